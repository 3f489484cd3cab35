"""Checkpoints of `gnnfuse train`: every run's best weights with the config that rebuilds them."""
from __future__ import annotations

import dataclasses
import numbers
import os
import warnings
from typing import Any

import torch
from torch import nn

from ..nn.block_models import build_block_model
from ..nn.models import build_model
from ..output_paths import write_atomically
from .config import ConfigError
from .loop import RunResult, TrainSummary

CHECKPOINT_FORMAT = "gnnfuse-train/1"


def save_checkpoint(summary: TrainSummary, path: str | os.PathLike, interrupted: dict[str, Any] | None = None
                    ) -> None:
    """Write every run's best-validation state dict with the config that rebuilds the model,
    and the `loop.run_state` of the run Ctrl-C stopped inside (``interrupted``), if any.

    Through `output_paths.write_atomically`: `train_runs` saves after every run, and a
    write stopped halfway (Ctrl-C, a full disk) must leave the previous checkpoint whole,
    not a truncated file, nor a temporary one beside it. Its own ``.partial`` rename left
    one there after a failed write, replaced a symbolic link at ``path`` by a plain file
    (the linked file kept the old checkpoint) and gave a shared file the umask's mode."""
    from ..distributed import world_size          # distributed builds on training: imported on use
    contents = {"format": CHECKPOINT_FORMAT, "config": dataclasses.asdict(summary.config), "ranks": world_size(),
                "threads": torch.get_num_threads(),
                "dataset": summary.dataset_name, "in_channels": summary.in_channels,
                "out_channels": summary.out_channels,
                "runs": [{"seed": r.seed, "best_epoch": r.best_epoch, "best_val_acc": r.best_val_acc,
                          "test_acc": r.test_acc, "state_dict": r.state_dict, "epochs_run": r.epochs_run,
                          "seconds": r.seconds, "history": r.history, "cuda_graph": r.cuda_graph,
                          "metric": r.metric} for r in summary.runs],
                "interrupted": interrupted}
    write_atomically(path, lambda partial: torch.save(contents, partial))


def set_aside(path: str | os.PathLike) -> str:
    """Rename the file at ``path`` to ``<path>.previous`` (``.previous2``, ... when taken)
    and return the new name. For a Ctrl-C in the first run of a command whose checkpoint
    path held a file before it: the command's note promised that file is replaced only
    once a run finishes, and a user who stopped the command on reading that note lost it
    to the stopped run's state; now both are kept."""
    aside, count = f"{os.fspath(path)}.previous", 1
    while os.path.lexists(aside):
        count += 1
        aside = f"{os.fspath(path)}.previous{count}"
    os.replace(path, aside)
    return aside


# Fields that may differ between a checkpoint and the call resuming it: more runs extend
# it, the data may have moved to another folder (its size is checked instead), and the
# loader's worker processes prepare the same batches as its thread, each drawn from its
# own generator (`loader`): resuming on a machine with other cores was refused for them.
RESUMABLE_CHANGES = frozenset({"runs", "root", "loader_workers"})


def resumed_runs(path: str | os.PathLike, summary: TrainSummary
                 ) -> tuple[list[RunResult], dict[str, Any] | None]:
    """The finished runs of the checkpoint at ``path``, for `train_runs` to continue
    ``summary`` (its config and data, no runs yet) with the rest, and the state of the
    run it stopped inside (None if it stopped between runs).

    A checkpoint of another recipe is refused with every differing field named: its runs
    mixed into this summary would average two different experiments under one config."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path} does not exist, so there is no checkpoint to resume")
    checkpoint = read_checkpoint(path)
    asked = dataclasses.asdict(summary.config)
    saved = {**checkpoint["config"], "fanout": tuple(checkpoint["config"]["fanout"] or ()) or None,
             "dataset": checkpoint["config"]["dataset"].lower()}     # saved as typed before make_config lowered it
    saved_data = (checkpoint["dataset"], checkpoint["in_channels"], checkpoint["out_channels"])
    # the number of ranks is no field of the config, but one process and two train the
    # same recipe to different numbers (partitioned graph, per-rank dropout streams)
    from ..distributed import world_size
    asked["ranks"], saved["ranks"] = world_size(), checkpoint.get("ranks")
    changed = [f"{key} {saved.get(key)!r} in the checkpoint, {value!r} asked for" for key, value in asked.items()
               if key not in RESUMABLE_CHANGES and saved.get(key) != value]
    if saved_data != (summary.dataset_name, summary.in_channels, summary.out_channels):
        changed.append(f"data (name, inputs, outputs) {saved_data} in the checkpoint, "
                       f"{(summary.dataset_name, summary.in_channels, summary.out_channels)} loaded")
    if changed:
        raise ConfigError(f"cannot resume {path}: it was trained with another recipe: {'; '.join(changed)}")
    if len(checkpoint["runs"]) > summary.config.runs:
        raise ConfigError(f"cannot resume {path}: it holds {len(checkpoint['runs'])} finished runs, more than "
                          f"the {summary.config.runs} asked for")
    missing = [key for key in ("history", "epochs_run") if key not in (checkpoint["runs"] or [{}])[0]]
    if checkpoint["runs"] and missing:
        raise ConfigError(f"cannot resume {path}: it was written by an older gnnfuse without each run's "
                          f"{' and '.join(missing)}")
    if len(checkpoint["runs"]) < summary.config.runs:
        _warn_other_threads(path, checkpoint.get("threads"), summary.config.device)
    return [RunResult(**run) for run in checkpoint["runs"]], checkpoint.get("interrupted")


def _warn_other_threads(path: str | os.PathLike, saved: int | None, device: str) -> None:
    """Warn when the runs left are trained on another number of CPU threads than the
    checkpoint's: torch's CPU matmuls and sums split their work by thread count, so the
    resumed runs round differently from the uninterrupted command's (gcn's losses on cora
    2e-7 apart after 30 epochs) -- not the same numbers, as --resume promises, and
    without a word, since the thread count is the machine's and no field of the recipe.
    A warning, not a refusal: going on on another machine is what resuming is for."""
    from ..distributed import current          # distributed builds on training: imported on use
    threads = torch.get_num_threads()
    if device == "cpu" and saved is not None and saved != threads and current().is_main:
        warnings.warn(f"{path} was trained on {saved} CPU thread(s) and this command uses {threads}: the runs it "
                      f"continues round differently from an uninterrupted command's (--threads {saved} gives its "
                      "numbers)", RuntimeWarning, stacklevel=4)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint at ``path`` as saved, or `ConfigError` (a ValueError) naming the file
    when it is none: torch.load's own error for, say, a text file advises loading with
    ``weights_only=False``, which would run whatever code the file holds."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as error:      # on arbitrary bytes its legacy reader also raises KeyError, IndexError, ...
        raise ConfigError(f"{path} is not a gnnfuse train checkpoint (format {CHECKPOINT_FORMAT}): "
                          f"torch.load could not read it ({type(error).__name__})") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} is not a gnnfuse train checkpoint (format {CHECKPOINT_FORMAT})")
    return checkpoint


def load_checkpoint(path: str | os.PathLike, run: int = 0) -> tuple[nn.Module, dict[str, Any]]:
    """The model of run `run` from a `save_checkpoint` file, weights loaded, in eval mode,
    with the whole checkpoint (config, accuracies) alongside."""
    checkpoint = read_checkpoint(path)
    if isinstance(run, bool) or not isinstance(run, numbers.Integral):   # True indexed run 1
        raise ValueError(f"run must be the index of a run (0 to {len(checkpoint['runs']) - 1}), got {run!r}")
    if not 0 <= run < len(checkpoint["runs"]):
        raise ValueError(f"{path} holds {len(checkpoint['runs'])} run(s); run {run} does not exist")
    saved = checkpoint["runs"][run]
    if not saved["state_dict"]:      # a run that diverged before any finite epoch kept no weights
        raise ValueError(f"{path}: run {run} (seed {saved['seed']}) has no weights: it diverged before its "
                         "first finite epoch, so it has no best epoch to rebuild")
    config = checkpoint["config"]
    if config.get("fanout"):       # a mini-batch run: one layer per sampled hop
        model = build_block_model(config["model"], checkpoint["in_channels"], checkpoint["out_channels"],
                                  config["hidden"], config["dropout"], len(config["fanout"]))
    else:
        model = build_model(config["model"], checkpoint["in_channels"], checkpoint["out_channels"],
                            config["hidden"], config["dropout"])
    model.load_state_dict(saved["state_dict"])
    return model.eval(), checkpoint
