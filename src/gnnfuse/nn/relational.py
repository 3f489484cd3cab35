"""Relational graph convolution (R-GCN, Schlichtkrull et al.) with PyG's names, arguments
and parameter layout, its message written in the vertex-centric front end with per-edge
relation matrices (``e.type.W``), as Graphiler's R-GCN is."""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from .. import frontend
from ..graph import Graph
from ..graph.convert import check_bipartite_adj_t, is_sparse_adjacency
from ..graph.index_cache import _stamp, cached_graph
from .arguments import node_features
from . import pyg_init
from .compiling import names_its_programs
from .fixed_aggregation import FixedAggregation
from .fixed_flow import FixedFlow
from .pyg_options import message_passing_options
from .torchscript import NotScriptable


def _relational(aggr: str, root: torch.Tensor | None, bias: torch.Tensor | None, v):
    """The vertex-centric R-GCN: per-relation messages ``x_u W_r`` (scaled by the
    per-relation mean's norm), summed; then the root term and the bias when given, which
    the compiler folds into the relation sum (passes/typed_root.py: one GEMM in the dense
    order, no [N, out] intermediates)."""
    if aggr == "mean":
        out = sum([(e.src.h @ e.type.W) * e.norm for e in v.inedges])
    else:
        out = sum([e.src.h @ e.type.W for e in v.inedges])
    if root is not None:
        out = out + v.h @ root
    return out if bias is None else out + bias


# the relation sums alone, built once: what torch.compile traces (root and bias after them)
_PLAIN = {kind: frontend.vertex(functools.partial(_relational, kind, None, None)) for kind in ("mean", "sum")}


def _relation_mean_norm(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    """``1 / |N_r(v)|`` per edge into ``v`` of relation ``r``: each relation's messages are
    averaged apart, as PyG's ``aggr="mean"`` does. Cached on the graph per dtype (computed
    in float64, rounded once), so a step neither casts nor keeps a float64 copy."""
    def build(g: Graph) -> torch.Tensor:
        key = g.dst * g.num_edge_types + g.edge_type
        count = torch.bincount(key, minlength=g.num_nodes * g.num_edge_types)
        return (1.0 / count[key].to(torch.float64)).to(dtype)
    return graph.cached(f"nn_relation_mean_norm_{dtype}", build)


def _typed_adj_t(adj_t, edge_type: torch.Tensor | None, num_src: int, num_dst: int, layer: str
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, edge_type)`` of PyG's typed ``adj_t``: a ``torch_sparse.SparseTensor``
    of shape [destinations, sources] whose stored values are the edge types (PyG's only
    sparse form for R-GCN; a torch sparse tensor has no such reading there, and is refused)."""
    if isinstance(adj_t, torch.Tensor):
        raise ValueError(f"{layer}: a torch sparse adj_t carries no edge types; pass edge_index and edge_type "
                         "(or a torch_sparse.SparseTensor whose values are the edge types, as PyG takes)")
    if edge_type is not None:
        raise ValueError(f"{layer}: the SparseTensor adj_t holds the edge types as its values; edge_type was "
                         "given too, pass the types one way")
    row, col, value = adj_t.coo()
    if value is None:
        raise ValueError(f"{layer}: the SparseTensor adj_t has no values; PyG reads them as the edge types")
    check_bipartite_adj_t(adj_t, num_dst, num_src)
    return torch.stack([col, row]), value


def _is_float(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _check_node_indices(x: torch.Tensor, width: int, name: str, channels: str, rows: str, layer: str) -> None:
    """Refuse a node index outside ``0..width-1``, naming the argument and the bound
    (torch's one_hot says "Class values must be smaller than num_classes"). Checked on
    the host only: on a GPU reading the bounds would stall every call for a sync, and
    the one-hot's scatter fails there with a device assert rather than a wrong answer."""
    if x.device.type != "cpu":
        return
    low, high = int(x.min()), int(x.max())
    if low < 0 or high >= width:
        raise ValueError(f"{layer}: {name} holds node index {low if low < 0 else high}, outside 0..{width - 1} "
                         f"({channels}={width} {rows} rows)")


def refuse_lazy_width(layer: str, *widths: int) -> None:
    """A ValueError for ``in_channels=-1`` (PyG's lazy width): a relational layer's
    weights are one [in, out] matrix per relation, which PyG's layer allocates at
    construction too, failing with torch's "negative dimension"; say what to give."""
    if any(width < 0 for width in widths):
        raise ValueError(f"{layer}: in_channels=-1 (a width found at the first call) is not supported, as in PyG: "
                         f"its per-relation weights are made at construction; give the input feature width")


def check_edge_types(graph: Graph, num_relations: int, layer: str) -> None:
    """Refuse a graph whose edge types are not the ``num_relations`` the relational
    ``layer`` was built for: none at all (said as such: "the graph has None edge types"
    advised ``num_edge_types=...``, which a Graph without ``edge_type`` refuses), or
    another count."""
    if graph.edge_type is None:
        raise ValueError(f"{layer}: the Graph has no edge types; build it with Graph(src, dst, edge_type=..., "
                         "num_edge_types=num_relations), or pass an edge_index and forward(x, edge_index, edge_type)")
    if graph.num_edge_types != num_relations:
        raise ValueError(f"{layer}: the graph has {graph.num_edge_types} edge types but the layer was built for "
                         f"num_relations={num_relations}; a Graph counts the types its edges hold unless told: "
                         f"build it with num_edge_types={num_relations}")


class RGCNConv(FixedAggregation, FixedFlow, NotScriptable, nn.Module):
    """``x'_v = x_v Θ_root + Σ_r agg_{u ∈ N_r(v)} x_u Θ_r + b`` with ``agg`` the mean per
    relation (``aggr="mean"``, PyG's default) or the sum (``aggr="add"``/``"sum"``).

    ``num_bases`` shares the relation matrices as combinations of that many bases
    (``Θ_r = Σ_b comp[r, b] V_b``; parameters ``weight`` [bases, in, out] and ``comp``
    [relations, bases], as in PyG). ``forward(x, edge_index, edge_type=None)`` takes a typed
    `Graph` (``Graph(src, dst, n, edge_type=..., num_edge_types=num_relations)``) or a
    PyG ``edge_index`` with ``edge_type``.

    ``num_blocks`` makes each relation matrix block-diagonal (``weight`` [relations, blocks,
    in/blocks, out/blocks], as in PyG). ``x`` may be None or a vector of node indices, as in
    PyG: the input is then the one-hot rows of those indices (``x=None``: ``arange(in_channels)``),
    so every node has its own learnt embedding row in each relation matrix. That one-hot
    input is built dense, [N, in_channels]. ``is_sorted`` (a PyG speed hint) changes nothing here.

    Bipartite input (PyG's): ``in_channels=(a, b)`` (relation matrices read sources of width
    ``a``, ``root`` destinations of width ``b``) and ``forward((x_src, x_dst), edge_index,
    edge_type)`` on a graph from ``x_src``'s rows to ``x_dst``'s; either side may be node
    indices, and ``x_src`` None (``arange(a)``), as above; a pair of float features and node
    indices reads each side so (as PyG's FastRGCNConv does; its RGCNConv fails on such pairs),
    except node indices as ``x_src`` with float ``x_dst``, which PyG's layers read two
    different ways and is refused.
    """

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None,
                 num_blocks: int | None = None, aggr: str = "mean", root_weight: bool = True,
                 is_sorted: bool = False, bias: bool = True, **kwargs: Any):
        super().__init__()
        message_passing_options(type(self).__name__, kwargs, aggr=())     # (its aggr is an argument of its own)
        in_src, in_dst = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        refuse_lazy_width(type(self).__name__, in_src, in_dst)
        if num_bases is not None and num_blocks is not None:
            raise ValueError(f"{type(self).__name__}: num_bases and num_blocks cannot both be given (one "
                             "decomposition at a time)")
        if num_blocks is not None and (num_blocks < 1 or in_src % num_blocks or out_channels % num_blocks):
            raise ValueError(f"{type(self).__name__}: num_blocks={num_blocks} must divide in_channels={in_src} and "
                             f"out_channels={out_channels}")
        if aggr not in ("mean", "add", "sum"):
            raise ValueError(f"{type(self).__name__}: aggr must be 'mean', 'add' or 'sum' (the aggregations "
                             f"gnnfuse compiles for it), got {aggr!r}")
        if num_relations < 1 or (num_bases is not None and num_bases < 1):
            raise ValueError(f"{type(self).__name__}: num_relations and num_bases must be >= 1, got "
                             f"{num_relations} and {num_bases}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_relations, self.num_bases, self.num_blocks, self.aggr = num_relations, num_bases, num_blocks, aggr
        self._aggr = aggr      # PyG builds its aggregation here: a later layer.aggr = ... changes nothing
        self.is_sorted, self.in_channels_l = is_sorted, in_src     # PyG's name for the sources' width
        if num_blocks is not None:
            shape = (num_relations, num_blocks, in_src // num_blocks, out_channels // num_blocks)
        else:
            shape = (num_bases or num_relations, in_src, out_channels)
        self.weight = nn.Parameter(torch.empty(shape))
        self.comp = nn.Parameter(torch.empty(num_relations, num_bases)) if num_bases is not None else None
        self.root = nn.Parameter(torch.empty(in_dst, out_channels)) if root_weight else None
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in (self.weight, self.comp, self.root):
            if p is not None:
                pyg_init.glorot(p)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def relation_weights(self) -> torch.Tensor:
        """[num_relations, in, out]: the per-relation matrices (combined from the bases)."""
        if self.num_blocks is not None:
            eye = torch.eye(self.num_blocks, dtype=self.weight.dtype, device=self.weight.device)
            return torch.einsum("rbio,bc->rbico", self.weight, eye).reshape(
                self.num_relations, self.in_channels_l, self.out_channels)
        if self.comp is None:
            return self.weight
        return (self.comp @ self.weight.reshape(self.num_bases, -1)).reshape(
            self.num_relations, self.in_channels_l, self.out_channels)

    def _aggregation(self) -> str:
        """The reduction over each relation's messages: the one built with, as PyG's
        ``RGCNConv`` keeps it in its ``aggr_module`` (a later ``layer.aggr = ...`` changes
        nothing there)."""
        return self._aggr

    @names_its_programs
    def forward(self, x: torch.Tensor | None | tuple[torch.Tensor | None, torch.Tensor],
                edge_index: Graph | torch.Tensor, edge_type: torch.Tensor | None = None) -> torch.Tensor:
        bipartite = isinstance(x, (tuple, list))
        if bipartite and len(x) != 2:
            raise ValueError(f"{type(self).__name__}: bipartite input is a pair (x_src, x_dst), got {len(x)} entries")
        x_src, x_dst = x if bipartite else (x, None)
        if bipartite and x_dst is None:
            raise ValueError(f"{type(self).__name__}: bipartite input needs x_dst (destination features or node "
                             "indices: they "
                             "give the destination count and feed root), as in PyG; got (x_src, None)")
        if bipartite and x_src is not None and not _is_float(x_src) and _is_float(x_dst):
            raise ValueError(f"{type(self).__name__}: x_src holds node indices and x_dst float features; PyG's "
                             "RGCNConv fails on "
                             "this pair and its FastRGCNConv reads each source by its position, not by its index; "
                             "pass x_src=None (source j has embedding row j) or float source features")
        if x_src is None and isinstance(edge_index, Graph) and edge_index.num_src_nodes != self.in_channels_l:
            raise ValueError(f"{type(self).__name__}(x=None) gives each of in_channels={self.in_channels_l} "
                             "nodes its own "
                             f"embedding row, but the graph has {edge_index.num_src_nodes} source nodes")
        x_src = self._input_features(x_src, self.in_channels_l, "x_src" if bipartite else "x")
        x_dst = self._input_features(x_dst, self.root.shape[0] if self.root is not None else None, "x_dst") \
            if bipartite else x_src
        graph = self._typed_graph(x_src, x_dst, edge_index, edge_type, bipartite)
        feeds = {"W": self.relation_weights()}
        # the root term and bias go into the program on one node set; on a bipartite graph
        # (whose destination rows are another table) and under torch.compile (which traces
        # no program built per call) the relation sums run alone (`_PLAIN`) and they follow
        kind = "mean" if self._aggregation() == "mean" else "sum"
        edges = {"norm": _relation_mean_norm(graph, x_src.dtype)} if kind == "mean" else {}
        if not bipartite and not torch.compiler.is_compiling():
            program = frontend.vertex(functools.partial(_relational, kind, self.root, self.bias))
            return program(graph, {"h": x_src}, edges, etype_feature=feeds)
        out = _PLAIN[kind](graph, {"h": x_src}, edges, etype_feature=feeds)
        if self.root is None:
            return out if self.bias is None else out + self.bias
        # the bias rides on the root GEMM's epilogue: one pass over the [N, out] output fewer
        return out + (x_dst @ self.root if self.bias is None else torch.addmm(self.bias, x_dst, self.root))

    def _input_features(self, x: torch.Tensor | None, width: int | None, name: str) -> torch.Tensor:
        """``x`` as [N, width] features: a float matrix as given (of that width, checked
        here so the error names the input and ``in_channels``); None or integer node
        indices (PyG's featureless input) as one-hot rows, so ``x @ W`` selects each node's
        row. (``width`` None: destination node indices without ``root``, whose rows only count.)"""
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__}: x must be a tensor, node indices or None, got {type(x).__name__}")
        channels = {"x_src": "in_channels[0]", "x_dst": "in_channels[1]"}.get(name, "in_channels")
        if x is not None and x.is_floating_point():
            x = node_features(x, type(self).__name__)
            if width is not None and x.shape[-1] != width:
                raise ValueError(f"{type(self).__name__}: {name} has {x.shape[-1]} features per node, but the "
                                 "layer was "
                                 f"built for {channels}={width}")
            return x
        if self.num_blocks is not None:
            raise ValueError(f"{type(self).__name__}: block-diagonal decomposition (num_blocks) needs float "
                             "node features, "
                             "not node indices or x=None (as in PyG)")
        if x is None:
            x = torch.arange(width, device=self.weight.device)
        # torch would index by a bool/uint8 one as by a mask; a complex one, not floating
        # point, was cast to int64 indices (its imaginary part and fraction dropped)
        if x.dtype in (torch.bool, torch.uint8) or x.is_complex():
            raise TypeError(f"{type(self).__name__}: {name} is a {x.dtype} tensor; give float node features or "
                            "integer node indices (int64 or int32)")
        if x.dim() != 1:
            raise ValueError(f"{type(self).__name__}: integer x must be a vector of node indices, got shape "
                             f"{list(x.shape)}")
        x = x.long()        # one_hot takes int64 only; PyG indexes by int32 indices as well
        if width is None or x.numel() == 0:     # one_hot cannot size an empty input's classes
            return x.new_zeros((x.shape[0], width or 0), dtype=self.weight.dtype)
        _check_node_indices(x, width, name, channels, "root" if name == "x_dst" else "embedding", type(self).__name__)
        return torch.nn.functional.one_hot(x, width).to(self.weight.dtype)

    def _typed_graph(self, x_src: torch.Tensor, x_dst: torch.Tensor, graph: Graph | torch.Tensor,
                     edge_type: torch.Tensor | None, bipartite: bool) -> Graph:
        num_src, num_dst = x_src.shape[0], x_dst.shape[0]
        if isinstance(graph, Graph):
            if edge_type is not None and graph.edge_type is not None:
                raise ValueError("pass edge_type inside the Graph (Graph(..., edge_type=...)) or with an "
                                 "edge_index, not both")
        else:
            if is_sparse_adjacency(graph):
                graph, edge_type = _typed_adj_t(graph, edge_type, num_src, num_dst, type(self).__name__)
            if edge_type is None:
                raise ValueError(f"{type(self).__name__} needs edge types: a Graph built with edge_type=..., or "
                                 "forward(x, edge_index, edge_type)")
            graph = self._typed_graph_of(graph, edge_type, num_dst, num_src if bipartite else None)
        if (graph.num_src_nodes, graph.num_nodes) != (num_src, num_dst):
            if not (bipartite or graph.is_bipartite):
                raise ValueError(f"x has {num_src} rows but the graph has {graph.num_nodes} nodes")
            raise ValueError(f"x has {num_src} source and {num_dst} destination rows but the graph has "
                             f"{graph.num_src_nodes} source and {graph.num_nodes} destination nodes")
        check_edge_types(graph, self.num_relations, type(self).__name__)
        return graph

    def _typed_graph_of(self, edge_index: torch.Tensor, edge_type: Any, num_dst: int, num_src: int | None) -> Graph:
        """The typed graph of ``edge_index`` and ``edge_type``, built once while both are
        the same tensors, unchanged. PyG's R-GCN takes them raw every step, and building
        the graph anew each call -- validating ids, sorting the CSR, finding the
        (vertex, relation) pairs (two ``unique`` sorts) -- took about 7 ms of a 45 ms
        R-GCN call on reddit2-like (H200). Remembered per ``edge_index`` by the index
        cache (a weak reference and a stamp), and per ``edge_type`` by identity (held by
        the memo, so its id cannot be reused) and stamp (torch's version counter)."""
        def build() -> Graph:
            return Graph(edge_index[0], edge_index[1], num_dst, edge_type=edge_type,
                         num_edge_types=self.num_relations, num_src_nodes=num_src)
        if (torch.compiler.is_compiling() or type(edge_index) is not torch.Tensor or edge_index.layout != torch.strided
                or not isinstance(edge_type, torch.Tensor)):
            return build()
        types = _stamp([edge_type])
        if types is None:       # an inference tensor: no version counter to tell an edit by
            return build()
        memo = cached_graph(edge_index, [edge_index], ("typed_graphs", num_dst, num_src), lambda parts: {})
        kept = memo.get(self.num_relations)
        if kept is None or kept[0] is not edge_type or kept[1] != types:
            kept = memo[self.num_relations] = (edge_type, types, build())
        return kept[2]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"num_relations={self.num_relations})")
