"""Neighbour sampling and reindexing (`gnnfuse.loader.sampler`) and the blocks built from
them: properties on random small multigraphs (self loops, repeated edges, a hub), checked
against the graph itself rather than against a second sampler."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import gnnfuse
from gnnfuse.loader import LinkNeighborLoader, NeighborLoader, block_graph, reindex, sample_block, sample_hop
from gnnfuse.graph.fixed_shape import build_reverse_csr
from gnnfuse.loader.batch_maker import rows_of
from graph_strategies import graphs

RUNS = settings(max_examples=15, deadline=None, derandomize=True, database=None)


def full_csr(case):
    csr = gnnfuse.Graph.from_edge_index(case.edge_index, case.num_nodes).csr()
    return csr.rowptr.long(), csr.col.long()


@st.composite
def hops(draw):
    case = draw(graphs(max_nodes=7, max_edges=20, hub_degrees=st.sampled_from([0, 9])))
    seeds = draw(st.lists(st.integers(0, case.num_nodes - 1), min_size=1, max_size=case.num_nodes, unique=True))
    return case, torch.tensor(seeds), draw(st.sampled_from([1, 2, 3, -1])), draw(st.booleans()), draw(st.integers(0, 99))


@RUNS
@given(hops())
def test_sampled_edges_exist_and_follow_the_fanout(drawn):
    case, seeds, fanout, replace, seed = drawn
    rowptr, col = full_csr(case)
    hop = sample_hop(rowptr, col, seeds, fanout, replace, torch.Generator().manual_seed(seed))
    deg = rowptr[seeds + 1] - rowptr[seeds]
    counts = hop.rowptr.diff()
    assert hop.rowptr[0] == 0 and bool((counts >= 0).all()) and hop.rowptr[-1] == hop.src.numel()
    for i, s in enumerate(seeds.tolist()):
        eids = hop.eid[hop.rowptr[i]:hop.rowptr[i + 1]]
        lo, hi = int(rowptr[s]), int(rowptr[s + 1])
        assert bool(((eids >= lo) & (eids < hi)).all()), "a sampled edge is not an in-edge of its destination"
        assert torch.equal(hop.src[hop.rowptr[i]:hop.rowptr[i + 1]], col[eids])
        assert bool((hop.dst[hop.rowptr[i]:hop.rowptr[i + 1]] == i).all())
        d = int(deg[i])
        if fanout == -1 or (not replace and d <= fanout):
            assert sorted(eids.tolist()) == list(range(lo, hi)), "degree <= fanout must keep every in-edge"
        elif replace:
            assert eids.numel() == (fanout if d else 0)
        else:
            assert eids.numel() == fanout and eids.unique().numel() == fanout, "duplicate without replacement"


@RUNS
@given(hops())
def test_reindex_puts_destinations_first_and_maps_back(drawn):
    case, seeds, fanout, replace, seed = drawn
    rowptr, col = full_csr(case)
    hop = sample_hop(rowptr, col, seeds, fanout, replace, torch.Generator().manual_seed(seed))
    nodes, local = reindex(seeds, hop.src)
    assert torch.equal(nodes[:seeds.numel()], seeds)
    assert nodes.unique().numel() == nodes.numel()
    assert torch.equal(nodes[local], hop.src)
    assert set(nodes.tolist()) == set(seeds.tolist()) | set(hop.src.tolist())
    graph = block_graph(hop.rowptr, local, hop.dst, nodes.numel())
    fresh = gnnfuse.Graph(local, hop.dst, seeds.numel(), num_src_nodes=nodes.numel())     # sorts for its CSR
    for ours, sorted_ in zip(graph.csr(), fresh.csr()):
        assert torch.equal(ours, sorted_), "the block's CSR differs from the one a sort builds"
    for ours, sorted_ in zip(build_reverse_csr(graph), fresh.reverse_csr()):
        assert ours.dtype == sorted_.dtype and torch.equal(ours, sorted_), "the block's reverse CSR differs"
    assert torch.equal(graph.in_degrees(), fresh.in_degrees())
    assert torch.equal(graph.out_degrees(), fresh.out_degrees())


def test_sampling_without_replacement_is_uniform():
    # one destination with 6 in-edges, fanout 2: each edge is kept with probability 1/3
    rowptr, col = torch.tensor([0, 6]), torch.arange(6)
    gen = torch.Generator().manual_seed(0)
    seeds = torch.zeros(3000, dtype=torch.int64)
    hop = sample_hop(rowptr, col, seeds, 2, False, gen)
    pairs = hop.eid.view(-1, 2)
    assert bool((pairs[:, 0] != pairs[:, 1]).all())
    share = torch.bincount(hop.eid, minlength=6).double() / 3000
    torch.testing.assert_close(share, torch.full((6,), 1 / 3, dtype=torch.float64), atol=0.04, rtol=0)


@pytest.mark.parametrize("replace", [False, True])
def test_every_in_edge_of_a_hub_past_float32s_resolution_can_be_drawn(replace):
    # one vertex with 2**25 in-edges (its column a stride-0 view: nothing materialised).
    # Offsets drawn as float32 uniforms times the degree were all even there (a float32
    # in [0, 1) holds 24 random bits), so half the in-edges were never sampled, with or
    # without replacement; at 10**7 in-edges some were drawn twice as often as others
    degree = 2**25
    rowptr, col = torch.tensor([0, degree]), torch.zeros(1, dtype=torch.int64).expand(degree)
    hop = sample_hop(rowptr, col, torch.zeros(4096, dtype=torch.int64), 1, replace, torch.Generator().manual_seed(0))
    odd = int((hop.eid % 2).sum())
    assert 1800 < odd < 2300, f"{odd} of 4096 draws took an odd in-edge, where half of them should"


def test_with_replacement_every_in_edge_can_be_drawn():
    """Draws with replacement are uniform over all ``deg`` in-edges, the last one too: 300
    draws from a vertex of 3 in-edges take each about 100 times."""
    rowptr, col = torch.tensor([0, 3]), torch.tensor([4, 5, 6])
    hop = sample_hop(rowptr, col, torch.tensor([0]), 300, True, torch.Generator().manual_seed(0))
    counts = torch.bincount(hop.eid, minlength=3)
    assert hop.eid.numel() == 300 and bool((counts > 70).all()), counts.tolist()


@RUNS
@given(graphs(max_nodes=8, max_edges=24, hub_degrees=st.sampled_from([0, 7])), st.integers(1, 4),
       st.integers(0, 99))
def test_loader_blocks_chain_and_carry_the_batch(case, batch_size, seed):
    features = torch.randn(case.num_nodes, 3)
    labels = torch.arange(case.num_nodes)
    torch.manual_seed(seed)
    loader = NeighborLoader(gnnfuse.Graph.from_edge_index(case.edge_index, case.num_nodes), [2, 3],
                            batch_size=batch_size, shuffle=True, x=features, y=labels, prefetch=0)
    seen = []
    for batch in loader:
        first, second = batch.blocks
        assert torch.equal(second.src_nodes[:second.num_dst], batch.input_id)
        assert torch.equal(first.src_nodes[:first.num_dst], second.src_nodes), "layer outputs feed the next layer"
        assert torch.equal(batch.n_id, first.src_nodes) and torch.equal(batch.x, features[batch.n_id])
        assert torch.equal(batch.y, labels[batch.input_id])
        for block in batch.blocks:   # every block edge is an edge of the graph
            src, dst = block.src_nodes[block.graph.src], block.src_nodes[block.graph.dst]
            edges = set(zip(case.edge_index[0].tolist(), case.edge_index[1].tolist()))
            assert set(zip(src.tolist(), dst.tolist())) <= edges
        seen += batch.input_id.tolist()
    assert sorted(seen) == list(range(case.num_nodes)) and len(loader) == -(-case.num_nodes // batch_size)


@pytest.mark.parametrize("table", [torch.arange(50) * 7, torch.arange(100)[::2], torch.randn(50, 3)],
                         ids=["labels", "strided labels", "feature rows"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_rows_of_a_table_are_index_selects(table, dtype):
    """`rows_of` takes a label table's rows by ``torch.take`` (why: its docstring): the
    same values as ``index_select`` for every table and id type the loader reads."""
    ids = torch.tensor([3, 0, 49, 3, 17], dtype=dtype)
    assert torch.equal(rows_of(table, ids), table.index_select(0, ids))


def test_loader_reads_a_pyg_data_and_input_mask():
    from torch_geometric.data import Data
    data = Data(x=torch.randn(5, 2), y=torch.arange(5), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]))
    mask = torch.tensor([False, True, False, True, True])
    batches = list(NeighborLoader(data, [-1], batch_size=2, input_nodes=mask))
    assert [b.input_id.tolist() for b in batches] == [[1, 3], [4]]
    assert batches[0].blocks[0].edge_index.tolist() == [[2, 3], [0, 1]]   # 0->1, 2->3 with local ids
    assert torch.equal(batches[0].x, data.x[[1, 3, 0, 2]])


@pytest.mark.parametrize("input_nodes, extra", [
    (None, {}), (torch.tensor([False, True, False, True, True, True, False]), {}), (torch.tensor([5, 1, 3, 6]), {}),
    (torch.tensor([5, 1, 3, 6]), {"prefetch": 2}), (torch.tensor([5, 1, 3, 6]), {"num_workers": 1})],
    ids=["all", "mask", "ids", "ids-prefetch", "ids-worker"])
def test_input_id_is_pygs_for_every_kind_of_input_nodes(input_nodes, extra):
    """``input_id`` as PyG's loader gives it (its own ``get_input_nodes`` and
    ``NodeSamplerInput`` are the oracle: PyG's sampler itself needs pyg-lib): for seeds
    given as ids, each seed's position in ``input_nodes``; for a mask or all vertices,
    its vertex id. gnnfuse gave vertex ids for ids too: ``input_nodes=[5, 1, 3, 6]`` in
    batches of 2 gave ``input_id`` [5, 1], [3, 6] where PyG gives [0, 1], [2, 3], so
    ``predictions[batch.input_id] = out`` wrote rows of another seed (or past the end)."""
    from torch_geometric.data import Data
    from torch_geometric.loader.utils import get_input_nodes
    from torch_geometric.sampler import NodeSamplerInput
    data = Data(x=torch.randn(7, 2), edge_index=torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]), num_nodes=7)
    _, nodes, input_id = get_input_nodes(data, input_nodes)
    pyg = NodeSamplerInput(input_id, nodes)
    torch.manual_seed(0)
    loader = NeighborLoader(data, [1], batch_size=2, input_nodes=input_nodes, shuffle=True, **{"prefetch": 0, **extra})
    seen = 0
    for batch in loader:
        seeds = batch.n_id[:batch.batch_size]
        positions = torch.tensor([int((nodes == seed).nonzero()) for seed in seeds])
        assert batch.input_id.tolist() == pyg[positions].input_id.tolist()
        seen += batch.batch_size
    loader.close()
    assert seen == nodes.numel()


@pytest.mark.parametrize("extra", [{}, {"prefetch": 2}, {"num_workers": 1}], ids=["plain", "prefetch", "worker"])
def test_no_seeds_is_no_batch(extra):
    """An all-False mask (or a sampler's empty share): ``len`` said 0 but one batch of 0
    seeds came out, whose mean loss is NaN (splitting an empty tensor gives one chunk)."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 4)
    loader = NeighborLoader(graph, [2], batch_size=2, input_nodes=torch.zeros(4, dtype=torch.bool),
                            x=torch.randn(4, 3), y=torch.arange(4), **{"prefetch": 0, **extra})
    assert len(loader) == 0 and list(loader) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"num_neighbors": []}, "num_neighbors"), ({"num_neighbors": [-2]}, "num_neighbors"),
    ({"batch_size": 0}, "batch_size"), ({"input_nodes": torch.tensor([0, 0])}, "repeated"),
    ({"input_nodes": torch.tensor([9])}, "outside"), ({"feature_device": "pinned"}, "CUDA"),
    # a mask of another length than the vertex count: a short one dropped seeds silently
    ({"input_nodes": torch.tensor([True, True])}, "mask has 2 entries but the graph has 3 nodes"),
    ({"x": torch.zeros(2, 1)}, "rows")])
def test_loader_rejects_bad_arguments(kwargs, message):
    graph = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    arguments = {"num_neighbors": [2], **kwargs}
    with pytest.raises(ValueError, match=message):
        NeighborLoader(graph, **arguments)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"num_neighbors": [2.5]}, TypeError, r"whole numbers .* got \[2.5\]"),
    ({"num_neighbors": {("v", "to", "v"): [2]}}, TypeError, "heterogeneous"),
    ({"num_neighbors": 2}, TypeError, "a list of fanouts"),
    ({"batch_size": 2.5}, ValueError, "batch_size must be a whole number"),
    ({"batch_size": torch.tensor([1])}, ValueError, "PyG's third positional argument is input_nodes")])
def test_fanouts_and_batch_sizes_that_are_not_whole_numbers_are_refused_by_name(kwargs, error, message):
    """A fanout of 2.5 sampled 2 in-edges per vertex without a word (``int(2.5)``); a
    per-edge-type dict failed on ``int()`` of a key, a bare int on "not iterable", a
    batch size of 2.5 only at the first batch, in ``split``; and PyG's third positional
    argument, ``input_nodes``, as ``tensor([1])`` was taken for a batch size of 1."""
    graph = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    with pytest.raises(error, match=message):
        NeighborLoader(graph, **{"num_neighbors": [2], **kwargs})


@pytest.mark.parametrize("name, value", [("x", np.ones((3, 2))), ("y", [0, 1, 2]), ("y", np.arange(3))])
def test_a_data_s_features_or_labels_that_are_not_tensors_are_refused_by_name(name, value):
    """A PyG ``Data`` may hold NumPy arrays or lists; as ``x`` or ``y`` they failed on
    "'numpy.ndarray' object has no attribute 'dim'", naming neither."""
    from torch_geometric.data import Data
    data = Data(edge_index=torch.tensor([[0, 1], [1, 2]]), num_nodes=3, **{name: value})
    with pytest.raises(TypeError, match=f"{name} must be a tensor with a row per node, got {type(value).__name__}"):
        NeighborLoader(data, [2])


@pytest.mark.parametrize("option, value", [("disjoint", True), ("time_attr", "time"), ("subgraph_type", "induced"),
                                           ("directed", False), ("transform", abs)])
def test_pygs_other_sampling_options_are_refused_by_name(option, value):
    """PyG's NeighborLoader options gnnfuse has no counterpart for failed as Python's bare
    "unexpected keyword argument"; asked for PyG's own default they are accepted, since
    gnnfuse samples so."""
    graph = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    with pytest.raises(NotImplementedError, match=f"PyG's {option}=.*not supported"):
        NeighborLoader(graph, [2], **{option: value})
    from torch_geometric.sampler.base import SubgraphType
    loader = NeighborLoader(graph, [2], disjoint=False, subgraph_type=SubgraphType.directional, directed=True,
                            time_attr=None, is_sorted=True, persistent_workers=True)
    assert sum(batch.batch_size for batch in loader) == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'fanout'"):
        NeighborLoader(graph, [2], fanout=3)


def test_pygs_generator_fixes_the_epochs_and_dataloader_arguments_are_refused_by_name():
    """PyG's loaders pass torch DataLoader's arguments on: ``generator=`` (a reproducible
    shuffle) and ``worker_init_fn``/``timeout``/... failed as Python's bare "unexpected
    keyword argument". A generator now draws the epoch's seed (order and samples);
    the DataLoader's own arguments are refused naming the DataLoader."""
    from torch_geometric.data import Data
    graph = gnnfuse.Graph(torch.randint(0, 40, (300,)), torch.randint(0, 40, (300,)), 40)
    data = Data(edge_index=torch.stack([graph.src, graph.dst]), num_nodes=40)

    def epoch(loader):
        return [(b.n_id.tolist(), b.edge_index.tolist()) for b in loader]
    for make in (lambda g: NeighborLoader(graph, [3, 2], batch_size=8, shuffle=True, generator=g),
                 lambda g: LinkNeighborLoader(data, [3], batch_size=16, shuffle=True, neg_sampling="binary",
                                              generator=g)):
        torch.manual_seed(0)
        first = epoch(make(torch.Generator().manual_seed(7)))
        torch.manual_seed(1)        # the global generator no longer decides
        assert epoch(make(torch.Generator().manual_seed(7))) == first
        assert epoch(make(torch.Generator().manual_seed(8))) != first
    with pytest.raises(TypeError, match="generator must be a torch.Generator, got int"):
        NeighborLoader(graph, [2], generator=7)
    for name, value in (("worker_init_fn", print), ("timeout", 5), ("prefetch_factor", 4)):
        with pytest.raises(TypeError, match=f"torch DataLoader's {name}= has no counterpart here"):
            NeighborLoader(graph, [2], **{name: value})
        with pytest.raises(TypeError, match=f"torch DataLoader's {name}= has no counterpart here"):
            LinkNeighborLoader(data, [2], **{name: value})


@pytest.mark.parametrize("input_nodes", ["paper", ("paper", torch.tensor([0, 1])), ("paper", None), {"paper": 1}])
def test_input_nodes_that_are_not_ids_or_a_mask_are_refused_by_name(input_nodes):
    """PyG's heterogeneous forms (a node type, or a node type with its ids) failed inside
    ``torch.as_tensor`` with "too many dimensions 'str'" or "invalid data type 'str'",
    naming neither ``input_nodes`` nor what it may hold."""
    graph = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    with pytest.raises(TypeError, match="input_nodes must be"):
        NeighborLoader(graph, [2], input_nodes=input_nodes)


def test_a_boolean_mask_that_is_not_one_dimensional_is_refused_by_name():
    """A ``[N, 1]`` mask (``train_mask.unsqueeze(1)``, a column read from a table) has N
    entries, as the count check asked, but ``nonzero().flatten()`` interleaved its row and
    column ids: mask rows 3, 5, 8 gave seeds 3, 0, 5, 0, 8, 0, and the first batch of 4
    held vertices 3, 0, 5, 10 (10's features and label as a seed's, 0 as one, neither in
    the mask) without a word. Refused by name, for a node type's mask too."""
    from torch_geometric.data import HeteroData
    graph = gnnfuse.Graph(*torch.randint(0, 12, (2, 40), generator=torch.Generator().manual_seed(0)), 12)
    mask = torch.zeros(12, 1, dtype=torch.bool)
    mask[[3, 5, 8]] = True
    with pytest.raises(ValueError, match=r"input_nodes mask must be 1-D .* got shape \[12, 1\]"):
        NeighborLoader(graph, [2], input_nodes=mask, batch_size=4)
    hetero = HeteroData()
    hetero["a"].num_nodes = 12
    hetero["a", "to", "a"].edge_index = graph.edge_index
    with pytest.raises(ValueError, match=r"input_nodes mask must be 1-D .* node type 'a'"):
        NeighborLoader(hetero, [2], input_nodes=("a", mask), batch_size=4)
    seeds = [int(b.n_id[:b.batch_size].max()) for b in NeighborLoader(graph, [2], input_nodes=mask.view(-1),
                                                                     batch_size=4, prefetch=0)]
    assert seeds == [8]


def test_whole_fanouts_come_as_any_integer_sequence_and_an_empty_seed_list_is_no_batch():
    graph = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    from torch_geometric.sampler.base import NumNeighbors      # PyG's loaders take one too
    for fanouts in ([2, -1], (2, -1), np.array([2, -1]), torch.tensor([2, -1]), NumNeighbors([2, -1])):
        assert NeighborLoader(graph, fanouts, batch_size=np.int64(2)).num_neighbors == [2, -1]
    loader = NeighborLoader(graph, [2], input_nodes=[], prefetch=0)     # was "got torch.float32 of shape [0]"
    assert len(loader) == 0 and list(loader) == []


def test_a_fanout_above_every_in_degree_samples_every_in_edge_at_the_cost_of_the_edges():
    """A hop lays its sample out in ``fanout`` slots per destination: ``[10**12]`` (PyG's
    fine) asked for 8 TB, ``[10**6]`` took 5 GB for 87 seeds. Without replacement the
    sampler gets the fanout bounded by the largest in-degree; the batches are the full
    neighbourhoods', and the user's fanouts stay the loader's."""
    gen = torch.Generator().manual_seed(0)
    graph = gnnfuse.Graph(*torch.randint(0, 200, (2, 1000), generator=gen), 200)
    huge = NeighborLoader(graph, [10**12, 10**9], batch_size=50, prefetch=0)
    full = list(NeighborLoader(graph, [-1, -1], batch_size=50, prefetch=0))
    assert huge.num_neighbors == [10**12, 10**9]
    for ours, everything in zip(huge, full, strict=True):
        assert torch.equal(ours.n_id, everything.n_id) and torch.equal(ours.edge_index, everything.edge_index)
    most = int(graph.in_degrees().max())
    assert huge._maker.num_neighbors == (most, most)


def test_a_fanout_above_every_in_degree_with_replacement_draws_the_fanout():
    """With replacement a destination of in-degree > 0 gets ``fanout`` draws, as PyG's
    sampler gives it, however small its in-degree: bounding the fanout by the largest
    in-degree (which without replacement changes nothing) would draw fewer."""
    graph = gnnfuse.Graph(torch.tensor([0, 2, 1]), torch.tensor([1, 1, 2]), 3)     # in-degrees 0, 2, 1
    batch = next(iter(NeighborLoader(graph, [5], input_nodes=[1, 2], batch_size=2, replace=True, prefetch=0)))
    block = batch.blocks[0]
    assert block.graph.num_edges == 10 and block.graph.in_degrees().tolist() == [5, 5]
    assert batch.num_sampled_edges == [10]


def test_a_learnable_feature_table_is_read_fresh_on_demand_or_refused():
    """``x`` an ``nn.Parameter`` (a learnable embedding): with the default prefetch a
    batch's rows were read before the optimizer stepped on the batches before it (after
    ``x.mul_(2)`` per batch the next batch held rows 2x or 4x too small, by the thread's
    timing), and a worker failed with "a loader batch holds only plain dense tensors"."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), 4)
    x = torch.nn.Parameter(torch.arange(4.0).unsqueeze(1))
    with pytest.raises(ValueError, match="x requires grad .* prefetch=2 would read its rows for batches ahead"):
        NeighborLoader(graph, [1], x=x)
    with pytest.raises(ValueError, match="num_workers=1 processes would send its rows without their gradient"):
        NeighborLoader(graph, [1], x=x, num_workers=1)
    for batch in NeighborLoader(graph, [1], batch_size=1, x=x, prefetch=0):
        assert torch.equal(batch.x, x[batch.n_id]) and batch.x.requires_grad
        with torch.no_grad():
            x.mul_(2)


@pytest.mark.parametrize("positions, message", [
    ([0, 1, 0], "a position twice"), ([0, -1], "outside 0..3"),
    ([[0, 1], [2, 3]], "one whole-number position at a time"), ([0.5, 2.0], "one whole-number position at a time")])
def test_a_sampler_that_repeats_a_seed_or_leaves_input_nodes_is_refused(positions, message):
    """A sampler's seeds 0, 1, 0 in one batch made a block whose destinations were
    vertices 0, 1, 3 (one row for both 0s), so the third output row had vertex 3's
    features and vertex 0's in-edges; a position of -1 took the last seed. Positions
    0.5 and 2.0 were truncated to seeds 0 and 2 without a word, and a ``BatchSampler``'s
    lists of positions failed inside the sampler's kernels (a Numba typing error)."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), 4)
    loader = NeighborLoader(graph, [1], batch_size=3, sampler=positions, prefetch=0)
    with pytest.raises(ValueError, match=message):
        list(loader)


def test_an_unindexed_cuda_device_means_the_current_one(monkeypatch):
    # tensors report cuda:0, and torch.device("cuda") != torch.device("cuda:0"): features already
    # on the GPU were taken for host features and moved back to the host
    from gnnfuse.loader.batch_move import target_device
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert target_device("cuda") == torch.device("cuda:0") and target_device("cuda:1") == torch.device("cuda:1")
    assert target_device("cpu") == torch.device("cpu")


def _counted(run):
    from gnnfuse.bench.host_syncs import HostSyncCounter
    counter = HostSyncCounter()
    with counter:
        run()
    return dict(counter.syncs)


def _small_csr():
    generator = torch.Generator().manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 30, (200,), generator=generator),
                          torch.randint(0, 30, (200,), generator=generator), 30)
    return graph.csr().rowptr.long(), graph.csr().col.long(), generator


@pytest.mark.parametrize("fanout, replace", [(3, False), (3, True)])
def test_a_sampled_block_reads_back_once(fanout, replace):
    """On a GPU every value read back stalls the loader's stream: a hop with a fanout
    reads its edge count, its frontier's size and its unread destinations' count in one
    transfer (it read back the first two apart, and mask indexing would add more)."""
    rowptr, col, generator = _small_csr()
    seeds = torch.arange(0, 30, 3)                 # some rows exceed 3, some do not
    assert _counted(lambda: sample_block(rowptr, col, seeds, fanout, replace, generator)) == {"Tensor.tolist": 1}
    hop = sample_hop(rowptr, col, seeds, fanout, replace, generator)
    assert _counted(lambda: reindex(seeds, hop.src)) == {"Tensor.tolist": 1}
    assert _counted(lambda: sample_hop(rowptr, col, seeds, -1)) == {"Tensor.tolist": 1}     # read once, not twice


@RUNS
@given(hops())
def test_a_sampled_block_is_sample_hop_then_reindex(drawn):
    case, seeds, fanout, replace, seed = drawn
    rowptr, col = full_csr(case)
    block = sample_block(rowptr, col, seeds, fanout, replace, torch.Generator().manual_seed(seed))
    hop = sample_hop(rowptr, col, seeds, fanout, replace, torch.Generator().manual_seed(seed))
    nodes, local = reindex(seeds, hop.src)
    for ours, theirs in ((block.rowptr, hop.rowptr), (block.dst, hop.dst), (block.eid, hop.eid),
                         (block.nodes, nodes), (block.local_src, local)):
        assert torch.equal(ours, theirs)
    leaves = set(local[local < seeds.numel()].tolist())
    assert block.unread_dst.tolist() == [d for d in range(seeds.numel()) if d not in leaves]
    out_degrees = torch.bincount(local, minlength=nodes.numel())
    assert torch.equal(block.out_degrees, out_degrees) and block.max_out_degree == int(out_degrees.max())


def test_floyd_resolved_at_once_picks_what_the_sequential_algorithm_picks():
    from gnnfuse.loader.sampler import _floyd_offsets
    deg = torch.randint(0, 30, (300,), generator=torch.Generator().manual_seed(1))
    for fanout in (1, 2, 5, 8, 13):
        ours = _floyd_offsets(deg, fanout, torch.Generator().manual_seed(fanout))
        draws = torch.randint(2**62, (deg.numel(), fanout), generator=torch.Generator().manual_seed(fanout))
        for row in torch.nonzero(deg > fanout).flatten().tolist():
            taken = []
            for i in range(fanout):
                j = int(deg[row]) - fanout + i
                t = int(draws[row, i]) % (j + 1)
                taken.append(j if t in taken else t)
            assert ours[row].tolist() == taken


def test_a_batch_reads_back_once_per_hop(backend, device, monkeypatch):
    """Preparing a batch (sampling, reindexing, the blocks' graphs and what their layers
    read) reads back one transfer per hop: the blocks' graphs skip `Graph`'s range
    checks (ids the sampler made), the rows a combine-first layer reads come from the
    sampler, and so does the out-degree bound that spares the Triton segments of the
    reverse CSR their count. It was 2 reads per hop, 4 per block graph, 3 per block's
    rows and 2 per block's Triton segments. On a CPU the torch hops are counted: the
    Numba hops that run there by default read their host tensors as they please."""
    if device == "cpu":
        monkeypatch.setenv("GNNFUSE_FUSED_HOPS", "0")
    generator = torch.Generator().manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 30, (200,), generator=generator),
                          torch.randint(0, 30, (200,), generator=generator), 30).to(device)
    loader = NeighborLoader(graph, [4, 3, 2], batch_size=5, shuffle=True, x=torch.randn(30, 2, device=device),
                            prefetch=0)
    batches = iter(loader)
    next(batches)                                  # the epoch's start draws its seed on the host
    read = "Tensor.tolist" if device == "cpu" else "aten._to_copy.default"     # a CUDA tensor's: its copy
    assert _counted(lambda: next(batches)) == {read: 3}


def test_a_block_graph_of_sampled_ids_skips_the_range_checks_others_keep_them():
    rowptr, src, dst = torch.tensor([0, 2, 3]), torch.tensor([2, 0, 1]), torch.tensor([0, 0, 1])
    assert _counted(lambda: block_graph(rowptr, src, dst, 3, sampled=True)) == {}
    assert _counted(lambda: block_graph(rowptr, src, dst, 3)) == {"Tensor.tolist": 1}    # the checks' one read
    with pytest.raises(ValueError, match="num_src_nodes"):
        block_graph(rowptr, torch.tensor([2, 0, 5]), dst, 3)
    # one vertex set (PyG's subgraph): as many vertices as rows, or the cached
    # out-degrees (num_src entries) would not match the graph's vertex count
    looped = block_graph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([0, 1]), 2, one_vertex_set=True)
    assert looped.num_nodes == 2 and looped.out_degrees().tolist() == [1, 1]
    with pytest.raises(ValueError, match="a graph of one vertex set has a row per vertex: 3 vertices, 2 rows"):
        block_graph(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([0, 1]), 3, one_vertex_set=True)


def test_the_sync_counter_sees_a_cpu_tensor_read_into_python():
    assert _counted(lambda: torch.arange(3).tolist()) == {"Tensor.tolist": 1}
    assert _counted(lambda: torch.arange(3).numpy()) == {"Tensor.numpy": 1}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=40), st.booleans())
def test_first_occurrence_numbering_matches_a_python_walk(values, with_missing):
    """Distinct values numbered in order of first appearance, each entry mapped to its
    value's number; the ``missing`` value (6 here) gets no number and is not counted."""
    from gnnfuse.loader.sampler import first_occurrence_ids
    missing = 6 if with_missing else None
    ids: dict[int, int] = {}
    for v in values:
        if v != missing and v not in ids:
            ids[v] = len(ids)
    local, nodes, count = first_occurrence_ids(torch.tensor(values, dtype=torch.int64), missing)
    assert int(count) == len(ids)
    assert nodes[:len(ids)].tolist() == list(ids)
    assert [int(i) for i, v in zip(local, values) if v != missing] == [ids[v] for v in values if v != missing]


@pytest.mark.parametrize("seeds", [12, 13])
def test_drop_last_drops_only_a_short_last_batch_and_len_counts_the_batches(seeds):
    """As torch's DataLoader: ``drop_last`` drops a last batch smaller than
    ``batch_size`` and keeps a full one, and ``len`` is the number of batches yielded
    (a full last batch dropped, and a len counting the dropped one, had passed)."""
    graph = gnnfuse.Graph(torch.arange(20), (torch.arange(20) + 1) % 20, 20)
    for drop_last in (False, True):
        loader = NeighborLoader(graph, [1], batch_size=4, input_nodes=torch.arange(seeds), drop_last=drop_last)
        sizes = [batch.batch_size for batch in loader]
        expected = [4, 4, 4] + ([1] if seeds == 13 and not drop_last else [])
        assert sizes == expected and len(loader) == len(expected)
