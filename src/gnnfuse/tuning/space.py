"""The schedule space the tuner searches, per backend and unit (FeatGraph §IV-A: the
templates' parameters -- graph partitions, thread blocks -- times the feature-dimension
schedule's tiling factors, searched exhaustively).

CPU (the Numba backend): feature tile x source-partition cache budget x thread chunk.
Tiles narrower than the unit's width; partition budgets around the L2 cache (FeatGraph
sizes ranges so that a range's feature rows fit in cache), only for units that gather
neighbour rows; chunks only when the kernel runs on several threads. Edge units have no
CPU schedule options. Triton: the CSR and (sum/mean only) COO and rows schedules x feature block.

``small`` is a space of a handful of points, for tests and quick checks.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

from ..backend.determinism import deterministic
from ..backend.forced_schedule import ForcedSchedule
from ..passes.fusion import AggregateUnit, Unit, gathered_leaves

SPACES = ("full", "small")
CPU_TILES = (16, 32, 64, 128)
CPU_CHUNKS = (1, 4, 16)
TRITON_TILES = (16, 32, 64, 128)
_L2_FALLBACK = 1 << 20


def l2_bytes() -> int:
    """This CPU's L2 cache size (Linux sysfs), else 1 MiB."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip().upper()
        return int(text[:-1]) * (1 << 10 if text.endswith("K") else 1 << 20) if text[-1] in "KM" else int(text)
    except (OSError, ValueError, IndexError):
        return _L2_FALLBACK


def _gathers_neighbours(unit: AggregateUnit) -> bool:
    return any(side != unit.by for sides in gathered_leaves(unit).values() for side in sides)


def candidates(unit: Unit, backend: str, threads: int, space: str = "full") -> list[ForcedSchedule]:
    """Every schedule to time for ``unit``; the first is the cost rule (all defaults).
    Under ``torch.use_deterministic_algorithms(True)`` no ``coo`` (its atomic adds have no
    fixed order, and forcing it there is refused: backend/determinism.py)."""
    width = math.prod(unit.root.shape)
    aggregate = isinstance(unit, AggregateUnit)
    if backend == "cpu":
        if not aggregate:
            return [ForcedSchedule()]
        tiles = (2,) if space == "small" else CPU_TILES
        budgets = (64,) if space == "small" else tuple(l2_bytes() * k // 2 for k in (1, 2, 4))
        chunks = () if space == "small" or threads < 2 else CPU_CHUNKS
        grid = itertools.product((None, *(t for t in tiles if t < width)),
                                 (None, *budgets) if _gathers_neighbours(unit) else (None,),
                                 (None, *chunks))
        return [ForcedSchedule(feature_tile=t, partition_bytes=b, chunk=c) for t, b, c in grid]
    kinds = ("csr", "coo", "rows") if aggregate and unit.reduce.attrs["op"] in ("sum", "mean") else ("auto",)
    if deterministic():
        kinds = tuple(k for k in kinds if k != "coo")
    tiles = (16,) if space == "small" else TRITON_TILES
    return [ForcedSchedule()] + [ForcedSchedule(kind=k, feature_tile=t)
                                 for k, t in itertools.product(kinds, (None, *tiles))
                                 if not (k == "auto" and t is None)]
