"""Where an epoch's batches are prepared: when asked, in prefetch threads, or in workers.

`NeighborLoader` (and through it `LinkNeighborLoader`) and `HeteroNeighborLoader` take
the same three settings -- ``prefetch`` batches ahead in ``prefetch_threads`` threads
(`loader.prefetch`), or ``num_workers`` processes (`loader.workers`) -- and run any maker
whose ``prepare(first, generator, times, *rest)`` makes one batch (`workers.Maker`).
`BatchPreparation` holds what those settings keep between epochs (the worker pool, the
threads' side streams, the stage seconds), so each loader reuses it rather than a copy.
Batch i always samples from `batch_generator` (the epoch's seed, i), so the batches are
the same whichever thread or process prepares them.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from .batch_maker import batch_generator
from .prefetch import Prefetcher, side_stream
from .stages import StageTimes
from .workers import Maker, WorkerPool


def check_settings(prefetch: int, prefetch_threads: int, num_workers: int) -> None:
    """Refuse a negative ``prefetch`` or ``num_workers``, or no ``prefetch_threads``."""
    if prefetch < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    if prefetch_threads < 1:
        raise ValueError(f"prefetch_threads must be >= 1, got {prefetch_threads}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")


def epoch_order(count: int, shuffle: bool, generator: torch.Generator) -> torch.Tensor:
    """The order an epoch takes ``count`` seeds (or label edges) in: a permutation drawn from
    ``generator`` when ``shuffle``, else as given."""
    return torch.randperm(count, generator=generator) if shuffle else torch.arange(count)


def epoch_batches(tables: tuple[torch.Tensor, ...], positions: torch.Tensor, batch_size: int, drop_last: bool,
                  device: torch.device | None = None) -> list[tuple[torch.Tensor, ...]]:
    """Each table's rows at ``positions``, on ``device`` (where they are used, moved once
    per epoch rather than batch by batch), cut into batches of ``batch_size``; a short last
    batch is dropped under ``drop_last``. No positions (an empty mask, a sampler's empty
    share) is no batch, not one empty batch."""
    if not positions.numel():
        return []
    batches = list(zip(*(table[positions].to(device).split(batch_size) for table in tables)))
    if drop_last and batches[-1][0].numel() < batch_size:
        batches.pop()
    return batches


class BatchPreparation:
    """An epoch's batches prepared as ``prefetch``, ``prefetch_threads`` and
    ``num_workers`` say, batches going to ``device`` and sampled on ``sample_device``;
    stage seconds in ``stage_times``. The worker pool starts with the first epoch's maker
    and keeps it (a loader passes the same maker every epoch) until `close`. ``loader``
    names the loader in the workers' errors."""

    def __init__(self, device: torch.device, sample_device: torch.device, prefetch: int, prefetch_threads: int,
                 num_workers: int, loader: str) -> None:
        check_settings(prefetch, prefetch_threads, num_workers)
        self.loader = loader
        self.device, self.sample_device = device, sample_device
        self.prefetch, self.prefetch_threads, self.num_workers = prefetch, prefetch_threads, num_workers
        self.stage_times = StageTimes()
        self.workers: WorkerPool | None = None
        self._side_streams: list[torch.cuda.Stream] | None = None      # the prefetch threads', made once

    def epoch(self, maker: Maker, batches: list[tuple[torch.Tensor, ...]], seed: int,
              tensors_of: Callable[[Any], list[torch.Tensor]]) -> Iterator[Any]:
        """``maker``'s batches of the epoch seeded ``seed``, in order: batch i is
        ``maker.prepare(batches[i][0], batch_generator(sample_device, seed, i), stage_times,
        *batches[i][1:])``, counted in ``stage_times`` when the next is asked for.
        ``tensors_of(batch)`` lists a batch's tensors, which a prefetch thread's side stream
        hands to the consumer's on a GPU (`Prefetcher`)."""
        if self.num_workers:
            if self.workers is None:
                self.workers = WorkerPool(maker, self.num_workers, max(self.prefetch, 1), self.loader)
            learnt = maker.learnt() if hasattr(maker, "learnt") else None
            with contextlib.closing(self.workers.epoch(batches, seed, self.stage_times, learnt)) as prepared:
                for batch in prepared:
                    yield batch
                    self.stage_times.count_batch()
            return
        prepare = lambda item: maker.prepare(      # noqa: E731
            item[1][0], batch_generator(self.sample_device, seed, item[0]), self.stage_times, *item[1][1:])
        if self.prefetch == 0:
            for item in enumerate(batches):
                yield prepare(item)
                self.stage_times.count_batch()
            return
        if self._side_streams is None and self.device.type == "cuda":   # the same for every epoch (`side_stream`)
            self._side_streams = [side_stream(self.device) for _ in range(self.prefetch_threads)]
        with contextlib.closing(iter(Prefetcher(list(enumerate(batches)), prepare, self.prefetch, self.device,
                                                tensors_of, self.stage_times, self._side_streams,
                                                self.prefetch_threads))) as prefetched:
            for batch in prefetched:
                yield batch
                self.stage_times.count_batch()

    def close(self) -> None:
        """Stop the worker processes, if any (they also stop when the pool is freed)."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None


def _get_stage_times(loader: Any) -> StageTimes:
    return loader._preparation.stage_times


def _set_stage_times(loader: Any, times: StageTimes) -> None:
    loader._preparation.stage_times = times


# A loader's ``stage_times``: its `BatchPreparation`'s, into which the batches are timed.
# A property rather than an alias, so that assigning one (a counting `StageTimes`,
# `benchmarks/minibatch_host.py`) times the next batches into it.
STAGE_TIMES = property(_get_stage_times, _set_stage_times,
                       doc="Seconds per stage of this loader's batches (`BatchPreparation.stage_times`).")
