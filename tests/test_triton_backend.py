"""Every generated kernel against the reference backend, forward and backward, for every
compiler-core model in both front ends, on the graphs that break naive kernels: no edges,
isolated vertices, a hub whose in-degree spans several edge chunks, self loops and
multi-edges. Rows longer than 64 edges are split into segments here, so both the
atomic and the direct store paths run. Without a GPU the kernels run in Triton's interpreter (see conftest)."""
from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse
import zoo
from graph_strategies import graphs
from mixed_floats import CASES as MIXED_CASES, mixed_float_model
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.backend.triton.codegen import generate
from gnnfuse.frontend import trace_message_passing
from gnnfuse.frontend.trace_cache import clear_trace_caches
from gnnfuse.passes.fusion import AggregateUnit, EdgeUnit, partition
from gnnfuse.runtime import CompiledProgram

KINDS = {"vertex": zoo.vertex_models, "message": zoo.message_models}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def hub_graph() -> gnnfuse.Graph:
    """300 in-edges on vertex 0 (more than one BLOCK_E chunk), random multi-edges among
    vertices 1..9, self loops on 3 and 5, vertices 10 and 11 isolated."""
    g = torch.Generator().manual_seed(7)
    src = torch.cat([torch.randint(1, 10, (300,), generator=g), torch.randint(1, 10, (40,), generator=g),
                     torch.tensor([3, 5, 2, 2])])
    dst = torch.cat([torch.zeros(300, dtype=torch.long), torch.randint(1, 10, (40,), generator=g),
                     torch.tensor([3, 5, 4, 4])])
    return gnnfuse.Graph(src, dst, 12)


GRAPHS = {"hub": hub_graph, "empty": lambda: gnnfuse.Graph(torch.empty(0, dtype=torch.long),
                                                           torch.empty(0, dtype=torch.long), 6)}


def run(kind, name, graph, x, p, backend, monkeypatch):
    """Outputs and the gradients of a fixed projection of them, under ``backend``."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    xs = x.clone().requires_grad_()
    ps = {k: v.clone().requires_grad_() for k, v in p.items()}
    out = KINDS[kind](xs, graph, ps)[name]()
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * weight).sum().backward()
    return out.detach(), [xs.grad] + [ps[k].grad for k in p]


@pytest.mark.parametrize("graph_name", GRAPHS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", zoo.MODELS)
def test_kernels_match_reference(name, kind, graph_name, monkeypatch):
    graph = GRAPHS[graph_name]().to(DEVICE)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=gen).to(DEVICE)
    p = {k: v.to(DEVICE) for k, v in zoo.params(name, gen).items()}

    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 64)   # the hub splits into 5 segments
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")   # the cost rule would pick COO on graphs this small
    launched = []
    real_run_unit = triton_executor.run_unit
    monkeypatch.setattr(triton_executor, "run_unit",
                        lambda unit, *a: launched.append(unit) or real_run_unit(unit, *a))
    out, grads = run(kind, name, graph, x, p, "triton", monkeypatch)
    assert launched, "no fused kernel ran: the test would compare the reference with itself"
    assert any(getattr(u, "by", None) == "src" for u in launched), "no backward kernel over the reverse CSR ran"

    ref, ref_grads = run(kind, name, graph, x, p, "reference", monkeypatch)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-12)


def test_float32_kernels_accumulate_in_float32(monkeypatch):
    graph = hub_graph().to(DEVICE)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_nodes, zoo.F_IN, generator=gen).to(DEVICE)
    p = {k: v.float().to(DEVICE) for k, v in zoo.params("gat", gen).items()}
    out, grads = run("message", "gat", graph, x, p, "triton", monkeypatch)
    ref, ref_grads = run("message", "gat", graph, x, p, "reference", monkeypatch)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        # 300-term float32 sums with cancellation: error relative to the terms, not the result
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4 * r.abs().max().item())


def test_units_fuse_gather_compute_and_reduce():
    """GCN's message ``h[src] * norm[src] * norm[dst]`` and its sum become one unit that
    reads only the node inputs: broadcast reordering turns ``h * norm`` into a node-level
    product, and the unit takes that product back in as arithmetic on the gathered rows
    rather than leaving it to a separate op: no edge-sized tensor, no extra pass."""
    graph = hub_graph()
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64)
    tracer = trace_message_passing(
        lambda e: {"m": e.src["h"] * e.src["norm"] * e.dst["norm"]},
        lambda n: {"out": torch.sum(n.mailbox["m"], dim=1)}, None,
        ndata={"h": x, "norm": torch.ones(graph.num_nodes, 1, dtype=torch.float64)}, edata={})
    plan = partition(CompiledProgram(tracer.program).program)
    assert len(plan) == 1 and isinstance(plan[0], AggregateUnit)
    units = plan
    assert {v.op for v in units[0].leaves} == {"input"}
    assert "mul" in [v.op for v in units[0].body if v.residency.name == "NODE"]
    source, _ = generate(units[0], "k", "tl.float64")
    assert "for e0 in range(start, end, BLOCK_E)" in source
    # only split rows' segments meet in the workspace; an unsplit row is stored once
    assert re.search(r"if slot >= 0:\s+part = work \+ .*\s+tl.atomic_add\(part", source)
    assert "for r in range(ROWS):" in source         # several segments per program


def test_segments_cover_every_edge_once_longest_first():
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.triton.schedule import segments
    graph = hub_graph()
    segs = segments(GraphContext(graph), "dst", 64)
    rowptr = graph.csr().rowptr.long()
    covered = torch.zeros(graph.num_edges, dtype=torch.long)
    for r, a, b in zip(segs.row.tolist(), segs.start.tolist(), segs.end.tolist()):
        assert rowptr[r] <= a <= b <= rowptr[r + 1] and b - a <= 64
        covered[a:b] += 1
    assert (covered == 1).all()
    assert set(segs.row.tolist()) == set(range(graph.num_nodes))        # isolated rows still written
    assert segs.row[segs.split.bool()].unique().tolist() == [0]          # only the hub is split
    assert segs.split_rows.tolist() == [0]                               # the one with a workspace slot
    lengths, split = segs.end - segs.start, segs.split.bool()
    first = int(split.sum())
    assert split[:first].all() and not split[first:].any()       # split rows' segments come first
    for part in (lengths[:first], lengths[first:]):                # each part longest first
        assert (part[:-1] >= part[1:]).all()


def test_gat_forward_writes_no_edge_sized_tensor_and_saves_only_vertex_data():
    """GATConv's edge softmax becomes fused max, sum and weighted-sum passes that each
    recompute the attention scores from gathered vertex rows: the forward writes no
    |E|-sized tensor at all, the backward keeps only vertex-sized values (features,
    logits, per-destination max and sum), and no per-edge torch op runs in either."""
    from gnnfuse import nn as gnn
    from gnnfuse.runtime import compiled as compiled_module
    graph = hub_graph()
    layer = gnn.GATConv(4, 3, heads=2)
    x = torch.randn(graph.num_nodes, 4, requires_grad=True)
    compiled_module._BY_STRUCTURE.clear()
    clear_trace_caches()       # a trace from another graph size would be reused
    layer(x, graph).sum().backward()
    (compiled,) = compiled_module._BY_STRUCTURE.values()
    (backward,) = compiled._backward.values()
    forward_plan = partition(compiled.program, [v.id for v in backward.saved])
    assert not any(isinstance(item, EdgeUnit) for item in forward_plan)
    assert [item.reduce.attrs["op"] for item in forward_plan if isinstance(item, AggregateUnit)] == [
        "max", "sum", "sum"]
    assert not any(v.residency.is_edge_rowed for v in backward.saved)
    for plan in (forward_plan, partition(backward.program, [])):
        plain = [v for v in plan if not isinstance(v, (AggregateUnit, EdgeUnit))]
        assert not any(v.residency.is_edge_rowed for v in plain)


@pytest.mark.parametrize("graph_name", GRAPHS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["gcn", "gat", "sage_mean", "gin", "appnp", "dotgat"])
def test_edge_parallel_schedule_matches_reference(name, kind, graph_name, monkeypatch):
    """GNNFUSE_SCHEDULE=coo runs sum and mean units edge-parallel with atomic adds
    (fuseGNN's GAS) -- forward and backward -- and must agree with the reference."""
    graph = GRAPHS[graph_name]().to(DEVICE)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=gen).to(DEVICE)
    p = {k: v.to(DEVICE) for k, v in zoo.params(name, gen).items()}
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    schedules = []
    real_kernel_for = triton_executor._kernel_for
    monkeypatch.setattr(triton_executor, "_kernel_for",
                        lambda unit, acc, schedule: schedules.append(schedule) or real_kernel_for(unit, acc, schedule))
    out, grads = run(kind, name, graph, x, p, "triton", monkeypatch)
    assert "coo" in schedules, "no edge-parallel kernel ran"
    ref, ref_grads = run(kind, name, graph, x, p, "reference", monkeypatch)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-12)


def test_schedule_is_checked(monkeypatch):
    from gnnfuse.backend.triton.codegen import generate_coo
    graph = hub_graph()
    x = torch.randn(graph.num_nodes, 3, dtype=torch.float64)
    tracer = trace_message_passing(lambda e: {"m": e.src["h"]}, lambda n: {"out": torch.max(n.mailbox["m"], dim=1)[0]},
                                   None, ndata={"h": x}, edata={})
    (unit,) = [u for u in partition(CompiledProgram(tracer.program).program) if isinstance(u, AggregateUnit)]
    with pytest.raises(ValueError, match="max needs the CSR one"):
        generate_coo(unit, "k", "tl.float64")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "gas")
    with pytest.raises(ValueError, match="GNNFUSE_SCHEDULE must be one of"):
        triton_executor.schedule_for(unit, graph.num_nodes, graph.num_edges)


def test_cost_rule_picks_coo_only_for_light_rows(monkeypatch):
    """The default schedule: edge-parallel where rows hold little work (low average
    degree, narrow features) unless a plain sum takes the rows schedule there, CSR
    otherwise, and always CSR for max/min, which have no atomic combine here;
    GNNFUSE_SCHEDULE overrides the rule."""
    graph = hub_graph()
    units = {}
    for op in ("sum", "max"):
        tracer = trace_message_passing(
            lambda e: {"m": e.src["h"]},
            lambda n, op=op: {"out": getattr(torch, op)(n.mailbox["m"], dim=1) if op == "sum"
                              else torch.max(n.mailbox["m"], dim=1)[0]},
            None, ndata={"h": torch.randn(graph.num_nodes, 8, dtype=torch.float64)}, edata={})
        (units[op],) = [u for u in partition(CompiledProgram(tracer.program).program) if isinstance(u, AggregateUnit)]
    monkeypatch.delenv("GNNFUSE_SCHEDULE", raising=False)
    choose = triton_executor.schedule_for
    assert choose(units["sum"], 1000, 2000) == "rows"       # degree 2, width 8: a plain sum by destination
    monkeypatch.setattr(triton_executor, "prefers_rows", lambda degree, width: False)
    assert choose(units["sum"], 1000, 2000) == "coo"
    assert choose(units["sum"], 1000, 50_000) == "csr"      # degree 50
    assert choose(units["max"], 1000, 2000) == "csr"
    assert triton_executor.prefers_coo(2, 64) and not triton_executor.prefers_coo(2, 256)
    assert triton_executor.prefers_coo(6, 16) and not triton_executor.prefers_coo(6, 64)
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    assert choose(units["sum"], 1000, 2000) == "csr"
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    assert choose(units["sum"], 1000, 50_000) == "coo"
    assert choose(units["max"], 1000, 2000) == "csr"


def test_cost_rule_counts_the_rows_coo_would_regather_per_edge(monkeypatch):
    """A unit that reduces one lane per edge but reads each edge's destination row
    (GAT's backward: the output gradient dotted with the source row) moves that row per
    edge in the COO schedule and once per row in CSR: at degree 6 it runs CSR, where a
    neighbour sum as narrow as its output runs COO."""
    graph = hub_graph()
    ndata = {"h": torch.randn(graph.num_nodes, 64, dtype=torch.float64),
             "g": torch.randn(graph.num_nodes, 64, dtype=torch.float64)}
    tracer = trace_message_passing(lambda e: {"m": (e.src["h"] * e.dst["g"]).sum(-1, keepdim=True)},
                                   lambda n: {"out": torch.sum(n.mailbox["m"], dim=1)}, None, ndata=ndata, edata={})
    program = CompiledProgram(tracer.program).program
    (unit,) = [u for u in partition(program, tile_feature_sums=True) if isinstance(u, AggregateUnit)]
    monkeypatch.delenv("GNNFUSE_SCHEDULE", raising=False)
    assert unit.reduce.shape == (1,) and triton_executor.edge_lanes(unit) == 1 + 64
    assert triton_executor.schedule_for(unit, 1000, 6000) == "csr"
    assert triton_executor.prefers_coo(6, 1)       # what the reduced width alone would have picked


@pytest.mark.parametrize("heads,channels", [(2, 3), (1, 5), (4, 2), (8, 64), (3, 47), (8, 40)])
def test_attention_gradient_row_sums_match_reference(heads, channels, monkeypatch, fresh_compile):
    """GATConv's backward sums ``h_src * grad`` over each head's channels per edge; the
    kernel reduces a padded [edges, heads, next_pow2(channels)] tile with the lanes past
    ``channels`` masked, and node rows of odd width are read from a padded copy. A tile
    wider than `EDGE_TILE_LANES` (8 x 64: 512 lanes) is walked in blocks of whole heads,
    one program each, the last block's heads past ``heads`` unstored (3 x 47: 4 padded
    heads of 64 lanes in two blocks)."""
    from gnnfuse.backend.triton import codegen
    from gnnfuse.nn import GATConv
    sums = []
    real = codegen.row_sum_tile
    monkeypatch.setattr(codegen, "row_sum_tile", lambda root: sums.append(real(root)) or real(root))
    graph = hub_graph().to(DEVICE)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64, generator=gen).to(DEVICE)
    layer = GATConv(6, channels, heads=heads).double().to(DEVICE)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        layer.zero_grad()
        xs = x.clone().requires_grad_()
        out = layer(xs, graph)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum().backward()
        results.append([out.detach(), xs.grad, layer.att_src.grad.clone(), layer.lin.weight.grad.clone()])
    assert (heads, channels) in [(s.kept, s.summed) for s in sums if s], \
        "the attention gradient did not take the row-tile path"
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("schedule", ["csr", "coo"])
@pytest.mark.parametrize("width", [5, 47])
def test_padded_rows_are_read_at_aligned_lanes(width, schedule, monkeypatch):
    """A GCN aggregation over vertex rows of odd width reads the padded copy at lane
    ``f % stride`` (so its loads can be vectorized) and still matches the reference on
    the output and the input gradient, the last row included: the lanes past ``width``
    must stay inside the row and never reach a stored value."""
    from gnnfuse.backend.triton import codegen
    from gnnfuse.nn import GCNConv
    from gnnfuse.runtime import compiled as compiled_module
    sources = []
    real = codegen._Emitter.padded_lanes
    monkeypatch.setattr(codegen._Emitter, "padded_lanes",
                        lambda self, stride: sources.append(stride) or real(self, stride))
    monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    graph = hub_graph().to(DEVICE)
    gen = torch.Generator().manual_seed(3)
    in_width = width + 3     # narrowing with an input gradient: the map runs first, writing odd-width rows
    x = torch.randn(graph.num_nodes, in_width, dtype=torch.float64, generator=gen).to(DEVICE)
    layer = GCNConv(in_width, width).double().to(DEVICE)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        clear_trace_caches()
        compiled_module._BY_STRUCTURE.clear()    # generate afresh: another test may have compiled this GCN
        xs = x.clone().requires_grad_()
        out = layer(xs, graph)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum().backward()
        results.append([out.detach(), xs.grad])
    assert -(-width // 4) * 4 in sources, "no kernel read the padded rows at aligned lanes"
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("schedule", ["csr", "coo"])
def test_sum_times_row_scalar_is_one_unit_forward_and_backward(schedule, monkeypatch):
    """GCN's ``sum(...) * v.norm`` scales each finished row inside the sum's kernel (its
    backward too), and a mean divides it by the degree there, so no torch op runs after
    the unit; a sum that is also used on its own
    stays a unit of its own. Both match the reference in float64, the split hub row and
    the edge-parallel schedule's per-edge terms included."""
    from gnnfuse.runtime import compiled as compiled_module

    @gnnfuse.vertex
    def scaled(v):
        return sum([u.h * u.norm for u in v.innbs]) * v.norm

    @gnnfuse.vertex
    def mean(v):
        return sum([u.h for u in v.innbs]) / len(v.innbs)

    @gnnfuse.vertex
    def scaled_and_plain(v):
        s = sum([u.h for u in v.innbs])
        return s * v.norm + torch.tanh(s)

    monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    graph = hub_graph().to(DEVICE)
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(graph.num_nodes, 6, dtype=torch.float64, generator=gen).to(DEVICE)
    norm = torch.rand(graph.num_nodes, 1, dtype=torch.float64, generator=gen).to(DEVICE) + 0.5
    # (function, which of the forward and backward plans end in a scaled unit)
    for fn, fused in ((scaled, (True, True)), (mean, (True,)), (scaled_and_plain, ())):
        results = []
        for backend in ("triton", "reference"):
            monkeypatch.setenv("GNNFUSE_BACKEND", backend)
            compiled_module._BY_STRUCTURE.clear()
            clear_trace_caches()
            hs = h.clone().requires_grad_()
            out = fn(graph, {"h": hs, "norm": norm})
            (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum().backward()
            results.append([out.detach(), hs.grad])
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        (compiled,) = compiled_module._BY_STRUCTURE.values()
        (backward,) = compiled._backward.values()
        plans = [partition(program, keep)
                 for program, keep in ((compiled.program, [v.id for v in backward.saved]), (backward.program, []))]
        for plan, _ in zip(plans, fused):   # the mean's backward divides before its gather
            assert [item.scale is not None for item in plan if isinstance(item, AggregateUnit)] == [True]
            assert not any(v.op in ("mul", "div") for v in plan if not isinstance(v, AggregateUnit))
        if not fused:
            (unit,) = [item for item in plans[0] if isinstance(item, AggregateUnit)]
            assert unit.scale is None and any(v.op == "mul" for v in plans[0] if v is not unit)


@pytest.mark.parametrize("schedule", ["csr", "coo", None])
@pytest.mark.parametrize("width", [3, 64])
def test_a_row_scale_computed_in_the_udf_keeps_eager_nans(schedule, width, monkeypatch, fresh_compile):
    """``sum(w * h) / sum(w)`` on vertices without in-edges is 0 / 0, NaN in eager code.
    Scaled per edge (the edge-parallel schedule) or per part of a split row, the empty
    rows stayed 0: a scale computed in the UDF now stays an op after the sum, so every
    schedule gives the reference's NaN rows (found by differential fuzzing)."""
    @gnnfuse.vertex
    def weighted_mean(v):
        return sum([e.src.h * e.w for e in v.inedges]) / sum([e.w for e in v.inedges])

    if schedule is not None:
        monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    graph = gnnfuse.Graph(torch.tensor([0, 1, 1]), torch.tensor([1, 0, 0]), 4).to(DEVICE)   # 2, 3: no in-edges
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(4, width, dtype=torch.float64, generator=gen).to(DEVICE)
    w = (torch.rand(3, 1, dtype=torch.float64, generator=gen) + 0.1).to(DEVICE)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        results.append(weighted_mean(graph, {"h": h}, {"w": w}))
    torch.testing.assert_close(results[0], results[1], rtol=1e-12, atol=1e-12, equal_nan=True)
    assert results[0][2:].isnan().all() and results[0][:2].isfinite().all()


@pytest.mark.parametrize("schedule", ["csr", "coo", None])
def test_one_vertex_graph_gradients_match_reference(schedule, monkeypatch, fresh_compile):
    """A graph of one vertex and its self loop: every table has one row. The norm's
    gradient is a row dot of the summed rows with a broadcast (stride-0) gradient row,
    which row_dot's kernel once read as a packed row -- 3.5 for the expected 6.0 here,
    about 1e243 under the automatic schedule (found by differential fuzzing)."""
    @gnnfuse.vertex
    def scaled_total(v):
        return (sum([u.h * u.norm for u in v.innbs]) * v.norm).sum(-1)

    if schedule is not None:
        monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    graph = gnnfuse.Graph(torch.tensor([0]), torch.tensor([0]), 1).to(DEVICE)
    h = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64, device=DEVICE)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        hs = h.clone().requires_grad_()
        norm = torch.tensor([[0.5]], dtype=torch.float64, device=DEVICE, requires_grad=True)
        out = scaled_total(graph, {"h": hs, "norm": norm})
        out.sum().backward()
        results.append([out.detach(), hs.grad, norm.grad])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[1][2].cpu(), torch.tensor([[6.0]], dtype=torch.float64))


@pytest.mark.parametrize("schedule", ["csr", "coo"])
@pytest.mark.parametrize("graph_name", GRAPHS)
def test_a_vertex_table_added_to_a_reduction_joins_its_unit(schedule, graph_name, monkeypatch):
    """SAGE's ``mean(neighbours) + v.r`` (and a scaled sum, a [2, 3] row at a padded
    stride): the kernel adds the vertex's row when it stores its own -- once per row, in
    the split hub row too, and on a graph without edges; the edge-parallel schedule adds
    it after its atomics -- so no torch ``add`` runs after the unit. A sum also used on
    its own, or a max whose backward keeps it, keeps the addition apart. Outputs and
    gradients match the reference in float64."""
    from gnnfuse.runtime import compiled as compiled_module

    fns = {
        "mean": (gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]) / len(v.innbs) + v.r), True),
        "scaled": (gnnfuse.vertex(lambda v: sum([u.h * u.norm for u in v.innbs]) * v.norm + v.r), True),
        # max's backward keeps the reduced rows (which edge won): the addition stays apart
        "max-first": (gnnfuse.vertex(lambda v: v.r + max([u.h for u in v.innbs])), False),
        "rows": (gnnfuse.vertex(lambda v: sum([u.h.reshape(2, 3) for u in v.innbs]) + v.r.reshape(2, 3)), True),
        "bias": (gnnfuse.vertex(lambda v: sum([u.h * u.norm for u in v.innbs]) * v.norm + bias), True),
        "shared-sum": (gnnfuse.vertex(lambda v: (lambda s: s + v.r + torch.tanh(s))(sum([u.h for u in v.innbs]))),
                       False),
    }
    monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 64)   # the hub splits into 5 segments
    graph = GRAPHS[graph_name]().to(DEVICE)
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(graph.num_nodes, 6, dtype=torch.float64, generator=gen).to(DEVICE)
    r = torch.randn(graph.num_nodes, 6, dtype=torch.float64, generator=gen).to(DEVICE)
    norm = torch.rand(graph.num_nodes, 1, dtype=torch.float64, generator=gen).to(DEVICE) + 0.5
    bias = torch.randn(6, dtype=torch.float64, generator=gen).to(DEVICE)      # a parameter row (GCN's bias)
    for name, (fn, fused) in fns.items():
        results = []
        for backend in ("triton", "reference"):
            monkeypatch.setenv("GNNFUSE_BACKEND", backend)
            compiled_module._BY_STRUCTURE.clear()
            clear_trace_caches()
            hs, rs = h.clone().requires_grad_(), r.clone().requires_grad_()
            out = fn(graph, {"h": hs, "r": rs, "norm": norm})
            (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum().backward()
            results.append([out.detach(), hs.grad, rs.grad])
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
        (compiled,) = compiled_module._BY_STRUCTURE.values()
        (backward,) = compiled._backward.values()
        plan = partition(compiled.program, [v.id for v in backward.saved], row_addends=True)
        units = [item for item in plan if isinstance(item, AggregateUnit)]
        assert any(u.addend is not None for u in units) == fused, name
        assert any(v.op == "add" for v in plan if not isinstance(v, AggregateUnit)) != fused, name


@pytest.mark.parametrize("layer, kwargs", [("SAGEConv", {"aggr": "mean"}), ("SAGEConv", {"aggr": "add"}),
                                           ("GraphConv", {"aggr": "mean"}), ("GraphConv", {"aggr": "add"}),
                                           ("GCNConv", {})])
def test_mapping_first_layers_add_their_root_term_inside_the_aggregation(layer, kwargs, monkeypatch):
    """SAGE and GraphConv mapping first (a narrowing layer): the root term, written with
    the layer's bias, is the aggregation unit's addend; GCN's bias is its normalized
    sum's (a parameter row). The forward runs no torch add, and the layer matches PyG's
    with the same (random) weights in float64, gradients included."""
    from gnnfuse import nn as gnn
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    graph = hub_graph().to(DEVICE)
    x = torch.randn(graph.num_nodes, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    theirs = getattr(pyg_nn, layer)(12, 5, **kwargs).double().to(DEVICE)
    torch.manual_seed(6)
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ours = getattr(gnn, layer)(12, 5, **kwargs).double().to(DEVICE)
    ours.load_state_dict(theirs.state_dict())
    edge_index = torch.stack([graph.src, graph.dst])
    xs, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ours(xs, graph)
    torch.testing.assert_close(out, theirs(xt, edge_index), rtol=1e-9, atol=1e-12)
    out.square().sum().backward()
    theirs(xt, edge_index).square().sum().backward()
    torch.testing.assert_close(xs.grad, xt.grad, rtol=1e-9, atol=1e-12)
    theirs_grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs_grads[name].grad, rtol=1e-9, atol=1e-12,
                                   msg=lambda m, name=name: f"{name}: {m}")
    (program,) = gnnfuse.explain(lambda: ours(x, graph)).programs
    steps = program.forward.steps
    assert [step.item.addend is not None for step in steps if step.fused] == [True], [s.label for s in steps]
    assert not any(step.item.op == "add" for step in steps if not step.fused)


def test_backward_saves_no_forward_value_it_does_not_read():
    """A derivative rule asks for every operand (mul's for both factors); once dead code
    is gone, GCN's backward reads only the norm, so the forward keeps only that and not
    its [N, F] sum."""
    from gnnfuse.nn import GCNConv
    from gnnfuse.runtime import compiled as compiled_module
    compiled_module._BY_STRUCTURE.clear()
    clear_trace_caches()
    graph = hub_graph()
    GCNConv(4, 5)(torch.randn(graph.num_nodes, 4, requires_grad=True), graph).sum().backward()
    (compiled,) = compiled_module._BY_STRUCTURE.values()
    (backward,) = compiled._backward.values()
    assert [tuple(v.shape) for v in backward.saved] == [(1,)]
    assert sorted(k for k in backward.program.inputs) == ["grad:out", f"saved:{backward.saved[0].id}"]


@settings(max_examples=8, deadline=None)
@given(case=graphs(max_nodes=8, max_edges=24, hub_degrees=st.sampled_from([0, 70])))
def test_segments_kept_in_csr_order_give_the_sorted_segments_results(case):
    """Segments one per row in CSR order (`schedule.SHORT_ROWS`: a loader block whose
    rows are known to be short) against the longest-first ones, on graphs with loops,
    multi-edges, isolated vertices and (with a hub past `SHORT_ROWS`) a hint too long to
    keep order: GCN- and GAT-style layers' outputs and gradients agree exactly."""
    from unittest import mock
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.triton.schedule import SEGMENT_EDGES, SHORT_ROWS, segments
    # the CSR schedule, which reads the segments (the cost rule picks COO on graphs this small)
    from gnnfuse.backend.triton import schedule
    with mock.patch.dict("os.environ", {"GNNFUSE_BACKEND": "triton", "GNNFUSE_SCHEDULE": "csr"}):
        results = []
        for hinted in (False, True):
            graph = gnnfuse.Graph(case.given[0], case.given[1], case.num_nodes).to(DEVICE)
            if not hinted:      # unhinted short rows keep order too (`_all_rows_short`): sorted here
                for by in ("dst", "src"):
                    graph.cached(f"triton_segments_{by}_{SEGMENT_EDGES}",
                                 lambda _, by=by: schedule._build(graph.grouped(by)[0], SEGMENT_EDGES))
            if hinted:
                for by, degrees in (("dst", graph.in_degrees()), ("src", graph.out_degrees())):
                    most = int(degrees.max()) if degrees.numel() else 0
                    built = segments(GraphContext(graph), by, SEGMENT_EDGES, max_degree=most)
                    lengths = (built.end - built.start).long().cpu()
                    if most <= SHORT_ROWS:
                        assert torch.equal(built.row.long().cpu(), torch.arange(len(built)))
                    else:
                        assert torch.equal(lengths, torch.sort(lengths, descending=True).values)
            gen = torch.Generator().manual_seed(1)
            x = torch.randn(case.num_nodes, zoo.F_IN, dtype=torch.float64, generator=gen).to(DEVICE)
            ps = {name: {k: v.to(DEVICE).requires_grad_() for k, v in zoo.params(name, gen).items()}
                  for name in ("gcn", "gat")}
            xs = x.clone().requires_grad_()
            outs = [zoo.vertex_models(xs, graph, ps[name])[name]() for name in ("gcn", "gat")]
            sum(o.square().sum() for o in outs).backward()
            results.append([o.detach() for o in outs] + [xs.grad] + [t.grad for p in ps.values() for t in p.values()])
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_integer_aggregations_run_exactly(monkeypatch):
    """A sum or max of integer messages (type ids, counts) ran as a kernel, which
    accumulates in its float ACC: the sum of 2**24 + 1 and 2 gave 2**24 + 2 (float32),
    of 2**53 + 1 and 2 gave 2**53 (float64 tables beside). Integer reductions now stay
    torch ops, as integer per-edge work already did."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    graph = gnnfuse.Graph(torch.tensor([0, 2, 1]), torch.tensor([1, 1, 0]), 3).to(DEVICE)

    @gnnfuse.vertex
    def neighbour_sum(v):
        return sum([u.i for u in v.innbs])

    for big, tables in ((2**24 + 1, {}), (2**53 + 1, {"h": torch.zeros(3, 1, dtype=torch.float64)})):
        ids = torch.tensor([big, 5, 2], device=DEVICE)
        ndata = {"i": ids, **{k: t.to(DEVICE) for k, t in tables.items()}}
        out = gnnfuse.message_passing(graph, lambda e: {"m": e.src["i"]},
                                      lambda n: {"sum": n.mailbox["m"].sum(1), "max": n.mailbox["m"].max(1)[0]},
                                      ndata=ndata)
        assert out["sum"].tolist() == [5, big + 2, 0] and out["max"].tolist() == [5, big, 0]
        assert neighbour_sum(graph, ndata).tolist() == [5, big + 2, 0]


@pytest.mark.parametrize("case", MIXED_CASES)
def test_units_mixing_float_dtypes_run_as_torch_ops(case, monkeypatch):
    """A kernel computes a unit in one dtype, float64 once any leaf was; torch rounds the
    float32 part of ``(((a - b) + 1e8) - 1e8) * w`` to float32's spacing of 8 before the
    float64 ``w`` widens it, and a 0-dim float64 tensor does not widen float32 data at all.
    The sums were 6.04 and 7.62 off the reference backend's; such a unit now runs as torch
    ops, with a warning (as on the cpu backend)."""
    monkeypatch.setattr(triton_executor, "_MIXED_WARNED", set())
    model, inputs = mixed_float_model(hub_graph().to(DEVICE), case, DEVICE)
    results = {}
    for backend in ("reference", "triton"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        leaves = [t.clone().requires_grad_() for t in inputs]
        if backend == "triton":
            with pytest.warns(RuntimeWarning, match="mixes torch.float32 and torch.float64"):
                out = model(*leaves)
        else:
            out = model(*leaves)
        out.sum().backward()
        results[backend] = (out.detach(), [t.grad for t in leaves])
    (out, grads), (expected, expected_grads) = results["triton"], results["reference"]
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e)
