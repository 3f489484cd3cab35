"""An ``edge_index`` written in place between a layer's forward and its backward.

The `Graph` shares a contiguous int64 ``edge_index``'s memory, and a backward builds the
layouts it walks (the reverse CSR) when it runs: after ``edge_index[1, :8] = ...`` (an
index buffer refilled for the next batch before ``loss.backward()``) the gradients mixed
the two graphs, silently -- NaN for a max. torch refuses a tensor saved for backward and
then modified; PyG's layers that save ``edge_index`` do. gnnfuse refuses it too (found by
differential fuzzing of what users do between calls)."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg

import gnnfuse
from gnnfuse import Graph, nn as gnn
from gnnfuse.graph import GraphModifiedError, clear_index_cache
from gnnfuse.loader import NeighborLoader

N, F = 10, 4


def _graph() -> torch.Tensor:
    return torch.randint(0, N, (2, 30), generator=torch.Generator().manual_seed(0))


LAYERS = {
    "sage": lambda: gnn.SAGEConv(F, 3),
    "sage-max": lambda: gnn.SAGEConv(F, 3, aggr="max"),
    "gin": lambda: gnn.GINConv(torch.nn.Linear(F, 3)),
    "gcn": lambda: gnn.GCNConv(F, 3),
    "gat": lambda: gnn.GATConv(F, 3, heads=2),
    "appnp": lambda: gnn.APPNP(K=2, alpha=0.1),
}


def _wrapped(ei: torch.Tensor):
    """PyG's ``EdgeIndex`` around ``ei``: a write through it moves its own version counter only."""
    from torch_geometric import EdgeIndex
    return EdgeIndex(ei, sparse_size=(N, N))


@pytest.mark.parametrize("wrap", [False, True], ids=["tensor", "EdgeIndex"])
@pytest.mark.parametrize("name", LAYERS)
def test_an_edit_before_backward_is_refused_or_harmless(name, wrap, backend, device):
    """Each layer raises, or (where its backward reads only layouts built in the
    forward, on a copy such as GCN's self-looped graph) returns the forward graph's
    gradient; never a gradient of some other graph."""
    torch.manual_seed(0)
    layer = LAYERS[name]().double().to(device)
    x0 = torch.randn(N, F, dtype=torch.float64, device=device)
    probe = None

    def grad(edit: bool):
        nonlocal probe
        ei = _graph().to(device)
        ei = _wrapped(ei) if wrap else ei
        x = x0.clone().requires_grad_()
        out = layer(x, ei)
        probe = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1)).to(device)
        loss = (out * probe).sum()
        if edit:
            ei[1, :8] = torch.arange(8, device=device) + 1
        loss.backward()
        return x.grad

    clean = grad(edit=False)
    try:
        edited = grad(edit=True)
    except RuntimeError as error:
        assert "modified by an in-place operation" in str(error) and "backward" in str(error)
    else:
        torch.testing.assert_close(edited, clean, rtol=1e-9, atol=1e-12)


def test_sage_refuses_as_pyg_does():
    torch.manual_seed(0)
    ours, ref = gnn.SAGEConv(F, 3).double(), pyg.SAGEConv(F, 3).double()
    ours.load_state_dict(ref.state_dict())
    # (an earlier test's equal edge_index would lend its graph over a private copy, which
    # the edit does not reach: README, "An edge_index gnnfuse had to copy")
    clear_index_cache()
    for layer in (ref, ours):
        ei = _graph()
        loss = layer(torch.randn(N, F, dtype=torch.float64, requires_grad=True), ei).sum()
        ei[0, 0] = (ei[0, 0] + 1) % N
        with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
            loss.backward()


# --- an edit between calls ---------------------------------------------------------------
@gnnfuse.vertex
def _neighbour_sum(v):
    return sum([u.h for u in v.innbs])


def _edited_graphs(device: str):
    """(what, graph, its in-place edit, the tensor the refusal names) for each kind of
    graph that keeps a caller's index tensors: the edit leaves every id in range."""
    def ei():
        return torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 0, 2, 4]], device=device)
    plain = ei()
    src, dst = ei().unbind(0)
    src, dst = src.clone(), dst.clone()
    bsrc, bdst = torch.tensor([0, 1, 2, 3, 4, 5], device=device), torch.tensor([0, 0, 1, 1, 2, 2], device=device)
    etype, ntype, looped = torch.tensor([0, 1, 0, 1, 0, 1, 0], device=device), torch.zeros(5, dtype=torch.long,
                                                                                           device=device), ei()
    blocks = NeighborLoader(Graph.from_edge_index(ei().cpu(), 5).to(device), [3], batch_size=2, prefetch=0)
    block = next(iter(blocks)).blocks[0].graph

    def setter(tensor, value):
        return lambda: tensor.__setitem__(0, value)
    return [
        ("edge_index", Graph.from_edge_index(plain, 5), lambda: plain.__setitem__((1, slice(0, 4)), 0), "edge_index"),
        ("src", Graph(src, dst, 5), setter(src, 3), "src"),
        ("bipartite", Graph.bipartite(bsrc, bdst, 6, 3), setter(bdst, 2), "dst"),
        ("edge_type", Graph(*ei().unbind(0), 5, edge_type=etype), setter(etype, 1), "edge_type"),
        ("node_type", Graph(*ei().unbind(0), 5, node_type=ntype, num_node_types=2), setter(ntype, 1), "node_type"),
        ("self-looped", Graph.from_edge_index(looped, 5).remove_self_loops().add_self_loops(),
         lambda: looped.__setitem__((0, 0), 3), "edge_index"),
        ("loader block", block, setter(block.src, int(block.src[-1])), "src"),
    ]


@pytest.mark.parametrize("kind", range(7), ids=["edge_index", "src", "bipartite", "edge_type", "node_type",
                                                "self-looped", "loader-block"])
@pytest.mark.parametrize("other_backend", [None, "cpu"], ids=["", "cpu"])
def test_a_graph_edited_in_place_is_refused_at_its_next_use(kind, other_backend, backend, device, monkeypatch):
    """A `Graph` keeps a contiguous int64 index tensor without copying. Written in place
    between two calls, the CPU and Triton backends ran on the CSR built for the old edges
    (a SAGE sum gave 0.91 off a fresh graph's), while the reference saw the new ones: now
    every backend refuses the graph, naming the tensor, and so does a layout read."""
    if other_backend is not None:
        if backend != "reference":
            pytest.skip("one run per backend")
        pytest.importorskip("numba")
        monkeypatch.setenv("GNNFUSE_BACKEND", other_backend)
    what, graph, edit, name = _edited_graphs(device)[kind]
    h = torch.randn(graph.num_src_nodes, 3, dtype=torch.float64, device=device)
    for _ in range(3):      # the third inference call on one graph runs a prepared call (triton)
        _neighbour_sum(graph, {"h": h})
    edit()
    with pytest.raises(GraphModifiedError, match=f"the graph's {name} tensor .* modified|graph's {name} tensor"):
        _neighbour_sum(graph, {"h": h})
    with pytest.raises(GraphModifiedError):
        graph.csr()


def test_copies_of_an_unedited_graph_run_and_an_edited_one_is_not_copied():
    """Pickling (a loader worker's batch), deep copies and `Graph.to` give graphs sealed
    on their own tensors; an edited graph is refused there too rather than carried on."""
    import copy
    import pickle
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    graph = Graph.from_edge_index(ei, 4)
    h = torch.randn(4, 2, dtype=torch.float64)
    want = _neighbour_sum(graph, {"h": h})
    for twin in (pickle.loads(pickle.dumps(graph)), copy.deepcopy(graph), copy.copy(graph)):
        torch.testing.assert_close(_neighbour_sum(twin, {"h": h}), want)
    ei[0, 0] = 2
    for use in (lambda: pickle.dumps(graph), lambda: copy.copy(graph), lambda: graph.to("meta"),
                lambda: graph.remove_self_loops()):
        with pytest.raises(GraphModifiedError, match="edge_index"):
            use()


@pytest.mark.parametrize("write", [lambda ei: ei.detach()[1, 0].fill_(3), lambda ei: ei.view(-1)[4].fill_(3),
                                   lambda ei: ei[1].copy_(torch.tensor([3, 2, 3, 0]))],
                         ids=["detach", "view", "row-copy"])
def test_writes_through_aliases_that_share_the_version_counter_are_refused(write):
    """The README's line between what the seal sees and what it cannot (``.data``,
    ``.numpy()``, DLPack: aliases with no shared version counter): a ``detach()`` or a
    view shares the tensor's counter, so a write through it is refused."""
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    graph = Graph.from_edge_index(ei, 4)
    graph.csr()
    write(ei)
    with pytest.raises(GraphModifiedError, match="edge_index"):
        graph.csr()


def test_a_write_through_an_edge_index_wrapper_is_refused_between_calls():
    """PyG's ``EdgeIndex`` moves its own version counter only: the graph watches it too."""
    ei = _wrapped(_graph())
    graph = Graph.coerce(ei)
    h = torch.randn(N, 2, dtype=torch.float64)
    _neighbour_sum(graph, {"h": h})
    ei[1, :8] = torch.arange(8) + 1
    with pytest.raises(GraphModifiedError, match="EdgeIndex"):
        _neighbour_sum(graph, {"h": h})


def test_a_graph_of_inference_tensors_trains():
    """Inference tensors have no version counter: a graph built inside
    ``torch.inference_mode()`` failed every training call ("Inference tensors do not
    track version counter") when the forward recorded its index tensors' versions. They
    are left out of the seal (torch refuses their in-place edits outside that mode)."""
    with torch.inference_mode():
        graph = Graph.from_edge_index(_graph(), N)
    layer = gnn.SAGEConv(F, 3).double()
    x = torch.randn(N, F, dtype=torch.float64, requires_grad=True)
    layer(x, graph).sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("learnt", [False, True])
@pytest.mark.parametrize("name", ["graphconv", "tag"])
def test_weights_of_a_csr_adj_t_edited_before_backward_leave_the_forwards_gradients(name, learnt):
    """A CSR ``adj_t``'s COO form holds the CSR's values under a version counter of its
    own, so an edit through ``adj_t.values()`` after the forward went unseen and the
    backward read the edited weights (GraphConv's x.grad 2.5 off, TAG's weight gradient
    1.6 off); PyG refuses the edit. The weights are copied now: the forward's gradients."""
    torch.manual_seed(0)
    layer = {"graphconv": lambda: gnn.GraphConv(F, 3), "tag": lambda: gnn.TAGConv(F, 3, K=2)}[name]().double()
    g = torch.Generator().manual_seed(1)
    ei = torch.unique(_graph(), dim=1)
    weights = torch.rand(ei.shape[1], dtype=torch.float64, generator=g) + 0.5
    x0 = torch.randn(N, F, dtype=torch.float64, generator=g)

    def gradients(edit: bool) -> list[torch.Tensor]:
        x = x0.clone().requires_grad_()
        values = weights.clone().requires_grad_(learnt)
        adj_t = torch.sparse_coo_tensor(ei.flip(0), values, (N, N)).coalesce().to_sparse_csr()
        layer.zero_grad()
        out = layer(x, adj_t)
        if edit:
            with torch.no_grad():
                adj_t.values().mul_(3)
        out.square().sum().backward()
        return [x.grad, *(values.grad for _ in range(learnt)), *(p.grad for p in layer.parameters())]
    for got, expected in zip(gradients(True), gradients(False)):
        torch.testing.assert_close(got, expected)
