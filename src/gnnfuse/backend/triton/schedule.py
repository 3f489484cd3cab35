"""Work decomposition for the vertex-parallel kernels: rows cut into edge segments.

Power-law graphs put thousands of edges on a few vertices (the arxiv-sized benchmark
graph has a vertex of in-degree ~7,000 against an average of 7). One program per row
would leave that row running serially while the rest of the GPU idles, so rows longer
than ``SEGMENT_EDGES`` are cut into segments that separate programs reduce and combine
(atomically into a workspace, `SplitSlots`, or as partial results a merge kernel reads,
`PartialSlots`). Segments are ordered longest first so the longest work starts earliest,
unless every row is known to be short (`SHORT_ROWS`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...graph import Graph
from ..reference import GraphContext

SEGMENT_EDGES = 512   # long enough to amortize a program's set-up, short enough to spread hubs
# Rows no longer than this (a sampled block's destinations under its fanout, its sources
# under the out-degree its hop read back) keep their CSR order: with no long row there
# is no late hub to start first, a program's few rows finish in about the same time
# either way, and rows in order store their outputs to consecutive addresses. The sort
# it spares was a radix sort and three gathers per CSR of every mini-batch block.
SHORT_ROWS = 64


@dataclass(frozen=True)
class Segments:
    row: torch.Tensor     # the row each segment belongs to
    start: torch.Tensor   # first CSR position of the segment
    end: torch.Tensor     # one past its last CSR position
    split: torch.Tensor   # int8: 1 where the row has several segments
    split_rows: torch.Tensor   # the rows cut into several segments, each once, ascending

    def __len__(self) -> int:
        return self.row.numel()


def segments(ctx: GraphContext, by: str, max_edges: int | None, max_degree: int | None = None,
             whole_rows: bool = False) -> Segments:
    """Segments of the CSR grouped by ``by``; ``max_edges=None`` keeps rows whole (for
    reductions with no atomic combine). Cached on the graph per (by, max_edges).
    ``max_degree``, a bound on the rows' lengths the caller knows (a sampled block's
    fanout), lets rows that cannot split skip counting segments, and rows that are all
    short (`SHORT_ROWS`) skip the longest-first sort. ``whole_rows`` keeps
    every row whole under ``max_edges``'s key too, so the segments number exactly the
    rows (a padded batch's fixed shapes, `loader.static_shapes`): a whole row is a
    valid segment for every reduction, only a hub's row then runs in one program."""
    return ctx.graph.cached(*_recipe(ctx, by, max_edges, max_degree, whole_rows))


def defer_segments(graph: Graph, by: str, max_edges: int, max_degree: int | None) -> None:
    """`segments`' recipe for ``graph`` under ``max_degree``, used only if and when a
    kernel asks for those segments (`Graph.build_later`)."""
    graph.build_later(*_recipe(GraphContext(graph), by, max_edges, max_degree, False))


def _recipe(ctx: GraphContext, by: str, max_edges: int | None, max_degree: int | None,
            whole_rows: bool) -> tuple[str, Callable[[Graph], Segments]]:
    """The cache key of `segments`' arguments and the builder of its value."""
    whole = whole_rows or max_edges is None or (max_degree is not None and max_degree <= max_edges)
    in_order = max_degree is not None and max_degree <= SHORT_ROWS

    def build(_: Graph) -> Segments:
        rowptr = ctx.grouped(by)[0]
        if whole or in_order:
            return _build(rowptr, None if whole else max_edges, in_order)
        return _build(rowptr, max_edges, _all_rows_short(rowptr, min(SHORT_ROWS, max_edges)))
    return f"triton_segments_{by}_{max_edges}", build


def _all_rows_short(rowptr: torch.Tensor, bound: int) -> bool:
    """Whether no row of ``rowptr`` is longer than ``bound`` (`SHORT_ROWS`, or the
    segment length where that is shorter, so that every row is one segment), read back
    from the device once. Asked where no bound is known and the segments would be
    counted, which reads back twice (a ``repeat_interleave``'s size and the split rows'
    ``nonzero``) after a sort: a graph of short rows (a batch of molecules, a mesh, a
    k-NN graph) then keeps its rows in order instead, as a sampled block does, and every
    new graph of a graph-classification step costs one read-back and no sort."""
    return rowptr.numel() < 2 or int(rowptr.diff().max()) <= bound


def whole_row_segments(graph: Graph) -> list[Any]:
    """Build (into ``graph``'s cache) the segments of both of its CSRs one per row, under
    the keys of every kernel that asks for them: a padded graph's fixed shapes
    (`loader.static_shapes`, `graph.fixed_shape`). The whole-row segments max and min
    reductions ask for (``max_edges=None``) are the same ones, and so are their split-row
    tables (`split_slots`, `partial_slots`, `ordered_slots`: no row is split, so they read nothing back):
    a captured step that built one itself would replay the first batch's
    (`training.captured_step`). Returns them."""
    context = GraphContext(graph)
    built: list[Any] = []
    for by in ("dst", "src"):
        whole = segments(context, by, SEGMENT_EDGES, whole_rows=True)
        graph.cached(f"triton_segments_{by}_None", lambda _, w=whole: w)
        built += [whole, split_slots(context, by, SEGMENT_EDGES), partial_slots(context, by, SEGMENT_EDGES),
                  ordered_slots(context, by, SEGMENT_EDGES)]
    return built


def _build(rowptr: torch.Tensor, max_edges: int | None, in_order: bool = False) -> Segments:
    """The segments of ``rowptr``'s rows, stored in its own index dtype (int32 where the
    graph fits it: the kernels widen each load to int64): on a products-sized graph the
    int64 arrays were 0.2 GB kept for the graph's lifetime. ``in_order`` (every row
    whole and short, `SHORT_ROWS`): one segment per row in row order, nothing sorted."""
    num_rows = rowptr.numel() - 1
    if in_order:
        return Segments(torch.arange(num_rows, dtype=rowptr.dtype, device=rowptr.device), rowptr[:-1],
                        rowptr[1:].clone(),       # a fresh, aligned buffer, as the sorted path's
                        torch.zeros(num_rows, dtype=torch.int8, device=rowptr.device),
                        torch.zeros(0, dtype=torch.int64, device=rowptr.device))
    # Sort keys stay in the index dtype: a radix sort of int32 takes half the passes of int64.
    dtype, lengths = rowptr.dtype, rowptr[1:] - rowptr[:-1]
    rowptr = rowptr.to(torch.int64)
    if max_edges is None:      # a segment per row: no count to read back from the device
        row = torch.arange(num_rows, device=rowptr.device)
        order = torch.sort(lengths, descending=True, stable=True).indices
        return Segments(row[order].to(dtype), rowptr[:-1][order].to(dtype), rowptr[1:][order].to(dtype),
                        torch.zeros(num_rows, dtype=torch.int8, device=rowptr.device), row[:0])
    count = torch.clamp((lengths.to(torch.int64) + max_edges - 1) // max_edges, min=1)
    row = torch.repeat_interleave(torch.arange(num_rows, device=rowptr.device), count)
    first = torch.cumsum(count, 0) - count
    k = torch.arange(row.numel(), device=rowptr.device) - first[row]
    start = rowptr[row] + k * max_edges
    end = torch.minimum(start + max_edges, rowptr[row + 1])
    # Longest first, with every segment of a split row ahead of the rest: a kernel whose
    # program covers only segments past them knows from its index that it has no
    # workspace to meet in (`SplitSlots.split_segments`), without a reduction to find out.
    split = count[row] > 1
    order = torch.sort((end - start + split * (max_edges + 1)).to(dtype), descending=True, stable=True).indices
    return Segments(row[order].to(dtype), start[order].to(dtype), end[order].to(dtype),
                    split.to(torch.int8)[order], torch.nonzero(count > 1).squeeze(1))


@dataclass(frozen=True)
class SplitSlots:
    """How the segments of split rows find each other without a zeroed output: ``slot``
    per segment, its row's index among ``split_rows`` (-1 for a row's only segment), and
    ``segments`` per split row, how many segments it was cut into, and
    ``split_segments``, how many segments split rows have in all (they come first,
    `_build`). A kernel adds a split row's partial sums into that row's slot of a
    workspace, counts the segments that have arrived, and the last one stores the row
    (`codegen._split_row_fixup`)."""
    slot: torch.Tensor
    segments: torch.Tensor
    split_segments: int

    def __len__(self) -> int:
        return self.segments.numel()


def split_slots(ctx: GraphContext, by: str, max_edges: int | None) -> SplitSlots:
    """The `SplitSlots` of ``segments(ctx, by, max_edges)``, cached on the graph. With no
    split row (a sampled block's rows under its fanout) it reads nothing from the device;
    else it reads how many segments they have, once."""
    segs = segments(ctx, by, max_edges)

    def build(_) -> SplitSlots:
        device = segs.row.device
        rows = segs.split_rows
        if not len(rows):
            return SplitSlots(torch.full((len(segs),), -1, dtype=torch.int32, device=device),
                              torch.zeros(0, dtype=torch.int32, device=device), 0)
        found = torch.searchsorted(rows, segs.row.to(rows.dtype)).clamp_(max=len(rows) - 1)
        slot = torch.where(segs.split != 0, found, -1)
        counts = torch.zeros(len(rows) + 1, dtype=torch.int32, device=device)
        counts.index_add_(0, slot + 1, torch.ones_like(slot, dtype=torch.int32))     # [0] counts unsplit rows
        return SplitSlots(slot.to(torch.int32), counts[1:].clone(), int(counts[1:].sum()))
    return ctx.graph.cached(f"triton_split_slots_{by}_{max_edges}", build)


@dataclass(frozen=True)
class PartialSlots:
    """Where the segments of split rows store partial results for a merge kernel
    (a sibling group with a max, `passes/siblings.py`): ``slot`` per segment (-1 for a
    row's only segment, never read: with no split row at all it is any index array),
    and for each split row, in row order, ``merge_row`` and its slots
    ``slot_ptr[i]:slot_ptr[i + 1]`` (a row's segments take consecutive slots)."""
    slot: torch.Tensor
    merge_row: torch.Tensor
    slot_ptr: torch.Tensor
    count: int                # slots in all

    def __len__(self) -> int:
        return self.merge_row.numel()


def partial_slots(ctx: GraphContext, by: str, max_edges: int | None) -> PartialSlots:
    """The `PartialSlots` of ``segments(ctx, by, max_edges)``, cached on the graph. A
    segment's CSR start orders the segments by row and, within a row, by position."""
    segs = segments(ctx, by, max_edges)

    def build(_) -> PartialSlots:
        if not len(segs.split_rows):    # nothing to merge, and nothing read back (a padded batch's graph)
            return PartialSlots(segs.row, segs.row[:0], torch.zeros(1, dtype=torch.int32, device=segs.row.device), 0)
        split = torch.nonzero(segs.split).squeeze(1)
        ordered = split[torch.argsort(segs.start[split])]
        slot = torch.full((len(segs),), -1, dtype=torch.int32, device=segs.row.device)
        slot[ordered] = torch.arange(ordered.numel(), dtype=torch.int32, device=slot.device)
        rows, counts = torch.unique_consecutive(segs.row[ordered], return_counts=True)
        slot_ptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(torch.int32)
        return PartialSlots(slot, rows.to(torch.int32), slot_ptr, ordered.numel())
    return ctx.graph.cached(f"triton_partial_slots_{by}_{max_edges}", build)


@dataclass(frozen=True)
class OrderedSlots:
    """How the segments of split rows meet in a fixed order, for
    ``torch.use_deterministic_algorithms(True)`` (`codegen._split_row_fixup` with
    ``ordered``): ``slot`` per segment, its own slot of the workspace (-1 for a row's
    only segment), a row's segments taking consecutive slots in the order of their
    edges; ``ranges`` per slot, flat pairs (its row's first slot, the row's segment
    count); ``split_segments``, the slots in all (split rows' segments come first,
    `_build`). Each segment adds its partial sum into its own zeroed slot (exactly: one
    add to zero), and the row's last to arrive sums the row's slots from the first, so
    the row's bits do not depend on which segment finishes when."""
    slot: torch.Tensor
    ranges: torch.Tensor
    split_segments: int

    def __len__(self) -> int:
        return self.split_segments


def ordered_slots(ctx: GraphContext, by: str, max_edges: int | None) -> OrderedSlots:
    """The `OrderedSlots` of ``segments(ctx, by, max_edges)``, cached on the graph, from
    the same slot order as `partial_slots`; with no split row it reads nothing back."""
    segs = segments(ctx, by, max_edges)
    parts = partial_slots(ctx, by, max_edges)

    def build(_) -> OrderedSlots:
        device = segs.row.device
        if not parts.count:
            return OrderedSlots(torch.full((len(segs),), -1, dtype=torch.int32, device=device),
                                torch.zeros(0, dtype=torch.int32, device=device), 0)
        pieces = parts.slot_ptr.diff()
        first = torch.repeat_interleave(parts.slot_ptr[:-1], pieces, output_size=parts.count)
        count = torch.repeat_interleave(pieces, pieces, output_size=parts.count)
        return OrderedSlots(parts.slot, torch.stack([first, count], 1).reshape(-1).contiguous(), parts.count)
    return ctx.graph.cached(f"triton_ordered_slots_{by}_{max_edges}", build)
