"""Edge softmax as plain reductions, so fusion can keep its scores out of memory.

``edge_softmax(x)`` becomes ``p / sum(p)`` with ``p = exp(x - max(x))``, the max and the
sum taken over each destination's in-edges. Each step is an ordinary Reduce or
elementwise op, so the fusion pass puts the score computation into every kernel that
needs it -- the max pass, the sum pass and the weighted aggregation -- and no |E|-sized
score or attention tensor is ever written (the online-softmax idea of flash attention,
by recomputation instead of a running rescale). The max is only a shift for numerical
safety: the softmax does not depend on it, so it sits behind ``stop_gradient`` and
autodiff differentiates ``p / sum(p)`` alone, which is exact.

The same holds for a softmax written out by hand, ``exp(x - max(x)) / sum(...)``
(GATv2's layer, a user's vertex function): `stop_softmax_shift_gradients` marks its shift
too. Differentiated as written, the shift's exactly-zero gradient costs the backward a
pass counting the max's ties and extra terms in every later kernel.
"""
from __future__ import annotations

from ..ir import Program, Residency, Value


def decompose_edge_softmax(program: Program) -> Program:
    """Rewrite every ``edge_softmax`` into max-reduce, exp, sum-reduce and divide."""
    for v in [v for v in program.values if v.op == "edge_softmax"]:
        x, by, src = v.inputs[0], v.attrs["by"], v.source
        peak = program.add("stop_gradient", program.add("reduce", x, op="max", by=by, source=src), source=src)
        p = program.add("exp", program.add("sub", x, program.add("broadcast", peak, by=by, source=src),
                                           source=src), source=src)
        total = program.add("reduce", p, op="sum", by=by, source=src)
        y = program.add("div", p, program.add("broadcast", total, by=by, source=src), source=src)
        program.replace_uses(v, y)
    return program


def stop_softmax_shift_gradients(program: Program) -> Program:
    """Wrap the shift ``c`` of every ``p = exp(x - broadcast(c))`` in ``stop_gradient``
    when ``p`` is only ever normalized over the same groups: each use of ``p`` is the
    numerator of ``p / broadcast(sum(p))`` or that sum, feeding only such denominators
    (and none of them is an output). Then ``p / sum(p)`` does not depend on ``c``, so
    its gradient through ``c`` is exactly zero (PyG's ``softmax`` detaches its max too)."""
    users = program.users()
    outputs = {v.id for v in program.outputs.values()}

    def only(value: Value, ok) -> bool:
        return value.id not in outputs and bool(users[value.id]) and all(ok(u) for u in users[value.id])

    for p in [v for v in program.values if v.op == "exp"]:
        shifted = p.inputs[0]
        if shifted.op != "sub" or shifted.inputs[1].op != "broadcast" or \
                shifted.inputs[1].inputs[0].op == "stop_gradient":
            continue
        shift = shifted.inputs[1]
        by = shift.attrs["by"]

        def denominator(u: Value, p: Value = p) -> bool:   # p / broadcast(sum(p)), p not its own divisor
            return u.op == "div" and u.inputs[0] is p and u.inputs[1].op == "broadcast"

        def normalizer(u: Value, p: Value = p, by: str = by) -> bool:   # sum(p), read only as such divisors
            return (u.op == "reduce" and u.inputs[0] is p and u.attrs.get("op") == "sum" and u.attrs.get("by") == by
                    and only(u, lambda b: b.op == "broadcast" and b.attrs["by"] == by and only(b, denominator)))

        if only(p, lambda u: normalizer(u) or (denominator(u) and normalizer(u.inputs[1].inputs[0]))):
            frozen = program.add("stop_gradient", shift.inputs[0], source=shift.source)
            shifted.inputs = (shifted.inputs[0], program.add("broadcast", frozen, by=by, source=shift.source))
    program.toposort()
    return program


def normalize_after_aggregation(program: Program) -> Program:
    """``sum_e (p_e / T) * m_e`` -> ``(sum_e p_e * m_e) / T`` for a softmax's weighted sum.

    ``p = exp(s - broadcast(max s))`` and ``T = sum p`` over the same groups, so ``T``
    is one number per group and leaves the sum: the weighted sum and the normalizer
    then depend on the max alone, not on each other, and one walk of the CSR can take
    all three (the max online, `passes/online_softmax.py`). A layer written the way the
    maths reads (GAT, HGT: ``weights[i] / total``) otherwise walks its graph three
    times in the forward -- on an ogbn-mag-sized HGT step each walk cost about 2 ms.

    Exact, not approximate: with the shift by the maximum every group with an edge has
    ``T >= 1`` (its largest score contributes ``exp(0) = 1``), and a NaN or infinite
    score makes both forms NaN. A group without edges has ``T = 0`` and a zero sum; it
    is divided by 1 instead (``select``), keeping the zero row the unnormalized form
    gives. Only the shifted form is rewritten: unshifted, ``T`` can underflow to 0
    where the written form is NaN."""
    for v in [v for v in program.values if v.op == "reduce" and v.attrs.get("op") == "sum"]:
        found = _normalized_factor(v)
        if found is None:
            continue
        weights, views, total, other = found
        src = v.source
        x = weights
        den = total
        for view in views:            # the same reshapes, applied to the weights and to T
            x = program.add("reshape", x, source=view.source, shape=view.attrs["shape"])
            den = program.add("reshape", den, source=view.source, shape=view.attrs["shape"])
        summed = program.add("reduce", program.add("mul", x, other, source=src), source=src, **v.attrs)
        one = program.add("const", value=1.0, dtype=total.dtype, source=src)
        program.replace_uses(v, program.add("div", summed, program.add("select", den, den, one, source=src),
                                            source=src))
    return program


def _normalized_factor(v: Value) -> tuple[Value, list[Value], Value, Value] | None:
    """(p, the reshapes between ``p / broadcast(T)`` and the product, T, the product's
    other factor) when ``v = reduce(reshape*(p / broadcast(T)) * m, sum, by)`` with
    ``p = exp(s - broadcast([stop_gradient] max s))`` and ``T = sum p`` by the same
    groups; None otherwise."""
    by, product = v.attrs["by"], v.inputs[0]
    if by not in ("src", "dst") or product.op != "mul":
        return None
    for factor, other in (product.inputs, product.inputs[::-1]):
        views = []
        while factor.op == "reshape":
            views.append(factor)
            factor = factor.inputs[0]
        if factor.op != "div" or factor.residency is not Residency.EDGE:
            continue
        weights, spread = factor.inputs
        if not (spread.op == "broadcast" and spread.attrs["by"] == by and spread.shape == weights.shape):
            continue
        total = spread.inputs[0]
        if (total.op == "reduce" and total.attrs == {"op": "sum", "by": by} and total.inputs[0] is weights
                and _shifted_exp(weights, by) and weights.dtype == other.dtype == v.dtype):
            return weights, views[::-1], total, other
    return None


def _shifted_exp(p: Value, by: str) -> bool:
    """``p = exp(s - broadcast(m))`` with ``m = max s`` (or its stop_gradient) by ``by``."""
    if p.op != "exp" or p.inputs[0].op != "sub":
        return False
    scores, shift = p.inputs[0].inputs
    if shift.op != "broadcast" or shift.attrs["by"] != by or shift.shape != scores.shape:
        return False
    peak = shift.inputs[0]
    if peak.op == "stop_gradient":
        peak = peak.inputs[0]
    return peak.op == "reduce" and peak.attrs == {"op": "max", "by": by} and peak.inputs[0] is scores
