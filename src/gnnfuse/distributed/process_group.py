"""The process group a training rank joins, from the environment ``torchrun`` sets.

``torchrun`` (and ``gnnfuse train --gpus/--cpu-ranks``, which sets the same) starts one process
per rank with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` set; `init_process_group` reads them and joins PyTorch's own process
group: NCCL between GPUs, gloo between CPU processes (CI, laptops). What cannot work is
refused before any collective starts, with the missing piece named -- a rank that
waited for peers which will never come would hang instead of failing.

NCCL's environment (``NCCL_NVLS_ENABLE`` among it: the GPU machines keep NVLink
multicast off) is left exactly as the launcher set it.
"""
from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime.cuda_graph import release_captures
from ..threads import explicitly_chosen, usable_cpus
from ..training.config import ConfigError

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class DistributedError(ConfigError):
    """Multi-process training that cannot start as asked (missing GPUs, no NCCL, not
    launched by torchrun); a `ConfigError`, so ``gnnfuse train`` reports it as a usage
    error before training."""


@dataclass(frozen=True)
class Rank:
    """Where this process stands: its rank among ``world_size``, its rank on this
    machine (``local_rank``, the GPU it drives), its device and the backend."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, draws the progress bar and writes files."""
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """True in a process ``torchrun`` started (it sets ``WORLD_SIZE`` for every rank)."""
    return "WORLD_SIZE" in os.environ


def check_joined() -> None:
    """Raise `DistributedError` in a process that a launcher started as one of several
    ranks (``WORLD_SIZE`` > 1 or ``RANK`` > 0 in the environment) but that joined no
    process group: each such process would train alone, every one of them as rank 0,
    and all would write the same files."""
    ranks, rank = os.environ.get("WORLD_SIZE", "1"), os.environ.get("RANK", "0")
    if (ranks.isdigit() and int(ranks) > 1 or rank.isdigit() and int(rank) > 0) and not (
            dist.is_available() and dist.is_initialized()):
        raise DistributedError(f"this process was launched as one of several ranks (WORLD_SIZE={ranks}, RANK={rank}) "
                               "but joined no process group, so every rank would train alone as rank 0 and write "
                               "the same files; call gnnfuse.distributed.init_process_group('cpu' or 'cuda') first "
                               "(gnnfuse train does), or unset WORLD_SIZE and RANK to train in this process alone")


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def check_backend(device_type: str, processes_per_machine: int) -> None:
    """Raise `DistributedError` unless ``processes_per_machine`` ranks can each drive one
    device of ``device_type`` through its backend (one GPU per rank for NCCL)."""
    if not dist.is_available():
        raise DistributedError(f"torch {torch.__version__} was built without torch.distributed")
    if device_type != "cuda":
        if not dist.is_gloo_available():
            raise DistributedError(f"CPU ranks need the gloo backend, which torch {torch.__version__} lacks")
        return
    if not torch.cuda.is_available():
        raise DistributedError(f"{processes_per_machine} GPU rank(s) asked for, but torch {torch.__version__} sees "
                               "no GPU (CUDA not available); use --cpu-ranks N for CPU ranks (gloo)")
    visible = torch.cuda.device_count()
    if visible < processes_per_machine:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise DistributedError(f"{processes_per_machine} GPU ranks per machine asked for, but only {visible} GPU(s) "
                               f"are visible{'' if shown is None else f' (CUDA_VISIBLE_DEVICES={shown})'}: "
                               "one rank drives one GPU")
    if not dist.is_nccl_available():
        raise DistributedError(f"GPU ranks communicate through NCCL, which torch {torch.__version__} was built "
                               "without")


def init_process_group(device_type: str) -> Rank:
    """Join the process group of a ``torchrun``-launched rank (idempotent): the NCCL
    backend on ``cuda`` with this rank's GPU made current, gloo on ``cpu``. Ranks other
    than 0 stop writing to stdout (rank-0-only logging; errors still reach stderr)."""
    missing = [name for name in LAUNCH_ENV if name not in os.environ]
    if missing:
        raise DistributedError(f"multi-process training needs {', '.join(missing)} in the environment; launch it "
                               "with torchrun --nproc-per-node N -m gnnfuse train ..., or gnnfuse train --gpus N "
                               "(--cpu-ranks N on CPU)")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    check_backend(device_type, local_world)
    share_cores(local_world)
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # device_id binds NCCL's communicator to this rank's GPU (barriers then need no guess)
        dist.init_process_group(backend_for(device_type), rank=rank, world_size=world_size,
                                device_id=device if device_type == "cuda" else None)
    if rank != 0:
        sys.stdout = open(os.devnull, "w")       # noqa: SIM115 (held for the process's life)
    return current()


def share_cores(local_world: int) -> None:
    """Give each of the machine's ``local_world`` ranks its share of the CPUs this process
    may use (affinity and cgroup quota) for torch's intra-op threads, unless the user chose
    the count (``--threads``, ``$GNNFUSE_NUM_THREADS``, ``$OMP_NUM_THREADS``, which torchrun
    sets to 1, or ``$MKL_NUM_THREADS``): each rank otherwise starts one thread per core,
    and the ranks' spinning OpenMP workers compete with every rank's Python thread, which
    issues the GPU's work. (``--threads 2 --cpu-ranks 2`` gave each rank 1 thread.)"""
    if local_world > 1 and not explicitly_chosen():
        torch.set_num_threads(max(1, usable_cpus() // local_world))


def current() -> Rank:
    """This process's `Rank`: from the joined process group, or rank 0 of 1 when none."""
    if not (dist.is_available() and dist.is_initialized()):
        return Rank(0, 1, 0, torch.device("cpu"), None)
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    return Rank(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)), device, backend)


def world_size() -> int:
    """Ranks in the joined process group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


# Seconds the leaving barrier waits for the peers (`leave_process_group`): long enough
# for rank 0 to finish writing its files while the others wait.
LEAVE_TIMEOUT_S = 60.0


def leave_process_group(timeout_s: float | None = None) -> bool:
    """Leave the joined process group (no-op without one), after a barrier bounded by
    ``timeout_s`` (`LEAVE_TIMEOUT_S` when None). Returns False when that barrier did not
    complete -- a peer still waits in a collective, and the group is left as it is (see
    below; the caller must then end the process without the interpreter's shutdown,
    `launch.abandon_process_group`) -- True otherwise.

    gloo's worker thread drops a finished collective's work object after the caller's
    wait returns, and dropping one that holds Python tensors (an ``all_gather_object``,
    DDP's buffers) needs the GIL. A barrier holds the works before it, so its work object
    is kept (`_FINAL_WORKS`) until the process ends: the last reference to it, and so to
    them, is then the main thread's. Dropped by the worker as the last one, it waited for
    the GIL while the main thread, holding it, freed DDP's reducer and with it the group,
    whose destructor joined that worker: a cold-cache CI run here hung so in
    test_the_distributed_benchmark_runs_1_and_2_cpu_ranks_in_one_invocation (~Reducer ->
    ~ProcessGroupGloo -> thread::join, against ~AsyncBarrierWork -> ~AsyncAllgatherWork
    -> GIL), the test where the project's CI run of 0e9f523 stopped for 90 minutes.

    A peer waiting in a collective for this rank never joins the barrier: once the wait
    expires, the barrier still occupies gloo's thread, and destroying the group joined
    that thread for the group's timeout (30 minutes), the peer waiting as long. So a
    barrier that did not complete leaves the group as it is, and so does a call while an
    error propagates (a ``finally``; such a rank's peers may be mid-collective): the
    process ends, its connections close, and the peers' collectives fail at once."""
    if dist.is_available() and dist.is_initialized():
        if sys.exc_info()[0] is not None:
            return True      # an error passes through the caller (a `finally`): the docstring says why
        release_captures()      # a captured step's graph holds NCCL work past the group (StepCapture.release)
        work = dist.barrier(async_op=True)
        _FINAL_WORKS.append(work)
        try:     # bounded, so a rank whose peer died still leaves
            work.wait(timeout=datetime.timedelta(seconds=LEAVE_TIMEOUT_S if timeout_s is None else timeout_s))
        except RuntimeError:
            if not work.is_completed():
                return False      # gloo's thread still runs the barrier: the docstring says why
        dist.destroy_process_group()
    return True


_FINAL_WORKS: list = []     # see leave_process_group
