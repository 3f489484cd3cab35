"""Scalar versions of the ``tl.*`` functions that registry emit strings call.

Each op's kernel expression lives once, in its registry entry, written against Triton's
``tl`` namespace (``tl.exp({0})``, ``tl.where({0} > 0, {0}, 0.0)``). The CPU kernels
evaluate one element at a time, so they import this module *as* ``tl`` and the same
strings compile under Numba. The functions are inlined into the generated kernels.

NaN semantics follow torch, not IEEE min/max: ``maximum`` returns NaN if either operand
is NaN, as ``torch.relu``/``torch.clamp_min`` do.
"""
from __future__ import annotations

import math

import numba


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
def maximum(a, b):
    return a if (a > b or a != a) else b


@numba.njit(inline="always", cache=True)
def minimum(a, b):
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


NAMES = frozenset({"exp", "log", "sqrt", "maximum", "minimum", "where", "sigmoid", "abs"})
