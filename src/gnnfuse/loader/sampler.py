"""Neighbour sampling and reindexing for one hop, as vectorized torch code.

The same code runs on the CPU (torch's intra-op threads parallelize every op) and on a
GPU when the graph's CSR lives there: there is no per-vertex Python loop, only a loop
over the fanout's `k` positions.

Sampling without replacement uses Floyd's algorithm vectorized over destinations: for
``j = deg - k .. deg - 1`` draw ``t`` uniform in ``[0, j]`` and take ``j`` if ``t`` was
already taken, else ``t``. It yields a uniform k-subset of each row at O(k^2) work per
destination, however large its degree (a hub of 10^5 in-edges costs what a vertex of
degree 16 costs), and needs no per-row sort. A destination with ``deg <= k`` keeps all
of its in-edges, as PyG's sampler does.

Reindexing (GraphTensor §V-B's R task) is sort-based: ``torch.unique`` on the
destinations followed by the sampled sources, then the unique ids ordered by first
occurrence, so the destinations keep local ids ``0..num_dst-1`` (``x_dst =
x_src[:num_dst]``, the PyG/DGL block convention) and new sources follow in the order
they were first sampled. No shared hash table, so nothing is lock-bound (the contention
GraphTensor §V-B spends its scheduler on does not arise).
"""
from __future__ import annotations

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


def sample_hop(rowptr: torch.Tensor, col: torch.Tensor, seeds: torch.Tensor, fanout: int,
               replace: bool = False, generator: torch.Generator | None = None) -> SampledHop:
    """Sample up to ``fanout`` in-edges of each vertex in ``seeds`` from the CSR
    (``rowptr``, ``col``: in-edges grouped by destination, ``col`` = sources).

    ``fanout < 0`` takes every in-edge. Without replacement each destination gets
    ``min(deg, fanout)`` distinct edges; with replacement ``fanout`` draws (none when
    ``deg == 0``). All tensors are on ``rowptr``'s device; ``generator`` must be too.
    """
    device = rowptr.device
    start = rowptr[seeds]
    deg = rowptr[seeds + 1] - start
    if fanout < 0:
        count = deg
    elif replace:
        count = torch.where(deg > 0, torch.full_like(deg, fanout), deg)
    else:
        count = deg.clamp(max=fanout)
    out_ptr = torch.zeros(seeds.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(count, 0, out=out_ptr[1:])
    total = int(out_ptr[-1])
    row = torch.repeat_interleave(torch.arange(seeds.numel(), device=device), count, output_size=total)
    offset = torch.arange(total, device=device) - out_ptr[row]     # position within the row's sample
    if fanout >= 0 and replace:
        draw = torch.rand(total, device=device, generator=generator)
        offset = (draw * deg[row]).long().clamp_(max=deg[row] - 1)
    elif fanout >= 0:
        offset = _floyd_offsets(deg, offset, row, fanout, generator)
    eid = start[row] + offset
    return SampledHop(out_ptr, col[eid], row, eid)


def _floyd_offsets(deg: torch.Tensor, offset: torch.Tensor, row: torch.Tensor, fanout: int,
                   generator: torch.Generator | None) -> torch.Tensor:
    """In-row offsets of the sampled edges: ``0..deg-1`` where the whole row is kept, a
    uniform ``fanout``-subset (Floyd) where ``deg > fanout``.

    Floyd runs on every destination, and the rows that keep everything ignore its draws:
    selecting the rows with ``deg > fanout`` first would size a tensor by a count read
    back from the device (a sync per hop on a GPU), and the extra work is ``fanout^2``
    comparisons per destination."""
    big = deg > fanout
    last = (deg - fanout).clamp(min=0)          # j's first value (rows that keep everything: ignored)
    chosen = torch.empty(deg.numel(), fanout, dtype=torch.int64, device=deg.device)
    for i in range(fanout):
        j = last + i
        t = (torch.rand(deg.numel(), device=deg.device, generator=generator) * (j + 1)).long()
        t = torch.minimum(t, j)                                   # float rounding at the top edge
        taken = (chosen[:, :i] == t.unsqueeze(1)).any(1)
        chosen[:, i] = torch.where(taken, j, t)
    # A row with deg > fanout holds exactly `fanout` samples, at positions 0..fanout-1.
    return torch.where(big[row], chosen[row, offset], offset)


class Reindexed(NamedTuple):
    """A hop's sources renumbered: ``nodes`` are the global ids of the next frontier
    (the destinations first, in order, then new sources by first appearance) and
    ``local_src`` each sampled edge's source as an index into ``nodes``."""
    nodes: torch.Tensor
    local_src: torch.Tensor


def reindex(dst_nodes: torch.Tensor, sampled_src: torch.Tensor) -> Reindexed:
    """Local ids for a hop whose destinations are ``dst_nodes`` (distinct global ids)
    and whose sampled edges start at ``sampled_src`` (global ids)."""
    everything = torch.cat([dst_nodes, sampled_src])
    unique, inverse = torch.unique(everything, return_inverse=True)
    position = torch.arange(everything.numel(), device=everything.device)
    first = torch.full((unique.numel(),), everything.numel(), dtype=torch.int64, device=everything.device)
    first.scatter_reduce_(0, inverse, position, reduce="amin")    # each id's first position
    # Numbering the first positions in position order is a prefix sum, not a second sort.
    is_first = torch.zeros(everything.numel(), dtype=torch.bool, device=everything.device)
    is_first[first] = True
    local = (torch.cumsum(is_first, 0) - 1)[first]                # local id of each unique id
    # The first positions in position order, sorted rather than read through the mask
    # `is_first` (a boolean index sizes its result on the host: a sync on a GPU).
    return Reindexed(everything[torch.sort(first).values], local[inverse[dst_nodes.numel():]])
