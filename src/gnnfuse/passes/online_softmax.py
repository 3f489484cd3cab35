"""Which sums may take a softmax's maximum online, in the walk that finds it.

After `normalize_after_aggregation` a softmax's forward is a max by destination and sums
that read it only as the shift of ``p = exp(s - broadcast(max s))``: the normalizer
``sum p`` and the weighted sum ``sum p * m``. Flash attention's online softmax computes
them in one pass: keep a running maximum ``r`` per row, add ``exp(s - r) * m`` for each
chunk of edges, and when a chunk raises ``r`` to ``r'``, first multiply what was added so
far by ``exp(r - r')``. At the end ``r`` is the maximum and the sum is exactly the one
with the final shift -- provided the sum is *linear* in ``p``: each term is ``p`` times
factors that do not depend on the maximum. `shifted_by` checks that on a unit's
expression; `passes/siblings.py` then lets such a unit join its max's group, and the
Triton backend's ``generate_siblings`` emits the running maximum and the rescaling.

On an ogbn-mag-sized HGT step the forward's three walks over 21.1M edges (max, sum,
weighted sum) took about 2 ms each per layer; GAT's forward has the same three.
"""
from __future__ import annotations

from ..ir import Value
from .fusion import AggregateUnit

ONLINE_REDUCERS = ("sum", "mean")        # linear: a rescaled partial sum is still the sum
_VIEWS = ("reshape", "expand", "neg")    # ops that pass one operand's value through, linearly


def shifted_by(unit: AggregateUnit, peak: AggregateUnit) -> bool:
    """Whether ``unit`` reads ``peak``'s maximum only as the shift of one ``p = exp(s -
    broadcast(max))``, with ``s`` the very scores ``peak`` reduces, and its summed
    expression is linear in that ``p`` (one occurrence, reached through products, a
    numerator and views). Then the sum can be taken with a running maximum and
    rescaled, in ``peak``'s own walk."""
    if not (isinstance(unit, AggregateUnit) and isinstance(peak, AggregateUnit)
            and peak.reduce.attrs["op"] == "max" and unit.reduce.attrs["op"] in ONLINE_REDUCERS
            and unit.by == peak.by and unit.addend is None and unit.scale is None):
        return False
    body = {v.id for v in unit.body}
    maximum = peak.reduce
    shifts = [v for v in unit.body if v.op == "exp" and _is_shift(v, maximum, unit.by)]
    if len(shifts) != 1:
        return False
    p = shifts[0]

    def depends(v: Value, seen: dict[int, bool]) -> bool:
        """``v`` reads the maximum (as a leaf of the unit, or through body values)."""
        if v.id not in seen:
            seen[v.id] = v is maximum or (v.id in body and any(depends(i, seen) for i in v.inputs))
        return seen[v.id]

    seen: dict[int, bool] = {}
    if depends(maximum.inputs[0], seen):
        return False

    def linear(v: Value) -> bool:
        if v is p:
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

    return linear(unit.reduce.inputs[0])


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
