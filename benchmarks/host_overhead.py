"""Host (Python) time per call of a compiled layer, where the device work is negligible.

On small graphs a training step is bound by the host: tracing-cache lookups, the
executor's plan walk, launch-argument building and checks, repeated every call. This
times N calls of a gnnfuse layer (forward, or forward + backward) on a tiny graph, so
the GPU or CPU arithmetic is a rounding error and what is left is the per-call Python
cost, and prints cProfile's top entries by own time to show where it goes.

Runs on the CPU: the reference backend (default) or the Triton interpreter
(``--backend triton``, which sets TRITON_INTERPRET=1 before triton is imported; its
kernels run in numpy, so only the host-side share outside the kernel bodies compares).
``--device cuda`` runs the Triton kernels on the GPU, where the per-call host cost is
what a small graph's step waits for.

    python benchmarks/host_overhead.py --layer gcn --calls 2000
    python benchmarks/host_overhead.py --layer gat --backward --profile 25
    python benchmarks/host_overhead.py --device cuda --layer gcn --profile 30
"""
from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path


def _layer(name: str, width: int):
    from gnnfuse import nn as gnn_nn
    if name == "gcn":
        return gnn_nn.GCNConv(width, width)
    if name == "gat":
        return gnn_nn.GATConv(width, width // 4, heads=4)
    return gnn_nn.SAGEConv(width, width, aggr="mean")


def measure(layer_name: str, calls: int, backward: bool, nodes: int, width: int, profile: int,
            repeats: int = 5, device: str = "cpu") -> dict:
    import torch
    from gnnfuse.graph import Graph

    torch.set_num_threads(1)     # intra-op threads on a tiny graph only add wake-up latency
    torch.manual_seed(0)
    src = torch.randint(0, nodes, (4 * nodes,))
    dst = torch.randint(0, nodes, (4 * nodes,))
    graph = Graph(src, dst, nodes).to(device)
    layer = _layer(layer_name, width).to(device)
    x = torch.randn(nodes, width, device=device, requires_grad=backward)

    def call():
        out = layer(x, graph)
        if backward:
            out.sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(5):          # traces, compiles, caches layouts
        call()
    walls, cpus = [], []
    for _ in range(repeats):        # the best of several blocks: other processes only add time
        begin, cpu_begin = time.perf_counter(), time.process_time()
        for _ in range(calls):
            call()
        walls.append((time.perf_counter() - begin) / calls * 1e6)
        cpus.append((time.process_time() - cpu_begin) / calls * 1e6)
    wall_us, cpu_us = min(walls), min(cpus)
    # Function calls per layer call, counted by cProfile: the same on every run, where
    # times on a shared machine vary by more than the differences being looked for;
    # gnnfuse's own share is what tests/test_host_path.py bounds.
    profiled = min(calls, 200)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(profiled):
        call()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    function_calls = stats.total_calls / profiled
    package = os.path.dirname(importlib.import_module("gnnfuse").__file__)
    own_calls = sum(entry[1] for (filename, _, _), entry in stats.stats.items()
                    if filename.startswith(package)) / profiled
    top = ""
    if profile:
        stats.sort_stats("tottime").print_stats(profile)
        top = text.getvalue()
    return {"layer": layer_name, "backward": backward, "nodes": nodes, "edges": 4 * nodes, "width": width,
            "calls": calls, "repeats": repeats, "wall_us_per_call": wall_us, "cpu_us_per_call": cpu_us,
            "function_calls_per_call": function_calls, "gnnfuse_calls_per_call": own_calls, "profile": top}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layer", default="gcn", choices=("gcn", "gat", "sage"))
    parser.add_argument("--backend", default="reference", choices=("reference", "cpu", "triton"))
    parser.add_argument("--calls", type=int, default=1000, help="calls per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks; the best is reported")
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N by own time")
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: the Triton kernels on the GPU (implies --backend triton)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        args.backend = "triton"
        os.environ["GNNFUSE_BACKEND"] = "triton"
    elif args.backend == "triton":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            parser.error("triton was imported before TRITON_INTERPRET=1 could be set")
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["GNNFUSE_BACKEND"] = "triton"
    elif args.backend == "cpu":
        os.environ["GNNFUSE_BACKEND"] = "cpu"
    result = measure(args.layer, args.calls, args.backward, args.nodes, args.width, args.profile, args.repeats,
                     args.device)
    result["backend"] = args.backend
    what = "forward + backward" if args.backward else "forward"
    print(f"{args.layer} {what} on {result['nodes']} nodes / {result['edges']} edges, width {args.width}, "
          f"{args.backend} backend on {args.device}: {result['wall_us_per_call']:.1f} us wall, "
          f"{result['cpu_us_per_call']:.1f} us CPU per call (best of {args.repeats} x {args.calls} calls), "
          f"{result['function_calls_per_call']:.0f} Python function calls per call "
          f"({result['gnnfuse_calls_per_call']:.0f} of them gnnfuse's)")
    if result["profile"]:
        print(result["profile"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
