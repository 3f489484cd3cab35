"""The ``rows`` schedule (`codegen.generate_rows`) on rows wider than one lane: BLOCK_R
segments side by side per program, each step a [BLOCK_R x K, BLOCK_F] tile of edge and
feature lanes. Checked against the reference backend (Triton's interpreter here, or the
GPU) where such a kernel breaks: widths that are not a power of two, several feature
blocks per row (a forced tile), a hub cut into segments that add atomically, isolated
vertices, a mean, a destination-side scale folded into the unit (GCN's ``* v.norm``),
edge data, per-type data, and the graphs users have (hypothesis); the cost rule's choice of it; and a
unit it must not take (a sum re-reading a wide row of its own vertex per edge)."""
from __future__ import annotations

import pytest
import torch
import triton
from hypothesis import given, settings
from oracle_check import device_for

import gnnfuse
from gnnfuse.backend.forced_schedule import ForcedSchedule, forcing
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.backend.triton.codegen import ROWS_TILE, ROWS_WIDEST, plain_sum, rows_space
from graph_strategies import graphs
from test_one_lane_schedules import _one_unit, check_neighbour_sum, hub_graph, launched

DEVICE = device_for("triton")
f64 = torch.float64

LAYERS = {
    "sum": lambda g, d: gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]))(g, {"h": d["h"]}),
    "gcn": lambda g, d: gnnfuse.vertex(lambda v: sum([u.h * u.norm for u in v.innbs]) * v.norm)(
        g, {"h": d["h"], "norm": d["norm"]}),
    "weighted": lambda g, d: gnnfuse.vertex(lambda v: sum([e.src.h * e.w for e in v.inedges]))(
        g, {"h": d["h"]}, {"w": d["w"]}),
    "typed": lambda g, d: gnnfuse.vertex(lambda v: sum([e.src.h * e.type.p for e in v.inedges]))(
        g, {"h": d["h"]}, etype_feature={"p": d["p"]}),
    "mean": lambda g, d: gnnfuse.message_passing(g, lambda e: {"m": e.src["h"]},
                                                 lambda n: {"o": torch.mean(n.mailbox["m"], dim=1)},
                                                 ndata={"h": d["h"]})["o"],
}


def rows_everywhere(monkeypatch) -> list[str]:
    """Make the cost rule pick ``rows`` for every plain sum, wide or not; the schedules launched."""
    monkeypatch.setattr(triton_executor, "prefers_rows", lambda *a: True)
    monkeypatch.setattr(triton_executor, "prefers_coo", lambda *a: False)
    return launched(monkeypatch)


def data(graph: gnnfuse.Graph, width: tuple[int, ...], device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)

    def r(*shape):
        return torch.randn(*shape, dtype=f64, generator=g).to(device).requires_grad_()
    return {"h": r(graph.num_nodes, *width), "norm": r(graph.num_nodes, 1), "w": r(graph.num_edges, 1),
            "p": r(graph.num_edge_types, *width)}


def run(layer: str, graph: gnnfuse.Graph, width: tuple[int, ...], backend: str, monkeypatch,
        tile: int | None = None) -> list[torch.Tensor]:
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = DEVICE if backend == "triton" else "cpu"
    graph, feeds = graph.to(device), data(graph, width, device)
    with forcing(ForcedSchedule(feature_tile=tile) if tile else None):
        out = LAYERS[layer](graph, feeds)
        weight = torch.linspace(-1, 1, out.numel(), dtype=f64, device=out.device).view_as(out)
        wrt = [feeds["h"]] + {"gcn": [feeds["norm"]], "weighted": [feeds["w"]], "typed": [feeds["p"]]}.get(layer, [])
        grads = torch.autograd.grad((out * weight).sum(), wrt)
    return [t.detach().cpu() for t in (out, *grads)]


@pytest.mark.parametrize("width,tile", [((3,), None), ((40,), None), ((40,), 16), ((2, 5), None)])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_wide_rows_equal_the_reference(layer, width, tile, monkeypatch):
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)    # the hubs split into 6 and 4 segments
    schedules = rows_everywhere(monkeypatch)
    graph = hub_graph()
    ours = run(layer, graph, width, "triton", monkeypatch, tile)
    theirs = run(layer, graph, width, "reference", monkeypatch)
    assert "rows" in schedules
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@settings(max_examples=8, deadline=None)
@given(case=graphs(max_nodes=12, max_edges=60))
def test_wide_rows_on_the_graphs_users_have(case):
    """Loops, multi-edges, isolated vertices, no edges, int32 or strided indices: a
    neighbour sum of width 5 equals index_add, forward and backward."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GNNFUSE_BACKEND", "triton")
        schedules = rows_everywhere(patch)
        check_neighbour_sum(case.to(DEVICE), 5)
        assert set(schedules) <= {"rows"}


def test_the_rule_gives_rows_only_to_plain_sums(monkeypatch):
    """Where `prefers_rows` says so, a plain wide sum takes rows from the walk and from
    COO; a sum re-reading a 32-wide row of its own vertex per edge keeps the walk."""
    monkeypatch.delenv("GNNFUSE_SCHEDULE", raising=False)
    monkeypatch.setattr(triton_executor, "prefers_rows", lambda degree, width: True)
    wide = _one_unit(lambda e: {"m": e.src["h"]}, {"h": torch.randn(12, 32, dtype=f64)})
    own = _one_unit(lambda e: {"m": e.src["h"] * e.dst["g"]},
                    {"h": torch.randn(12, 32, dtype=f64), "g": torch.randn(12, 32, dtype=f64)})
    assert plain_sum(wide)
    assert triton_executor.schedule_for(wide, 1000, 20_000) == "rows"
    assert triton_executor.schedule_for(wide, 1000, 2000) == "rows"
    assert triton_executor.schedule_for(own, 1000, 20_000) == "csr"
    monkeypatch.setattr(triton_executor, "prefers_rows", lambda degree, width: False)
    assert triton_executor.schedule_for(wide, 1000, 20_000) == "csr"
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    monkeypatch.setattr(triton_executor, "prefers_rows", lambda degree, width: True)
    assert triton_executor.schedule_for(wide, 1000, 20_000) == "csr"


def test_the_autotuning_space_keeps_each_step_within_the_tile():
    """Every config's step tile (BLOCK_R x K x BLOCK_F values) fits `ROWS_TILE` over four
    warps, a quarter of it over one; each width has configs of both."""
    assert {w for _, _, w in rows_space(1)} == {1, 4, 8}
    for width in (2, 7, 16, 40, 64, 256):
        block_f = min(triton.next_power_of_2(width), ROWS_WIDEST)
        space = rows_space(width)
        assert {w for _, _, w in space} == {1, 4}
        for r, k, w in space:
            assert r * k * block_f <= ROWS_TILE * w // 4


@pytest.mark.parametrize("degree,width,rows", [(6.9, 16, True), (6.9, 32, True), (6.9, 64, False),
                                               (25.3, 16, True), (25.3, 32, False), (99.6, 2, True),
                                               (99.6, 8, False)])
def test_the_rule_at_its_fitted_points(degree, width, rows):
    """`prefers_rows` on the measurements in its docstring: where rows won and where the
    walk or COO did (arxiv-, products- and Reddit2-sized average degrees)."""
    assert triton_executor.prefers_rows(degree, width) is rows


def test_a_forced_rows_schedule_applies_to_plain_sums_and_walks_the_rest(monkeypatch):
    """``GNNFUSE_SCHEDULE=rows`` (or a call's ``schedule="rows"``) runs every plain sum in
    rows, whatever the rule (one re-reading its own vertex's rows too: forced, not
    chosen); a max, and a sum with a fused addend row (SAGE's ``+ x W_r``), walk as csr."""
    from gnnfuse.frontend import trace_message_passing
    from gnnfuse.passes.fusion import AggregateUnit, partition
    from gnnfuse.runtime import CompiledProgram
    from gnnfuse.runtime.compiled import record_calls
    tracer = trace_message_passing(lambda e: {"m": e.src["h"]}, lambda n: {"out": torch.max(n.mailbox["m"], dim=1)[0]},
                                   None, ndata={"h": torch.randn(12, 8, dtype=f64)}, edata={})
    (peak,) = [u for u in partition(CompiledProgram(tracer.program).program) if isinstance(u, AggregateUnit)]
    wide = _one_unit(lambda e: {"m": e.src["h"]}, {"h": torch.randn(12, 128, dtype=f64)})
    own = _one_unit(lambda e: {"m": e.src["h"] * e.dst["g"]},
                    {"h": torch.randn(12, 32, dtype=f64), "g": torch.randn(12, 32, dtype=f64)})
    with record_calls() as calls:
        gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]) + v.h)(hub_graph(), {"h": torch.randn(12, 8, dtype=f64)})
    (added,) = [u for u in partition(calls[0].compiled.program, row_addends=True) if isinstance(u, AggregateUnit)]
    assert added.addend is not None and not plain_sum(added)
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "rows")
    assert triton_executor.schedule_for(wide, 1000, 200_000) == "rows"     # degree 200, width 128: a walk by rule
    assert plain_sum(own) and triton_executor.schedule_for(own, 1000, 200_000) == "rows"
    assert triton_executor.schedule_for(peak, 1000, 2000) == "csr"
    assert triton_executor.schedule_for(added, 1000, 2000) == "csr"
    monkeypatch.delenv("GNNFUSE_SCHEDULE")
    with forcing(ForcedSchedule(kind="rows")):
        assert triton_executor.schedule_for(wide, 1000, 200_000) == "rows"


def test_gspmm_runs_the_rows_schedule_it_is_given(monkeypatch):
    """`gnnfuse.ops.gspmm(schedule="rows")` on a width-128 sum (above the rule's 32 lanes,
    with a forced 256-lane tile cut to the kernel's 64): forward and backward equal the
    reference; a max refuses it by name."""
    from gnnfuse.ops import gspmm
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)
    schedules = launched(monkeypatch)
    graph = hub_graph().to(DEVICE)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(graph.num_nodes, 128, dtype=f64, generator=gen).to(DEVICE).requires_grad_()
    out = gspmm(graph, None, "sum", src=x, schedule=gnnfuse.ops.Schedule(kind="rows", feature_tile=256))
    src, dst = graph.src, graph.dst
    expected = torch.zeros_like(out).index_add_(0, dst, x.detach()[src])
    torch.testing.assert_close(out.detach(), expected, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(out.square().sum(), [x])
    torch.testing.assert_close(grad, torch.zeros_like(grad).index_add_(0, src, 2 * expected[dst]),
                               rtol=1e-12, atol=1e-12)
    assert schedules and set(schedules) == {"rows"}
    with pytest.raises(ValueError, match="schedule='rows'.*supports reduce 'sum' and 'mean' only"):
        gspmm(graph, None, "max", src=x, schedule="rows")
