"""Rows no edge reads keep eager code's exact zero gradients after broadcast reordering.

Broadcast reordering (passes/reorder.py) computes ``f(u.h)`` once per vertex instead of
once per edge, so ``f`` also runs on vertices that send no edge, and its backward runs
there on a zero gradient. Eager code never touches those rows. Where ``f``'s derivative
is infinite at a finite point (sqrt or log at 0, ``x ** -0.5``, ``1 / x``, exp's
overflow) that was ``inf * 0 = NaN`` in the input's gradient, and through ``h = x @ W``
in every weight's: finite inputs, NaN gradients (found by differential fuzzing).
"""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.frontend.templates import gspmm
from oracle_check import assert_matches_oracle

# Vertex 3 sends no edge (and 4 neither sends nor receives); each one's row is where the
# unbounded derivative sits.
SRC = torch.tensor([0, 2, 1, 0, 2])
DST = torch.tensor([1, 1, 0, 2, 2])
N = 5


def _features(device: str) -> torch.Tensor:
    h = torch.rand(N, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5
    h[3] = 0.0          # sqrt, log, x ** -0.5 and 1 / x have an infinite derivative at 0
    h[4, 0] = 800.0     # exp(800) overflows float64
    return h.to(device)


@gnnfuse.vertex
def sqrt_sum(v):
    return sum([torch.sqrt(u.h) for u in v.innbs])


@gnnfuse.vertex
def log_times_weight(v):
    return sum([torch.log(u.h) * u.w for u in v.innbs])


@gnnfuse.vertex
def rsqrt_then_exp(v):
    return sum([torch.exp(-(u.h ** -0.5)) + 1.0 / (u.h + 1.0) for u in v.innbs])


@gnnfuse.vertex
def exp_sum(v):
    return sum([torch.exp(u.h - 1.0) for u in v.innbs])


def _eager(fn, h: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    src, dst = SRC.to(h.device), DST.to(h.device)
    terms = fn(h[src], None if w is None else w[src])
    return torch.zeros(N, *terms.shape[1:], dtype=terms.dtype, device=h.device).index_add(0, dst, terms)


EAGER = {
    sqrt_sum: lambda h, w: torch.sqrt(h),
    log_times_weight: lambda h, w: torch.log(h) * w,
    rsqrt_then_exp: lambda h, w: torch.exp(-(h ** -0.5)) + 1.0 / (h + 1.0),
    exp_sum: lambda h, w: torch.exp(h - 1.0),
}


@pytest.mark.parametrize("udf", list(EAGER), ids=lambda f: f.__name__)
def test_vertex_functions_give_unread_rows_eagers_zero_gradient(udf, backend, device):
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    h = _features(device)
    if udf is sqrt_sum or udf is log_times_weight:
        h[4, 0] = 1.0   # log(800) is finite, but keep these two about the zero row
    inputs = {"h": h}
    if udf is log_times_weight:
        inputs["w"] = torch.randn(N, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    assert_matches_oracle(lambda **feats: {"out": udf(graph, feats)},
                          lambda **feats: {"out": _eager(EAGER[udf], feats["h"], feats.get("w"))}, inputs)


def test_a_weight_before_a_source_side_sqrt_gets_a_finite_gradient(backend, device):
    """``h = x @ W`` is 0 on vertex 3, which sends no edge: its NaN reached all of W."""
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    x = torch.rand(N, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    x[3] = 0.0
    weight = torch.tensor([[1.0, 0.5], [0.2, 1.0]], dtype=torch.float64, device=device)

    def ours(weight):
        return {"out": gspmm(graph, lambda xs: torch.sqrt(xs), "sum", src=x @ weight)}

    def eager(weight):
        return {"out": _eager(lambda h, w: torch.sqrt(h), x @ weight, x)}

    assert_matches_oracle(ours, eager, {"weight": weight})


def test_only_ops_with_unbounded_derivatives_read_masked_rows():
    """The mask costs a pass over vertex rows where fusion would otherwise compute the op
    per edge in registers, so bounded ops (matmul, products: GCN's ``u.h * u.norm``) move
    as before; sqrt moves behind one ``select`` by out-degree."""
    from gnnfuse.ir import Program, Residency
    from gnnfuse.passes import reorder_broadcasts

    program = Program()
    h = program.input("h", Residency.NODE, (4,), torch.float32)
    weight = program.input("W", Residency.SHARED, (4, 4), torch.float32)
    gathered = program.add("broadcast", h, by="src")
    program.output("a", program.add("reduce", program.add("matmul", gathered, weight), op="sum", by="dst"))
    program.output("b", program.add("reduce", program.add("sqrt", gathered), op="sum", by="dst"))
    reorder_broadcasts(program)
    moved = {v.op: v for v in program if v.op in ("matmul", "sqrt") and v.residency is Residency.NODE}
    assert moved["matmul"].inputs[0] is h
    select = moved["sqrt"].inputs[0]
    assert select.op == "select" and select.inputs[1] is h
    assert select.inputs[0].op == "degree" and select.inputs[0].attrs["by"] == "src"


NEG_INF = float("-inf")


@gnnfuse.vertex
def times_minus_inf(v):
    return sum([u.h * NEG_INF for u in v.innbs])


@gnnfuse.vertex
def over_zero(v):
    return sum([u.h / 0.0 for u in v.innbs])


@pytest.mark.parametrize("udf, eager", [(times_minus_inf, lambda h: h * NEG_INF), (over_zero, lambda h: h / 0.0)],
                         ids=["times_minus_inf", "over_zero"])
def test_an_infinite_constant_factor_stays_per_edge(udf, eager, backend, device):
    """``u.h * -inf`` moved before the gather made the backward ``-inf * sum(g)`` over a
    vertex's out-edges where eager code sums ``-inf * g`` per edge: +inf instead of NaN
    for vertex 0, whose two out-edges' gradients (1 and -2) differ in sign, and NaN
    (``-inf * 0``) instead of 0 for vertices 3 and 4, which send no edge."""
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    h = _features(device)
    seed = torch.tensor([1.0, 0.5, -2.0, 0.0, 0.0], dtype=torch.float64, device=device).unsqueeze(1)
    ha, hb = h.clone().requires_grad_(), h.clone().requires_grad_()
    out, expected = udf(graph, {"h": ha}), _eager(lambda x, w: eager(x), hb, None)
    torch.testing.assert_close(out, expected, equal_nan=True)
    (out * seed).sum().backward()
    (expected * seed).sum().backward()
    assert hb.grad[0].isnan().all() and (hb.grad[3:] == 0).all()
    torch.testing.assert_close(ha.grad, hb.grad, equal_nan=True)
