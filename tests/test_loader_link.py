"""`LinkNeighborLoader`: PyG's link-prediction batches from gnnfuse's sampler.

Oracle: PyG's own ``LinkNeighborLoader`` (its negative sampling, seed numbering, label
rule and batch assembly) with its neighbour sampler replaced by the direct
re-implementation of PyG's full-neighbourhood sampler (`pyg_full_subgraph`; PyG's needs
pyg-lib, which this machine lacks). With full neighbourhoods and no negatives the
batches must be PyG's edge for edge; with negatives, whose draws differ, the counts,
labels and positives must be PyG's, and a GAE scores the batch's pairs as the full
graph does.
"""
from __future__ import annotations

import math
import subprocess
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import gnnfuse
from gnnfuse.loader import LinkNeighborLoader, NegativeSampling
from graph_strategies import graphs
from test_loader_pyg_batch import _power_law, check_subgraph, pyg_data, pyg_full_subgraph

RUNS = settings(max_examples=15, deadline=None, derandomize=True, database=None)


def pyg_link_loader(data, hops: int, **kwargs):
    """PyG's ``LinkNeighborLoader`` on ``data`` with ``num_neighbors=[-1] * hops``,
    sampling through `pyg_full_subgraph`."""
    from torch_geometric.loader import LinkNeighborLoader as PyGLinkNeighborLoader
    from torch_geometric.sampler import BaseSampler, SamplerOutput
    from torch_geometric.sampler.neighbor_sampler import edge_sample

    class FullNeighbourhoods(BaseSampler):
        edge_permutation = None

        def sample_from_nodes(self, index, **kwargs):
            raise NotImplementedError

        def sample_from_edges(self, inputs, neg_sampling=None):
            return edge_sample(inputs, self.sample, data.num_nodes, False, None, neg_sampling)

        def sample(self, seed, seed_time=None):
            n_id, edge_index, e_id, nodes, edges = pyg_full_subgraph(data.edge_index, seed.tolist(), hops)
            return SamplerOutput(node=n_id, row=edge_index[0], col=edge_index[1], edge=e_id,
                                 num_sampled_nodes=nodes, num_sampled_edges=edges)

    return PyGLinkNeighborLoader(data, [-1] * hops, neighbor_sampler=FullNeighbourhoods(), **kwargs)


def _both(data, hops: int, ours_from=None, **kwargs):
    """(gnnfuse's batches, PyG's batches) of the same arguments, unshuffled; gnnfuse's
    from ``ours_from`` when given (the same graph as the user gave it)."""
    ours = list(LinkNeighborLoader(data if ours_from is None else ours_from, [-1] * hops, **kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = list(pyg_link_loader(data, hops, **kwargs))
    assert len(ours) == len(theirs)
    return ours, theirs


@st.composite
def label_cases(draw):
    """A random graph and label edges: its own edges (None) or random pairs, maybe labelled."""
    case = draw(graphs(max_nodes=8, max_edges=20, hub_degrees=st.sampled_from([0, 6])))
    if draw(st.booleans()):
        index = None
        count = case.edge_index.shape[1]
    else:
        count = draw(st.integers(1, 12))
        gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        index = torch.randint(0, case.num_nodes, (2, count), generator=gen)
    label = torch.arange(count) % 3 if draw(st.booleans()) else None
    return case, index, label


@RUNS
@given(label_cases(), st.integers(1, 3), st.integers(1, 5))
def test_full_neighbourhood_link_batches_are_pygs_edge_for_edge(case, hops, batch_size):
    (graph, index, label) = case
    given = pyg_data(graph.given, graph.num_nodes)           # int32 or a strided view, maybe
    data = pyg_data(graph.edge_index, graph.num_nodes)
    wanted = graph.edge_index if index is None else index
    ours, theirs = _both(data, hops, given, edge_label_index=index, edge_label=label, batch_size=batch_size)
    for mine, pyg in zip(ours, theirs):
        assert torch.equal(mine.n_id, pyg.n_id)
        assert torch.equal(mine.edge_index, pyg.edge_index) and torch.equal(mine.e_id, pyg.e_id)
        assert mine.num_sampled_nodes == pyg.num_sampled_nodes and mine.num_sampled_edges == pyg.num_sampled_edges
        assert torch.equal(mine.x, pyg.x) and torch.equal(mine.edge_attr, pyg.edge_attr)
        assert torch.equal(mine.input_id, pyg.input_id)
        assert torch.equal(mine.edge_label_index, pyg.edge_label_index)
        if label is None:
            assert mine.edge_label is None and getattr(pyg, "edge_label", None) is None
        else:
            assert torch.equal(mine.edge_label, pyg.edge_label)
        # the brief's form: global-id edges as sets, label edges back in order
        assert set(map(tuple, mine.n_id[mine.edge_index].t().tolist())) == \
            set(map(tuple, data.edge_index[:, mine.e_id].t().tolist()))
        assert torch.equal(mine.n_id[mine.edge_label_index], wanted[:, mine.input_id])
        seeds = mine.n_id[:mine.num_sampled_nodes[0]]
        assert torch.equal(seeds, wanted[:, mine.input_id].unique())
        assert torch.equal(mine.y, data.y[seeds])
        assert torch.equal(mine.y[mine.edge_label_index], pyg.y[pyg.edge_label_index])   # PyG's y, at the pairs
    assert torch.equal(torch.cat([torch.empty(0, dtype=torch.long)] + [b.input_id for b in ours]),
                       torch.arange(wanted.shape[1]))


@pytest.mark.parametrize("labels", [None, "from_zero", "from_one"])
@pytest.mark.parametrize("negatives", [{"neg_sampling_ratio": 1.5}, {"neg_sampling": ("binary", 0.5)}, {
    "neg_sampling": {"mode": "binary", "amount": 2}}])
def test_binary_negatives_count_and_labels_as_pygs(labels, negatives):
    """Per batch ``ceil(amount * P)`` negatives after the P positives; labels PyG's: the
    given ones plus one when they start at 0 (0 then means negative), default float
    ones, then zeros. Negatives are random pairs of valid vertices."""
    data = pyg_data(_power_law(30, 90), 30)
    count = data.edge_index.shape[1]
    edge_label = {None: None, "from_zero": torch.arange(count) % 3, "from_one": torch.arange(count) % 3 + 1}[labels]
    torch.manual_seed(0)
    ours, theirs = _both(data, 1, edge_label=edge_label, batch_size=7, **negatives)
    amount = negatives.get("neg_sampling_ratio") or (negatives["neg_sampling"][1] if isinstance(
        negatives["neg_sampling"], tuple) else negatives["neg_sampling"]["amount"])
    for mine, pyg in zip(ours, theirs):
        positives = mine.input_id.numel()
        total = positives + math.ceil(amount * positives)
        assert mine.edge_label_index.shape == pyg.edge_label_index.shape == (2, total)
        assert mine.edge_label.dtype == pyg.edge_label.dtype and torch.equal(mine.edge_label, pyg.edge_label)
        assert (mine.edge_label[:positives] > 0).all() and (mine.edge_label[positives:] == 0).all()
        pairs = mine.n_id[mine.edge_label_index]
        assert torch.equal(pairs[:, :positives], data.edge_index[:, mine.input_id])
        assert ((pairs >= 0) & (pairs < data.num_nodes)).all()
        seeds = mine.n_id[:mine.num_sampled_nodes[0]]
        assert torch.equal(seeds, pairs.flatten().unique())
        assert torch.equal(mine.y, data.y[seeds])


@pytest.mark.parametrize("amount", [1, 2])
def test_triplet_negatives_are_pygs_shape(amount):
    data = pyg_data(_power_law(30, 90), 30)
    ours, theirs = _both(data, 1, batch_size=8, neg_sampling=("triplet", amount))
    for mine, pyg in zip(ours, theirs):
        assert mine.edge_label_index is None and mine.edge_label is None
        assert torch.equal(mine.n_id[mine.src_index], data.edge_index[0, mine.input_id])
        assert torch.equal(mine.n_id[mine.dst_pos_index], data.edge_index[1, mine.input_id])
        assert mine.dst_neg_index.shape == pyg.dst_neg_index.shape
        assert (mine.dst_neg_index < mine.num_sampled_nodes[0]).all()
    with pytest.raises(ValueError, match="edge_label must be None with 'triplet'"):
        LinkNeighborLoader(data, [2], edge_label=torch.ones(data.edge_index.shape[1]), neg_sampling="triplet")


def test_pygs_negative_sampling_object_and_weights_are_read():
    from torch_geometric.sampler import NegativeSampling as PyGNegativeSampling
    data = pyg_data(_power_law(20, 50), 20)
    weight = torch.zeros(20)
    weight[[3, 7]] = 1.0
    loader = LinkNeighborLoader(data, [2], batch_size=10,
                                neg_sampling=PyGNegativeSampling("binary", 1, src_weight=weight, dst_weight=weight))
    for batch in loader:
        negatives = batch.n_id[batch.edge_label_index[:, batch.input_id.numel():]]
        assert negatives.numel() and set(negatives.flatten().tolist()) <= {3, 7}


def _loader_of_weighted_negatives(mode: str) -> LinkNeighborLoader:
    """A loader whose negatives may have source 3 alone (``src_weight``) and destinations
    7 and 11 alone (``dst_weight``)."""
    data = pyg_data(_power_law(20, 50), 20)
    src_weight, dst_weight = torch.zeros(20), torch.zeros(20)
    src_weight[3], dst_weight[[7, 11]] = 1.0, 1.0
    return LinkNeighborLoader(data, [2], batch_size=10,
                              neg_sampling=NegativeSampling(mode, 2, src_weight=src_weight, dst_weight=dst_weight))


def test_binary_negatives_draw_sources_by_src_weight_and_destinations_by_dst_weight():
    """Each endpoint of a negative comes from its own weights (PyG's): sources only where
    ``src_weight`` is non-zero, destinations only where ``dst_weight`` is (drawing both by
    one endpoint's weights had passed the test above, whose weights are equal)."""
    loader = _loader_of_weighted_negatives("binary")
    for batch in loader:
        src, dst = batch.n_id[batch.edge_label_index[:, batch.input_id.numel():]]
        assert src.numel() == 2 * batch.input_id.numel()
        assert set(src.tolist()) == {3} and set(dst.tolist()) <= {7, 11}


def test_triplet_negatives_draw_destinations_by_dst_weight():
    """Triplet mode's negative destinations come from ``dst_weight`` (PyG's), not from
    ``src_weight``, which it does not read."""
    loader = _loader_of_weighted_negatives("triplet")
    for batch in loader:
        negatives = batch.n_id[batch.dst_neg_index]
        assert negatives.shape == (batch.input_id.numel(), 2) and set(negatives.flatten().tolist()) <= {7, 11}

def _gae(channels: int, backend_device: str):
    torch.manual_seed(0)
    return torch.nn.ModuleList([gnnfuse.nn.SAGEConv(channels, 8), gnnfuse.nn.SAGEConv(8, 4)]).double().to(
        backend_device)


def _encode(convs, x, graph):
    return convs[1](convs[0](x, graph).relu(), graph)


def test_gae_scores_on_a_full_neighbourhood_batch_are_the_full_graphs(backend, device):
    """A GAE (SAGE encoder, dot-product decoder on ``edge_label_index``): each batch's
    scores, loss and weight gradients are the full graph's at the same pairs, through
    PyG's ``edge_index`` and through the blocks."""
    data = pyg_data(_power_law(30, 100), 30)
    convs = _gae(3, device)
    x, edge_index = data.x.to(device), data.edge_index.to(device)
    loader = LinkNeighborLoader(data, [-1, -1], batch_size=12, shuffle=True, neg_sampling_ratio=1.0, device=device)
    for batch in list(loader)[:2]:
        pairs = batch.n_id[batch.edge_label_index]
        full = _encode(convs, x, edge_index)
        want = (full[pairs[0]] * full[pairs[1]]).sum(-1)
        want_loss = F.binary_cross_entropy_with_logits(want, batch.edge_label.double())
        want_grads = torch.autograd.grad(want_loss, list(convs.parameters()))
        z = _encode(convs, batch.x, batch.edge_index)
        scores = (z[batch.edge_label_index[0]] * z[batch.edge_label_index[1]]).sum(-1)
        torch.testing.assert_close(scores, want, rtol=1e-9, atol=1e-12)
        loss = F.binary_cross_entropy_with_logits(scores, batch.edge_label.double())
        for got, wanted in zip(torch.autograd.grad(loss, list(convs.parameters())), want_grads):
            torch.testing.assert_close(got, wanted, rtol=1e-9, atol=1e-12)
        h = batch.x
        for i, block in enumerate(batch.blocks):
            h = convs[i]((h, h[:block.num_dst]), block.graph)
            h = h.relu() if i == 0 else h
        torch.testing.assert_close((h[batch.edge_label_index[0]] * h[batch.edge_label_index[1]]).sum(-1), want,
                                   rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("replace", [False, True])
def test_sampled_link_batches_are_pyg_subgraphs_of_the_endpoints(replace):
    """With fanouts: the node part is a PyG subgraph sampled from the endpoints (the
    node loader's structural oracle), and the seeds are exactly the endpoints."""
    data = pyg_data(_power_law(30, 100), 30)
    torch.manual_seed(0)
    for batch in LinkNeighborLoader(data, [3, 2], batch_size=16, shuffle=True, replace=replace,
                                    neg_sampling_ratio=1.0):
        check_subgraph(batch, data, [3, 2], replace)
        seeds = batch.n_id[:batch.num_sampled_nodes[0]]
        assert torch.equal(seeds, batch.n_id[batch.edge_label_index].unique())
        assert torch.equal(batch.blocks[-1].src_nodes[:batch.blocks[-1].num_dst], seeds)


def test_the_same_seed_gives_the_same_batches():
    data = pyg_data(_power_law(30, 100), 30)
    loader = LinkNeighborLoader(data, [3, 2], batch_size=16, shuffle=True, neg_sampling_ratio=2.0)

    def epoch(seed):
        torch.manual_seed(seed)
        return [(b.n_id, b.edge_index, b.edge_label_index, b.edge_label, b.input_id) for b in loader]
    first, again, other = epoch(1), epoch(1), epoch(2)
    assert len(first) == len(loader) == math.ceil(data.edge_index.shape[1] / 16)
    assert all(torch.equal(a, b) for x, y in zip(first, again) for a, b in zip(x, y))
    assert not all(torch.equal(a, b) for x, y in zip(first, other) for a, b in zip(x, y))
    for n_id, _, pairs, _, input_id in first:         # shuffled: each label edge once, at its position
        assert torch.equal(n_id[pairs[:, :input_id.numel()]], data.edge_index[:, input_id])
    assert torch.equal(torch.cat([batch[4] for batch in first]).sort().values, torch.arange(data.edge_index.shape[1]))


def test_drop_last_and_no_label_edges():
    data = pyg_data(_power_law(20, 50), 20)
    assert len(LinkNeighborLoader(data, [2], batch_size=16, drop_last=True)) == 3
    assert [b.input_id.numel() for b in LinkNeighborLoader(data, [2], batch_size=16, drop_last=True)] == [16] * 3
    empty = LinkNeighborLoader(data, [2], edge_label_index=torch.empty(2, 0, dtype=torch.long), batch_size=4)
    assert len(empty) == 0 and list(empty) == []


def test_a_link_batch_has_no_batch_size():
    data = pyg_data(_power_law(20, 50), 20)
    batch = next(iter(LinkNeighborLoader(data, [2], batch_size=4)))
    with pytest.raises(AttributeError, match="a link batch has no batch_size"):
        _ = batch.batch_size


@pytest.mark.parametrize("kwargs, error, match", [
    ({"edge_label_index": torch.tensor([[0, 20], [1, 2]])}, ValueError, r"outside 0\.\.19"),
    ({"edge_label_index": torch.tensor([[0, -1], [1, 2]])}, ValueError, r"outside 0\.\.19"),
    ({"edge_label_index": torch.tensor([[0, 1, 2]])}, ValueError, r"shape \[2, E\].*\[1, 3\]"),
    ({"edge_label_index": torch.zeros(2, 3)}, ValueError, "integer vertex ids"),
    ({"edge_label_index": ("a", "to", "b")}, TypeError, "heterogeneous"),
    ({"edge_label_index": (("a", "to", "b"), torch.tensor([[0], [1]]))}, TypeError, "heterogeneous"),
    ({"edge_label": torch.ones(57)}, ValueError, r"a row per label edge \(58.*\[57\]"),
    ({"edge_label_index": torch.tensor([[0], [1]]), "edge_label": torch.ones(2)}, ValueError, "a row per label edge"),
    ({"neg_sampling_ratio": -1.0}, ValueError, "finite number > 0"),
    ({"neg_sampling": "random"}, ValueError, "mode must be one of"),
    ({"neg_sampling": ("triplet", 1.5)}, ValueError, "whole number in 'triplet'"),
    ({"neg_sampling": "binary", "neg_sampling_ratio": 2.0}, ValueError, "not both"),
    ({"neg_sampling": NegativeSampling("binary", 1, src_weight=torch.ones(3))}, ValueError,
     r"src_weight must be a float tensor of one weight per vertex \(20\), got a torch.float32 tensor of shape \[3\]"),
    ({"neg_sampling": NegativeSampling("binary", 1, dst_weight=torch.tensor([1.0] * 19 + [math.inf]))}, ValueError,
     "dst_weight must hold finite.*it holds a NaN or infinite weight"),
    ({"neg_sampling": NegativeSampling("binary", 1, src_weight=torch.full((20,), math.nan))}, ValueError,
     "it holds a NaN or infinite weight"),
    ({"neg_sampling": NegativeSampling("binary", 1, src_weight=-torch.ones(20))}, ValueError, "a negative weight"),
    ({"neg_sampling": NegativeSampling("binary", 1, src_weight=torch.zeros(20))}, ValueError, "only zeros"),
    ({"disjoint": True}, NotImplementedError, "disjoint=True"),
    ({"edge_label_time": torch.zeros(58)}, NotImplementedError, "edge_label_time"),
    ({"sampler": [0, 1]}, NotImplementedError, r"sampler=\[0, 1\]"),
    ({"deferred": True}, NotImplementedError, "deferred=True"),
    ({"prefetch": -1}, ValueError, "prefetch must be >= 0"),
    ({"num_workers": -1}, ValueError, "num_workers must be >= 0"),
    ({"x": torch.randn(20, 3, requires_grad=True)}, ValueError, "prefetch=2 would read its rows for batches ahead"),
    ({"static_shapes": True}, NotImplementedError, "static_shapes=True"),
    ({"input_nodes": torch.tensor([1, 2])}, NotImplementedError, "input_nodes=tensor"),
    ({"batch_sizes": 3}, TypeError, "unexpected keyword argument 'batch_sizes'"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"batch_size": 2.5}, ValueError, "batch_size"),
])
def test_bad_arguments_are_refused_by_name(kwargs, error, match):
    data = pyg_data(_power_law(20, 50), 20)
    with pytest.raises(error, match=match):
        LinkNeighborLoader(data, [2], **kwargs)


def test_what_the_node_loader_refuses_names_the_link_loader():
    """A LinkNeighborLoader samples its endpoints with NeighborLoader's checks and
    machinery; what those refuse named NeighborLoader, which the user never made."""
    typed = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3, edge_type=torch.tensor([0, 1]))
    for data, error, match in [(object(), TypeError, "^LinkNeighborLoader takes a gnnfuse Graph"),
                               (typed, ValueError, "^LinkNeighborLoader samples a homogeneous graph")]:
        with pytest.raises(error, match=match):
            LinkNeighborLoader(data, [2])
    batch = next(iter(LinkNeighborLoader(gnnfuse.Graph.from_edge_index(_power_law(20, 50), 20), [2], batch_size=4)))
    with pytest.raises(AttributeError, match="batch.e_id: .*edge_attr") as caught:
        batch.e_id                              # no edge table: no edge ids kept
    assert "NeighborLoader" not in str(caught.value)


def test_a_failing_worker_names_the_link_loader():
    loader = LinkNeighborLoader(pyg_data(_power_law(20, 50), 20), [2], batch_size=8, num_workers=1)
    loader._nodes._maker.rowptr = loader._nodes._maker.rowptr * 100     # sampling reads past the columns
    try:
        with pytest.raises(RuntimeError, match=r"^gnnfuse LinkNeighborLoader: worker 0 failed on batch 0:\n"):
            list(loader)
    finally:
        loader.close()


def test_pygs_defaults_and_a_gnnfuse_graph_are_accepted():
    data = pyg_data(_power_law(20, 50), 20)
    graph = gnnfuse.Graph.from_edge_index(data.edge_index, 20)
    loader = LinkNeighborLoader(graph, [2], x=data.x, batch_size=8, disjoint=False, time_attr=None,
                                edge_label_time=None, num_workers=0, subgraph_type="directional", prefetch=0)
    batch = next(iter(loader))
    assert torch.equal(batch.x, data.x[batch.n_id]) and batch.y is None
    assert torch.equal(batch.n_id[batch.edge_label_index], data.edge_index[:, :8])
    rows = [(0, 5, 19), (1, 2, 3)]                         # a list of rows, not an edge type
    batch = next(iter(LinkNeighborLoader(graph, [2], edge_label_index=rows, batch_size=8)))
    assert batch.n_id[batch.edge_label_index].tolist() == [list(row) for row in rows]


def test_a_hetero_data_is_refused():
    from torch_geometric.data import HeteroData
    data = HeteroData()
    data["a"].x = torch.randn(3, 2)
    data["a", "to", "a"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(NotImplementedError, match="HeteroData"):
        LinkNeighborLoader(data, [2])


def test_link_batches_move_and_carry_the_datas_other_attributes():
    """PyG's ``batch = batch.to(device)`` and ``batch.train_mask`` on a link batch, as on a
    node batch (`loader.batch_move`, `loader.data_attributes`), the label edges kept."""
    from test_loader_batch_attributes import attributed_data
    data = attributed_data()
    torch.manual_seed(0)
    batch = next(iter(LinkNeighborLoader(data, [2, 2], batch_size=4, neg_sampling_ratio=1.0)))
    assert torch.equal(batch.train_mask, data.train_mask[batch.n_id])
    assert torch.equal(batch.edge_time, data.edge_time[batch.e_id])
    assert batch.to("cpu") is batch and batch.cpu() is batch
    label_index, label = batch.edge_label_index, batch.edge_label
    moved = batch.to("meta")
    assert moved is batch and all(t.device.type == "meta" for t in moved.tensors())
    assert moved.edge_label_index.shape == label_index.shape and moved.edge_label.shape == label.shape
    assert moved.train_mask.device.type == "meta" and moved.edge_index.device.type == "meta"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        batch.nothing_here


@pytest.mark.parametrize("negatives", [{}, {"neg_sampling_ratio": 1.0}, {"neg_sampling": "triplet"}])
def test_a_link_splits_own_labels_are_listed_once_as_the_batchs(negatives):
    """A link split's ``Data`` holds ``edge_label`` and ``edge_label_index`` itself (an
    edge-level pair when they are the graph's edges); the batch's keys name each once,
    for the value the batch gives (PyG's loader sets its labels over the ``Data``'s,
    removing one that is None): they named both twice, and ``edge_label`` where it was None."""
    edge_index = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 3]])
    data = pyg_data(edge_index, 4)
    data.edge_label, data.edge_label_index = torch.ones(5), edge_index.clone()
    batch = next(iter(LinkNeighborLoader(data, [-1], batch_size=2, prefetch=0, **negatives)))
    keys = batch.keys()
    assert len(keys) == len(set(keys)) and [k for k, _ in batch] == keys
    for name in ("edge_label", "edge_label_index", "src_index", "dst_pos_index", "dst_neg_index"):
        assert (name in batch) == (getattr(batch, name) is not None)


# --- batches prepared ahead: a prefetch thread, worker processes ---------------------

def _link_fields(batch) -> list:
    """Every field of a link batch, the blocks' and the Data's other attributes included."""
    link = [getattr(batch, name) for name in ("input_id", "edge_label_index", "edge_label", "src_index",
                                              "dst_pos_index", "dst_neg_index")]
    nodes = [batch.n_id, batch.x, batch.y, batch.edge_index, batch.e_id, batch.edge_attr, batch.edge_weight,
             batch.num_sampled_nodes, batch.num_sampled_edges, batch.train_mask, batch.edge_time]
    blocks = [t for block in batch.blocks for t in (block.src_nodes, *block.graph.csr(), *block.graph.reverse_csr())]
    return link + nodes + blocks


def _same_batches(ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs)
    for mine, other in zip(ours, theirs):
        for a, b in zip(_link_fields(mine), _link_fields(other), strict=True):
            if isinstance(a, torch.Tensor):
                assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
            else:
                assert a == b


@pytest.mark.parametrize("negatives", [{"neg_sampling_ratio": 1.5}, {"neg_sampling": ("triplet", 2)}])
def test_a_prefetch_thread_gives_the_batches_prepared_when_asked(negatives):
    """``prefetch`` (default 2) prepares link batches in a background thread (NeighborLoader's
    `Prefetcher`): each batch's negatives and samples come from its own generator, so the
    batches are those of ``prefetch=0``, field for field, and the Data's other attributes
    are attached as on a node batch; an abandoned epoch stops the thread."""
    from test_loader_batch_attributes import attributed_data
    data = attributed_data(40, 200)
    make = lambda **kw: LinkNeighborLoader(data, [3, 2], batch_size=16, shuffle=True, **negatives, **kw)  # noqa: E731
    torch.manual_seed(3)
    plain = list(make(prefetch=0))
    ahead = make()
    torch.manual_seed(3)
    batches, threads = [], set()
    for batch in ahead:                                 # prepared by a thread, not when asked
        batches.append(batch)
        threads |= {t.name for t in threading.enumerate() if t.is_alive()}
    assert "gnnfuse-prefetch" in threads
    _same_batches(plain, batches)
    assert ahead.stage_times.batches == len(plain) == 13 and ahead.stage_times.totals()["sample"] > 0
    torch.manual_seed(3)
    _same_batches(plain, list(make(prefetch=3, prefetch_threads=2)))
    epoch = iter(ahead)
    next(epoch)
    epoch.close()                                       # the thread is stopped and joined
    assert not any(t.name == "gnnfuse-prefetch" and t.is_alive() for t in threading.enumerate())


def test_worker_processes_give_the_batches_prepared_when_asked():
    """``num_workers`` processes prepare link batches from a pickled `LinkBatchMaker`; the
    label edges travel packed with the node batch and come back a `LinkMiniBatch`, the
    same as without workers for two epochs, one interrupted between them; ``close`` stops
    them, and they ignore SIGINT."""
    from test_loader_batch_attributes import attributed_data
    data = attributed_data(40, 200)
    edge_label = torch.arange(200) % 2
    make = lambda **kw: LinkNeighborLoader(data, [3, 2], edge_label=edge_label, batch_size=32,  # noqa: E731
                                           shuffle=True, neg_sampling_ratio=1.0, **kw)

    def interrupted(loader) -> None:         # a Ctrl-C in the first step of an epoch
        with pytest.raises(KeyboardInterrupt):
            for _ in loader:
                raise KeyboardInterrupt

    reference = make(prefetch=0)
    torch.manual_seed(5)
    plain = [list(reference), interrupted(reference), list(reference)]
    loader = make(num_workers=2)
    torch.manual_seed(5)
    try:
        first = list(loader)
        processes = loader._nodes._preparation.workers._processes
        ignores = [subprocess.run(["grep", "SigIgn", f"/proc/{p.pid}/status"], capture_output=True,
                                  text=True).stdout for p in processes]
        interrupted(loader)                     # the epoch abandoned: the next one is whole
        second = list(loader)
    finally:
        loader.close()
    assert all(not p.is_alive() for p in processes)
    assert all(int(line.split()[1], 16) & (1 << 1) for line in ignores)      # SIGINT (2) ignored
    _same_batches(plain[0], first)
    _same_batches(plain[2], second)
    # the interrupted batch is not counted: a batch counts once the next one is asked for
    assert loader.stage_times.batches == 14 and loader.stage_times.totals()["sample"] > 0


def test_worker_processes_learn_which_blocks_gat_loops():
    """A GAT step on a link batch's blocks asks for their self-looped graphs; worker
    processes learn it with the next epoch's jobs (`LinkBatchMaker.learnt`), and that
    epoch's blocks come with the looped graphs built (before, they never did, and every
    step built them, reading counts back from the device)."""
    import torch.nn.functional as F

    from gnnfuse.nn.block_models import build_block_model
    from test_loader_batch_attributes import attributed_data
    data = attributed_data(40, 200)
    loader = LinkNeighborLoader(data, [3, 2], batch_size=32, shuffle=True, num_workers=1)
    model = build_block_model("gat", data.x.shape[1], 4, 4, 0.0, 2).to(data.x.dtype)
    try:
        for batch in loader:
            nodes = batch.nodes
            out = model(nodes.x, nodes.blocks)
            F.mse_loss((out[batch.edge_label_index[0]] * out[batch.edge_label_index[1]]).sum(-1),
                       out.new_ones(batch.edge_label_index.shape[1])).backward()
        later = next(iter(loader))
    finally:
        loader.close()
    assert all("nn_self_looped" in block.graph._cache for block in later.nodes.blocks)
