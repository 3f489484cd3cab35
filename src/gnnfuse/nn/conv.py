"""Graph convolutions with PyG's names, arguments and parameter layout, whose graph part
is written in gnnfuse's own front ends and compiled.

Each layer keeps the dense transform (a matmul every backend already does well) in
torch and writes only the part that moves data along edges -- gather, per-edge
arithmetic, aggregation -- as a vertex-centric or message/reduce function, which the
compiler fuses into one kernel forward and one backward. Parameter names and shapes
match PyG, so ``layer.load_state_dict(pyg_layer.state_dict())`` copies a PyG model.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .. import frontend
from ..graph import Graph
from ..graph.convert import check_bipartite_adj_t, coalesced, declared_size
from ..graph.fixed_shape import is_padded, loader_position, per_step
from ..runtime.compile_op import GRAPH_STEPS, GraphRef
from ..runtime.compiled import backend_name, on_first_pass
from ..runtime.autocast import AUTOCAST_DEVICE_TYPES, autocast_dtype
from .aligned_linear import RowsRead, aligned_linear, bias_added, flat_heads, kernel_row_stride, paired_linear
from .aggregation import Reduction, aggregate, eager_slots, pyg_aggr_name, resolve_aggregation
from .arguments import (adjacency_weights, edge_weight_column, floating_node_features, node_pair, refuse_stored_loops,
                        over_feature_batches, weighted_degrees)
from .attention_weights import AttentionOutput, attention_weights, check_attention_request
from .compiling import compile_path, graph_input_problem, propagation_problem, traced_layer
from .edge_features import FillValue, edge_projection, edge_rows, traced_edge_matmul
from .fixed_aggregation import FixedAggregation
from .fixed_flow import FixedFlow
from .padded_loops import padded_looped
from .plain_linear import plain_linear
from .pyg_options import message_passing_options
from .pyg_repr import OneLineRepr
from . import pyg_init, recompute
from .torchscript import NotScriptable

_UNSIZED = nn.parameter.UninitializedParameter     # a lazy map's weight before its first call


def _unsized(weight: Any) -> bool:
    """Whether ``weight`` is a lazy map's, not materialized yet (`_UNSIZED`). A plain
    ``Parameter`` is answered without ``isinstance``, which on a parameter class runs
    torch's Python ``__instancecheck__`` (two calls; SAGEConv asks twice per call)."""
    return type(weight) is not nn.Parameter and isinstance(weight, _UNSIZED)


def _as_graph(graph: Graph | torch.Tensor, num_nodes: int) -> Graph:
    """Accept a PyG ``edge_index`` (or ``EdgeIndex``, or a sparse ``adj_t``) for drop-in
    use. `Graph.coerce` remembers the graph made for an unchanged index tensor, so a
    loop passing the same ``edge_index`` reuses its cached CSR as a `Graph` would."""
    if isinstance(graph, Graph):
        if graph.is_bipartite and graph.num_src_nodes != graph.num_nodes:
            # (the layers without bipartite input come here too: the advice names them)
            raise ValueError(f"x has {num_nodes} rows but the graph has {graph.num_src_nodes} source and "
                             f"{graph.num_nodes} destination nodes; pass (x_src, x_dst) to a layer that takes "
                             "bipartite input (GCNConv, APPNP, SGConv, TAGConv and ChebConv need a graph with "
                             "one vertex set)")
        if graph.num_nodes != num_nodes:
            raise ValueError(f"x has {num_nodes} rows but the graph has {graph.num_nodes} nodes")
        return GraphRef.of(graph, num_nodes) if traced_layer() else graph
    if traced_layer():     # a covered layer under torch.compile (nn.compiling)
        return GraphRef.of(graph, num_nodes)
    return Graph.coerce(graph, num_nodes=num_nodes)


def _bipartite_inputs(x, graph: Graph | torch.Tensor, size, layer: str, weighted_adj_t: Any = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None, Graph]:
    """``(x_src, x_dst, graph)`` for a layer taking PyG's bipartite input (`node_pair`):
    a pair gives a graph whose sources index ``x_src`` and destinations ``x_dst``; one
    tensor is both, on a graph with one vertex set. ``weighted_adj_t`` is the graph
    argument as the user gave it, where `adjacency_weights` may have turned a weighted
    sparse adj_t into ``graph`` (an edge_index, which has lost the adjacency's shape):
    that adj_t's shape is checked against the pair's counts here, as `Graph.from_adj_t`
    checks an unweighted one's. Without ``x_dst`` and ``size``
    the destination count is the one the adjacency declares, as PyG reads it."""
    adjacency = graph if weighted_adj_t is None else weighted_adj_t
    if size is None and isinstance(x, (tuple, list)) and len(x) == 2 and x[1] is None:
        size = declared_size(adjacency)
    x_src, x_dst, sizes = node_pair(x, size, layer)
    if sizes is None:
        return x_src, x_dst, _as_graph(graph, x_src.shape[0])
    if weighted_adj_t is not None and weighted_adj_t is not graph:
        check_bipartite_adj_t(weighted_adj_t, sizes[1], sizes[0])
    if traced_layer():
        checked = Graph.coerce(graph, num_nodes=sizes[1], num_src_nodes=sizes[0]) if isinstance(graph, Graph) else graph
        return x_src, x_dst, GraphRef.of(checked, sizes[1], sizes[0])
    return x_src, x_dst, Graph.coerce(graph, num_nodes=sizes[1], num_src_nodes=sizes[0])


def attention_adjacency(edge_index: Any, edge_attr: torch.Tensor | None, layer: str) -> Any:
    """GAT's and GATv2's graph argument: an uncoalesced COO adj_t as its `coalesced`
    matrix, which is how PyG's layers read it (adding self loops coalesces it). With
    ``edge_attr`` that is refused: its rows follow the stored entries, which coalescing
    reorders, so they would meet other edges (PyG refuses the pair as well)."""
    merged = coalesced(edge_index)
    if merged is not edge_index and edge_attr is not None:
        raise ValueError(f"{layer}: edge_attr with an uncoalesced COO adj_t: its rows follow the stored "
                         "entries, which the coalesced matrix orders otherwise; pass adj_t.coalesce() with "
                         "edge_attr in that order, or an edge_index")
    return merged


# the batch positions (`graph.fixed_shape.loader_position`) of the loader blocks whose
# self-looped graph a layer of this process has asked for
_LOOPED_POSITIONS: set[int] = set()


def _looped(graph: Graph | GraphRef) -> Graph | GraphRef:
    """The graph with exactly one self loop per vertex, as PyG's ``add_self_loops`` does."""
    if isinstance(graph, GraphRef):
        return graph.derived("looped")
    position = loader_position(graph)       # a loader block's (None for any other graph)
    if position is not None:
        _LOOPED_POSITIONS.add(position)
    return self_looped(graph)


def self_looped(graph: Graph) -> Graph:
    """``graph`` with exactly one self loop per vertex, cached on it. Building it reads
    counts back from the device (the loops to drop, the new graph's rows), so a layer
    asking for it on a loader's block would sync in the training step once per layer and
    batch; the first such request makes the loader build it, and its layouts, for the
    blocks at the same position in the batches that follow (`looped_blocks_wanted`,
    `loader.layouts`): a GAT over PyG's ``batch.edge_index`` asks for the batch's
    PyG view's, never for its blocks'."""
    return graph.cached("nn_self_looped", GRAPH_STEPS["looped"])


def looped_blocks_wanted(position: int) -> bool:
    """Whether a layer of this process has asked for the self-looped graph of a loader
    block at ``position`` in its batch."""
    return position in _LOOPED_POSITIONS


def looped_positions() -> frozenset[int]:
    """Every position `looped_blocks_wanted` answers yes for: what a loader's worker
    processes, which never see a step, are told (`want_looped`)."""
    return frozenset(_LOOPED_POSITIONS)


def want_looped(positions: Iterable[int]) -> None:
    """Mark ``positions`` as asked for (a worker process, told by the training process)."""
    _LOOPED_POSITIONS.update(positions)


def _with_loops(graph: Graph, add_self_loops: bool, vertex_data_only: bool = False) -> Graph:
    """The graph an attention or propagation layer runs on: `_looped` when the layer's
    ``add_self_loops`` asks for it, else as given. ``vertex_data_only``: the caller reads
    no per-edge tensor of the looped graph (no edge features, no attention weights
    returned), so on a padded block (`graph.fixed_shape`) the fixed-shape looped graph
    serves, whose edge ids differ from `_looped`'s (`nn.padded_loops`); it is built on
    every call, or once per step where the graph's owner marks its steps
    (`fixed_shape.per_step`), never cached across them, so a captured step rebuilds it
    on every replay."""
    if not add_self_loops:
        return graph
    if vertex_data_only and isinstance(graph, Graph) and is_padded(graph):
        return per_step(graph, "nn_padded_looped", padded_looped)
    return _looped(graph)


def _inv_sqrt_degree(graph: Graph | GraphRef, dtype: torch.dtype) -> torch.Tensor:
    """deg^-1/2 by in-degree, 0 for isolated vertices (PyG's ``gcn_norm``), computed in
    float64 and cast to ``dtype``. Cached per graph and dtype, cast included: every layer
    of a model runs on the same graph, and a cast per layer call was an op per layer;
    under torch.compile computed in the traced graph from the index tensors."""
    def inv_sqrt(degree: torch.Tensor) -> torch.Tensor:
        norm = degree.to(torch.float64).pow(-0.5)
        return norm.masked_fill(torch.isinf(norm), 0.0).unsqueeze(-1)
    if isinstance(graph, GraphRef):
        return inv_sqrt(graph.in_degrees(torch.float64)).to(dtype)
    key = _INV_SQRT_KEYS.get(dtype) or _INV_SQRT_KEYS.setdefault(dtype, f"nn_inv_sqrt_degree_{dtype}")
    return graph.cached(key, lambda g: inv_sqrt(g.in_degrees()).to(dtype))


# the graph cache's key of `_inv_sqrt_degree` per dtype (float64: the uncast norm's)
_INV_SQRT_KEYS: dict[torch.dtype, str] = {torch.float64: "nn_inv_sqrt_degree"}


def _improved_gcn_norm(graph: Graph, dtype: torch.dtype) -> tuple[Graph, torch.Tensor, torch.Tensor]:
    """(graph without self loops, deg^-1/2, self-loop weight) for ``A + 2I``, cached per graph.

    PyG's ``add_remaining_self_loops`` semantics: a vertex that already has a self loop
    keeps it at weight 1, every other vertex gets a loop of weight 2. The loops are kept
    out of the edge list and applied per vertex, so no |E|-sized weight is ever built.
    """
    def build(g: Graph) -> tuple[Graph, torch.Tensor, torch.Tensor]:
        loop_free = g.remove_self_loops()
        has_loop = torch.zeros(g.num_nodes, dtype=torch.bool, device=g.device)
        has_loop[g.src[g.src == g.dst]] = True
        fill = torch.where(has_loop, 1.0, 2.0).to(torch.float64).unsqueeze(-1)
        norm = (loop_free.in_degrees().to(torch.float64).unsqueeze(-1) + fill).pow(-0.5)
        return loop_free, norm, fill
    loop_free, norm, fill = graph.cached("nn_improved_gcn_norm", build)
    return loop_free, norm.to(dtype), fill.to(dtype)


def _gcn_edge_norm(graph: Graph, edge_weight: torch.Tensor, dtype: torch.dtype, add_self_loops: bool,
                   fill: float = 1.0, normalize: bool = True) -> tuple[Graph, torch.Tensor]:
    """(graph, per-edge weight [E', 1]) of PyG's ``gcn_norm`` given explicit edge weights.

    With ``add_self_loops`` every vertex ends with exactly one loop (`_looped`'s edge
    order), weighted by the weight of its existing loop or else ``fill`` -- PyG's
    ``add_remaining_self_loops``, also where a vertex has several loops: one of their
    weights by ``index_put``, the last on CPU and an unspecified one on CUDA, as PyG's.
    With ``normalize`` each weight is scaled by deg^-1/2 of both ends, a vertex's degree
    summing the weights of its in-edges (0 where that is 0).
    Computed in torch on every call: the weights may change between calls and carry
    gradients, which flow through this normalisation as they do in PyG.
    """
    weight = edge_weight_column(edge_weight, graph, dtype)
    if add_self_loops:
        is_loop = graph.src == graph.dst
        loop_weight = weight.new_full((graph.num_nodes,), fill).index_put((graph.src[is_loop],), weight[is_loop])
        graph, weight = _looped(graph), torch.cat([weight[~is_loop], loop_weight])
    if normalize:
        inv_sqrt = weighted_degrees(weight, graph.dst, graph.num_nodes).pow(-0.5)
        inv_sqrt = inv_sqrt.masked_fill(torch.isinf(inv_sqrt), 0.0)
        weight = inv_sqrt[graph.src] * weight * inv_sqrt[graph.dst]
    return graph, weight.unsqueeze(-1)


def _normalized_hop(graph: Graph, edge_weight: torch.Tensor | None, dtype: torch.dtype, add_self_loops: bool,
                    normalize: bool = True) -> tuple[Graph, Callable[[torch.Tensor], torch.Tensor]]:
    """(the graph propagated over, ``h -> Â h``) for PyG's ``gcn_norm`` adjacency ``Â``.

    Without edge weights ``Â`` is read as per-vertex deg^-1/2 factors (all ones with
    ``normalize=False``), so a hop gathers no |E|-sized array; with them, as one weight per
    edge (`_gcn_edge_norm`).
    """
    if edge_weight is not None:
        graph, weight = _gcn_edge_norm(graph, edge_weight, dtype, add_self_loops, normalize=normalize)
        return graph, lambda h: _weighted_sum(graph, {"h": h}, {"w": weight})
    graph = _with_loops(graph, add_self_loops, vertex_data_only=True)     # per-vertex norms only
    norm = (_inv_sqrt_degree(graph, dtype) if normalize
            else torch.ones(graph.num_nodes, 1, dtype=dtype, device=graph.device))
    return graph, lambda h: _normalized_sum(graph, {"h": h, "norm": norm})


def _walk_starts(graph: Graph, hops: int) -> RowsRead | None:
    """The vertices some walk of exactly ``hops`` edges leaves (one per source vertex),
    whose features a ``hops``-hop propagation carries to an output; None when that is
    every vertex. Cached per graph. On a bipartite graph only ``hops=1`` is meaningful (a
    walk cannot continue from a destination)."""
    def build(g: Graph) -> RowsRead | None:
        if not hops:
            return None     # a walk of no edge leaves every vertex
        # the first hop reaches every vertex, so it leaves every edge's source, marked by index
        # (picked by a boolean mask of every edge, they were a read-back: a sync per graph on a GPU)
        starts = torch.zeros(g.num_src_nodes, dtype=torch.bool, device=g.device).index_fill_(0, g.src, True)
        for _ in range(hops - 1):
            reached, starts = starts, torch.zeros(g.num_src_nodes, dtype=torch.bool, device=g.device)
            starts[g.src[reached[g.dst]]] = True
        return RowsRead.of(starts)
    return graph.cached(f"nn_walk_starts_{hops}", build)


def _aligned(lin: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``lin(x)`` laid out for the kernels that aggregate it (`aligned_linear`) when
    ``lin`` is a plain, unhooked ``nn.Linear``; a replaced or hooked map runs as it is."""
    if plain_linear(lin):
        return aligned_linear(x, lin.weight, lin.bias)
    return lin(x)


def _transform_first(x: torch.Tensor, weight: torch.Tensor, graph: Graph, hops: int) -> torch.Tensor:
    """``x W^T`` for a layer that moves its linear map before ``hops`` propagations over
    ``graph`` (so they move narrower rows) where PyG applies it after, with PyG's gradients.

    Every row is transformed (its value travels the shorter walks it starts and reaches
    what PyG's intermediate hops reach, edge weights' gradients included), but the
    weight's gradient takes only the rows some ``hops``-walk leaves (`rows_read`), in
    one GEMM per pass (`aligned_linear`, which also lays the rows out for the kernels).
    """
    return aligned_linear(x, weight, read=transform_first_rows(graph, hops))


def transform_first_rows(graph: Graph, hops: int) -> RowsRead | None:
    """The `_walk_starts` rows `_transform_first` reads on ``graph`` (None: every row),
    built and cached on first use. Building them reads counts back from the device (a
    sync, and a break in graph capture), so a mini-batch loader builds them for each
    block in its own thread rather than leaving it to the training step."""
    return _walk_starts(graph, hops)


def known_transform_first_rows(graph: Graph, unread: torch.Tensor) -> None:
    """Give ``graph`` the rows a one-hop `_transform_first` reads when its builder knows
    them: ``unread`` are the ids of the sources no edge leaves (a sampler knows which
    destinations it sampled no edge from, and every other source was sampled).
    `transform_first_rows` then counts nothing on the device."""
    read = None
    if unread.numel():
        mask = torch.ones(graph.num_src_nodes, dtype=torch.bool, device=graph.device).index_fill_(0, unread, False)
        read = RowsRead(mask, unread)
    graph.cached("nn_walk_starts_1", lambda _: read)


def _layer_graph(layer: nn.Module, name: str, x: torch.Tensor, graph: Graph | torch.Tensor, cache: bool) -> Graph:
    """The graph a layer with PyG's ``cached`` flag propagates over.

    With ``cache`` the first graph is kept on the layer and reused on every later call,
    whatever graph is passed then -- PyG's transductive-only ``cached=True`` contract. The
    normalisation lives in that graph's own cache, so it is computed once. What is kept
    is a copy with index tensors of its own (`Graph.clone`, one per graph, shared by the
    layers caching it): PyG keeps a normalised copy, so an ``edge_index`` edited in place
    after the first call leaves its result unchanged, where a graph sharing the edited
    memory is refused (`Graph.check_unchanged`).

    As PyG's, the kept graph serves only a normalising call (PyG's layers neither read nor
    fill their cache with ``normalize=False``: the kept graph served such a call, 3.4 off
    PyG's GCN given another graph), and whether or not ``cached`` is still set. PyG keeps
    the *normalised* adjacency, so a setting that normalisation read (`CachedGraph`'s
    ``_normalised_by``: self loops, GCN's ``improved`` and ``flow``) changed after the first
    call does not reach it there, where the kept graph was normalised anew with the new
    setting (GCN 1.2 off PyG after ``add_self_loops = False``): that is refused, naming it.
    """
    if not layer.normalize:
        return _as_graph(graph, x.shape[0])
    kept = layer._cached_graph
    if kept is not None:
        if kept.num_nodes != x.shape[0]:
            raise ValueError(f"x has {x.shape[0]} rows but the cached graph has {kept.num_nodes} nodes "
                             "(cached=True reuses the first graph; call reset_parameters() to drop it)")
        for setting, then in zip(layer._normalised_by, layer._cached_settings):
            now = getattr(layer, setting)
            if now != then:
                raise ValueError(f"{name}(cached=True) normalised the graph of its first call with {setting}={then!r} "
                                 f"and keeps that normalisation, as PyG's layer does, which would not apply "
                                 f"{setting}={now!r}: set it back, or drop the cache first (reset_parameters(), or "
                                 "_cached_edge_index = None)")
        return kept
    graph = _as_graph(graph, x.shape[0])
    if cache:
        graph = layer._cached_graph = graph.cached("cached_layer_graph", Graph.clone)
        layer._cached_settings = tuple(getattr(layer, setting) for setting in layer._normalised_by)
    return graph


def _normalized_layer_inputs(layer: nn.Module, name: str, x: torch.Tensor, edge_index: Graph | torch.Tensor,
                             edge_weight: torch.Tensor | None) -> tuple[torch.Tensor, Graph, torch.Tensor | None]:
    """``(x, graph, edge_weight)`` for a normalising layer with PyG's ``cached`` flag (GCN,
    APPNP): a weighted sparse ``adj_t`` becomes ``edge_weight``, and caching keeps the graph
    -- the normalisation lives in its cache -- so weights, which that normalisation ignores,
    are refused with it (or with a kept graph, ``cached`` since unset) rather than silently
    reusing a normalisation computed without them."""
    x = floating_node_features(x, name)
    given, (edge_index, edge_weight) = edge_index, adjacency_weights(edge_index, edge_weight, name, x.shape[0])
    if layer.normalize and layer.add_self_loops:
        refuse_stored_loops(given, name)
    if edge_weight is not None and layer.normalize and (layer.cached or layer._cached_graph is not None):
        raise NotImplementedError(f"{name}(cached=True) with edge weights (edge_weight, or a sparse adj_t's values "
                                  "other than 1) is not supported: the cache "
                                  "holds the graph's normalisation, not the weights'")
    return x, _layer_graph(layer, name, x, edge_index, layer.cached), edge_weight


class CachedGraph:
    """Mixin for layers with PyG's ``cached=True``: the graph kept by `_layer_graph` under
    the names PyG users reach for. PyG keeps ``_cached_edge_index`` (for an edge_index) and
    ``_cached_adj_t`` (for a sparse adjacency), and users clear the cache by setting them
    to None; here both name the one kept `Graph`, so setting either to None drops it."""

    _cached_graph: Graph | None
    # the attributes besides the graph that the layer's normalisation reads, and their
    # values when the kept graph was cached (`_layer_graph` refuses a later change)
    _normalised_by: tuple[str, ...] = ("add_self_loops",)
    _cached_settings: tuple[Any, ...] = ()

    @property
    def _cached_edge_index(self) -> Graph | None:
        return self._cached_graph

    @_cached_edge_index.setter
    def _cached_edge_index(self, value: None) -> None:
        self._drop_cached_graph(value, "_cached_edge_index")

    @property
    def _cached_adj_t(self) -> Graph | None:
        return self._cached_graph

    @_cached_adj_t.setter
    def _cached_adj_t(self, value: None) -> None:
        self._drop_cached_graph(value, "_cached_adj_t")

    def _drop_cached_graph(self, value: None, name: str) -> None:
        if value is not None:
            raise ValueError(f"{name} can only be set to None (to drop the cached graph); gnnfuse keeps the "
                             "graph of the first call itself")
        self._cached_graph = None


@frontend.vertex
def _normalized_sum(v):
    return sum([u.h * u.norm for u in v.innbs]) * v.norm


def _normalized_sum_plus(bias: torch.Tensor, v):
    """`_normalized_sum` plus a bias, which the Triton backend adds inside the sum's
    kernel (passes.fusion._row_added) instead of in a pass over the output of its own."""
    return sum([u.h * u.norm for u in v.innbs]) * v.norm + bias


@frontend.vertex
def _normalized_sum_with_loops(v):
    return (sum([u.h * u.norm for u in v.innbs]) + v.h * v.norm * v.fill) * v.norm


@frontend.vertex
def _neighbour_mean(v):
    return sum([u.h for u in v.innbs]) / len(v.innbs)


@frontend.vertex
def _neighbour_max(v):
    return max([u.h for u in v.innbs])


@frontend.vertex
def _neighbour_sum(v):
    return sum([u.h for u in v.innbs])


_AGGREGATORS = {"mean": _neighbour_mean, "max": _neighbour_max, "sum": _neighbour_sum, "add": _neighbour_sum}


@frontend.vertex
def _neighbour_mean_plus_root(v):
    return sum([u.h for u in v.innbs]) / len(v.innbs) + v.root


@frontend.vertex
def _neighbour_sum_plus_root(v):
    return sum([u.h for u in v.innbs]) + v.root


_AGGREGATORS_PLUS_ROOT = {"mean": _neighbour_mean_plus_root, "sum": _neighbour_sum_plus_root,
                          "add": _neighbour_sum_plus_root}


@frontend.vertex
def _weighted_sum(v):
    return sum([e.src.h * e.w for e in v.inedges])


@frontend.vertex
def _weighted_mean(v):
    return sum([e.src.h * e.w for e in v.inedges]) / len(v.inedges)


@frontend.vertex
def _weighted_max(v):
    return max([e.src.h * e.w for e in v.inedges])


# The same aggregations of messages ``w_e * h_u`` (PyG's edge_weight), ``w`` an [E, 1] edge feature.
_WEIGHTED_AGGREGATORS = {"mean": _weighted_mean, "max": _weighted_max, "sum": _weighted_sum, "add": _weighted_sum}


_FLOWS = ("source_to_target", "target_to_source")


def _check_flow(flow: str) -> None:
    if flow not in _FLOWS:
        raise ValueError(f"flow must be one of {list(_FLOWS)}, got {flow!r}")


def _along_flow(graph: Graph, flow: str) -> Graph:
    """The graph messages travel along: as given for PyG's default ``flow``
    ``"source_to_target"`` (edge_index[0] sends to edge_index[1]); reversed, and cached
    as such, for ``"target_to_source"``. ``flow`` is read on every call, since PyG users
    may set the attribute after construction."""
    _check_flow(flow)
    if flow == "source_to_target":
        return graph
    return graph.derived("reversed") if isinstance(graph, GraphRef) else graph.cached("reversed", Graph.reverse)


def _sized_linear(in_channels: int, out_channels: int, bias: bool = True,
                  weight_initializer: str | None = None) -> nn.Linear:
    """PyG's ``Linear`` (`pyg_init.linear`) for a map that is never lazy here: PyG's
    ``in_channels=-1`` is refused by name instead of as torch's "negative dimension"."""
    if isinstance(in_channels, int) and in_channels <= 0:
        raise NotImplementedError(f"in_channels={in_channels} (PyG's lazy initialisation) is not supported by "
                                  "this gnnfuse layer: give the input width")
    return pyg_init.linear(in_channels, out_channels, bias=bias, weight_initializer=weight_initializer)


def _channel_pair(in_channels: int | tuple[int, int]) -> tuple[int, int]:
    """PyG's ``in_channels``: one width for both vertex sets, or ``(source, destination)``."""
    return (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)


def _check_dropout(dropout: float) -> float:
    if not 0.0 <= dropout <= 1.0:     # (1: every attention weight dropped while training, as in PyG)
        raise ValueError(f"dropout must be in [0, 1], got {dropout}")
    return dropout


def _combine_heads(out: torch.Tensor, concat: bool, bias: torch.Tensor | None,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """[N, heads, C] -> [N, heads * C] (concat) or [N, C] (mean over heads), plus PyG's
    ``residual`` term (``res(x)``, when given) and the bias, in PyG's order. The mean
    over one head is that head itself, taken as a view: ``mean`` would copy the output
    forward and the gradient backward. Both views come from `flat_heads`, whose backward
    gives the program its gradient in the kernels' padded layout where they pad."""
    if concat or out.shape[1] == 1:
        out = flat_heads(out)                 # flatten, unlike reshape(N, -1), allows N = 0
    else:
        out = out.mean(dim=1)
    out = out if residual is None else out + residual
    return bias_added(out, bias)


def _head_bias(heads: int, out_channels: int, concat: bool, bias: bool) -> nn.Parameter | None:
    return nn.Parameter(torch.zeros(heads * out_channels if concat else out_channels)) if bias else None


def _head_residual(residual: bool, in_channels: int, heads: int, out_channels: int, concat: bool) -> nn.Linear | None:
    """PyG's ``res`` of the attention layers: ``x`` (``x_dst`` of bipartite input, so of
    width ``in_channels[1]``) mapped to the output width without bias, added to the
    combined heads before the bias. Lazy (``in_channels=-1``) as PyG's, drawn first at the
    first call (PyG maps ``x_dst`` through ``res`` before its other maps): the layers put
    it first in their `pyg_init.materialize`."""
    width = heads * out_channels if concat else out_channels
    return pyg_init.linear(_channel_pair(in_channels)[1], width, False, "glorot") if residual else None


class GCNConv(FixedAggregation, OneLineRepr, CachedGraph, NotScriptable, nn.Module):
    """Kipf & Welling's graph convolution, ``D^-1/2 (A + I) D^-1/2 X W + b``.

    ``improved=True`` uses ``A + 2I`` (a vertex that already has a self loop keeps it at
    weight 1, as PyG's ``add_remaining_self_loops`` does). Note that PyG 2.8 applies that
    fill only when an explicit ``edge_weight`` is passed; without one its ``improved``
    flag has no effect, whereas here it always means ``A + 2I``. ``normalize=False``
    sums ``X W`` over in-neighbours unscaled and, like PyG, adds no self loops.
    ``cached=True`` keeps the first graph (and its normalisation) for every later call.
    ``edge_weight`` (one number per edge, PyG's) scales each edge's message and enters
    the degrees; with it, ``improved`` fills loops with 2 as PyG's does.
    ``flow="target_to_source"`` (PyG's) sends messages from ``edge_index[1]`` to ``edge_index[0]``.
    """

    _normalised_by = ("improved", "add_self_loops", "flow")

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False, cached: bool = False,
                 add_self_loops: bool | None = None, normalize: bool = True, bias: bool = True,
                 flow: str = "source_to_target", **kwargs: Any):
        super().__init__()
        self.node_dim = message_passing_options(type(self).__name__, kwargs)
        _check_flow(flow)
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise ValueError("GCNConv does not support adding self-loops to the graph when no "
                             "normalization is applied (normalize=False needs add_self_loops=False)")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.improved, self.cached, self.flow = improved, cached, flow
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self._cached_graph: Graph | None = None
        self.lin = pyg_init.linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        pyg_init.reset_linear(self.lin, "glorot")
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cached_graph = None

    def _aggregates_first(self, x: torch.Tensor, graph: Graph, lin: nn.Module) -> bool:
        """PyG maps first; the normalized sum commutes with the map, so aggregate first
        where that moves fewer feature lanes over the step (`maps_first`: a first layer,
        whose input needs no gradient, narrowing by less than half).
        Under torch.compile (a GraphRef) the order stays PyG's, and so it does for sparse
        COO features (bag-of-words), which the compiled aggregation cannot read, and under
        torch.autocast: PyG's map gives the autocast dtype and its float32 normalisation
        then promotes the sum to float32, where the map after the sum gave bfloat16.
        ``lin``: the layer's, as `forward` read it."""
        if (isinstance(graph, GraphRef) or x.is_sparse or autocast_dtype(x.device.type) is not None
                or not plain_linear(lin)):
            return False
        return not maps_first(lin.in_features, self.out_channels, x, lin.weight)

    def _compile_problem(self, x: Any, edge_index: Any, edge_weight: Any = None) -> str | None:
        if self.improved and self.add_self_loops and edge_weight is None:
            return "improved=True"
        return propagation_problem(edge_index, edge_weight, self.cached and self.normalize)

    @over_feature_batches
    @compile_path(_compile_problem)
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        x, graph, edge_weight = _normalized_layer_inputs(self, "GCNConv", x, edge_index, edge_weight)
        lin = self.lin      # read once (a Module.__getattr__ call per read)
        pyg_init.materialize([(lin, x)], "glorot")
        graph = _along_flow(graph, self.flow)
        if edge_weight is None and self.normalize and not self.improved and self._aggregates_first(x, graph, lin):
            graph = _with_loops(graph, self.add_self_loops, vertex_data_only=True)
            # the bias in the GEMM's epilogue: one pass over the [N, out] output fewer
            return F.linear(_normalized_sum(graph, {"h": x, "norm": _inv_sqrt_degree(graph, x.dtype)}),
                            lin.weight, self.bias)
        h = _aligned(lin, x)
        if edge_weight is not None:
            # loops only while normalising, as PyG's forward (``normalize = False`` set after
            # construction leaves ``add_self_loops`` at the True it defaulted to)
            graph, weight = _gcn_edge_norm(graph, edge_weight, x.dtype, self.add_self_loops and self.normalize,
                                           2.0 if self.improved else 1.0, self.normalize)
            out = _weighted_sum(graph, {"h": h}, {"w": weight})
        elif not self.normalize:
            out = _neighbour_sum(graph, {"h": h})
        elif self.improved and self.add_self_loops:
            loop_free, norm, fill = _improved_gcn_norm(graph, x.dtype)
            out = _normalized_sum_with_loops(loop_free, {"h": h, "norm": norm, "fill": fill})
        else:
            graph = _with_loops(graph, self.add_self_loops, vertex_data_only=True)
            norm = _inv_sqrt_degree(graph, x.dtype)
            if self.bias is not None and not torch.compiler.is_compiling():
                # added by the aggregation's kernel as it stores each row; a program built
                # per call is not something torch.compile traces, so it keeps the add
                return frontend.vertex(functools.partial(_normalized_sum_plus, self.bias))(graph, {"h": h, "norm": norm})
            out = _normalized_sum(graph, {"h": h, "norm": norm})
        return bias_added(out, self.bias)


def maps_first(width_in: int, width_out: int, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The static order of a map around a commuting aggregation of ``x``: by feature
    lanes moved over the step (`combine_first_moves_less`), except on the Numba CPU
    backend, which keeps mapping first whenever the map narrows: its register-row kernels
    are built for rows of up to 64 lanes, and on a 2-core CPU the lane rule's order was no
    faster (arxiv-sized GCN step, one thread, steps alternating in one process: 1028 ms
    aggregating first against 957 ms mapping first; separate runs, noisier, gave 987
    against 1048)."""
    if backend_name(x.is_cuda) == "cpu":
        return width_out < width_in
    grad = torch.is_grad_enabled()
    return combine_first_moves_less(width_in, width_out, grad and x.requires_grad, grad and weight.requires_grad)


def combine_first_moves_less(width_in: int, width_out: int, input_grad: bool, weight_grad: bool) -> bool:
    """Whether mapping ``width_in -> width_out`` before a commuting aggregation gathers
    fewer feature lanes along the edges than mapping after it, counted over a training
    step. Mapping first aggregates ``width_out`` lanes forward and, when anything needs
    a gradient, again backward (the weight's gradient needs the aggregated output
    gradient); aggregating first aggregates ``width_in`` lanes forward and backward only
    for the input's gradient (the weight's comes from the saved aggregate, at the cost
    of keeping it). So a first layer, whose input needs no gradient, maps first only
    when that more than halves the width: products-sized SAGE's 100 -> 64 aggregates
    first (100 lanes once rather than 64 twice). Ties aggregate first: one pass fewer."""
    forward_only_combine = not (input_grad or weight_grad)
    combine_lanes = width_out * (1 if forward_only_combine else 2)
    aggregate_lanes = width_in * (2 if input_grad else 1)
    return combine_lanes < aggregate_lanes


class SAGEConv(FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    """GraphSAGE: ``lin_l(aggr_{u in N(v)} x_u) + lin_r(x_v)``.

    For mean and sum aggregation the linear map commutes with the aggregation, so when
    that has the graph kernels move fewer feature lanes over the step
    (`maps_first`) it runs first -- GraphTensor's combine-first order; max does not
    commute and always aggregates first. Bipartite input (PyG's): ``in_channels=(a, b)``
    and ``forward((x_src, x_dst), edge_index, size)``.

    ``aggr`` takes what PyG's does (`aggregation`): a name, a list of names combined as
    ``aggr_kwargs`` says (PyG's ``MultiAggregation``), or an ``Aggregation`` module, held
    in ``aggr_module`` as in PyG. Sum, mean, max, min, var, std and softmax are fused;
    others run PyG's module eagerly, with a warning.
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, aggr: Any = "mean",
                 normalize: bool = False, root_weight: bool = True, project: bool = False, bias: bool = True,
                 aggr_kwargs: dict | None = None, **kwargs: Any):
        super().__init__()
        self.node_dim = message_passing_options(type(self).__name__, kwargs, aggr=())     # its aggr is its own argument
        in_src, in_dst = _channel_pair(in_channels)
        if aggr == "lstm":      # PyG sizes the LSTM by the sources' width
            aggr_kwargs = {"in_channels": in_src, "out_channels": in_src, **(aggr_kwargs or {})}
        self.aggr_module = resolve_aggregation("SAGEConv", aggr, aggr_kwargs)
        if project and in_src <= 0:
            raise ValueError("'SAGEConv' does not support lazy initialization with `project=True`")
        self.in_channels, self.out_channels, self.aggr = in_channels, out_channels, pyg_aggr_name(aggr)
        self.normalize, self.project = normalize, project
        self.lin = _sized_linear(in_src, in_src, bias=True) if project else None   # PyG: the sources' width
        self.lin_l = pyg_init.linear(self._aggregated_width(in_src), out_channels, bias)
        self.lin_r = pyg_init.linear(in_dst, out_channels, False) if root_weight else None
        self.reset_parameters()

    @property
    def root_weight(self) -> bool:
        """PyG's attribute: whether the root term ``lin_r(x_v)`` is added. Set to False
        after construction (PyG's ``DirGNNConv`` does so on its copies of the layer) it
        keeps ``lin_r`` and its ``state_dict`` entry, unused, as PyG's does; a layer built
        without ``lin_r`` cannot take the term back."""
        return self.lin_r is not None and not self._root_dropped

    @root_weight.setter
    def root_weight(self, value: bool) -> None:
        if value and self.lin_r is None:
            raise AttributeError("SAGEConv: root_weight=True needs lin_r, which a layer built with "
                                 "root_weight=False does not have; build the layer with root_weight=True")
        self._root_dropped = not value

    # A plain attribute, not read through ``self.__dict__.get``: dynamo guarded no such
    # read, and a compiled layer kept adding lin_r(x) after root_weight was set to False
    _root_dropped = False

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr={self.aggr}"

    placement = None     # a `nn.placement.PlacementModel` choosing the order per call, or the static rule

    def _combine_first(self, graph: Graph, messages: torch.Tensor, lin_l: nn.Module, weight_l: torch.Tensor) -> bool:
        """Whether the linear map runs before the aggregation (mean/sum only): by the
        `placement` model when one is installed (GraphTensor's DKP), else by the static
        rule `maps_first`. ``lin_l`` and its weight as `forward` read them (once a call).
        Never under torch.autocast, as GCNConv: the map first gives autocast-dtype rows
        whose sum then takes ``lin_l``'s float32 bias, so without a root term the layer
        returned float32 where PyG's returns the autocast dtype (checked inline: a hot path)."""
        if isinstance(graph, GraphRef) or not plain_linear(lin_l):  # torch.compile: no per-graph row masks
            return False
        device_type = messages.device.type
        if device_type in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type):
            return False
        width = lin_l.in_features
        if not width:     # lazy in_channels: not materialized yet
            return False
        if self.placement is None:
            return maps_first(width, self.out_channels, messages, weight_l)
        input_grad = torch.is_grad_enabled() and messages.requires_grad
        return self.placement.combine_first(graph, width, self.out_channels, input_grad)

    @staticmethod
    def _root_takes_bias(x_dst: torch.Tensor | None, lin_r: Any, weight_r: torch.Tensor | None) -> bool:
        """Whether the root term can carry ``lin_l``'s bias into its GEMM's epilogue: a
        root term ``lin_r`` with a materialized weight ``weight_r`` and no bias of its own."""
        return x_dst is not None and plain_linear(lin_r, bias=False) and not _unsized(weight_r)

    def _aggregated_width(self, width: int) -> int:
        """The width of the aggregated rows ``lin_l`` maps, for messages ``width`` wide
        (``MultiAggregation``: ours, or PyG's passed as a module)."""
        if type(self.aggr_module).__name__ == "MultiAggregation":
            return self.aggr_module.get_out_channels(width)
        return width

    def reset_parameters(self) -> None:
        if hasattr(self.aggr_module, "reset_parameters"):
            self.aggr_module.reset_parameters()
        for lin in (self.lin, self.lin_l, self.lin_r):
            pyg_init.reset_linear(lin)

    def _compile_problem(self, x: Any, edge_index: Any, size: Any = None) -> str | None:
        eager = eager_slots(self.aggr_module)
        if eager:
            return f"aggregation {', '.join(eager)} runs PyG's module eagerly"
        if any(isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()
               for m in (self.lin_l, self.lin_r)):
            return "lazy in_channels=-1 before the first call"
        return graph_input_problem(edge_index)

    @over_feature_batches
    @compile_path(_compile_problem)
    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None], edge_index: Graph | torch.Tensor,
                size: tuple[int, int] | None = None) -> torch.Tensor:
        # the submodules and parameters read once, into locals: each read of one is a
        # Module.__getattr__ call, and reading them where used was 21 per call
        aggr_module, lin_l, lin_r = self.aggr_module, self.lin_l, self.lin_r if self.root_weight else None
        kind = aggr_module.kind if isinstance(aggr_module, Reduction) else None
        if kind != "sum":
            # PyG aggregates a sparse adj_t by spmm, which sums a COO tensor's repeated
            # entries into one neighbour (then refused as a weight): a mean or max over
            # the stored entries would count it twice
            edge_index = coalesced(edge_index)
        x, x_dst, graph = _bipartite_inputs(x, edge_index, size, "SAGEConv")
        messages = x
        if self.project:      # PyG projects the sources only
            if self.lin is None:    # project=True set on a layer built without its lin
                raise AttributeError("SAGEConv: project=True needs lin, which a layer built with project=False "
                                     "lacks (PyG's skips the projection then); build it with project=True")
            messages = F.relu(self.lin(x))
        # the weights as stored, not ``lin.weight``: a parametrized one (spectral_norm) is
        # recomputed, power iteration and all, by each read, and such a map is called below,
        # which reads it again (PyG reads it once). Only a plain map's weight is used here
        weight_l = lin_l._parameters.get("weight")
        weight_r = None if lin_r is None else lin_r._parameters.get("weight")
        if _unsized(weight_l) or _unsized(weight_r):
            pyg_init.materialize([(lin_l, self._aggregated_width(messages.shape[-1])), (lin_r, x_dst)])
            weight_l, weight_r = lin_l.weight, getattr(lin_r, "weight", None)
        if kind in ("sum", "mean") and self._combine_first(graph, messages, lin_l, weight_l):
            if self._root_takes_bias(x_dst, lin_r, weight_r):
                # the root term carries lin_l's bias in its GEMM's epilogue, and the
                # aggregation's kernel adds it to each row it stores (passes.fusion.
                # _row_added), reading it where the GEMM wrote it (`aligned_linear`):
                # no pass over the output of its own. Both maps of one input share a
                # backward that sums their gradients for it inside a GEMM (`paired_linear`).
                if x_dst is messages:
                    h, root = paired_linear(messages, weight_l, transform_first_rows(graph, 1), weight_r, lin_l.bias)
                else:
                    h = _transform_first(messages, weight_l, graph, 1)
                    root = aligned_linear(x_dst, weight_r, lin_l.bias)
                out = _AGGREGATORS_PLUS_ROOT[kind](graph, {"h": h, "root": root})
                return F.normalize(out, p=2.0, dim=-1) if self.normalize else out
            out = _AGGREGATORS[kind](graph, {"h": _transform_first(messages, weight_l, graph, 1)})
            bias_l = lin_l.bias
            if bias_l is not None:
                out = out + bias_l
        else:
            aggregated = (_AGGREGATORS[kind](graph, {"h": messages}) if kind in _AGGREGATORS
                          else aggregate("SAGEConv", aggr_module, graph, messages))
            if self._root_takes_bias(x_dst, lin_r, weight_r) and plain_linear(lin_l):
                # lin_l(aggregated) + lin_r(x_dst) as the root term (lin_l's bias in its
                # epilogue, its gradient a matrix-vector product) plus one GEMM that adds
                # onto it: no [N, out] addition and no bias reduction over the rows (on
                # the arxiv-sized SAGE step's first layer an 85 us pair of kernels). In place
                # unless the root term is a view into a padded table (autograd forbids it) or
                # the operands' dtypes differ: under torch.autocast the root term comes back
                # in the autocast dtype while the weight and the aggregation stay float32, and
                # the in-place addmm_ is not cast by autocast ("self and mat2 must have the
                # same dtype"); the out-of-place addmm is, giving PyG's autocast result.
                root = aligned_linear(x_dst, weight_r, lin_l.bias)
                in_place = (kernel_row_stride(x_dst, self.out_channels) == self.out_channels
                            and root.dtype == aggregated.dtype == weight_l.dtype)
                out = (root.addmm_(aggregated, weight_l.t()) if in_place
                       else torch.addmm(root, aggregated, weight_l.t()))
                return F.normalize(out, p=2.0, dim=-1) if self.normalize else out
            out = lin_l(aggregated)
        out = out if lin_r is None or x_dst is None else out + lin_r(x_dst)
        return F.normalize(out, p=2.0, dim=-1) if self.normalize else out


def _gat_udfs(slope: float, p: float, training: bool, dst_term: bool,
              edge_score: Callable | None) -> tuple[Callable, Callable]:
    """GAT's message and reduce: per edge ``leaky_relu(alpha_src[u] + alpha_dst[v] (+
    edge_score))``, then the edge softmax, attention dropout and the weighted sum."""
    def message(edges):
        score = edges.src["alpha_src"]
        if dst_term:      # PyG: no destination term without x_dst
            score = score + edges.dst["alpha_dst"]
        if edge_score is not None:
            score = score + edge_score(edges)
        return {"score": F.leaky_relu(score, slope), "h": edges.src["h"]}

    def reduce(nodes):
        alpha = F.dropout(torch.softmax(nodes.mailbox["score"], dim=1), p, training)
        return {"out": torch.sum(alpha.unsqueeze(-1) * nodes.mailbox["h"], dim=1)}
    return message, reduce


@frontend.udf_factory
def _gat_attention(slope: float, p: float, training: bool, dst_term: bool) -> frontend.UpdateAll:
    """`_gat_udfs` without edge features, built once per setting (so torch.compile can run it)."""
    return frontend.UpdateAll(*_gat_udfs(slope, p, training, dst_term, None))


def _folds(lin: nn.Linear, x: torch.Tensor, graph: Any = None) -> bool:
    """Whether `_folded_logits` moves fewer bytes than ``(lin(x) * att).sum(-1)``, and
    bytes are what counts: not on a small graph's first pass (`on_first_pass`), whose step
    is bound by host time, where the folded form is seven ops forward (stack, batched
    GEMM, GEMM, view, unbind, two copies) and as many autograd nodes backward against the
    product's and sum's two per vector (a molecule batch's GAT step: 146 autograd nodes
    against PyG's 118). Its
    GEMM reads x's ``in_features`` per vertex, the product and the sum read and write the
    ``heads x channels`` of lin(x) about three times per logit vector (and as much again
    in the backward). Never under torch.autocast: the folded GEMM gives the logits in the
    autocast dtype, where PyG's product of bfloat16 lin(x) and the float32 attention
    vector gives float32 (and the attention weights returned with them were bfloat16)."""
    return (plain_linear(lin, bias=False) and 0 < lin.in_features <= 4 * lin.out_features   # (no view of 0 features)
            and autocast_dtype(x.device.type) is None and not on_first_pass(graph))


def _folded_logits(weight: torch.Tensor, x: torch.Tensor, *atts: torch.Tensor) -> list[torch.Tensor]:
    """GAT's per-head logits ``<lin(x)_h, a_h>`` for each attention vector ``a`` ([1, H, C]),
    ``weight`` being ``lin``'s [H x C, in_features], as one skinny GEMM ``x @ [W_a]^T``
    with ``W_a[h] = W_h^T a_h`` ([H, in_features]): the same sums, reassociated, without
    the [N, H x C] product and its reduction forward and backward (about 4 ms of a
    products-sized GAT step's elementwise kernels).

    Takes the weight tensor, not the module: a backward remaking the logits
    (`GATConv._remakes`) must use the weight the forward read, and ``lin.weight`` read
    then may be another tensor (``torch.func.functional_call`` puts the module's own
    parameters back when the forward returns)."""
    heads, in_features = atts[0].shape[-2], weight.shape[-1]
    per_head = weight.view(heads, -1, in_features)                                   # [H, C, F]
    # every W_h^T a_h at once: one batched GEMM over heads, forward and backward, where a
    # product and a sum per vector were 16 small launches a step on a two-layer GAT
    folded = torch.bmm(torch.stack([a.view(heads, -1) for a in atts], 1), per_head)  # [H, len(atts), F]
    logits = (x @ folded.view(-1, in_features).t()).view(-1, heads, len(atts))
    return [alpha.contiguous() for alpha in logits.unbind(-1)]


class GATConv(FixedAggregation, FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    """Graph attention (Veličković et al.), multi-head, with PyG's parameter layout.

    Per-vertex attention logits ``<h_u, a_src>`` and ``<h_v, a_dst>`` are computed densely;
    the message/reduce function adds them per edge, applies leaky ReLU and the edge
    softmax, and aggregates the weighted messages. ``dropout`` drops normalized attention
    coefficients in training mode, as PyG does; with ``p = 0`` or in eval mode the traced
    program is exactly the one without dropout.

    Bipartite input (PyG's): ``in_channels=(a, b)`` gives separate maps ``lin_src`` and
    ``lin_dst`` (and no ``lin``), and ``forward((x_src, x_dst), edge_index, size=...)``;
    self loops then join source i to destination i for i below both counts, as in PyG.
    There ``residual`` maps ``x_dst`` (``res`` has width ``in_channels[1]``); with more
    destinations than sources the loops' edge features may only be a number or a tensor
    ``fill_value`` (a reduction such as ``"mean"`` is taken otherwise); attention weights
    of bipartite input are not returned (both refused by name).
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None, fill_value: FillValue = "mean",
                 bias: bool = True, residual: bool = False, **kwargs: Any):
        super().__init__()
        message_passing_options(type(self).__name__, kwargs)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope, self.add_self_loops = concat, negative_slope, add_self_loops
        self.dropout = _check_dropout(dropout)
        self.edge_dim, self.fill_value, self.residual = edge_dim, fill_value, residual
        self.lin = self.lin_src = self.lin_dst = None
        if isinstance(in_channels, int):
            self.lin = pyg_init.linear(in_channels, heads * out_channels, False, "glorot")
        else:
            self.lin_src = pyg_init.linear(in_channels[0], heads * out_channels, False, "glorot")
            self.lin_dst = pyg_init.linear(in_channels[1], heads * out_channels, False, "glorot")
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge = edge_projection(edge_dim, heads * out_channels)
        self.att_edge = nn.Parameter(torch.empty(1, heads, out_channels)) if edge_dim is not None else None
        self.res = _head_residual(residual, in_channels, heads, out_channels, concat)
        self.bias = _head_bias(heads, out_channels, concat, bias)
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}"

    def reset_parameters(self) -> None:
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.res):    # PyG's order
            pyg_init.reset_linear(lin, "glorot")
        for att in (self.att_src, self.att_dst, self.att_edge):
            pyg_init.glorot(att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _compile_problem(self, x: Any, edge_index: Any, edge_attr: Any = None, size: Any = None,
                         return_attention_weights: bool | None = None) -> str | None:
        if return_attention_weights:
            return "return_attention_weights=True"
        if edge_attr is not None:
            return "edge_attr"
        if self.training and self.dropout > 0:
            return "attention dropout in training (the backward re-runs the forward and would draw anew)"
        return graph_input_problem(edge_index)

    @staticmethod
    def _remakes(x: torch.Tensor, x_dst: torch.Tensor | None, graph: Graph | GraphRef,
                 ndata: dict[str, torch.Tensor], lin: nn.Module | None,
                 atts: tuple[torch.Tensor, torch.Tensor]) -> list[recompute.Remake]:
        """What the compiled attention may remake in its backward rather than keep
        (`nn.recompute`): ``h = lin(x)`` and the folded logits, one GEMM of ``x`` each,
        when ``lin``'s own backward keeps ``x`` anyway (its weight needs a gradient) and
        the tables came from the plain maps this remakes exactly. Not under torch.compile
        (a GraphRef), which traces saved-tensor hooks as it likes, and not for a table
        under `recompute.MIN_BYTES`, whose memory is not worth the host work.

        Every such layer remakes, the last one too, although its backward starts soon
        after its forward: measured on the products-sized GAT step (H100), remaking only
        the first layer's tables ran 2.3 ms faster but its captured step peaked at
        8.24 GB against 7.93 GB with both layers remade. ``lin`` and ``atts`` (the source and
        destination attention vectors): the layer's, as `forward` read them."""
        if (lin is None or x_dst is not x or isinstance(graph, GraphRef)
                or not torch.is_grad_enabled() or not plain_linear(lin) or not lin.weight.requires_grad
                or ndata["h"].numel() * ndata["h"].element_size() < recompute.MIN_BYTES):
            return []
        weight, bias, shape = lin.weight, lin.bias, ndata["h"].shape[1:]
        remakes = [recompute.Remake(ndata["h"], lambda: aligned_linear(x, weight, bias).view(-1, *shape),
                          (x, weight) if bias is None else (x, weight, bias))]
        if _folds(lin, x, graph):     # as the forward asked: a table is remade as it was made
            makers = recompute.made_together(lambda: _folded_logits(weight, x, *atts), 2)
            remakes += [recompute.Remake(ndata[name], make, (x, weight, *atts))
                        for name, make in zip(("alpha_src", "alpha_dst"), makers)]
        return remakes

    def projects_first(self) -> bool:
        """Whether `forward_projected` computes this layer: one shared ``lin``, no edge
        features and no residual (both read the unprojected input)."""
        return self.lin is not None and self.edge_dim is None and self.res is None

    def forward_projected(self, h_src: torch.Tensor, h_dst: torch.Tensor, graph: Graph) -> torch.Tensor:
        """The layer on rows ``lin`` has already mapped: ``h_src = lin(x_src)``
        ([num_src, heads * out_channels]) and ``h_dst = lin(x_dst)``, on the bipartite
        ``graph``; equal to ``forward((x_src, x_dst), graph)``.

        Partitioned full-graph training (`distributed.fullgraph`) maps each rank's own rows
        and exchanges ``h``, so rows ``heads * out_channels`` wide cross ranks instead of the
        input's (512 -> 64 for the GAT benchmark's first layer), and the GEMM runs on the
        owned rows only, not on every halo row again."""
        if not self.projects_first():
            raise ValueError("GATConv.forward_projected needs one shared lin and no edge_dim or residual; "
                             "call the layer on its inputs instead")
        shape = (-1, self.heads, self.out_channels)
        h = h_src.view(shape)
        ndata = {"h": h, "alpha_src": (h * self.att_src).sum(-1),
                 "alpha_dst": (h_dst.view(shape) * self.att_dst).sum(-1)}
        setting = (self.negative_slope, self.dropout, self.training, True)
        out = _gat_attention(*setting)(_with_loops(graph, self.add_self_loops, True), ndata=ndata)["out"]
        return _combine_heads(out, self.concat, self.bias)

    @compile_path(_compile_problem)
    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None], edge_index: Graph | torch.Tensor,
                edge_attr: torch.Tensor | None = None, size: tuple[int, int] | None = None,
                return_attention_weights: bool | None = None) -> AttentionOutput:
        edge_index = attention_adjacency(edge_index, edge_attr, "GATConv")
        if return_attention_weights:                               # False: just the output, as in PyG
            check_attention_request(self, x, edge_index, "GATConv")
        x, x_dst, graph = _bipartite_inputs(x, edge_index, size, "GATConv")
        # the maps and attention vectors read once, into locals: each read of a submodule or
        # parameter is a Module.__getattr__ call, and reading them where used was 14 per call
        lin, att_src, att_dst = self.lin, self.att_src, self.att_dst
        pyg_init.materialize([(self.res, x_dst), (lin, x), (self.lin_src, x), (self.lin_dst, x_dst)], "glorot")
        rows = edge_rows(self, graph, edge_attr, "GATConv")
        # the edge logit <lin_edge(a), att_edge> per head is a @ w_edge, w_edge [edge_dim, heads] folded from
        # both parameters, so no [E, heads x channels] product exists; traced in (edge_dim <= the compiler's
        # unroll limit) it is evaluated in registers, else torch computes the [E, heads] logits. A lin_edge
        # that is not a plain map (`plain_linear`: a hook, a subclass) is called on the rows, as in PyG
        lin_edge, att_edge = self.lin_edge, self.att_edge
        folds_edge = rows is not None and plain_linear(lin_edge, bias=False)
        w_edge = None if not folds_edge else (lin_edge.weight.view(self.heads, self.out_channels, -1)
                                              * att_edge.view(self.heads, self.out_channels, 1)).sum(1).t()
        in_kernel = folds_edge and traced_edge_matmul(rows)
        edata = (None if rows is None else {"attr": rows} if in_kernel
                 else {"alpha_edge": rows @ w_edge if folds_edge
                       else (lin_edge(rows).view(-1, self.heads, self.out_channels) * att_edge).sum(-1)})
        graph = _with_loops(graph, self.add_self_loops, rows is None and not return_attention_weights)
        shape = (-1, self.heads, self.out_channels)
        h = _aligned(lin or self.lin_src, x).view(shape)
        if x_dst is x and lin is not None and _folds(lin, x, graph):
            alpha_src, alpha_dst = _folded_logits(lin.weight, x, att_src, att_dst)
            ndata = {"h": h, "alpha_src": alpha_src, "alpha_dst": alpha_dst}
        else:
            alpha_src = (h * att_src).sum(-1)
            ndata = {"h": h, "alpha_src": alpha_src}
        if x_dst is not None and "alpha_dst" not in ndata:
            h_dst = h if x_dst is x and lin is not None else (lin or self.lin_dst)(x_dst).view(shape)
            ndata["alpha_dst"] = (h_dst * att_dst).sum(-1)
        setting = (self.negative_slope, self.dropout, self.training, x_dst is not None)
        remakes = self._remakes(x, x_dst, graph, ndata, lin, (att_src, att_dst))
        with recompute.remade_when_saved(remakes) if remakes else contextlib.nullcontext():
            if edata is None:
                out = _gat_attention(*setting)(graph, ndata=ndata)["out"]
            else:
                edge_score = ((lambda edges: edges.data["attr"] @ w_edge) if in_kernel
                              else (lambda edges: edges.data["alpha_edge"]))
                out = frontend.message_passing(graph, *_gat_udfs(*setting, edge_score), ndata=ndata,
                                               edata=edata)["out"]
        residual = None if self.res is None or x_dst is None else self.res(x_dst)   # PyG: res(x_dst)
        out = _combine_heads(out, self.concat, self.bias, residual)
        if not return_attention_weights:
            return out
        score = alpha_src[graph.src.long()] + ndata["alpha_dst"][graph.dst.long()]   # one x: never bipartite
        if rows is not None:
            score = score + (rows @ w_edge if in_kernel else edata["alpha_edge"])
        return out, attention_weights(graph, F.leaky_relu(score, self.negative_slope), edge_index,
                                     self.add_self_loops)
