"""The graph indices movement ops read while a program runs."""
from __future__ import annotations

import torch

from ...graph import Graph
from ...ir import Residency


class GraphContext:
    """Adapts a `Graph` to the registry's `ExecContext`: int64 indices by name."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.num_nodes = graph.num_nodes
        self.num_edges = graph.num_edges
        self.src = graph.src
        self.dst = graph.dst

    def index(self, by: str) -> torch.Tensor:
        if by == "src":
            return self.src
        if by == "dst":
            return self.dst
        if self.graph.edge_type is None:
            raise ValueError("this program reads edge types but the graph has none (pass edge_type=)")
        return self.graph.edge_type

    def num_rows(self, by: str) -> int:
        return self.num_nodes if by in ("src", "dst") else int(self.graph.num_edge_types)

    def rows(self, residency: Residency) -> int:
        if residency is Residency.NODE:
            return self.num_nodes
        if residency.is_edge_rowed:
            return self.num_edges
        if residency is Residency.EDGE_TYPE:
            return int(self.graph.num_edge_types)
        if residency is Residency.NODE_TYPE:
            return int(self.graph.num_node_types)
        raise ValueError(f"{residency.name} values have no rows")

    def csr(self, by: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Edges grouped by ``by``: (rowptr, the other endpoint, edge ids)."""
        csr = self.graph.csr() if by == "dst" else self.graph.reverse_csr()
        return csr.rowptr, csr.col, csr.eid

    def order(self, by: str) -> torch.Tensor:
        """Group rows in descending degree, so the heaviest rows start first."""
        if by == "dst":
            return self.graph.degree_order()
        return self.graph.cached("out_degree_order", lambda g: torch.sort(
            g.out_degrees(), descending=True, stable=True).indices)

    def degree(self, by: str) -> torch.Tensor:
        return self.graph.in_degrees() if by == "dst" else self.graph.out_degrees()
