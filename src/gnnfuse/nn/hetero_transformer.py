"""The Heterogeneous Graph Transformer (HGT, Hu et al. 2020) with PyG 2.8's ``HGTConv``
arguments, parameter names and maths, its attention written vertex-centrically on the
typed `Graph` that `HeteroGraph` lays the per-type inputs onto.

Per node type, ``kqv_lin`` maps features to keys, queries and values (H heads of width
D). Along an edge ``u -> v`` of relation ``r`` and head ``h``, the key and value pass
through that relation's and head's matrices ``k_rel.weight[h * R + r]`` /
``v_rel.weight[h * R + r]``; the score ``<q_v, k_u W^k> * p_rel[r] / sqrt(D)`` is
soft-maxed over all of ``v``'s in-edges, whatever their relation, and weights the
transformed values. Per destination node type the sum goes through GELU and
``out_lin``, then a learnt gate ``sigmoid(skip)`` mixes in the input when the widths
match. Node types that no edge type ends at are left out of the output, as in PyG.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .. import frontend
from ..graph.hetero import EdgeType, HeteroGraph, check_metadata
from ..graph.hetero_cache import cached_hetero_graph
from . import pyg_init
from .compiling import names_its_programs
from .fixed_aggregation import FixedAggregation
from .fixed_flow import FixedFlow
from .hetero_conv import module_key, refuse_shared_keys
from .pyg_options import message_passing_options
from .torchscript import NotScriptable


class TypeLinears(nn.Module):
    """One linear map per node type, stored as PyG's ``HeteroDictLinear`` stores them
    (``lins.<type>.weight``/``.bias``), so its state dict loads into this one, and drawn
    as PyG draws them: each map at its construction and once more when all are built;
    a lazy one (width -1) twice at the first call, in the order of that call's types,
    and a lazy one that call left out once, at the first call giving its type."""

    def __init__(self, in_channels: Mapping[str, int], out_channels: int, bias: bool = True):
        super().__init__()
        self.types = list(in_channels)
        self.lins = nn.ModuleDict({module_key(t): pyg_init.linear(c, out_channels, bias)
                                   for t, c in in_channels.items()})
        self._called = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in self.lins.values():
            pyg_init.reset_linear(lin)

    def forward(self, x_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self._materialize(x_dict)
        return {t: self.lins[module_key(t)](x_dict[t]) for t in self.types if t in x_dict}

    def _materialize(self, x_dict: Mapping[str, torch.Tensor]) -> None:
        """Draw the lazy maps ``x_dict`` sizes as PyG does. Its ``HeteroDictLinear`` draws
        each map of its first call twice (the map's own lazy hook, then its reset), in that
        call's order, and then drops that hook; a map that call left out is drawn later by
        its own lazy ``Linear``, once, in the maps' order. Drawn twice then too,
        such a map got other weights than PyG's under the same seed, and every later draw
        (dropout, the next layer) shifted."""
        if self._called:
            pairs = [(self.lins[module_key(t)], x_dict[t]) for t in self.types if t in x_dict]
        else:
            pairs = [(self.lins[module_key(t)], x) for t, x in x_dict.items() if t in self.types]
        pyg_init.materialize(pairs, times=1 if self._called else 2)
        self._called = True

    def check_widths(self, x_dict: Mapping[str, torch.Tensor], layer: str) -> None:
        """Refuse a feature table whose width is not its type's map's, naming the type
        (torch's matmul error names neither the type nor which width was expected), and
        one that is not [num_nodes, F]: a [3] table was refused as "features of width 3",
        and a [1, 3, F] one as "a destination id is outside 0..0 (node type 'b' has 1
        vertices)" (PyG's HGTConv ran the [1, 3, F] table, mixing its rows)."""
        for t in self.types:
            if t in x_dict and (not isinstance(x_dict[t], torch.Tensor) or x_dict[t].dim() != 2):
                got = (f"shape {list(x_dict[t].shape)}" if isinstance(x_dict[t], torch.Tensor)
                       else type(x_dict[t]).__name__)
                raise ValueError(f"{layer}: the features of node type {t!r} must be a [num_nodes, F] tensor, got {got}")
            lin = self.lins[module_key(t)]
            # the weight's width, not in_features: a lazy map given its weight by
            # load_state_dict keeps in_features 0 (torch sets it at a first call only)
            if t in x_dict and not pyg_init.is_lazy(lin) and x_dict[t].shape[-1] != lin.weight.shape[1]:
                raise ValueError(f"{layer}: node type {t!r} has features of width {x_dict[t].shape[-1]}, but the "
                                 f"layer was built for width {lin.weight.shape[1]}")


class RelationHeadWeight(nn.Module):
    """PyG's ``HeteroLinear`` without bias as HGT uses it: ``weight`` [types, in, out],
    type ``h * R + r`` holding relation r's matrix for head h."""

    def __init__(self, num_types: int, in_channels: int, out_channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_types, in_channels, out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        pyg_init.kaiming_uniform(self.weight, self.weight.shape[1], math.sqrt(5))    # PyG's default

    def per_relation(self, heads: int, relations: int) -> torch.Tensor:
        """[R, H*D, H*D]: each relation's heads as one block-diagonal matrix, so a row's
        H heads are transformed by one typed matmul of the flat [H*D] row. The off-diagonal
        zeros cost H times the multiply-adds of per-head [D, D] products; the compiler's
        typed matmul takes one [in, out] matrix per type."""
        d = self.weight.shape[-1]
        w = self.weight.view(heads, relations, d, d).transpose(0, 1)
        eye = torch.eye(heads, dtype=w.dtype, device=w.device)
        return torch.einsum("rhij,hg->rhigj", w, eye).reshape(relations, heads * d, heads * d)


def _key(edge_type: EdgeType) -> str:
    """PyG's ``p_rel`` key of an edge type."""
    return _parameter_key("__".join(edge_type))


def _parameter_key(key: str) -> str:
    """PyG's ``ParameterDict`` key (dots, which torch refuses, as ``#``)."""
    return module_key(key, nn.ParameterDict)


def hetero_graph_for(edge_index_dict: Any, x_dict: Mapping[str, torch.Tensor], edge_types: list[EdgeType],
                     layer: str) -> HeteroGraph:
    """The `HeteroGraph` a hetero layer runs on: given, or made from ``edge_index_dict``
    with the node types in ``x_dict``'s order and relations numbered as the layer's
    metadata lists them (so relation r reads the layer's r-th weights) -- built once
    for as long as the dict's tensors are unchanged (`cached_hetero_graph`).

    An empty dict is refused: the layer would return every destination type's output
    computed without a single edge (each type's gated ``out_lin(gelu(0))``), where PyG's
    layer raises (on an obscure ``torch.cat`` of an empty list)."""
    if isinstance(edge_index_dict, HeteroGraph):
        if edge_index_dict.edge_types != edge_types:
            raise ValueError(f"{layer}: the HeteroGraph numbers its edge types {edge_index_dict.edge_types}, but "
                             f"the layer's metadata lists {edge_types}; build it with edge_types=metadata[1]")
        return edge_index_dict
    if not isinstance(edge_index_dict, Mapping):
        raise TypeError(f"{layer}: expected edge_index_dict {{(src, rel, dst): edge_index}} or a HeteroGraph, got "
                        f"{type(edge_index_dict).__name__}")
    if not edge_index_dict:
        raise ValueError(f"{layer}: edge_index_dict holds no edge type, but the layer's metadata lists {edge_types}; "
                         "give the edge_index of at least one of them (an edge type without edges as a [2, 0] "
                         "tensor). An empty dict is most often the wrong dict: PyG's layer refuses it too")
    for edge_type in edge_index_dict:     # (one outside the metadata is refused by HeteroGraph)
        for t in (edge_type[0], edge_type[-1]) if tuple(edge_type) in edge_types else ():
            if t not in x_dict:
                raise ValueError(f"{layer}: edge type {tuple(edge_type)} reads node type {t!r}, which x_dict has no "
                                 f"features for (x_dict holds {list(x_dict)})")
    return cached_hetero_graph(edge_index_dict, {t: x.shape[0] for t, x in x_dict.items()},
                               node_types=list(x_dict), edge_types=edge_types)


def _attend(hetero: HeteroGraph, k: torch.Tensor, q: torch.Tensor, v: torch.Tensor, w_k: torch.Tensor,
            w_v: torch.Tensor, p: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """[N, H, D]: the softmax-weighted sum of relation-transformed values per vertex.

    Written per edge, as the paper writes it. The compiler computes each transformed key
    and value once per (source, relation) pair (passes/compact.py) and runs the attention
    on the graph over those pairs (passes/pair_sources.py), so no [E, H x D] key, value
    or gradient is written."""
    def hgt(vertex):
        scores = [((e.src.k @ e.type.w_k).view(heads, dim) * vertex.q).sum(-1) * e.type.p for e in vertex.inedges]
        peak = max(scores)
        weights = [torch.exp(s - peak) for s in scores]
        total = sum(weights)
        return sum([(weights[i] / total).unsqueeze(-1) * (e.src.v @ e.type.w_v).view(heads, dim)
                    for i, e in enumerate(vertex.inedges)])

    return frontend.VertexFunction(hgt)(hetero.graph, {"k": k, "q": q, "v": v}, None,
                                        etype_feature={"w_k": w_k, "w_v": w_v, "p": p})


class HGTConv(FixedAggregation, FixedFlow, NotScriptable, nn.Module):
    r"""PyG's ``HGTConv(in_channels, out_channels, metadata, heads=1)``: same arguments,
    parameters (``kqv_lin``, ``out_lin``, ``k_rel``, ``v_rel``, ``skip``, ``p_rel``) and
    maths, so ``load_state_dict(pyg_layer.state_dict())`` copies a PyG layer.

    ``forward(x_dict, edge_index_dict)`` takes ``{node_type: x}`` and ``{(src, rel, dst):
    edge_index}`` (whose `HeteroGraph` is kept while its tensors are unchanged), or a
    `HeteroGraph` built with ``edge_types=metadata[1]``, and returns ``{node_type: out}``
    for the node types of x_dict some edge type of the metadata ends at (an edge type the
    dict leaves out has no edges; an empty dict is refused). A `HeteroGraph` may leave out
    a node type no edge touches (it gets no messages) and hold one x_dict has no features
    for if no edge touches it, as the dicts may in PyG. ``in_channels`` may be a
    dict per node type, or -1 (lazy), as in PyG. The relation matrices of all heads are
    applied as one block-diagonal matrix per relation (`RelationHeadWeight.per_relation`),
    once per (source vertex, relation) pair (passes/compact.py).
    """

    def __init__(self, in_channels: int | dict[str, int], out_channels: int, metadata: tuple[list, list],
                 heads: int = 1, **kwargs: Any):
        super().__init__()
        message_passing_options("HGTConv", kwargs, aggr=())      # PyG's HGTConv sets aggr itself
        if out_channels % heads != 0:
            raise ValueError(f"'out_channels' (got {out_channels}) must be divisible by the number of heads "
                             f"(got {heads})")
        check_metadata(metadata, "HGTConv")
        node_types, edge_types = list(metadata[0]), [tuple(t) for t in metadata[1]]
        if not isinstance(in_channels, dict):
            in_channels = {t: in_channels for t in node_types}
        for types, key in ((node_types, module_key), (node_types, _parameter_key), (edge_types, _key)):
            refuse_shared_keys(types, key, "HGTConv")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.node_types, self.edge_types = node_types, edge_types
        self.dst_node_types = {t[-1] for t in edge_types}
        dim = out_channels // heads
        self.kqv_lin = TypeLinears(in_channels, out_channels * 3)
        self.out_lin = TypeLinears({t: out_channels for t in node_types}, out_channels)
        self.k_rel = RelationHeadWeight(heads * len(edge_types), dim, dim)
        self.v_rel = RelationHeadWeight(heads * len(edge_types), dim, dim)
        self.skip = nn.ParameterDict({_parameter_key(t): nn.Parameter(torch.ones(1)) for t in node_types})
        # pairs, not a dict: torch sorts a dict's keys, PyG keeps the metadata's order, and an
        # optimizer's state (a PyG checkpoint's Adam moments) follows parameters by position
        self.p_rel = nn.ParameterDict([(_key(t), nn.Parameter(torch.ones(1, heads))) for t in edge_types])
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in (self.kqv_lin, self.out_lin, self.k_rel, self.v_rel):
            module.reset_parameters()
        for p in (*self.skip.values(), *self.p_rel.values()):
            nn.init.ones_(p)

    @names_its_programs
    def forward(self, x_dict: Mapping[str, torch.Tensor], edge_index_dict: Any) -> dict[str, torch.Tensor]:
        x_dict = {t: x for t, x in x_dict.items() if t in self.kqv_lin.types}    # PyG skips unknown types
        self.kqv_lin.check_widths(x_dict, "HGTConv")
        hetero = hetero_graph_for(edge_index_dict, x_dict, self.edge_types, "HGTConv")
        heads, relations = self.heads, len(self.edge_types)
        if not relations:                                  # no edge type: no node type has an output
            return {}
        dim = self.out_channels // heads
        kqv = _edgeless_rows_as_zeros(hetero, self.kqv_lin(x_dict), 3 * self.out_channels, self.k_rel.weight)
        k, q, v = _split_kqv(hetero, kqv)
        p = torch.cat([self.p_rel[_key(t)] for t in self.edge_types]) / math.sqrt(dim)
        w_k, w_v = self.k_rel.per_relation(heads, relations), self.v_rel.per_relation(heads, relations)
        out = self.attention(hetero, k, q.view(-1, heads, dim), v, w_k, w_v, p, heads, dim)
        out = hetero.split(out.reshape(-1, self.out_channels),
                           [t for t in hetero.node_types if t in self.dst_node_types and t in x_dict])
        for t in self.dst_node_types.intersection(x_dict).difference(hetero.node_types):
            # a destination type a given HeteroGraph leaves out has no edges: no messages, as in PyG
            out[t] = x_dict[t].new_zeros(x_dict[t].shape[0], self.out_channels)
        mapped = self.out_lin({t: F.gelu(o) for t, o in out.items()})
        result = {}
        for t, o in mapped.items():
            if o.shape[-1] == x_dict[t].shape[-1]:
                gate = self.skip[_parameter_key(t)].sigmoid()
                o = gate * o + (1 - gate) * x_dict[t]
            result[t] = o
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}(-1, {self.out_channels}, heads={self.heads})"

    # ``(hetero, k, q, v, w_k, w_v, p, heads, dim) -> [N, H, D]``: the attention, replaceable
    # by another formulation of the same maths (benchmarks/bench_hetero.py runs
    # Graphiler's message/reduce UDF through it)
    attention = staticmethod(_attend)


def _edgeless_rows_as_zeros(hetero: HeteroGraph, kqv: dict[str, torch.Tensor], width: int,
                            like: torch.Tensor) -> dict[str, torch.Tensor]:
    """``kqv`` with zero rows for the node types of a given `HeteroGraph` that x_dict has
    no (metadata) features for. Such a type is fine when no edge touches it: its rows are
    read by no edge and give no output (a type outside the metadata is one: PyG ignores
    its features). With an edge reading it the call is refused, naming the edge type."""
    for t in hetero.node_types:
        if t in kqv:
            continue
        touching = hetero.edge_types_touching(t)
        if touching:
            raise ValueError(f"HGTConv: edge type {touching[0]} of the HeteroGraph reads node type {t!r}, which "
                             f"x_dict has no features for (it holds {list(kqv)} of the metadata's node types)")
        kqv[t] = like.new_zeros(hetero.counts[t], width)
    return kqv


def _split_kqv(hetero: HeteroGraph, kqv: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Keys, queries and values of every vertex in the global numbering: each type's
    [n, 3F] projection split in three (PyG's ``tensor_split`` order: three equal column
    blocks), then concatenated. ``split`` rather than ``tensor_split``: the gradient of
    a type's three blocks is then one concatenation, where ``tensor_split``'s slices each
    made a zero [n, 3F] table, copied their block in and were summed by autograd (on
    mag-sized HGT about 3 ms of fills, copies and additions per step)."""
    parts = {t: val.split(val.shape[1] // 3, dim=1) for t, val in kqv.items()}
    return tuple(hetero.concat({t: p[i] for t, p in parts.items()}) for i in range(3))
