"""PyG's edge features (``edge_attr`` with ``edge_dim``) for the attention layers: the
per-edge inputs lined up with the graph a layer runs on, and the layer parts they feed.

Why a module of its own: GAT and GATv2 both replace every self loop by one loop per vertex
before attending, and PyG gives each new loop an edge feature made by ``fill_value`` --
a constant, or an aggregation of the features of the vertex's other in-edges. The loops
are added by `_looped`'s rule (the edges that are not loops, in order, then one loop per
vertex in vertex order), so the features here follow that order.
"""
from __future__ import annotations

from typing import Union

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..graph import Graph
from ..passes.fusion import MAX_EDGE_FEATURES
from . import pyg_init

FillValue = Union[float, torch.Tensor, str]

# PyG's fill_value strings -> torch.scatter_reduce's reductions (0 where a vertex has no in-edge)
_FILL_REDUCTIONS = {"mean": "mean", "add": "sum", "sum": "sum", "max": "amax", "min": "amin", "mul": "prod"}


def edge_feature_rows(edge_attr: torch.Tensor, num_edges: int, edge_dim: int, layer: str) -> torch.Tensor:
    """``edge_attr`` as [E, edge_dim] (PyG also takes a vector when ``edge_dim=1``). A
    complex one is refused: cast to ``lin_edge``'s dtype it lost its imaginary part (a
    float output, where PyG's GATConv and GATv2Conv raise), with at most torch's one-time
    warning."""
    if not isinstance(edge_attr, torch.Tensor):
        raise TypeError(f"{layer}: edge_attr must be a tensor of edge features, got {type(edge_attr).__name__}")
    if edge_attr.is_complex():
        raise TypeError(f"{layer}: edge_attr is {edge_attr.dtype}: complex edge features are not supported "
                        "(casting them to the layer's dtype would drop their imaginary part); pass real features")
    rows = edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr
    if rows.dim() != 2 or rows.shape != (num_edges, edge_dim):
        raise ValueError(f"{layer}: edge_attr must have shape [{num_edges}, {edge_dim}] (one row of edge_dim "
                         f"features per edge), got {list(edge_attr.shape)}")
    return rows


def loop_features(graph: Graph, rows: torch.Tensor, fill_value: FillValue, layer: str) -> torch.Tensor:
    """The features of the self loops PyG's ``add_self_loops(edge_attr, fill_value)`` adds,
    one row per vertex, from the features ``rows`` of the edges of ``graph`` that are not
    self loops."""
    num_nodes, width = min(graph.num_nodes, graph.num_src_nodes), rows.shape[1:]   # bipartite: `_looped`'s loops
    if isinstance(fill_value, bool) or not isinstance(fill_value, (int, float, torch.Tensor, str)):
        raise ValueError(f"{layer}: fill_value must be a number, a tensor or one of {sorted(_FILL_REDUCTIONS)}, "
                         f"got {fill_value!r}")
    if isinstance(fill_value, (int, float)):
        return rows.new_full((num_nodes, *width), float(fill_value))
    if isinstance(fill_value, torch.Tensor):
        loop = fill_value.to(rows.device, rows.dtype)
        return (loop if loop.dim() == rows.dim() else loop.unsqueeze(0)).expand(num_nodes, *width)
    if fill_value not in _FILL_REDUCTIONS:
        raise NotImplementedError(f"{layer}(fill_value={fill_value!r}) is not supported by gnnfuse; use a number, "
                                  f"a tensor or one of {sorted(_FILL_REDUCTIONS)}")
    if graph.num_nodes > graph.num_src_nodes:     # PyG's scatter then reads past its loops' rows
        raise ValueError(f"{layer}(fill_value={fill_value!r}) with add_self_loops on bipartite input with more "
                         f"destinations ({graph.num_nodes}) than sources ({graph.num_src_nodes}): the loops' "
                         "features would aggregate the in-edges of destinations that get no loop (PyG fails "
                         "when one has any); give fill_value as a number or a tensor, or build the layer with "
                         "add_self_loops=False")
    index = graph.dst.to(torch.long).view(-1, 1).expand_as(rows)
    return rows.new_zeros(num_nodes, *width).scatter_reduce(0, index, rows, _FILL_REDUCTIONS[fill_value],
                                                            include_self=False)


def looped_edge_features(graph: Graph, rows: torch.Tensor, fill_value: FillValue, layer: str) -> torch.Tensor:
    """Edge features for ``_looped(graph)``: those of the edges that are not self loops, in
    order, then one loop row per vertex (PyG drops the given loops' features, as their edges)."""
    keep = graph.src != graph.dst
    loop_free = graph.cached("nn_loop_free", Graph.remove_self_loops)
    return torch.cat([rows[keep], loop_features(loop_free, rows[keep], fill_value, layer)])


def edge_projection(edge_dim: int | None, width: int) -> nn.Linear | None:
    """PyG's ``lin_edge``: edge features to ``width`` (heads * out_channels), no bias,
    drawn as PyG's. Its weight is read before it is called, so it cannot be lazy."""
    if edge_dim is None:
        return None
    if edge_dim <= 0:
        raise NotImplementedError(f"edge_dim={edge_dim} (PyG's lazy initialisation) is not supported by gnnfuse: "
                                  "give the width of the edge features")
    return pyg_init.linear(edge_dim, width, False, "glorot")


def edge_rows(layer: nn.Module, graph: Graph, edge_attr: torch.Tensor | None, name: str) -> torch.Tensor | None:
    """The edge features of the graph the attention runs on, [E', edge_dim], before
    ``lin_edge``: E' the edges with self loops replaced by one per vertex, featured by
    ``fill_value``, when ``add_self_loops``; None without ``edge_attr``. Edge features
    given to a layer built without ``edge_dim`` are refused (PyG ignores them)."""
    if edge_attr is None:
        return None
    if layer.lin_edge is None:
        raise NotImplementedError(f"{name}.forward(..., edge_attr=...) needs the layer built with edge_dim "
                                  f"(the width of the edge features): {name}(..., edge_dim=D)")
    rows = edge_feature_rows(edge_attr, graph.num_edges, layer.edge_dim, name)
    # a module in lin_edge's place takes the rows as given. A parametrized weight
    # (spectral_norm) is read as stored: each read of ``lin_edge.weight`` recomputes it, power
    # iteration and all, and the layer calls lin_edge too (PyG reads it once). A
    # parametrization of several tensors (weight_norm's magnitude and direction) stores
    # ``original0``, ``original1``, ... and no ``original``: its first gives the dtype
    lin_edge = layer.lin_edge
    if parametrize.is_parametrized(lin_edge, "weight"):
        stored = lin_edge.parametrizations.weight
        weight = stored.original if hasattr(stored, "original") else stored.original0
    else:
        weight = getattr(lin_edge, "weight", None)
    rows = rows if weight is None else rows.to(weight.dtype)
    return looped_edge_features(graph, rows, layer.fill_value, name) if layer.add_self_loops else rows


def traced_edge_matmul(rows: torch.Tensor | None) -> bool:
    """Whether ``rows @ W`` can be written inside a traced function, where the compiler
    evaluates it in registers in every kernel that uses it and recomputes it in the
    backward (passes.fusion.edge_feature_matmul), so no [E, heads x channels] product is
    ever stored. That holds up to ``MAX_EDGE_FEATURES`` features (the compiler unrolls the
    dot); wider features take the precomputed ``lin_edge(edge_attr)`` path."""
    return rows is not None and rows.shape[1] <= MAX_EDGE_FEATURES

