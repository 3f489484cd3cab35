"""Where a mini-batch training step spends its host and device time, gnnfuse's block
layers against PyG's SAGEConv on the same sampled batches.

A sampled batch is a new set of block graphs, so whatever gnnfuse derives per graph is
paid every step, and on a small batch the step is bound by the host. For GraphSAGE
(3 layers, fanouts 15,10,5 by default) it takes batches from gnnfuse's loader, warms
each model up, then per model prints the host milliseconds per step (median of 10,
each from an idle device), cProfile's heaviest functions over 10 steps (by own time
and cumulative) and, on a GPU, torch.profiler's tables of 5 steps by host time and by
device time. PyG's model is skipped when torch_geometric is missing.

``--live-loader`` profiles as training runs instead: each model steps through an epoch
of batches the loader prepares in its prefetch thread meanwhile, under a sampling
profiler (`gnnfuse.bench.stack_sampler`) that also reads the autograd thread's stack
during the backward. What a step loses to the loader's thread, or builds per block that
the loader could have, shows only there (an in-step sort of every block, 78144c8).

    python benchmarks/profile_minibatch.py --dataset products-like --device cuda
    python benchmarks/profile_minibatch.py --dataset cora --device cpu --hidden 16
    python benchmarks/profile_minibatch.py --dataset products-like --device cuda --live-loader
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Any, Callable

import torch

import bench_minibatch as bm
from gnnfuse.bench import synchronize
from gnnfuse.bench.stack_sampler import StackSampler
from gnnfuse.loader import NeighborLoader
from gnnfuse.nn.block_models import build_block_model

from common import resolve_device

WARMUP, TIMED, PROFILED, TRACED = 10, 10, 10, 5


def models(dataset, hidden: int, layers: int, device: torch.device) -> dict[str, torch.nn.Module]:
    widths = [dataset.num_features] + [hidden] * (layers - 1) + [dataset.num_classes]
    built = {"gnnfuse": build_block_model("sage", dataset.num_features, dataset.num_classes, hidden, 0.5, layers)}
    try:
        built["pyg"] = bm.PygSage(widths, 0.5)
    except ImportError:
        print("torch_geometric is not installed: PyG's model is skipped")
    return {name: model.to(device) for name, model in built.items()}


def stepper(model: torch.nn.Module) -> Callable[[Any], None]:
    """A training step of ``model`` (Adam) on a batch."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    return lambda batch: bm.train_step(model, optimizer, batch.x, batch.blocks, batch.y, batch.batch_size)


def profile(name: str, model: torch.nn.Module, batches: list, device: torch.device, top: int) -> None:
    step = stepper(model)
    for batch in batches[:WARMUP]:
        step(batch)
    synchronize(device)
    host = []
    for batch in batches[WARMUP:WARMUP + TIMED]:
        begin = time.perf_counter()
        step(batch)
        host.append((time.perf_counter() - begin) * 1e3)
        synchronize(device)
    print(f"== {name}: host ms per step, median {statistics.median(host):.2f} (min {min(host):.2f})")
    profiled = cProfile.Profile()
    for batch in batches[WARMUP + TIMED:WARMUP + TIMED + PROFILED]:
        profiled.enable()
        step(batch)
        profiled.disable()
        synchronize(device)
    stats = pstats.Stats(profiled)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as traced:
            for batch in batches[WARMUP:WARMUP + TRACED]:
                step(batch)
            synchronize(device)
        print(traced.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
        print(traced.key_averages().table(sort_by="cuda_time_total", row_limit=top))


def sample_live(name: str, model: torch.nn.Module, loader: NeighborLoader, device: torch.device, top: int) -> None:
    """Sample ``model``'s steps over an epoch of ``loader`` with its prefetch thread
    running, after an epoch that compiles and tunes every size class it reaches."""
    step = stepper(model)
    for batch in loader:
        step(batch)
    synchronize(device)
    host = []
    with StackSampler(where="train_step") as sampler:
        for batch in loader:
            begin = time.perf_counter()
            step(batch)
            host.append((time.perf_counter() - begin) * 1e3)
    synchronize(device)
    print(f"== {name}, the loader's thread running: host ms per step, median {statistics.median(host):.2f} "
          f"(min {min(host):.2f}), {len(host)} steps")
    print(sampler.report(len(host), sum(host), top))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="products-like")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-root")
    parser.add_argument("--fanout", type=lambda s: [int(k) for k in s.split(",")], default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--top", type=int, default=30, help="rows of each table (default 30)")
    parser.add_argument("--live-loader", action="store_true",
                        help="sample steps over an epoch with the loader's prefetch thread running (module doc)")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    problem = argparse.Namespace(dataset=args.dataset, data_root=args.data_root, train_nodes=None, seed=0)
    dataset, train_idx, graph = bm.load_problem(problem, device)
    loader = NeighborLoader(graph, args.fanout, args.batch_size, input_nodes=train_idx, shuffle=True,
                            x=dataset.x.to(device), y=dataset.y.to(device), device=device,
                            prefetch=2 if args.live_loader else 0)
    if args.live_loader:
        for name, model in models(dataset, args.hidden, len(args.fanout), device).items():
            sample_live(name, model, loader, device, args.top)
        return
    built = models(dataset, args.hidden, len(args.fanout), device)
    # the loader learns from the steps what to build ahead (`loader.layouts`): batches
    # taken before any step ran would leave every step to build their blocks' source sides
    for model in built.values():
        step = stepper(model)
        for batch in bm.take(loader, 2):
            step(batch)
    batches = bm.take(loader, WARMUP + TIMED + PROFILED)
    for name, model in built.items():
        profile(name, model, batches, device, args.top)


if __name__ == "__main__":
    main()
