"""PyG code on gnnfuse's loader batches: ``model(batch.x, batch.edge_index)[:batch.batch_size]``
with PyG's semantics (`loader.pyg_batch`).

Oracles: with full neighbourhoods the batch is PyG's, edge for edge, against a direct
re-implementation of PyG's sampler (pyg-lib's ``neighbor_sample``, which PyG's own
loader needs and this machine lacks): each hop expands the vertices the hop before it
added, in order, taking their in-edges in the edge list's order, numbering new sources
by first appearance. PyG models then give the full graph's outputs at the seeds. With
fanouts, the subgraph's structure is checked against the graph and the blocks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import gnnfuse
from gnnfuse.bench.host_syncs import HostSyncCounter
from gnnfuse.loader import NeighborLoader
from graph_strategies import graphs

RUNS = settings(max_examples=25, deadline=None, derandomize=True, database=None)


def pyg_data(edge_index: torch.Tensor, num_nodes: int, seed: int = 0, channels: int = 3):
    from torch_geometric.data import Data
    gen = torch.Generator().manual_seed(seed)
    num_edges = edge_index.shape[1]
    return Data(x=torch.randn(num_nodes, channels, dtype=torch.float64, generator=gen),
                y=torch.randint(0, 3, (num_nodes,), generator=gen), edge_index=edge_index,
                edge_attr=torch.randn(num_edges, 2, generator=gen), edge_weight=torch.rand(num_edges, generator=gen),
                num_nodes=num_nodes)


def pyg_full_subgraph(edge_index: torch.Tensor, seeds: list[int], hops: int | list[int]):
    """PyG's batch for ``seeds`` with ``num_neighbors=[-1] * hops`` (or ``hops`` a list of
    -1 and 0 entries): (n_id, edge_index, e_id, num_sampled_nodes, num_sampled_edges)."""
    src, dst = edge_index.tolist()
    in_edges: dict[int, list[int]] = {}
    for e, v in enumerate(dst):
        in_edges.setdefault(v, []).append(e)
    nodes, local = list(seeds), {v: i for i, v in enumerate(seeds)}
    rows, cols, e_ids, counts_n, counts_e = [], [], [], [len(seeds)], []
    begin, end = 0, len(nodes)
    for fanout in [-1] * hops if isinstance(hops, int) else hops:
        for i in range(begin, end if fanout else begin):
            for e in in_edges.get(nodes[i], []):
                if src[e] not in local:
                    local[src[e]] = len(nodes)
                    nodes.append(src[e])
                rows.append(local[src[e]])
                cols.append(i)
                e_ids.append(e)
        counts_e.append(len(rows) - sum(counts_e))
        begin, end = end, len(nodes)
        counts_n.append(end - begin)
    return (torch.tensor(nodes), torch.tensor([rows, cols], dtype=torch.int64).reshape(2, -1),
            torch.tensor(e_ids, dtype=torch.int64), counts_n, counts_e)


def _batches(data, fanouts, batch_size, **kwargs):
    torch.manual_seed(0)
    return list(NeighborLoader(data, fanouts, batch_size=batch_size, shuffle=True, prefetch=0, **kwargs))


@RUNS
@given(graphs(max_nodes=8, max_edges=24, hub_degrees=st.sampled_from([0, 9])), st.integers(1, 3),
       st.integers(1, 4))
def test_full_neighbourhood_batches_are_pygs_subgraph_edge_for_edge(case, hops, batch_size):
    data = pyg_data(case.given, case.num_nodes)
    for batch in _batches(data, [-1] * hops, batch_size):
        n_id, edge_index, e_id, nodes, edges = pyg_full_subgraph(case.edge_index, batch.n_id[:batch.batch_size].tolist(),
                                                                 hops)
        assert torch.equal(batch.n_id, n_id)
        assert batch.edge_index.dtype == torch.int64 and torch.equal(batch.edge_index, edge_index)
        assert torch.equal(batch.e_id, e_id)
        assert torch.equal(batch.edge_attr, data.edge_attr[e_id])
        assert torch.equal(batch.edge_weight, data.edge_weight[e_id])
        assert batch.num_sampled_nodes == nodes and batch.num_sampled_edges == edges
        assert batch.num_nodes == n_id.numel() == batch.x.shape[0]
        assert torch.equal(batch.x, data.x[n_id])
        assert torch.equal(batch.y[:batch.batch_size], data.y[n_id[:batch.batch_size]])


def check_subgraph(batch, data, fanouts, replace):
    """PyG's subgraph structure of a sampled batch: every edge is a graph edge (global
    ids via ``n_id`` and ``e_id``); hop k's edges go into the vertices hop k - 1 added
    and are exactly its block's edges into those; each such vertex got
    ``min(deg, fanout)`` (or with replacement ``fanout``) in-edges and no others."""
    nodes, edges = batch.num_sampled_nodes, batch.num_sampled_edges
    assert sum(nodes) == batch.num_nodes == batch.n_id.numel() == batch.x.shape[0]
    assert len(nodes) == len(fanouts) + 1 and len(edges) == len(fanouts)
    edge_index = batch.edge_index
    assert edge_index.shape == (2, sum(edges))
    assert torch.equal(batch.n_id[edge_index], data.edge_index[:, batch.e_id])
    assert torch.equal(batch.edge_attr, data.edge_attr[batch.e_id])
    degree = torch.bincount(data.edge_index[1], minlength=data.num_nodes)
    level_end = torch.tensor(nodes).cumsum(0).tolist()
    hop_end = torch.tensor(edges).cumsum(0).tolist()
    for k, fanout in enumerate(fanouts):
        first, last = (level_end[k - 1] if k else 0), level_end[k]
        hop = edge_index[:, hop_end[k] - edges[k]:hop_end[k]]
        assert ((hop[1] >= first) & (hop[1] < last)).all()
        assert (hop[0] < level_end[k + 1]).all()
        block = batch.blocks[-1 - k].edge_index
        assert torch.equal(hop, block[:, block[1] >= first])
        got = torch.bincount(hop[1] - first, minlength=last - first)
        deg = degree[batch.n_id[first:last]]
        want = torch.where(deg > 0, fanout, 0) if replace else deg if fanout < 0 else deg.clamp(max=fanout)
        assert torch.equal(got, want)
    assert (edge_index[1] < level_end[len(fanouts) - 1]).all()     # the last level's vertices expand nothing
    if not replace:
        assert batch.e_id.unique().numel() == batch.e_id.numel()


@RUNS
@given(graphs(max_nodes=8, max_edges=24, hub_degrees=st.sampled_from([0, 9])),
       st.sampled_from([[2], [3, 2], [2, 1, 2], [-1, 2], [1, -1]]), st.booleans(), st.integers(1, 4))
def test_sampled_batches_are_pyg_subgraphs_of_the_graph(case, fanouts, replace, batch_size):
    data = pyg_data(case.given, case.num_nodes)
    data.edge_index = case.edge_index
    for batch in _batches(data, fanouts, batch_size, replace=replace):
        check_subgraph(batch, data, fanouts, replace)


def test_fused_hop_kernels_count_pygs_hops_too(monkeypatch):
    """The Triton hop kernels (here in Triton's interpreter) read back the same counts."""
    monkeypatch.setenv("GNNFUSE_FUSED_HOPS", "1")
    data = pyg_data(_power_law(40, 200), 40)
    for batch in _batches(data, [3, 2], 8)[:2]:
        check_subgraph(batch, data, [3, 2], False)


def _power_law(num_nodes: int, num_edges: int) -> torch.Tensor:
    """A skewed multigraph with self loops (vertex 0 a hub)."""
    from gnnfuse.data.synthetic import power_law_graph
    edge_index = power_law_graph(num_nodes, num_edges, 1, 2, seed=0).graph.edge_index
    loops = torch.arange(0, num_nodes, 7).repeat(2, 1)
    return torch.cat([edge_index, loops, edge_index[:, :5]], 1)


def _pyg_models(channels: int):
    from torch_geometric.nn import GCNConv, SAGEConv
    from torch_geometric.nn.models import GraphSAGE

    class Stack(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.convs = torch.nn.ModuleList([conv(channels, 8), conv(8, 3)])

        def forward(self, x, edge_index):
            return self.convs[1](self.convs[0](x, edge_index).relu(), edge_index)
    torch.manual_seed(0)
    return {"sage": Stack(SAGEConv).double(), "gcn": Stack(GCNConv).double(),
            "graphsage": GraphSAGE(channels, 8, num_layers=2, out_channels=3).double()}


@pytest.mark.parametrize("model", ["sage", "gcn", "graphsage"])
def test_pyg_models_on_full_neighbourhood_batches_give_the_full_graphs_seed_outputs(model):
    """The PyG idiom, its loss included. GCN normalises by each source's degree in the
    subgraph, complete only for vertices a hop expanded: a 2-layer GCN's seeds need
    three hops to be the full graph's (with two, PyG's own batch differs the same way)."""
    data = pyg_data(_power_law(40, 200), 40)
    net = _pyg_models(3)[model].eval()
    full = net(data.x, data.edge_index)
    hops = 3 if model == "gcn" else 2
    for batch in _batches(data, [-1] * hops, 7):
        out = net(batch.x, batch.edge_index)[:batch.batch_size]
        seeds = batch.n_id[:batch.batch_size]
        torch.testing.assert_close(out, full[seeds], rtol=1e-12, atol=1e-12)
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])
        torch.testing.assert_close(loss, F.cross_entropy(full[seeds], data.y[seeds]), rtol=1e-12, atol=1e-12)
        if batch.num_nodes > batch.batch_size:    # the whole output against the seeds' labels: refused, not wrong
            with pytest.raises(ValueError, match="batch_size"):
                F.cross_entropy(net(batch.x, batch.edge_index), batch.y)


def test_trim_to_layer_gives_the_same_seed_outputs_on_sampled_batches():
    """PyG's ``BasicGNN(..., num_sampled_nodes_per_hop=, num_sampled_edges_per_hop=)``
    drops the outer hops layer by layer: the seeds' outputs must not change, which holds
    only if each hop's vertices and edges come where the counts say."""
    data = pyg_data(_power_law(40, 200), 40)
    net = _pyg_models(3)["graphsage"].eval()
    for batch in _batches(data, [3, 2], 6):
        plain = net(batch.x, batch.edge_index)[:batch.batch_size]
        trimmed = net(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                      num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
        torch.testing.assert_close(trimmed, plain, rtol=1e-12, atol=1e-12)


def test_gcn_on_a_two_hop_batch_is_pygs_own_batch_result():
    data = pyg_data(_power_law(40, 200), 40)
    net = _pyg_models(3)["gcn"].eval()
    for batch in _batches(data, [-1, -1], 7):
        n_id, edge_index, *_ = pyg_full_subgraph(data.edge_index, batch.n_id[:batch.batch_size].tolist(), 2)
        torch.testing.assert_close(net(batch.x, batch.edge_index)[:batch.batch_size],
                                   net(data.x[n_id], edge_index)[:batch.batch_size], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", ["sage", "gcn"])
def test_gnnfuse_layers_run_the_pyg_idiom_on_both_backends(layer, backend, device):
    data = pyg_data(_power_law(30, 150), 30)
    conv = {"sage": gnnfuse.nn.SAGEConv, "gcn": gnnfuse.nn.GCNConv}[layer]
    torch.manual_seed(0)
    first, second = conv(3, 6).double().to(device), conv(6, 3).double().to(device)
    full = second(first(data.x.to(device), data.edge_index.to(device)).relu(), data.edge_index.to(device))
    for batch in _batches(data, [-1] * (3 if layer == "gcn" else 2), 8, device=device)[:2]:
        out = second(first(batch.x, batch.edge_index).relu(), batch.edge_index)[:batch.batch_size]
        torch.testing.assert_close(out, full[batch.n_id[:batch.batch_size]], rtol=1e-9, atol=1e-12)


def test_pygs_attributes_read_nothing_back_from_the_device():
    """They are cut from the blocks by counts the sampler read back with its own."""
    data = pyg_data(_power_law(40, 200), 40)
    batch = _batches(data, [3, 2], 8)[0]
    with HostSyncCounter() as counter:
        for name in ("edge_index", "e_id", "edge_attr", "edge_weight", "num_sampled_nodes", "num_sampled_edges",
                     "num_nodes"):
            getattr(batch, name)
    assert counter.ops, "the counter saw no op at all"
    assert not counter.syncs, f"host syncs: {dict(counter.syncs)}"
    assert batch.edge_index is batch.edge_index        # built once


def test_a_loader_without_edge_tables_has_no_edge_ids_to_give():
    data = pyg_data(_power_law(20, 60), 20)
    graph = gnnfuse.Graph.from_edge_index(data.edge_index, 20)
    batch = next(iter(NeighborLoader(graph, [2], batch_size=4, x=data.x, prefetch=0)))
    assert batch.edge_attr is None and batch.edge_weight is None       # as PyG's Data without them
    assert batch.edge_index.shape == (2, batch.num_sampled_edges[0])
    with pytest.raises(AttributeError, match="edge ids only with edge tables"):
        _ = batch.e_id


@pytest.mark.parametrize("deferred", [False, True])
def test_padded_batches_refuse_pygs_view(deferred):
    """A padded batch's x ends in padding rows a PyG model would take for vertices."""
    data = pyg_data(_power_law(40, 200), 40)
    graph = gnnfuse.Graph.from_edge_index(data.edge_index, 40)
    loader = NeighborLoader(graph, [3, 2], batch_size=8, x=data.x, y=data.y, prefetch=0, static_shapes=True,
                            deferred=deferred)
    batch = next(iter(loader))
    assert batch.padded
    for name in ("edge_index", "num_sampled_nodes", "num_sampled_edges", "num_nodes", "e_id", "edge_attr"):
        with pytest.raises(ValueError, match=rf"batch\.{name}: this batch is padded .*static_shapes"):
            getattr(batch, name)


def test_a_batch_sent_from_a_worker_process_keeps_pygs_view():
    """Worker processes send batches through `loader.packing`; the counts must cross."""
    from gnnfuse.loader.packing import pack, unpack
    data = pyg_data(_power_law(40, 200), 40)
    batch = _batches(data, [3, 2], 8)[0]
    sent = unpack(*pack(batch))
    assert sent.num_sampled_edges == batch.num_sampled_edges and sent.num_sampled_nodes == batch.num_sampled_nodes
    assert torch.equal(sent.edge_index, batch.edge_index) and torch.equal(sent.e_id, batch.e_id)


@pytest.mark.parametrize("fanouts", [[-1, 0], [0, -1], [-1, 0, -1], [0, 0], [0, -1, -1], [-1, 0, 2, -1]])
def test_a_hop_of_zero_samples_nothing_there_nor_after_it_as_in_pyg(fanouts):
    """PyG's hop i samples for the vertices hop i - 1 added: after a 0, none. Its batch's
    edges and counts are PyG's; a vertex only the blocks' re-sample reached (after a 0)
    is in n_id but in no edge (two hops after a 0, a later hop's edges into one were in
    edge_index), and a PyG model's seed outputs are those of PyG's batch; the graph the
    batch hands a gnnfuse layer with its edge_index is that edge_index's."""
    data = pyg_data(_power_law(40, 200), 40)
    net = _pyg_models(3)["sage"].eval()
    conv = gnnfuse.nn.SAGEConv(3, 2).double()
    for batch in _batches(data, fanouts, 6):
        size = batch.batch_size
        n_id, edge_index, e_id, nodes, edges = pyg_full_subgraph(data.edge_index, batch.n_id[:size].tolist(), fanouts)
        assert torch.equal(batch.edge_index, edge_index) and torch.equal(batch.e_id, e_id)
        assert batch.num_sampled_edges == edges
        first_zero = fanouts.index(0)
        assert batch.num_sampled_nodes[:first_zero + 2] == nodes[:first_zero + 2]
        assert torch.equal(batch.n_id[:n_id.numel()], n_id)
        torch.testing.assert_close(net(batch.x, batch.edge_index)[:size], net(data.x[n_id], edge_index)[:size],
                                   rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(conv(batch.x, batch.edge_index), conv(batch.x, batch.edge_index.clone()),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", ["sage", "gat", "gatv2", "graphconv"])
def test_a_block_of_a_hop_of_zero_gives_pygs_layer_on_no_edges(layer, backend, device):
    """``num_neighbors=[3, 0]``: the input layer's block has no edges, and a layer on it
    gives what PyG's gives on an edgeless bipartite graph (the root term, a self loop),
    gradients included."""
    import torch_geometric.nn as pyg_nn
    data = pyg_data(_power_law(40, 200), 40, channels=4)
    ours, theirs, options = {"sage": (gnnfuse.nn.SAGEConv, pyg_nn.SAGEConv, {}),
                             "gat": (gnnfuse.nn.GATConv, pyg_nn.GATConv, {"heads": 2}),
                             "gatv2": (gnnfuse.nn.GATv2Conv, pyg_nn.GATv2Conv, {"heads": 2}),
                             "graphconv": (gnnfuse.nn.GraphConv, pyg_nn.GraphConv, {})}[layer]
    torch.manual_seed(0)
    conv = ours(4, 5, **options).double().to(device)
    reference = theirs(4, 5, **options).double()
    reference.load_state_dict({k: v.cpu() for k, v in conv.state_dict().items()})
    batch = _batches(data, [3, 0], 8, device=device)[0]
    block = batch.blocks[0]
    assert block.graph.num_edges == 0 and block.num_src == block.num_dst == batch.num_nodes
    x = batch.x.clone().requires_grad_()
    x_ref = batch.x.detach().cpu().clone().requires_grad_()
    out = conv((x, x[:block.num_dst]), block.graph)
    want = reference((x_ref, x_ref[:block.num_dst]), torch.empty(2, 0, dtype=torch.int64))
    torch.testing.assert_close(out.cpu(), want, rtol=1e-12, atol=1e-12)
    gen = torch.Generator().manual_seed(1)
    weights = torch.randn(want.shape, dtype=torch.float64, generator=gen)
    (out * weights.to(device)).sum().backward()
    (want * weights).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x_ref.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fanouts", [[3, 0], [0, 3]])
def test_block_models_train_on_hops_of_zero_padded_or_not(fanouts, backend, device):
    """A block model on a batch with an edgeless block, and on the same batch padded to
    static shapes: the same loss and gradients."""
    from gnnfuse.nn.block_models import build_block_model
    data = pyg_data(_power_law(40, 200), 40, channels=4)
    graph = gnnfuse.Graph.from_edge_index(data.edge_index, 40)
    torch.manual_seed(0)
    net = build_block_model("sage", 4, 3, 8, 0.0, 2).double().to(device)
    results = []
    for static in (False, True):
        torch.manual_seed(3)
        batch = next(iter(NeighborLoader(graph, fanouts, batch_size=8, x=data.x, y=data.y, prefetch=0,
                                         static_shapes=static, device=device)))
        assert batch.padded == static
        net.zero_grad()
        loss = F.cross_entropy(net(batch.x, batch.blocks)[:batch.batch_size], batch.y[:batch.batch_size])
        loss.backward()
        results.append([loss.detach()] + [p.grad.clone() for p in net.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_num_neighbors_are_whole_counts_of_zero_or_more_or_minus_one():
    data = pyg_data(_power_law(20, 60), 20)
    with pytest.raises(ValueError, match=r"fanouts >= 0 \(or -1 for all\), got \[2, -2\]"):
        NeighborLoader(data, [2, -2])
    with pytest.raises(ValueError, match="non-empty"):
        NeighborLoader(data, [])
