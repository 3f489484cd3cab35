"""On a GPU: calls that go through launch plans' bound launches give the reference's results.

A fused unit's or sibling group's launch plan binds its direct launch from its third
call on (`backend/triton/direct_launch.BoundLaunch`), and a merging sibling group's merge
kernel launches through `Replays`; the test suite runs each plan once or twice, and CI
runs Triton's interpreter, where neither path is taken. This runs a float64 GATConv on a
graph whose hub (6000 in-edges) is split over segments and merged, five times forward and
backward on CUDA, each against the reference backend on the CPU, and says how many
launches went through bound launches and whether a merge kernel was replayed.

    PYTHONPATH=src python benchmarks/check_bound_launches.py
"""
from __future__ import annotations

import os

import torch

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.backend.triton import direct_launch
from gnnfuse.backend.triton import executor

CALLS = 5
TOLERANCE = 1e-9


def hub_graph(nodes: int = 3000) -> gnnfuse.Graph:
    torch.manual_seed(0)
    src = torch.cat([torch.randint(0, nodes, (20000,)), torch.randint(0, nodes, (6000,))])
    dst = torch.cat([torch.randint(0, nodes, (20000,)), torch.zeros(6000, dtype=torch.long)])
    return gnnfuse.Graph(src, dst, nodes)


def forward_backward(layer: torch.nn.Module, x: torch.Tensor, graph: gnnfuse.Graph, backend: str
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    os.environ["GNNFUSE_BACKEND"] = backend
    x = x.clone().requires_grad_()
    out = layer(x, graph)
    (grad,) = torch.autograd.grad((out * out).sum(), [x])
    return out.detach().cpu(), grad.cpu()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def main() -> None:
    graph = hub_graph()
    layer = gnn.GATConv(32, 8, heads=4).double()
    x = torch.randn(graph.num_nodes, 32, dtype=torch.float64)
    expected = forward_backward(layer, x, graph, "reference")
    used = {True: 0, False: 0}
    bound_call = direct_launch.BoundLaunch.__call__

    def counted(self, tensors):
        went = bound_call(self, tensors)
        used[went] += 1
        return went
    direct_launch.BoundLaunch.__call__ = counted
    layer, graph, x = layer.cuda(), graph.to("cuda"), x.cuda()
    for call in range(CALLS):
        out, grad = forward_backward(layer, x, graph, "triton")
        errors = rel_err(out, expected[0]), rel_err(grad, expected[1])
        print(f"call {call}: output rel err {errors[0]:.1e}, input gradient {errors[1]:.1e}; bound launches "
              f"so far {used[True]}, refused {used[False]}")
        if not all(e <= TOLERANCE for e in errors):       # NaN included (max() would drop one after a number)
            raise SystemExit(f"FAIL: call {call} differs from the reference by {errors[0]:.1e} / {errors[1]:.1e}")
    merges = [len(plan.merge[0].launches) for per_graph in executor._LAUNCHES._plans.values()
              for _, plan in per_graph.values() if getattr(plan, "merge", None) is not None]
    print(f"merging sibling plans: {len(merges)}, direct merge launches recorded: {merges}")
    if not used[True]:
        raise SystemExit("FAIL: no launch went through a bound launch")


if __name__ == "__main__":
    main()
