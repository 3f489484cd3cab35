"""Per-type matmul: ``x_row @ W[type(row)]`` with ``W`` a table of one matrix per type.

R-GCN transforms each message by its relation's weight (x_u @ W_r), HGT each vertex by its
node type's projection. Written as ``broadcast(W, by="etype")`` followed by a per-row
matmul, every edge would hold its own copy of an [in, out] matrix -- |E|*in*out memory
for what is R matrices. ``typed_matmul`` instead reads ``W`` (a type-resident value,
[in, out] per type) through the type index, and its weight gradient ``typed_matmul_tn``
sums each type's outer products straight into that type's row (the reduce-along-the-same-
index rule of the broadcast it replaces).

Both run one dense matmul per type over the rows of that type (what PyG's RGCNConv does
per relation), so the cost is R small GEMMs and nothing |E|*in*out sized. They have no
Triton emitter: they run through the context's ``grouped_matmul``/``grouped_matmul_tn``,
which are the torch loops below in the reference backend and one segment-matmul kernel
launch for all types in the Triton backend (backend/triton/segment_matmul.py).
"""
from __future__ import annotations

import torch

from ..registry import OpDef, register
from ..residency import EDGE_ROWED, Movement, Residency, join
from .dense import row_matrix
from .movement import BROADCAST_FROM, BROADCAST_TO, REDUCE_TO, TYPE_INDICES


class RowGroups(list):
    """Row ids per type (a list of id tensors, one per type), with the group sizes as host
    integers and a memo for what kernels derive from them (the segment matmul's tile map,
    backend/triton/segment_matmul.py).

    The grouping is a sort done once per graph (or per index tensor) and then served from a
    cache, but every per-type matmul reads its sizes: taken from the tensors (``len`` per
    group, hundreds of host calls with 90-266 relations) each call, they made a training
    step's host time grow with the relation count. Here they are read once, when the
    groups are built (the ``tolist`` that sized the split), and the memo lives exactly as
    long as the groups."""

    def __init__(self, ids: list[torch.Tensor] | tuple[torch.Tensor, ...], counts: list[int]):
        super().__init__(ids)
        self.counts: tuple[int, ...] = tuple(counts)
        self.memo: dict = {}


def group_rows(index: torch.Tensor, count: int) -> RowGroups:
    """The ids of the rows with each value ``0..count-1`` of ``index``, ascending per group
    (a stable sort): one sort and one host read of the group sizes."""
    order = torch.sort(index, stable=True).indices
    counts = torch.bincount(index, minlength=count).tolist()
    return RowGroups(torch.split(order, counts), counts)


def _check_type_index(by: str) -> None:
    if by not in TYPE_INDICES:
        raise ValueError(f"a per-type matmul looks its weight up by one of {TYPE_INDICES}, got {by!r}")


def _rows_residency(x: Residency, by: str, what: str) -> Residency:
    """The residency of rows that index ``by`` has one entry for, or a clear error."""
    if BROADCAST_TO[by] is Residency.NODE:
        if x is not Residency.NODE:
            raise ValueError(f"{what} by {by} takes per-vertex (NODE) rows, got {x.name}")
        return Residency.NODE
    if x not in EDGE_ROWED:
        raise ValueError(f"{what} by {by} takes per-edge rows (SRC, DST or EDGE), got {x.name}")
    return join([x, BROADCAST_TO[by]])


# --- typed_matmul -----------------------------------------------------------------------
def _typed_matmul_residency(rs, attrs):
    by = attrs["by"]
    _check_type_index(by)
    if rs[1] is not BROADCAST_FROM[by]:
        raise ValueError(f"typed_matmul by {by} takes a weight table resident on {BROADCAST_FROM[by].name}, "
                         f"got {rs[1].name}")
    return _rows_residency(rs[0], by, "typed_matmul")


def _typed_matmul_shape(inputs, attrs, residency):
    x, w = inputs
    if len(w.shape) != 2:
        raise ValueError(f"a per-type weight must be one [in, out] matrix per type, got per-type shape "
                         f"{list(w.shape)}")
    if not x.shape or x.shape[-1] != w.shape[0]:
        raise ValueError(f"x's last dim must match the weight's rows: x {list(x.shape)} @ W {list(w.shape)}")
    return x.shape[:-1] + (w.shape[1],), torch.promote_types(x.dtype, w.dtype)


def typed_matmul(x: torch.Tensor, w: torch.Tensor, groups: list[torch.Tensor],
                 gather: torch.Tensor | None = None) -> torch.Tensor:
    """``out[i] = x[gather[i]] @ w[t]`` for every row i in ``groups[t]`` (``gather`` None:
    ``x[i]``; the Triton kernel follows ``gather`` without copying ``x``)."""
    if gather is not None:
        x = x.index_select(0, gather)
    out = x.new_empty(tuple(x.shape[:-1]) + (w.shape[-1],), dtype=torch.promote_types(x.dtype, w.dtype))
    for t, rows in enumerate(groups):
        if rows.numel():
            out[rows] = x[rows].to(out.dtype) @ w[t].to(out.dtype)
    return out


def _typed_matmul_derivative(b, v, g):
    x, w = v.inputs
    by = v.attrs["by"]
    return [b.add("typed_matmul", g, b.add("transpose", b.fwd(w)), by=by),
            b.add("typed_matmul_tn", b.fwd(x), g, by=by)]


register(OpDef("typed_matmul", Movement.BROADCAST,
               lambda ctx, x, w, by: ctx.grouped_matmul(x, w, ctx.groups(by)),
               residency=_typed_matmul_residency, shape=_typed_matmul_shape, arity=2,
               derivative=_typed_matmul_derivative,
               doc="x @ W[type] per row: W holds one [in, out] matrix per edge type (by='etype') "
                   "or node type (by='srctype'/'dsttype' on edges, 'ntype' on vertices)"))


# --- typed_matmul_tn: the weight gradient -------------------------------------------------
def _typed_matmul_tn_residency(rs, attrs):
    by = attrs["by"]
    _check_type_index(by)
    for r in rs:
        _rows_residency(r, by, "typed_matmul_tn")
    return REDUCE_TO[by]


def _typed_matmul_tn_shape(inputs, attrs, residency):
    x, g = inputs
    if x.shape[:-1] != g.shape[:-1]:
        raise ValueError(f"x {list(x.shape)} and g {list(g.shape)} must agree on all but the last dim")
    return (x.shape[-1], g.shape[-1]), torch.promote_types(x.dtype, g.dtype)


def typed_matmul_tn(x: torch.Tensor, g: torch.Tensor, groups: list[torch.Tensor],
                    gather: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = sum over rows i of type t of outer(x[gather[i]], g[i])`` (``gather`` None:
    ``x[i]``); types without rows get 0."""
    if gather is not None:
        x = x.index_select(0, gather)
    dtype = torch.promote_types(x.dtype, g.dtype)
    out = x.new_zeros((len(groups), x.shape[-1], g.shape[-1]), dtype=dtype)
    for t, rows in enumerate(groups):
        if rows.numel():
            out[t] = row_matrix(x[rows]).transpose(0, 1).to(dtype) @ row_matrix(g[rows]).to(dtype)
    return out


register(OpDef("typed_matmul_tn", Movement.REDUCE,
               lambda ctx, x, g, by: ctx.grouped_matmul_tn(x, g, ctx.groups(by)),
               residency=_typed_matmul_tn_residency, shape=_typed_matmul_tn_shape, arity=2,
               doc="per type, the sum over its rows of outer(x_row, g_row): the weight gradient "
                   "of typed_matmul"))
