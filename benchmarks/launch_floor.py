"""How close a launched neighbour sum is to the floor of launching its kernel from Python.

A "launched" cell of `bench_aggregate.py` times one call from an idle GPU: the host's
work before the kernel plus the kernel. This splits gnnfuse's call on the GPU's host into
what no Python library can avoid and what is ours: per call (median host time after a
synchronize) ``torch.empty`` and ``torch.zeros`` of the output, the plan's bound launch
alone (`direct_launch.BoundLaunch`, into a preallocated output), the floor (an empty
output and the bound launch, which leaves split rows unzeroed: timing only), the same with
the output zeroed, the whole gnnfuse call and ``torch.sparse.mm``; then each one's
latency measured as `bench_aggregate` does, and the kernels' GPU times (torch.profiler).

Host time and latency are measured with the pieces taking turns (`ROUNDS` rounds of a
few calls each), as `bench_aggregate` times its methods: the GPU machine's host runs
2-2.5x faster or slower within a process, and timed one piece after another (this
script's first version) a slow spell landed on one piece. That version put gnnfuse's own
host time at an arxiv-sized F = 1 at 8 us; in turns it reads 21-31 us.

    PYTHONPATH=src:benchmarks python benchmarks/launch_floor.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import gnnfuse.backend.triton.prepared_run as prepared_run
from bench_aggregate import build_operands, neighbour_sum
from common import environment
from gnnfuse.bench.timing import time_calls
from gnnfuse.data import load_dataset


ROUNDS = 40      # rounds in which every piece takes its turn


def host_times(fn, calls: int) -> list[float]:
    """Host time of each of ``calls`` calls of ``fn`` in microseconds, each after a synchronize."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        fn()
        times.append((time.perf_counter() - begin) * 1e6)
    return times


def in_turns(pieces: dict, measure, calls: int) -> dict[str, float]:
    """Median of ``measure(fn, calls_per_round)`` (a list of microseconds) per piece, over
    `ROUNDS` rounds in which the pieces take turns."""
    times: dict[str, list[float]] = {name: [] for name in pieces}
    per_round = max(1, calls // ROUNDS)
    for _ in range(ROUNDS):
        for name, fn in pieces.items():
            times[name] += measure(fn, per_round)
    return {name: round(statistics.median(t), 1) for name, t in times.items()}


def latency_times(device: torch.device):
    return lambda fn, calls: [ms * 1e3 for ms in time_calls(fn, calls, device)]


def kernel_us(fn, calls: int = 50) -> dict[str, float]:
    """GPU time per call of each kernel ``fn`` launches."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    return {e.key[:48]: round(e.self_device_time_total / calls, 1) for e in prof.key_averages()
            if e.self_device_time_total > 0}


def measure(name: str, width: int, device: torch.device) -> dict:
    held = {}
    real = prepared_run.run_launch

    def spy(plan, leaves):
        held["plan"] = plan
        return real(plan, leaves)
    prepared_run.run_launch = spy
    try:
        ops = build_operands(load_dataset(name, None).graph, device)
        x = torch.randn(ops.graph.num_nodes, width, device=device)

        def ours():
            return neighbour_sum(ops.graph, {"h": x})

        def sparse():
            return torch.sparse.mm(ops.adjacency, x)
        for _ in range(20):
            ours(), sparse()
    finally:
        prepared_run.run_launch = real
    plan = held["plan"]
    bound, shape, dtype = plan.bound[0], plan.out_shape, plan.out_dtype
    extra = () if plan.workspace is None else tuple(plan.workspaces[next(iter(plan.workspaces))])
    if plan.carried is not None:    # the next call's output, which the kernel zeroes: one made once
        extra = (torch.empty(shape, dtype=dtype, device=device),)
    ready = torch.empty(shape, dtype=dtype, device=device)

    def floor_empty():
        bound((torch.empty(shape, dtype=dtype, device=device), *extra, x))

    def floor_zeros():
        bound((torch.zeros(shape, dtype=dtype, device=device), *extra, x))
    pieces = {"empty": lambda: torch.empty(shape, dtype=dtype, device=device),
              "zeros": lambda: torch.zeros(shape, dtype=dtype, device=device),
              "bound_launch": lambda: bound((ready, *extra, x)),
              "floor_empty": floor_empty, "floor_zeros": floor_zeros, "gnnfuse": ours, "sparse_mm": sparse}
    return {"graph": name, "features": width, "output_zeroed": bool(plan.zeros), "output_carried": plan.carried is not None,
            "workspace": plan.workspace is not None,
            "host_us": in_turns(pieces, host_times, 1600),
            "latency_us": in_turns({k: pieces[k] for k in ("floor_empty", "floor_zeros", "gnnfuse", "sparse_mm")},
                                   latency_times(device), 400),
            "kernels_us": {"gnnfuse": kernel_us(ours), "sparse_mm": kernel_us(sparse)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="arxiv-like:1,arxiv-like:32,arxiv-like:64,arxiv-like:128,reddit2-like:1")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = [measure(cell.split(":")[0], int(cell.split(":")[1]), device) for cell in args.cells.split(",")]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out is not None:
        (args.out / "launch_floor.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                                "environment": environment(device),
                                                                "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
