"""Dropout's kernels on the GPU: torch's fused dropout against gnnfuse's counter kernel
(`gnnfuse.backend.triton.random_mask`, which `gnnfuse.nn.functional.dropout` runs on CUDA
tensors of 4M elements or more), at the shapes of the training benchmark's dropouts.

torch's forward writes its output and a one-byte keep mask; its backward
(`native_dropout_backward`) reads the gradient and that mask. gnnfuse's forward writes the
output only and its backward is the same kernel on the gradient. Each kernel is timed
replayed from a CUDA graph (``--reps`` calls per graph, so no host time), median of
``--repeats`` replays; bytes per element: torch forward 4 + 4 + 1, backward 4 + 1 + 4;
gnnfuse 4 + 4 each way.

    PYTHONPATH=src:benchmarks python benchmarks/bench_dropout.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any, Callable

import torch

from common import environment, load_results, new_run_id, results_saver, runs_markdown
from gnnfuse.backend.triton import random_mask

# (rows, columns): products-sized input and hidden table, arxiv-sized input and hidden table
SHAPES = ((2_449_029, 100), (2_449_029, 64), (169_343, 128), (169_343, 64))


def replayed_us(fn: Callable[[], Any], reps: int, repeats: int) -> float:
    """Median microseconds per call of ``fn``, ``reps`` calls captured in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def measure(shape: tuple[int, int], p: float, reps: int, repeats: int) -> dict[str, Any]:
    x = torch.randn(*shape, device="cuda")
    out = torch.empty_like(x)
    _, mask = torch.native_dropout(x, p, True)
    seed = random_mask.new_seed(x.device)
    scale = 1.0 / (1.0 - p)
    cell = {"torch_forward_us": replayed_us(lambda: torch.native_dropout(x, p, True), reps, repeats),
            "torch_backward_us": replayed_us(lambda: torch.ops.aten.native_dropout_backward(x, mask, scale),
                                             reps, repeats),
            "gnnfuse_us": replayed_us(lambda: random_mask.apply_mask(x, out, seed, p), reps, repeats)}
    cell["forward_speedup"] = cell["torch_forward_us"] / cell["gnnfuse_us"]
    cell["forward_backward_speedup"] = (cell["torch_forward_us"] + cell["torch_backward_us"]) / (2 * cell["gnnfuse_us"])
    cell["gnnfuse_gb_per_s"] = x.numel() * 8 / cell["gnnfuse_us"] / 1e3
    cell["torch_forward_gb_per_s"] = x.numel() * 9 / cell["torch_forward_us"] / 1e3
    return cell


def render_markdown(results: dict[str, Any]) -> str:
    lines = ["# Dropout kernels: torch's fused dropout vs gnnfuse's counter kernel", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "", *runs_markdown(results), "",
             "| shape | p | torch forward us | torch backward us | gnnfuse us (each way) | forward speedup "
             "| forward + backward speedup | gnnfuse GB/s | torch forward GB/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, c in results["cells"].items():
        shape, p = key.rsplit("/", 1)
        lines.append(f"| {shape} | {p} | {c['torch_forward_us']:.1f} | {c['torch_backward_us']:.1f} | "
                     f"{c['gnnfuse_us']:.1f} | {c['forward_speedup']:.2f} | {c['forward_backward_speedup']:.2f} | "
                     f"{c['gnnfuse_gb_per_s']:.0f} | {c['torch_forward_gb_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--p", type=float, default=0.5)
    parser.add_argument("--reps", type=int, default=20, help="calls per captured graph")
    parser.add_argument("--repeats", type=int, default=7, help="replays timed per kernel")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("bench_dropout.py times CUDA kernels: no CUDA device is available")
    path = args.out / "dropout.json"
    results = load_results(path)
    run = new_run_id()
    results["runs"][run] = environment(torch.device("cuda"))
    save = results_saver(path, render_markdown)
    for shape in SHAPES:
        cell = measure(shape, args.p, args.reps, args.repeats)
        results["cells"][f"{shape[0]}x{shape[1]}/{args.p:g}"] = {**cell, "run": run}
        save(results)
        print(f"{shape}: torch {cell['torch_forward_us']:.1f} + {cell['torch_backward_us']:.1f} us, gnnfuse "
              f"{cell['gnnfuse_us']:.1f} us each way: forward {cell['forward_speedup']:.2f}x, forward + backward "
              f"{cell['forward_backward_speedup']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
