"""Edge lists from other libraries' graph objects (scipy sparse, networkx, torch sparse
adjacency, torch_sparse's SparseTensor, PyG's EdgeIndex).

Kept apart from `Graph` so the class itself depends only on torch; networkx is imported
only when a networkx graph is actually passed in, and torch_sparse and PyG are
recognised by type name, never imported.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch


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
    coo = stored_entries(matrix)
    return coo.row.astype(np.int64), coo.col.astype(np.int64), rows


def stored_entries(matrix: Any) -> Any:
    """``matrix.tocoo()``: its stored entries, each an edge. A ValueError for a BSR
    matrix, which stores the zeros of every block it keeps, and lists them: read as
    edges, the diagonal blocks' zeros became self loops of weight 0 and GCNConv added no
    unit loop there (1.13 off the same matrix in CSR), as a torch BSR adj_t's did before
    `check_adjacency_shape` refused those."""
    if matrix.format == "bsr":
        raise ValueError("a scipy BSR matrix stores the zeros of its blocks, which would read as edges: pass "
                         "matrix.tocsr() after dropping them (csr.eliminate_zeros()), or a COO/CSR/CSC matrix")
    return matrix.tocoo()


def scipy_weights(matrix: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(``[2, E]`` edge_index, ``[E]`` weights) of a scipy sparse matrix (row = source)
    whose stored values are not all 1, one edge per stored entry as `scipy_edges` makes
    them; None when every value is 1. Why: given to a layer, a matrix's values are its
    edge weights, as a torch sparse ``adj_t``'s are (`adj_t_edges`), and reading only
    its pattern would drop them without a word."""
    coo = stored_entries(matrix)
    if not coo.nnz or bool((coo.data == 1).all()):
        return None
    edge_index = torch.from_numpy(np.stack([coo.row.astype(np.int64), coo.col.astype(np.int64)]))
    return edge_index, torch.from_numpy(np.asarray(coo.data))


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


def is_sparse_adjacency(obj: Any) -> bool:
    """A torch sparse tensor or a torch_sparse ``SparseTensor``: PyG's ``adj_t``."""
    if isinstance(obj, torch.Tensor):
        return obj.layout is not torch.strided
    return type(obj).__name__ == "SparseTensor" and type(obj).__module__.split(".")[0] == "torch_sparse"


def is_pyg_edge_index(obj: Any) -> bool:
    """PyG's ``EdgeIndex``: a tensor subclass holding a plain ``[2, E]`` tensor."""
    return isinstance(obj, torch.Tensor) and type(obj).__name__ == "EdgeIndex" and hasattr(obj, "as_tensor")


def index_tensors(obj: Any) -> list[torch.Tensor]:
    """The plain tensors holding the indices (and values) of a torch-side graph input:
    what changes when its contents change (see `index_cache`). An ``EdgeIndex`` counts
    twice: a write through it (``ei[1, :5] = 0``) moves its own version counter, not the
    plain tensor's it holds, and a write to that tensor moves only the latter's."""
    if is_pyg_edge_index(obj):
        return [obj.as_tensor(), obj]
    if not is_sparse_adjacency(obj):
        return [obj]
    if not isinstance(obj, torch.Tensor):             # torch_sparse.SparseTensor
        return [t for t in obj.coo() if t is not None]
    if obj.layout is torch.sparse_coo:
        return [obj._indices(), obj._values()]
    if obj.layout is torch.sparse_csr:
        return [obj.crow_indices(), obj.col_indices(), obj.values()]
    if obj.layout is torch.sparse_csc:
        return [obj.ccol_indices(), obj.row_indices(), obj.values()]
    raise ValueError(f"a sparse adjacency must be a sparse COO, CSR or CSC tensor, got layout {obj.layout}")


def check_adjacency_shape(adj_t: torch.Tensor) -> None:
    """A ValueError unless a torch sparse ``adj_t`` is a 2-D COO, CSR or CSC matrix with
    scalar entries. A blocked layout (BSR, BSC) stores the zeros of every block, which a
    read of its stored positions would take for edges (the diagonal blocks' zeros became
    self loops of weight 0, and GCN then added no unit loop there); a batched one has no
    single graph to read."""
    if adj_t.layout not in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc):
        raise ValueError(f"a sparse adjacency must be a sparse COO, CSR or CSC tensor, got layout {adj_t.layout}")
    if adj_t.dim() != 2 or adj_t.dense_dim() != 0:
        raise ValueError(f"a sparse adjacency must be 2-D with scalar entries, got shape {list(adj_t.shape)}")


def declared_size(obj: Any) -> tuple[int | None, int | None] | None:
    """(num_src, num_dst) that a sparse adj_t (its shape, transposed) or an ``EdgeIndex``
    declares, as PyG infers a layer's ``size`` from them; None for an input that declares
    no counts. An ``EdgeIndex`` may set one of its sparse sizes only: the other entry is
    None, which the layer reads from the features as PyG does (`arguments.size_entries`);
    an ``EdgeIndex(..., sparse_size=(None, 4))`` beside ``(x_src, None)`` was refused,
    its 4 destinations met with the 5 of x_src, where PyG gives 4 rows."""
    if is_sparse_adjacency(obj):
        shape = tuple(obj.shape) if isinstance(obj, torch.Tensor) else tuple(obj.sparse_sizes())
        return (shape[1], shape[0]) if len(shape) == 2 else None     # adj_t_edges names a wrong rank
    if is_pyg_edge_index(obj) and obj.sparse_size() != (None, None):
        return tuple(obj.sparse_size())
    return None


def check_bipartite_adj_t(adj_t: Any, num_nodes: int, num_src_nodes: int) -> None:
    """A ValueError naming both unless ``adj_t`` (PyG's bipartite adjacency, rows =
    destinations, columns = sources) is [num_nodes, num_src_nodes]: a mis-shaped one
    whose stored entries happen to fit would otherwise be read silently."""
    shape = list(adj_t.shape) if isinstance(adj_t, torch.Tensor) else list(adj_t.sparse_sizes())
    if shape != [num_nodes, num_src_nodes]:
        raise ValueError(f"the sparse adj_t has shape {shape} (destinations x sources) but the bipartite graph "
                         f"has {num_src_nodes} source and {num_nodes} destination nodes (adj_t must be "
                         f"{[num_nodes, num_src_nodes]})")


def coalesced(adj_t: Any) -> Any:
    """A torch COO ``adj_t`` with the entries it stores twice at one position summed into
    one, as the matrix it stands for holds them; other inputs unchanged. PyG's layers that
    aggregate through a sparse matmul (``spmm``) read a COO adj_t so (the conversion to
    CSR coalesces): there two stored 1s are one neighbour of weight 2, which a mean or max
    counts once, not two edges. PyG's GAT and GATv2 read it so too (adding self loops
    coalesces it; without them PyG refuses it), one edge where gnnfuse's pattern-only
    layers see the value 2 and refuse it. GIN's sum, which is the same either way, keeps
    the stored entries, as `adj_t_edges` does. A scipy matrix storing a position twice
    (the README reads its values as a torch adj_t's) is summed so too, by scipy's own
    ``sum_duplicates``: read as two edges, SAGE's mean counted that neighbour twice where
    the same matrix converted to CSR (which sums them) was refused."""
    if isinstance(adj_t, torch.Tensor) and adj_t.layout is not torch.strided:
        check_adjacency_shape(adj_t)
    if isinstance(adj_t, torch.Tensor) and adj_t.layout is torch.sparse_coo:
        if not adj_t.is_coalesced():
            return adj_t.coalesce()
        if not _row_major(adj_t):      # flagged coalesced, but not
            merged = torch.sparse_coo_tensor(adj_t._indices(), adj_t._values(), adj_t.shape).coalesce()
            if merged._nnz() < adj_t._nnz():
                raise ValueError("the COO adj_t is flagged coalesced but stores a position twice (PyG's "
                                 "to_edge_index, GCNConv and GATConv set the flag in place without merging): PyG "
                                 "reads such a tensor as two edges in some layers (GraphConv's spmm) and as their "
                                 "sum in others, so gnnfuse refuses it; merge it first (torch.sparse_coo_tensor("
                                 "adj_t._indices(), adj_t._values(), adj_t.shape).coalesce()) or pass an edge_index")
            return merged               # stored out of order alone: the same matrix
    if sp.issparse(adj_t) and adj_t.format in ("coo", "csr", "csc") and not adj_t.has_canonical_format:
        coo = adj_t.tocoo()
        keys = coo.row.astype(np.int64) * coo.shape[1] + coo.col
        if np.unique(keys).size < keys.size:      # a position stored twice (unsorted alone keeps its order)
            summed = adj_t.copy()      # the caller's matrix stays as it is
            summed.sum_duplicates()
            return summed
    return adj_t


def _row_major(adj_t: torch.Tensor) -> bool:
    """Whether a COO tensor flagged coalesced stores each position once in row-major
    order, as a coalesced one does. PyG sets the flag in place without merging anything
    (``to_edge_index``, ``GCNConv`` and ``GATConv`` call ``adj._coalesced_(True)``), and
    ``sparse_coo_tensor(..., is_coalesced=True)`` takes the caller's word. A position
    stored twice was read as two edges (0.16 off PyG's GAT, 1.3 off SAGE's mean, where
    PyG sums it), and summed it was 0.5-2 off PyG's GraphConv mean and max (whose spmm
    keeps the two): PyG disagrees with itself, so `coalesced` refuses it. One host read."""
    rows, cols = adj_t._indices()
    if rows.numel() < 2:
        return True
    keys = rows * adj_t.shape[1] + cols
    return bool((keys[1:] > keys[:-1]).all())


def adj_t_edges(adj_t: Any) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int], bool, torch.Tensor | None]:
    """(src, dst, (num_dst, num_src), grouped by dst, stored values) of PyG's transposed adjacency
    ``adj_t``: a stored entry at (i, j) is the edge j -> i, as PyG's layers read a sparse
    ``adj_t``. Its shape is (rows, columns) = (destinations, sources); a bipartite
    graph's is rectangular.

    One edge per stored entry, in storage order (duplicates of an uncoalesced COO tensor
    stay separate edges). "Grouped" says storage is row-major (CSR, SparseTensor or a
    coalesced COO tensor), so the edges already come grouped by destination; a CSC
    tensor, the same matrix stored column by column (PyG's SAGE, GIN and GraphConv take
    it), comes grouped by source. The values are for `check_unit_values`, once the
    caller has checked the shape.
    """
    if isinstance(adj_t, torch.Tensor):
        check_adjacency_shape(adj_t)
        rows, cols = adj_t.shape
        if adj_t.layout is torch.sparse_csr:
            crow, col, value = adj_t.crow_indices(), adj_t.col_indices(), adj_t.values()
            row = torch.repeat_interleave(torch.arange(rows, device=crow.device), crow.diff())
            grouped = True
        elif adj_t.layout is torch.sparse_csc:
            ccol, row, value = index_tensors(adj_t)
            col = torch.repeat_interleave(torch.arange(cols, device=ccol.device), ccol.diff())
            grouped = False
        else:
            (row, col), value = index_tensors(adj_t)
            grouped = adj_t.is_coalesced() and _row_major(adj_t)
            # copied: the indices share the sparse tensor's version counter, which PyG's
            # own layers move (``adj_t._coalesced_(True)`` in ``to_edge_index``) without
            # changing an edge; a graph on them would then be refused as edited
            row, col = row.clone(), col.clone()
    else:                                             # torch_sparse.SparseTensor, always row-major
        row, col, value = adj_t.coo()
        rows, cols = adj_t.sparse_sizes()
        grouped = True
    return col, row, (rows, cols), grouped, value


def check_unit_values(value: torch.Tensor | None, learnt: bool = False) -> None:
    """Every stored value of a pattern-only ``adj_t`` must be 1: PyG would use other values
    as edge weights, and silently dropping them would change the result. ``learnt``: the
    adj_t takes a gradient, which its pattern alone would silently never give."""
    if learnt:
        raise ValueError("the sparse adj_t's values require a gradient, but gnnfuse reads only its pattern here: "
                         "pass the edges as edge_index and the weights as edge_weight to a layer that takes them")
    if value is not None and value.numel() and not bool((value == 1).all()):
        raise ValueError("the sparse adj_t holds values other than 1, which PyG would use as edge weights (a "
                         "COO entry stored twice counts as 2); gnnfuse reads only its pattern: pass the edges "
                         "as edge_index and the weights as edge_weight to a layer that takes them")
