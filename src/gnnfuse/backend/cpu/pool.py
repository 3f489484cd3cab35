"""Launching a ``parallel=True`` Numba kernel on Numba's thread pool, from any thread.

Three things go wrong around a launch when the caller is not a plain one-process, one-thread
script:

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
- GNU OpenMP cannot run in a process forked after it started its threads: Numba
  terminates such a child at its first parallel launch ("fork() called from a process
  already using GNU OpenMP, this is unsafe"), so a ``DataLoader`` worker (forked on
  Linux) or an ``os.fork``/``multiprocessing`` child calling a layer was killed once the
  parent had run one parallel kernel. Such a child runs the serial kernels
  (`schedule.parallel`, `USABLE`) and torch's dropout mask (`random_mask.available`).
"""
from __future__ import annotations

import os
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
# whether this process may launch parallel kernels: not in a fork of a process whose pool
# was GNU OpenMP's (read inline by the launch settings, `executor._settings`)
USABLE = [True]


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


def _gnu_openmp_started() -> bool:
    """Whether Numba's pool has started on GNU OpenMP (Intel's runtime survives a fork;
    the TBB and workqueue pools are rebuilt in the child)."""
    try:
        layer = numba.threading_layer()
    except ValueError:      # no parallel kernel has run
        return False
    if layer != "omp":
        return False
    from numba.np.ufunc import omppool
    return omppool.openmp_vendor == "GNU"


def _after_fork_in_child() -> None:
    if numba is not None and _gnu_openmp_started():
        USABLE[0] = False


os.register_at_fork(after_in_child=_after_fork_in_child)
