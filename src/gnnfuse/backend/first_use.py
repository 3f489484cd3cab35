"""Kernels compiled on their first call: the time it took, and a notice while it happens.

The Numba CPU backend compiles each fused kernel the first time it runs -- seconds per
kernel on a laptop-class core; a two-layer GAT's forward, backward and evaluation are
about twenty kernels, a minute on this project's 2-core machine -- and keeps the machine
code on disk, where later processes load it in milliseconds. The Triton backend's first
launch of an autotuned kernel per size class compiles and times every config (a GAT's
first step on an arxiv-sized graph: 29 s on an H200, each kernel's configs compiled side
by side, backend/triton/parallel_compile.py), unless Triton's caches hold them. A first
epoch that takes a minute for no visible reason looks like a hang, so the first such
compile of a process prints one line when stderr is a terminal (`gnnfuse.progress`:
nothing in logs and pipes), and the training loops add what `compiled_since` reports to
their epoch lines.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

from ..progress import stderr_is_terminal
from .kernel_cache import cache_dir, compiled_by_call

_TALLY = [0, 0.0]          # kernels compiled by first calls in this process, and their seconds
_ANNOUNCED: list[bool] = []


def call_compiling(kernel: object, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, the first call of ``kernel`` (`kernel_cache.first_call_compiles`;
    ``call`` is the kernel or a wrapper of it), timed into the tally, with the process's
    first notice."""
    _announce(f"gnnfuse: compiling CPU kernels on first use (seconds each; the machine code is cached in "
              f"{cache_dir()}, so later runs load it)")
    begin = time.perf_counter()
    try:
        return call(*args)
    finally:
        compiled_by_call(kernel)
        _TALLY[0] += 1
        _TALLY[1] += time.perf_counter() - begin


# A first launch faster than this found its kernel in Triton's caches: not counted.
COMPILE_SECONDS = 0.2


def first_launch(call: Callable[[], Any]) -> Any:
    """``call()``, an autotuned Triton kernel's first launch for its signature, counted
    into the tally when it takes `COMPILE_SECONDS` or more; the process's first such
    prints its line afterwards (before, it cannot be told from a launch that only loads)."""
    begin = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - begin
    if seconds >= COMPILE_SECONDS:
        _TALLY[0] += 1
        _TALLY[1] += seconds
        _announce(f"gnnfuse: compiled and tuned a GPU kernel in {seconds:.1f} s on its first launch; the first "
                  f"step does so for each of its kernels (Triton caches them for later runs)")
    return result


def _announce(line: str) -> None:
    if not _ANNOUNCED:
        _ANNOUNCED.append(True)
        if stderr_is_terminal():
            print(line, file=sys.stderr, flush=True)


def compiled_so_far() -> tuple[int, float]:
    """(kernels, seconds) compiled by first calls in this process so far."""
    return _TALLY[0], _TALLY[1]


def compiled_since(before: tuple[int, float]) -> str:
    """What was compiled since ``before`` (a `compiled_so_far`), as an epoch line's
    note: "" when nothing was."""
    kernels, seconds = _TALLY[0] - before[0], _TALLY[1] - before[1]
    if not kernels:
        return ""
    return f" (of which {seconds:.1f} s compiling {kernels} kernel{'s' if kernels != 1 else ''} on first use)"
