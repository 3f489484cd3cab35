"""Relational encoders with a DistMult decoder, for link prediction on knowledge graphs
(R-GCN's setting, Schlichtkrull et al. 2018 §4).

Entities have no features, so each starts from a learnt embedding row; two relational
layers (``RGCNConv`` or ``RGATConv``) run over the training triples, each relation
``r`` also read backwards as relation ``r + R`` (messages flow both ways, as in the
paper); DistMult scores a triple as ``<z_h, d_r, z_t>`` with one diagonal ``d_r`` per
original relation.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..graph import Graph
from .hetero_relational import RGATConv
from .relational import RGCNConv


def with_inverse_relations(graph: Graph) -> Graph:
    """``graph`` plus every edge reversed, typed ``relation + num_edge_types``; its node
    types kept (they were dropped)."""
    if graph.edge_type is None:
        raise ValueError("with_inverse_relations: the graph has no edge types (relations); build it with "
                         "edge_type=... (Graph(src, dst, num_nodes, edge_type=relation))")
    if graph.is_bipartite:
        raise ValueError(f"with_inverse_relations: the graph is bipartite ({graph.num_src_nodes} sources, "
                         f"{graph.num_nodes} destinations), whose edges cannot be reversed onto one vertex set; "
                         "build it over one vertex set (no num_src_nodes)")
    r = graph.num_edge_types
    return Graph(torch.cat([graph.src, graph.dst]), torch.cat([graph.dst, graph.src]), graph.num_nodes,
                 edge_type=torch.cat([graph.edge_type, graph.edge_type + r]), num_edge_types=2 * r,
                 node_type=graph.node_type, num_node_types=graph.num_node_types)


class DistMultLinkModel(nn.Module):
    """embedding -> conv1 -> ReLU -> dropout -> conv2, scored by DistMult.

    ``forward(graph)`` takes the training graph with inverse relations
    (`with_inverse_relations`) and returns every entity's representation;
    ``score(z, triples)`` the DistMult score of ``[T, 3]`` (head, relation, tail) triples.
    """

    def __init__(self, num_entities: int, num_relations: int, hidden: int, dropout: float,
                 conv: Callable[[int, int, int], nn.Module]):
        super().__init__()
        self.embedding = nn.Embedding(num_entities, hidden)
        self.conv1, self.conv2 = conv(hidden, hidden, 2 * num_relations), conv(hidden, hidden, 2 * num_relations)
        self.relation = nn.Parameter(torch.empty(num_relations, hidden))
        self.dropout = dropout
        # Glorot-scaled, not nn.Embedding's N(0, 1): with unit rows a DistMult score sums
        # `hidden` products of size ~1 and the first steps' logits saturate
        nn.init.xavier_uniform_(self.embedding.weight)
        nn.init.xavier_uniform_(self.relation)

    def forward(self, graph: Graph) -> torch.Tensor:
        x = F.relu(self.conv1(self.embedding.weight, graph))
        return self.conv2(F.dropout(x, self.dropout, self.training), graph)

    def score(self, z: torch.Tensor, triples: torch.Tensor) -> torch.Tensor:
        return (z[triples[:, 0]] * self.relation[triples[:, 1]] * z[triples[:, 2]]).sum(-1)

    def query_scores(self, z: torch.Tensor, anchor: torch.Tensor, relation: torch.Tensor) -> torch.Tensor:
        """[Q, entities]: the score of every entity completing each (anchor, relation)
        query; DistMult is symmetric, so one formula serves head and tail queries."""
        return (z[anchor] * self.relation[relation]) @ z.t()


def rgcn_link_model(num_entities: int, num_relations: int, hidden: int, dropout: float) -> DistMultLinkModel:
    return DistMultLinkModel(num_entities, num_relations, hidden, dropout,
                             lambda i, o, r: RGCNConv(i, o, r, aggr="mean"))


def rgat_link_model(num_entities: int, num_relations: int, hidden: int, dropout: float) -> DistMultLinkModel:
    return DistMultLinkModel(num_entities, num_relations, hidden, dropout,
                             lambda i, o, r: RGATConv(i, o, r, heads=1))
