"""Progress bars that only draw on a terminal.

tqdm redraws its bar with carriage returns several times a second. On a terminal that
is one line updated in place; in a log file, a CI job or a captured pipe every redraw is
kept, which made a long ``gnnfuse train`` write hundreds of KB of ``\\r`` lines to
stderr. So the bar is drawn only when stderr is a terminal; elsewhere callers print one
plain line per step that matters (train's per-epoch lines, one line per download).
"""
from __future__ import annotations

import sys
from typing import Any, Iterable

from tqdm import tqdm


def stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(iterable: Iterable[Any] | None = None, **kw: Any) -> tqdm:
    """`tqdm(iterable, **kw)` on stderr, disabled (drawing nothing) when stderr is not a terminal."""
    return tqdm(iterable, file=sys.stderr, disable=not stderr_is_terminal(), **kw)
