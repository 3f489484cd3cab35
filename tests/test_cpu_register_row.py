"""The CPU backend's register-row aggregate kernels (codegen.generate_register_row):
which launches get them (`schedule.register_row`), and their values against the torch
reference executor -- float64 to 1e-12 and float32 to its rounding, forward and the
backward's reverse-CSR units -- on a graph with a hub row, rows with no in-edges, an
isolated vertex, a multi-edge and self loops, for every reduction, a per-row scale
(GCN's norm), attention weights and multi-head rows. The widths straddle the cap
(`REGISTER_ROW_MAX` runs the register-row kernel, one more column the loop kernel).

Graphs are tiny and kernels are compiled serially and cached on disk (see
test_cpu_backend.py)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

import gnnfuse  # noqa: E402
from gnnfuse.backend.cpu import executor as cpu_executor  # noqa: E402
from gnnfuse.backend.cpu import schedule  # noqa: E402
from gnnfuse.passes.fusion import AggregateUnit  # noqa: E402
from test_cpu_backend import assert_same  # noqa: E402  (the CPU backend's oracle comparison)

NUM_NODES = 9


def hub_graph() -> gnnfuse.Graph:
    """Vertex 0 is a hub (in-edges from every other vertex, a self loop and a doubled
    edge from 1); 1, 2 and 3 have a few in-edges; 4, 5 and 6 have none; 7 has only
    out-edges; 8 is isolated."""
    src = [v for v in range(8)] + [1, 2, 3, 7, 7, 2, 0]
    dst = [0] * 8 + [0, 1, 1, 2, 3, 3, 3]
    return gnnfuse.Graph(torch.tensor(src), torch.tensor(dst), NUM_NODES)


@pytest.fixture
def kinds(monkeypatch):
    """(row shape, register_row, parallel) of every aggregate kernel the CPU backend builds."""
    built = []
    real = cpu_executor._kernel_for

    def recording(unit, acc, parallel, partitioned=False, register_row=False):
        if isinstance(unit, AggregateUnit):
            built.append((unit.reduce.shape, register_row, parallel))
        return real(unit, acc, parallel, partitioned, register_row)
    monkeypatch.setattr(cpu_executor, "_kernel_for", recording)
    return built


def reduce_model(reducer: str):
    graph = hub_graph()
    pick = {"sum": torch.sum, "mean": torch.mean, "max": lambda m, dim: torch.max(m, dim).values,
            "min": lambda m, dim: torch.min(m, dim).values}[reducer]
    return lambda h: gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"] * 2.0 - e.dst["h"]},
                                             lambda n: {"o": pick(n.mailbox["m"], dim=1)}, ndata={"h": h})["o"]


def test_narrow_kernel_is_written_out_column_by_column(monkeypatch, fresh_compile):
    """The source of a 16-wide neighbour sum has no feature loop and one accumulator per
    column. Before: the loop kernel, its 16 columns a run-time loop that never reached
    LLVM's vectorized body (0.8x torch's CSR matmul on pubmed)."""
    sources = []
    real = cpu_executor.load_kernel
    monkeypatch.setattr(cpu_executor, "load_kernel", lambda source, name: sources.append(source) or real(source, name))
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    h = torch.randn(NUM_NODES, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reduce_model("sum")(h)
    aggregate = [s for s in sources if "def cpu_aggregate" in s]
    assert aggregate and all("for fi in range" not in s and "a15 = " in s for s in aggregate)


def test_register_row_rule():
    """Narrow rows taken whole get the register-row kernel; a forced narrower feature
    tile or source ranges (which only the loop kernel implements) and rows wider than
    the cap keep the loop kernel."""
    cap = schedule.REGISTER_ROW_MAX
    assert schedule.register_row(1, 1, False) and schedule.register_row(16, 16, False)
    assert schedule.register_row(cap, cap, False)
    assert not schedule.register_row(cap + 1, cap + 1, False)
    assert not schedule.register_row(16, 8, False)
    assert not schedule.register_row(16, 16, True)


@pytest.mark.parametrize("width", [1, 16, schedule.REGISTER_ROW_MAX, schedule.REGISTER_ROW_MAX + 1])
def test_neighbour_sum_at_widths_around_the_cap(width, kinds, monkeypatch):
    """Forward only: the wide kernels are the slowest to compile, and the backward's
    units are covered at narrower widths below."""
    h = torch.randn(NUM_NODES, width, dtype=torch.float64, generator=torch.Generator().manual_seed(width))
    model = reduce_model("sum")
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    with torch.no_grad():
        out = model(h)
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    torch.testing.assert_close(out, model(h), rtol=1e-12, atol=1e-12)
    expected = width <= schedule.REGISTER_ROW_MAX
    assert kinds and all(flag == expected for _, flag, _ in kinds), kinds


@pytest.mark.parametrize("reducer", ["mean", "max", "min"])
def test_reductions_with_empty_rows_and_nan(reducer, kinds, monkeypatch):
    """Rows with no in-edges hold 0 (mean: no division by zero); NaN wins in max/min."""
    h = torch.randn(NUM_NODES, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if reducer != "mean":
        h[2, 3] = float("nan")    # an in-neighbour of the hub and of vertex 1
    assert_same(reduce_model(reducer), [h], monkeypatch, rtol=1e-12, atol=1e-12)
    assert kinds and all(flag for _, flag, _ in kinds)


def test_gcn_norm_and_attention_float64_and_float32(kinds, monkeypatch):
    """A per-row scale (GCN's ``sum(norm_u h_u) * norm_v``) in float64 and float32 (to
    float32 rounding), and GAT's softmax-weighted sum in float64."""
    graph = hub_graph()

    @gnnfuse.vertex
    def gcn(v):
        return sum([u.h * u.norm for u in v.innbs]) * v.norm

    @gnnfuse.vertex
    def gat(v):
        e = [torch.exp(torch.nn.functional.leaky_relu(u.al + v.ar, 0.2)) for u in v.innbs]
        total = sum(e)
        return sum([e[i] / total * u.h for i, u in enumerate(v.innbs)])
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(NUM_NODES, 16, dtype=torch.float64, generator=gen)
    norm = graph.in_degrees().double().clamp_min(1).pow(-0.5)
    al, ar = torch.randn(NUM_NODES, dtype=torch.float64, generator=gen), torch.randn(NUM_NODES, dtype=torch.float64,
                                                                                     generator=gen)
    for dtype, tol in ((torch.float64, dict(rtol=1e-12, atol=1e-12)), (torch.float32, dict(rtol=1e-5, atol=1e-6))):
        assert_same(lambda h, n: gcn(graph, {"h": h, "norm": n}), [h.to(dtype), norm.to(dtype)],
                                 monkeypatch, **tol)
    assert_same(lambda h, a, b: gat(graph, {"h": h, "al": a, "ar": b}), [h, al, ar], monkeypatch,
                             rtol=1e-12, atol=1e-12)
    assert any(shape == (16,) and flag for shape, flag, _ in kinds)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [1, 16])
def test_a_row_of_negative_zero_products_sums_to_positive_zero(width, dtype, kinds, monkeypatch):
    """Register-row kernels of products compile with ``nsz`` (`REGISTER_ROW_FASTMATH`),
    which lets LLVM fold a row's first ``0.0 + x`` to ``x``: a row whose products are
    all -0.0 would then sum to -0.0, where torch's sum (added into zeros) is +0.0 and a
    later ``1 / x`` or ``atan2`` would see the sign. Not seen with Numba's LLVM (the
    loop is not peeled); this keeps it so, GCN's per-row scale included, which turns
    torch's +0.0 into -0.0 at a negative norm (and a folded -0.0 into +0.0)."""
    graph = hub_graph()

    @gnnfuse.vertex
    def scaled(v):
        return sum([u.h * u.norm for u in v.innbs]) * v.norm
    gen = torch.Generator().manual_seed(5)
    h = -torch.zeros(NUM_NODES, width, dtype=dtype)
    h[3] = torch.randn(width, generator=gen).to(dtype)    # vertex 3's in-edges: 2 (zeros) and 3's own
    norm = torch.where(torch.arange(NUM_NODES) % 2 == 0, 1.5, -0.5).to(dtype).view(-1, 1)
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    with torch.no_grad():
        out = scaled(graph, {"h": h, "norm": norm})
    src, dst = graph.src.long(), graph.dst.long()
    want = torch.zeros_like(h).index_add(0, dst, h[src] * norm[src]) * norm
    torch.testing.assert_close(out, want, rtol=0.0, atol=0.0)
    assert torch.equal(out.signbit(), want.signbit()), (out, want)
    assert kinds and all(flag for _, flag, _ in kinds)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_factor_the_same_on_every_edge_is_not_regrouped(dtype, kinds, monkeypatch):
    """With ``reassoc``, LLVM multiplied two constants first (``h * c * c`` as ``h *
    inf``: NaN at h = 0 and inf at h = 1/c, where eager code gives 0 and c) and took a
    common factor out of a row's sum (``sum(x * -inf)`` as ``sum(x) * -inf``: +-inf where
    eager code adds inf and -inf to NaN). Such units compile without fast-math; GCN's
    per-edge products (`test_a_row_of_negative_zero_products_sums_to_positive_zero`)
    keep it."""
    big = 1e30 if dtype == torch.float32 else 1e200
    graph = hub_graph()
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(NUM_NODES, 4, generator=gen).to(dtype)
    h[1], h[2] = 1 / big, 0.0
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    src, dst = graph.src.long(), graph.dst.long()
    for message in (lambda e: {"m": e.src["h"] * big * big}, lambda e: {"m": e.src["h"] * float("-inf")},
                    lambda e: {"m": e.src["h"] * e.dst["s"]}):
        s = torch.full((NUM_NODES, 1), float("inf"), dtype=dtype)
        with torch.no_grad():
            out = gnnfuse.message_passing(graph, message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                          ndata={"h": h, "s": s})["o"]
        edges = message(type("E", (), {"src": {"h": h[src]}, "dst": {"s": s[dst]}}))["m"]
        want = torch.zeros_like(h).index_add(0, dst, edges)
        torch.testing.assert_close(out, want, equal_nan=True, rtol=1e-6, atol=0.0)
    assert kinds and all(flag for _, flag, _ in kinds)      # the kernels under test are register-row ones


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_chain_of_per_edge_products_is_not_regrouped(dtype, kinds, monkeypatch):
    """With ``reassoc``, LLVM computed ``h_u * w_e * s_u`` as ``h_u * (w_e * s_u)`` (one
    scalar product per edge instead of one per column), which moves an overflow or
    underflow. Column 0, eager code against the kernel before: vertex 1 (in-edges from 2
    and 3) inf against 2e200 (``(big * big) / big`` is inf, ``big * (big / big)`` not);
    vertex 3 (from 7, 2 and 0) NaN against inf (vertex 0's ``(big * big) * 0`` is
    ``inf * 0``, ``big * (big * 0)`` is 0); in float64 vertex 2 (from 7) inf against NaN
    (``(inf / big) / big`` against ``inf * 0``, 1e-400 underflowing). A body of two or
    more products compiles without fast-math; one product (GCN's ``h_u * norm_u``) keeps it."""
    big = 1e20 if dtype == torch.float32 else 1e200
    graph = hub_graph()
    src, dst = graph.src.long(), graph.dst.long()
    h = torch.ones(NUM_NODES, 4, dtype=dtype)
    h[2], h[7] = big, float("inf")
    h[7, 1:] = 1.0
    w = torch.ones(graph.num_edges, 1, dtype=dtype)
    w[(dst == 1) | (dst == 3)] = big
    w[dst == 2] = 1 / big
    s = torch.ones(NUM_NODES, 1, dtype=dtype)
    s[2], s[7] = 1 / big, 1 / big
    s[0] = 0.0
    h[0] = big
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    message = lambda e: {"m": e.src["h"] * e.data["w"] * e.src["s"]}   # noqa: E731
    with torch.no_grad():
        out = gnnfuse.message_passing(graph, message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                      ndata={"h": h, "s": s}, edata={"w": w})["o"]
    want = torch.zeros_like(h).index_add(0, dst, h[src] * w * s[src])
    assert want[1, 0].isinf() and want[2, 0].isinf() and want[3, 0].isnan()
    torch.testing.assert_close(out, want, equal_nan=True, rtol=1e-6, atol=0.0)
    assert kinds and all(flag for _, flag, _ in kinds)      # the kernels under test are register-row ones


def test_multi_head_rows(kinds, monkeypatch, fresh_compile):
    """Rows of shape (heads, D): per-head attention weights broadcast over D, written out
    once per head, not once per column (GAT's 8 x 8 kernels were a thousand lines and
    took 12.5-14 s each to compile)."""
    sources = []
    real = cpu_executor.load_kernel
    monkeypatch.setattr(cpu_executor, "load_kernel", lambda source, name: sources.append(source) or real(source, name))
    graph = hub_graph()
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(NUM_NODES, 3, 4, dtype=torch.float64, generator=gen)
    a = torch.randn(NUM_NODES, 3, 1, dtype=torch.float64, generator=gen)

    def model(h, a):
        return gnnfuse.message_passing(graph, lambda e: {"m": torch.sigmoid(e.src["a"] + e.dst["a"]) * e.src["h"]},
                                       lambda n: {"o": n.mailbox["m"].sum(dim=1)}, ndata={"h": h, "a": a})["o"]
    assert_same(model, [h, a], monkeypatch, rtol=1e-12, atol=1e-12)
    assert any(shape == (3, 4) and flag for shape, flag, _ in kinds)
    # sigmoid is 1 / (1 + exp(-x)): one exp per head
    forward = [src for src in sources if "(row in registers)" in src and "tl.exp(" in src]
    assert forward and all(src.count("tl.exp(") == 3 for src in forward), [src.count("tl.exp(") for src in forward]


def test_parallel_build(kinds, monkeypatch):
    """The ``prange`` build (two threads), whose kernel-level constants must be inlined."""
    monkeypatch.setattr(schedule, "PARALLEL_MIN_WORK", 0)
    h = torch.randn(NUM_NODES, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert_same(reduce_model("sum"), [h], monkeypatch, rtol=1e-12, atol=1e-12)
    finally:
        torch.set_num_threads(threads)
    assert kinds and all(flag and parallel for _, flag, parallel in kinds)


@pytest.mark.parametrize("parallel", [False, True])
def test_launches_compile_with_slp_when_planned_and_calls_compile_nothing(parallel, monkeypatch):
    """A register-row kernel is compiled for its launch's argument types, with LLVM's SLP
    vectorizer on, when the launch is planned (executor._compile_vectorized): its calls
    then find that machine code (one signature, no second compile without SLP) and the
    process's SLP setting is left as it was. Before, every call went through a wrapper
    turning SLP on and off around it."""
    import numba
    monkeypatch.setattr(schedule, "PARALLEL_MIN_WORK", 0 if parallel else schedule.PARALLEL_MIN_WORK)
    compiled_under = []
    real_compile = cpu_executor._compile_vectorized

    def recording(kernel, args):
        real_compile(kernel, args)
        compiled_under.append(kernel)
    monkeypatch.setattr(cpu_executor, "_compile_vectorized", recording)
    h = torch.randn(NUM_NODES, 5, dtype=torch.float32, generator=torch.Generator().manual_seed(5))
    slp_before = numba.config.SLP_VECTORIZE
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if parallel else 1)
    try:
        monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
        with torch.no_grad():
            for _ in range(2):
                reduce_model("sum")(h)
    finally:
        torch.set_num_threads(threads)
    assert numba.config.SLP_VECTORIZE == slp_before
    assert compiled_under, "no register-row launch was planned"
    for kernel in compiled_under:
        assert len(kernel.signatures) == 1, kernel.signatures
        assert (kernel.signatures[0][0] == numba.int64) == parallel    # a parallel build's thread count
