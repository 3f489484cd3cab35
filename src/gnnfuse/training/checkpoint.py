"""Checkpoints of `gnnfuse train`: every run's best weights with the config that rebuilds them."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch import nn

from ..nn.block_models import build_block_model
from ..nn.models import build_model
from .loop import TrainSummary

CHECKPOINT_FORMAT = "gnnfuse-train/1"


def save_checkpoint(summary: TrainSummary, path: str | os.PathLike) -> None:
    """Write every run's best-validation state dict with the config that rebuilds the model.

    Into a temporary file beside ``path``, then renamed over it: `train_runs` saves after
    every run, and a write stopped halfway (Ctrl-C, a full disk) must leave the previous
    checkpoint whole, not a truncated file."""
    partial = f"{os.fspath(path)}.partial"
    torch.save({"format": CHECKPOINT_FORMAT, "config": dataclasses.asdict(summary.config),
                "dataset": summary.dataset_name, "in_channels": summary.in_channels,
                "out_channels": summary.out_channels,
                "runs": [{"seed": r.seed, "best_epoch": r.best_epoch, "best_val_acc": r.best_val_acc,
                          "test_acc": r.test_acc, "state_dict": r.state_dict} for r in summary.runs]}, partial)
    os.replace(partial, path)


def load_checkpoint(path: str | os.PathLike, run: int = 0) -> tuple[nn.Module, dict[str, Any]]:
    """The model of run `run` from a `save_checkpoint` file, weights loaded, in eval mode,
    with the whole checkpoint (config, accuracies) alongside."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a gnnfuse train checkpoint (format {CHECKPOINT_FORMAT})")
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
