"""One way to launch: ``gnnfuse train --gpus N`` starts the ranks ``torchrun`` would.

``torchrun --nproc-per-node N -m gnnfuse train ...`` is the launch; ``--gpus N`` (GPU
ranks, NCCL) and ``--cpu-ranks N`` (CPU ranks, gloo: CI and machines without GPUs) start
the same N processes on this machine with torch.multiprocessing, each with torchrun's
environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` on a free local port) and the same command line: a
process that finds ``WORLD_SIZE`` in its environment joins the process group instead of
launching again. Not torchrun's own agent: it costs seconds of start-up and shut-down
per launch for a restart policy a single-machine run does not use, while
torch.multiprocessing already stops every rank when one fails.

GPU ranks are spawned (fresh interpreters: a CUDA context does not survive a fork).
CPU ranks are forked, so they start with the launcher's imports (gnnfuse, and
torch._dynamo, which DDP imports: ~3 s of CPU a process otherwise): safe because the
launcher has done no parallel torch work yet -- it has only parsed its options -- and
so holds no OpenMP thread team for a child to inherit (a forked child's first parallel
region would hang on it). `train_run_function` then picks what each rank runs.
"""
from __future__ import annotations

import atexit
import os
import socket
import sys
from typing import Callable, Sequence

import torch.multiprocessing as mp

from .process_group import (DistributedError, check_backend, init_process_group, launched_by_torchrun,
                            leave_process_group)


def ranks_and_device(gpus: int | None, cpu_ranks: int | None, device: str) -> tuple[int | None, str]:
    """(ranks asked for, device type): ``--gpus`` means CUDA ranks, ``--cpu-ranks`` CPU ranks,
    neither keeps ``device`` (a torchrun launch without either takes its world size)."""
    if gpus is not None and cpu_ranks is not None:
        raise DistributedError("--gpus N asks for GPU ranks and --cpu-ranks N for CPU ranks; give one")
    for flag, count in (("--gpus", gpus), ("--cpu-ranks", cpu_ranks)):
        if count is not None and count < 1:
            raise DistributedError(f"{flag} must be >= 1, got {count}")
    if gpus is not None:
        return gpus, "cuda"
    if cpu_ranks is not None:
        if device == "cuda":
            raise DistributedError("--cpu-ranks N starts CPU ranks (gloo); for GPU ranks use --gpus N")
        return cpu_ranks, "cpu"
    return None, device


def launch_or_join(gpus: int | None, cpu_ranks: int | None, device: str, entry: Callable[[list[str]], int],
                   argv: Sequence[str]) -> tuple[int | None, str]:
    """Start the ranks, join them, or do nothing, for ``entry(argv)`` (``gnnfuse``'s main).

    Returns (exit status, device type): a status when this process launched the ranks
    (`run_ranks`) and they have finished (it trains nothing itself); None when this
    process should train -- as a rank of the process group it has just joined (launched
    by torchrun), or alone. Raises `DistributedError` when the ranks cannot run.
    """
    ranks, device_type = ranks_and_device(gpus, cpu_ranks, device)
    if launched_by_torchrun():
        if ranks is not None and ranks != int(os.environ["WORLD_SIZE"]):
            raise DistributedError(f"{'--gpus' if gpus is not None else '--cpu-ranks'} {ranks}, but the launcher started "
                                   f"{os.environ['WORLD_SIZE']} ranks")
        init_process_group(device_type)
        atexit.register(_leave)
        return None, device_type
    if ranks is None or ranks == 1:
        if ranks == 1:
            check_backend(device_type, 1)
        return None, device_type
    check_backend(device_type, ranks)
    return run_ranks(ranks, device_type, entry, argv), device_type


def run_ranks(ranks: int, device_type: str, entry: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """Run ``entry(argv)`` in ``ranks`` processes with torchrun's environment (see the
    module docstring); the exit status: 0, or 1 when a rank failed (its error printed)."""
    try:
        start_ranks(_rank_main, (ranks, free_port(), entry, list(argv)), ranks, device_type)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        print(f"gnnfuse: rank {error.error_index} of {ranks} failed: {error}", file=sys.stderr)
        return 1
    return 0


def start_ranks(function: Callable[..., None], args: tuple, ranks: int, device_type: str) -> None:
    """``function(local_rank, *args)`` in ``ranks`` processes: spawned for CUDA, forked
    for the CPU (call it before any parallel torch work; see the module docstring).
    Raises torch.multiprocessing's `ProcessRaisedException` or `ProcessExitedException`
    when a rank fails."""
    start_method = "spawn" if device_type == "cuda" else "fork"
    if start_method == "fork":
        import torch._dynamo  # noqa: F401  (imported once here, not once per rank)
    sys.stdout.flush(), sys.stderr.flush()          # a forked rank would print the buffer again
    mp.start_processes(function, args=args, nprocs=ranks, start_method=start_method)


def free_port() -> int:
    """A local TCP port free now (for rank 0's store)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(local_rank: int, ranks: int, port: int, entry: Callable[[list[str]], int], argv: list[str]) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(ranks),
                      LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    status = entry(argv)
    if status:
        raise SystemExit(status)


def _leave() -> None:
    leave_process_group()
