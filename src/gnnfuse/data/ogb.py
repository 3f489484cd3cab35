"""OGB node-property data sets (ogbn-arxiv, ogbn-products, ogbn-mag) through the `ogb` package.

The files and their processing are ogb's (its ``NodePropPredDataset`` reads the raw CSV
layout, downloads what is missing and caches a processed copy); this module only finds
the folder, keeps ogb from blocking or from reaching the network unasked, and turns the
result into a `NodeDataset`. ogbn-mag is heterogeneous: its node types are laid side by
side in one typed `Graph` (``node_type``, ``edge_type`` by relation), as PyG's
``to_homogeneous`` does.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import sys
import urllib.error
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..graph import Graph
from .dataset import NodeDataset, index_mask
from .download import DownloadError
from .paths import candidate_roots, download_root

OGB_NAMES = ("ogbn-arxiv", "ogbn-products", "ogbn-mag")
SUBDIR = "ogb"
# ogb caches its processed data as a pickle that torch >= 2.6 will not load with its safe
# default (weights_only=True), so later loads would fail; gnnfuse keeps its own cache of
# plain tensors beside it, which loads safely, and calls ogb only the first time.
CACHE = "gnnfuse_node_dataset.pt"


def _node_prop_pred_dataset() -> type:
    """ogb's `NodePropPredDataset`, imported without ogb's PyPI version check.

    Importing ogb starts a thread that asks PyPI whether ogb is out of date (through the
    `outdated` package); a data loader must not reach the network unasked, so `outdated`
    is hidden while ogb is first imported (ogb skips the check when it is missing).
    """
    hidden = "outdated" not in sys.modules
    if hidden:
        sys.modules["outdated"] = None          # type: ignore[assignment]  # makes its import fail
    try:
        from ogb.nodeproppred import NodePropPredDataset
    except ImportError:
        raise ImportError("the OGB data sets are read with the ogb package, which is not installed: "
                          "pip install ogb") from None
    finally:
        if hidden:
            del sys.modules["outdated"]
    return NodePropPredDataset


def _meta(name: str) -> Any:
    """ogb's metadata row for `name` (version, download URL, ...)."""
    import pandas as pd
    import ogb.nodeproppred
    master = Path(ogb.nodeproppred.__file__).parent / "master.csv"
    return pd.read_csv(master, index_col=0, keep_default_na=False)[name]


def ogb_root(name: str, root: str | os.PathLike | None = None) -> Path:
    """The folder holding ``<folder>/ogbn_arxiv/...``: the first searched root with it
    under ``ogb/`` or directly, else ``download_root(root)/ogb`` (where ogb downloads it)."""
    folder = name.replace("-", "_")
    for base in candidate_roots(root):
        for parent in (base / SUBDIR, base):
            if (parent / folder).is_dir():
                return parent
    return download_root(root) / SUBDIR


def load_ogb(name: str, root: str | os.PathLike | None = None) -> NodeDataset:
    """Load an OGB node data set with its official split; graphs are as OGB stores them
    (ogbn-arxiv directed, ogbn-products with both directions). Missing files are
    downloaded by ogb itself (it asks before downloads over 1 GB)."""
    if name not in OGB_NAMES:
        raise ValueError(f"unknown OGB node data set {name!r}; expected one of {OGB_NAMES}")
    dataset_class = _node_prop_pred_dataset()
    meta = _meta(name)
    parent = ogb_root(name, root)
    folder = parent / name.replace("-", "_")
    release = folder / f"RELEASE_v{meta['version']}.txt"
    if folder.is_dir() and not release.exists():
        # ogb would stop and ask on stdin whether to delete the folder and download again
        raise ValueError(f"{folder} is not release {meta['version']} of {name} (no {release.name}): "
                         f"remove the folder to have ogb download it again, or put the release there")
    cache = folder / "processed" / CACHE
    if cache.is_file():
        try:
            return _from_cache(name, torch.load(cache, weights_only=True))
        except (RuntimeError, EOFError, pickle.UnpicklingError, KeyError) as error:
            # a truncated cache (earlier versions wrote it in place; a write stopped halfway) is
            # derived data: rebuilt below rather than failing every load
            print(f"rebuilding {cache}, which could not be read ({type(error).__name__}: {error})"[:300],
                  file=sys.stderr)
    if folder.is_dir():
        cache.parent.mkdir(exist_ok=True)               # ogb saves there without creating it
        _drop_unreadable_ogb_cache(folder)
    try:
        with contextlib.redirect_stdout(sys.stderr):     # ogb's progress messages: not our output
            dataset = dataset_class(name, root=str(parent))
            split = dataset.get_idx_split()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:    # ogb's download failed
        raise DownloadError(f"{name} is not in {folder} and ogb could not download it ({error}); fetch "
                            f"{meta['url']} elsewhere and unzip it into {parent}{os.sep}") from error
    result = (_flatten_hetero(name, dataset, split) if dataset.is_hetero
              else _homogeneous(name, dataset, split, meta["split"]))
    # beside its name, then renamed over it: a write stopped halfway (Ctrl-C, a full disk)
    # must leave no truncated cache for every later load to fail on. The name is fresh per
    # call: the ranks of a distributed run all load the data set at once, and with one
    # shared name a rank's rename took away the file another was about to rename
    # (FileNotFoundError, reported as a data set error)
    partial = cache.with_name(f".{cache.name}.{secrets.token_hex(4)}.partial")
    try:
        torch.save(_to_cache(result), partial)
        os.replace(partial, cache)
    finally:
        partial.unlink(missing_ok=True)         # already gone after the rename into place
    return result


def _drop_unreadable_ogb_cache(folder: Path) -> None:
    """Remove ogb's own processed pickle when gnnfuse's cache is missing beside it (a
    load stopped between the two writes, or ogb used on the folder directly): ogb would
    load it with torch's safe default and fail on it under torch >= 2.6 ("Unsupported
    operand 149"), on every later load. It is derived from ``raw/``, from which ogb
    rebuilds it; without raw files it is the only copy, so it stays and the error says why."""
    processed = folder / "processed" / "data_processed"
    if not processed.is_file():
        return
    raw = folder / "raw"
    if not (raw.is_dir() and any(raw.iterdir())):
        raise ValueError(f"{processed} is ogb's pickled copy of {folder.name}, which torch "
                         f"{torch.__version__} cannot load safely (weights_only), and {raw} holds no raw "
                         f"files to rebuild it from: put the raw files there, or remove {folder} to have ogb "
                         f"download it again")
    print(f"removing {processed}: torch {torch.__version__} cannot load ogb's pickle safely; ogb rebuilds it "
          f"from {raw}", file=sys.stderr)
    processed.unlink()


def _homogeneous(name: str, dataset: Any, split: dict[str, np.ndarray], scheme: str) -> NodeDataset:
    graph, labels = dataset[0]
    n = int(graph["num_nodes"])
    return NodeDataset(
        name=name, graph=Graph.from_edge_index(_tensor(graph["edge_index"]), n),
        x=_tensor(graph["node_feat"]).float(), y=_tensor(labels.reshape(-1)).long(),
        train_mask=index_mask(n, _tensor(split["train"])), val_mask=index_mask(n, _tensor(split["valid"])),
        test_mask=index_mask(n, _tensor(split["test"])), num_classes=dataset.num_classes,
        description=f"OGB {name}: official {scheme} split, graph as OGB stores it")


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing `array`'s memory, copied only when the array is read-only (as
    pandas may hand it out), which torch would otherwise warn about."""
    return torch.from_numpy(np.require(array, requirements="W"))


def _to_cache(dataset: NodeDataset) -> dict[str, Any]:
    """Plain tensors, numbers and strings only: what ``torch.load(weights_only=True)`` accepts."""
    g = dataset.graph
    return {"src": g.src, "dst": g.dst, "num_nodes": g.num_nodes, "edge_type": g.edge_type,
            "num_edge_types": g.num_edge_types, "node_type": g.node_type, "num_node_types": g.num_node_types,
            "x": dataset.x, "y": dataset.y, "masks": [dataset.train_mask, dataset.val_mask, dataset.test_mask],
            "num_classes": dataset.num_classes, "description": dataset.description}


def _from_cache(name: str, saved: dict[str, Any]) -> NodeDataset:
    graph = Graph(saved["src"], saved["dst"], saved["num_nodes"], edge_type=saved["edge_type"],
                  num_edge_types=saved["num_edge_types"], node_type=saved["node_type"],
                  num_node_types=saved["num_node_types"])
    train, val, test = saved["masks"]
    return NodeDataset(name=name, graph=graph, x=saved["x"], y=saved["y"], train_mask=train, val_mask=val,
                       test_mask=test, num_classes=saved["num_classes"], description=saved["description"])


def _flatten_hetero(name: str, dataset: Any, split: dict[str, dict[str, np.ndarray]]) -> NodeDataset:
    """One typed graph from ogb's per-type dictionaries: node types in sorted order, each a
    block of ids; relations numbered in ogb's sorted triplet order. Features and labels
    exist for the labelled type only (papers in ogbn-mag): other rows are zero and
    outside every mask."""
    graph, labels = dataset[0]
    types = sorted(graph["num_nodes_dict"])
    counts = [int(graph["num_nodes_dict"][t]) for t in types]
    offset = dict(zip(types, np.cumsum([0, *counts[:-1]]).tolist()))
    n = sum(counts)
    triplets = list(graph["edge_index_dict"])
    src, dst, etype = [], [], []
    for relation, triplet in enumerate(triplets):
        head, _, tail = triplet
        edges = graph["edge_index_dict"][triplet]
        src.append(edges[0] + offset[head])
        dst.append(edges[1] + offset[tail])
        etype.append(np.full(edges.shape[1], relation))
    if len(labels) != 1:
        raise ValueError(f"{name} has labels for node types {sorted(labels)}; one labelled type is supported")
    (labelled, y_typed), = labels.items()
    features = graph["node_feat_dict"][labelled]
    rows = slice(offset[labelled], offset[labelled] + features.shape[0])
    x = torch.zeros(n, features.shape[1])
    x[rows] = _tensor(features).float()
    y = torch.zeros(n, dtype=torch.long)
    y[rows] = _tensor(y_typed.reshape(-1)).long()
    masks = [index_mask(n, split[part][labelled] + offset[labelled]) for part in ("train", "valid", "test")]
    return NodeDataset(
        name=name, graph=Graph(np.concatenate(src), np.concatenate(dst), n,
                               edge_type=np.concatenate(etype), num_edge_types=len(triplets),
                               node_type=np.repeat(np.arange(len(types)), counts), num_node_types=len(types)),
        x=x, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2], num_classes=dataset.num_classes,
        description=f"OGB {name} (heterogeneous: node types {', '.join(types)} as one typed graph, relations "
                    f"{', '.join('/'.join(t) for t in triplets)}); features and labels for {labelled} only, "
                    "zero elsewhere; official split over them")
