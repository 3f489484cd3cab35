"""Graphiler's broadcast reordering (§4.3.1): ``f(broadcast(x))`` becomes
``broadcast(f(x))`` when ``f`` is a dense op, so ``edges.src['h'] @ W`` costs |V| rows
of matmul instead of |E|. The same holds for a per-node-type matmul on an endpoint's
data: ``edges.src['h'] @ edges.srctype['W']`` depends only on the source vertex, so it
is computed per vertex with the vertex's type (HGT's per-type projections)."""
from __future__ import annotations

from ..ir import Movement, Program, Residency, get_op


def reorder_broadcasts(program: Program) -> Program:
    """Move pure dense ops above the broadcast that feeds them, until none can move.

    An op moves when every operand that has rows is a broadcast along the same index
    (the others are SHARED): then it computes the same rows before the gather.
    """
    changed = True
    while changed:
        changed = False
        for v in list(program.values):
            if _reorder_typed_matmul(program, v):
                changed = True
                continue
            if v.op == "input" or v.movement is not Movement.DENSE or not get_op(v.op).pure:
                continue
            rowed = [i for i in v.inputs if i.residency is not Residency.SHARED]
            if not rowed or any(i.op != "broadcast" for i in rowed):
                continue
            by = {i.attrs["by"] for i in rowed}
            if len(by) != 1:
                continue
            inner = [i.inputs[0] if i.op == "broadcast" else i for i in v.inputs]
            moved = program.add(v.op, *inner, source=v.source, **v.attrs)
            gathered = program.add("broadcast", moved, source=v.source, by=by.pop())
            program.replace_uses(v, gathered)
            changed = True
    return program


_ENDPOINT_TYPE = {"srctype": "src", "dsttype": "dst"}


def _reorder_typed_matmul(program: Program, v) -> bool:
    """``typed_matmul(broadcast(x, src), W, by=srctype)`` -> ``broadcast(typed_matmul(x, W,
    by=ntype), src)`` (and likewise for dst); returns whether it rewrote ``v``."""
    if v.op != "typed_matmul" or v.attrs["by"] not in _ENDPOINT_TYPE:
        return False
    x, w = v.inputs
    side = _ENDPOINT_TYPE[v.attrs["by"]]
    if x.op != "broadcast" or x.attrs["by"] != side:
        return False
    moved = program.add("typed_matmul", x.inputs[0], w, source=v.source, by="ntype")
    program.replace_uses(v, program.add("broadcast", moved, source=v.source, by=side))
    return True
