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


def test_a_contended_reduce_takes_the_slotted_sum_in_programs_and_their_gradients(monkeypatch):
    """The dispatch in `reduce_rows`, end to end: with the threshold lowered and the CPU
    admitted, a per-relation scalar's gradient (a reduce by edge type over every edge,
    HGT's ``p``) and the forward's sums run through `_slotted_sum` and still pass
    gradcheck in float64."""
    import gnnfuse
    monkeypatch.setattr(movement, "SLOTTED_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(movement, "CONTENDED_ENTRIES_PER_ROW", 2)
    monkeypatch.setattr(movement, "SLOTS", 3)
    calls = []
    slotted = movement._slotted_sum
    monkeypatch.setattr(movement, "_slotted_sum", lambda *a: calls.append(a[2]) or slotted(*a))
    g = torch.Generator().manual_seed(2)
    src, dst = torch.randint(0, 6, (40,), generator=g), torch.randint(0, 6, (40,), generator=g)
    graph = gnnfuse.Graph(src, dst, 6, edge_type=torch.randint(0, 3, (40,), generator=g), num_edge_types=3)
    fn = gnnfuse.vertex(lambda v: sum([e.src.h * e.type.p for e in v.inedges]))
    h = torch.randn(6, 2, dtype=torch.float64, generator=g, requires_grad=True)
    p = torch.randn(3, 1, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h, p: fn(graph, {"h": h}, etype_feature={"p": p}), (h, p))
    assert 3 in calls        # the gradient of p: 40 edges into 3 relation rows
