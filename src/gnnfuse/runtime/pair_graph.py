"""The graph of (source, relation) pairs, and per-pair products of a vertex table and a
relation's matrix: what a program rewritten by passes/pair_sources.py runs on and reads.

The pair graph has an edge ``pair(e) -> dst(e)`` for every edge ``e`` of a typed graph
(same order, same edge types), its sources being the (source vertex, relation) pairs
that have edges -- the pairs compact materialization computes its products on
(ir/ops/compact.py). A pair table is then an ordinary source-side table: the fused
kernels gather its rows per edge, and the backward sums gradients per pair over the
pair graph's reverse CSR, so nothing per edge is wider than the per-edge scalars.

`pair_matmul` computes a pair table: one segment matmul over the pairs (the context's
``grouped_matmul``: a Triton kernel on the GPU, one torch matmul per relation
elsewhere), with the gradients compact materialization's backward computes from the
pairs' summed gradients.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..backend.reference import GraphContext
from ..graph import Graph
from ..ir.ops.compact import RelationPairs, is_edge_types, pair_input_grad, pair_weight_grad, relation_pairs


class PairGraph(NamedTuple):
    """The (source, relation) pairs of a typed graph and the bipartite graph over them."""
    graph: Graph             # sources: the pairs; destinations: the typed graph's vertices
    pairs: RelationPairs


def pair_graph(graph: Graph) -> PairGraph:
    """The pair graph of ``graph`` (which must have edge types), built once per graph."""
    if graph.edge_type is None:
        raise ValueError("a relation pair graph needs a graph with edge types")

    def build(g: Graph) -> PairGraph:
        pairs = relation_pairs(GraphContext(g), "src")
        over_pairs = Graph.bipartite(pairs.of_edge, g.dst, num_src_nodes=len(pairs.vertex),
                                     num_dst_nodes=g.num_nodes, edge_type=g.edge_type,
                                     num_edge_types=g.num_edge_types)
        return PairGraph(over_pairs, pairs)
    return graph.cached("relation_pair_graph", build)


def _context(graph: Graph, x: torch.Tensor) -> GraphContext:
    """The context whose grouped matmul and row scatter the call's backend runs."""
    from .compiled import backend_name      # compiled.py imports this module
    if backend_name(x.is_cuda) == "triton":
        from ..backend.triton.context import TritonGraphContext     # imports triton: only when asked for
        return TritonGraphContext(graph)
    return GraphContext(graph)


class _PairMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, pairs: RelationPairs, context: GraphContext) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.pairs, ctx.context = pairs, context
        return context.grouped_matmul(x, w, pairs.groups, pairs.vertex)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors
        pairs, context = ctx.pairs, ctx.context
        g = g.contiguous()
        grad_x = (pair_input_grad(context, g, w.transpose(1, 2), pairs, x.shape[0])
                  if ctx.needs_input_grad[0] else None)
        grad_w = pair_weight_grad(context, x, g, pairs) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None


def pair_matmul(graph: Graph, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[P, out]: ``x[vertex] @ w[relation]`` for each (source vertex, relation) pair of
    `pair_graph` (``x``: [sources, in], ``w``: [relations, in, out]); differentiable in
    both."""
    if w.dim() != 3 or x.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"pair_matmul takes x [sources, in] and w [relations, in, out], got x {list(x.shape)} "
                         f"and w {list(w.shape)}")
    pairs = pair_graph(graph).pairs
    return _PairMatmul.apply(x.contiguous(), w, pairs, _context(graph, x))


def pair_rows(graph: Graph, x: torch.Tensor) -> torch.Tensor:
    """[P, ...]: each pair's vertex's row of source table ``x`` (differentiable)."""
    return x.index_select(0, pair_graph(graph).pairs.vertex)


def reads_edge_types(graph: Graph, index: torch.Tensor, relations: int) -> bool:
    """Whether a per-edge table index is ``graph``'s own edge types (the same memory read
    as the same vector, over as many relations): the relation the pair graph's pairs are
    made of."""
    return is_edge_types(GraphContext(graph), index, relations)
