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


def normalize_after_sum(program: Program) -> Program:
    """``sum_e(p_e / s_v * r_e)`` -> ``sum_e(p_e * r_e) / s_v``, for a max-shifted softmax.

    The attention aggregation of GAT reads the softmax's normalizer ``s_v`` on every
    edge, so it could only run after the pass summing ``s`` -- one more walk over the
    edges. ``s_v`` is constant over ``v``'s group, so it divides the sum instead: the
    numerator and the normalizer become two independent sums over the same CSR, which
    the sibling grouping (passes/siblings.py) runs as one kernel, and the division is a
    dense per-vertex op (flash attention divides once at the end for the same reason).

    Applied where ``p = exp(x - broadcast(m))``, ``m`` the max of ``x`` over the same
    groups (possibly behind ``stop_gradient``), ``s = sum(p)`` over them, and ``p / s``
    reaches the sum only through reshapes and products with values that do not depend
    on ``s``, each used once. The division is by ``nonzero_or_one(s)`` (``s + [s == 0]``):
    an empty group (a vertex without in-edges) has ``s = 0`` and a zero sum, and gets
    ``0 / 1 = 0`` as the per-edge form gave, not ``0 / 0``. Only there:
    a group with edges has ``s >= 1`` (its largest score contributes ``exp(0) = 1``),
    which is why the shift by the max is required -- without it every ``p`` of a group
    may underflow to 0, where the per-edge form gives NaN and this form would give 0.
    The indicator has no gradient, so the backward sees ``d out / d s`` of a plain
    division (the same per-edge work as `autodiff.softmax_sum`'s identity, which the
    form it is written for no longer matches)."""
    changed = True
    while changed:
        changed = False
        users = program.users()
        for d in list(program.values):
            found = _normalized_chain(program, d, users)
            if found is None:
                continue
            p, total, chain, summed = found
            carried, previous = p, d
            for step in chain:      # the same steps on p: reshapes, and products with s-free values
                carried = program.add(step.op, *[carried if i is previous else i for i in step.inputs],
                                      source=step.source, **step.attrs)
                previous = step
            numerator = program.add("reduce", carried, source=summed.source, **summed.attrs)
            # built after the numerator, so no op reading the normalizer sits between the
            # two sums in the plan and they stay groupable
            divisor = program.add("nonzero_or_one", total, source=d.source)
            for step in chain:
                if step.op == "reshape":
                    divisor = program.add("reshape", divisor, source=step.source, **step.attrs)
            program.replace_uses(summed, program.add("div", numerator, divisor, source=summed.source))
            changed = True
            break
    return program


def _normalized_chain(program: Program, d: Value, users: dict[int, list[Value]]):
    """(p, s, steps from ``p / broadcast(s)`` to the sum, the sum) where ``d`` is such a
    normalized softmax feeding a sum over its groups (see `normalize_after_sum`), else None."""
    if d.op != "div" or d.inputs[1].op != "broadcast":
        return None
    p, spread = d.inputs
    total, by = spread.inputs[0], spread.attrs["by"]
    if not (p.op == "exp" and total.op == "reduce" and total.attrs.get("op") == "sum"
            and total.attrs.get("by") == by and total.inputs[0] is p and p.shape == total.shape == d.shape
            and _max_shifted(p.inputs[0], by)):
        return None
    outputs = {v.id for v in program.outputs.values()}
    chain: list[Value] = []
    current = d
    while True:
        if current.id in outputs or len(users[current.id]) != 1:
            return None
        step = users[current.id][0]
        if step.op == "reduce" and step.attrs.get("op") == "sum" and step.attrs.get("by") == by:
            return p, total, chain, step
        if step.op == "reshape":
            pass
        elif step.op == "mul" and sum(i is current for i in step.inputs) == 1:
            other = step.inputs[1] if step.inputs[0] is current else step.inputs[0]
            if _depends_on(other, total):
                return None
        else:
            return None
        chain.append(step)
        current = step


def _max_shifted(shifted: Value, by: str) -> bool:
    """``x - broadcast(max(x))`` over groups ``by`` (the max possibly behind stop_gradient)."""
    if shifted.op != "sub" or shifted.inputs[1].op != "broadcast" or shifted.inputs[1].attrs["by"] != by:
        return False
    peak = shifted.inputs[1].inputs[0]
    if peak.op == "stop_gradient":
        peak = peak.inputs[0]
    return (peak.op == "reduce" and peak.attrs.get("op") == "max" and peak.attrs.get("by") == by
            and peak.inputs[0] is shifted.inputs[0])


def _depends_on(value: Value, target: Value) -> bool:
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v is target:
            return True
        if v.id not in seen:
            seen.add(v.id)
            stack.extend(v.inputs)
    return False
