"""Where a value lives on the graph, and how an op moves data between those places.

A value's *residency* says which index its leading (stripped) dimension runs over.
``SRC`` and ``DST`` values are edge-rowed, but depend only on the edge's source or
destination vertex: that is what lets the broadcast-reordering pass compute them per
vertex instead of per edge (Graphiler §4.3.1), and what lets a fused kernel gather them
instead of reading an |E|-sized tensor (Seastar §5.1's graph types S/D/E/P).

On a bipartite graph (sources and destinations are separate vertex sets, PyG's
``size=(num_src, num_dst)``) a NODE value is a table of one of the two sets. That is not
a residency of its own: which set is implied by how the value is used -- gathered by
src or by dst, produced by a reduce by src or by dst -- and inferred per program by
`ir.sides`, so programs, passes and kernels stay the same for both kinds of graph; only
row counts (the runtime's input check, the rows a reduce writes) ask the graph for the
right set.
"""
from __future__ import annotations

import enum
from typing import Iterable


class Residency(enum.Enum):
    NODE = "node"            # one row per vertex
    SRC = "src"              # one row per edge, a function of the edge's source vertex
    DST = "dst"              # one row per edge, a function of the edge's destination vertex
    EDGE = "edge"            # one row per edge
    SHARED = "shared"        # parameters and constants: no row dimension
    NODE_TYPE = "node_type"  # one row per vertex type
    EDGE_TYPE = "edge_type"  # one row per edge type
    PAIR = "pair"            # one row per ordered pair of in-edges of one vertex (ir/ops/pairwise.py)

    def __repr__(self) -> str:
        return self.name

    @property
    def is_edge_rowed(self) -> bool:
        return self in EDGE_ROWED


class Movement(enum.Enum):
    """Graphiler's data-movement classes (Table 1)."""

    BROADCAST = "broadcast"  # vertex/type data -> edges
    REDUCE = "reduce"        # edges -> vertices (or rows -> shared, for parameter gradients)
    NORM = "norm"            # edges -> edges through a per-destination reduction (edge softmax)
    DENSE = "dense"          # no movement across the row dimension


EDGE_ROWED = frozenset({Residency.SRC, Residency.DST, Residency.EDGE})


class ResidencyError(ValueError):
    """Operands live in places that no dense op can combine without an explicit movement."""


def join(residencies: Iterable[Residency]) -> Residency:
    """Residency of a dense op's output (Seastar §5.1 rules 2-4, Graphiler §4.1).

    SHARED never changes the result; any mix of SRC, DST and EDGE is EDGE; a vertex or
    type value mixed with edge data needs an explicit broadcast first.
    """
    rows = {r for r in residencies if r is not Residency.SHARED}
    if not rows:
        return Residency.SHARED
    if len(rows) == 1:
        return next(iter(rows))
    if rows <= EDGE_ROWED:
        return Residency.EDGE
    names = ", ".join(sorted(r.name for r in rows))
    raise ResidencyError(
        f"cannot combine values resident on {names} in one dense op; "
        "broadcast vertex data onto edges first (u.<key>, v.<key>, edges.src[...], edges.dst[...])"
    )
