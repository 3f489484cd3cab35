"""benchmarks/bench_hetero.py on the CPU, on tiny stand-ins for its presets: PyG's
per-type dicts rebuilt from the typed graph, every framework's forward equal to PyG's
from the same weights (R-GCN and HGT, including a node type no relation ends at), steps
timed and stored, and a failed cell kept as its status."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
# Imported here, not first by the script: the import_script fixture unloads what the
# script's import brought in, and numpy's and scipy's C modules cannot load twice.
import torch_geometric.nn  # noqa: F401

import gnnfuse.bench  # noqa: F401
from gnnfuse.bench.host_syncs import HostSyncCounter
from gnnfuse.data.typed import TypedPreset, _kg, build_typed_graph

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench_hetero(import_script):
    return import_script(BENCHMARKS, "bench_hetero")


def tiny_presets(bench_hetero, monkeypatch) -> None:
    """The script's two smallest names stand for tiny presets of the same two kinds: a
    KG (one node type, relations with inverses) and a heterogeneous graph with a node
    type no relation ends at (as mag-like's authors)."""
    kg = _kg("tiny KG", 300, 1_200, 6, 3)
    hetero = TypedPreset("tiny mag", (("paper", 80), ("author", 120), ("field", 10)), 4, 8,
                         edge_counts=((("author", "writes", "paper"), 400), (("paper", "cites", "paper"), 300),
                                      (("paper", "has_topic", "field"), 200)))
    presets = {"aifb-like": kg, "mutag-like": hetero}
    monkeypatch.setattr(bench_hetero, "TYPED_PRESETS", presets)
    monkeypatch.setattr(bench_hetero, "typed_graph", lambda name: build_typed_graph(presets[name], name))


def test_per_type_dicts_hold_the_typed_graph(bench_hetero, monkeypatch):
    tiny_presets(bench_hetero, monkeypatch)
    data = bench_hetero.load_typed("mutag-like", torch.device("cpu"))
    assert list(data.x_dict) == ["paper", "author", "field"] and data.x_dict["author"].shape == (120, 8)
    assert sum(e.shape[1] for e in data.edge_index_dict.values()) == data.graph.num_edges == 900
    mask = data.graph.edge_type == 0                    # author -> paper, in per-type ids
    assert torch.equal(data.edge_index_dict[("author", "writes", "paper")],
                       torch.stack([data.graph.src[mask] - 80, data.graph.dst[mask]]))


def test_cells_are_checked_timed_and_stored(bench_hetero, tmp_path, monkeypatch):
    tiny_presets(bench_hetero, monkeypatch)
    common = ["--device", "cpu", "--frameworks", "gnnfuse", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)]
    bench_hetero.main(["--datasets", "aifb-like", "--models", "rgcn", *common])
    bench_hetero.main(["--datasets", "mutag-like", "--models", "hgt", *common])    # merged into the same file
    results = json.loads((tmp_path / "hetero.json").read_text())
    errors = results["checks"]["aifb-like/rgcn"]["max_rel_err"]
    assert set(errors) == {"gnnfuse", "gnnfuse-train-rows", "pyg-fastrgcn", "graphiler-udf"}
    assert max(errors.values()) < 1e-5          # the train-rows model against PyG's rows of its output
    assert results["checks"]["mutag-like/hgt"]["max_rel_err"]["gnnfuse"] < 1e-5
    bench_hetero.main(["--datasets", "aifb-like,mutag-like", "--models", "sage", *common])
    results = json.loads((tmp_path / "hetero.json").read_text())
    assert "aifb-like/sage" not in results["checks"]       # one node type: no to_hetero cell
    assert results["checks"]["mutag-like/sage"]["max_rel_err"]["gnnfuse"] < 1e-5
    assert {key: cell["status"] for key, cell in results["cells"].items()} == {
        "aifb-like/rgcn/gnnfuse": "ok", "mutag-like/hgt/gnnfuse": "ok", "mutag-like/sage/gnnfuse": "ok"}
    # PyG's cells, one out of memory: the ratio is against the fastest that ran
    ours = results["cells"]["aifb-like/rgcn/gnnfuse"]
    results["cells"]["aifb-like/rgcn/pyg-fastrgcn"] = {"status": "oom", "run": ours["run"]}
    results["cells"]["aifb-like/rgcn/pyg-rgcn"] = {**ours, "median_ms": 3 * ours["median_ms"]}
    bench_hetero.store(results, tmp_path)
    markdown = (tmp_path / "hetero.md").read_text()
    assert "| aifb-like | rgcn |" in markdown and "| oom |" in markdown
    ratios = results["ratios"]["aifb-like/rgcn"]
    assert ratios["fastest_pyg"] == "pyg-rgcn" and ratios["speedup"] == pytest.approx(3.0)
    # a forward that failed its check is no speedup: gnnfuse's, or the PyG variant's it is timed against
    errors = results["checks"]["aifb-like/rgcn"]["max_rel_err"]
    errors["gnnfuse"] = 0.5
    bench_hetero.store(results, tmp_path)
    assert results["ratios"]["aifb-like/rgcn"]["speedup"] is None
    results["checks"]["aifb-like/rgcn"]["max_rel_err"] = {**errors, "gnnfuse": 0.0}
    results["cells"]["aifb-like/rgcn/pyg-fastrgcn"] = {**ours, "median_ms": 2 * ours["median_ms"]}
    bench_hetero.store(results, tmp_path)
    assert results["ratios"]["aifb-like/rgcn"]["fastest_pyg"] == "pyg-fastrgcn"
    results["checks"]["aifb-like/rgcn"]["max_rel_err"]["pyg-fastrgcn"] = 0.5
    bench_hetero.store(results, tmp_path)
    assert results["ratios"]["aifb-like/rgcn"]["fastest_pyg"] == "pyg-rgcn"


def test_each_cell_builds_its_own_graph_layouts_and_profile_counts_a_step(bench_hetero, tmp_path, monkeypatch):
    """A cell runs on a fresh Graph (gnnfuse's layouts cached by an earlier cell or the
    forward check are not held, so they count in the cell's own peak), and --profile
    records one step's counts."""
    tiny_presets(bench_hetero, monkeypatch)
    data = bench_hetero.load_typed("aifb-like", torch.device("cpu"))
    fresh = bench_hetero.with_fresh_graph(data)
    assert fresh.graph is not data.graph and not fresh.graph._cache
    assert torch.equal(fresh.graph.edge_type, data.graph.edge_type) and fresh.x is data.x
    state = bench_hetero.reference_state("rgcn", data, 8)
    cell = bench_hetero.measure("rgcn", "gnnfuse", data, 8, state, 1, 0, torch.device("cpu"), profile=True)
    assert cell["profile"]["python_calls"] > 0 and cell["profile"]["host_syncs"] == 0
    assert not data.graph._cache                    # the cell's layouts were built on its own graph


def test_graphiler_hgt_udf_step_reads_nothing_back_to_the_host(bench_hetero, monkeypatch):
    """Graphiler's HGT UDF reads its relation prior as ``p[edges.data['type']]``: the
    gradient of that lookup must not read the index's range back (a host sync keeps the
    step out of a CUDA graph: 118 ms eager on mag-like). Counted on the CPU
    (`HostSyncCounter`) over a step after the graph's one-time layouts are built."""
    tiny_presets(bench_hetero, monkeypatch)
    data = bench_hetero.with_fresh_graph(bench_hetero.load_typed("mutag-like", torch.device("cpu")))
    state = bench_hetero.reference_state("hgt", data, 8)
    module = bench_hetero.instantiate("hgt", "graphiler-udf", data, 8, state, torch.device("cpu"))

    def step():
        torch.nn.functional.cross_entropy(module(data)[data.train_idx], data.y[data.train_idx]).backward()
    step()
    with HostSyncCounter() as counter:
        step()
    assert not counter.syncs, dict(counter.syncs)


def test_hgt_heads_agree_and_both_are_reported(bench_hetero, tmp_path, monkeypatch):
    """gnnfuse's HGT cell takes its classifier and loss through linear_cross_entropy, the
    gnnfuse-linear-head cell through nn.Linear and F.cross_entropy: the same loss and
    gradients, and the table keeps the linear head's memory ratio beside the fused one's."""
    tiny_presets(bench_hetero, monkeypatch)
    data = bench_hetero.with_fresh_graph(bench_hetero.load_typed("mutag-like", torch.device("cpu")))
    state = bench_hetero.reference_state("hgt", data, 8)
    module = bench_hetero.instantiate("hgt", "gnnfuse", data, 8, state, torch.device("cpu"))
    y = data.y[data.train_idx]
    losses, grads = [], []
    for fused in (True, False):
        module.zero_grad()
        loss = (bench_hetero.linear_cross_entropy(module.embed(data)[data.train_idx], module.lin.weight,
                                                  module.lin.bias, y, chunk_rows=7) if fused
                else torch.nn.functional.cross_entropy(module(data)[data.train_idx], y))
        loss.backward()
        losses.append(loss.detach())
        grads.append([None if p.grad is None else p.grad.clone() for p in module.parameters()])
    torch.testing.assert_close(losses[0], losses[1])
    assert sum(g is not None for g in grads[0]) > 10
    for a, b in zip(*grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)
    bench_hetero.main(["--datasets", "mutag-like", "--models", "hgt", "--device", "cpu", "--frameworks",
                       "gnnfuse,gnnfuse-linear-head", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "hetero.json").read_text())
    cells = results["cells"]
    assert cells["mutag-like/hgt/gnnfuse"]["head"] == "linear_cross_entropy"
    assert cells["mutag-like/hgt/gnnfuse-linear-head"]["head"] == "nn.Linear"
    cells["mutag-like/hgt/pyg-hgt"] = {**cells["mutag-like/hgt/gnnfuse"], "own_peak_gb": 4.0, "median_ms": 9.0}
    cells["mutag-like/hgt/gnnfuse-linear-head"]["own_peak_gb"] = 2.0
    bench_hetero.store(results, tmp_path)
    assert results["ratios"]["mutag-like/hgt"]["linear_head_own_memory_ratio"] == pytest.approx(0.5)
    assert "own mem vs PyG, Linear head" in (tmp_path / "hetero.md").read_text()


def test_the_train_rows_cell_gives_the_whole_models_loss_and_gradients(bench_hetero, tmp_path, monkeypatch):
    """gnnfuse-train-rows computes R-GCN's second layer on the training vertices' in-edges
    only: its loss and every parameter gradient equal the all-rows model's, a step takes
    no host read back once its block is built, and its cell is reported with its own
    speedup and memory share."""
    tiny_presets(bench_hetero, monkeypatch)
    data = bench_hetero.with_fresh_graph(bench_hetero.load_typed("aifb-like", torch.device("cpu")))
    state = bench_hetero.reference_state("rgcn", data, 8)
    full = bench_hetero.instantiate("rgcn", "gnnfuse", data, 8, state, torch.device("cpu"))
    rows = bench_hetero.instantiate("rgcn", bench_hetero.TRAIN_ROWS, data, 8, state, torch.device("cpu"))
    rows.prepare(data)
    y = data.y[data.train_idx]
    grads = []
    for loss in (torch.nn.functional.cross_entropy(full(data)[data.train_idx], y),
                 torch.nn.functional.cross_entropy(rows(data), y)):
        model = full if len(grads) == 0 else rows
        grads.append([loss.detach(), *torch.autograd.grad(loss, list(model.parameters()))])
    for ours, theirs in zip(grads[1], grads[0]):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    with HostSyncCounter() as counter:
        torch.nn.functional.cross_entropy(rows(data), y).backward()
    assert not counter.syncs, dict(counter.syncs)
    common = ["--device", "cpu", "--steps", "1", "--warmup", "0", "--out", str(tmp_path)]
    bench_hetero.main(["--datasets", "aifb-like", "--models", "rgcn", "--frameworks", "gnnfuse-train-rows,pyg-rgcn",
                       *common])
    bench_hetero.main(["--datasets", "aifb-like", "--models", "rgcn", "--frameworks", "gnnfuse", *common])
    results = json.loads((tmp_path / "hetero.json").read_text())
    assert results["cells"]["aifb-like/rgcn/gnnfuse-train-rows"]["status"] == "ok"
    assert "loss" not in results["cells"]["aifb-like/rgcn/gnnfuse-train-rows"]    # no rows= for its own loss
    ratios = results["ratios"]["aifb-like/rgcn"]
    cells = results["cells"]
    assert ratios["train_rows_speedup"] == pytest.approx(
        cells["aifb-like/rgcn/pyg-rgcn"]["median_ms"] / cells["aifb-like/rgcn/gnnfuse-train-rows"]["median_ms"])
    assert "train_rows_own_memory_ratio" in ratios            # None on the CPU: no allocator peaks there
    assert f"| {ratios['train_rows_speedup']:.2f} / – |" in (tmp_path / "hetero.md").read_text()
