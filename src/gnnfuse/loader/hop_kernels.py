"""One hop sampled and reindexed by fused kernels (`sample_slots_fused`,
`reindex_slots_fused`): on a GPU four Triton kernels (`hop_triton`, described below), on
a CPU with Numba two Numba kernels (`hop_numba`, which says how they differ).

`loader.sampler` does the same hop in vectorized torch code: about 60 aten ops per hop
for the sample (Floyd's draws resolved by a sort and pointer doubling) and 100 for the
reindex (sort-based first-occurrence numbering). On an H100 a products-sized batch then
took 12.5 ms of host time and 3.3 ms of GPU time, half of it in sorts, and the loader's
thread, sharing the GIL with the training step, bound the epoch. Here a hop is:

1. ``sample``: per destination, Floyd's algorithm run sequentially over the fanout in
   registers (a row of ``k`` slots, ``k`` membership tests of ``k`` lanes each), so a
   hub costs what a vertex of degree ``k`` costs; the rows' edge counts.
2. ``insert``: every destination and sampled source into an open-addressed hash table
   (compare-and-swap, linear probing), each key's smallest position kept by an atomic
   minimum: its first occurrence.
3. ``find_first``: each position's first occurrence (a probe without atomics), and whether
   it is that first occurrence; one cumsum then numbers the first occurrences in
   position order.
4. ``emit``: the block's CSR (sources as local ids, destinations, edge ids), the
   distinct ids in their new order, and the sources' out-degrees.

The numbering is the one `sampler.reindex_slots` gives (destinations keep ``0..n-1``, new
sources follow by first appearance in slot order), so for the same slots the two produce
the same block, which the tests check. Only the draws differ: they come from a
counter-based stream (Triton's Philox, or SplitMix64 on a CPU) keyed by the batch
generator's seed and the hop, not from torch's generator; the distribution is the same
(uniform ``min(deg, k)``-subsets per row).

Host syncs on a GPU: one per hop (`sampler.read_hop_counts`), as in the torch path.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import torch

from .sampler import SampledBlock, Slots, read_hop_counts

FUSED_HOPS = "GNNFUSE_FUSED_HOPS"     # "1": these kernels on any device; "0": the torch path everywhere

_ROWS = 64            # destinations per program in `sample`
_POSITIONS = 256      # positions per program in the hash-table kernels
_EMPTY, _SCRATCH = -1, -3       # table keys: a free entry; the spare entries masked-off lanes swap against
_SPARE = 4096                   # spare entries past the table
_NO_POSITION = 2**31 - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = 2**64 - 1


def _kernels():
    """The four kernels (their module imports Triton, which a CPU-only loader lacks)."""
    from . import hop_triton
    return hop_triton.sample, hop_triton.insert, hop_triton.find_first, hop_triton.emit


def fused_hops(device: torch.device, fanout: int, replace: bool, rows: int = 0) -> bool:
    """Whether a hop on ``device`` runs here: for a fanout without replacement, on a GPU
    or on a CPU with Numba installed, unless `FUSED_HOPS` says otherwise ("0": the torch
    path; "1": wherever the fanout allows, so a CPU without Numba runs the Triton kernels
    in Triton's interpreter).

    Data-parallel ranks run them too: on four H200s of one machine, in a call whose
    caches were warm (b3735a1, products-sized GraphSAGE, 49 batches per rank, a rank's
    loader in a thread), four ranks took 0.64 s with the kernels against 0.75 s on the
    torch path. On four H100s (47b97a0) the kernels had looked slower (1.36 against
    0.77 s), but that run's training steps were 2-3x their usual time, as on the H200s
    in a fresh machine's first data-parallel invocation whichever path sampled, where a
    kernel tuned mid-epoch stalled every rank (`backend.triton.tuning_class`); a probe
    there also showed every rank's loader thread launching in its own GPU's context.

    ``rows`` destinations: the kernels number positions and draw Philox offsets in 32
    bits, so a hop of ``rows * (fanout + 1)`` positions past that stays on the torch path."""
    forced = os.environ.get(FUSED_HOPS) or "auto"
    if forced not in ("0", "1", "auto"):     # "false" or "off" would otherwise mean auto
        raise ValueError(f"{FUSED_HOPS} must be 0 (the torch path), 1 (the kernels) or auto, got {forced!r}")
    if fanout < 1 or replace or rows * (fanout + 1) >= _NO_POSITION:
        return False
    if forced != "auto":
        return forced == "1"
    return device.type == "cuda" or _has_numba()


@functools.cache
def _has_numba() -> bool:
    """Whether Numba is installed (asked once per process: every hop asks)."""
    return importlib.util.find_spec("numba") is not None


def _engine(device: torch.device, engine: str | None) -> str:
    """The kernels a hop on ``device`` runs: ``engine`` when given, else Numba's on a CPU
    that has it and Triton's elsewhere."""
    if engine is None:
        return "numba" if device.type == "cpu" and _has_numba() else "triton"
    if engine not in ("numba", "triton"):
        raise ValueError(f"unknown hop engine {engine!r}; choose 'numba' or 'triton'")
    if engine == "numba" and device.type != "cpu":
        raise ValueError(f"the Numba hop kernels run on CPU tensors, not {device}")
    return engine


def hop_seed(generator: torch.Generator, hop: int) -> int:
    """The counter seed (Philox on a GPU, SplitMix64 on a CPU) of ``hop`` for a batch
    whose generator is ``generator``: its initial seed (read on the host, no sync)
    scrambled, then stepped by the hop's index. Scrambled first because consecutive
    batches' seeds are themselves one Weyl step apart (`batch_maker.batch_generator`):
    stepped by the hop alone, batch i's hop h + 1 had batch i + 1's hop h's key, and
    drew the same offsets for the same rows."""
    return (_mix64(generator.initial_seed()) + (hop + 1) * _GOLDEN) % 2**62


def _mix64(value: int) -> int:
    """SplitMix64's mixing function on a Python int (`backend.cpu.random_mask.splitmix64`
    is the Numba one): a bijection of 64-bit values that scatters neighbouring inputs."""
    z = value & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_slots_fused(rowptr: torch.Tensor, col: torch.Tensor, seeds: torch.Tensor, fanout: int,
                       seed: int, engine: str | None = None) -> Slots:
    """`sampler.sample_slots` without replacement for ``fanout >= 1``, by ``sample``
    (`hop_triton`'s, or on a CPU `hop_numba`'s; ``engine`` picks one): ``fanout``
    slots per destination, the first ``count`` holding distinct in-edges."""
    if fanout < 1:
        raise ValueError(f"sample_slots_fused needs a fanout >= 1, got {fanout}")
    num_dst, device = seeds.numel(), seeds.device
    num_nodes = rowptr.numel() - 1
    src = torch.empty(num_dst * fanout, dtype=torch.int64, device=device)
    eid = torch.empty_like(src)
    count = torch.empty(num_dst, dtype=torch.int64, device=device)
    if num_dst and _engine(device, engine) == "numba":
        from . import hop_numba
        bad = hop_numba.sample(rowptr.long().numpy(), col.long().numpy(), seeds.long().numpy(), fanout, seed,
                               src.numpy(), eid.numpy(), count.numpy(), num_nodes)
        if bad >= 0:
            vertex = int(seeds[bad])
            row = f" (row pointers {int(rowptr[vertex])}..{int(rowptr[vertex + 1])})" if 0 <= vertex < num_nodes else ""
            raise IndexError(f"gnnfuse loader: destination {bad} of the hop, vertex {vertex}, is not a row of the "
                             f"sampling CSR ({num_nodes} rows, {col.numel()} column entries){row}")
    elif num_dst:
        import triton

        from ..backend.triton.launch import launch
        launch(_kernels()[0], (triton.cdiv(num_dst, _ROWS),), (),
               (rowptr, col, seeds, num_dst, seed, src, eid, count, num_nodes),
               {"K": fanout, "KP": triton.next_power_of_2(fanout), "ROWS": _ROWS})
    rowptr_out = torch.zeros(num_dst + 1, dtype=torch.int64, device=device)
    torch.cumsum(count, 0, out=rowptr_out[1:])
    return Slots(src, eid, src != num_nodes, count, rowptr_out, fanout)


def reindex_slots_fused(seeds: torch.Tensor, slots: Slots, num_nodes: int, engine: str | None = None,
                        reached_before: int = 0) -> SampledBlock:
    """`sampler.reindex_slots` by the hash-table kernels (``engine`` as in
    `sample_slots_fused`): the same block for the same ``slots`` (which must have a
    ``width``: one hop's fixed-width sample)."""
    if slots.width is None:
        raise ValueError("reindex_slots_fused needs fixed-width slots (a fanout >= 1)")
    if _engine(seeds.device, engine) == "numba":
        return _reindex_numba(seeds, slots, num_nodes, reached_before)
    import triton

    from ..backend.triton.launch import launch
    _, insert, find_first, emit = _kernels()
    device, num_dst = seeds.device, seeds.numel()
    num_all = num_dst + slots.src.numel()
    size = triton.next_power_of_2(max(2 * num_all, 2))          # load factor <= 1/2: short probes
    keys = torch.full((size + _SPARE,), _EMPTY, dtype=torch.int64, device=device)
    keys[size:] = _SCRATCH
    first_of = torch.full((size,), _NO_POSITION, dtype=torch.int32, device=device)
    first_pos = torch.empty(num_all, dtype=torch.int64, device=device)
    is_first = torch.empty(num_all, dtype=torch.int64, device=device)
    grid = (triton.cdiv(num_all, _POSITIONS),)
    if num_all:
        launch(insert, grid, (), (seeds, slots.src, num_dst, num_all, num_nodes, keys, first_of, size - 1),
               {"SPARE": _SPARE, "POSITIONS": _POSITIONS})
        launch(find_first, grid, (), (seeds, slots.src, num_dst, num_all, num_nodes, keys, first_of, first_pos,
                                      is_first, size - 1), {"POSITIONS": _POSITIONS})
    numbered = torch.cumsum(is_first, 0)
    edges_bound = slots.src.numel()
    local_src = torch.empty(edges_bound, dtype=torch.int64, device=device)
    dst = torch.empty_like(local_src)
    eid = torch.empty_like(local_src)
    nodes = torch.empty(num_all, dtype=seeds.dtype, device=device)
    out_degrees = torch.zeros(num_all, dtype=torch.int64, device=device)
    if num_all:
        launch(emit, grid, (), (seeds, slots.src, slots.eid, num_dst, num_all, num_nodes, first_pos, numbered,
                                slots.count, slots.rowptr, local_src, dst, eid, nodes, out_degrees),
               {"K": slots.width, "POSITIONS": _POSITIONS})
    distinct_now = numbered[-1] if num_all else numbered.new_zeros(())
    edges, distinct, most, earlier, unread_dst = read_hop_counts(slots.rowptr, distinct_now, out_degrees, num_dst,
                                                                 reached_before)
    return SampledBlock(slots.rowptr, local_src[:edges], dst[:edges], eid[:edges], nodes[:distinct],
                        out_degrees[:distinct], most, unread_dst, earlier)


def _reindex_numba(seeds: torch.Tensor, slots: Slots, num_nodes: int, reached_before: int) -> SampledBlock:
    """`reindex_slots_fused` by `hop_numba.reindex`: one scan on the host."""
    from . import hop_numba
    num_dst, bound = seeds.numel(), slots.src.numel()
    edges = int(slots.rowptr[-1])
    local_src, dst, eid = (torch.empty(edges, dtype=torch.int64) for _ in range(3))
    nodes = torch.empty(num_dst + bound, dtype=seeds.dtype)
    out_degrees = torch.zeros(num_dst + bound, dtype=torch.int64)
    distinct = hop_numba.reindex(seeds.long().numpy(), slots.src.numpy(), slots.eid.numpy(), slots.count.numpy(),
                                 slots.rowptr.numpy(), slots.width, num_nodes, local_src.numpy(), dst.numpy(),
                                 eid.numpy(), nodes.numpy(), out_degrees.numpy())
    _, _, most, earlier, unread_dst = read_hop_counts(slots.rowptr, torch.tensor(distinct), out_degrees[:distinct],
                                                      num_dst, reached_before)
    return SampledBlock(slots.rowptr, local_src, dst, eid, nodes[:distinct], out_degrees[:distinct], most, unread_dst,
                        earlier)
