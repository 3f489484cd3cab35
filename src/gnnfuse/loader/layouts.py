"""What the layers and kernels derive from each block, built in the loader's thread.

Every block is a new graph, so everything a layer or backend caches per graph is built
once per block. Several of those builders read a count back from the device (the size
of a ``nonzero``, a ``repeat_interleave`` or a maximum): on a GPU each is a sync that
empties the device's queue in the middle of the training step, several times per layer
and batch. Built here, they run in the prefetch thread on its side stream, overlapped
with the previous batch's compute, and the step finds them in the graph's cache
(`Graph.cached`, the same entries the layers would have built: values cannot differ).

What is built depends on the backend that will run the block (`runtime.backend_name`):
the Triton kernels' edge segments of both CSRs and their split rows' tables, the
tuned-schedule shape class the Triton and CPU backends key their lookups on, and for
every backend the rows a combine-first SAGE layer reads (`nn.conv.transform_first_rows`).
The CSR and the degree vectors come with the block itself (`block.block_graph`).

What only a walk by source reads -- the reverse CSR (`graph.fixed_shape`) and the
Triton segments of its rows -- is built here only for the block positions a step has
been seen to walk by source (`SourceSideDemand`). Elsewhere it is left on the graph as
a recipe (`Graph.build_later`) with what the loader knows: the sort that needs no host
sync and the bound on the sources' out-degrees the hop read back; a step that does
walk the block by source builds it, without a sync, and the next blocks at that
position come with it. A first layer whose input needs no gradient (SAGE aggregating
the input features first) never walks its block by source, and that block is the
batch's largest: on products-sized fanouts (15, 10, 5), 568K of 708K edges. A padded
batch (fixed shapes) gets everything built here. Once a layer has asked for a block's
self-looped graph (`nn.conv.looped_blocks_wanted`), each block at that position in its
batch also comes with that graph and its layouts: a GAT on the blocks asks at every
position, one on PyG's ``batch.edge_index`` at its view's only.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from ..backend import tuned_schedule
from ..backend.reference import GraphContext
from ..graph import Graph
from ..graph.fixed_shape import build_reverse_csr, defer_reverse_csr, loader_position
from ..nn.conv import known_transform_first_rows, looped_blocks_wanted, self_looped, transform_first_rows
from ..runtime.compiled import backend_name


def prepare_layouts(graph: Graph, max_in_degree: int | None = None, unread: torch.Tensor | None = None,
                    max_out_degree: int | None = None, whole_rows: bool = False,
                    source_side_read: Callable[[], None] | None = None) -> tuple[torch.Tensor, ...]:
    """Build the per-graph layouts the step will read on ``graph`` (see the module
    doc); returns the tensors built, which the consumer's stream must keep alive.
    ``max_in_degree`` and ``max_out_degree`` bound the destinations' sampled in-edges
    (the hop's fanout) and the sources' out-edges (None: unknown), which spares the
    Triton segments of either CSR a count when no row can split; ``unread``, the
    sources no edge leaves when the sampler knows them (`SampledBlock.unread_dst`),
    spares the rows a combine-first layer reads theirs. ``whole_rows`` keeps the Triton
    segments one per row (a padded batch's fixed shapes: `triton.schedule.segments`).
    ``source_side_read``, if given, leaves the source side as recipes (see the module
    doc) and is called when the step builds them. The self-looped graph is built where a
    layer has asked for it at the graph's place in its batch (`loader_position`,
    `looped_blocks_wanted`)."""
    if unread is not None:
        known_transform_first_rows(graph, unread)
    built: list[Any] = [transform_first_rows(graph, 1)]
    position = loader_position(graph)
    # a padded block's layers derive a fixed-shape looped graph
    if position is not None and looped_blocks_wanted(position) and not whole_rows:
        built += _looped_layouts(graph, max_in_degree, max_out_degree)
    return tuple(tensors_in(built + _backend_layouts(graph, max_in_degree, max_out_degree, whole_rows,
                                                     source_side_read)))


def _backend_layouts(graph: Graph, max_in_degree: int | None, max_out_degree: int | None,
                     whole_rows: bool, source_side_read: Callable[[], None] | None = None) -> list[Any]:
    """What the backend that will run ``graph`` reads of it (see the module doc)."""
    built: list[Any] = []
    backend = backend_name(graph.device.type == "cuda")
    defer = source_side_read is not None and not whole_rows
    if backend != "reference":      # the reference backend's backward scatters by edge: no reverse CSR
        if defer:
            defer_reverse_csr(graph, source_side_read)
        else:
            built.append(build_reverse_csr(graph))
        if tuned_schedule.entries():     # the lookup's key; without stored choices it is never read
            tuned_schedule.shape_class(graph)
    if backend == "triton":
        from ..backend.triton.schedule import SEGMENT_EDGES, defer_segments, segments, split_slots, whole_row_segments
        if whole_rows:
            built += whole_row_segments(graph)
        else:
            # each side's segments with the table of its split rows, which a sum or mean
            # over them reads (two allocations, and no read-back when the bound splits no row)
            context = GraphContext(graph)
            built += [segments(context, "dst", SEGMENT_EDGES, max_in_degree),
                      split_slots(context, "dst", SEGMENT_EDGES)]
            if defer:
                defer_segments(graph, "src", SEGMENT_EDGES, max_out_degree)
            else:
                built += [segments(context, "src", SEGMENT_EDGES, max_out_degree),
                          split_slots(context, "src", SEGMENT_EDGES)]
    return built


class SourceSideDemand:
    """Which of a batch's blocks (by position in its list, the input layer's first; the
    batch's PyG view at `pyg_batch.PYG_VIEW_POSITION`) the step walks by source,
    learnt from the recipes it consumed: a block's source side is left as a recipe until
    a step builds one at its position, and from then on built ahead. In a worker process
    the recipes are built when the batch is pickled for the consumer
    (`Graph.__getstate__`), which marks every position: its blocks come with everything
    built, as before recipes existed."""

    def __init__(self) -> None:
        self._read: set[int] = set()

    def recipe_callback(self, position: int) -> Callable[[], None] | None:
        """None (build ahead) for a position a step has read, else what marks it read."""
        if position in self._read:
            return None
        return lambda: self._read.add(position)


def _looped_layouts(graph: Graph, max_in_degree: int | None, max_out_degree: int | None) -> list[Any]:
    """The block's self-looped graph (`nn.conv.self_looped`: GAT's and GCN's
    ``add_self_loops``) and what its layers read of it, built here because building
    them reads counts back from the device. One loop per destination adds one to each
    bound."""
    looped = self_looped(graph)
    built: list[Any] = [looped.src, looped.dst, looped.csr(), looped.in_degrees(), looped.out_degrees()]
    return built + _backend_layouts(looped, None if max_in_degree is None else max_in_degree + 1,
                                    None if max_out_degree is None else max_out_degree + 1, False)


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors inside ``value`` (nested tuples, lists and dataclasses; None skipped)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if dataclasses.is_dataclass(value):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_in(item)]
    return []
