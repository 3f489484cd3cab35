"""Attention and edge-MLP graph layers, their graph part written vertex-centrically.

Each layer's ``forward`` does the dense per-vertex work (linear maps, per-vertex attention
logits) in torch and hands the part that moves data along edges to a vertex function --
what one vertex ``v`` computes from its in-neighbours ``u in v.innbs`` -- which the
compiler fuses into one forward and one backward pass over the graph. Where a layer
has PyG's counterpart, the constructor and parameter names match it, so
``layer.load_state_dict(pyg_layer.state_dict())`` copies a PyG layer.

Edge softmaxes are written as ``exp(s - max s) / sum exp(s - max s)``: the shift by the
per-vertex maximum changes nothing mathematically but keeps ``exp`` from overflowing,
as every framework's softmax does.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .. import frontend
from ..graph import Graph
from ..ir import CompileError
from .aligned_linear import RowsRead, bias_added, rows_read
from .arguments import node_features
from .attention_weights import AttentionOutput, attention_weights, check_attention_request
from . import pyg_init
from .compiling import compile_path
from .conv import (_sized_linear, GATConv, _as_graph, attention_adjacency, _bipartite_inputs, _channel_pair,
                   _check_dropout, _combine_heads, _head_bias, _head_residual, _inv_sqrt_degree, _normalized_sum,
                   _with_loops)
from .edge_conv_eager import coupled_reason, eager_edge_conv, rows_coupled_by
from .edge_features import FillValue, edge_projection, edge_rows, traced_edge_matmul
from .fixed_aggregation import FixedAggregation
from .fixed_flow import FixedFlow
from .plain_linear import plain_linear
from .pyg_options import message_passing_options
from .pyg_repr import OneLineRepr
from .torchscript import NotScriptable


def _run_vertex(fn: Callable, graph: Graph, v_feature: Mapping[str, torch.Tensor],
                e_feature: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Run a vertex function that closes over a layer's parameters, made anew in every
    ``forward`` (so it reads the current parameters, and a deep-copied layer its own);
    its compiled program is shared by structure, so only the trace repeats per call."""
    return frontend.VertexFunction(fn)(graph, v_feature, e_feature)


# --- GATv2 --------------------------------------------------------------------------------

class GATv2Conv(FixedAggregation, FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    r"""GATv2 (Brody et al., "How attentive are graph attention networks?"), PyG's layout.

    .. math::
        e_{u \to v} = a^\top \mathrm{LeakyReLU}(W_l x_u + W_r x_v), \quad
        \alpha_{u \to v} = \mathrm{softmax}_{u \in N(v)}(e_{u \to v}), \quad
        x'_v = \sum_{u \in N(v)} \alpha_{u \to v} W_l x_u + b

    per head; heads are concatenated or averaged. Unlike GAT, the non-linearity sits
    between the two per-vertex terms and ``a``, so the score cannot be split into
    per-vertex logits: it is computed per edge inside the traced function, with ``a``
    read from the closure. ``dropout`` drops normalized attention coefficients in
    training mode, as PyG does. Bipartite input (PyG's): ``in_channels=(a, b)`` and
    ``forward((x_src, x_dst), edge_index)`` (``x_dst`` required, as in PyG); self loops
    then join source i to destination i for i below both counts.
    """

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None, fill_value: FillValue = "mean",
                 bias: bool = True, share_weights: bool = False, residual: bool = False, **kwargs: Any):
        super().__init__()
        message_passing_options(type(self).__name__, kwargs)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope = concat, negative_slope
        self.dropout, self.add_self_loops = _check_dropout(dropout), add_self_loops
        self.edge_dim, self.fill_value, self.residual = edge_dim, fill_value, residual
        self.share_weights = share_weights
        in_src, in_dst = _channel_pair(in_channels)
        self.lin_l = pyg_init.linear(in_src, heads * out_channels, bias, "glorot")
        self.lin_r = self.lin_l if share_weights else pyg_init.linear(in_dst, heads * out_channels, bias, "glorot")
        self.att = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge = edge_projection(edge_dim, heads * out_channels)
        self.res = _head_residual(residual, in_channels, heads, out_channels, concat)
        self.bias = _head_bias(heads, out_channels, concat, bias)
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}"

    def reset_parameters(self) -> None:
        for lin in (self.lin_l, self.lin_r, self.lin_edge, self.res):    # PyG's order (a shared map twice)
            pyg_init.reset_linear(lin, "glorot")
        pyg_init.glorot(self.att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @compile_path()
    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], edge_index: Graph | torch.Tensor,
                edge_attr: torch.Tensor | None = None, return_attention_weights: bool | None = None) -> AttentionOutput:
        edge_index = attention_adjacency(edge_index, edge_attr, "GATv2Conv")
        if return_attention_weights:                               # False: just the output, as in PyG
            check_attention_request(self, x, edge_index, "GATv2Conv")
        x, x_dst, graph = _bipartite_inputs(x, edge_index, None, "GATv2Conv")
        if x_dst is None:
            raise ValueError("GATv2Conv: bipartite input needs x_dst (the destination features score "
                             "every edge), as in PyG; got (x_src, None)")
        pyg_init.materialize([(self.res, x_dst), (self.lin_l, x), (self.lin_r, x_dst)], "glorot")
        rows = edge_rows(self, graph, edge_attr, "GATv2Conv")
        graph = _with_loops(graph, self.add_self_loops, rows is None and not return_attention_weights)
        shape = (-1, self.heads, self.out_channels)
        x_l = self.lin_l(x).view(shape)
        x_r = x_l if self.share_weights and x_dst is x else self.lin_r(x_dst).view(shape)
        att, slope = self.att.view(self.heads, self.out_channels), self.negative_slope
        p, training, heads, channels = self.dropout, self.training, self.heads, self.out_channels
        # lin_edge traced in (edge_dim <= the compiler's unroll limit): evaluated in registers, never
        # stored per edge; wider edge features are projected by torch and read as [E, heads, channels]
        in_kernel = traced_edge_matmul(rows) and plain_linear(self.lin_edge, bias=False)
        w_edge = self.lin_edge.weight.t() if in_kernel else None
        e_feature = None if rows is None else {"attr": rows} if in_kernel else {
            "x_e": self.lin_edge(rows).view(shape)}
        # the traced functions read whether there are edge features, never ``rows`` itself: a
        # tensor they reach is guarded by its whole shape, so every edge count traced afresh
        with_edges = rows is not None

        def pair(e, v):
            both = e.src.x_l + v.x_r
            if not with_edges:
                return both
            return both + ((e.attr @ w_edge).view(heads, channels) if in_kernel else e.x_e)

        def gatv2(v):
            scores = [(F.leaky_relu(pair(e, v), slope) * att).sum(-1) for e in v.inedges]
            peak = max(scores)
            weights = [torch.exp(s - peak) for s in scores]
            alpha = [F.dropout(w / sum(weights), p, training) for w in weights]
            return sum([alpha[i].unsqueeze(-1) * e.src.x_l for i, e in enumerate(v.inedges)])

        out = _run_vertex(gatv2, graph, {"x_l": x_l, "x_r": x_r}, e_feature)
        out = _combine_heads(out, self.concat, self.bias, None if self.res is None else self.res(x_dst))
        if not return_attention_weights:
            return out
        pair = x_l[graph.src.long()] + x_r[graph.dst.long()]
        pair = pair if rows is None else pair + self.lin_edge(rows).view(shape)
        return out, attention_weights(graph, (F.leaky_relu(pair, slope) * att).sum(-1), edge_index,
                                     self.add_self_loops)


# --- constrained GAT ----------------------------------------------------------------------
def _constrained_reduce(nodes):
    """Graphiler's C-GAT reduce: edge ``b`` is weighted by how far its score clears
    each in-edge ``a`` of the same vertex, ``sum_a max(0, e_b - e_a)``; the [N, D, D]
    pair table it is written with is sorted away by the compiler (passes/pairwise.py)."""
    score = nodes.mailbox["score"]                               # [N, D, heads]
    margin = score.unsqueeze(1) - score.unsqueeze(2)             # [v, a, b] = e_b - e_a
    weight = margin.clamp(min=0).sum(1)                          # [N, D, heads]
    return {"out": torch.sum(weight.unsqueeze(-1) * nodes.mailbox["z"], dim=1)}


class CGATConv(GATConv):
    r"""Constrained GAT (C-GAT, Wang et al. 2019) as Graphiler benchmarks it (Graphiler §5.2.1).

    .. math::
        z = W x, \quad e_{u \to v} = \mathrm{LeakyReLU}(a_s^\top z_u + a_d^\top z_v), \quad
        w_{u \to v} = \sum_{t \in N(v)} \max(0,\, e_{u \to v} - e_{t \to v}), \quad
        x'_v = \sum_{u \in N(v)} w_{u \to v}\, z_u + b

    per head. The paper only names the "edge pair-wise normalization" that framework
    primitives cannot express; the formula is that of Graphiler's C-GAT benchmark (its
    reduce UDF compares every pair of a vertex's in-edges), whose ``a^T [z_u || z_v]`` is
    split into a source and a destination half as PyG's GAT stores it. Instead of a
    softmax, each edge is weighted by how far its score clears each competing in-edge's;
    the weights are not normalized: the lowest-scoring in-edge of a vertex gets 0, and a
    vertex whose only in-edge is its self loop outputs just the bias. Equal scores add 0;
    their gradient at the tie is ``clamp(min=0)``'s, which torch passes at 0 (ReLU's is 0
    there). Graphiler's layer is ``heads=1,
    add_self_loops=False, bias=False`` (slope 0.01); there is no PyG counterpart, so the
    parameters follow PyG's GATConv layout.

    The graph part is the message/reduce pair as Graphiler writes it, pair table
    included; the compiler turns its pairwise term into a per-vertex sort, O(E log E)
    instead of O(sum of squared in-degrees).
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, add_self_loops: bool = True, bias: bool = True):
        super().__init__(in_channels, out_channels, heads, concat, negative_slope, dropout=0.0,
                         add_self_loops=add_self_loops, bias=bias)

    @compile_path()
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor) -> torch.Tensor:
        x = node_features(x, "CGATConv")
        graph = _with_loops(_as_graph(edge_index, x.shape[0]), self.add_self_loops)
        z = self.lin(x).view(-1, self.heads, self.out_channels)
        slope = self.negative_slope

        def message(edges):
            score = edges.src["score_src"] + edges.dst["score_dst"]
            return {"score": F.leaky_relu(score, slope), "z": edges.src["z"]}

        out = frontend.message_passing(graph, message, _constrained_reduce, ndata={
            "z": z, "score_src": (z * self.att_src).sum(-1), "score_dst": (z * self.att_dst).sum(-1)})["out"]
        return _combine_heads(out, self.concat, self.bias)


# --- dot-product attention ----------------------------------------------------------------
@frontend.vertex
def _dot_attention(v):
    scores = [(u.z * v.q).sum(-1) for u in v.innbs]
    peak = max(scores)
    weights = [torch.exp(s - peak) for s in scores]
    return sum([(weights[i] / sum(weights)).unsqueeze(-1) * u.z for i, u in enumerate(v.innbs)])


class DotGATConv(NotScriptable, nn.Module):
    r"""Dot-product attention (DGL's ``DotGatConv``; FeatGraph's "dot-product attention").

    .. math::
        z = W x, \quad
        \alpha_{u \to v} = \mathrm{softmax}_{u \in N(v)}\Big(\frac{\langle z_u, z_v \rangle}{\sqrt{C}}\Big),
        \quad x'_v = \sum_{u \in N(v)} \alpha_{u \to v} z_u + b

    per head of width ``C = out_channels``. The destination side is pre-scaled,
    ``q = z / sqrt(C)``, so the traced score is a plain dot product (an SDDMM). DGL's layer
    is ``add_self_loops=False, bias=False`` with heads kept apart; here heads are
    concatenated or averaged like PyG's GATConv.
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 add_self_loops: bool = True, bias: bool = True):
        super().__init__()
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.add_self_loops = concat, add_self_loops
        self.lin = _sized_linear(in_channels, heads * out_channels, bias=False)
        self.bias = _head_bias(heads, out_channels, concat, bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @compile_path()
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor) -> torch.Tensor:
        x = node_features(x, "DotGATConv")
        graph = _with_loops(_as_graph(edge_index, x.shape[0]), self.add_self_loops)
        z = self.lin(x).view(-1, self.heads, self.out_channels)
        out = _dot_attention(graph, {"z": z, "q": z / math.sqrt(self.out_channels)})
        return _combine_heads(out, self.concat, self.bias)


# --- edge MLPs ----------------------------------------------------------------------------
_EDGE_AGGREGATIONS = ("max", "mean", "add", "sum")


class EdgeConv(FixedAggregation, FixedFlow, OneLineRepr, NotScriptable, nn.Module):
    r"""EdgeConv (Wang et al., DGCNN) with PyG's arguments.

    .. math::
        x'_v = \square_{u \in N(v)} h_\Theta([x_v \,\|\, x_u - x_v])

    with ``h_Theta = nn`` applied to every edge and aggregation ``aggr`` (max, mean, add).
    ``nn`` is traced inside the vertex function, so it may use what the tracer compiles
    (``nn.Linear``, elementwise activations, ``torch.cat``, ...); isolated vertices get 0.
    It sees each edge's row as PyG's ``nn`` sees the [E, 2F] table of all edges: dim 0 is
    the edges, dim 1 the first feature dim (`frontend.as_table_rows`). An ``nn`` holding a
    norm over all edges' rows (BatchNorm, PyG's norms) runs eagerly with a warning
    (`edge_conv_eager`), and so does one the tracer cannot compile per edge (an op over
    dim 0, combining edges' rows; an activation without a gnnfuse op), the warning saying why.
    Bipartite input (PyG's): ``forward((x_src, x_dst), edge_index)``, ``x_v`` then read
    from ``x_dst`` and ``x_u`` from ``x_src`` (the same width, as ``nn`` takes both).
    """

    def __init__(self, nn: Callable, aggr: str = "max", **kwargs: Any):
        super().__init__()
        message_passing_options(type(self).__name__, kwargs, aggr=())     # its aggr is its own argument
        if not isinstance(aggr, str) or aggr not in _EDGE_AGGREGATIONS:    # a list or module: PyG's other forms
            raise ValueError(f"EdgeConv: aggr must be one of {list(_EDGE_AGGREGATIONS)} (the reductions gnnfuse "
                             f"fuses for it), got {aggr!r}")
        self.nn, self.aggr = nn, aggr
        self._aggr = aggr      # PyG builds its aggregation here: a later layer.aggr = ... changes nothing
        self.reset_parameters()

    def extra_repr(self) -> str:
        return f"nn={self.nn}"

    def reset_parameters(self) -> None:
        pyg_init.reset_module(self.nn)

    @compile_path()
    def forward(self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], edge_index: Graph | torch.Tensor
                ) -> torch.Tensor:
        x_src, x_dst, graph = _bipartite_inputs(x, edge_index, None, "EdgeConv")
        if x_dst is None:
            raise ValueError("EdgeConv: bipartite input needs x_dst (every message reads its destination's "
                             "features), as in PyG; got (x_src, None)")
        h = self.nn
        coupled = rows_coupled_by(h)
        if coupled is not None:
            return eager_edge_conv(h, self._aggr, x_src, x_dst, graph, coupled_reason(coupled))

        # h sees each edge's row as PyG's nn sees the [E, 2F] table: dim 0 the edges
        def edge_max(v):
            return max([frontend.as_table_rows(h, torch.cat([v.x_dst, u.x_src - v.x_dst], -1)) for u in v.innbs])

        def edge_sum(v):
            return sum([frontend.as_table_rows(h, torch.cat([v.x_dst, u.x_src - v.x_dst], -1)) for u in v.innbs])

        def edge_mean(v):
            return sum([frontend.as_table_rows(h, torch.cat([v.x_dst, u.x_src - v.x_dst], -1))
                        for u in v.innbs]) / len(v.innbs)

        fn = {"max": edge_max, "mean": edge_mean, "add": edge_sum, "sum": edge_sum}[self._aggr]
        try:
            return _run_vertex(fn, graph, {"x_src": x_src, "x_dst": x_dst})
        except CompileError as error:       # raised by the trace, before anything ran
            return eager_edge_conv(h, self._aggr, x_src, x_dst, graph, f"nn cannot be compiled per edge: {error}")


def _with_edges(graph: Graph, direction: str) -> RowsRead | None:
    """The vertices with an in-edge (``direction="in"``) or with any edge (``"any"``);
    None when that is every vertex. Cached per graph."""
    def build(g: Graph) -> RowsRead | None:
        degree = g.in_degrees() if direction == "in" else g.in_degrees() + g.out_degrees()
        return RowsRead.of(degree > 0)
    return graph.cached(f"nn_with_edges_{direction}", build)


@frontend.vertex
def _mlp_max(v):
    return max([torch.relu(u.a + v.b) for u in v.innbs])


class MLPAggConv(NotScriptable, nn.Module):
    r"""FeatGraph's MLP aggregation (FeatGraph Figure 2(b)): a one-layer MLP on the sum
    of the two endpoints' features, max-aggregated.

    .. math::
        x'_v = \max_{u \in N(v)} \mathrm{ReLU}\big(W (x_u + x_v) + b\big)

    (FeatGraph's kernel has no ``b``; ``bias=False`` gives it exactly). ``W`` distributes
    over the sum, so ``W x`` is computed once per vertex instead of once per edge and the
    traced function is ``max_u ReLU(a_u + b_v)`` with ``a = W x``, ``b = W x + bias``.
    Isolated vertices get 0, like PyG's max aggregation, and their features (which no
    edge reads) are left out of ``W x`` so that a NaN in them reaches no gradient.
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = _sized_linear(in_channels, out_channels, bias=bias)

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()

    @compile_path()
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor) -> torch.Tensor:
        x = node_features(x, "MLPAggConv")
        graph = _as_graph(edge_index, x.shape[0])
        if not plain_linear(self.lin):
            raise TypeError(f"MLPAggConv.lin must be a plain torch.nn.Linear (no hooks, not a subclass or another "
                            f"module): W (x_u + x_v) is computed as W x_u + W x_v from its weight, which a "
                            f"{type(self.lin).__name__} with hooks or its own forward would not give")
        a = F.linear(rows_read(x, _with_edges(graph, "any")), self.lin.weight)
        return _mlp_max(graph, {"a": a, "b": a if self.lin.bias is None else a + self.lin.bias})


class NGCFConv(NotScriptable, nn.Module):
    r"""One NGCF propagation layer (Wang et al. 2019, eq. 3-7), as GraphTensor runs it
    (mean-style aggregation f, element-wise-product edge weighting g, sum h).

    .. math::
        m_{u \to v} = \frac{1}{\sqrt{|N_u||N_v|}} \big(W_1 x_u + W_2 (x_u \odot x_v)\big), \quad
        x'_v = \mathrm{LeakyReLU}\Big(W_1 x_v + \sum_{u \in N(v)} m_{u \to v} + b\Big)

    ``|N_u|`` is u's in-degree (PyG's ``gcn_norm`` convention; on the undirected
    user-item graphs NGCF is meant for it is just the degree); an isolated vertex gets
    no messages. ``W_1``, ``W_2`` are ``lin1``, ``lin2`` (no bias; ``bias`` is added once).
    Both are linear, so they distribute over the neighbour sum:
    ``sum_u m = W_1 s_v + W_2 (x_v * s_v)`` with ``s_v = sum_u p_uv x_u`` -- the compiled
    vertex function aggregates ``x`` once (in_channels wide) instead of materializing a
    transformed message per edge. A vertex without in-edges has no messages, so its
    ``x_v * s_v`` term is left out rather than computed as ``x_v * 0`` (NaN for a NaN
    ``x_v``, which would reach ``W_2``'s gradient).
    """

    def __init__(self, in_channels: int, out_channels: int, negative_slope: float = 0.2, bias: bool = True):
        super().__init__()
        self.in_channels, self.out_channels, self.negative_slope = in_channels, out_channels, negative_slope
        self.lin1 = _sized_linear(in_channels, out_channels, bias=False)
        self.lin2 = _sized_linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin1.weight)
        nn.init.xavier_uniform_(self.lin2.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @compile_path()
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor) -> torch.Tensor:
        x = node_features(x, "NGCFConv")
        graph = _as_graph(edge_index, x.shape[0])
        s = _normalized_sum(graph, {"h": x, "norm": _inv_sqrt_degree(graph, x.dtype)})
        out = self.lin1(x + s) + self.lin2(rows_read(x, _with_edges(graph, "in")) * s)
        return F.leaky_relu(bias_added(out, self.bias), self.negative_slope)
