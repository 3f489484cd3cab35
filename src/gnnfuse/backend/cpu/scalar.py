"""Scalar versions of the ``tl.*`` functions that registry emit strings call.

Each op's kernel expression lives once, in its registry entry, written against Triton's
``tl`` namespace (``tl.exp({0})``, ``tl.where({0} > 0, {0}, 0.0)``). The CPU kernels
evaluate one element at a time, so they import this module *as* ``tl`` and the same
strings compile under Numba. The functions are inlined into the generated kernels.

NaN semantics follow torch, not IEEE min/max: ``maximum`` returns NaN if either operand
is NaN, as ``torch.relu``/``torch.clamp_min`` and ``torch.maximum`` do. That is
Triton's ``propagate_nan=tl.PropagateNan.ALL``, which the registry's ``maximum`` and
``minimum`` spell out; the argument is accepted here and changes nothing, and
`PropagateNan` has no member for Triton's default (NaN dropped), so an emit string that
asked for it would fail to compile rather than propagate silently.
"""
from __future__ import annotations

import enum
import math

import numba


class PropagateNan(enum.IntEnum):
    ALL = 1


@numba.njit(inline="always", cache=True)
def exp(x):
    return math.exp(x)


@numba.njit(inline="always", cache=True)
def log(x):
    return math.log(x)   # NaN below zero, -inf at zero, as in torch (no exception)


@numba.njit(inline="always", cache=True)
def sqrt(x):
    return math.sqrt(x)


@numba.njit(inline="always", cache=True)
def maximum(a, b, propagate_nan=PropagateNan.ALL):
    return a if (a > b or a != a) else b


@numba.njit(inline="always", cache=True)
def minimum(a, b, propagate_nan=PropagateNan.ALL):
    return a if (a < b or a != a) else b


@numba.njit(inline="always", cache=True)
def where(condition, a, b):
    return a if condition else b


@numba.njit(inline="always", cache=True)
def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


@numba.njit(inline="always", cache=True)
def abs(x):   # noqa: A001 -- mirrors tl.abs
    return math.fabs(x)


NAMES = frozenset({"exp", "log", "sqrt", "maximum", "minimum", "where", "sigmoid", "abs", "PropagateNan"})
