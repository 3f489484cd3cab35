"""Edge lists from other libraries' graph objects (scipy sparse, networkx).

Kept apart from `Graph` so the class itself depends only on torch; networkx is imported
only when a networkx graph is actually passed in.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp


def scipy_edges(matrix: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """(src, dst, num_nodes) of a square scipy sparse matrix: one edge per stored entry.

    Edges come in `matrix.tocoo()` order and stored duplicates stay separate edges, so a
    COO round trip (`Graph.to_scipy`) gives back the same edge ids. Explicitly stored
    zeros are edges too: the sparsity pattern, not the values, defines the graph.
    """
    if not sp.issparse(matrix):
        raise ValueError(f"expected a scipy sparse matrix or array, got {type(matrix).__name__}")
    rows, cols = matrix.shape
    if rows != cols:
        raise ValueError(f"adjacency matrix must be square (row = source, column = target), got shape {matrix.shape}")
    coo = matrix.tocoo()
    return coo.row.astype(np.int64), coo.col.astype(np.int64), rows


def networkx_edges(g: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """(src, dst, num_nodes) of a networkx graph.

    Vertices are numbered in `g.nodes` iteration order (so 0..n-1 integer graphs built in
    order keep their ids). Multi-edges stay separate edges. An undirected graph yields each
    edge in both directions: first every edge as `g.edges` lists it, then the reverses of
    all non-loop edges (a self loop appears once).
    """
    index = {node: i for i, node in enumerate(g.nodes)}
    pairs = np.array([(index[u], index[v]) for u, v in g.edges()], dtype=np.int64).reshape(-1, 2)
    src, dst = pairs[:, 0], pairs[:, 1]
    if not g.is_directed():
        loops = src == dst
        src, dst = np.concatenate([src, dst[~loops]]), np.concatenate([dst, src[~loops]])
    return src, dst, len(index)
