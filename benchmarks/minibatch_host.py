"""Host-side cost of a mini-batch training step on fresh blocks, on the CPU.

Each sampled block is a new graph, so whatever layers and backends derive per graph is
paid per block; on a GPU the part of it that reads a count back to the host also stalls
the device. This measures, for GraphSAGE (3 layers, fanouts 15,10,5) on a power-law
graph, per batch:

- the step's host time (forward + backward) on fresh blocks and on the same blocks
  again (their per-graph caches then warm): the difference is the per-block work;
- Python function calls (cProfile), aten ops and host-syncing ops (`HostSyncCounter`)
  per step on fresh blocks;
- the loader's time per batch (no prefetch), which now builds the blocks' layouts, and
  per stage (sample, reindex -- which includes building the blocks' graphs and layouts
  -- lookup, transfer): host ms, aten ops and host syncs per batch.

With ``--backend triton`` the Triton interpreter compiles the kernels on a warm-up
batch, then launches are replaced by no-ops: what is left is the host work a GPU step
does around its kernels. Times are medians of ``--repeats`` runs (the machine may be
shared: the spread is printed).

    python benchmarks/minibatch_host.py --backend triton
    python benchmarks/minibatch_host.py --backend reference --hidden 16
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ms (range {min(values):.2f}-{max(values):.2f})"


def counting_stage_times():
    """A `StageTimes` that also counts, per stage, the aten ops and host syncs issued
    inside it (`HostSyncCounter`)."""
    from collections import Counter
    from contextlib import contextmanager

    from gnnfuse.bench.host_syncs import HostSyncCounter
    from gnnfuse.loader.stages import StageTimes

    class CountingStageTimes(StageTimes):
        def reset(self) -> None:
            super().reset()
            self.ops: dict[str, Counter] = {}
            self.syncs: dict[str, Counter] = {}

        @contextmanager
        def timing(self, stage, sync=None, *, stream=None):
            counter = HostSyncCounter()
            with counter, super().timing(stage, sync, stream=stream):
                yield
            self.ops.setdefault(stage, Counter()).update(counter.ops)
            self.syncs.setdefault(stage, Counter()).update(counter.syncs)

    return CountingStageTimes()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("reference", "triton"), default="triton")
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batches", type=int, default=10, help="batches per timed run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.backend == "triton":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("triton was imported before TRITON_INTERPRET=1 could be set")
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ["GNNFUSE_BACKEND"] = args.backend

    import torch
    import torch.nn.functional as F
    from gnnfuse.bench.host_syncs import HostSyncCounter
    from gnnfuse.data.synthetic import power_law_graph
    from gnnfuse.loader import NeighborLoader
    from gnnfuse.nn.block_models import build_block_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = power_law_graph(args.nodes, 25 * args.nodes, 100, 47, seed=0)
    model = build_block_model("sage", 100, 47, args.hidden, 0.5, 3)
    loader = NeighborLoader(data.graph, [15, 10, 5], args.batch_size, input_nodes=data.train_mask, shuffle=True,
                            x=data.x, y=data.y, prefetch=0)

    def step(batch) -> None:
        F.cross_entropy(model(batch.x, batch.blocks), batch.y).backward()

    # traces and compiles; and the loader learns from the steps what to build ahead
    # (`loader.layouts`): batches made before any step ran would leave every step to
    # build their blocks' source sides
    warm = iter(loader)
    for _ in range(2):
        step(next(warm))
    warm.close()
    loader.stage_times = counting_stage_times()
    needed = 3 + args.repeats * args.batches + 2
    loader_ms, batches = [], []
    while len(batches) < needed:
        epoch = iter(loader)
        begin, count = time.perf_counter(), 0
        for batch in epoch:
            batches.append(batch)
            count += 1
            if count == args.batches or len(batches) == needed:
                break
        loader_ms.append((time.perf_counter() - begin) / count * 1e3)
        epoch.close()

    step(batches[0])
    if args.backend == "triton":
        from gnnfuse.backend.triton import executor
        executor.launch = lambda *a, **k: None          # host work only from here on
    for batch in batches[1:3]:
        step(batch)
    fresh_ms, warm_ms = [], []
    for r in range(args.repeats):
        run = batches[3 + r * args.batches:3 + (r + 1) * args.batches]
        for times in (fresh_ms, warm_ms):               # fresh blocks, then the same blocks again
            begin = time.perf_counter()
            for batch in run:
                step(batch)
            times.append((time.perf_counter() - begin) / len(run) * 1e3)
    profile_batch, count_batch = batches[-2], batches[-1]
    profiler = cProfile.Profile()
    profiler.enable()
    step(profile_batch)
    profiler.disable()
    counter = HostSyncCounter()
    with counter:
        step(count_batch)
    sizes = [(b.num_src, b.num_dst, b.graph.num_edges) for b in batches[3].blocks]
    print(f"{args.backend} backend{' (launches stubbed)' if args.backend == 'triton' else ''}, SAGE 3x{args.hidden}, "
          f"{args.nodes:,} nodes, batch {args.batch_size}; blocks (sources, destinations, edges) e.g. {sizes}")
    print(f"  step (fwd+bwd) on fresh blocks: {_median(fresh_ms)}")
    print(f"  same blocks again (caches warm): {_median(warm_ms)}")
    print(f"  per step on fresh blocks: {pstats.Stats(profiler).total_calls} Python calls, "
          f"{sum(counter.ops.values())} aten ops, {sum(counter.syncs.values())} host syncs {dict(counter.syncs)}")
    print(f"  loader per batch (no prefetch): {_median(loader_ms)}")
    times = loader.stage_times
    seconds, count = times.totals(), len(batches)          # no prefetch: one preparation per batch taken
    print(f"  loader per batch and stage, over {count} batches:")
    for stage in times.ops:
        syncs = {name: round(n / count, 2) for name, n in times.syncs[stage].items()}
        print(f"    {stage:9s} {1e3 * seconds[stage] / count:7.2f} ms  {sum(times.ops[stage].values()) / count:6.1f} "
              f"aten ops  {sum(times.syncs[stage].values()) / count:5.2f} host syncs {syncs}")


if __name__ == "__main__":
    main()
