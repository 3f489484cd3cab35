"""benchmarks/check_cuda_graph.py keeps earlier measurements a short run skips (no GPU)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def check_cuda_graph(import_script):
    return import_script(BENCHMARKS, "check_cuda_graph")


def _timing(ms, commit=None, status="ok"):
    cell = {"status": status, "median_ms": ms, "host_ms": 0.1, "cuda_graph": "captured", "graph_pool_gb": 0.5}
    return cell if commit is None else {**cell, "commit": commit}


def test_earlier_measurements_survive_and_rows_name_their_commits(check_cuda_graph, tmp_path):
    (tmp_path / "cuda_graph.json").write_text(json.dumps({"timings": {
        "arxiv-like/gcn/gnnfuse-captured": _timing(1.78, "aaaaaaa"),
        "arxiv-like/gcn/pyg-compile": {"status": "skipped (time budget)"}}}))
    earlier = check_cuda_graph.measured_timings(tmp_path / "cuda_graph.json")
    assert list(earlier) == ["arxiv-like/gcn/gnnfuse-captured"]     # a skipped cell is no measurement
    assert check_cuda_graph.measured_timings(tmp_path / "absent.json") == {}
    results = {"environment": "H100", "datasets": ["arxiv-like"], "peers": ["pyg-compile"], "equivalence": {},
               "fresh_masks": {}, "forward_checks": {}, "timings": {
                   "arxiv-like/gcn/gnnfuse-captured": earlier["arxiv-like/gcn/gnnfuse-captured"],
                   "arxiv-like/gcn/pyg-compile": _timing(3.56, "bbbbbbb")}}
    row = next(line for line in check_cuda_graph.render(results).splitlines() if line.startswith("| arxiv-like | gcn"))
    assert "1.78 (0.10)" in row and "3.56 (0.10)" in row and "| 2.00 |" in row
    assert row.endswith("| aaaaaaa, bbbbbbb |")
