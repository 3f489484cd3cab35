"""Ops that move data across the row dimension: Broadcast, Reduce and Norm.

``by`` names the index that connects edges to rows: ``"src"``/``"dst"`` (vertex ids of
each edge's endpoints) or ``"etype"`` (each edge's type id). Empty groups reduce to 0,
as PyG's scatter does, so isolated vertices get zeros, never NaN or -inf.
"""
from __future__ import annotations

import torch

from ..errors import CompileError
from ..registry import OpDef, register
from ..residency import EDGE_ROWED, Movement, Residency

_BROADCAST_FROM = {"src": Residency.NODE, "dst": Residency.NODE, "etype": Residency.EDGE_TYPE}
_BROADCAST_TO = {"src": Residency.SRC, "dst": Residency.DST, "etype": Residency.EDGE}
_REDUCE_TO = {"src": Residency.NODE, "dst": Residency.NODE, "etype": Residency.EDGE_TYPE}
REDUCERS = ("sum", "mean", "max", "min")


def _same_shape(inputs, attrs, residency):
    return inputs[0].shape, inputs[0].dtype


def _check_by(attrs: dict) -> str:
    by = attrs["by"]
    if by not in _BROADCAST_FROM:
        raise ValueError(f"by must be one of {sorted(_BROADCAST_FROM)}, got {by!r}")
    return by


# --- broadcast --------------------------------------------------------------------------
def _broadcast_residency(rs, attrs):
    by = _check_by(attrs)
    if rs[0] is not _BROADCAST_FROM[by]:
        raise ValueError(f"broadcast by {by} takes {_BROADCAST_FROM[by].name} data, got {rs[0].name}")
    return _BROADCAST_TO[by]


register(OpDef("broadcast", Movement.BROADCAST,
               lambda ctx, x, by: x.index_select(0, ctx.index(by)),
               residency=_broadcast_residency, shape=_same_shape, arity=1,
               derivative=lambda b, v, g: [b.add("reduce", g, op="sum", by=v.attrs["by"])],
               doc="gather vertex (or type) rows onto edges through src, dst or etype"))


# --- reduce ---------------------------------------------------------------------------
def _reduce_residency(rs, attrs):
    by = _check_by(attrs)
    if attrs["op"] not in REDUCERS:
        raise ValueError(f"reduce op must be one of {REDUCERS}, got {attrs['op']!r}")
    if rs[0] not in EDGE_ROWED:
        raise ValueError(f"reduce takes edge data (SRC, DST or EDGE), got {rs[0].name}")
    return _REDUCE_TO[by]


def reduce_rows(x: torch.Tensor, index: torch.Tensor, rows: int, op: str) -> torch.Tensor:
    out = x.new_zeros((rows,) + tuple(x.shape[1:]))
    if op == "sum":
        return out.index_add_(0, index, x)
    expanded = index.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    return out.scatter_reduce_(0, expanded, x, reduce={"mean": "mean", "max": "amax", "min": "amin"}[op],
                               include_self=False)


def _reduce_derivative(b, v, g):
    by, op = v.attrs["by"], v.attrs["op"]
    if op == "sum":
        return [b.add("broadcast", g, by=by)]
    if op == "mean":
        count = b.add("clamp_min", b.add("degree", by=by, dtype=g.dtype), min=1.0)
        return [b.add("broadcast", b.add("div", g, count), by=by)]
    # max / min: the gradient goes to the arg-extreme edges, split evenly among ties.
    x = b.fwd(v.inputs[0])
    hit = b.add("eq", x, b.add("broadcast", b.fwd(v), by=by))
    ties = b.add("clamp_min", b.add("reduce", hit, op="sum", by=by), min=1.0)
    return [b.add("mul", b.add("broadcast", b.add("div", g, ties), by=by), hit)]


register(OpDef("reduce", Movement.REDUCE,
               lambda ctx, x, op, by: reduce_rows(x, ctx.index(by), ctx.num_rows(by), op),
               residency=_reduce_residency, shape=_same_shape, arity=1,
               derivative=_reduce_derivative,
               doc="aggregate edge rows into vertex (or type) rows with sum, mean, max or min"))

# --- norm -----------------------------------------------------------------------------


def edge_softmax(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    peak = reduce_rows(x, index, rows, "max").index_select(0, index)
    e = torch.exp(x - peak)
    return e / reduce_rows(e, index, rows, "sum").index_select(0, index)


def _softmax_residency(rs, attrs):
    _check_by(attrs)
    if rs[0] not in EDGE_ROWED:
        raise ValueError(f"edge_softmax takes edge data, got {rs[0].name}")
    return Residency.EDGE


def _softmax_derivative(b, v, g):
    y = b.fwd(v)
    gy = b.add("mul", g, y)
    total = b.add("broadcast", b.add("reduce", gy, op="sum", by=v.attrs["by"]), by=v.attrs["by"])
    return [b.add("sub", gy, b.add("mul", y, total))]


register(OpDef("edge_softmax", Movement.NORM,
               lambda ctx, x, by: edge_softmax(x, ctx.index(by), ctx.num_rows(by)),
               residency=_softmax_residency, shape=_same_shape, arity=1,
               derivative=_softmax_derivative,
               doc="softmax over each destination's in-edges (by='dst')"))


# --- graph-derived values -------------------------------------------------------------
def _degree_residency(rs, attrs):
    if attrs["by"] not in ("src", "dst"):
        raise CompileError(f"degree is counted by 'src' or 'dst', got {attrs['by']!r}")
    return Residency.NODE


register(OpDef("degree", Movement.REDUCE, lambda ctx, by, dtype: ctx.degree(by).to(dtype),
               residency=_degree_residency, shape=lambda inputs, a, r: ((), a["dtype"]), arity=0,
               doc="in-degree (by='dst') or out-degree (by='src') of every vertex"))
