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
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numba.np.ufunc.parallel import _launch_threads


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
def sqrt_rn(x):
    return math.sqrt(x)   # correctly rounded on the CPU, as Triton's sqrt_rn


@numba.njit(inline="always", cache=True)
def maximum(a, b, propagate_nan=PropagateNan.ALL):
    return a if (a > b or a != a) else b


@numba.njit(inline="always", cache=True)
def minimum(a, b, propagate_nan=PropagateNan.ALL):
    return a if (a < b or a != a) else b


@numba.njit(inline="always", cache=True)
def where(condition, a, b):
    return a if condition else b


@numba.njit(inline="always", cache=True, error_model="numpy")
def div_rn(x, y):
    return x / y   # correctly rounded on the CPU, as Triton's div_rn; x / 0 is inf or NaN


@numba.njit(inline="always", cache=True)
def abs(x):   # noqa: A001 -- mirrors tl.abs
    return math.fabs(x)


# Triton's dtypes, as ``tl.cast`` takes them: numpy's float classes where Numba has them,
# markers for the two it lacks (Numba has no float16 or bfloat16 scalars).
float32 = np.float32
float64 = np.float64


class _Narrow(enum.IntEnum):
    """A float format Numba cannot hold, by its significant bits: its values are float32s
    rounded to it (`_rounded`)."""
    FLOAT16 = 11
    BFLOAT16 = 8


float16 = _Narrow.FLOAT16
bfloat16 = _Narrow.BFLOAT16


@numba.njit(cache=True)
def _rounded(x, bits, tiny_exponent, largest):
    """``x`` (a float64 holding a float32 or a float64) rounded to nearest, ties to even, to a
    format of ``bits`` significant bits whose subnormals are multiples of
    ``2 ** tiny_exponent``, beyond ``largest`` infinite; NaN and zeros keep their sign. As
    torch's float32-to-float16/bfloat16 conversions: ``ldexp`` scales exactly, and
    ``rint`` rounds half to even. (Not inlined by Numba: its inliner mislaid a variable
    of this function's branches; LLVM inlines it.) No builtin ``max``: a vertex function's
    trace swaps it process-wide, and a compile in another thread meanwhile failed
    (`backend.kernel_cache._BUILTINS`)."""
    exponent = math.frexp(x)[1]
    if exponent < tiny_exponent + bits:
        exponent = tiny_exponent + bits
    r = math.ldexp(np.rint(math.ldexp(x, bits - exponent)), exponent - bits)
    if abs(r) > largest:
        return math.copysign(math.inf, x)
    return r


@numba.njit(inline="always", cache=True)
def _widened(bits, fraction_bits, exponent_mask, bias):
    """The float a float16/bfloat16 bit pattern (an int16 read from the tensor's memory)
    holds, exactly, as a float64: sign, biased exponent and fraction decoded as IEEE 754
    does, subnormals (exponent 0) scaled from the fraction, the top exponent infinite or
    NaN."""
    h = bits & 0xFFFF
    fraction = h & ((1 << fraction_bits) - 1)
    exponent = (h >> fraction_bits) & exponent_mask
    magnitude = math.ldexp(fraction, 1 - bias - fraction_bits)
    if exponent == exponent_mask:
        magnitude = math.inf if fraction == 0 else math.nan
    elif exponent:
        magnitude = math.ldexp(fraction + (1 << fraction_bits), exponent - bias - fraction_bits)
    return -magnitude if h >> 15 else magnitude


@numba.njit(inline="always", cache=True)
def from_float16_bits(bits):
    """A float16 element read as int16 (Numba has no float16 arrays)."""
    return _widened(bits, 10, 0x1F, 15)


@numba.njit(inline="always", cache=True)
def from_bfloat16_bits(bits):
    """A bfloat16 element read as int16."""
    return _widened(bits, 7, 0xFF, 127)


@numba.njit(cache=True)
def _narrowed_bits(x, fraction_bits, exponent_mask, bias, largest):
    """The float16/bfloat16 bit pattern (as the int16 the output array holds) of ``x``
    rounded to nearest even (`_rounded`), as torch stores a float32: the inverse of
    `_widened`; NaN as torch's quiet NaN (the sign kept for float16, as c10 keeps it)."""
    r = _rounded(np.float64(np.float32(x)), fraction_bits + 1, 1 - bias - fraction_bits, largest)
    sign = 0x8000 if math.copysign(1.0, r) < 0 else 0
    a = abs(r)
    if a != a:
        bits = 0x7FC0 if fraction_bits == 7 else sign | 0x7E00
    elif a == math.inf:
        bits = sign | (exponent_mask << fraction_bits)
    elif a == 0.0:
        bits = sign
    else:
        biased = math.frexp(a)[1] - 1 + bias
        if biased >= 1:
            fraction = int(math.ldexp(a, fraction_bits + bias - biased)) - (1 << fraction_bits)
            bits = sign | (biased << fraction_bits) | fraction
        else:       # subnormal: multiples of 2 ** (1 - bias - fraction_bits)
            bits = sign | int(math.ldexp(a, bias - 1 + fraction_bits))
    return np.int16(bits - 0x10000 if bits >= 0x8000 else bits)


@numba.njit(inline="always", cache=True)
def to_float16_bits(x):
    """``x`` stored into a float16 output read as int16."""
    return _narrowed_bits(x, 10, 0x1F, 15, 65504.0)


@numba.njit(inline="always", cache=True)
def to_bfloat16_bits(x):
    """``x`` stored into a bfloat16 output read as int16."""
    return _narrowed_bits(x, 7, 0xFF, 127, 3.3895313892515355e38)


def cast(x, dtype):
    """``tl.cast(x, dtype)`` in a CPU kernel (Numba-compiled only: `_cast`)."""
    raise NotImplementedError("scalar.cast runs inside Numba kernels only")


@overload(cast)
def _cast(x, dtype):
    """To a numpy float class (``ACC``, ``tl.float64``): that class's conversion. To
    float16 or bfloat16: ``x`` rounded to it as torch rounds a float32, held in a float32
    (a kernel computes in its float32 accumulator)."""
    if isinstance(dtype, types.NumberClass):
        return lambda x, dtype: dtype(x)
    if isinstance(dtype, types.IntEnumMember) and dtype.instance_class is _Narrow:
        def narrowed(x, dtype):
            if dtype == _Narrow.BFLOAT16:
                return np.float32(_rounded(np.float64(np.float32(x)), 8, -133, 3.3895313892515355e38))
            return np.float32(_rounded(np.float64(np.float32(x)), 11, -24, 65504.0))
        return narrowed
    return None


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


@intrinsic
def use_threads(typingctx, count):
    """Run this thread's later ``prange`` loops on ``count`` threads of Numba's pool, as
    ``numba.set_num_threads(count)`` does, from inside a kernel. A parallel kernel calls
    it first with its launch's count: from Python, ``numba.set_num_threads`` cost about 3
    us a launch once the kernel had streamed the caches (a lock, checks, a ctypes call),
    2-3% of a pubmed neighbour sum at F=16 on two threads. Numba's own jitted
    ``set_num_threads`` reaches the pool through a ctypes pointer, which keeps a kernel
    out of the disk cache ("uses dynamic globals"); this calls the threading layer's
    ``set_num_threads`` symbol by name, as Numba's ``prange`` lowering reaches
    ``get_num_threads``, so the kernel caches. Unchecked: the executor passes 1 to
    ``NUMBA_NUM_THREADS`` (`schedule.threads`)."""
    _launch_threads()   # loads the threading layer, which registers the symbol with LLVM

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i32]),
                                            "set_num_threads")
        builder.call(fn, [builder.trunc(args[0], i32)])
        return context.get_dummy_value()
    return types.void(count), codegen


NAMES = frozenset({"exp", "log", "sqrt", "sqrt_rn", "div_rn", "maximum", "minimum", "where", "abs", "PropagateNan", "cast",
                   "float16", "bfloat16", "float32", "float64"})
