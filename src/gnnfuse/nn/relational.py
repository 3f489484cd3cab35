"""Relational graph convolution (R-GCN, Schlichtkrull et al.) with PyG's names, arguments
and parameter layout, its message written in the vertex-centric front end with per-edge
relation matrices (``e.type.W``), as Graphiler's R-GCN is."""
from __future__ import annotations

import torch
from torch import nn

from .. import frontend
from ..graph import Graph
from .arguments import node_features


@frontend.vertex
def _relational_mean(v):
    return sum([(e.src.h @ e.type.W) * e.norm for e in v.inedges])


@frontend.vertex
def _relational_sum(v):
    return sum([e.src.h @ e.type.W for e in v.inedges])


def _relation_mean_norm(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    """``1 / |N_r(v)|`` per edge into ``v`` of relation ``r``: each relation's messages are
    averaged apart, as PyG's ``aggr="mean"`` does. Cached on the graph."""
    def build(g: Graph) -> torch.Tensor:
        key = g.dst * g.num_edge_types + g.edge_type
        count = torch.bincount(key, minlength=g.num_nodes * g.num_edge_types)
        return 1.0 / count[key].to(torch.float64)
    return graph.cached("nn_relation_mean_norm", build).to(dtype)


class RGCNConv(nn.Module):
    """``x'_v = x_v Θ_root + Σ_r agg_{u ∈ N_r(v)} x_u Θ_r + b`` with ``agg`` the mean per
    relation (``aggr="mean"``, PyG's default) or the sum (``aggr="add"``/``"sum"``).

    ``num_bases`` shares the relation matrices as combinations of that many bases
    (``Θ_r = Σ_b comp[r, b] V_b``; parameters ``weight`` [bases, in, out] and ``comp``
    [relations, bases], as in PyG). ``forward(x, edge_index, edge_type=None)`` takes a typed
    `Graph` (``Graph(src, dst, n, edge_type=..., num_edge_types=num_relations)``) or a
    PyG ``edge_index`` with ``edge_type``. PyG's block-diagonal ``num_blocks`` and
    featureless input (``x=None``) are not supported and say so.
    """

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None,
                 num_blocks: int | None = None, aggr: str = "mean", root_weight: bool = True, bias: bool = True):
        super().__init__()
        if num_blocks is not None:
            raise NotImplementedError("RGCNConv(num_blocks=...) (block-diagonal relation matrices) is not "
                                      "supported; use num_bases or full matrices")
        if aggr not in ("mean", "add", "sum"):
            raise ValueError(f"aggr must be 'mean', 'add' or 'sum', got {aggr!r}")
        if num_relations < 1 or (num_bases is not None and num_bases < 1):
            raise ValueError(f"num_relations and num_bases must be >= 1, got {num_relations} and {num_bases}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_relations, self.num_bases, self.aggr = num_relations, num_bases, aggr
        self.weight = nn.Parameter(torch.empty(num_bases or num_relations, in_channels, out_channels))
        self.comp = nn.Parameter(torch.empty(num_relations, num_bases)) if num_bases is not None else None
        self.root = nn.Parameter(torch.empty(in_channels, out_channels)) if root_weight else None
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.weight, self.comp, self.root):
            if p is not None:
                nn.init.xavier_uniform_(p)   # PyG's glorot
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def relation_weights(self) -> torch.Tensor:
        """[num_relations, in, out]: the per-relation matrices (combined from the bases)."""
        if self.comp is None:
            return self.weight
        return (self.comp @ self.weight.reshape(self.num_bases, -1)).reshape(
            self.num_relations, self.in_channels, self.out_channels)

    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor,
                edge_type: torch.Tensor | None = None) -> torch.Tensor:
        if x is None:
            raise NotImplementedError("RGCNConv without node features (x=None) is not supported; pass "
                                      "an embedding, e.g. nn.Embedding(num_nodes, in_channels).weight")
        x = node_features(x, "RGCNConv")
        graph = self._typed_graph(x, edge_index, edge_type)
        feeds = {"W": self.relation_weights()}
        if self.aggr == "mean":
            out = _relational_mean(graph, {"h": x}, {"norm": _relation_mean_norm(graph, x.dtype)},
                                   etype_feature=feeds)
        else:
            out = _relational_sum(graph, {"h": x}, etype_feature=feeds)
        if self.root is not None:
            out = out + x @ self.root
        return out if self.bias is None else out + self.bias

    def _typed_graph(self, x: torch.Tensor, graph: Graph | torch.Tensor, edge_type: torch.Tensor | None) -> Graph:
        if isinstance(graph, Graph):
            if edge_type is not None:
                raise ValueError("pass edge_type inside the Graph (Graph(..., edge_type=...)) or with an "
                                 "edge_index, not both")
        else:
            if edge_type is None:
                raise ValueError("RGCNConv needs edge types: a Graph built with edge_type=..., or "
                                 "forward(x, edge_index, edge_type)")
            graph = Graph(graph[0], graph[1], x.shape[0], edge_type=edge_type, num_edge_types=self.num_relations)
        if graph.num_nodes != x.shape[0]:
            raise ValueError(f"x has {x.shape[0]} rows but the graph has {graph.num_nodes} nodes")
        if graph.num_edge_types != self.num_relations:
            raise ValueError(f"the graph has {graph.num_edge_types} edge types but the layer was built for "
                             f"num_relations={self.num_relations}")
        return graph

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"num_relations={self.num_relations})")
