"""Every gnnfuse setting variable's value checked when a program runs, on whichever
backend. Why: each variable is read only by the code it steers, so on a path that does
not reach that code -- the torch reference, the default off the GPU -- a mistyped value
(``GNNFUSE_SCHEDULE=CSR``, ``GNNFUSE_AUTOTUNE=yes``, ``GNNFUSE_CPU_FEATURE_TILE=-1``) was
never read and silently ignored, where README promises such values are refused by name.
The values are checked again only when one of the variables changes
(`environ.Variables`), so a run costs one tuple comparison. A set name close to a known
one is warned about at the first check (`_warn_misspelled`).
"""
from __future__ import annotations

import difflib
import os

from ..backend.cpu.schedule import FEATURE_TILE_ENV, feature_tile
from ..backend.forced_schedule import SCHEDULE_ENV, TILED_SCORES_ENV, schedule_variable, tiled_scores
from ..environ import Variables, count, flag
from ..ir.ops.typed_aggregate import ORDER_ENV, forced_order
from ..user_warning import warn

SWITCHES = ("GNNFUSE_AUTOTUNE", "GNNFUSE_SIBLING_KERNELS", "GNNFUSE_PAIR_SOURCES", "GNNFUSE_CHECK_CONFIGS")
COMPILE_THREADS_ENV = "GNNFUSE_COMPILE_THREADS"     # backend/triton/parallel_compile.py's; not imported:
# that package imports triton, which gnnfuse imports only when a Triton run needs it
CHECKED = Variables((SCHEDULE_ENV, FEATURE_TILE_ENV, TILED_SCORES_ENV, ORDER_ENV, COMPILE_THREADS_ENV,
                     *SWITCHES))
_LAST: list[tuple | None] = [None]     # the raw values last found good
# Every variable gnnfuse reads (README's list): a set name one letter off one of these is a
# typo whose setting silently never applies (``GNNFUSE_BACKNED=triton`` ran the reference)
KNOWN = ("GNNFUSE_BACKEND", "GNNFUSE_SCHEDULE", "GNNFUSE_CPU_FEATURE_TILE", "GNNFUSE_TILED_SCORES",
         "GNNFUSE_TYPED_ORDER", "GNNFUSE_COMPILE_THREADS", *SWITCHES, "GNNFUSE_CACHE",
         "GNNFUSE_TUNED_SCHEDULES", "GNNFUSE_NUM_THREADS", "GNNFUSE_DATA", "GNNFUSE_PLANETOID_URL",
         "GNNFUSE_FUSED_HOPS", "GNNFUSE_COMMIT")


def check_settings() -> None:
    """ValueError naming the variable and the values it takes, for the first variable
    of `CHECKED` set to a value its reader would refuse; nothing when all are good."""
    raw = CHECKED.raw()
    if raw == _LAST[0]:
        return
    if _LAST[0] is None:
        _warn_misspelled()
    schedule_variable()
    feature_tile(1)
    tiled_scores(0)
    forced_order()
    count(COMPILE_THREADS_ENV, "threads (1 compiles serially)")
    for name in SWITCHES:
        flag(name, True)
    _LAST[0] = raw


def _warn_misspelled() -> None:
    """One warning per set ``GNNFUSE_*`` name that is not one gnnfuse reads but is close
    to one (names far from every known one, a script's own, are left alone)."""
    for name in os.environ:
        upper = name.upper()       # gnnfuse_backend: names are case-sensitive on POSIX
        if upper.startswith("GNNFUSE_") and name not in KNOWN:
            close = [upper] if upper in KNOWN else difflib.get_close_matches(upper, KNOWN, n=1, cutoff=0.85)
            if close:
                warn(f"gnnfuse reads no variable {name}; did you mean {close[0]}? ({name} is ignored)",
                     RuntimeWarning)
