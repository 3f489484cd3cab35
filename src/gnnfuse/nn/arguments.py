"""Checks of the ``forward`` arguments that PyG's layers take and gnnfuse's handle
differently or not yet.

Every layer's ``forward`` keeps PyG's positional order, so a PyG call such as
``conv(x, edge_index, edge_weight)`` never binds a value to a parameter of another
meaning. A parameter PyG has and gnnfuse does not implement is still accepted in its
place, and a value it cannot honour fails, naming it, instead of being ignored.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ..graph.convert import is_sparse_adjacency


def node_features(x: Any, layer: str) -> torch.Tensor:
    """``x`` itself, after checking it is one [N, F] tensor rather than PyG's bipartite
    ``(x_src, x_dst)`` pair, which the layers do not support yet."""
    if isinstance(x, (tuple, list)):
        raise NotImplementedError(
            f"{layer}: bipartite input (a pair (x_src, x_dst) of feature tensors) is not supported yet "
            "(gnnfuse issue #12); pass one [num_nodes, F] tensor for a graph whose sources and "
            "destinations are the same vertices")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{layer}: x must be a [num_nodes, F] tensor, got {type(x).__name__}")
    if x.dim() > 2:
        raise NotImplementedError(f"{layer}: node features of shape {list(x.shape)} (a batch of feature "
                                  "matrices on one graph, PyG's static graphs) are not supported by this "
                                  "layer; pass one [num_nodes, F] tensor")
    return x


def over_feature_batches(forward: Callable) -> Callable:
    """A layer ``forward`` that also takes PyG's static-graph input: node features
    ``[B, N, F]``, B feature matrices on one N-vertex graph, giving ``[B, N, F']``.

    Each matrix runs through the layer on its own and the outputs are stacked -- exactly
    the per-matrix result, whatever the layer computes. Only for layers whose PyG
    counterpart accepts such input; the others refuse it in `node_features`.
    """
    @functools.wraps(forward)
    def run(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() == 3:
            return torch.stack([forward(self, features, *args, **kwargs) for features in x.unbind(0)])
        return forward(self, x, *args, **kwargs)
    return run


def check_size(size: Any, num_nodes: int, layer: str) -> None:
    """PyG's ``size=(num_src, num_dst)``: only the non-bipartite ``(N, N)`` (or None) is
    supported; anything else describes a bipartite graph (issue #12)."""
    if size is not None and tuple(size) != (num_nodes, num_nodes):
        raise NotImplementedError(f"{layer}: size={tuple(size)} describes a bipartite graph, which is not "
                                  f"supported yet (gnnfuse issue #12); x has {num_nodes} rows, so size may "
                                  f"only be None or ({num_nodes}, {num_nodes})")


def edge_weight_column(edge_weight: torch.Tensor, num_edges: int, dtype: torch.dtype) -> torch.Tensor:
    """PyG's ``edge_weight`` (one number per edge, shape [E] or [E, 1], in edge-id order)
    as an [E] tensor of the features' dtype, still attached to autograd."""
    if not isinstance(edge_weight, torch.Tensor):
        raise TypeError(f"edge_weight must be a tensor of one number per edge, got {type(edge_weight).__name__}")
    if edge_weight.dim() not in (1, 2) or edge_weight.shape[0] != num_edges or edge_weight.numel() != num_edges:
        raise ValueError(f"edge_weight must have shape [{num_edges}] (one number per edge of the graph), "
                         f"got {list(edge_weight.shape)}")
    return edge_weight.reshape(num_edges).to(dtype)


def adjacency_weights(edge_index: Any, edge_weight: torch.Tensor | None, layer: str) -> tuple[Any, torch.Tensor | None]:
    """``(edge_index, edge_weight)`` for a layer that takes edge weights, given PyG's
    sparse ``adj_t`` whose stored values are not all 1: PyG multiplies each message by
    its entry, so the entries become ``edge_weight`` of a ``[2, E]`` edge_index (row =
    target, column = source). Any other input passes through unchanged. (The index made
    here is new on every call, so such a graph's layout is rebuilt per call; a pattern-only
    ``adj_t`` or a plain edge_index keeps the cached layout.)"""
    if not is_sparse_adjacency(edge_index):
        return edge_index, edge_weight
    if isinstance(edge_index, torch.Tensor):
        coo = edge_index if edge_index.layout is torch.sparse_coo else edge_index.to_sparse_coo()
        (row, col), value = coo._indices(), coo._values()
    else:                                             # torch_sparse.SparseTensor
        row, col, value = edge_index.coo()
    if value is None or not value.numel() or bool((value == 1).all()):
        return edge_index, edge_weight
    if edge_weight is not None:
        raise ValueError(f"{layer}: the sparse adj_t holds edge weights (values other than 1) and edge_weight "
                         "was given too; pass the weights one way")
    return torch.stack([col, row]), value
