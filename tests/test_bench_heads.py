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
