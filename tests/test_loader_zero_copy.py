"""The loader's zero-copy row gather (loader/zero_copy.py): its kernel against
``index_select`` under Triton's interpreter (no pinned memory without a GPU), and the
cases where it must hand the lookup back to the host gather."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gnnfuse.loader.zero_copy import gather_rows, zero_copy_rows
from oracle_check import device_for

pytest.importorskip("triton")


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 70), width=st.sampled_from([1, 3, 8, 100, 130]), count=st.integers(0, 90),
       dtype=st.sampled_from([torch.float32, torch.int64]))
def test_gathered_rows_are_index_select(rows, width, count, dtype):
    """Every width (one label per row, odd widths, wider than one feature block), ids
    repeated and in any order, no ids at all: the kernel's rows are torch's."""
    device = device_for("triton")
    gen = torch.Generator().manual_seed(rows * 131 + width)
    table = torch.randint(-1000, 1000, (rows, width), generator=gen).to(dtype)
    table = (table if width > 1 else table[:, 0]).to(device)
    ids = torch.randint(0, rows, (count,), generator=gen).to(device)
    out = torch.empty((count,) + table.shape[1:], dtype=dtype, device=device)
    assert torch.equal(gather_rows(table, ids, out), table.index_select(0, ids))


def test_host_ids_or_an_unpinned_table_go_back_to_the_host_gather():
    """Zero-copy needs ids on a GPU and a page-locked table; otherwise None, and the
    loader gathers on the host as before."""
    table = torch.randn(5, 3)
    assert zero_copy_rows(table, torch.tensor([0, 4])) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory and UVA need a GPU")
def test_a_pinned_table_is_read_in_place_on_the_gpu():
    """On a GPU the kernel reads a pinned host table through its mapped address: the
    rows come back on the device, equal to a host index_select, with no host gather."""
    table = torch.randn(1000, 37).pin_memory()
    ids = torch.randint(0, 1000, (517,), device="cuda")
    rows = zero_copy_rows(table, ids)
    assert rows is not None and rows.device.type == "cuda"
    assert torch.equal(rows.cpu(), table.index_select(0, ids.cpu()))
    labels = torch.randint(0, 47, (1000,)).pin_memory()
    assert torch.equal(zero_copy_rows(labels, ids).cpu(), labels[ids.cpu()])
