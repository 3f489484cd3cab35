"""Sampled mini-batch training (``gnnfuse train --fanout 15,10,5``): one run.

Each epoch draws batches of training vertices from `gnnfuse.loader.NeighborLoader` and
steps on their blocks; held-out accuracy is measured by full-neighbourhood inference
(every layer on the whole graph, the same weights), so it is the model's accuracy, not
a sample of it. Everything else -- seeds, the optimizer, early stopping, the best
epoch's weights -- is `training.loop`'s, so mini-batch and full-batch runs compare.
Per epoch the history also records the seconds of each loader stage
(`loader.STAGES`) and of the epoch, which ``--plot`` draws as a stacked breakdown.
"""
from __future__ import annotations

import sys
import time
import warnings
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..backend.first_use import compiled_since, compiled_so_far
from ..loader import STAGES, MiniBatch, NeighborLoader
from ..loader.stages import ComputeTimer
from ..nn.block_models import build_block_model
from ..nn.functional import cross_entropy
from ..nn.models import ModelSpec
from ..nn.placement import PlacementModel, calibrate, install
from ..progress import progress_bar
from ..runtime.cuda_graph import CaptureFallbackWarning
from .captured_step import BlockStepCapture
from .config import TrainConfig
from .data import PreparedData
from .interrupt import DeferredInterrupt, RunInterrupted
from .loop import BestEpoch, EarlyStopping, RunResult, _optimizer, accuracy, peak_memory_mib, restore_run, run_state


def train_minibatch_run(config: TrainConfig, spec: ModelSpec, data: PreparedData, seed: int, *,
                        label: str = "", log_epochs: bool = True, cuda_graph: str = "auto",
                        resume_from: dict[str, Any] | None = None) -> RunResult:
    """Train one model from `seed` on sampled mini-batches of the training vertices,
    keeping the weights and test accuracy of the best validation epoch. On a GPU (unless
    ``cuda_graph`` is ``"off"``) batches are padded to fixed shapes and the steps replayed
    from a CUDA graph where `BlockStepCapture` finds that safe (``cuda_graph`` is its mode).

    Ctrl-C ends the run at the end of its epoch with `RunInterrupted`, whose state
    passed back as ``resume_from`` continues it exactly (as `loop.train_run`): batches
    are drawn from torch's generator, which the state holds, whether loader workers or
    this process prepare them; the state also holds the fitted kernel placement
    (``config.dkp``) and the number of steps replayed from a CUDA graph so far."""
    device = torch.device(config.device)
    captured = device.type == "cuda" and cuda_graph != "off"
    off_device = f"CUDA graphs need a CUDA device; the step runs on {device}"
    uncaptured = RunResult.cuda_graph if cuda_graph == "off" else f"eager: {off_device}"
    if cuda_graph == "on" and not captured:
        warnings.warn(f"gnnfuse: the mini-batch training step is not captured in a CUDA graph and runs eagerly: "
                      f"{off_device}", CaptureFallbackWarning, stacklevel=2)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    fanout = list(config.fanout)
    model = build_block_model(config.model, data.num_features, data.num_classes, config.hidden, config.dropout,
                              len(fanout)).to(device)
    optimizer = _optimizer(spec, model, config, capturable=captured)
    x = data.x.to_dense() if data.x.is_sparse else data.x         # batches gather rows
    train_mask, val_mask, _ = data.masks
    deferred = captured and table_fits_on_device(x, device)
    loader = NeighborLoader(data.graph, fanout, config.batch_size, input_nodes=train_mask, shuffle=True,
                            x=x, y=data.y, device=device, num_workers=config.loader_workers, static_shapes=captured,
                            feature_device="device" if deferred else None, deferred=deferred)
    train_step = classification_step(model, optimizer)
    step = BlockStepCapture(train_step, optimizers=[optimizer], modules=[model], mode=cuda_graph,
                            features=loader.features, short_batches="replay") if captured else train_step
    times = loader.stage_times
    compute = ComputeTimer(times, device)
    # a resumed run takes the fitted placement from its state instead (below)
    placement = _fit_placement(model, loader) if config.dkp and resume_from is None else None
    history: dict[str, list[float]] = {key: [] for key in ("loss", "val_loss", "train_acc", "val_acc", "test_acc",
                                                           "epoch_seconds", *(f"stage_{s}" for s in STAGES))}
    stopping = EarlyStopping(config.patience)
    best = BestEpoch(history, stopping)

    def run_epoch(epoch: int) -> bool:
        """One epoch: its batches, full-neighbourhood evaluation, the record; True when the run should stop."""
        model.train()
        times.reset()
        epoch_start, compiled_before = time.perf_counter(), compiled_so_far()
        loss_sum, seen = torch.zeros((), device=device), 0
        for batch in loader:
            with compute.step():
                loss_sum += step(batch) * batch.batch_size
            seen += batch.batch_size
            progress.update()
        compute.flush()
        epoch_seconds = time.perf_counter() - epoch_start
        compiling = compiled_since(compiled_before)
        stages = times.totals()
        model.eval()
        with torch.no_grad():
            logits = model(x, data.graph)                          # full-neighbourhood inference
            val_loss = F.cross_entropy(logits[val_mask], data.y[val_mask]).item()
        train_acc, val_acc, test_acc = (accuracy(logits, data.y, m) for m in data.masks)
        train_loss = loss_sum.item() / max(seen, 1)
        values = (train_loss, val_loss, train_acc, val_acc, test_acc, epoch_seconds, *stages.values())
        best.record(epoch, values, model, val_acc, val_loss, test_acc)
        rate = times.batches / epoch_seconds if epoch_seconds > 0 else float("inf")
        split = stage_split(stages)
        progress.set_postfix_str(f"epoch {epoch} loss {train_loss:.4f} val {val_acc:.4f} | {split}")
        if log_epochs:
            tqdm.write(f"{label.strip() + ' | ' if label else ''}epoch {epoch:4d} | loss {train_loss:.4f} | "
                       f"train {train_acc:.4f} | val {val_acc:.4f} | test {test_acc:.4f} | "
                       f"{epoch_seconds * 1e3:7.1f} ms{compiling}, {rate:.1f} batches/s ({split}) | "
                       f"peak {peak_memory_mib(device):.0f} MiB", file=sys.stdout)
        return stopping.should_stop

    done, replayed = 0, 0
    if resume_from is not None:
        done = restore_run(resume_from, model, optimizer, best)
        placement = restored_placement(model, resume_from["placement"]) if config.dkp else None
        replayed = resume_from.get("replayed", 0)       # not in the states of gnnfuse before it counted them
    start = time.perf_counter() - (0.0 if resume_from is None else resume_from["seconds"])
    progress = progress_bar(total=(config.epochs - done) * len(loader), desc=f"train{label}", unit="batch")
    with DeferredInterrupt(terminate=True) as interrupt:
        for epoch in range(done + 1, config.epochs + 1):
            if run_epoch(epoch):
                break
            if interrupt.requested and epoch < config.epochs:
                progress.close()
                state = run_state(epoch, model, optimizer, best, time.perf_counter() - start)
                state["placement"] = placement.state() if placement is not None else None
                state["replayed"] = replayed + (step.replayed if captured else 0)
                raise RunInterrupted(state)
    progress.close()
    if placement is not None and log_epochs:       # the fitted model and the decisions it took
        tqdm.write(f"{label.strip() + ' | ' if label else ''}{placement.describe()}", file=sys.stdout)
    return RunResult(seed=seed, best_epoch=stopping.best_epoch, best_val_acc=stopping.reported_val_acc,
                     test_acc=best.test_acc, epochs_run=len(history["loss"]), seconds=time.perf_counter() - start,
                     state_dict=best.state_dict, history=history,
                     cuda_graph=f"{step.status} ({replayed + step.replayed} steps replayed)" if captured
                     else uncaptured, interrupted=interrupt.requested)


def restored_placement(model: torch.nn.Module, state: dict[str, Any]) -> PlacementModel:
    """The kernel placement a stopped run had fitted (`PlacementModel.state`), installed
    in ``model``: refitted on new kernel times it could choose other orders for the same
    batches, and so other roundings."""
    placement = PlacementModel.from_state(state)
    install(model, placement)
    return placement


def table_fits_on_device(x: torch.Tensor, device: torch.device) -> bool:
    """Whether captured steps should gather their batches' rows themselves from a copy of
    ``x`` on ``device`` (a deferred loader, `loader.static_shapes`): when it takes under a
    quarter of the device's free memory."""
    return x.element_size() * x.numel() < torch.cuda.mem_get_info(device)[0] // 4


def classification_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        average: Callable[[Iterable[torch.Tensor]], None] | None = None
                        ) -> Callable[[MiniBatch], torch.Tensor]:
    """One training step on a batch's seeds: cross-entropy over its first ``batch_size``
    rows (a padded batch's later rows are padding), backward, optimizer step; returns the
    loss. The form `BlockStepCapture` captures and replays. ``average`` (data-parallel
    ranks: `distributed.average_gradients`) runs on the parameters between backward and
    the optimizer step."""
    def step(batch: MiniBatch) -> torch.Tensor:
        optimizer.zero_grad()
        loss = cross_entropy(model(batch.x, batch.blocks)[:batch.batch_size], batch.y[:batch.batch_size])
        loss.backward()
        if average is not None:
            average(model.parameters())
        optimizer.step()
        return loss.detach()
    return step


DKP_CALIBRATION_BATCHES = 4


def _fit_placement(model: torch.nn.Module, loader: NeighborLoader) -> PlacementModel:
    """Fit dynamic kernel placement on the kernel times of the first batches of an
    extra, abandoned epoch, before training (GraphTensor fits in the first epoch).
    Under a forked random state: the abandoned epoch's sampling drew from torch's
    generator (the timed kernels' random inputs fork their own, `kernel_times`), so a
    --dkp run trained on other batches and dropout masks than the same seed without it
    (cora, fanout 3,3: epoch 1's loss 1.9623 against 1.9614), where the placement may
    change only the rounding."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        batches = []
        for batch in loader:
            batches.append(batch)
            if len(batches) == DKP_CALIBRATION_BATCHES:
                break
        return calibrate(model, batches)


def stage_split(stages: dict[str, float]) -> str:
    """``sample 12% reindex 8% ...``: each stage's share of the summed stage times
    (stages overlap under prefetch, so these are shares of work, not of the epoch)."""
    total = sum(stages.values()) or 1.0
    return " ".join(f"{stage} {100 * seconds / total:.0f}%" for stage, seconds in stages.items())
