"""``torch.autocast`` in traced functions: the casts eager torch makes, as program ops.

Under autocast, torch casts the operands of some ops before running them: matrix
products to the autocast dtype on every device (``x @ W`` of float32 data is bfloat16
under ``torch.autocast("cpu", dtype=torch.bfloat16)``), and on CUDA the operands of a
list of precision-sensitive ops (``exp``, ``log``, ``pow``, ``softplus``, ``sum``,
``softmax``, norms) from float16/bfloat16 to float32. Every other op then promotes as
usual. A traced function was traced in its inputs' dtypes with none of these casts, so
its compiled program gave float32 where eager evaluation of the same function gave
bfloat16 (on the Triton backend; the reference backend's torch ops were cast by autocast
behind the program's back, and its backward then failed on mismatched dtypes).

Here the traced handlers of those torch functions cast their operands as autocast would
(`autocast_handler`), each cast an op of the program, so the program states every dtype
and runs with autocast off (`runtime.autocast`); the cast's derivative gives each input
its gradient in its own dtype, as torch's does. Which device type's autocast applies is
the tables' (`Tracer.input`), and its state is part of the trace cache's key
(`trace_cache.signature`); each op's casts follow the state in force when the UDF calls it
(`in_force`), so a ``torch.autocast`` block the UDF enters itself (``enabled=False`` around
a product, or autocast turned on inside) casts as in eager code. Only CPU's and CUDA's op
lists are known here: a traced op on either list under autocast on another device type is
refused by name rather than guessed.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from ..ir import Residency
from ..runtime.autocast import AUTOCAST_DEVICE_TYPES, autocast_dtype

T = torch.Tensor
# Cast to the autocast dtype, on every device type autocast runs on (torch's
# "lower_precision_fp" list, the ops of it a traced function can call).
_MATMULS = (torch.mm, torch.matmul, T.mm, T.matmul, T.__matmul__, T.__rmatmul__, F.linear, torch.bmm, T.bmm)
# CUDA only: float16/bfloat16 operands cast to float32 ("fp32"); for the reductions,
# only the first operand and only without a ``dtype=`` ("fp32_set_opt_dtype" /
# "fp32_append_dtype"). CPU's float32 list holds none of the ops a traced function can call.
_CUDA_FP32 = (torch.exp, T.exp, torch.log, T.log, torch.pow, T.pow, T.__pow__, F.softplus)
_CUDA_FP32_FIRST = (torch.sum, T.sum, torch.softmax, F.softmax, T.softmax, torch.log_softmax, F.log_softmax,
                    T.log_softmax, torch.norm, T.norm, torch.linalg.vector_norm, F.normalize)
_LOWER = frozenset(_MATMULS)
_FP32 = frozenset(_CUDA_FP32)
_FP32_FIRST = frozenset(_CUDA_FP32_FIRST)
_KNOWN_DEVICES = ("cpu", "cuda")
_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)     # torch never casts float64 or integers


def autocast_state(device_type: str) -> tuple[str, torch.dtype] | None:
    """(device type, dtype) of the autocast in force for ``device_type``'s tensors, or
    None when it is off there. Tensors on the meta device -- the stand-ins a call under
    torch.compile is traced on (`compiled_call.program_at_compile_time`) -- take the
    state of the call they stand in for (`stand_ins_under`)."""
    if device_type == "meta":
        return _STAND_INS.get()
    dtype = autocast_dtype(device_type)
    return None if dtype is None else (device_type, dtype)


_STAND_INS: contextvars.ContextVar[tuple[str, torch.dtype] | None] = contextvars.ContextVar("stand_ins", default=None)


@contextlib.contextmanager
def stand_ins_under(state: tuple[str, torch.dtype] | None) -> Iterator[None]:
    """Trace on meta stand-ins as a call under the autocast ``state`` (from
    `autocast_state` of the real tensors' device) would trace, and key the trace so."""
    token = _STAND_INS.set(state)
    try:
        yield
    finally:
        _STAND_INS.reset(token)


def live_states() -> tuple[tuple[bool, torch.dtype], ...]:
    """torch's autocast state (enabled, dtype) of every device type autocast serves, now."""
    return tuple((torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)) for kind in AUTOCAST_DEVICE_TYPES)


def in_force(tracer) -> tuple[str, torch.dtype] | None:
    """The autocast state a traced op is cast under: the one in force now for the tables'
    device, read at the op and not only at the first input read, since a UDF may enter its
    own ``torch.autocast`` block (the trace cache keys on the caller's state; what the UDF
    does inside is the same on every call). On meta stand-ins (under torch.compile) the
    call's state names the tables' device type, whose state is then read as well; a block
    the UDF enters in a call made outside autocast is refused there: which device type's
    block applies to the tables is not known (`Tracer.autocast_live`, taken at the trace's
    start, tells that one was entered)."""
    kind = tracer.autocast_device
    if kind is None:
        return tracer.autocast
    if kind != "meta":
        return autocast_state(kind)
    if tracer.autocast is not None:
        return autocast_state(tracer.autocast[0])
    if live_states() != tracer.autocast_live:
        raise tracer.error("a torch.autocast block entered inside a function traced under torch.compile, called "
                           "outside autocast: gnnfuse traces it on stand-ins of no device, so which device's "
                           "block applies is not known; enter the block around the call, or call the function "
                           "outside torch.compile")
    return None


def applies(func: Any) -> bool:
    """Whether autocast may cast the operands of the torch callable ``func``."""
    return func in _LOWER or func in _FP32 or func in _FP32_FIRST


def autocast_handler(func: Any, handler: Callable) -> Callable:
    """``handler`` (a traced torch function's) with its operands first cast as autocast
    casts ``func``'s, when the trace runs under autocast (`Tracer.autocast`)."""
    def handle(tracer, *args, **kwargs):
        state = in_force(tracer)
        if state is None:
            return handler(tracer, *args, **kwargs)
        device_type, dtype = state
        name = getattr(func, "__name__", repr(func))
        if device_type not in _KNOWN_DEVICES:
            raise tracer.error(f"torch.{name} under torch.autocast on {device_type!r}: gnnfuse knows autocast's "
                               "casts on CPU and CUDA only; run this function outside torch.autocast "
                               f"(torch.autocast({device_type!r}, enabled=False))")
        if func in _LOWER:
            return handler(tracer, *[_cast(tracer, a, dtype) for a in args],
                           **{k: _cast(tracer, a, dtype) for k, a in kwargs.items()})
        if device_type != "cuda":
            return handler(tracer, *args, **kwargs)
        if func in _FP32:
            return handler(tracer, *[_cast(tracer, a, torch.float32, lower_only=True) for a in args], **kwargs)
        if args and kwargs.get("dtype") is None and not any(isinstance(a, torch.dtype) for a in args[1:]):
            args = (_cast(tracer, args[0], torch.float32, lower_only=True), *args[1:])
        return handler(tracer, *args, **kwargs)
    return handle


def _cast(tracer, x: Any, dtype: torch.dtype, lower_only: bool = False) -> Any:
    """``x`` as autocast hands it to the op: a floating tensor of a castable dtype (with
    ``lower_only``, float16 or bfloat16 alone) in ``dtype``; anything else as it is.
    A broadcast or table lookup is cast before it (its per-vertex or per-type rows, not
    every edge's copy), which also keeps it recognisable to the matmul handler as a
    per-type or indexed matrix (`tracer._typed_matmul`, `tracer._row_matmul`)."""
    from .tracer import SymTensor
    if not isinstance(x, (SymTensor, torch.Tensor)) or x.dtype not in _ELIGIBLE or x.dtype == dtype or (
            lower_only and x.dtype == torch.float32):
        return x
    x = tracer.lift(x)      # a captured tensor: a program input, cast in the program
    return SymTensor(tracer, _cast_value(tracer, x.value, dtype), x.prefix)


def _cast_value(tracer, value, dtype: torch.dtype):
    program, source = tracer.program, tracer.source()
    if value.op == "broadcast":
        return program.add("broadcast", _cast_value(tracer, value.inputs[0], dtype), source=source, **value.attrs)
    if value.op == "index_rows" and value.inputs[0].residency is Residency.SHARED:
        table, index = value.inputs
        return program.add("index_rows", _cast_value(tracer, table, dtype), index, source=source)
    return program.add("cast", value, dtype=dtype, source=source)
