"""Plain-PyTorch baselines that the compiled gnnfuse layers replace.

They use only gather/`index_add_` over the edge list -- no torch_geometric, no gnnfuse
compiler -- so they are an independent accuracy and speed reference for the CLI and the
benchmarks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..graph import Graph
from .functional import dropout


def gcn_norm(graph: Graph) -> tuple[Graph, torch.Tensor]:
    """(graph with one self loop per vertex, per-edge weight deg^-1/2[src] * deg^-1/2[dst]).

    Kipf & Welling's symmetric normalisation of A + I, with in-degrees as in PyG's
    `gcn_norm`. Cached per graph, since it depends only on the topology.
    """
    def build(g: Graph) -> tuple[Graph, torch.Tensor]:
        looped = g.remove_self_loops().add_self_loops()
        inv_sqrt = looped.in_degrees().to(torch.float32).pow(-0.5)
        return looped, inv_sqrt[looped.src] * inv_sqrt[looped.dst]
    return graph.cached("reference_gcn_norm", build)


class GCNLayer(nn.Module):
    """One graph convolution: ``D^-1/2 (A + I) D^-1/2 X W + b``."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_dim, out_dim))
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x: torch.Tensor, graph: Graph | torch.Tensor) -> torch.Tensor:
        # an edge_index as the other registered models take it (its graph cached while unchanged)
        looped, weight = gcn_norm(Graph.coerce(graph, num_nodes=x.shape[0]))
        h = x @ self.weight                            # transform first: fewer columns to move
                                                       # (x may be sparse COO: see `functional.dropout`)
        out = torch.zeros_like(h).index_add_(0, looped.dst, h[looped.src] * weight.unsqueeze(1))
        return out + self.bias


class GCN(nn.Module):
    """The two-layer GCN of Kipf & Welling: dropout, conv, ReLU, dropout, conv."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.conv1 = GCNLayer(in_dim, hidden)
        self.conv2 = GCNLayer(hidden, out_dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, graph: Graph) -> torch.Tensor:
        x = dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(x, graph))
        x = dropout(x, self.dropout, self.training)
        return self.conv2(x, graph)
