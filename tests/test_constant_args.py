"""A constant that changes between calls (an annealed temperature) reuses the kernels.

A Python number a UDF reads is a constant of its traced program; the code generators
pass it to the kernel as an argument (backend/constant_args.py), so a new value traces
and plans a new program but compiles no new kernel. Before, every value wrote new kernel
source: a Triton or Numba compile per step, and kernels kept for the process.
"""
from __future__ import annotations

import pytest
import torch
from oracle_check import device_for

from gnnfuse import frontend
from gnnfuse.backend import kernel_cache
from gnnfuse.graph import Graph

_EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2, 4, 6, 6, 1],
                       [1, 2, 3, 4, 5, 0, 3, 5, 1, 0, 2, 6]])


def _tempered_step(graph: Graph, h: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A softmax over in-edges at temperature ``tau``, scaled and shifted by it too: the
    constant sits in an edge score, a division, an addition and a maximum."""
    h = h.detach().requires_grad_(True)

    def message(edges):
        return {"s": (edges.src["h"] * edges.dst["h"]).sum(-1, keepdim=True) / tau, "m": edges.src["h"] * tau + 0.5}

    def reduce(nodes):
        alpha = torch.softmax(nodes.mailbox["s"], dim=1)
        return {"o": torch.maximum(torch.sum(alpha * nodes.mailbox["m"], dim=1), nodes.data["h"] * 0.0 - tau)}
    out = frontend.message_passing(graph, message, reduce, ndata={"h": h})["o"]
    out.pow(2).sum().backward()
    return out.detach(), h.grad


def _eager(h: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = h.detach().requires_grad_(True)
    src, dst = _EDGES
    score = (h[src] * h[dst]).sum(-1, keepdim=True) / tau
    peak = torch.full((h.shape[0], 1), float("-inf"), dtype=h.dtype).scatter_reduce(
        0, dst[:, None], score, "amax")
    weight = (score - peak[dst]).exp()
    total = torch.zeros(h.shape[0], 1, dtype=h.dtype).index_add_(0, dst, weight)
    summed = torch.zeros_like(h).index_add_(0, dst, weight / total[dst] * (h[src] * tau + 0.5))
    out = torch.maximum(summed, h * 0.0 - tau)
    out.pow(2).sum().backward()
    return out.detach(), h.grad


@pytest.mark.parametrize("backend_name", ["cpu", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_constant_changing_every_step_compiles_no_new_kernels(backend_name, dtype, monkeypatch, fresh_compile):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend_name)
    device = device_for(backend_name)
    graph = Graph(_EDGES[0], _EDGES[1], num_nodes=7).to(device)
    h = torch.randn(7, 4, dtype=dtype, generator=torch.Generator().manual_seed(3))
    kernels = []
    for tau in (0.9, 0.8, 0.7, 0.3, 2, -1.5):
        out, grad = _tempered_step(graph, h.to(device), tau)
        expected, expected_grad = _eager(h, tau)
        torch.testing.assert_close(out.cpu(), expected)
        torch.testing.assert_close(grad.cpu(), expected_grad)
        kernels.append(len(kernel_cache._KERNELS))
    # the graph's first pass runs the reference executor; its second step builds the kernels
    assert kernels[2:] == [kernels[1]] * 4, kernels


@pytest.mark.parametrize("tau", [1e39, float("inf"), float("nan"), -0.0, 1e-45, 3.4028235677973366e38])
def test_a_constant_argument_rounds_as_the_literal_did(tau, monkeypatch):
    """The argument is float64 and the kernel converts it to float32 as the literal was:
    beyond float32's range to inf, a subnormal to its nearest float32, as torch rounds
    the Python number (`_eager`'s ``x * tau``)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    graph = Graph(_EDGES[0], _EDGES[1], num_nodes=7).to(device)
    h = torch.randn(7, 4, generator=torch.Generator().manual_seed(5))
    src, dst = _EDGES
    expected = torch.zeros_like(h).index_add_(0, dst, h[src] * tau)
    for _ in range(2):     # the second call runs the kernel (the first pass, to a backward, the reference's)
        x = h.detach().to(device).requires_grad_(True)
        out = frontend.message_passing(graph, lambda e: {"m": e.src["h"] * tau},
                                       lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": x})["o"]
        out.sum().backward()
        torch.testing.assert_close(out.detach().cpu(), expected, equal_nan=True)


@pytest.mark.parametrize("backend_name", ["cpu", "triton"])
@pytest.mark.parametrize("setting", ["leaky_relu", "clamp", "elu"])
def test_an_op_setting_changing_every_step_compiles_no_new_kernels(backend_name, setting, monkeypatch, fresh_compile):
    """An op's numeric setting its kernel expression reads (``leaky_relu``'s slope,
    ``clamp``'s bound, ``elu``'s alpha) is an argument too, in the forward and backward."""
    import torch.nn.functional as F
    ops = {"leaky_relu": lambda x, c: F.leaky_relu(x, c), "clamp": lambda x, c: torch.clamp(x, min=c),
           "elu": lambda x, c: F.elu(x, c)}
    op = ops[setting]
    monkeypatch.setenv("GNNFUSE_BACKEND", backend_name)
    device = device_for(backend_name)
    graph = Graph(_EDGES[0], _EDGES[1], num_nodes=7).to(device)
    h = torch.randn(7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    src, dst = _EDGES
    kernels = []
    for c in (0.1, 0.2, 0.3, -0.4, 0.55):
        x = h.detach().to(device).requires_grad_(True)
        out = frontend.message_passing(graph, lambda e: {"m": op(e.src["h"], c)},
                                       lambda n: {"o": torch.sum(n.mailbox["m"], 1)}, ndata={"h": x})["o"]
        out.pow(2).sum().backward()
        y = h.clone().requires_grad_(True)
        expected = torch.zeros_like(h).index_add_(0, dst, op(y[src], c))
        expected.pow(2).sum().backward()
        torch.testing.assert_close(out.detach().cpu(), expected.detach())
        torch.testing.assert_close(x.grad.cpu(), y.grad)
        kernels.append(len(kernel_cache._KERNELS))
    assert kernels[2:] == [kernels[1]] * 3, kernels
