"""Sorted hinge sums: C-GAT's pairwise term without materializing the pairs.

``sum_j max(0, x_i - x_j)`` over the in-edges ``j`` of ``i``'s destination, written as
``(m.unsqueeze(1) - m.unsqueeze(2)).clamp(min=0).sum(1)`` (Graphiler's C-GAT reduce),
traces to ``pair_reduce(relu(pair_broadcast(x) - pair_broadcast(x)))``: ``sum_v deg(v)^2``
pair rows. The same numbers come from sorting each destination's values
(``hinge_sum``, O(E log E); see ir/ops/pairwise.py), so this pass rewrites that exact
form; any other pairwise term keeps its pair rows and stays exact.
"""
from __future__ import annotations

from ..ir import Program, Value

_OTHER_SIDE = {"i": "j", "j": "i"}


def sort_hinge_pairs(program: Program) -> Program:
    """Rewrite every ``pair_reduce(sum, by=k)`` of ``relu(x_k - x_other)`` (``relu`` or
    ``clamp_min(0)``, both pair sides read from one edge value ``x``) into
    ``hinge_sum(x)``; ``relu(x_other - x_k)`` is ``hinge_sum(-x)``."""
    for v in [v for v in program.values if v.op == "pair_reduce"]:
        matched = _hinge_operand(v)
        if matched is None:
            continue
        x, flipped = matched
        if flipped:
            x = program.add("neg", x, source=v.source)
        inclusive = v.inputs[0].op == "clamp_min"    # its gradient passes at ties, relu's does not
        program.replace_uses(v, program.add("hinge_sum", x, by="dst", inclusive=inclusive, source=v.source))
    return program


def _hinge_operand(v: Value) -> tuple[Value, bool] | None:
    """``(x, flipped)`` if ``v`` sums ``max(0, x_kept - x_other)`` (flipped: ``x_other -
    x_kept``) over the pairs sharing its kept edge, else None."""
    if v.attrs["op"] != "sum":
        return None
    hinge = v.inputs[0]
    if not (hinge.op == "relu" or (hinge.op == "clamp_min" and hinge.attrs["min"] == 0.0)):
        return None
    diff = hinge.inputs[0]
    if diff.op != "sub" or any(side.op != "pair_broadcast" for side in diff.inputs):
        return None
    left, right = diff.inputs
    if left.inputs[0] is not right.inputs[0] or left.attrs["by"] != _OTHER_SIDE[right.attrs["by"]]:
        return None
    return left.inputs[0], left.attrs["by"] != v.attrs["by"]
