"""Pairwise terms over a destination's in-edges (Graphiler's C-GAT reduce).

A DGL reduce UDF can compare every pair of a vertex's messages:
``mailbox['e'].unsqueeze(1) - mailbox['e'].unsqueeze(2)`` is a [N, D, D, ...] tensor per
destination. Its rows live on the ``PAIR`` residency: one row per ordered pair ``(i, j)``
of in-edges of one destination, ``i == j`` included, as in DGL's dense mailbox.

* ``pair_broadcast(x, by)`` reads edge data onto pairs through the pair's edge ``i``
  (user axis 1 of the [N, D, D] tensor) or ``j`` (user axis 2);
* ``pair_reduce(x, op, by)`` aggregates the pairs that share edge ``by`` back into that
  edge's row: ``by='j'`` reduces over axis 1, ``by='i'`` over axis 2.

They are each other's derivative, like broadcast and reduce. A pairwise term costs
``sum_v deg(v)^2`` rows, so ``hinge_sum`` covers C-GAT's own form,
``w_e = sum_t max(0, x_e - x_t)`` over the in-edges ``t`` of ``e``'s destination, by
sorting each destination's scores (O(E log E) instead of O(sum deg^2));
``passes.pairwise`` rewrites the pairwise form into it.
"""
from __future__ import annotations

import math

import torch

from ..registry import OpDef, register
from ..residency import EDGE_ROWED, Movement, Residency
from .movement import REDUCERS, reduce_rows

PAIR_SIDES = ("i", "j")


def in_edge_pairs(dst: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Edge ids ``(i, j)`` of every ordered pair of edges with the same destination,
    ``i == j`` included: ``sum_v deg(v)^2`` pairs, grouped by destination, then by ``i``."""
    order = torch.sort(dst, stable=True).indices
    counts = torch.bincount(dst, minlength=num_nodes)
    starts = torch.cumsum(counts, 0) - counts
    group = dst[order]
    degree, start = counts[group], starts[group]                 # per sorted position
    position = torch.arange(len(order), device=dst.device)
    first = torch.repeat_interleave(position, degree)            # sorted position of i, per pair
    block = torch.cumsum(degree, 0) - degree                     # where i's block of pairs begins
    offset = torch.arange(len(first), device=dst.device) - torch.repeat_interleave(block, degree)
    return order[first], order[start[first] + offset]


def _same_shape(inputs, attrs, residency):
    return inputs[0].shape, inputs[0].dtype


def _check_side(attrs: dict) -> str:
    if attrs["by"] not in PAIR_SIDES:
        raise ValueError(f"a pair is read through its edge 'i' or 'j', got by={attrs['by']!r}")
    return attrs["by"]


# --- pair_broadcast -------------------------------------------------------------------
def _pair_broadcast_residency(rs, attrs):
    _check_side(attrs)
    if rs[0] not in EDGE_ROWED:
        raise ValueError(f"pair_broadcast takes edge data (SRC, DST or EDGE), got {rs[0].name}")
    return Residency.PAIR


register(OpDef("pair_broadcast", Movement.BROADCAST,
               lambda ctx, x, by: x.index_select(0, ctx.pairs()[PAIR_SIDES.index(by)]),
               residency=_pair_broadcast_residency, shape=_same_shape, arity=1,
               derivative=lambda b, v, g: [b.add("pair_reduce", g, op="sum", by=v.attrs["by"])],
               doc="read edge rows onto in-edge pairs through the pair's edge i or j"))


# --- pair_reduce ----------------------------------------------------------------------
def _pair_reduce_residency(rs, attrs):
    _check_side(attrs)
    if attrs["op"] not in REDUCERS:
        raise ValueError(f"pair_reduce op must be one of {REDUCERS}, got {attrs['op']!r}")
    if rs[0] is not Residency.PAIR:
        raise ValueError(f"pair_reduce takes pair data (PAIR), got {rs[0].name}")
    return Residency.EDGE


def _pair_reduce_derivative(b, v, g):
    by, op = v.attrs["by"], v.attrs["op"]
    if op == "sum":
        return [b.add("pair_broadcast", g, by=by)]
    if op == "mean":   # every edge owns deg(dst) pairs, at least one: its own (e, e)
        count = b.add("broadcast", b.add("degree", by="dst", dtype=g.dtype), by="dst")
        return [b.add("pair_broadcast", b.add("div", g, count), by=by)]
    # max / min: to the arg-extreme pairs, split evenly among ties (as torch.amax does),
    # compared with the pairs' values as the forward computed them (`fwd_exact`, as reduce's).
    hit = b.add("eq", b.fwd_exact(v.inputs[0]), b.add("pair_broadcast", b.fwd(v), by=by))
    ties = b.add("pair_reduce", hit, op="sum", by=by)
    return [b.add("mul", b.add("pair_broadcast", b.add("div", g, ties), by=by), hit)]


register(OpDef("pair_reduce", Movement.REDUCE,
               lambda ctx, x, op, by: reduce_rows(x, ctx.pairs()[PAIR_SIDES.index(by)], ctx.num_edges, op),
               residency=_pair_reduce_residency, shape=_same_shape, arity=1,
               derivative=_pair_reduce_derivative,
               doc="aggregate the in-edge pairs sharing edge i (by='i') or j (by='j') into its row"))


# --- hinge_sum: sum_t max(0, x_e - x_t) by sorting --------------------------------------
class _SortedRuns:
    """Each (destination, feature element) group of ``x`` sorted ascending, with, for
    every element, where its group and its run of equal values start and end."""

    def __init__(self, x: torch.Tensor, dst: torch.Tensor, num_nodes: int):
        edges, self.shape = x.shape[0], x.shape
        width = math.prod(x.shape[1:])
        flat = x.reshape(edges, width).t().reshape(-1)          # feature-major: [width * E]
        column = torch.arange(width, device=x.device).repeat_interleave(edges)
        group = dst.repeat(width) + num_nodes * column
        by_value = torch.argsort(flat, stable=True)
        self.perm = by_value[torch.argsort(group[by_value], stable=True)]
        self.value, grp = flat[self.perm], group[self.perm]
        self.position = torch.arange(len(self.perm), device=x.device)
        counts = torch.bincount(grp, minlength=num_nodes * width)
        ends = torch.cumsum(counts, 0)
        self.group_start, self.group_end = (ends - counts)[grp], ends[grp]
        new_run = torch.ones_like(grp, dtype=torch.bool)
        new_run[1:] = (grp[1:] != grp[:-1]) | (self.value[1:] != self.value[:-1])
        run = torch.cumsum(new_run.long(), 0) - 1
        firsts = self.position[new_run]
        self.run_first = firsts[run]
        self.run_last = (torch.cat([firsts[1:], firsts.new_full((1,), len(self.perm))]) - 1)[run]

    def before(self, sorted_values: torch.Tensor, upto: torch.Tensor) -> torch.Tensor:
        """Per element, the float64 sum of its group's sorted values at positions
        ``group_start .. upto - 1``. Scanned within each group only: one running sum over
        all groups (a cumsum, then differences) rounded every later group's sums to the
        ulp of the earlier groups' total, so one vertex's large scores (1e17) made another
        vertex's O(1) hinge sums wrong by a factor of 2."""
        scan = sorted_values.double()
        offset = self.position - self.group_start
        step, longest = 1, int(offset.max()) + 1 if len(offset) else 0
        while step < longest:               # Hillis-Steele: log2(largest group) passes
            shifted = torch.cat([scan.new_zeros(step), scan[:-step]])
            scan = scan + torch.where(offset >= step, shifted, torch.zeros_like(shifted))
            step *= 2
        inclusive = torch.cat([scan.new_zeros(1), scan])          # inclusive[p + 1]: through p
        return torch.where(upto > self.group_start, inclusive[upto], torch.zeros_like(inclusive[upto]))

    def unsort(self, sorted_values: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(sorted_values)
        out[self.perm] = sorted_values
        edges = self.shape[0]
        return out.view(-1, edges).t().reshape(self.shape)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Another [E, ...] tensor in this sorted order."""
        edges = self.shape[0]
        return x.reshape(edges, -1).t().reshape(-1)[self.perm]


def _pairwise_hinge(x: torch.Tensor, g: torch.Tensor | None, dst: torch.Tensor, num_nodes: int,
                    inclusive: bool = False) -> torch.Tensor:
    """`hinge_sum` (``g`` None) or `hinge_sum_grad` over every in-edge pair, as torch
    computes the pair table: for inputs with NaN or infinities, which prefix sums would
    smear across vertices (``inf - inf``) where the pair table keeps them in their group."""
    i, j = in_edge_pairs(dst, num_nodes)
    gap = x[i] - x[j]
    if g is None:
        return torch.zeros_like(x).index_add_(0, i, torch.relu(gap))
    # torch's backward: clamp passes where gap >= 0 (not NaN), relu unless gap <= 0 (NaN passes)
    passes = gap >= 0 if inclusive else ~(gap <= 0)
    passed = torch.where(passes, g[i], torch.zeros_like(gap))
    return torch.zeros_like(g).index_add_(0, i, passed).index_add_(0, j, -passed)


def hinge_sum(x: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``w_e = sum_{t: dst(t) = dst(e)} max(0, x_e - x_t)`` per feature element: with the
    group sorted, the terms that count are the strictly smaller values, so
    ``w = (#smaller) x_e - sum(smaller)``, read off prefix sums at the first position of
    ``e``'s run of equal values (equal values add 0). The difference of those two large
    terms is taken in float64 and rounded once: taken in ``x``'s dtype it cancelled
    catastrophically (bfloat16 scores near 100 on a 300-edge vertex: a C-GAT output off
    by 15% where the pair table's sum is off by 0.1%)."""
    if x.numel() == 0:
        return torch.zeros_like(x)
    if not torch.isfinite(x).all():
        return _pairwise_hinge(x, None, dst, num_nodes)
    runs = _SortedRuns(x, dst, num_nodes)
    smaller = runs.before(runs.value, runs.run_first)
    return runs.unsort(((runs.run_first - runs.group_start).double() * runs.value.double() - smaller).to(x.dtype))


def hinge_sum_grad(x: torch.Tensor, g: torch.Tensor, dst: torch.Tensor, num_nodes: int,
                   inclusive: bool = False) -> torch.Tensor:
    """Gradient of `hinge_sum` at ``x`` for output gradient ``g``: edge ``c`` gains
    ``g_c`` per smaller value and loses ``g_b`` for every larger ``x_b``. At equal values
    the hinge has a kink: ``inclusive=False`` passes nothing there (``relu``'s choice),
    ``inclusive=True`` counts them on both sides (``clamp(min=0)``'s; ``c`` itself then
    adds and takes ``g_c`` once, which cancels). Taken in float64 and rounded once, as
    `hinge_sum` is."""
    if x.numel() == 0:
        return torch.zeros_like(g)
    if not (torch.isfinite(x).all() and torch.isfinite(g).all()):
        return _pairwise_hinge(x, g, dst, num_nodes, inclusive)
    runs = _SortedRuns(x, dst, num_nodes)
    g_sorted = runs.gather(g)
    if inclusive:
        count, larger_from = runs.run_last + 1, runs.run_first
    else:
        count, larger_from = runs.run_first, runs.run_last + 1
    larger = runs.before(g_sorted, runs.group_end) - runs.before(g_sorted, larger_from)
    return runs.unsort(((count - runs.group_start).double() * g_sorted.double() - larger).to(g.dtype))


def _hinge_residency(rs, attrs):
    if attrs["by"] != "dst" or any(r not in EDGE_ROWED for r in rs):
        raise ValueError(f"hinge_sum compares edge data over each destination's in-edges (by='dst'), "
                         f"got {[r.name for r in rs]} by {attrs['by']!r}")
    return Residency.EDGE


register(OpDef("hinge_sum", Movement.NORM,
               lambda ctx, x, by, inclusive: hinge_sum(x, ctx.index(by), ctx.num_rows(by)),
               residency=_hinge_residency, shape=_same_shape, arity=1,
               derivative=lambda b, v, g: [b.add("hinge_sum_grad", b.fwd(v.inputs[0]), g, **v.attrs)],
               doc="sum over the in-edges t of e's destination of max(0, x_e - x_t), by sorting; "
                   "inclusive: the gradient at equal values is clamp's (passes), else relu's (blocks)"))
register(OpDef("hinge_sum_grad", Movement.NORM,
               lambda ctx, x, g, by, inclusive: hinge_sum_grad(x, g, ctx.index(by), ctx.num_rows(by), inclusive),
               residency=_hinge_residency, shape=lambda inputs, a, r: (inputs[1].shape, inputs[1].dtype),
               arity=2, doc="the gradient of hinge_sum at x for output gradient g"))
