"""One way to launch: ``gnnfuse train --gpus N`` runs ``torchrun`` on the same command.

``torchrun --nproc-per-node N -m gnnfuse train ...`` is the launch; ``--gpus N`` (GPU
ranks, NCCL) and ``--cpu-ranks N`` (CPU ranks, gloo: CI and machines without GPUs) start
exactly that through torchrun's own entry point (``torch.distributed.run``, standalone
rendezvous on a free local port), with the command line unchanged: a process torchrun
started sees ``WORLD_SIZE`` in its environment and joins the process group instead of
launching again. `train_run_function` then picks what each rank runs.
"""
from __future__ import annotations

import atexit
import os
from typing import Callable, Sequence

import torch.distributed as dist

from ..training.config import TrainConfig
from .process_group import DistributedError, check_backend, init_process_group, launched_by_torchrun, world_size


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


def launch_or_join(gpus: int | None, cpu_ranks: int | None, device: str, argv: Sequence[str]
                   ) -> tuple[int | None, str]:
    """Start the ranks, join them, or do nothing, for ``gnnfuse <argv>``.

    Returns (exit status, device type): a status when this process launched the ranks
    through torchrun and they have finished (it trains nothing itself); None when this
    process should train -- as a rank of the process group it has just joined (launched
    by torchrun), or alone. Raises `DistributedError` when the ranks cannot run.
    """
    ranks, device_type = ranks_and_device(gpus, cpu_ranks, device)
    if launched_by_torchrun():
        if ranks is not None and ranks != int(os.environ["WORLD_SIZE"]):
            raise DistributedError(f"{'--gpus' if gpus is not None else '--cpu-ranks'} {ranks}, but torchrun started "
                                   f"{os.environ['WORLD_SIZE']} ranks")
        init_process_group(device_type)
        atexit.register(_leave)
        return None, device_type
    if ranks is None or ranks == 1:
        if ranks == 1:
            check_backend(device_type, 1)
        return None, device_type
    check_backend(device_type, ranks)
    return run_torchrun(ranks, ["-m", "gnnfuse", *argv]), device_type


def run_torchrun(ranks: int, command: Sequence[str]) -> int:
    """``torchrun --standalone --nproc-per-node ranks <command>`` in this process;
    the exit status (1 when a rank failed: torchrun has printed which and why)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run
    try:
        run(get_args_parser().parse_args(["--standalone", f"--nproc-per-node={ranks}", *command]))
    except ChildFailedError:
        return 1
    return 0


def train_run_function(config: TrainConfig) -> Callable[..., object] | None:
    """What each rank runs when there are several (None with one process): data-parallel
    mini-batch training with a fanout, partitioned full-graph training without."""
    if world_size() == 1:
        return None
    if config.fanout is None:
        from .fullgraph import train_full_graph_run       # gnnfuse.distributed.fullgraph (item 2 of #17)
        return train_full_graph_run
    from .minibatch import train_distributed_minibatch_run
    return train_distributed_minibatch_run


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
