"""PyG's batch idioms on gnnfuse's loader batches: a PyG ``Data``'s other node- and
edge-level attributes (``batch.train_mask``, ``batch.node_year``, ``batch.edge_time``)
cut to the sample (`loader.data_attributes`), and ``batch = batch.to(device)``
(`loader.batch_move`).

Oracle for the attributes: PyG's own batch builder, ``torch_geometric.loader.utils.
filter_data`` (what PyG's ``NeighborLoader`` runs on its sampler's output; the sampler
itself needs pyg-lib, which this machine lacks), applied to PyG's full-neighbourhood
sample (`pyg_full_subgraph`); values are compared keyed by ``n_id`` and ``e_id``, so the
check does not rest on the two numberings agreeing. The move is checked by copying a
batch to its own device through the move path (every tensor then new memory, no layout
left behind) and running block and PyG models on both; on a GPU machine also CPU -> CUDA."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnnfuse
from gnnfuse.loader import NeighborLoader
from gnnfuse.loader.batch_move import move_batch
from test_loader_pyg_batch import pyg_data, pyg_full_subgraph


def attributed_data(num_nodes: int = 30, num_edges: int = 120, seed: int = 0, edge_tables: bool = True):
    """A PyG ``Data`` with masks, a 2-column node attribute, a node attribute whose name
    holds ``index`` (PyG concatenates those along their last dimension), and edge-level ones."""
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    data = pyg_data(edge_index, num_nodes, seed)
    if not edge_tables:
        del data.edge_attr, data.edge_weight
    data.train_mask = torch.rand(num_nodes, generator=gen) < 0.5
    data.val_mask = ~data.train_mask
    data.node_year = torch.randint(2000, 2020, (num_nodes, 2), generator=gen)
    data.paper_index = torch.randint(0, 9, (3, num_nodes), generator=gen)
    data.edge_time = torch.rand(num_edges, generator=gen, dtype=torch.float64)
    data.title, data.scale = "graph-level: not sliced", torch.tensor([2.5, 1.0, 4.0])
    return data


NODE_ATTRS = ("train_mask", "val_mask", "node_year", "paper_index")


def _keyed(ids: torch.Tensor, values: torch.Tensor, dim: int = 0) -> dict[int, list]:
    return {int(i): values.select(dim, k).tolist() for k, i in enumerate(ids.tolist())}


def _batches(data, fanouts, batch_size=4, **kw):
    torch.manual_seed(0)
    return list(NeighborLoader(data, fanouts, batch_size=batch_size, shuffle=True, prefetch=0, **kw))


@pytest.mark.parametrize("edge_tables", [True, False])
def test_node_and_edge_attributes_are_pygs_batch_keyed_by_n_id_and_e_id(edge_tables):
    """With full neighbourhoods, against PyG's own ``filter_data`` on PyG's sample. Without
    edge tables the loader keeps edge ids for the edge-level attribute anyway."""
    from torch_geometric.loader.utils import filter_data
    data = attributed_data(edge_tables=edge_tables)
    batches = _batches(data, [-1, -1])
    assert len(batches) > 3
    for batch in batches:
        n_id, edge_index, e_id, _, _ = pyg_full_subgraph(data.edge_index, batch.n_id[:batch.batch_size].tolist(), 2)
        pyg = filter_data(data, n_id, edge_index[0], edge_index[1], e_id)
        for name in NODE_ATTRS:
            dim = -1 if name == "paper_index" else 0
            assert getattr(batch, name).dtype == getattr(data, name).dtype
            assert _keyed(batch.n_id, getattr(batch, name), dim) == _keyed(n_id, getattr(pyg, name), dim)
        assert _keyed(batch.e_id, batch.edge_time) == _keyed(e_id, pyg.edge_time)
        assert batch.title == pyg.title and torch.equal(batch.scale, pyg.scale)    # graph-level: kept whole


def test_sampled_batches_read_every_vertex_s_attribute():
    data = attributed_data(60, 300)
    for batch in _batches(data, [3, 2], batch_size=8):
        assert torch.equal(batch.train_mask, data.train_mask[batch.n_id])
        assert torch.equal(batch.node_year, data.node_year[batch.n_id])
        assert torch.equal(batch.edge_time, data.edge_time[batch.e_id])
        assert batch.train_mask.shape[0] == batch.num_nodes


def test_attributes_are_gathered_on_first_read_only_and_unknown_names_are_refused():
    data = attributed_data()
    batch = _batches(data, [2, 2])[0]
    assert "train_mask" not in vars(batch)                  # nothing gathered for a loop that never reads it
    mask = batch.train_mask
    assert batch.train_mask is mask                         # gathered once
    with pytest.raises(AttributeError, match="'test_mask'"):
        batch.test_mask
    assert not hasattr(batch, "test_mask") and hasattr(batch, "val_mask")
    data.train_mask[batch.n_id[0]] = ~data.train_mask[batch.n_id[0]]      # in place: later batches see it (PyG)
    later = _batches(data, [2, 2])[0]
    assert torch.equal(later.train_mask, data.train_mask[later.n_id])


def test_an_attribute_deleted_from_the_data_is_missing_on_later_batches():
    """PyG's batch copies the ``Data`` as it is, so ``del data.train_mask`` leaves its
    batches without one; the loader's kept table must not stand in for it (a stale mask)."""
    data = attributed_data()
    loader = NeighborLoader(data, [2], batch_size=4, prefetch=0)
    del data.train_mask, data.edge_time, data.title
    batch = next(iter(loader))
    for name in ("train_mask", "edge_time", "title"):
        with pytest.raises(AttributeError, match=f"data.{name} was deleted"):
            getattr(batch, name)
    assert torch.equal(batch.val_mask, data.val_mask[batch.n_id])


@pytest.mark.parametrize("others", [False, True])
def test_attributes_added_after_the_loader_was_built_are_pygs_batch(others):
    """PyG's loader cuts the ``Data`` as it is at each batch, so ``data.train_mask = ...``
    after the loader was built reaches its batches; gnnfuse's listed the attributes once
    and said "no attribute 'train_mask'" -- with (``others``) or without other attributes
    then. Against PyG's ``filter_data``, keyed by ``n_id`` and ``e_id``; a link batch's
    node batch carries them too."""
    from torch_geometric.loader.utils import filter_data
    from gnnfuse.loader import LinkNeighborLoader
    data = attributed_data() if others else pyg_data(torch.randint(0, 30, (2, 120)), 30)
    torch.manual_seed(0)
    loader = NeighborLoader(data, [-1, -1], batch_size=4, shuffle=True, prefetch=0)
    link = LinkNeighborLoader(data, [-1], batch_size=4, prefetch=0)
    next(iter(loader))
    gen = torch.Generator().manual_seed(1)
    data.late_mask = torch.rand(data.num_nodes, generator=gen) < 0.5
    data.late_index = torch.randint(0, 9, (2, data.num_nodes), generator=gen)     # cut along its last dimension
    data.late_time = torch.rand(data.num_edges, generator=gen, dtype=torch.float64)
    data.late_title, data.late_scale = "graph-level", torch.tensor([2.5, 1.0])
    for batch in list(loader)[:3]:
        n_id, edge_index, e_id, _, _ = pyg_full_subgraph(data.edge_index, batch.n_id[:batch.batch_size].tolist(), 2)
        pyg = filter_data(data, n_id, edge_index[0], edge_index[1], e_id)
        assert _keyed(batch.n_id, batch.late_mask) == _keyed(n_id, pyg.late_mask)
        assert _keyed(batch.n_id, batch.late_index, -1) == _keyed(n_id, pyg.late_index, -1)
        assert _keyed(batch.e_id, batch.late_time) == _keyed(e_id, pyg.late_time)
        assert batch.late_title == pyg.late_title and torch.equal(batch.late_scale, pyg.late_scale)
        assert not hasattr(batch, "never_set")
    batch = next(iter(link))
    assert torch.equal(batch.late_mask, data.late_mask[batch.n_id])
    assert torch.equal(batch.late_time, data.late_time[batch.e_id])
    data.late_names = [f"v{i}" for i in range(data.num_nodes)]      # refused by name, as when there at first
    with pytest.raises(TypeError, match="batch.late_names: the Data's late_names is a list with an entry per vertex"):
        next(iter(loader)).late_names


def test_an_edge_attribute_added_where_the_loader_keeps_no_edge_ids_is_refused_by_name():
    """Built on a Data without edge tables or edge-level attributes, the loader keeps no
    edge ids to cut an edge-level attribute given later by: refused naming it, saying to
    build the loader again (a node-level one still comes)."""
    from gnnfuse.loader import LinkNeighborLoader
    data = pyg_data(torch.randint(0, 30, (2, 120)), 30)
    del data.edge_attr, data.edge_weight
    loaders = [NeighborLoader(data, [2], batch_size=4, prefetch=0),
               LinkNeighborLoader(data, [2], batch_size=4, prefetch=0)]
    data.edge_time, data.late_mask = torch.rand(data.num_edges), torch.rand(data.num_nodes) < 0.5
    for loader, called in zip(loaders, ("NeighborLoader", "LinkNeighborLoader")):
        batch = next(iter(loader))
        assert torch.equal(batch.late_mask, data.late_mask[batch.n_id])
        with pytest.raises(RuntimeError, match=rf"batch.edge_time: data.edge_time .*set after this {called} was "
                                               rf"built.*no edge ids.*Build a new {called}"):
            batch.edge_time


def test_a_gnnfuse_node_dataset_s_masks_come_too():
    from gnnfuse.data import load_node_dataset
    data = load_node_dataset("synthetic")
    batch = next(iter(NeighborLoader(data, [3, 2], batch_size=16, input_nodes=data.train_mask, prefetch=0)))
    assert batch.train_mask[:batch.batch_size].all()
    for name in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(batch, name), getattr(data, name)[batch.n_id])


def test_a_node_level_list_is_refused_by_name():
    data = attributed_data()
    data.names = [f"v{i}" for i in range(data.num_nodes)]
    batch = _batches(data, [2])[0]
    with pytest.raises(TypeError, match="batch.names: the Data's names is a list with an entry per vertex"):
        batch.names


def test_padded_batches_refuse_the_attributes_by_name():
    data = attributed_data(60, 300)
    loader = NeighborLoader(data, [3, 2], batch_size=8, prefetch=0, static_shapes=True)
    batch = next(iter(loader))
    assert batch.padded
    for name in ("train_mask", "edge_time"):
        with pytest.raises(ValueError, match=f"batch.{name}: this batch is padded"):
            getattr(batch, name)


def test_worker_processes_batches_carry_the_attributes():
    data = attributed_data(40, 200)
    torch.manual_seed(0)
    loader = NeighborLoader(data, [3, 2], batch_size=8, num_workers=1)
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert len(batches) == 5
    for batch in batches:
        assert torch.equal(batch.train_mask, data.train_mask[batch.n_id])
        assert torch.equal(batch.edge_time, data.edge_time[batch.e_id])


# --- batch.to(device) ---------------------------------------------------------------

def _held(batch) -> list[torch.Tensor]:
    """The batch's tensors but for the layouts prepared ahead (a moved block has none)."""
    blocks = [t for b in batch.blocks for t in (b.graph.src, b.graph.dst, *b.graph.csr(), b.graph.in_degrees(),
                                                b.graph.out_degrees(), b.src_nodes, b.e_id, b.edge_attr, b.edge_weight)]
    return [t for t in [batch.n_id, batch.input_id, batch.x, batch.y] + blocks if t is not None]


def _storages(batch) -> dict[int, torch.Tensor]:
    """The memory of every tensor the batch holds, its graphs' cached layouts included
    (the tensors kept, so that no later allocation reuses their memory)."""
    from gnnfuse.loader.layouts import tensors_in
    cached = [t for block in batch.blocks for value in block.graph._cache.values() for t in tensors_in(value)]
    return {t.untyped_storage().data_ptr(): t for t in batch.tensors() + cached if t.numel()}


def test_to_the_batch_s_own_device_is_the_batch_itself_without_a_copy():
    data = attributed_data()
    batch = _batches(data, [2, 2])[0]
    before, edge_index = _storages(batch), batch.edge_index
    for moved in (batch.to("cpu"), batch.to(torch.device("cpu")), batch.to("cpu", non_blocking=True), batch.cpu()):
        assert moved is batch
    assert _storages(batch).keys() == before.keys() and batch.edge_index is edge_index


def test_to_refuses_pygs_per_attribute_form():
    batch = _batches(attributed_data(), [2])[0]
    with pytest.raises(TypeError, match="batch.to\\(device, 'x'\\)"):
        batch.to("cpu", "x")


def test_to_the_meta_device_moves_every_tensor_and_leaves_no_layout_behind():
    data = attributed_data()
    batch = _batches(data, [2, 2])[0]
    shapes = [(t.shape, t.dtype) for t in _held(batch)]
    batch.blocks[0].graph.reverse_csr()                          # a layout built on the CPU
    assert batch.edge_index.device.type == batch.train_mask.device.type == "cpu"     # built there
    moved = batch.to("meta")
    assert moved is batch                                        # in place, as PyG's Data.to
    assert all(t.device.type == "meta" for t in moved.tensors())
    assert [(t.shape, t.dtype) for t in _held(moved)] == shapes
    for block in moved.blocks:
        graph = block.graph
        assert "reverse_csr" not in graph._cache                 # left behind, rebuilt on the target when read
        assert all(t.device.type == "meta" for t in (graph.src, graph.dst, *graph.csr(), graph.in_degrees()))
        assert all(t.device.type == "meta" for value in graph._cache.values()
                   for t in (value if isinstance(value, tuple) else (value,)) if isinstance(t, torch.Tensor))
    assert moved.edge_index.device.type == "meta" and moved.train_mask.device.type == "meta"


def _block_model(name, data, channels):
    from gnnfuse.nn.block_models import build_block_model
    torch.manual_seed(1)
    return build_block_model(name, data.num_features, channels, hidden=8, dropout=0.0, num_layers=2).double()


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_a_batch_moved_through_the_move_path_gives_the_same_outputs_and_gradients(model, backend, device):
    """Every tensor copied (new memory) and every layout rebuilt on the target: block
    models and a PyG model give the batch's own outputs."""
    from torch_geometric.nn.models import GraphSAGE
    data = attributed_data(50, 250)
    data.x, data.y = data.x.to(device), data.y.to(device)
    data.edge_index = data.edge_index.to(device)
    batch = _batches(data, [3, 2], batch_size=8)[1]
    block_model = _block_model(model, data, 3).to(device)
    torch.manual_seed(2)
    pyg_model = GraphSAGE(data.num_features, 8, num_layers=2, out_channels=3).double().to(device)

    def outputs(b):
        x = b.x.clone().requires_grad_()
        out = block_model(x, b.blocks)
        pyg_out = pyg_model(x, b.edge_index)[:b.batch_size]
        (out.square().sum() + pyg_out.square().sum()).backward()
        return out.detach(), pyg_out.detach(), x.grad, b.train_mask, b.edge_time, [blk.src_nodes for blk in b.blocks]

    want, before = outputs(batch), _storages(batch)
    moved = move_batch(batch, device, copy=True)
    torch.testing.assert_close(outputs(moved), want, rtol=1e-12, atol=1e-12)
    assert not _storages(moved).keys() & before.keys()       # nothing read through the old memory


def test_a_padded_batch_moves_with_its_layouts_rebuilt_whole_rows():
    data = attributed_data(50, 250)
    loader = NeighborLoader(data, [3, 2], batch_size=8, prefetch=0, static_shapes=True)
    batch = next(iter(loader))
    model = _block_model("sage", data, 3)
    want = model(batch.x, batch.blocks)
    keys = [set(block.graph._cache) for block in batch.blocks]
    src_nodes = [block.src_nodes for block in batch.blocks]
    moved = move_batch(batch, "cpu", copy=True)
    assert moved.padded and [set(block.graph._cache) for block in moved.blocks] == keys
    assert all(block.layouts for block in moved.blocks)          # built ahead, as the loader's
    assert all(torch.equal(block.src_nodes, ids) for block, ids in zip(moved.blocks, src_nodes, strict=True))
    torch.testing.assert_close(model(moved.x, moved.blocks), want, rtol=1e-12, atol=1e-12)


def test_a_deferred_batch_refuses_a_move_by_name():
    graph = gnnfuse.Graph.from_edge_index(attributed_data().edge_index, 30)
    loader = NeighborLoader(graph, [2], batch_size=4, x=torch.randn(30, 3), prefetch=0, static_shapes=True,
                            deferred=True)
    batch = next(iter(loader))
    assert batch.deferred and batch.to("cpu") is batch
    with pytest.raises(ValueError, match="deferred"):
        batch.to("meta")


def test_hetero_batches_keep_pygs_own_to():
    from torch_geometric.data import HeteroData
    mag = HeteroData()
    mag["paper"].x, mag["paper"].train_mask = torch.randn(20, 4), torch.rand(20) < 0.5
    mag["paper", "cites", "paper"].edge_index = torch.randint(0, 20, (2, 60))
    batch = next(iter(NeighborLoader(mag, [2], batch_size=4, input_nodes="paper")))
    assert batch.to("cpu") is batch and batch.cpu() is batch
    assert torch.equal(batch["paper"].train_mask, mag["paper"].train_mask[batch["paper"].n_id])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cpu_loader_s_batch_moved_to_cuda_gives_the_cpu_batch_s_outputs():
    from torch_geometric.nn.models import GraphSAGE
    data = attributed_data(50, 250)
    batch = _batches(data, [3, 2], batch_size=8)[1]
    models = [_block_model(name, data, 3) for name in ("sage", "gat")]
    torch.manual_seed(2)
    pyg_model = GraphSAGE(data.num_features, 8, num_layers=2, out_channels=3).double()
    want = [m(batch.x, batch.blocks) for m in models] + [pyg_model(batch.x, batch.edge_index), batch.train_mask,
                                                         batch.edge_time]
    moved = batch.to("cuda")
    assert moved is batch and all(t.is_cuda for t in moved.tensors())
    got = [m.cuda()(moved.x, moved.blocks) for m in models] + [pyg_model.cuda()(moved.x, moved.edge_index),
                                                               moved.train_mask, moved.edge_time]
    assert all(t.is_cuda for t in got)
    torch.testing.assert_close([t.cpu() for t in got], want, rtol=1e-9, atol=1e-9)
    assert moved.to("cuda") is moved and moved.cuda() is moved


@pytest.mark.parametrize("name", ["x", "y", "edge_attr"])
def test_a_data_table_replaced_after_the_loader_was_built_is_refused_by_name(name):
    """PyG's loader reads data.x (y, edge tables) per batch, so a tensor assigned later
    reaches its batches; gnnfuse's holds the one it took, so a replacement would be
    silently ignored: refused by name instead. In-place changes are read, as before."""
    from gnnfuse.loader import LinkNeighborLoader
    data = attributed_data()
    loaders = [NeighborLoader(data, [2], batch_size=4, prefetch=0),
               LinkNeighborLoader(data, [2], batch_size=4, prefetch=0)]
    for loader in loaders:
        next(iter(loader))
    getattr(data, name).mul_(2)                              # in place: read, no error
    batch = next(iter(loaders[0]))
    assert torch.equal(batch.x, data.x[batch.n_id])
    setattr(data, name, getattr(data, name).clone())
    for loader, called in zip(loaders, ("NeighborLoader", "LinkNeighborLoader")):
        with pytest.raises(RuntimeError, match=f"data.{name} was replaced after this {called} was built"):
            next(iter(loader))


@pytest.mark.parametrize("how", ["replaced", "changed in place"])
def test_an_edge_index_changed_after_the_loader_was_built_is_refused_by_name(how):
    """The loader samples the CSR of the edge_index it was given, as PyG's does, but cuts
    the edge tables by e_id when each batch is made: an edge_index permuted with its
    edge_attr after the loader was built gave batches whose edge_attr rows belonged to
    other edges than their edge_index's. Refused by name, replaced or changed in place."""
    from gnnfuse.loader import LinkNeighborLoader
    data = attributed_data()
    loaders = [NeighborLoader(data, [-1], batch_size=4, prefetch=0),
               LinkNeighborLoader(data, [-1], batch_size=4, prefetch=0)]
    for loader in loaders:
        next(iter(loader))
    order = torch.randperm(data.num_edges, generator=torch.Generator().manual_seed(0))
    if how == "replaced":
        data.edge_index = data.edge_index[:, order]
    else:
        data.edge_index.copy_(data.edge_index[:, order])
    data.edge_attr.copy_(data.edge_attr[order])
    for loader, called in zip(loaders, ("NeighborLoader", "LinkNeighborLoader")):
        with pytest.raises(RuntimeError, match=f"data.edge_index was {how} after this {called} was built"):
            next(iter(loader))


def test_tables_given_by_keyword_are_not_watched_on_the_data():
    data = attributed_data()
    loader = NeighborLoader(data, [2], batch_size=4, prefetch=0, x=data.x.clone())
    data.x = torch.zeros_like(data.x)                        # the loader reads its own x, as given
    next(iter(loader))


@pytest.mark.parametrize("name", ["edge_attr", "edge_weight", "y"])
def test_a_data_table_added_after_the_loader_was_built_is_refused_by_name(name):
    """A table the Data lacked when the loader was built and was given afterwards reaches
    PyG's batches; gnnfuse's loader took none, so its batches said ``None`` for it, silently
    (``GCNConv(x, edge_index, batch.edge_weight)`` then ran unweighted): refused by name,
    as a replaced table is."""
    from gnnfuse.loader import LinkNeighborLoader
    data = attributed_data(edge_tables=False)
    del data.y
    loaders = [NeighborLoader(data, [2], batch_size=4, prefetch=0),
               LinkNeighborLoader(data, [2], batch_size=4, prefetch=0)]
    for loader in loaders:
        next(iter(loader))
    rows = data.num_nodes if name == "y" else data.num_edges
    setattr(data, name, torch.rand(rows, dtype=torch.float64))
    for loader, called in zip(loaders, ("NeighborLoader", "LinkNeighborLoader")):
        with pytest.raises(RuntimeError, match=f"data.{name} was set after this {called} was built"):
            next(iter(loader))


def test_an_in_place_change_to_a_table_the_loader_copied_is_refused_by_name(monkeypatch):
    """A table the loader keeps as a copy (on a GPU one moved to the loader's device or
    page-locked; here a copy forced through `_place`, since this machine's placements
    read every table in place) would not see an in-place change the README promises
    reaches later batches: refused at the next batch. A table read in place sees the
    change, as before."""
    shared = attributed_data()
    in_place = NeighborLoader(shared, [2], batch_size=4, prefetch=0)
    shared.x.mul_(2)
    batch = next(iter(in_place))
    assert torch.equal(batch.x, shared.x[batch.n_id])
    monkeypatch.setattr(NeighborLoader, "_place", lambda self, table: None if table is None else table.clone())
    data = attributed_data()
    copied = NeighborLoader(data, [2], batch_size=4, prefetch=0)
    next(iter(copied))
    data.y[0] += 1
    with pytest.raises(RuntimeError, match="the y table was changed in place after this NeighborLoader copied it"):
        next(iter(copied))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a copy to the GPU needs one")
def test_an_in_place_change_to_a_host_table_a_gpu_loader_copied_is_refused():
    """Features moved to the GPU (``feature_device='device'``) are a copy; a loader
    sampling on the host with pinned features (the default here) gathers from the
    table itself, so there the change is read."""
    data = attributed_data()
    loader = NeighborLoader(data, [2], batch_size=4, prefetch=0, device="cuda", feature_device="device")
    next(iter(loader))
    data.x.add_(1)
    with pytest.raises(RuntimeError, match="the x table was changed in place"):
        next(iter(loader))
    read = attributed_data()
    pinned = NeighborLoader(read, [2], batch_size=4, prefetch=0, device="cuda")
    read.x.add_(1)
    batch = next(iter(pinned))
    assert torch.equal(batch.x.cpu(), read.x[batch.n_id.cpu()])


def test_a_zero_dim_label_is_pygs_graph_level_y_passed_whole():
    """A graph-level label (a 0-dim ``y``) has no row per vertex to cut: PyG's batch keeps
    it whole (``Data.is_node_attr`` is False for it), where gnnfuse's loader refused it
    (and before that raised ``IndexError`` from the row count check). Against PyG's
    ``filter_data``; an in-place change reaches later batches, as in PyG; padded batches,
    whose ``y`` is padded per seed, refuse it by name, and so does a 0-dim ``x``."""
    from torch_geometric.loader.utils import filter_data
    from gnnfuse.loader import LinkNeighborLoader
    data = attributed_data()
    data.y = torch.tensor(3)
    for batch in _batches(data, [-1], num_workers=0)[:2] + [next(iter(LinkNeighborLoader(data, [2], batch_size=4)))]:
        n_id, edge_index, e_id, _, _ = pyg_full_subgraph(data.edge_index, batch.n_id[:4].tolist(), 1)
        pyg = filter_data(data, n_id, edge_index[0], edge_index[1], e_id)
        assert batch.y.dim() == 0 and batch.y.dtype == pyg.y.dtype and torch.equal(batch.y, pyg.y)
    loader = NeighborLoader(data, [2], batch_size=4, prefetch=0)
    data.y.add_(1)
    assert int(next(iter(loader)).y) == 4
    with pytest.raises(ValueError, match="y is a 0-dim tensor .*static_shapes"):
        NeighborLoader(data, [2], batch_size=4, prefetch=0, static_shapes=True)
    data.x = torch.tensor(1.0)
    with pytest.raises(ValueError, match="x is a 0-dim tensor"):
        NeighborLoader(data, [2], batch_size=4, prefetch=0)


def test_an_attribute_replaced_by_another_level_is_cut_by_its_new_level():
    """PyG's loader decides each attribute's level on its copy of the ``Data`` at every
    batch (the copy drops ``Data``'s cache of levels, and assigning a name drops its entry),
    so ``data.late = <an edge-level tensor>`` after a node-level one is cut by ``e_id``.
    The level gnnfuse's batches decided on the first read was kept: the edge-level table was
    cut by ``n_id`` (a silent wrong batch), a node-level one that had been a title came
    whole, and a mask replaced by a 0-dim flag raised index_select's error. Against PyG's
    ``filter_data``, for an attribute there at construction and one given later; a pickled
    batch keeps the levels of the tables it carries."""
    import pickle
    from torch_geometric.loader.utils import filter_data
    data = attributed_data()
    loader = NeighborLoader(data, [-1], batch_size=4, prefetch=0)
    data.late = torch.rand(data.num_nodes)
    first = next(iter(loader))
    assert torch.equal(first.late, data.late[first.n_id]) and first.title == data.title
    gen = torch.Generator().manual_seed(2)
    data.late = torch.rand(data.num_edges, generator=gen)                  # node -> edge level
    data.node_year = torch.rand(data.num_edges, generator=gen)             # node -> edge level
    data.train_mask = torch.tensor(True)                                   # node -> graph level
    data.title = torch.rand(data.num_nodes, generator=gen)                 # graph -> node level
    data.edge_time = torch.rand(data.num_nodes, generator=gen)             # edge -> node level
    batch = next(iter(loader))
    for seen in (batch, pickle.loads(pickle.dumps(next(iter(loader))))):
        n_id, edge_index, e_id, _, _ = pyg_full_subgraph(data.edge_index, seen.n_id[:seen.batch_size].tolist(), 1)
        pyg = filter_data(data, n_id, edge_index[0], edge_index[1], e_id)
        assert _keyed(seen.e_id, seen.late) == _keyed(e_id, pyg.late)
        assert _keyed(seen.e_id, seen.node_year) == _keyed(e_id, pyg.node_year)
        assert _keyed(seen.n_id, seen.title) == _keyed(n_id, pyg.title)
        assert _keyed(seen.n_id, seen.edge_time) == _keyed(n_id, pyg.edge_time)
        assert seen.train_mask.dim() == 0 and torch.equal(seen.train_mask, pyg.train_mask)


def test_assigning_to_a_batch_is_refused_with_what_to_do_instead():
    """PyG code writes to its batch (``batch.x = emb(batch.n_id)``); a gnnfuse batch's
    blocks, PyG view and layouts are built from its tensors, so it is read-only, and the
    refusal says so and names the way out (the dataclass's own message was "cannot
    assign to field 'x'"), for node and link batches, new names and deletion alike."""
    from dataclasses import FrozenInstanceError

    from gnnfuse.loader import LinkNeighborLoader
    data = attributed_data()
    batch = next(iter(NeighborLoader(data, [3, 3], batch_size=4)))
    link = next(iter(LinkNeighborLoader(data, [3], batch_size=4, edge_label_index=data.edge_index[:, :8])))
    for target, name in ((batch, "x"), (batch, "train_mask"), (batch, "new_name"), (link, "x")):
        with pytest.raises(FrozenInstanceError, match=f"cannot set batch.{name}: a gnnfuse .* is read-only") as info:
            setattr(target, name, torch.zeros(1))
        assert "x = emb(batch.n_id)" in str(info.value)
    with pytest.raises(FrozenInstanceError, match="read-only"):
        del batch.x
    assert batch.train_mask.shape == (batch.num_nodes,)      # reads still cut the Data's table


def pyg_neighbor_loader(data, hops: int, **kwargs):
    """PyG's ``NeighborLoader`` on ``data`` with ``num_neighbors=[-1] * hops``, sampling
    through `pyg_full_subgraph` (PyG's own sampler needs pyg-lib)."""
    from torch_geometric.loader import NeighborLoader as PyGNeighborLoader
    from torch_geometric.sampler import BaseSampler, SamplerOutput

    class FullNeighbourhoods(BaseSampler):
        edge_permutation = None

        def sample_from_nodes(self, inputs, **kwargs):
            n_id, edge_index, e_id, nodes, edges = pyg_full_subgraph(data.edge_index, inputs.node.tolist(), hops)
            return SamplerOutput(node=n_id, row=edge_index[0], col=edge_index[1], edge=e_id, num_sampled_nodes=nodes,
                                 num_sampled_edges=edges, metadata=(inputs.input_id, None))

        def sample_from_edges(self, inputs, neg_sampling=None):
            raise NotImplementedError

    return PyGNeighborLoader(data, [-1] * hops, neighbor_sampler=FullNeighbourhoods(), **kwargs)


@pytest.mark.parametrize("edge_tables", [True, False])
def test_data_accessors_are_pygs(edge_tables):
    """``keys()``, ``in``, ``batch[name]``, iteration, ``num_edges`` and the feature
    counts, against PyG's loader's batch of the same sample (they raised AttributeError
    or TypeError)."""
    data = attributed_data(edge_tables=edge_tables)
    ours = list(NeighborLoader(data, [-1, -1], batch_size=8, prefetch=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = list(pyg_neighbor_loader(data, 2, batch_size=8))
    assert len(ours) == len(theirs) > 1
    for batch, pyg in zip(ours, theirs):
        assert torch.equal(batch.n_id, pyg.n_id)
        assert set(batch.keys()) == set(pyg.keys())
        for name in ("edge_attr", "e_id", "train_mask", "title", "not_there"):
            assert (name in batch) == (name in pyg)
        assert (batch.num_edges, batch.num_node_features, batch.num_features, batch.num_edge_features) == \
            (pyg.num_edges, pyg.num_node_features, pyg.num_features, pyg.num_edge_features)
        assert torch.equal(batch["edge_index"], pyg["edge_index"]) and torch.equal(batch["x"], pyg["x"])
        pairs = dict(batch)
        assert list(pairs) == batch.keys() and pairs["batch_size"] == pyg.batch_size
        with pytest.raises(KeyError, match="'not_there': this MiniBatch holds x, y, n_id"):
            batch["not_there"]


def test_feature_counts_of_vector_tables_are_pygs():
    """A 1-D ``x`` or ``edge_attr`` holds one feature per row, as PyG's ``Data`` counts
    it (not its row count), checked against a PyG ``Data`` of the batch's tables."""
    from torch_geometric.data import Data
    edge_index = torch.randint(0, 12, (2, 40), generator=torch.Generator().manual_seed(0))
    data = Data(x=torch.randn(12), edge_index=edge_index, edge_attr=torch.randn(40), num_nodes=12)
    batch = next(iter(NeighborLoader(data, [-1], batch_size=4, prefetch=0)))
    pyg = Data(x=batch.x, edge_index=batch.edge_index, edge_attr=batch.edge_attr)
    assert batch.x.shape[0] > 1 and batch.edge_attr.shape[0] > 1
    assert (batch.num_node_features, batch.num_features, batch.num_edge_features) == \
        (pyg.num_node_features, pyg.num_features, pyg.num_edge_features) == (1, 1, 1)


def test_padded_and_link_batches_list_what_they_hold():
    """A padded batch lists no PyG view (its ``num_edges`` is refused as its
    ``edge_index`` is); a link batch lists its mode's link attributes and no ``batch_size``."""
    from gnnfuse.loader import LinkNeighborLoader
    data = attributed_data(60, 300)
    padded = next(iter(NeighborLoader(data, [3, 2], batch_size=8, prefetch=0, static_shapes=True)))
    assert padded.padded and "edge_index" not in padded and "x" in padded
    with pytest.raises(ValueError, match="batch.edge_index: this batch is padded"):
        padded.num_edges
    binary = next(iter(LinkNeighborLoader(data, [2], batch_size=4, neg_sampling_ratio=1.0)))
    assert {"edge_label_index", "edge_label", "input_id", "edge_index"} <= set(binary.keys())
    assert "batch_size" not in binary and "src_index" not in binary
    assert binary.num_edges == binary.edge_index.shape[1] and torch.equal(binary["edge_label"], binary.edge_label)
    triplet = next(iter(LinkNeighborLoader(data, [2], batch_size=4, neg_sampling="triplet")))
    assert {"src_index", "dst_pos_index", "dst_neg_index"} <= set(triplet.keys()) and "edge_label_index" not in triplet


def test_a_data_s_edge_and_node_types_are_attributes_cut_as_pyg_cuts_them():
    """PyG's loaders take a homogeneous ``Data`` with ``edge_type`` (a knowledge graph an
    R-GCN reads as ``batch.edge_type``) and cut it by ``e_id``; gnnfuse's refused the
    graph as typed."""
    from gnnfuse.loader import LinkNeighborLoader
    data = attributed_data(60, 300)
    gen = torch.Generator().manual_seed(5)
    data.edge_type = torch.randint(0, 4, (300,), generator=gen)
    data.node_type = torch.randint(0, 2, (60,), generator=gen)
    for batch in _batches(data, [3, 2], batch_size=8)[:3]:
        assert torch.equal(batch.edge_type, data.edge_type[batch.e_id])
        assert torch.equal(batch.node_type, data.node_type[batch.n_id])
    link = next(iter(LinkNeighborLoader(data, [3], batch_size=8)))
    assert torch.equal(link.edge_type, data.edge_type[link.e_id])
