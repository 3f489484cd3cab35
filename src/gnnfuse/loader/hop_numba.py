"""One hop sampled and reindexed on the CPU by two Numba kernels: the CPU counterpart of
`hop_triton`, reached through `hop_kernels` (`sample_slots_fused`, `reindex_slots_fused`).

The vectorized torch path (`loader.sampler`) runs about 160 aten ops per hop, sorts
included; on this project's 2-core CPU an arxiv-sized batch (fanouts 15,10,5, 1024
seeds) spent 18 ms sampling and 17 ms reindexing on one thread. Here:

- ``sample``: each destination draws Floyd's uniform subset with a counter-based
  generator (SplitMix64 of the seed and the slot); a destination with at most
  ``fanout`` in-edges keeps all. One thread: the sample is a small share of the hop,
  and a parallel loop would start Numba's OpenMP pool in the loader's process, after
  which GNU OpenMP aborts any fork() of it (the CPU ranks of `gnnfuse.distributed` are
  forked).
- ``reindex``: one pass over [destinations, slots] in position order through an
  open-addressed table, numbering each id at its first occurrence (the numbering of
  `sampler.reindex_slots`, which the tests check), then the block's CSR, its distinct
  ids and their out-degrees. Sequential: the numbering is a scan.
"""
from __future__ import annotations

import numba
import numpy as np

from ..backend.cpu.random_mask import GOLDEN, splitmix64
from ..backend.kernel_cache import guard_numba_disk_cache


@numba.njit(cache=True, nogil=True)
def sample(rowptr, col, seeds, fanout, seed, slot_src, slot_eid, count, num_nodes):
    """Fill ``fanout`` slots per destination (source id, edge id; ``num_nodes`` and 0 in
    empty slots) and the destinations' edge counts. Returns -1, or the first destination
    whose id or CSR row is out of range: Numba does not check bounds, and a bad row
    would read past the arrays (a crash, or worse, garbage)."""
    key = np.uint64(seed)
    for r in range(seeds.shape[0]):
        v = seeds[r]
        if v < 0 or v >= num_nodes:
            return r
        start = rowptr[v]
        deg = rowptr[v + 1] - start
        if start < 0 or deg < 0 or start + deg > col.shape[0]:
            return r
        base = r * fanout
        taken = deg if deg < fanout else fanout     # not ``min``: a trace swaps that builtin (frontend/vertex.py)
        if deg <= fanout:
            for i in range(deg):
                slot_eid[base + i] = start + i
        else:
            for i in range(fanout):                     # Floyd: step i draws t in [0, top]
                top = deg - fanout + i
                t = np.int64(splitmix64(key ^ (np.uint64(base + i) * GOLDEN) + GOLDEN) % np.uint64(top + 1))
                for j in range(i):
                    if slot_eid[base + j] == t:
                        t = top
                        break
                slot_eid[base + i] = t
            for i in range(fanout):
                slot_eid[base + i] += start
        for i in range(fanout):
            if i < taken:
                slot_src[base + i] = col[slot_eid[base + i]]
            else:
                slot_src[base + i] = num_nodes
                slot_eid[base + i] = 0
        count[r] = taken
    return -1


@numba.njit(cache=True, nogil=True)
def reindex(seeds, slot_src, slot_eid, count, rowptr, fanout, num_nodes, local_src, dst, eid, nodes, out_degrees):
    """Number [destinations, slots] by first occurrence into ``nodes`` and write the
    block's edges in CSR order; returns how many distinct ids there are."""
    num_dst = seeds.shape[0]
    num_all = num_dst + slot_src.shape[0]
    size = 2
    while size < 2 * num_all:
        size *= 2
    mask = size - 1
    keys = np.full(size, -1, np.int64)
    ids = np.empty(size, np.int64)
    distinct = 0
    for p in range(num_all):
        key = seeds[p] if p < num_dst else slot_src[p - num_dst]
        if key == num_nodes:
            continue
        h = np.int64(splitmix64(np.uint64(key) + GOLDEN) & np.uint64(mask))
        while keys[h] != -1 and keys[h] != key:
            h = (h + 1) & mask
        if keys[h] == -1:
            keys[h] = key
            ids[h] = distinct
            nodes[distinct] = key
            distinct += 1
        if p >= num_dst:
            s = p - num_dst
            row = s // fanout
            lane = s - row * fanout
            if lane < count[row]:
                e = rowptr[row] + lane
                local = ids[h]
                local_src[e] = local
                dst[e] = row
                eid[e] = slot_eid[s]
                out_degrees[local] += 1
    return distinct


# cached in the package's __pycache__ (or $NUMBA_CACHE_DIR), loaded by every loader worker
for _kernel in (sample, reindex):
    guard_numba_disk_cache(_kernel)
