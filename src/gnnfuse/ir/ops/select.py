"""Row selection: ``select(mask, a, b)`` is ``a`` where ``mask != 0`` and ``b`` elsewhere.

A choice by a mask cannot be written as ``mask * a + (1 - mask) * b``: an infinite or
NaN entry of the branch not taken would turn the result into NaN (0 * inf). The
message/reduce front end uses it to give zero-in-degree vertices DGL's zero-filled
reduce outputs (``select(in_degree, reduced, 0)``). The mask is not differentiated; each
branch receives the gradient where it was chosen and exact zeros elsewhere.
"""
from __future__ import annotations

import torch

from ..registry import OpDef, register
from ..residency import Movement


def _select_derivative(b, v, g):
    mask, zero = b.fwd(v.inputs[0]), b.const(0.0, g)
    return [None, b.add("select", mask, g, zero), b.add("select", mask, zero, g)]


register(OpDef("select", Movement.DENSE, lambda ctx, mask, a, other: torch.where(mask != 0, a, other), bounded_derivative=True,
               derivative=_select_derivative, elementwise=True, arity=3,
               emit="tl.where({0} != 0, {1}, {2})",
               doc="a where mask != 0 else b, elementwise, without arithmetic on the branch not taken"))
