"""Raw graph inputs a PyG user passes -- an ``edge_index`` tensor, PyG's ``EdgeIndex``, a
sparse ``adj_t`` -- get one remembered `Graph` while unchanged (issue #12 item 1), so a
training loop reuses its CSR and self-looped graph, and an edited input is never served
a stale graph."""
from __future__ import annotations

import gc
import sys
import threading
import types
import weakref

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex

import gnnfuse
from gnnfuse import Graph
from gnnfuse import nn as gnn
from gnnfuse.graph import clear_index_cache, index_cache
from layer_check import assert_same_outputs_and_grads

N = 10


@pytest.fixture(autouse=True)
def empty_cache():
    clear_index_cache()
    yield
    clear_index_cache()


def edge_index() -> torch.Tensor:
    """No multi-edges (a sparse adj_t would merge them), vertex 9 isolated."""
    pairs = sorted({(s, d) for s, d in torch.randint(0, N - 1, (30, 2), generator=torch.Generator().manual_seed(5)).tolist()})
    return torch.tensor(pairs).t().contiguous()


def gcn() -> tuple[gnn.GCNConv, pyg.GCNConv]:
    torch.manual_seed(0)
    ours, ref = gnn.GCNConv(4, 3).double(), pyg.GCNConv(4, 3).double()
    ours.load_state_dict(ref.state_dict())
    return ours, ref


def no_call(graph: Graph):
    pytest.fail("a layout cached on the first call was built again")


def test_a_repeated_edge_index_reuses_one_graph_and_its_layouts():
    ei, conv = edge_index(), gcn()[0]
    x = torch.randn(N, 4, dtype=torch.float64)
    conv(x, ei)
    graph = Graph.coerce(ei, N)
    assert Graph.coerce(ei, N) is graph
    graph.cached("nn_self_looped", no_call).cached("nn_inv_sqrt_degree", no_call)   # from the first call
    assert Graph.coerce(ei, N + 1) is not graph and Graph.coerce(ei, N + 1).num_nodes == N + 1


def test_an_edited_edge_index_is_never_served_stale():
    ei, conv = edge_index(), gcn()[0]
    x = torch.randn(N, 4, dtype=torch.float64)
    before = conv(x, ei)
    edits = [lambda: ei.__setitem__((1, 0), 9),           # item assignment
             lambda: ei[0].copy_(ei[0].flip(0)),          # through a view of one row
             lambda: ei.t()[:3, 1].fill_(4)]              # through a strided view
    for edit in edits:
        edit()
        fresh = conv(x, ei.clone())                      # a new tensor: rebuilt from scratch
        torch.testing.assert_close(conv(x, ei), fresh, rtol=0, atol=0)
        assert not torch.equal(fresh, before)
        before = fresh


def test_an_edge_index_written_through_either_handle_is_never_served_stale():
    """A write through PyG's ``EdgeIndex`` moves its own version counter, not the plain
    tensor's inside it; the cache once stamped only the latter and kept the old graph."""
    ei, (conv, ref) = edge_index(), gcn()
    wrapped = EdgeIndex(ei.clone(), sparse_size=(N, N))
    x = torch.randn(N, 4, dtype=torch.float64)
    conv(x, wrapped)
    for edit in (lambda: wrapped.__setitem__((1, slice(0, 5)), 0),
                 lambda: wrapped.as_tensor()[0, :3].fill_(8)):
        edit()
        torch.testing.assert_close(conv(x, wrapped), ref(x, wrapped.as_tensor().clone()), rtol=1e-12, atol=1e-12)


def test_an_edge_index_resized_in_place_is_never_served_its_old_size():
    """``EdgeIndex.sparse_resize_`` changes the vertex count the graph reads from it
    without moving a version counter: a gspmm over edge data alone (the count from the
    EdgeIndex) once came back with the old 3 rows after a resize to 5."""
    wrapped = EdgeIndex(torch.tensor([[0, 1], [1, 2]]), sparse_size=(3, 3))
    w = torch.ones(2, 1, dtype=torch.float64)
    assert gnnfuse.ops.gspmm(wrapped, None, "sum", edge=w).shape == (3, 1)
    wrapped.sparse_resize_(5, 5)
    assert Graph.coerce(wrapped).num_nodes == 5
    assert gnnfuse.ops.gspmm(wrapped, None, "sum", edge=w).shape == (5, 1)
    wrapped.sparse_resize_(2, 5)          # sources x destinations: bipartite now
    graph = Graph.coerce(wrapped)
    assert (graph.num_src_nodes, graph.num_nodes) == (2, 5)


def test_new_tensors_are_never_mistaken_for_freed_ones():
    """Each temporary below gets the id of the one freed before it, and int32 input is
    copied into the graph, so the freed tensor's memory (and version 0) may come back
    too: only the object itself tells the inputs apart."""
    for i in range(16):
        graph = Graph.coerce(torch.full((2, 1 << 16), i, dtype=torch.int32), 16)
        assert graph.dst[0].item() == i


@pytest.mark.parametrize("make", [edge_index, lambda: adjacencies(edge_index())["csr"],
                                  lambda: EdgeIndex(edge_index(), sparse_size=(N, N))],
                         ids=["edge_index", "adj_t", "EdgeIndex"])
def test_a_dropped_input_frees_its_graph(make):
    """A loop making a new edge_index per epoch must not pile up graphs (and their
    layouts) on the GPU until the cache evicts them."""
    graph = Graph.coerce(make(), N)
    graph.csr()
    alive = weakref.ref(graph)
    del graph
    gc.collect()
    assert alive() is None


def test_the_cache_is_bounded_least_recently_used_first():
    first = edge_index()
    graph = Graph.coerce(first, N)
    others = [edge_index() for _ in range(2 * index_cache.CAPACITY)]
    for other in others[:index_cache.CAPACITY - 1]:     # now full
        Graph.coerce(other, N)
    assert Graph.coerce(first, N) is graph              # a hit: `first` is the most recent
    Graph.coerce(others[index_cache.CAPACITY - 1], N)   # evicts others[0], not `first`
    assert Graph.coerce(first, N) is graph
    for other in others[index_cache.CAPACITY:]:
        Graph.coerce(other, N)
    assert Graph.coerce(first, N) is not graph


def test_inference_tensors_are_used_but_not_cached():
    with torch.inference_mode():
        ei = edge_index()
    graph = Graph.coerce(ei, N)
    assert graph.num_edges == ei.shape[1] and Graph.coerce(ei, N) is not graph


# --- other PyG graph inputs --------------------------------------------------------------
def loop_free_edge_index() -> torch.Tensor:
    """For comparisons with PyG's own sparse path: on a torch sparse adj_t, PyG's GCN adds
    a second self loop where one exists (add_self_loops), unlike on an edge_index
    (add_remaining_self_loops); gnnfuse reads both inputs as the same graph and follows the
    edge_index semantics."""
    ei = edge_index()
    return ei[:, ei[0] != ei[1]]


def adjacencies(ei: torch.Tensor) -> dict[str, torch.Tensor]:
    """PyG's adj_t convention: entry (target, source)."""
    coo = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64), (N, N)).coalesce()
    return {"coo": coo, "csr": coo.to_sparse_csr()}


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_adj_t_is_read_as_pyg_reads_it(layout):
    ei = loop_free_edge_index()
    adj_t = adjacencies(ei)[layout]
    ours, ref = gcn()
    x = torch.randn(N, 4, dtype=torch.float64)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, adj_t), lambda xs: ref(xs, adj_t), x)
    with pytest.raises(ValueError, match="the torch sparse adj_t stores self loops"):     # PyG adds more: refused
        ours(x, adjacencies(edge_index())[layout])
    graph = Graph.coerce(adj_t, N)
    assert sorted(zip(graph.src.tolist(), graph.dst.tolist())) == sorted(zip(*ei.tolist()))
    assert Graph.coerce(adj_t, N) is graph


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_row_major_adj_t_builds_its_csr_without_a_sort(layout, monkeypatch):
    graph = Graph.coerce(adjacencies(edge_index())[layout], N)
    expected = Graph(graph.src, graph.dst, N).csr()
    monkeypatch.setattr(torch, "sort", lambda *a, **k: pytest.fail("sorted again"))
    for got, want in zip(graph.csr(), expected):
        assert torch.equal(got, want)


@pytest.mark.parametrize("make, message", [
    (lambda ei: torch.sparse_coo_tensor(ei.flip(0), torch.full((ei.shape[1],), 0.5), (N, N)),
     "values other than 1, which PyG would use as edge weights"),
    (lambda ei: torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N + 1)), "must be square"),
    (lambda ei: adjacencies(ei)["coo"].to_sparse_bsr((1, 1)),
     "sparse COO, CSR or CSC tensor, got layout torch.sparse_bsr"),
])
def test_unusable_adj_t_is_rejected(make, message):
    with pytest.raises(ValueError, match=message):
        Graph.coerce(make(edge_index()))


def test_adj_t_size_must_match_num_nodes():
    with pytest.raises(ValueError, match="num_nodes=12 given but the adjacency is 10 x 10"):
        Graph.coerce(adjacencies(edge_index())["coo"], 12)


def test_pyg_edge_index_is_read_and_its_column_order_reused(monkeypatch):
    ei = edge_index()
    order = torch.sort(ei[1], stable=True).indices
    by_col = EdgeIndex(ei[:, order], sparse_size=(N, N), sort_order="col")
    ours, ref = gcn()
    x = torch.randn(N, 4, dtype=torch.float64)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, by_col), lambda xs: ref(xs, ei[:, order]), x)
    graph = Graph.coerce(by_col, N)
    assert type(graph.src) is torch.Tensor and Graph.coerce(by_col, N) is graph
    fresh = Graph.coerce(EdgeIndex(ei[:, order], sparse_size=(N, N), sort_order="col"), N)
    expected = Graph.from_edge_index(ei[:, order], N).csr()
    monkeypatch.setattr(torch, "sort", lambda *a, **k: pytest.fail("sorted again"))
    for got, want in zip(fresh.csr(), expected):
        assert torch.equal(got, want)


def test_a_false_sort_order_claim_is_not_trusted():
    ei = edge_index()
    claimed = EdgeIndex(ei, sparse_size=(N, N), sort_order="col")   # ei is sorted by source, not target
    for got, want in zip(Graph.coerce(claimed, N).csr(), Graph.from_edge_index(ei, N).csr()):
        assert torch.equal(got, want)


class _FakeSparseTensor:
    """torch_sparse.SparseTensor's surface gnnfuse reads (``coo``, ``sparse_sizes``)."""

    def __init__(self, row: torch.Tensor, col: torch.Tensor, size: int):
        self.row, self.col, self.size = row, col, size

    def coo(self):
        return self.row, self.col, None

    def sparse_sizes(self):
        return self.size, self.size


def test_sparse_tensor_is_read_as_adj_t():
    fake = types.new_class("SparseTensor", (_FakeSparseTensor,))
    fake.__module__ = "torch_sparse.tensor"
    ei = edge_index()
    order = torch.sort(ei[1], stable=True).indices
    adj_t = fake(ei[1, order], ei[0, order], N)
    graph = Graph.coerce(adj_t, N)
    assert graph.src.tolist() == ei[0, order].tolist() and graph.dst.tolist() == ei[1, order].tolist()
    assert Graph.coerce(adj_t, N) is graph


def test_real_sparse_tensor_matches_pyg():
    torch_sparse = pytest.importorskip("torch_sparse")
    ei = edge_index()
    adj_t = torch_sparse.SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(N, N))
    ours, ref = gcn()
    x = torch.randn(N, 4, dtype=torch.float64)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, adj_t), lambda xs: ref(xs, adj_t), x)


def test_front_ends_take_the_same_inputs():
    @gnnfuse.vertex
    def neighbour_sum(v):
        return sum([u.h for u in v.innbs])

    ei = torch.cat([edge_index(), torch.tensor([[N - 1], [0]])], 1)   # N inferred from the ids
    x = torch.randn(N, 2, dtype=torch.float64)
    expected = torch.zeros_like(x).index_add(0, ei[1], x[ei[0]])
    for graph in (ei, adjacencies(ei)["csr"], EdgeIndex(ei, sparse_size=(N, N))):
        torch.testing.assert_close(neighbour_sum(graph, {"h": x}), expected)
    padded = torch.cat([x, x[:2]])             # EdgeIndex's size counts isolated trailing vertices
    assert neighbour_sum(EdgeIndex(ei, sparse_size=(N + 2, N + 2)), {"h": padded}).shape == (N + 2, 2)


def test_a_new_edge_index_per_call_with_the_same_contents_reuses_one_graph():
    """PyG's ClusterGCNConv and PDNConv make a fresh self-looped edge_index on every call:
    from the third such call on, one graph (and its CSR) is served, built over a private
    copy of the contents, so it reads no caller's memory."""
    inputs = [edge_index() for _ in range(5)]
    built = [Graph.coerce(ei, N) for ei in inputs]
    assert built[1] is not built[2] and built[2] is built[3] is built[4]
    storages = {t.untyped_storage().data_ptr() for t in inputs}
    assert built[2].src.untyped_storage().data_ptr() not in storages
    assert Graph.coerce(edge_index(), N + 1) is not built[2]        # another vertex count
    assert Graph.coerce(edge_index().to(torch.int32), N) is not built[2]


def test_a_graph_served_by_contents_survives_writes_to_the_buffer_it_was_matched_from():
    """The graph lent by contents was the held input's own: a loader refilling its
    ``torch.from_numpy`` buffer (a write no version counter sees) changed the edges under
    every tensor that had borrowed it -- a validation edge_index never written got the
    new batch's edges under the old CSR (SAGEConv 4.3, GAT 3.2 off PyG's)."""
    sage, ref = gnn.SAGEConv(4, 3).double(), pyg.SAGEConv(4, 3).double()
    ref.load_state_dict(sage.state_dict())
    x = torch.randn(N, 4, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    c0, c1, c2 = (torch.randint(0, N, (2, 24), generator=gen) for _ in range(3))
    fixed = c1.clone()
    buffer = np.empty((2, 24), dtype=np.int64)
    for contents in (c0, c1):
        buffer[:] = contents.numpy()
        sage(x, torch.from_numpy(buffer))       # the second is held: its shape missed before
    torch.testing.assert_close(sage(x, fixed), ref(x, fixed))       # equal to it: served by contents
    buffer[:] = c2.numpy()                      # the loader's next batch
    torch.testing.assert_close(sage(x, fixed), ref(x, fixed))
    torch.testing.assert_close(sage(x, torch.from_numpy(buffer)), ref(x, c2))


def test_an_edit_to_a_held_input_does_not_reach_a_borrowers_backward():
    """A borrower's graph watched the lender's tensors: editing the lender after a
    borrower's forward failed that borrower's backward, naming a tensor it never used.
    Now neither the lender's edit nor the borrower's own reaches it: the backward runs
    on the edges of the forward that ran."""
    sage, ref = gnn.SAGEConv(4, 3).double(), pyg.SAGEConv(4, 3).double()
    ref.load_state_dict(sage.state_dict())
    lender = edge_index()
    sage(torch.randn(N, 4, dtype=torch.float64), edge_index())
    sage(torch.randn(N, 4, dtype=torch.float64), lender)                # held
    borrower, clean = edge_index(), edge_index()
    for edited in (lender, borrower):
        x = torch.randn(N, 4, dtype=torch.float64, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        out = sage(x, borrower)
        edited[0, :5] = 0
        out.pow(2).sum().backward()
        ref(xr, clean).pow(2).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)


@pytest.mark.parametrize("write", ["numpy", "data"])
@pytest.mark.parametrize("view", ["view", "slice"])
def test_views_of_one_buffer_refilled_without_torch_get_the_new_edges(view, write):
    """A loader holding one tensor over its buffer (``torch.from_numpy`` once) and handing
    out a view of it per batch, refilled through numpy or ``.data``: those writes move no
    version counter, so a view always equals the held view of the batch before, and was
    served that batch's graph (a SAGEConv 1-4 off PyG's from the third batch on). Each
    call's graph must hold the edges the view holds then."""
    buffer = edge_index().numpy().copy()
    base = torch.from_numpy(buffer)
    sage = gnn.SAGEConv(4, 3).double()
    ref = pyg.SAGEConv(4, 3).double()
    ref.load_state_dict(sage.state_dict())
    x = torch.randn(N, 4, dtype=torch.float64)
    gen = torch.Generator().manual_seed(7)
    for _ in range(4):
        fresh = torch.randint(0, N, base.shape, generator=gen)
        if write == "numpy":
            buffer[:] = fresh.numpy()
        else:
            base.data.copy_(fresh)
        given = base.view(2, -1) if view == "view" else base[:, :]
        graph = Graph.coerce(given, N)
        assert torch.equal(graph.src.long(), fresh[0]) and torch.equal(graph.dst.long(), fresh[1])
        torch.testing.assert_close(sage(x, given), ref(x, fresh))


def test_a_new_edge_index_with_other_contents_is_never_served_a_held_graph(monkeypatch):
    """Equal shapes, different contents: each gets its own graph, and once a comparison
    has failed that shape is not compared again (a loader's fixed-shape batches would
    otherwise pay a read-back per batch)."""
    base = edge_index()
    Graph.coerce(base.clone(), N)
    Graph.coerce(base.clone(), N)                    # held
    changed = base.clone()
    changed[0, 0] = (changed[0, 0] + 1) % N
    graph = Graph.coerce(changed, N)
    assert torch.equal(graph.src.long(), changed[0]) and torch.equal(graph.dst.long(), changed[1])
    compared = []
    monkeypatch.setattr(torch, "equal", lambda a, b: compared.append(1) or True)
    for _ in range(3):
        Graph.coerce(base.clone(), N)
    assert compared == []


def test_a_held_edge_index_edited_in_place_is_not_matched():
    ei = edge_index()
    Graph.coerce(ei.clone(), N)
    held = ei.clone()
    graph = Graph.coerce(held, N)                    # held for comparison
    held[0, 0] = (held[0, 0] + 1) % N                # its graph no longer describes it
    assert Graph.coerce(held.clone(), N) is not graph


def test_an_edge_index_served_a_held_graph_is_not_served_it_after_the_holder_is_edited():
    """A graph taken by contents reads the memory of the input it was built from: once that
    input is edited in place, the borrower rebuilds. A SAGEConv on the borrower, whose
    first gradient call builds a layout from the graph's (edited) endpoints, gave outputs
    0.56 and gradients 1.19 off PyG's."""
    torch.manual_seed(0)
    ours, ref = gnn.SAGEConv(4, 3).double(), pyg.SAGEConv(4, 3).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, 4, dtype=torch.float64)
    ei = edge_index()
    with torch.no_grad():
        ours(x, ei.clone())
        lender, borrower = ei.clone(), ei.clone()
        ours(x, lender)                           # held for comparison
        ours(x, borrower)                         # served the lender's graph
    lender[0, :10] = 0
    for edges in (borrower, lender):
        assert_same_outputs_and_grads(ours, ref, lambda h: ours(h, edges), lambda h: ref(h, edges), x)


def test_pyg_layers_deriving_an_edge_index_per_call_stay_right_when_it_changes():
    """gnnfuse's ClusterGCNConv (PyG's forward, which self-loops its input on every call)
    against PyG's over calls with the same edges, then other edges of the same count."""
    torch.manual_seed(0)
    ours, ref = gnn.ClusterGCNConv(4, 3).double(), pyg.ClusterGCNConv(4, 3).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, 4, dtype=torch.float64)
    ei = edge_index()
    other = ei.clone()
    other[1] = (other[1] + 3) % N
    for edges in (ei, ei, ei.clone(), ei.clone(), other, other.clone(), ei.clone()):
        torch.testing.assert_close(ours(x, edges), ref(x, edges))


def test_a_sparse_adjacency_of_another_size_is_never_served_a_held_graph():
    """A sparse adj_t's index and value tensors do not hold its size: two with equal
    indices and different sizes are different graphs (the bigger has an isolated vertex)."""
    rows = edge_index()
    for size in (N, N, N + 1):
        adj = torch.sparse_coo_tensor(rows.flip(0), torch.ones(rows.shape[1]), (size, size))
        assert Graph.coerce(adj).num_nodes == size


def test_threads_coercing_their_own_edge_indexes_never_fail():
    """Eight threads, three edge_index tensors each (more than `CAPACITY` in all), the
    interpreter switching threads as often as it can: another thread's eviction between
    a hit's lookup and its move_to_end raised KeyError out of Graph.coerce (in 3 of 4
    such rounds before the cache took a lock). A race: the test can miss it, never
    report one falsely."""
    errors = []
    inputs = [[torch.randint(0, N, (2, 30), generator=torch.Generator().manual_seed(8 * k + j)) for j in range(3)]
              for k in range(8)]

    def work(mine: list[torch.Tensor]) -> None:
        try:
            for step in range(1500):
                t = mine[step % 3]
                assert Graph.coerce(t, N).num_edges == 30
                if step % 50 == 0:
                    Graph.coerce(t.clone(), N)
        except Exception as exc:        # noqa: BLE001 -- reported below
            errors.append(repr(exc))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(4):
            threads = [threading.Thread(target=work, args=(mine,)) for mine in inputs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


def test_an_int32_edge_index_swapped_through_data_keeps_its_old_address_taken():
    """A graph copies an int32 input, so the cache entry held nothing of its memory: after
    ``ei.data = new`` the allocator could hand a later tensor the freed address, and a
    stamp of equal version, address and shape served the old graph (1.9 off PyG's SAGE in
    a plain script, where the block came back within 40 allocations). The entry keeps
    the storages it stamped alive, so that address cannot come back while it lives."""
    sage, ref = gnn.SAGEConv(4, 3).double(), pyg.SAGEConv(4, 3).double()
    ref.load_state_dict(sage.state_dict())
    x = torch.randn(N, 4, dtype=torch.float64)
    gen = torch.Generator().manual_seed(11)
    ei = torch.randint(0, N, (2, 40), generator=gen, dtype=torch.int32)
    first = ei.data_ptr()
    sage(x, ei)
    ei.data = torch.randint(0, N, (2, 40), generator=gen, dtype=torch.int32)
    pinned = [storage.data_ptr() for entry in index_cache._ENTRIES.values() if len(entry) > 3 for storage in entry[3]]
    assert first in pinned
    torch.testing.assert_close(sage(x, ei), ref(x, ei.long()))


def test_a_tensor_freed_while_the_interpreter_tears_the_module_down_is_forgotten_quietly():
    """At exit the module's globals are cleared in any order: with the lock still there
    and the entries already None, a freed edge_index's weakref callback printed
    "AttributeError: 'NoneType' object has no attribute 'get'" as the process ended."""
    kept = index_cache._ENTRIES
    index_cache._ENTRIES = None
    try:
        index_cache._forget(0, weakref.ref(torch.empty(0)))
    finally:
        index_cache._ENTRIES = kept     # before the autouse fixture clears the tables


def test_a_view_at_a_remembered_tensors_address_with_other_strides_is_not_its_prefix():
    """A remembered ``edge_index``'s column prefixes are served by root, address and
    strides: ``ei.view(-1)[:6].view(2, 3)`` starts where ``ei[:, :3]`` does, with two rows
    of three, but its targets are ``ei[0, 3:]``. Matched without its strides it was served
    the prefix's graph (targets 1, 2, 3 where it holds 3, 4, 0)."""
    ei = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])
    index_cache.remember_prefixes(ei, {(3, 5): lambda: Graph.from_edge_index(ei[:, :3].clone(), 5)})
    assert Graph.coerce(ei.narrow(1, 0, 3), 5).dst.tolist() == [1, 2, 3]
    view = ei.view(-1)[:6].view(2, 3)
    graph = Graph.coerce(view, 5)
    assert (graph.src.tolist(), graph.dst.tolist()) == (view[0].tolist(), view[1].tolist())
