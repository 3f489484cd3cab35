"""PyG's batch idioms on gnnfuse's loader batches: a PyG ``Data``'s other node- and
edge-level attributes (``batch.train_mask``, ``batch.node_year``, ``batch.edge_time``)
cut to the sample (`loader.data_attributes`).

Oracle for the attributes: PyG's own batch builder, ``torch_geometric.loader.utils.
filter_data`` (what PyG's ``NeighborLoader`` runs on its sampler's output; the sampler
itself needs pyg-lib, which this machine lacks), applied to PyG's full-neighbourhood
sample (`pyg_full_subgraph`); values are compared keyed by ``n_id`` and ``e_id``, so the
check does not rest on the two numberings agreeing."""
from __future__ import annotations

import pytest
import torch

from gnnfuse.loader import NeighborLoader
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
    data.title = "graph-level: not sliced"
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
        with pytest.raises(AttributeError, match="'title'"):       # graph-level: PyG keeps it whole
            batch.title


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


def test_a_gnnfuse_node_dataset_s_masks_come_too():
    from gnnfuse.data import load_node_dataset
    data = load_node_dataset("synthetic")
    batch = next(iter(NeighborLoader(data, [3, 2], batch_size=16, input_nodes=data.train_mask, prefetch=0)))
    assert batch.train_mask[:batch.batch_size].all()
    for name in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(batch, name), getattr(data, name)[batch.n_id])


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
