"""Batches of whole graphs padded to fixed shapes (`loader.padded_graph_batch`) and
``gnnfuse.loader.DataLoader``: the padding keeps every real row, joins padded vertices
only to padded vertices, and leaves a model's loss and gradients as on PyG's batch
(float64 against the unpadded batch); what cannot be padded safely is refused by name."""
from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from hypothesis import given, settings, strategies as st
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.loader import DataLoader as PyGDataLoader

import gnnfuse.nn
from gnnfuse.loader import IGNORE_LABEL, DataLoader, GraphCapacities
from gnnfuse.loader.padded_graph_batch import pad_graph_batch, padded_capacities, probe_capacities, unpadded

RUNS = settings(max_examples=25, deadline=None, derandomize=True, database=None)
f64 = torch.float64


@st.composite
def graph_lists(draw, max_graphs: int = 5):
    """Small graphs as molecule data sets hold them: isolated vertices, no edges at all,
    loops and repeated edges, integer atom types and bond features, a class label."""
    out = []
    for _ in range(draw(st.integers(1, max_graphs))):
        n = draw(st.integers(1, 6))
        m = draw(st.integers(0, 10))
        ids = st.lists(st.integers(0, n - 1), min_size=m, max_size=m)
        out.append(Data(x=torch.tensor(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))).unsqueeze(1),
                        edge_index=torch.tensor([draw(ids), draw(ids)], dtype=torch.long).reshape(2, m),
                        edge_attr=torch.arange(m * 2, dtype=f64).reshape(m, 2),
                        y=torch.tensor([draw(st.integers(0, 2))]), name=f"g{n}"))
    return out


def molecules(count: int, seed: int = 0, features: int = 5) -> list[Data]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n = int(torch.randint(2, 9, (1,), generator=gen))
        m = int(torch.randint(1, 2 * n, (1,), generator=gen))
        src = torch.randint(0, n, (m,), generator=gen)
        dst = torch.randint(0, n, (m,), generator=gen)
        out.append(Data(x=torch.randn(n, features, generator=gen, dtype=f64),
                        edge_index=torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]),
                        y=torch.randint(0, 3, (1,), generator=gen)))
    return out


@RUNS
@given(graph_lists(), st.integers(1, 6), st.integers(0, 12), st.integers(1, 3))
def test_padding_keeps_the_batch_and_joins_padded_vertices_only_to_padded_ones(graphs, spare_nodes, spare_edges,
                                                                               spare_graphs):
    plain = Batch.from_data_list(graphs)
    n, e, g = plain.num_nodes, plain.num_edges, plain.num_graphs
    caps = GraphCapacities(n + spare_nodes, e + spare_edges, g + spare_graphs)
    padded = pad_graph_batch(Batch.from_data_list(graphs), caps)
    if g in (n, e):         # a row per graph is one per vertex or edge too: which is it?
        assert padded_capacities(padded) is None and torch.equal(padded.y, plain.y)
        return
    assert padded_capacities(padded) == caps and padded_capacities(plain) is None
    assert padded.num_graphs == caps.graphs and padded.num_nodes == caps.nodes
    assert torch.equal(padded.x[:n], plain.x) and not padded.x[n:].any() and padded.x.dtype == plain.x.dtype
    assert torch.equal(padded.edge_index[:, :e], plain.edge_index) and padded.edge_index.shape == (2, caps.edges)
    pad = padded.edge_index[:, e:]
    assert bool(((pad >= n) & (pad < caps.nodes)).all())
    if spare_nodes > 1:
        assert bool((pad[0] != pad[1]).all())            # a ring: no loops where it can avoid them
    assert torch.equal(padded.edge_attr[:e], plain.edge_attr) and not padded.edge_attr[e:].any()
    assert torch.equal(padded.batch[:n], plain.batch) and bool((padded.batch[n:] == caps.graphs - 1).all())
    assert torch.equal(padded.y[:g], plain.y) and bool((padded.y[g:] == IGNORE_LABEL).all())
    assert padded.ptr.tolist() == plain.ptr.tolist() + [n] * (caps.graphs - g - 1) + [caps.nodes]
    assert "name" not in padded.keys()       # a string per graph: a replayed step would see the first batch's
    again = unpadded(pickle.loads(pickle.dumps(padded)).to("cpu"))      # PyG's batch, for an eager step
    assert padded_capacities(again) is None and unpadded(plain) is plain
    assert sorted(again.keys()) == sorted(k for k in plain.keys() if k != "name")
    assert all(torch.equal(again[k], plain[k]) for k in again.keys())
    assert (again.num_nodes, again.num_edges, again.num_graphs) == (n, e, g)
    assert [d.num_nodes for d in again.to_data_list()] == [d.num_nodes for d in graphs]
    assert padded.num_graphs == caps.graphs and padded.x.shape[0] == caps.nodes     # left as it was


def test_a_batch_over_the_capacities_comes_unpadded():
    graphs = molecules(4)
    plain = Batch.from_data_list(graphs)
    for caps in (GraphCapacities(plain.num_nodes, 10**4, 10), GraphCapacities(10**4, plain.num_edges - 1, 10),
                 GraphCapacities(10**4, 10**4, plain.num_graphs)):
        batch = pad_graph_batch(Batch.from_data_list(graphs), caps)
        assert padded_capacities(batch) is None and torch.equal(batch.edge_index, plain.edge_index)


def test_a_batch_whose_graph_rows_are_also_its_vertex_or_edge_rows_comes_unpadded():
    """In a batch of one-vertex graphs a graph label has a row per vertex too, and PyG's
    classification made it per vertex: padded to the vertex capacity, the loss met a
    label per padded vertex (ValueError: batch_size 3 against 64). Which count such rows
    follow is the data set's to know, not the batch's; the batch stays PyG's."""
    single = [Data(x=torch.randn(1, 2), edge_index=torch.zeros(2, 0, dtype=torch.long), y=torch.tensor([k]))
              for k in range(3)]
    one_edge = [Data(x=torch.randn(2, 2), edge_index=torch.tensor([[0], [1]]), y=torch.tensor([k]))
                for k in range(3)]
    for graphs in (single, one_edge):
        batch = pad_graph_batch(Batch.from_data_list(graphs), GraphCapacities(64, 64, 8))
        assert padded_capacities(batch) is None and batch.y.shape == (3,)
    mixed = pad_graph_batch(Batch.from_data_list(single + one_edge[:1]), GraphCapacities(64, 64, 8))
    assert padded_capacities(mixed) is not None and mixed.y.shape == (8,)


def test_the_loader_is_pygs_without_static_shapes_and_pads_with_them():
    data = molecules(30)
    ours = list(DataLoader(data, batch_size=7))
    theirs = list(PyGDataLoader(data, batch_size=7))
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a.keys())
    loader = DataLoader(data, batch_size=7, static_shapes=True)
    caps = loader.capacities
    assert caps.graphs == 8 and caps == probe_capacities(data, 7)
    batches = list(loader)
    assert all(padded_capacities(b) == caps for b in batches)       # the short last batch too
    assert [tuple(b.x.shape) for b in batches] == [(caps.nodes, 5)] * len(batches)
    assert int(batches[-1].y.ne(IGNORE_LABEL).sum()) == 30 - 7 * 4
    given = GraphCapacities(256, 512, 9)
    assert DataLoader(data, batch_size=7, static_shapes=True, capacities=given).capacities == given


def test_padded_batches_travel_to_worker_processes_and_back():
    loader = DataLoader(molecules(20), batch_size=6, static_shapes=True, num_workers=1)
    batches = list(loader)
    assert len(batches) == 4 and all(padded_capacities(b) == loader.capacities for b in batches)
    again = pickle.loads(pickle.dumps(batches[0]))
    assert padded_capacities(again) == loader.capacities and padded_capacities(again.to("cpu")) is not None


def test_capacities_cover_the_probed_batches_and_refuse_impossible_shapes():
    caps = GraphCapacities.covering([(100, 300), (120, 200)], 9)
    assert caps.nodes > 120 and caps.edges > 300 and caps.nodes % 128 == 0 and caps.graphs == 9
    with pytest.raises(ValueError, match="at least 2 vertices"):
        GraphCapacities(1, 10, 3)
    with pytest.raises(ValueError, match="2 graphs"):
        GraphCapacities(10, 10, 1)
    with pytest.raises(ValueError, match="negative edge count"):
        GraphCapacities(10, -1, 3)
    with pytest.raises(ValueError, match="at least one probed batch"):
        GraphCapacities.covering([], 3)


def test_what_cannot_be_padded_safely_is_refused_by_name():
    data = molecules(6)
    with pytest.raises(ValueError, match="static_shapes=True"):
        DataLoader(data, batch_size=2, capacities=GraphCapacities(64, 64, 3))
    with pytest.raises(ValueError, match="hold 2 graphs, but a batch of 2 needs 3"):
        DataLoader(data, batch_size=2, static_shapes=True, capacities=GraphCapacities(64, 64, 2))
    with pytest.raises(ValueError, match="follow_batch.*x"):
        DataLoader(data, batch_size=2, static_shapes=True, follow_batch=["x"])
    caps = GraphCapacities(256, 256, 4)
    regression = [Data(x=d.x, edge_index=d.edge_index, y=torch.tensor([0.5])) for d in data]
    with pytest.raises(ValueError, match="float64 label y|float32 label y"):
        pad_graph_batch(Batch.from_data_list(regression[:3]), caps)
    per_vertex = [Data(x=d.x, edge_index=d.edge_index, y=torch.rand(d.num_nodes)) for d in data]
    with pytest.raises(ValueError, match="label y"):
        pad_graph_batch(Batch.from_data_list(per_vertex[:3]), caps)
    faces = [Data(x=d.x, edge_index=d.edge_index, face=torch.zeros(3, 1, dtype=torch.long)) for d in data]
    with pytest.raises(ValueError, match="'face': it holds vertex or graph ids"):
        pad_graph_batch(Batch.from_data_list(faces[:3]), caps)
    odd = [Data(x=d.x, edge_index=d.edge_index, table=torch.zeros(7, 2)) for d in data]
    with pytest.raises(ValueError, match="cannot tell whether the batch's 'table'"):
        pad_graph_batch(Batch.from_data_list(odd[:3]), caps)


def test_a_batch_of_heterogeneous_graphs_is_refused_by_name():
    """A ``HeteroData`` batch has no single vertex count to pad: it failed with
    "'HeteroDataBatch' has no attribute 'is_node_attr'", naming nothing the user did."""
    def typed(n):
        graph = HeteroData()
        graph["atom"].x = torch.randn(n, 2)
        graph["atom", "bond", "atom"].edge_index = torch.tensor([[0, 1, 1], [1, 0, n - 1]])
        graph.y = torch.tensor([n % 2])
        return graph
    loader = DataLoader([typed(n) for n in (2, 3, 4)], batch_size=2, static_shapes=True)
    with pytest.raises(ValueError, match="HeteroData.*static_shapes=False"):
        next(iter(loader))


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_a_label_that_cannot_hold_the_ignored_label_is_refused(dtype):
    """IGNORE_LABEL (-100) in a bool label is True, in a uint8 one 156: the padding
    graphs were positives of a binary loss (``y.float()``), or a class past the last."""
    graphs = [Data(x=d.x, edge_index=d.edge_index, y=d.y.to(dtype)) for d in molecules(3, seed=3)]
    with pytest.raises(ValueError, match=f"{dtype} label y.*-100"):
        pad_graph_batch(Batch.from_data_list(graphs), GraphCapacities(64, 64, 6))


def test_ids_past_a_graphs_vertices_are_refused_not_joined_to_the_padding():
    bad = Data(x=torch.randn(3, 2), edge_index=torch.tensor([[0, 1], [1, 3]]), y=torch.tensor([0]))
    with pytest.raises(ValueError, match="edge_index targets has id 3 at position 1, but num_nodes=3"):
        pad_graph_batch(Batch.from_data_list([bad]), GraphCapacities(64, 64, 2))
    negative = Data(x=torch.randn(3, 2), edge_index=torch.tensor([[0, -1], [1, 2]]), y=torch.tensor([0]))
    with pytest.raises(ValueError, match="edge_index sources has a negative id -1 at position 1"):
        pad_graph_batch(Batch.from_data_list([negative]), GraphCapacities(64, 64, 2))



def test_an_edge_index_dtype_too_narrow_for_the_padded_ids_is_refused_not_wrapped():
    """A uint8 ``edge_index`` of 200 vertices collates as PyG's, but padded to 384
    vertices its padded ids 256..383 wrapped round to 0..127: padded edges joined real
    vertices, and GIN's loss moved from 0.7447 to 0.7316 without a word."""
    graphs = [Data(x=torch.randn(10, 2), edge_index=torch.randint(0, 10, (2, 12), dtype=torch.uint8),
                   y=torch.tensor([k % 2])) for k in range(20)]
    with pytest.raises(ValueError, match="torch.uint8 edge_index: its padded vertices' ids reach 383.*largest 255"):
        pad_graph_batch(Batch.from_data_list(graphs), GraphCapacities(384, 384, 21))
    padded = pad_graph_batch(Batch.from_data_list(graphs), GraphCapacities(256, 384, 21))    # ids up to 255 fit
    assert padded.edge_index.dtype == torch.uint8 and int(padded.edge_index[:, 240:].min()) == 200


def test_a_batch_sampler_is_probed_for_its_own_batch_size():
    """With ``batch_sampler=`` torch's ``batch_size`` is 1, and the capacities were probed
    for batches of 1 graph (2 with the padding one): no batch of 4 fitted, and every
    batch came unpadded, every step eager, without a word."""
    from torch.utils.data import BatchSampler, SequentialSampler
    data = molecules(12)
    loader = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 4, False), static_shapes=True)
    assert loader.capacities.graphs == 5
    assert all(padded_capacities(batch) == loader.capacities for batch in loader)
    with pytest.raises(ValueError, match="list has no batch_size: pass capacities="):
        DataLoader(data, batch_sampler=[[0, 1], [2, 3, 4]], static_shapes=True)
    caps = GraphCapacities(128, 128, 4)
    loader = DataLoader(data, batch_sampler=[[0, 1], [2, 3, 4]], static_shapes=True, capacities=caps)
    assert [padded_capacities(batch) for batch in loader] == [caps, caps]

class _Classifier(torch.nn.Module):
    def __init__(self, name: str):
        super().__init__()
        kw = {"heads": 2} if name == "GAT" else {}
        self.body = getattr(gnnfuse.nn, name)(5, 6, 2, **kw)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x, edge_index, batch, graphs):
        h = self.body(x, edge_index)
        return self.head(torch.cat([pyg_nn.global_mean_pool(h, batch, size=graphs),
                                    pyg_nn.global_max_pool(h, batch, size=graphs)], 1)[:, :6] +
                         pyg_nn.global_add_pool(h, batch, size=graphs))


@pytest.mark.parametrize("name", ["GIN", "GraphSAGE", "GCN", "GAT"])
def test_padded_batches_give_the_plain_batchs_loss_and_gradients(name):
    """Padded vertices feed only padded vertices and the padding graphs' labels are
    ignored, so the loss and every gradient are the plain batch's (float64)."""
    torch.manual_seed(0)
    model = _Classifier(name).double()
    graphs = molecules(5, seed=3)
    results = []
    for batch in (Batch.from_data_list(graphs), pad_graph_batch(Batch.from_data_list(graphs),
                                                                GraphCapacities(64, 128, 8))):
        model.zero_grad()
        loss = F.cross_entropy(model(batch.x, batch.edge_index, batch.batch, batch.num_graphs), batch.y)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (plain_loss, plain_grads), (padded_loss, padded_grads) = results
    torch.testing.assert_close(padded_loss, plain_loss, rtol=1e-12, atol=1e-12)
    for a, b in zip(padded_grads, plain_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_pnas_degree_histogram_over_padded_batches_is_pygs():
    """PNAConv.get_degree_histogram(loader) reads every batch; over padded ones it
    counted the padded vertices and edges (439 vertices of degree 2 where PyG's loader
    gives 46), and a PNAConv built with that histogram scaled by another degree."""
    data = molecules(40)
    theirs = pyg_nn.PNAConv.get_degree_histogram(PyGDataLoader(data, batch_size=8))
    ours = gnnfuse.nn.PNAConv.get_degree_histogram(DataLoader(data, batch_size=8, static_shapes=True))
    assert torch.equal(ours, theirs)
    assert torch.equal(gnnfuse.nn.PNAConv.get_degree_histogram(data), pyg_nn.PNAConv.get_degree_histogram(data))


def test_plain_batches_are_pygs_batches():
    """``loader.plain_batches()`` holds PyG's collated batches, padded ones unpadded."""
    torch.manual_seed(3)
    graphs = [Data(x=torch.randn(n, 3), edge_index=torch.randint(0, n, (2, 2 * n)), y=torch.tensor([n % 2]))
              for n in torch.randint(3, 12, (20,)).tolist()]
    loader = DataLoader(graphs, batch_size=6, static_shapes=True)
    plain = list(loader.plain_batches())
    expected = list(PyGDataLoader(graphs, batch_size=6))
    assert len(plain) == len(expected) == 4
    assert any(b.num_nodes != p.num_nodes for b, p in zip(loader, plain))       # the loader's batches are padded
    for got, want in zip(plain, expected):
        assert sorted(got.keys()) == sorted(want.keys())
        for key in want.keys():
            assert torch.equal(got[key], want[key]), key
