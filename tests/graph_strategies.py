"""Hypothesis strategies for the graphs and features that break graph kernels: isolated
vertices, self loops, multi-edges, a hub whose in-edges fill more than one kernel tile,
int32 and int64 indices, a non-contiguous ``edge_index`` (``.t()`` of an [E, 2] edge
list, as PyG code often builds it) and NaN/inf features.

Big tensors are drawn from a seed rather than element by element, which keeps examples
cheap to generate and shrink; the structure that matters (sizes, loops, the hub, index
layout, where a non-finite value sits) is drawn directly, so a failure shrinks to it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

NUM_RELATIONS = 3   # edge types drawn for RGCNConv


@dataclass(frozen=True)
class GraphCase:
    """One random graph: ``edge_index`` (int64, contiguous) is what the oracle gets,
    ``given`` the same edges as a user might hand them to gnnfuse (int32 or int64,
    possibly a strided view); ``edge_type`` one relation per edge."""
    num_nodes: int
    edge_index: torch.Tensor
    given: torch.Tensor
    edge_type: torch.Tensor

    def to(self, device: str) -> GraphCase:
        return GraphCase(self.num_nodes, self.edge_index.to(device), self.given.to(device),
                         self.edge_type.to(device))


@st.composite
def graphs(draw, max_nodes: int = 6, max_edges: int = 14, hub_degrees: st.SearchStrategy[int] = st.just(0)
           ) -> GraphCase:
    """A random directed multigraph: up to ``max_nodes`` connected-or-not vertices plus up
    to two always-isolated ones, up to ``max_edges`` edges drawn as pairs (so loops and
    repeats are common), and optionally a hub: vertex 0 with ``hub_degrees`` extra in-edges."""
    active = draw(st.integers(1, max_nodes))
    num_nodes = active + draw(st.integers(0, 2))
    vertex = st.integers(0, active - 1)
    pairs = draw(st.lists(st.tuples(vertex, vertex), max_size=max_edges))
    hub = draw(hub_degrees)
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    edges = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
    if hub:
        sources = torch.randint(0, active, (hub,), generator=gen)
        edges = torch.cat([edges, torch.stack([sources, torch.zeros_like(sources)], 1)])
    index_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    transposed = draw(st.booleans())
    edge_index = edges.t().contiguous()
    given = edges.to(index_dtype).t() if transposed else edge_index.to(index_dtype)
    edge_type = torch.randint(0, NUM_RELATIONS, (edges.shape[0],), generator=gen)
    return GraphCase(num_nodes, edge_index, given, edge_type)


NON_FINITE = (float("nan"), float("inf"), float("-inf"))


@st.composite
def features(draw, num_nodes: int, channels: int, non_finite: bool = True) -> torch.Tensor:
    """[num_nodes, channels] float64 standard-normal features, with (when ``non_finite``)
    up to two entries replaced by NaN, inf or -inf."""
    seed = draw(st.integers(0, 2**16))
    x = torch.randn(num_nodes, channels, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    if non_finite:
        entry = st.tuples(st.integers(0, num_nodes - 1), st.integers(0, channels - 1), st.sampled_from(NON_FINITE))
        for row, column, value in draw(st.lists(entry, max_size=2)):
            x[row, column] = value
    return x
