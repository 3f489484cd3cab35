"""A sampled layer's bipartite graph: what one GNN layer of a mini-batch runs on."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..graph import CSR, Graph


@dataclass(frozen=True)
class Block:
    """One layer's destination-centric block (DGL's name; PyG calls the same thing one
    hop of a sampled subgraph).

    ``graph`` is bipartite: ``num_src`` sources, ``num_dst`` destinations, an edge per
    sampled in-edge, sources numbered so that the first ``num_dst`` are the destinations
    themselves (a layer reads ``x_dst = x_src[:num_dst]``). ``src_nodes`` are the global
    ids of the sources (so ``src_nodes[:num_dst]`` those of the destinations).
    """
    graph: Graph
    src_nodes: torch.Tensor

    @property
    def num_src(self) -> int:
        return self.graph.num_src_nodes

    @property
    def num_dst(self) -> int:
        return self.graph.num_dst_nodes

    @property
    def edge_index(self) -> torch.Tensor:
        """``[2, E]`` local (source, destination) ids, PyG's layout."""
        return self.graph.edge_index

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the block holds (to tie their memory to a consumer's CUDA stream)."""
        csr = self.graph.csr()
        return [self.graph.src, self.graph.dst, csr.rowptr, csr.col, csr.eid, self.src_nodes]


def block_graph(rowptr: torch.Tensor, local_src: torch.Tensor, local_dst: torch.Tensor, num_src: int) -> Graph:
    """The bipartite graph of a block whose edges come grouped by destination
    (``rowptr``, ``local_src``; ``local_dst`` is each edge's destination). Its CSR is the
    sampled layout itself, stored in the graph's layout cache, so no per-batch sort
    regroups the edges (the sort `Graph.csr` would do gives exactly this layout: edges in
    destination order, identity edge ids)."""
    graph = Graph(local_src, local_dst, rowptr.numel() - 1, num_src_nodes=num_src)
    dtype = graph.index_dtype
    edges = torch.arange(local_src.numel(), device=local_src.device, dtype=dtype)
    graph.cached("csr", lambda g: CSR(rowptr.to(dtype), local_src.to(dtype), edges))
    return graph
