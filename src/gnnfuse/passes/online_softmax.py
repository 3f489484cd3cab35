"""Which sums may take a softmax's maximum online, in the walk that finds it.

A softmax's forward is a max by destination, its normalizer ``T = sum p`` with
``p = exp(s - broadcast(max s))``, and a weighted sum ``sum (p / broadcast(T)) * m``:
three walks over the graph, each waiting for the one before. Flash attention's online
softmax takes them in one: keep a running maximum ``r`` per row, add ``exp(s - r) * m``
for each chunk of edges, and when a chunk raises ``r`` to ``r'``, first multiply what
was added so far by ``exp(r - r')``. At the end ``r`` is the maximum and the sum is the
one with the final shift -- provided the sum is *linear* in ``p``: each term is ``p``
times factors that do not depend on the maximum. The division by ``T`` is linear too,
``T`` being one number per row: the weighted sum accumulates its own copy of ``T``
alongside (the same terms, rescaled the same way) and divides once at the end.

`online_terms` checks that on a unit's expression; `passes/siblings.py` then lets such
a unit join its max's group (and its normalizer's), and the Triton backend's
``generate_siblings`` emits the running maximum, the rescaling and the division. On an
ogbn-mag-sized HGT step the forward's three walks over 21.1M edges took about 2 ms
each per layer; GAT's forward has the same three.
"""
from __future__ import annotations

from ..ir import Value
from .fusion import AggregateUnit

ONLINE_REDUCERS = ("sum", "mean")        # linear: a rescaled partial sum is still the sum
_VIEWS = ("reshape", "expand", "neg")    # ops that pass one operand's value through, linearly


def online_terms(unit: AggregateUnit, peak: AggregateUnit, normalizers: list[AggregateUnit]) -> tuple[bool, AggregateUnit | None]:
    """(whether ``unit`` may take ``peak``'s maximum online, the unit among
    ``normalizers`` it divides by, if any). It may when it reads the maximum only as the
    shift of one ``p = exp(s - broadcast(max))``, with ``s`` the very scores ``peak``
    reduces, and its summed expression is linear in ``p`` (one occurrence, reached
    through products, a numerator and views) -- or in ``p / broadcast(T)``, where ``T``
    is a normalizer's output, the sum of that same ``p`` by the same index."""
    if not (isinstance(unit, AggregateUnit) and isinstance(peak, AggregateUnit)
            and peak.reduce.attrs["op"] == "max" and unit.reduce.attrs["op"] in ONLINE_REDUCERS
            and unit.by == peak.by and unit.addend is None and unit.scale is None):
        return False, None
    body = {v.id for v in unit.body}
    maximum = peak.reduce
    shifts = [v for v in unit.body if v.op == "exp" and _is_shift(v, maximum, unit.by)]
    if len(shifts) != 1:
        return False, None
    p = shifts[0]
    totals = {n.reduce.id: n for n in normalizers
              if n.by == unit.by and n.reduce.attrs["op"] == "sum" and n.reduce.inputs[0] is p}
    used: list[AggregateUnit] = []

    def depends(v: Value, seen: dict[int, bool]) -> bool:
        """``v`` reads the maximum or a normalizer (as the unit's leaf, or through body values)."""
        if v.id not in seen:
            seen[v.id] = (v is maximum or v.id in totals
                          or (v.id in body and any(depends(i, seen) for i in v.inputs)))
        return seen[v.id]

    seen: dict[int, bool] = {}
    if depends(maximum.inputs[0], seen):
        return False, None

    def normalized(v: Value) -> bool:
        """``v = p / broadcast(T)`` for a normalizer's ``T``."""
        if v.op != "div" or v.inputs[0] is not p or v.id not in body:
            return False
        spread = v.inputs[1]
        if spread.op != "broadcast" or spread.attrs["by"] != unit.by or spread.inputs[0].id not in totals:
            return False
        used.append(totals[spread.inputs[0].id])
        return True

    def linear(v: Value) -> bool:
        if v is p or normalized(v):
            return True
        if v.id not in body:
            return False
        if v.op in _VIEWS:
            return linear(v.inputs[0])
        if v.op == "mul":
            a, b = v.inputs
            return (linear(a) and not depends(b, seen)) or (linear(b) and not depends(a, seen))
        if v.op == "div":
            return linear(v.inputs[0]) and not depends(v.inputs[1], seen)
        return False

    if not linear(unit.reduce.inputs[0]) or len(used) > 1:
        return False, None
    return True, (used[0] if used else None)


def _is_shift(p: Value, maximum: Value, by: str) -> bool:
    """``p = exp(s - broadcast([stop_gradient] maximum))`` with ``s`` what ``maximum``
    reduces, broadcast along the same index."""
    if p.inputs[0].op != "sub":
        return False
    scores, shift = p.inputs[0].inputs
    if shift.op != "broadcast" or shift.attrs["by"] != by:
        return False
    peak = shift.inputs[0]
    if peak.op == "stop_gradient":
        peak = peak.inputs[0]
    return peak is maximum and scores is maximum.inputs[0]
