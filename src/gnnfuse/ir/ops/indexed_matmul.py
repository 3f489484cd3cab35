"""``x_row @ table[idx_row]``: multiply each row by the matrix its integer data names.

Graphiler's R-GCN reads its relation weights through edge data,
``torch.bmm(edges.src['h'].unsqueeze(1), W[edges.data['type']])``. Gathered first
(``index_rows``) and multiplied row by row (``row_matmul``), every edge would hold its
own [in, out] copy -- |E|*in*out memory for what is T matrices. As with a typed lookup
(ir/ops/typed.py) the rows are instead grouped by their index and each group runs one
dense matmul against its table entry; the table's gradient sums each group's outer
products into its entry. The grouping is a sort of the index, done per call because
the index is data, not part of the graph.
"""
from __future__ import annotations

import torch

from ..registry import OpDef, register
from ..residency import Movement, Residency, join
from .indexing import wrap_index
from .typed import RowGroups, group_rows


def index_groups(idx: torch.Tensor, count: int) -> RowGroups:
    """Row ids per table entry (see `wrap_index` for negative entries)."""
    return group_rows(wrap_index(idx, count), count)


def _residency(rs, attrs):
    x, table, idx = rs
    if table is not Residency.SHARED or x is Residency.SHARED or idx is Residency.SHARED:
        raise ValueError(f"indexed_matmul takes rows @ a parameter table[row index], got {x.name} @ "
                         f"{table.name}[{idx.name}]")
    return join([x, idx])


def _shape(inputs, attrs, residency):
    x, table, idx = inputs
    if idx.shape != () or len(table.shape) != 3:
        raise ValueError(f"indexed_matmul takes one index per row into a [T, in, out] table, got index "
                         f"{list(idx.shape)} into {list(table.shape)}")
    if not x.shape or x.shape[-1] != table.shape[1]:
        raise ValueError(f"x's last dim must match the matrices' rows: {list(x.shape)} @ {list(table.shape[1:])}")
    return x.shape[:-1] + (table.shape[2],), torch.promote_types(x.dtype, table.dtype)


def _derivative(b, v, g):
    x, table, idx = v.inputs
    rows = b.fwd(idx)
    return [b.add("indexed_matmul", g, b.add("transpose", b.fwd(table)), rows),
            b.add("indexed_matmul_tn", b.fwd(x), g, rows, count=table.shape[0]), None]


register(OpDef("indexed_matmul", Movement.DENSE,
               lambda ctx, x, table, idx: ctx.grouped_matmul(x, table, index_groups(idx, table.shape[0])),
               residency=_residency, shape=_shape, bounded_derivative=True, arity=3, derivative=_derivative,
               doc="x @ table[idx] per row, one dense matmul per table entry; nothing |E|*in*out sized"))


def _tn_shape(inputs, attrs, residency):
    x, g, _ = inputs
    return (attrs["count"], x.shape[-1], g.shape[-1]), torch.promote_types(x.dtype, g.dtype)


register(OpDef("indexed_matmul_tn", Movement.REDUCE,
               lambda ctx, x, g, idx, count: ctx.grouped_matmul_tn(x, g, index_groups(idx, count)),
               residency=lambda rs, a: Residency.SHARED, shape=_tn_shape, arity=3,
               doc="per table entry, the sum of outer(x_row, g_row) over the rows indexing it: the table "
                   "gradient of indexed_matmul"))
