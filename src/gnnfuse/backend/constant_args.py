"""The constants a generated kernel reads as arguments instead of literals in its source.

A user's closure constant that changes every step (an annealed softmax temperature, a
scheduled scale) traces a new program for each value (frontend/trace_cache.py guards
closure values). With the value written into the kernel's source as a literal, each
step wrote new source and compiled a new kernel: seconds of Triton compilation on a GPU,
about 2 s of Numba on the CPU, every step. Read from an argument, the source is the
same for every value, so the kernel cache (`kernel_cache`, keyed by the source's
digest) hands back the kernel compiled for the first value, and a new value costs only
the host work of planning its program.

Each constant travels as a one-element float64 tensor made once per launch plan: a
kernel converts it to its accumulator type as it would have converted the literal
(float64 holds every Python float exactly, and one rounding to float32 is the literal's
rounding), so the results are the same bits as before.
"""
from __future__ import annotations

import torch

from ..ir import Value


def constant_leaves(unit) -> list[Value]:
    """``unit``'s constant leaves, in the order its kernel takes them (after its tensor
    leaves): the one definition the code generators and the executors share."""
    return [v for v in unit.leaves if v.op == "const"]


def constant_tensors(unit, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """One float64 element per constant leaf of ``unit`` on ``device``, its value."""
    return tuple(torch.full((1,), float(v.attrs["value"]), dtype=torch.float64, device=device)
                 for v in constant_leaves(unit))
