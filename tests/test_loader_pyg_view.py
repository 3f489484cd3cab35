"""PyG's idiom on gnnfuse's layers, ``model(batch.x, batch.edge_index)``: the batch's
``edge_index`` comes with its `Graph` (`loader.pyg_batch.subgraph_graph`), remembered for
it, so a layer finds the graph instead of making one in the step (a read-back of its ids'
range and a sort); once a step has read an ``edge_index``, the loader builds that graph and
its layouts ahead in its own thread (`PygViewDemand`).

Oracles: the graph a layer would make of the same ``edge_index`` (`Graph.from_edge_index`
of a copy: CSR, degrees, outputs, gradients), and `HostSyncCounter` for the reads."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import gnnfuse
import gnnfuse.nn as gnn
from gnnfuse.bench.host_syncs import HostSyncCounter
from gnnfuse.loader import NeighborLoader
from gnnfuse.loader.pyg_batch import subgraph_graph
from graph_strategies import graphs
from layout_builds import STEP_BUILDS, watch_builds

RUNS = settings(max_examples=25, deadline=None, derandomize=True, database=None)


def _loader(graph: gnnfuse.Graph, fanouts, batch_size: int, device: str = "cpu", **kwargs) -> NeighborLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_nodes, 8, generator=gen, dtype=torch.float64).to(device)
    y = torch.randint(0, 3, (graph.num_nodes,), generator=gen).to(device)
    torch.manual_seed(0)
    return NeighborLoader(graph.to(device), fanouts, batch_size=batch_size, shuffle=True, x=x, y=y, prefetch=0,
                          **kwargs)


def _random_graph(num_nodes: int = 50, num_edges: int = 400, seed: int = 0) -> gnnfuse.Graph:
    gen = torch.Generator().manual_seed(seed)
    return gnnfuse.Graph(torch.randint(0, num_nodes, (num_edges,), generator=gen),
                         torch.randint(0, num_nodes, (num_edges,), generator=gen), num_nodes)


def _assert_same_step(ours, theirs, batch, rtol: float, **kwargs) -> None:
    """A training step's seed outputs and every gradient of ``ours`` and ``theirs``,
    each a (model, edge_index) run on ``batch.x`` (with ``kwargs``), are equal."""
    results = []
    for net, edge_index in (ours, theirs):
        net.zero_grad()
        out = net(batch.x, edge_index, **kwargs)[:batch.batch_size]
        F.cross_entropy(out, batch.y).backward()
        results.append((out.detach(), [p.grad.clone() for p in net.parameters()]))
    (out, grads), (want, want_grads) = results
    torch.testing.assert_close(out, want, rtol=rtol, atol=1e-12)
    for grad, want_grad in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(grad, want_grad, rtol=rtol, atol=1e-12)


@RUNS
@given(graphs(max_nodes=10, max_edges=40, hub_degrees=st.sampled_from([0, 12])),
       st.lists(st.sampled_from([-1, 0, 1, 2, 5]), min_size=1, max_size=3), st.integers(1, 4))
def test_the_subgraphs_graph_is_the_one_a_layer_would_make_of_its_edge_index(case, fanouts, batch_size):
    graph = gnnfuse.Graph.from_edge_index(case.edge_index, case.num_nodes)
    for batch in _loader(graph, fanouts, batch_size):
        made = gnnfuse.Graph.from_edge_index(batch.edge_index.clone(), batch.num_nodes)
        built = subgraph_graph(batch.blocks, batch.edge_index, batch.num_sampled_edges)
        assert built.num_nodes == made.num_nodes and not built.is_bipartite
        for ours, theirs in zip(built.csr(), made.csr()):
            assert torch.equal(ours.long(), theirs.long())
        assert torch.equal(built.in_degrees(), made.in_degrees())
        assert torch.equal(built.out_degrees(), made.out_degrees())


def test_a_layer_given_the_batchs_edge_index_runs_on_its_graph():
    batch = next(iter(_loader(_random_graph(), [4, 3], 6)))
    remembered = gnnfuse.Graph.coerce(batch.edge_index, batch.num_nodes)
    assert remembered is gnnfuse.Graph.coerce(batch.edge_index, batch.num_nodes)
    assert torch.equal(remembered.src, batch.edge_index[0]) and torch.equal(remembered.dst, batch.edge_index[1])
    # another vertex count is another graph (a layer given fewer rows of x), made as before
    assert gnnfuse.Graph.coerce(batch.edge_index, batch.num_nodes + 1) is not remembered


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_outputs_and_gradients_on_the_batchs_graph_are_those_on_a_graph_made_anew(model, backend, device):
    """Outputs and every gradient, float64: the remembered graph against the one a layer
    makes of a copy of the same ``edge_index`` (a new tensor, so nothing remembered)."""
    loader = _loader(_random_graph(), [4, 3], 6, device)
    torch.manual_seed(0)
    net = (gnn.GraphSAGE(8, 8, 2, 3) if model == "sage" else gnn.GAT(8, 4, 2, 3, heads=2)).double().to(device)
    for index, batch in zip(range(2), loader):     # the first step shows the loader the idiom: then built ahead
        assert (batch.pyg_view is not None) == (index > 0)
        _assert_same_step((net, batch.edge_index), (net, batch.edge_index.clone()), batch, rtol=1e-10)


def test_the_loader_builds_the_view_ahead_only_once_a_step_has_read_an_edge_index():
    batches = iter(_loader(_random_graph(), [4, 3], 6))
    first = next(batches)
    assert first.pyg_view is None, "the view was built for a loop that may read only blocks"
    assert next(batches).pyg_view is None
    first.edge_index
    later = next(batches)
    assert later.pyg_view is not None
    assert later.edge_index is later.pyg_view.edge_index
    assert gnnfuse.Graph.coerce(later.edge_index, later.num_nodes) is later.pyg_view.graph


def test_an_edge_index_edited_in_place_gets_a_graph_of_its_new_edges():
    """The remembered graph serves its ``edge_index`` only while it is unchanged
    (`index_cache`): a user's in-place edit between calls makes a new graph."""
    batch = next(iter(_loader(_random_graph(), [4, 3], 6)))
    edge_index = batch.edge_index
    before = gnnfuse.Graph.coerce(edge_index, batch.num_nodes)
    edge_index[0] = edge_index[0].flip(0)
    after = gnnfuse.Graph.coerce(edge_index, batch.num_nodes)
    assert after is not before
    made = gnnfuse.Graph.from_edge_index(edge_index.clone(), batch.num_nodes)
    assert torch.equal(after.in_degrees(), made.in_degrees()) and torch.equal(after.out_degrees(),
                                                                               made.out_degrees())


@pytest.mark.parametrize("kind", ["sage", "gat"])
@pytest.mark.parametrize("schedule", ["auto", "csr"])
def test_an_idiom_step_on_a_view_built_ahead_reads_nothing_back_nor_builds_a_layout(schedule, kind, monkeypatch):
    """What `test_block_syncs` asks of a step on blocks, asked of PyG's idiom on the
    Triton backend: once the loader has seen the idiom, the step's forward and backward
    issue no syncing op and find every layout of the batch's graph built, but for the
    per-graph values the reference executor keeps and two small sync-free tables."""
    from gnnfuse.backend.triton import executor
    from oracle_check import device_for
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    device = device_for("triton")
    loader = _loader(_random_graph(), [4, 3], 6, device)
    torch.manual_seed(0)
    net = (gnn.GraphSAGE(8, 8, 2, 3) if kind == "sage" else gnn.GAT(8, 4, 2, 3, heads=2)).double().to(device)
    batches = iter(loader)
    for _ in range(2):        # compiles, shows the loader the idiom, then which side the step walks
        batch = next(batches)
        F.cross_entropy(net(batch.x, batch.edge_index)[:batch.batch_size], batch.y).backward()
    batch = next(batches)
    assert batch.pyg_view is not None
    counter = HostSyncCounter()
    launch = executor.launch

    def paused_launch(*args, **kwargs):     # the interpreter runs kernels on the host
        with counter.paused():
            launch(*args, **kwargs)
    monkeypatch.setattr(executor, "launch", paused_launch)
    built = watch_builds(monkeypatch)
    with counter:
        F.cross_entropy(net(batch.x, batch.edge_index)[:batch.batch_size], batch.y).backward()
    assert counter.ops, "the counter saw no op"
    assert not counter.syncs, f"host syncs: {dict(counter.syncs)}"
    assert built, "the step asked its graph for nothing: the watch saw no program run"
    assert all(key.startswith(STEP_BUILDS) for key in built), built


def test_a_step_on_the_first_batches_makes_its_graph_without_a_read_back():
    """Before the loader knows the idiom, the step makes the batch's graph itself, from
    the blocks: no id range read, no sort (the degree counts of a CPU ``bincount`` aside,
    a scatter on a GPU, are the blocks' already)."""
    batch = next(iter(_loader(_random_graph(), [4, 3], 6)))
    with HostSyncCounter() as counter:
        graph = gnnfuse.Graph.coerce(batch.edge_index, batch.num_nodes)
        graph.csr(), graph.in_degrees(), graph.out_degrees()
    assert counter.ops and not counter.syncs, dict(counter.syncs)
    assert not any("sort" in op for op in counter.ops), dict(counter.ops)


def _trimmed_views(batch):
    """The ``edge_index`` views PyG's ``trim_to_layer`` hands layers 1, 2, ... (its own code)."""
    from torch_geometric.utils import trim_to_layer
    x, edge_index, views = batch.x, batch.edge_index, []
    for layer in range(1, len(batch.num_sampled_edges)):
        x, edge_index, _ = trim_to_layer(layer, batch.num_sampled_nodes, batch.num_sampled_edges, x, edge_index)
        views.append((x.shape[0], edge_index))
    return views


@RUNS
@given(graphs(max_nodes=10, max_edges=40, hub_degrees=st.sampled_from([0, 12])),
       st.lists(st.sampled_from([-1, 0, 1, 2, 5]), min_size=2, max_size=3), st.integers(1, 4))
def test_each_trimmed_edge_index_gets_the_graph_a_layer_would_make_of_it(case, fanouts, batch_size):
    pytest.importorskip("torch_geometric")
    graph = gnnfuse.Graph.from_edge_index(case.edge_index, case.num_nodes)
    for batch in _loader(graph, fanouts, batch_size):
        for num_nodes, view in _trimmed_views(batch):
            served = gnnfuse.Graph.coerce(view, num_nodes)
            made = gnnfuse.Graph.from_edge_index(view.clone(), num_nodes)
            assert served is not made and served.num_nodes == made.num_nodes == num_nodes
            assert torch.equal(served.src, made.src) and torch.equal(served.dst, made.dst)
            for ours, theirs in zip(served.csr(), made.csr()):
                assert torch.equal(ours.long(), theirs.long())
            assert torch.equal(served.in_degrees(), made.in_degrees())
            assert torch.equal(served.out_degrees(), made.out_degrees())


def test_a_trimmed_view_is_served_only_as_the_prefix_it_is():
    """Another slice of the same memory (not a prefix of the columns, other rows, another
    vertex count), or the tensor edited in place, gets a graph made for it."""
    pytest.importorskip("torch_geometric")
    batch = next(iter(_loader(_random_graph(), [4, 3, 2], 6)))
    (nodes, view), _ = _trimmed_views(batch)
    served = gnnfuse.Graph.coerce(view, nodes)
    assert served is gnnfuse.Graph.coerce(batch.edge_index.narrow(1, 0, view.shape[1]), nodes)
    assert gnnfuse.Graph.coerce(batch.edge_index.narrow(1, 1, view.shape[1]), nodes) is not served
    assert gnnfuse.Graph.coerce(batch.edge_index.narrow(1, 0, view.shape[1]), nodes + 1) is not served
    assert gnnfuse.Graph.coerce(batch.edge_index[:, :view.shape[1] - 1], nodes) is not served
    edge_index = batch.edge_index
    edge_index[0, 0] = edge_index[0, 0].item()          # an in-place write, same values: a new version
    again = gnnfuse.Graph.coerce(edge_index.narrow(1, 0, view.shape[1]), nodes)
    assert again is not served


@pytest.mark.parametrize("model", ["GraphSAGE", "GCN", "GAT"])
def test_pygs_trimmed_models_on_gnnfuses_layers_give_pygs_outputs(model, backend, device):
    """``gnnfuse.nn.<model>(..., num_sampled_nodes_per_hop=, num_sampled_edges_per_hop=)``
    (PyG's ``trim_to_layer``) on the served prefix graphs against PyG's own model from the
    same weights, trimmed too: the seeds' outputs and every gradient, float64, before and
    once the loader builds the prefixes ahead. (A trimmed GCN is not the untrimmed one: a
    kept vertex of the last hop has lost its in-edges, and with them its degree.)"""
    tg = pytest.importorskip("torch_geometric.nn")
    loader = _loader(_random_graph(), [4, 3, 2], 6, device)
    torch.manual_seed(0)
    ours = getattr(gnn, model)(8, 8, num_layers=3, out_channels=3).double().to(device)
    theirs = getattr(tg, model)(8, 8, num_layers=3, out_channels=3).double().to(device)
    theirs.load_state_dict(ours.state_dict())
    for index, batch in zip(range(3), loader):     # the first step shows the loader the idiom: then built ahead
        assert (batch.pyg_view is not None and len(batch.pyg_view.trimmed) == 2) == (index > 0)
        _assert_same_step((ours, batch.edge_index), (theirs, batch.edge_index.clone()), batch, rtol=1e-9,
                          num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                          num_sampled_edges_per_hop=batch.num_sampled_edges)


def test_a_trimmed_step_on_views_built_ahead_reads_nothing_back(monkeypatch):
    pytest.importorskip("torch_geometric")
    loader = _loader(_random_graph(), [4, 3, 2], 6)
    torch.manual_seed(0)
    net = gnn.GraphSAGE(8, 8, num_layers=3, out_channels=3).double()
    batches = iter(loader)

    def step(batch):
        out = net(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                  num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
        F.cross_entropy(out, batch.y).backward()
    for _ in range(3):
        step(next(batches))
    batch = next(batches)
    assert len(batch.pyg_view.trimmed) == 2
    with HostSyncCounter() as counter:
        step(batch)
    assert counter.ops and not counter.syncs, dict(counter.syncs)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_worker_processes_build_the_view_once_the_training_process_has_seen_the_idiom(device):
    """A worker's copy of the maker sees no step: what the training process's maker
    learnt reaches the workers with the next epoch's jobs (`BatchMaker.learnt`). The
    view crosses the processes (its tensors packed; CUDA IPC on a GPU), and a trimmed
    step on it reads nothing back and gives the outputs of a graph made anew."""
    pytest.importorskip("torch_geometric")
    loader = _loader(_random_graph(), [4, 3, 2], 6, device, num_workers=1)
    torch.manual_seed(0)
    net = gnn.GraphSAGE(8, 8, num_layers=3, out_channels=3).double().to(device)

    def outputs(batch, edge_index):
        return net(batch.x, edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                   num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
    try:
        first = [batch for batch in loader]
        assert all(batch.pyg_view is None for batch in first)
        outputs(first[0], first[0].edge_index)            # the idiom, trimmed, in the training process
        second = [batch for batch in loader]
    finally:
        loader.close()
    assert all(batch.pyg_view is not None and len(batch.pyg_view.trimmed) == 2 for batch in second)
    batch = second[0]
    with HostSyncCounter() as counter:
        out = outputs(batch, batch.edge_index)
    assert counter.ops and not counter.syncs, dict(counter.syncs)
    torch.testing.assert_close(out, outputs(batch, batch.edge_index.clone()), rtol=1e-12, atol=1e-12)


def test_a_batchs_edge_index_and_graphs_are_freed_with_the_batch():
    """The index cache keeps a remembered graph while its ``edge_index`` lives, so the
    graph (and a prefix's builder) must not hold ``edge_index`` itself: graphs over views
    of it kept every batch's tensors alive until the cache evicted them (64 batches)."""
    import gc
    import weakref
    pytest.importorskip("torch_geometric")
    loader = _loader(_random_graph(), [4, 3, 2], 6)
    net = gnn.GraphSAGE(8, 8, num_layers=3, out_channels=3).double()
    freed = []
    for _, batch in zip(range(4), loader):      # the later batches come with views built ahead
        net(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
            num_sampled_edges_per_hop=batch.num_sampled_edges)
        freed.append(weakref.ref(batch.edge_index))
        del batch
    gc.collect()
    assert not any(ref() is not None for ref in freed)
