"""loader/packing.py: a batch's tensors cross between processes in one buffer per device."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse
from gnnfuse.loader import NeighborLoader
from gnnfuse.loader.packing import ALIGN, pack, unpack

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
