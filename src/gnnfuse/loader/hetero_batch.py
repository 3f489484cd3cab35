"""A heterogeneous batch as PyG's loader hands it: the ``HeteroData`` cut to a sample.

PyG's ``filter_hetero_data`` keeps every node-level attribute of a node type (``x``,
``y``, masks: the rows of the sampled vertices, so ``y`` holds every sampled vertex's
label) and every edge-level attribute of an edge type (``edge_attr``: the rows of the
sampled edges), replaces ``edge_index`` by the sample's local ids, and the loader adds
``n_id``, ``e_id``, ``num_sampled_nodes``, ``num_sampled_edges``, and ``input_id`` and
``batch_size`` on the input type. This does the same, so PyG code written against those
names runs on the batch.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from .hetero_sampler import HeteroSample


def hetero_batch(data: Any, sample: HeteroSample, input_type: str, input_id: torch.Tensor) -> Any:
    """``data`` (a PyG ``HeteroData``) restricted to ``sample``, with PyG's batch attributes."""
    _check_types(data, sample)
    out = copy.copy(data)
    for node_type in data.node_types:
        store, out_store, n_id = data[node_type], out[node_type], sample.n_id[node_type]
        for key, value in store.items():
            if key != "num_nodes" and store.is_node_attr(key):
                out_store[key] = _rows(value, n_id, data.__cat_dim__(key, value, store))
        out_store.num_nodes = n_id.numel()
        if "n_id" not in store:
            out_store.n_id = n_id
        out_store.num_sampled_nodes = sample.num_sampled_nodes[node_type]
    for edge_type in data.edge_types:
        store, out_store, e_id = data[edge_type], out[edge_type], sample.e_id[edge_type]
        for key, value in store.items():
            if key == "edge_index":
                out_store.edge_index = sample.edge_index[edge_type].to(value.device)
            elif store.is_edge_attr(key):
                out_store[key] = _rows(value, e_id, data.__cat_dim__(key, value, store))
        if "e_id" not in store:
            out_store.e_id = e_id
        out_store.num_sampled_edges = sample.num_sampled_edges[edge_type]
    out[input_type].input_id = input_id
    out[input_type].batch_size = input_id.numel()
    return out


def _check_types(data: Any, sample: HeteroSample) -> None:
    """Refuse a node or edge type ``data`` gained after the loader was built: the loader
    samples the types it had then, so the new one has nothing to be cut to (it failed as
    a bare ``KeyError`` here; `HeldHeteroData` watches edge types, by their
    ``edge_index``, but not node types unless there are worker processes)."""
    added = ([t for t in data.node_types if t not in sample.n_id]
             + [t for t in data.edge_types if t not in sample.e_id])
    if added:
        raise RuntimeError(
            f"data[{added[0]!r}] was added after this NeighborLoader was built: it samples the node and edge "
            f"types the HeteroData had then, so the new one has no sample to cut a batch to. Build a new "
            f"NeighborLoader on the HeteroData")


def _rows(value: Any, index: torch.Tensor, dim: int) -> Any:
    """Entries ``index`` of a node- or edge-level attribute along ``dim``: a tensor where
    it is, anything else (a NumPy array, a list) as PyG's loader takes it."""
    if isinstance(value, torch.Tensor):
        return value.index_select(dim, index.to(value.device))
    from torch_geometric.loader.utils import index_select
    return index_select(value, index.cpu(), dim=dim)
