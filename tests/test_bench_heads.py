"""benchmarks/bench_heads.py on a tiny CPU run: a wide-head cell and an averaged one run
against PyG from the same weights and land in the JSON and Markdown."""
from __future__ import annotations

import json
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_cells_compare_gnnfuse_with_pyg_from_the_same_weights(tmp_path, import_script):
    bench = import_script(BENCHMARKS, "bench_heads")
    path = tmp_path / "heads.json"
    bench.main(["--device", "cpu", "--datasets", "synthetic", "--cells", "GAT 8x64,GAT 8x47 mean",
                "--steps", "1", "--warmup", "1", "--json", str(path)])
    cells = json.loads(path.read_text())["cells"]
    assert sorted(cells) == ["synthetic/GAT 8x47 mean", "synthetic/GAT 8x64"]
    for cell in cells.values():
        assert "status" not in cell and cell["rel_err"] < 1e-5
        assert cell["gnnfuse"]["median_ms"] > 0 and cell["pyg"]["median_ms"] > 0
    table = path.with_suffix(".md").read_text()
    assert "| synthetic | GAT 8x47 mean |" in table and "speed-up" in table


def test_no_speedup_or_memory_ratio_beside_a_failed_check(import_script):
    """bench_pyg_layers' and bench_heads' table: a layer whose forward failed its check
    (or gave NaN) gets **FAIL** and no speed-up or memory ratio."""
    bench = import_script(BENCHMARKS, "bench_pyg_layers")
    timed = {"gnnfuse": {"median_ms": 1.0, "peak_gb": 0.1, "warmup_s": 1.0}, "pyg": {"median_ms": 3.0, "peak_gb": 0.4}}
    results = {"runs": {"r": {"device_name": "H100", "torch": "2.11", "triton": "3.6", "torch_geometric": "2.8",
                              "git_commit": None, "git_dirty": None, "date": "2026-12-05"}},
               "cells": {"d/Bad": {**timed, "rel_err": 0.5, "run": "r"},
                         "d/Nan": {**timed, "rel_err": float("nan"), "run": "r"},
                         "d/Good": {**timed, "rel_err": 1e-7, "run": "r"}}}
    lines = {line.split(" | ")[1]: line for line in bench.markdown(results).splitlines() if line.startswith("| d |")}
    assert lines["Bad"].endswith("| – | – | 1.0 | 5.0e-01 **FAIL** |")
    assert lines["Nan"].endswith("| – | – | 1.0 | nan **FAIL** |")
    assert lines["Good"].endswith("| 3.00x | 0.25 | 1.0 | 1.0e-07 |")
