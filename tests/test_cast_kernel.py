"""Casts inside fused kernels: ``x.to(dtype)`` between float32, float16 and bfloat16 (and
from integers) is per-edge work of the unit that reads it on the cpu and triton
backends, rounded as torch rounds. The cast had no kernel expression: under
``torch.autocast`` every cast the tracer writes (frontend/autocast.py), and every
gradient autodiff casts back to its input's dtype, split its unit and ran as a torch op
over an edge-sized tensor.

Triton's CPU interpreter has no bfloat16 (a program holding one runs on the reference
backend: runtime/interpreter.py), so here the Triton kernels are tested with float16 and
the CPU ones (whose float16/bfloat16 are float32s rounded by `scalar.cast`) with both.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import gnnfuse
from gnnfuse.ir import Program, Residency
from gnnfuse.passes.fusion import partition
from gnnfuse.runtime.compiled import CompiledProgram
from gnnfuse.runtime.explain import explain

SRC, DST = [1, 0, 2, 0, 1, 3, 2, 3], [0, 1, 1, 2, 2, 2, 3, 0]
NARROW = {"triton": [torch.float16], "cpu": [torch.float16, torch.bfloat16]}


def _round_trip_program(narrow: torch.dtype, width: int) -> Program:
    """``(x_u * w_e).to(narrow).float() * 3`` per edge, written per edge (an edge unit)."""
    p = Program()
    x = p.input("x", Residency.NODE, (width,), torch.float32)
    w = p.input("w", Residency.EDGE, (width,), torch.float32)
    product = p.add("mul", p.add("broadcast", x, by="src"), w)
    back = p.add("cast", p.add("cast", product, dtype=narrow), dtype=torch.float32)
    p.output("y", p.add("mul", back, p.add("const", value=3.0, dtype=torch.float32)))
    return p


def _awkward_float32s(count: int) -> torch.Tensor:
    """Float32s where rounding to float16/bfloat16 is delicate: ties (a low half of 0x8000
    or a 13-bit remainder of 0x1000), subnormals of both, the overflow bounds, random bit
    patterns, infinities, NaN and signed zeros."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-2 ** 31, 2 ** 31, (count,), generator=gen, dtype=torch.int64).to(torch.int32)
    ties = (bits & ~0xFFFF) | 0x8000
    half_ties = (bits & ~0x1FFF) | 0x1000
    special = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 3.389e38, 3.3895314e38, 3.4e38,
                            5.96e-8, 2.98e-8, 2.99e-8, 6.1e-5, 1e-39, -1e-40, 9.2e-41, 1.4e-45,
                            float("inf"), float("-inf"), float("nan"), 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -9])
    return torch.cat([bits.view(torch.float32), ties.view(torch.float32), half_ties.view(torch.float32), special])


@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
def test_a_round_trip_through_a_narrow_dtype_rounds_as_torch_inside_the_kernel(backend, device):
    values = _awkward_float32s(3000)
    width = 8
    rows = values.numel() // width
    values = values[: rows * width].view(rows, width)
    graph = gnnfuse.Graph(torch.arange(rows), (torch.arange(rows) + 1) % rows, rows).to(device)
    for narrow in NARROW[backend]:
        program = _round_trip_program(narrow, width)
        compiled = CompiledProgram(program)
        plan = partition(compiled.program)
        assert [v.op for v in plan if not hasattr(v, "body") and v.op != "const"] == [], plan
        x = values.to(device)
        w = torch.ones(rows, width, device=device)
        got = compiled(graph, {"x": x, "w": w})["y"]
        want = (x[graph.src] * w).to(narrow).float() * 3
        assert torch.equal(got.isnan(), want.isnan())
        signs = got.signbit() == want.signbit()
        if got.is_cuda:     # GPU kernels compile with fast-math nsz: a zero's sign is not kept (H200: -0.0 read 0.0)
            signs |= want == 0
        same = got.isnan() | ((got == want) & signs)
        assert same.all(), (values.flatten()[~same.flatten().cpu()][:5], got[~same][:5], want[~same][:5])


def _gat_like(W: torch.Tensor, al: torch.Tensor, ar: torch.Tensor):
    """A GAT-like message/reduce pair whose messages go through products (cast to the
    autocast dtype) of per-edge values."""
    def message(edges):
        z = (edges.src["h"] * edges.data["w"]) @ W
        e = F.leaky_relu((z * al).sum(-1, keepdim=True) + (edges.dst["h"] @ W * ar).sum(-1, keepdim=True), 0.2)
        return {"m": z, "e": e}

    def reduce(nodes):
        return {"o": torch.sum(torch.softmax(nodes.mailbox["e"], dim=1) * nodes.mailbox["m"], dim=1)}
    return message, reduce


def _counts(plan) -> tuple[int, int]:
    """(fused units, torch casts) of a plan."""
    return sum(s.fused for s in plan.steps), sum(1 for s in plan.steps if not s.fused and s.item.op == "cast")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
def test_autocast_casts_of_edge_values_join_their_units(dtype, backend, device, monkeypatch):
    """Under CPU autocast the per-edge product ``h_u * w_e`` is cast to the autocast dtype
    for its matmul, and the backward casts the gradients of per-edge values back: those
    casts now sit in units. Before: forward 5 units and 3 torch casts, backward 9 units
    and 6 casts; now forward 5 and 2, backward 7 and 3: the edge-rowed casts are inside
    units (the backward recomputes the forward's cast product in an edge unit rather than
    keeping it), and the casts of a weight or of a vertex table feeding a matmul stay
    torch ops. Values and gradients agree with the
    reference backend within float16/bfloat16 rounding (a kernel rounds where it stores)."""
    gen = torch.Generator().manual_seed(0)
    tables = {"h": torch.randn(4, 8, generator=gen), "w": torch.rand(len(SRC), 1, generator=gen)}
    params = {"W": torch.randn(8, 6, generator=gen) / 3, "al": torch.randn(6, generator=gen),
              "ar": torch.randn(6, generator=gen)}
    leaves = {k: t.to(device).requires_grad_() for k, t in {**tables, **params}.items()}
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    message, reduce = _gat_like(leaves["W"], leaves["al"], leaves["ar"])

    def run():
        with torch.autocast(torch.device(device).type, dtype=dtype):
            return gnnfuse.message_passing(graph, message, reduce, ndata={"h": leaves["h"]},
                                           edata={"w": leaves["w"]})["o"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the interpreter's and the cpu backend's notes on low precision
        [program] = explain(run).programs
        assert (_counts(program.forward), _counts(program.backward)) == ((5, 2), (7, 3))
        got = run()
        grads = torch.autograd.grad(got.float().sum(), list(leaves.values()))
        monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
        want = run()
        wants = torch.autograd.grad(want.float().sum(), list(leaves.values()))
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
    for g, w in zip(grads, wants):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
def test_integer_edge_data_cast_in_the_kernel_rounds_as_torch(backend, device):
    """``idx.to(float)`` of integer edge data is the unit's load (int64 to float32, then to
    the narrow dtype, as torch converts): integers past 2**24 round to nearest even, and
    float16 overflows to inf. With a float64 table beside it the float32 cast would be
    computed in a float64 kernel: that unit runs as torch ops (`unit_ops.mixed_floats`)."""
    ints = torch.tensor([0, 1, -3, 2 ** 24 + 1, 2 ** 25 + 3, -(2 ** 31), 2 ** 40 + 12345, 65519, 65520, 70000])
    n = ints.numel()
    graph = gnnfuse.Graph(torch.arange(n), (torch.arange(n) + 1) % n, n).to(device)
    for narrow, table in ((torch.float32, torch.float32), (torch.float16, torch.float32),
                          (torch.float32, torch.float64)):
        p = Program()
        x = p.input("x", Residency.NODE, (1,), table)
        k = p.input("k", Residency.EDGE, (1,), torch.int64)
        cast = p.add("cast", p.add("cast", k, dtype=narrow), dtype=torch.float32) if narrow != torch.float32 \
            else p.add("cast", k, dtype=torch.float32)
        p.output("y", p.add("mul", p.add("broadcast", x, by="src"), cast))
        compiled = CompiledProgram(p)
        assert [v.op for v in partition(compiled.program) if not hasattr(v, "body")] == []   # casts in the unit
        xs = torch.ones(n, 1, dtype=table, device=device)
        got = compiled(graph, {"x": xs, "k": ints.view(-1, 1).to(device)})["y"]
        want = xs[graph.src] * ints.view(-1, 1).to(device).to(narrow).float()
        assert got.dtype == want.dtype and torch.equal(got, want), (narrow, table, got.flatten(), want.flatten())


def _counting_by_ops(monkeypatch) -> list:
    """The units the CPU backend runs as torch ops from now on (GNNFUSE_BACKEND=cpu)."""
    from gnnfuse.backend.cpu import executor as cpu_executor
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    by_ops, real = [], cpu_executor.run_by_ops
    monkeypatch.setattr(cpu_executor, "run_by_ops", lambda *a: (by_ops.append(a[0]), real(*a))[1])
    return by_ops


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan())
    kept = ~want.isnan()
    assert torch.equal(got[kept].view(torch.int16), want[kept].view(torch.int16))   # signed zeros too


@pytest.mark.parametrize("narrow", [torch.float16, torch.bfloat16])
def test_cpu_kernels_read_float16_and_bfloat16_leaves(narrow, monkeypatch):
    """The CPU backend's kernels read float16/bfloat16 tables (their bits, widened to the
    float32 accumulator exactly): a unit with narrow leaves and a float32 result -- most
    of an autocast program's, whose messages are products cast to the autocast dtype --
    ran as torch ops (Numba has no float16 or bfloat16), and with it every cast that
    unit held. Subnormals, infinities, NaN and signed zeros widen as torch widens them."""
    by_ops = _counting_by_ops(monkeypatch)
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(narrow).view(-1, 8)            # every bit pattern of the format
    n = x.shape[0]
    graph = gnnfuse.Graph(torch.arange(n), torch.roll(torch.arange(n), 1), n)
    w = torch.linspace(-2, 2, n).view(-1, 1)
    got = gnnfuse.ops.gspmm(graph, lambda xs, e: xs * e, "sum", src=x, edge=w)
    want = torch.zeros(n, 8).index_add(0, graph.dst, x[graph.src].float() * w)
    assert by_ops == [] and got.dtype == torch.float32
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("narrow", [torch.float16, torch.bfloat16])
def test_cpu_kernels_write_float16_and_bfloat16_results(narrow, monkeypatch):
    """The CPU backend's kernels write float16/bfloat16 results, rounded to nearest even
    and stored as their bits: an edge unit ending in an autocast cast ran as torch ops."""
    by_ops = _counting_by_ops(monkeypatch)
    values = _awkward_float32s(2000)
    rows = values.numel() // 8
    x = values[: rows * 8].view(rows, 8)
    graph = gnnfuse.Graph(torch.arange(rows), torch.roll(torch.arange(rows), 1), rows)
    p = Program()
    xs = p.input("x", Residency.NODE, (8,), torch.float32)
    w = p.input("w", Residency.EDGE, (8,), torch.float32)
    p.output("y", p.add("cast", p.add("mul", p.add("broadcast", xs, by="src"), w), dtype=narrow))
    ones = torch.ones(rows, 8)
    _same_bits(CompiledProgram(p)(graph, {"x": x, "w": ones})["y"], (x[graph.src] * ones).to(narrow))
    assert by_ops == []


def test_cpu_aggregate_kernels_write_bfloat16_rows(monkeypatch):
    """Sums, maxima and means of bfloat16 messages (register-row and loop kernels) ran as
    torch ops. One in-edge per vertex makes each row one product, exact in float32 and
    rounded once as torch rounds it."""
    by_ops = _counting_by_ops(monkeypatch)
    values = _awkward_float32s(500)
    rows = values.numel() // 8
    h = values[: rows * 8].view(rows, 8).to(torch.bfloat16)
    graph = gnnfuse.Graph(torch.arange(rows), torch.roll(torch.arange(rows), 1), rows)
    e = torch.linspace(-3, 3, rows, dtype=torch.bfloat16).view(-1, 1)
    product = torch.zeros(rows, 8, dtype=torch.bfloat16).index_copy(0, graph.dst, h[graph.src] * e)
    # a sum starts from +0.0, so -0.0 + 0.0 is +0.0 -- but a register-row kernel may drop
    # that addition (its fast-math ``nsz``, codegen.REGISTER_ROW_FASTMATH): + 0.0 on both
    for reduce, tile, zero in (("sum", None, 0.0), ("max", 4, None), ("mean", None, 0.0)):   # tile 4: loop kernel
        got = gnnfuse.ops.gspmm(graph, lambda a, b: a * b, reduce, src=h, edge=e,
                                schedule=gnnfuse.ops.Schedule(feature_tile=tile))
        _same_bits(got if zero is None else got + zero, product if zero is None else product + zero)
    assert by_ops == []
