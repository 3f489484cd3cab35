"""PyG's ``return_attention_weights=True`` for the attention layers: ``(out, (edge_index,
alpha))``, the edges attended over and each edge's softmax weight per head.

The kernel normalises the scores inside its aggregation and keeps no per-edge weight, so
when asked for, the weights are recomputed here in torch from the same per-edge scores:
exact, differentiable, and free for the calls that do not ask.
"""
from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import nn

from ..graph import Graph
from ..graph.convert import is_pyg_edge_index, is_sparse_adjacency

# What GAT/GATv2's forward returns: the output, or with return_attention_weights=True
# ``(output, (edge_index, alpha))`` as in PyG.
AttentionOutput = Union[torch.Tensor, Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]]


def check_attention_request(layer: nn.Module, x: object, edge_index: object, name: str) -> None:
    """Refuse, by name, the ``return_attention_weights=True`` calls whose weights cannot be
    given exactly: in training with dropout the kernel's dropout mask is not returned, for
    a torch_sparse ``SparseTensor`` PyG returns one of weights, which is not built here,
    and for bipartite input ``(x_src, x_dst)`` the returned edges and loops are not checked
    against PyG's."""
    if isinstance(x, (tuple, list)):
        raise NotImplementedError(f"{name}(..., return_attention_weights=True) with bipartite input (x_src, x_dst) "
                                  "is not supported by gnnfuse; call it without return_attention_weights")
    if layer.training and layer.dropout > 0:
        raise NotImplementedError(f"{name}(..., return_attention_weights=True) in training mode with dropout > 0 "
                                  "is not supported by gnnfuse (the dropped weights stay in the kernel); call "
                                  "it in eval mode or with dropout=0")
    if is_sparse_adjacency(edge_index) and not isinstance(edge_index, torch.Tensor):
        raise NotImplementedError(f"{name}(..., return_attention_weights=True) with a torch_sparse SparseTensor "
                                  "is not supported by gnnfuse; pass an edge_index or a torch sparse adj_t")


def attention_weights(graph: Graph, scores: torch.Tensor, given: object, looped: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """PyG's ``(edge_index, alpha)``: the edges attended over (self loops included) and the
    softmax of the per-edge ``scores`` [E, heads] over each vertex's in-edges. Computed in
    torch from the same scores the kernel normalises, and only when asked for.

    The edges are, as in PyG, the caller's own ``edge_index`` where the layer added no
    self loops (``looped`` False), else a new tensor (an ``EdgeIndex`` for one, as PyG's
    ``add_self_loops`` keeps the type): never the graph's cached layout,
    which every later call on that ``edge_index`` reads (code that explains a batch per
    graph shifts the returned ids in place, and the next call then raised
    GraphModifiedError for that batch and for every equal edge_index).

    When the graph was ``given`` as a torch sparse ``adj_t``, the first element is, as in
    PyG, that adjacency (loops included) in the same layout with the weights as values,
    [N, N, heads] (row = target); duplicate entries are summed, as PyG's coalescing does.
    ``alpha`` then lines up with that adjacency's stored entries (row-major, the order of a
    coalesced COO tensor's and of a CSR tensor's values), as PyG's ``set_sparse_value(adj_t,
    alpha)`` pairs them, not with the graph's edge order."""
    index = graph.dst.to(torch.long).unsqueeze(-1).expand_as(scores)
    peak = scores.new_full((graph.num_nodes, scores.shape[1]), float("-inf")).scatter_reduce(
        0, index, scores, "amax")
    weight = torch.exp(scores - peak.gather(0, index))
    total = scores.new_zeros(graph.num_nodes, scores.shape[1]).scatter_add(0, index, weight)
    alpha = weight / total.gather(0, index)
    if not is_sparse_adjacency(given):
        if isinstance(given, torch.Tensor) and not looped:
            return given, alpha
        if is_pyg_edge_index(given):      # PyG's self loops keep the EdgeIndex type (and its size)
            return type(given)(graph.edge_index.clone(), sparse_size=(graph.num_nodes, graph.num_nodes)), alpha
        return graph.edge_index.clone(), alpha
    adj = torch.sparse_coo_tensor(torch.stack([graph.dst, graph.src]).to(torch.long), alpha,
                                  (graph.num_nodes, graph.num_nodes, alpha.shape[1])).coalesce()
    entries = adj.values()
    if given.layout is torch.sparse_csr:
        adj = adj.to_sparse_csr()
    elif given.layout is torch.sparse_csc:
        adj = adj.to_sparse_csc()
    return adj, entries
