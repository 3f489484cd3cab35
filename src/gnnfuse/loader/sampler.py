"""Neighbour sampling and reindexing for one hop, as vectorized torch code.

The same code runs on the CPU (torch's intra-op threads parallelize every op) and on a
GPU when the graph's CSR lives there: there is no per-vertex Python loop, and no loop
over the fanout either (a fixed handful of ops per hop, however large the fanout).

Sampling without replacement is Floyd's algorithm vectorized over destinations: for
``j = deg - k .. deg - 1`` draw ``t`` uniform in ``[0, j]`` and take ``j`` if ``t`` was
already taken, else ``t``. It yields a uniform k-subset of each row at O(k log k) work
per destination, however large its degree (a hub of 10^5 in-edges costs what a vertex
of degree 16 costs), and needs no per-row sort. A destination with ``deg <= k`` keeps
all of its in-edges, as PyG's sampler does. Floyd's steps look sequential (each asks
what the earlier ones took); `_floyd_offsets` resolves them all at once.

Reindexing (GraphTensor §V-B's R task) is sort-based: one stable sort of the
destinations followed by the sampled sources, then the distinct ids numbered by first
occurrence, so the destinations keep local ids ``0..num_dst-1`` (``x_dst =
x_src[:num_dst]``, the PyG/DGL block convention) and new sources follow in the order
they were first sampled. No shared hash table, so nothing is lock-bound (the contention
GraphTensor §V-B spends its scheduler on does not arise).

Host syncs: on a GPU every value read back to the host stalls the loader's stream. A hop
with a fanout samples into a ``[num_dst, fanout]`` table (its upper bound), reindexes
that table with its empty slots masked out, and reads back the five values it needs in
one transfer (`sample_block`): the edge count, the new frontier's size, how many
destinations no edge reads, the largest out-degree (which spares the Triton
backend's segments of the reverse CSR a count of their own when no source is a hub), and
how many edges go into the destinations an earlier hop expanded (`SampledBlock`).
Only then are the tensors cut to size, from the counts it now knows. (A fanout of -1
has no bound: it reads its edge count first.)
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch


class SampledHop(NamedTuple):
    """One hop's sampled in-edges of ``num_dst`` destinations, in CSR order.

    ``rowptr`` [num_dst + 1] delimits each destination's sampled edges; ``src`` holds
    their global source ids, ``dst`` their destinations' positions in the seeds, and
    ``eid`` their positions in the full graph's CSR.
    """
    rowptr: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    eid: torch.Tensor


class Reindexed(NamedTuple):
    """A hop's sources renumbered: ``nodes`` are the global ids of the next frontier
    (the destinations first, in order, then new sources by first appearance) and
    ``local_src`` each sampled edge's source as an index into ``nodes``."""
    nodes: torch.Tensor
    local_src: torch.Tensor


class SampledBlock(NamedTuple):
    """One hop sampled and reindexed (`sample_block`): ``rowptr``, ``local_src``,
    ``dst`` and ``eid`` as in `SampledHop` (sources as indices into ``nodes``), ``nodes``
    as in `Reindexed`, ``out_degrees`` the sampled edges leaving each of ``nodes``
    (``max_out_degree`` the largest), and ``unread_dst`` the destinations (ascending
    local ids) that no sampled edge leaves: the rows a layer that maps before
    aggregating never reads. ``earlier_edges``: how many of the edges (the first ones, in
    CSR order) go into the destinations an earlier hop expanded already (the first
    ``reached_before`` of `reindex_slots`); the rest are the in-edges of the vertices
    this hop expands first, which is PyG's hop (`loader.pyg_batch`)."""
    rowptr: torch.Tensor
    local_src: torch.Tensor
    dst: torch.Tensor
    eid: torch.Tensor
    nodes: torch.Tensor
    out_degrees: torch.Tensor
    max_out_degree: int
    unread_dst: torch.Tensor
    earlier_edges: int = 0


class Slots(NamedTuple):
    """A hop's sample (`sample_slots`) before it is cut to size: ``src``/``eid`` per slot (a slot that
    holds no edge has ``valid`` False and the source id ``num_nodes``), the per-row edge
    counts ``count`` and their prefix sums ``rowptr``; ``width`` slots per destination
    (None: the slots are already the edges, in CSR order)."""
    src: torch.Tensor
    eid: torch.Tensor
    valid: torch.Tensor | None
    count: torch.Tensor
    rowptr: torch.Tensor
    width: int | None


def sample_hop(rowptr: torch.Tensor, col: torch.Tensor, seeds: torch.Tensor, fanout: int,
               replace: bool = False, generator: torch.Generator | None = None) -> SampledHop:
    """Sample up to ``fanout`` in-edges of each vertex in ``seeds`` from the CSR
    (``rowptr``, ``col``: in-edges grouped by destination, ``col`` = sources).

    ``fanout < 0`` takes every in-edge. Without replacement each destination gets
    ``min(deg, fanout)`` distinct edges; with replacement ``fanout`` draws (none when
    ``deg == 0``). All tensors are on ``rowptr``'s device; ``generator`` must be too.
    Reads back one value (the edge count).
    """
    slots = sample_slots(rowptr, col, seeds, fanout, replace, generator)
    if slots.width is None:             # every in-edge: already cut to size, by the count it read
        return SampledHop(slots.rowptr, slots.src, edge_slots(slots, slots.src.numel())[0], slots.eid)
    (edges,) = read_back(slots.rowptr[-1:])
    row, slot = edge_slots(slots, edges)
    return SampledHop(slots.rowptr, slots.src[slot], row, slots.eid[slot])


def reindex(dst_nodes: torch.Tensor, sampled_src: torch.Tensor) -> Reindexed:
    """Local ids for a hop whose destinations are ``dst_nodes`` (distinct global ids)
    and whose sampled edges start at ``sampled_src`` (global ids). Reads back one value
    (the number of distinct ids)."""
    everything = torch.cat([dst_nodes, sampled_src])
    local, nodes, count = first_occurrence_ids(everything, None)
    (distinct,) = read_back(count.unsqueeze(0))
    return Reindexed(nodes[:distinct], local[dst_nodes.numel():])


def sample_block(rowptr: torch.Tensor, col: torch.Tensor, seeds: torch.Tensor, fanout: int,
                 replace: bool = False, generator: torch.Generator | None = None) -> SampledBlock:
    """`sample_hop` and `reindex` of one hop together, reading back once (see the
    module doc), plus the sources' out-degrees and the destinations no edge leaves.
    The sample is the one `sample_hop` draws from the same generator state."""
    return reindex_slots(seeds, sample_slots(rowptr, col, seeds, fanout, replace, generator), rowptr.numel() - 1)


def reindex_slots(seeds: torch.Tensor, slots: Slots, num_nodes: int, reached_before: int = 0) -> SampledBlock:
    """The reindexing half of `sample_block`: ``slots`` sampled for ``seeds`` from a
    graph of ``num_nodes`` vertices, renumbered and cut to size after one read back.
    ``reached_before``: how many of the first seeds an earlier hop expanded already
    (`SampledBlock.earlier_edges` counts their edges)."""
    num_dst = seeds.numel()
    everything = torch.cat([seeds, slots.src])
    local, nodes, distinct = first_occurrence_ids(everything, num_nodes)
    local_src = local[num_dst:]
    leaves = local_src if slots.valid is None else torch.where(slots.valid, local_src, everything.numel())
    out_degrees = torch.zeros(everything.numel() + 1, dtype=torch.int64, device=seeds.device).index_add_(
        0, leaves, torch.ones_like(leaves))[:-1]            # empty slots add to the last entry, cut off
    edges, distinct, most, earlier, unread_dst = read_hop_counts(slots.rowptr, distinct, out_degrees, num_dst,
                                                                 reached_before)
    row, slot = edge_slots(slots, edges)
    return SampledBlock(slots.rowptr, local_src[slot], row, slots.eid[slot], nodes[:distinct],
                        out_degrees[:distinct], most, unread_dst, earlier)


def read_hop_counts(rowptr: torch.Tensor, distinct: torch.Tensor, out_degrees: torch.Tensor, num_dst: int,
                    reached_before: int = 0) -> tuple[int, int, int, int, torch.Tensor]:
    """A reindexed hop's one read back: (its edge count, its distinct ids, the largest
    out-degree among them, the edges into its first ``reached_before`` destinations), and
    the destinations (ascending local ids) no edge leaves. ``distinct`` is the count on
    the device, ``out_degrees`` per id (padded past it with zeros, so its maximum is
    theirs)."""
    read = out_degrees[:num_dst] > 0
    most = out_degrees.max() if out_degrees.numel() else distinct
    edges, distinct, unread, most, earlier = read_back(
        torch.stack([rowptr[-1], distinct, num_dst - read.sum(), most, rowptr[reached_before]]))
    return edges, distinct, most, earlier, torch.sort(read.to(torch.uint8), stable=True).indices[:unread]


def read_back(values: torch.Tensor) -> list[int]:
    """``values`` on the host: the one transfer (and, on a GPU, the one wait for the
    queued work) a caller pays for all of them."""
    return values.tolist()


def sample_slots(rowptr: torch.Tensor, col: torch.Tensor, seeds: torch.Tensor, fanout: int, replace: bool,
                 generator: torch.Generator | None) -> Slots:
    """The hop's sample as `Slots`: ``fanout`` slots per destination (the first
    ``count`` of a row hold its edges), or for ``fanout < 0`` every in-edge, which has
    no bound and so reads its edge count back here."""
    device = rowptr.device
    start = rowptr[seeds]
    deg = rowptr[seeds + 1] - start
    if fanout < 0:
        count = deg
    elif replace:
        count = torch.where(deg > 0, fanout, 0)
    else:
        count = deg.clamp(max=fanout)
    out_ptr = torch.zeros(seeds.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(count, 0, out=out_ptr[1:])
    if fanout < 0:
        (total,) = read_back(out_ptr[-1:])
        row = torch.repeat_interleave(torch.arange(seeds.numel(), device=device), count, output_size=total)
        eid = start[row] + torch.arange(total, device=device) - out_ptr[row]
        return Slots(col[eid], eid, None, count, out_ptr, None)
    position = torch.arange(fanout, device=device)
    if replace:
        offset = uniform_below(deg.clamp(min=1).unsqueeze(1), (seeds.numel(), fanout), generator)
    else:
        offset = torch.where((deg > fanout).unsqueeze(1), _floyd_offsets(deg, fanout, generator), position)
    valid = position < count.unsqueeze(1)
    eid = torch.where(valid, start.unsqueeze(1) + offset, 0)
    num_nodes = rowptr.numel() - 1
    src = torch.where(valid, col[eid], num_nodes) if col.numel() else torch.full_like(eid, num_nodes)
    return Slots(src.flatten(), eid.flatten(), valid.flatten(), count, out_ptr, fanout)


def edge_slots(slots: Slots, edges: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(each edge's destination row, its slot) for the hop's ``edges`` sampled edges in
    CSR order, sized by the count the caller read back (no sync)."""
    device = slots.rowptr.device
    row = torch.repeat_interleave(torch.arange(slots.count.numel(), device=device), slots.count, output_size=edges)
    if slots.width is None:
        return row, torch.arange(edges, device=device)
    return row, row * slots.width + torch.arange(edges, device=device) - slots.rowptr[row]


def _floyd_offsets(deg: torch.Tensor, fanout: int, generator: torch.Generator | None) -> torch.Tensor:
    """Floyd's uniform ``fanout``-subset of ``0..deg-1`` for every row ([rows, fanout]
    offsets; rows with ``deg <= fanout`` get draws the caller ignores), all steps at once.

    Step ``i`` (``j_i = deg - fanout + i``) draws ``t_i`` in ``[0, j_i]`` and takes
    ``j_i`` exactly when ``t_i`` is already taken. Every ``t_m`` is in the set after step
    ``m`` (taken then, or taken before), and ``j_m`` is in it exactly when step ``m``
    collided, so step ``i`` collides when ``t_i`` repeats an earlier draw, or equals
    ``j_m`` (``m = t_i - j_0 < i``) for a step ``m`` that collided. That is an OR down a
    chain of strictly earlier steps, resolved by pointer doubling in ceil(log2 k) rounds.
    The draws and the result are those of the sequential algorithm.
    """
    rows = deg.numel()
    step = torch.arange(fanout, device=deg.device)
    first = (deg - fanout).clamp(min=0).unsqueeze(1)                      # j_0
    top = first + step                                                    # j_i
    t = uniform_below(top + 1, (rows, fanout), generator)
    # t_i repeats an earlier draw: not the first of its run after a stable sort of the row
    ordered, order = torch.sort(t, dim=1, stable=True)
    later = torch.cat([torch.zeros_like(ordered[:, :1], dtype=torch.bool), ordered[:, 1:] == ordered[:, :-1]], 1)
    collided = torch.empty_like(later).scatter_(1, order, later)
    earlier = t - first                                                   # the step m whose j_m is t_i
    pointer = torch.where((earlier >= 0) & (earlier < step), earlier, step)
    for _ in range(math.ceil(math.log2(fanout)) if fanout > 1 else 0):
        collided = collided | collided.gather(1, pointer)
        pointer = pointer.gather(1, pointer)
    return torch.where(collided, top, t)


def uniform_below(bound: torch.Tensor, shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    """Integers uniform in ``[0, bound)`` (``bound`` >= 1, broadcast to ``shape``), on
    ``bound``'s device: 62-bit integer draws reduced modulo ``bound`` (a bias below
    ``bound / 2**62``). Offsets had been float32 uniforms times the degree, and a float32
    in [0, 1) holds 24 random bits: a vertex of 2**25 in-edges drew only even offsets
    (half its in-edges never sampled), and one of 10**7 some edges twice as often as
    others, where PyG's sampler draws integers."""
    return torch.randint(2**62, shape, device=bound.device, generator=generator) % bound


def first_occurrence_ids(values: torch.Tensor, missing: int | None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Number the distinct ``values`` by first occurrence, without reading anything back:
    (each position's local id, the distinct values in that order padded to
    ``values.numel() + 1`` entries, how many there are). Entries equal to ``missing``
    (empty slots) get no id of their own and are not counted."""
    size = values.numel()
    ordered, order = torch.sort(values, stable=True)            # equal values keep position order
    starts_run = torch.ones(size, dtype=torch.bool, device=values.device)
    starts_run[1:] = ordered[1:] != ordered[:-1]
    run = torch.cumsum(starts_run, 0) - 1                       # each sorted entry's run (distinct value)
    first_of_run = starts_run if missing is None else starts_run & (ordered != missing)
    is_first = torch.empty_like(first_of_run).scatter_(0, order, first_of_run)   # in position order
    numbered = torch.cumsum(is_first, 0)
    rank = numbered - 1                                         # the id of a first occurrence
    # each run's id is its first entry's rank (the stable sort puts the earliest position
    # first); entries that start no run write to a spare last slot. A scan of run starts
    # (cummax) did this 3x per batch at 0.76 ms each on an H100; cumsum and a scatter do not.
    run_id = rank.new_empty(size + 1).scatter_(0, torch.where(starts_run, run, size), rank[order])
    local = torch.empty_like(rank).scatter_(0, order, run_id[run])
    nodes = values.new_empty(size + 1).index_put_((torch.where(is_first, rank, size),), values)
    count = numbered[-1] if size else numbered.new_zeros(())
    return local, nodes, count
