"""Constant folding: evaluate ops whose operands are all constants at compile time."""
from __future__ import annotations

from ..ir import Program, Residency, get_op


def fold_constants(program: Program) -> Program:
    """Replace a pure op over ``const`` operands by one ``const`` holding its value."""
    for v in list(program.values):
        if v.op in ("input", "const") or not v.inputs or not get_op(v.op).pure:
            continue
        if not all(i.op == "const" for i in v.inputs) or v.shape != ():
            continue
        tensors = [get_op("const").run(None, [], [], i.attrs) for i in v.inputs]
        value = get_op(v.op).run(None, tensors, [Residency.SHARED] * len(tensors), v.attrs)
        folded = program.add("const", value=float(value), dtype=v.dtype, source=v.source)
        program.replace_uses(v, folded)
    return program
