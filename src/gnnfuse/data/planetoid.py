"""Cora, CiteSeer and PubMed in the original Planetoid ``ind.*`` pickle format.

Reproduces the preprocessing of the GCN paper and PyG's `Planetoid` so that accuracies
are comparable with published numbers: public split, row-normalised features, graph
symmetrised, de-duplicated and without self loops.
"""
from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from ..graph import Graph
from ..user_warning import warn
from .dataset import DataFileError, NodeDataset, index_mask, reading, row_normalize
from .planetoid_source import ensure_planetoid

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")
NUM_VAL = 500


_HOLDS = {"x": "feature matrix", "tx": "feature matrix", "allx": "feature matrix", "y": "one-hot label array",
          "ty": "one-hot label array", "ally": "one-hot label array", "graph": "adjacency dict",
          "test.index": "test node ids, one per line"}
_LABELS = ("y", "ty", "ally")


def _read(folder: Path, name: str, part: str):
    path = folder / f"ind.{name}.{part}"
    with reading(path, f"Planetoid {name}'s {_HOLDS[part]}"):
        if part == "test.index":
            return np.loadtxt(path, dtype=np.int64).reshape(-1)
        with open(path, "rb") as f, warnings.catch_warnings():
            # the pickles name scipy's long-deprecated `scipy.sparse.csr` module
            warnings.simplefilter("ignore", DeprecationWarning)
            value = pickle.load(f, encoding="latin1")      # written by Python 2
        # any scipy sparse matrix or array (sp.issparse): a csr_array is no spmatrix
        matrix = isinstance(value, np.ndarray) or sp.issparse(value)
        if not (isinstance(value, dict) if part == "graph" else matrix and len(value.shape) == 2):
            raise DataFileError(f"{path} should hold a {_HOLDS[part]}, holds a {type(value).__name__}"
                                f"{' of shape ' + str(value.shape) if hasattr(value, 'shape') else ''}")
        # labels dense, as PyG's reader makes every part: stored sparse, len() and the
        # row assignment of the test labels failed on them with errors naming no file
        return _dense(value) if part in _LABELS else value


def _check_rows(folder: Path, name: str, parts: dict[str, object]) -> None:
    """The files' rows line up: features and labels of the same nodes, one width of
    features and one of labels; a short ``allx`` would shift the test rows onto other
    nodes' ids without a word."""
    pairs = [("x", "y"), ("tx", "ty"), ("allx", "ally"), ("ty", "test.index")]
    for a, b in pairs:
        if a in parts and b in parts and parts[a].shape[0] != parts[b].shape[0]:
            raise DataFileError(f"{folder}: ind.{name}.{a} has {parts[a].shape[0]} rows but ind.{name}.{b} has "
                                f"{parts[b].shape[0]}; they describe the same nodes: one file is truncated or "
                                "from another copy")
    for kind in (("x", "tx", "allx"), ("y", "ty", "ally")):
        widths = {p: parts[p].shape[1] for p in kind if p in parts}
        if len(set(widths.values())) > 1:
            raise DataFileError(f"{folder}: Planetoid {name}'s files disagree on the width: "
                                + ", ".join(f"ind.{name}.{p} has {w} columns" for p, w in widths.items()))


def _dense(m) -> np.ndarray:
    return np.asarray(m.todense() if sp.issparse(m) else m, dtype=np.float32)


def _graph_from_dict(path: Path, name: str, adjacency: dict, num_nodes: int) -> Graph:
    """The symmetrised simple graph of the adjacency dict; a dict naming a node the other
    files do not have (an id past the test ids: a graph file of another data set or copy)
    is a `DataFileError` naming the file, not `Graph`'s bare ValueError."""
    with reading(path, f"Planetoid {name}'s adjacency dict over the {num_nodes} nodes its other files hold"):
        return _symmetrised(adjacency, num_nodes)


def _symmetrised(adjacency: dict, num_nodes: int) -> Graph:
    src = np.repeat(np.fromiter(adjacency.keys(), dtype=np.int64),
                    [len(v) for v in adjacency.values()])
    dst = np.fromiter((u for v in adjacency.values() for u in v), dtype=np.int64, count=len(src))
    return Graph(src, dst, num_nodes).to_undirected().remove_self_loops()


def load_planetoid(name: str, root: str | os.PathLike | None = None) -> NodeDataset:
    """Load "cora", "citeseer" or "pubmed" with the standard public split.

    Test rows of ``tx``/``ty`` are put at the ids in ``test.index``; citeseer's test ids
    without a feature row (isolated papers) get zero features and label 0, as in PyG.
    pubmed's ``allx`` is not among the files fetched here: without it, its topology, labels
    and split are real, but `x` is seeded random (a warning says so) and the 1060 real
    rows are in `x_known`; a folder that holds ``ind.pubmed.allx`` gives the real `x`.
    Files that do not parse, or whose rows do not line up, raise `DataFileError`.
    All files are read from one folder; when no searched root holds them all, the
    missing ones are downloaded first (`ensure_planetoid`).
    """
    name = name.lower()
    if name not in PLANETOID_NAMES:
        raise ValueError(f"unknown Planetoid data set {name!r}; expected one of {PLANETOID_NAMES}")
    folder = ensure_planetoid(name, root)       # every file from this one folder
    y_train, ty, ally = (_read(folder, name, p) for p in ("y", "ty", "ally"))
    x_train, tx = (_read(folder, name, p) for p in ("x", "tx"))
    test_index = _read(folder, name, "test.index")
    adjacency = _read(folder, name, "graph")
    # pubmed's allx is not among the published files we fetch; a copy holding it is read
    allx = _read(folder, name, "allx") if name != "pubmed" or (folder / "ind.pubmed.allx").exists() else None
    _check_rows(folder, name, {"x": x_train, "y": y_train, "tx": tx, "ty": ty, "ally": ally,
                               "test.index": test_index[:, None], **({"allx": allx} if allx is not None else {})})

    first_test, last_test = int(test_index.min()), int(test_index.max())
    if first_test != len(ally):
        raise ValueError(f"ind.{name}: test ids start at {first_test}, expected right after "
                         f"the {len(ally)} rows of ally")
    num_nodes = first_test + (last_test - first_test + 1)
    labels_test = np.zeros((last_test - first_test + 1, ty.shape[1]), dtype=np.float32)
    labels_test[test_index - first_test] = ty
    labels = np.concatenate([_dense(ally), labels_test])
    y = torch.from_numpy(labels.argmax(axis=1)).long()

    x_test = np.zeros((last_test - first_test + 1, tx.shape[1]), dtype=np.float32)
    x_test[test_index - first_test] = _dense(tx)
    if allx is None:
        x, x_known, known = _pubmed_features(x_train, x_test, first_test, num_nodes, test_index)
    else:
        x = torch.from_numpy(np.concatenate([_dense(allx), x_test]))
        x, x_known, known = row_normalize(x), None, None

    num_train = len(y_train)
    description = (f"Planetoid {name}: public split ({num_train} train / {NUM_VAL} val / "
                   f"{len(test_index)} test), row-normalised features, undirected graph; read from {folder}")
    if known is not None:
        description += "; FEATURES ARE RANDOM (ind.pubmed.allx missing), real rows in x_known"
    return NodeDataset(
        name=name, graph=_graph_from_dict(folder / f"ind.{name}.graph", name, adjacency, num_nodes), x=x, y=y,
        train_mask=index_mask(num_nodes, np.arange(num_train)),
        val_mask=index_mask(num_nodes, np.arange(num_train, num_train + NUM_VAL)),
        test_mask=index_mask(num_nodes, test_index),
        num_classes=labels.shape[1], features_partial=known is not None,
        description=description, x_known=x_known, x_known_mask=known)


def _pubmed_features(x_train, x_test: np.ndarray, first_test: int, num_nodes: int,
                     test_index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(random x, real partial x, mask of real rows) for pubmed, whose allx is missing."""
    width = x_test.shape[1]
    x_known = torch.zeros(num_nodes, width)
    x_known[:x_train.shape[0]] = torch.from_numpy(_dense(x_train))
    x_known[first_test:] = torch.from_numpy(x_test)
    known = index_mask(num_nodes, np.concatenate([np.arange(x_train.shape[0]), test_index]))
    warn(
        f"pubmed: ind.pubmed.allx is not in the folder read, so x holds SEEDED RANDOM features for all "
        f"{num_nodes} nodes (topology, labels and split are real; the {int(known.sum())} real "
        "feature rows are in dataset.x_known[dataset.x_known_mask]). Accuracies are not "
        "comparable with published pubmed results.", UserWarning)
    generator = torch.Generator().manual_seed(0)
    x = row_normalize(torch.rand(num_nodes, width, generator=generator))
    return x, row_normalize(x_known), known
