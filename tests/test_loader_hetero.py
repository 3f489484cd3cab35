"""`NeighborLoader` on a PyG ``HeteroData``: PyG's heterogeneous mini-batches
(`loader.hetero_loader`, `loader.hetero_sampler`, `loader.hetero_batch`).

Oracles: with full neighbourhoods (-1, and 0 for none) a batch is PyG's, edge for edge,
against a direct re-implementation of PyG's heterogeneous sampler (pyg-lib's
``hetero_neighbor_sample``, which PyG's own loader needs and this machine lacks): per
hop, for every edge type in the graph's order, each vertex of its destination type that
the previous hop added takes its in-edges of that type in ``edge_index`` order, new
vertices of each type numbered by first appearance after those already there. A
``to_hetero`` model (PyG's layers and gnnfuse's) then gives the full graph's outputs at
the seeds. With fanouts, the batch's structure is checked against the graph."""
from __future__ import annotations

import subprocess
import threading

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import HeteroData

from gnnfuse.loader import NeighborLoader

RUNS = settings(max_examples=40, deadline=None, derandomize=True, database=None)
f64 = torch.float64


def pyg_hetero_subgraph(data: HeteroData, input_type: str, seeds: list[int], fanouts: dict) -> tuple:
    """PyG's sample of ``seeds`` when every fanout is -1 or 0: (n_id, edge_index, e_id,
    num_sampled_nodes, num_sampled_edges), dicts by node or edge type."""
    node_types, edge_types = data.metadata()
    in_edges = {et: {} for et in edge_types}
    for et in edge_types:
        for e, v in enumerate(data[et].edge_index[1].tolist()):
            in_edges[et].setdefault(v, []).append(e)
    nodes = {t: list(seeds) if t == input_type else [] for t in node_types}
    local = {t: {v: i for i, v in enumerate(nodes[t])} for t in node_types}
    slices = {t: (0, len(nodes[t])) for t in node_types}
    rows, cols, e_ids = ({et: [] for et in edge_types} for _ in range(3))
    counts_n, counts_e = {t: [len(nodes[t])] for t in node_types}, {et: [] for et in edge_types}
    for hop in range(len(next(iter(fanouts.values()))) if fanouts else 0):
        for et in edge_types:
            src_type, _, dst_type = et
            src = data[et].edge_index[0].tolist()
            before = len(rows[et])
            if fanouts[et][hop] != 0:
                for i in range(*slices[dst_type]):
                    for e in in_edges[et].get(nodes[dst_type][i], []):
                        if src[e] not in local[src_type]:
                            local[src_type][src[e]] = len(nodes[src_type])
                            nodes[src_type].append(src[e])
                        rows[et].append(local[src_type][src[e]])
                        cols[et].append(i)
                        e_ids[et].append(e)
            counts_e[et].append(len(rows[et]) - before)
        for t in node_types:
            slices[t] = (slices[t][1], len(nodes[t]))
            counts_n[t].append(slices[t][1] - slices[t][0])
    return ({t: torch.tensor(nodes[t], dtype=torch.int64) for t in node_types},
            {et: torch.tensor([rows[et], cols[et]], dtype=torch.int64).reshape(2, -1) for et in edge_types},
            {et: torch.tensor(e_ids[et], dtype=torch.int64) for et in edge_types}, counts_n, counts_e)


@st.composite
def hetero_graphs(draw):
    """Small HeteroData: 1-3 node types (some possibly with no in-edges, isolated
    vertices), edge types among them including self relations, some with no edges."""
    types = ["a", "b", "c"][:draw(st.integers(1, 3))]
    counts = {t: draw(st.integers(1 if t == "a" else 0, 6)) for t in types}
    pairs = draw(st.lists(st.sampled_from([(s, d) for s in types for d in types]), min_size=0, max_size=6,
                          unique=True))
    data = HeteroData()
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    for t in types:
        data[t].x = torch.randn(counts[t], 2, dtype=f64, generator=gen)
        data[t].y = torch.randint(0, 3, (counts[t],), generator=gen)
        data[t].num_nodes = counts[t]
    for k, (s, d) in enumerate(pairs):
        edges = draw(st.integers(0, 12)) if counts[s] and counts[d] else 0
        data[s, f"r{k}", d].edge_index = torch.stack([torch.randint(0, max(counts[s], 1), (edges,), generator=gen),
                                                      torch.randint(0, max(counts[d], 1), (edges,), generator=gen)])
        data[s, f"r{k}", d].edge_attr = torch.randn(edges, 3, generator=gen)
    return data


def _input(kind: int, data: HeteroData):
    """PyG's three forms of ``input_nodes`` for type ``a``: the type, a mask, ids."""
    n = data["a"].num_nodes
    if kind == 0:
        return "a"
    if kind == 1:
        return ("a", torch.arange(n) % 2 == 0)
    return ("a", torch.arange(n).flip(0)[: max(1, n - 1)])


def _batches(data, fanouts, batch_size, input_nodes, **kwargs):
    torch.manual_seed(0)
    return list(NeighborLoader(data, fanouts, batch_size=batch_size, input_nodes=input_nodes, shuffle=True, **kwargs))


def assert_pygs_sample(batch, data: HeteroData, input_type: str, fanouts: dict) -> list[int]:
    """The batch is PyG's for its seeds, edge for edge (fanouts -1 or 0); its seeds."""
    store = batch[input_type]
    seeds = store.n_id[:store.batch_size].tolist()
    n_id, edge_index, e_id, counts_n, counts_e = pyg_hetero_subgraph(data, input_type, seeds, fanouts)
    for t in data.node_types:
        assert torch.equal(batch[t].n_id, n_id[t])
        assert batch[t].num_sampled_nodes == counts_n[t]
        assert torch.equal(batch[t].x, data[t].x[n_id[t]])
        assert "y" not in data[t] or torch.equal(batch[t].y, data[t].y[n_id[t]])
        assert batch[t].num_nodes == n_id[t].numel()
    for et in data.edge_types:
        assert batch[et].edge_index.dtype == torch.int64 and torch.equal(batch[et].edge_index, edge_index[et])
        assert torch.equal(batch[et].e_id, e_id[et])
        assert "edge_attr" not in data[et] or torch.equal(batch[et].edge_attr, data[et].edge_attr[e_id[et]])
        assert batch[et].num_sampled_edges == counts_e[et]
    return seeds


@RUNS
@given(hetero_graphs(), st.integers(1, 3), st.integers(1, 4), st.integers(0, 2), st.data())
def test_full_neighbourhood_batches_are_pygs_hetero_sample_edge_for_edge(data, hops, batch_size, kind, draw):
    edge_types = data.metadata()[1]
    fanouts = {et: draw.draw(st.lists(st.sampled_from([-1, -1, 0]), min_size=hops, max_size=hops))
               for et in edge_types}
    as_list = draw.draw(st.booleans())
    num_neighbors = [-1] * hops if as_list else fanouts
    fanouts = {et: [-1] * hops for et in edge_types} if as_list else fanouts
    input_nodes = _input(kind, data)
    seen = []
    for batch in _batches(data, num_neighbors, batch_size, input_nodes):
        seen += assert_pygs_sample(batch, data, "a", fanouts)
    want = torch.arange(data["a"].num_nodes) if isinstance(input_nodes, str) else input_nodes[1]
    want = want.nonzero().flatten() if want.dtype == torch.bool else want
    assert sorted(seen) == sorted(want.tolist())


def check_hetero_subgraph(batch, data, fanouts: dict, replace: bool) -> None:
    """PyG's sample structure: every edge is a graph edge of its type (via ``n_id`` and
    ``e_id``); hop k's edges of a type go into the vertices of its destination type that
    hop k - 1 added, each of which got ``min(deg, fanout)`` (with replacement ``fanout``
    when it has any) in-edges of that type; every vertex a hop added is a source of one
    of that hop's edges."""
    node_types, edge_types = data.metadata()
    ends = {t: torch.tensor(batch[t].num_sampled_nodes).cumsum(0).tolist() for t in node_types}
    for t in node_types:
        n_id = batch[t].n_id
        assert n_id.unique().numel() == n_id.numel() == sum(batch[t].num_sampled_nodes) == batch[t].x.shape[0]
        assert torch.equal(batch[t].x, data[t].x[n_id])
        assert "y" not in data[t] or torch.equal(batch[t].y, data[t].y[n_id])
    reached = {t: [set() for _ in ends[t]] for t in node_types}
    for et in edge_types:
        src_type, _, dst_type = et
        edge_index, e_id, counts = batch[et].edge_index, batch[et].e_id, batch[et].num_sampled_edges
        assert edge_index.shape == (2, sum(counts)) and len(counts) == len(fanouts[et])
        assert torch.equal(batch[src_type].n_id[edge_index[0]], data[et].edge_index[0, e_id])
        assert torch.equal(batch[dst_type].n_id[edge_index[1]], data[et].edge_index[1, e_id])
        assert "edge_attr" not in data[et] or torch.equal(batch[et].edge_attr, data[et].edge_attr[e_id])
        degree = torch.bincount(data[et].edge_index[1], minlength=data[dst_type].num_nodes)
        hop_end = torch.tensor(counts, dtype=torch.int64).cumsum(0).tolist()
        for k, fanout in enumerate(fanouts[et]):
            first, last = (ends[dst_type][k - 1] if k else 0), ends[dst_type][k]
            hop = edge_index[:, hop_end[k] - counts[k]:hop_end[k]]
            assert ((hop[1] >= first) & (hop[1] < last)).all() and (hop[0] < ends[src_type][k + 1]).all()
            got = torch.bincount(hop[1] - first, minlength=last - first)
            deg = degree[batch[dst_type].n_id[first:last]]
            want = (torch.zeros_like(deg) if fanout == 0 else torch.where(deg > 0, fanout, 0) if replace and fanout > 0
                    else deg if fanout < 0 else deg.clamp(max=fanout))
            assert torch.equal(got, want)
            reached[src_type][k + 1].update(hop[0].tolist())
        if not replace:
            assert e_id.unique().numel() == e_id.numel()
    for t in node_types:
        for k in range(1, len(ends[t])):
            assert set(range(ends[t][k - 1], ends[t][k])) <= reached[t][k]


@RUNS
@given(hetero_graphs(), st.sampled_from([[2], [3, 1], [1, -1], [2, 0, 1]]), st.booleans(), st.integers(1, 4),
       st.integers(0, 2))
def test_sampled_batches_have_pygs_structure(data, fanouts, replace, batch_size, kind):
    typed = {et: fanouts for et in data.edge_types}
    for batch in _batches(data, fanouts, batch_size, _input(kind, data), replace=replace):
        check_hetero_subgraph(batch, data, typed, replace)


@pytest.mark.parametrize("fanout", [1, 3, -1])
def test_a_source_type_larger_than_the_destination_type_keeps_every_sampled_source(fanout):
    """Source ids of ``b`` reach past ``a``'s count (2): the fused sampling kernels mark
    an empty slot with the CSR's row count, here source 2 of ``b``, a real vertex."""
    data = HeteroData()
    data["a"].x, data["b"].x = torch.randn(2, 2, dtype=f64), torch.randn(5, 2, dtype=f64)
    data["b", "to", "a"].edge_index = torch.tensor([[2, 4, 2, 3, 2], [0, 1, 1, 0, 0]])
    batch = next(iter(NeighborLoader(data, [fanout], batch_size=2, input_nodes="a")))
    check_hetero_subgraph(batch, data, {("b", "to", "a"): [fanout]}, replace=False)
    if fanout != 1:       # every in-edge, in edge_index order: a's vertex 0 reads b's 2, 3, 2; vertex 1 b's 4, 2
        assert batch["b"].n_id.tolist() == [2, 3, 4]


def mag_like(seed: int = 0) -> HeteroData:
    """A small ogbn-mag shape: papers citing papers, authors writing them and the reverse,
    papers with topics and the reverse; isolated papers among them."""
    gen = torch.Generator().manual_seed(seed)
    counts = {"paper": 40, "author": 25, "field": 6}
    data = HeteroData()
    for t, n in counts.items():
        data[t].x = torch.randn(n, 5, dtype=f64, generator=gen)
    data["paper"].y = torch.randint(0, 4, (counts["paper"],), generator=gen)
    data["paper"].train_mask = torch.rand(counts["paper"], generator=gen) < 0.6

    def edges(s, d, m):
        return torch.stack([torch.randint(0, counts[s], (m,), generator=gen),
                            torch.randint(0, counts[d] - 3, (m,), generator=gen)])
    data["paper", "cites", "paper"].edge_index = edges("paper", "paper", 90)
    data["author", "writes", "paper"].edge_index = edges("author", "paper", 70)
    data["paper", "rev_writes", "author"].edge_index = data["author", "writes", "paper"].edge_index.flip(0)
    data["paper", "has_topic", "field"].edge_index = edges("paper", "field", 50)
    data["field", "rev_has_topic", "paper"].edge_index = data["paper", "has_topic", "field"].edge_index.flip(0)
    return data


def sage_model(lib, layers: int) -> torch.nn.Module:
    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = torch.nn.ModuleList([lib.SAGEConv((-1, -1), 7 if i < layers - 1 else 4)
                                              for i in range(layers)])

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                x = x.relu() if i < len(self.convs) - 1 else x
            return x
    return GNN()


@pytest.mark.parametrize("library", ["pyg", "gnnfuse"])
@pytest.mark.parametrize("layers", [1, 2])
def test_to_hetero_model_on_full_neighbourhood_batches_gives_the_full_graph_output_at_the_seeds(library, layers):
    """PyG's ogbn-mag idiom, unchanged: ``model(batch.x_dict, batch.edge_index_dict)``
    read at the first ``batch_size`` papers, equal (float64, 1e-12) to the full-graph
    model's output at those papers, for as many hops as layers."""
    import torch_geometric.nn as pyg_nn

    from gnnfuse import nn as gnn
    lib, to_hetero = (pyg_nn, pyg_nn.to_hetero) if library == "pyg" else (gnn, gnn.to_hetero)
    data = mag_like()
    torch.manual_seed(1)
    model = to_hetero(sage_model(lib, layers), data.metadata(), aggr="sum").double()
    full = model(data.x_dict, data.edge_index_dict)["paper"]
    loader = NeighborLoader(data, num_neighbors=[-1] * layers, batch_size=8, shuffle=True,
                            input_nodes=("paper", data["paper"].train_mask))
    seen = 0
    for batch in loader:
        size = batch["paper"].batch_size
        out = model(batch.x_dict, batch.edge_index_dict)["paper"][:size]
        torch.testing.assert_close(out, full[batch["paper"].n_id[:size]], rtol=0, atol=1e-12)
        loss = F.cross_entropy(out, batch["paper"].y[:size])
        assert torch.isfinite(loss)
        assert torch.equal(batch["paper"].input_id, batch["paper"].n_id[:size])     # a mask: vertex ids
        seen += size
    assert seen == int(data["paper"].train_mask.sum())


def test_three_hop_full_batches_of_a_mag_like_graph_are_pygs_sample():
    """Hop 1 adds papers through three edge types (cites, rev_writes, has_topic): each
    type's new vertices are numbered edge type by edge type, in the graph's order."""
    data = mag_like(2)
    fanouts = {et: [-1, -1, -1] for et in data.edge_types}
    for batch in _batches(data, [-1, -1, -1], 3, ("paper", torch.tensor([4, 9, 33, 0, 21]))):
        assert_pygs_sample(batch, data, "paper", fanouts)
        assert all(count > 0 for count in batch["paper"].num_sampled_nodes[:3])


def test_gnnfuses_to_hetero_model_on_sampled_batches_is_pygs_with_its_state_dict():
    """PyG's idiom with fanouts and a training step: gnnfuse's ``to_hetero`` model, PyG's
    state dict loaded, gives PyG's model's output on every sampled batch (float64, 1e-12),
    through a few SGD steps."""
    import torch_geometric.nn as pyg_nn

    from gnnfuse import nn as gnn
    data = mag_like(6)
    loader = NeighborLoader(data, num_neighbors=[4, 2], batch_size=6, shuffle=True,
                            input_nodes=("paper", data["paper"].train_mask))
    torch.manual_seed(2)
    theirs = pyg_nn.to_hetero(sage_model(pyg_nn, 2), data.metadata(), aggr="sum").double()
    ours = gnn.to_hetero(sage_model(gnn, 2), data.metadata(), aggr="sum").double()
    theirs(data.x_dict, data.edge_index_dict), ours(data.x_dict, data.edge_index_dict)
    ours.load_state_dict(theirs.state_dict())
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.1)
    for batch in loader:
        size = batch["paper"].batch_size
        want = theirs(batch.x_dict, batch.edge_index_dict)["paper"][:size]
        out = ours(batch.x_dict, batch.edge_index_dict)["paper"][:size]
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
        loss = F.cross_entropy(out, batch["paper"].y[:size])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        theirs.load_state_dict(ours.state_dict())


def test_pygs_trim_to_layer_on_the_per_hop_counts_keeps_the_seeds_outputs():
    """``num_sampled_nodes_dict``/``num_sampled_edges_dict`` are what PyG's
    ``trim_to_layer`` reads: trimming each layer's input to the vertices and edges it
    still needs (which assumes PyG's hop-by-hop order) leaves the seeds' outputs as they
    were, on batches sampled with fanouts."""
    import torch_geometric.nn as pyg_nn
    from torch_geometric.utils import trim_to_layer
    data = mag_like(3)
    torch.manual_seed(3)
    convs = [pyg_nn.HeteroConv({et: pyg_nn.SAGEConv((-1, -1), 6) for et in data.edge_types}, aggr="sum").double()
             for _ in range(2)]
    for batch in _batches(data, [3, 2], 5, "paper"):
        size = batch["paper"].batch_size
        whole = batch.x_dict
        for conv in convs:
            whole = conv(whole, batch.edge_index_dict)
        x, edge_index = batch.x_dict, batch.edge_index_dict
        for layer, conv in enumerate(convs):
            x, edge_index, _ = trim_to_layer(layer, batch.num_sampled_nodes_dict, batch.num_sampled_edges_dict, x,
                                             edge_index)
            x = conv(x, edge_index)
        assert x["paper"].shape[0] == sum(batch["paper"].num_sampled_nodes[:2])     # the last level trimmed
        torch.testing.assert_close(x["paper"][:size], whole["paper"][:size], rtol=0, atol=1e-12)


def test_per_edge_type_fanouts_and_the_mag_idiom_with_fanouts():
    """A dict ``num_neighbors`` (tuple or PyG's ``'src__rel__dst'`` keys) samples each edge
    type by its own list; ids as input_nodes give PyG's ``input_id`` (positions)."""
    data = mag_like(3)
    fanouts = {("paper", "cites", "paper"): [3, 2], "author__writes__paper": [2, 0],
               ("paper", "rev_writes", "author"): [1, 1], ("paper", "has_topic", "field"): [0, 2],
               ("field", "rev_has_topic", "paper"): [-1, 1]}
    typed = {tuple(k.split("__")) if isinstance(k, str) else k: v for k, v in fanouts.items()}
    ids = torch.tensor([5, 17, 2, 30, 11])
    batches = _batches(data, fanouts, 2, ("paper", ids))
    assert [b["paper"].batch_size for b in batches] == [2, 2, 1]
    positions = torch.cat([b["paper"].input_id for b in batches])
    assert torch.equal(ids[positions], torch.cat([b["paper"].n_id[:b["paper"].batch_size] for b in batches]))
    assert sorted(positions.tolist()) == [0, 1, 2, 3, 4]
    for batch in batches:
        check_hetero_subgraph(batch, data, typed, replace=False)


def test_pygs_num_neighbors_object_and_its_default_are_read():
    """PyG's loaders take a ``NumNeighbors`` in place of a list or dict (its ``default``
    for the edge types a dict leaves out); it was refused as "not a list of fanouts"."""
    from torch_geometric.sampler.base import NumNeighbors
    data = mag_like(3)
    given = NumNeighbors({("paper", "cites", "paper"): [3, 2], "author__writes__paper": [2, 0]}, default=[1, 1])
    loader = NeighborLoader(data, given, batch_size=4, input_nodes="paper")
    assert loader.num_neighbors == {et: [3, 2] if et[1] == "cites" else [2, 0] if et[1] == "writes" else [1, 1]
                                    for et in data.edge_types}
    for batch in loader:
        check_hetero_subgraph(batch, data, loader.num_neighbors, replace=False)
    assert NeighborLoader(data, NumNeighbors([2]), input_nodes="paper").num_neighbors == {
        et: [2] for et in data.edge_types}
    with pytest.raises(ValueError, match="no fanouts for edge type"):
        NeighborLoader(data, NumNeighbors({("paper", "cites", "paper"): [3]}), input_nodes="paper")


@pytest.mark.parametrize("path", ["0", "1"])
def test_the_torch_sampler_and_the_fused_kernels_both_give_pygs_structure(monkeypatch, path):
    """``GNNFUSE_FUSED_HOPS``: 0 samples with `sample_slots`, 1 with the homogeneous
    loader's fused kernels (Numba here), for every edge type with a fanout."""
    monkeypatch.setenv("GNNFUSE_FUSED_HOPS", path)
    data = mag_like(4)
    for batch in _batches(data, [3, 2], 5, ("paper", data["paper"].train_mask)):
        check_hetero_subgraph(batch, data, {et: [3, 2] for et in data.edge_types}, replace=False)


def test_a_fanout_above_every_in_degree_samples_every_in_edge_at_the_cost_of_the_edges():
    """As the homogeneous loader's: a hop lays its sample out in ``fanout`` slots per
    destination, so ``[10**5]`` (PyG's "every in-edge") took 1.7 GB for 100 seeds and
    ``[10**7]`` was killed. Each edge type's fanout is bounded by its largest in-degree;
    the batches are the full neighbourhoods', and the user's fanouts stay the loader's."""
    data = mag_like()
    huge = NeighborLoader(data, [10**12, 10**9], batch_size=16, input_nodes="paper", prefetch=0)
    assert all(fanouts == [10**12, 10**9] for fanouts in huge.num_neighbors.values())
    for edge_type in data.edge_types:
        most = int(torch.bincount(data[edge_type].edge_index[1]).max())
        assert huge._maker.num_neighbors[edge_type] == [most, most]
    full = NeighborLoader(data, [-1, -1], batch_size=16, input_nodes="paper", prefetch=0)
    for ours, everything in zip(huge, full, strict=True):
        for node_type in data.node_types:
            assert torch.equal(ours[node_type].n_id, everything[node_type].n_id)
        for edge_type in data.edge_types:
            assert torch.equal(ours[edge_type].e_id.sort().values, everything[edge_type].e_id.sort().values)


def test_batches_are_reproducible_and_drop_last():
    data = mag_like(5)

    def epoch():
        torch.manual_seed(7)
        return [(b["paper"].n_id, b["author"].n_id, b["paper", "cites", "paper"].e_id)
                for b in NeighborLoader(data, [2, 2], batch_size=6, input_nodes="paper", shuffle=True,
                                        drop_last=True)]
    first, second = epoch(), epoch()
    assert len(first) == 40 // 6 == len(NeighborLoader(data, [2], batch_size=6, input_nodes="paper", drop_last=True))
    assert all(torch.equal(a, b) for x, y in zip(first, second) for a, b in zip(x, y))
    # shuffle=True draws the seeds in a random order, each once per epoch (drop_last aside);
    # only reproducibility was checked, so seeds taken in their given order passed
    torch.manual_seed(7)
    seeds = torch.cat([b["paper"].n_id[:b["paper"].batch_size]
                       for b in NeighborLoader(data, [2], batch_size=6, input_nodes="paper", shuffle=True)])
    assert sorted(seeds.tolist()) == list(range(40)) and seeds.tolist() != list(range(40))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"static_shapes": True}, NotImplementedError, "static_shapes=True is not offered"),
    ({"feature_device": "pinned"}, NotImplementedError, "feature_device='pinned' is not offered"),
    ({"sampler": [0, 1]}, NotImplementedError, r"sampler=\[0, 1\] is not offered"),
    ({"prefetch": -1}, ValueError, "prefetch must be >= 0"),
    ({"num_workers": -1}, ValueError, "num_workers must be >= 0"),
    ({"prefetch_threads": 0}, ValueError, "prefetch_threads must be >= 1"),
    ({"x": torch.zeros(40, 5)}, NotImplementedError, r"x=<a \[40, 5\] tensor> is not offered"),
    ({"time_attr": "time"}, NotImplementedError, "PyG's time_attr="),
    ({"fanout": 3}, TypeError, "unexpected keyword argument 'fanout'"),
    ({"input_nodes": None}, ValueError, "needs input_nodes"),
    ({"input_nodes": "venue"}, ValueError, "node type 'venue'"),
    ({"input_nodes": ("paper", torch.tensor([99]))}, ValueError, "outside .* node type 'paper'"),
    ({"input_nodes": torch.tensor([1])}, TypeError, "node type or"),
    ({"num_neighbors": {("paper", "cites", "paper"): [2]}}, ValueError, r"no fanouts for edge type\(s\)"),
    ({"num_neighbors": {("paper", "likes", "paper"): [2]}}, ValueError, "does not have"),
    ({"num_neighbors": {et: [2] if et[1] == "cites" else [2, 2] for et in mag_like().edge_types}}, ValueError,
     "different numbers of hops"),
    ({"num_neighbors": [2.5]}, TypeError, "whole numbers"),
    ({"batch_size": 0}, ValueError, "batch_size")])
def test_what_is_not_offered_or_wrong_is_refused_by_name(kwargs, error, message):
    arguments = {"num_neighbors": [2], "input_nodes": "paper", **kwargs}
    with pytest.raises(error, match=message):
        NeighborLoader(mag_like(), **arguments)


def test_a_bad_edge_index_is_refused_naming_its_edge_type():
    data = mag_like()
    data["author", "writes", "paper"].edge_index = torch.tensor([[0, 25], [1, 2]])
    with pytest.raises(ValueError, match=r"\('author', 'writes', 'paper'\)'s edge_index\[0\] holds ids outside 0..24"):
        NeighborLoader(data, [2], input_nodes="paper")
    data["author", "writes", "paper"].edge_index = torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"must be an integer tensor of shape \[2, num_edges\]"):
        NeighborLoader(data, [2], input_nodes="paper")


def test_an_edge_type_to_a_node_type_without_a_store_is_refused_and_data_left_as_it_was():
    data = HeteroData()
    data["paper"].x = torch.randn(3, 2)
    data["venue", "hosts", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="node type 'venue', which the HeteroData has no node store for"):
        NeighborLoader(data, [2], input_nodes="paper")
    assert data.node_types == ["paper"]
    data["venue"].num_nodes = 2
    batch = next(iter(NeighborLoader(data, [-1], batch_size=3, input_nodes="paper")))
    assert batch["venue"].n_id.tolist() == [0, 1] and batch["venue"].num_sampled_nodes == [0, 2]


def _attributed_mag_like() -> HeteroData:
    """`mag_like` with an edge-level attribute, a node-level one of another dtype and a
    graph-level one: every kind of attribute a batch carries across processes."""
    data = mag_like(6)
    data["paper", "cites", "paper"].edge_attr = torch.randn(90, 3, dtype=f64)
    data["author"].h_index = torch.arange(25, dtype=torch.int32)
    data.name = "mag-like"
    return data


def assert_same_hetero_batches(expected: list, got: list) -> None:
    """The same batches: every store with the same keys, each tensor equal with its dtype,
    each other value (``num_sampled_nodes``, ``batch_size``, ...) equal."""
    assert len(expected) == len(got) and expected
    for a, b in zip(expected, got):
        assert [s._key for s in a.stores] == [s._key for s in b.stores]
        for store_a, store_b in zip(a.stores, b.stores):
            assert sorted(store_a.keys()) == sorted(store_b.keys())
            for key, value in store_a.items():
                if isinstance(value, torch.Tensor):
                    assert value.dtype == store_b[key].dtype and torch.equal(value, store_b[key]), (store_a._key, key)
                else:
                    assert value == store_b[key], (store_a._key, key)


def _hetero_epochs(loader, epochs: int = 2) -> list[list]:
    torch.manual_seed(11)
    return [list(loader) for _ in range(epochs)]


def _hetero_loader(data, **kwargs):
    return NeighborLoader(data, [3, 2], batch_size=7, input_nodes=("paper", data["paper"].train_mask),
                          shuffle=True, **kwargs)


def test_a_prefetch_thread_gives_the_batches_prepared_when_asked():
    """Batches prepared ahead by ``prefetch`` threads (default 2 ahead) are those prepared
    when asked, attribute for attribute, for two epochs; the stages are timed."""
    data = _attributed_mag_like()
    plain = _hetero_epochs(_hetero_loader(data, prefetch=0))
    assert len(plain[0]) == 4 and not all(torch.equal(a["paper"].n_id, b["paper"].n_id)
                                          for a, b in zip(*plain))     # the epochs differ
    ahead = _hetero_loader(data)
    torch.manual_seed(11)
    epochs, threads = [], set()
    for _ in range(2):
        epochs.append([])
        for batch in ahead:                                 # prepared by a thread, not when asked
            epochs[-1].append(batch)
            threads |= {t.name for t in threading.enumerate() if t.is_alive()}
    assert "gnnfuse-prefetch" in threads
    for expected, got in zip(plain, epochs):
        assert_same_hetero_batches(expected, got)
    totals = ahead.stage_times.totals()
    assert ahead.stage_times.batches == 8 and totals["sample"] > 0 and totals["lookup"] > 0
    for expected, got in zip(plain, _hetero_epochs(_hetero_loader(data, prefetch=3, prefetch_threads=2))):
        assert_same_hetero_batches(expected, got)
    assert not any(t.name == "gnnfuse-prefetch" and t.is_alive() for t in threading.enumerate())


def test_worker_processes_give_the_batches_prepared_when_asked():
    """``num_workers`` processes prepare batches from a pickled `HeteroBatchMaker`; each
    ``HeteroData`` comes back packed (`loader.packing`) and is the one prepared when asked,
    store for store, for two epochs; an in-place change of a table reaches them, a replaced
    table is refused; ``close`` stops the workers, which ignore SIGINT."""
    data = _attributed_mag_like()
    plain = _hetero_epochs(_hetero_loader(data, prefetch=0))
    loader = _hetero_loader(data, num_workers=2)
    try:
        got = _hetero_epochs(loader)
        processes = loader._preparation.workers._processes
        data["author"].x.mul_(2)                    # read by the workers, as it is by PyG's
        in_place = next(iter(loader))
        data["paper"].x = data["paper"].x.clone()    # the workers hold the old one: refused
        with pytest.raises(RuntimeError, match=r"data\['paper'\]\.x was replaced after .* num_workers processes"):
            list(loader)
        ignores = [subprocess.run(["grep", "SigIgn", f"/proc/{p.pid}/status"], capture_output=True,
                                  text=True).stdout for p in processes]
    finally:
        loader.close()
    assert len(processes) == 2 and all(not p.is_alive() for p in processes)
    assert all(int(line.split()[1], 16) & (1 << 1) for line in ignores)      # SIGINT (2) ignored
    for expected, batches in zip(plain, got):
        assert_same_hetero_batches(expected, batches)
    assert in_place["author"].x.equal(data["author"].x[in_place["author"].n_id])   # shared, not copied
    assert set(got[0][0].x_dict) == {"paper", "author", "field"} and len(got[0][0].edge_index_dict) == 5
    assert loader.stage_times.batches == 8 and loader.stage_times.totals()["sample"] > 0
    assert "num_workers=2" in repr(loader)


def test_a_learnable_table_is_refused_by_prefetch_and_workers_and_read_when_asked():
    """A node table that requires grad (a learnable embedding) would be read ahead, before
    the optimizer updates it, or sent to workers without its gradient: refused by name
    unless batches are prepared when asked, whose rows then carry the gradient."""
    data = mag_like()
    data["author"].x = torch.nn.Parameter(torch.randn(25, 5, dtype=f64))
    for kwargs, why in (({}, "prefetch=2 would read"), ({"num_workers": 1}, "num_workers=1 processes")):
        with pytest.raises(ValueError, match=rf"data\['author'\]\.x requires grad .*{why}"):
            NeighborLoader(data, [2], batch_size=4, input_nodes="paper", **kwargs)
    batch = next(iter(NeighborLoader(data, [-1], batch_size=40, input_nodes="paper", prefetch=0)))
    assert batch["author"].x.requires_grad and batch["author"].num_nodes > 0


def test_a_replaced_table_is_read_and_a_replaced_edge_index_refused_by_name():
    """As PyG's loader, a batch reads the ``HeteroData``'s tables as they are when it is
    made (here, when asked); the loader samples CSRs built from each ``edge_index`` when
    it was made, so a new ``edge_index`` would reach no batch: refused by name."""
    data = mag_like()
    loader = NeighborLoader(data, [2], batch_size=8, input_nodes="paper", prefetch=0)
    assert len(list(loader)) == 5
    data["author"].x = torch.randn(25, 5, dtype=f64)
    batch = next(iter(loader))
    assert torch.equal(batch["author"].x, data["author"].x[batch["author"].n_id])
    data["author", "writes", "paper"].edge_index = data["author", "writes", "paper"].edge_index.clone()
    with pytest.raises(RuntimeError, match=r"data\[\('author', 'writes', 'paper'\)\]\.edge_index was replaced "
                                           r"after this NeighborLoader was built: its CSRs"):
        next(iter(loader))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_node_or_edge_type_added_after_the_loader_was_built_is_refused_by_name(prefetch):
    """The loader samples the node and edge types the ``HeteroData`` had when it was made;
    a type added since has no sample to cut. Cutting the batch failed on a bare
    ``KeyError: ('field', 'has', 'field')`` (or ``'venue'``) before the check that refuses
    an added ``edge_index`` by name could run: now refused by name, as that is."""
    data = mag_like()
    loader = NeighborLoader(data, [2], batch_size=8, input_nodes="paper", prefetch=prefetch)
    data["field", "has", "field"].edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(RuntimeError, match=r"data\[\('field', 'has', 'field'\)\](\.edge_index)? was added after this "
                                           r"NeighborLoader was built"):
        next(iter(loader))
    del data["field", "has", "field"]
    data["venue"].x = torch.randn(3, 2, dtype=f64)
    with pytest.raises(RuntimeError, match=r"data\['venue'\] was added after this NeighborLoader was built"):
        next(iter(loader))
    del data["venue"]
    assert len(list(loader)) == 5


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_edge_type_replaced_by_fewer_edges_is_refused_by_name_not_an_index_error(prefetch):
    """A batch cuts edge attributes from the ``HeteroData`` as it is when the batch is
    made, by ids sampled from the CSRs built when the loader was; an edge type replaced by
    a subset of its edges (``edge_index`` and ``edge_attr`` both) failed in that cut as a
    bare ``IndexError: index out of range in self``, before the check that refuses a
    replaced ``edge_index`` by name could run: now that check names it."""
    data = mag_like()
    data["author", "writes", "paper"].edge_attr = torch.randn(data["author", "writes", "paper"].num_edges, 2)
    loader = NeighborLoader(data, [-1], batch_size=40, input_nodes="paper", prefetch=prefetch)
    store = data["author", "writes", "paper"]
    keep = torch.arange(0, store.num_edges, 4)
    store.edge_index, store.edge_attr = store.edge_index[:, keep], store.edge_attr[keep]
    with pytest.raises(RuntimeError, match=r"data\[\('author', 'writes', 'paper'\)\]\.edge_index was replaced "
                                           r"after this NeighborLoader was built"):
        next(iter(loader))


def test_an_edge_index_changed_in_place_is_refused_by_name():
    """The loader samples CSRs built from each ``edge_index`` when it was made; an
    ``edge_index`` changed in place (the edges permuted, ``edge_attr`` with them: what the
    replaced-``edge_index`` error advised) reached no CSR, and the batch cut its edges'
    attributes and ``e_id`` by the old ids, silently: ``n_id[edge_index]`` was no longer
    ``data.edge_index[:, e_id]``. Now refused by name, and the advice is gone."""
    data = mag_like()
    store = data["author", "writes", "paper"]
    store.edge_attr = torch.randn(store.num_edges, 2)
    loader = NeighborLoader(data, [-1], batch_size=40, input_nodes="paper", prefetch=0)
    perm = torch.randperm(store.num_edges, generator=torch.Generator().manual_seed(0))
    store.edge_index.copy_(store.edge_index[:, perm].clone())
    store.edge_attr.copy_(store.edge_attr[perm].clone())
    with pytest.raises(RuntimeError, match=r"data\[\('author', 'writes', 'paper'\)\]\.edge_index was changed in "
                                           r"place after this NeighborLoader was built"):
        next(iter(loader))
    loader = NeighborLoader(data, [-1], batch_size=40, input_nodes="paper", prefetch=0)
    batch = next(iter(loader))
    edge_index, e_id = batch["author", "writes", "paper"].edge_index, batch["author", "writes", "paper"].e_id
    assert torch.equal(batch["author"].n_id[edge_index[0]], store.edge_index[0, e_id])
    assert torch.equal(batch["author", "writes", "paper"].edge_attr, store.edge_attr[e_id])
