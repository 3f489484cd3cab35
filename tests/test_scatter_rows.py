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


def test_a_table_of_strided_columns_is_read_by_its_elements(monkeypatch):
    """Every other column of a [9, 10] table: copied to packed rows before the kernel,
    which reads a row's elements one apart."""
    names = launched(monkeypatch)
    g = torch.Generator().manual_seed(1)
    table = torch.randn(9, 10, generator=g).to(DEVICE)[:, ::2]
    gather = torch.randint(0, 9, (40,), generator=g).to(DEVICE)
    scatter = torch.randint(0, 4, (40,), generator=g).to(DEVICE)
    got = scatter_rows.scatter_scaled_rows(table, gather, scatter, None, 4)
    torch.testing.assert_close(got.double(), oracle(table, gather, scatter, None, 4), rtol=1e-5, atol=1e-5)
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


@pytest.fixture
def deterministic():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("gathered, scaled", [(True, True), (False, False), (True, False)])
def test_under_the_switch_each_target_walks_its_edges_in_order(dtype, tol, gathered, scaled, deterministic,
                                                               monkeypatch):
    """torch.use_deterministic_algorithms(True): no atomics (whose arrival order sets the
    last bits) but one program per target row summing its edges in a fixed order; rows
    without edges are zero (targets 0 and 7 have none here), a row of more edges than a
    block (target 3) sums over several."""
    names = launched(monkeypatch)
    g = torch.Generator().manual_seed(3)
    edges, sources, rows = 90, 9, 8
    table = torch.randn((sources if gathered else edges, 2, 3), generator=g).to(DEVICE, dtype)
    gather = torch.randint(0, sources, (edges,), generator=g).to(DEVICE) if gathered else None
    scatter = torch.cat([torch.full((40,), 3), torch.randint(1, 7, (50,), generator=g)])
    scatter = scatter[torch.randperm(edges, generator=g)].to(DEVICE)
    scatter[scatter == 0] = 1
    scale = torch.rand(edges, generator=g).to(DEVICE, dtype) if scaled else None
    got = scatter_rows.scatter_scaled_rows(table, gather, scatter, scale, rows)
    read = gather if gathered else torch.arange(edges, device=DEVICE)
    torch.testing.assert_close(got.double(), oracle(table, read, scatter, scale, rows), rtol=tol, atol=tol)
    assert torch.equal(got[0], torch.zeros_like(got[0])) and torch.equal(got[7], torch.zeros_like(got[7]))
    assert names == ["_scatter_rows_in_order"]


def test_the_target_order_is_remembered_while_the_index_is_unchanged(deterministic):
    """The order is a sort of the scatter index, made once per index tensor: an in-place
    edit of the index, or another row count, orders anew."""
    scatter = torch.tensor([2, 0, 2, 1, 0], device=DEVICE)
    first = scatter_rows.target_order(scatter, 3)
    assert scatter_rows.target_order(scatter, 3) is first
    assert first.edges.tolist() == [1, 4, 3, 0, 2] and first.offsets.tolist() == [0, 2, 3, 5]
    assert scatter_rows.target_order(scatter, 4).offsets.tolist() == [0, 2, 3, 5, 5]
    scatter[0] = 1
    again = scatter_rows.target_order(scatter, 3)
    assert again.edges.tolist() == [1, 4, 0, 3, 2] and again.offsets.tolist() == [0, 2, 4, 5]


def _kernel_signature(index: str, edges: str = "i32") -> dict[str, str]:
    """`_scatter_scaled_rows`' argument types with ``index`` (``*i32``/``*i64``) indices,
    the edge count ``edges`` and every other size an int32 (as Triton specializes sizes
    below 2^31)."""
    return {"table_ptr": "*fp32", "gather_ptr": index, "scatter_ptr": index, "scale_ptr": "*fp32",
            "out_ptr": "*fp32", "E": edges, "F": "i32", "stride_t": "i32", "stride_o": "i32",
            "SCALED": "constexpr", "GATHER": "constexpr", "BLOCK_E": "constexpr", "BLOCK_F": "constexpr",
            "WIDE": "constexpr"}


@pytest.mark.parametrize("gathered", [True, False])
def test_int32_targets_address_their_rows_in_64_bits(gathered):
    """The compact tables hand their edge-to-pair index over as int32 where the pairs fit
    it (`compact.narrow_index`); the kernel multiplied each loaded target by the row
    width in int32, so once ``out`` held 2^31 elements (16.8M pairs of 128 features, a
    products-sized graph's vertices at 1024) the adds went to another row, or out of
    bounds. Compiled for an sm_90 GPU (no GPU needed), no loaded index is multiplied in
    32 bits; `test_a_table_past_2_to_the_32_elements_gets_its_rows_on_a_gpu` shows it."""
    from offset_widths import narrow_index_products, triton_ir
    for index in ("*i32", "*i64"):
        ir = triton_ir(scatter_rows._scatter_scaled_rows, _kernel_signature(index),
                       {"SCALED": True, "GATHER": gathered, "BLOCK_E": 32, "BLOCK_F": 128, "WIDE": False})
        assert narrow_index_products(ir) == []


def test_a_scatter_of_2_to_the_31_edges_numbers_them_in_64_bits(monkeypatch):
    """As the row gather's edges (test_row_moves.py): past 2^31 edges an int32
    ``tl.program_id(0) * BLOCK_E`` wrapped to negative edge ids that the ``< E`` mask let
    through. The variant such a launch takes (``WIDE``) multiplies no program id in 32
    bits where that wraps, and scatters what torch does (run here on 70 edges)."""
    from offset_widths import narrow_program_products, triton_ir
    programs = -(-(2**31 + 1) // scatter_rows.BLOCK_E)
    for wide in (True, False):
        ir = triton_ir(scatter_rows._scatter_scaled_rows, _kernel_signature("*i64", "i64"),
                       {"SCALED": True, "GATHER": True, "BLOCK_E": scatter_rows.BLOCK_E, "BLOCK_F": 128, "WIDE": wide})
        assert bool(narrow_program_products(ir, programs)) is not wide     # narrow: what smaller launches keep
    monkeypatch.setattr(scatter_rows, "wide_ids", lambda count, block: True)
    g = torch.Generator().manual_seed(2)
    table = torch.randn(9, 4, generator=g).to(DEVICE)
    gather, scatter = (torch.randint(0, n, (70,), generator=g).to(DEVICE) for n in (9, 6))
    scale = torch.rand(70, generator=g).to(DEVICE)
    torch.testing.assert_close(scatter_rows.scatter_scaled_rows(table, gather, scatter, scale, 6).double(),
                               oracle(table, gather, scatter, scale, 6), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a 17 GB output table: GPU only")
def test_a_table_past_2_to_the_32_elements_gets_its_rows_on_a_gpu():
    """Pairs of 128 features past row 2^25 (``out`` of 2^32 + 1024 float32 elements,
    17.2 GB): an int32 target of row 2^25 + 1 times 128 wrapped to row 1 before the
    targets were widened, silently; each row now gets its own edges' sums."""
    width, rows = 128, (1 << 25) + 8
    table = torch.arange(3 * width, dtype=torch.float32, device="cuda").reshape(3, width)
    scatter = torch.tensor([rows - 7, rows - 1, 2], dtype=torch.int32, device="cuda")     # 2^25 + 1, the last, 2
    got = scatter_rows.scatter_scaled_rows(table, None, scatter, None, rows)
    for edge, row in enumerate(scatter.tolist()):
        assert torch.equal(got[row], table[edge]), row
    assert torch.count_nonzero(got[:2]) == 0 and int(torch.count_nonzero(got)) == 3 * width - 1   # table[0][0] is 0
    del got
    torch.cuda.empty_cache()
