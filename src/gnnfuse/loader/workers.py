"""Loader worker processes: batches prepared outside the training process.

A prefetch thread (`loader.prefetch`) overlaps the loader's device work with the
training step's, but not its host work: both threads run Python under one interpreter
lock, and on a GPU both are host-bound (a products-sized batch costs the loader about
15 ms of Python and torch dispatch, the step about 10), so an epoch took about the sum
of the two. Worker processes (PyG's ``num_workers``) each run a `BatchMaker` (a
`LinkNeighborLoader`'s `LinkBatchMaker`, a `HeteroNeighborLoader`'s `HeteroBatchMaker`)
under their own interpreter lock, so the two sides' host work overlaps too.

What crosses between the processes: at start, the maker (its CSR and feature tables
shared, not copied: CUDA tensors through CUDA IPC, host tensors through shared memory);
per epoch, each worker's list of (batch index, what the maker's ``prepare`` takes: a
`BatchMaker`'s seeds and input ids, a `LinkBatchMaker`'s label-edge positions); per
batch, the `MiniBatch` (or `LinkMiniBatch`, or PyG ``HeteroData``) with its blocks' graphs and their prepared
layouts, its tensors packed into one buffer per device (`loader.packing`: one IPC
handle to open instead of some forty; the receiving stream waits for the worker's
kernels through the IPC event torch sends with it), and the worker's stage seconds for
it. Worker ``w`` of ``n`` prepares batches ``w, w + n, ...`` in order, each from its
own generator (`batch_generator`), so the batches are the same for any number of
workers.

Workers are started with ``spawn`` (CUDA cannot be used in a forked child) on the first
epoch, which therefore waits for their start-up (importing torch and gnnfuse), and kept
for later epochs; each holds its own CUDA context on a GPU (a few hundred MB).

Each worker runs torch's intra-op work (the host sampler's sorts, a host gather) on its
share of this process's threads, `worker_threads`, as PyTorch's DataLoader caps its
workers at one: left at torch's default each took every core, and the processes' OpenMP
pools, spinning for each other's cores, made the hetero loader's two workers on this
project's 2-core machine 8x slower than one in-process thread (3 against 25 batches/s
of 1024 papers of a tenth of ogbn-mag sampled [10, 10]; the thread about 37).

Workers ignore SIGINT: a terminal's Ctrl-C reaches them too, and a worker it stopped
ended the epoch under way with "worker exited" -- where ``gnnfuse train`` means to
finish that epoch and stop after it. So they do SIGTERM, which a batch scheduler sends
to every process of the job, and which ``gnnfuse train`` takes as a Ctrl-C. The
training process decides; its exit (or `close`) stops them, and so does its death.
"""
from __future__ import annotations

import contextlib
import pickle
import queue
import signal
import threading
import time
import traceback
import types
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, Iterator, Protocol, Union

import torch
import torch.multiprocessing as mp     # also registers torch's tensor reducers with ForkingPickler

from ..main_module import main_module_hidden
from .batch_maker import MiniBatch, batch_generator
from .link_batch import LinkMiniBatch
from .packing import pack, unpack
from .stages import STAGES, StageTimes

_POLL = 0.1              # seconds between checks for a stop while blocked on a queue
_JOIN_TIMEOUT = 5.0


# a `HeteroBatchMaker`'s batches are PyG ``HeteroData``, not named here: torch_geometric
# is imported only by those who pass one
Batch = Union[MiniBatch, LinkMiniBatch, Any]


class Maker(Protocol):
    """What a worker runs (`BatchMaker`, `LinkBatchMaker`, `HeteroBatchMaker`): batch ``i`` is
    ``prepare(first, generator, times, *rest)`` for its listed arguments (``first``,
    ``*rest``), ``generator`` `batch_generator` on ``sample_device``."""
    device: torch.device
    sample_device: torch.device

    def pin_shared_tables(self) -> None: ...

    def prepare(self, first: torch.Tensor, generator: torch.Generator, times: StageTimes, *rest: Any) -> Batch: ...


class _Failed:
    """A worker's exception, as text (an exception object may not pickle)."""

    def __init__(self, text: str) -> None:
        self.text = text


def worker_threads(num_workers: int) -> int:
    """Intra-op threads for each of ``num_workers`` workers: this process's
    (``torch.get_num_threads()``, which ``OMP_NUM_THREADS`` sets) shared among the workers
    and this process, at least one (module doc)."""
    return max(1, torch.get_num_threads() // (num_workers + 1))


def _work(maker: Maker, jobs: Any, results: Any, stop: Any, abandoned: Any, threads: int) -> None:
    """A worker's loop: take an epoch's job list, prepare its batches in order, put each
    (with its stage seconds) on ``results``; leave an epoch the consumer abandoned."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)         # the training process decides (module doc)
    torch.set_num_threads(threads)
    if maker.device.type == "cuda":
        torch.cuda.set_device(maker.device)
    maker.pin_shared_tables()
    stop = _StopOrOrphaned(stop)
    while not stop.is_set():
        try:
            epoch, epoch_seed, items, learnt = jobs.get(timeout=_POLL)
        except queue.Empty:
            continue
        if learnt is not None:
            maker.learn(learnt)
        for index, first, *rest in items:
            if stop.is_set() or abandoned.value >= epoch:
                break
            times = StageTimes()
            try:
                batch = maker.prepare(first, batch_generator(maker.sample_device, epoch_seed, index), times, *rest)
                if maker.device.type == "cuda" or maker.sample_device.type == "cuda":
                    torch.cuda.synchronize()          # its event-timed stages are read below
                entry: tuple = (epoch, index, pack(batch), times.totals())
                del batch
            except BaseException:                    # noqa: BLE001 - reported to the consumer
                entry = (epoch, index, _Failed(traceback.format_exc()), None)
            payload = bytes(ForkingPickler.dumps(entry))     # unpickled by the consumer, timed as transfer
            del entry
            while not (stop.is_set() or abandoned.value >= epoch):
                try:
                    results.put(payload, timeout=_POLL)
                    break
                except queue.Full:
                    continue


class _StopOrOrphaned:
    """The workers' stop event, set also once the training process is gone: one ended
    by SIGKILL or a crash never sets it, and its workers, orphaned, polled for jobs for
    good (each a process holding the graph and feature tables, using CPU)."""

    def __init__(self, stop: Any):
        self._stop, self._parent = stop, mp.parent_process()

    def is_set(self) -> bool:
        return self._stop.is_set() or (self._parent is not None and not self._parent.is_alive())


class _Discarded:
    """A file that keeps nothing written to it."""

    def write(self, data: Any) -> int:
        return len(memoryview(data))


class _ScriptReferences(ForkingPickler):
    """A pickler that keeps nothing and notes the first class or function of the training
    script (``__main__``) that what it pickles refers to. Tensors and storages are left
    out (a worker gets them as shared memory; pickled whole here they would be copied)."""

    def __init__(self) -> None:
        super().__init__(_Discarded(), pickle.HIGHEST_PROTOCOL)
        self.found: Any = None

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
            return 0
        if self.found is None and isinstance(obj, (type, types.FunctionType)) and obj.__module__ == "__main__":
            self.found = obj
        return None


def _check_spawnable(maker: Maker, loader: str, num_workers: int) -> None:
    """Refuse a maker that refers to a class or function of the training script: workers
    are spawned without importing it (`main_module_hidden`), so each died unpickling it
    and the loader said only "worker 0 exited (code 1) before batch 0" (a ``HeteroData``,
    which crosses whole, holding an object of a class the script defines); a lambda
    failed here with pickle's bare error. Anything else that does not pickle is left to
    the workers' start, as before."""
    references = _ScriptReferences()
    try:
        references.dump(maker)
    except Exception:     # noqa: BLE001 - only a reference to the script is reported
        pass
    if references.found is not None:
        name = getattr(references.found, "__qualname__", repr(references.found))
        raise TypeError(f"gnnfuse {loader}: num_workers={num_workers} sends the loader's graph and tables (a "
                        f"HeteroData whole, with its other attributes) to worker processes, which do not import "
                        f"your script, and they refer to {name!r}, defined in it: define it in a module the "
                        f"workers can import, remove what refers to it, or pass num_workers=0")


class WorkerPool:
    """``num_workers`` processes preparing the batches of `epoch` with ``maker``, up to
    ``depth`` batches ahead each; their errors name ``loader``, the loader the user made."""

    def __init__(self, maker: Maker, num_workers: int, depth: int, loader: str) -> None:
        self._loader = loader
        _check_spawnable(maker, loader, num_workers)
        context = mp.get_context("spawn")
        self._jobs = [context.Queue() for _ in range(num_workers)]
        self._results = [context.Queue(maxsize=depth) for _ in range(num_workers)]
        self._stop = context.Event()
        self._abandoned = context.Value("q", -1)      # the latest epoch the consumer left early
        self._processes = [context.Process(target=_work, name=f"gnnfuse-loader-{rank}", daemon=True,
                                           args=(maker, self._jobs[rank], self._results[rank], self._stop,
                                                 self._abandoned, worker_threads(num_workers)))
                           for rank in range(num_workers)]
        with main_module_hidden(), _sigint_ignored():
            for process in self._processes:
                process.start()
        self._epoch = 0
        self._finalizer = weakref.finalize(self, _shut_down, self._stop, self._processes)

    def epoch(self, batches: list[tuple[torch.Tensor, ...]], epoch_seed: int, times: StageTimes,
              learnt: Any = None) -> Iterator[Batch]:
        """The epoch's batches, each given as what the maker's ``prepare`` takes around
        the batch's generator and ``times`` (`Maker`), in order; the workers' stage
        seconds go into ``times``, the consumer's waits as ``wait``. ``learnt``, if not
        None, is what the training process's maker has learnt of the steps so far
        (`BatchMaker.learnt`), which each worker's maker takes before the epoch
        (``learn``): a worker's copy of the maker sees no step."""
        self._epoch += 1
        epoch, workers = self._epoch, len(self._processes)
        # the workers serve one epoch at a time: one still iterated is superseded, its
        # remaining batches skipped (it raises if resumed, rather than wait for them)
        self._abandon(epoch - 1)
        for rank, jobs in enumerate(self._jobs):
            jobs.put((epoch, epoch_seed, [(i, *batches[i]) for i in range(rank, len(batches), workers)], learnt))
        done = False
        try:
            for index in range(len(batches)):
                if self._epoch != epoch:
                    raise RuntimeError(f"gnnfuse {self._loader}: this epoch was superseded by a later iteration "
                                       "of the same loader (its num_workers processes serve one epoch at a time); "
                                       "finish or close an epoch's iterator before starting another")
                batch, seconds = self._next(index % workers, epoch, index, times)
                for stage, value in seconds.items():
                    if stage in STAGES and value:
                        times.add(stage, value)
                yield batch
            done = True
        finally:
            if not done:
                self._abandon(epoch)

    def _abandon(self, epoch: int) -> None:
        """Tell the workers to skip what is left of the epochs up to ``epoch``: they
        compare their epoch with this watermark, so it never moves back (an old epoch's
        iterator closed after a later epoch was abandoned would otherwise have the
        workers prepare that later epoch's batches for nobody)."""
        self._abandoned.value = max(self._abandoned.value, epoch)

    def _next(self, rank: int, epoch: int, index: int, times: StageTimes) -> tuple[Batch, dict[str, float]]:
        """Batch ``index`` from worker ``rank``: the time spent waiting for it counts as
        ``wait``, rebuilding it here (opening the shared memory, waiting on the worker's
        CUDA events) as ``transfer``."""
        while True:
            try:
                start = time.perf_counter()
                payload = self._results[rank].get(timeout=_POLL)
                received = time.perf_counter()
                times.add("wait", received - start)
                got_epoch, got_index, batch, seconds = ForkingPickler.loads(payload)
                if not isinstance(batch, _Failed) and got_epoch == epoch:
                    batch = unpack(*batch)
                times.add("transfer", time.perf_counter() - received)
            except queue.Empty:
                times.add("wait", time.perf_counter() - start)
                process = self._processes[rank]
                if not process.is_alive():
                    raise RuntimeError(f"gnnfuse {self._loader}: worker {rank} exited (code {process.exitcode}) "
                                       f"before batch {index}") from None
                continue
            if got_epoch != epoch:              # left over from an epoch the consumer abandoned
                continue
            if isinstance(batch, _Failed):
                raise RuntimeError(f"gnnfuse {self._loader}: worker {rank} failed on batch {got_index}:\n"
                                   f"{batch.text}")
            if got_index != index:
                raise RuntimeError(f"gnnfuse {self._loader}: worker {rank} sent batch {got_index}, expected {index}")
            return batch, seconds

    def close(self) -> None:
        """Stop the workers (also done when the pool is garbage-collected or at exit)."""
        self._finalizer()


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the workers start, so that they start with it ignored (a
    process keeps an ignored signal ignored through exec, and Python then installs no
    KeyboardInterrupt handler): no window in which a Ctrl-C stops one while it imports.
    A Ctrl-C in the milliseconds the processes take to start is ignored here too."""
    if threading.current_thread() is not threading.main_thread():
        yield       # only the main thread may set handlers; `_work` ignores it from its start
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _shut_down(stop: Any, processes: list) -> None:
    stop.set()
    for process in processes:
        process.join(_JOIN_TIMEOUT)
        if process.is_alive():
            process.kill()                            # it ignores SIGTERM (module doc)
            process.join(_JOIN_TIMEOUT)
