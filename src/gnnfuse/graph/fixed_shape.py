"""Graphs padded to fixed capacities, and layouts built without reading back to the host.

A CUDA graph replays fixed shapes, so a captured mini-batch step runs on blocks padded to
capacities (`loader.static_shapes`), and a captured graph-classification step on a batch
of whole graphs so padded (`loader.padded_graph_batch`): the real vertices and edges
first, then padding, with the last source row and the last destination row always
padded ones (each level keeps at least one padded row). Such a graph is *marked* (`mark_padded`), so a layer
that would derive a graph of data-dependent size from it -- PyG's self-loop handling
drops the loops it finds, a count only the device knows -- can derive one of fixed size
instead (`nn.padded_loops`), which the step then rebuilds inside the graph on every
replay rather than caching the first batch's.

The builders here read nothing back to the host: a layout `Graph` would build with
``bincount`` (which reads its input's maximum) or ``nonzero`` is built from a stable
sort and a binary search, so it can run in a captured step or in a loader thread
without draining the device's queue.
"""
from __future__ import annotations

from typing import Callable

import torch

from .graph import CSR, Graph, scatter_counts

PADDED = "padded_to_capacity"     # graph cache key: the graph is padded (see module doc)
LOADER_BLOCK = "loader_block"     # graph cache key: a block a loader built, its layouts prepared ahead
LOADER_POSITION = "loader_block_position"     # graph cache key: where in its batch (`mark_loader_block`)


def mark_padded(graph: Graph) -> Graph:
    """Mark ``graph`` as padded to capacities: its last source and last destination rows
    are padding, which only ever feeds padding (`loader.static_shapes`)."""
    graph._cache[PADDED] = True
    return graph


def is_padded(graph: Graph) -> bool:
    return bool(graph._cache.get(PADDED, False))


STEP_KEYS = "built_this_step"     # graph cache key: the keys `per_step` built since `begin_step`


def begin_step(graph: Graph) -> None:
    """Start a step on ``graph``: forget what `per_step` kept on it in the step before,
    and keep what it builds from now on until the next call. For an owner that calls
    this at the start of every step and rewrites the graph's edges only between steps
    (a captured step's static graph, `training.static_graph_batch`): a value built from
    the edges then serves every layer of one step, and is built again, inside the step,
    in the next, so a CUDA graph of the step rebuilds it on every replay."""
    for key in graph._cache.pop(STEP_KEYS, ()):
        graph._cache.pop(key, None)
    graph._cache[STEP_KEYS] = []


def per_step(graph: Graph, key: str, build: Callable[[Graph], object]) -> object:
    """``build(graph)``, kept on ``graph`` until its owner's next `begin_step`; on a graph
    whose owner began no step (a loader's padded block), built anew on every call."""
    keys = graph._cache.get(STEP_KEYS)
    if keys is None:
        return build(graph)
    if key not in graph._cache:
        graph._cache[key] = build(graph)
        keys.append(key)
    return graph._cache[key]


def mark_loader_block(graph: Graph, position: int | None = None) -> Graph:
    """Mark ``graph`` as a block a loader built, whose layouts the loader prepares in
    its own thread (`loader.layouts`), at ``position`` in its batch if given (the loader's
    numbering: a block's index, input layer first, or its PyG view's): a layer deriving
    another graph from it tells the loader so (`nn.conv.self_looped`), and later blocks
    at that position come with that graph too."""
    graph._cache[LOADER_BLOCK] = True
    if position is not None:
        graph._cache[LOADER_POSITION] = position
    return graph


def is_loader_block(graph: Graph) -> bool:
    return bool(graph._cache.get(LOADER_BLOCK, False))


def loader_position(graph: Graph) -> int | None:
    """The position in its batch `mark_loader_block` gave ``graph``, if any."""
    return graph._cache.get(LOADER_POSITION)


def prefill(graph: Graph, **layouts: object) -> None:
    """Store ``layouts`` in the graph's cache under `Graph`'s own keys (a key already
    built keeps its value: both are the same layout)."""
    for key, value in layouts.items():
        graph._builders.pop(key, None)      # a recipe `build_later` left for it is moot now
        graph.cached(key, lambda g, v=value: v)


def grouped_csr(keys: torch.Tensor, others: torch.Tensor, rows: int, dtype: torch.dtype) -> CSR:
    """The CSR grouping edges by ``keys`` (their row, one of ``rows``), ``others`` the
    column per edge: one stable sort of the keys in ``dtype`` (int32 where the graph
    fits it: half the radix-sort passes of int64), row pointers by binary search."""
    by_key = torch.sort(keys.to(dtype), stable=True)
    rowptr = torch.searchsorted(by_key.values, torch.arange(rows + 1, device=keys.device, dtype=dtype))
    return CSR(rowptr.to(dtype), others[by_key.indices].to(dtype), by_key.indices.to(dtype))


def prefill_grouping(graph: Graph) -> None:
    """Build ``graph``'s CSR and both degree vectors into its cache without a host sync
    (a sort, a binary search and an ``index_add``, `scatter_counts`), in fixed shapes: what
    a captured step rebuilds on every replay for a graph whose edges change between
    batches. A key already in the cache keeps its value (`prefill`), so a rebuild runs on
    a graph without them (`loader.static_shapes.build_layouts` builds on a scratch copy)."""
    src, dst = graph.src, graph.dst
    csr = grouped_csr(dst, src, graph.num_dst_nodes, graph.index_dtype)
    prefill(graph, csr=csr, in_degrees=csr.rowptr.long().diff(), out_degrees=scatter_counts(src, graph.num_src_nodes))


def build_reverse_csr(graph: Graph) -> CSR:
    """The graph's out-edges grouped by source (what a backward pass reads), built into
    its cache without a host sync (`Graph.reverse_csr` would count rows with ``bincount``)."""
    prefill(graph, reverse_csr=_sync_free_reverse_csr(graph))
    return graph.reverse_csr()


def defer_reverse_csr(graph: Graph, when_built: Callable[[], None] | None = None) -> None:
    """`build_reverse_csr`'s recipe for ``graph``'s reverse CSR, used only if and when
    something reads it (`Graph.build_later`); ``when_built`` is called then."""
    def build(g: Graph) -> CSR:
        if when_built is not None:
            when_built()
        return _sync_free_reverse_csr(g)
    graph.build_later("reverse_csr", build)


def _sync_free_reverse_csr(graph: Graph) -> CSR:
    return grouped_csr(graph.src, graph.dst, graph.num_src_nodes, graph.index_dtype)
