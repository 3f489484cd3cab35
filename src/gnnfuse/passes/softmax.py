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

from ..ir import Program, Value


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
