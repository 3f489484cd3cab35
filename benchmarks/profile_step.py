"""Where one gnnfuse training step spends its time and memory, step by step of the plan.

Every fused unit and every plain torch op the executor runs is bracketed by CUDA
synchronisation, so each line shows that step's own time, the memory it allocated
(its output) and the transient peak above what was allocated before it. A step is
listed as the unit's ``describe()`` or the op's name with its residency and shape. The
totals at the end compare the summed step times with the whole step, whose difference is
Python overhead (tracing, cache lookups, launching) plus dense torch work outside the
compiled programs (linear layers, the loss, Adam).

    python benchmarks/profile_step.py --model gat --dataset arxiv-like
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import time

import torch

from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.bench import build_model
from gnnfuse.data import load_dataset
from gnnfuse.ir import registry

import torch.nn.functional as F


def profiled(records: list, label, fn):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    begin = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    records.append((label(out), (time.perf_counter() - begin) * 1e3,
                    (torch.cuda.memory_allocated() - before) / 1e9,
                    (torch.cuda.max_memory_allocated() - before) / 1e9))
    return out


def install(records: list) -> None:
    """Wrap the Triton executor's unit runner and every op's torch reference. A sibling
    group that runs its members one by one calls the unit runner again for each: only
    the outermost call is recorded, so no time is counted twice."""
    run_unit, run_op = triton_executor.run_unit, registry.OpDef.run
    depth = [0]

    def unit(u, ctx, leaves):
        if depth[0]:
            return run_unit(u, ctx, leaves)
        depth[0] += 1
        try:
            return profiled(records, lambda out: f"unit  {u.describe()}", lambda: run_unit(u, ctx, leaves))
        finally:
            depth[0] -= 1

    def op(self, ctx, tensors, residencies, attrs):
        if ctx is None:          # shape inference on meta tensors
            return run_op(self, ctx, tensors, residencies, attrs)
        return profiled(records, lambda out: f"torch {self.name}{list(out.shape)} {attrs.get('by', '')}",
                        lambda: run_op(self, ctx, tensors, residencies, attrs))

    triton_executor.run_unit = unit
    registry.OpDef.run = op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gat")
    parser.add_argument("--dataset", default="arxiv-like")
    parser.add_argument("--top", type=int, default=25, help="steps listed, slowest first")
    parser.add_argument("--cprofile", action="store_true",
                        help="also list the Python functions with the most own and cumulative time over 20 steps")
    parser.add_argument("--kernels", action="store_true",
                        help="also list the GPU kernels (generated and torch's) with the most time over 3 "
                             "steps, from torch.profiler: where the step's time goes outside the plan too")
    args = parser.parse_args()
    data = load_dataset(args.dataset)
    device = torch.device("cuda")
    graph = data.graph.to(device)
    x, y = data.x.to(device), data.y.to(device)
    train = data.train_mask.nonzero().squeeze(1).to(device)
    model = build_model("gnnfuse", args.model, x.shape[1], data.num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, graph)[train], y[train])
        loss.backward()
        optimizer.step()

    for _ in range(3):           # compile, autotune, build layouts
        step()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    step()
    torch.cuda.synchronize()
    whole_ms = (time.perf_counter() - begin) * 1e3
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(10):          # unsynchronised, as training runs: GPU- or CPU-bound?
        step()
    cpu_ms = (time.process_time() - cpu) * 1e2
    torch.cuda.synchronize()
    pipelined_ms = (time.perf_counter() - wall) * 1e2
    torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated() / 1e9
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 1e9

    if args.cprofile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        profiler.disable()
        for order in ("tottime", "cumulative"):
            pstats.Stats(profiler).sort_stats(order).print_stats(args.top)

    if args.kernels:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top, max_name_column_width=70))

    records: list = []
    install(records)
    step()
    merged: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for label, ms, alloc, transient in records:
        entry = merged[label]
        entry[0] += 1
        entry[1] += ms
        entry[2] = max(entry[2], alloc)
        entry[3] = max(entry[3], transient)
    print(f"{args.model} on {args.dataset}: N={graph.num_nodes:,} E={graph.num_edges:,}; "
          f"whole step {whole_ms:.2f} ms, resident {resident:.3f} GB, step peak {peak:.3f} GB")
    print(f"10 steps back to back: {pipelined_ms:.2f} ms per step, of which {cpu_ms:.2f} ms CPU time "
          "(close to equal: the host, not the GPU, sets the pace)")
    print(f"{'calls':>5} {'ms':>8} {'out GB':>7} {'peak GB':>8}  step")
    for label, (calls, ms, alloc, transient) in sorted(merged.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{calls:5d} {ms:8.3f} {alloc:7.3f} {transient:8.3f}  {label[:150]}")
    print(f"sum of profiled steps {sum(r[1] for r in records):.2f} ms over {len(records)} steps "
          f"(synchronised; the rest of the {whole_ms:.2f} ms step is Python and dense torch work)")


if __name__ == "__main__":
    main()
