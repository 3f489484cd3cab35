"""A relation-typed linear aggregation, ``out[v] = sum over edges e into v of s_e *
(x[u_e] @ W[relation_e])``, run in whichever order moves fewer bytes on the graph at hand.

R-GCN's message is a typed linear transform of the gathered endpoint, scaled by at most a
scalar per edge (its per-relation mean is the scale ``1 / |N_r(v)|``), and summed. The
sum commutes with each ``W_r``, so there are two orders (Hector's linear-operator
reordering, ASPLOS '24; the hetero counterpart of dynamic kernel placement, nn/
placement.py):

- ``before`` (transform, then aggregate): one product per (source, relation) pair that has
  edges -- compact materialization, ir/ops/compact.py -- gathered onto the edges, scaled
  and summed per destination. The rows gathered per edge are ``out`` wide.
- ``after`` (aggregate, then transform): Seastar's hierarchical aggregation (§6.3.5). The
  raw scaled source rows are summed per (destination, relation) pair, each partial is
  multiplied by its ``W_r`` once, and the partials are summed across relations. The rows
  gathered per edge are ``in`` wide.
- ``dense`` (aggregate, then transform, with few relations): the scaled source rows are
  summed into a dense [destinations, relations x in] table -- a zero block where a
  destination has no edge of a relation -- and one GEMM with the stacked ``W_r`` gives
  the output. With a handful of relations (ogbn-mag's 4) and a wide output that skips
  ``after``'s [pairs, out] products and their atomic sum across relations (R-GCN's
  16 -> 349 layer on mag-like wrote 2.1 GB of them); with hundreds (AM's 266) the table
  is larger than the pairs, and the byte model keeps ``after``.

Either way the edge stage -- gather a row per edge, scale it, add it into its vertex or
pair -- is the context's ``scatter_rows``: one kernel that writes nothing per edge in the
Triton backend (backend/triton/scatter_rows.py), a gathered [E, F] table in the reference
backend's torch form.

Programs are compiled once and run on many graphs, and the pair counts the choice depends
on are properties of the graph (or, for a relation read from edge data, of that data), so
the op decides at run time with `choose_order`'s byte model and records the choice on the
graph for `gnnfuse.explain`. ``GNNFUSE_TYPED_ORDER=before|after|dense`` forces one order (the
result is the same up to rounding; tests compare them).

``by`` names the aggregated endpoint (``"dst"``: sum over in-edges); ``x`` is a table of
the other endpoint. The relation is the graph's edge type when ``W`` is per-edge-type data
(EDGE_TYPE, [in, out] per relation), or a per-edge index operand into a [T, in, out]
parameter table (Graphiler's ``W[edges.data['type']]``). ``scaled`` says whether a per-edge
scalar operand ``s`` follows ``W``. Operands: ``x, W[, s][, idx]``.

The gradients are the same aggregation again: the input gradient sums ``s_e * g[v_e] @
W_r^T`` over each source's out-edges (``typed_aggregate`` by the other endpoint, which
picks its own order), the weight gradient ``typed_aggregate_tn`` sums ``s_e *
outer(x[u_e], g[v_e])`` per relation through either endpoint's pairs, and the scale's
gradient is the per-edge dot of the message and the gathered output gradient. All are
torch ops calling into the context's kernels (``grouped_matmul``, ``scatter_rows``), like
the compact ops.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from ..registry import OpDef, register
from ..residency import EDGE_ROWED, Movement, Residency
from .compact import data_pairs, is_edge_types, narrow_index, pair_input_grad, pair_weight_grad, relation_pairs
from .dense import row_matrix
from ...environ import getenv

ORDERS = ("before", "after", "dense")
ORDER_ENV = "GNNFUSE_TYPED_ORDER"
OTHER_SIDE = {"src": "dst", "dst": "src"}


class OrderCost(NamedTuple):
    """What one order reads and writes (bytes, every stage counted) and computes (flops)."""
    reads: int
    writes: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.reads + self.writes


class OrderChoice(NamedTuple):
    """The choice `choose_order` made for one op on one graph, with what it was made from."""
    op: str
    order: str
    forced: bool
    edges: int
    gathered_pairs: int        # (vertex, relation) pairs of the gathered endpoint
    aggregated_pairs: int      # (vertex, relation) pairs of the aggregated endpoint
    width_in: int
    width_out: int
    costs: dict[str, OrderCost]

    def describe(self) -> str:
        how = f"forced by {ORDER_ENV}" if self.forced else "fewer bytes"
        costs = ", ".join(f"{order} {c.bytes:,} B / {c.flops:,} flops" for order, c in self.costs.items())
        what = ("aggregate into a dense (vertex, relation) table, then one GEMM" if self.order == "dense"
                else f"transform {self.order} aggregation")
        return (f"typed linear order: {what} ({how}); in={self.width_in} "
                f"out={self.width_out}, E={self.edges:,}, pairs gathered={self.gathered_pairs:,} "
                f"aggregated={self.aggregated_pairs:,}; {costs}")


def order_costs(edges: int, gathered_pairs: int, aggregated_pairs: int, rows_out: int, width_in: int,
                width_out: int, element_size: int, weight_grad: bool = False, rows_by: int | None = None,
                relations: int | None = None) -> dict[str, OrderCost]:
    """The byte model of the orders, counting each stage's reads and writes once.

    The edge stage is one row scatter (the context's ``scatter_rows``: a kernel in the
    Triton backend) that gathers E rows, reads E scales and adds the scaled rows into
    their targets, writing nothing per edge. ``before``: the matmul reads P_g rows of
    ``in`` and writes P_g of ``out``; the edge stage gathers E pair rows of ``out`` into
    the output. ``after``: the edge stage gathers E rows of ``in`` into P_a partials; the
    matmul reads those and writes P_a rows of ``out``; the sum across relations reads them
    and writes the output. The weight gradient (``weight_grad``) has the same stages with
    the other operand's rows per edge, and writes one [in, out] matrix per relation
    (``rows_out`` of them) whichever order runs. ``dense`` (costed when ``rows_by``, the
    aggregated side's vertex count, and ``relations`` are given): the edge stage gathers
    E rows of ``in`` into the [rows_by, relations x in] table; one GEMM reads it (and, for
    the weight gradient, the rows_by output-gradient rows) and writes the output.
    """
    n_out = rows_out * (width_in * width_out if weight_grad else width_out)
    p_g, p_a, e = gathered_pairs, aggregated_pairs, edges
    before = OrderCost(element_size * (p_g * width_in + e * width_out + e),
                       element_size * (p_g * width_out + n_out),
                       2 * p_g * width_in * width_out + 2 * e * width_out)
    after = OrderCost(element_size * (e * width_in + e + p_a * (width_in + width_out)),
                      element_size * (p_a * (width_in + width_out) + n_out),
                      2 * p_a * width_in * width_out + 2 * e * width_in)
    costs = {"before": before, "after": after}
    if rows_by is not None and relations is not None:
        table = rows_by * relations * width_in
        costs["dense"] = OrderCost(element_size * (e * width_in + e + table + (rows_by * width_out if weight_grad else 0)),
                                   element_size * (table + n_out),
                                   2 * table * width_out + 2 * e * width_in)
    return costs


def forced_order() -> str | None:
    """The order ``GNNFUSE_TYPED_ORDER`` forces, or None (the byte model decides)."""
    order = getenv(ORDER_ENV) or None
    if order is not None and order not in ORDERS:
        raise ValueError(f"{ORDER_ENV} must be one of {ORDERS}, got {order!r}")
    return order


def choose_order(op: str, edges: int, gathered_pairs: int, aggregated_pairs: int, rows_out: int, width_in: int,
                 width_out: int, element_size: int, weight_grad: bool = False, rows_by: int | None = None,
                 relations: int | None = None) -> OrderChoice:
    """The order with fewer bytes (then fewer flops; ``before`` on a tie), unless forced;
    ``dense`` is a candidate when ``rows_by`` and ``relations`` are given. Every call of a
    typed aggregation asks, with the same sizes step after step: the answer is remembered
    (a pure function of its arguments and the forced order)."""
    return _choose(op, edges, gathered_pairs, aggregated_pairs, rows_out, width_in, width_out, element_size,
                   weight_grad, rows_by, relations, forced_order())


@functools.lru_cache(maxsize=256)
def _choose(op: str, edges: int, gathered_pairs: int, aggregated_pairs: int, rows_out: int, width_in: int,
            width_out: int, element_size: int, weight_grad: bool, rows_by: int | None, relations: int | None,
            forced: str | None) -> OrderChoice:
    costs = order_costs(edges, gathered_pairs, aggregated_pairs, rows_out, width_in, width_out, element_size,
                        weight_grad, rows_by, relations)
    if forced is not None and forced not in costs:
        raise ValueError(f"{ORDER_ENV}={forced} needs the aggregated side's vertex count and the relation count")
    order = forced or min(costs, key=lambda o: (costs[o].bytes, costs[o].flops))
    return OrderChoice(op, order, forced is not None, edges, gathered_pairs, aggregated_pairs, width_in, width_out,
                       costs)


def recorded_choices(graph) -> dict[tuple, OrderChoice]:
    """The choices the ops made on ``graph``, by (op, by, in, out), latest last: what
    `gnnfuse.explain` reports."""
    return graph.cached("typed_aggregate_choices", lambda g: {})


def choice_key(op: str, by: str, width_in: int, width_out: int) -> tuple:
    return op, by, width_in, width_out


def _operands(rest: tuple, scaled: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(s, idx)`` from the operands after ``x`` and ``W`` (or ``x`` and ``g``)."""
    s = rest[0] if scaled else None
    idx = rest[1 if scaled else 0] if len(rest) > int(scaled) else None
    return s, idx


def _pairs_of(ctx, side: str, idx: torch.Tensor | None, count: int):
    return relation_pairs(ctx, side) if idx is None else data_pairs(ctx, side, idx, count)


def _pair_rows(ctx, table: torch.Tensor, side: str, s: torch.Tensor | None, pairs) -> torch.Tensor:
    """Per pair of ``pairs``, the sum over its edges of ``s_e * table[endpoint side of e]``:
    the context's row scatter (one kernel in the Triton backend), no [E, F] table kept."""
    return ctx.scatter_rows(table, ctx.index(side), pairs.of_edge, s, len(pairs.vertex))


def _dense_rows(ctx, table: torch.Tensor, side: str, s: torch.Tensor | None, by: str, idx: torch.Tensor | None,
                count: int) -> torch.Tensor:
    """[rows of ``by``, count x in]: per vertex of side ``by`` and relation r, the sum over
    its relation-r edges of ``s_e * table[endpoint side of e]`` in columns r*in..(r+1)*in
    (the ``dense`` order's table; zeros where a vertex has no edge of r)."""
    rows = ctx.num_rows(by)
    if idx is None or is_edge_types(ctx, idx, count):
        target = ctx.graph.cached(f"dense_relation_rows_{by}_{count}",
                                  lambda graph: narrow_index(ctx.index(by) * count + ctx.index("etype"), rows * count))
    else:   # `_decide` built this index's pairs first, which range-checked it (`data_pairs`)
        flat = idx.reshape(-1)
        target = ctx.index(by) * count + torch.where(flat < 0, flat + count, flat)
    return ctx.scatter_rows(table, ctx.index(side), target, s, rows * count).reshape(rows, count * table.shape[-1])


def _without_absent_relations(w: torch.Tensor, pairs) -> torch.Tensor:
    """``w`` with the matrices of relations that no edge has set to 0 (``pairs``' host
    group sizes say which). The dense order multiplies their all-zero table blocks by
    them, and 0 * NaN is NaN: a NaN or inf in a weight-table row no edge reads (spare rows
    of a table sized for more relations) made every output NaN, where the pair orders and
    eager torch never read that row. Filled run by run, from the host's counts: an index
    tensor would be a host-to-device copy, which a captured step cannot hold."""
    counts = pairs.groups.counts
    if all(counts):
        return w
    w = w.clone()
    start = None
    for r, count in enumerate([*counts, 1]):
        if count == 0 and start is None:
            start = r
        elif count and start is not None:
            w[start:r] = 0
            start = None
    return w


def _rows_with_edges(ctx, g: torch.Tensor, by: str) -> torch.Tensor:
    """``g`` with the rows of vertices that have no edge by ``by`` (degree 0, the graph's
    cached count) set to 0. The dense weight gradient multiplies their all-zero table rows
    by ``g``'s rows, and 0 * NaN is NaN: a loss not differentiable at a zero output row
    (its length, ``sqrt(sum(out ** 2))``) sends NaN back on those rows, which the pair
    orders and eager torch never read; the dense order made the whole weight gradient NaN."""
    return torch.where((ctx.degree(by) > 0).unsqueeze(-1), g, 0)


def _decide(ctx, op: str, by: str, idx, count: int, width_in: int, width_out: int, dtype: torch.dtype,
            rows_out: int, weight_grad: bool = False):
    gather = OTHER_SIDE[by]
    pairs = {side: _pairs_of(ctx, side, idx, count) for side in (gather, by)}
    choice = choose_order(op, ctx.num_edges, len(pairs[gather].vertex), len(pairs[by].vertex), rows_out,
                          width_in, width_out, dtype.itemsize, weight_grad, rows_by=ctx.num_rows(by),
                          relations=count)
    recorded_choices(ctx.graph)[choice_key(op, by, width_in, width_out)] = choice
    return choice.order, pairs[gather], pairs[by]


# --- typed_aggregate ------------------------------------------------------------------------
def _aggregate(ctx, x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor, by: str, scaled: bool) -> torch.Tensor:
    return _typed_sum(ctx, x, w, rest, by, scaled)


def _typed_sum(ctx, x: torch.Tensor, w: torch.Tensor, rest: tuple, by: str, scaled: bool,
               root: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
    """typed_aggregate's sum in the order the byte model picks, plus ``root`` =
    ``(x_root, W_root, bias or None)``'s ``x_root @ W_root + bias`` when given (see
    ``typed_aggregate_rooted``)."""
    s, idx = _operands(rest, scaled)
    gather, rows = OTHER_SIDE[by], ctx.num_rows(by)
    dtype = torch.promote_types(x.dtype, w.dtype)
    order, gathered, aggregated = _decide(ctx, "typed_aggregate", by, idx, w.shape[0], w.shape[-2], w.shape[-1],
                                          dtype, rows)
    if order == "dense":      # one GEMM: [rows, R x in] @ the relations' matrices stacked
        table = _dense_rows(ctx, x, gather, s, by, idx, w.shape[0]).to(dtype)
        weights = row_matrix(_without_absent_relations(w, gathered)).to(dtype)
        if root is None:
            return table @ weights
        # the root's product added into the output in place (the bias the first GEMM's
        # epilogue): a [rows, R x in + in] copy of the table with the root's columns
        # appended was the forward's largest temporary after the output
        x_root, w_root, bias = root
        out = table @ weights if bias is None else torch.addmm(bias.to(dtype), table, weights)
        del table
        return out.addmm_(x_root.to(dtype), w_root.to(dtype))
    if order == "before":     # one product per gathered pair, each edge's scaled into its vertex
        products = ctx.grouped_matmul(x, w, gathered.groups, gathered.vertex)
        out = ctx.scatter_rows(products, gathered.of_edge, ctx.index(by), s, rows)
    else:
        out = pair_input_grad(ctx, _pair_rows(ctx, x, gather, s, aggregated), w, aggregated, rows)
    if root is None:
        return out
    x_root, w_root, bias = root
    out = torch.addmm(out.to(dtype), x_root.to(dtype), w_root.to(dtype))
    return out if bias is None else out.add_(bias)


def _check(rs: list[Residency], attrs: dict, what: str) -> None:
    if attrs.get("by") not in OTHER_SIDE:
        raise ValueError(f"{what} aggregates by one endpoint, 'src' or 'dst', got {attrs.get('by')!r}")
    rest = rs[2:]
    s, idx = _operands(tuple(rest), attrs["scaled"])
    if s is not None and s not in EDGE_ROWED:
        raise ValueError(f"{what}'s scale is one value per edge, got {s.name}")
    if idx is not None and idx not in EDGE_ROWED:
        raise ValueError(f"{what}'s relation index is one value per edge, got {idx.name}")
    if len(rest) > int(attrs["scaled"]) + 1:
        raise ValueError(f"{what} takes at most a scale and a relation index after its two operands")


def _aggregate_residency(rs, attrs):
    _check(rs, attrs, "typed_aggregate")
    indexed = len(rs) > 2 + int(attrs["scaled"])
    if rs[0] is not Residency.NODE or rs[1] is not (Residency.SHARED if indexed else Residency.EDGE_TYPE):
        raise ValueError(f"typed_aggregate takes a vertex table and a per-relation weight (EDGE_TYPE, or a "
                         f"parameter table with a per-edge index), got {[r.name for r in rs]}")
    return Residency.NODE


def _aggregate_shape(inputs, attrs, residency):
    x, w = inputs[0], inputs[1]
    matrix = w.shape[-2:] if len(w.shape) == 3 else w.shape
    if len(x.shape) != 1 or len(matrix) != 2 or x.shape[0] != matrix[0] or (len(w.shape) == 3) != (
            len(inputs) > 2 + int(attrs["scaled"])):
        raise ValueError(f"rows [in] @ one [in, out] matrix per relation, got {list(x.shape)} @ {list(w.shape)}")
    for s in inputs[2:]:
        if math.prod(s.shape) != 1:
            raise ValueError(f"the scale and relation index hold one scalar per edge, got {list(s.shape)}")
    return (matrix[1],), torch.promote_types(x.dtype, w.dtype)


def _aggregate_derivative(b, v, g):
    x, w, *rest = v.inputs
    return _typed_sum_grads(b, x, w, rest, v.attrs["by"], v.attrs["scaled"], g)


def _typed_sum_grads(b, x, w, rest: list, by: str, scaled: bool, g) -> list:
    s, idx = _operands(tuple(rest), scaled)
    extra = [b.fwd(t) for t in rest]
    grad_x = b.add("typed_aggregate", g, b.add("transpose", b.fwd(w)), *extra, by=OTHER_SIDE[by], scaled=scaled)
    grad_w = b.add("typed_aggregate_tn", b.fwd(x), g, *extra, by=by, scaled=scaled,
                   count=w.shape[0] if idx is not None else None)
    grads = [grad_x, grad_w]
    if scaled:   # d out / d s_e = (x[u_e] @ W_r) . g[v_e]; summed to s's shape by autodiff
        side = OTHER_SIDE[by]
        message = (b.add("compact_typed_matmul", b.fwd(x), b.fwd(w), side=side) if idx is None else
                   b.add("compact_indexed_matmul", b.fwd(x), b.fwd(w), b.fwd(idx), side=side))
        grads.append(b.add("mul", message, b.add("broadcast", g, by=by)))
    return grads + ([None] if idx is not None else [])


register(OpDef("typed_aggregate", Movement.REDUCE, _aggregate, residency=_aggregate_residency,
               shape=_aggregate_shape, derivative=_aggregate_derivative,
               doc="per vertex of side by, the sum over its edges of s_e * x[other endpoint] @ W[relation], "
                   "transformed before or after aggregation by the byte model (linear-operator reordering)"))


# --- typed_aggregate_rooted: with the root term and the bias -------------------------------------
def _rooted_parts(operands: tuple, biased: bool) -> tuple[tuple, tuple]:
    """``((x_root, W_root, bias or None), (x, W, *rest))`` from the op's operands."""
    k = 3 if biased else 2
    return (operands[0], operands[1], operands[2] if biased else None), tuple(operands[k:])


def _rooted(ctx, *operands: torch.Tensor, by: str, scaled: bool, biased: bool) -> torch.Tensor:
    root, (x, w, *rest) = _rooted_parts(operands, biased)
    return _typed_sum(ctx, x, w, tuple(rest), by, scaled, root)


def _rooted_residency(rs, attrs):
    (x_root, w_root, bias), aggregated = _rooted_parts(tuple(rs), attrs["biased"])
    if x_root is not Residency.NODE or w_root is not Residency.SHARED or bias not in (None, Residency.SHARED):
        raise ValueError(f"typed_aggregate_rooted's root term is a vertex table times a parameter (plus a "
                         f"parameter bias), got {[r.name for r in rs]}")
    return _aggregate_residency(list(aggregated), attrs)


def _rooted_shape(inputs, attrs, residency):
    (x_root, w_root, bias), aggregated = _rooted_parts(tuple(inputs), attrs["biased"])
    shape, dtype = _aggregate_shape(list(aggregated), attrs, residency)
    if tuple(w_root.shape) != (x_root.shape[-1],) + shape or len(x_root.shape) != 1 or (
            bias is not None and tuple(bias.shape) != shape):
        raise ValueError(f"the root term is rows [in] @ [in, {shape[0]}] (+ a [{shape[0]}] bias), got "
                         f"{list(x_root.shape)} @ {list(w_root.shape)}"
                         + (f" + {list(bias.shape)}" if bias is not None else ""))
    return shape, dtype


def _rooted_derivative(b, v, g):
    (x_root, w_root, bias), (x, w, *rest) = _rooted_parts(tuple(v.inputs), v.attrs["biased"])
    grads = [b.add("matmul", g, b.add("transpose", b.fwd(w_root))), b.add("matmul_tn", b.fwd(x_root), g)]
    if bias is not None:
        grads.append(g)           # summed over the rows to the bias's shape by autodiff
    return grads + _typed_sum_grads(b, x, w, rest, v.attrs["by"], v.attrs["scaled"], g)


register(OpDef("typed_aggregate_rooted", Movement.REDUCE, _rooted, residency=_rooted_residency,
               shape=_rooted_shape, derivative=_rooted_derivative,
               doc="typed_aggregate(x, W, ...) + x_root @ W_root (+ bias): R-GCN's self-connection as one more "
                   "block of the dense order's GEMM, the bias its epilogue (passes/typed_root.py); operands "
                   "x_root, W_root[, bias], then typed_aggregate's"))


# --- typed_aggregate_tn: the weight gradient ----------------------------------------------------
def _weight_grad(ctx, x: torch.Tensor, g: torch.Tensor, *rest: torch.Tensor, by: str, scaled: bool,
                 count: int | None) -> torch.Tensor:
    s, idx = _operands(rest, scaled)
    gather = OTHER_SIDE[by]
    count = count if idx is not None else ctx.num_rows("etype")
    order, gathered, aggregated = _decide(ctx, "typed_aggregate_tn", by, idx, count, x.shape[-1], g.shape[-1],
                                          torch.promote_types(x.dtype, g.dtype), count, weight_grad=True)
    if order == "before":
        return pair_weight_grad(ctx, x, _pair_rows(ctx, g, by, s, gathered), gathered)
    if order == "dense":      # per relation r, table[:, r]^T @ g: one GEMM over the stacked blocks
        dtype = torch.promote_types(x.dtype, g.dtype)
        table = _dense_rows(ctx, x, gather, s, by, idx, count)
        g = _rows_with_edges(ctx, g, by)
        return (table.to(dtype).t() @ g.to(dtype)).reshape(count, x.shape[-1], g.shape[-1])
    return pair_weight_grad(ctx, g, _pair_rows(ctx, x, gather, s, aggregated), aggregated).transpose(-1, -2)


def _weight_grad_residency(rs, attrs):
    _check(rs, attrs, "typed_aggregate_tn")
    if rs[0] is not Residency.NODE or rs[1] is not Residency.NODE:
        raise ValueError(f"typed_aggregate_tn takes two vertex tables, got {[r.name for r in rs]}")
    return Residency.SHARED if len(rs) > 2 + int(attrs["scaled"]) else Residency.EDGE_TYPE


def _weight_grad_shape(inputs, attrs, residency):
    x, g = inputs[0], inputs[1]
    matrix = (x.shape[-1], g.shape[-1])
    dtype = torch.promote_types(x.dtype, g.dtype)
    return ((attrs["count"],) + matrix if residency is Residency.SHARED else matrix), dtype


register(OpDef("typed_aggregate_tn", Movement.REDUCE, _weight_grad, residency=_weight_grad_residency,
               shape=_weight_grad_shape,
               doc="per relation, the sum over its edges of s_e * outer(x[other endpoint], g[by]): the weight "
                   "gradient of typed_aggregate, through either endpoint's (vertex, relation) pairs"))


def recorded_choice(graph, value) -> OrderChoice | None:
    """The order the op behind ``value`` (a ``typed_aggregate`` or ``typed_aggregate_tn``)
    last chose on ``graph``, or None if it has not run there or ``value`` is another op."""
    if value.op == "typed_aggregate_rooted":     # it decides as the typed_aggregate it folds
        x = _rooted_parts(tuple(value.inputs), value.attrs["biased"])[1][0]
        key = choice_key("typed_aggregate", value.attrs["by"], x.shape[-1], value.shape[-1])
        return recorded_choices(graph).get(key)
    if value.op not in ("typed_aggregate", "typed_aggregate_tn"):
        return None
    width_out = value.shape[-1] if value.op == "typed_aggregate" else value.inputs[1].shape[-1]
    key = choice_key(value.op, value.attrs["by"], value.inputs[0].shape[-1], width_out)
    return recorded_choices(graph).get(key)
