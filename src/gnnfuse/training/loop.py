"""Full-graph node-classification training with early stopping, over several seeds.

One implementation shared by ``gnnfuse train`` and ``benchmarks/accuracy.py``, so the
accuracy table measures exactly what users run. A run keeps the weights of its best
validation epoch and reports the test accuracy there (the Planetoid protocol); several
runs differ only in the seed of initialisation and dropout, never in the split.
"""
from __future__ import annotations

import contextlib
import math
import os
import resource
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from ..backend.first_use import compiled_since, compiled_so_far
from ..nn.functional import cross_entropy
from ..nn.models import ModelSpec, build_model, get_model
from ..progress import progress_bar
from ..runtime.cuda_graph import CaptureFallbackWarning, StepCapture
from .config import ConfigError, TrainConfig
from .data import PreparedData, prepare_data
from .interrupt import DeferredInterrupt, RunInterrupted, StoppedAtOnce


@dataclass
class RunResult:
    """One seed's run: the best-validation epoch, its accuracies and weights, and the curves."""
    seed: int
    best_epoch: int
    best_val_acc: float
    test_acc: float
    epochs_run: int
    seconds: float
    state_dict: dict[str, torch.Tensor]
    history: dict[str, list[float]] = field(default_factory=dict)
    cuda_graph: str = "eager: disabled (mode 'off')"   # StepCapture.status of the training step
    metric: str = "acc"       # what best_val_acc and test_acc hold: accuracy, or MRR for link prediction
    interrupted: bool = False  # a Ctrl-C came in its last epoch: whoever runs more should stop


@dataclass
class TrainSummary:
    config: TrainConfig
    dataset_name: str
    in_channels: int
    out_channels: int
    runs: list[RunResult]

    def mean_std(self, key: str) -> tuple[float, float]:
        """Mean and sample standard deviation (0 for one run) of a per-run number; both NaN
        when a run's is (one that diverged before a finite epoch): `statistics.stdev`
        raises on a NaN, and leaving the run out would report the others as every run's."""
        values = [getattr(run, key) for run in self.runs]
        if any(math.isnan(value) for value in values):
            return math.nan, math.nan
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def peak_memory_mib(device: torch.device) -> float:
    """Peak CUDA allocation on GPU; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10   # bytes vs KiB


def accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of ``mask``'s rows whose argmax is the label; ``mask`` is a boolean mask
    or an index tensor, as PyG users pass either. NaN without rows (counted after
    indexing: ``mask.any()`` read the index [0] as no rows), and NaN when a row's logits
    hold a NaN: an argmax over them (class 0, or wherever the NaN is) looks like a
    result, and a diverged model's epoch lines and curves showed it."""
    rows = logits[mask]
    if rows.shape[0] == 0 or bool(rows.isnan().any()):
        return float("nan")
    return (rows.argmax(dim=1) == y[mask]).float().mean().item()


def _optimizer(spec: ModelSpec, model: nn.Module, config: TrainConfig, capturable: bool = False
               ) -> torch.optim.Optimizer:
    """Adam with weight decay on `spec.decayed` parameters only (all when unset);
    ``capturable`` keeps its step count on the GPU, so a CUDA graph can replay it."""
    decayed = list(spec.decayed(model)) if spec.decayed else list(model.parameters())
    ids = {id(p) for p in decayed}
    groups = [{"params": decayed, "weight_decay": config.weight_decay}]
    rest = [p for p in model.parameters() if id(p) not in ids]
    if rest:
        groups.append({"params": rest, "weight_decay": 0.0})
    return torch.optim.Adam(groups, lr=config.lr, capturable=capturable)


class EarlyStopping:
    """Best-epoch selection and the patience rule, apart from the loop so both can be
    checked on plain numbers.

    The best epoch has the highest validation accuracy, ties broken by lower validation
    loss (so a plateau still moves to a better-calibrated epoch). Training stops after
    `patience` epochs in which neither the validation accuracy nor the validation loss
    reached a new best -- the GAT paper's rule: the loss often keeps falling while the
    accuracy plateaus early, and stopping on accuracy alone then cuts training short.
    `patience` None never stops.
    """

    def __init__(self, patience: int | None):
        self.patience = patience
        self.best_epoch, self.best_val_acc, self.best_val_loss = 0, -1.0, float("inf")
        self.lowest_val_loss, self.last_progress, self.epoch = float("inf"), 0, 0
        self.diverged_at: int | None = None

    def step(self, epoch: int, val_acc: float, val_loss: float) -> bool:
        """Record one epoch; True when it is the new best epoch."""
        self.epoch = epoch
        improved = val_acc > self.best_val_acc or (val_acc == self.best_val_acc and val_loss < self.best_val_loss)
        if improved:
            self.best_epoch, self.best_val_acc, self.best_val_loss = epoch, val_acc, val_loss
        if improved or val_loss < self.lowest_val_loss:
            self.last_progress = epoch
        self.lowest_val_loss = min(self.lowest_val_loss, val_loss)
        return improved

    @property
    def reported_val_acc(self) -> float:
        """The best epoch's validation accuracy for a run's result: NaN when no epoch was
        best (every one diverged), not the -1 that starts the comparison."""
        return self.best_val_acc if self.best_epoch else float("nan")

    def diverge(self, epoch: int) -> None:
        """Record an epoch whose losses are not finite: never a best epoch, and the end of
        the run (the weights are not finite either, so no later epoch recovers)."""
        self.epoch, self.diverged_at = epoch, epoch

    @property
    def should_stop(self) -> bool:
        return self.diverged_at is not None or (self.patience is not None
                                                and self.epoch - self.last_progress >= self.patience)


def warn_diverged(epoch: int, losses: str, best_epoch: int) -> None:
    """Say that a run stopped at ``epoch`` because its ``losses`` are not finite, and which
    epoch's results it reports (0: none)."""
    warnings.warn(f"training diverged at epoch {epoch} ({losses}): the run stops; its results are its best "
                  f"finite epoch's ({f'epoch {best_epoch}' if best_epoch else 'none'}). A lower learning rate "
                  "may help.", RuntimeWarning, stacklevel=3)


class BestEpoch:
    """One training loop's epoch record: each epoch's values appended to ``history``, and
    the test accuracy and weights (a CPU copy) of the best validation epoch, as chosen by
    an `EarlyStopping` rule -- the bookkeeping every training loop shares."""

    def __init__(self, history: dict[str, list[float]], stopping: EarlyStopping):
        self.history, self.stopping = history, stopping
        self.test_acc, self.state_dict = float("nan"), {}

    def record(self, epoch: int, values: Iterable[float], model: nn.Module, val_acc: float, val_loss: float,
               test_acc: float) -> None:
        values = list(values)
        for key, value in zip(self.history, values):
            self.history[key].append(value)
        if not (math.isfinite(values[0]) and math.isfinite(val_loss)):
            # a NaN model's accuracies are argmax over NaN logits (class 0 everywhere):
            # numbers that look like results, so the epoch is never the best one
            self.stopping.diverge(epoch)
            warn_diverged(epoch, f"loss {values[0]}, val loss {val_loss}", self.stopping.best_epoch)
        elif self.stopping.step(epoch, val_acc, val_loss):
            self.test_acc = test_acc
            self.state_dict = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def run_state(epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer, best: BestEpoch,
              seconds: float) -> dict[str, Any]:
    """Everything a full-graph run needs to go on after ``epoch`` as if it had never
    stopped: weights, Adam's moments, torch's RNG (dropout's masks), the early-stopping
    counters, the best epoch's weights and the curves."""
    device = next(model.parameters()).device
    return {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "history": best.history, "stopping": dict(vars(best.stopping)), "best_test_acc": best.test_acc,
            "best_state_dict": best.state_dict, "seconds": seconds}


def restore_run(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, best: BestEpoch) -> int:
    """Put a `run_state` back into a freshly built run; returns the epoch it was taken after."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for key, values in state["history"].items():
        best.history[key][:] = values
    vars(best.stopping).update(state["stopping"])
    best.test_acc, best.state_dict = state["best_test_acc"], state["best_state_dict"]
    torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None:
        torch.cuda.set_rng_state(state["cuda_rng"], next(model.parameters()).device)
    return state["epoch"]


def interrupted_result(state: dict[str, Any], seed: int) -> RunResult:
    """A `run_state` as the result of a run that stopped there (for its curves)."""
    stopping = state["stopping"]
    return RunResult(seed=seed, best_epoch=stopping["best_epoch"],
                     best_val_acc=stopping["best_val_acc"] if stopping["best_epoch"] else float("nan"),
                     test_acc=state["best_test_acc"], epochs_run=state["epoch"], seconds=state["seconds"],
                     state_dict=state["best_state_dict"], history=state["history"])


def train_run(config: TrainConfig, spec: ModelSpec, data: PreparedData, seed: int, *,
              label: str = "", log_epochs: bool = True, cuda_graph: str = "auto",
              resume_from: dict[str, Any] | None = None) -> RunResult:
    """Train one model from `seed`, keeping the weights and test accuracy of the best
    validation epoch and stopping by `config.patience` (see `EarlyStopping`). The
    training step is captured in a CUDA graph where `StepCapture` finds it replayable
    (``cuda_graph`` is its mode); the evaluation forward stays eager.

    Ctrl-C ends the run at the end of its epoch with `RunInterrupted`, whose `run_state`
    passed back as ``resume_from`` continues the run to the numbers it would have reached."""
    device = torch.device(config.device)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = build_model(config.model, data.num_features, data.num_classes,
                        config.hidden, config.dropout).to(device)
    optimizer = _optimizer(spec, model, config, capturable=device.type == "cuda" and cuda_graph != "off")
    train_mask, val_mask, test_mask = data.masks
    train_index = train_mask.nonzero().squeeze(1)    # a boolean mask would sync every step
    train_y = data.y[train_index]

    def train_step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = cross_entropy(model(data.x, data.graph), train_y, rows=train_index)
        loss.backward()
        optimizer.step()
        return loss
    step = StepCapture(train_step, optimizers=[optimizer], modules=[model], mode=cuda_graph)
    history: dict[str, list[float]] = {key: [] for key in ("loss", "val_loss", "train_acc", "val_acc", "test_acc")}
    stopping = EarlyStopping(config.patience)
    best = BestEpoch(history, stopping)

    def run_epoch(epoch: int) -> bool:
        """One epoch: the training step, evaluation, the record; True when the run should stop."""
        epoch_start, compiled_before = time.perf_counter(), compiled_so_far()
        model.train()
        loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_ms = (time.perf_counter() - epoch_start) * 1e3      # the training step only
        compiling = compiled_since(compiled_before)
        model.eval()
        with torch.no_grad():
            logits = model(data.x, data.graph)
            val_loss = F.cross_entropy(logits[val_mask], data.y[val_mask]).item()
        train_acc, val_acc, test_acc = (accuracy(logits, data.y, m) for m in data.masks)
        best.record(epoch, (loss.item(), val_loss, train_acc, val_acc, test_acc), model, val_acc, val_loss, test_acc)
        progress.set_postfix(loss=f"{loss.item():.4f}", val=f"{val_acc:.4f}", test=f"{test_acc:.4f}")
        if log_epochs:
            tqdm.write(f"{label.strip() + ' | ' if label else ''}epoch {epoch:4d} | loss {loss.item():.4f} | "
                       f"train {train_acc:.4f} | val {val_acc:.4f} | test {test_acc:.4f} | {epoch_ms:7.1f} ms{compiling} | "
                       f"peak {peak_memory_mib(device):.0f} MiB", file=sys.stdout)
        return stopping.should_stop

    done = 0 if resume_from is None else restore_run(resume_from, model, optimizer, best)
    start = time.perf_counter() - (0.0 if resume_from is None else resume_from["seconds"])
    progress = progress_bar(range(done + 1, config.epochs + 1), desc=f"train{label}", unit="epoch")
    with DeferredInterrupt(terminate=True) as interrupt:
        for epoch in progress:
            if run_epoch(epoch):
                break
            if interrupt.requested and epoch < config.epochs:
                progress.close()
                raise RunInterrupted(run_state(epoch, model, optimizer, best, time.perf_counter() - start))
    progress.close()
    return RunResult(seed=seed, best_epoch=stopping.best_epoch, best_val_acc=stopping.reported_val_acc,
                     test_acc=best.test_acc,
                     epochs_run=len(history["loss"]), seconds=time.perf_counter() - start,
                     state_dict=best.state_dict, history=history, cuda_graph=step.status,
                     interrupted=interrupt.requested)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during `train_runs`: a KeyboardInterrupt (so ``except KeyboardInterrupt``
    still stops on it) that carries the runs that finished before it (`summary`), the
    index of the run it stopped, and that run's `run_state` at the end of its last epoch
    (None where the run cannot be continued: a second Ctrl-C, which stops at once, or a
    run that stops at once, `reason` saying why: `interrupt.StoppedAtOnce`). `between_runs`:
    it came in the last epoch of the run before, so run `index` had not started."""

    def __init__(self, summary: TrainSummary, index: int, state: dict[str, Any] | None = None,
                 between_runs: bool = False, reason: str | None = None):
        super().__init__(f"interrupted {'before' if between_runs else 'in'} run {index + 1}/{summary.config.runs}")
        self.summary, self.index, self.state, self.between_runs = summary, index, state, between_runs
        self.reason = reason


def train_runs(config: TrainConfig, *, log_epochs: bool = True,
               on_run: Callable[[int, RunResult], None] | None = None, cuda_graph: str = "auto",
               save_to: str | None = None, resume: bool = False) -> TrainSummary:
    """`config.runs` runs with seeds ``config.seed, config.seed + 1, ...`` on one split;
    `on_run(index, result)` is called after each (for progress lines); ``cuda_graph`` is
    the training step's capture mode (`StepCapture`). With ``save_to`` the checkpoint of
    the runs so far is written after each run (by the main rank), so stopping a long
    ``--runs`` loses at most the run in progress; ``resume`` takes the finished runs from
    that checkpoint (`checkpoint.resumed_runs` refuses one of another recipe) and trains
    only the rest. Every run starts from its own seed, so a resumed summary is the one an
    uninterrupted call gives. Ctrl-C raises `TrainingInterrupted` with the finished runs.
    Under torchrun, the process group must be joined first (`DistributedError` otherwise)."""
    from ..distributed.process_group import check_joined     # imports this module
    check_joined()          # a torchrun rank without a process group would train alone as rank 0
    spec = get_model(config.model)
    if spec.task == "link":
        from .link_prediction import prepare_link_data, train_link_run as run_one     # imports this module
        if cuda_graph == "on":
            warnings.warn(f"gnnfuse: {config.model} is a link-prediction model, whose steps are not captured in a "
                          "CUDA graph: they run eagerly", CaptureFallbackWarning, stacklevel=2)
        data = prepare_link_data(config)
        summary = TrainSummary(config, data.name, data.num_entities, data.num_relations, [])
    else:
        data = prepare_data(config, spec)
        summary = TrainSummary(config, data.name, data.num_features, data.num_classes, [])
        from ..distributed import train_run_function              # imports this module
        run_one = train_run_function(config)                      # several ranks: theirs; one process: None
        if run_one is None and config.fanout is None:
            run_one = train_run
        elif run_one is None:
            from .minibatch import train_minibatch_run as run_one     # imports this module
    interrupted = None             # the state of the run a resumed checkpoint stopped inside
    if resume:
        if save_to is None:
            raise ConfigError("resume continues the save_to checkpoint, and none was given")
        from .checkpoint import resumed_runs                          # imports this module
        finished, interrupted = resumed_runs(save_to, summary)
        summary.runs.extend(finished)
        print(f"resuming {save_to}: {len(summary.runs)} of {config.runs} run(s) already finished"
              + (f" (seeds {', '.join(str(run.seed) for run in summary.runs)})" if summary.runs else "")
              + (f"; run {len(summary.runs) + 1} goes on after its epoch {interrupted['epoch']}"
                 if interrupted is not None else ""))
    from ..distributed import current                                 # imports this module
    for index in range(len(summary.runs), config.runs):
        label = f" run {index + 1}/{config.runs}" if config.runs > 1 else ""
        # one process captures its steps (full-graph; mini-batch on padded batches); data-parallel ranks
        # where asked (distributed.minibatch); link prediction does not
        extra: dict[str, Any] = {"cuda_graph": cuda_graph} if spec.task != "link" else {}
        if interrupted is not None:       # saved by this kind of run: the config and the ranks are the same
            extra["resume_from"] = interrupted
        interrupted = None
        saving = save_to is not None and current().is_main
        if saving:
            from .checkpoint import save_checkpoint                   # imports this module
        try:
            result = run_one(config, spec, data, config.seed + index, label=label, log_epochs=log_epochs, **extra)
        except KeyboardInterrupt as error:
            state = error.state if isinstance(error, RunInterrupted) else None
            if saving and state is not None:
                if not resume and not summary.runs and os.path.lexists(save_to):    # there before this call
                    from .checkpoint import set_aside                 # imports this module
                    print(f"{save_to} held a file before this command, replaced only once a run finishes: it is "
                          f"kept as {set_aside(save_to)}", file=sys.stderr)
                with held_while_saving(current().world_size, quiet=True):
                    save_checkpoint(summary, save_to, interrupted=state)
            reason = error.reason if isinstance(error, StoppedAtOnce) else None
            raise TrainingInterrupted(summary, index, state, reason=reason) from None
        with held_while_saving(current().world_size) as held:
            summary.runs.append(result)
            if saving:
                save_checkpoint(summary, save_to)
            if on_run is not None:
                on_run(index, result)
        if (result.interrupted or held.requested) and index + 1 < config.runs:
            raise TrainingInterrupted(summary, index + 1, between_runs=True)
    return summary


def held_while_saving(world_size: int, quiet: bool = False) -> contextlib.AbstractContextManager[DeferredInterrupt]:
    """What a Ctrl-C or SIGTERM does between a finished run and its checkpoint: held
    until the run is saved and reported, then it stops before the next run. It raised
    in the save, losing the finished run (the file kept the runs before it) and the
    resume hint. ``quiet`` while saving a run stopped by a signal, which said so: the
    run's own hold has ended with its epoch, and a duplicate of that signal (``timeout``
    sends two) arriving then ended the process by SIGTERM's default action, before the
    checkpoint was written (and, quiet, while the command reports the stop: `cli.run_train`).
    One process only: ranks stop together (`distributed.stopping`),
    and a rank holding it while the others start the next run would leave them waiting."""
    interrupt = DeferredInterrupt(when="before the next run, once this run is saved", terminate=True, quiet=quiet)
    return interrupt if world_size == 1 else contextlib.nullcontext(interrupt)     # never entered: hears none
