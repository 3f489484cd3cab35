"""Graph: every input format against a scipy reference, kernel layouts, validation."""
from __future__ import annotations

from unittest import mock

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnfuse import Graph
from gnnfuse.bench.host_syncs import HostSyncCounter
from gnnfuse.graph import GraphModifiedError, choose_index_dtype, clear_index_cache
from gnnfuse.graph import graph as graph_module

INT32_MAX = 2**31 - 1


@st.composite
def edge_lists(draw, max_nodes: int = 12, max_edges: int = 30):
    """(src, dst, num_nodes): isolated vertices, self loops and multi-edges all likely."""
    n = draw(st.integers(0, max_nodes))
    e = draw(st.integers(0, max_edges)) if n else 0
    ids = st.lists(st.integers(0, max(n - 1, 0)), min_size=e, max_size=e)
    return draw(ids), draw(ids), n


def reference(src, dst, n) -> np.ndarray:
    """Dense edge-count matrix from scipy (which sums duplicates), row = source."""
    ones = np.ones(len(src), dtype=np.int64)
    return sp.coo_array((ones, (np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))),
                        shape=(n, n)).toarray()


def dense(g: Graph) -> np.ndarray:
    return g.to_scipy().toarray().astype(np.int64)


fast = settings(max_examples=25, deadline=None)


# --- input formats ---------------------------------------------------------------------
@fast
@given(edge_lists())
def test_every_input_format_gives_the_same_graph(edges):
    src, dst, n = edges
    ref = reference(src, dst, n)
    a_src, a_dst = np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)
    exact = [
        Graph(src, dst, n),
        Graph(a_src, a_dst, n),
        Graph(torch.tensor(a_src, dtype=torch.int32), torch.tensor(a_dst, dtype=torch.int32), n),
        Graph.from_edge_index(torch.tensor(np.stack([a_src, a_dst])), n),
        Graph.from_edge_index(np.stack([a_src, a_dst]), n),
        Graph.from_scipy(sp.coo_array((np.ones(len(src)), (a_src, a_dst)), shape=(n, n))),
        Graph.coerce(torch.tensor(np.stack([a_src, a_dst])), n),
    ]
    for g in exact:                                  # edge ids follow input order
        assert g.num_nodes == n and g.num_edges == len(src)
        assert g.src.dtype == g.dst.dtype == torch.int64
        assert g.src.tolist() == src and g.dst.tolist() == dst
        assert g.edge_index.tolist() == [src, dst]
    order = np.argsort(a_src, kind="stable")                       # CSR with duplicates stored
    indptr = np.concatenate([[0], np.cumsum(np.bincount(a_src, minlength=n))])
    csr_matrix = sp.csr_matrix((np.ones(len(src)), a_dst[order], indptr), shape=(n, n))
    multigraph = nx.MultiDiGraph()
    multigraph.add_nodes_from(range(n))
    multigraph.add_edges_from(zip(src, dst))
    for g in (Graph.from_scipy(csr_matrix), Graph.coerce(csr_matrix), Graph.from_networkx(multigraph)):
        assert g.num_nodes == n
        assert np.array_equal(dense(g), ref)


@fast
@given(edge_lists())
def test_from_scipy_keeps_coo_order_and_duplicates(edges):
    src, dst, n = edges
    coo = sp.coo_matrix((np.arange(len(src)) + 1.0, (src, dst)), shape=(n, n))
    g = Graph.from_scipy(coo)
    assert g.src.tolist() == coo.tocoo().row.tolist() and g.num_edges == len(src)
    assert Graph.from_scipy(g.to_scipy()).edge_index.tolist() == g.edge_index.tolist()


@fast
@given(edge_lists())
def test_undirected_networkx_gives_both_directions(edges):
    src, dst, n = edges
    g_nx = nx.Graph()
    g_nx.add_nodes_from(range(n))
    g_nx.add_edges_from(zip(src, dst))
    g = Graph.from_networkx(g_nx)
    assert np.array_equal(dense(g), nx.to_numpy_array(g_nx, nodelist=range(n), dtype=np.int64))


def test_networkx_vertices_numbered_in_iteration_order():
    g_nx = nx.DiGraph()
    g_nx.add_edges_from([("b", "a"), ("a", "c")])
    g = Graph.from_networkx(g_nx)
    assert g.num_nodes == 3 and g.edge_index.tolist() == [[0, 1], [1, 2]]


def test_coerce():
    g = Graph([0, 1], [1, 0])
    assert Graph.coerce(g) is g
    assert Graph.coerce(nx.path_graph(3)).num_edges == 4
    with pytest.raises(ValueError, match="num_nodes=5 given but the graph has 2"):
        Graph.coerce(g, num_nodes=5)
    with pytest.raises(TypeError, match="cannot make a Graph from str"):
        Graph.coerce("cora")


def test_graph_owns_contiguous_int64_indices():
    """Kernels read indices through a bare pointer: a strided view (a row of
    ``edges.t()``) or int32 ids must become contiguous int64 arrays in the graph."""
    edges = torch.tensor([[0, 1], [1, 2], [2, 0]])
    ei = edges.t()
    assert not ei[0].is_contiguous()
    types = torch.tensor([[0, 9], [1, 9], [1, 9]])[:, 0]
    for g in (Graph(ei[0], ei[1], 3, edge_type=types), Graph.from_edge_index(ei, 3, edge_type=types),
              Graph(ei[0].int(), ei[1].int(), 3, edge_type=types.int())):
        for t in (g.src, g.dst, g.edge_type):
            assert t.is_contiguous() and t.dtype == torch.int64
        assert g.src.tolist() == [0, 1, 2] and g.dst.tolist() == [1, 2, 0] and g.edge_type.tolist() == [0, 1, 1]
    plain = torch.tensor([0, 1])
    assert Graph(plain, plain).src is plain          # contiguous int64 is not copied


# --- layouts ---------------------------------------------------------------------------
def check_grouping(csr, n, key, other, index_dtype):
    rowptr, col, eid = csr
    assert rowptr.dtype == col.dtype == eid.dtype == index_dtype
    assert len(rowptr) == n + 1 and rowptr[0] == 0 and rowptr[-1] == len(key)
    assert sorted(eid.tolist()) == list(range(len(key)))          # a permutation of edge ids
    rows = torch.repeat_interleave(torch.arange(n), torch.diff(rowptr.long()))
    eid = eid.long()
    assert torch.equal(key[eid], rows)
    assert torch.equal(other[eid], col.long())
    for v in range(n):                                             # stable: ids increase per row
        ids = eid[rowptr[v]:rowptr[v + 1]]
        assert torch.all(ids[1:] > ids[:-1])


@fast
@given(edge_lists())
def test_csr_and_reverse_csr_carry_edge_ids(edges):
    src, dst, n = edges
    g = Graph(src, dst, n)
    ref = reference(src, dst, n)
    check_grouping(g.csr(), n, g.dst, g.src, g.index_dtype)
    check_grouping(g.reverse_csr(), n, g.src, g.dst, g.index_dtype)
    assert g.in_degrees().tolist() == ref.sum(axis=0).tolist()
    assert g.out_degrees().tolist() == ref.sum(axis=1).tolist()
    c_src, c_dst = g.coo()
    assert c_src.dtype == g.index_dtype and c_src.tolist() == src and c_dst.tolist() == dst


@fast
@given(edge_lists())
def test_degree_order_descending_ties_by_id(edges):
    src, dst, n = edges
    g = Graph(src, dst, n)
    deg = g.in_degrees().tolist()
    assert g.degree_order().tolist() == sorted(range(n), key=lambda v: (-deg[v], v))


def test_layouts_are_cached_and_shared_with_cached():
    g = Graph([0, 1, 2], [1, 2, 0])
    assert g.csr() is g.csr()
    calls = []
    value = g.cached("norm", lambda graph: calls.append(graph) or 42)
    assert value == g.cached("norm", lambda graph: 0) == 42 and calls == [g]
    assert Graph([0], [1]).cached("norm", lambda graph: 7) == 7                  # per graph


def test_index_dtype_narrows_only_when_it_fits():
    assert Graph([0], [1]).index_dtype == torch.int32
    assert choose_index_dtype(INT32_MAX, INT32_MAX - 1) == torch.int32
    assert choose_index_dtype(INT32_MAX + 1, 0) == torch.int64
    assert choose_index_dtype(0, INT32_MAX) == torch.int64
    big = Graph([0, 2**40], [2**40, 0])                           # no per-vertex arrays built
    assert big.num_nodes == 2**40 + 1 and big.index_dtype == torch.int64
    assert big.coo()[0].tolist() == [0, 2**40]                     # not wrapped


# --- transformations -------------------------------------------------------------------
@fast
@given(edge_lists())
def test_transformations_match_scipy(edges):
    src, dst, n = edges
    g = Graph(src, dst, n)
    ref = reference(src, dst, n)
    no_loops = ref * (1 - np.eye(n, dtype=np.int64))
    assert np.array_equal(dense(g.remove_self_loops()), no_loops)
    assert np.array_equal(dense(g.add_self_loops()), ref + np.eye(n, dtype=np.int64))
    assert g.add_self_loops().src[len(src):].tolist() == list(range(n))
    assert np.array_equal(dense(g.reverse()), ref.T)
    undirected = g.to_undirected()
    assert np.array_equal(dense(undirected), ((ref + ref.T) > 0).astype(np.int64))
    assert np.array_equal(g.to_scipy().toarray(), ref)


def test_typed_graph_keeps_relations_apart():
    g = Graph([0, 0, 1, 2], [1, 1, 1, 0], edge_type=[0, 1, 0, 1])
    assert g.num_edge_types == 2 and g.reverse().edge_type.tolist() == [0, 1, 0, 1]
    assert g.remove_self_loops().edge_type.tolist() == [0, 1, 1]
    looped = g.add_self_loops()
    assert looped.num_edge_types == 3 and looped.edge_type[4:].tolist() == [2, 2, 2]
    assert g.add_self_loops(loop_type=0).edge_type[4:].tolist() == [0, 0, 0]
    undirected = g.to_undirected()
    triples = sorted(zip(undirected.src.tolist(), undirected.dst.tolist(), undirected.edge_type.tolist()))
    assert triples == [(0, 1, 0), (0, 1, 1), (0, 2, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 1)]


def test_node_types():
    g = Graph([0], [1], 3, node_type=[0, 1, 1])
    assert g.num_node_types == 2 and g.reverse().node_type.tolist() == [0, 1, 1]


def test_empty_graph_everywhere():
    for g in (Graph([], []), Graph(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 0)):
        assert g.num_nodes == 0 and g.num_edges == 0
        assert g.csr().rowptr.tolist() == [0] and g.reverse_csr().eid.numel() == 0
        assert g.degree_order().numel() == 0 and g.in_degrees().numel() == 0
        assert g.to_undirected().num_edges == 0 and g.add_self_loops().num_edges == 0
        assert g.to_scipy().shape == (0, 0) and g.edge_index.shape == (2, 0)
    assert Graph.from_edge_index([[], []]).num_edges == 0
    assert Graph.from_edge_index([[], []]).num_edges == 0
    isolated = Graph([], [], 4)
    assert isolated.csr().rowptr.tolist() == [0] * 5 and isolated.degree_order().tolist() == [0, 1, 2, 3]
    assert isolated.add_self_loops().num_edges == 4


def test_to_device_and_repr():
    g = Graph([0, 1], [1, 0])
    assert g.to("cpu") is g
    meta = g.to("meta")
    assert meta.device.type == "meta" and meta.num_edges == 2
    assert repr(g) == "Graph(num_nodes=2, num_edges=2, device=cpu)"
    copied = g.to("cpu", copy=True)          # as Tensor.to(copy=True): tensors of its own on the same device
    assert copied is not g and torch.equal(copied.edge_index, g.edge_index)
    assert copied.src.data_ptr() != g.src.data_ptr() and copied.dst.data_ptr() != g.dst.data_ptr()


# --- validation ------------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: Graph([0, 1, -3], [1, 1, 1]), r"src has a negative id -3 at position 2"),
    (lambda: Graph([0, 1], [1, -1]), r"dst has a negative id -1 at position 1"),
    (lambda: Graph([0, 1], [1, 5], 3), r"dst has id 5 at position 1, but num_nodes=3"),
    (lambda: Graph([0, 9], [1, 1], 4), r"num_nodes is smaller than the largest id \+ 1 = 10"),
    (lambda: Graph([0, 1], [1]), r"same length, got 2 and 1"),
    (lambda: Graph([0.0, 1.0], [1, 0]), r"src must hold integer ids, got numpy dtype float64"),
    (lambda: Graph(torch.tensor([0.0]), torch.tensor([1.0])), r"src must hold integer ids, got torch.float32"),
    (lambda: Graph(torch.tensor([True]), torch.tensor([1])), r"src must hold integer ids, got torch.bool"),
    (lambda: Graph([[0, 1]], [[1, 0]]), r"src must be 1-D, got shape \(1, 2\)"),
    (lambda: Graph(torch.tensor([0]), torch.tensor([0], device="meta")), r"src is on cpu, dst is on meta"),
    (lambda: Graph([0, 1], [1, 0], edge_type=[0]), r"edge_type has 1 entries but the graph has 2 edges"),
    (lambda: Graph([0, 1], [1, 0], edge_type=[0, 3], num_edge_types=2), r"edge_type has id 3 at position 1"),
    (lambda: Graph([0, 1], [1, 0], edge_type=[0, -1]), r"edge_type has a negative id -1 at position 1"),
    (lambda: Graph([0, 1], [1, 0], num_edge_types=2), r"num_edge_types given without edge_type"),
    (lambda: Graph([0], [1], node_type=[0]), r"node_type has 1 entries but the graph has 2 nodes"),
    (lambda: Graph([0], [1], -1), r"num_nodes must be >= 0, got -1"),
    (lambda: Graph([0], [1], 2.0), r"num_nodes must be an int, got float"),
    (lambda: Graph.from_edge_index(torch.zeros(3, 2, dtype=torch.long)), r"shape \[2, E\], got \[3, 2\]"),
    (lambda: Graph.from_scipy(sp.coo_array((2, 3))), r"must be square"),
    (lambda: Graph.from_scipy(np.eye(2)), r"expected a scipy sparse matrix"),
    (lambda: Graph(np.array([2**63], dtype=np.uint64), [0]), r"above the int64 range"),
    (lambda: Graph(torch.tensor([0, 2**64 - 1], dtype=torch.uint64), torch.tensor([1, 2])),
     r"src holds ids above the int64 range"),      # was "a negative id -1", which the user never gave
    (lambda: Graph([0, 1], [1, 0]).add_self_loops(loop_type=0), r"loop_type given but the graph has no edge types"),
])
def test_bad_input_raises_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("make, message", [
    (lambda: Graph([0, -1], [1, 9], 3), "src has a negative id -1 at position 1"),      # src before dst
    (lambda: Graph([0, 1], [4, 9], 3), ("dst has id 4 at position 0, but num_nodes=3 (ids must be < num_nodes; "
                                        "num_nodes is smaller than the largest id + 1 = 10)")),
    (lambda: Graph([-1, 2], [0, 1]), "src has a negative id -1 at position 0"),
    (lambda: Graph([2, 1], [0, -4]), "dst has a negative id -4 at position 1"),
    (lambda: Graph([0, 5], [1, 0], 3, num_src_nodes=4),
     ("src has id 5 at position 1, but num_src_nodes=4 (ids must be < num_src_nodes; num_src_nodes is smaller than "
      "the largest id + 1 = 6)")),
    (lambda: Graph([0, 7], [1, 2], num_src_nodes=4),
     ("src has id 7 at position 1, but num_src_nodes=4 (ids must be < num_src_nodes; num_src_nodes is smaller than "
      "the largest id + 1 = 8)")),
    (lambda: Graph([0, 1], [1, -2], num_src_nodes=3), "dst has a negative id -2 at position 1"),
    (lambda: Graph([0, 1], [1, 2], 2, num_src_nodes=3),
     ("dst has id 2 at position 1, but num_nodes=2 (ids must be < num_nodes; num_nodes is smaller than the largest "
      "id + 1 = 3)")),
    (lambda: Graph([0], [1], 2, num_src_nodes=-1), "num_src_nodes must be >= 0, got -1"),
])
def test_a_bad_id_is_named_with_its_array_and_position(make, message):
    with pytest.raises(ValueError) as raised:
        make()
    assert str(raised.value) == message


@pytest.mark.parametrize("num_nodes, num_src_nodes", [(7, None), (None, None), (7, 5), (None, 5), (7, 0)])
def test_a_new_graphs_ids_are_checked_in_one_read_back(num_nodes, num_src_nodes):
    """A graph-classification step builds a graph per batch: the bounds of its src and dst
    (and its vertex count, where inferred) come back to the host in one read, where a
    min and a max of each were four (six with the count inferred), each a sync on a GPU."""
    src, dst = torch.tensor([0, 4, 2, 1]), torch.tensor([3, 6, 0, 6])
    if num_src_nodes == 0:
        src, dst = src[:0], dst[:0]
    with HostSyncCounter() as counter:
        g = Graph(src, dst, num_nodes, num_src_nodes=num_src_nodes)
    assert sum(counter.syncs.values()) == (0 if num_src_nodes == 0 else 1), counter.syncs
    assert (g.num_nodes, g.num_src_nodes) == (7 if num_nodes or num_src_nodes != 0 else 0,
                                              7 if num_src_nodes is None else num_src_nodes)
    edge_index = torch.stack([src, dst])
    clear_index_cache()         # nor an earlier case's graph taken by equal contents (one torch.equal)
    with HostSyncCounter() as counter:
        Graph.coerce(edge_index, num_nodes=7)
    assert sum(counter.syncs.values()) == (0 if num_src_nodes == 0 else 1), counter.syncs
    if num_src_nodes != 0:      # every torch call is host time on a GPU: the edge_index's rows in one
        assert dict(counter.ops) == {"aten.detach.default": 1, "aten.unbind.int": 1, "aten.aminmax.default": 2,
                                     "aten.stack.default": 1, "Tensor.tolist": 1}


@given(st.lists(st.integers(0, 9), max_size=40), st.integers(0, 3), st.sampled_from([torch.int32, torch.int64]))
@settings(max_examples=40, deadline=None)
def test_row_pointers_are_made_in_the_index_dtype_both_ways(keys, extra_rows, dtype):
    """A CSR's row pointers by ``bincount`` (the host's way) and by binary search (a GPU's)
    come out in the graph's index dtype, equal to the counts' running sum."""
    from gnnfuse.graph.graph import row_pointers, searched_row_pointers
    key = torch.tensor(sorted(keys), dtype=torch.int64)
    rows = (max(keys) + 1 if keys else 0) + extra_rows
    expected = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(key, minlength=rows).cumsum(0)])
    for made in (row_pointers(key, rows, dtype), searched_row_pointers(key, rows, dtype)):
        assert made.dtype == dtype and torch.equal(made.long(), expected)


@given(edge_lists())
@settings(max_examples=30, deadline=None)
def test_scatter_counts_are_bincounts(edges):
    """A GPU counts out-degrees by `scatter_counts` where the reverse grouping is not
    built (its sort would serve nothing else on a small graph, whose backward sums in
    COO): the same int64 counts as ``bincount``, isolated vertices and multi-edges too."""
    from gnnfuse.graph.graph import scatter_counts
    src, _, n = edges
    ids = torch.tensor(src, dtype=torch.int64)
    counts = scatter_counts(ids, n + 1)
    assert counts.dtype == torch.int64 and torch.equal(counts, torch.bincount(ids, minlength=n + 1))


def _eager_loop_free_then_looped(src, dst, n, num_src=None):
    """What `remove_self_loops().add_self_loops()` means, computed without gnnfuse."""
    src, dst = torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)
    keep = src != dst
    loops = torch.arange(min(n, n if num_src is None else num_src))
    return torch.cat([src[keep], loops]), torch.cat([dst[keep], loops])


@given(edge_lists(), st.booleans())
@settings(max_examples=60, deadline=None)
def test_self_looped_graph_builds_layouts_without_keeping_endpoints(edges, bipartite):
    """GCN and GAT run on ``remove_self_loops().add_self_loops()``; its int64 endpoint
    arrays (1 GB on a products-sized graph) are not built for the CSR layouts, degrees
    or the COO pair, and every one of those equals the eagerly built graph's."""
    src, dst, n = edges
    num_src = n + 2 if bipartite else None
    base = Graph(src, dst, n, num_src_nodes=num_src) if bipartite else Graph(src, dst, n)
    with mock.patch.object(graph_module, "KEPT_ENDPOINTS_EDGES", -1):     # as a large graph does
        _check_self_looped_layouts(base, src, dst, n, num_src, bipartite)


def _check_self_looped_layouts(base, src, dst, n, num_src, bipartite):
    lazy = base.remove_self_loops().add_self_loops()
    exp_src, exp_dst = _eager_loop_free_then_looped(src, dst, n, num_src)
    eager = Graph(exp_src, exp_dst, n, num_src_nodes=num_src) if bipartite else Graph(exp_src, exp_dst, n)
    assert lazy.num_edges == eager.num_edges and lazy.device == eager.device
    assert lazy.index_dtype == eager.index_dtype
    for layout in ("csr", "reverse_csr"):
        for mine, theirs in zip(getattr(lazy, layout)(), getattr(eager, layout)()):
            assert torch.equal(mine, theirs)
    for mine, theirs in zip(lazy.coo(), eager.coo()):
        assert torch.equal(mine, theirs)
    assert torch.equal(lazy.in_degrees(), eager.in_degrees())
    assert torch.equal(lazy.out_degrees(), eager.out_degrees())
    assert lazy._edges is None, "a layout kept the self-looped graph's int64 endpoints"
    assert torch.equal(lazy.src, exp_src) and torch.equal(lazy.dst, exp_dst)
    assert lazy._edges is not None                  # read once: kept, not rebuilt per read
    assert torch.equal(lazy.add_self_loops().dst[-min(n, num_src or n):], torch.arange(min(n, num_src or n)))


def test_a_small_self_looped_graph_builds_its_endpoints_once():
    """A graph-classification step's self-looped batch (GCN, GAT) builds its CSR from its
    endpoints, and a COO kernel reads them again: up to `KEPT_ENDPOINTS_EDGES` edges it
    keeps them from the first build, where it made them a second time."""
    torch.manual_seed(0)
    graph = Graph(torch.randint(0, 30, (90,)), torch.randint(0, 30, (90,)), 30)
    looped = graph.remove_self_loops().add_self_loops()
    with HostSyncCounter() as counter:
        looped.grouped("dst")
        src, dst = looped.src, looped.dst
    assert counter.ops["aten.nonzero_static.default"] == 1 and counter.ops["aten.cat.default"] == 2
    keep = graph.src != graph.dst
    assert torch.equal(src, torch.cat([graph.src[keep], torch.arange(30)]))
    assert torch.equal(dst, torch.cat([graph.dst[keep], torch.arange(30)]))
    with pytest.raises(GraphModifiedError):      # kept, they are sealed with the recipe's tensors
        graph.src.add_(0)
        looped.check_unchanged()
    # arrays made inside a torch.func transform are its wrappers, unusable after it: not kept
    graph = Graph(torch.randint(0, 30, (90,)), torch.randint(0, 30, (90,)), 30)
    looped = graph.remove_self_loops().add_self_loops()
    torch.func.grad(lambda x: (x * looped._endpoints(keep=False)[0].double()).sum())(torch.ones(looped.num_edges,
                                                                                                 dtype=torch.float64))
    assert looped._edges is None
    assert torch.equal(looped.src, torch.cat([graph.src[graph.src != graph.dst], torch.arange(30)]))


def test_an_execution_context_builds_looped_endpoints_only_when_an_op_indexes_by_them():
    """The fused Triton kernels walk the looped graph's CSR layouts; only an op that
    indexes by src/dst outside them (the reference executor's gathers do) builds them."""
    torch.manual_seed(0)
    graph = Graph(torch.randint(0, 40, (200,)), torch.randint(0, 40, (200,)), 40)
    looped = graph.remove_self_loops().add_self_loops()
    from gnnfuse.backend.reference.context import GraphContext
    ctx = GraphContext(looped)
    assert ctx.num_edges == looped.num_edges and ctx.device == looped.device
    assert looped._edges is None, "making an execution context built the endpoints"
    assert torch.equal(ctx.index("src"), looped.src)


def test_a_self_looped_graphs_endpoints_read_back_only_the_loop_free_count():
    """`remove_self_loops` reads how many edges it keeps, once; its endpoints are then
    picked at that count. A boolean-mask index read the count back again, per array,
    every time they were built (GAT built them twice per new graph: four syncs)."""
    torch.manual_seed(0)
    graph = Graph(torch.randint(0, 20, (100,)), torch.randint(0, 20, (100,)), 20)
    with HostSyncCounter() as counter:
        looped = graph.remove_self_loops().add_self_loops()
        transient = looped._endpoints(keep=False)
        kept = looped.src, looped.dst
    assert dict(counter.syncs) == {"aten._local_scalar_dense.default": 1}
    keep = graph.src != graph.dst
    loops = torch.arange(20)
    for built in (transient, kept):
        assert torch.equal(built[0], torch.cat([graph.src[keep], loops]))
        assert torch.equal(built[1], torch.cat([graph.dst[keep], loops]))


@given(edge_lists(), st.sampled_from(["plain", "dst-grouped", "self-looped"]), st.booleans())
@settings(max_examples=60, deadline=None)
def test_layouts_without_edge_ids_are_the_full_layouts(edges, kind, ids_first):
    """`Graph.grouped` gives the CSR's and reverse CSR's ``rowptr``/``col`` without
    building ``eid``; asking for the full layout afterwards (or first) gives the same
    arrays and edge ids that read each position's edge back."""
    src, dst, n = edges
    if kind == "dst-grouped":
        order = sorted(range(len(dst)), key=lambda i: dst[i])
        src, dst = [src[i] for i in order], [dst[i] for i in order]
        graph = Graph(src, dst, n)
        graph._trust_dst_order(True)
    else:
        graph = Graph(src, dst, n)
        if kind == "self-looped":
            graph = graph.remove_self_loops().add_self_loops()
    for by, full_key in (("dst", "csr"), ("src", "reverse_csr")):
        if ids_first:
            getattr(graph, full_key)()
        rowptr, col = graph.grouped(by)
        assert (full_key in graph._cache) == ids_first, "grouped() built the edge ids"
        layout = getattr(graph, full_key)()
        assert torch.equal(layout.rowptr, rowptr) and torch.equal(layout.col, col)
        other, key = (graph.src, graph.dst) if by == "dst" else (graph.dst, graph.src)
        eid = layout.eid.long()
        assert torch.equal(torch.sort(eid).values, torch.arange(graph.num_edges))
        assert torch.equal(other[eid].to(col.dtype), col)
        rows = torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr.long().diff())
        assert torch.equal(key[eid], rows)
        assert bool((eid.diff()[rows[1:] == rows[:-1]] > 0).all()), "ids do not rise within a row"


def test_a_step_without_edge_rows_builds_no_edge_ids(monkeypatch):
    """GCN and GAT steps on the Triton backend (interpreter on this CPU) walk their CSR
    layouts without the edge ids; a GAT with edge features reads edge rows through them."""
    import gnnfuse.nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    torch.manual_seed(0)
    graph = Graph(torch.randint(0, 30, (120,)), torch.randint(0, 30, (120,)), 30).to(device)
    x = torch.randn(30, 8, device=device, requires_grad=True)
    for layer in (gnnfuse.nn.GCNConv(8, 4), gnnfuse.nn.GATConv(8, 4, heads=2)):
        layer = layer.to(device)
        layer(x, graph).sum().backward()
    built = _graphs_in(graph)
    assert built and all("csr" not in g._cache and "reverse_csr" not in g._cache for g in built)
    assert any("csr_rows" in g._cache for g in built)
    edge_attr = torch.randn(120, 3, device=device)
    gnnfuse.nn.GATConv(8, 4, heads=2, edge_dim=3).to(device)(x, graph, edge_attr).sum().backward()
    assert any("csr" in g._cache for g in _graphs_in(graph))


def _graphs_in(graph: Graph) -> list[Graph]:
    """``graph`` and the graphs derived from it that its cache holds (self-looped copies)."""
    found = [graph]
    for value in graph._cache.values():
        if isinstance(value, Graph):
            found.extend(_graphs_in(value))
    return found


def test_build_later_recipe_builds_on_first_ask_in_place_of_the_askers_builder():
    g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    calls = []
    g.build_later("layout", lambda graph: calls.append("recipe") or "from the recipe")
    assert "layout" not in g._cache and not calls
    assert g.cached("layout", lambda graph: calls.append("asker") or "from the asker") == "from the recipe"
    assert g.cached("layout", lambda graph: "again") == "from the recipe" and calls == ["recipe"]
    g.build_later("layout", lambda graph: "late")              # already built: kept
    assert g.cached("layout", lambda graph: "asker") == "from the recipe"
    from gnnfuse.graph.fixed_shape import prefill
    g.build_later("other", lambda graph: calls.append("unused") or "recipe")
    prefill(g, other="prefilled")                              # a value in hand beats a recipe
    assert g.cached("other", lambda graph: "asker") == "prefilled" and "unused" not in calls


def test_a_pickled_graph_takes_its_recipes_built():
    """A loader worker's batch crosses processes pickled: recipes are closures, so they
    are built before the graph travels, and arrive as cached layouts."""
    import pickle
    g = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    g.build_later("layout", lambda graph: ("built", graph.num_edges))
    g.build_later("stored", lambda graph: "recipe")
    g._cache["stored"] = "stored directly"          # as a padded batch's fixed shapes store theirs
    g.build_later("chained", lambda graph: graph.cached("layout", lambda _: "asker") + ("chained",))
    copy = pickle.loads(pickle.dumps(g))
    assert copy._cache["layout"] == ("built", 3) and not copy._builders
    assert copy.cached("layout", lambda graph: "asker") == ("built", 3)
    assert copy._cache["stored"] == "stored directly" and copy._cache["chained"] == ("built", 3, "chained")


def _sage_twice_on_a_received_graph(queue, results):
    """A worker: SAGEConv on the graph it receives, then again once told to; puts how far
    apart the two outputs are (a number: tensors would need the worker alive to cross)."""
    from gnnfuse.nn import SAGEConv
    graph = queue.get(timeout=60)
    torch.manual_seed(0)
    conv, x = SAGEConv(4, 3).double(), torch.randn(graph.num_nodes, 4, dtype=torch.float64)
    first = conv(x, graph).detach()
    results.put("ran once")
    queue.get(timeout=60)
    results.put((first - conv(x, graph).detach()).abs().max().item())


def test_a_graph_sent_to_another_process_is_its_own():
    """A graph put on a ``torch.multiprocessing`` queue crossed with its tensors moved to
    shared memory: the sender's in-place edit of ``dst`` reached the receiver's edges,
    whose version counters (per process) never moved, so its cached layouts went stale
    unseen: a SAGEConv there was 2.1 off its own first output and 2.3 off the edited
    edges' (2.9 off here; a GCN silently kept the old edges). The receiver gets a copy instead."""
    import torch.multiprocessing as mp
    context = mp.get_context("fork")
    queue, results = context.Queue(), context.Queue()
    worker = context.Process(target=_sage_twice_on_a_received_graph, args=(queue, results))
    worker.start()
    try:
        g = Graph(torch.tensor([0, 1, 2, 3, 4, 0, 2]), torch.tensor([1, 2, 3, 4, 0, 3, 1]), 5)
        queue.put(g)
        assert results.get(timeout=120) == "ran once"   # its layouts are built before the edit
        g.dst[:3] = 0                                # the sender edits its graph in place
        queue.put("again")
        apart = results.get(timeout=120)
    finally:
        worker.join(30)
        if worker.is_alive():
            worker.kill()
    assert apart == 0.0


@pytest.mark.parametrize("write", [lambda g: g.in_degrees().clamp_(min=1), lambda g: g.csr().col.zero_(),
                                   lambda g: g.edge_index[0].fill_(0)], ids=["in_degrees", "csr", "edge_index"])
def test_a_layout_written_in_place_by_its_caller_is_refused(write):
    """``graph.in_degrees()`` (``csr()``, ``edge_index``, ...) is the cached tensor every
    layer reads: ``deg = g.in_degrees(); deg[deg == 0] = 1`` made a GCN without self loops
    1.04 off PyG's, silently. The graph is refused at its next use, naming the layout."""
    from gnnfuse import nn as gnn
    from gnnfuse.graph import GraphModifiedError
    graph = Graph.from_edge_index(torch.tensor([[0, 1, 2, 3, 0], [1, 2, 3, 3, 2]]), 6)
    layer = gnn.GCNConv(3, 2, add_self_loops=False)
    x = torch.randn(6, 3)
    layer(x, graph)
    write(graph)
    with pytest.raises(GraphModifiedError, match="cached .* layout .* clone it before writing"):
        layer(x, graph)
    with pytest.raises(GraphModifiedError):
        graph.in_degrees()


def test_an_edit_inside_inference_mode_is_refused_or_does_not_reach_the_graph():
    """Inference tensors have no version counter, but inside ``torch.inference_mode()``
    they can be written in place: a graph built there kept its CSR while an edit of its
    ``edge_index`` reached the gathers (a SAGEConv 1.02 off PyG's), and an edit of
    ``in_degrees()`` changed a GCN's norms (0.78 off), both silently. The graph now copies
    inference index tensors and builds the layouts it hands out as normal tensors."""
    from gnnfuse import nn as gnn
    from gnnfuse.graph import GraphModifiedError
    torch.manual_seed(0)
    x = torch.randn(6, 3)
    sage, gcn = gnn.SAGEConv(3, 2), gnn.GCNConv(3, 2, add_self_loops=False)
    with torch.inference_mode():
        edge_index = torch.tensor([[0, 1, 2, 3, 0, 5], [1, 2, 3, 3, 2, 4]])
        graph = Graph.from_edge_index(edge_index, 6)
        before = sage(x, graph)
        edge_index[1, :3] = 5
        assert torch.equal(sage(x, graph), before)          # the graph's edges are its own
        assert not torch.allclose(sage(x, edge_index), before)   # the edited tensor is a new graph
        deg = graph.in_degrees()
        deg[deg == 0] = 1
        with pytest.raises(GraphModifiedError, match="cached in_degrees layout"):
            gcn(x, graph)


@pytest.mark.parametrize("layer", ["GCNConv", "SGConv", "APPNP", "TAGConv", "ChebConv"])
def test_a_graph_first_used_inside_inference_mode_trains_afterwards(layer):
    """Evaluating under ``torch.inference_mode()`` and then training on the same edges:
    the graph's cached norms were built there as inference tensors, and a float64 layer
    (whose ``.to(float64)`` of the norms is no copy) saved them for backward -- 'Inference
    tensors cannot be saved for backward' on the training step (a HeteroConv with a
    GCNConv relation too)."""
    from gnnfuse import nn as gnn
    torch.manual_seed(0)
    make = {"GCNConv": lambda: gnn.GCNConv(3, 2), "SGConv": lambda: gnn.SGConv(3, 2, K=2),
            "APPNP": lambda: gnn.APPNP(K=2, alpha=0.1), "TAGConv": lambda: gnn.TAGConv(3, 2),
            "ChebConv": lambda: gnn.ChebConv(3, 2, K=2)}[layer]
    conv = make().double()
    x = torch.randn(6, 3, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 2, 3, 0, 5], [1, 2, 3, 3, 2, 4]])
    with torch.inference_mode():
        conv(x, edge_index)
    grads = []
    for edges in (edge_index, edge_index.clone()):           # the graph built in inference mode, a new one
        leaf = x.clone().requires_grad_()
        conv(leaf, edges).square().sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_graph_tensors_on_two_devices_are_refused_by_name():
    """An edge_index's two rows on one device take `Graph.__init__`'s short path; rows,
    or types, on another device are still refused, naming each tensor's device."""
    cpu, meta = torch.tensor([0, 1]), torch.tensor([1, 0], device="meta")
    with pytest.raises(ValueError, match=r"share one device, but src is on cpu, dst is on meta"):
        Graph(cpu, meta, 2)
    with pytest.raises(ValueError, match=r"share one device, but src is on cpu, dst is on cpu, edge_type is on meta"):
        Graph(cpu, cpu.flip(0), 2, edge_type=meta)


def test_numpy_ids_are_copied_so_a_later_write_to_the_array_cannot_stale_the_graph():
    """A contiguous int64 numpy array had been wrapped without a copy: an in-place write to
    it changed ``g.dst`` while the degrees and layouts still described the old edges (and
    numpy moves no version counter the graph could check). Non-tensor ids are copied."""
    import gnnfuse
    src, dst = np.array([0, 1, 2, 3]), np.array([1, 1, 3, 0])
    h = torch.randn(4, 2, dtype=torch.float64)
    for g in (Graph(src, dst, 4), Graph.from_edge_index(np.stack([src, dst]), 4)):
        before = gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]))(g, {"h": h})
        dst[0] = 2
        assert not np.shares_memory(g.dst.numpy(), dst) and g.dst.tolist() == [1, 1, 3, 0]
        torch.testing.assert_close(gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]))(g, {"h": h}), before)
        assert g.in_degrees().tolist() == [1, 2, 0, 1]
        dst[0] = 1


def test_to_scipy_hands_out_coordinates_of_its_own():
    """``to_scipy`` gave scipy the numpy views of the graph's own ``src``/``dst`` (the
    caller's ``edge_index`` rows): a write to the matrix's ``row``/``col`` rewrote the
    edge_index and the graph without moving a version counter, and a mean over
    in-edges came out [100, 100, 10] on the reference backend and [100, 50.5, 10] on the
    cpu one (its CSR built before). The matrix's coordinates are copies."""
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    g = Graph.from_edge_index(edge_index)
    g.csr()
    matrix = g.to_scipy()
    assert not np.shares_memory(matrix.row, g.src.numpy()) and not np.shares_memory(matrix.col, g.dst.numpy())
    matrix.row[0], matrix.col[0] = 2, 0
    assert edge_index.tolist() == [[0, 1, 2, 2], [1, 2, 0, 1]] and g.edge_index.tolist() == edge_index.tolist()
    g.check_unchanged()


def test_from_edge_index_counts_an_edge_index_s_declared_vertices():
    """``Graph.coerce`` read a PyG EdgeIndex's sparse_size, ``from_edge_index`` dropped it:
    9 declared vertices became 2."""
    from torch_geometric import EdgeIndex
    edge_index = EdgeIndex(torch.tensor([[0], [1]]), sparse_size=(9, 9))
    assert Graph.from_edge_index(edge_index).num_nodes == Graph.coerce(edge_index).num_nodes == 9
    typed = Graph.from_edge_index(edge_index, edge_type=torch.tensor([0]))
    assert typed.num_nodes == 9 and typed.edge_type.tolist() == [0]


def test_a_write_to_csr_col_is_refused_naming_the_method_that_returned_it():
    """``csr().col`` and ``csr().rowptr`` are the graph's ``csr_rows`` layout's tensors, so
    a write to them was refused as a write to the tensor "Graph.csr_rows returns" -- no
    such method; the caller wrote to what ``csr()`` gave them. The error names ``csr()``."""
    from gnnfuse import nn as gnn
    from gnnfuse.graph import GraphModifiedError
    x = torch.randn(6, 3)
    for by, layout in (("col", "csr"), ("rowptr", "reverse_csr")):
        graph = Graph.from_edge_index(torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 1]]), 6)
        getattr(getattr(graph, layout)(), by)[0] = 1
        with pytest.raises(GraphModifiedError, match=rf"Graph\.{layout}\(\) \(or grouped") as info:
            gnn.SAGEConv(3, 2)(x, graph)
        assert "Graph.csr_rows" not in str(info.value) and "Graph.reverse_csr_rows" not in str(info.value)
