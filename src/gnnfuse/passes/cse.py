"""Common-subexpression elimination over pure ops."""
from __future__ import annotations

from ..ir import Program, get_op


def eliminate_common_subexpressions(program: Program) -> Program:
    """Merge values with the same op, operands and attrs; random ops are never merged."""
    seen: dict[tuple, object] = {}
    for v in list(program.values):
        if v.op == "input" or not get_op(v.op).pure:
            continue
        sig = v.signature()
        if sig in seen:
            program.replace_uses(v, seen[sig])
        else:
            seen[sig] = v
    return program
