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
    ``layouts`` are the tensors the loader built ahead for the layers' kernels
    (`loader.layouts`), listed so their memory is tied to the consumer's stream.
    """
    graph: Graph
    src_nodes: torch.Tensor
    layouts: tuple[torch.Tensor, ...] = ()

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
        graph = self.graph
        return [graph.src, graph.dst, *graph.csr(), *graph.reverse_csr(), graph.in_degrees(), graph.out_degrees(),
                self.src_nodes, *self.layouts]


def block_graph(rowptr: torch.Tensor, local_src: torch.Tensor, local_dst: torch.Tensor, num_src: int) -> Graph:
    """The bipartite graph of a block whose edges come grouped by destination
    (``rowptr``, ``local_src``; ``local_dst`` is each edge's destination), with both of
    its layouts and degree vectors already in the graph's cache.

    Why here: a layer's forward reads the CSR, its backward the reverse CSR (out-edges
    grouped by source), and both degree vectors. Built lazily they would run in the
    training step, once per block, and `Graph` builds them with ``bincount``, which on a
    GPU reads its input's maximum back to the host: a sync that drains the device queue
    every layer of every batch. The sample already holds the CSR (edges in destination
    order, identity edge ids: exactly what `Graph.csr`'s sort would give), the in-degrees
    are its row lengths, and the reverse layout is one stable sort of the sources with
    its row pointers found by binary search -- nothing is read back to the host.
    """
    graph = Graph(local_src, local_dst, rowptr.numel() - 1, num_src_nodes=num_src)
    dtype, device = graph.index_dtype, local_src.device
    rowptr, local_src, local_dst = rowptr.long(), local_src.long(), local_dst.long()
    edges = torch.arange(local_src.numel(), device=device)
    by_source = torch.sort(local_src, stable=True)
    reverse_rowptr = torch.searchsorted(by_source.values, torch.arange(num_src + 1, device=device))
    layouts = {
        "csr": CSR(rowptr.to(dtype), local_src.to(dtype), edges.to(dtype)),
        "reverse_csr": CSR(reverse_rowptr.to(dtype), local_dst[by_source.indices].to(dtype),
                           by_source.indices.to(dtype)),
        "in_degrees": rowptr.diff(),
        "out_degrees": reverse_rowptr.diff(),
    }
    for key, value in layouts.items():
        graph.cached(key, lambda g, v=value: v)
    return graph
