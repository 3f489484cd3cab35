"""Defects a differential hunt (gnnfuse against PyG, float64) found in the PyG models,
``EdgeConv`` and the loaders, each pinned by the case that showed it."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch import nn

import gnnfuse.nn

# 7 vertices, a self loop, a repeated edge, vertex 6 without in-edges
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 1, 3, 0, 2, 6],
                      [1, 2, 3, 4, 5, 0, 0, 0, 3, 2, 4, 5]])


class _Centred(nn.Module):
    """Each edge's row minus the mean over all edges' rows (dim 0: the edges)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h - h.mean(0)


class _RowSum(nn.Module):
    """Each edge's row scaled by its own sum (dim 1: the features, as PyG's nn sees them)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * h.sum(dim=1, keepdim=True)


class _Pairs(nn.Module):
    """PyG-style reshapes and indexing of the [E, 4] table: ``view(-1, 2, 2)`` keeps the
    edge axis first; ``h[:, :2]`` slices features."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.view(-1, 2, 2).sum(-1) + h[:, :2] * h[:, 2:]


# nn -> the warning when it runs eagerly (it combines edges' rows: dim 0 of PyG's [E, 2F]
# input; or it has an op the tracer lacks), None when it compiles
EDGE_NNS = {
    "softmax-over-edges": (lambda: nn.Sequential(nn.Linear(6, 4), nn.Softmax(dim=0)), "dim 0 is the row axis"),
    "centred-over-edges": (lambda: nn.Sequential(nn.Linear(6, 4), _Centred()), "dim 0 is the row axis"),
    "gelu": (lambda: nn.Sequential(nn.Linear(6, 4), nn.GELU()), "gelu has no gnnfuse op"),
    "softmax-dim1": (lambda: nn.Sequential(nn.Linear(6, 4), nn.Softmax(dim=1)), None),
    "row-sum-dim1": (lambda: nn.Sequential(nn.Linear(6, 4), _RowSum()), None),
    "view-and-slices": (lambda: nn.Sequential(nn.Linear(6, 4), _Pairs()), None),     # was [N, 1, 2] for [N, 2]
}


@pytest.mark.parametrize("case", EDGE_NNS)
def test_edge_conv_nn_sees_pygs_edge_axis(case, monkeypatch):
    """PyG's EdgeConv applies ``nn`` to the [E, 2F] table of all edges, so in ``nn`` dim 0
    is the edge axis and dim 1 the first feature dim. Traced per edge, ``nn`` had seen a
    row without that axis: ``Softmax(dim=0)`` and ``h - h.mean(0)`` ran over each edge's
    own features (a silently wrong answer), and ``dim=1`` was refused as out of range.
    Now a per-row ``nn`` compiles to PyG's output and one the tracer cannot compile per
    edge (over dim 0; ``EdgeCNN(act='gelu')``'s GELU, which raised a CompileError) runs
    PyG's formula eagerly with a warning saying why."""
    from gnnfuse.nn import edge_conv_eager
    monkeypatch.setattr(edge_conv_eager, "_WARNED", set())
    make, eager_because = EDGE_NNS[case]
    torch.manual_seed(0)
    h = make().double()
    x = torch.randn(7, 3, dtype=torch.float64)
    for aggr in ("add", "max"):
        ours, theirs = gnnfuse.nn.EdgeConv(h, aggr=aggr), pyg_nn.EdgeConv(h, aggr=aggr)    # each resets h
        outputs = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for layer in (ours, theirs):
                xs = x.clone().requires_grad_()
                out = layer(xs, EDGES)
                outputs.append((out, torch.autograd.grad(out.square().sum(), [xs, *h.parameters()])))
        torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-9, atol=1e-12)
        eager = [str(w.message) for w in caught if "EdgeConv runs eagerly" in str(w.message)]
        if eager_because is None:
            assert not eager
        elif aggr == "add":                     # warned once
            assert len(eager) == 1 and eager_because in eager[0]


def test_a_data_attribute_assigned_anew_reaches_later_batches():
    """PyG's loader reads the ``Data``'s attributes at each batch, so ``data.train_mask =
    new_mask`` between epochs (an active-learning loop) reaches the next batches. The
    loader had kept the tensor it saw at construction: later batches read the old mask,
    silently; a table moved to another device kept its stale copy too."""
    from gnnfuse.loader import LinkNeighborLoader, NeighborLoader
    from test_loader_batch_attributes import attributed_data
    data = attributed_data(30, 120)
    loaders = [NeighborLoader(data, [2, 2], batch_size=8, prefetch=0), LinkNeighborLoader(data, [2], batch_size=8)]
    for loader in loaders:
        batch = next(iter(loader))
        assert torch.equal(batch.train_mask, data.train_mask[batch.n_id])
    data.train_mask = ~data.train_mask                   # a new tensor, not an in-place change
    data.edge_time = torch.rand(data.edge_time.shape, dtype=torch.float64)
    data.title = "renamed"
    for loader in loaders:
        torch.manual_seed(0)
        batch = next(iter(loader))
        assert torch.equal(batch.train_mask, data.train_mask[batch.n_id])
        assert torch.equal(batch.edge_time, data.edge_time[batch.e_id])
        assert batch.title == "renamed"
        batch.to("meta")                                  # copied to another device: the new table's copy
        assert batch.train_mask.device.type == "meta"
    import pickle
    batch = pickle.loads(pickle.dumps(next(iter(loaders[0]))))     # a pickled batch keeps the tables it saw
    assert torch.equal(batch.train_mask, data.train_mask[batch.n_id])


@pytest.mark.parametrize("name", ["n_id", "e_id"])
def test_a_datas_own_ids_other_than_positions_are_refused_by_name(name):
    """PyG's loader keeps a ``Data``'s own ``n_id`` / ``e_id`` (``if 'n_id' not in data``),
    cut to the sample: with ``data.n_id`` holding original ids (of a subgraph), PyG's
    ``batch.n_id`` gives those. gnnfuse's ``batch.n_id`` / ``e_id`` are the sampled
    positions, which hid the ``Data``'s: the batch gave other ids, silently. Ids equal
    to the positions (PyG's ``data.n_id = torch.arange(num_nodes)`` idiom) mean the
    same in both and are accepted."""
    from gnnfuse.loader import LinkNeighborLoader, NeighborLoader
    from test_loader_batch_attributes import attributed_data
    data = attributed_data(30, 120)
    count = data.num_nodes if name == "n_id" else data.num_edges
    data[name] = torch.arange(count)
    batch = next(iter(NeighborLoader(data, [2], batch_size=4, prefetch=0)))
    assert torch.equal(getattr(batch, name), data[name][getattr(batch, name)])
    data[name] = torch.arange(count) + 1000
    for loader in (NeighborLoader, LinkNeighborLoader):
        with pytest.raises(ValueError, match=f"the Data's own {name}"):
            loader(data, [2], batch_size=4)
