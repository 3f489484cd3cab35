"""A schedule chosen for one call, overriding the backend's cost rule (FeatGraph's FDS).

FeatGraph lets the user of a template say how a kernel is parallelized and tiled; here
``gnnfuse.ops.gspmm(..., schedule=...)`` does that by running the call inside
`forcing` (and its backward inside the same choice, see `runtime.compiled`). The
override lives in a context variable rather than in the program, so one compiled
program serves every schedule and the choice never leaks into other calls or threads.
Backends that have no such choice (the torch reference) ignore it.
"""
from __future__ import annotations


from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator
from ..environ import getenv

SCHEDULES = ("auto", "csr", "coo", "rows")
MAX_FEATURE_TILE = 1024   # widest feature tile a schedule may name: Triton's BLOCK_F lanes


def valid_feature_tile(tile: object) -> bool:
    """Whether ``tile`` is a feature tile a schedule may name: None (the backend's
    default) or a power of two from 1 to `MAX_FEATURE_TILE`. ``gspmm(schedule=)`` and
    the tuned-schedule file share it: a file naming a tile of 2**40 was taken, and the
    Triton backend then failed inside its kernel (Scalar ... out of range for int32)."""
    return tile is None or (isinstance(tile, int) and not isinstance(tile, bool)
                            and 1 <= tile <= MAX_FEATURE_TILE and not tile & (tile - 1))


@dataclass(frozen=True)
class ForcedSchedule:
    """``kind``: ``csr`` (vertex-parallel over destinations, edges in sequence), ``coo``
    (edge-parallel with atomic adds; sum and mean only), ``rows`` (many destinations side
    by side per program; a sum or mean without a fused addend or head-blocked lanes:
    forced for every unit by ``GNNFUSE_SCHEDULE``, other units walk as ``csr``) or
    ``auto`` (the cost rule). ``gnnfuse.ops.gspmm`` checks its ``schedule=`` against its
    one reduction: ``coo`` and ``rows`` with max or min are refused there, as is an
    unknown kind or a feature tile that is not a power of two.
    ``feature_tile``: features one program handles (a power of two), None for the
    backend's width-adaptive default.

    The CPU backend reads two more, FeatGraph's CPU schedule (§III-C): ``partition_bytes``
    cuts the source vertices into ranges whose gathered feature rows fill that many bytes
    of cache, each range's partial aggregation accumulated in turn (None: one pass over
    all sources); ``chunk`` is how many blocks of rows a thread takes at a time from the
    shared pool (dynamic scheduling against degree skew; None: an even static split)."""
    kind: str = "auto"
    feature_tile: int | None = None
    partition_bytes: int | None = None
    chunk: int | None = None

    def __post_init__(self) -> None:
        for name in ("partition_bytes", "chunk"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"schedule {name} must be a positive integer or None, got {value!r}")


_CURRENT: ContextVar[ForcedSchedule | None] = ContextVar("gnnfuse_forced_schedule", default=None)


# ``forced_schedule()``: the schedule forced for the code running now, or None. The context
# variable's own ``get`` (one C call), not a function wrapping it: every program run asks,
# forward and backward, and the wrapper was a Python call more each time.
forced_schedule: Callable[[], ForcedSchedule | None] = _CURRENT.get


SCHEDULE_ENV = "GNNFUSE_SCHEDULE"


def schedule_variable() -> str:
    """The kind ``GNNFUSE_SCHEDULE`` forces on every unit ("auto" where unset or empty),
    refused by name if it is none of `SCHEDULES`."""
    kind = getenv(SCHEDULE_ENV) or "auto"
    if kind not in SCHEDULES:
        raise ValueError(f"{SCHEDULE_ENV} must be one of {SCHEDULES}, got {kind!r}")
    return kind


@contextmanager
def forcing(schedule: ForcedSchedule | None) -> Iterator[None]:
    """Run the block under ``schedule`` (None: no override)."""
    token = _CURRENT.set(schedule)
    try:
        yield
    finally:
        _CURRENT.reset(token)


TILED_SCORES_FROM_EDGES = 4_000_000   # the default plan tiles the scores on graphs with this many edges or more
TILED_SCORES_ENV = "GNNFUSE_TILED_SCORES"


def tiled_scores(num_edges: int) -> bool:
    """Whether per-edge feature sums (attention scores) are recomputed inside every kernel
    that reads them, as a register tile (``passes.fusion.partition``'s
    ``tile_feature_sums``), instead of written once as an [E, heads] tensor, on a graph of
    ``num_edges`` edges. Tiled, GAT, GATv2 and DotGAT write nothing per edge in forward or
    backward, which is what keeps GATv2's extra memory on a Reddit2-sized graph (23M
    edges) near turbo-gnn's: the [E, heads] float32 scores were the difference. Written
    once, the scores cost E x heads x 4 bytes -- 43 MB for GAT's 8 heads on an
    arxiv-sized graph (1.3M edges with self loops) -- and save recomputing them in four
    kernels: that GAT training step took 3.18-3.22 ms untiled against 3.42-3.43 ms tiled
    on an H200, with the same peak memory. So by default (``GNNFUSE_TILED_SCORES=auto``)
    graphs of `TILED_SCORES_FROM_EDGES` edges or more get the tiled plan and smaller ones
    the untiled; ``1`` and ``0`` force either. Both plans stay within the IO rule (no
    edge-rowed tensor wider than the heads).

    It was opt-in while Triton 3.6 could not compile it on an H100: the first form looked
    each lane's head up with ``tl.gather`` (an assertion in TritonGPUOptimizeThreadLocality
    at 2 heads x 3 channels, a 40 s compile at 4 x 32), and [256, 128] score tiles
    spilled registers. ``benchmarks/compile_tiled_scores.py`` compiles every tiled kernel
    for sm_90 with a given Triton, without a GPU."""
    value = getenv(TILED_SCORES_ENV) or "auto"     # (empty: unset, as for every variable)
    if value not in ("0", "1", "auto"):
        raise ValueError(f"GNNFUSE_TILED_SCORES must be auto, 0 or 1, got {value!r}")
    return num_edges >= TILED_SCORES_FROM_EDGES if value == "auto" else value == "1"
