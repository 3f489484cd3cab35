"""The `HeteroGraph` made for a PyG ``edge_index_dict``, remembered while its tensors are
unchanged -- the hetero counterpart of `index_cache`.

PyG hetero models call every layer with ``data.edge_index_dict``, a new dict of the same
tensors each time. A `HeteroGraph` built per call would re-concatenate the indices and
re-sort the CSR (and every other cached layout) in every layer on every step, so the graph
made for a set of tensors is served again while each of them is the very same object
(held through a weak reference: a new tensor that reuses a freed one's id and memory is
not mistaken for it) in the same state (`index_cache`'s stamp: version counter, data
pointer, shape, strides, dtype, device), and the vertex counts and type numbering agree.
An entry is dropped as soon as one of its tensors is freed.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Hashable, Iterable, Mapping

import torch

from .convert import index_tensors
from .hetero import EdgeType, HeteroGraph
from .index_cache import _LOCK, CAPACITY, _stamp, put_recent

# key -> (weak references to the tensors, their stamp, the graph, the storages stamped)
_ENTRIES: OrderedDict[Hashable, tuple[list[weakref.ref], tuple, HeteroGraph, tuple]] = OrderedDict()


def cached_hetero_graph(edge_index_dict: Mapping[EdgeType, Any], num_nodes_dict: Mapping[str, int], *,
                        node_types: Iterable[str], edge_types: Iterable[EdgeType]) -> HeteroGraph:
    """``HeteroGraph(edge_index_dict, num_nodes_dict, ...)``, or the one an earlier call
    built from the same tensors in the same state."""
    node_types, edge_types = list(node_types), [tuple(t) for t in edge_types]

    def build() -> HeteroGraph:
        return HeteroGraph(edge_index_dict, num_nodes_dict, node_types=node_types, edge_types=edge_types)

    items = list(edge_index_dict.items())
    tensors = [index for _, index in items]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return build()                        # refused there, with the reason
    # an EdgeIndex counts with the plain tensor it holds (`index_tensors`): an edit through
    # ``ei.as_tensor()`` moves only the latter's version, and HGTConv ran on the old edges
    parts = [part for t in tensors for part in index_tensors(t)]
    stamp = _stamp(parts)
    if stamp is None:
        return build()
    counts = tuple((t, int(num_nodes_dict[t])) if t in num_nodes_dict else (t, None) for t in node_types)
    key = (tuple((tuple(edge_type), id(index)) for edge_type, index in items), counts, tuple(edge_types))
    with _LOCK:     # index_cache's, for the same reason: threads evicting each other's entries
        entry = _ENTRIES.get(key)
        if entry is not None and entry[1] == stamp and all(ref() is t for ref, t in zip(entry[0], tensors)):
            _ENTRIES.move_to_end(key)
            return entry[2]
    hetero = build()
    refs = [weakref.ref(t, lambda dead, key=key: _forget(key, dead)) for t in tensors]
    # the storages stamped, kept so their addresses cannot come back (`index_cache`'s reason)
    storages = tuple([part.untyped_storage() for part in parts])
    with _LOCK:
        put_recent(_ENTRIES, key, (refs, stamp, hetero, storages), CAPACITY)
    return hetero


def _forget(key: Hashable, dead: weakref.ref) -> None:
    """Drop the entry one of whose tensors was just freed (unless the key was reused)."""
    with _LOCK:
        entry = _ENTRIES.get(key)
        if entry is not None and any(ref is dead for ref in entry[0]):
            del _ENTRIES[key]


def clear_hetero_cache() -> None:
    """Forget every remembered `HeteroGraph` (and free its layouts): what a benchmark
    does between frameworks, so each one's graph caches count in its own memory."""
    with _LOCK:
        _ENTRIES.clear()
