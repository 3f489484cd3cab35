"""``row_dot``: per-row dot products over feature dims as one op (passes/row_dot.py) and
one Triton kernel (backend/triton/row_dot.py).

Checked: the kernel against torch's ``(x * y).sum(dims, keepdim=True)`` under Triton's
interpreter (or on the GPU) for the widths and dtypes it takes, and its fallbacks; the
rewrite taking exactly the per-row ``sum_to(mul(x, y))`` it may; GAT's backward program
computing ``<grad_out, out>`` with it, the kernel launched, and every gradient matching
the reference backend; and the op's own derivative (a backward of a backward) in float64."""
from __future__ import annotations

import pytest
import torch
from oracle_check import device_for

from gnnfuse.backend.triton import row_dot as rd
from gnnfuse.graph import Graph
from gnnfuse.ir import Program, Residency
from gnnfuse.ir.ops.dense import row_dot_reference
from gnnfuse.nn import GATConv
from gnnfuse.passes.dce import eliminate_dead_code
from gnnfuse.passes.row_dot import fuse_row_dots

DEVICE = device_for("triton")


@pytest.mark.parametrize("shape, dims", [((37, 8, 8), (-1,)), ((37, 1, 40), (-1,)), ((300, 3, 5), (-2, -1)),
                                         ((5, 2, 300), (-1,))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_matches_torch(shape, dims, dtype, monkeypatch):
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(shape, dtype=dtype, generator=g).to(DEVICE) for _ in range(2))
    monkeypatch.setattr(rd, "row_dot_reference", _refuse)
    got = rd.row_dot(x, y, dims)
    expected = (x * y).sum(dims, keepdim=True)
    assert got.shape == expected.shape and got.dtype == dtype
    torch.testing.assert_close(got, expected, rtol=1e-12 if dtype == torch.float64 else 1e-5, atol=1e-6)


def test_kernel_reads_rows_of_a_padded_table(monkeypatch):
    """A GPU layer hands gradients as views of padded tables ([N, 3, 5] rows 16 apart):
    the kernel reads them in place, each operand at its own row stride."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(33, 16, dtype=torch.float64, generator=g).to(DEVICE)[:, :15].view(33, 3, 5)
    y = torch.randn(33, 15, dtype=torch.float64, generator=g).to(DEVICE).view(33, 3, 5)
    monkeypatch.setattr(rd, "row_dot_reference", _refuse)
    torch.testing.assert_close(rd.row_dot(x, y, (-1,)), (x * y).sum(-1, keepdim=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_broadcast_row_is_read_as_broadcast(rows):
    """A one-vertex graph's backward hands row_dot a stride-0 ``expand`` of its one
    gradient row; the one-row case once skipped the packed-row check and the kernel read
    past the row (Triton gradients 3.5 against 6.0 in the fuzzed case)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 3, dtype=torch.float64, generator=g).to(DEVICE)
    y = torch.randn(rows, 1, dtype=torch.float64, generator=g).to(DEVICE).expand(rows, 3)
    torch.testing.assert_close(rd.row_dot(x, y, (-1,)), (x * y).sum(-1, keepdim=True), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rd.row_dot(y, x, (-1,)), (x * y).sum(-1, keepdim=True), rtol=1e-12, atol=1e-12)


def test_kernel_half_accumulates_in_float32():
    x = torch.full((4, 2, 64), 0.1, dtype=torch.float16).to(DEVICE)
    got = rd.row_dot(x, x, (-1,))
    torch.testing.assert_close(got.float(), (x.float() * x.float()).sum(-1, keepdim=True), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("case", ["leading dim", "every dim", "transposed", "too wide", "no rows"])
def test_kernel_falls_back_to_torch(case):
    x = torch.randn(6, 4, 3, dtype=torch.float64).to(DEVICE)
    dims = (-1,)
    if case == "leading dim":
        dims = (-2,)
    elif case == "every dim":      # the vertex dim summed too: one total, not one per row
        dims = (0, 1, 2)
    elif case == "transposed":     # a row's elements not packed
        x = x.transpose(1, 2)
    elif case == "too wide":
        x = torch.randn(3, rd.MAX_BLOCK_K + 1, dtype=torch.float64).to(DEVICE)
    else:
        x = x[:0]
    torch.testing.assert_close(rd.row_dot(x, 2 * x, dims), (x * 2 * x).sum(dims, keepdim=True))


def _refuse(*args):
    raise AssertionError("row_dot fell back to torch")


def _dot_program(x_shape=(8, 8), y_shape=(8, 8), target=(8, 1), residency=Residency.NODE, extra_use=False):
    p = Program()
    x = p.input("x", residency, x_shape, torch.float32)
    y = p.input("y", residency, y_shape, torch.float32)
    product = p.add("mul", x, y)
    p.outputs["out"] = p.add("sum_to", product, shape=target, residency=residency)
    if extra_use:
        p.outputs["product"] = product
    return p


def test_rewrite_takes_a_per_row_dot():
    p = eliminate_dead_code(fuse_row_dots(_dot_program()))    # the pipeline drops the product after
    assert p.op_count("row_dot") == 1 and p.op_count("mul") == 0 and p.op_count("sum_to") == 0
    assert p.outputs["out"].shape == (8, 1) and p.outputs["out"].attrs["dims"] == (-1,)


@pytest.mark.parametrize("why", ["product used twice", "broadcast operand", "sum over rows", "edge rows",
                                 "dim kept wider"])
def test_rewrite_leaves_other_sums(why):
    kwargs = {"product used twice": dict(extra_use=True),
              "broadcast operand": dict(y_shape=(8, 1)),
              "sum over rows": dict(target=(8, 1), residency=Residency.SHARED),
              "edge rows": dict(residency=Residency.EDGE),
              "dim kept wider": dict(target=(1, 8))}[why]
    if why == "sum over rows":      # a parameter-shaped gradient: rows are summed too
        p = Program()
        x = p.input("x", Residency.NODE, (8, 8), torch.float32)
        y = p.input("y", Residency.NODE, (8, 8), torch.float32)
        p.outputs["out"] = p.add("sum_to", p.add("mul", x, y), shape=(8, 1), residency=Residency.SHARED)
    else:
        p = _dot_program(**kwargs)
    before = p.pretty()
    if why == "dim kept wider":
        assert fuse_row_dots(p).op_count("row_dot") == 1      # (8, 8) -> (1, 8) sums dim -2: still a row dot
        return
    assert fuse_row_dots(p).pretty() == before


def _gat_step(backend: str, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    torch.manual_seed(0)
    n = 40
    edge_index = torch.randint(0, n, (2, 200))
    device = device_for(backend)
    graph = Graph.from_edge_index(edge_index.to(device), num_nodes=n)
    x = torch.randn(n, 12, dtype=torch.float64).to(device).requires_grad_()    # drawn on the host: same on every run
    conv = GATConv(12, 5, heads=3).double().to(device)
    out = conv(x, graph)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=device).view_as(out)).sum().backward()
    return out.detach().cpu(), x.grad.cpu(), {k: p.grad.cpu() for k, p in conv.named_parameters()}


def test_gat_backward_runs_the_kernel(monkeypatch):
    """GAT's ``<grad_out, out>`` per vertex and head is a row_dot, launched as the kernel;
    the outputs and every gradient match the reference backend's."""
    launched = []
    real_launch = rd.launch
    monkeypatch.setattr(rd, "launch", lambda kernel, *a, **k: (launched.append(kernel), real_launch(kernel, *a, **k)))
    ours = _gat_step("triton", monkeypatch)
    assert launched, "the GAT backward launched no row_dot kernel"
    reference = _gat_step("reference", monkeypatch)
    torch.testing.assert_close(ours, reference, rtol=1e-9, atol=1e-12)


def test_derivative_of_row_dot():
    """The op's derivative rule, through a program whose forward is a row_dot, against
    torch's in float64 (gradcheck)."""
    from gnnfuse.runtime.compiled import CompiledProgram
    from gnnfuse.backend.reference import GraphContext
    p = fuse_row_dots(_dot_program(x_shape=(3, 4), y_shape=(3, 4), target=(3, 1)))
    compiled = CompiledProgram(p)
    graph = Graph.from_edge_index(torch.tensor([[0, 1], [1, 2]]), num_nodes=3)
    assert GraphContext(graph).row_dot is row_dot_reference

    def fn(x, y):
        return compiled(graph, {"x": x, "y": y})["out"]
    x, y = (torch.randn(3, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(fn, (x, y))
    torch.testing.assert_close(fn(x, y), (x * y).sum(-1, keepdim=True))


def test_explain_shows_the_row_dot_and_its_gpu_kernel(monkeypatch):
    """`gnnfuse.explain` lists GAT's backward <grad_out, out> as one row_dot op, run on
    CUDA as a kernel of its own, with no product of the two tables before it."""
    import gnnfuse
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    torch.manual_seed(0)
    graph = Graph.from_edge_index(torch.randint(0, 30, (2, 120)).to(DEVICE), num_nodes=30)
    conv = GATConv(6, 4, heads=2).to(DEVICE)
    text = str(gnnfuse.explain(conv, torch.randn(30, 6).to(DEVICE), graph))
    backward = text[text.index("--- backward program"):]
    assert "= row_dot(%grad:out" in backward and "on CUDA: one Triton kernel" in backward
    program = backward.split("--- backward plan")[0]
    assert not [line for line in program.splitlines() if "sum_to(" in line and "residency=NODE" in line]
