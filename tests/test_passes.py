"""Each rewrite pass on a small program: the rewritten listing and its op count."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.ir import Program, Residency, verify
from gnnfuse.passes import (eliminate_common_subexpressions, eliminate_dead_code, fold_constants, optimize,
                            reorder_broadcasts)
from oracle_check import assert_matches_oracle

R = Residency
f64 = torch.float64


def ops(p: Program) -> list[str]:
    return [v.op for v in p if v.op != "input"]


def test_broadcast_reordering_moves_dense_ops_before_the_gather():
    p = Program()
    h = p.input("h", R.NODE, (8,), f64)
    w = p.input("W", R.SHARED, (8, 4), f64)
    msg = p.add("relu", p.add("matmul", p.add("broadcast", h, by="src"), w))   # edges.src['h'] @ W
    p.output("out", p.add("reduce", msg, op="sum", by="dst"))
    assert ops(p) == ["broadcast", "matmul", "relu", "reduce"]
    reorder_broadcasts(p)
    eliminate_dead_code(p)
    verify(p)
    assert ops(p) == ["matmul", "relu", "broadcast", "reduce"]
    assert [v.residency for v in p if v.op in ("matmul", "relu")] == [R.NODE, R.NODE]
    assert p.op_count() == 4 and "NODE[4] float64              = matmul(%h, %W)" in p.pretty()


def test_reordering_keeps_ops_that_mix_source_and_destination():
    p = Program()
    h = p.input("h", R.NODE, (3,), f64)
    e = p.add("add", p.add("broadcast", h, by="src"), p.add("broadcast", h, by="dst"))
    p.output("out", p.add("reduce", e, op="sum", by="dst"))
    reorder_broadcasts(p)
    assert ops(p) == ["broadcast", "broadcast", "add", "reduce"]


def test_reordering_never_moves_random_masks():
    p = Program()
    h = p.input("h", R.NODE, (3,), f64)
    hs = p.add("broadcast", h, by="src")
    p.output("out", p.add("reduce", p.add("mul", hs, p.add("dropout_mask", hs, p=0.5)), op="sum", by="dst"))
    reorder_broadcasts(p)
    assert ops(p) == ["broadcast", "dropout_mask", "mul", "reduce"]


def test_cse_merges_equal_pure_ops_only():
    p = Program()
    h = p.input("h", R.NODE, (3,), f64)
    a, b = p.add("exp", h), p.add("exp", h)
    m1, m2 = p.add("dropout_mask", h, p=0.5), p.add("dropout_mask", h, p=0.5)
    p.output("out", p.add("add", p.add("add", a, b), p.add("add", m1, m2)))
    eliminate_common_subexpressions(p)
    assert ops(p) == ["exp", "dropout_mask", "dropout_mask", "add", "add", "add"]
    assert p.op_count("exp") == 1


@gnnfuse.vertex
def two_clamps(v):
    return sum([torch.clamp(u.h, min=0.3) * torch.clamp(u.h, min=0.7) for u in v.innbs])


def test_cse_keeps_ops_that_differ_only_in_an_attribute(backend, device):
    """Two clamps of one row with different bounds are two values: a signature without
    the attrs merged them, and the product became ``clamp(h, 0.3) ** 2``."""
    src, dst = torch.tensor([0, 2, 1, 0, 2]), torch.tensor([1, 1, 0, 2, 2])
    graph = gnnfuse.Graph(src, dst, 3).to(device)
    h = torch.linspace(0.0, 1.0, 6, dtype=f64).reshape(3, 2).to(device)

    def eager(h):
        terms = torch.clamp(h[src], min=0.3) * torch.clamp(h[src], min=0.7)
        return {"out": torch.zeros(3, 2, dtype=h.dtype, device=h.device).index_add(0, dst.to(h.device), terms)}
    assert_matches_oracle(lambda h: {"out": two_clamps(graph, {"h": h})}, eager, {"h": h})


def test_constant_folding():
    p = Program()
    h = p.input("h", R.NODE, (3,), f64)
    c = p.add("mul", p.add("const", value=2.0, dtype=f64), p.add("const", value=3.0, dtype=f64))
    p.output("out", p.add("mul", h, p.add("sqrt", c)))
    fold_constants(p)
    eliminate_dead_code(p)
    assert ops(p) == ["const", "mul"]
    assert abs(next(v for v in p if v.op == "const").attrs["value"] - 6.0 ** 0.5) < 1e-15


@pytest.mark.parametrize("op, expected", [("sub", 2.0 - 3.0), ("div", 2.0 / 3.0)])
def test_constant_folding_keeps_the_operands_order(op, expected):
    """A non-commutative op over two constants folds to ``a op b``, not ``b op a``."""
    p = Program()
    h = p.input("h", R.NODE, (3,), f64)
    c = p.add(op, p.add("const", value=2.0, dtype=f64), p.add("const", value=3.0, dtype=f64))
    p.output("out", p.add("mul", h, c))
    fold_constants(p)
    eliminate_dead_code(p)
    assert ops(p) == ["const", "mul"]
    assert next(v for v in p if v.op == "const").attrs["value"] == pytest.approx(expected, rel=1e-15)


def test_dead_code_elimination():
    p = Program()
    h = p.input("h", R.NODE, (3,), f64)
    p.input("unused", R.NODE, (3,), f64)
    p.add("exp", h)
    p.output("out", p.add("relu", h))
    eliminate_dead_code(p, keep_inputs=True)
    assert ops(p) == ["relu"] and set(p.inputs) == {"h", "unused"}
    eliminate_dead_code(p)
    assert set(p.inputs) == {"h"}


def test_optimize_pipeline_on_a_traced_gcn():
    from gnnfuse.frontend import trace_message_passing

    x, w = torch.randn(5, 4, dtype=f64), torch.randn(4, 2, dtype=f64)

    def message(edges):
        return {"m": (edges.src["h"] @ w) * edges.src["n"]}

    tracer = trace_message_passing(message, lambda n: {"out": torch.sum(n.mailbox["m"], dim=1)},
                                           None, {"h": x, "n": torch.ones(5, 1, dtype=f64)}, {})
    before = tracer.program.op_count()
    optimize(tracer.program)
    assert ops(tracer.program) == ["matmul", "mul", "broadcast", "reduce"]
    assert tracer.program.op_count() == before - 1   # two source broadcasts became one


def test_edge_softmax_decomposes_into_reductions_with_a_gradient_free_shift():
    from gnnfuse.autodiff import build_backward
    from gnnfuse.passes import decompose_edge_softmax
    p = Program()
    s = p.input("s", R.EDGE, (2,), f64)
    p.output("a", p.add("edge_softmax", s, by="dst"))
    decompose_edge_softmax(p)
    eliminate_dead_code(p)
    verify(p)
    assert ops(p) == ["reduce", "stop_gradient", "broadcast", "sub", "exp", "reduce", "broadcast", "div"]
    assert [v.attrs["op"] for v in p if v.op == "reduce"] == ["max", "sum"]
    backward = build_backward(p, ["s"])
    assert not any(v.op == "reduce" and v.attrs["op"] == "max" for v in backward.program)
    assert "eq" not in ops(backward.program)     # the max's tie-splitting derivative never runs


def _max_of(score: str) -> Program:
    """``max`` over in-edges of a per-edge value made from gathered rows: a feature sum
    (``(u.h * v.q).sum(-1, keepdim=True)``), a chain of additions (``u.h + v.q + v.q``),
    one addition under a relu (``relu(u.h + v.q)``) or the gathered row itself."""
    p = Program()
    h, q = p.input("h", R.NODE, (2, 3), f64), p.input("q", R.NODE, (2, 3), f64)
    hu, qv = p.add("broadcast", h, by="src"), p.add("broadcast", q, by="dst")
    value = {"feature sum": lambda: p.add("sum_dim", p.add("mul", hu, qv), dim=(-1,), keepdim=True),
             "chained sum": lambda: p.add("add", p.add("add", hu, qv), qv),
             "elementwise": lambda: p.add("relu", p.add("add", hu, qv)),
             "gather": lambda: hu}[score]()
    p.output("out", p.add("reduce", value, op="max", by="dst"))
    verify(p)
    return p


@pytest.mark.parametrize("score,saved", [("feature sum", True), ("chained sum", True), ("elementwise", False),
                                         ("gather", False)])
def test_a_max_derivative_compares_the_forwards_own_values(score, saved):
    """The backward of a max finds its arg-max edges by equality with the saved maximum,
    in two kernels (the hits and their count). A per-edge feature sum recomputed there is
    added in each kernel's own order, and a chain of additions may be regrouped, so they
    are saved and the forward's maximum is taken over those saved values; one op on
    gathered rows, and gathers, redo the same bits anywhere and stay recomputed (no
    [E, F] tensor kept)."""
    from gnnfuse.autodiff import build_backward
    p = _max_of(score)
    backward = build_backward(p, ["h", "q"])
    edge_saved = [v.op for v in backward.saved if v.residency is R.EDGE]
    assert edge_saved == ([p.outputs["out"].inputs[0].op] if saved else [])
    eq = next(v for v in backward.program if v.op == "eq")
    assert (eq.inputs[0].op == "input") == saved      # a saved value is an input of the backward
