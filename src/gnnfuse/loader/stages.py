"""Where a mini-batch epoch's time goes, stage by stage.

GraphTensor §V-B splits data preparation into sampling (S), reindexing (R), embedding
lookup (K) and host-to-device transfer (T), next to the model's compute. With a
prefetching loader these overlap, so the stage totals add up to more than the epoch:
``wait`` (time the training loop sat waiting for its next batch) is what preparation
still costs the epoch, and ``compute / wall`` how busy the model kept the device.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

STAGES = ("sample", "reindex", "lookup", "transfer", "compute", "wait")
_PENDING_EVENTS = 256       # event-timed stages kept unread before the ones done are added up


class StageTimes:
    """Seconds spent per stage, summed over batches; safe to add to from the loader's
    background thread while the training loop reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._seconds = dict.fromkeys(STAGES, 0.0)
            self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
            self.batches = 0

    def add(self, stage: str, seconds: float) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        with self._lock:
            self._seconds[stage] += seconds

    def count_batch(self) -> None:
        with self._lock:
            self.batches += 1

    def totals(self) -> dict[str, float]:
        """Seconds per stage so far (a copy); a stage timed by events counts once its
        work has run on the device (this never waits for it)."""
        with self._lock:
            self._collect()
            return dict(self._seconds)

    def _collect(self) -> None:
        """Add the spans of the event-timed stages whose work has run (lock held)."""
        still = []
        for stage, start, end in self._pending:
            if end.query():
                self._seconds[stage] += start.elapsed_time(end) / 1e3
            else:
                still.append((stage, start, end))
        self._pending = still

    @contextmanager
    def timing(self, stage: str, sync: Callable[[], None] | None = None, *,
               stream: torch.cuda.Stream | None = None) -> Iterator[None]:
        """Time the block as ``stage``. With ``stream`` (the CUDA stream the block queues
        its work on), the span between two events recorded on it: the stage's time on
        the device's timeline, waits for the host's launches included, read later
        (`totals`) -- a synchronize here would stall the thread that queues the work at
        every stage. Else host seconds, after ``sync`` (a stream's synchronize) if given."""
        if stream is not None:
            if stage not in STAGES:
                raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            yield
            end.record(stream)
            with self._lock:
                self._pending.append((stage, start, end))
                if len(self._pending) > _PENDING_EVENTS:     # nobody reads the totals: do not hoard events
                    self._collect()
            return
        begin = time.perf_counter()
        yield
        if sync is not None:
            sync()
        self.add(stage, time.perf_counter() - begin)

    def summary(self) -> str:
        """``sample 1.2s | reindex ...`` for a progress bar or a log line."""
        return " | ".join(f"{stage} {seconds:.2f}s" for stage, seconds in self.totals().items())


def device_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The stream `StageTimes.timing` records a stage's events on: the current CUDA
    stream of ``device`` (the loader's side stream in its thread), None on the CPU."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


def stream_sync(device: torch.device) -> Callable[[], None] | None:
    """What `StageTimes.timing` calls to charge queued device work to its stage: the
    current CUDA stream's synchronize on a GPU, nothing on the CPU."""
    if device.type != "cuda":
        return None
    return lambda: torch.cuda.current_stream(device).synchronize()


class ComputeTimer:
    """Charges training steps to the ``compute`` stage of ``times`` without stalling
    the device: on a GPU, CUDA events around each step, read once per epoch (`flush`);
    a synchronize after every step to read a host clock would stop the host from
    queueing step i+1 while the device runs step i. On the CPU, host seconds."""

    def __init__(self, times: StageTimes, device: torch.device) -> None:
        self._times, self._device = times, device
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def step(self) -> Iterator[None]:
        if self._device.type != "cuda":
            with self._times.timing("compute"):
                yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._events.append((start, end))

    def flush(self) -> None:
        """Add the steps timed since the last flush (waits for the last one to finish)."""
        if self._events:
            self._events[-1][1].synchronize()
            self._times.add("compute", sum(start.elapsed_time(end) for start, end in self._events) / 1e3)
            self._events.clear()
