"""The gnn-benchmark ``.npz`` graphs (Shchur et al., "Pitfalls of GNN evaluation").

Unlike Planetoid these are the raw *directed* citation graphs with no predefined split,
which makes them a second, independent loader path and a real directed graph for tests.
PyG's ``read_npz`` (behind ``CitationFull``, ``Amazon``, ``Coauthor``) symmetrises the
same files, so numbers from it are not comparable; the data set's description (``gnnfuse
info``) says so, and ``undirected=True`` gives PyG's graph. ``CitationFull`` itself reads
other files (graph2gauss's: its "Cora" is the 19,793-node Cora-Full), so it is no oracle
for these.
"""
from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp
import torch

from ..graph import Graph
from .dataset import DataFileError, NodeDataset, reading, row_normalize
from .paths import find_data_file


REQUIRED_ARRAYS = tuple(f"{prefix}_{part}" for prefix in ("adj", "attr") for part in ("data", "indices", "indptr",
                                                                                        "shape")) + ("labels",)


def _csr(parts, prefix: str) -> sp.csr_matrix:
    """The CSR matrix stored as ``<prefix>_data/_indices/_indptr/_shape``, fully checked:
    scipy's constructor does not look at the column ids, so one out of range surfaced
    later, converting the matrix, as a bare ValueError naming neither file nor array."""
    matrix = sp.csr_matrix((parts[f"{prefix}_data"], parts[f"{prefix}_indices"],
                            parts[f"{prefix}_indptr"]), shape=tuple(parts[f"{prefix}_shape"]))
    try:
        matrix.check_format(full_check=True)
    except ValueError as error:
        raise ValueError(f"the {prefix}_* arrays are not a valid CSR matrix: {error}") from error
    return matrix


def load_npz(name: str, root: str | os.PathLike | None = None, *, undirected: bool = False) -> NodeDataset:
    """Load ``gnn-benchmark/<name>.npz`` (e.g. "cora", "citeseer"); masks are None.

    The graph keeps the file's direction (row = source) with duplicates and self loops
    removed: cora has 5429 edges, citeseer 4591 (it stores 124 self loops). A row is the
    *cited* paper, as in Cora's ``.cites`` file ("cited citing"): cora's paper "35", cited
    166 times, is the source of 166 edges, and no paper is the target of more than 5 (its
    references within cora): messages flow from a paper to the papers citing it.
    `undirected=True` symmetrises instead (cora 10556 -- the Planetoid graph -- citeseer
    9072). Features are row-normalised; use `random_split` for a split.
    """
    path = find_data_file("gnn-benchmark", f"{name}.npz", root)
    with reading(path, "a gnn-benchmark graph (adj_*, attr_* and labels arrays)"), \
            np.load(path, allow_pickle=True) as parts:
        _check_arrays(path, parts.files)
        adjacency = _csr(parts, "adj")
        attributes = _csr(parts, "attr")
        labels = np.asarray(parts["labels"], dtype=np.int64)
        nodes = {"adj rows": adjacency.shape[0], "adj columns": adjacency.shape[1],
                 "attr rows": attributes.shape[0], "labels": labels.shape[0]}
        if len(set(nodes.values())) != 1 or labels.ndim != 1:
            raise DataFileError(f"{path}: its arrays disagree on the node count ("
                                + ", ".join(f"{k} {v}" for k, v in nodes.items()) + ")")
    graph = Graph.from_scipy(adjacency)
    graph = graph.to_undirected() if undirected else _deduplicate(graph)
    graph = graph.remove_self_loops()
    x = row_normalize(torch.from_numpy(attributes.toarray().astype(np.float32)))
    kind = ("undirected (symmetrised, as PyG's read_npz reads it)" if undirected else
            f"directed, {graph.num_edges} citations (PyG's read_npz -- CitationFull, Amazon, Coauthor -- "
            f"symmetrises this file; load_npz({name!r}, undirected=True) gives that graph)")
    return NodeDataset(
        name=f"{name}-npz", graph=graph, x=x, y=torch.from_numpy(labels),
        train_mask=None, val_mask=None, test_mask=None, num_classes=int(labels.max()) + 1,
        description=f"gnn-benchmark {name}: raw citation graph, {kind}; row-normalised "
                    f"binary features, no predefined split (see random_split); read from {path}")


def _check_arrays(path: os.PathLike, present: list[str]) -> None:
    """Refuse a readable archive lacking arrays this loader reads, naming them: the
    format's variants (dense ``attr_matrix``, multi-label ``labels_*`` CSR parts, no
    attributes at all) are valid files, which the parsers' KeyError made look corrupted."""
    missing = [key for key in REQUIRED_ARRAYS if key not in present]
    if missing:
        raise DataFileError(f"{path} lacks the array(s) {', '.join(missing)} (it holds {', '.join(present)}): "
                            "load_npz reads a CSR adjacency (adj_*), CSR attributes (attr_*) and one integer "
                            "label per node (labels); dense attr_matrix or multi-label labels_* are not read")


def _deduplicate(graph: Graph) -> Graph:
    """Keep the first of each repeated (src, dst) edge, preserving edge order."""
    key = graph.src * max(graph.num_nodes, 1) + graph.dst
    _, first = np.unique(key.numpy(), return_index=True)
    keep = torch.zeros(graph.num_edges, dtype=torch.bool)
    keep[torch.from_numpy(np.sort(first))] = True
    return Graph(graph.src[keep], graph.dst[keep], graph.num_nodes)
