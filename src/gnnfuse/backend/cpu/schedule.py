"""How a CPU aggregate kernel walks the feature axis and how many threads it uses.

FeatGraph (§III-C) tiles the feature dimension on CPUs: an SpMM gathers rows of the
source features in CSR order, essentially at random, so when the N x F source matrix
is larger than the last-level cache every gathered row is a miss. Processing F in tiles
of ``t`` columns, one pass over the graph per tile, shrinks the randomly accessed working
set to N x t, at the price of reading the CSR once per tile. The tile is the widest
that keeps N x t within `CACHE_BUDGET` (never narrower than `MIN_TILE`, where the pass
over the CSR starts to dominate); ``GNNFUSE_CPU_FEATURE_TILE`` forces one (tuning and
benchmarks).
"""
from __future__ import annotations

import os

import torch

CACHE_BUDGET = 8 << 20   # bytes of gathered rows per tile: a share of a typical 16-32 MiB L3
MIN_TILE = 16            # one 64-byte line of float32 per gathered row and tile
FEATURE_TILE_ENV = "GNNFUSE_CPU_FEATURE_TILE"
PARALLEL_MIN_WORK = 1 << 16   # edge-features below which one thread beats waking the others


def feature_tile(num_rows: int, width: int, itemsize: int) -> int:
    """Columns per feature tile for gathering ``num_rows`` rows of ``width`` elements."""
    forced = os.environ.get(FEATURE_TILE_ENV)
    if forced:
        tile = int(forced)
        if tile < 1:
            raise ValueError(f"{FEATURE_TILE_ENV} must be a positive integer, got {forced!r}")
        return min(tile, max(width, 1))
    if num_rows * width * itemsize <= CACHE_BUDGET:
        return max(width, 1)
    fitting = CACHE_BUDGET // max(num_rows * itemsize, 1)
    return min(width, max(MIN_TILE, fitting // MIN_TILE * MIN_TILE))


def threads(work: int, limit: int) -> int:
    """Threads for a kernel doing ``work`` edge-feature steps, at most ``limit``:
    torch's intra-op count (which ``gnnfuse.threads`` and the test suite set), so the
    CPU backend and the torch ops around it share one budget, but one thread for small
    work -- waking a second thread cost 20 ms per launch on a loaded 2-core machine,
    against 0.3 ms for a whole small kernel run serially."""
    if work < PARALLEL_MIN_WORK:
        return 1
    return max(1, min(torch.get_num_threads(), limit))
