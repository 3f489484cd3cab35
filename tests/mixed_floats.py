"""The units mixing float32 and float64 that a kernel's one accumulator dtype rounds unlike
torch, shared by the cpu and triton backends' tests: float32 features with float64 edge
weights, and a 0-dim float64 constant (which does not widen float32 data)."""
from __future__ import annotations

from typing import Callable

import torch

import gnnfuse

CASES = ["float64_edge_operand", "float64_scalar_constant"]


def mixed_float_model(graph: gnnfuse.Graph, case: str, device: str = "cpu"
                      ) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
    """``(model, inputs)``: ``(((a - b) + 1e8) - 1e8) * w`` summed, whose float32 part
    rounds to float32's spacing of 8 in torch before ``w`` widens it, or the same with
    the float64 constant and no weight."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(graph.num_nodes, 3, generator=gen).to(device)
    if case == "float64_edge_operand":
        w = (torch.rand(graph.num_edges, 1, dtype=torch.float64, generator=gen) + 0.5).to(device)

        def weighted(x, w):
            return gnnfuse.ops.gspmm(graph, lambda a, b, e: (((a - b) + 1e8) - 1e8) * e, "sum", src=x, dst=x, edge=w)
        return weighted, [x, w]
    big = torch.tensor(1e8, dtype=torch.float64)

    def shifted(x):
        return gnnfuse.ops.gspmm(graph, lambda a, b: ((a - b) + big) - big, "sum", src=x, dst=x)
    return shifted, [x]
