"""benchmarks/bench_aggregate.py times launched calls with the methods taking turns (CPU)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench_aggregate(import_script):
    return import_script(BENCHMARKS, "bench_aggregate")


def test_launched_calls_take_turns_and_a_failure_stays_its_methods(bench_aggregate):
    order = []
    x = torch.ones(4, 2)

    def method(name, fail_at=None):
        def call(t):
            order.append(name)
            if fail_at is not None and order.count(name) == fail_at:
                raise RuntimeError("boom")
            return t * 2
        return call
    args = argparse.Namespace(warmup=1, repeats=3, blocks=2)
    fns = {"a": method("a"), "b": method("b"), "c": method("c", fail_at=3)}
    cells = bench_aggregate.measure(fns, x, {"a": x * 2, "b": None, "c": x}, args, torch.device("cpu"), 8)
    timed = order[3:]       # after one warm-up call each
    # block 1: a, b, then c, whose second timed call fails; block 2: a and b only; then
    # a's output is checked (b has nothing to be checked against)
    assert timed == ["a"] * 3 + ["b"] * 3 + ["c"] * 2 + ["a"] * 3 + ["b"] * 3 + ["a"]
    assert cells["a"]["repeats"] == 6 and cells["a"]["blocks"] == 2 and cells["a"]["rel_err"] == 0
    assert cells["b"]["rel_err"] is None and cells["b"]["median_ms"] >= 0
    assert cells["c"]["status"] != "ok" and "median_ms" not in cells["c"]


def test_no_speedup_beside_a_failed_check(bench_aggregate):
    """A method whose output failed its check gets no speedup (gnnfuse's: none at all), and
    NaN fails the check too."""
    results = {"runs": {"gpu": {"device_name": "H100", "copy_bandwidth_gbs": 100.0}}}

    def cell(ms, err):
        return {"status": "ok", "median_ms": ms, "gb_per_s": 10.0, "rel_err": err, "run": "gpu"}
    row = bench_aggregate.table_row(results, 64, [cell(1.0, 0.5), cell(2.0, None), cell(3.0, 0.0)])
    assert row[-3:] == ["–", "–", "5.0e-01 **FAIL**"]
    row = bench_aggregate.table_row(results, 64, [cell(1.0, 0.0), cell(2.0, None), cell(3.0, float("nan"))])
    assert row[-3:] == ["2.00", "–", "nan **FAIL**"]
    assert bench_aggregate.table_row(results, 64, [cell(1.0, 0.0), cell(2.0, None), cell(3.0, 0.0)])[-3:] == [
        "2.00", "3.00", "0.0e+00"]


def test_no_warm_up_times_the_methods_and_bad_counts_are_usage_errors(bench_aggregate, capsys):
    """``--warmup 0`` ended the run with "TypeError: list indices must be integers or
    slices, not str" (the warm-up's empty list stood in for the method's status), and
    ``--blocks 0`` timed nothing and failed on the missing times."""
    x = torch.ones(4, 2)
    args = argparse.Namespace(warmup=0, repeats=2, blocks=1)
    cells = bench_aggregate.measure({"a": lambda t: t * 2}, x, {"a": x * 2}, args, torch.device("cpu"), 8)
    assert cells["a"]["status"] == "ok" and cells["a"]["repeats"] == 2 and cells["a"]["rel_err"] == 0
    for option in (["--blocks", "0"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit):
            bench_aggregate.parse_args(["--device", "cpu", *option])
        assert option[0] in capsys.readouterr().err
