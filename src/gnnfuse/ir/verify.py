"""Checks that a program is well formed before anything runs or rewrites it."""
from __future__ import annotations

from .errors import CompileError
from .program import Program
from .registry import get_op


def verify(program: Program) -> None:
    """Raise `CompileError` unless every value's recorded type is what its op infers,
    inputs come before their users, and every output belongs to the program."""
    seen: set[int] = set()
    for v in program.values:
        for i in v.inputs:
            if i.id not in seen:
                raise CompileError(f"{v.name} = {v.op}(...) uses {i.name} before it is defined", v.source)
        if v.op != "input":
            opdef = get_op(v.op, v.source)
            residency = opdef.infer_residency([i.residency for i in v.inputs], v.attrs)
            shape, dtype = opdef.infer_shape(v.inputs, v.attrs, residency)
            if (residency, tuple(shape), dtype) != (v.residency, v.shape, v.dtype):
                raise CompileError(
                    f"{v.name} = {v.op}(...) records {v.residency.name}{list(v.shape)} {v.dtype} "
                    f"but its op infers {residency.name}{list(shape)} {dtype}", v.source)
        seen.add(v.id)
    for key, out in program.outputs.items():
        if out.id not in seen:
            raise CompileError(f"output {key!r} is not a value of this program")
    if not program.outputs:
        raise CompileError("program has no outputs")
