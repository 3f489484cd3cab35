"""Row moves outside the fused kernels: the Triton row gather (backend/triton/
gather_rows.py) against ``index_select`` bit for bit, under Triton's interpreter (or on
the GPU); and the slotted sum that `reduce_rows` uses on a GPU when many entries go into
few rows (ir/ops/movement.py), against ``index_add`` in float64."""
from __future__ import annotations

import pytest
import torch
from oracle_check import device_for

from gnnfuse.backend.triton import gather_rows as gather_module
from gnnfuse.ir.ops import movement

DEVICE = device_for("triton")


def launched(monkeypatch) -> list[str]:
    names: list[str] = []
    launch = gather_module.launch

    def record(kernel, *args):
        names.append(kernel.__name__)
        launch(kernel, *args)
    monkeypatch.setattr(gather_module, "launch", record)
    return names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (300,)])     # (300,): two column blocks
def test_the_gather_kernel_equals_index_select(dtype, shape, monkeypatch):
    names = launched(monkeypatch)
    g = torch.Generator().manual_seed(0)
    table = torch.randn((11,) + shape, generator=g).to(DEVICE, dtype)
    index = torch.randint(0, 11, (150,), generator=g).to(DEVICE)     # more rows than one block, repeats
    got = gather_module.gather_rows(table, index)
    assert got.shape == (150,) + shape and got.dtype == dtype
    assert torch.equal(got, table.index_select(0, index))
    assert names == ["_gather_rows"]


def test_a_strided_table_is_gathered_by_its_rows(monkeypatch):
    launched(monkeypatch)
    table = torch.randn(7, 8, device=DEVICE)[:, ::2]          # rows 8 apart, 4 wide, not contiguous
    index = torch.tensor([6, 0, 0, 3], device=DEVICE)
    assert torch.equal(gather_module.gather_rows(table, index), table.index_select(0, index))


def test_integer_tables_and_empty_indices_keep_index_select(monkeypatch):
    names = launched(monkeypatch)
    table = torch.arange(12, device=DEVICE).view(6, 2)
    index = torch.tensor([5, 1], device=DEVICE)
    assert torch.equal(gather_module.gather_rows(table, index), table[index])
    empty = gather_module.gather_rows(torch.randn(3, 4, device=DEVICE), index[:0])
    assert empty.shape == (0, 4)
    assert names == []


@pytest.mark.parametrize("shape", [(2,), (2, 3)])
@pytest.mark.parametrize("cap", [None, 12])     # 12 partial sums at most: 2 slots, or 1 for (2, 3) rows
def test_the_slotted_sum_equals_index_add(shape, cap, monkeypatch):
    if cap is not None:
        monkeypatch.setattr(movement, "SLOTTED_ELEMENTS", cap)
    monkeypatch.setattr(movement, "SLOTS", 7)     # entries of one row land in several slots, unevenly
    g = torch.Generator().manual_seed(1)
    entries, rows = 1000, 3
    x = torch.randn((entries,) + shape, generator=g, dtype=torch.float64)
    index = torch.randint(0, rows - 1, (entries,), generator=g)   # the last row gets nothing
    expected = torch.zeros((rows,) + shape, dtype=torch.float64).index_add_(0, index, x)
    got = movement._slotted_sum(x, index, rows)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[-1], torch.zeros(shape, dtype=torch.float64))
