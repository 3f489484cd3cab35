"""benchmarks/bench_first_step.py on a tiny CPU run: each setup's first steps run in a
process of their own, once per source tree, and land in the JSON and Markdown."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_each_setup_runs_in_its_own_process_per_source_tree(tmp_path, import_script):
    bench = import_script(BENCHMARKS, "bench_first_step")
    path = tmp_path / "first.json"
    source = BENCHMARKS.parent / "src"
    bench.main(["--device", "cpu", "--dataset", "synthetic", "--setups", "gcn", "--steps", "2",
                "--source", f"again={source}", "--json", str(path)])
    cells = json.loads(path.read_text())["cells"]
    assert [(c["setup"], c["label"], c["status"]) for c in cells] == [("gcn", "this tree", "ok"),
                                                                       ("gcn", "again", "ok")]
    for cell in cells:
        assert [s["step"] for s in cell["steps"]] == [0, 1] and all(s["s"] > 0 for s in cell["steps"])
    table = path.with_suffix(".md").read_text()
    assert "| gcn | again | ok |" in table and "step 2 s" in table


def test_a_source_without_gnnfuse_is_refused(tmp_path, import_script, capsys):
    bench = import_script(BENCHMARKS, "bench_first_step")
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--source", f"old={tmp_path}", "--json", str(tmp_path / "x.json")])
    assert "holds no gnnfuse package" in capsys.readouterr().err
