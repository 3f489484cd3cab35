"""Data-parallel mini-batch training on 1 to N GPUs of one machine, in one invocation
(issues #17 and #18): GraphSAGE's epoch time, its scaling, and each rank's stage breakdown.

The default cell is bench_minibatch.py's (products-like, 3 layers of 256 hidden
channels, fanouts 15,10,5, ogbn-products' 196,615 training seeds) with batches of 1024
seeds *per GPU*. For every world size in ``--world-sizes`` (default 1,2) the script
starts that many ranks (`gnnfuse.distributed.launch.start_ranks`: spawned on GPUs, forked
from a fork server on the CPU), each of which loads the data set itself (the generator is seeded, so every
rank holds the same graph), builds the model from the same seed and times one epoch
after ``--warmup`` untimed batches:

- one GPU is plain single-process training (no process group, no DDP), the number a
  user with one GPU gets;
- N GPUs are `gnnfuse.distributed`'s data-parallel training: each rank samples from
  its disjoint share of the seeds (DistributedSampler, drop_last), DDP averages the
  gradients (NCCL on GPUs, gloo on the CPU), features replicated or, with
  ``--features partitioned``, fetched from their owner rank by all-to-all.

Per rank it records the epoch's wall time and batches, the loader's stage seconds
(sample, reindex, lookup, transfer in its background thread; compute and wait in the
training loop), the GPU busy fraction (CUDA-event time of the training steps over wall
time), peak memory and, partitioned, the feature bytes sent and received. The epoch time
of a world size is its slowest rank's. With ``--max-batches`` (a 10-minute device
limit) ranks stop after that many batches; the full-epoch time is then projected from
the throughput (seeds per second), and the speed-up is always the ratio of
throughputs, so 1 and N GPUs compare the same work per seed.

    python benchmarks/bench_distributed.py --device cuda                     # products-like, 1 and 2 GPUs
    python benchmarks/bench_distributed.py --device cpu --dataset synthetic --fanout 5,5 --batch-size 64 \\
        --hidden 16 --max-batches 4                                          # CPU smoke test (gloo)
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from gnnfuse.bench import synchronize
from gnnfuse.distributed import PartitionedFeatures, average_gradients, broadcast_parameters, init_process_group
from gnnfuse.distributed.launch import free_port, start_ranks
from gnnfuse.distributed.process_group import check_backend, leave_process_group
from gnnfuse.loader import STAGES, NeighborLoader
from gnnfuse.loader.stages import stream_sync
from gnnfuse.nn.block_models import build_block_model
from gnnfuse.training.captured_step import BlockStepCapture
from gnnfuse.training.loop import peak_memory_mib
from gnnfuse.training.minibatch import classification_step

from bench_minibatch import PRODUCTS_TRAIN_NODES, StepClock, load_problem, train_step
from common import REPO_ROOT, environment, log, results_saver, write_atomically

# Speed-up targets, N GPUs against 1 on the same machine: issue #17 (2) and #18 (4, 8)
TARGET_SPEEDUP = {2: 1.8, 4: 3.5, 8: 6.5}


# --- one rank --------------------------------------------------------------------------
def rank_main(local_rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    """Time one epoch on this rank; rank 0 writes every rank's numbers to ``out``."""
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(args.device)
    if world > 1:
        device = init_process_group(device.type).device
    elif device.type == "cuda":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    begin = time.perf_counter()
    dataset, train_idx, graph = load_problem(args, device)
    store = None
    if args.features == "partitioned" and world > 1:
        store = PartitionedFeatures.from_full(dataset.x, local_rank, world, device)
    x = dataset.x.to(device) if store is None else None
    synchronize(device)
    load_s = time.perf_counter() - begin
    torch.manual_seed(args.seed)
    model = build_block_model("sage", dataset.num_features, dataset.num_classes, args.hidden, args.dropout,
                              len(args.fanout)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003, capturable=args.cuda_graph and device.type == "cuda")
    torch.manual_seed(args.seed + local_rank)
    sampler = (DistributedSampler(range(train_idx.numel()), num_replicas=world, rank=local_rank, shuffle=True,
                                  seed=args.seed, drop_last=True) if world > 1 else None)
    loader = NeighborLoader(graph, args.fanout, args.batch_size, input_nodes=train_idx, shuffle=sampler is None,
                            sampler=sampler, x=x, y=dataset.y.to(device), device=device, prefetch=args.prefetch,
                            prefetch_threads=args.prefetch_threads, num_workers=args.num_workers,
                            static_shapes=args.cuda_graph,
                            deferred=args.cuda_graph and args.deferred)
    times = loader.stage_times
    captured = None
    if args.cuda_graph and not args.loader_alone:
        # DDP's hooks are not replayable (gnnfuse.distributed.gradients): ranks start from
        # rank 0's weights and the step averages its gradients in one all-reduce -- the
        # step `gnnfuse train --cuda-graph on` replays on each rank
        if world > 1:
            broadcast_parameters(model)
        step_fn = classification_step(model, optimizer, average_gradients if world > 1 else None)
        captured = BlockStepCapture(step_fn, optimizers=[optimizer], modules=[model], mode="on",
                                    features=loader.features, short_batches="replay")
    step_model = DistributedDataParallel(model) if world > 1 and captured is None else model

    def epoch(batches: int | None, clock: StepClock | None) -> int:
        count = 0
        for batch in loader:
            features = batch.x
            if store is not None:
                with times.timing("lookup", stream_sync(device)):
                    features = store.gather(batch.n_id)
            if not args.loader_alone:
                step_begin = time.perf_counter()
                if captured is not None:
                    step = lambda: captured(batch)  # noqa: E731
                else:
                    step = lambda: train_step(step_model, optimizer, features, batch.blocks, batch.y, batch.batch_size)  # noqa: E731
                clock.run(step) if clock is not None else step()
                times.add("compute", time.perf_counter() - step_begin)
            count += 1
            if batches is not None and count >= batches:
                break
        return count

    model.train()
    if sampler is not None:
        sampler.set_epoch(0)
    epoch(args.warmup, None)                        # compilation and allocator growth, untimed
    synchronize(device)
    if world > 1:
        dist.barrier()
    if sampler is not None:
        sampler.set_epoch(1)
    times.reset()
    if store is not None:
        store.bytes.clear()
    clock = StepClock(device)
    begin = time.perf_counter()
    batches = epoch(args.max_batches, clock)
    synchronize(device)
    wall = time.perf_counter() - begin
    busy = clock.seconds()
    share = len(sampler) if sampler is not None else train_idx.numel()      # this rank's seeds per epoch
    result = {"rank": local_rank, "epoch_s": wall, "batches": batches, "epoch_seeds": share,
              "seeds": min(batches * args.batch_size, share),
              "stages_s": times.totals(), "busy_s": busy, "busy_fraction": busy / wall, "step_ms": clock.spread_ms(),
              "load_s": load_s,
              "peak_mib": peak_memory_mib(device),
              "feature_bytes": store.bytes_moved() if store is not None else None,
              "weights_off_rank_0": weights_off_rank_0(model, world)}
    if captured is not None:
        result["cuda_graph"] = {"status": captured.status, "replayed": captured.replayed, "eager": captured.eager}
    loader.close()
    results = [result]
    if world > 1:
        results = [None] * world
        dist.all_gather_object(results, result)
    if local_rank == 0:
        write_atomically(Path(out), json.dumps({"ranks": results, "environment": environment(device)}, default=str))
    if world > 1:
        leave_process_group()


def weights_off_rank_0(model: torch.nn.Module, world: int) -> float:
    """The largest difference between this rank's weights and rank 0's after the epoch:
    data-parallel ranks that averaged their gradients correctly hold the same weights
    (NCCL's and gloo's all-reduce give every rank the same sum), so anything but 0 is a bug."""
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    if world == 1:
        return 0.0
    first = mine.clone()
    dist.broadcast(first, src=0)
    return (mine - first).abs().max().item()


# --- the run ---------------------------------------------------------------------------
def summarize(world: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """A world size's epoch: its slowest rank's time, and the throughput of all ranks."""
    wall = max(r["epoch_s"] for r in ranks)
    seeds = sum(r["seeds"] for r in ranks)
    throughput = seeds / wall
    return {"world_size": world, "epoch_s": wall, "seeds": seeds, "seeds_per_s": throughput,
            "full_epoch_s": sum(r["epoch_seeds"] for r in ranks) / throughput, "ranks": ranks}


def run(args: argparse.Namespace, save) -> dict[str, Any]:
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "worlds": {}}
    for world in args.world_sizes:
        out = Path(args.json).with_suffix(f".world{world}.tmp")
        begin = time.perf_counter()
        start_ranks(rank_main, (world, free_port(), args, str(out)), world, torch.device(args.device).type)
        record = json.loads(out.read_text())
        out.unlink()
        results["environment"] = record["environment"]
        cell = summarize(world, record["ranks"])
        results["worlds"][str(world)] = cell
        save(results)
        log(f"{world} {args.device} rank(s): epoch {cell['epoch_s']:.2f} s over {cell['ranks'][0]['batches']} "
            f"batches per rank, {cell['seeds_per_s']:,.0f} seeds/s, projected full epoch {cell['full_epoch_s']:.2f} s "
            f"(launch and run {time.perf_counter() - begin:.0f} s)")
    one = results["worlds"].get("1")
    if one:
        results["speedup_vs_1"] = {world: cell["seeds_per_s"] / one["seeds_per_s"]
                                   for world, cell in results["worlds"].items() if world != "1"}
        save(results)
        for world, speedup in results["speedup_vs_1"].items():
            target = TARGET_SPEEDUP.get(int(world))
            log(f"speed-up {world} vs 1: x{speedup:.2f}" + (f" (target x{target})" if target else ""))
    return results


def replays(rank: dict[str, Any]) -> str:
    graph = rank.get("cuda_graph")
    if not graph:
        return "–"
    counts = f"{graph['replayed']} / {graph['eager']}"
    return counts if graph["status"] == "captured" else f"{counts} ({graph['status']})"


def markdown(results: dict[str, Any]) -> str:
    config, env = results["config"], results.get("environment", {})
    threads = config.get("prefetch_threads", 1)
    threads = f", {threads} loader threads per rank" if threads > 1 else ""
    lines = ["# Data-parallel mini-batch training (GraphSAGE, DDP)", "",
             f"{config['dataset']}, {len(config['fanout'])} layers hidden {config['hidden']}, fanouts "
             f"{','.join(map(str, config['fanout']))}, batch {config['batch_size']} per rank, features "
             f"{config['features']}, {config.get('num_workers') or 'no'} loader workers per rank"
             f"{threads}"
             f"{', the loaders alone (no training step)' if config.get('loader_alone') else ''}"
             f"{', steps replayed from CUDA graphs (gradients averaged in them)' if config.get('cuda_graph') else ''}; "
             f"{env.get('device_name')}, torch {env.get('torch')}, commit "
             f"{(env.get('git_commit') or 'unknown')[:12]}{' (dirty)' if env.get('git_dirty') else ''}, "
             f"{env.get('date')}.", "",
             "1 rank is plain single-process training; N ranks are gnnfuse.distributed (DistributedSampler "
             "shares, DDP). Epoch s: the slowest rank's wall time over the batches run; full epoch s: projected "
             "from seeds/s when --max-batches cut the epoch short. Stage seconds are per rank, summed over its "
             "batches (sample/reindex/lookup/transfer in the loader's thread, overlapped with compute); busy = "
             "training-step GPU time / wall; step ms = median / 90th percentile / slowest step's GPU span "
             "(a rank's span includes its wait in DDP's all-reduce for the others); steps replayed / eager with "
             "--cuda-graph; weights diff = largest difference of the rank's weights from rank 0's after the epoch "
             "(0 when gradients were averaged right).", "",
             "| ranks | rank | batches | epoch s | full epoch s | seeds/s | busy | step ms | peak MiB | "
             + " | ".join(STAGES) + " | feature MB sent / received | replayed / eager | weights diff |",
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(STAGES) + "---|---|---|"]
    for world, cell in results["worlds"].items():
        for rank in cell["ranks"]:
            stages = " | ".join(f"{rank['stages_s'][s]:.2f}" for s in STAGES)
            moved = rank["feature_bytes"]
            moved = "–" if moved is None else f"{moved['sent'] / 1e6:.1f} / {moved['received'] / 1e6:.1f}"
            spread = rank.get("step_ms") or {}
            step = "–" if not spread else f"{spread['median']:.1f} / {spread['p90']:.1f} / {spread['max']:.1f}"
            lines.append(f"| {world} | {rank['rank']} | {rank['batches']} | {rank['epoch_s']:.2f} | "
                         f"{cell['full_epoch_s']:.2f} | {cell['seeds_per_s']:,.0f} | "
                         f"{100 * rank['busy_fraction']:.0f}% | {step} | {rank['peak_mib']:.0f} | {stages} | {moved} | "
                         f"{replays(rank)} | {rank.get('weights_off_rank_0', float('nan')):.1g} |")
    if results.get("speedup_vs_1"):
        lines += ["", "| ranks | speed-up vs 1 (seeds/s) | target |", "|---|---|---|"]
        for world, speedup in results["speedup_vs_1"].items():
            target = TARGET_SPEEDUP.get(int(world))
            verdict = "–" if target is None else f"x{target} {'met' if speedup >= target else 'NOT met'}"
            lines.append(f"| {world} | x{speedup:.2f} | {verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-root", help="folder of the real data sets (default: $GNNFUSE_DATA, ../shared/data)")
    parser.add_argument("--dataset", default="products-like")
    parser.add_argument("--world-sizes", type=lambda s: [int(k) for k in s.split(",")], default=[1, 2],
                        help="ranks per run, one run each (default 1,2)")
    parser.add_argument("--features", choices=("replicated", "partitioned"), default="replicated")
    parser.add_argument("--fanout", type=lambda s: [int(k) for k in s.split(",")], default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024, help="seeds per batch per rank (default 1024)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.5)
    # Each new batch shape can compile a kernel variant or tune a launch; on a machine with
    # cold caches 3 warm-up batches left them to the timed epoch (H100 x4: 2 ranks 4.00 s
    # as a fresh machine's first invocation, 1.37 s on another fresh machine after an
    # invocation with partitioned features had run), so each rank warms on 20.
    parser.add_argument("--warmup", type=int, default=20, help="untimed batches first, per rank (default 20)")
    parser.add_argument("--max-batches", type=int, help="stop each rank's timed epoch after this many batches")
    parser.add_argument("--train-nodes", type=int, help="training seeds per epoch (default: ogbn-products' "
                        f"{PRODUCTS_TRAIN_NODES:,} for products-like, else the whole split; 0: the whole split)")
    parser.add_argument("--prefetch", type=int, default=2, help="batches the loader prepares ahead (default 2)")
    parser.add_argument("--prefetch-threads", type=int, default=1,
                        help="threads of each rank's loader preparing batches (default 1)")
    parser.add_argument("--loader-alone", action="store_true",
                        help="iterate each rank's loader without training: whether N ranks' loaders slow each "
                             "other when no step shares the GPU or the host with them")
    parser.add_argument("--num-workers", type=int, default=0,
                        help="loader worker processes per rank (PyG's num_workers; default 0: a thread)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="replay each rank's training steps from a CUDA graph (a loader with static_shapes, "
                             "BlockStepCapture; gradients averaged by gnnfuse.distributed.average_gradients in the "
                             "graph instead of DDP's hooks); replicated features only")
    parser.add_argument("--no-deferred", dest="deferred", action="store_false",
                        help="with --cuda-graph: the loader gathers the feature rows and builds the layouts "
                             "(default: the replayed step does, loader.static_shapes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here (default benchmarks/results/distributed_<device>.json, "
                                       "with a .md beside it)")
    args = parser.parse_args(argv)
    if args.cuda_graph and args.features == "partitioned":
        parser.error("--cuda-graph replays steps on replicated features: a partitioned fetch is an all-to-all "
                     "with host-side sizes, outside any graph")
    device_type = torch.device(args.device).type
    if device_type == "cuda":
        check_backend("cuda", max(args.world_sizes))     # before any rank starts: a clear refusal
    args.json = args.json or str(REPO_ROOT / "benchmarks" / "results" / f"distributed_{device_type}.json")
    path = Path(args.json)

    results = run(args, results_saver(path, markdown))
    log(f"wrote {path} and {path.with_suffix('.md')}")
    return results


if __name__ == "__main__":
    main()
