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
CPU ranks are forked from a fork server: a fresh interpreter, started at the first
launch of a process with gnnfuse and torch._dynamo imported (DDP imports it: ~3 s of
CPU a process otherwise), so later ranks start in a tenth of a second. Not from the
launcher itself: a child of fork() gets only the forking thread, so a lock another
thread held stays held, and an OpenMP thread team the launcher started (torch's or
Numba's, after any parallel work: a notebook that trained first, a test suite) is
inherited as threads that no longer exist -- the child's first parallel region waits
for them for good (GNU OpenMP is not fork-safe; Numba's OpenMP layer kills such a child
instead). A launcher always has threads (numpy's OpenBLAS pool starts at import), and
which of them are safe to fork cannot be told from outside. The server's ranks get what
a forked one would have inherited -- the launcher's environment, torch thread count,
stdout and stderr as they are at the launch (`_as_launched`) -- and the function they
run must be importable by module and name (one defined in the main script needs the
script's ``if __name__ == "__main__":`` guard, as with any spawned process).
`train_run_function` then picks what each rank runs.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
import threading
from multiprocessing import reduction
from typing import Any, Callable, Iterator, NoReturn, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..main_module import main_module_hidden
from ..training.interrupt import INTERRUPTED
from . import process_group
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
        if cpu_ranks > (most := _most_processes()):   # 10**20 overflowed inside torch.multiprocessing
            raise DistributedError(f"--cpu-ranks {cpu_ranks} starts a process per rank, but this machine lets a "
                                   f"user run at most {most} processes")
        return cpu_ranks, "cpu"
    return None, device


def _most_processes() -> int:
    """The processes one user may run here (RLIMIT_NPROC), or Linux's largest process id
    where that is unlimited: more CPU ranks than that cannot start (more than the CPUs
    can, oversubscribed, as the tests do)."""
    limit = os.sysconf("SC_CHILD_MAX") if "SC_CHILD_MAX" in os.sysconf_names else -1
    return limit if limit > 0 else 2**22


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


class RanksInterrupted(Exception):
    """A launch in which a rank ended with `INTERRUPTED`: stopped by Ctrl-C."""


# A rank's exit status when the reader of its stdout left (``gnnfuse train ... | head``):
# 128 + SIGPIPE, as a shell reports a process that SIGPIPE ended. `cli.main` exits so.
READER_LEFT = 128 + signal.SIGPIPE


class ReaderLeft(Exception):
    """A launch in which a rank ended with `READER_LEFT`: its output has no reader."""


# argparse's exit status for a usage error, which the rank has printed with the usage line
USAGE_ERROR = 2


def run_ranks(ranks: int, device_type: str, entry: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """Run ``entry(argv)`` in ``ranks`` processes with torchrun's environment (see the
    module docstring); the exit status: 0, `INTERRUPTED` when the ranks were stopped by
    Ctrl-C (rank 0 has said what it kept), `USAGE_ERROR` when a rank stopped on a usage
    error only a rank can find (data files missing where the ranks look; the error is
    printed), or 1 when a rank failed (its error printed). A usage error ended the launch
    with status 1 and "rank 0 of 2 failed: process 0 terminated with exit code 2", where
    one process exits with 2, as the README promises of every bad option."""
    try:
        start_ranks(_rank_main, (ranks, free_port(), entry, list(argv)), ranks, device_type, pass_sigint=True)
    except RanksInterrupted:
        return INTERRUPTED
    except ReaderLeft:          # stopped quietly, as one process does (`cli.main`)
        return 1
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        if getattr(error, "exit_code", None) == USAGE_ERROR:
            return USAGE_ERROR
        print(f"gnnfuse: rank {error.error_index} of {ranks} failed: {error}", file=sys.stderr)
        return 1
    return 0


def start_ranks(function: Callable[..., None], args: tuple, ranks: int, device_type: str,
                pass_sigint: bool = False) -> None:
    """``function(local_rank, *args)`` in ``ranks`` processes: spawned for CUDA, forked
    from the fork server for the CPU (the module docstring says why). Raises
    torch.multiprocessing's `ProcessRaisedException` or `ProcessExitedException` when a
    rank fails, once the others have ended (`FAILURE_GRACE_S`) and the error of every
    other failed rank is printed to stderr; `RanksInterrupted` when a rank ended with
    `INTERRUPTED` (a Ctrl-C; the ranks that failed only because a peer stopped at once
    get one line each); `ReaderLeft` when a rank ended with `READER_LEFT` (the other
    ranks' failures, which followed from it, are not printed). ``pass_sigint``: a SIGINT to this process is sent on to the
    ranks, which decide how to stop (`gnnfuse train`'s do, `run_ranks`), instead of
    raising KeyboardInterrupt here."""
    start_method = rank_start_method(device_type)
    # A function of the main script needs the script imported in each rank (which then
    # needs its ``__main__`` guard); any other is found by module, and the script is not
    # run again (`main_module_hidden`).
    in_main = getattr(function, "__module__", None) == "__main__"
    if start_method == "forkserver":
        mp.get_context("forkserver").set_forkserver_preload(FORK_SERVER_PRELOAD)
        _start_fork_server()
        streams = tuple(_LauncherFd(fd) if _is_open(fd) else None for fd in (1, 2))
        function, args = _as_launched, (function, dict(os.environ), torch.get_num_threads(), streams, args)
    sys.stdout.flush(), sys.stderr.flush()
    with contextlib.nullcontext() if in_main else main_module_hidden():
        context = mp.start_processes(function, args=args, nprocs=ranks, start_method=start_method, join=False)
    try:
        with _sigint_passed_on(context.processes) if pass_sigint else contextlib.nullcontext():
            while not context.join(grace_period=FAILURE_GRACE_S):
                pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        if any(process.exitcode == INTERRUPTED for process in context.processes):
            _report_failures_after_interrupt(context)
            raise RanksInterrupted from None
        if any(process.exitcode == READER_LEFT for process in context.processes):
            # the others failed only in collectives with it ("Connection reset by peer"):
            # their tracebacks were all the launch printed for ``| head``
            raise ReaderLeft from None
        _report_other_failures(context, error.error_index)
        raise


@contextlib.contextmanager
def _sigint_passed_on(processes: Sequence[Any]) -> Iterator[None]:
    """While the ranks run, a SIGINT to this process is sent on to every live rank
    instead of raising here: the ranks decide when to stop (`distributed.stopping`) and
    this process waits for them, whose status is the launch's. A terminal's Ctrl-C
    reaches the ranks directly as well; they count the two as one Ctrl-C (they come
    within `stopping.DUPLICATE_WINDOW_S`). torchrun's agent passes SIGINT on the same way.

    A SIGTERM to this process (``kill``, ``timeout``, a batch scheduler's stop) is sent on
    as a SIGINT too, where nothing else handles it: it ended this process alone, and the
    ranks, orphaned, trained on to their last epoch with no one reading their output."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def pass_on(signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM:
            print("gnnfuse: SIGTERM, passed on to the ranks as a Ctrl-C", file=sys.stderr, flush=True)
        for process in processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGINT)
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, pass_on)}
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, pass_on)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# Seconds the other ranks get to end by themselves once one has failed, before they are
# terminated: a peer waiting in a collective fails as soon as the failed rank's
# connections close, and its error, reported too, says where it was.
FAILURE_GRACE_S = 3.0


def _report_other_failures(context: mp.ProcessContext, reported: int) -> None:
    """Print to stderr the error of every failed rank but ``reported`` (torch reports one:
    the first exit it sees, which when several ended at once is the lowest rank's -- often
    a peer's "Connection closed by peer" that only followed from another rank's error)."""
    for index, path in enumerate(context.error_files):
        if index != reported and os.access(path, os.R_OK):
            with open(path, "rb") as file:
                trace = pickle.load(file)
            print(f"gnnfuse: rank {index} of {len(context.processes)} failed too:\n{trace}", file=sys.stderr)


def _report_failures_after_interrupt(context: mp.ProcessContext) -> None:
    """One line per rank that failed while another was stopped by Ctrl-C: its error's
    last line (a peer stopped at once leaves the others' collectives without it)."""
    for index, path in enumerate(context.error_files):
        if os.access(path, os.R_OK):
            with open(path, "rb") as file:
                last = pickle.load(file).strip().splitlines()[-1]
            print(f"gnnfuse: rank {index} of {len(context.processes)} ended with an error after a rank was stopped "
                  f"at once by Ctrl-C: {last}", file=sys.stderr)


# What the fork server imports before it forks any rank: what every rank imports anyway.
FORK_SERVER_PRELOAD = ["gnnfuse", "gnnfuse.distributed", "torch._dynamo"]


def rank_start_method(device_type: str) -> str:
    """How `start_ranks` starts ``device_type`` ranks (torch.multiprocessing's name)."""
    return "spawn" if device_type == "cuda" else "forkserver"


def _start_fork_server() -> None:
    """Start the fork server (unless it runs already) with SIGTERM ignored, which it keeps
    across its exec: ``timeout`` and a batch scheduler's stop send SIGTERM to every process
    of the job, and the server died of it; the launcher then read every rank's exit status
    from the server's closed pipe as 255 and reported a rank failed (status 1) while the
    ranks, which take a SIGTERM as a Ctrl-C, stopped after their epoch and saved it. The
    server still ends with its launcher (it watches a pipe from it); each rank takes
    SIGTERM's default action back (`_as_launched`). From the main thread only, where
    Python sets signal handlers; elsewhere the server starts with the launch, as before."""
    from multiprocessing import forkserver
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is None:
        return          # None: a handler not set from Python, which could not be put back
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _as_launched(local_rank: int, function: Callable[..., None], environ: dict[str, str], threads: int,
                 streams: tuple[int | None, int | None], args: tuple) -> None:
    """A fork-server rank: ``function(local_rank, *args)`` with what a forked rank would
    have inherited from the launcher -- its environment at the launch (``GNNFUSE_*``
    settings, ``OMP_NUM_THREADS``), not the server's, its torch thread count, its stdout
    and stderr as they are now (`_LauncherFd`; the server holds those of its start), and
    SIGTERM's default action (the server ignores it: `_start_fork_server`)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(environ)
    torch.set_num_threads(threads)
    sys.stdout.flush(), sys.stderr.flush()
    for target, fd in zip((1, 2), streams):
        if fd is not None:      # None: the launcher had that descriptor closed
            os.dup2(fd, target)
            os.close(fd)
    function(local_rank, *args)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class _LauncherFd:
    """A file descriptor of the launcher, sent to a fork-server rank: pickled while the
    rank's process is started, it travels beside the pickle (multiprocessing's own
    descriptor passing) and unpickles as the rank's duplicate of it."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(duplicate) -> int:
    return duplicate.detach()


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
    """A torchrun rank's exit hook: leave the process group -- unless an uncaught error
    is ending the process. Its peers may then wait in a collective for this rank, never
    joining the leaving barrier: once its bound expired, destroying the group waited for
    the barrier's gloo thread for the group's 30-minute timeout, and the peers as long.
    Exiting without leaving closes the connections, which fails the peers' collectives
    at once ("Connection closed by peer"). A rank ending normally (or by ``sys.exit``)
    while a peer waits fares the same once its barrier expires: the interpreter's
    shutdown still destroys the group, so `abandon_process_group` ends it instead."""
    if getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None:
        return
    if not leave_process_group():
        abandon_process_group()


def end_rank_now(status: int) -> NoReturn:
    """End this rank with ``status`` without leaving its process group: what a rank
    stopped at once by Ctrl-C does, while its peers may still be inside a collective
    with it. The leaving barrier would wait for them for `process_group.LEAVE_TIMEOUT_S`
    (they never join it); exiting closes this rank's connections, which fails their
    collectives at once (gloo), or lets the launcher end them (NCCL: torchrun's agent,
    `start_ranks`). Files the rank wrote are closed by then; stdout, stderr and
    logging's handlers are flushed."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):      # a closed or broken stream must not stop the exit
            stream.flush()
    os._exit(status)


def abandon_process_group() -> NoReturn:
    """End this rank now, after its leaving barrier expired: say so on stderr, flush what
    Python still buffers (stdout, stderr, logging's handlers) and leave by ``os._exit(1)``.

    The group's gloo (or NCCL) thread still runs the barrier, and the interpreter's
    shutdown would destroy the group, joining that thread for the group's 30-minute
    timeout while the peer waits as long. Files the rank wrote are closed by then (the
    checkpoint and curves are written before training returns). Status 1 whatever the
    rank meant to exit with (an exit hook cannot see a ``sys.exit`` status): the ranks
    disagreed on their collectives, so the run did not end as one. Exit hooks
    registered before the process group was joined (`launch_or_join`) do not run."""
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"gnnfuse: rank {rank} of {world} left while a peer still waited in a collective: the process group's "
          f"leaving barrier did not complete in {process_group.LEAVE_TIMEOUT_S:g} s (the ranks ran different "
          "numbers of collectives, or a peer is stuck); ending this rank now (status 1) instead of waiting for "
          "the group's timeout", file=sys.stderr)
    end_rank_now(1)
