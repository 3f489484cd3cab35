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
forces a tile for every kernel, for benchmarks.

Which schedule a unit runs under (`chosen`): a schedule the call forced
(``gnnfuse.ops.gspmm(..., schedule=...)``, or the tuner timing a candidate), else --
unless ``GNNFUSE_CPU_FEATURE_TILE`` is set -- the tuner's stored choice for this unit,
graph class and machine (`tuned_schedule`), else this module's cost rule: one pass over
the whole feature width and all sources (no partitions; see partition.py), rows split
evenly between threads.
"""
from __future__ import annotations

import math

import torch

from ...passes.fusion import AggregateUnit, Unit, gathered_leaves
from .. import tuned_schedule
from ..forced_schedule import ForcedSchedule
from ..reference import GraphContext
from . import pool
from ...environ import getenv

FEATURE_TILE_ENV = tuned_schedule.OVERRIDES["cpu"]
PARALLEL_MIN_WORK = 1 << 16   # edge-features below which one thread beats waking the others
COST_RULE = ForcedSchedule()


def chosen(unit: Unit, ctx: GraphContext) -> ForcedSchedule:
    """The schedule ``unit`` runs under on this graph (see module doc)."""
    return tuned_schedule.forced_or_tuned(unit, ctx.graph, "cpu") or COST_RULE


def feature_tile(width: int, tile: int | None = None) -> int:
    """Columns per feature tile for an aggregate of ``width`` columns: ``tile`` (a chosen
    schedule's), else ``GNNFUSE_CPU_FEATURE_TILE``, else the whole width (see module doc)."""
    if tile is None:
        forced = getenv(FEATURE_TILE_ENV)
        if not forced:
            return max(width, 1)
        tile = int(forced) if forced.isdigit() else 0
        if tile < 1:
            raise ValueError(f"{FEATURE_TILE_ENV} must be a positive integer, got {forced!r}")
    return min(tile, max(width, 1))


def range_rows(unit: AggregateUnit, partition_bytes: int | None, tile: int, num_neighbours: int) -> int | None:
    """Neighbour vertices per source range so that the rows the unit gathers from a range
    (``tile`` columns of each wide gathered leaf, all of a one-column one) fill
    ``partition_bytes``; None where one range would hold them all or nothing is gathered."""
    if not partition_bytes:
        return None
    sides = gathered_leaves(unit)
    row_bytes = sum(min(math.prod(leaf.shape), tile) * leaf.dtype.itemsize
                    for leaf in unit.leaves if any(side != unit.by for side in sides.get(leaf.id, ())))
    if row_bytes == 0:
        return None
    rows = max(1, partition_bytes // row_bytes)
    return rows if rows < num_neighbours else None


# Gathered tables smaller than this stay in the caches, where prefetching the rows of
# later edges only costs instructions. One core of the 2-core AMD EPYC, pubmed (19,717
# rows), fastest of 5 runs each: at F=16 (1.3 MB) a neighbour sum took 0.147 ms without
# and 0.222 with prefetching; at F=64 (5 MB) 0.565 without, 0.466 with; arxiv-sized at
# F=16 (10.8 MB) 9.9 without, 6.4 with.
PREFETCH_MIN_BYTES = 3 << 20


def prefetch(gathered_bytes: int) -> bool:
    """Whether a kernel prefetches the rows its walk will gather (codegen.PREFETCH_DISTANCE
    edges ahead): only where the table they come from, ``gathered_bytes``, outgrows the
    caches."""
    return gathered_bytes >= PREFETCH_MIN_BYTES


REGISTER_ROW_MAX = 64   # widest row an aggregate kernel keeps in registers (`register_row`)


def register_row(width: int, tile: int, partitioned: bool) -> bool:
    """Whether an aggregate of ``width`` columns runs the kernel that keeps its row in
    registers (codegen.generate_register_row): for rows up to `REGISTER_ROW_MAX` wide
    taken in one pass over all sources -- a forced narrower feature tile or source
    ranges (FeatGraph's schedules) keep the loop kernel, which implements them. Measured
    on pubmed, one core of an AMD EPYC, GCN-normalized sum, against the loop kernel:
    F=16 0.18 against 0.37 ms, F=64 0.28 against 1.28 ms; arxiv-sized F=64 12 against 45
    ms. The cap bounds the written-out kernel's compile time, which grows with the width
    (parallel build: 0.9 s at 16 columns, 1.6 s at 64, 3.5 s at 128, 9 s at 256)."""
    return 0 < width <= REGISTER_ROW_MAX and tile >= width and not partitioned


def parallel(work: int, threads: int, row_shape: tuple[int, ...]) -> bool:
    """Whether a kernel doing ``work`` edge-feature steps on ``threads`` threads, with
    output rows of ``row_shape``, is compiled with ``parallel=True``. Always for large
    work on several threads. On one thread too where its rows are flat: there the
    parallel build of a neighbour sum ran 4.3x faster than the serial one (arxiv-sized,
    F=16, one core of an AMD EPYC: 5.4 against 23.5 ms), Numba outlining the ``prange``
    body into a function LLVM vectorizes. Not for multi-head rows (H, D), whose parallel
    build ran 2x slower on one thread (pubmed GAT, 8 heads x 8: the weighted sums took 64
    against 32 ms a step). Small work keeps the serial build, which compiles in a third
    of the time (the test suite's graphs). Never in a process that cannot start Numba's
    pool (`pool.USABLE`: a fork of one whose pool was GNU OpenMP's)."""
    return pool.USABLE[0] and work >= PARALLEL_MIN_WORK and (threads > 1 or len(row_shape) < 2)


def threads(work: int, limit: int) -> int:
    """Threads for a kernel doing ``work`` edge-feature steps, at most ``limit``:
    torch's intra-op count (which ``gnnfuse.threads`` and the test suite set), so the
    CPU backend and the torch ops around it share one budget, but one thread for small
    work -- waking a second thread cost 20 ms per launch on a loaded 2-core machine,
    against 0.3 ms for a whole small kernel run serially."""
    if work < PARALLEL_MIN_WORK:
        return 1
    return max(1, min(torch.get_num_threads(), limit))
