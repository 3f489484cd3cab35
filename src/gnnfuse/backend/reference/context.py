"""The graph indices movement ops read while a program runs.

Besides the endpoint indices ``src``/``dst``, typed programs read ``etype`` (each edge's
type), ``srctype``/``dsttype`` (each edge's endpoint's node type) and ``ntype`` (each
vertex's node type); the derived ones are built once per graph in its cache.
"""
from __future__ import annotations

import torch

from ...graph import Graph
from ...ir import CompileError, Residency
from ...ir.ops.compact import scatter_scaled_rows
from ...ir.ops.dense import row_dot_reference
from ...ir.ops.movement import contended_sum_reference, gather_rows
from ...ir.ops.pairwise import in_edge_pairs
from ...ir.ops.typed import RowGroups, group_rows, typed_matmul, typed_matmul_tn

EDGE_TYPE_INDICES = ("etype",)
NODE_TYPE_INDICES = ("srctype", "dsttype", "ntype")


class GraphContext:
    """Adapts a `Graph` to the registry's `ExecContext`: int64 indices by name."""

    # Per-type matmuls (ir/ops/typed.py): one torch matmul per type here; the Triton
    # backend's context runs one segment-matmul kernel for all types instead.
    grouped_matmul = staticmethod(typed_matmul)
    grouped_matmul_tn = staticmethod(typed_matmul_tn)
    scatter_rows = staticmethod(scatter_scaled_rows)     # the typed aggregation's row moves
    gather_rows = staticmethod(gather_rows)               # rows onto edges (broadcast, pair products)
    row_dot = staticmethod(row_dot_reference)             # per-row dot products over feature dims
    row_matmul = staticmethod(torch.matmul)               # per-row matrix products, rows aligned
    contended_sum = staticmethod(contended_sum_reference)  # many entries into few rows (ir/ops/movement.py)

    def __init__(self, graph: Graph):
        self.graph = graph
        self.run_memo: dict = {}      # what ops of one program run share (compact._shared_pair_sums)
        self.num_nodes = graph.num_nodes
        self.num_edges = graph.num_edges
        self.device = graph.device
        # the graph's endpoint arrays once read (`index`): fixed for a graph once read (a lazy
        # graph keeps those it builds for them), and every gather and scatter of a run reads one
        self._src: torch.Tensor | None = None
        self._dst: torch.Tensor | None = None

    @property
    def src(self) -> torch.Tensor:
        """Each edge's source, int64. Read on demand: a lazily self-looped graph
        (`Graph.add_self_loops`) builds its endpoint arrays only for a program that
        indexes by them outside the fused kernels, which walk the CSR layouts."""
        return self.graph.src

    @property
    def dst(self) -> torch.Tensor:
        return self.graph.dst

    def index(self, by: str) -> torch.Tensor:
        """int64 index ``by``: one entry per edge (per vertex for ``ntype``)."""
        if by == "src":         # not through the properties: read on every gather and scatter
            src = self._src
            if src is None:
                src = self._src = self.graph.src
            return src
        if by == "dst":
            dst = self._dst
            if dst is None:
                dst = self._dst = self.graph.dst
            return dst
        if by in EDGE_TYPE_INDICES:
            return self._edge_types()
        node_type = self._node_types()
        if by == "ntype":
            return node_type
        if by == "srctype":
            return self.graph.cached("src_node_type", lambda g: node_type[g.src])
        if by == "dsttype":
            return self.graph.cached("dst_node_type", lambda g: node_type[g.dst])
        raise ValueError(f"unknown index {by!r}")

    def num_rows(self, by: str) -> int:
        """How many rows index ``by`` points into: sources for ``src`` (a bipartite
        graph's source set), destinations for ``dst``."""
        if by == "src":
            return self.graph.num_src_nodes
        if by == "dst":
            return self.num_nodes
        if by in EDGE_TYPE_INDICES:
            self._edge_types()
            return int(self.graph.num_edge_types)
        self._node_types()
        return int(self.graph.num_node_types)

    def groups(self, by: str) -> RowGroups:
        """Row ids per value of index ``by`` (per type), each ascending; cached per graph.

        Per-type ops (typed_matmul) run one dense op per group, so the grouping is a sort
        done once per graph rather than a boolean mask per type per call."""
        return self.graph.cached(f"groups_by_{by}", lambda g: group_rows(self.index(by), self.num_rows(by)))

    def _edge_types(self) -> torch.Tensor:
        if self.graph.edge_type is None:
            raise CompileError("this program reads edge types (e.type / edges.type) but the graph has "
                               "none; build it with Graph(..., edge_type=...)")
        return self.graph.edge_type

    def _node_types(self) -> torch.Tensor:
        if self.graph.node_type is None:
            raise CompileError("this program reads node types (u.type / edges.srctype / edges.dsttype) "
                               "but the graph has none; build it with Graph(..., node_type=...)")
        return self.graph.node_type

    def rows(self, residency: Residency, side: str = "dst") -> int:
        """Rows of a value of ``residency``; a NODE value's count depends on which vertex
        set it is a table of (``side``, see ir/sides.py), which matters on bipartite graphs."""
        if residency is Residency.NODE:
            return self.num_rows(side)
        if residency.is_edge_rowed:
            return self.num_edges
        if residency is Residency.EDGE_TYPE:
            return self.num_rows("etype")
        if residency is Residency.NODE_TYPE:
            return self.num_rows("ntype")
        if residency is Residency.PAIR:
            return len(self.pairs()[0])
        raise ValueError(f"{residency.name} values have no rows")

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Edge ids (i, j) of every ordered pair of in-edges of one vertex (PAIR rows)."""
        return self.graph.cached("in_edge_pairs", lambda g: in_edge_pairs(g.dst, g.num_nodes))

    def csr(self, by: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Edges grouped by ``by``: (rowptr, the other endpoint, edge ids)."""
        csr = self.graph.csr() if by == "dst" else self.graph.reverse_csr()
        return csr.rowptr, csr.col, csr.eid

    def grouped(self, by: str) -> tuple[torch.Tensor, torch.Tensor]:
        """`csr` less the edge ids, which are then never built (`Graph.grouped`)."""
        return self.graph.grouped("dst" if by == "dst" else "src")

    def order(self, by: str) -> torch.Tensor:
        """Group rows in descending degree, so the heaviest rows start first."""
        if by == "dst":
            return self.graph.degree_order()
        return self.graph.cached("out_degree_order", lambda g: torch.sort(
            g.out_degrees(), descending=True, stable=True).indices)

    def zero_unread_rows(self, x: torch.Tensor, by: str) -> torch.Tensor:
        """``x`` with the rows the broadcast by ``by`` never reads (vertices without
        out-edges for ``src``, without in-edges for ``dst``) zeroed; ``x`` itself when it
        reads every row. The ids come back from the device once per graph and side (one
        read-back), so a graph that reads every row -- one with self loops -- costs no
        pass at all, where a mask over every row wrote a copy of ``x`` per call."""
        def unread(g: Graph) -> torch.Tensor | None:
            ids = (self.degree(by) == 0).nonzero().squeeze(1)
            return ids if ids.numel() else None
        ids = self.graph.cached(f"unread_rows_by_{by}", unread)
        return x if ids is None else x.index_fill(0, ids, 0.0)

    def degree(self, by: str) -> torch.Tensor:
        """How many entries of index ``by`` point at each row (in/out-degree, edges or
        vertices per type)."""
        if by == "dst":
            return self.graph.in_degrees()
        if by == "src":
            return self.graph.out_degrees()
        return self.graph.cached(f"count_by_{by}", lambda g: torch.bincount(
            self.index(by), minlength=self.num_rows(by)))
