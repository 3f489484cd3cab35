"""How a CPU aggregate kernel walks the feature axis and how many threads it uses.

FeatGraph (§III-C) tiles the feature dimension on CPUs: an SpMM gathers rows of the
source features in CSR order, essentially at random, so when the N x F source matrix
is larger than the last-level cache every gathered row is a miss; processing F in tiles
of ``t`` columns, one pass over the graph per tile, shrinks the randomly gathered
working set to N x t, at the price of walking the CSR once per tile. The kernels take
the tile as an argument, but the default is one tile (no tiling) because tiling did not
pay where it was measured: on the arxiv-like graph (169k vertices, 1.17M edges) at
F=256, one thread of an AMD EPYC (32 MiB L3), tiles of 16, 32 and 64 columns made the
neighbour sum 2.8x, 1.8x and 1.06x slower than one 256-wide pass (534, 357, 205 against
193 ms). A gathered row of 1 KiB streams through the prefetcher; a 64-byte tile of it
is one isolated miss, and the CSR is re-read per tile. ``GNNFUSE_CPU_FEATURE_TILE``
forces a tile, for benchmarks and for a tuner's search (FeatGraph's FDS).
"""
from __future__ import annotations

import os

import torch

FEATURE_TILE_ENV = "GNNFUSE_CPU_FEATURE_TILE"
PARALLEL_MIN_WORK = 1 << 16   # edge-features below which one thread beats waking the others


def feature_tile(width: int) -> int:
    """Columns per feature tile for an aggregate of ``width`` columns (see module doc)."""
    forced = os.environ.get(FEATURE_TILE_ENV)
    if not forced:
        return max(width, 1)
    tile = int(forced) if forced.isdigit() else 0
    if tile < 1:
        raise ValueError(f"{FEATURE_TILE_ENV} must be a positive integer, got {forced!r}")
    return min(tile, max(width, 1))


def threads(work: int, limit: int) -> int:
    """Threads for a kernel doing ``work`` edge-feature steps, at most ``limit``:
    torch's intra-op count (which ``gnnfuse.threads`` and the test suite set), so the
    CPU backend and the torch ops around it share one budget, but one thread for small
    work -- waking a second thread cost 20 ms per launch on a loaded 2-core machine,
    against 0.3 ms for a whole small kernel run serially."""
    if work < PARALLEL_MIN_WORK:
        return 1
    return max(1, min(torch.get_num_threads(), limit))
