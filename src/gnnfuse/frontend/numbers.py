"""Python numbers in traced code, promoted as torch promotes Python scalars.

In eager code a constant (``2``, ``0.5``) and the in-degree (``len(v.innbs)``,
``nodes.mailbox[k].shape[1]``) are Python ints and floats, and torch ranks a Python number
below every tensor: it never widens the tensor it meets (``h / len(v.innbs)`` stays
float32 beside float64 data, ``h * 0.5`` stays float16), and only its kind counts (an
integer tensor times ``0.5`` takes the default float dtype, times ``2`` keeps its own). The
trace holds each number as an IR value -- a constant as a 0-dim one, the degree as one per
vertex -- and those would promote as tensors do: a float64 degree widened float32 data, a
float64 constant made ``idx * 0.5`` float64. So the tracer builds numbers in the dtypes
torch gives a Python number on its own (int64 for ints, the default dtype for floats),
and where one meets a tensor, `as_eager` rebuilds it in the dtype torch computes it in
there. It is rebuilt from its constants and degrees, not cast: a value computed from
numbers alone (``len(v.innbs) ** -0.5``) then keeps a float64 tensor's precision, as eager
Python's double does.
"""
from __future__ import annotations

import torch

from ..ir import Program, Residency, Value

# a Python number of each kind, for torch.result_type's rule for Python scalars
_SAMPLE = {"bool": True, "int": 1, "float": 1.0}


def is_number(value: Value) -> bool:
    """Whether eager code would hold ``value`` as a Python number: a constant, an
    in-degree, or a per-row scalar computed from those alone."""
    if value.op in ("const", "degree"):
        return True
    return (value.op not in ("input", "cast") and value.shape == () and bool(value.inputs)
            and all(is_number(i) for i in value.inputs))


def as_eager(program: Program, a: Value, b: Value) -> tuple[Value, Value]:
    """The operands of a binary elementwise op, a number among them rebuilt in the dtype
    torch computes that Python number in beside the other operand, a tensor. Left as
    traced where that changes neither the op's dtype nor the number's precision."""
    if is_number(a) == is_number(b):
        return a, b
    number, tensor = (a, b) if is_number(a) else (b, a)
    rebuilt = _rebuilt(program, number, _eager_dtype(number, tensor)) if _differs(number, tensor) else number
    return (rebuilt, b) if number is a else (a, rebuilt)


def _eager_dtype(number: Value, tensor: Value) -> torch.dtype:
    kind = "bool" if number.dtype == torch.bool else "float" if number.dtype.is_floating_point else "int"
    return torch.result_type(stand_in(tensor), _SAMPLE[kind])


def _differs(number: Value, tensor: Value) -> bool:
    """Whether ``number`` as traced would give the op another dtype than eager's, or a
    float computed narrower than eager's (float32 where the tensor is float64)."""
    target = _eager_dtype(number, tensor)
    narrower = (number.dtype.is_floating_point and target.is_floating_point
                and number.dtype.itemsize < target.itemsize)
    return narrower or torch.result_type(stand_in(tensor), stand_in(number)) != target


def stand_in(value: Value, rows: bool = True) -> torch.Tensor:
    """A stand-in with ``value``'s dtype and rank as torch sees it, for ``torch.result_type``:
    with a row axis unless SHARED, or (``rows=False``) as eager code run for one vertex
    holds it, without one."""
    axis = (1,) if rows and value.residency is not Residency.SHARED else ()
    return torch.empty(axis + tuple(value.shape), dtype=value.dtype, device="meta")


def _rebuilt(program: Program, value: Value, dtype: torch.dtype) -> Value:
    """``value`` traced again from its constants and degrees, those taken in ``dtype``."""
    if value.op in ("const", "degree"):
        return program.add(value.op, source=value.source, **{**value.attrs, "dtype": dtype})
    return program.add(value.op, *(_rebuilt(program, i, dtype) for i in value.inputs), source=value.source,
                       **value.attrs)
