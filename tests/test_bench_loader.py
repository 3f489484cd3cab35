"""benchmarks/bench_loader.py on a tiny CPU run: both hop paths timed in turns, per
thread count, into JSON and Markdown."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_bench_loader_times_both_hop_paths_in_turns(tmp_path, import_script, monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.delenv("GNNFUSE_FUSED_HOPS", raising=False)     # restored after, whatever the bench set
    bench = import_script(BENCHMARKS, "bench_loader")
    bench.main(["--dataset", "synthetic", "--fanout", "3,2", "--batch-size", "8", "--threads", "1",
                "--batches", "2", "--rounds", "2", "--out", str(tmp_path)])
    cells = json.loads((tmp_path / "loader_cpu.json").read_text())["cells"]
    assert {key.rsplit("/", 1)[1] for key in cells} == {"torch", "fused"}
    assert all(len(cell["round_ms"]) == 2 and cell["median_ms"] > 0 for cell in cells.values())
    assert "| synthetic | 3,2 | 8 | cpu | 1 |" in (tmp_path / "loader_cpu.md").read_text()
