"""Graphiler's broadcast reordering (§4.3.1): ``f(broadcast(x))`` becomes
``broadcast(f(x))`` when ``f`` is a dense op, so ``edges.src['h'] @ W`` costs |V| rows
of matmul instead of |E|."""
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
