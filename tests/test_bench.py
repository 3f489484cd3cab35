"""`gnnfuse bench` on CPU with a couple of steps: table, JSON, plot, failures as statuses."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from gnnfuse import bench
from gnnfuse.cli import main


def test_cli_bench_writes_table_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    status = main(["bench", "--model", "gcn", "--dataset", "synthetic", "--device", "cpu",
                   "--frameworks", "gnnfuse,pyg", "--steps", "2", "--warmup", "1",
                   "--json", str(out), "--plot", str(png)])
    assert status == 0
    text = capsys.readouterr().out
    assert "forward check gnnfuse vs pyg" in text and "agree" in text and "n/a" in text
    report = json.loads(out.read_text())
    assert report["check"]["agrees"] and report["check"]["max_rel_err"] < bench.REL_ERR_LIMIT
    assert report["num_nodes"] == 2000 and set(report["results"]) == {"gnnfuse", "pyg"}
    for cell in report["results"].values():
        assert cell["status"] == "ok" and cell["median_ms"] > 0 and cell["peak_gb"] is None
    assert report["ratios"]["pyg"]["speedup"] > 0 and report["ratios"]["pyg"]["memory"] is None
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_data_set_that_cannot_be_fetched_is_a_usage_error(monkeypatch, capsys):
    """`gnnfuse train` and `tune` turn a data set that is missing and cannot be downloaded
    (`DownloadError`, an OSError) into a usage error; `bench` caught only ValueError and
    FileNotFoundError, so ``bench --dataset ogbn-arxiv`` offline ended in a traceback."""
    from gnnfuse.data.download import DownloadError

    def offline(name, root=None, **kw):
        raise DownloadError(f"{name} is not in /nowhere and ogb could not download it")
    monkeypatch.setattr(bench.models, "load_node_dataset", offline)
    with pytest.raises(SystemExit) as stopped:
        main(["bench", "--dataset", "ogbn-arxiv", "--frameworks", "gnnfuse", "--steps", "1"])
    assert stopped.value.code == 2
    assert "gnnfuse bench: error: ogbn-arxiv is not in /nowhere" in capsys.readouterr().err

def test_a_failing_framework_becomes_a_status(monkeypatch):
    real = bench.measure

    def measure(framework, *args, **kwargs):
        if framework == "pyg":
            raise RuntimeError("simulated compiler failure\nsecond line")
        return real(framework, *args, **kwargs)

    monkeypatch.setattr(bench.compare, "measure", measure)   # what run_bench calls
    report = bench.run_bench("sage", "synthetic", "cpu", ("gnnfuse", "pyg"), steps=1, warmup=1, log=lambda m: None)
    assert report["results"]["gnnfuse"]["status"] == "ok"
    assert report["results"]["pyg"]["status"] == "error: RuntimeError: simulated compiler failure"
    assert report["ratios"]["pyg"]["speedup"] is None
    assert "failed" in bench.format_table(report)



def test_no_speedup_is_reported_when_the_forward_check_fails(monkeypatch, import_script):
    """A forward that disagreed with PyG's (max rel err 0.5, limit 1e-3) still got a
    speedup in the report's ``ratios``, the table and bench_training's summary, whose doc
    promises "a speedup is never reported for a layer that computes something else"."""

    monkeypatch.setattr(bench.compare, "check_forward", lambda *args: 0.5)
    report = bench.run_bench("gcn", "synthetic", "cpu", ("gnnfuse", "pyg"), steps=1, warmup=0, log=lambda m: None)
    assert not report["check"]["agrees"] and report["results"]["pyg"]["status"] == "ok"
    assert report["ratios"]["pyg"] == {"speedup": None, "memory": None}
    table = bench.format_table(report)
    assert "DISAGREE" in table and "the forward check did not pass" in table
    pyg_row = next(line for line in table.splitlines() if line.startswith("pyg "))
    assert pyg_row.split()[-2:] == ["n/a", "n/a"]

    ratios = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_training").ratios
    cells = {f"cora/gcn/{fw}": {"status": "ok", "median_ms": ms, "peak_gb": 1.0, "run": "r1"}
             for fw, ms in (("gnnfuse", 1.0), ("pyg", 3.0), ("pyg-compile", 2.0))}
    results = {"cells": cells, "checks": {"cora/gcn": {"status": "ok", "max_rel_err": 0.5}},
               "runs": {"r1": {"device_name": "GPU"}}}
    assert ratios(results, "cora", "gcn")["speedup_vs_pyg"] is None
    results["checks"]["cora/gcn"]["max_rel_err"] = 1e-6
    assert ratios(results, "cora", "gcn")["speedup_vs_pyg"] == 3.0

def test_bad_options_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse,dgl"])
    assert exit_info.value.code == 2 and "frameworks" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["bench", "--dataset", "synthetic", "--device", "cuda"])
        assert "CUDA is not available" in capsys.readouterr().err
    # --warmup -1 ran with no warm-up, as 0 would, saying nothing
    with pytest.raises(SystemExit):
        main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse", "--steps", "1", "--warmup", "-1"])
    assert "warmup must be at least 0, got -1" in capsys.readouterr().err
    # gnnfuse was timed twice and the table showed the second timing alone, as if listed once
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse,pyg,gnnfuse", "--steps", "1"])
    assert exit_info.value.code == 2 and "frameworks lists 'gnnfuse' twice" in capsys.readouterr().err


def test_plot_without_matplotlib_is_a_usage_error_before_any_timing(monkeypatch, capsys, tmp_path):
    """It raised MissingDependency as a traceback after every framework was timed."""
    import sys
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backend_bases"):
        monkeypatch.setitem(sys.modules, name, None)              # makes the imports fail
    monkeypatch.setattr(bench.command, "run_bench", lambda *a, **k: pytest.fail("timed before refusing --plot"))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse", "--plot", str(tmp_path / "b.png")])
    assert exit_info.value.code == 2 and "--plot needs matplotlib" in capsys.readouterr().err


def test_missing_torch_geometric_is_reported(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "torch_geometric.nn", None)   # makes the import fail
    with pytest.raises(bench.MissingDependency, match="gnnfuse\\[bench\\]"):
        bench.require_pyg()


def test_a_stuck_measurement_becomes_a_timeout_and_the_alarm_is_cleared():
    import signal
    import time

    from gnnfuse.bench import guarded

    def stuck():
        while True:
            time.sleep(0.01)
    cell = guarded(stuck, torch.device("cpu"), time_limit_s=0.2)
    assert cell == {"status": "timeout (0.2 s)"}
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert guarded(lambda: {"status": "ok"}, torch.device("cpu"), time_limit_s=5) == {"status": "ok"}

    def compiler_wrapping_the_timeout():   # as torch.compile's InductorError does
        try:
            stuck()
        except Exception as exc:
            raise RuntimeError(f"compile failed: {exc}") from exc
    assert guarded(compiler_wrapping_the_timeout, torch.device("cpu"), time_limit_s=0.2) == {"status": "timeout (0.2 s)"}


def test_an_oom_cell_records_what_earlier_cells_left_allocated(monkeypatch, import_script):
    """An OOM says how much was already allocated when the cell began, and the training
    table shows it: after a timed-out compiled-PyG cell held ~70 GB, the next framework's
    OOM was not its own."""
    import importlib

    from gnnfuse.bench import guarded
    time_cell = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_training").time_cell
    monkeypatch.setattr(importlib.import_module("gnnfuse.bench.measure"), "allocated_gb", lambda device: 70.2)

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory")
    cell = guarded(out_of_memory, torch.device("cpu"))
    assert cell == {"status": "oom", "held_gb": 70.2}
    assert time_cell(cell) == "oom (70.2 GB held before)"
    assert time_cell({"status": "oom", "held_gb": 0.4}) == "oom"


def test_bench_json_names_the_machine_versions_and_commit(tmp_path, capsys):
    """A --json result that said only "cpu" or "cuda" could not tell one GPU's numbers
    from another's, nor which commit made them."""
    out = tmp_path / "bench.json"
    assert main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse", "--steps", "1", "--warmup", "0",
                 "--json", str(out)]) == 0
    env = json.loads(out.read_text())["environment"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__
    assert {"git_commit", "git_dirty", "gnnfuse", "torch_geometric", "date"} <= set(env)
    commit = (env["git_commit"] or "unknown")[:12]
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("machine: ")]
    # the table's second line names the PyG version as README says (it was left out)
    assert line.startswith(f"machine: {env['device_name']}") and f"PyG {env['torch_geometric']};" in line
    assert f"commit {commit}" in line


def test_the_table_keeps_its_columns_with_pyg_compile_ro():
    """pyg-compile-ro is longer than the framework column was wide: its row's numbers ran
    one column to the right of the header's."""
    cell = {"status": "ok", "median_ms": 2.0, "peak_gb": None}
    report = {"model": "gcn", "dataset": "cora", "num_nodes": 1, "num_edges": 1, "device": "cpu", "steps": 1,
              "rel_err_limit": 1e-3, "check": {"status": "ok", "max_rel_err": 0.0, "agrees": True},
              "results": {"gnnfuse": cell, "pyg-compile-ro": cell},
              "ratios": {"pyg-compile-ro": {"speedup": 1.0, "memory": None}}}
    lines = bench.format_table(report).splitlines()
    header = next(line for line in lines if line.startswith("framework"))
    rows = [line for line in lines if line.startswith(("gnnfuse ", "pyg-compile-ro "))]
    assert len(rows) == 2
    for row in rows:
        assert row.index(" ok ") + 1 == header.index("status")
        assert len(row) == len(header)


def test_a_json_write_stopped_midway_leaves_the_earlier_file_whole(tmp_path, monkeypatch, capsys):
    """--json was written in place: a Ctrl-C (or a full disk) during the write left half a
    JSON file where the previous result had been."""
    out = tmp_path / "bench.json"
    out.write_text('{"earlier": true}\n')
    write_text = Path.write_text

    def stopped_midway(self, text, *args, **kwargs):
        write_text(self, text[:len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(Path, "write_text", stopped_midway)
    status = main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse", "--steps", "1", "--warmup", "0",
                   "--json", str(out)])
    monkeypatch.undo()
    assert status != 0 and "interrupted" in capsys.readouterr().err
    assert json.loads(out.read_text()) == {"earlier": True}
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]


def test_a_cpu_bench_names_the_cpu_model_not_the_isa():
    """On Linux platform.processor() is '' or 'x86_64', which was recorded as the machine."""
    from gnnfuse.backend.tuned_schedule import cpu_name
    from gnnfuse.bench.environment import environment
    assert environment(torch.device("cpu"))["device_name"] == cpu_name()


def test_a_json_output_that_is_a_link_is_written_through_it(tmp_path, capsys):
    """The atomic write renames a new file into place: over a link it writes the file the
    link points at, as writing in place did, and keeps the link."""
    real, link = tmp_path / "real.json", tmp_path / "latest.json"
    real.write_text("{}\n")
    link.symlink_to(real)
    assert main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse", "--steps", "1", "--warmup", "0",
                 "--json", str(link)]) == 0
    assert link.is_symlink() and json.loads(real.read_text())["dataset"] == "synthetic"
    # and the file keeps its permissions, as it did written in place (the renamed one had the umask's)
    real.chmod(0o664)
    mask = os.umask(0o022)
    try:
        assert main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse", "--steps", "1", "--warmup", "0",
                     "--json", str(link)]) == 0
    finally:
        os.umask(mask)
    assert real.stat().st_mode & 0o777 == 0o664


def test_bench_edge_index_gives_no_ratio_beside_a_failed_check(import_script):
    """bench_edge_index: the Graph and edge_index forwards that disagree (or give NaN) get
    **FAIL** and no ratio."""
    bench = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_edge_index")
    cells = {f"cora/gcn/{kind}": {"status": "ok", "median_ms": ms, "run": "r"}
             for kind, ms in zip(bench.INPUTS, (1.0, 2.0))}
    results = {"runs": {"r": {"device_name": "H100"}}, "cells": cells, "checks": {"cora/gcn": {"max_rel_err": 0.0}}}
    assert bench.ratio(results, "cora", "gcn") == 2.0
    for err in (0.5, float("nan")):
        results["checks"]["cora/gcn"]["max_rel_err"] = err
        assert bench.ratio(results, "cora", "gcn") is None
    results["runs"]["r"].update(torch="2.11", triton="3.6", torch_geometric="2.8", git_commit=None, git_dirty=None,
                                date="2026-12-05")
    assert "| 1.00 | 2.00 | – | nan **FAIL** |" in bench.render_markdown(results)


def test_bench_cpu_gives_no_speedup_beside_a_kernel_that_failed_its_check(import_script):
    """bench_cpu's kernel table: a method whose output differs from PyG's (or is NaN) gets no
    speedup, only the reason."""
    bench = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_cpu")
    key = "cora/sum/64/2"

    def results(err):
        return {"kernels": {f"{key}/gnnfuse-cpu": {"status": "ok", "median_ms": 1.0, "rel_err": err},
                            f"{key}/pyg-scatter": {"status": "ok", "median_ms": 3.0, "rel_err": None}}}
    assert bench.ratio(results(1e-7), "kernels", key, "gnnfuse-cpu", "pyg-scatter") == "3.00x"
    for err in (0.5, float("nan")):
        assert bench.ratio(results(err), "kernels", key, "gnnfuse-cpu", "pyg-scatter") == "check failed"


def test_bench_records_the_thread_count_and_the_backend_it_ran(tmp_path, monkeypatch, capsys):
    """The JSON named the CPU model but not the torch thread count nor the gnnfuse backend
    (GNNFUSE_BACKEND): a CPU step's time depends on both, so two results of one commit and
    machine could not be told apart."""
    out = tmp_path / "bench.json"
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    assert main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse", "--steps", "1", "--warmup", "0",
                 "--threads", "1", "--json", str(out)]) == 0
    env = json.loads(out.read_text())["environment"]
    assert env["threads"] == 1 and env["backend"] == "cpu"
    assert "1 CPU thread(s), gnnfuse backend cpu" in capsys.readouterr().out


def test_bench_edge_index_gives_no_ratio_where_the_check_did_not_run(import_script):
    """bench_edge_index's ratio promises "None unless ... the two inputs' forwards agreed";
    a check that failed to run (an OOM: no max_rel_err) or is missing leaves agreement
    unknown, yet the ratio was given (2.00 in both cases)."""
    bench = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_edge_index")
    cells = {f"cora/gcn/{kind}": {"status": "ok", "median_ms": ms, "run": "r"}
             for kind, ms in zip(bench.INPUTS, (1.0, 2.0))}
    results = {"runs": {"r": {"device_name": "H100"}}, "cells": cells, "checks": {"cora/gcn": {"status": "oom"}}}
    assert bench.ratio(results, "cora", "gcn") is None
    results["checks"] = {}
    assert bench.ratio(results, "cora", "gcn") is None


def test_bench_cpu_checks_each_gnnfuse_training_forward_before_a_speedup(import_script, monkeypatch, tmp_path):
    """bench_cpu's training table gave "vs pyg" speedups (4.64x published) for gnnfuse steps
    whose forward was never compared with PyG's: a CPU backend computing something else
    would still have shown one. Each gnnfuse trainer's forward is now checked on its own
    backend, and a difference (or a check that could not run) leaves "check failed"."""
    import argparse

    script = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_cpu")
    backends = []

    def check_forward(model, data, state, device):
        backends.append(os.environ["GNNFUSE_BACKEND"])
        return 0.5 if os.environ["GNNFUSE_BACKEND"] == "cpu" else 1e-7
    monkeypatch.setattr(bench, "load_data", lambda *args: "data")
    monkeypatch.setattr(bench, "reference_state", lambda model, data: {})
    monkeypatch.setattr(bench, "check_forward", check_forward)
    monkeypatch.setattr(bench, "measure", lambda framework, *args: {"status": "ok", "median_ms": 1.0})
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    results = {"runs": {}, "kernels": {}, "training": {}}
    args = argparse.Namespace(data_root=None, models=["gcn"], steps=1, warmup=0, out=tmp_path)
    script.run_training("cora", 1, args, results, "r")
    assert backends == ["cpu", "reference"]
    assert results["training"]["cora/gcn/1/gnnfuse-cpu"]["rel_err"] == 0.5
    assert script.ratio(results, "training", "cora/gcn/1", "gnnfuse-cpu", "pyg") == "check failed"
    assert script.ratio(results, "training", "cora/gcn/1", "gnnfuse-reference", "pyg") == "1.00x"

    def broken(*args):
        raise RuntimeError("simulated")
    monkeypatch.setattr(bench, "check_forward", broken)
    script.run_training("cora", 1, args, results, "r")
    assert script.ratio(results, "training", "cora/gcn/1", "gnnfuse-cpu", "pyg") == "check failed"


def test_bench_loss_gives_no_speedup_beside_a_loss_that_differs(import_script, monkeypatch):
    """bench_loss printed the two losses' and gradients' differences but gave both speed-ups
    whatever they were: a kernel returning twice torch's loss and gradient read "1.0e+00 /
    1.0e+00" beside its speed-up, with no FAIL."""
    import argparse

    import torch.nn.functional as F

    script = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_loss")
    monkeypatch.setitem(script.SIZES, "tiny", (50, 4, 20))
    monkeypatch.setitem(script.METHODS, "gnnfuse", lambda out, y, idx: 2 * F.cross_entropy(out[idx], y))
    args = argparse.Namespace(repeats=2, graph_calls=2)
    cell = script.run_size("tiny", args, torch.device("cpu"))
    assert cell["loss_rel_diff"] == pytest.approx(1.0) and cell["speedup_launched"] is None
    results = {"runs": {}, "cells": {"tiny": {**cell, "run": "r"}}}
    row = next(line for line in script.markdown(results).splitlines() if line.startswith("| tiny "))
    assert "1.0e+00 **FAIL** / 1.0e+00 **FAIL**" in row and "x |" not in row
    monkeypatch.setitem(script.METHODS, "gnnfuse", lambda out, y, idx: F.cross_entropy(out[idx], y))
    cell = script.run_size("tiny", args, torch.device("cpu"))
    assert cell["loss_rel_diff"] == 0 and cell["speedup_launched"] > 0


def test_results_saver_drops_runs_no_cell_refers_to(import_script, tmp_path):
    """bench_loss, bench_dropout and check_determinism save through `results_saver` and never
    pruned: loss.md listed four runs (their commits, dates and devices) for cells all
    measured in one, and a replaced cell's old device would raise the "more than one
    device" warning."""
    common = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "common")
    env = {"device_name": "H100", "torch": "2.11", "triton": "3.6", "torch_geometric": "2.8", "git_commit": "abc",
           "git_dirty": False, "date": "2026-12-05"}
    results = {"runs": {"old": {**env, "device_name": "A100"}, "new": env}, "cells": {"a": {"run": "new"}}}
    save = common.results_saver(tmp_path / "r.json",
                                lambda r: "\n".join(common.runs_markdown(r) if "runs" in r else []) + "\n")
    save(results)
    assert set(json.loads((tmp_path / "r.json").read_text())["runs"]) == {"new"}
    table = (tmp_path / "r.md").read_text()
    assert "old" not in table and "more than one device" not in table
    save({"ranks": [1]})            # a result without runs (bench_distributed's) is written as it is
    assert json.loads((tmp_path / "r.json").read_text()) == {"ranks": [1]}


def test_the_capture_streams_workspaces_are_made_before_any_framework_is_measured(monkeypatch, import_script,
                                                                                  tmp_path):
    """gnnfuse's captured step makes cuBLAS workspaces on its capture stream (32 MiB per
    handle on Hopper) during its warm-up, and they stay allocated: a framework measured
    after gnnfuse counted them in its peak, one measured before it (``--frameworks
    pyg,gnnfuse``, or a bench_training run re-timing PyG alone) did not, so memory ratios
    depended on the order and on which runs the cells came from. bench_hetero made them
    first (`prime_capture_stream`); `gnnfuse bench` and bench_training now do too."""
    calls = []
    monkeypatch.setattr(bench.compare, "prime_capture_stream", lambda device: calls.append("prime"))
    monkeypatch.setattr(bench.compare, "measure", lambda *a, **k: calls.append("measure") or {"status": "error"})
    bench.run_bench("gcn", "synthetic", "cpu", ("pyg", "gnnfuse"), steps=1, warmup=0, log=lambda m: None)
    assert calls == ["prime", "measure", "measure"]

    training = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_training")
    calls.clear()
    monkeypatch.setattr(training, "prime_capture_stream", lambda device: calls.append("prime"))
    monkeypatch.setattr(training, "run_dataset", lambda *args: calls.append("dataset"))
    training.main(["--device", "cpu", "--datasets", "cora", "--out", str(tmp_path)])
    assert calls == ["prime", "dataset"]


def test_check_templates_catches_a_nan_gradient_and_gives_no_ratio_beside_a_failure(import_script, monkeypatch):
    """check_templates took ``max`` over the output's and gradients' errors, which drops a
    NaN listed after a number: a template with a NaN input gradient read max rel err 0 and
    passed. Its table also gave the peer / template ratio beside a template that failed."""
    script = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "check_templates")

    class NanGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return torch.full_like(grad, float("nan"))
    monkeypatch.setitem(script.PAIRS, "nan", lambda graph, width, device: (lambda x: x.clone(), NanGradient.apply))
    graph = type("G", (), {"num_nodes": 5})()
    cell = script.run_cell(graph, "nan", 3, torch.device("cpu"), 2)
    assert cell["max_rel_err"] != cell["max_rel_err"]
    results = {"runs": {}, "cells": {"g/nan/3": {**cell, "run": "r"}}}
    row = next(line for line in script.markdown(results).splitlines() if line.startswith("| g |"))
    assert row.endswith("| – | nan **FAIL** |")


def test_check_tiled_scores_worst_error_is_nan_wherever_the_nan_is(import_script):
    """check_tiled_scores picked ``max(errors, key=errors.get)``, which keeps whichever of NaN
    and a number comes first: a NaN gradient listed after a good output read as the good
    output's 0.0, and the tiled plan "passed"."""
    script = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "check_tiled_scores")
    ones = torch.ones(3)
    err, where = script.worst_error({"out": ones, "x": torch.full((3,), float("nan"))}, {"out": ones, "x": ones})
    assert err != err and where == "x"
    assert script.worst_error({"out": ones, "x": 2 * ones}, {"out": ones, "x": ones}) == (1.0, "x")
    assert script.worst_error({"out": ones, "x": None}, {"out": ones, "x": ones}) == (float("inf"), "x")


def test_check_split_rows_counts_a_nan_output_as_wrong(import_script):
    """check_split_rows counted a call wrong when ``err > TOLERANCE`` and kept
    ``max(worst, err)``: a NaN output (what a race on a split row's workspace can give)
    counted as right and left the worst error unchanged, so the check printed "ok"."""
    script = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "check_split_rows")
    worst, wrong = script.tally(0.0, 0, float("nan"))
    assert worst != worst and wrong == 1
    assert script.tally(1e-7, 0, 1e-6) == (1e-6, 0)
    assert script.tally(1e-7, 2, 1.0) == (1.0, 3)


def test_bench_training_compares_peaks_only_within_one_run(import_script):
    """A peak counts everything allocated in the process, and what a process holds besides
    the cell differs between runs: training.json's pubmed/gcn gnnfuse cell (run
    20261123T211139Z) had 0.518 GB resident where the PyG cell (run 20261123T020303Z) had
    0.114, and the table gave "mem vs pyg" 2.65 (0.581 / 0.219 GB), while compiled PyG in
    gnnfuse's own run peaked at the same 0.581 (ratio 1.00). Speed-ups still merge across
    runs on one device; memory ratios only within a run."""
    ratios = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_training").ratios
    cells = {"pubmed/gcn/gnnfuse": {"status": "ok", "median_ms": 0.42, "peak_gb": 0.581, "run": "late"},
             "pubmed/gcn/pyg": {"status": "ok", "median_ms": 2.68, "peak_gb": 0.219, "run": "early"},
             "pubmed/gcn/pyg-compile": {"status": "ok", "median_ms": 3.75, "peak_gb": 0.581, "run": "late"}}
    results = {"cells": cells, "checks": {"pubmed/gcn": {"status": "ok", "max_rel_err": 3e-7}},
               "runs": {"early": {"device_name": "H100"}, "late": {"device_name": "H100"}}}
    out = ratios(results, "pubmed", "gcn")
    assert out["speedup_vs_pyg"] == pytest.approx(2.68 / 0.42) and out["memory_ratio_vs_pyg"] is None
    assert out["memory_ratio_vs_pyg-compile"] == pytest.approx(1.0)


def test_summarize_reports_the_median_min_and_mean():
    """The table's headline is the median (robust to one stall): of 3, 1, 10, 2 ms that
    is 2.5, the min 1 and the mean 4. Nothing computed a summary by hand, so a mean
    reported as the median (a stall inflating the headline) or a max as the min passed."""
    from gnnfuse.bench.timing import summarize
    assert summarize([3.0, 1.0, 10.0, 2.0]) == {"median_ms": 2.5, "min_ms": 1.0, "mean_ms": 4.0}


def test_ratios_are_the_other_frameworks_time_and_gnnfuses_memory_over_the_other():
    """As documented and printed under the table: speedup = framework median / gnnfuse
    median, mem ratio = gnnfuse peak / framework peak. gnnfuse at 2 ms and 1 GB against
    6 ms and 4 GB is a 3x speedup in a quarter of the memory; either ratio inverted (a
    3x speedup printed as 0.33x) passed every earlier test."""
    from gnnfuse.bench.compare import ratios
    results = {"gnnfuse": {"status": "ok", "median_ms": 2.0, "peak_gb": 1.0},
               "pyg": {"status": "ok", "median_ms": 6.0, "peak_gb": 4.0}}
    assert ratios(results, True) == {"pyg": {"speedup": 3.0, "memory": 0.25}}


def test_time_calls_on_the_cpu_reports_milliseconds():
    """A 20 ms call is timed as about 20 (the tables say "median ms"); nothing timed a
    call of known length, so a CPU time in microseconds (20000) passed."""
    import time

    from gnnfuse.bench.timing import time_calls
    times = time_calls(lambda: time.sleep(0.02), 2, torch.device("cpu"))
    assert len(times) == 2 and all(19 < t < 1000 for t in times)


def test_the_shared_initial_weights_are_seeded():
    """Every framework starts from `reference_state`'s weights, documented as seeded: two
    runs of a benchmark (and their first losses) then start alike. Nothing compared two
    calls, so weights drawn from whatever the global generator held passed."""
    from gnnfuse.bench.models import DeviceData, reference_state
    data = DeviceData("tiny", torch.randn(6, 5), torch.zeros(6, dtype=torch.long), torch.arange(3),
                      torch.tensor([[0, 1, 2], [1, 2, 3]]), 3)
    first = reference_state("gcn", data)
    torch.rand(100)                        # the global generator moves on between runs
    second = reference_state("gcn", data)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(reference_state("gcn", data, seed=1)["conv1.lin.weight"], first["conv1.lin.weight"])


def test_bench_data_trains_on_the_data_sets_training_nodes():
    """The timed step's loss is over the data set's training split (``train_idx``); an index
    of the validation nodes instead (500 rows, not 100, of the synthetic set) passed."""
    from gnnfuse.bench.models import load_data
    from gnnfuse.data import load_node_dataset
    data = load_data("synthetic", None, torch.device("cpu"))
    assert torch.equal(data.train_idx, load_node_dataset("synthetic").train_mask.nonzero().squeeze(1))
    assert data.train_idx.numel() == 100


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_the_forward_check_agrees_with_pyg_on_a_directed_graph(model):
    """gnnfuse's graph is a view of PyG's edge_index rows (source, destination). Every
    bench test ran on symmetric graphs, where the two rows read swapped give the same
    graph, so a reversed gnnfuse graph passed; on a directed one the forward against
    PyG's (same weights) must agree."""
    from gnnfuse.bench.measure import REL_ERR_LIMIT, check_forward
    from gnnfuse.bench.models import DeviceData, reference_state
    g = torch.Generator().manual_seed(0)
    edge_index = torch.stack([torch.randint(0, 12, (30,), generator=g), torch.randint(0, 12, (30,), generator=g)])
    data = DeviceData("directed", torch.randn(12, 5, generator=g), torch.zeros(12, dtype=torch.long),
                      torch.arange(4), edge_index, 3)
    assert check_forward(model, data, reference_state(model, data), torch.device("cpu")) <= REL_ERR_LIMIT
