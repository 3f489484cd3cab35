"""Float32 divisions and square roots inside generated kernels round as torch's do.

Torch's CUDA kernels divide and take square roots correctly rounded; Triton's float32
``/`` is ``div.full.f32`` (within 2 ulps) and ``tl.sqrt`` the approximate square root,
so on a GPU a kernel's ``a / b``, ``sqrt(x)``, a mean's ``sum / degree``
and a row's ``sum / scale`` came out an ulp or two off torch's on some values. The
kernels now write ``tl.div_rn`` and ``tl.sqrt_rn`` in float32 (`gnnfuse.ir.rounded`), and
these tests want torch's values bit for bit, on many random values so that an
approximate instruction would miss some. Triton's interpreter computes both forms
exactly, so on a machine without a GPU they pass either way; they exercise the code
path there, and only CUDA (the triton backend's device on a GPU machine) can fail.

The oracle is the correctly rounded float32: the op in float64, rounded once to float32,
which for one division or square root is the correctly rounded result (float64 has more
than twice float32's precision, so the double rounding is harmless). On CUDA it is
torch's own value (checked too); torch's float32 ``sqrt`` on a CPU with AVX-512 is not
correctly rounded (1 ulp off on 18% of these values), so it is no oracle there.
"""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.runtime.explain import explain

COUNT = 4096


def _ring(n: int, device: str) -> gnnfuse.Graph:
    return gnnfuse.Graph(torch.arange(n), (torch.arange(n) + 1) % n, n).to(device)


def _spread(gen: torch.Generator, n: int) -> torch.Tensor:
    """``n`` float32 values of random sign, significand and exponent (2**-20 to 2**20)."""
    magnitude = torch.exp2(torch.rand(n, generator=gen) * 40 - 20)
    return torch.where(torch.rand(n, generator=gen) < 0.5, -magnitude, magnitude).view(-1, 1)


def _kernels(run) -> str:
    """The generated kernels ``run()`` launches, one after another (`explain`)."""
    report = explain(run, source=True)
    return "\n".join(step.source or "" for program in report.programs
                     for plan in (program.forward, program.backward) if plan is not None for step in plan.steps)


def _per_edge(device: str, fn, a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``fn(a)`` (or ``fn(a, b)``) of each value inside an edge kernel: one edge per
    value, ``a`` its source's row (times an edge weight of 1, so the op is the kernel's
    work rather than a per-vertex torch op), ``b`` its own edge data."""
    ring = _ring(a.shape[0], device)
    if b is None:
        return gnnfuse.ops.gsddmm(ring, lambda xs, w: fn(xs * w), src=a.to(device), edge=torch.ones_like(a).to(device))
    return gnnfuse.ops.gsddmm(ring, lambda xs, eb: fn(xs, eb), src=a.to(device), edge=b.to(device))


def _rounded(fn, *operands: torch.Tensor) -> torch.Tensor:
    """``fn`` of float32 ``operands`` correctly rounded: computed in float64, rounded once."""
    return fn(*(x.double() for x in operands)).float()


# each one rounding of float32 operands, so `_rounded` is its correctly rounded value
ELEMENTWISE = {
    "div": (2, lambda a, b: a / b),
    "sqrt": (1, lambda a: torch.sqrt(a.abs())),
}


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
@pytest.mark.parametrize("name", ELEMENTWISE)
def test_float32_division_and_square_root_in_a_kernel_are_torchs(name, backend, device):
    arity, fn = ELEMENTWISE[name]
    gen = torch.Generator().manual_seed(0)
    columns = [_spread(gen, COUNT) for _ in range(arity)]
    source = _kernels(lambda: _per_edge(device, fn, *columns))
    assert ("tl.sqrt_rn(" if name == "sqrt" else "tl.div_rn(") in source
    assert "tl.sqrt(" not in source
    got = _per_edge(device, fn, *columns)
    want = _rounded(fn, *columns).to(device)
    if got.is_cuda:
        torch.testing.assert_close(fn(*(c.to(device) for c in columns)), want, rtol=0.0, atol=0.0)
    torch.testing.assert_close(got, want, rtol=0.0, atol=0.0)


def _in_degrees(device: str, degrees: torch.Tensor) -> gnnfuse.Graph:
    """A graph whose vertex ``v`` has ``degrees[v]`` in-edges, from vertices in turn."""
    n = degrees.shape[0]
    dst = torch.repeat_interleave(torch.arange(n), degrees)
    return gnnfuse.Graph(torch.arange(dst.shape[0]) % n, dst, n).to(device)


def _integers(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """Integer-valued float32 features: a sum of a few of them is exact in any order,
    so a mean or a scaled sum differs from torch's only by its division."""
    return torch.randint(-1000, 1000, (rows, width), generator=gen).float()


@pytest.mark.parametrize("schedule", ["csr", "rows"])
@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_float32_mean_divides_as_torch(schedule, backend, device):
    """A mean is its row's sum over the degree, correctly rounded as torch's ``sum /
    count`` (degrees 3, 5, 6, 7: quotients that are not exact)."""
    gen = torch.Generator().manual_seed(1)
    n, width = 1024, 4
    degrees = torch.tensor([3, 5, 6, 7]).repeat(n // 4)
    graph = _in_degrees(device, degrees)
    x = _integers(gen, n, width).to(device)
    ones = torch.ones(graph.num_edges, 1, device=device)
    def mean():
        return gnnfuse.ops.gspmm(graph, lambda xs, w: xs * w, "mean", src=x, edge=ones, schedule=schedule)
    assert "tl.div_rn(acc, " in _kernels(mean)
    got = mean()
    sums = torch.zeros_like(x).index_add(0, graph.dst.long(), x[graph.src.long()])
    want = _rounded(torch.div, sums, degrees.to(device)[:, None].float())
    if x.is_cuda:
        torch.testing.assert_close(x.new_zeros(x.shape).index_reduce(0, graph.dst.long(), x[graph.src.long()], "mean",
                                                                       include_self=False), want, rtol=0.0, atol=0.0)
    torch.testing.assert_close(got, want, rtol=0.0, atol=0.0)


@gnnfuse.vertex
def _sum_over_scale(v):
    return sum([u.h * u.w for u in v.innbs]) / v.d


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_float32_row_scale_divides_as_torch(backend, device):
    """``sum(...) / v.d`` with ``d`` a given table is divided inside the sum's kernel
    (a row scale), correctly rounded as torch's division of the finished sum."""
    gen = torch.Generator().manual_seed(2)
    n, width = 1024, 4
    graph = _in_degrees(device, torch.tensor([1, 2, 3, 4]).repeat(n // 4))
    h, w = _integers(gen, n, width).to(device), torch.ones(n, 1, device=device)
    d = (torch.randint(1, 1000, (n, 1), generator=gen).float() * 0.37).to(device)
    tables = {"h": h, "w": w, "d": d}
    [program] = explain(_sum_over_scale, graph, tables).programs
    assert [s.item.op for s in program.forward.steps if not s.fused and s.item.op != "const"] == []
    assert "tl.div_rn(acc, " in _kernels(lambda: _sum_over_scale(graph, tables))
    got = _sum_over_scale(graph, tables)
    want = _rounded(torch.div, torch.zeros_like(h).index_add(0, graph.dst.long(), h[graph.src.long()]), d)
    torch.testing.assert_close(got, want, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_float64_kernels_keep_the_plain_forms(backend, device):
    """``tl.div_rn`` and ``tl.sqrt_rn`` take float32 only; float64's ``/`` and ``tl.sqrt``
    are correctly rounded already, so a float64 kernel keeps them (and compiles on a GPU)."""
    gen = torch.Generator().manual_seed(3)
    a, b = (_spread(gen, 256).double() for _ in range(2))

    def run():
        return _per_edge(device, lambda x, y: torch.sqrt(x.abs()) / y, a, b)
    source = _kernels(run)
    assert "_rn(" not in source and "tl.sqrt(" in source
    # (within an ulp: torch's float64 sqrt on a CPU is not always correctly rounded either)
    torch.testing.assert_close(run(), (torch.sqrt(a.abs()) / b).to(device), rtol=torch.finfo(torch.float64).eps,
                               atol=0.0)
