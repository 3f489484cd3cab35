"""What a training run is asked to do: `TrainConfig`, resolved from a model's paper
defaults by `make_config`, and `ConfigError` for a request that cannot run as given."""
from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any

import torch

from ..data import DEFAULT_DATASET
from ..data.registry import RELATIONAL_DATASETS
from ..nn.block_models import BLOCK_MODELS
from ..nn.models import get_model


FEATURE_PLACEMENTS = ("replicated", "partitioned")     # where data-parallel ranks keep the features
MAX_SEED = 2**63     # a run's seed is below it, leaving room below torch's 2**64 for the ranks' seed strides
MAX_COUNT = 2**63    # epochs and batch sizes are 64-bit integers to range() and torch
# Adam's first step scales by lr / (1 - beta1) = 10 lr and its weight decay by the rate,
# as float32 numbers (the parameters' dtype): a larger rate failed inside that step with
# "value cannot be converted to type float without overflow"
MAX_RATE = float(torch.finfo(torch.float32).max) * (1 - 0.9)
# Loader worker processes each hold pipes to this one: --num-workers 10**20 spawned
# processes until "OSError: Too many open files" (a traceback, hundreds of processes on).
# More workers than CPUs prepare no batch sooner; a few dozen always pass.
MAX_LOADER_WORKERS = max(64, os.cpu_count() or 1)


class ConfigError(ValueError):
    """A training request that cannot run as given: unknown model or data set, a value out
    of range, a missing data file or device. Raised before any training starts, so callers
    can report it as a usage error without mistaking a failure inside training for one."""


@dataclass(frozen=True)
class TrainConfig:
    """A fully resolved training recipe: every value the runs used, saved with the weights.

    `patience` None trains all `epochs`; `hidden` None is for models without a hidden layer.
    `fanout` (one per layer, PyG's ``num_neighbors``) makes the runs sampled mini-batch
    training (`training.minibatch`) with `batch_size` seeds per batch; None trains on the
    full graph. `features` is where several data-parallel ranks keep the feature table:
    ``replicated`` (each rank all of it) or ``partitioned`` (each rank a contiguous
    share, rows fetched from their owner per batch; `gnnfuse.distributed`).
    `loader_workers` is the mini-batch loader's worker processes (its ``num_workers``).
    """
    model: str
    dataset: str
    hidden: int | None
    lr: float
    weight_decay: float
    dropout: float
    epochs: int
    patience: int | None
    runs: int = 1
    seed: int = 0
    device: str = "cpu"
    root: str | None = None
    fanout: tuple[int, ...] | None = None
    batch_size: int = 1024
    dkp: bool = False
    features: str = "replicated"
    loader_workers: int = 0


def make_config(model: str, dataset: str = DEFAULT_DATASET, *, runs: int = 1, seed: int = 0,
                device: str = "cpu", root: str | os.PathLike | None = None,
                fanout: tuple[int, ...] | None = None, batch_size: int | None = None, dkp: bool = False,
                features: str = "replicated", loader_workers: int = 0, **overrides: Any) -> TrainConfig:
    """`model`'s paper defaults, with every override that is not None applied.

    Overrides are hidden, lr, weight_decay, dropout, epochs and patience (0 disables
    early stopping). `fanout` and `batch_size` ask for mini-batch training, `dkp` for
    dynamic kernel placement fitted on its first batches (`nn.placement`),
    `loader_workers` for loader worker processes. Raises
    `ConfigError` naming the bad value.
    """
    try:
        spec = get_model(model)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    unknown = set(overrides) - {"hidden", "lr", "weight_decay", "dropout", "epochs", "patience"}
    if unknown:
        raise ConfigError(f"unknown hyperparameter(s): {', '.join(sorted(unknown))}")
    given = {key: value for key, value in overrides.items() if value is not None}
    if "hidden" in given and spec.defaults.hidden is None:
        raise ConfigError(f"model {model!r} has no hidden layer, so hidden does not apply")
    if given.get("dropout") and spec.defaults.hidden is None:     # sgc: one linear map, nothing to drop
        raise ConfigError(f"model {model!r} has no hidden layer and no dropout, so dropout does not apply "
                          "(it was accepted and ignored)")
    values = {**dataclasses.asdict(spec.defaults), **given}
    if isinstance(fanout, Iterator):    # map(int, text.split(",")): read once, not emptied by the type check
        fanout = tuple(fanout)
    _check_types({"runs": runs, "seed": seed, "loader_workers": loader_workers, "batch_size": batch_size,
                  **{key: values[key] for key in ("epochs", "patience", "hidden")}},
                 {key: values[key] for key in ("lr", "weight_decay", "dropout")}, fanout)
    # after the type check: False (== 0) and 0.0 became "never stop early" unchecked
    if values["patience"] == 0:
        values["patience"] = None
    if not isinstance(dataset, str):      # failed inside loading, with "'int' object has no attribute 'lower'"
        raise ConfigError(f"dataset must be a data set's name, got {dataset!r}")
    dataset = dataset.lower()     # names are case-blind: --dataset CORA then cora is one recipe, resumable
    if not isinstance(dkp, bool):         # a string such as "no" is true: it trained with dkp on
        raise ConfigError(f"dkp must be True or False, got {dkp!r}")
    # numpy scalars pass as numbers, but the config is saved in checkpoints, which
    # torch.load(weights_only=True) reads: a numpy object there made load_checkpoint and
    # --resume refuse the file as "not a gnnfuse train checkpoint"
    runs, seed, loader_workers = int(runs), int(seed), int(loader_workers)
    batch_size = None if batch_size is None else int(batch_size)
    fanout = None if fanout is None else tuple(int(k) for k in fanout)
    values.update({key: int(values[key]) for key in ("epochs", "patience", "hidden") if values[key] is not None})
    values.update({key: float(values[key]) for key in ("lr", "weight_decay", "dropout")})
    checks = [(runs >= 1, f"runs must be >= 1, got {runs}"),
              # numpy's generators (the split of a data set without one) take no negative seed
              (seed >= 0, f"seed must be >= 0, got {seed}"),
              # run i seeds torch's generator with seed + i (ranks add a stride to it), which takes
              # no seed of 2**64 or more: a larger one failed inside training, a traceback
              (seed + runs - 1 < MAX_SEED, f"seed must be below 2**63, and so must the last run's seed "
               f"(seed + runs - 1); got {seed + runs - 1}"),
              (values["epochs"] >= 1, f"epochs must be >= 1, got {values['epochs']}"),
              (values["epochs"] < MAX_COUNT, f"epochs must be below 2**63, got {values['epochs']}"),
              (values["patience"] is None or values["patience"] >= 1,
               f"patience must be >= 0, got {values['patience']}"),
              (values["hidden"] is None or values["hidden"] >= 1, f"hidden must be >= 1, got {values['hidden']}"),
              (0 <= values["lr"] <= MAX_RATE,
               f"lr must be finite, >= 0 and at most {MAX_RATE:.2g}, got {values['lr']}"),
              (0 <= values["weight_decay"] <= MAX_RATE,
               f"weight decay must be finite, >= 0 and at most {MAX_RATE:.2g}, got {values['weight_decay']}"),
              (0 <= values["dropout"] < 1, f"dropout must be in [0, 1), got {values['dropout']}"),
              (device in ("cpu", "cuda"), f"device must be cpu or cuda, got {device!r}")]
    checks.append((features in FEATURE_PLACEMENTS,
                   f"features must be one of {', '.join(FEATURE_PLACEMENTS)}, got {features!r}"))
    checks.append((features == "replicated" or fanout is not None,
                   "partitioned features are fetched per mini-batch: they need a fanout"))
    checks.append((not dkp or (fanout is not None and model == "sage"),
                   "dynamic kernel placement needs mini-batch training (a fanout) of sage"))
    # here, not only in the ranks' loop: there each rank printed the usage error after loading
    # the data, and the launch ended with status 1 ("rank 0 of 2 failed")
    checks.append((not (dkp and features == "partitioned"),
                   "dynamic kernel placement calibrates on batches with their features; with --features "
                   "partitioned use replicated features or drop --dkp"))
    checks.append((spec.task != "link" or fanout is None, f"model {model!r} (link prediction) trains on the full "
                   "graph; --fanout does not apply"))
    checks.append((spec.task != "link" or dataset.lower() in RELATIONAL_DATASETS,
                   f"model {model!r} predicts links of a relational data set "
                   f"({', '.join(sorted(RELATIONAL_DATASETS))}), not {dataset}"))
    checks.append((loader_workers >= 0, f"loader workers must be >= 0, got {loader_workers}"))
    checks.append((loader_workers <= MAX_LOADER_WORKERS,
                   f"loader workers must be at most {MAX_LOADER_WORKERS}, got {loader_workers}"))
    checks.append((not loader_workers or fanout is not None,
                   "loader workers prepare sampled mini-batches: they need a fanout"))
    for ok, message in checks + minibatch_checks(model, fanout, batch_size):
        if not ok:
            raise ConfigError(message)
    sampling = {} if fanout is None else {"fanout": tuple(fanout), "batch_size": batch_size or 1024, "dkp": dkp,
                                          "loader_workers": loader_workers}
    return TrainConfig(model=model, dataset=dataset, runs=runs, seed=seed, device=device, features=features,
                       root=None if root is None else str(root), **values, **sampling)


def _check_types(counts: dict[str, Any], rates: dict[str, Any], fanout: Any) -> None:
    """Raise `ConfigError` for a count (epochs, runs, hidden, ...) that is not an integer or
    a rate (lr, dropout) that is not a real number. The range checks compare them only,
    so ``epochs=2.5`` passed and failed inside training with Python's "'float' object
    cannot be interpreted as an integer", and ``seed=0.5`` trained silently as seed 0."""
    def integer(value: Any) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    for name, value in counts.items():
        if value is not None and not integer(value):
            raise ConfigError(f"{name.replace('_', ' ')} must be an integer, got {value!r}")
    for name, value in rates.items():
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise ConfigError(f"{name.replace('_', ' ')} must be a number, got {value!r}")
    # a mapping (PyG's per-edge-type num_neighbors) iterates its keys, and a set in no
    # order of layers: both trained silently on a fanout made of whatever came out
    if fanout is not None and (isinstance(fanout, (str, bytes, Mapping, Set)) or not isinstance(fanout, Iterable)
                               or not all(integer(k) for k in fanout)):
        raise ConfigError(f"fanout must be a sequence of integers (one per layer), got {fanout!r}")


def minibatch_checks(model: str, fanout: tuple[int, ...] | None, batch_size: int | None
                     ) -> list[tuple[bool, str]]:
    """(ok, message) pairs for the mini-batch options."""
    if fanout is None:
        return [(batch_size is None, "batch size given without a fanout; mini-batch training needs both")]
    return [(model in BLOCK_MODELS, f"model {model!r} has no mini-batch version; mini-batch models: "
                                     f"{', '.join(BLOCK_MODELS)}"),
            (len(fanout) >= 1 and all(k >= 1 or k == -1 for k in fanout),
             f"fanout must be one count >= 1 (or -1 for all) per layer, got {list(fanout)}"),
            (batch_size is None or batch_size >= 1, f"batch size must be >= 1, got {batch_size}"),
            (batch_size is None or batch_size < MAX_COUNT, f"batch size must be below 2**63, got {batch_size}")]
