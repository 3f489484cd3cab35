"""benchmarks/bench_attention.py's issue-13 target table, from canned results (no GPU)."""
from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench_attention(import_script):
    return import_script(BENCHMARKS, "bench_attention")


def _run(device_name):
    return {"device_name": device_name, "torch": "2.11", "triton": "3.6", "torch_geometric": "2.8",
            "git_commit": None, "git_dirty": None, "date": "2026-11-23"}


def _cell(status="ok", ms=None, gb=None, run="gpu"):
    return {"status": status, "median_ms": ms, "extra_peak_gb": gb, "run": run}


def test_targets_compare_time_and_memory_per_cell_and_name_what_failed(bench_attention):
    results = {
        "runs": {"gpu": _run("H100"), "other": _run("A100")},
        "graphs": {"arxiv-like": {}, "products-like": {}},
        "cells": {
            "arxiv-like/4x32/gnnfuse": _cell(ms=7.0, gb=0.5),        # faster, but more memory
            "arxiv-like/4x32/turbo-gnn": _cell(ms=9.4, gb=0.35),
            "arxiv-like/1x64/gnnfuse": _cell(ms=4.0, gb=0.1, run="other"),
            "arxiv-like/1x64/turbo-gnn": _cell(ms=11.6, gb=0.18),
            "products-like/4x32/gnnfuse": _cell("oom"),
            "products-like/4x32/turbo-gnn": _cell(ms=272.0, gb=5.06),
            "products-like/8x8/gnnfuse": _cell(ms=167.0, gb=3.0),
            "products-like/8x8/turbo-gnn": _cell("error: RuntimeError: unsupported head dim D=8"),
            "products-like/1x64/gnnfuse": _cell(ms=90.0, gb=2.0),
            "products-like/1x64/turbo-gnn": _cell("oom"),
            "products-like/1x64/torch": _cell("oom"),
        },
    }
    rows = {(name, shape): rest for name, shape, *rest in bench_attention.target_rows(results)}
    assert rows[("arxiv-like", "4x32")] == ["7.00 / 9.40 ms", "met", "0.50 / 0.35 GB", "missed"]
    assert rows[("arxiv-like", "1x64")][1] == "n/a (measured on different devices)"
    assert rows[("products-like", "4x32")][1::2] == ["missed (gnnfuse: oom)"] * 2
    assert rows[("products-like", "8x8")][1] == "n/a (turbo-gnn: error: RuntimeError: unsupported head dim D=8)"
    assert rows[("products-like", "1x64")][1::2] == ["met (turbo-gnn: oom)"] * 2
    markdown = bench_attention.render_markdown(results)
    assert "| products-like | 4 × 32 | – | missed (gnnfuse: oom) |" in markdown


def test_a_failed_check_meets_no_target(bench_attention):
    """A faster kernel computing something else meets nothing: gnnfuse's failed check misses
    both targets, turbo-gnn's leaves no number to meet, and NaN is a failure (no ``> limit``
    catches it)."""
    ok = {"rel_err": {"out": 1e-6}, "checked_against": "torch"}
    results = {"runs": {"gpu": _run("H100")}, "graphs": {"a": {}, "b": {}, "c": {}},
               "cells": {"a/4x32/gnnfuse": {**_cell(ms=1.0, gb=0.1), "rel_err": {"out": 0.5},
                                            "checked_against": "torch"},
                         "a/4x32/turbo-gnn": {**_cell(ms=9.0, gb=0.5), **ok},
                         "b/4x32/gnnfuse": {**_cell(ms=1.0, gb=0.1), "rel_err": {"out": float("nan")},
                                            "checked_against": "torch"},
                         "b/4x32/turbo-gnn": {**_cell(ms=9.0, gb=0.5), **ok},
                         "c/4x32/gnnfuse": {**_cell(ms=1.0, gb=0.1), **ok},
                         "c/4x32/turbo-gnn": {**_cell(ms=9.0, gb=0.5), "rel_err": {"out": 0.5},
                                              "checked_against": "torch"}}}
    rows = {name: rest for name, _, *rest in bench_attention.target_rows(results)}
    assert rows["a"][1::2] == rows["b"][1::2] == ["missed (gnnfuse's check failed)"] * 2
    assert rows["c"][1::2] == ["n/a (turbo-gnn's check failed)"] * 2
    assert "nan vs torch **FAIL**" in bench_attention.render_markdown(results)


def test_a_nan_gradient_beside_a_good_output_fails_the_check(bench_attention):
    """The worst of a cell's errors is NaN when any is: ``max`` keeps whichever of NaN and a
    number comes first, so a NaN gradient listed after a good output passed."""
    cell = {**_cell(ms=1.0, gb=0.1), "rel_err": {"out": 1e-7, "x_l": float("nan")}, "checked_against": "torch"}
    assert bench_attention.max_error(cell) != bench_attention.max_error(cell)
    assert bench_attention.error_text(cell).endswith("**FAIL**")


def test_a_rerun_without_torch_still_checks_gnnfuse_against_torch(bench_attention, monkeypatch, tmp_path):
    """``--methods gnnfuse`` (re-timing gnnfuse after a change) made gnnfuse the first method
    to run, hence the oracle: its cell had no error and the table said "oracle" beside an
    "ok" torch cell, whatever gnnfuse computed. torch's answer is now computed as the check
    even when torch is not timed."""
    import argparse

    import torch

    real = bench_attention.build_method

    def build(method, problem, att, turbo):
        if method == "gnnfuse":       # a kernel computing twice the answer
            forward = real("torch", problem, att, turbo)
            return lambda x_l, x_r, a: 2 * forward(x_l, x_r, a)
        return real(method, problem, att, turbo)
    monkeypatch.setattr(bench_attention, "build_method", build)
    edges = torch.tensor([[0, 1, 2, 3, 0], [1, 2, 3, 0, 2]])
    problem = bench_attention.Problem("tiny", edges, 4)
    args = argparse.Namespace(methods=["gnnfuse"], warmup=1, reps=1, profile=False, cell_timeout=None, out=tmp_path)
    results = {"runs": {"r": _run("cpu")}, "graphs": {"tiny": {"run": "r"}}, "cells": {}}
    bench_attention.run_cell(problem, 2, 4, None, None, args, torch.device("cpu"), results, "r")
    cell = results["cells"]["tiny/2x4/gnnfuse"]
    assert cell["checked_against"] == "torch" and bench_attention.max_error(cell) > 0.4
    assert bench_attention.error_text(cell).endswith("**FAIL**")
    assert "tiny/2x4/torch" not in results["cells"]
