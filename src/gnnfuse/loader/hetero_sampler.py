"""Neighbour sampling over a heterogeneous graph, PyG's rule, as vectorized torch.

PyG's heterogeneous sampler (pyg-lib's ``hetero_neighbor_sample``) runs hop by hop; in
hop k, for every edge type ``(src, rel, dst)`` in the graph's order, each vertex of type
``dst`` that hop k - 1 added (the seeds for hop 0) samples up to ``fanout[k]`` of its
in-edges of that type. New vertices of each type are numbered after those already
there, by first appearance: edge type by edge type, destination by destination, sample
by sample. A vertex a hop adds is expanded only in the next hop, even by a later edge
type of the same hop (a self relation's new papers wait for hop k + 1). Each edge type's
edges are listed hop by hop, by destination, ``edge_index`` holding (local source,
local destination) ids.

The per-hop work reuses the homogeneous sampler's pieces (`loader.sampler`): an edge
type's sample is `sample_slots` on its own CSR, or for a fanout without replacement the
fused kernels of `loader.hop_kernels` (Numba on a CPU, Triton on a GPU): on two CPU threads
of this project's machine, a batch of 1024 papers with ``[10, 10]`` from a 200K-paper,
355K-vertex, 4.2M-edge graph of five edge types (about 100K vertices sampled, their 128
features gathered) took 230 ms with `sample_slots`, mostly Floyd's sorts, and 28 ms with
the kernels. A node type's new vertices are numbered by the same sort-based first-occurrence pass, over that type's vertices so far
followed by every slot that samples one of them. A hop reads back once: each node
type's vertex count and each edge type's edge count, in one transfer (plus, as in the
homogeneous sampler, once per edge type whose fanout is -1: its sample has no bound).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..graph.fixed_shape import grouped_csr
from ..graph.graph import CSR
from .hop_kernels import fused_hops, hop_seed, sample_slots_fused
from .sampler import Slots, edge_slots, first_occurrence_ids, read_back, sample_slots

EdgeType = tuple[str, str, str]


class HeteroSample(NamedTuple):
    """A batch's sampled subgraph, PyG's ``HeteroSamplerOutput`` by another name:
    ``n_id`` per node type (global ids, seeds first for the input type),
    ``edge_index`` per edge type (local ids into the source and destination types'
    ``n_id``), ``e_id`` (columns of the full ``edge_index``), and PyG's per-hop counts."""
    n_id: dict[str, torch.Tensor]
    edge_index: dict[EdgeType, torch.Tensor]
    e_id: dict[EdgeType, torch.Tensor]
    num_sampled_nodes: dict[str, list[int]]
    num_sampled_edges: dict[EdgeType, list[int]]


def typed_csr(edge_index: torch.Tensor, num_dst: int) -> CSR:
    """One edge type's in-edges grouped by destination, from an (already checked)
    ``[2, E]`` int64 edge index whose destinations are ids below ``num_dst``: ``rowptr``
    over the destination type's vertices, ``col`` the sources (ids of the source type),
    ``eid`` each position's column in ``edge_index`` (a stable sort: a destination's
    edges in ``edge_index`` order, as PyG's CSC)."""
    return grouped_csr(edge_index[1], edge_index[0], num_dst, torch.int64)


def sample_hetero(csrs: dict[EdgeType, CSR], num_nodes: dict[str, int], input_type: str, seeds: torch.Tensor,
                  fanouts: dict[EdgeType, Sequence[int]], num_hops: int, replace: bool,
                  generator: torch.Generator | None) -> HeteroSample:
    """The subgraph PyG samples for ``seeds`` (distinct ids of ``input_type``), every
    edge type of ``csrs`` (the graph's order) taking ``fanouts[edge_type][k]`` in-edges
    per vertex in hop k (-1 all, 0 none). Tensors are on the CSRs' device, as
    ``generator`` must be."""
    device = seeds.device
    nodes = {t: torch.empty(0, dtype=torch.int64, device=device) for t in num_nodes}
    nodes[input_type] = seeds.long()
    frontier = {t: (0, ids.numel()) for t, ids in nodes.items()}
    hop_edges: dict[EdgeType, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {et: [] for et in csrs}
    sampled_nodes = {t: [ids.numel()] for t, ids in nodes.items()}
    sampled_edges: dict[EdgeType, list[int]] = {et: [] for et in csrs}
    for hop in range(num_hops):
        slots = {}
        for index, (edge_type, csr) in enumerate(csrs.items()):
            begin, end = frontier[edge_type[2]]
            if fanouts[edge_type][hop] != 0 and end > begin:
                slots[edge_type] = _sample(csr, nodes[edge_type[2]][begin:end], fanouts[edge_type][hop], replace,
                                           generator, hop * len(csrs) + index)
        numbered = {t: _number_new(nodes[t], [(et, s) for et, s in slots.items() if et[0] == t], num_nodes[t])
                    for t in num_nodes}
        counts = read_back(torch.stack([count for _, _, count in numbered.values()]
                                        + [s.rowptr[-1] for s in slots.values()]))
        distinct, edges = dict(zip(numbered, counts)), dict(zip(slots, counts[len(numbered):]))
        for edge_type in csrs:
            if edge_type not in slots:
                sampled_edges[edge_type].append(0)
                continue
            row, slot = edge_slots(slots[edge_type], edges[edge_type])
            local_src = numbered[edge_type[0]][1][edge_type][slot]
            local_dst = row + frontier[edge_type[2]][0]
            hop_edges[edge_type].append((local_src, local_dst, csrs[edge_type].eid[slots[edge_type].eid[slot]]))
            sampled_edges[edge_type].append(edges[edge_type])
        for t, (ids, _, _) in numbered.items():
            frontier[t] = (nodes[t].numel(), distinct[t])
            nodes[t] = ids[:distinct[t]]
            sampled_nodes[t].append(distinct[t] - frontier[t][0])
    edge_index, e_id, empty = {}, {}, torch.empty(0, dtype=torch.int64, device=device)
    for edge_type, parts in hop_edges.items():
        src, dst, eid = (torch.cat(column) for column in zip(*parts)) if parts else (empty, empty, empty)
        edge_index[edge_type], e_id[edge_type] = torch.stack([src, dst]), eid
    return HeteroSample(nodes, edge_index, e_id, sampled_nodes, sampled_edges)


def _sample(csr: CSR, dst: torch.Tensor, fanout: int, replace: bool, generator: torch.Generator | None,
            stream: int) -> Slots:
    """One edge type's sample for the vertices ``dst``: by the homogeneous loader's fused
    kernels where they run (a fanout without replacement, on a GPU or with Numba:
    `hop_kernels`, drawing from counter stream ``stream`` of the batch's generator), else
    by `sample_slots`. The kernels mark an empty slot with the CSR's row count, a valid
    source id of another node type, so which slots hold edges is read from the counts."""
    if generator is None or not fused_hops(dst.device, fanout, replace, dst.numel()):
        return sample_slots(csr.rowptr, csr.col, dst, fanout, replace, generator)
    slots = sample_slots_fused(csr.rowptr, csr.col, dst, fanout, hop_seed(generator, stream))
    valid = torch.arange(fanout, device=dst.device) < slots.count.unsqueeze(1)
    return slots._replace(valid=valid.flatten())


def _number_new(known: torch.Tensor, sampled: list[tuple[EdgeType, Slots]], num_nodes: int
                ) -> tuple[torch.Tensor, dict[EdgeType, torch.Tensor], torch.Tensor]:
    """A node type's vertices after a hop: (``known`` then the new sources by first
    appearance, padded; each edge type's slots as local ids; the count, on the device).
    ``known`` are distinct, so they keep their ids; an empty slot's source is set to
    ``num_nodes``, which gets no id (`sample_slots` marks it with its CSR's row count,
    the destination type's size, a valid id of another type)."""
    sources = [s.src if s.valid is None else torch.where(s.valid, s.src, num_nodes) for _, s in sampled]
    local, ids, count = first_occurrence_ids(torch.cat([known, *sources]), num_nodes)
    per_type, start = {}, known.numel()
    for (edge_type, _), src in zip(sampled, sources):
        per_type[edge_type] = local[start:start + src.numel()]
        start += src.numel()
    return ids, per_type, count
