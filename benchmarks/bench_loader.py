"""The mini-batch loader alone, its hops by the torch path against the fused hop kernels.

For each thread count, the two hop paths (``GNNFUSE_FUSED_HOPS=0`` and ``=1``: on a CPU
the Numba kernels of `loader.hop_numba`, on a GPU the Triton kernels of
`loader.hop_triton`) take turns in rounds; each round times ``--batches`` batches of a
loader without prefetch (the batch's whole preparation: sample, reindex, blocks and
their layouts, feature and label lookup), after one untimed epoch start. A cell is the
median over rounds of each round's milliseconds per batch.

    python benchmarks/bench_loader.py --dataset arxiv-like --device cpu
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from gnnfuse.bench import synchronize
from gnnfuse.data import load_dataset
from gnnfuse.loader import NeighborLoader
from gnnfuse.loader.hop_kernels import FUSED_HOPS

from common import environment, fmt, load_results, log, new_run_id, prune_runs, runs_markdown, save_json, \
    write_atomically

PATHS = {"torch": "0", "fused": "1"}


def ms_per_batch(loader: NeighborLoader, batches: int, device: torch.device) -> float:
    """Milliseconds per batch over ``batches`` batches, after one untimed batch."""
    iterator = iter(loader)
    next(iterator)
    synchronize(device)
    begin = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    synchronize(device)
    return (time.perf_counter() - begin) / batches * 1e3


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dataset = load_dataset(args.dataset, args.data_root)
    graph = dataset.graph.to(device)
    graph.csr()
    x, y = dataset.x.to(device), dataset.y.to(device)
    results = load_results(args.out / f"loader_{device.type}.json")
    results.setdefault("cells", {})
    run_id = new_run_id()
    results["runs"][run_id] = environment(device)
    for threads in args.threads:
        torch.set_num_threads(threads)
        rounds: dict[str, list[float]] = {name: [] for name in PATHS}
        for r in range(args.rounds):
            for name in (list(PATHS) if r % 2 == 0 else list(PATHS)[::-1]):
                os.environ[FUSED_HOPS] = PATHS[name]
                loader = NeighborLoader(graph, args.fanout, args.batch_size, shuffle=True, x=x, y=y, prefetch=0,
                                        device=device)
                rounds[name].append(ms_per_batch(loader, args.batches, device))
        for name, values in rounds.items():
            key = f"{args.dataset}/{','.join(map(str, args.fanout))}/{args.batch_size}/{device.type}/{threads}/{name}"
            results["cells"][key] = {"median_ms": statistics.median(values), "min_ms": min(values),
                                     "round_ms": values, "batches": args.batches, "run": run_id}
            log(f"[{args.dataset}] {threads} thread(s), {name} hops: {statistics.median(values):.1f} ms per batch")
    os.environ.pop(FUSED_HOPS, None)
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = ["# The mini-batch loader alone: torch hops against fused hop kernels", "",
             "Milliseconds per batch (sample, reindex, blocks and layouts, lookup; no prefetch): the median over "
             "rounds in which the two paths take turns. Fused hops: Numba kernels on a CPU, Triton kernels on a "
             "GPU (`benchmarks/bench_loader.py`).", "", *runs_markdown(results), "",
             "| dataset | fanout | batch | device | threads | torch hops ms | fused hops ms | speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    keys = sorted({k.rsplit("/", 1)[0] for k in results["cells"]})
    for key in keys:
        torch_ms = results["cells"].get(f"{key}/torch", {}).get("median_ms")
        fused_ms = results["cells"].get(f"{key}/fused", {}).get("median_ms")
        ratio = f"{torch_ms / fused_ms:.2f}x" if torch_ms and fused_ms else "–"
        lines.append(f"| {' | '.join(key.split('/'))} | {fmt(torch_ms, '.1f')} | {fmt(fused_ms, '.1f')} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="arxiv-like")
    parser.add_argument("--data-root")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fanout", type=lambda s: [int(k) for k in s.split(",")], default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--threads", type=lambda s: [int(k) for k in s.split(",")], default=[1, 2])
    parser.add_argument("--batches", type=int, default=10, help="timed batches per round (default 10)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per path (default 4)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    results = run(args)
    prune_runs(results)
    device = torch.device(args.device).type
    save_json(args.out / f"loader_{device}.json", results)
    write_atomically(args.out / f"loader_{device}.md", markdown(results))
    log(f"results in {args.out / f'loader_{device}.md'}")


if __name__ == "__main__":
    main()
