"""The small containers loaders return, and the split helper shared by them."""
from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from ..graph import Graph


class DataFileError(ValueError):
    """A data file that is there but cannot be read as what it should hold (truncated,
    of another format, rows that do not line up): a usage error naming the file."""


@contextlib.contextmanager
def reading(path: str | os.PathLike, holds: str) -> Iterator[None]:
    """Report any failure to parse ``path`` as a `DataFileError` naming it and what it
    should hold: the parsers' own errors (a truncated pickle's UnpicklingError, a zip's
    BadZipFile, numpy's reshape) name neither."""
    try:
        yield
    except DataFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the parser raised, the file is the cause
        raise DataFileError(f"{path} cannot be read as {holds} ({type(exc).__name__}: {exc}); the file may be "
                            "truncated or corrupted: replace it with a fresh copy") from exc


@dataclass(frozen=True)
class NodeDataset:
    """A node-classification data set: one graph, features, labels and an optional split.

    `features_partial` marks data sets whose real features are incomplete (pubmed here):
    `x` is then a stand-in, and the real rows we do have are `x_known[x_known_mask]`.
    """
    name: str
    graph: Graph
    x: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor | None
    val_mask: torch.Tensor | None
    test_mask: torch.Tensor | None
    num_classes: int
    features_partial: bool = False
    description: str = ""
    x_known: torch.Tensor | None = None
    x_known_mask: torch.Tensor | None = None

    @property
    def num_features(self) -> int:
        return self.x.shape[1]


@dataclass(frozen=True)
class RelationalDataset:
    """A multi-relational graph (knowledge-graph style) without features or labels.

    `graph` holds the training triples as typed edges head -> tail; `entity_ids[i]` and
    `relation_names[r]` name vertex i and relation r; the triples of each split are
    ``[T, 3]`` int64 tensors of (head, relation, tail).
    """
    name: str
    graph: Graph
    entity_ids: list[str]
    relation_names: list[str]
    train_triples: torch.Tensor
    valid_triples: torch.Tensor
    test_triples: torch.Tensor
    description: str = ""


def row_normalize(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to sum 1 (all-zero rows stay zero), the usual GCN preprocessing."""
    total = x.sum(dim=1, keepdim=True)
    return x / torch.where(total == 0, torch.ones_like(total), total)


def index_mask(num_nodes: int, index: np.ndarray | torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[torch.as_tensor(index, dtype=torch.int64)] = True
    return mask


def random_split(dataset: NodeDataset, num_train_per_class: int = 20, num_val: int = 500,
                 num_test: int = 1000, seed: int = 0) -> NodeDataset:
    """A copy of `dataset` with a seeded Planetoid-style split.

    `num_train_per_class` random nodes of every class train (balanced even when classes
    are not); `num_val` then `num_test` further random nodes validate and test.
    """
    y = dataset.y.cpu().numpy()
    rng = np.random.default_rng(seed)
    train = []
    for c in range(dataset.num_classes):
        members = np.flatnonzero(y == c)
        if len(members) < num_train_per_class:
            raise ValueError(f"class {c} of {dataset.name} has {len(members)} nodes, "
                             f"fewer than num_train_per_class={num_train_per_class}")
        train.append(rng.choice(members, num_train_per_class, replace=False))
    train = np.concatenate(train) if train else np.zeros(0, dtype=np.int64)
    rest = rng.permutation(np.setdiff1d(np.arange(len(y)), train))
    if len(rest) < num_val + num_test:
        raise ValueError(f"{dataset.name} has {len(rest)} nodes left after training, "
                         f"fewer than num_val + num_test = {num_val + num_test}")
    n = len(y)
    return dataclasses.replace(dataset, train_mask=index_mask(n, train),
                               val_mask=index_mask(n, rest[:num_val]),
                               test_mask=index_mask(n, rest[num_val:num_val + num_test]))
