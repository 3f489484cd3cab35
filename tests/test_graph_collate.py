"""`loader.graph_collate` against PyG's ``Batch.from_data_list``: every attribute, the
``batch``/``ptr`` vectors and the slice and increment tables, for graphs from a list
and from an ``InMemoryDataset``; and `gnnfuse.loader.DataLoader` against PyG's loader."""
from __future__ import annotations

import pickle

import pytest
import torch

pyg_data = pytest.importorskip("torch_geometric.data")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch_geometric.data import Batch, Data, InMemoryDataset  # noqa: E402
from torch_geometric.loader import DataLoader as PyGDataLoader  # noqa: E402

import gnnfuse.loader  # noqa: E402
from gnnfuse.loader.graph_collate import GraphSelection, collate_graphs, gather_graphs, selecting_view  # noqa: E402
from gnnfuse.loader.packed_batch import for_transfer  # noqa: E402
from gnnfuse.loader.padded_graph_batch import GraphCapacities, pad_graph_batch, padded_capacities, unpadded  # noqa: E402


def assert_same_batch(ours, theirs) -> None:
    assert type(ours) is type(theirs)
    assert list(ours.keys()) == list(theirs.keys())
    for key in theirs.keys():
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key
    assert ours.num_graphs == theirs.num_graphs and ours.num_nodes == theirs.num_nodes
    assert ours.num_edges == theirs.num_edges
    for table in ("_slice_dict", "_inc_dict"):
        mine, pygs = getattr(ours, table), getattr(theirs, table)
        assert list(mine) == list(pygs), table
        for key in pygs:
            assert mine[key].dtype == pygs[key].dtype and torch.equal(mine[key], pygs[key]), (table, key)
    for a, b in zip(ours.to_data_list(), theirs.to_data_list()):
        assert list(a.keys()) == list(b.keys())
        for key in b.keys():
            assert torch.equal(a[key], b[key]), key


class Graphs(InMemoryDataset):
    """An in-memory data set over a list of graphs, as PyG's data sets store them."""

    def __init__(self, graphs, transform=None):
        super().__init__(None, transform=transform)
        self.data, self.slices = self.collate(graphs)


@st.composite
def graph_lists(draw):
    """Lists of graphs with the same attributes: vertex features (or positions only),
    edges (int64 or int32, some graphs without edges or vertices), edge features,
    graph labels of several shapes, vertex labels."""
    count = draw(st.integers(1, 7))
    features = draw(st.sampled_from(["x", "pos", "x+pos"]))
    edge_attr = draw(st.booleans())
    label = draw(st.sampled_from(["none", "scalar", "one", "row", "vertex"]))
    index_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    graphs = []
    for _ in range(count):
        n = draw(st.integers(0, 6))
        m = draw(st.integers(0, 8)) if n else 0
        attrs = {}
        if "x" in features:
            attrs["x"] = torch.randn(n, 3, generator=gen)
        attrs["edge_index"] = torch.randint(0, max(n, 1), (2, m), generator=gen).to(index_dtype)
        if "pos" in features:
            attrs["pos"] = torch.randn(n, 2, generator=gen, dtype=torch.float64)
        if edge_attr:
            attrs["edge_attr"] = torch.randn(m, 4, generator=gen)
        if label == "scalar":
            attrs["y"] = torch.tensor(int(torch.randint(0, 3, (1,), generator=gen)))
        elif label == "one":
            attrs["y"] = torch.randint(0, 3, (1,), generator=gen)
        elif label == "row":
            attrs["y"] = torch.randn(1, 2, generator=gen)
        elif label == "vertex":
            attrs["y"] = torch.randint(0, 3, (n,), generator=gen)
        graphs.append(Data(**attrs))
    return graphs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_lists())
def test_collated_graphs_are_pygs_batch(graphs):
    ours = collate_graphs(graphs)
    assert ours is not None, "plain Data graphs must take the fast path"
    assert_same_batch(ours, Batch.from_data_list(graphs))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_lists(), st.data())
def test_gathered_graphs_are_pygs_batch(graphs, data):
    dataset = Graphs(graphs)
    if data.draw(st.booleans()):            # a subset in another order, as dataset[perm] or shuffle() make
        perm = data.draw(st.permutations(range(len(graphs))))
        dataset = dataset[torch.tensor(perm[:max(1, len(perm) - 1)])]
    positions = data.draw(st.lists(st.integers(0, len(dataset) - 1), min_size=1, max_size=8))
    ours = gather_graphs(GraphSelection(dataset, positions))
    if len(graphs) == 1:        # PyG stores a lone graph whole, without slices: left to PyG
        assert ours is None
        return
    assert ours is not None, "an InMemoryDataset of plain Data graphs must take the fast path"
    assert_same_batch(ours, Batch.from_data_list([dataset[p] for p in positions]))


def _molecules(count: int, seed: int = 0) -> list[Data]:
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(count):
        n = int(torch.randint(3, 9, (1,), generator=gen))
        m = int(torch.randint(1, 12, (1,), generator=gen))
        graphs.append(Data(x=torch.randn(n, 4, generator=gen), edge_index=torch.randint(0, n, (2, m), generator=gen),
                           edge_attr=torch.randn(m, 2, generator=gen), y=torch.randint(0, 2, (1,), generator=gen)))
    return graphs


def test_exclude_keys_match_pyg():
    graphs = _molecules(5)
    assert_same_batch(collate_graphs(graphs, frozenset({"edge_attr"})),
                      Batch.from_data_list(graphs, exclude_keys=["edge_attr"]))
    dataset = Graphs(graphs)
    # the vertex count still comes from x when x is excluded, as PyG counts it per graph
    assert_same_batch(gather_graphs(GraphSelection(dataset, [4, 0, 2]), frozenset({"x"})),
                      Batch.from_data_list([dataset[i] for i in (4, 0, 2)], exclude_keys=["x"]))


class Subclassed(Data):
    def __inc__(self, key, value, *args, **kwargs):
        return 2 * super().__inc__(key, value, *args, **kwargs)


@pytest.mark.parametrize("make", [
    lambda g: [Subclassed(**dict(d)) for d in g],                               # its own increments
    lambda g: [Data(num_nodes=d.num_nodes, **dict(d)) for d in g],             # an explicit vertex count
    lambda g: [Data(face=torch.zeros(3, 1, dtype=torch.long), **dict(d)) for d in g],  # another index key
    lambda g: [Data(ring_index=torch.zeros(2, 1, dtype=torch.long), **dict(d)) for d in g],  # PyG increments *index*
    lambda g: [Data(edge_index=d.edge_index, y=d.y) for d in g],               # no vertex rows to count
    lambda g: g[:2] + [Data(x=g[2].x, edge_index=g[2].edge_index)],            # attributes that differ
    lambda g: [Data(x=d.x, edge_index=d.edge_index, name="mol") for d in g],   # not a tensor
    lambda g: [Data(x=d.x, edge_index=d.edge_index.bool()) for d in g],        # a bool edge_index (stayed bool)
])
def test_other_graphs_are_left_to_pyg(make):
    assert collate_graphs(make(_molecules(4))) is None


def test_a_bool_edge_index_batches_as_pygs():
    """PyG's sum promotes a bool edge_index with the offsets; added in place here, they
    kept it bool (every entry True past the first graph)."""
    graphs = [Data(x=torch.randn(4, 2), edge_index=torch.tensor([[True, False], [False, True]])) for _ in range(3)]
    ours = next(iter(gnnfuse.loader.DataLoader(graphs, batch_size=3)))
    theirs = next(iter(PyGDataLoader(graphs, batch_size=3)))
    assert ours.edge_index.dtype == theirs.edge_index.dtype == torch.int64
    assert torch.equal(ours.edge_index, theirs.edge_index)


def test_sizes_that_do_not_line_up_raise_pygs_error_through_the_loader():
    graphs = _molecules(3)
    graphs[1].x = torch.randn(graphs[1].num_nodes, 5)                # 5 features where the others have 4
    assert collate_graphs(graphs) is None
    with pytest.raises(RuntimeError) as theirs:
        Batch.from_data_list(graphs)
    with pytest.raises(RuntimeError) as ours:
        next(iter(gnnfuse.loader.DataLoader(graphs, batch_size=3)))
    assert str(ours.value) == str(theirs.value)


def test_graphs_whose_vertices_pyg_does_not_count_batch_as_pygs():
    """PyG adds ``batch`` and ``ptr`` only where a graph's keys let it count vertices
    (``can_infer_num_nodes``: x, pos, edge_index, a 'node' key; not ``feat``), and
    cannot count a 0-dim ``x``'s rows: collated here, graphs of ``feat`` rows alone got
    ``batch`` and ``ptr`` vectors PyG's batch has not, and scalar ``x`` graphs a batch
    where PyG raises."""
    feats = [Data(feat=torch.randn(n, 2), y=torch.tensor([n])) for n in (2, 3, 1)]
    assert_same_batch(next(iter(gnnfuse.loader.DataLoader(feats, batch_size=3))), Batch.from_data_list(feats))
    assert_same_batch(next(iter(gnnfuse.loader.DataLoader(Graphs(feats), batch_size=3))),
                      Batch.from_data_list(feats))
    scalars = [Data(x=torch.tensor(float(n)), y=torch.tensor([n])) for n in range(3)]
    with pytest.raises(IndexError) as theirs:
        Batch.from_data_list(scalars)
    with pytest.raises(IndexError) as ours:
        next(iter(gnnfuse.loader.DataLoader(scalars, batch_size=3)))
    assert str(ours.value) == str(theirs.value)


def test_a_transform_or_a_subclass_takes_pygs_path_with_pygs_result():
    graphs = _molecules(6)

    def double(data):
        data = data.clone()
        data.x = 2 * data.x
        return data
    dataset = Graphs(graphs, transform=double)
    assert gather_graphs(GraphSelection(dataset, [1, 2])) is None
    ours = list(gnnfuse.loader.DataLoader(dataset, batch_size=4))
    theirs = list(PyGDataLoader(dataset, batch_size=4))
    for a, b in zip(ours, theirs, strict=True):
        assert_same_batch(a, b)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("source", ["list", "in_memory"])
def test_loader_batches_equal_pygs(source, workers):
    graphs = _molecules(37, seed=1)
    dataset = graphs if source == "list" else Graphs(graphs)
    kwargs = {"batch_size": 8, "shuffle": True, "num_workers": workers}
    torch.manual_seed(3)
    ours = list(gnnfuse.loader.DataLoader(dataset, **kwargs))
    torch.manual_seed(3)
    theirs = list(PyGDataLoader(dataset, **kwargs))
    assert len(ours) == len(theirs) == 5
    for a, b in zip(ours, theirs):
        assert_same_batch(a, b)


def test_the_users_data_set_is_unchanged_and_the_loaders_copy_keeps_its_class():
    dataset = Graphs(_molecules(9))
    loader = gnnfuse.loader.DataLoader(dataset, batch_size=4)
    assert not hasattr(dataset, "__getitems__")                   # another loader over it still gets graphs
    assert isinstance(loader.dataset, Graphs) and len(loader.dataset) == 9
    assert loader.dataset.num_features == dataset.num_features
    assert_same_batch(next(iter(PyGDataLoader(dataset, batch_size=4))), next(iter(loader)))
    assert isinstance(pickle.loads(pickle.dumps(loader.dataset)).__getitems__([0, 1]), GraphSelection)
    assert selecting_view(_molecules(3)) is None                  # a list is not viewed
    assert isinstance(gnnfuse.loader.DataLoader(dataset, follow_batch=["x"]).dataset, Graphs)


def test_a_transform_set_after_the_loader_was_made_still_applies():
    dataset = Graphs(_molecules(6))
    loader = gnnfuse.loader.DataLoader(dataset, batch_size=3)
    dataset.transform = lambda data: Data(x=data.x + 1, edge_index=data.edge_index, y=data.y)
    ours, theirs = next(iter(loader)), next(iter(PyGDataLoader(dataset, batch_size=3)))
    assert_same_batch(ours, theirs)


@pytest.mark.parametrize("source", ["list", "in_memory"])
def test_padded_batches_equal_padding_pygs_batch(source):
    graphs = _molecules(24, seed=2)
    dataset = graphs if source == "list" else Graphs(graphs)
    capacities = GraphCapacities(nodes=128, edges=128, graphs=9)
    loader = gnnfuse.loader.DataLoader(dataset, batch_size=8, static_shapes=True, capacities=capacities)
    plain = PyGDataLoader(dataset, batch_size=8)
    for ours, theirs in zip(loader, plain, strict=True):
        expected = pad_graph_batch(theirs.clone(), capacities)
        assert list(ours.keys()) == list(expected.keys())
        for key in expected.keys():
            value = expected[key]
            assert torch.equal(ours[key], value) if isinstance(value, torch.Tensor) else ours[key] == value, key
        assert_same_batch(unpadded(ours), theirs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_lists(), st.booleans(), st.integers(0, 3))
def test_batches_collated_with_room_pad_as_pygs(graphs, in_memory, spare):
    """Collated into buffers as long as their padded form (guessing each attribute's
    kind from its row count), the padded batch is PyG's batch padded: every attribute,
    or the same refusal (a float label)."""
    nodes, edges = sum(g.num_nodes for g in graphs), sum(g.num_edges for g in graphs)
    capacities = GraphCapacities(nodes + 2 + spare, edges + spare, len(graphs) + 1 + spare)
    if in_memory and len(graphs) > 1:
        collated = gather_graphs(GraphSelection(Graphs(graphs), list(range(len(graphs)))), frozenset(), capacities)
    else:
        collated = collate_graphs(graphs, frozenset(), capacities)
    try:
        expected = pad_graph_batch(Batch.from_data_list(graphs), capacities)
    except ValueError as refusal:
        with pytest.raises(ValueError, match="static_shapes cannot pad") as ours:
            pad_graph_batch(collated, capacities)
        assert str(ours.value) == str(refusal)
        return
    padded = pad_graph_batch(collated, capacities)
    assert list(padded.keys()) == list(expected.keys())
    for key in expected.keys():
        value = expected[key]
        assert torch.equal(padded[key], value) if isinstance(value, torch.Tensor) else padded[key] == value, key
    assert_same_batch(unpadded(padded), unpadded(expected))


def test_a_batch_from_a_worker_crosses_as_one_buffer_and_arrives_as_pygs():
    """`packed_batch.for_transfer`: pickled as one buffer, unpickled as PyG's own class,
    every attribute and table equal, a padded batch still unpadding to PyG's."""
    graphs = _molecules(6, seed=4)
    plain = Batch.from_data_list(graphs)
    sent = pickle.loads(pickle.dumps(for_transfer(collate_graphs(graphs))))
    assert type(sent) is type(plain)
    assert_same_batch(sent, plain)
    capacities = GraphCapacities(nodes=64, edges=96, graphs=8)
    padded = pickle.loads(pickle.dumps(for_transfer(pad_graph_batch(collate_graphs(graphs), capacities))))
    assert padded_capacities(padded) == capacities
    assert_same_batch(unpadded(padded), plain)
    storages = {t.untyped_storage().data_ptr() for t in padded.to_dict().values() if isinstance(t, torch.Tensor)}
    assert len(storages) == 6           # x, edge_index, edge_attr, y, batch, ptr: each its own storage


@pytest.mark.parametrize("static_shapes", [False, True])
def test_worker_batches_equal_the_training_process_ones(static_shapes):
    dataset = Graphs(_molecules(30, seed=5))
    kwargs = {"batch_size": 8, "static_shapes": static_shapes}
    here = list(gnnfuse.loader.DataLoader(dataset, **kwargs))
    there = list(gnnfuse.loader.DataLoader(dataset, num_workers=2, **kwargs))
    assert len(here) == len(there) == 4
    for a, b in zip(here, there):
        assert type(a) is type(b) and list(a.keys()) == list(b.keys())
        for key in a.keys():
            assert torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key], key
        if static_shapes:
            assert padded_capacities(b) == padded_capacities(a)


def test_heterogeneous_batches_from_workers_equal_pygs():
    from torch_geometric.data import HeteroData
    graphs = []
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        data = HeteroData()
        data["paper"].x = torch.randn(4 + seed, 3, generator=gen)
        data["author"].x = torch.randn(3, 2, generator=gen)
        data["author", "writes", "paper"].edge_index = torch.stack(
            [torch.randint(0, 3, (5,), generator=gen), torch.randint(0, 4 + seed, (5,), generator=gen)])
        graphs.append(data)
    ours = list(gnnfuse.loader.DataLoader(graphs, batch_size=3, num_workers=2))
    theirs = list(PyGDataLoader(graphs, batch_size=3))
    for a, b in zip(ours, theirs, strict=True):
        assert type(a) is type(b)
        for store_a, store_b in zip(a.stores, b.stores):
            for key, value in store_b.items():
                assert torch.equal(store_a[key], value) if isinstance(value, torch.Tensor) else store_a[key] == value


def test_worker_batches_with_tensors_packing_cannot_carry_arrive_as_pygs():
    """A batch holding a sparse tensor or a tensor subclass (PyG's ``EdgeIndex``)
    crosses from a worker as PyG sends it: packing it failed in the worker's queue
    thread (the loader then waited for ever) or arrived as a plain tensor."""
    from torch_geometric import EdgeIndex
    graphs = _molecules(6, seed=6)
    sparse = [Data(x=g.x, edge_index=g.edge_index, s=torch.eye(3).to_sparse()) for g in graphs]
    typed = [Data(x=g.x, edge_index=EdgeIndex(g.edge_index, sparse_size=(g.num_nodes, g.num_nodes)))
             for g in graphs]
    for data in (sparse, typed):
        ours = list(gnnfuse.loader.DataLoader(data, batch_size=3, num_workers=1, timeout=20))
        theirs = list(PyGDataLoader(data, batch_size=3))
        for a, b in zip(ours, theirs, strict=True):
            assert list(a.keys()) == list(b.keys())
            for key in b.keys():
                assert type(a[key]) is type(b[key]), key
                assert torch.equal(a[key].to_dense(), b[key].to_dense()), key


def test_a_data_set_with_its_own_get_or_getitem_is_read_through_them():
    """An ``InMemoryDataset`` subclass that overrides ``get`` or ``__getitem__`` hands
    out what they return; gathering from its collated tensors bypassed them."""
    class Zeroed(Graphs):
        def get(self, idx):
            data = super().get(idx)
            data.x = torch.zeros_like(data.x)
            return data

    class Shifted(Graphs):
        def __getitem__(self, idx):
            data = super().__getitem__(idx)
            if isinstance(data, Data):
                data.x = data.x + 100
            return data
    for cls in (Zeroed, Shifted):
        dataset = cls(_molecules(7, seed=7))
        for a, b in zip(gnnfuse.loader.DataLoader(dataset, batch_size=3), PyGDataLoader(dataset, batch_size=3),
                        strict=True):
            assert_same_batch(a, b)


def test_graphs_whose_dtypes_differ_collate_as_pygs():
    """torch.cat promotes a column of float32 and float64 rows; collated into a buffer
    made for padding (``static_shapes``) the batch kept the first graph's dtype."""
    graphs = [Data(x=g.x.double() if i % 2 else g.x, edge_index=g.edge_index, y=g.y)
              for i, g in enumerate(_molecules(6, seed=8))]
    capacities = GraphCapacities(nodes=128, edges=128, graphs=4)
    ours = list(gnnfuse.loader.DataLoader(graphs, batch_size=3, static_shapes=True, capacities=capacities))
    theirs = [pad_graph_batch(b, capacities) for b in PyGDataLoader(graphs, batch_size=3)]
    for a, b in zip(ours, theirs, strict=True):
        assert list(a.keys()) == list(b.keys())
        for key in b.keys():
            if isinstance(b[key], torch.Tensor):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def test_a_transform_set_on_the_loaders_data_set_applies():
    """``loader.dataset`` is PyG's data set itself; gnnfuse's is a copy, and a transform
    set on it (rather than on the user's object) must apply as well."""
    dataset = Graphs(_molecules(6, seed=9))
    loader = gnnfuse.loader.DataLoader(dataset, batch_size=3)
    _ = loader.dataset.num_features              # caches a graph on the data set
    loader.dataset.transform = lambda data: Data(x=data.x + 1, edge_index=data.edge_index, y=data.y)
    theirs = Graphs(_molecules(6, seed=9))
    theirs.transform = loader.dataset.transform
    for a, b in zip(loader, PyGDataLoader(theirs, batch_size=3), strict=True):
        assert_same_batch(a, b)


@pytest.mark.parametrize("static_shapes", [False, True])
@pytest.mark.parametrize("source", ["list", "in_memory"])
def test_batches_share_no_memory_with_the_data_set_or_each_other(source, static_shapes):
    """As PyG's: a batch written in place changes neither the data set nor another batch
    (gathered rows are copies; `_Room` buffers are the batch's own)."""
    graphs = _molecules(12, seed=10)
    dataset = graphs if source == "list" else Graphs(graphs)
    kwargs = {"batch_size": 4}
    if static_shapes:
        kwargs.update(static_shapes=True, capacities=GraphCapacities(nodes=128, edges=128, graphs=5))
    loader = gnnfuse.loader.DataLoader(dataset, **kwargs)
    first = list(loader)
    for batch in first:
        for value in batch.to_dict().values():
            if isinstance(value, torch.Tensor):
                value.fill_(7)
    for a, b in zip(loader, PyGDataLoader(Graphs(_molecules(12, seed=10)), batch_size=4), strict=True):
        assert_same_batch(unpadded(a), b)


@pytest.mark.parametrize("positions", [[-1, 0], [1.0, 2], [9, 10], [torch.tensor(3), torch.tensor(1)]])
def test_positions_pyg_reads_its_own_way_are_read_as_pyg_reads_them(positions):
    """A batch sampler's negative position is PyG's last graph, a float one PyG's
    IndexError, one past the end its IndexError; gathering from the collated tensors
    gave a RuntimeError, a graph and another error."""
    dataset = Graphs(_molecules(10, seed=11))
    try:
        theirs = list(PyGDataLoader(dataset, batch_sampler=[positions]))
    except IndexError as refusal:
        with pytest.raises(IndexError) as ours:
            list(gnnfuse.loader.DataLoader(dataset, batch_sampler=[positions]))
        assert str(ours.value) == str(refusal)
        return
    ours = list(gnnfuse.loader.DataLoader(dataset, batch_sampler=[positions]))
    for a, b in zip(ours, theirs, strict=True):
        assert_same_batch(a, b)


def test_a_data_set_whose_slices_are_not_int64_gives_pygs_batch():
    """Slices stored as int32 (a data set collated by its own code): PyG's ``batch``,
    ``ptr`` and slice tables are int64 whatever they are; gathered, they took int32."""
    dataset = Graphs(_molecules(6, seed=12))
    dataset.slices = {key: value.int() for key, value in dataset.slices.items()}
    for a, b in zip(gnnfuse.loader.DataLoader(dataset, batch_size=4), PyGDataLoader(dataset, batch_size=4),
                    strict=True):
        assert_same_batch(a, b)


def test_the_loaders_data_set_and_the_users_are_one_data_set():
    """Attributes set on either, in any order, are set on both, as PyG's ``loader.dataset``
    is the user's object: a transform set on the view, then one on the user's object."""
    dataset = Graphs(_molecules(6, seed=11))
    loader = gnnfuse.loader.DataLoader(dataset, batch_size=3)
    loader.dataset.transform = lambda data: Data(x=data.x + 1, edge_index=data.edge_index, y=data.y)
    assert dataset.transform is loader.dataset.transform
    dataset.transform = lambda data: Data(x=data.x * 3, edge_index=data.edge_index, y=data.y)
    for a, b in zip(loader, PyGDataLoader(dataset, batch_size=3), strict=True):
        assert_same_batch(a, b)
    dataset.transform = None
    subset = dataset[torch.tensor([5, 1, 3])]
    view = gnnfuse.loader.DataLoader(subset, batch_size=2).dataset
    assert type(view).__name__ == "Graphs" and len(view) == 3
    for a, b in zip(gnnfuse.loader.DataLoader(subset, batch_size=2), PyGDataLoader(subset, batch_size=2), strict=True):
        assert_same_batch(a, b)


def test_a_data_set_class_made_in_a_function_is_freed_after_its_loader():
    """The selecting view's class (a subclass of the data set's, made per class) was cached
    by the class, so a data set class defined in a function stayed alive for good with
    what its methods close over: 10 such classes and the 10 [1000, 100] tensors they
    closed over outlived their loaders, where PyG's DataLoader lets all 20 go."""
    import gc
    import weakref

    def make():
        scale = torch.randn(1000, 100)

        class Scaled(InMemoryDataset):
            def __init__(self):
                super().__init__()
                self.data, self.slices = self.collate([Data(x=torch.randn(3, 2) * scale[0, 0],
                                                            edge_index=torch.tensor([[0, 1], [1, 2]]))
                                                       for _ in range(8)])
        return Scaled, scale

    refs = []
    for _ in range(10):
        cls, scale = make()
        loader = gnnfuse.loader.DataLoader(cls(), batch_size=4)
        assert [batch.num_graphs for batch in loader] == [4, 4]
        refs += [weakref.ref(cls), weakref.ref(scale)]
        del cls, scale, loader
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0


def test_a_batch_holding_a_tensor_that_requires_grad_crosses_as_pygs():
    """One buffer cannot carry a tensor that requires grad (`packing` refuses it, and a
    refusal in a worker's queue thread left the loader waiting for ever): such a batch is
    not marked for packing and pickles as PyG's, its autograd flag kept."""
    batch = Batch.from_data_list([Data(x=torch.randn(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]))
                                  for _ in range(2)])
    batch.x.requires_grad_()
    back = pickle.loads(pickle.dumps(for_transfer(batch)))
    assert back.x.requires_grad and torch.equal(back.x, batch.x) and torch.equal(back.edge_index, batch.edge_index)
