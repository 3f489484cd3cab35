"""The Triton row scatter of the typed aggregation (backend/triton/scatter_rows.py):
``out[scatter[e]] += s[e] * table[gather[e]]`` against plain torch in float64, run as a
kernel under Triton's interpreter (or on the GPU) for float32 and bfloat16 rows with and
without a scale, rows with middle dimensions and repeated targets; float64 keeps the
exact torch form."""
from __future__ import annotations

import pytest
import torch
from oracle_check import device_for

from gnnfuse.backend.triton import scatter_rows

DEVICE = device_for("triton")


def oracle(table, gather, scatter, scale, rows):
    picked = table.double()[gather]
    if scale is not None:
        picked = picked * scale.double().reshape((-1,) + (1,) * (picked.dim() - 1))
    return torch.zeros((rows,) + tuple(table.shape[1:]), dtype=torch.float64, device=table.device).index_add(
        0, scatter, picked)


def launched(monkeypatch) -> list[str]:
    names: list[str] = []
    launch = scatter_rows.launch

    def record(kernel, *args):
        names.append(kernel.__name__ if hasattr(kernel, "__name__") else str(kernel))
        launch(kernel, *args)
    monkeypatch.setattr(scatter_rows, "launch", record)
    return names


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", [(5,), (2, 3)])
@pytest.mark.parametrize("scaled", [True, False])
def test_the_kernel_matches_torch(dtype, tol, shape, scaled, monkeypatch):
    names = launched(monkeypatch)
    g = torch.Generator().manual_seed(0)
    edges, sources, rows = 70, 9, 6             # more edges than one block; every target hit many times
    table = torch.randn((sources,) + shape, generator=g).to(DEVICE, dtype)
    gather = torch.randint(0, sources, (edges,), generator=g).to(DEVICE)
    scatter = torch.randint(0, rows, (edges,), generator=g).to(DEVICE)
    scale = torch.rand(edges, 1, generator=g).to(DEVICE, dtype) if scaled else None
    got = scatter_rows.scatter_scaled_rows(table, gather, scatter, scale, rows)
    assert got.dtype == dtype and got.shape == (rows,) + shape
    torch.testing.assert_close(got.double(), oracle(table, gather, scatter, scale, rows), rtol=tol, atol=tol)
    assert names == ["_scatter_scaled_rows"]


def test_float64_keeps_the_torch_form(monkeypatch):
    names = launched(monkeypatch)
    table = torch.randn(4, 3, dtype=torch.float64, device=DEVICE)
    gather, scatter = torch.tensor([0, 3, 3], device=DEVICE), torch.tensor([1, 1, 0], device=DEVICE)
    scale = torch.tensor([0.5, 2.0, -1.0], dtype=torch.float64, device=DEVICE)
    torch.testing.assert_close(scatter_rows.scatter_scaled_rows(table, gather, scatter, scale, 2),
                               oracle(table, gather, scatter, scale, 2), rtol=1e-15, atol=1e-15)
    assert names == []


def test_no_edges_give_zero_rows(monkeypatch):
    """A graph without edges: an empty table of pair products, nothing to launch."""
    names = launched(monkeypatch)
    empty = torch.zeros(0, 4, device=DEVICE)
    index = torch.zeros(0, dtype=torch.long, device=DEVICE)
    got = scatter_rows.scatter_scaled_rows(empty, index, index, torch.zeros(0, device=DEVICE), 3)
    assert torch.equal(got, torch.zeros(3, 4, device=DEVICE)) and names == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scaled", [True, False])
def test_without_a_gather_each_row_is_its_own(dtype, scaled, monkeypatch):
    """``gather`` None: edge e reads row e (a per-edge table summed per pair, the compact
    gradients' pair sums) -- in the kernel, and in the torch form without touching the
    table it was given."""
    names = launched(monkeypatch)
    g = torch.Generator().manual_seed(1)
    table = torch.randn(70, 2, 3, generator=g).to(DEVICE, dtype)
    before = table.clone()
    scatter = torch.randint(0, 6, (70,), generator=g).to(DEVICE)
    scale = torch.rand(70, generator=g).to(DEVICE, dtype) if scaled else None
    got = scatter_rows.scatter_scaled_rows(table, None, scatter, scale, 6)
    expected = oracle(table, torch.arange(70, device=DEVICE), scatter, scale, 6)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(table, before)
    assert names == (["_scatter_scaled_rows"] if dtype == torch.float32 else [])
