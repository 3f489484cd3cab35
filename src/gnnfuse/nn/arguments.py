"""Checks of the ``forward`` arguments that PyG's layers take and gnnfuse's handle
differently or not yet.

Every layer's ``forward`` keeps PyG's positional order, so a PyG call such as
``conv(x, edge_index, edge_weight)`` never binds a value to a parameter of another
meaning. A parameter PyG has and gnnfuse does not implement is still accepted in its
place, and a value it cannot honour fails, naming it, instead of being ignored.
"""
from __future__ import annotations

import functools
import operator
from typing import Any, Callable

import scipy.sparse as sp
import torch

from ..graph.convert import check_adjacency_shape, coalesced, is_sparse_adjacency, scipy_weights
from ..ir.ops.movement import reduce_rows


def node_features(x: Any, layer: str) -> torch.Tensor:
    """``x`` itself, after checking it is one [N, F] tensor rather than PyG's bipartite
    ``(x_src, x_dst)`` pair, which only the layers that take it in PyG's form do (SAGE,
    GraphConv, GIN, GAT, GATv2: `node_pair`)."""
    if isinstance(x, (tuple, list)):
        raise NotImplementedError(
            f"{layer}: bipartite input (a pair (x_src, x_dst) of feature tensors) is not supported yet "
            "(gnnfuse issue #12); pass one [num_nodes, F] tensor for a graph whose sources and "
            "destinations are the same vertices")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{layer}: x must be a [num_nodes, F] tensor, got {type(x).__name__}")
    if x.dim() < 2:     # NGCF's ``x + s`` broadcast a [N] x against [N, 1] into an [N, N] matrix, silently
        raise ValueError(f"{layer}: x must be a [num_nodes, F] tensor, got shape {list(x.shape)}; a single "
                         "feature per node is x.unsqueeze(-1)")
    if x.dim() > 2:
        raise NotImplementedError(f"{layer}: node features of shape {list(x.shape)} (a batch of feature "
                                  "matrices on one graph, PyG's static graphs) are not supported by this "
                                  "layer; pass one [num_nodes, F] tensor")
    return x


# A neighbour sum of boolean features is their logical or in PyG's scatter (GINConv gives
# a result from it) and their count in torch's sum: a compiled layer refused it only deep
# in its program, naming gnnfuse's own line (conv.py's ``sum([u.h for u in v.innbs])``).
_BOOL_FEATURES = ("{layer}: {name} has dtype torch.bool; a sum of boolean features over neighbours is their logical "
                  "or in PyG's scatter and their count in torch, so gnnfuse takes no boolean features: convert "
                  "them first, e.g. {name}.float()")


def floating_node_features(x: Any, layer: str) -> torch.Tensor:
    """`node_features`, refusing a tensor that is not floating-point. The normalising
    layers (GCN, APPNP, SGC, TAG, Cheb) build their coefficients (``deg^-1/2``, Laplacian
    factors) in ``x``'s dtype, where an integer or bool dtype truncates them to 0: APPNP
    returned wrong values without an error. PyG either raises or promotes, depending on
    the layer and on ``edge_weight``; converting is the caller's choice of precision."""
    x = node_features(x, layer)
    if not x.is_floating_point():
        raise TypeError(f"{layer}: x must be a floating-point tensor, got dtype {x.dtype} (its normalisation "
                        "coefficients would be built in that dtype and truncated); convert it first, e.g. "
                        "x.float()")
    return x


def over_feature_batches(forward: Callable) -> Callable:
    """A layer ``forward`` that also takes PyG's static-graph input: node features
    ``[B, N, F]``, B feature matrices on one N-vertex graph, giving ``[B, N, F']``.

    Each matrix runs through the layer on its own and the outputs are stacked -- exactly
    the per-matrix result, whatever the layer computes. Only for layers whose PyG
    counterpart accepts such input; the others refuse it in `node_features`. An empty
    batch (B = 0) is refused by name: there is no matrix to run, so no output width
    (torch's "stack expects a non-empty TensorList" said nothing of the input). So is any
    batch of a layer built with ``node_dim=0``: PyG's such layer propagates over dim 0 of
    [B, N, F], not over each matrix's N vertices, so running the matrices would be a
    silently different answer.
    """
    @functools.wraps(forward)
    def run(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() == 3:
            if getattr(self, "node_dim", -2) == 0:
                raise ValueError(f"{type(self).__name__}: built with node_dim=0, which makes dim 0 of node features "
                                 f"of shape {list(x.shape)} the node axis in PyG; gnnfuse takes [B, N, F] as B feature "
                                 "matrices (nodes on dim -2): build the layer with node_dim=-2 (the default)")
            if not x.shape[0]:
                raise ValueError(f"{type(self).__name__}: node features of shape {list(x.shape)} are a batch of no "
                                 "feature matrices (B = 0); pass at least one [N, F] matrix")
            return torch.stack([forward(self, features, *args, **kwargs) for features in x.unbind(0)])
        return forward(self, x, *args, **kwargs)
    return run


def node_pair(x: Any, size: Any, layer: str) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, int] | None]:
    """PyG's ``x`` of a layer that takes bipartite input: ``(x_src, x_dst, sizes)``.

    One [N, F] tensor is both tables of a graph with one vertex set (``sizes`` None;
    ``size`` may only be None or (N, N), as PyG checks). A pair ``(x_src, x_dst)`` is a
    bipartite graph's source and destination tables, ``sizes = (num_src, num_dst)``;
    ``x_dst`` may be None (the layer then has no root term), and the destination count
    comes from ``size`` or, as in PyG, defaults to the source count.
    """
    if not isinstance(x, (tuple, list)):
        x = node_features(x, layer)
        if x.dtype == torch.bool:
            raise TypeError(_BOOL_FEATURES.format(layer=layer, name="x"))
        if size is not None and any(n is not None and n != x.shape[0] for n in size_entries(size, layer)):
            raise ValueError(f"{layer}: size={tuple(size)} does not fit x with {x.shape[0]} rows; pass "
                             "(x_src, x_dst) for a bipartite graph")
        return x, x, None
    if len(x) != 2:
        raise ValueError(f"{layer}: bipartite input is a pair (x_src, x_dst), got {len(x)} tensors")
    x_src, x_dst = x
    if not isinstance(x_src, torch.Tensor) or not (x_dst is None or isinstance(x_dst, torch.Tensor)):
        raise TypeError(f"{layer}: (x_src, x_dst) must be tensors (x_dst may be None), got "
                        f"({type(x_src).__name__}, {type(x_dst).__name__})")
    for name, t in (("x_src", x_src), ("x_dst", x_dst)):
        if t is not None and t.dtype == torch.bool:
            raise TypeError(_BOOL_FEATURES.format(layer=layer, name=name))
    if any(t is not None and t.dim() > 2 for t in (x_src, x_dst)):
        raise NotImplementedError(f"{layer}: bipartite input with batched node features ([B, N, F] in "
                                  "(x_src, x_dst)) is not supported by gnnfuse; [B, N, F] is taken as one "
                                  "tensor x only")
    num_src = x_src.shape[0]
    num_dst = num_src if x_dst is None else x_dst.shape[0]
    if size is not None:
        given_src, given_dst = size_entries(size, layer)
        if (given_src is not None and given_src != num_src) or (
                x_dst is not None and given_dst is not None and given_dst != num_dst):
            raise ValueError(f"{layer}: size={tuple(size)} does not fit x_src with {num_src} rows and "
                             f"x_dst with {None if x_dst is None else num_dst} rows")
        if given_dst is not None:
            num_dst = given_dst
    return x_src, x_dst, (num_src, num_dst)


def size_entries(size: Any, layer: str) -> tuple[int | None, int | None]:
    """PyG's ``size`` argument as ``(num_src, num_dst)``, each an int or None. PyG's
    ``propagate`` reads a None entry as "the count of that side's features" (a missing
    ``x_dst``'s count defaulting to the sources'), so ``size=(num_src, None)`` is a PyG
    call: taken as the destination count itself, that None let the graph infer it from
    the largest destination id, and ``((x_src, None), edge_index, size=(5, None))`` gave 3
    output rows where PyG gives 5. An entry may be a 0-d integer tensor, as PyG takes it."""
    try:
        entries = tuple(size)
    except TypeError:
        raise TypeError(f"{layer}: size must be a pair (num_src, num_dst) of ints or None, got "
                        f"{type(size).__name__}") from None
    if len(entries) != 2:
        raise ValueError(f"{layer}: size must be a pair (num_src, num_dst), got {len(entries)} entries: {size!r}")
    try:
        return tuple(None if n is None else operator.index(n) for n in entries)
    except TypeError:
        raise TypeError(f"{layer}: size entries must be ints or None, got "
                        f"({', '.join(type(n).__name__ for n in entries)})") from None


def edge_weight_column(edge_weight: torch.Tensor, graph: Any, dtype: torch.dtype) -> torch.Tensor:
    """PyG's ``edge_weight`` (one number per edge of ``graph``, shape [E] or [E, 1], in
    edge-id order) as an [E] tensor of the features' dtype, still attached to autograd.
    Refused, naming both devices, where it is not on the graph's: the normalising layers'
    torch ops then failed in an ``index_add`` naming neither edge_weight nor edge_index,
    and GraphConv named its program's input ``'e.w'``. A complex one is refused: the cast
    to the features' dtype dropped its imaginary part (GCNConv gave a float output where
    PyG's is complex; GraphConv, SGConv, TAGConv and APPNP, where PyG's raise, too), with at
    most torch's one-time warning."""
    if not isinstance(edge_weight, torch.Tensor):
        raise TypeError(f"edge_weight must be a tensor of one number per edge, got {type(edge_weight).__name__}")
    if edge_weight.is_complex():
        raise TypeError(f"edge_weight is {edge_weight.dtype}: complex edge weights are not supported (casting them "
                        f"to the features' {dtype} would drop their imaginary part); pass real weights")
    if edge_weight.device != graph.device:
        raise ValueError(f"edge_weight is on {edge_weight.device} but the graph (edge_index) is on {graph.device}; "
                         "move one of them (edge_weight.to(edge_index.device))")
    num_edges = graph.num_edges
    # (shape, not numel: an empty graph's [0, 2] weights have E numbers too, and PyG raises)
    if edge_weight.shape != (num_edges,) and edge_weight.shape != (num_edges, 1):
        raise ValueError(f"edge_weight must have shape [{num_edges}] (one number per edge of the graph), "
                         f"got {list(edge_weight.shape)}")
    return edge_weight.reshape(num_edges).to(dtype)


def weighted_degrees(weight: torch.Tensor, index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """The sum of the [E] ``weight`` at each of ``num_nodes`` vertices by ``index``, in
    ``weight``'s dtype and attached to autograd, by the reference executor's own sum
    (`reduce_rows`): a float16/bfloat16 sum accumulates in float32 and rounds once, as
    PyG's ``scatter`` does, where torch's CPU ``index_add`` of a 1-D half tensor adds in the
    half type (a bfloat16 degree of 2,000 in-edges weighted about 0.5 stopped at 256, and
    GCNConv's output was off by 85%)."""
    return reduce_rows(weight, index, num_nodes, "sum")


def refuse_stored_loops(edge_index: Any, layer: str) -> None:
    """Refuse a torch sparse ``adj_t`` that stores self loops, given to a layer that adds
    self loops as PyG's ``gcn_norm`` does (GCNConv, APPNP, SGConv). For a torch sparse
    input PyG's ``gcn_norm`` adds a loop to every vertex on top of a stored one (a stored
    loop then weighs one more), where for an ``edge_index`` or a ``SparseTensor`` it keeps
    one loop per vertex, as gnnfuse does for every input: the results would differ from
    PyG's without a word. One host read per call with such an input."""
    if not isinstance(edge_index, torch.Tensor) or edge_index.layout is torch.strided:
        return
    check_adjacency_shape(edge_index)
    rows, cols = (edge_index if edge_index.layout is torch.sparse_coo else edge_index.to_sparse_coo())._indices()
    if bool((rows == cols).any()):
        raise ValueError(f"{layer}: the torch sparse adj_t stores self loops, and PyG's {layer} adds a second "
                         "loop to each such vertex of a torch sparse input (gcn_norm's add_self_loops; for an "
                         "edge_index or a SparseTensor it keeps one loop per vertex, as gnnfuse does for all "
                         "three), so gnnfuse's results would differ from PyG's; drop the diagonal first (both then "
                         "add one loop per vertex), pass an edge_index or a SparseTensor, or pass "
                         "add_self_loops=False")


def adjacency_weights(edge_index: Any, edge_weight: torch.Tensor | None, layer: str,
                      num_nodes: int | None = None) -> tuple[Any, torch.Tensor | None]:
    """``(edge_index, edge_weight)`` for a layer that takes edge weights, given PyG's
    sparse ``adj_t`` whose stored values are not all 1: PyG multiplies each message by
    its entry, so the entries become ``edge_weight`` of a ``[2, E]`` edge_index (row =
    target, column = source), one per entry of the `coalesced` matrix (a position stored
    twice is one edge weighing their sum, as PyG's ``spmm`` reads it: a weighted mean or
    max differs from two edges'). Any other input passes through unchanged.
    (The index made here is new on every call, so such a graph's layout is rebuilt per
    call; a pattern-only ``adj_t`` or a plain edge_index keeps the cached layout.) A scipy
    sparse matrix (row = source) with values other than 1 gives its entries as
    ``edge_weight`` the same way, also one per entry of its `coalesced` form: a COO one
    storing a position twice was read as two edges where the same matrix in CSR (whose
    conversion sums them) is one, and GraphConv's mean and max differed between the two.

    An ``edge_weight`` beside a sparse adj_t is refused: PyG ignores it (the weights are
    the adj_t's values), and its rows would have no defined edge order to follow.

    ``num_nodes`` (the rows of a one-set layer's x) is checked against the shape of a
    weighted matrix, which the edge_index made here no longer carries: an 8 x 8, 4 x 4 or
    6 x 7 adj_t beside an x of 6 rows gave GCN, SGConv, TAGConv, ChebConv, APPNP and
    GraphConv a result (PyG raises), where the unweighted one is refused by
    `Graph.from_adj_t`. None where the caller checks the shape itself (bipartite pairs)."""
    if type(edge_index) is torch.Tensor and edge_index.layout is torch.strided:
        return edge_index, edge_weight      # a plain edge_index, the usual call: no scipy or sparse check
    if sp.issparse(edge_index):
        edge_index = coalesced(edge_index)
        weighted = scipy_weights(edge_index)
        if weighted is None:
            return edge_index, edge_weight
        if edge_weight is not None:
            raise ValueError(f"{layer}: the scipy sparse matrix holds edge weights (values other than 1) and "
                             "edge_weight was given too; pass the weights one way")
        _check_square(edge_index.shape, num_nodes, layer)
        return weighted
    if not is_sparse_adjacency(edge_index):
        return edge_index, edge_weight
    if edge_weight is not None:
        raise ValueError(f"{layer}: edge_weight beside a sparse adj_t, which PyG ignores (it weighs the "
                         "edges by the adj_t's values): put the weights in the adj_t's values, or pass an "
                         "edge_index with edge_weight")
    if isinstance(edge_index, torch.Tensor):
        edge_index = coalesced(edge_index)         # (which checks the layout and shape)
        # a CSC matrix's COO form comes uncoalesced (column-major), whose values() refuses
        coo = edge_index if edge_index.layout is torch.sparse_coo else edge_index.to_sparse_coo().coalesce()
        # values() where they take a gradient (learnt edge weights packed into the adj_t,
        # as PyG differentiates them): _values() is not differentiated, and they got none
        (row, col), value = coo._indices(), coo.values() if coo.requires_grad else coo._values()
        if edge_index.layout is torch.sparse_csr:
            # a CSR matrix's COO form holds the CSR's own values, under a version counter of
            # its own: an edit through ``adj_t.values()`` after the forward went unseen, and
            # the backward read the edited weights (GraphConv's x.grad 2.5 off). (A CSC
            # matrix's ``coalesce`` above made new values already.)
            value = value.clone()
    else:                                             # torch_sparse.SparseTensor
        row, col, value = edge_index.coo()
    if value is None or not value.numel() or (not value.requires_grad and bool((value == 1).all())):
        return edge_index, None
    _check_square(edge_index.shape if isinstance(edge_index, torch.Tensor) else edge_index.sparse_sizes(),
                  num_nodes, layer)
    return torch.stack([col, row]), value


def _check_square(shape: Any, num_nodes: int | None, layer: str) -> None:
    """A ValueError naming the sparse matrix's shape unless it is [num_nodes, num_nodes]."""
    if num_nodes is not None and list(shape) != [num_nodes, num_nodes]:
        raise ValueError(f"{layer}: the sparse adjacency (edge_index) has shape {list(shape)} but x has {num_nodes} "
                         f"rows: it must be [{num_nodes}, {num_nodes}]")
