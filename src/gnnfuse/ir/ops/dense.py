"""Dense ops that are not elementwise: matmul, feature-dim reductions, shape changes,
constants, dropout masks and the row reduction that produces parameter gradients.

Dims in attrs are always negative (per-element, counted from the right), so the same
attrs work on row-leading tensors at run time and on stripped shapes at trace time.
"""
from __future__ import annotations

import math

import torch

from ..registry import OpDef, register
from ..residency import Movement, Residency, ResidencyError, join


def _dense(name: str, fn, derivative=None, **kw) -> OpDef:
    return register(OpDef(name, Movement.DENSE, lambda ctx, *xs, **a: fn(*xs, **a),
                          derivative=derivative, **kw))


# --- matmul ---------------------------------------------------------------------------
def _matmul_derivative(b, v, g):
    x, w = v.inputs
    if w.residency is not Residency.SHARED:
        raise NotImplementedError("matmul derivative needs a SHARED right operand")
    return [b.add("matmul", g, b.add("transpose", b.fwd(w))),
            b.add("matmul_tn", b.fwd(x), g)]


def _matmul_residency(rs, attrs):
    """Only ``rows @ parameter``: a row-resident right operand would be batched against the
    left's rows by torch.matmul's broadcasting and silently give the wrong shape."""
    if rs[1] is not Residency.SHARED:
        raise ResidencyError(f"x @ W needs W to be a parameter (SHARED), got {rs[1].name}; a weight "
                             "looked up per edge or node type is typed_matmul (x @ e.type.W, "
                             "x @ edges.type['W'])")
    return join(rs)


def _matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.matmul``, refusing operands of two dtypes as torch's CPU and CUDA kernels
    do: its meta function, which infers the op's dtype at trace time, takes any pair and
    answers the left operand's dtype, so float32 edge features @ an int64 weight ran in
    the Triton and Numba kernels (an unrolled dot of edge features, `edge_feature_matmul`)
    where torch, and the reference backend at run time, raise."""
    if x.dtype != w.dtype:
        raise RuntimeError(f"x @ W takes operands of one dtype, as torch's matmul does; got {x.dtype} @ {w.dtype} "
                           "(convert one of them)")
    return torch.matmul(x, w)


_dense("matmul", _matmul, _matmul_derivative, bounded_derivative=True, arity=2, residency=_matmul_residency,
       doc="x @ W with W a parameter (the usual linear transform)", autograd_reference=True)


def _addmm(x: torch.Tensor, w: torch.Tensor, addend: torch.Tensor) -> torch.Tensor:
    shape = (*x.shape[:-1], w.shape[-1])
    addend = addend if addend.dim() <= 1 else addend.reshape(math.prod(shape[:-1]), shape[-1])
    return torch.addmm(addend, row_matrix(x), w).reshape(shape)


def _addmm_derivative(b, v, g):
    x, w, _ = v.inputs
    return [b.add("matmul", g, b.add("transpose", b.fwd(w))), b.add("matmul_tn", b.fwd(x), g), g]


def _addmm_residency(rs, attrs):
    if rs[1] is not Residency.SHARED:
        raise ResidencyError(f"addmm takes a parameter weight (SHARED), got {rs[1].name}")
    return join(rs)


_dense("addmm", _addmm, _addmm_derivative, bounded_derivative=True, arity=3, residency=_addmm_residency,
       doc="x @ W + c with W a parameter and c a bias row or a table of the product's shape, as one GEMM "
           "whose epilogue adds c (passes/addmm.py): the product and the sum as two ops wrote and reread "
           "an output-sized table", autograd_reference=True)
_dense("transpose", lambda x: x.transpose(-1, -2), lambda b, v, g: [b.add("transpose", g)], bounded_derivative=True,
       arity=1, view=True, autograd_reference=True)


def row_matrix(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., K] as a [rows, K] matrix. ``reshape(-1, K)`` cannot infer the row count
    of an empty tensor, which zero-width features (K = 0) make, so the rows are counted."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _matmul_tn_shape(inputs, attrs, residency):
    x, g = inputs
    return (x.shape[-1], g.shape[-1]), x.dtype


_dense("matmul_tn", lambda x, g: row_matrix(x).transpose(0, 1) @ row_matrix(g),
       None, arity=2, shape=_matmul_tn_shape,
       residency=lambda rs, a: Residency.SHARED,
       doc="sum over rows of outer(x_row, g_row): the weight gradient of x @ W")
register(OpDef("sum_to", Movement.REDUCE, lambda ctx, x, shape, residency, rows: _sum_to(x, shape, rows[0],
                                                                                   residency),
               residency=lambda rs, a: a["residency"],
               shape=lambda inputs, a, r: (tuple(a["shape"]), inputs[0].dtype),
               arity=1, row_aware=True,
               doc="sum broadcast dims away, and the rows too for a SHARED target (parameter gradients)"))


def column_sums(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)``: a parameter's gradient summed over the rows (a bias's, an edge
    weight's). On a GPU, for float32/float64 rows, as ``x^T @ ones``: torch's reduction
    over the leading dim of an [N, 64] table took 62 us at N = 169K on an H200, the
    matrix-vector product 28 us. ``mv`` runs cuBLAS's gemv, which has no TF32 path, so
    the sum keeps float32 precision when TF32 matmuls are allowed."""
    if not x.is_cuda or x.dtype not in (torch.float32, torch.float64) or x.dim() < 2 or x.shape[0] < 2:
        return x.sum(0)
    flat = x.reshape(x.shape[0], -1)
    return torch.mv(flat.t(), flat.new_ones(x.shape[0])).reshape(x.shape[1:])


def _sum_to(x: torch.Tensor, shape, rows: bool, residency: Residency) -> torch.Tensor:
    if rows and residency is Residency.SHARED:
        x, rows = column_sums(x), False
    lead = int(rows)
    elem = x.shape[lead:]
    extra = len(elem) - len(shape)
    dims = [lead + i for i in range(extra)]
    dims += [lead + extra + i for i, s in enumerate(shape) if s == 1 and elem[extra + i] != 1]
    if dims:
        x = x.sum(dims, keepdim=True)
    return x.reshape(((x.shape[0],) if rows else ()) + tuple(shape))


# --- feature-dim reductions -----------------------------------------------------------
def _expand_back(b, v, g):
    x = v.inputs[0]
    if not v.attrs["keepdim"]:
        keep_shape = list(x.shape)
        for d in v.attrs["dim"]:
            keep_shape[d] = 1
        g = b.add("reshape", g, shape=tuple(keep_shape))
    return b.add("expand", g, shape=x.shape)


def _row_dot_residency(rs, attrs):
    """Two tables of the same rows: the rewrite (passes/row_dot.py) makes it from a
    product of two such tables, and a parameter operand would be a broadcast it avoids."""
    if rs[0] is not rs[1] or rs[0] is Residency.SHARED:
        raise ResidencyError(f"row_dot takes two tables of the same rows, got {rs[0].name} and {rs[1].name}")
    return rs[0]


def row_dot_reference(x: torch.Tensor, y: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``(x * y).sum(dims, keepdim=True)``: torch's two kernels, the oracle of the fused one."""
    return (x * y).sum(dims, keepdim=True)


def _row_dot_derivative(b, v, g):
    x, y = v.inputs
    return [b.add("mul", g, b.fwd(y)), b.add("mul", g, b.fwd(x))]


register(OpDef("row_dot", Movement.DENSE,
               lambda ctx, x, y, dims: (row_dot_reference if ctx is None else ctx.row_dot)(x, y, tuple(dims)),
               residency=_row_dot_residency,
               shape=lambda inputs, a, r: (tuple(1 if i - len(inputs[0].shape) in a["dims"] else n
                                                 for i, n in enumerate(inputs[0].shape)), inputs[0].dtype),
               derivative=_row_dot_derivative, bounded_derivative=True, arity=2,
               doc="per-row sums of x * y over the feature dims ``dims`` (kept as size 1): one pass, "
                   "where the product as its own op writes and rereads a table as wide as x"))


_dense("sum_dim", lambda x, dim, keepdim: x.sum(dim, keepdim=keepdim),
       lambda b, v, g: [_expand_back(b, v, g)], bounded_derivative=True, arity=1, autograd_reference=True)


def _mean_derivative(b, v, g):
    """``g / count`` spread back over the averaged dims. Over a zero-width dim (``x[:, :0]
    .mean(-1)``: NaN, as torch's) the input's gradient is empty, with no count to divide
    by: the scale was ``1.0 / 0``, a ZeroDivisionError building the backward program where
    torch's autograd (a small graph's first pass, runtime/first_pass.py) gives the empty one."""
    count = math.prod(v.inputs[0].shape[d] for d in v.attrs["dim"])
    spread = _expand_back(b, v, g)
    return [b.add("mul", spread, b.const(1.0 / count, g)) if count else spread]


_dense("mean_dim", lambda x, dim, keepdim: x.mean(dim, keepdim=keepdim), _mean_derivative,
       bounded_derivative=True, arity=1, autograd_reference=True)

# --- shape changes --------------------------------------------------------------------
def _reshape(x: torch.Tensor, shape, rows) -> torch.Tensor:
    return x.reshape(((x.shape[0],) if rows[0] else ()) + tuple(shape))


def _expand(x: torch.Tensor, shape, rows) -> torch.Tensor:
    return x.expand(((x.shape[0],) if rows[0] else ()) + tuple(shape))


_dense("reshape", _reshape, lambda b, v, g: [b.add("reshape", g, shape=v.inputs[0].shape)], bounded_derivative=True,
       arity=1, row_aware=True, autograd_reference=True, view=True)
_dense("expand", _expand, None, arity=1, row_aware=True, view=True,
       doc="broadcast per-element dims to shape; its gradient is summed back by autodiff")


def _concat_derivative(b, v, g):
    grads, start, dim = [], 0, v.attrs["dim"]
    for x in v.inputs:
        size = x.shape[dim]
        grads.append(b.add("narrow", g, dim=dim, start=start, length=size))
        start += size
    return grads


_dense("concat", lambda *xs, dim: torch.cat(xs, dim), _concat_derivative, bounded_derivative=True, elementwise=True,
       autograd_reference=True)
_dense("narrow", lambda x, dim, start, length: x.narrow(dim, start, length),
       lambda b, v, g: [b.add("unnarrow", g, dim=v.attrs["dim"], start=v.attrs["start"],
                              size=v.inputs[0].shape[v.attrs["dim"]])], bounded_derivative=True, arity=1,
       view=True)
_dense("unnarrow", lambda g, dim, start, size: _unnarrow(g, dim, start, size),
       lambda b, v, g: [b.add("narrow", g, dim=v.attrs["dim"], start=v.attrs["start"],
                              length=v.inputs[0].shape[v.attrs["dim"]])], bounded_derivative=True, arity=1,
       doc="place g at [start, start+len) of a zero tensor of length size along dim")


def _unnarrow(g: torch.Tensor, dim: int, start: int, size: int) -> torch.Tensor:
    shape = list(g.shape)
    shape[dim] = size
    out = g.new_zeros(shape)
    out.narrow(dim, start, g.shape[dim]).copy_(g)
    return out


# --- constants and randomness ---------------------------------------------------------
def _rounded_into(value: float, dtype: torch.dtype) -> float:
    """``value`` as torch rounds a Python scalar into ``dtype`` where it lies beyond the
    dtype's range (``x + 1e40`` on float32: inf), which `torch.full` refuses with an
    overflow error: inf from half a unit in the last place above the largest value, the
    largest value below that. Worked out on the host, with no tensor op (no host copy)."""
    info = torch.finfo(dtype)
    if abs(value) <= info.max:
        return value
    last_place = info.eps * 2.0 ** math.floor(math.log2(info.max))
    return math.copysign(math.inf if abs(value) >= info.max + last_place / 2 else info.max, value)


def _const(ctx, value: float, dtype: torch.dtype) -> torch.Tensor:
    """On the graph's device: a value derived from constants alone can become a kernel
    operand, and a kernel cannot read a CPU scalar. Filled there (``torch.full``) rather
    than copied from the host (``torch.tensor``): that copy synchronises the host with the
    GPU on every call and cannot be captured in a CUDA graph."""
    if dtype.is_floating_point and isinstance(value, float) and math.isfinite(value):
        value = _rounded_into(value, dtype)
    return torch.full((), value, dtype=dtype, device=None if ctx is None else ctx.device)


register(OpDef("const", Movement.DENSE, _const,
               residency=lambda rs, a: Residency.SHARED,
               shape=lambda inputs, a, r: ((), a["dtype"]), arity=0, autograd_reference=True))


def _dropout_mask(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
    """``bernoulli(1 - p) / (1 - p)`` shaped like ``x``, in its dtype. The probabilities are
    at least float32, as torch's dropout draws with the exact ``1 - p``: in bfloat16 they
    rounded (1 - p = 0.501953125 kept half the elements)."""
    keep = torch.full(x.shape, 1.0 - p, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
    return torch.bernoulli(keep).to(x.dtype) / (1.0 - p)


register(OpDef("dropout_mask", Movement.DENSE, _dropout_mask,
               shape=lambda inputs, a, r: (inputs[0].shape, inputs[0].dtype),
               bounded_derivative=True, arity=1, pure=False, derivative=lambda b, v, g: [None],
               doc="a fresh keep-mask scaled by 1/(1-p), shaped like x; dropout is x * mask; the mask "
                   "is a constant of the step (backward reuses the saved one), so no gradient flows to x"))
