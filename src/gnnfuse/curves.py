"""Learning curves of a `gnnfuse train` invocation as a PNG.

matplotlib is an optional extra (``pip install gnnfuse[plot]``), imported only here and
only when a plot is asked for, so training never depends on it.
"""
from __future__ import annotations

import os
from typing import Any

from .loader import STAGES
from .output_paths import write_atomically
from .training import TrainSummary


def require_matplotlib() -> Any:
    """matplotlib's `Figure` class, or an ImportError that says how to install it.

    Called before training starts, so a missing plotting library does not surface
    only after minutes of training.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("plotting learning curves needs matplotlib: pip install 'gnnfuse[plot]' "
                          "(or pip install matplotlib)") from error
    return Figure


def plot_curves(summary: TrainSummary, path: str | os.PathLike) -> None:
    """Loss (train solid, validation dashed) and accuracy (train solid, validation dashed)
    per epoch, one colour per run, with each run's best-validation epoch marked.

    Uses `Figure` directly rather than pyplot, so no GUI backend or global state is involved.
    Written by `output_paths.write_atomically`: drawn straight onto ``path``, a write
    stopped halfway (Ctrl-C after the training, a full disk) left a truncated image where
    the previous one was.
    """
    figure_class = require_matplotlib()
    staged = bool(summary.runs) and "epoch_seconds" in summary.runs[0].history
    figure = figure_class(figsize=(16.5 if staged else 11, 4.2), layout="constrained")
    axes = figure.subplots(1, 3 if staged else 2)
    loss_axes, acc_axes = axes[0], axes[1]
    for index, run in enumerate(summary.runs):
        colour = f"C{index % 10}"
        epochs = range(1, run.epochs_run + 1)
        loss_axes.plot(epochs, run.history["loss"], color=colour, label=f"seed {run.seed}")
        loss_axes.plot(epochs, run.history["val_loss"], color=colour, linestyle="--")
        acc_axes.plot(epochs, run.history["train_acc"], color=colour, label=f"seed {run.seed}")
        acc_axes.plot(epochs, run.history["val_acc"], color=colour, linestyle="--")
        acc_axes.axvline(run.best_epoch, color=colour, linestyle=":", linewidth=0.8)
    loss_axes.set(xlabel="epoch", ylabel="cross-entropy", title="loss (solid: train, dashed: val)")
    acc_axes.set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1.01),
                 title="accuracy (solid: train, dashed: val, dotted: best val)")
    if len(summary.runs) <= 10:
        acc_axes.legend(loc="lower right", fontsize="small")
    if staged:
        plot_stage_breakdown(axes[2], summary.runs[0].history, summary.runs[0].seed)
    config = summary.config
    figure.suptitle(f"{config.model} on {summary.dataset_name}: {len(summary.runs)} run(s), "
                    f"lr {config.lr:g}, weight decay {config.weight_decay:g}, dropout {config.dropout:g}")
    write_atomically(path, lambda tmp: figure.savefig(tmp, dpi=110))


def plot_stage_breakdown(axes: Any, history: dict[str, list[float]], seed: int) -> None:
    """One run's per-epoch seconds of each mini-batch stage as stacked bars, with the
    epoch's wall time as a line: with prefetch the stages overlap, so the bars may rise
    above the line; ``wait`` is the part of preparation the overlap did not hide."""
    epochs = range(1, len(history["epoch_seconds"]) + 1)
    bottom = [0.0] * len(epochs)
    for index, stage in enumerate(STAGES):
        seconds = history[f"stage_{stage}"]
        axes.bar(epochs, seconds, bottom=bottom, width=0.85, color=f"C{index}", label=stage)
        bottom = [b + s for b, s in zip(bottom, seconds)]
    axes.plot(epochs, history["epoch_seconds"], color="black", marker=".", label="epoch (wall)")
    axes.set(xlabel="epoch", ylabel="seconds", title=f"time per stage, seed {seed} (stacked; line: epoch wall)")
    axes.legend(loc="upper right", fontsize="small")
