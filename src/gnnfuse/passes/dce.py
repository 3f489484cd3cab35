"""Dead-code elimination: drop values no output depends on."""
from __future__ import annotations

from ..ir import Program


def eliminate_dead_code(program: Program, keep_inputs: bool = False) -> Program:
    """Remove values unreachable from the outputs; unused inputs go too unless
    ``keep_inputs`` (a caller that feeds inputs by position needs them to stay)."""
    live: set[int] = set()
    stack = list(program.outputs.values())
    while stack:
        v = stack.pop()
        if v.id not in live:
            live.add(v.id)
            stack.extend(v.inputs)
    if keep_inputs:
        live |= {v.id for v in program.inputs.values()}
    program.values = [v for v in program.values if v.id in live]
    program.inputs = {k: v for k, v in program.inputs.items() if v.id in live}
    return program
