"""bfloat16 features through the generated kernels (float32 accumulation) against the
float32 reference backend: a GAT and a GCN layer's forward and input gradient on a
power-law graph. Prints the relative errors; exits non-zero above bfloat16's precision.

    python benchmarks/check_bf16.py
"""
from __future__ import annotations

import os
import sys

import torch

from gnnfuse import nn as gnn
from gnnfuse.data import power_law_graph

LIMIT = 3e-2   # bfloat16 keeps 8 mantissa bits: ~4e-3 per rounding, a few roundings deep


def run(layer, x, graph, backend):
    os.environ["GNNFUSE_BACKEND"] = backend
    x = x.detach().clone().requires_grad_()
    out = layer(x, graph)
    out.float().pow(2).sum().backward()
    return out, x.grad


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> int:
    data = power_law_graph(50_000, 400_000, 64, 8)
    graph = data.graph.to("cuda")
    passed = True
    for name, make in (("gcn", lambda: gnn.GCNConv(64, 32)), ("gat", lambda: gnn.GATConv(64, 8, heads=4))):
        torch.manual_seed(0)
        layer = make().cuda()
        x = data.x.cuda()
        ref_out, ref_grad = run(layer, x, graph, "reference")
        out, grad = run(layer.bfloat16(), x.bfloat16(), graph, "triton")
        errors = rel(out, ref_out), rel(grad, ref_grad)
        passed &= all(e < LIMIT for e in errors)      # a NaN error fails (max() would drop one listed after a number)
        print(f"{name}: bfloat16 triton vs float32 reference: output rel err {errors[0]:.2e}, "
              f"input-gradient rel err {errors[1]:.2e}, output dtype {out.dtype}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
