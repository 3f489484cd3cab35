"""The numbers a generated kernel reads as arguments instead of literals in its source.

A user's closure constant that changes every step (an annealed softmax temperature, a
scheduled scale or slope) traces a new program for each value (frontend/trace_cache.py
guards closure values). With the value written into the kernel's source as a literal,
each step wrote new source and compiled a new kernel: seconds of Triton compilation on
a GPU, about 2 s of Numba on the CPU, every step. Read from an argument, the source is
the same for every value, so the kernel cache (`kernel_cache`, keyed by the source's
digest) hands back the kernel compiled for the first value, and a new value costs only
the host work of planning its program.

The numbers are a unit's constant leaves (``x / tau``) and the numeric settings its ops'
kernel expressions read as values (``leaky_relu``'s ``{negative_slope}``, ``clamp_min``'s
``{min}``). Each travels as a one-element float64 tensor made once per launch plan: a
kernel converts it to its accumulator type as it converted the literal (float64 holds
every Python float exactly, and one rounding to float32 is the literal's rounding), so
the results are the same bits as before.
"""
from __future__ import annotations

import torch

from ..ir import Value, get_op


def constant_slots(unit) -> list[tuple[Value, str]]:
    """``unit``'s numbers, as (value, attrs key), in the order its kernel takes them (after
    its tensor leaves): its constant leaves' ``value``s, then each numeric setting an
    evaluated op's kernel expression reads (``{key}`` in its steps). The one definition
    the code generators and the executors share; a number not listed stays a literal."""
    slots = [(v, "value") for v in unit.leaves if v.op == "const"]
    for v in _evaluated(unit):
        numbers = [k for k, a in v.attrs.items() if isinstance(a, (int, float)) and not isinstance(a, bool)]
        steps = get_op(v.op).emit_steps(v) if numbers else None
        slots += [(v, k) for k in numbers if steps and any("{%s}" % k in step for step in steps)]
    return slots


def _evaluated(unit) -> list[Value]:
    """The ops ``unit``'s kernel evaluates, each once: a sibling group's members' and
    riders', a unit's body and root."""
    members = getattr(unit, "members", None)
    parts = (*members, *unit.riders) if members is not None else (unit,)
    seen: dict[int, Value] = {}
    for part in parts:
        for v in (*part.body, part.root):
            seen.setdefault(v.id, v)
    return list(seen.values())


def constant_tensors(unit, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """One float64 element per number of ``unit`` (`constant_slots`) on ``device``."""
    return tuple(torch.full((1,), float(v.attrs[key]), dtype=torch.float64, device=device)
                 for v, key in constant_slots(unit))
