"""Data-parallel mini-batch training: one run on every rank of the process group.

Each rank samples batches from its own share of the training vertices (torch's
``DistributedSampler`` over the seed list: one permutation per epoch, seeded by
``seed + epoch`` and so identical on every rank, cut into disjoint equal shares), runs
the compiled layers on its blocks, and ``DistributedDataParallel`` averages the
gradients, so every rank steps the same weights. The sampler *drops* the last
``len(seeds) % world_size`` seeds of each epoch's permutation (``drop_last=True``)
rather than padding with repeats: shares stay disjoint (no seed counts twice in an
epoch), every rank gets the same number of seeds and so the same number of batches
(DDP needs the same number of steps everywhere, or a rank waits forever in an
all-reduce), and since the permutation changes each epoch, a different handful of fewer
than ``world_size`` seeds sits out each epoch.

Features (``config.features``): ``replicated`` -- every rank holds the whole table and
the loader gathers each batch's rows in its prefetch thread, as on one GPU;
``partitioned`` -- each rank holds a contiguous 1/world of the rows and a batch's rows
are fetched from their owners by all-to-all (`PartitionedFeatures`) in the training
thread, between steps, with the bytes moved logged per rank.

Steps replayed from CUDA graphs (``cuda_graph="on"``, GPU ranks, replicated features):
each rank pads its batches to fixed shapes and replays its step as one process does
(`training.BlockStepCapture`); DDP's hooks cannot be replayed, so the ranks start from
rank 0's weights and the step averages its gradients in one all-reduce the graph holds
(`gradients.average_gradients`). A rank whose batch does not fit the fixed shapes runs
that step eagerly, with the same all-reduce, so ranks stay in step. ``"auto"`` does the
same (`CAPTURE_RANKS_ON_AUTO`); ``"off"`` keeps DDP's eager steps. Each run releases its
graph when it ends (`BlockStepCapture.release`), and leaving the process group releases
any left (`leave_process_group`): a graph holding NCCL work past the group hung the ranks.

Only rank 0 logs and draws the progress bar; accuracies are summed over ranks
(`inference`), so all ranks agree on the best epoch and on when to stop.
"""
from __future__ import annotations

import contextlib
import sys
import time
import warnings
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler
from tqdm import tqdm

from ..loader import STAGES, NeighborLoader
from ..loader.stages import ComputeTimer, stream_sync
from ..nn.block_models import build_block_model
from ..nn.functional import cross_entropy
from ..nn.models import ModelSpec
from ..progress import progress_bar
from ..training.config import TrainConfig
from ..training.data import PreparedData
from ..training.loop import BestEpoch, EarlyStopping, RunResult, _optimizer, peak_memory_mib
from ..runtime.cuda_graph import CaptureFallbackWarning
from ..training.captured_step import BlockStepCapture
from ..training.interrupt import RunInterrupted, StoppedAtOnce
from ..training.minibatch import (_fit_placement, classification_step, restored_placement, stage_split,
                                  table_fits_on_device)
from .features import PartitionedFeatures, row_ranges
from .agreement import check_agreement, describe_data, describe_settings
from .gradients import average_gradients, broadcast_parameters
from .inference import layerwise_logits, range_block, summed_accuracies
from .process_group import DistributedError, current
from .stopping import carry_over, rank_interrupt, ranks_run_state, restore_ranks_run

RANK_SEED_STRIDE = 1_000_003     # rank r draws dropout and neighbour samples from seed + r * stride

# Whether ``cuda_graph="auto"`` captures data-parallel steps. On two H200s (a0d8684,
# benchmarks/results/scaling_cuda.md) both ranks replayed 113 of 117 steps, their
# all-reduce inside the graph, and ended with equal weights; 279,434 seeds/s against
# 79,711 for DDP's eager steps on the same machine.
CAPTURE_RANKS_ON_AUTO = True


# Measured on 4 H100s (benchmarks/results/scaling_cuda.md): with loader worker processes,
# a training step's kernels (DDP's all-reduce among them) took 26-45 ms instead of 6.7,
# likely because each GPU time-slices its rank's context with its workers': 2 and 4 GPUs
# trained 0.62x and 0.76x as fast as one GPU with workers.
LOADER_WORKERS_WITH_DDP = (
    "gnnfuse: loader worker processes (--num-workers) with several GPU ranks share each GPU "
    "between the rank and its workers; measured on 4 H100s, 2 and 4 GPUs then trained slower "
    "than one (0.62x, 0.76x). Drop --num-workers to prepare batches in a thread (2.7-3.7x on 4 GPUs).")


def train_distributed_minibatch_run(config: TrainConfig, spec: ModelSpec, data: PreparedData, seed: int, *,
                                    label: str = "", log_epochs: bool = True, cuda_graph: str = "auto",
                                    resume_from: dict[str, Any] | None = None) -> RunResult:
    """`training.minibatch.train_minibatch_run` on every rank of the joined process
    group, gradients averaged by DDP, or inside replayed steps (``cuda_graph``, see the
    module doc); returns the same `RunResult` on every rank. Ctrl-C on any rank ends the
    run on every rank at the end of the epoch (`stopping`) with `RunInterrupted`, whose
    state passed back as ``resume_from`` continues it exactly (the state holds each rank's
    random state and fitted kernel placement)."""
    me = current()
    device = me.device
    if device.type != config.device:
        raise DistributedError(f"the process group's {me.backend} backend drives {device.type}, but the run asks "
                               f"for device {config.device}")
    if config.features == "partitioned" and config.dkp:
        raise DistributedError("dynamic kernel placement calibrates on batches with their features; with "
                               "--features partitioned use replicated features or drop --dkp")
    if device.type == "cuda" and config.loader_workers and me.world_size > 1 and me.is_main:
        warnings.warn(LOADER_WORKERS_WITH_DDP, RuntimeWarning, stacklevel=2)
    # each rank reads its own copy of the data set, and may be started with settings of its own
    check_agreement(describe_settings(config, seed) + describe_data(data), "the training settings and data sets")
    _check_seeds_per_rank(int(data.masks[0].sum()), me.world_size)
    captured = _captures(cuda_graph, device, config, me.is_main)
    torch.manual_seed(seed)                      # the same initial weights on every rank
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    fanout = list(config.fanout)
    model = build_block_model(config.model, data.num_features, data.num_classes, config.hidden, config.dropout,
                              len(fanout)).to(device)
    if captured:
        broadcast_parameters(model)
    # The loader already puts every batch on this rank's device (device_ids=None: DDP
    # moves no inputs, and a list of blocks is nothing its input mover knows).
    ddp = DistributedDataParallel(model) if not captured else None
    optimizer = _optimizer(spec, model, config, capturable=captured)
    torch.manual_seed(seed + RANK_SEED_STRIDE * me.rank)
    x = data.x.to_dense() if data.x.is_sparse else data.x
    bounds = row_ranges(data.graph.num_nodes, me.world_size)
    store = (PartitionedFeatures.from_full(x, me.rank, me.world_size, device)
             if config.features == "partitioned" else None)
    train_mask, val_mask, _ = data.masks
    train_ids = train_mask.nonzero().flatten().cpu()
    sampler = DistributedSampler(range(train_ids.numel()), num_replicas=me.world_size, rank=me.rank, shuffle=True,
                                 seed=seed, drop_last=True)
    deferred = captured and table_fits_on_device(x, device)
    loader = NeighborLoader(data.graph, fanout, config.batch_size, input_nodes=train_ids, sampler=sampler,
                            x=None if store is not None else x, y=data.y, device=device,
                            num_workers=config.loader_workers, static_shapes=captured,
                            feature_device="device" if deferred else None, deferred=deferred)
    step = (BlockStepCapture(classification_step(model, optimizer, average_gradients), optimizers=[optimizer],
                             modules=[model], mode=cuda_graph, features=loader.features, short_batches="replay")
            if captured else None)
    times = loader.stage_times
    compute = ComputeTimer(times, device)
    # a resumed run takes each rank's fitted placement from the checkpoint instead (below)
    placement = _fit_placement(model, loader) if config.dkp and resume_from is None else None
    block = range_block(data.graph, bounds[me.rank], bounds[me.rank + 1])
    owned = slice(bounds[me.rank], bounds[me.rank + 1])
    # evaluation reads through its own view of the rows, so the bytes logged are training's
    read_input = (PartitionedFeatures(store.local, bounds, me.rank).gather if store is not None
                  else (lambda ids: x.index_select(0, ids)))
    history: dict[str, list[float]] = {key: [] for key in ("loss", "val_loss", "train_acc", "val_acc", "test_acc",
                                                           "epoch_seconds", *(f"stage_{s}" for s in STAGES))}
    stopping = EarlyStopping(config.patience)
    best = BestEpoch(history, stopping)
    done, replayed = 0, 0
    if resume_from is not None:
        done, own = restore_ranks_run(resume_from, model, optimizer, best)
        placement = restored_placement(model, own["placement"]) if config.dkp else None
        replayed = own["replayed"]
    start = time.perf_counter() - (0.0 if resume_from is None else resume_from["seconds"])
    total = (config.epochs - done) * len(loader)
    progress = progress_bar(total=total, desc=f"train{label}", unit="batch") if me.is_main else tqdm(disable=True)
    prefix = f"{label.strip() + ' | ' if label else ''}"
    stop, reason = False, inexact_resume(me.world_size, captured)

    def stopped_state(epoch: int) -> dict[str, Any]:
        """The run's state after ``epoch``, every rank's random state, placement and replay count."""
        own = {"placement": placement.state() if placement is not None else None,
               "replayed": replayed + (step.replayed if step is not None else 0)}
        return ranks_run_state(epoch, model, optimizer, best, time.perf_counter() - start, own)

    with rank_interrupt() if reason is None else stops_at_once(reason) as interrupt:
        for epoch in range(done + 1, config.epochs + 1):
            sampler.set_epoch(epoch)
            model.train()
            times.reset()
            epoch_start = time.perf_counter()
            loss_sum = torch.zeros(2, dtype=torch.float64, device=device)        # loss * seeds, seeds
            for batch in loader:
                x_batch = batch.x
                if store is not None:
                    with times.timing("lookup", stream_sync(device)):
                        x_batch = store.gather(batch.n_id)
                with compute.step():
                    if step is not None:
                        loss = step(batch)
                    else:
                        optimizer.zero_grad()
                        loss = cross_entropy(ddp(x_batch, batch.blocks), batch.y)
                        loss.backward()
                        optimizer.step()
                loss_sum += torch.stack([loss.detach().double() * batch.batch_size,
                                         torch.tensor(float(batch.batch_size), dtype=torch.float64, device=device)])
                progress.update()
            compute.flush()
            epoch_seconds = time.perf_counter() - epoch_start
            stages = times.totals()
            dist.all_reduce(loss_sum)
            train_loss = (loss_sum[0] / loss_sum[1].clamp_min(1)).item()
            model.eval()
            logits = layerwise_logits(model, block, read_input, bounds, me.rank)
            local_masks = tuple(m[owned] for m in data.masks)
            (train_acc, val_acc, test_acc), val_loss, stop = summed_accuracies(
                logits, data.y[owned], local_masks, val_mask[owned], interrupt is not None and interrupt.requested)
            values = (train_loss, val_loss, train_acc, val_acc, test_acc, epoch_seconds, *stages.values())
            best.record(epoch, values, model, val_acc, val_loss, test_acc)
            split = stage_split(stages)
            progress.set_postfix_str(f"epoch {epoch} loss {train_loss:.4f} val {val_acc:.4f} | {split}")
            moved = _bytes_per_rank(store, device) if store is not None else ""
            if log_epochs and me.is_main:
                rate = times.batches / epoch_seconds if epoch_seconds > 0 else float("inf")
                tqdm.write(f"{prefix}epoch {epoch:4d} | loss {train_loss:.4f} | train {train_acc:.4f} | val "
                           f"{val_acc:.4f} | test {test_acc:.4f} | {epoch_seconds * 1e3:7.1f} ms, {rate:.1f} batches/s "
                           f"per rank ({split}) | peak {peak_memory_mib(device):.0f} MiB{moved}", file=sys.stdout)
            if stopping.should_stop:
                break
            if stop and epoch < config.epochs:
                progress.close()
                raise RunInterrupted(stopped_state(epoch))
        if interrupt is not None:
            carry_over(interrupt, stop)
    progress.close()
    if placement is not None and log_epochs and me.is_main:
        tqdm.write(f"{prefix}rank 0: {placement.describe()}", file=sys.stdout)
    graph_status = (f"{step.status} ({replayed + step.replayed} steps replayed)" if step is not None
                    else RunResult.cuda_graph)
    if step is not None:
        step.release()       # its graph and pool go now, not at the process's last run (leave_process_group)
    return RunResult(seed=seed, best_epoch=stopping.best_epoch, best_val_acc=stopping.reported_val_acc,
                     test_acc=best.test_acc, epochs_run=len(history["loss"]), seconds=time.perf_counter() - start,
                     state_dict=best.state_dict, history=history, cuda_graph=graph_status, interrupted=stop)


def inexact_resume(world_size: int, captured: bool) -> str | None:
    """Why a run on ``world_size`` ranks could not go on exactly from the end of an epoch
    (None: it can), so that Ctrl-C stops it at once instead.

    DDP all-reduces the gradients in buckets it lays out anew after a run's first step,
    in the order that step's gradients came in, which depends on the batch (a layer
    maps or aggregates first by its block's sizes). On 3 CPU ranks a resumed run's
    first step after epoch 5 laid them out otherwise than the uninterrupted run's first
    step had, the all-reduce added the ranks' gradients in another order, and the loss
    of epoch 8 of 12 was 16.723311424 against 16.723310788. The sum of two ranks' values
    is one addition, the same in any order; replayed steps average the gradients in
    parameter order (`gradients.average_gradients`)."""
    if captured or world_size <= 2:
        return None
    return (f"data-parallel steps through DDP on {world_size} ranks (more than 2) cannot go on exactly from the "
            "end of an epoch, since DDP lays out its gradient buckets by the order of a run's first step's "
            "gradients, and a resumed run's all-reduces would add up the ranks' gradients in another order")


@contextlib.contextmanager
def stops_at_once(reason: str) -> Iterator[None]:
    """Ctrl-C where it lands, as `StoppedAtOnce` saying ``reason``."""
    try:
        yield None
    except KeyboardInterrupt as error:
        if isinstance(error, StoppedAtOnce):
            raise
        raise StoppedAtOnce(reason) from None


def _check_seeds_per_rank(num_seeds: int, world_size: int) -> None:
    """Refuse a run in which no rank would take a step: ``drop_last`` gives each rank
    ``num_seeds // world_size`` seeds an epoch, none when there are fewer seeds than ranks,
    and an epoch of no batch would report a training loss of 0 for weights that never
    moved, where one process trains on those seeds."""
    if num_seeds < world_size:
        raise DistributedError(f"{num_seeds} training vertices for {world_size} data-parallel ranks: each rank's "
                               "share (DistributedSampler, drop_last) holds none, so no rank would take a step; "
                               "use fewer ranks than training vertices")


def _captures(cuda_graph: str, device: torch.device, config: TrainConfig, tell: bool) -> bool:
    """Whether this rank replays its steps from a CUDA graph (module doc); says why not
    when ``cuda_graph="on"`` asked for it (on rank 0 only: ``tell``)."""
    if cuda_graph == "off" or (cuda_graph == "auto" and not CAPTURE_RANKS_ON_AUTO):
        return False
    reason = ("CUDA graphs need GPU ranks" if device.type != "cuda" else
              "partitioned features are fetched by an all-to-all with host-side sizes, outside any graph"
              if config.features == "partitioned" else None)
    if reason and cuda_graph == "on" and tell:
        warnings.warn(f"gnnfuse: data-parallel steps are not captured in a CUDA graph and run eagerly: {reason}",
                      CaptureFallbackWarning, stacklevel=3)
    return reason is None


def _bytes_per_rank(store: PartitionedFeatures, device: torch.device) -> str:
    """`` | features moved: rank 0 sent 1.2 MB, received 1.3 MB; rank 1 ...`` (a collective:
    every rank's cumulative training-batch feature traffic, gathered)."""
    mine = store.bytes_moved()
    counts = torch.tensor([mine["sent"], mine["received"]], dtype=torch.int64, device=device)
    every = [torch.empty_like(counts) for _ in range(store.world_size)]
    dist.all_gather(every, counts)
    parts = [f"rank {r} sent {int(c[0]) / 1e6:.2f} MB, received {int(c[1]) / 1e6:.2f} MB" for r, c in enumerate(every)]
    return " | features moved so far: " + "; ".join(parts)
