"""``x_row @ W_row``: a matmul whose right operand differs from row to row.

DGL code multiplies each edge by its own matrix with ``torch.bmm(x.unsqueeze(1), W_e)``,
``W_e`` being edge data or computed per edge (a table looked up by one integer per row
is ``indexed_matmul`` instead, which never gathers the matrices). The plain ``matmul``
op takes a parameter on the right; this one takes per-row matrices (or a parameter on
the left, ``W @ x_row``) and multiplies row by row. Both operands are at
least matrices per row (the tracer turns a vector into a one-row matrix and back); their
per-row batch dims broadcast, and autodiff sums a gradient back over them.
"""
from __future__ import annotations

import torch

from ..registry import OpDef, align_rows, register
from ..residency import Movement, Residency, join


def _row_matmul_shape(inputs, attrs, residency):
    x, w = inputs
    if len(x.shape) < 2 or len(w.shape) < 2:
        raise ValueError(f"row_matmul takes a matrix per row on both sides, got {list(x.shape)} @ {list(w.shape)}")
    if x.shape[-1] != w.shape[-2]:
        raise ValueError(f"inner dims differ: {list(x.shape)} @ {list(w.shape)}")
    batch = torch.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    return tuple(batch) + (x.shape[-2], w.shape[-1]), torch.promote_types(x.dtype, w.dtype)


def _row_matmul(ctx, x: torch.Tensor, w: torch.Tensor, rows) -> torch.Tensor:
    """Rows line up with rows: per-row ranks are aligned before the product batches them
    (torch.matmul, or the backend's kernel: ``ExecContext.row_matmul``)."""
    x, w = align_rows([x, w], [Residency.EDGE if r else Residency.SHARED for r in rows])
    return (torch.matmul if ctx is None else ctx.row_matmul)(x, w)


def _row_matmul_derivative(b, v, g):
    x, w = v.inputs
    return [b.add("row_matmul", g, b.add("transpose", b.fwd(w))),
            b.add("row_matmul", b.add("transpose", b.fwd(x)), g)]


def _row_matmul_residency(rs, attrs):
    if rs[1] is Residency.SHARED:
        raise ValueError("x @ W with W a parameter is the matmul op, not row_matmul")
    return join(rs)


register(OpDef("row_matmul", Movement.DENSE, _row_matmul, bounded_derivative=True,
               residency=_row_matmul_residency, shape=_row_matmul_shape, arity=2, row_aware=True,
               derivative=_row_matmul_derivative,
               doc="x @ W row by row, W holding one matrix per row (bmm against per-edge matrices)"))
