"""Relational layers on typed graphs with PyG's names: relational graph attention
(``RGATConv``, Busbridge et al. 2019) and ``FastRGCNConv``.

RGAT transforms both endpoints of an edge of relation r by that relation's matrix W_r,
scores the pair from the transformed rows (``q``, ``k``: additive ``LeakyReLU(q_v + k_u)``
or multiplicative ``q_v * k_u``, one score per head and per ``dim``), normalises the
scores over the destination's in-edges -- all of them (``"across-relation"``) or each
relation's apart (``"within-relation"``) -- and sums the weighted transformed sources.
The per-edge part is one vertex function; the within-relation softmax runs it on a
graph whose destinations are the (vertex, relation) pairs that have edges, so that
each pair's softmax is an ordinary per-destination one, and then sums each vertex's
pairs (a second compiled aggregation) -- Seastar's hierarchical aggregation (§6.3.5)
written as two graph passes.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import frontend
from ..graph import Graph
from ..graph.convert import is_sparse_adjacency
from ..runtime.autocast import autocast_dtype
from .arguments import node_features
from .conv import _check_dropout, _neighbour_sum
from .fixed_aggregation import FixedAggregation
from .fixed_flow import FixedFlow
from .pyg_options import message_passing_options
from .relational import RGCNConv, check_edge_types, refuse_lazy_width
from . import pyg_init
from .compiling import names_its_programs
from .torchscript import NotScriptable

_MECHANISMS = ("across-relation", "within-relation")
_MODES = ("additive-self-attention", "multiplicative-self-attention")


class FastRGCNConv(RGCNConv):
    """PyG's ``FastRGCNConv``: the same arguments, parameters and result as `RGCNConv`
    (PyG's variant gathers one relation matrix per edge where ``RGCNConv`` loops over
    relations; here both run the same compiled program, which never gathers per edge).

    One known difference: with an integer ``x`` (node indices, the featureless input)
    other than ``arange(N)``, PyG's ``FastRGCNConv`` picks each edge's weight row by the
    source's *position* and ignores the values of ``x``, while PyG's ``RGCNConv`` picks it
    by ``x[source]``. This layer follows ``RGCNConv``, which reads the input it is given;
    with ``x=None`` or ``x=arange(N)`` all four agree."""

    _pyg_reads_aggr_module = False      # PyG's own aggregate() sums by relation, never calling aggr_module

    def _aggregation(self) -> str:
        """``self.aggr`` as it is now: PyG's ``FastRGCNConv`` reads it at each call (its
        ``aggregate`` normalizes when it is 'mean' and sums otherwise)."""
        if self.aggr not in ("mean", "add", "sum"):
            raise ValueError(f"FastRGCNConv: aggr must be 'mean', 'add' or 'sum', got {self.aggr!r} (set after "
                             "construction)")
        return self.aggr


def typed_input_graph(rows: int, graph: Graph | torch.Tensor, edge_type: torch.Tensor | None, num_relations: int,
                      layer: str) -> Graph:
    """The typed `Graph` of a relational layer's ``forward(x, edge_index, edge_type)``: a
    typed `Graph` as given, or a PyG ``edge_index`` with its ``edge_type``."""
    if isinstance(graph, Graph):
        if edge_type is not None and graph.edge_type is not None:
            raise ValueError(f"{layer}: pass edge_type inside the Graph (Graph(..., edge_type=...)) or with an "
                             "edge_index, not both")
    else:
        if edge_type is None:
            raise ValueError(f"{layer} needs edge types: a Graph built with edge_type=..., or "
                             "forward(x, edge_index, edge_type)")
        if is_sparse_adjacency(graph):
            raise NotImplementedError(f"{layer}: a sparse adjacency (adj_t) is not supported by gnnfuse here; pass "
                                      "edge_index and edge_type, or a typed Graph")
        graph = Graph.from_edge_index(graph, rows, edge_type=edge_type, num_edge_types=num_relations)
    if graph.num_src_nodes != graph.num_nodes:
        raise ValueError(f"{layer} needs one vertex set, but the graph is bipartite ({graph.num_src_nodes} "
                         f"sources, {graph.num_nodes} destinations); pass x and a graph on the same vertices")
    if graph.num_nodes != rows:
        raise ValueError(f"{layer}: x has {rows} rows but the graph has {graph.num_nodes} nodes")
    check_edge_types(graph, num_relations, layer)
    return graph


class RGATConv(FixedAggregation, FixedFlow, NotScriptable, nn.Module):
    r"""PyG's ``RGATConv``: same arguments and parameters (``weight`` or ``basis``/``att``,
    ``q``, ``k``, ``e``/``lin_edge``, ``bias``, and the unused ``w``, ``l1``, ``b1``,
    ``l2``, ``b2`` PyG keeps for its ``mod`` variants), so ``load_state_dict`` copies a
    PyG layer.

    Supported: both attention mechanisms, both attention modes (``dim > 1`` with the
    multiplicative one, as in PyG), ``heads``, ``concat``, ``num_bases``, ``num_blocks``,
    ``edge_dim`` with ``edge_attr``, ``dropout`` on the attention coefficients in training
    mode. Refused by name: ``mod`` (PyG's cardinality-preserving variants), integer node
    indices as ``x``, ``size`` and ``return_attention_weights``.
    """

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None,
                 num_blocks: int | None = None, mod: str | None = None,
                 attention_mechanism: str = "across-relation", attention_mode: str = "additive-self-attention",
                 heads: int = 1, dim: int = 1, concat: bool = True, negative_slope: float = 0.2,
                 dropout: float = 0.0, edge_dim: int | None = None, bias: bool = True, **kwargs: Any):
        super().__init__()
        message_passing_options("RGATConv", kwargs)
        if attention_mechanism not in _MECHANISMS:
            raise ValueError('attention mechanism must either be "within-relation" or "across-relation"')
        if attention_mode not in _MODES:
            raise ValueError('attention mode must either be "additive-self-attention" or '
                             '"multiplicative-self-attention"')
        if attention_mode == "additive-self-attention" and dim > 1:
            raise ValueError('"additive-self-attention" mode cannot be applied when value of d is greater than 1. '
                             'Use "multiplicative-self-attention" instead.')
        if mod is not None:
            raise NotImplementedError(f"RGATConv(mod={mod!r}) is not supported by gnnfuse; only mod=None")
        if num_bases is not None and num_blocks is not None:
            raise ValueError("Can not apply both basis-decomposition and block-diagonal-decomposition at the "
                             "same time.")
        refuse_lazy_width("RGATConv", in_channels)
        width = heads * out_channels
        if num_blocks is not None and (num_blocks < 1 or in_channels % num_blocks or width % num_blocks):
            raise ValueError(f"RGATConv: num_blocks={num_blocks} must divide in_channels={in_channels} and "
                             f"heads * out_channels={width}")
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.num_bases, self.num_blocks, self.mod = num_bases, num_blocks, mod
        self.attention_mechanism, self.attention_mode = attention_mechanism, attention_mode
        self.heads, self.dim, self.concat, self.negative_slope = heads, dim, concat, negative_slope
        self.dropout, self.edge_dim = _check_dropout(dropout), edge_dim
        self.q = nn.Parameter(torch.empty(width, heads * dim))
        self.k = nn.Parameter(torch.empty(width, heads * dim))
        self.bias = nn.Parameter(torch.empty((heads if concat else 1) * dim * out_channels)) if bias else None
        self.lin_edge = pyg_init.linear(edge_dim, width, False, "glorot") if edge_dim is not None else None
        self.e = nn.Parameter(torch.empty(width, heads * dim)) if edge_dim is not None else None
        if num_bases is not None:
            self.att = nn.Parameter(torch.empty(num_relations, num_bases))
            self.basis = nn.Parameter(torch.empty(num_bases, in_channels, width))
        elif num_blocks is not None:
            self.weight = nn.Parameter(torch.empty(num_relations, num_blocks, in_channels // num_blocks,
                                                   width // num_blocks))
        else:
            self.weight = nn.Parameter(torch.empty(num_relations, in_channels, width))
        # PyG creates these for its `mod` variants in every layer; kept so state dicts match.
        # PyG leaves ``l2`` as ``torch.empty`` made it (its reset builds a filled tensor and
        # drops it), and never resets it or ``w``; here ``l2`` starts filled as that tensor
        # is, rather than with whatever memory held, and is not reset either
        self.w = nn.Parameter(torch.ones(out_channels))
        self.l1 = nn.Parameter(torch.empty(1, out_channels))
        self.b1 = nn.Parameter(torch.empty(1, out_channels))
        self.l2 = nn.Parameter(torch.full((out_channels, out_channels), 1.0 / out_channels))
        self.b2 = nn.Parameter(torch.empty(1, out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (getattr(self, "basis", None), getattr(self, "att", None), getattr(self, "weight", None),
                  self.q, self.k, None if self.lin_edge is None else self.lin_edge.weight, self.e):   # PyG's order
            pyg_init.glorot(p)
        for p in (self.bias, self.b1, self.b2):
            if p is not None:
                nn.init.zeros_(p)
        nn.init.ones_(self.l1)

    def relation_weights(self) -> torch.Tensor:
        """[num_relations, in, heads * out]: each relation's matrix (combined from the
        bases, or laid out block-diagonally from the blocks)."""
        width = self.heads * self.out_channels
        if self.num_bases is not None:
            return (self.att @ self.basis.view(self.num_bases, -1)).view(self.num_relations, self.in_channels, width)
        if self.num_blocks is not None:
            eye = torch.eye(self.num_blocks, dtype=self.weight.dtype, device=self.weight.device)
            return torch.einsum("rbio,bc->rbico", self.weight, eye).reshape(self.num_relations, self.in_channels,
                                                                           width)
        return self.weight

    @names_its_programs
    def forward(self, x: torch.Tensor, edge_index: Graph | torch.Tensor, edge_type: torch.Tensor | None = None,
                edge_attr: torch.Tensor | None = None, size: Any = None,
                return_attention_weights: bool | None = None) -> torch.Tensor:
        if size is not None or return_attention_weights is not None:
            raise NotImplementedError("RGATConv: size= and return_attention_weights= are not supported by gnnfuse")
        if self.mod is not None:
            # PyG's forward reads ``mod`` on every call, so one set after construction (which
            # refuses it) gives PyG's layer its variant; computed without it, silently, this was
            # 2.0 off PyG's output for mod='scaled'
            raise NotImplementedError(f"RGATConv: mod={self.mod!r} (set after construction) is not supported by "
                                      "gnnfuse; only mod=None")
        if not (isinstance(x, torch.Tensor) and not x.is_floating_point()):
            x = node_features(x, "RGATConv")             # names a bipartite pair or a wrong type
        if not x.is_floating_point() or x.dim() != 2:
            raise TypeError("RGATConv: x must be a float [num_nodes, in_channels] tensor (gnnfuse does not take "
                            "PyG's node-index input here)")
        if x.shape[-1] != self.in_channels:
            raise ValueError(f"RGATConv: x has {x.shape[-1]} features per node, but the layer was built for "
                             f"in_channels={self.in_channels}")
        if x.dtype != self.q.dtype and autocast_dtype(x.device.type) is None:
            # PyG's matmuls refuse it; here part of the step ran in the parameters' dtype and
            # the output came back in x's, rounded to the narrower one without a word
            raise TypeError(f"RGATConv: x is {x.dtype} but the layer's parameters are {self.q.dtype}; convert one "
                            f"(layer.to({x.dtype}) or x.to({self.q.dtype})), or run under torch.autocast")
        graph = typed_input_graph(x.shape[0], edge_index, edge_type, self.num_relations, "RGATConv")
        edge_feature = self._edge_scores(graph, edge_attr)
        heads, dim, channels = self.heads, self.dim, self.out_channels
        additive = self.attention_mode == "additive-self-attention"
        slope, p, training = self.negative_slope, self.dropout, self.training
        with_edges = edge_feature is not None

        def rgat(v):
            def score(e):
                query = v.x_dst @ e.type.W_q
                key = e.src.x @ e.type.W_k
                if additive:
                    return F.leaky_relu(query + key + e.a if with_edges else query + key, slope)
                return query * key * e.a if with_edges else query * key
            scores = [score(e) for e in v.inedges]
            peak = max(scores)
            weights = [torch.exp(s - peak) for s in scores]
            total = sum(weights)
            alpha = [F.dropout(w / total, p, training) for w in weights]
            return sum([alpha[i].view(heads, dim, 1) * (e.src.x @ e.type.W).view(heads, 1, channels)
                        for i, e in enumerate(v.inedges)])

        # PyG's (x W_r) q re-associated as x (W_r q): the score's query and key come from one
        # relation-typed matmul each (computed per (vertex, relation) pair by the compact
        # materialization pass) instead of a further [heads*C, heads*dim] product per edge.
        weights = self.relation_weights()
        tables = {"etype_feature": {"W": weights, "W_q": weights @ self.q, "W_k": weights @ self.k}}
        edges = None if edge_feature is None else {"a": edge_feature}
        if self.attention_mechanism == "across-relation":
            out = frontend.VertexFunction(rgat)(graph, {"x": x, "x_dst": x}, edges, **tables)
        else:
            pairs, to_vertex = _relation_pairs(graph)
            out = frontend.VertexFunction(rgat)(pairs, {"x": x, "x_dst": x[to_vertex.dst]}, edges, **tables)
            out = _neighbour_sum(to_vertex, {"h": out})
        out = out.flatten(1) if self.concat else out.mean(dim=1).flatten(1)     # [N, H, dim, C] -> PyG's width
        return out if self.bias is None else out + self.bias

    def _edge_scores(self, graph: Graph, edge_attr: torch.Tensor | None) -> torch.Tensor | None:
        """PyG's edge term of the score, ``lin_edge(edge_attr) @ e`` per edge, or None."""
        if edge_attr is None:
            return None
        if self.lin_edge is None:
            raise ValueError("RGATConv: edge_attr given but the layer has no edge_dim (set edge_dim = "
                             "edge_attr.size(-1), as in PyG)")
        edge_attr = edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr
        if edge_attr.shape[0] != graph.num_edges:
            raise ValueError(f"RGATConv: edge_attr has {edge_attr.shape[0]} rows but the graph has "
                             f"{graph.num_edges} edges")
        return self.lin_edge(edge_attr) @ self.e

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"


def _relation_pairs(graph: Graph) -> tuple[Graph, Graph]:
    """Two graphs for a within-relation softmax, cached on ``graph``: ``graph``'s edges
    (ids and types kept) with each destination replaced by its (destination, relation)
    pair, and the graph from the pairs to their vertices."""
    def build(g: Graph) -> tuple[Graph, Graph]:
        key = g.dst * g.num_edge_types + g.edge_type
        unique, pair = torch.unique(key, return_inverse=True)
        count = unique.numel()
        pairs = Graph.bipartite(g.src, pair, g.num_src_nodes, count, edge_type=g.edge_type,
                                num_edge_types=g.num_edge_types)
        to_vertex = Graph.bipartite(torch.arange(count, device=g.device), unique // g.num_edge_types, count,
                                    g.num_nodes)
        return pairs, to_vertex
    return graph.cached("nn_relation_pairs", build)
