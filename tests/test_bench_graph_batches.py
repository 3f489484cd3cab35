"""benchmarks/bench_graph_batches.py on a tiny CPU run, per task: both models' steps are
timed on the same batches after their eval outputs agree, and the regression task's
replayed side trains on masked labels (its epoch, on the padded loader, runs the masked
loss; on the CPU the step runs eagerly)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch_geometric.nn")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_bench_graph_batches_times_both_models_per_task(task, tmp_path, import_script):
    bench = import_script(BENCHMARKS, "bench_graph_batches")
    path = tmp_path / "graph_batches.json"
    bench.main(["--device", "cpu", "--models", "GIN", "--graphs", "4", "--batches", "4", "--hidden", "8",
                "--layers", "2", "--steps", "2", "--warmup", "1", "--blocks", "1", "--task", task,
                "--epochs", "1", "--epoch-workers", "0", "--epoch-sources", "list", "--json", str(path)])
    cells = json.loads(path.read_text())["cells"]
    (key, cell), = cells.items()
    assert key == ("GIN/4" if task == "classification" else "GIN/4/regression") and cell["task"] == task
    assert cell["max_rel_err"] < 1e-5
    assert cell["gnnfuse"]["median_ms"] > 0 and cell["pyg"]["median_ms"] > 0
    epochs = cell["epochs"]["list/0"]
    assert all(isinstance(epochs[kind], float) for kind in ("pyg", "gnnfuse", "gnnfuse_captured")), epochs
    assert f"| GIN | {task} | 4 |" in path.with_suffix(".md").read_text()


def test_no_speedup_beside_a_failed_check(import_script):
    """A step whose eval forward failed its check gets no speed-up (eager or captured), a
    replayed loss off the eager one no captured speed-up, and both show **FAIL**."""
    bench = import_script(BENCHMARKS, "bench_graph_batches")
    timed = {"pyg": {"median_ms": 4.0}, "gnnfuse": {"median_ms": 2.0}, "gnnfuse_captured": {"median_ms": 1.0}}
    assert bench.speedups({**timed, "max_rel_err": 1e-7, "captured_loss_error": 0.0}) == (2.0, 4.0)
    assert bench.speedups({**timed, "max_rel_err": 0.5, "captured_loss_error": 0.0}) == (None, None)
    assert bench.speedups({**timed, "max_rel_err": float("nan"), "captured_loss_error": 0.0}) == (None, None)
    assert bench.speedups({**timed, "max_rel_err": 1e-7, "captured_loss_error": 0.5}) == (2.0, None)
    cell = {**timed, "model": "GIN", "graphs": 4, "vertices_per_batch": 40.0, "hidden": 8, "layers": 2,
            "max_rel_err": 0.5, "captured_loss_error": 0.5, "speedup": 2.0, "captured_speedup": 4.0}
    table = bench.markdown({"runs": {}, "cells": {"GIN/4": cell}})
    assert "| 2.00 | 4.00 | – | 5.0e-01 **FAIL** | 1.00 | – | 5.0e-01 **FAIL** |" in table
