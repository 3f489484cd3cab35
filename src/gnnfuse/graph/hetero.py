"""PyG's heterogeneous graphs (``HeteroData``, or dicts keyed by node and edge type) laid
onto one typed `Graph`.

A PyG hetero graph numbers each node type's vertices from 0 and keeps one ``[2, E_t]``
edge_index per edge type ``(src_type, relation, dst_type)``. gnnfuse's kernels run on one
graph, so the types are concatenated: node type ``t`` owns the global ids
``offsets[t] .. offsets[t] + counts[t] - 1``, every edge is shifted by its endpoints'
offsets, and the edge and node types become the graph's ``edge_type`` / ``node_type``
(their numbers are the positions in `HeteroGraph.edge_types` / `node_types`, which a
layer fixes from its ``metadata`` so its per-relation weights line up). Edges come in
`edge_types` order, each type's edges in their own order, so a per-edge result splits
back the same way.

Only the index arrays are rebuilt. Node features are not copied to build the graph:
a layer usually transforms each type's features first (HGT's per-type K/Q/V maps) and
concatenates the results, which are new tensors anyway; `concat` is the one copy a
layer makes, and `split` hands per-type results back as views, not copies.

torch_geometric is never imported: a ``HeteroData`` is read through its
``num_nodes_dict`` and ``edge_index_dict``.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import torch

from .graph import Graph
from .validate import integer_ids

EdgeType = tuple[str, str, str]


def check_metadata(metadata: tuple[Iterable[str], Iterable[EdgeType]], caller: str) -> None:
    """Refuse PyG ``metadata`` (node types, edge types) with an edge type between node
    types the node list leaves out: what a layer built for it does there is undefined
    (PyG's ``to_hetero`` drops the edge type, its HGTConv fails on a KeyError at the call).
    ``caller`` names the layer in the message."""
    node_types = list(metadata[0])
    for edge_type in metadata[1]:
        unknown = [t for t in dict.fromkeys((edge_type[0], edge_type[-1])) if t not in node_types]
        if unknown:
            raise ValueError(f"{caller}: edge type {tuple(edge_type)} names node type(s) {unknown}, which "
                             f"metadata[0] {node_types} does not list; list every node type (data.metadata() "
                             "does)")


class HeteroGraph:
    """One typed `Graph` holding every node and edge type of a PyG hetero graph, with the
    record (`offsets`, `counts`) that maps per-type tensors onto it and back.

    ``edge_index_dict`` maps ``(src_type, relation, dst_type)`` to a ``[2, E]`` index
    tensor in that type pair's own numbering; ``num_nodes_dict`` maps each node type to
    its vertex count. ``node_types`` / ``edge_types`` fix the type numbering (default:
    the dicts' order); every edge type of the dict must be in ``edge_types``, which may
    list more (relations without edges here). Each index is checked against its own
    type's count: an id past it would otherwise land silently on the next type's vertex.
    A type listed twice is refused: its edges would be laid on twice (each vertex of a
    repeated node type numbered twice), silently changing every sum and softmax there.
    The index arrays are built anew (shifted by the offsets), so an in-place edit of the
    dict's tensors afterwards does not reach a built `HeteroGraph` (a layer given the dict
    itself builds a new one: `hetero_cache`); an edit of ``graph``'s own tensors is
    refused at its next use (`Graph.check_unchanged`).
    """

    def __init__(self, edge_index_dict: Mapping[EdgeType, Any], num_nodes_dict: Mapping[str, int], *,
                 node_types: Iterable[str] | None = None, edge_types: Iterable[EdgeType] | None = None) -> None:
        self.node_types: list[str] = list(num_nodes_dict if node_types is None else node_types)
        self.edge_types: list[EdgeType] = [tuple(t) for t in (edge_index_dict if edge_types is None else edge_types)]
        for kind, types in (("node", self.node_types), ("edge", self.edge_types)):
            repeated = sorted({t for t in types if types.count(t) > 1}, key=types.index)
            if repeated:
                raise ValueError(f"{kind} type(s) {repeated} are listed more than once in {kind}_types {types} "
                                 f"(a layer's metadata[{int(kind == 'edge')}]): list each {kind} type once")
        missing = [t for t in self.node_types if t not in num_nodes_dict]
        if missing:
            raise ValueError(f"no vertex count for node type(s) {missing}")
        self.counts: dict[str, int] = {t: _vertex_count(t, num_nodes_dict[t]) for t in self.node_types}
        self.offsets: dict[str, int] = {}
        total = 0
        for t in self.node_types:
            self.offsets[t], total = total, total + self.counts[t]
        self.edge_offsets: dict[EdgeType, int] = {}
        self.edge_counts: dict[EdgeType, int] = {}
        self.graph = self._build(edge_index_dict, total)

    @classmethod
    def from_data(cls, data: Any, *, node_types: Iterable[str] | None = None,
                  edge_types: Iterable[EdgeType] | None = None) -> HeteroGraph:
        """From a PyG ``HeteroData`` (read by attribute: ``num_nodes_dict``, ``edge_index_dict``)."""
        if not hasattr(data, "edge_index_dict") or not hasattr(data, "num_nodes_dict"):
            raise TypeError(f"HeteroGraph.from_data needs a PyG HeteroData (with edge_index_dict and "
                            f"num_nodes_dict), got {type(data).__name__}")
        return cls(data.edge_index_dict, data.num_nodes_dict, node_types=node_types, edge_types=edge_types)

    def _build(self, edge_index_dict: Mapping[EdgeType, Any], num_nodes: int) -> Graph:
        relation = {t: i for i, t in enumerate(self.edge_types)}
        unknown = [t for t in edge_index_dict if tuple(t) not in relation]
        if unknown:
            raise ValueError(f"edge type(s) {unknown} are not among the edge types {self.edge_types}")
        srcs, dsts, types = [], [], []
        device = None
        position = 0
        for edge_type in self.edge_types:
            if edge_type not in edge_index_dict:
                continue
            src_type, _, dst_type = edge_type
            for t in (src_type, dst_type):
                if t not in self.counts:
                    raise ValueError(f"edge type {edge_type} names node type {t!r}, which has no vertex count")
            index = edge_index_dict[edge_type]
            if (not isinstance(index, torch.Tensor) or index.layout is not torch.strided or index.dim() != 2
                    or index.shape[0] != 2):
                raise TypeError(f"edge type {edge_type}: expected a [2, E] edge_index tensor, got "
                                f"{_describe(index)} (sparse adjacencies are not supported here)")
            device = index.device if device is None else device
            if index.device != device:
                raise ValueError(f"edge type {edge_type} is on {index.device}, the others on {device}")
            index = integer_ids(f"edge type {edge_type}: the edge_index", index).long()
            for row, t, side in ((index[0], src_type, "source"), (index[1], dst_type, "destination")):
                if row.numel() and (int(row.min()) < 0 or int(row.max()) >= self.counts[t]):
                    raise ValueError(f"edge type {edge_type}: a {side} id is outside 0..{self.counts[t] - 1} "
                                     f"(node type {t!r} has {self.counts[t]} vertices)")
            self.edge_offsets[edge_type] = position
            self.edge_counts[edge_type] = index.shape[1]
            position += index.shape[1]
            srcs.append(index[0] + self.offsets[src_type])
            dsts.append(index[1] + self.offsets[dst_type])
            types.append(torch.full_like(index[0], relation[edge_type]))
        device = torch.device("cpu") if device is None else device
        node_type = torch.repeat_interleave(
            torch.arange(len(self.node_types), device=device),
            torch.tensor([self.counts[t] for t in self.node_types], device=device))
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Graph(torch.cat(srcs) if srcs else empty, torch.cat(dsts) if dsts else empty, num_nodes,
                     edge_type=torch.cat(types) if types else empty,
                     num_edge_types=max(len(self.edge_types), 1),
                     node_type=node_type, num_node_types=max(len(self.node_types), 1))

    def edge_types_touching(self, node_type: str) -> list[EdgeType]:
        """The edge types with at least one edge here that start or end at ``node_type``."""
        return [t for t, n in self.edge_counts.items() if n and node_type in (t[0], t[-1])]

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    def node_slice(self, node_type: str) -> slice:
        """The global ids of ``node_type``'s vertices."""
        start = self.offsets[node_type]
        return slice(start, start + self.counts[node_type])

    def concat(self, x_dict: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-type row tables as one table in the global numbering (one copy). Every node
        type needs its table with exactly its vertex count of rows."""
        tables = []
        for t in self.node_types:
            if t not in x_dict:
                raise ValueError(f"no features for node type {t!r}")
            x = x_dict[t]
            if x.shape[0] != self.counts[t]:
                raise ValueError(f"node type {t!r} has {self.counts[t]} vertices but its features have "
                                 f"{x.shape[0]} rows")
            tables.append(x)
        return torch.cat(tables)

    def split(self, out: torch.Tensor, node_types: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """A global row table back as ``{node_type: rows}`` views (no copy), for
        ``node_types`` (default: all).

        One ``split``, not a slice per type: its gradient is one concatenation of the
        parts' gradients (zeros for a part no loss reached), where each slice's was a
        zero table of all N rows with its part copied in, summed by autograd -- three
        launches per type, each over the whole table."""
        if out.shape[0] != self.num_nodes:
            raise ValueError(f"expected {self.num_nodes} rows (all node types), got {out.shape[0]}")
        parts = dict(zip(self.node_types, out.split([self.counts[t] for t in self.node_types])))
        return {t: parts[t] for t in (self.node_types if node_types is None else node_types)}

    def __repr__(self) -> str:
        return (f"HeteroGraph(node_types={self.node_types}, edge_types={self.edge_types}, "
                f"num_nodes={self.num_nodes}, num_edges={self.graph.num_edges})")


def _vertex_count(node_type: str, count: Any) -> int:
    """``count`` as node type ``node_type``'s vertex count: an int (a numpy integer or a
    one-element integer tensor, as PyG may store ``num_nodes``), never negative. ``int()``
    had read 2.5 as 2 without a word, raised about ``NoneType`` for a type PyG could not
    count, and took -1, whose edges were then said to lie "outside 0..-2"."""
    if isinstance(count, torch.Tensor) and count.numel() == 1 and not count.is_floating_point():
        count = count.item()
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"node type {node_type!r}: its vertex count must be a non-negative int, got {count!r}")
    return int(count)


def _describe(value: Any) -> str:
    if not isinstance(value, torch.Tensor):
        return type(value).__name__
    layout = "" if value.layout is torch.strided else f"{value.layout} "
    return f"a {layout}tensor of shape {list(value.shape)}"
