"""The immutable graph every gnnfuse layer runs on.

A graph is stored as its edge list in *input order*: edge i goes ``src[i] -> dst[i]`` and
edge-feature tensors are indexed by that i. Kernels want other layouts -- in-edges grouped
by destination (CSR) for the forward pass, out-edges grouped by source (reverse CSR) for
the backward pass (Seastar §6.1, §6.3.4), vertices in descending degree for load balancing
(§6.3.3). Each layout permutes the edges, so each has an ``eid`` array mapping its
positions back to edge ids; edge features are never permuted. Only kernels that read
edge-rowed tensors need ``eid``, so `Graph.grouped` gives a layout without it and the
ids are built only when asked for (on a products-sized graph the two id arrays are
0.51 GB that a GCN, SAGE or GAT step never reads).

All layouts are built lazily, on the graph's device, once per graph, and memoised in one
cache that layers also use (`Graph.cached`) for their own derived data such as GCN
normalisation. Because the cache assumes the graph never changes, a `Graph` has no
mutating methods: transformations return new graphs with empty caches.

The index tensors a graph keeps without copying can still be written in place by their
owner (``edge_index[1, :4] = 0``). The layouts built before would then describe the old
edges while a torch gather reads the new ones -- the CPU and Triton backends silently
ran on the old CSR where the reference (and PyG) saw the edit. So a graph *seals* its
index tensors when it is built (their version counters, which every in-place torch op
moves, views included) and `check_unchanged` refuses a graph whose seal is broken; the
runtime calls it on every program call, and `cached` on every layout read. The layouts
the public methods hand out (``in_degrees()``, ``csr()``, ...) are sealed the same way:
they are the very tensors the layers read.

Writes that move no version counter are not seen: through ``.data`` (an alias with a
counter of its own), ``.numpy()``, DLPack, a tensor ``set_`` on the same storage, or a
kernel of one's own. Torch offers nothing cheap to detect them, and comparing the edges
on every call would be a pass over them per call; the README says so where it describes
the seal.
"""
from __future__ import annotations

import pickle
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from .convert import (adj_t_edges, check_bipartite_adj_t, check_unit_values, index_tensors, is_pyg_edge_index,
                      is_sparse_adjacency, networkx_edges, scipy_edges, scipy_weights)
from .index_cache import cached_graph, functorch_interpreter
from .validate import as_index_tensor, check_ids, choose_index_dtype, edge_counts, infer_count


class CSR(NamedTuple):
    """Edges grouped by one endpoint: row v owns positions ``rowptr[v]:rowptr[v+1]``.

    ``col`` holds the other endpoint and ``eid`` the original edge id of each position.
    """
    rowptr: torch.Tensor
    col: torch.Tensor
    eid: torch.Tensor


# A lazy graph (`Graph._lazily`) of up to this many edges keeps the endpoint arrays it
# builds for a layout: at most 1 MB, where a graph-classification step's self-looped batch
# (GCN, GAT) built them for its CSR and again, kept, for a COO kernel's ``src``: seven
# torch calls per new graph, each 10-20 us of host time on the H200's host.
KEPT_ENDPOINTS_EDGES = 1 << 16


class _LazyEdges(NamedTuple):
    """How a lazy graph's endpoints are made (`Graph._lazily`): the ``src``/``dst`` it was
    derived from, the ``keep`` mask over them (None: all), how many edges that keeps, and
    the number of ``i -> i`` loops appended."""
    src: torch.Tensor
    dst: torch.Tensor
    keep: torch.Tensor | None
    kept: int
    loops: int


def _recorded_type_counts(data: Any, types: dict[str, Any]) -> dict[str, int]:
    """``num_edge_types`` / ``num_node_types`` of a ``HeteroData.to_homogeneous()``
    result: the lengths of the type names it records (``_edge_type_names``,
    ``_node_type_names``), where the matching type tensor is present. Counted from the
    ids instead, a relation (or node type) numbered last that has no edges (vertices)
    was lost: ``RGCNConv(num_relations=len(metadata[1]))`` refused the graph, advising
    ``num_edge_types=``, which from_data has no argument for."""
    counts = {}
    for key, names, tensor in (("num_edge_types", "_edge_type_names", "edge_type"),
                               ("num_node_types", "_node_type_names", "node_type")):
        recorded = getattr(data, names, None)
        if types[tensor] is not None and isinstance(recorded, (list, tuple)) and recorded:
            counts[key] = len(recorded)
    return counts


class Graph:
    """A directed graph on vertices ``0..num_nodes-1``, optionally with edge/vertex types.

    A *bipartite* graph (``num_src_nodes`` given, or `Graph.bipartite`) has two vertex
    sets: edges go from a source ``0..num_src_nodes-1`` to a destination
    ``0..num_nodes-1``, so ``num_nodes`` always counts the vertices that aggregate
    (``num_dst_nodes``). This is PyG's ``size=(num_src, num_dst)`` layer shape, the one
    mini-batch training runs on: a sampled block's destinations are a few seed vertices,
    its sources their much larger neighbourhood. Keeping ``num_nodes`` the destination
    count means every row an aggregation writes, the CSR (grouped by destination, one row
    per destination) and in-degrees need no change; only what is indexed by source --
    the reverse CSR, out-degrees, source-side feature tables -- has ``num_src_nodes``
    rows. A graph built without ``num_src_nodes`` has one vertex set and
    ``num_src_nodes == num_nodes``. Node types and undirected copies need one vertex set
    and are refused on a bipartite graph; `add_self_loops` there joins source i to
    destination i, as PyG's attention layers do.

    `src`, `dst` (and `edge_type`, `node_type`) may be tensors, numpy arrays or sequences
    of integers. Contiguous int64 tensors are kept without copying: do not modify them
    afterwards. Anything else (int32, a strided view, an inference tensor) is copied to
    contiguous int64.
    Non-tensor inputs go to the device of the tensor inputs (CPU if there are none).
    """

    # a PyG ``EdgeIndex`` this graph's edges were read from (weakly: the index cache lets
    # a graph go with its input); a write through it moves its own version counter only
    _wrapper: weakref.ref | None = None
    _wrapper_version: int = 0      # its version counter when the graph was built
    # its edges are read from another graph's tensors (`_lazy_graph`), sealed with it
    _reads_recipe: bool = False
    # made by a layer call from a raw index tensor (`coerce`) and no backward pass has run
    # on it yet: a small such graph runs on the reference executor (runtime/first_pass.py)
    first_pass: bool = False

    def __init__(self, src: Any, dst: Any, num_nodes: int | None = None, *,
                 edge_type: Any = None, num_edge_types: int | None = None,
                 node_type: Any = None, num_node_types: int | None = None,
                 num_src_nodes: int | None = None) -> None:
        if (edge_type is None and node_type is None and isinstance(src, torch.Tensor)
                and isinstance(dst, torch.Tensor) and src.device == dst.device):
            device = src.device       # an edge_index's rows (every new graph of a loader): nothing to compare
        else:
            devices = {name: t.device for name, t in
                       (("src", src), ("dst", dst), ("edge_type", edge_type), ("node_type", node_type))
                       if isinstance(t, torch.Tensor)}
            if len(set(devices.values())) > 1:
                where = ", ".join(f"{name} is on {dev}" for name, dev in devices.items())
                raise ValueError(f"graph tensors must share one device, but {where}")
            device = next(iter(devices.values()), torch.device("cpu"))
        src = as_index_tensor("src", src, device)
        dst = as_index_tensor("dst", dst, device)
        if src.numel() != dst.numel():
            raise ValueError(f"src and dst must have the same length, got {src.numel()} and {dst.numel()}")
        if num_src_nodes is not None and node_type is not None:
            raise ValueError("node_type needs one vertex set; a bipartite graph (num_src_nodes given) has two")
        n = edge_counts(src, dst, num_nodes, num_src_nodes)

        etype, num_etypes = _types("edge", edge_type, num_edge_types, src.numel(), "edges", device)
        ntype, num_ntypes = _types("node", node_type, num_node_types, n, "nodes", device)
        self._init(src, dst, n, etype, num_etypes, ntype, num_ntypes, num_src_nodes)

    def _init(self, src, dst, num_nodes, edge_type, num_edge_types, node_type, num_node_types,
              num_src_nodes=None) -> None:
        # (`_sealable` called by name, not over a generator: a graph is made per layer call
        # of a loader's step, and the generator was a Python call per tensor more)
        src, dst = _sealable(src), _sealable(dst)
        if edge_type is not None:
            edge_type = _sealable(edge_type)
        if node_type is not None:
            node_type = _sealable(node_type)
        self._edges: tuple[torch.Tensor, torch.Tensor] | None = (src, dst)
        self._lazy: _LazyEdges | None = None
        self._num_nodes = num_nodes
        self._num_src = num_src_nodes   # None: sources and destinations are one vertex set
        self._edge_type, self._num_edge_types = edge_type, num_edge_types
        self._node_type, self._num_node_types = node_type, num_node_types
        self._cache: dict[str, Any] = {}
        self._builders: dict[str, Callable[[Graph], Any]] = {}   # `build_later`'s recipes
        self._dst_grouped = False   # edges already in destination order: the CSR needs no sort
        # an `in_edges_block`'s chosen rows: destination i is vertex rows[i], not source i
        # (and source i in its `reverse`)
        self._dst_rows: torch.Tensor | None = None
        self._src_rows: torch.Tensor | None = None
        if src is not None:     # a lazy graph (`_lazy_graph`) is sealed once it has its recipe
            self._seal()

    def _derive(self, src: torch.Tensor, dst: torch.Tensor, edge_type: torch.Tensor | None,
                num_edge_types: int | None = None) -> Graph:
        """A graph from already-valid tensors, skipping validation; keeps vertex types.
        Its caller read them from this graph, so this graph must be unchanged (`_seal`)."""
        self.check_unchanged()
        g = Graph.__new__(Graph)
        g._init(src, dst, self._num_nodes, edge_type,
                self._num_edge_types if num_edge_types is None else num_edge_types,
                self._node_type, self._num_node_types, self._num_src)
        g._dst_rows, g._src_rows = self._dst_rows, self._src_rows
        g._wrapper, g._wrapper_version = self._wrapper, self._wrapper_version
        g.first_pass = self.first_pass
        return g

    def _lazily(self, keep: torch.Tensor | None, loops: int) -> Graph:
        """This untyped graph's edges where `keep` holds (all if None), then `loops` edges
        ``i -> i`` for i < loops -- with the int64 endpoint arrays only built when
        something reads `src` or `dst`.

        Layers that run on a self-looped copy (GCN, GAT: `remove_self_loops` then
        `add_self_loops`) never read those arrays, only the CSR layouts built once from
        transient endpoints (`_endpoints`); for a 62M-edge graph the copy's arrays were
        1 GB resident for the whole training run. A lazy graph refers to the endpoint
        tensors it was derived from (and the mask), which its source graph holds anyway.
        A small one keeps the arrays from their first build (`KEPT_ENDPOINTS_EDGES`).
        """
        self.check_unchanged()      # the recipe reads this graph's tensors: they must be its edges
        own = self._lazy
        if own is not None and own.loops == 0 and (keep is None or own.keep is None):   # compose the recipes
            kept = own.kept if keep is None else int(keep.sum())
            return self._lazy_graph(_LazyEdges(own.src, own.dst, keep if own.keep is None else own.keep, kept, loops))
        kept = self.num_edges if keep is None else int(keep.sum())
        return self._lazy_graph(_LazyEdges(self._src, self._dst, keep, kept, loops))

    def _lazy_graph(self, recipe: _LazyEdges) -> Graph:
        g = Graph.__new__(Graph)
        g._init(None, None, self._num_nodes, None, None, self._node_type, self._num_node_types, self._num_src)
        g._edges, g._lazy, g._dst_rows, g._src_rows = None, recipe, self._dst_rows, self._src_rows
        g._reads_recipe = True
        g._wrapper = self._wrapper
        g._wrapper_version, g.first_pass = self._wrapper_version, self.first_pass
        g._seal()
        return g

    def _endpoints(self, keep: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(src, dst) int64 in edge-id order; a lazy graph (`_lazily`) builds them, and
        keeps them only when `keep` (a layout builder uses them once and lets them go) or
        when it has at most `KEPT_ENDPOINTS_EDGES` edges (outside a ``torch.func`` transform)."""
        if self._edges is not None:
            return self._edges
        self.check_unchanged()     # built from the recipe's tensors: they must still hold its edges
        src, dst, keep_mask, kept, count = self._lazy
        with torch.inference_mode(False):       # kept arrays are sealed (`_sealable`)
            if keep_mask is not None:
                # the kept edges' ids at the count read when the mask was taken (`_lazily`): a
                # boolean-mask index reads its count back again, a sync per array on a GPU
                ids = torch.nonzero_static(keep_mask, size=kept).squeeze(1)
                src, dst = src.index_select(0, ids), dst.index_select(0, ids)
            if count:
                loops = torch.arange(count, device=src.device)
                src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
        # (not kept unasked inside a torch.func transform: arrays made there are its wrappers)
        if keep or (kept + count <= KEPT_ENDPOINTS_EDGES and functorch_interpreter() is None):
            recipe, self._edges, self._lazy = self._sealed, (src, dst), None
            # the arrays it reads from now on, and still those it was derived from: its
            # layouts may be theirs, so an edit there refuses it on every backend alike
            self._seal()
            self._sealed += recipe
        return src, dst

    @classmethod
    def _of_valid_ids(cls, src: torch.Tensor, dst: torch.Tensor, num_nodes: int,
                      num_src_nodes: int | None = None) -> Graph:
        """A graph from contiguous int64 ids that its caller built in range itself (a
        sampler's local ids), without `__init__`'s checks: each reads the ids' minimum
        or maximum back to the host, a sync per check on a GPU, per sampled block."""
        g = cls.__new__(cls)
        g._init(src, dst, num_nodes, None, None, None, None, num_src_nodes)
        return g

    @classmethod
    def bipartite(cls, src: Any, dst: Any, num_src_nodes: int | None = None, num_dst_nodes: int | None = None,
                  **kw: Any) -> Graph:
        """Edges ``src[i] -> dst[i]`` from sources ``0..num_src_nodes-1`` to the separate
        destinations ``0..num_dst_nodes-1`` (each count defaults to its largest id + 1)."""
        if num_src_nodes is None:
            num_src_nodes = infer_count(None, "num_src_nodes", as_index_tensor("src", src))
        if num_dst_nodes is not None:   # checked here to name it as given (the constructor calls it num_nodes)
            check_ids("dst", as_index_tensor("dst", dst), infer_count(num_dst_nodes, "num_dst_nodes"), "num_dst_nodes")
        return cls(src, dst, num_dst_nodes, num_src_nodes=num_src_nodes, **kw)

    # --- construction from other formats -------------------------------------------------
    @classmethod
    def from_edge_index(cls, edge_index: Any, num_nodes: int | None = None, **kw: Any) -> Graph:
        """From a PyG-style ``[2, E]`` array: row 0 = sources, row 1 = targets. A PyG
        ``EdgeIndex`` brings its ``sparse_size`` (isolated trailing vertices count), as
        `coerce` reads it: two different sizes make a bipartite graph (sources,
        destinations), one size set counts the vertices."""
        if is_pyg_edge_index(edge_index):
            return cls._from_pyg_edge_index(edge_index, num_nodes, given=f"num_nodes={num_nodes}", **kw)
        if not isinstance(edge_index, torch.Tensor) and not isinstance(edge_index, np.ndarray):
            edge_index = np.asarray(edge_index)
            if edge_index.size == 0 and edge_index.dtype.kind == "f":
                edge_index = edge_index.astype(np.int64)    # `[[], []]` parses as float64
        shape = tuple(edge_index.shape)
        if len(shape) != 2 or shape[0] != 2:
            raise ValueError(f"edge_index must have shape [2, E], got {list(shape)}")
        # a tensor's rows in one call (two ``select``s were two: every new graph comes here)
        src, dst = edge_index.unbind(0) if isinstance(edge_index, torch.Tensor) else edge_index
        return cls(src, dst, num_nodes, **kw)

    @classmethod
    def from_data(cls, data: Any) -> Graph:
        """From a PyG ``Data``: its ``edge_index``, ``num_nodes`` and, when present,
        ``edge_type`` and ``node_type`` (what ``HeteroData.to_homogeneous()`` produces).

        Read by attribute name, so torch_geometric is not imported here. A ``HeteroData``
        is refused rather than flattened silently: its type numbering is the caller's choice.
        The type counts are the ones ``to_homogeneous()`` records (`_recorded_type_counts`).
        """
        if getattr(data, "edge_index", None) is None:
            hint = (" (a HeteroData: call data.to_homogeneous() first)" if hasattr(data, "to_homogeneous")
                    else "")
            raise TypeError(f"Graph.from_data needs a PyG Data with an edge_index; got "
                            f"{type(data).__name__} without one{hint}")
        edge_index, num_nodes = data.edge_index, getattr(data, "num_nodes", None)
        types = {"edge_type": getattr(data, "edge_type", None), "node_type": getattr(data, "node_type", None)}
        types.update(_recorded_type_counts(data, types))
        if is_pyg_edge_index(edge_index):
            rows, cols = edge_index.sparse_size()
            if rows is not None and cols is not None and rows != cols:
                # a bipartite EdgeIndex: PyG's Data.num_nodes counts one side of it, which
                # the one-set check below would refuse; the EdgeIndex gives both counts
                num_nodes = None
            return cls._from_pyg_edge_index(edge_index, num_nodes, given=f"the Data's num_nodes is {num_nodes}",
                                            **types)
        return cls.from_edge_index(edge_index, num_nodes, **types)

    @classmethod
    def from_adj_t(cls, adj_t: Any, num_nodes: int | None = None, num_src_nodes: int | None = None) -> Graph:
        """From PyG's transposed adjacency ``adj_t`` [N, N] -- a torch sparse COO, CSR or
        CSC tensor, or a torch_sparse ``SparseTensor`` -- as PyG's layers read it: a stored
        entry at (row i, column j) is the edge j -> i (row = target, column = source).
        With ``num_src_nodes`` the graph is bipartite and ``adj_t`` is
        [num_nodes, num_src_nodes] (destinations x sources, PyG's bipartite ``adj_t``;
        a CSC adjacency's ``.t()`` is such a CSR tensor).

        One edge per stored entry, in storage order; every stored value must be 1 (PyG
        would use other values as edge weights). A row-major input (CSR, SparseTensor,
        coalesced COO) is already grouped by destination, so `csr` is built without a sort.
        """
        src, dst, (rows, cols), grouped, value = adj_t_edges(adj_t)
        if num_src_nodes is None:
            if rows != cols:
                raise ValueError(f"a sparse adj_t must be square (row = target, column = source), got shape "
                                 f"{[rows, cols]}; a bipartite adj_t [num_dst, num_src] needs num_src_nodes "
                                 "(a layer's (x_src, x_dst) input)")
            if num_nodes is not None and num_nodes != rows:
                raise ValueError(f"num_nodes={num_nodes} given but the adjacency is {rows} x {rows}")
            graph = cls(src, dst, rows)
        else:
            check_bipartite_adj_t(adj_t, rows if num_nodes is None else num_nodes, num_src_nodes)
            graph = cls(src, dst, rows, num_src_nodes=cols)
        check_unit_values(value, isinstance(adj_t, torch.Tensor) and adj_t.requires_grad)
        graph._trust_dst_order(grouped)
        return graph

    @classmethod
    def from_scipy(cls, matrix: Any) -> Graph:
        """From a square scipy sparse matrix/array: row = source, column = target.

        One edge per stored entry, in ``matrix.tocoo()`` order (duplicates kept).
        """
        src, dst, n = scipy_edges(matrix)
        return cls(src, dst, n)

    @classmethod
    def from_networkx(cls, g: Any) -> Graph:
        """From a networkx graph; vertices are renumbered in ``g.nodes`` iteration order.

        Undirected graphs give both directions of every edge; multigraphs keep multi-edges.
        """
        src, dst, n = networkx_edges(g)
        return cls(src, dst, n)

    @classmethod
    def coerce(cls, obj: Any, num_nodes: int | None = None, num_src_nodes: int | None = None) -> Graph:
        """Whatever a layer's ``forward(x, graph)`` was given, as a `Graph`.

        A `Graph` passes through; a ``[2, E]`` tensor (PyG's ``EdgeIndex`` included) or
        array is an edge_index; a torch sparse tensor or torch_sparse ``SparseTensor`` is
        PyG's ``adj_t`` (`from_adj_t`: row = target); scipy sparse matrices (row =
        source) and networkx graphs are converted. The graph made for a torch input is
        remembered while that tensor is unchanged (`index_cache`), so passing the same
        ``edge_index`` every step reuses one graph and its cached layouts. With
        ``num_src_nodes`` an edge_index becomes a bipartite graph (PyG's ``size=``).
        """
        if type(obj) is torch.Tensor and obj.layout is torch.strided:
            # a plain edge_index, every layer call's input: the general path below asks
            # `index_tensors` (three Python calls) for the [obj] it gives such a tensor
            key = num_nodes if num_src_nodes is None else (num_nodes, num_src_nodes)
            return cached_graph(obj, [obj], key,
                                lambda parts: cls._from_torch(parts[0], num_nodes, num_src_nodes)._begin_first_pass())
        if isinstance(obj, Graph):
            if num_nodes is not None and num_nodes != obj.num_nodes:
                raise ValueError(f"num_nodes={num_nodes} given but the graph has {obj.num_nodes} nodes")
            if num_src_nodes is not None and num_src_nodes != obj.num_src_nodes:
                raise ValueError(f"num_src_nodes={num_src_nodes} given but the graph has "
                                 f"{obj.num_src_nodes} source nodes")
            return obj
        if num_src_nodes is not None:
            if not isinstance(obj, torch.Tensor) and not is_sparse_adjacency(obj):
                raise ValueError(f"a bipartite graph (num_src_nodes={num_src_nodes}) is made from a [2, E] "
                                 f"edge_index, a sparse adj_t or a Graph, got {type(obj).__name__}")
            # (never a held copy here: only a plain dense tensor's are held, `index_cache._shape_key`)
            return _cached_index_graph(cls, obj, num_nodes, num_src_nodes)
        if isinstance(obj, torch.Tensor) or is_sparse_adjacency(obj):
            return _cached_index_graph(cls, obj, num_nodes)
        if isinstance(obj, np.ndarray):
            return cls.from_edge_index(obj, num_nodes)
        import scipy.sparse as sp
        if sp.issparse(obj):
            if scipy_weights(obj) is not None:
                raise ValueError("the scipy sparse matrix holds values other than 1, which would be edge "
                                 "weights; this graph input reads only its pattern: pass the layout as "
                                 "Graph.from_scipy(matrix) to drop them, or the weights as edge_weight to a "
                                 "layer that takes them (GCNConv, GraphConv, SGConv, TAGConv, APPNP, "
                                 "ChebConv take the matrix itself)")
            graph = cls.from_scipy(obj)
        elif type(obj).__module__.startswith("networkx"):
            graph = cls.from_networkx(obj)
        else:
            raise TypeError(f"cannot make a Graph from {type(obj).__name__}; pass a Graph, a [2, E] "
                            "edge_index, a scipy sparse matrix or a networkx graph")
        return cls.coerce(graph, num_nodes)

    def _begin_first_pass(self) -> Graph:
        """Mark this graph, just made for a layer's raw index input, as on its first pass."""
        self.first_pass = True
        return self

    @classmethod
    def _from_torch(cls, obj: Any, num_nodes: int | None, num_src_nodes: int | None = None) -> Graph:
        """`coerce` for a torch-side input, uncached. The graph shares the input's
        memory but must not hold the input object (a view would): the index cache lets
        a graph go when its input is freed. A PyG ``EdgeIndex`` sorted by column is
        already grouped by destination, so its CSR needs no sort."""
        if is_sparse_adjacency(obj):
            return cls.from_adj_t(obj, num_nodes, num_src_nodes)
        if not is_pyg_edge_index(obj):
            bipartite = {} if num_src_nodes is None else {"num_src_nodes": num_src_nodes}
            return cls.from_edge_index(obj.detach(), num_nodes, **bipartite)
        return cls._from_pyg_edge_index(obj, num_nodes, num_src_nodes)

    @classmethod
    def _from_pyg_edge_index(cls, obj: Any, num_nodes: int | None, num_src_nodes: int | None = None,
                             given: str | None = None, **kw: Any) -> Graph:
        """From a PyG ``EdgeIndex``: its ``sparse_size`` checked against the vertex counts
        given and counted where none is (isolated trailing vertices; two different sizes
        make a bipartite graph, as PyG's layers read them); ``given``: where ``num_nodes``
        came from, for the error (a layer's node features by default); ``kw`` (edge and
        node types) as `from_edge_index` takes them."""
        bipartite = {} if num_src_nodes is None else {"num_src_nodes": num_src_nodes}
        rows, cols = obj.sparse_size()
        if num_src_nodes is not None and (rows not in (None, num_src_nodes)
                                          or (num_nodes is not None and cols not in (None, num_nodes))):
            raise ValueError(f"the EdgeIndex has sparse_size=({rows}, {cols}) (sources, destinations) but the "
                             f"bipartite graph has {num_src_nodes} source and {num_nodes} destination nodes")
        if num_src_nodes is None and num_nodes is not None and (rows not in (None, num_nodes)
                                                                or cols not in (None, num_nodes)):
            # PyG refuses it too; running on num_nodes would drop the declared vertices
            given = given or f"the node features have {num_nodes} rows"
            raise ValueError(f"the EdgeIndex has sparse_size=({rows}, {cols}) but {given} (one vertex set: "
                             f"both sizes must be {num_nodes} or None)")
        if num_nodes is None and num_src_nodes is None and (rows, cols) != (None, None):
            if rows is not None and cols is not None and rows != cols:
                bipartite = {"num_src_nodes": rows}       # sources x destinations
                num_nodes = cols
            else:
                num_nodes = rows if rows is not None else cols    # isolated trailing vertices count
        graph = cls.from_edge_index(obj.as_tensor(), num_nodes, **bipartite, **kw)
        graph._trust_dst_order(obj.is_sorted_by_col)
        graph._wrapper, graph._wrapper_version = weakref.ref(obj), obj._version
        return graph

    def _trust_dst_order(self, claimed: bool) -> None:
        """Let `csr` skip its sort when the input says its edges come grouped by
        destination. The claim (a coalesced flag, an EdgeIndex sort order) is the
        caller's word, unchecked by its library, so one pass confirms it first."""
        dst = self._dst
        self._dst_grouped = bool(claimed) and bool((dst[1:] >= dst[:-1]).all())

    # --- basic attributes ----------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @property
    def num_src_nodes(self) -> int:
        """How many vertices edges start from (``num_nodes`` unless the graph is bipartite)."""
        return self._num_nodes if self._num_src is None else self._num_src

    @property
    def num_dst_nodes(self) -> int:
        """How many vertices edges end at: ``num_nodes``, under PyG's name."""
        return self._num_nodes

    @property
    def is_bipartite(self) -> bool:
        """Whether sources and destinations are separate vertex sets (see the class doc)."""
        return self._num_src is not None

    @property
    def is_block(self) -> bool:
        """Whether this is an `in_edges_block` (or a graph derived from one): its
        destination i (source i, once reversed) stands for vertex ``rows[i]``, which its
        ``src``/``dst`` arrays alone do not say."""
        return self._dst_rows is not None or self._src_rows is not None

    @property
    def reads_edge_index(self) -> bool:
        """Whether this graph's edges are read from a PyG ``EdgeIndex`` that is still
        alive: a write through it moves its own version counter only, not its tensor's,
        so only this graph's `check_unchanged` sees it."""
        return self._wrapper is not None and self._wrapper() is not None

    @property
    def reads_other_edges(self) -> bool:
        """Whether this graph's edges are read from another graph's tensors (an untyped
        graph's `add_self_loops` or `remove_self_loops`): an in-place edit of those refuses
        it (`check_unchanged`), though its own ``src``/``dst`` arrays, once built, do not
        change."""
        return self._reads_recipe

    def _one_vertex_set(self, what: str) -> None:
        if self.is_bipartite:
            raise ValueError(f"{what} needs one vertex set, but this graph is bipartite "
                             f"({self.num_src_nodes} sources, {self.num_dst_nodes} destinations)")

    @property
    def num_edges(self) -> int:
        if self._edges is None:
            return self._lazy.kept + self._lazy.loops
        return self._edges[0].numel()

    @property
    def device(self) -> torch.device:
        return (self._lazy.src if self._edges is None else self._edges[0]).device

    def _sealed_tensors(self) -> tuple[tuple[str, torch.Tensor, int], ...]:
        """(name, tensor, its version now) for each tensor this graph's edges are read
        from -- a caller's own ``edge_index`` rows where they were kept without a copy
        (`Graph`'s doc), a lazy graph's recipe's, and the edge and vertex types -- without
        building a lazy graph's endpoints. (An `in_edges_block`'s ``rows`` only mark it:
        nothing is computed from them.) Inference tensors have no version counter and are
        left out: a graph copies those it is built from (`_sealable`), so only a graph
        unpickled in inference mode holds any. (Built by a loop into a tuple: a graph is
        made per layer call of a loader's step, and the comprehensions and generator
        this was were a Python call per step of theirs.)"""
        src, dst = self._edges if self._edges is not None else self._lazy[:2]
        base = src._base
        # the rows of one [2, E] edge_index share its version counter: name the one edited
        if base is not None and base is dst._base:
            named: tuple = (("edge_index", base),)
        else:
            named = (("src", src), ("dst", dst))
        if self._edges is None:
            named += (("self-loop mask", self._lazy.keep),)
        named += (("edge_type", self._edge_type), ("node_type", self._node_type))
        sealed: tuple = ()
        for name, t in named:
            if t is not None and not t.is_inference():
                sealed += ((name, t, t._version),)
        return sealed

    def _seal(self) -> None:
        """Record the version counters of the tensors the graph is read from (see the
        module doc), and of the layouts it has handed out (`_seal_layout`);
        `check_unchanged` compares them. Called when a graph is built."""
        self._sealed = self._sealed_tensors()
        layouts: tuple = ()
        cache = self._cache
        if cache:       # (a graph just built has handed out nothing)
            for key in _HANDED_OUT:
                if key in cache:
                    layouts += _layout_versions(key, cache[key])
        self._sealed_layouts = layouts

    def _seal_layout(self, key: str) -> None:
        """Seal a layout the public methods hand out (``in_degrees()``, ``csr()``, ...):
        it is the very tensor every layer reads, so a caller's in-place write to it
        (``deg[deg == 0] = 1``) silently changed their results (a GCN without self loops
        1.04 off PyG's)."""
        self._sealed_layouts += _layout_versions(key, self._cache[key])

    def check_unchanged(self) -> None:
        """Refuse this graph if a tensor it reads was written in place since it was built
        (see the module doc): its cached layouts (CSR, degrees, norms, launch plans) would
        describe other edges than its ``src``/``dst``, and ids written there were never
        range-checked. Cheap: one version read per tensor, inline on every program call.
        A PyG ``EdgeIndex`` the edges were read from counts too, while it lives."""
        for name, tensor, version in self._sealed:
            if tensor._version != version:
                raise _edited(f"{name} tensor", tensor, version, "the Graph was built", _REBUILD)
        if self._wrapper is not None:
            wrapper = self._wrapper()
            if wrapper is not None and wrapper._version != self._wrapper_version:
                raise _edited("edge_index (a PyG EdgeIndex)", wrapper, self._wrapper_version, "the Graph was built",
                              _REBUILD)
        for key, tensor, version in self._sealed_layouts:
            if tensor._version != version:
                raise _edited(f"cached {key} layout", tensor, version, "it was built",
                              _CLONE.format(key=_HANDED_OUT[key]))

    def _reseal(self) -> None:
        """Accept the graph's current tensors as its edges and layouts: only for a caller
        that rewrote them *and every cached layout* in place together (a captured step's
        static batch, `training.captured_step`), so the two still agree."""
        self._seal()
        if self._wrapper is not None and (wrapper := self._wrapper()) is not None:
            self._wrapper_version = wrapper._version

    # `src`/`dst` read ``_edges`` first, inline: every gather and scatter of a program run
    # reads one (backend contexts' ``index``), and going through `_endpoints` was two more
    # Python calls per read for the arrays a graph almost always holds already
    @property
    def src(self) -> torch.Tensor:
        """Source of each edge, int64, in edge-id order."""
        edges = self._edges
        return (edges if edges is not None else self._endpoints(keep=True))[0]

    @property
    def dst(self) -> torch.Tensor:
        """Target of each edge, int64, in edge-id order."""
        edges = self._edges
        return (edges if edges is not None else self._endpoints(keep=True))[1]

    _src, _dst = src, dst       # the internal names of the same properties

    @property
    def edge_type(self) -> torch.Tensor | None:
        return self._edge_type

    @property
    def num_edge_types(self) -> int | None:
        return self._num_edge_types

    @property
    def node_type(self) -> torch.Tensor | None:
        return self._node_type

    @property
    def num_node_types(self) -> int | None:
        return self._num_node_types

    @property
    def edge_index(self) -> torch.Tensor:
        """``[2, E]`` int64 (PyG layout)."""
        return self.cached("edge_index", lambda g: torch.stack([g.src, g.dst]))

    @property
    def index_dtype(self) -> torch.dtype:
        """The narrowest safe dtype for indices into this graph (int32 when it fits)."""
        return choose_index_dtype(max(self._num_nodes, self.num_src_nodes), self.num_edges)

    # --- derived layouts (lazy, cached, on the graph's device) ---------------------------
    def cached(self, key: str, fn: Callable[[Graph], Any]) -> Any:
        """``fn(self)``, computed on first use per graph and key, then memoised.

        Keys are shared by every user of the graph, so pick descriptive ones
        (e.g. ``"gcn_norm"``); two users with the same key must compute the same thing.
        A value built inside a ``torch.func`` transform is returned but not kept: its
        tensors are the transform's wrappers, unusable after it (`index_cache`).
        Every value is built from the graph alone, so outside inference mode: one built
        as an inference tensor (a GCN's norms, during an evaluation under
        ``torch.inference_mode()``) could not be saved for backward by a later training
        step on the same graph; and the layouts the graph hands out must be sealable.
        """
        self.check_unchanged()
        if key not in self._cache:
            if functorch_interpreter() is not None:
                return self._builders.get(key, fn)(self)
            with torch.inference_mode(False):
                self._cache[key] = self._builders.pop(key, fn)(self)
            if key in _HANDED_OUT:
                self._seal_layout(key)
        return self._cache[key]

    def cached_tensors(self) -> list[torch.Tensor]:
        """Every tensor the graph keeps memoised (`cached`: its layouts, degrees, norms),
        built so far: what a program may hand back as it is (runtime/compiled.py's
        `_run_forward` copies such an output, which the caller may write in place)."""
        held = []
        for value in self._cache.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, torch.Tensor):
                    held.append(item)
        return held

    def __getstate__(self) -> dict[str, Any]:
        """A graph pickled (sent to another process: a loader worker's batch) takes its
        `build_later` recipes built first: they are closures, which cannot travel, and
        the receiver would otherwise build those layouts its own way."""
        self.check_unchanged()       # the receiver would seal edges its layouts do not describe
        while self._builders:      # a recipe may ask for another (segments: the reverse CSR)
            key, build = self._builders.popitem()
            if key not in self._cache:     # a value stored directly since keeps its place
                self._cache[key] = build(self)
        # not a weakref, nor the versions of tensors the receiver gets anew (it seals its own)
        return {key: value for key, value in self.__dict__.items() if key not in _UNPICKLED}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_builders", {})       # pickled before graphs had recipes
        self.__dict__.setdefault("_dst_rows", None)     # pickled before in_edges_block marked its blocks
        self.__dict__.setdefault("_src_rows", None)
        self._seal()

    def build_later(self, key: str, fn: Callable[[Graph], Any]) -> None:
        """Have `cached` build ``key`` with ``fn`` when something first asks for it, in
        place of the asker's own builder (they must compute the same thing).

        For what one party knows how to build best but cannot tell whether anyone will
        read: a mini-batch loader knows how to build a block's reverse CSR without a host
        sync, and a bound on its rows' lengths, but not whether the step will walk the
        block by source (`loader.layouts`). A key already built keeps its value."""
        if key not in self._cache:
            self._builders[key] = fn

    def csr(self) -> CSR:
        """In-edges grouped by destination: ``col`` = sources; stable in edge id per row.
        One row per destination (``num_nodes + 1`` row pointers)."""
        return self.cached("csr", lambda g: CSR(*g.grouped("dst"), g._grouping_order("dst")))

    def reverse_csr(self) -> CSR:
        """Out-edges grouped by source: ``col`` = destinations; stable in edge id per row.
        One row per source (``num_src_nodes + 1`` row pointers)."""
        return self.cached("reverse_csr", lambda g: CSR(*g.grouped("src"), g._grouping_order("src")))

    def grouped(self, by: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rowptr, col)`` of `csr` (``by="dst"``) or `reverse_csr` (``"src"``) without
        the edge ids, for kernels that read no edge-rowed tensor: a layout built here
        never builds its ``eid`` (a full layout already built, prefilled by a loader or
        left by one as a recipe, serves as it is)."""
        full_key = "csr" if by == "dst" else "reverse_csr"
        if full_key in self._cache or full_key in self._builders:
            # a recipe waiting for the full layout (a loader's sync-free reverse CSR,
            # `build_later`) is built and served: building the rows here instead would
            # sort the edges again, and never tell the loader its recipe was wanted
            full = self.cached(full_key, self._builders.get(full_key))     # the recipe, if not built
            return full.rowptr, full.col
        return self.cached(f"{full_key}_rows", lambda g: g._group_rows(by))

    def _group_rows(self, by: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Edges grouped by endpoint ``by``, the other endpoint as ``col``, stably (ids rise
        per row); the sort's permutation is dropped (`_grouping_order` remakes it)."""
        src, dst = self._endpoints(keep=False)
        key, other, rows = (dst, src, self._num_nodes) if by == "dst" else (src, dst, self.num_src_nodes)
        dtype = self.index_dtype
        if by == "dst" and self._dst_grouped:
            col, grouped_key = other, key
        else:
            grouped_key, order = torch.sort(key, stable=True)
            col = other[order]
        return sorted_row_pointers(grouped_key, rows, dtype), col.to(dtype)

    def _grouping_order(self, by: str) -> torch.Tensor:
        """The permutation `_group_rows` sorted the edges by, as ``eid``: after regrouping,
        a position no longer names its edge, so E-typed tensors must be read through it
        (Seastar §6.3.4). Edges already grouped by destination need no sort (the identity);
        otherwise the same stable sort gives the same order as the layout's ``col``."""
        if by == "dst" and self._dst_grouped:
            return torch.arange(self.num_edges, device=self.device, dtype=self.index_dtype)
        src, dst = self._endpoints(keep=False)
        return torch.sort(dst if by == "dst" else src, stable=True).indices.to(self.index_dtype)

    def coo(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(src, dst) in `index_dtype`, edge-id order."""
        return self.cached("coo", lambda g: tuple(t.to(g.index_dtype) for t in g._endpoints(keep=False)))

    def in_degrees(self) -> torch.Tensor:
        """int64 [N]: number of edges into each vertex (multi-edges and loops count)."""
        return self.cached("in_degrees", lambda g: g._degrees("dst"))

    def out_degrees(self) -> torch.Tensor:
        """int64 [num_src_nodes]: number of edges out of each (source) vertex."""
        return self.cached("out_degrees", lambda g: g._degrees("src"))

    def _degrees(self, by: str) -> torch.Tensor:
        """int64 edges per ``by`` endpoint. On the host ``bincount``, cheaper than a sort.
        On a GPU ``bincount`` reads its input's maximum back to the host, a sync for every
        new graph (a graph-classification step builds one per batch), so there: the row
        pointers' differences where the grouping by ``by`` is built, or by destination
        (every CSR kernel walks that grouping anyway); else `scatter_counts`. A small
        graph's backward sums by source in COO and reads only the out-degrees of the
        reverse grouping, whose sort, gather and binary search were built for them on
        every new graph. A graph on its first pass may run on torch scatters, which walk no
        grouping (runtime/first_pass.py): until a grouping by ``by`` is built, its
        degrees are `scatter_counts` too, not a sort."""
        if self.device.type != "cpu" and ((by == "dst" and not self.first_pass) or any(
                key in self._cache for key in (("csr", "csr_rows") if by == "dst" else ("reverse_csr",
                                                                                       "reverse_csr_rows")))):
            return self.grouped(by)[0].diff().to(torch.int64)
        src, dst = self._endpoints(keep=False)
        count = torch.bincount if self.device.type == "cpu" else scatter_counts
        return count(dst, minlength=self._num_nodes) if by == "dst" else count(src, minlength=self.num_src_nodes)

    def degree_order(self) -> torch.Tensor:
        """Vertex ids by descending in-degree, ties by ascending id (Seastar §6.3.3).

        Scheduling the heaviest rows first keeps a long tail of hub vertices from landing
        on the last, otherwise idle, workers.
        """
        return self.cached("degree_order", lambda g: torch.sort(
            g.in_degrees(), descending=True, stable=True).indices)

    # --- transformations (each returns a new graph) -------------------------------------
    def to(self, device: torch.device | str, *, non_blocking: bool = False, copy: bool = False) -> Graph:
        """This graph on `device` (itself if already there, unless ``copy``: then a graph
        with tensors of its own there, as ``Tensor.to(copy=True)``); caches are rebuilt
        lazily. ``non_blocking`` as for ``Tensor.to``."""
        device = torch.device(device)
        if device == self.device and not copy:
            return self
        return self._copied(lambda t: t.to(device, non_blocking=non_blocking, copy=copy))

    def clone(self) -> Graph:
        """This graph with index tensors of its own (caches rebuilt lazily): an in-place
        edit of the tensors it was built from no longer reaches it. What a layer with
        PyG's ``cached=True`` keeps, as PyG keeps its own normalised copy."""
        return self._copied(torch.Tensor.clone)

    def _copied(self, copy: Callable[[torch.Tensor], torch.Tensor]) -> Graph:
        self.check_unchanged()

        def each(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else copy(t)
        g = Graph.__new__(Graph)
        g._init(each(self._src), each(self._dst), self._num_nodes, each(self._edge_type),
                self._num_edge_types, each(self._node_type), self._num_node_types, self._num_src)
        g._dst_rows, g._src_rows = each(self._dst_rows), each(self._src_rows)
        return g

    def add_self_loops(self, loop_type: int | None = None) -> Graph:
        """Append one ``v -> v`` edge per vertex after the existing edges (ids E..E+N-1).

        Existing loops are kept (use `remove_self_loops` first for exactly one per
        vertex). In a typed graph the loops get `loop_type`, by default a new relation
        ``num_edge_types`` -- a self connection is usually weighted apart (R-GCN's W_0).
        On a bipartite graph, as PyG's attention layers do there, source i gets an edge to
        destination i for every i below both vertex counts.
        """
        if self._dst_rows is not None or self._src_rows is not None:
            side = "destination" if self._dst_rows is not None else "source (of its reverse)"
            raise ValueError(f"add_self_loops on a graph from in_edges_block: its {side} i is vertex rows[i], "
                             "not vertex i, so a loop i -> i would join the wrong vertices. Add the loops to the "
                             "whole graph first (in_edges_block(graph.add_self_loops(), rows)) and pass "
                             "add_self_loops=False to the layer")
        count = min(self._num_nodes, self.num_src_nodes)
        if self._edge_type is None:
            if loop_type is not None:
                raise ValueError("loop_type given but the graph has no edge types")
            return self._lazily(None, count)
        loops = torch.arange(count, device=self.device)
        num_types = self._num_edge_types
        if loop_type is None:
            loop_type, num_types = num_types, num_types + 1
        elif not 0 <= loop_type < num_types:
            raise ValueError(f"loop_type={loop_type} is not a valid edge type (num_edge_types={num_types})")
        types = torch.cat([self._edge_type, torch.full_like(loops, loop_type)])
        return self._derive(torch.cat([self._src, loops]), torch.cat([self._dst, loops]), types, num_types)

    def remove_self_loops(self) -> Graph:
        """Drop every ``v -> v`` edge; the others keep their relative order. In a block of
        `in_edges_block`, destination i is vertex rows[i]: its loops are the edges from
        that vertex, not from source i."""
        src = self._src if self._src_rows is None else self._src_rows[self._src]
        dst = self._dst if self._dst_rows is None else self._dst_rows[self._dst]
        return self._select(src != dst)

    def _select(self, keep: torch.Tensor) -> Graph:
        if self._edge_type is None:
            return self._lazily(keep, 0)
        etype = self._edge_type[keep]
        return self._derive(self._src[keep], self._dst[keep], etype)

    def reverse(self) -> Graph:
        """Every edge flipped; edge ids (and types) unchanged. A bipartite graph's
        vertex sets swap roles."""
        g = self._derive(self._dst, self._src, self._edge_type)
        g._dst_rows, g._src_rows = self._src_rows, self._dst_rows      # a block's chosen rows change sides
        if self.is_bipartite:
            g._num_nodes, g._num_src = self._num_src, self._num_nodes
        return g

    def to_undirected(self) -> Graph:
        """Each edge in both directions, with duplicate edges removed.

        Duplicates are equal (src, dst) pairs -- (src, dst, type) triples in a typed graph,
        so relations are not merged. The result is sorted by (src, dst[, type]), so edge
        ids do not correspond to this graph's.
        """
        self._one_vertex_set("to_undirected")
        src = torch.cat([self._src, self._dst])
        dst = torch.cat([self._dst, self._src])
        etype = None if self._edge_type is None else torch.cat([self._edge_type, self._edge_type])
        columns = [src, dst] + ([etype] if etype is not None else [])
        unique = _unique_rows(columns, [self._num_nodes, self._num_nodes, self._num_edge_types or 1])
        return self._derive(unique[0], unique[1], unique[2] if etype is not None else None)

    def to_scipy(self) -> Any:
        """``scipy.sparse.coo_array`` of ones, shape [N, N] ([num_src_nodes, num_nodes] if
        bipartite), one entry per edge in id order.

        Duplicate edges stay separate entries (scipy sums them into counts on conversion
        to CSR), so ``Graph.from_scipy(g.to_scipy())`` gives back the same edges and ids.
        The matrix's coordinates are copies: numpy views of a CPU graph's ``src``/``dst``
        (often the caller's ``edge_index``) let a write to ``matrix.row`` rewrite the
        graph's edges without moving a version counter, its cached layouts left stale.
        """
        import scipy.sparse as sp
        src, dst = (t.cpu().numpy().copy() for t in (self._src, self._dst))
        return sp.coo_array((np.ones(len(src), dtype=np.float32), (src, dst)),
                            shape=(self.num_src_nodes, self._num_nodes))

    def __repr__(self) -> str:
        typed = f", num_src_nodes={self._num_src}" if self.is_bipartite else ""
        if self._edge_type is not None:
            typed += f", num_edge_types={self._num_edge_types}"
        if self._node_type is not None:
            typed += f", num_node_types={self._num_node_types}"
        return f"Graph(num_nodes={self._num_nodes}, num_edges={self.num_edges}{typed}, device={self.device})"


_UNPICKLED = ("_wrapper", "_wrapper_version", "_sealed", "_sealed_layouts", "_reads_recipe")


def _sent_by_value(graph: Graph) -> tuple[Callable[[bytes], Graph], tuple[bytes]]:
    """How a graph crosses to another process through ``multiprocessing`` (a
    ``torch.multiprocessing`` queue, a spawned process's arguments): by value, as
    ``pickle`` and ``torch.save`` take it. Left to torch's reducers, its tensors moved to
    shared memory and the receiver read the sender's: an in-place edit in the sender
    (``graph.dst[:3] = 0``) reached the receiver's edges without moving their version
    counters (one per process), so `check_unchanged` could not see it and the layouts the
    receiver had cached described other edges (a SAGEConv there 2.1 off its own first
    output and 2.3 off the edited edges', silently). Loader batches do not come this way:
    they are packed into one buffer the sending worker never writes (`loader.packing`)."""
    return pickle.loads, (pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL),)


ForkingPickler.register(Graph, _sent_by_value)

# the cache keys of the layouts `Graph`'s public methods return (`_seal_layout`), each with
# the public spelling that hands it out, for the error naming it: ``csr().col`` is the
# ``csr_rows`` layout's tensor, and the error said a write to "Graph.csr_rows", no method
_HANDED_OUT = {"csr": "csr()", "reverse_csr": "reverse_csr()", "csr_rows": "csr() (or grouped('dst'))",
               "reverse_csr_rows": "reverse_csr() (or grouped('src'))", "coo": "coo()",
               "in_degrees": "in_degrees()", "out_degrees": "out_degrees()", "degree_order": "degree_order()",
               "edge_index": "edge_index"}
_REBUILD = ("A Graph keeps its index tensors without copying and caches layouts built from them (CSR, degrees, "
            "norms), which describe the old edges. Build a new Graph from the edited tensors (e.g. "
            "Graph.from_edge_index(edge_index)), or edit a clone (edge_index = edge_index.clone()) so the graph "
            "keeps its own")
_CLONE = ("The tensor Graph.{key} returns is the graph's cached layout, which every layer on the graph reads: "
          "clone it before writing to it (e.g. deg = graph.in_degrees().clone()), and build a new Graph")


class GraphModifiedError(RuntimeError):
    """A `Graph` used after one of its index tensors, or a layout it handed out, was
    written in place (see the module doc). ``what`` names the tensor and its versions."""

    def __init__(self, what: str, advice: str) -> None:
        self.what, self.advice = what, advice
        super().__init__(f"a Graph was used after an in-place operation modified it: {what}. {advice}")

    def __reduce__(self) -> tuple:
        return type(self), (self.what, self.advice)


def _edited(name: str, tensor: torch.Tensor, sealed: int, when: str, advice: str) -> GraphModifiedError:
    return GraphModifiedError(f"the graph's {name} (shape {list(tensor.shape)}) is at version {tensor._version}, "
                              f"not {sealed} as when {when}", advice)


def _sealable(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t``, or where it is an inference tensor a normal copy of it. An inference tensor
    has no version counter to seal, yet inside ``torch.inference_mode()`` it can be written
    in place: a graph built there from a user's ``edge_index`` kept its CSR while the edit
    reached the gathers, and a SAGEConv on it was 1.02 (reference) and 0.92 (cpu backend)
    off PyG's, silently. The copy makes the graph's edges its own, as for the inputs
    `Graph` copies anyway (int32, strided)."""
    if t is None or not t.is_inference():
        return t
    with torch.inference_mode(False):
        return t.clone()


def _layout_versions(key: str, value: Any) -> tuple[tuple[str, torch.Tensor, int], ...]:
    """(key, tensor, version) for each tensor of a layout (a tensor or a tuple of them)."""
    tensors = value if isinstance(value, tuple) else (value,)
    return tuple((key, t, t._version) for t in tensors if isinstance(t, torch.Tensor) and not t.is_inference())


def sorted_row_pointers(key: torch.Tensor, rows: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """`row_pointers` of ``key`` sorted ascending, in ``dtype`` (int64 or int32): on a GPU
    by a binary search per row, which reads nothing back (``bincount`` reads its input's
    maximum: a sync per new graph); on the host by `row_pointers`. Made in ``dtype``
    directly: a cast after it was one more op per CSR of every new graph."""
    if key.device.type == "cpu":
        return row_pointers(key, rows, dtype)
    return searched_row_pointers(key, rows, dtype)


def searched_row_pointers(key: torch.Tensor, rows: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """`sorted_row_pointers` by binary search (its GPU way), on any device."""
    return torch.searchsorted(key, torch.arange(rows + 1, dtype=key.dtype, device=key.device),
                              out_int32=dtype == torch.int32)


def row_pointers(key: torch.Tensor, rows: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Row pointers (``rows + 1``, in ``dtype``) of edges grouped by ``key``, their row ids:
    row ``r``'s edges are positions ``rowptr[r]:rowptr[r + 1]`` of the grouping."""
    rowptr = torch.zeros(rows + 1, dtype=dtype, device=key.device)
    torch.cumsum(torch.bincount(key, minlength=rows), 0, dtype=dtype, out=rowptr[1:])
    return rowptr


def scatter_counts(ids: torch.Tensor, minlength: int) -> torch.Tensor:
    """``torch.bincount(ids, minlength=minlength)`` for ids below ``minlength``, by
    ``index_add_``: no sort, and unlike ``bincount`` on a GPU nothing read back.
    (Integers add exactly in any order, and a CUDA ``index_add_`` is deterministic
    where torch is asked to be.)"""
    return torch.zeros(minlength, dtype=torch.int64, device=ids.device).index_add_(0, ids, torch.ones_like(ids))


def _types(kind: str, values: Any, count: int | None, length: int, unit: str,
           device: torch.device) -> tuple[torch.Tensor | None, int | None]:
    """Validated (``{kind}_type`` tensor, ``num_{kind}_types``); both None if untyped."""
    if values is None:
        if count is not None:
            raise ValueError(f"num_{kind}_types given without {kind}_type")
        return None, None
    types = as_index_tensor(f"{kind}_type", values, device)
    if types.numel() != length:
        raise ValueError(f"{kind}_type has {types.numel()} entries but the graph has {length} {unit}")
    count = infer_count(count, f"num_{kind}_types", types)
    check_ids(f"{kind}_type", types, count, f"num_{kind}_types")
    return types, count


def _unique_rows(columns: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
    """Distinct tuples of the parallel id `columns`, sorted lexicographically.

    Packs each tuple into one int64 key when the key space fits (fast 1-D unique), else
    falls back to a row-wise unique.
    """
    space = 1
    for size in sizes[:len(columns)]:
        space *= max(size, 1)
    if space > torch.iinfo(torch.int64).max:
        return list(torch.unique(torch.stack(columns), dim=1).unbind(0))
    key = torch.zeros_like(columns[0])
    for col, size in zip(columns, sizes):
        key = key * max(size, 1) + col
    key = torch.unique(key)
    out = []
    for size in reversed(sizes[:len(columns)]):
        out.append(key % max(size, 1))
        key = key // max(size, 1)
    return out[::-1]


@torch.compiler.disable
def _cached_index_graph(cls: type[Graph], obj: Any, num_nodes: int | None,
                        num_src_nodes: int | None = None) -> Graph:
    """`Graph.coerce` of a torch input other than a plain edge_index (a sparse adj_t, an
    ``EdgeIndex``), cached by `index_cache`. Never traced by dynamo: a sparse input sends
    a compiled layer's frame back to Python and dynamo compiles its helpers one by one, and
    it fails wrapping a CSR's index tensors, views of a sparse base (an IndexError from its
    stride bookkeeping). The graph is host work over index tensors; nothing to compile.

    An ``EdgeIndex``'s ``sparse_size`` is part of the key: ``sparse_resize_`` changes it in
    place without moving a version counter, and the graph counts its vertices from it (a
    graph of the old size was served: a [3, F] `gspmm` output after a resize to 5)."""
    key = num_nodes if num_src_nodes is None else (num_nodes, num_src_nodes)
    if is_pyg_edge_index(obj):
        key = (key, tuple(obj.sparse_size()))
    return cached_graph(obj, index_tensors(obj), key,
                        lambda _: cls._from_torch(obj, num_nodes, num_src_nodes)._begin_first_pass())

