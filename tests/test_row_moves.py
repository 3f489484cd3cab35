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


@pytest.mark.parametrize("columns", [slice(None, None, 2), slice(0, 5)])
def test_a_strided_table_is_gathered_by_its_rows(columns, monkeypatch):
    """Every other column (copied to packed rows first), and the first 5 of 8 columns:
    packed rows 8 apart, which the kernel reads in place by the table's row stride."""
    names = launched(monkeypatch)
    table = torch.randn(7, 8, device=DEVICE)[:, columns]
    index = torch.tensor([6, 0, 0, 3], device=DEVICE)
    assert torch.equal(gather_module.gather_rows(table, index), table.index_select(0, index))
    assert names == ["_gather_rows"]


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


def _relation_scalar(seed: int):
    """A typed graph of 40 edges over 3 relations and a layer scaling each in-edge's
    source row by its relation's scalar ``p`` (HGT's relation prior): the gradient of
    ``p`` sums every edge into 3 rows. Returns (graph, the vertex function, h, p)."""
    import gnnfuse
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, 6, (40,), generator=g), torch.randint(0, 6, (40,), generator=g)
    graph = gnnfuse.Graph(src, dst, 6, edge_type=torch.randint(0, 3, (40,), generator=g), num_edge_types=3)
    fn = gnnfuse.vertex(lambda v: sum([e.src.h * e.type.p for e in v.inedges]))
    h = torch.randn(6, 2, dtype=torch.float64, generator=g, requires_grad=True)
    p = torch.randn(3, 1, dtype=torch.float64, generator=g, requires_grad=True)
    return graph, fn, h, p


def test_a_contended_reduce_takes_the_slotted_sum_in_programs_and_their_gradients(monkeypatch):
    """The dispatch in `reduce_rows`, end to end: with the threshold lowered and the CPU
    admitted, a per-relation scalar's gradient (a reduce by edge type over every edge,
    HGT's ``p``) and the forward's sums run through `_slotted_sum` and still pass
    gradcheck in float64."""
    monkeypatch.setattr(movement, "SLOTTED_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(movement, "CONTENDED_ENTRIES_PER_ROW", 2)
    monkeypatch.setattr(movement, "SLOTS", 3)
    calls = []
    slotted = movement._slotted_sum
    monkeypatch.setattr(movement, "_slotted_sum", lambda *a: calls.append(a[2]) or slotted(*a))
    graph, fn, h, p = _relation_scalar(2)
    assert torch.autograd.gradcheck(lambda h, p: fn(graph, {"h": h}, etype_feature={"p": p}), (h, p))
    assert 3 in calls        # the gradient of p: 40 edges into 3 relation rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("rows, shape", [(1, ()), (3, (2,)), (4, (2,)), (5, (2, 3)), (16, (4,))])
def test_the_few_rows_kernel_equals_index_add(dtype, rows, shape):
    """Many entries into a few rows (backend/triton/few_rows_sum.py), against
    ``index_add`` in float64: entries not a multiple of a program's chunk, a row no
    entry reaches, int32 and int64 indices, a NaN that reaches only its own row."""
    from gnnfuse.backend.triton import few_rows_sum as few
    names = []
    launch = few.launch
    few.launch, restore = (lambda kernel, *a: names.append(kernel.__name__) or launch(kernel, *a)), launch
    try:
        g = torch.Generator().manual_seed(rows)
        entries = 3001
        x = torch.randn((entries,) + shape, generator=g, dtype=torch.float64)
        index = torch.randint(0, max(rows - 1, 1), (entries,), generator=g)
        if rows > 2:
            x[7] = float("nan")
        expected = torch.zeros((rows,) + shape, dtype=torch.float64).index_add_(0, index, x)
        for index_dtype in (torch.int64, torch.int32):
            got = few.few_rows_sum(x.to(DEVICE, dtype), index.to(DEVICE, index_dtype), rows)
            assert got.shape == (rows,) + shape and got.dtype == dtype
            tol = {torch.float64: 1e-12, torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]
            scale = x.to(dtype).double().abs().nan_to_num().sum(0).max()
            torch.testing.assert_close(got.double().cpu(), expected, rtol=0, atol=tol * float(scale), equal_nan=True)
        assert names == ["_few_rows_sum"] * 2
    finally:
        few.launch = restore


def test_the_few_rows_kernel_reads_rows_a_stride_apart():
    """The first 3 of 5 columns: packed rows 5 apart, read in place by the table's row
    stride (a width-strided read mixes the rows' columns up)."""
    from gnnfuse.backend.triton import few_rows_sum as few
    g = torch.Generator().manual_seed(0)
    x = torch.randn(700, 5, generator=g, dtype=torch.float64)[:, :3]
    index = torch.randint(0, 4, (700,), generator=g)
    got = few.few_rows_sum(x.to(DEVICE), index.to(DEVICE), 4)
    torch.testing.assert_close(got.cpu(), torch.zeros(4, 3, dtype=torch.float64).index_add_(0, index, x),
                               rtol=0, atol=1e-12)


def test_the_few_rows_kernel_leaves_wide_tables_to_the_slotted_sum(monkeypatch):
    from gnnfuse.backend.triton import few_rows_sum as few
    calls = []
    monkeypatch.setattr(few, "launch", lambda *a: calls.append("kernel"))
    x = torch.randn(500, 40, dtype=torch.float64, device=DEVICE)        # 4 rows x 64 lanes: past MAX_TILE
    index = torch.randint(0, 3, (500,), device=DEVICE)
    expected = torch.zeros(3, 40, dtype=torch.float64, device=DEVICE).index_add_(0, index, x)
    torch.testing.assert_close(few.few_rows_sum(x, index, 3), expected, rtol=1e-12, atol=1e-12)
    ints = torch.ones(500, 2, dtype=torch.int64, device=DEVICE)
    assert torch.equal(few.few_rows_sum(ints, index, 3), torch.zeros(3, 2, dtype=torch.int64,
                                                                      device=DEVICE).index_add_(0, index, ints))
    assert calls == []


def test_a_contended_reduce_runs_the_few_rows_kernel_on_the_triton_backend(monkeypatch):
    """The `reduce` op's dispatch on the Triton backend: with the threshold lowered, the
    relation scalar's gradient (a sum by edge type over every edge) launches the kernel,
    and outputs and gradients equal the reference backend's."""
    from gnnfuse.backend.triton import few_rows_sum as few
    monkeypatch.setattr(movement, "CONTENDED_ENTRIES_PER_ROW", 2)
    names = []
    launch = few.launch
    monkeypatch.setattr(few, "launch", lambda kernel, *a: names.append(kernel.__name__) or launch(kernel, *a))
    on_host, fn, h0, p0 = _relation_scalar(2)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        device = DEVICE if backend == "triton" else "cpu"
        graph = on_host.to(device)
        h, p = h0.detach().to(device).requires_grad_(), p0.detach().to(device).requires_grad_()
        out = fn(graph, {"h": h}, etype_feature={"p": p})
        out.square().sum().backward()
        results.append([t.detach().cpu() for t in (out, h.grad, p.grad)])
    assert "_few_rows_sum" in names
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_explain_names_the_few_rows_kernel_for_a_contended_sum(monkeypatch):
    import gnnfuse
    graph, fn, h, p = _relation_scalar(3)

    def step():
        fn(graph, {"h": h}, etype_feature={"p": p}).sum().backward()
    assert "few_rows_sum.py" not in str(gnnfuse.explain(step))       # 40 edges into 3 rows: not contended
    monkeypatch.setattr(movement, "CONTENDED_ENTRIES_PER_ROW", 2)
    assert "few_rows_sum.py" in str(gnnfuse.explain(step))


def test_a_few_rows_kernel_that_fails_to_build_warns_once_and_takes_the_reference_form(monkeypatch):
    from gnnfuse.backend.triton import few_rows_sum as few
    monkeypatch.setattr(few, "_BUILT", {})
    calls = []

    def failing(*args):
        calls.append(1)
        raise RuntimeError("PTX assembly failed\\nmore")
    monkeypatch.setattr(few, "launch", failing)
    x = torch.randn(300, 2, dtype=torch.float64, device=DEVICE)
    index = torch.randint(0, 3, (300,), device=DEVICE)
    expected = torch.zeros(3, 2, dtype=torch.float64, device=DEVICE).index_add_(0, index, x)
    with pytest.warns(RuntimeWarning, match="few-rows sum kernel failed.*PTX assembly failed"):
        got = few.few_rows_sum(x, index, 3)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(few.few_rows_sum(x, index, 3), expected, rtol=1e-12, atol=1e-12)
    assert calls == [1]


def test_ids_past_2_to_the_31_are_numbered_in_64_bits():
    """`launch.wide_ids`: a launch whose last program's last id (cdiv(count, block) *
    block - 1) passes 2^31 - 1 numbers its items in int64, and only such a launch."""
    from gnnfuse.backend.triton.launch import wide_ids
    assert not wide_ids(2**31, 64) and not wide_ids(2**31 - 63, 64) and not wide_ids(0, 64)
    assert wide_ids(2**31 + 1, 64) and wide_ids(2**31 + 1, 32) and wide_ids(3 * 2**31, 64)


def test_a_gather_of_2_to_the_31_edges_numbers_them_in_64_bits(monkeypatch):
    """``tl.program_id(0) * BLOCK_E`` was an int32 product: past 2^31 edges (a graph of
    2^31 + 1 edges gathering one row per edge) the last programs' edge ids wrapped
    negative, passed the ``< E`` mask and read before the index array. Compiled for an
    sm_90 GPU (no GPU needed), the variant such a launch takes (``WIDE``, `wide_ids`)
    multiplies no program id in 32 bits where that wraps, and it gathers what
    ``index_select`` does (run here on a small index)."""
    from offset_widths import narrow_program_products, triton_ir
    from gnnfuse.backend.triton.gather_rows import BLOCK_E, _gather_rows
    signature = {"table_ptr": "*fp32", "index_ptr": "*i64", "out_ptr": "*fp32", "E": "i64", "F": "i32",
                 "stride_t": "i32", "BLOCK_E": "constexpr", "BLOCK_F": "constexpr", "WIDE": "constexpr"}
    programs = -(-(2**31 + 1) // BLOCK_E)
    wide = triton_ir(_gather_rows, signature, {"BLOCK_E": BLOCK_E, "BLOCK_F": 16, "WIDE": True})
    assert narrow_program_products(wide, programs) == []
    narrow = triton_ir(_gather_rows, signature, {"BLOCK_E": BLOCK_E, "BLOCK_F": 16, "WIDE": False})
    assert narrow_program_products(narrow, programs)      # what smaller launches keep
    monkeypatch.setattr(gather_module, "wide_ids", lambda count, block: True)
    table = torch.randn(11, 5, device=DEVICE)
    index = torch.randint(0, 11, (150,), device=DEVICE)
    assert torch.equal(gather_module.gather_rows(table, index), table.index_select(0, index))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="2^31 + 3 edges, 17 GB: GPU only")
def test_a_gather_of_2_to_the_31_edges_gets_every_row_on_a_gpu():
    """`test_a_gather_of_2_to_the_31_edges_numbers_them_in_64_bits` run: 2^31 + 3 int32
    edge ids (8.6 GB) gathering rows of one float32 (8.6 GB out); the last three edges
    read rows 1-3, every other row 0."""
    edges = 2**31 + 3
    table = torch.tensor([[10.0], [11.0], [12.0], [13.0]], device="cuda")
    index = torch.zeros(edges, dtype=torch.int32, device="cuda")
    index[-3:] = torch.tensor([1, 2, 3], dtype=torch.int32, device="cuda")
    got = gather_module.gather_rows(table, index)
    del index
    assert got[-3:, 0].tolist() == [11.0, 12.0, 13.0]
    assert bool((got[:-3] == 10.0).all())
    del got
    torch.cuda.empty_cache()
