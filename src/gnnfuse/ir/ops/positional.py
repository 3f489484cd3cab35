"""One message by its position in a vertex's mailbox: DGL's ``nodes.mailbox['m'][:, i]``.

DGL's mailbox lists a vertex's in-edges in edge-id order (its degree buckets keep each
vertex's edges sorted by id), and so does the graph's CSR (stable in edge id per row),
so message ``i`` of vertex ``v`` is the edge at ``rowptr[v] + i`` (``rowptr[v + 1] + i``
for a negative ``i``, counted from the last). DGL skips vertices without in-edges and
fills zeros there; on any other vertex with fewer than ``i + 1`` (or ``-i``) messages it
raises IndexError, so that is a ValueError here, never a read of another vertex's edge.

``pick_in_edge`` reads each vertex's picked edge row; ``place_in_edge`` writes a row per
vertex back onto that edge (zeros on every other edge): each is the other's derivative.
They move rows between edges and vertices through an index no kernel computes, so on
the Triton backend they run as torch ops, as the pairwise ops do.
"""
from __future__ import annotations

import torch

from ..registry import OpDef, register
from ..residency import EDGE_ROWED, Movement, Residency


def picked_in_edges(ctx, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(vertices with in-edges, the id of each one's in-edge at ``position``)."""
    rowptr, _, eid = ctx.csr("dst")
    rowptr, eid = rowptr.long(), eid.long()
    degree = rowptr[1:] - rowptr[:-1]
    needed = position + 1 if position >= 0 else -position
    short = (degree > 0) & (degree < needed)
    if bool(short.any()):
        vertex = int(short.nonzero()[0])
        raise ValueError(f"nodes.mailbox[...][:, {position}] needs {needed} messages on every vertex that "
                         f"receives any, but vertex {vertex} has in-degree {int(degree[vertex])} (DGL "
                         "raises IndexError there)")
    vertices = (degree > 0).nonzero().squeeze(1)
    start = rowptr[:-1] if position >= 0 else rowptr[1:]
    return vertices, eid[start[vertices] + position]


def _pick(ctx, x: torch.Tensor, position: int) -> torch.Tensor:
    vertices, edges = picked_in_edges(ctx, position)
    out = x.new_zeros((ctx.num_nodes,) + x.shape[1:])
    return out.index_copy_(0, vertices, x.index_select(0, edges))


def _place(ctx, g: torch.Tensor, position: int) -> torch.Tensor:
    vertices, edges = picked_in_edges(ctx, position)
    out = g.new_zeros((ctx.num_edges,) + g.shape[1:])
    return out.index_copy_(0, edges, g.index_select(0, vertices))


def _same_shape(inputs, attrs, residency):
    return inputs[0].shape, inputs[0].dtype


def _pick_residency(rs, attrs):
    if rs[0] not in EDGE_ROWED:
        raise ValueError(f"pick_in_edge takes edge data (SRC, DST or EDGE), got {rs[0].name}")
    return Residency.NODE


def _place_residency(rs, attrs):
    if rs[0] is not Residency.NODE:
        raise ValueError(f"place_in_edge takes vertex data (NODE), got {rs[0].name}")
    return Residency.EDGE


register(OpDef("pick_in_edge", Movement.REDUCE, lambda ctx, x, position: _pick(ctx, x, position),
               residency=_pick_residency, shape=_same_shape, arity=1,
               derivative=lambda b, v, g: [b.add("place_in_edge", g, **v.attrs)],
               doc="each vertex's in-edge row at a position in edge-id order (0 without in-edges)"))
register(OpDef("place_in_edge", Movement.BROADCAST, lambda ctx, g, position: _place(ctx, g, position),
               residency=_place_residency, shape=_same_shape, arity=1,
               derivative=lambda b, v, g: [b.add("pick_in_edge", g, **v.attrs)],
               doc="each vertex's row written to its in-edge at a position, zeros on other edges"))
