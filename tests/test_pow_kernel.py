"""``x ** c`` inside fused kernels: the cpu and triton backends evaluate ``pow`` in the
unit that uses it (it had no kernel expression, so every power split its unit and ran as
a torch op over an edge-sized tensor), with torch's values.

Torch computes ``x ** 2`` as ``x * x``, ``** 3`` as ``x * x * x``, ``** -2`` as ``1 / (x
* x)``, ``** -1`` as ``1 / x`` and ``** ±0.5`` as ``sqrt`` / ``1 / sqrt`` (half excepted),
``** 0`` as 1 and ``** 1`` as a copy: the kernels use the same formulas, so those
agree bit for bit. Any other exponent is ``std::pow`` (a correctly rounded float32 from
a float64 pow on torch's scalar path, Sleef's 1-ulp powf on its vector path); the
kernels take float32 powers from float64 ``exp(c * log|x|)``, correctly rounded but for
ties within 2**-45 of the result, so they may differ from torch's vector path by 1 ulp
(`ULPS`; on CUDA torch's powf and rsqrt are within 2 ulps: `GPU_ULPS`). Float64 powers of other exponents have no kernel expression accurate to a few
ulps and still run as torch ops.
"""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.runtime.explain import explain

VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 1.7, -2.3, 1e-3, -7e-4, 12.5, -40.0, 1e30, -1e30,
          1e-40, float("inf"), float("-inf"), float("nan")]
EXPONENTS = [2, 3, -1, -2, 0.5, -0.5, 0, 1, 4, -3, 5, 1.5, -0.7, 2.5, 0.1]
ULPS = 1
GPU_ULPS = 2    # torch's CUDA powf and rsqrt are within 2 ulps, not correctly rounded


def _ring(n: int, device: str) -> gnnfuse.Graph:
    return gnnfuse.Graph(torch.arange(n), (torch.arange(n) + 1) % n, n).to(device)


def _powered(x: torch.Tensor, exponent: float, device: str) -> torch.Tensor:
    """``x ** exponent`` of each value inside an edge kernel (one edge per value, written
    as it is, signed zeros included): times an edge weight of 1, so the power is the
    unit's work rather than a per-vertex op."""
    ring = _ring(x.shape[0], device)
    return gnnfuse.ops.gsddmm(ring, lambda xs, w: (xs * w) ** exponent, src=x, edge=torch.ones_like(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
@pytest.mark.parametrize("exponent", EXPONENTS)
def test_power_in_a_kernel_is_torchs(exponent, backend, device, dtype):
    x = torch.tensor(VALUES, dtype=dtype, device=device).view(-1, 1)
    got, want = _powered(x, exponent, device), x ** exponent
    exact = exponent in (2, 3, -1, -2, 0.5, -0.5, 0, 1) or dtype == torch.float64
    if x.is_cuda and exponent == -0.5:
        exact = False       # CUDA's rsqrt, which torch calls, is itself 2 ulps off
    rtol = 0.0 if exact else (GPU_ULPS if x.is_cuda else ULPS) * torch.finfo(dtype).eps
    torch.testing.assert_close(got, want, rtol=rtol, atol=0.0, equal_nan=True)
    # signs of zeros and infinities too (pow(-0.0, 3) is -0.0, pow(-0.0, -1) is -inf)
    finite_or_inf = ~want.isnan()
    assert torch.equal(got[finite_or_inf].signbit(), want[finite_or_inf].signbit())


def _edge_power(exponent: float):
    @gnnfuse.vertex
    def layer(v):
        return sum([(u.a * v.b) ** exponent for u in v.innbs])
    return layer


def _steps(layer, graph, tables) -> list[tuple[int, list[str]]]:
    """(fused units, torch ops other than inlined constants) of the forward and backward plans."""
    [program] = explain(layer, graph, tables).programs
    return [(sum(s.fused for s in plan.steps), [s.item.op for s in plan.steps if not s.fused and s.item.op != "const"])
            for plan in (program.forward, program.backward) if plan is not None]


@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
@pytest.mark.parametrize("exponent, dtype", [(2, torch.float64), (3, torch.float64), (0.5, torch.float64),
                                             (-1, torch.float64), (4, torch.float32), (1.5, torch.float32)])
def test_power_and_its_gradient_stay_in_their_units(exponent, dtype, backend, device):
    """A per-edge ``(a_u * b_v) ** c``: the forward is one aggregation unit, the backward
    two (one per operand) with its ``x ** (c - 1)`` inside; no torch op. Before, each
    power was a torch op over the edges: the forward 2 units and a pow, the backward
    3 units and a pow. Float64 gradients pass gradcheck."""
    gen = torch.Generator().manual_seed(0)
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3, 1]), torch.tensor([1, 2, 3, 0, 3]), 4).to(device)
    a, b = ((torch.rand(4, 3, generator=gen, dtype=dtype) + 0.5).to(device).requires_grad_() for _ in range(2))
    layer = _edge_power(exponent)
    assert _steps(layer, graph, {"a": a, "b": b}) == [(1, []), (2, [])]
    got = layer(graph, {"a": a, "b": b})
    want = torch.zeros_like(got).index_add(0, graph.dst, (a[graph.src] * b[graph.dst]) ** exponent)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, want, rtol=4 * eps, atol=0.0)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda a, b: layer(graph, {"a": a, "b": b}), (a, b))
    else:
        grads = torch.autograd.grad(got.sum(), (a, b))
        wants = torch.autograd.grad(want.sum(), (a, b))
        for g, w in zip(grads, wants):
            torch.testing.assert_close(g, w, rtol=8 * eps, atol=0.0)


@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
def test_float64_power_of_other_exponents_stays_a_torch_op(backend, device):
    """No kernel formula reaches torch's float64 ``std::pow`` within a few ulps for other
    exponents: it stays a torch op, with torch's values."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3, 1]), torch.tensor([1, 2, 3, 0, 3]), 4).to(device)
    a = torch.rand(4, 3, dtype=torch.float64, device=device) + 0.5
    layer = _edge_power(1.5)
    assert _steps(layer, graph, {"a": a, "b": a}) == [(2, ["pow"])]
    torch.testing.assert_close(layer(graph, {"a": a, "b": a}),
                               torch.zeros_like(a).index_add(0, graph.dst, (a[graph.src] * a[graph.dst]) ** 1.5))
