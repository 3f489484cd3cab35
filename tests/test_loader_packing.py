"""loader/packing.py: a batch's tensors cross between processes in one buffer per device."""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse
from gnnfuse.loader import NeighborLoader
from gnnfuse.loader.packing import ALIGN, pack, unpack
from gnnfuse.nn import SAGEConv

DTYPES = [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.float32, torch.float64]


@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), max_size=3)), max_size=6))
@settings(max_examples=60, deadline=None)
def test_any_dense_tensors_come_back_equal_and_aligned(specs):
    gen = torch.Generator().manual_seed(len(specs))
    tensors = [(torch.rand(shape, generator=gen) * 100).to(dtype) for dtype, shape in specs]
    data, buffers, where = pack({"tensors": tensors, "first": tensors[0] if tensors else None})
    assert len(buffers) <= 1                                   # one buffer for the one device
    out = unpack(data, buffers, where)
    for got, want in zip(out["tensors"], tensors, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    if tensors:
        assert out["first"] is out["tensors"][0]
    assert all(offset % ALIGN == 0 for _, offset, _, _ in where)


def test_a_loader_batch_round_trips_with_its_graph_caches():
    gen = torch.Generator().manual_seed(3)
    graph = gnnfuse.Graph(torch.randint(0, 30, (150,), generator=gen), torch.randint(0, 30, (150,), generator=gen), 30)
    loader = NeighborLoader(graph, [4, 2], batch_size=8, x=torch.randn(30, 3, generator=gen), prefetch=0)
    batch = next(iter(loader))
    out = unpack(*pack(batch))
    assert torch.equal(out.x, batch.x) and torch.equal(out.n_id, batch.n_id)
    for got, want in zip(out.blocks, batch.blocks, strict=True):
        assert set(got.graph._cache) == set(want.graph._cache)
        assert all(torch.equal(a, b) for a, b in zip(got.graph.csr(), want.graph.csr()))
        assert torch.equal(got.graph.src, want.graph.src) and got.num_src == want.num_src


def test_a_tensor_that_needs_grad_is_refused():
    with pytest.raises(TypeError, match="plain dense tensors"):
        pack({"w": torch.zeros(2, requires_grad=True)})


def test_unpacked_tensors_have_their_own_version_counters():
    """Views of the one received buffer shared its version counter: ``batch.x``
    normalised in place read as an edit of every block graph's index tensors, which the
    graph then refused (`Graph.check_unchanged`)."""
    gen = torch.Generator().manual_seed(3)
    graph = gnnfuse.Graph(torch.randint(0, 30, (150,), generator=gen), torch.randint(0, 30, (150,), generator=gen), 30)
    loader = NeighborLoader(graph, [4, 2], batch_size=8, x=torch.randn(30, 3, generator=gen), prefetch=0)
    batch = unpack(*pack(next(iter(loader))))
    batch.x.mul_(2)
    for block in batch.blocks:
        block.graph.check_unchanged()
        assert block.graph.csr() is not None


def _saved_and_loaded(obj):
    file = io.BytesIO()
    torch.save(obj, file)
    file.seek(0)
    return torch.load(file, weights_only=False)


@pytest.mark.parametrize("round_trip", [_saved_and_loaded, lambda b: pickle.loads(pickle.dumps(b)), copy.deepcopy],
                         ids=["torch.save", "pickle", "deepcopy"])
def test_a_batch_from_a_worker_saves_loads_and_runs_as_the_batch(round_trip):
    """A worker's batch had all its tensors, of several dtypes, on one storage:
    ``torch.save`` refused it ("view the same data as different types") and pickle wrote
    the whole buffer once per tensor."""
    gen = torch.Generator().manual_seed(3)
    graph = gnnfuse.Graph(torch.randint(0, 30, (150,), generator=gen), torch.randint(0, 30, (150,), generator=gen), 30)
    loader = NeighborLoader(graph, [4, 2], batch_size=8, x=torch.randn(30, 3, generator=gen), prefetch=0)
    batch = unpack(*pack(next(iter(loader))))
    back = round_trip(batch)
    assert torch.equal(back.x, batch.x) and torch.equal(back.n_id, batch.n_id)
    conv = SAGEConv(3, 4)
    for got, want in zip(back.blocks, batch.blocks, strict=True):
        assert torch.equal(got.edge_index, want.edge_index) and torch.equal(got.src_nodes, want.src_nodes)
        x = torch.randn(got.num_src, 3, generator=gen)
        torch.testing.assert_close(conv((x, x[:got.num_dst]), got.graph), conv((x, x[:want.num_dst]), want.graph),
                                   rtol=0, atol=0)


def test_a_pickled_batch_from_a_worker_holds_each_tensor_once():
    """Each tensor pickled its storage, the whole buffer: 255 kB for a batch that pickles
    to 12 kB."""
    gen = torch.Generator().manual_seed(3)
    graph = gnnfuse.Graph(torch.randint(0, 30, (150,), generator=gen), torch.randint(0, 30, (150,), generator=gen), 30)
    loader = NeighborLoader(graph, [4, 2], batch_size=8, x=torch.randn(30, 3, generator=gen), prefetch=0)
    plain = next(iter(loader))
    assert len(pickle.dumps(unpack(*pack(plain)))) < 1.5 * len(pickle.dumps(plain))


def test_an_empty_tensor_beside_another_dtype_saves():
    """An empty tensor's slice of the buffer would start where the next tensor's does:
    ``torch.save`` reads one address under two dtypes as an alias and refuses it."""
    out = _saved_and_loaded(unpack(*pack([torch.empty(0, dtype=torch.int64), torch.ones(3)])))
    assert out[0].shape == (0,) and out[0].dtype == torch.int64 and torch.equal(out[1], torch.ones(3))
