"""Compact materialization (Hector, ASPLOS '24; ir/ops/compact.py): a relation-typed
transform of an endpoint's row, ``typed_matmul(broadcast(x, by=src|dst), W, by=etype)``
-- R-GCN's ``e.src.h @ e.type.W``, HGT's relation-transformed keys and values, RGAT's
transformed endpoints -- becomes ``compact_typed_matmul(x, W, side=src|dst)``: one
product per (vertex, relation) pair that has edges, gathered onto the edges, instead of
one per edge. The broadcast it read is left to dead-code elimination when nothing else
uses it.

The rewrite is unconditional: a pair never has fewer than one edge, so it never does
more matmul work than the per-edge form (P <= |E|), and the pairs are built once per
graph. `gnnfuse.explain` shows it in the optimized program as ``compact_typed_matmul``.
"""
from __future__ import annotations

from ..ir import Program, Residency


def materialize_compactly(program: Program) -> Program:
    for v in list(program.values):
        if v.op != "typed_matmul" or v.attrs["by"] != "etype":
            continue
        x, w = v.inputs
        if x.op != "broadcast" or x.attrs["by"] not in ("src", "dst") or w.residency is not Residency.EDGE_TYPE:
            continue
        compact = program.add("compact_typed_matmul", x.inputs[0], w, source=v.source, side=x.attrs["by"])
        program.replace_uses(v, compact)
    return program
