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


class StageTimes:
    """Seconds spent per stage, summed over batches; safe to add to from the loader's
    background thread while the training loop reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._seconds = dict.fromkeys(STAGES, 0.0)
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
        """Seconds per stage so far (a copy)."""
        with self._lock:
            return dict(self._seconds)

    @contextmanager
    def timing(self, stage: str, sync: Callable[[], None] | None = None) -> Iterator[None]:
        """Time the block as ``stage``; ``sync`` (a CUDA stream's synchronize) runs before
        the clock stops, so asynchronous device work is charged to the stage that queued it."""
        start = time.perf_counter()
        yield
        if sync is not None:
            sync()
        self.add(stage, time.perf_counter() - start)

    def summary(self) -> str:
        """``sample 1.2s | reindex ...`` for a progress bar or a log line."""
        return " | ".join(f"{stage} {seconds:.2f}s" for stage, seconds in self.totals().items())


def stream_sync(device: torch.device) -> Callable[[], None] | None:
    """What `StageTimes.timing` calls to charge queued device work to its stage: the
    current CUDA stream's synchronize on a GPU, nothing on the CPU."""
    if device.type != "cuda":
        return None
    return lambda: torch.cuda.current_stream(device).synchronize()
