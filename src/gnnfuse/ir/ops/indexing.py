"""Indexing inside a row: strided feature slices and per-row lookups in a shared table.

``slice_features`` is ``x[..., a:b:s, i, ...]`` on feature dims only (the tracer rejects
an index on a graph axis): ``window`` holds one ``(start, step, count)`` per
per-element dim, an integer index being a window of one that the tracer then reshapes
away. Its gradient scatters back into zeros (``unslice_features``); in a kernel it is a
coordinate map, like a reshape.

``index_rows`` is ``table[idx]`` with ``table`` a parameter and ``idx`` an integer
value with one entry (or a few) per row -- R-GCN's ``weight[edges.data['rel_type']]``,
an embedding ``embed[index]``. Unlike a typed lookup (``edges.type['W']``), the index
is user data, not an index the graph owns, so it is read per row; the table's gradient
adds each row's gradient into the entry it read (``index_rows_grad``). Indices computed
from integer data (``edges.data['type'] * in_feat + edges.src['id']``, then ``.long()``:
``cast``) stay integers.
"""
from __future__ import annotations

import torch

from ..registry import OpDef, register
from ..residency import Movement, Residency
from .movement import reduce_rows


def _window_slices(window) -> tuple:
    return (Ellipsis,) + tuple(slice(start, start + step * count, step) for start, step, count in window)


def _check_window(x_shape, window) -> None:
    if len(window) != len(x_shape):
        raise ValueError(f"a slice window needs one (start, step, count) per dim of {list(x_shape)}")
    for (start, step, count), n in zip(window, x_shape):
        if step < 1 or count < 0 or start < 0 or (count and start + step * (count - 1) >= n):
            raise ValueError(f"window ({start}, {step}, {count}) does not fit a dim of size {n}")


def _slice_shape(inputs, attrs, residency):
    _check_window(inputs[0].shape, attrs["window"])
    return tuple(count for _, _, count in attrs["window"]), inputs[0].dtype


def _unslice(g: torch.Tensor, window, size) -> torch.Tensor:
    out = g.new_zeros(tuple(g.shape[: g.dim() - len(size)]) + tuple(size))
    out[_window_slices(window)] = g
    return out


register(OpDef("slice_features", Movement.DENSE, lambda ctx, x, window: x[_window_slices(window)], bounded_derivative=True,
               shape=_slice_shape, arity=1, view=True,
               derivative=lambda b, v, g: [b.add("unslice_features", g, window=v.attrs["window"],
                                                 size=v.inputs[0].shape)],
               doc="x[..., start:start+step*count:step, ...] per feature dim (window of (start, step, count))",
               autograd_reference=True))
register(OpDef("unslice_features", Movement.DENSE, lambda ctx, g, window, size: _unslice(g, window, size), bounded_derivative=True,
               shape=lambda inputs, a, r: (tuple(a["size"]), inputs[0].dtype), arity=1,
               derivative=lambda b, v, g: [b.add("slice_features", g, window=v.attrs["window"])],
               doc="g placed at a slice window of a zero tensor of per-element shape size"))


# --- index_rows: table[idx] per row ------------------------------------------------------
def _index_rows_residency(rs, attrs):
    if rs[0] is not Residency.SHARED:
        raise ValueError(f"index_rows looks rows up in a parameter (SHARED) table, got {rs[0].name}")
    return rs[1]


def _index_rows_shape(inputs, attrs, residency):
    table, idx = inputs
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"a table is indexed by integers, got {idx.dtype}")
    if not table.shape:
        raise ValueError("a 0-dim tensor cannot be indexed")
    return idx.shape + table.shape[1:], table.dtype


def wrap_index(idx: torch.Tensor, count: int) -> torch.Tensor:
    """``idx`` into a table of ``count`` entries with negative entries counted from the end,
    as torch's indexing does; an entry outside [-count, count) is an IndexError."""
    if idx.numel() and (int(idx.min()) < -count or int(idx.max()) >= count):
        raise IndexError(f"an index is out of range for a table of {count} entries")
    return _from_the_end(idx, count)


def _from_the_end(idx: torch.Tensor, count: int) -> torch.Tensor:
    return torch.where(idx < 0, idx + count, idx)


def _index_rows_grad(g: torch.Tensor, idx: torch.Tensor, size) -> torch.Tensor:
    """Every row's ``g`` added into the table entry it read. The forward's ``table[idx]``
    already refused an index out of range (an IndexError on the CPU, a device-side assert
    on a GPU), so no range check here: its two host reads made a training step through
    Graphiler's HGT UDF (``p[edges.data['type']]``) impossible to capture in a CUDA graph.
    The sum is `reduce_rows`', which spreads a few heavily hit entries -- a per-relation
    parameter read by every edge -- over partial sums on a GPU."""
    rows = _from_the_end(idx, size[0]).reshape(-1)
    return reduce_rows(g.reshape((-1,) + tuple(size[1:])), rows, size[0], "sum")


register(OpDef("index_rows", Movement.DENSE, lambda ctx, table, idx: table[idx], bounded_derivative=True,
               residency=_index_rows_residency, shape=_index_rows_shape, arity=2,
               derivative=lambda b, v, g: [b.add("index_rows_grad", g, b.fwd(v.inputs[1]),
                                                 size=v.inputs[0].shape), None],
               doc="table[idx]: each row reads the table entries its integer idx names"))
register(OpDef("index_rows_grad", Movement.REDUCE, lambda ctx, g, idx, size: _index_rows_grad(g, idx, size),
               residency=lambda rs, a: Residency.SHARED,
               shape=lambda inputs, a, r: (tuple(a["size"]), inputs[0].dtype), arity=2,
               doc="the table gradient of index_rows: every row's g added into the entry it read"))


# --- casts: indices computed from data, gradients to their inputs' dtypes ------------------
def _cast_derivative(b, v, g):
    """A float-to-float cast passes its gradient back (autodiff's `_fit` gives it the
    input's dtype, as torch's ``x.to(dtype)`` does); a cast to or from integers carries none."""
    return [g if v.dtype.is_floating_point and v.inputs[0].dtype.is_floating_point else None]


# The Triton names of the dtypes a kernel rounds its float32 values to.
_NARROW = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}
_KERNEL_FLOATS = (torch.float32, *_NARROW)


def _cast_emit(v) -> tuple[str, ...] | None:
    """A cast inside a kernel, which computes in float32 (its ``ACC``): ``x.to(dtype)``
    rounds to nearest even as torch does, float16 and bfloat16 values being float32s
    rounded to them (``tl.cast`` on the CPU backend: `scalar.cast`). A narrow input is
    rounded to its own dtype first: computed in the kernel's float32, it is the value
    torch holds rounded. Integer and boolean inputs are leaves, already converted to
    ``ACC`` by their load as torch converts them (int64 to float32 to the narrow dtype).
    Casts to or from float64 have none: a kernel computes in one accumulator dtype, so a
    unit mixing float64 with other floats runs as torch ops anyway (`unit_ops`), and an
    integer-to-float64 cast would need a float64 kernel its float64-free leaves do not
    choose; nor do casts to integers (a kernel holds no integer values)."""
    src, dst = v.inputs[0].dtype, v.dtype
    if dst not in _KERNEL_FLOATS or src == torch.float64 or src.is_complex:
        return None
    steps, operand = [], "{0}"
    for dtype in (src, dst):
        if dtype in _NARROW:
            steps.append(f"tl.cast(tl.cast({operand}, {_NARROW[dtype]}), ACC)")
            operand = f"{{s{len(steps) - 1}}}"
    return tuple(steps) or ("{0}",)


register(OpDef("cast", Movement.DENSE, lambda ctx, x, dtype: x.to(dtype), bounded_derivative=True,
               shape=lambda inputs, a, r: (inputs[0].shape, a["dtype"]), arity=1, elementwise=True,
               derivative=_cast_derivative, emit=_cast_emit,
               doc="x.to(dtype): a front end's cast to an integer dtype (idx.long(), idx.int()), whose data "
                   "carries no gradient; torch.autocast's cast of an op's operands (frontend/autocast.py); or "
                   "autodiff's cast of a gradient to its input's float dtype"))
