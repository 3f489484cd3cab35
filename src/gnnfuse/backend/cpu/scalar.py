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
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


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


@intrinsic
def prefetch(typingctx, array, index):
    """Ask the CPU to start loading ``array[index]``'s cache line (LLVM's ``prefetch``:
    a read, kept in all cache levels). Never faults and changes no value. The generated
    kernels issue it for the rows a few edges ahead (`codegen.PREFETCH_DISTANCE`), so the
    random row gathers of a graph walk overlap instead of each waiting out a miss."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", [byte_ptr],
                                              ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]))
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_ptr)
        builder.call(fn, [address, i32(0), i32(3), i32(1)])   # read, keep in every level, data cache
        return context.get_dummy_value()
    return types.void(array, index), codegen


NAMES = frozenset({"exp", "log", "sqrt", "maximum", "minimum", "where", "sigmoid", "abs", "PropagateNan"})
