"""On a GPU: split rows meeting in their workspace give cuSPARSE's sums, call after call.

The segments of a hub row add into a per-plan workspace, count themselves, and the last
to arrive stores the row (`backend/triton/codegen._split_row_fixup`). CI runs Triton's
interpreter, which runs one program at a time, so the ordering that makes this correct
(the adds before the count, the count seen complete before the read) is only exercised
here, with thousands of programs in flight. For each preset graph, schedule (the CSR
walk and ``rows`` by default, ``--schedules``) and width, this runs the neighbour sum many times launched, replayed
from a CUDA graph, and on two streams at once, checks every output against
``torch.sparse.mm`` and checks the workspaces are all zero afterwards.

    PYTHONPATH=src:benchmarks python benchmarks/check_split_rows.py --dataset arxiv-like,reddit2-like
"""
from __future__ import annotations

import argparse
import os

import torch

from bench_aggregate import build_operands, neighbour_sum
from common import worst_error
from gnnfuse.backend.triton import executor
from gnnfuse.data import load_dataset

TOLERANCE = 1e-5      # float32 sums in another order than cuSPARSE's


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def tally(worst: float, wrong: int, err: float) -> tuple[float, int]:
    """(worst error, wrong calls) counting one more call's error: a NaN output is wrong and
    the worst, which ``err > TOLERANCE`` and ``max(worst, err)`` both let through."""
    return worst_error([worst, err]), wrong + (not err <= TOLERANCE)


def workspaces_clean(graph) -> tuple[int, bool]:
    """How many workspaces the graph's plans hold, and whether all are zero."""
    count, clean = 0, True
    for per_graph in list(executor._LAUNCHES._plans.values()):
        entry = per_graph.get(graph)
        plan = entry[1] if entry is not None else None
        for work, arrived in (getattr(plan, "workspaces", None) or {}).values():
            count += 1
            clean &= not bool(work.any()) and not bool(arrived.any())
    return count, clean


def check(name: str, schedule: str, width: int, calls: int, device: torch.device) -> dict:
    os.environ["GNNFUSE_SCHEDULE"] = schedule
    ops = build_operands(load_dataset(name, os.environ.get("GNNFUSE_DATA")).graph, device)
    graph = ops.graph
    worst, bad = 0.0, 0
    inputs = [torch.randn(graph.num_nodes, width, device=device) for _ in range(4)]
    expected = [torch.sparse.mm(ops.adjacency, x) for x in inputs]
    for call in range(calls):                                  # launched, back to back
        k = call % len(inputs)
        err = rel_err(neighbour_sum(graph, {"h": inputs[k]}), expected[k])
        worst, bad = tally(worst, bad, err)
    static = inputs[0].clone()
    graph_capture = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        neighbour_sum(graph, {"h": static})
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph_capture):
        captured = neighbour_sum(graph, {"h": static})
    for call in range(calls // 4):                             # replayed, fresh inputs copied in
        k = call % len(inputs)
        static.copy_(inputs[k])
        graph_capture.replay()
        err = rel_err(captured, expected[k])
        worst, bad = tally(worst, bad, err)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]      # two streams at once, one workspace each
    outs = [[], []]
    torch.cuda.synchronize()
    for call in range(calls // 4):
        for n, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                outs[n].append(neighbour_sum(graph, {"h": inputs[(call + n) % len(inputs)]}))
    torch.cuda.synchronize()
    for n in range(2):
        for call, out in enumerate(outs[n]):
            err = rel_err(out, expected[(call + n) % len(inputs)])
            worst, bad = tally(worst, bad, err)
    held, clean = workspaces_clean(graph)
    return {"graph": name, "schedule": schedule, "width": width, "calls": calls + calls // 4 + 2 * (calls // 4),
            "max_rel_err": worst, "wrong": bad, "workspaces": held, "workspaces_zero": clean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="arxiv-like,reddit2-like")
    parser.add_argument("--widths", default="1,3,32,64,300")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--schedules", default="csr,rows",
                        help="GNNFUSE_SCHEDULE values to check (auto: what the cost rule picks)")
    args = parser.parse_args()
    device = torch.device("cuda")
    failed = False
    for name in args.dataset.split(","):
        for schedule in args.schedules.split(","):
            for width in (int(w) for w in args.widths.split(",")):
                result = check(name, schedule, width, args.calls, device)
                ok = result["wrong"] == 0 and result["workspaces_zero"] and result["workspaces"] > 0
                failed |= not ok
                print(("ok  " if ok else "FAIL"), result, flush=True)
    os.environ.pop("GNNFUSE_SCHEDULE", None)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
