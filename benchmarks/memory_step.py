"""What is alive on the GPU at the peak of one gnnfuse training step, and who allocated it.

``bench_training.py`` reports one number per cell: the step's peak memory. To lower it we
need the composition of that peak. This script builds the benchmark's model and graph
exactly as ``bench_training.py`` does (same data, same `DeviceData` views, same step, run
uncaptured so every allocation is visible), records the CUDA caching allocator's history
with Python stacks, replays the recorded allocations and frees of one step, and prints

* the resident set before the step (graph layouts, features, weights, optimiser state),
* the live blocks at the step's peak, grouped by the innermost gnnfuse (or benchmark)
  source line that allocated them, largest first.

    python benchmarks/memory_step.py --model gat --dataset products-like
"""
from __future__ import annotations

import argparse
import collections
import os

import torch

from gnnfuse.bench.measure import LR, WEIGHT_DECAY, training_step
from gnnfuse.bench.models import instantiate, load_data, reference_state

import torch.nn.functional as F

OURS = os.sep + "gnnfuse" + os.sep


def site(frames: list[dict]) -> str:
    """The innermost frame in gnnfuse's sources or a benchmark script, else the innermost."""
    for frame in frames:
        name = frame.get("filename", "")
        if (OURS in name or "benchmarks" in name) and "memory_step" not in name:
            short = name.split(OURS, 1)[-1] if OURS in name else os.path.basename(name)
            return f"{short}:{frame.get('line')} {frame.get('name')}"
    return "<no python frame>" if not frames else f"{frames[0].get('filename')}:{frames[0].get('line')}"


def replay(events: list[dict], start: int) -> tuple[dict, int, dict]:
    """Live blocks at the highest total after event `start`, that total, and the blocks
    live at `start` (the resident set)."""
    live: dict[int, tuple[int, str]] = {}
    total, best, best_live, resident = 0, -1, {}, {}
    for index, event in enumerate(events):
        if index == start:
            resident = dict(live)
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = (event["size"], site(event.get("frames", [])))
            total += event["size"]
        elif action == "free_requested" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
        if index >= start and total > best:
            best, best_live = total, dict(live)
    return best_live, best, resident


def table(blocks: dict, title: str, top: int) -> None:
    sums: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0])
    for size, where in blocks.values():
        sums[where][0] += size
        sums[where][1] += 1
    print(f"\n{title}: {sum(s for s, _ in blocks.values()) / 1e9:.3f} GB in {len(blocks)} blocks")
    for where, (size, count) in sorted(sums.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {size / 1e9:7.3f} GB {count:4d} x  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gat")
    parser.add_argument("--dataset", default="products-like")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    data = load_data(args.dataset, None, device, log=print)
    module = instantiate("gnnfuse", args.model, data, reference_state(args.model, data), device)
    train_y = data.y[data.train_idx]
    graph = data.gnnfuse_graph()
    step = training_step(module, lambda: F.cross_entropy(module(data.x, graph)[data.train_idx], train_y),
                         device, "off", "gnnfuse", lr=LR, weight_decay=WEIGHT_DECAY)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    at_peak, peak, resident = replay(events, start)
    print(f"{args.model} on {args.dataset}: max_memory_allocated {torch.cuda.max_memory_allocated() / 1e9:.3f} GB, "
          f"replayed peak {peak / 1e9:.3f} GB ({len(events) - start} events in the step)")
    table(resident, "resident before the step", args.top)
    table({a: b for a, b in at_peak.items() if a not in resident}, "allocated by the step, live at its peak", args.top)


if __name__ == "__main__":
    main()
