"""How many intra-op threads torch uses for a command-line run on the CPU.

torch starts one OpenMP thread per physical core, and those threads meet at a barrier
after every parallel op. When another process holds one of the cores, the thread that
lands there stalls every op until it is scheduled again: on a shared 2-core machine
(load average 5-6), the 200 epochs of `gnnfuse train` took 16-100 s with torch's 2
threads and 1.3-3.4 s with one (50x was reported elsewhere). Half the CPUs this process
may use (at least one) leaves room for other work and for hyperthread siblings; on an
idle machine it costs at most a factor two on large ops, against an unbounded loss on a
busy one. An explicit choice always wins: ``--threads``, ``$GNNFUSE_NUM_THREADS``, or
``$OMP_NUM_THREADS`` / ``$MKL_NUM_THREADS`` (which torch reads itself, so we leave it).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

THREADS_ENV = "GNNFUSE_NUM_THREADS"
TORCH_THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# The OpenMP runtime creates every thread asked for at the first parallel op, and past
# the OS's thread limit it crashes: 100000 on a 2-CPU machine was a segmentation fault
# (exit 139) after the command's first output line. Far more than any machine's cores,
# and never fewer than one thread per CPU of this one.
MAX_THREADS = max(1024, os.cpu_count() or 1)


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota
    (containers often see every host core but may use only a few)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            count = min(count, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass                                  # no cgroup v2 quota: the affinity mask is the limit
    return max(1, count)


def default_num_threads() -> int:
    """Half the usable CPUs, at least one (see the module docstring for why)."""
    return max(1, usable_cpus() // 2)


def configure_threads(requested: int | None = None) -> int | None:
    """Set torch's intra-op thread count for a command-line run; returns the count set,
    or None where the user's $OMP_NUM_THREADS / $MKL_NUM_THREADS already chose it.

    `requested` (the ``--threads`` option) wins, then ``$GNNFUSE_NUM_THREADS``; a value
    below 1 or above `MAX_THREADS` is a `ValueError`.
    """
    chosen, source = requested, "the thread count (--threads)"
    if chosen is None and os.environ.get(THREADS_ENV):
        source = f"${THREADS_ENV}"
        try:
            chosen = int(os.environ[THREADS_ENV])
        except ValueError:
            raise ValueError(f"${THREADS_ENV} must be an integer, got {os.environ[THREADS_ENV]!r}") from None
    if chosen is None:
        if any(os.environ.get(name) for name in TORCH_THREAD_ENVS):
            return None
        chosen = default_num_threads()
    if chosen < 1:
        raise ValueError(f"{source} must be >= 1, got {chosen}")
    if chosen > MAX_THREADS:
        raise ValueError(f"{source} must be at most {MAX_THREADS}, got {chosen}")
    torch.set_num_threads(chosen)
    _REQUESTED[0] = requested
    return chosen


# ``--threads`` as the last `configure_threads` got it: a rank started by the launcher
# parses its own command line, and `explicitly_chosen` must see the option there too
_REQUESTED: list[int | None] = [None]


def explicitly_chosen() -> bool:
    """Whether the user chose the thread count (``--threads``, ``$GNNFUSE_NUM_THREADS``,
    ``$OMP_NUM_THREADS`` or ``$MKL_NUM_THREADS``), which a rank's share of the cores
    (`distributed.process_group.share_cores`) must not replace."""
    return _REQUESTED[0] is not None or any(os.environ.get(name) for name in (THREADS_ENV, *TORCH_THREAD_ENVS))
