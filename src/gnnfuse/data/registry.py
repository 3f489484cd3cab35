"""`load_dataset`: one name-based entry point for the CLI and benchmarks."""
from __future__ import annotations

import os
from typing import Any, Callable

from .dataset import NodeDataset, RelationalDataset
from .npz import load_npz
from .ogb import OGB_NAMES, load_ogb
from .planetoid import load_planetoid
from .synthetic import planted_partition, power_law_graph
from .typed import TYPED_PRESETS, typed_graph
from .wn18rr import load_wn18rr

# (num_nodes, num_edges, num_features, num_classes) of the real graphs each preset mimics
POWER_LAW_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "arxiv-like": (169_343, 1_166_243, 128, 40),
    "reddit2-like": (232_965, 23_213_838, 602, 41),
    "products-like": (2_449_029, 61_859_140, 100, 47),
}

_LOADERS: dict[str, Callable[..., NodeDataset | RelationalDataset]] = {
    "cora": lambda root, **kw: load_planetoid("cora", root, **kw),
    "citeseer": lambda root, **kw: load_planetoid("citeseer", root, **kw),
    "pubmed": lambda root, **kw: load_planetoid("pubmed", root, **kw),
    "cora-npz": lambda root, **kw: load_npz("cora", root, **kw),
    "citeseer-npz": lambda root, **kw: load_npz("citeseer", root, **kw),
    "wn18rr": lambda root, **kw: load_wn18rr(root, **kw),
    **{name: (lambda root, _name=name, **kw: load_ogb(_name, root, **kw)) for name in OGB_NAMES},
    "synthetic": lambda root, **kw: planted_partition(**kw),
    "sbm": lambda root, **kw: planted_partition(**kw),
    **{name: (lambda root, _name=name, **kw: power_law_graph(*POWER_LAW_PRESETS[_name], name=_name, **kw))
       for name in POWER_LAW_PRESETS},
    **{name: (lambda root, _name=name, **kw: typed_graph(_name, **kw)) for name in TYPED_PRESETS},
}

DATASET_NAMES: tuple[str, ...] = tuple(_LOADERS)
# What loading raises for a request that cannot be met as given -- an unknown or unfit
# name (ValueError), files missing and not downloadable (OSError, DownloadError among
# them), the ogb package not installed (ImportError) -- as opposed to a bug: callers
# report these as usage errors.
LOAD_ERRORS: tuple[type[Exception], ...] = (ValueError, OSError, ImportError)
RELATIONAL_DATASETS = frozenset({"wn18rr"})   # typed edges for link prediction: no node labels
DEFAULT_DATASET = "synthetic"


def load_dataset(name: str, root: str | os.PathLike | None = None,
                 **kw: Any) -> NodeDataset | RelationalDataset:
    """Load a data set by name (case-insensitive); `kw` goes to the underlying loader.

    Real data sets are searched for as described in `gnnfuse.data.paths`; synthetic ones
    ("synthetic"/"sbm", the power-law presets and the typed ones) ignore `root`.
    """
    _check_known(name)
    return _LOADERS[name.lower()](root, **kw)


def _check_known(name: str) -> None:
    if name.lower() not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASET_NAMES)}")


def check_node_dataset_name(name: str) -> None:
    """Raise the `ValueError` `load_node_dataset` raises for a name it refuses whatever
    the files hold (an unknown name, a relational data set), without reading any: for a
    launcher to refuse it before its ranks start and each fails alike."""
    _check_known(name)
    if name.lower() in RELATIONAL_DATASETS:
        raise ValueError(f"{name} is not a node-classification data set (it is a relational one: typed "
                         "edges, no node labels)")


def load_node_dataset(name: str, root: str | os.PathLike | None = None, **kw: Any) -> NodeDataset:
    """`load_dataset` for callers that need node labels (training, benchmarks, explain).

    A relational data set is refused by name before anything is read, so the error does
    not depend on whether its files happen to be present."""
    check_node_dataset_name(name)
    dataset = load_dataset(name, root, **kw)
    if not isinstance(dataset, NodeDataset):
        raise ValueError(f"{name} is not a node-classification data set")
    return dataset
