"""Linear maps whose output the fused kernels read as it is.

Two details of a layer's ``x W^T`` matter to the compiled aggregation that reads it:

* **Row layout.** The Triton kernels read a vertex table at `aligned_row_width` (rows a
  whole number of 16-byte vectors apart, backend/row_layout.py). A 47-class output is
  then padded to 48 by a copy in every program that reads it, forward and backward --
  on a products-sized graph 0.46 GB each, live at GAT's memory peak. Written by the GEMM
  into an [N, 48] table and returned as its [N, 47] view, it needs no copy.
* **Which rows the weight's gradient sums** (`rows_read`, for layers that transform
  before a propagation that reads only some rows; see `rows_read`).

One autograd Function does both; its backward works on the unpadded view's gradient
(no [N, 48] gradient exists) and is written in differentiable ops, so double backward
works. On a GPU it also takes every map of at least `GEMV_BIAS_FROM_ROWS` rows whose
bias wants a gradient, which it sums as a matrix-vector product (`column_sums`: half the
time of torch's ``grad.sum(0)``).

The same holds the other way round for a compiled program's *output* at such a width:
the gradient that reaches its backward is a plain [N, 47] tensor, which the executor
copies to [N, 48] while the plain one is still held -- 0.47 GB each at the products-sized
GAT step's memory peak. `flat_heads` takes a layer's [N, heads, C] output to [N, heads * C]
with a backward that writes the gradient padded in the first place.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F

from ..backend.row_layout import aligned_row_width
from ..runtime.autocast import AUTOCAST_DEVICE_TYPES, autocast_dtype
from ..ir.ops.dense import column_sums


class RowsRead(NamedTuple):
    """The rows of a vertex table a propagation reads: ``mask`` (boolean [N]) and
    ``unread``, the ids of the other rows. `rows_read` zeroes those by index: on a
    products-sized [N, 64] table (71 unread rows of 2.45M) a masked pass over every row
    took 0.96 ms on an H100, the copy with the unread rows filled by index 0.42 ms."""
    mask: torch.Tensor
    unread: torch.Tensor

    @classmethod
    def of(cls, mask: torch.Tensor) -> "RowsRead | None":
        """The rows ``mask`` marks, or None when it marks every row. Reads one count back
        from the device, the unmarked rows' (whose ids `rows_read` needs anyway; an
        ``all()`` first was a second read): build it where a sync is allowed (a layout
        cache, a loader)."""
        unread = (~mask).nonzero().squeeze(1)
        return cls(mask, unread) if unread.numel() else None


def rows_read(x: torch.Tensor, read: RowsRead | None) -> torch.Tensor:
    """``x`` with the rows outside ``read`` (None: all are read) zeroed.

    Why: a layer that transforms every row before a propagation that reads only some
    (``(A X) W`` evaluated as ``A (X W)``) gives the same output, but its weight gradient
    sums every row times that row's share of the output gradient -- 0 for an unread row,
    yet 0 * NaN = NaN -- where propagating first, as PyG does, never touches the row.
    Zeroing unread rows changes no output and keeps a NaN or inf in them out of every
    gradient, as in PyG. Free when every row is read (the usual graph).
    """
    return x if read is None else x.index_fill(0, read.unread, 0.0)


def weight_gradient(grad: torch.Tensor, x: torch.Tensor, read: RowsRead | None) -> torch.Tensor:
    """``grad^T rows_read(x, read)``: a linear map's weight gradient summed over the rows
    of ``read`` only (None: all) -- in a backward, where ``grad`` is 0 on the unread rows.

    `rows_read`'s zeroed copy of ``x`` is a whole pass over it: 0.30 ms for a
    products-sized [2.45M, 64] input on an H200 (24 us at arxiv's size), to zero 71 rows.
    So on CUDA, outside a double backward, for a contiguous ``x`` that autograd made in
    this forward (it has a ``grad_fn``: a layer's hidden input, not a user's feature table,
    which another stream or thread may be reading), the unread rows are zeroed in ``x``
    itself for the product and put back right after it, on the same stream: every kernel
    queued before or after sees ``x`` as it was, and its version counter is kept, since to
    autograd nothing changed. That costs three kernels over the unread rows.
    """
    if read is None:
        return grad.t() @ x
    if not (x.is_cuda and x.grad_fn is not None and x.is_contiguous() and not torch.is_grad_enabled()):
        return grad.t() @ rows_read(x, read)     # a CPU tensor may be a read-only memory map
    return product_with_rows_zeroed(grad, x, read)


def product_with_rows_zeroed(grad: torch.Tensor, x: torch.Tensor, read: RowsRead) -> torch.Tensor:
    """``grad^T x`` with ``x``'s unread rows zeroed in place for the product and restored
    after it, ``x``'s version counter kept (`weight_gradient` says when this is safe)."""
    kept = x.index_select(0, read.unread)
    with torch.autograd._unsafe_preserve_version_counter(x):
        x.index_fill_(0, read.unread, 0.0)
        product = grad.t() @ x
        x.index_copy_(0, read.unread, kept)
    return product


# Rows from which a GPU map's bias gradient is summed by `column_sums` (the Function below)
# rather than by autograd's own reduction. The matrix-vector product saved 34 us of 62 at
# 169K rows on an H200, a saving that shrinks with the rows (about 13 us at this bound),
# while the Python Function costs the host about 19 us per forward and backward (measured
# on the CPU against F.linear, tiny tensors): a small graph's step, a molecule batch of
# a few thousand vertices, is bound by that host time, and its kernels gain nothing.
GEMV_BIAS_FROM_ROWS = 65_536


def aligned_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   read: RowsRead | None = None) -> torch.Tensor:
    """``x W^T + b`` -- on CUDA with its rows at the kernels' stride (a view into a
    padded table when the width needs it), and with the weight's gradient summed over
    the rows of ``read`` only (None: all)."""
    width = weight.shape[0]
    stride = kernel_row_stride(x, width)
    if stride == width and read is None and not (x.is_cuda and bias is not None and bias.requires_grad
                                                 and x.shape[0] >= GEMV_BIAS_FROM_ROWS):
        return F.linear(x, weight, bias)
    return (_AlignedLinearJvp if _dual_level() else _AlignedLinear).apply(x, weight, bias, read, stride)


def kernel_row_stride(x: torch.Tensor, width: int) -> int:
    """The row stride to give ``x W^T``: the GPU kernels' (`aligned_row_width`) for a 2-D
    CUDA input; packed elsewhere (the CPU executors read rows at any stride)."""
    return aligned_row_width(width) if x.is_cuda and x.dim() == 2 else width


def paired_linear(x: torch.Tensor, weight_a: torch.Tensor, read_a: RowsRead | None, weight_b: torch.Tensor,
                  bias_b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(aligned_linear(x, weight_a, read=read_a), aligned_linear(x, weight_b, bias_b))``
    -- two maps of one input (a SAGE layer's neighbour and root terms) -- whose backward
    forms ``x``'s gradient as one GEMM plus one that accumulates onto it, where autograd
    would add the two maps' gradients in a pass of its own (an [N, in] addition, 29 us on
    the arxiv-sized SAGE step's second layer on an H200)."""
    return (_PairedLinearJvp if _dual_level() else _PairedLinear).apply(x, weight_a, read_a, weight_b, bias_b)


def _mapped(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int) -> torch.Tensor:
    """``x W^T + b`` with its rows ``stride`` apart (a view into a padded table).

    The GEMM writes the view of a new table directly (cuBLAS takes the row stride as its
    leading dimension); the padding lanes are left as they are, which no kernel's result
    reads (`row_layout.has_row_stride`). Padding the weight and bias by a zero row
    instead was four more kernels a call, 0.24 ms of host time of a 5.6 ms mini-batch
    SAGE step on an H200 (47 classes, three layers). Under autocast, whose casts the
    ``out=`` form skips, for mixed dtypes and inside torch.compile's trace (whose graph
    the host time does not burden), the padded operands remain."""
    width = weight.shape[0]
    if stride == width:
        return F.linear(x, weight, bias)
    if (x.dim() == 2 and x.dtype == weight.dtype and (bias is None or bias.dtype == x.dtype)
            and not torch.is_autocast_enabled(x.device.type) and not torch.compiler.is_compiling()):
        out = x.new_empty(x.shape[0], stride)[:, :width]
        return torch.mm(x, weight.t(), out=out) if bias is None else torch.addmm(bias, x, weight.t(), out=out)
    pad = stride - width
    out = F.linear(x, F.pad(weight, (0, 0, 0, pad)), None if bias is None else F.pad(bias, (0, pad)))
    return out[:, :width]


def as_computed(dtype: torch.dtype | None, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """``tensors`` as a forward under autocast multiplied them (``dtype``, from
    `runtime.autocast.autocast_dtype`; None: as they are): the F.linear of a forward under autocast ran
    in the autocast dtype on its cast operands, but saved the uncast ones, and a backward
    run outside the block (as training runs it) multiplied the bfloat16 output gradient by
    the float32 weight: "expected m1 and m2 to have the same dtype". Autograd casts the
    gradients returned in ``dtype`` to each input's dtype, as autocast's own casts do."""
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if t is not None and t.dtype in _CASTABLE else t for t in tensors)


_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)     # autocast leaves float64 as it is


class _PairedLinear(torch.autograd.Function):
    """`paired_linear`. The backward is written in differentiable ops (the in-place
    accumulation writes a product nothing saved), so double backward works."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight_a: torch.Tensor, read_a: RowsRead | None,
                weight_b: torch.Tensor, bias_b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(x, weight_a, weight_b)
        ctx.read_a, ctx.autocast, ctx.kind = read_a, autocast_dtype(x.device.type), x.device.type
        return (_mapped(x, weight_a, None, kernel_row_stride(x, weight_a.shape[0])),
                _mapped(x, weight_b, bias_b, kernel_row_stride(x, weight_b.shape[0])))

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor | None, grad_b: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        if ctx.kind in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(ctx.kind):
            # a backward called inside an autocast block (after a forward outside it, or
            # inside): the products compute in the forward's dtypes (`as_computed`), not
            # cast again, where the cast ``grad_a @ weight_a`` met the float32 in-place
            # addmm_: "self and mat2 must have the same dtype"
            with torch.autocast(ctx.kind, enabled=False):
                return _PairedLinear.backward(ctx, grad_a, grad_b)
        x, weight_a, weight_b = as_computed(ctx.autocast, *ctx.saved_tensors)
        grad_a, grad_b = as_computed(ctx.autocast, grad_a, grad_b)
        grad_a = x.new_zeros(x.shape[0], weight_a.shape[0]) if grad_a is None else grad_a
        grad_b = x.new_zeros(x.shape[0], weight_b.shape[0]) if grad_b is None else grad_b
        grad_x = (grad_a @ weight_a).addmm_(grad_b, weight_b) if ctx.needs_input_grad[0] else None
        grad_wa = weight_gradient(grad_a, x, ctx.read_a) if ctx.needs_input_grad[1] else None
        grad_wb = grad_b.t() @ x if ctx.needs_input_grad[3] else None
        grad_bias = column_sums(grad_b) if ctx.needs_input_grad[4] else None
        return grad_x, grad_wa, None, grad_wb, grad_bias


class _AlignedLinear(torch.autograd.Function):
    """`aligned_linear` where a padded layout or a read mask applies (see the module doc)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                read: RowsRead | None, stride: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.read, ctx.autocast, ctx.kind = read, autocast_dtype(x.device.type), x.device.type
        return _mapped(x, weight, bias, stride)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.kind in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(ctx.kind):
            with torch.autocast(ctx.kind, enabled=False):      # as `_PairedLinear.backward`
                return _AlignedLinear.backward(ctx, grad)
        x, weight, grad = as_computed(ctx.autocast, *ctx.saved_tensors, grad)
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = weight_gradient(grad, x, ctx.read) if ctx.needs_input_grad[1] else None
        grad_bias = column_sums(grad) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None, None


def bias_added(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``out + bias`` (a bias over ``out``'s trailing dims; None: ``out``), whose bias
    gradient is summed over the rows as a matrix-vector product on a GPU (`column_sums`)
    from `GEMV_BIAS_FROM_ROWS` rows: autograd's broadcast add reduces ``grad.sum(0)``,
    which took twice as long (62 against 28 us for an [N, 64] gradient at N = 169K on an
    H200, twice per GAT step). Below it the Function's Python forward and backward cost
    the host more than the sum saves (a molecule batch's GAT step on an H200: 61 + 188 us
    of host time per layer in torch's profiler, four layers a step)."""
    if bias is None:
        return out
    if (not (out.is_cuda and bias.requires_grad and torch.is_grad_enabled()) or out.shape[1:] != bias.shape
            or out.shape[0] < GEMV_BIAS_FROM_ROWS):
        return out + bias
    return (_BiasAddedJvp if _dual_level() else _BiasAdded).apply(out, bias)


class _BiasAdded(torch.autograd.Function):
    """`bias_added` on CUDA with a bias that wants a gradient. The backward is written in
    differentiable ops (`column_sums` is a matrix-vector product), so double backward works."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.dtypes = out.dtype, bias.dtype
        return out + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        out_dtype, bias_dtype = ctx.dtypes
        grad_out = grad.to(out_dtype) if ctx.needs_input_grad[0] else None
        grad_bias = column_sums(grad).to(bias_dtype) if ctx.needs_input_grad[1] else None
        return grad_out, grad_bias


def flat_heads(out: torch.Tensor) -> torch.Tensor:
    """``out`` ([N, heads, C]) as [N, heads * C], the view ``flatten(1)`` gives -- with,
    when it will be differentiated and the kernels read its rows padded (CUDA, an
    unaligned width), a backward that hands the program the gradient in that layout."""
    flat = out.flatten(1)
    stride = kernel_row_stride(flat, flat.shape[1])
    if stride == flat.shape[1] or not (torch.is_grad_enabled() and out.requires_grad):
        return flat
    return (_PaddedGradientJvp if _dual_level() else _PaddedGradient).apply(out, stride)


class _PaddedGradient(torch.autograd.Function):
    """`flat_heads` on CUDA at an unaligned width (see the module doc)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, stride: int) -> torch.Tensor:
        ctx.shape, ctx.stride = out.shape, stride
        return out.flatten(1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        rows, width = grad.shape
        padded = grad.new_empty(rows, ctx.stride)[:, :width]    # the kernels never read the padding lanes
        padded.copy_(grad)
        return padded.view(ctx.shape), None


# Forward-mode AD. Each Function above, without a jvp, stopped a dual input (forward_ad,
# ``jacobian(strategy="forward-mode")``) in torch's "You must implement the jvp function",
# naming no layer, where PyG's layers carry the tangent: SAGEConv's paired maps, and the
# map GraphConv, TAGConv and SAGEConv make before aggregating with a row mask. Dynamo
# cannot trace a Function that defines a jvp, so these variants, which do, run only inside
# a forward-AD level (where torch.compile does not trace).


def _dual_level() -> bool:
    """Whether a ``forward_ad.dual_level()`` is open (torch keeps no public flag)."""
    return forward_ad._current_level >= 0


def _linear_tangent(x: torch.Tensor, weight: torch.Tensor, x_t: torch.Tensor | None, weight_t: torch.Tensor | None,
                    bias_t: torch.Tensor | None) -> torch.Tensor:
    """The tangent of ``x W^T + b`` by the product rule (a missing tangent is 0)."""
    tangent = x.new_zeros(*x.shape[:-1], weight.shape[0])
    if x_t is not None:
        tangent = tangent + F.linear(x_t, weight)
    if weight_t is not None:
        tangent = tangent + F.linear(x, weight_t)
    return tangent if bias_t is None else tangent + bias_t


class _PairedLinearJvp(_PairedLinear):
    """`_PairedLinear` with a jvp (see `_dual_level`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight_a: torch.Tensor, read_a: RowsRead | None,
                weight_b: torch.Tensor, bias_b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_forward(x, weight_a, weight_b)
        return _PairedLinear.forward(ctx, x, weight_a, read_a, weight_b, bias_b)

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor | None, weight_a_t: torch.Tensor | None, _read: None,
            weight_b_t: torch.Tensor | None, bias_b_t: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight_a, weight_b = ctx.saved_tensors
        return (_linear_tangent(x, weight_a, x_t, weight_a_t, None),
                _linear_tangent(x, weight_b, x_t, weight_b_t, bias_b_t))


class _AlignedLinearJvp(_AlignedLinear):
    """`_AlignedLinear` with a jvp (see `_dual_level`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                read: RowsRead | None, stride: int) -> torch.Tensor:
        ctx.save_for_forward(x, weight)
        return _AlignedLinear.forward(ctx, x, weight, bias, read, stride)

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor | None, weight_t: torch.Tensor | None, bias_t: torch.Tensor | None,
            _read: None, _stride: None) -> torch.Tensor:
        x, weight = ctx.saved_tensors
        return _linear_tangent(x, weight, x_t, weight_t, bias_t)


class _BiasAddedJvp(_BiasAdded):
    """`_BiasAdded` with a jvp (see `_dual_level`)."""

    @staticmethod
    def jvp(ctx: Any, out_t: torch.Tensor | None, bias_t: torch.Tensor | None) -> torch.Tensor:
        zero = torch.zeros((), dtype=torch.promote_types(*ctx.dtypes))
        return (zero if out_t is None else out_t) + (zero if bias_t is None else bias_t)


class _PaddedGradientJvp(_PaddedGradient):
    """`_PaddedGradient` with a jvp (see `_dual_level`)."""

    @staticmethod
    def jvp(ctx: Any, out_t: torch.Tensor, _stride: None) -> torch.Tensor:
        return out_t.flatten(1)
