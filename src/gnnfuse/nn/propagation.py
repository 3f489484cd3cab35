"""Propagation-family layers with PyG's names, arguments and parameter layout: GIN,
GraphConv, APPNP, SGC, TAG and Chebyshev convolutions.

Each hop is one vertex-centric function that reads like its formula (``v`` the vertex,
``u`` an in-neighbour); the per-graph coefficients it needs -- ``D^-1/2``, the scaled
Laplacian's diagonal and off-diagonal factors -- are computed once per graph and kept in
the graph's cache, and the dense transforms stay plain torch. Normalisation factors are
passed per vertex (``u.norm * v.norm``) rather than per edge, so a hop gathers no
|E|-sized weight array; only APPNP's edge dropout needs per-edge weights, and only while
training. Parameter names and shapes match PyG, so
``layer.load_state_dict(pyg_layer.state_dict())`` copies a PyG model.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import frontend
from ..graph import Graph
from ..runtime.compile_op import GraphRef
from ..runtime.autocast import autocast_dtype
from .aligned_linear import aligned_linear
from .arguments import (adjacency_weights, edge_weight_column, floating_node_features, over_feature_batches,
                        refuse_stored_loops, weighted_degrees)
from .compiling import compile_path, graph_input_problem, propagation_problem
from . import pyg_init
from .fixed_aggregation import FixedAggregation
from .fixed_flow import FixedFlow
from .plain_linear import plain_linear
from .pyg_options import message_passing_options
from .pyg_repr import OneLineRepr
from .conv import (_AGGREGATORS, _AGGREGATORS_PLUS_ROOT, _WEIGHTED_AGGREGATORS, CachedGraph, _as_graph,
                   _bipartite_inputs, _channel_pair, _gcn_edge_norm, _inv_sqrt_degree, _neighbour_sum,
                   _normalized_hop, _normalized_layer_inputs, _transform_first, _with_loops, maps_first)
from .torchscript import NotScriptable


class GINConv(FixedAggregation, FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    """Graph isomorphism network layer (Xu et al.):
    ``x'_v = nn((1 + eps) * x_v + sum_{u in N(v)} x_u)``.

    ``eps`` is a parameter with ``train_eps=True`` and a buffer otherwise, as in PyG, so
    state dicts carry it either way.
    """

    def __init__(self, nn: Callable[[torch.Tensor], torch.Tensor], eps: float = 0.0, train_eps: bool = False,
                 **kwargs: Any):
        super().__init__()
        self.node_dim = message_passing_options(type(self).__name__, kwargs)
        self.nn = nn
        self.initial_eps = eps
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"nn={self.nn}"

    def reset_parameters(self) -> None:
        pyg_init.reset_module(self.nn)
        self.eps.data.fill_(self.initial_eps)

    def _compile_problem(self, x: Any, edge_index: Any, size: Any = None) -> str | None:
        return graph_input_problem(edge_index)

    @over_feature_batches
    @compile_path(_compile_problem)
    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None], edge_index: Graph | torch.Tensor,
                size: tuple[int, int] | None = None) -> torch.Tensor:
        x, x_dst, graph = _bipartite_inputs(x, edge_index, size, "GINConv")
        out = _neighbour_sum(graph, {"h": x})
        return self.nn(out if x_dst is None else out + (1 + self.eps) * x_dst)


class GraphConv(FixedAggregation, FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    """Morris et al.'s higher-order GNN layer:
    ``x'_v = lin_rel(aggr_{u in N(v)} x_u) + lin_root(x_v)``, ``aggr`` in add/sum/mean/max.

    As in `SAGEConv`, add and mean commute with ``lin_rel``, so it runs first when the
    graph kernels then move fewer feature lanes (`maps_first`; with an
    edge weight that needs a gradient, whenever it narrows the rows). ``edge_weight``
    (PyG's) scales each message ``x_u`` before the aggregation. Bipartite input (PyG's):
    ``in_channels=(a, b)`` and ``forward((x_src, x_dst), edge_index, edge_weight, size)``.
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, aggr: str = "add",
                 bias: bool = True, **kwargs: Any):
        super().__init__()
        self.node_dim = message_passing_options(type(self).__name__, kwargs, aggr=())     # its aggr is its own argument
        if not isinstance(aggr, str) or aggr not in _AGGREGATORS:    # a list or module: PyG's other forms
            raise ValueError(f"GraphConv: aggr must be one of {sorted(_AGGREGATORS)} (the reductions gnnfuse "
                             f"fuses for it; SAGEConv takes PyG's other forms), got {aggr!r}")
        self.in_channels, self.out_channels, self.aggr = in_channels, out_channels, aggr
        self._aggr = aggr      # PyG builds its aggregation here: a later layer.aggr = ... changes nothing
        in_src, in_dst = _channel_pair(in_channels)
        self.lin_rel = pyg_init.linear(in_src, out_channels, bias=bias)
        self.lin_root = pyg_init.linear(in_dst, out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        pyg_init.reset_linear(self.lin_rel)
        pyg_init.reset_linear(self.lin_root)

    def _compile_problem(self, x: Any, edge_index: Any, edge_weight: Any = None, size: Any = None) -> str | None:
        return "edge_weight" if edge_weight is not None else graph_input_problem(edge_index)

    @over_feature_batches
    @compile_path(_compile_problem)
    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None], edge_index: Graph | torch.Tensor,
                edge_weight: torch.Tensor | None = None, size: tuple[int, int] | None = None) -> torch.Tensor:
        one_set = x.shape[0] if isinstance(x, torch.Tensor) else None       # a pair: `_bipartite_inputs` checks
        graph_input, edge_weight = adjacency_weights(edge_index, edge_weight, "GraphConv", one_set)
        x, x_dst, graph = _bipartite_inputs(x, graph_input, size, "GraphConv", weighted_adj_t=edge_index)
        pyg_init.materialize([(self.lin_rel, x), (self.lin_root, x_dst)])
        if edge_weight is None:
            aggregate, edge_feature = _AGGREGATORS[self._aggr], None
        else:
            weight = edge_weight_column(edge_weight, graph, x.dtype).unsqueeze(-1)
            aggregate, edge_feature = _WEIGHTED_AGGREGATORS[self._aggr], {"w": weight}
        if not plain_linear(self.lin_rel):
            narrows = False                                           # called after the aggregation, as in PyG
        elif edge_weight is not None and edge_weight.requires_grad and torch.is_grad_enabled():
            narrows = self.out_channels < self.lin_rel.in_features    # its gradient is an SDDMM of the mapped width
        else:
            narrows = maps_first(self.lin_rel.in_features, self.out_channels, x, self.lin_rel.weight)
        # under torch.compile aggregate first, and under torch.autocast, as PyG: its weighted sum
        # of float32 data is float32 and the map after it bfloat16, where the map first made the
        # sum of its bfloat16 rows by float32 weights float32
        if (self._aggr != "max" and narrows and not isinstance(graph, GraphRef)
                and autocast_dtype(x.device.type) is None):
            h = _transform_first(x, self.lin_rel.weight, graph, 1)
            if edge_feature is None and x_dst is not None and plain_linear(self.lin_root, bias=False):
                # as in SAGEConv: the root term carries lin_rel's bias and is added by the
                # aggregation's kernel (passes.fusion._row_added)
                root = aligned_linear(x_dst, self.lin_root.weight, self.lin_rel.bias)
                return _AGGREGATORS_PLUS_ROOT[self._aggr](graph, {"h": h, "root": root})
            out = aggregate(graph, {"h": h}, edge_feature)
            if self.lin_rel.bias is not None:
                out = out + self.lin_rel.bias
        else:
            out = self.lin_rel(aggregate(graph, {"h": x}, edge_feature))
        return out if x_dst is None else out + self.lin_root(x_dst)


@frontend.udf_factory
def _appnp_step(alpha: float) -> frontend.VertexFunction:
    """One personalised-PageRank hop for a given teleport ``alpha`` (a compile-time
    constant, so each distinct alpha compiles once)."""

    @frontend.vertex
    def step(v):
        return (1 - alpha) * sum([u.h * u.norm for u in v.innbs]) * v.norm + alpha * v.h0
    return step


@frontend.udf_factory
def _appnp_dropped_step(alpha: float) -> frontend.VertexFunction:
    """The same hop over explicit per-edge weights (PyG's ``edge_weight`` normalised, or the
    dropped-out normalised adjacency)."""

    @frontend.vertex
    def step(v):
        return (1 - alpha) * sum([e.src.h * e.w for e in v.inedges]) + alpha * v.h0
    return step


def _edge_weights(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    """``deg^-1/2[src] * deg^-1/2[dst]`` per edge, in edge-id order (PyG's ``gcn_norm``)."""
    def build(g: Graph) -> torch.Tensor:
        norm = _inv_sqrt_degree(g, torch.float64).squeeze(-1)
        return norm[g.src] * norm[g.dst]
    return graph.cached("nn_gcn_edge_weight", build).to(dtype)


class APPNP(FixedAggregation, FixedFlow, OneLineRepr, CachedGraph, NotScriptable, nn.Module):
    """Approximate personalised propagation of neural predictions (Klicpera et al.):
    ``X^0 = X``, ``X^{k+1} = (1 - alpha) Â X^k + alpha X`` for K hops, where
    ``Â = D^-1/2 (A + I) D^-1/2`` (``A`` with ``add_self_loops=False``, plain ``A`` with
    ``normalize=False``).

    With ``dropout > 0`` in training mode each hop drops entries of ``Â`` (edge dropout,
    inverted scaling). As in PyG each hop drops from the previous hop's already-dropped
    weights, so the masks compound: hop k keeps an entry with probability ``(1-p)^k``
    and scales it by ``(1-p)^-k``, so each hop's weights are unbiased but not independent
    of the earlier hops'. Drawing in PyG's order over PyG's edge order, a seeded run gives
    PyG's masks. Unlike PyG, ``normalize=False`` with dropout works (it drops entries of
    ``A``). ``edge_weight`` (PyG's) weights ``A``'s entries and the degrees.
    """

    def __init__(self, K: int, alpha: float, dropout: float = 0.0, cached: bool = False,
                 add_self_loops: bool = True, normalize: bool = True, **kwargs: Any):
        super().__init__()
        self.node_dim = message_passing_options(type(self).__name__, kwargs)
        if not 0.0 <= dropout <= 1.0:      # 1 drops every edge: each hop gives alpha * x, as in PyG
            raise ValueError(f"dropout must be in [0, 1], got {dropout}")
        self.K, self.alpha, self.dropout = K, alpha, dropout
        self.cached, self.add_self_loops, self.normalize = cached, add_self_loops, normalize
        self._cached_graph: Graph | None = None

    def reset_parameters(self) -> None:
        self._cached_graph = None

    def _compile_problem(self, x: Any, edge_index: Any, edge_weight: Any = None) -> str | None:
        if self.dropout > 0 and self.training:
            return "edge dropout in training"
        return propagation_problem(edge_index, edge_weight, self.cached and self.normalize)

    @compile_path(_compile_problem)
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        return self._propagated(x, edge_index, edge_weight, [])

    @over_feature_batches
    def _propagated(self, x: torch.Tensor, edge_index: Graph | torch.Tensor, edge_weight: torch.Tensor | None,
                    dropped: list[torch.Tensor]) -> torch.Tensor:
        """`forward` for one feature matrix (each of a [B, N, F] batch in turn). ``dropped``
        holds each hop's edge-dropped weights, drawn for the first matrix and read by the
        others: PyG drops the edges once per hop for the whole batch, so every matrix
        propagates over the same dropped adjacency (drawn per matrix, a seeded batch was
        1.3 off PyG's, and its matrices saw different graphs)."""
        x, graph, edge_weight = _normalized_layer_inputs(self, "APPNP", x, edge_index, edge_weight)
        add_self_loops = self.normalize and self.add_self_loops
        dropping = self.dropout > 0 and self.training
        if edge_weight is not None:
            graph, weight = _gcn_edge_norm(graph, edge_weight, x.dtype, add_self_loops, normalize=self.normalize)
        else:
            graph = _with_loops(graph, add_self_loops)
        h = x
        if edge_weight is not None or dropping:
            if edge_weight is None:
                weight = (_edge_weights(graph, x.dtype) if self.normalize
                          else x.new_ones(graph.num_edges))
            step = _appnp_dropped_step(float(self.alpha))
            for k in range(self.K):
                if dropping:
                    if len(dropped) == k:
                        dropped.append(F.dropout(weight, p=self.dropout))
                    weight = dropped[k]
                h = step(graph, {"h": h, "h0": x}, {"w": weight})
            return h
        norm = _inv_sqrt_degree(graph, x.dtype) if self.normalize else x.new_ones(graph.num_nodes, 1)
        step = _appnp_step(float(self.alpha))
        for _ in range(self.K):
            h = step(graph, {"h": h, "norm": norm, "h0": x})
        return h

    def extra_repr(self) -> str:
        return f"K={self.K}, alpha={self.alpha}"


class SGConv(FixedAggregation, FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    """Simplified graph convolution (Wu et al.): ``lin(Â^K X)``,
    ``Â = D^-1/2 (A + I) D^-1/2``.

    ``cached=True`` keeps ``Â^K X`` from the first call and reuses it (detached) on every
    later one, as PyG does -- only sound when X and the graph never change. Features
    ``[B, N, F]`` are cached whole, as PyG caches them. Without it, a narrowing ``lin``
    runs first (``Â^K (X W) + b``), so the K hops move narrower rows.
    """

    def __init__(self, in_channels: int, out_channels: int, K: int = 1, cached: bool = False,
                 add_self_loops: bool = True, bias: bool = True, **kwargs: Any):
        super().__init__()
        self.node_dim = message_passing_options(type(self).__name__, kwargs)
        self.in_channels, self.out_channels, self.K = in_channels, out_channels, K
        self.cached, self.add_self_loops = cached, add_self_loops
        self._cached_x: torch.Tensor | None = None
        self.lin = pyg_init.linear(in_channels, out_channels, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        pyg_init.reset_linear(self.lin)
        self._cached_x = None

    def _compile_problem(self, x: Any, edge_index: Any, edge_weight: Any = None) -> str | None:
        return propagation_problem(edge_index, edge_weight, self.cached)

    @compile_path(_compile_problem)
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        if self._cached_x is not None:
            # PyG returns the kept rows for any x: an x of 8 rows after one of 6 got 6 output rows
            if not isinstance(x, torch.Tensor) or x.shape != self._cached_x.shape:
                got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"SGConv(cached=True): x is {got} but the cached A^K X of the first call is "
                                 f"{list(self._cached_x.shape)}, which cached=True returns for every later x; "
                                 "call reset_parameters() to drop it")
            return self.lin(self._cached_x.detach())
        pyg_init.materialize([(self.lin, x)])
        # not under torch.autocast, as GCNConv: PyG's map last gives the autocast dtype, where the
        # map first, propagated by float32 weights and given its bias after, gave float32
        if (not self.cached and plain_linear(self.lin) and self.out_channels < self.lin.in_features
                and not torch.compiler.is_compiling() and autocast_dtype(self.lin.weight.device.type) is None):
            return self._propagated(x, edge_index, edge_weight, mapped_first=True)
        h = self._propagated(x, edge_index, edge_weight)
        if self.cached and self.K > 0:     # as PyG, which caches inside its hop loop: K = 0 caches nothing
            self._cached_x = h
        return self.lin(h)

    @over_feature_batches
    def _propagated(self, x: torch.Tensor, edge_index: Graph | torch.Tensor, edge_weight: torch.Tensor | None,
                    mapped_first: bool = False) -> torch.Tensor:
        """``Â^K X`` for one feature matrix (each of a [B, N, F] batch in turn), or with
        ``mapped_first`` ``Â^K (X W) + b``, the map moved before the hops (under
        torch.compile it stays after them, as in PyG). `forward` keeps the cache for the
        whole batch: kept here, per matrix, every matrix after the first got the first's."""
        x = floating_node_features(x, "SGConv")
        given, (edge_index, edge_weight) = edge_index, adjacency_weights(edge_index, edge_weight, "SGConv", x.shape[0])
        if self.add_self_loops:
            refuse_stored_loops(given, "SGConv")
        graph, hop = _normalized_hop(_as_graph(edge_index, x.shape[0]), edge_weight, x.dtype, self.add_self_loops)
        h = _transform_first(x, self.lin.weight, graph, self.K) if mapped_first else x
        for _ in range(self.K):
            h = hop(h)
        return h if not mapped_first or self.lin.bias is None else h + self.lin.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, K={self.K}"


@frontend.vertex
def _tag_step(v):
    return sum([u.h * u.norm for u in v.innbs]) * v.norm + v.skip


class TAGConv(FixedAggregation, FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    """Topology adaptive graph convolution (Du et al.):
    ``sum_{k=0..K} Â^k X W_k + b``, ``Â = D^-1/2 A D^-1/2`` (no self loops; plain ``A``
    with ``normalize=False``).

    ``Â`` commutes with right-multiplication by ``W_k``, so when the transforms narrow
    the features the sum is evaluated in Horner form,
    ``X W_0 + Â (X W_1 + Â (... + Â X W_K))``: K hops over out-channel rows, each adding
    its skip term in the same kernel (a separate add when PyG's ``edge_weight`` is given:
    those hops read one weight per edge).
    """

    def __init__(self, in_channels: int, out_channels: int, K: int = 3, bias: bool = True,
                 normalize: bool = True, **kwargs: Any):
        super().__init__()
        self.node_dim = message_passing_options(type(self).__name__, kwargs)
        self.in_channels, self.out_channels, self.K, self.normalize = in_channels, out_channels, K, normalize
        self.lins = nn.ModuleList([pyg_init.linear(in_channels, out_channels, bias=False) for _ in range(K + 1)])
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in self.lins:
            pyg_init.reset_linear(lin)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _compile_problem(self, x: Any, edge_index: Any, edge_weight: Any = None) -> str | None:
        return propagation_problem(edge_index, edge_weight)

    @over_feature_batches
    @compile_path(_compile_problem)
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        x = floating_node_features(x, "TAGConv")
        edge_index, edge_weight = adjacency_weights(edge_index, edge_weight, "TAGConv", x.shape[0])
        graph, hop = _normalized_hop(_as_graph(edge_index, x.shape[0]), edge_weight, x.dtype, False, self.normalize)
        pyg_init.materialize([(lin, x) for lin in self.lins])
        # PyG calls lins[1:] by their forward, hooks not run: a map is moved before the hops
        # when its forward is nn.Linear's, without a bias (which moved, would be propagated);
        # not under torch.autocast, as SGConv: the hops of autocast-dtype rows by float32
        # norms gave float32 where PyG's maps after them give the autocast dtype
        if (all(type(lin) is nn.Linear and lin.bias is None for lin in self.lins[1:])
                and self.out_channels < x.shape[-1] and not isinstance(graph, GraphRef)   # not under torch.compile
                and autocast_dtype(x.device.type) is None):
            skips = [_transform_first(x, lin.weight, graph, k) if k else lin(x) for k, lin in enumerate(self.lins)]
            norm = _inv_sqrt_degree(graph, x.dtype) if self.normalize else x.new_ones(graph.num_nodes, 1)
            out = skips[-1]
            for skip in reversed(skips[:-1]):
                out = (_tag_step(graph, {"h": out, "norm": norm, "skip": skip}) if edge_weight is None
                       else hop(out) + skip)
        else:
            out, h = self.lins[0](x), x
            for lin in self.lins[1:]:
                h = hop(h)
                out = out + lin.forward(h)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, K={self.K}"


_LAPLACIANS = ("sym", "rw", None)
# The default lambda_max of a graph without vertices (a node type with no rows in a
# mini-batch): its Laplacian has no entries to take the largest of, and no vertex reads
# the value -- the output has no rows whatever it is. Any positive number does.
_NO_VERTICES_LAMBDA_MAX = 2.0


def _laplacian(graph: Graph, normalization: str | None, dtype: torch.dtype
               ) -> tuple[Graph, float, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(graph without self loops, default lambda_max, diag, left, right), cached per graph:
    ``(L x)_v = diag_v x_v + left_v sum_{u -> v} right_u x_u``.

    PyG's ``get_laplacian``: self loops are dropped, degrees are *out*-degrees (by
    source), and 0 for a vertex without out-edges; ``sym`` is ``I - D^-1/2 A D^-1/2``,
    ``rw`` is ``I - D^-1 A`` (``D^-1`` of the source), None is ``D - A``. The default
    lambda_max is PyG's, twice the largest entry of ``L``: off-diagonal entries are
    negative, so that is the largest diagonal entry (1 for "sym" and "rw").
    """
    def build(g: Graph) -> tuple[Graph, float, torch.Tensor, torch.Tensor, torch.Tensor]:
        loop_free = g.remove_self_loops()
        deg = loop_free.out_degrees().to(torch.float64).unsqueeze(-1)
        ones = torch.ones_like(deg)
        if normalization == "sym":
            inv_sqrt = deg.pow(-0.5).masked_fill(deg == 0, 0.0)
            diag, left, right = ones, -inv_sqrt, inv_sqrt
        elif normalization == "rw":
            diag, left, right = ones, -ones, deg.reciprocal().masked_fill(deg == 0, 0.0)
        else:
            diag, left, right = deg, -ones, ones
        return loop_free, 2.0 * float(diag.max()) if diag.numel() else _NO_VERTICES_LAMBDA_MAX, diag, left, right
    loop_free, lambda_max, *factors = graph.cached(f"nn_laplacian_{normalization}", build)
    return (loop_free, lambda_max, *(f.to(dtype) for f in factors))


def _weighted_laplacian(graph: Graph, edge_weight: torch.Tensor, normalization: str | None, dtype: torch.dtype
                        ) -> tuple[Graph, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(graph without self loops, default lambda_max, diag [N, 1], off-diagonal entry per
    edge [E', 1]) of PyG's ``get_laplacian`` with edge weights: as `_laplacian`, degrees
    summing the weights of a vertex's out-edges. Built in torch on every call (weights
    change and carry gradients); lambda_max is twice the largest entry of ``L``, diagonal
    or not, a tensor through which gradients reach the weights as in PyG.
    """
    is_loop = graph.src == graph.dst
    weight = edge_weight_column(edge_weight, graph, dtype)[~is_loop]
    loop_free = graph.remove_self_loops()
    src, dst = loop_free.src, loop_free.dst
    degree = weighted_degrees(weight, src, graph.num_nodes)
    if normalization == "sym":
        inv_sqrt = degree.pow(-0.5)
        inv_sqrt = inv_sqrt.masked_fill(torch.isinf(inv_sqrt), 0.0)
        diag, off = torch.ones_like(degree), -(inv_sqrt[src] * weight * inv_sqrt[dst])
    elif normalization == "rw":
        inverse = 1.0 / degree
        diag, off = torch.ones_like(degree), -(inverse.masked_fill(torch.isinf(inverse), 0.0)[src] * weight)
    else:
        diag, off = degree, -weight
    entries = torch.cat([off, diag])
    lambda_max = 2.0 * entries.max() if entries.numel() else entries.new_tensor(_NO_VERTICES_LAMBDA_MAX)
    return loop_free, lambda_max, diag.unsqueeze(-1), off.unsqueeze(-1)


def _default_lambda_max_hint(lam: torch.Tensor, graph: Graph, edge_weight: torch.Tensor | None,
                             normalization: str | None) -> str:
    """Why ChebConv's default lambda_max (twice the largest entry of ``L``) is not
    positive. A NaN one comes from the weights, not from a graph without edges as the
    only hint said: a non-finite weight, or under "sym" a vertex whose out-edge weights
    sum to a negative degree (its deg^-1/2 is NaN), named."""
    generic = (" (the default, twice the largest entry of L, is not positive: e.g. L = D - A of a graph "
               "without edges; pass lambda_max)")
    if not bool(lam.isnan().any()) or edge_weight is None:
        return generic
    weight = edge_weight.detach().reshape(-1)
    if not bool(weight.isfinite().all()):
        edge = int((~weight.isfinite()).nonzero()[0])
        return f" (the default, twice the largest entry of L, is NaN: edge_weight[{edge}] is {weight[edge].item()})"
    loop_free = graph.src != graph.dst
    degree = weighted_degrees(weight[loop_free], graph.src[loop_free].long(), graph.num_nodes)
    negative = (degree < 0).nonzero().flatten()[:8].tolist()
    if normalization != "sym" or not negative:
        return generic
    return (f" (the default, twice the largest entry of L, is NaN: normalization='sym' takes deg^-1/2 of each "
            f"vertex's summed out-edge weights (self loops dropped), and vertices {negative} have a negative "
            "degree; PyG's output is NaN then)")


def _per_vertex_lambda_max(lambda_max: float | torch.Tensor, batch: torch.Tensor | None,
                           x: torch.Tensor) -> torch.Tensor:
    """lambda_max as a scalar tensor, or [N, 1] (each vertex's graph's) when a value per
    graph comes with PyG's ``batch`` vector. Stays attached to autograd."""
    lam = torch.as_tensor(lambda_max, dtype=x.dtype, device=x.device)
    if lam.numel() != 1:
        if lam.dim() != 1:      # a [2, 2] one gave graphs 0 and 1 its first row; PyG raises for any such shape
            raise ValueError(f"ChebConv: lambda_max must be one number or a 1-D tensor of one value per graph of "
                             f"the batch, got shape {list(lam.shape)}")
        if batch is None:
            raise ValueError(f"lambda_max has {lam.numel()} values (one per graph of a batch) but no batch "
                             "vector was given; pass batch=... (graph id per vertex) or one number")
        if batch.shape != (x.shape[0],):
            raise ValueError(f"batch must hold one graph id per vertex, shape [{x.shape[0]}], got {list(batch.shape)}")
        low, high = (int(batch.min()), int(batch.max())) if batch.numel() else (0, 0)
        if low < 0 or high >= lam.numel():     # (PyG's lookup raised an IndexError naming neither argument)
            raise ValueError(f"ChebConv: batch names graph {low if low < 0 else high} but lambda_max has "
                             f"{lam.numel()} values, one per graph 0..{lam.numel() - 1} (or pass one number for all)")
        return lam.reshape(-1)[batch].unsqueeze(-1)
    return lam.reshape(())


@frontend.vertex
def _chebyshev_first(v):
    return v.h * v.diag + sum([u.h * u.right for u in v.innbs]) * v.left


@frontend.vertex
def _chebyshev_next(v):
    return 2 * (v.h * v.diag + sum([u.h * u.right for u in v.innbs]) * v.left) - v.prev


@frontend.vertex
def _weighted_chebyshev_first(v):
    return v.h * v.diag + sum([e.src.h * e.off for e in v.inedges])


@frontend.vertex
def _weighted_chebyshev_next(v):
    return 2 * (v.h * v.diag + sum([e.src.h * e.off for e in v.inedges])) - v.prev


class ChebConv(FixedAggregation, FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    """Chebyshev spectral graph convolution (Defferrard et al.):
    ``sum_{k<K} T_k(L̂) X W_k + b`` with ``L̂ = 2 L / lambda_max - I``, ``T_0 = I``,
    ``T_1 = L̂``, ``T_k = 2 L̂ T_{k-1} - T_{k-2}``.

    ``L`` is PyG's ``get_laplacian`` of the graph (see `_laplacian`) for
    ``normalization`` "sym", "rw" or None. ``lambda_max`` defaults, as in PyG, to twice
    the largest entry of ``L`` -- 2 for "sym" and "rw" without edge weights. PyG's
    ``edge_weight`` weights ``A`` (and the degrees); a ``lambda_max`` per graph of a batch
    is read through PyG's ``batch`` vector (graph id per vertex).
    """

    def __init__(self, in_channels: int, out_channels: int, K: int, normalization: str | None = "sym",
                 bias: bool = True, **kwargs: Any):
        super().__init__()
        message_passing_options(type(self).__name__, kwargs)
        if K < 1:
            raise ValueError(f"K must be at least 1, got {K}")
        if normalization not in _LAPLACIANS:
            raise ValueError(f"normalization must be 'sym', 'rw' or None, got {normalization!r}")
        self.in_channels, self.out_channels, self.normalization = in_channels, out_channels, normalization
        self.lins = nn.ModuleList([pyg_init.linear(in_channels, out_channels, False, "glorot") for _ in range(K)])
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in self.lins:
            pyg_init.reset_linear(lin, "glorot")
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @compile_path()
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor, edge_weight: torch.Tensor | None = None,
                batch: torch.Tensor | None = None, lambda_max: float | torch.Tensor | None = None) -> torch.Tensor:
        x = floating_node_features(x, "ChebConv")
        pyg_init.materialize([(lin, x) for lin in self.lins], "glorot")
        edge_index, edge_weight = adjacency_weights(edge_index, edge_weight, "ChebConv", x.shape[0])
        graph = _as_graph(edge_index, x.shape[0])
        if edge_weight is None:
            loop_free, default_lam, diag, left, right = _laplacian(graph, self.normalization, x.dtype)
        else:
            loop_free, default_lam, diag, off = _weighted_laplacian(graph, edge_weight, self.normalization, x.dtype)
        lam = _per_vertex_lambda_max(default_lam if lambda_max is None else lambda_max, batch, x)
        if not bool((lam > 0).all()):
            hint = ("" if lambda_max is not None
                    else _default_lambda_max_hint(lam, graph, edge_weight, self.normalization))
            raise ValueError(f"lambda_max must be positive, got {lam.detach().flatten()[:8].tolist()}{hint}")
        scale = 2.0 / lam
        vertex = {"diag": diag * scale - 1.0}
        if edge_weight is None:        # off-diagonal entry left_v * right_u, scaled by u's lambda_max as in PyG
            first, step, edge = _chebyshev_first, _chebyshev_next, None
            vertex.update(left=left, right=right * scale)
        else:
            first, step = _weighted_chebyshev_first, _weighted_chebyshev_next
            edge = {"off": off * (scale[loop_free.src] if scale.dim() else scale)}
        tx0, out = x, self.lins[0](x)
        if len(self.lins) > 1:
            tx1 = first(loop_free, {"h": x, **vertex}, edge)
            out = out + self.lins[1](tx1)
            for lin in self.lins[2:]:      # by forward, as PyG calls them: their hooks do not run
                tx0, tx1 = tx1, step(loop_free, {"h": tx1, "prev": tx0, **vertex}, edge)
                out = out + lin.forward(tx1)
        return out if self.bias is None else out + self.bias

    @property
    def row_mixing(self) -> str | None:
        """Why an output row can depend on rows it has no edge from, or None: with
        ``normalization=None`` the default lambda_max is twice the largest degree over
        the whole graph, so a padded batch's spare vertices (2+ out-edges each where its
        spare edges outnumber them) changed the real graphs' outputs. A step replayed on
        padded batches reads this (`training.captured_step.row_mixing_module`) and runs
        eagerly on the plain batches instead; a lambda_max passed to forward is not
        known then, so that step runs eagerly too."""
        if self.normalization is None:
            return "normalization=None: its default lambda_max is twice the largest degree of all rows"
        return None

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, K={len(self.lins)}, normalization={self.normalization}"
