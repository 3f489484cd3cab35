"""GPU check of `torch.compile` on gnnfuse layers: graph breaks, compiled against eager
(output and input gradient), and a training-style step's time eager and compiled.

Each layer runs on a random graph (100k vertices, 1M edges, 64 features) on CUDA; one
line per layer. Exits non-zero when a layer breaks the graph or differs from eager.

    python benchmarks/check_compile.py
"""
from __future__ import annotations

import sys
import time

import torch

from gnnfuse.nn import GATConv, GCNConv, SAGEConv


def median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - begin) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> int:
    n, e, f = 100_000, 1_000_000, 64
    torch.manual_seed(0)
    x = torch.randn(n, f, device="cuda")
    edge_index = torch.randint(0, n, (2, e), device="cuda")
    failed = False
    layers = [("sage_list", SAGEConv(f, f, aggr=["mean", "sum", "min", "max", "std"])),
              ("gcn", GCNConv(f, f)), ("gat", GATConv(f, 8, heads=8))]
    for name, layer in layers:
        layer = layer.cuda()
        breaks = torch._dynamo.explain(layer)(x, edge_index).graph_break_count
        compiled = torch.compile(layer, fullgraph=True)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        a, b = layer(xa, edge_index), compiled(xb, edge_index)
        a.square().sum().backward()
        b.square().sum().backward()
        out_err = ((a - b).norm() / a.norm()).item()
        grad_err = ((xa.grad - xb.grad).norm() / xa.grad.norm()).item()

        def step(module):
            return lambda: module(x.clone().requires_grad_(), edge_index).square().sum().backward()
        failed |= breaks != 0 or out_err > 1e-4 or grad_err > 1e-4
        print(f"{name}: breaks={breaks} out_err={out_err:.1e} grad_err={grad_err:.1e} "
              f"eager={median_ms(step(layer)):.2f}ms compiled={median_ms(step(compiled)):.2f}ms", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
