"""benchmarks/bench_minibatch.py on a tiny CPU run: both models and every DKP policy are
timed on the same batches after a warm-up, with host, device and wall time apart, and
the PyG loader epoch is either run or recorded as unavailable."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

# Imported here, not first inside the bench: `import_script` drops the modules a script
# imports, and torch_geometric registers global DataPipe names it cannot register twice.
pytest.importorskip("torch_geometric.nn")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_bench_minibatch_times_both_models_and_every_policy_on_the_same_batches(tmp_path, import_script,
                                                                                monkeypatch):
    # The torch hops, whose one read back per hop is the contract a GPU relies on (the
    # CPU's Numba hops read their host tensors as they please).
    monkeypatch.setenv("GNNFUSE_FUSED_HOPS", "0")
    bench = import_script(BENCHMARKS, "bench_minibatch")
    path = tmp_path / "minibatch.json"
    bench.main(["--device", "cpu", "--dataset", "synthetic", "--hidden", "8", "--fanout", "3,2", "--batch-size", "16",
                "--train-nodes", "64", "--warmup", "1", "--max-batches", "2", "--dkp-calibration", "1",
                "--json", str(path)])
    results = json.loads(path.read_text())
    compute = results["compute_only"]
    assert compute["batches"] == 2
    for name in ("gnnfuse", "pyg"):
        assert compute[name]["steps"] == 2 and compute[name]["wall_s"] > 0 and compute[name]["device_s"] is None
    assert compute["host_syncs_per_step"]["gnnfuse"] == {}
    idiom = results["pyg_idiom"]         # PyG's idiom: on the batch's graph, on one made in the step, PyG's
    assert idiom["batches"] == 2 and all(idiom[name]["steps"] == 2 for name in bench.idiom_labels("sage"))
    assert idiom["host_syncs_per_step"]["gnnfuse"] == idiom["host_syncs_per_step"]["gnnfuse_trimmed"] == {}
    assert idiom["max_rel_err"] < 1e-5
    assert idiom["host_syncs_per_step"]["gnnfuse_made_in_step"], "the graph made in the step read nothing back"
    dkp = results["dkp"]
    assert set(dkp["steps"]) == {"aggregate-first", "combine-first", "dkp"}
    assert all(summary["steps"] == dkp["batches"] == 2 for summary in dkp["steps"].values())
    assert set(dkp["prediction_error_per_layer"]) == {"0", "1"}
    assert "skipped" in results["pyg"] or results["pyg"]["batches"] > 0
    loader = results["loader"]            # the loader alone: one read back per hop, nothing else
    assert loader["batches"] == 2 and loader["per_batch"]["reindex"]["syncs_by_op"] == {"Tensor.tolist": 2.0}
    assert loader["per_batch"]["sample"]["host_syncs"] == 0 and loader["per_batch"]["sample"]["aten_ops"] > 0
    markdown = path.with_suffix(".md").read_text()
    assert "| PyG SAGEConv |" in markdown and "| dkp |" in markdown
    assert "| gnnfuse, graph made in the step |" in markdown


def test_every_policy_goes_first_against_every_other_on_half_the_batches(import_script):
    """Whoever runs first on a batch pays its first uses (per-graph caches, autotuning a
    new size class that two orders share); a rotation of three put one policy before
    another on two batches of three."""
    bench = import_script(BENCHMARKS, "bench_minibatch")
    names = ["aggregate-first", "combine-first", "dkp"]
    orders = [bench.turn_order(names, index) for index in range(6)]
    for a in names:
        for b in names:
            if a != b:
                assert sum(order.index(a) < order.index(b) for order in orders) == 3, (a, b)
    assert [bench.turn_order(["gnnfuse", "pyg"], i) for i in range(2)] == [["gnnfuse", "pyg"], ["pyg", "gnnfuse"]]


def test_bench_minibatch_times_gat_epochs_and_skips_the_sage_comparisons(tmp_path, import_script):
    bench = import_script(BENCHMARKS, "bench_minibatch")
    path = tmp_path / "minibatch_gat.json"
    bench.main(["--device", "cpu", "--dataset", "synthetic", "--model", "gat", "--hidden", "16", "--fanout", "3,2",
                "--batch-size", "16", "--train-nodes", "64", "--warmup", "1", "--max-batches", "2",
                "--feature-devices", "device", "--workers", "0", "--json", str(path)])
    results = json.loads(path.read_text())
    assert results["config"]["model"] == "gat" and "compute_only" not in results and "dkp" not in results
    (cells,) = results["gnnfuse"].values()
    assert cells[0]["batches"] == 2
    assert "(sampled, GAT, 8 heads)" in path.with_suffix(".md").read_text()


def test_bench_minibatch_runs_pyg_idiom_for_gat_against_pygs_gat(tmp_path, import_script):
    """``--model gat``: PyG's idiom with gnnfuse.nn.GAT against PyG's GAT from the same
    weights (their forwards agree), every model stepped on the same batches, and
    gnnfuse's steps on the batch's graphs reading nothing back."""
    bench = import_script(BENCHMARKS, "bench_minibatch")
    path = tmp_path / "minibatch_gat.json"
    bench.main(["--device", "cpu", "--dataset", "synthetic", "--hidden", "16", "--fanout", "3,2", "--batch-size", "16",
                "--train-nodes", "64", "--warmup", "1", "--max-batches", "2", "--dkp-calibration", "0",
                "--model", "gat", "--no-pyg-loader", "--no-loader-thread", "--workers", "0", "--json", str(path)])
    results = json.loads(path.read_text())
    assert "compute_only" not in results and results["config"]["model"] == "gat"
    idiom = results["pyg_idiom"]
    assert idiom["batches"] == 2 and all(idiom[name]["steps"] == 2 for name in bench.idiom_labels("gat"))
    assert idiom["max_rel_err"] < 1e-5
    assert idiom["host_syncs_per_step"]["gnnfuse"] == idiom["host_syncs_per_step"]["gnnfuse_trimmed"] == {}
    assert "PyG GATConv" in path.with_suffix(".md").read_text()
