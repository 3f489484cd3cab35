"""Compact materialization (Hector, ASPLOS '24; ir/ops/compact.py): a relation-typed
transform of an endpoint's row, ``typed_matmul(broadcast(x, by=src|dst), W, by=etype)``
-- R-GCN's ``e.src.h @ e.type.W``, HGT's relation-transformed keys and values, RGAT's
transformed endpoints -- becomes ``compact_typed_matmul(x, W, side=src|dst)``: one
product per (vertex, relation) pair that has edges, gathered onto the edges, instead of
one per edge. The same for a relation read from edge data, ``indexed_matmul(broadcast(x),
table, idx)`` (Graphiler's ``bmm(edges.src['h'].unsqueeze(1), W[edges.data['type']])``),
which becomes ``compact_indexed_matmul``. The broadcast it read is left to dead-code
elimination when nothing else uses it.

The rewrite is unconditional: a pair never has fewer than one edge, so it never does
more matmul work than the per-edge form (P <= |E|), and the pairs are built once per
graph. `gnnfuse.explain` shows it in the optimized program as ``compact_typed_matmul``.
"""
from __future__ import annotations

from ..ir import Program, Residency


def materialize_compactly(program: Program) -> Program:
    for v in list(program.values):
        if v.op == "typed_matmul" and v.attrs["by"] == "etype":
            x, w = v.inputs
            if _endpoint_rows(x) and w.residency is Residency.EDGE_TYPE:
                program.replace_uses(v, program.add("compact_typed_matmul", x.inputs[0], w, source=v.source,
                                                    side=x.attrs["by"]))
        elif v.op == "indexed_matmul" and _endpoint_rows(v.inputs[0]):
            x, table, idx = v.inputs
            program.replace_uses(v, program.add("compact_indexed_matmul", x.inputs[0], table, idx,
                                                source=v.source, side=x.attrs["by"]))
    return program


def _endpoint_rows(x) -> bool:
    """Whether ``x`` is a vertex table gathered onto the edges by one endpoint."""
    return x.op == "broadcast" and x.attrs["by"] in ("src", "dst")
