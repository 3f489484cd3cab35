"""A sampled layer's bipartite graph: what one GNN layer of a mini-batch runs on."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..graph import CSR, Graph
from ..graph.fixed_shape import mark_loader_block, prefill


@dataclass(frozen=True)
class Block:
    """One layer's destination-centric block (DGL's name). PyG's sampled subgraph holds
    per hop only the block's edges into the vertices that hop expands first
    (`loader.pyg_batch`): a block samples the earlier hops' vertices again.

    ``graph`` is bipartite: ``num_src`` sources, ``num_dst`` destinations, an edge per
    sampled in-edge, sources numbered so that the first ``num_dst`` are the destinations
    themselves (a layer reads ``x_dst = x_src[:num_dst]``). ``src_nodes`` are the global
    ids of the sources (so ``src_nodes[:num_dst]`` those of the destinations).
    ``layouts`` are the tensors the loader built ahead for the layers' kernels
    (`loader.layouts`), listed so their memory is tied to the consumer's stream.

    When the loader was given edge tables (a PyG ``Data``'s ``edge_attr`` or
    ``edge_weight``), ``e_id`` holds each block edge's id in the full graph's
    ``edge_index`` (PyG's name) and ``edge_attr``/``edge_weight`` its rows of those
    tables, in the block's edge order (``edge_index``'s columns), so a layer takes them
    as it takes a full graph's: ``conv((x, x[:block.num_dst]), block.graph,
    block.edge_attr)``. Otherwise they are None: a block holds no edge ids by default,
    which would cost a gather and a copy per hop that nothing reads. A padded block's
    padding edges (between padded vertices only) have id 0 and zero rows.
    """
    graph: Graph
    src_nodes: torch.Tensor
    layouts: tuple[torch.Tensor, ...] = ()
    e_id: torch.Tensor | None = None
    edge_attr: torch.Tensor | None = None
    edge_weight: torch.Tensor | None = None

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
        edge_tables = [t for t in (self.e_id, self.edge_attr, self.edge_weight) if t is not None]
        return [graph.src, graph.dst, *graph.csr(), graph.in_degrees(), graph.out_degrees(), self.src_nodes,
                *self.layouts, *edge_tables]


def block_graph(rowptr: torch.Tensor, local_src: torch.Tensor, local_dst: torch.Tensor, num_src: int, *,
                sampled: bool = False, out_degrees: torch.Tensor | None = None,
                one_vertex_set: bool = False, position: int | None = None) -> Graph:
    """The bipartite graph of a block whose edges come grouped by destination
    (``rowptr``, ``local_src``; ``local_dst`` is each edge's destination), with its CSR
    and both degree vectors already in the graph's cache. ``sampled``: the ids are the
    int64 local ids `loader.sampler` built, in range by construction, so their range
    is not checked (otherwise it is, as `Graph` checks any ids). ``out_degrees``: the
    sources' int64 out-degrees when the caller has counted them already.
    ``one_vertex_set``: the sources are the destinations (``num_src`` of them, as many
    as ``rowptr`` has rows), so the graph is not bipartite: PyG's subgraph of a batch
    (`loader.pyg_batch.subgraph_graph`). ``position``: where in its batch the loader
    placed it (`graph.fixed_shape.mark_loader_block`).

    Why here: built lazily they would run in the training step, once per block, and
    `Graph` builds them with a sort and ``bincount``, which on a GPU reads its input's
    maximum back to the host: a sync that drains the device queue. The sample already
    holds the CSR (edges in destination order, identity edge ids: exactly what
    `Graph.csr`'s sort would give), the in-degrees are its row lengths and the
    out-degrees one scatter-add; nothing is read back to the host (nor, for sampled
    ids, by the four range checks).
    """
    sources = None if one_vertex_set else num_src
    if one_vertex_set and num_src != rowptr.numel() - 1:
        raise ValueError(f"a graph of one vertex set has a row per vertex: {num_src} vertices, "
                         f"{rowptr.numel() - 1} rows")
    if sampled:
        graph = Graph._of_valid_ids(local_src, local_dst, rowptr.numel() - 1, sources)
    else:
        graph = Graph(local_src, local_dst, rowptr.numel() - 1, num_src_nodes=sources)
    dtype, device = graph.index_dtype, local_src.device
    rowptr, local_src = rowptr.long(), local_src.long()
    edges = torch.arange(local_src.numel(), device=device, dtype=dtype)
    if out_degrees is None:
        out_degrees = torch.zeros(num_src, dtype=torch.int64, device=device).index_add_(
            0, local_src, torch.ones(local_src.numel(), dtype=torch.int64, device=device))
    prefill(graph, csr=CSR(rowptr.to(dtype), local_src.to(dtype), edges), in_degrees=rowptr.diff(),
             out_degrees=out_degrees)
    return mark_loader_block(graph, position)
