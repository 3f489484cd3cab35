"""GraphTensor's NAPA programming model (GraphTensor §IV-B, Fig. 10): NeighborApply, Pull, Apply.

A GNN layer is edge weighting, then aggregation, then combination:

    p = NeighborApply(graph, x, "gcn")             # per-edge weights (SDDMM): [E, 1]
    h = Pull(graph, x, p, "mul", "sum")            # sum_u p_uv * x_u (SpMM): [N, F]
    out = Apply(16, 8, activation=torch.relu)(h)   # dense MLP

GraphTensor configures each primitive with a mode (its f, g and h); here a mode is a
name or a function traced into the IR, because `NeighborApply` and `Pull` are thin
wrappers over `gnnfuse.ops.gsddmm` and `gnnfuse.ops.gspmm`: each call is one fused,
destination-centric kernel (CSR by default, as GraphTensor runs it), differentiable.
`Apply` is a dense layer in plain torch, as GraphTensor's Apply uses the framework's
matmul and activations: dense work gains nothing from the graph compiler. An `Apply`
module can also be called inside a `NeighborApply` or `Pull` function, where its
``nn.Linear`` is traced like any captured weight (NGCF's per-edge ``W2 (x_u * x_v)``).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..graph import Graph
from .templates import REDUCERS, Schedule, gsddmm, gspmm, operand_graph


def _in_degree_power(graph: Graph, exponent: float, dtype: torch.dtype) -> torch.Tensor:
    """in-degree ** exponent as a [N, 1] column, 0 where a vertex has no in-edges;
    computed once per graph (a layer calls it every step on the same graph)."""
    def build(g: Graph) -> torch.Tensor:
        scale = g.in_degrees().to(torch.float64).pow(exponent)
        return scale.masked_fill(torch.isinf(scale), 0.0).unsqueeze(-1)
    return graph.cached(f"napa_in_degree_pow_{exponent}", build).to(dtype)


def _one_vertex_set(primitive: str, graph: Graph, what: str) -> None:
    """Refuse a bipartite graph where ``what`` reads both ends of an edge from one table:
    there a source and a destination with the same id are different vertices (the
    source's row of a [num_dst, 1] in-degree table, or the destination's row of the
    sources' embeddings, is another vertex's), so the weights would be silently wrong
    whenever the two sets have the same size."""
    if graph.is_bipartite:
        raise ValueError(f"{primitive}: {what} reads both ends of each edge from one table, but this graph is "
                         f"bipartite ({graph.num_src_nodes} sources, {graph.num_nodes} destinations); call "
                         "gnnfuse.ops.gsddmm / gspmm with src= and dst= tables instead")


def _weight_dtype(mode: str, embed: torch.Tensor | None) -> torch.dtype:
    """The dtype of ``mode``'s degree weights: ``embed``'s, which must be floating (an
    integer dtype would truncate 1/sqrt(2) to 0)."""
    if not isinstance(embed, torch.Tensor):
        return torch.get_default_dtype()
    if not embed.is_floating_point():
        raise TypeError(f"NeighborApply: mode {mode!r} gives its weights in embed's dtype, which must be "
                        f"floating, got {embed.dtype} (pass embed=None for the default dtype)")
    return embed.dtype


def _dot(s, d):
    return (s * d).sum(-1, keepdim=True)


def _mul(s, d):
    return s * d


def _weighted(s, w):
    return w * s


WEIGHTINGS = ("gcn", "mean", "dot", "mul")      # NeighborApply's named modes (GraphTensor's f)
MESSAGES = ("copy", "mul")                     # Pull's named modes (GraphTensor's g)


def NeighborApply(graph: Graph | object, embed: torch.Tensor | None = None, mode: str | Callable = "gcn", *,
                  edge: torch.Tensor | None = None) -> torch.Tensor:
    """Per-edge weights ``f(x_u, x_v)`` for every edge u -> v, in edge-id order ([E, ...]).

    ``mode``: ``"gcn"`` -- ``1/sqrt(deg(u) deg(v))`` by in-degree, GCN's and NGCF's
    normalization, 0 at a vertex without in-edges ([E, 1]; ``embed`` only sets its
    dtype); ``"mean"`` -- ``1/deg(v)``, the weight that turns a sum into a mean ([E, 1]);
    ``"dot"`` -- ``<x_u, x_v>`` ([E, 1]); ``"mul"`` -- ``x_u * x_v``; or a function of
    ``(x_u, x_v)``, or ``(x_u, x_v, e)`` when ``edge`` is given, traced as a `gsddmm` UDF.
    """
    graph = operand_graph(graph, embed, None)
    if callable(mode):
        _one_vertex_set("NeighborApply", graph, "a function mode")
        if embed is None:
            raise ValueError("NeighborApply: a function mode is called on each edge's (x_u, x_v): give the node "
                             "embeddings (embed=)")
        return gsddmm(graph, mode, src=embed, dst=embed, edge=edge)
    if isinstance(mode, torch.Tensor):     # `in` would compare it with each name; its repr lists its values
        raise ValueError(f"NeighborApply: mode must be one of {WEIGHTINGS} or a function, got a tensor of shape "
                         f"{list(mode.shape)}: per-edge weights are Pull's edge= (mode_g='mul')")
    if mode not in WEIGHTINGS:
        raise ValueError(f"NeighborApply: mode must be one of {WEIGHTINGS} or a function, got {mode!r}")
    if edge is not None:
        raise ValueError(f"NeighborApply: mode {mode!r} reads no edge= tensor; pass a function to use one")
    if mode != "mean":
        _one_vertex_set("NeighborApply", graph, f"mode {mode!r}")
    if mode in ("gcn", "mean"):
        dtype = _weight_dtype(mode, embed)
        if mode == "mean":
            return gsddmm(graph, None, dst=_in_degree_power(graph, -1.0, dtype))
        norm = _in_degree_power(graph, -0.5, dtype)
        return gsddmm(graph, _mul, src=norm, dst=norm)
    if embed is None:
        raise ValueError(f"NeighborApply: mode {mode!r} needs the node embeddings (embed=)")
    if mode == "dot" and embed.dim() < 2:
        raise ValueError(f"NeighborApply: mode 'dot' sums x_u * x_v over the feature dim; embed is "
                         f"{list(embed.shape)}, one value per vertex (give it as [N, 1], or use mode 'mul')")
    return gsddmm(graph, _dot if mode == "dot" else _mul, src=embed, dst=embed)


def _check_weight_shape(edge: torch.Tensor, embed: torch.Tensor) -> None:
    """Refuse edge weights that cannot multiply the messages row by row, naming both shapes:
    else the tracer refused ``w * s`` at the line of `_weighted`, gnnfuse's own code, with
    a broadcast error on its probe shapes that named neither ``edge=`` nor ``embed``."""
    if edge.dim() != embed.dim():
        # torch's right-aligned broadcasting would pair the edge axis of one with a feature axis of the other
        fix = "edge.unsqueeze(-1)" if edge.dim() < embed.dim() else "edge.squeeze(-1), or embed.unsqueeze(-1)"
        raise ValueError(f"Pull: mode_g='mul' multiplies each message x_u by its edge weight, so edge= must have "
                         f"as many dims as embed ([E, 1], as NeighborApply gives it, for a [N, F] embed); got "
                         f"edge {list(edge.shape)} and embed {list(embed.shape)}: pass {fix}")
    try:
        torch.broadcast_shapes(edge.shape[1:], embed.shape[1:])
    except RuntimeError:
        raise ValueError(f"Pull: mode_g='mul' multiplies each message x_u by its edge weight, but edge= has "
                         f"per-edge shape {list(edge.shape[1:])}, which does not broadcast with embed's per-vertex "
                         f"shape {list(embed.shape[1:])} (edge {list(edge.shape)}, embed {list(embed.shape)}); "
                         "give each edge one weight per row ([E, 1]) or one per feature") from None


def Pull(graph: Graph | object, embed: torch.Tensor, edge: torch.Tensor | None = None,
         mode_g: str | Callable = "mul", mode_h: str = "sum", *,
         schedule: str | Schedule | None = None) -> torch.Tensor:
    """Aggregate over each vertex's in-edges: ``h_v = mode_h over u -> v of g(x_u, ...)`` ([N, ...]).

    ``mode_g``: ``"mul"`` -- ``e * x_u`` with the edge weights ``edge`` (from
    `NeighborApply`); ``"copy"`` -- ``x_u``; or a function of ``(x_u, x_v, e)`` (of
    ``(x_u, x_v)`` without ``edge``), traced as a `gspmm` UDF. ``mode_h``: sum, mean, max
    or min. ``schedule`` is `gspmm`'s (FeatGraph's per-call schedule).
    """
    if not isinstance(mode_h, str) or mode_h not in REDUCERS:
        raise ValueError(f"Pull: mode_h must be one of {REDUCERS}, got {mode_h!r}")
    if callable(mode_g):
        graph = operand_graph(graph, embed, None)
        _one_vertex_set("Pull", graph, "a function mode_g")
        return gspmm(graph, mode_g, mode_h, src=embed, dst=embed, edge=edge, schedule=schedule)
    if mode_g not in MESSAGES:
        raise ValueError(f"Pull: mode_g must be one of {MESSAGES} or a function, got {mode_g!r}")
    if (mode_g == "mul") != (edge is not None):
        raise ValueError("Pull: mode_g='mul' weights each message by edge= (give it); 'copy' reads no edge= "
                         f"(got mode_g={mode_g!r} with edge={'a tensor' if edge is not None else 'None'})")
    if mode_g == "mul" and isinstance(edge, torch.Tensor) and isinstance(embed, torch.Tensor):
        _check_weight_shape(edge, embed)
    message = _weighted if mode_g == "mul" else None
    return gspmm(graph, message, mode_h, src=embed, edge=edge, schedule=schedule)


class Apply(nn.Module):
    """The combination step: ``activation(x @ W^T + b)``, a dense layer on vertex rows
    (GraphTensor's Apply: matmul, bias add, activation). ``lin`` is an ``nn.Linear``, so
    weights copy to and from PyG-style layers by name."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True,
                 activation: Callable[[torch.Tensor], torch.Tensor] | None = None):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        return out if self.activation is None else self.activation(out)
