"""Feature-dim reductions that need a rule of their own: the 2-norm and the max.

``F.normalize`` and ``x.norm(dim=-1)`` need the 2-norm with torch's derivative, which is
``x * g / norm`` and 0 where the norm is 0 (an all-zero row, common after a relu).
Composed as ``sqrt(sum(x * x))``, that row's gradient would be ``0 / 0`` = NaN, so the
norm is one op. ``amax_dim`` is the shift a feature-dim softmax subtracts for
stability; it is only ever read through ``stop_gradient`` and so has no derivative.
"""
from __future__ import annotations

import torch

from ..registry import OpDef, register
from ..residency import Movement
from .dense import _expand_back


def _norm_derivative(b, v, g):
    x, norm = b.fwd(v.inputs[0]), b.fwd(v)
    # Where the norm is 0 every element of x is 0, so dividing by 1 there gives torch's 0.
    safe = b.add("add", norm, b.add("eq", norm, b.const(0.0, norm)))
    return [b.add("mul", x, _expand_back(b, v, b.add("div", g, safe)))]


register(OpDef("norm_dim", Movement.DENSE,
               lambda ctx, x, dim, keepdim: torch.linalg.vector_norm(x, 2, dim, keepdim),
               derivative=_norm_derivative, bounded_derivative=True, arity=1,
               doc="Euclidean norm over feature dims (negative ``dim``); gradient 0 at a zero norm"))
def _no_gradient_reaches(attrs: dict) -> bool:
    """amax_dim has no derivative rule: a program runs under autograd (runtime/first_pass.py)
    only where its max is read through ``stop_gradient`` alone, as a softmax reads it."""
    return False


register(OpDef("amax_dim", Movement.DENSE, lambda ctx, x, dim, keepdim: x.amax(dim, keepdim), arity=1,
               doc="max over feature dims; no derivative: a softmax reads it through stop_gradient",
               autograd_reference=_no_gradient_reaches))
