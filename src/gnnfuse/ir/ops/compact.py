"""Compact materialization (Hector, ASPLOS '24): ``x[endpoint] @ W[relation]`` per edge,
computed once per (endpoint vertex, relation) pair that has an edge, then gathered.

R-GCN's and HGT's messages multiply an endpoint's row by the edge's relation matrix.
Per edge (``typed_matmul(broadcast(x, by=src), W, by=etype)``) that is |E| row-matrix
products, although every edge of one source vertex and one relation computes the same
row. ``compact_typed_matmul`` computes one product per such *pair* -- P <= min(|E|,
|V| * R) of them, one dense matmul per relation over its pairs -- and gathers each edge's
row from its pair. The backward pass runs on pairs too: a pair's edges' gradients are
summed first (the matmul is linear), so the input gradient is P products, not |E|, and
the weight gradient sums P outer products per relation.

The pairs are a sorted ``unique`` of ``vertex * R + relation`` over the edges. With the
graph's edge types (``compact_typed_matmul``: ``e.src.h @ e.type.W``) they are built once
per graph and endpoint; with a relation read from edge data (``compact_indexed_matmul``:
Graphiler's ``bmm(edges.src['h'].unsqueeze(1), W[edges.data['type']])``, ir/ops/
indexed_matmul.py) once per call, as the data may change between calls -- one sort, as
the per-edge form's grouping already costs. ``side`` names the endpoint (``"src"``:
sources, ``"dst"``: destinations); on a bipartite graph the vertex table is that side's
(ir/sides.py reads ``side``). The per-relation products run through the context's
``grouped_matmul`` like ``typed_matmul``'s (a segment-matmul kernel in the Triton backend).
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from ..registry import OpDef, register
from ..residency import EDGE_ROWED, Movement, Residency
from ...graph.index_cache import _stamp
from .indexing import wrap_index
from .typed import RowGroups, group_rows

SIDES = ("src", "dst")


class RelationPairs(NamedTuple):
    """The (vertex, relation) pairs of one endpoint that have edges."""
    vertex: torch.Tensor               # [P] the pair's vertex
    groups: RowGroups                  # per relation, the ids of its pairs
    of_edge: torch.Tensor              # [E] each edge's pair


def _pairs(endpoint: torch.Tensor, relation: torch.Tensor, count: int) -> RelationPairs:
    unique, of_edge = torch.unique(endpoint * count + relation, return_inverse=True)
    return RelationPairs(unique // count, group_rows(unique % count, count), narrow_index(of_edge, len(unique)))


def narrow_index(index: torch.Tensor, bound: int) -> torch.Tensor:
    """``index`` (entries below ``bound``) as int32 where ``bound`` fits it: the graph keeps
    these [E] tables for its lifetime, and every consumer (``index_select``,
    ``index_add_``, the Triton kernels, which widen each load) reads either width. On
    ogbn-mag-sized R-GCN the int64 edge-to-pair and dense-row tables were 0.5 GB of the
    step's own peak."""
    return index.to(torch.int32) if bound <= torch.iinfo(torch.int32).max else index


def relation_pairs(ctx, side: str) -> RelationPairs:
    """The pairs of endpoint ``side`` and the graph's edge types, built once per graph."""
    return ctx.graph.cached(f"relation_pairs_{side}", lambda graph: _pairs(
        ctx.index(side), ctx.index("etype"), ctx.num_rows("etype")))


def data_pairs(ctx, side: str, idx: torch.Tensor, count: int) -> RelationPairs:
    """The pairs of endpoint ``side`` and the per-edge table index ``idx`` (negative
    entries counted from the end, as torch indexes).

    Building them is a ``unique``, a sort and host reads of the index's range and group
    sizes -- host synchronisations that, per call of every op and its gradients, made
    Graphiler's R-GCN UDF several times slower than the same layer reading the graph's
    edge types. The index is data, but in practice the same tensor every step, so:

    - an index that *is* the graph's edge types (the same memory, read as the same
      int64 vector, over as many relations: the UDF's ``edges.data['type']`` fed the
      graph's ``edge_type``) takes the graph's own pairs, `relation_pairs` -- the graph
      is immutable, so its memory holds those types for as long as it lives;
    - any other index's pairs are remembered on the graph per endpoint and table size
      while the index is the same tensor object in the same state (`index_cache`'s
      stamp: version counter, data pointer, shape, strides; a weak reference, so a new
      tensor at a freed one's address is not taken for it), and rebuilt otherwise. A
      host index must also still hold the contents of a private copy kept with its
      pairs: it is data, which a loader may refill where the version counter does not
      see it (numpy into a ``torch.from_numpy`` buffer, ``.data``), and the next call
      then ran on the old contents' pairs (outputs 51.7 off eager code's on a 30-edge
      graph). On the CPU that comparison is one pass over the ids with no device sync,
      far below the ``unique`` and sort it saves; a GPU index keeps to the stamp alone
      (README).
    """
    if is_edge_types(ctx, idx, count):
        return relation_pairs(ctx, side)
    memo = ctx.graph.cached("data_pairs", lambda graph: {})
    stamp = _stamp([idx])
    entry = memo.get((side, count))
    if (entry is not None and stamp is not None and entry[0]() is idx and entry[1] == stamp
            and (entry[3] is None or torch.equal(idx, entry[3]))):
        return entry[2]
    pairs = _pairs(ctx.index(side), wrap_index(idx.reshape(-1), count), count)
    if stamp is not None:
        held = idx.clone() if idx.device.type == "cpu" else None
        memo[(side, count)] = (weakref.ref(idx), stamp, pairs, held)
    return pairs


def is_edge_types(ctx, idx: torch.Tensor, count: int) -> bool:
    """Whether ``idx`` reads the graph's edge-type memory as the same vector of types."""
    types = ctx.graph.edge_type
    return (types is not None and count == ctx.graph.num_edge_types and idx.dtype == types.dtype
            and idx.device == types.device and idx.shape == types.shape and idx.stride() == types.stride()
            and idx.data_ptr() == types.data_ptr())


def _pair_matmul(ctx, x: torch.Tensor, w: torch.Tensor, pairs: RelationPairs) -> torch.Tensor:
    """Each edge's ``x[vertex] @ w[relation]``, computed per pair."""
    return ctx.gather_rows(ctx.grouped_matmul(x, w, pairs.groups, pairs.vertex), pairs.of_edge)


# The two gradients take the pairs' sums (`_pair_sums`), not the per-edge rows: a caller
# that gathers [E, F] rows only to sum them lets them go before the [P, F] products are
# made, rather than holding them through the call (the backward's peak).
def pair_input_grad(ctx, sums: torch.Tensor, w_t: torch.Tensor, pairs: RelationPairs, rows: int) -> torch.Tensor:
    """Per vertex, the sum over its pairs of the pair's ``sums`` row @ w_t[relation]."""
    return ctx.scatter_rows(ctx.grouped_matmul(sums, w_t, pairs.groups), None, pairs.vertex, None, rows)


def pair_weight_grad(ctx, x: torch.Tensor, sums: torch.Tensor, pairs: RelationPairs) -> torch.Tensor:
    """Per relation, the sum over its pairs of outer(x[vertex], the pair's ``sums`` row)."""
    return ctx.grouped_matmul_tn(x, sums, pairs.groups, pairs.vertex)


def _check_side(attrs) -> str:
    if attrs.get("side") not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {attrs.get('side')!r}")
    return attrs["side"]


def _pair_sums(ctx, g: torch.Tensor, pairs: RelationPairs) -> torch.Tensor:
    """Each pair's rows of per-edge ``g`` summed: the context's row scatter (a Triton
    kernel on the GPU; torch's ``index_add_`` there took 2.2 ms per [21.1M, 16] sum of
    the mag-sized HGT step)."""
    return ctx.scatter_rows(g, None, pairs.of_edge, None, len(pairs.vertex))


def _shared_pair_sums(ctx, g: torch.Tensor, pairs: RelationPairs) -> torch.Tensor:
    """`_pair_sums` of ``g``, computed once per program run for the input and the weight
    gradient of one compact matmul, which both start from it: the [E, F] -> [P, F] sum is
    the largest cost of either (two of 2.8 ms each per HGT key or value on mag-like).
    Kept on the run's context, one entry per set of pairs, weakly keyed on ``g`` (and its
    version, so an in-place edit recomputes): it never holds the per-edge rows alive, and
    a context that outlives a step keeps one [P, F] table per pairs, not one per step."""
    key = ("pair_sums", id(pairs))
    hit = ctx.run_memo.get(key)
    if hit is not None and hit[0]() is g and hit[1] == g._version and hit[2] is pairs:
        return hit[3]
    sums = _pair_sums(ctx, g, pairs)
    ctx.run_memo[key] = (weakref.ref(g), g._version, pairs, sums)
    return sums


def scatter_scaled_rows(table: torch.Tensor, gather: torch.Tensor | None, scatter: torch.Tensor,
                        scale: torch.Tensor | None, rows: int) -> torch.Tensor:
    """``out[scatter[e]] += scale[e] * table[gather[e]]`` over the edges ``e`` (``scale``
    one value per edge, or None; ``gather`` None: row ``e`` itself; ``out`` has ``rows``
    rows): how the typed aggregation and the compact gradients move rows between
    vertices, (vertex, relation) pairs and edges. The contexts' ``scatter_rows``: this
    torch form (a gathered [E, F] table, scaled, then added) in the reference backend,
    one Triton kernel writing nothing per edge in the Triton backend
    (backend/triton/scatter_rows.py)."""
    if gather is None:
        picked = table if scale is None else table * scale.reshape((-1,) + (1,) * (table.dim() - 1)).to(table.dtype)
        return picked.new_zeros((rows,) + tuple(picked.shape[1:])).index_add_(0, scatter, picked)
    picked = table.index_select(0, gather)
    if scale is not None:
        picked.mul_(scale.reshape((-1,) + (1,) * (picked.dim() - 1)).to(picked.dtype))
    return picked.new_zeros((rows,) + tuple(picked.shape[1:])).index_add_(0, scatter, picked)


def _matmul_shape(inputs, attrs):
    x, w = inputs
    if len(w.shape) != 2 or not x.shape or x.shape[-1] != w.shape[0]:
        raise ValueError(f"rows {list(x.shape)} @ one [in, out] matrix per relation {list(w.shape)}")
    return x.shape[:-1] + (w.shape[1],), torch.promote_types(x.dtype, w.dtype)


# --- compact_typed_matmul: x[endpoint] @ W[etype] per edge --------------------------------
def _forward_residency(rs, attrs):
    _check_side(attrs)
    if rs != [Residency.NODE, Residency.EDGE_TYPE]:
        raise ValueError(f"compact_typed_matmul takes a vertex table and a per-relation weight, got "
                         f"{[r.name for r in rs]}")
    return Residency.EDGE


def compact_typed_matmul(ctx, x: torch.Tensor, w: torch.Tensor, side: str) -> torch.Tensor:
    return _pair_matmul(ctx, x, w, relation_pairs(ctx, side))


def _derivative(b, v, g):
    x, w = v.inputs
    side = v.attrs["side"]
    return [b.add("compact_typed_matmul_t", g, b.add("transpose", b.fwd(w)), side=side),
            b.add("compact_typed_matmul_tn", b.fwd(x), g, side=side)]


register(OpDef("compact_typed_matmul", Movement.BROADCAST, compact_typed_matmul,
               residency=_forward_residency, shape=lambda inputs, a, r: _matmul_shape(inputs, a), arity=2,
               derivative=_derivative,
               doc="x[side] @ W[etype] per edge, computed once per (vertex, relation) pair with edges, "
                   "then gathered (compact materialization)"))


# --- compact_typed_matmul_t: the input gradient ------------------------------------------
def _input_grad_residency(rs, attrs):
    _check_side(attrs)
    if rs[0] not in EDGE_ROWED or rs[1] is not Residency.EDGE_TYPE:
        raise ValueError(f"compact_typed_matmul_t takes per-edge rows and a per-relation weight, got "
                         f"{[r.name for r in rs]}")
    return Residency.NODE


def _input_grad(ctx, g: torch.Tensor, w_t: torch.Tensor, side: str) -> torch.Tensor:
    pairs = relation_pairs(ctx, side)
    return pair_input_grad(ctx, _shared_pair_sums(ctx, g, pairs), w_t, pairs, ctx.num_rows(side))


register(OpDef("compact_typed_matmul_t", Movement.REDUCE, _input_grad,
               residency=_input_grad_residency, shape=lambda inputs, a, r: _matmul_shape(inputs, a), arity=2,
               doc="per vertex of side, the sum over its (vertex, relation) pairs of (the pair's edges' g "
                   "summed) @ W^T[relation]: the input gradient of compact_typed_matmul"))


# --- compact_typed_matmul_tn: the weight gradient ----------------------------------------
def _weight_grad_residency(rs, attrs):
    _check_side(attrs)
    if rs[0] is not Residency.NODE or rs[1] not in EDGE_ROWED:
        raise ValueError(f"compact_typed_matmul_tn takes a vertex table and per-edge rows, got "
                         f"{[r.name for r in rs]}")
    return Residency.EDGE_TYPE


def _weight_grad_shape(inputs, attrs, residency):
    x, g = inputs
    if x.shape[:-1] != g.shape[:-1]:
        raise ValueError(f"x {list(x.shape)} and g {list(g.shape)} must agree on all but the last dim")
    return (x.shape[-1], g.shape[-1]), torch.promote_types(x.dtype, g.dtype)


def _weight_grad(ctx, x: torch.Tensor, g: torch.Tensor, side: str) -> torch.Tensor:
    pairs = relation_pairs(ctx, side)
    return pair_weight_grad(ctx, x, _shared_pair_sums(ctx, g, pairs), pairs)


register(OpDef("compact_typed_matmul_tn", Movement.REDUCE, _weight_grad,
               residency=_weight_grad_residency, shape=_weight_grad_shape, arity=2,
               doc="per relation, the sum over its (vertex, relation) pairs of outer(x[vertex], the pair's "
                   "edges' g summed): the weight gradient of compact_typed_matmul"))


# --- compact_indexed_matmul: x[endpoint] @ table[idx] per edge, idx edge data --------------
def _indexed_residency(rs, attrs):
    _check_side(attrs)
    x, table, idx = rs
    if x is not Residency.NODE or table is not Residency.SHARED or idx not in EDGE_ROWED:
        raise ValueError(f"compact_indexed_matmul takes a vertex table, a parameter table and a per-edge index, "
                         f"got {[r.name for r in rs]}")
    return Residency.EDGE


class _PerEntry(NamedTuple):
    """A table entry's shape and dtype, as `_matmul_shape` reads a value's."""
    shape: tuple
    dtype: torch.dtype


def _indexed_shape(inputs, attrs, residency):
    x, table, idx = inputs
    if idx.shape != () or len(table.shape) != 3:
        raise ValueError(f"one index per edge into a [T, in, out] table, got index {list(idx.shape)} into "
                         f"{list(table.shape)}")
    return _matmul_shape([x, _PerEntry(table.shape[1:], table.dtype)], attrs)


def _indexed_derivative(b, v, g):
    x, table, idx = v.inputs
    side, rows = v.attrs["side"], b.fwd(idx)
    return [b.add("compact_indexed_matmul_t", g, b.add("transpose", b.fwd(table)), rows, side=side),
            b.add("compact_indexed_matmul_tn", b.fwd(x), g, rows, side=side, count=table.shape[0]), None]


register(OpDef("compact_indexed_matmul", Movement.BROADCAST,
               lambda ctx, x, table, idx, side: _pair_matmul(ctx, x, table, data_pairs(ctx, side, idx, table.shape[0])),
               residency=_indexed_residency, shape=_indexed_shape, arity=3, derivative=_indexed_derivative,
               doc="x[side] @ table[idx] per edge (idx edge data), computed once per (vertex, index) pair, "
                   "then gathered (compact materialization)"))


def _indexed_input_grad_residency(rs, attrs):
    _check_side(attrs)
    if rs[0] not in EDGE_ROWED or rs[1] is not Residency.SHARED or rs[2] not in EDGE_ROWED:
        raise ValueError(f"compact_indexed_matmul_t takes per-edge rows, a parameter table and a per-edge index, "
                         f"got {[r.name for r in rs]}")
    return Residency.NODE


def _indexed_input_grad(ctx, g: torch.Tensor, table_t: torch.Tensor, idx: torch.Tensor, side: str) -> torch.Tensor:
    pairs = data_pairs(ctx, side, idx, table_t.shape[0])
    return pair_input_grad(ctx, _shared_pair_sums(ctx, g, pairs), table_t, pairs, ctx.num_rows(side))


register(OpDef("compact_indexed_matmul_t", Movement.REDUCE,
               lambda ctx, g, table_t, idx, side: _indexed_input_grad(ctx, g, table_t, idx, side),
               residency=_indexed_input_grad_residency, shape=_indexed_shape, arity=3,
               doc="the input gradient of compact_indexed_matmul, per (vertex, index) pair"))


def _indexed_weight_grad_residency(rs, attrs):
    _check_side(attrs)
    if rs[0] is not Residency.NODE or rs[1] not in EDGE_ROWED or rs[2] not in EDGE_ROWED:
        raise ValueError(f"compact_indexed_matmul_tn takes a vertex table, per-edge rows and a per-edge index, "
                         f"got {[r.name for r in rs]}")
    return Residency.SHARED


def _indexed_weight_grad_shape(inputs, attrs, residency):
    x, g, _ = inputs
    return (attrs["count"],) + _weight_grad_shape([x, g], attrs, residency)[0], torch.promote_types(x.dtype, g.dtype)


def _indexed_weight_grad(ctx, x: torch.Tensor, g: torch.Tensor, idx: torch.Tensor, side: str,
                         count: int) -> torch.Tensor:
    pairs = data_pairs(ctx, side, idx, count)
    return pair_weight_grad(ctx, x, _shared_pair_sums(ctx, g, pairs), pairs)


register(OpDef("compact_indexed_matmul_tn", Movement.REDUCE,
               lambda ctx, x, g, idx, side, count: _indexed_weight_grad(ctx, x, g, idx, side, count),
               residency=_indexed_weight_grad_residency, shape=_indexed_weight_grad_shape, arity=3,
               doc="the table gradient of compact_indexed_matmul, per (vertex, index) pair"))
