"""Launching a ``parallel=True`` Numba kernel on Numba's thread pool, from any thread.

Two things go wrong around a launch when the caller is not a plain one-thread script:

- Starting Numba's pool (the first parallel kernel a process compiles, loads or calls)
  resets OpenMP's thread count -- torch's too -- to every core. torch's count is the
  budget both share, so it is put back (a user's ``torch.set_num_threads(1)`` stays 1).
- Numba's ``workqueue`` pool, its threading layer where neither OpenMP nor TBB is
  installed (or ``NUMBA_THREADING_LAYER=workqueue``), is not thread-safe: two Python
  threads launching parallel kernels at once make it abort the whole process
  ("Concurrent access has been detected"), so a model served from a thread pool with
  ``GNNFUSE_BACKEND=cpu`` died. On that pool launches take turns under a lock; the
  OpenMP and TBB pools take concurrent launches, and run them without it. Which pool
  runs is known only once it has started, so the first launch takes the lock too.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

try:
    import numba
except ImportError:     # the backend falls back to the torch reference (executor.py)
    numba = None

_TURNS = threading.Lock()
# whether Numba's pool is known to take concurrent launches (False until it has started)
_CONCURRENT = [False]


def launch(call: Callable, *args) -> None:
    """``call(*args)``: a parallel kernel's launch, or a compile, which may start the pool
    (see the module docstring)."""
    torch_threads = torch.get_num_threads()
    try:
        if _CONCURRENT[0]:
            call(*args)
        else:
            with _TURNS:
                call(*args)
            try:
                _CONCURRENT[0] = numba.threading_layer() != "workqueue"
            except ValueError:      # the pool has not started (the kernel had no parallel loop)
                pass
    finally:
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
