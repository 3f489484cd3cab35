"""Split rows meeting in a workspace (`codegen._split_row_fixup`) instead of a zeroed output.

A hub row cut into segments used to have its output rows zeroed by a launch before the
kernel's, then each segment added into them atomically. Now each segment adds into the
row's slot of a per-plan workspace, counts itself, and the last to arrive stores the row
and leaves the slot and its counter at zero. These tests check, for the CSR walk and the
``rows`` schedule, sums that are scaled, averaged or carry an addend, at one and several
feature programs per row: every call matches the reference, the output is made by
``torch.empty`` with nothing zeroed, and the workspace is all zero after each call (a
slot left dirty would silently corrupt the next call). Hypothesis draws hub graphs and
segment lengths. On a GPU each stream gets its own workspace.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_check import device_for

import gnnfuse
from gnnfuse.backend.forced_schedule import ForcedSchedule, forcing
from gnnfuse.backend.triton import executor as triton_executor
from test_one_lane_schedules import hub_graph

DEVICE = device_for("triton")
f64 = torch.float64

LAYERS = {
    "sum": (gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs])),
            lambda g, d: torch.zeros_like(d["h"]).index_add_(0, g.dst, d["h"][g.src])),
    "gcn": (gnnfuse.vertex(lambda v: sum([u.h * u.norm for u in v.innbs]) * v.norm),
            lambda g, d: torch.zeros_like(d["h"]).index_add_(0, g.dst, d["h"][g.src] * d["norm"][g.src]) * d["norm"]),
    "addend": (gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]) + v.h),
               lambda g, d: torch.zeros_like(d["h"]).index_add_(0, g.dst, d["h"][g.src]) + d["h"]),
}


def _feeds(graph: gnnfuse.Graph, width: int, seed: int, dtype=f64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"h": torch.randn(graph.num_nodes, width, dtype=dtype, generator=g).to(DEVICE),
            "norm": torch.rand(graph.num_nodes, 1, dtype=dtype, generator=g).to(DEVICE) + 0.5}


def _plans(graph: gnnfuse.Graph) -> list:
    """The unit launch plans made on ``graph``."""
    found = []
    for per_graph in list(triton_executor._LAUNCHES._plans.values()):
        entry = per_graph.get(graph)
        if entry is not None and isinstance(entry[1], triton_executor._Launch):
            found.append(entry[1])
    return found


def _call(layer: str, graph: gnnfuse.Graph, feeds: dict[str, torch.Tensor]) -> None:
    fn, oracle = LAYERS[layer]
    out = fn(graph, {k: feeds[k] for k in ("h", "norm") if k == "h" or layer == "gcn"})
    tol = 1e-12 if feeds["h"].dtype == f64 else 1e-5
    torch.testing.assert_close(out, oracle(graph, feeds), rtol=tol, atol=tol)


@pytest.fixture
def switch():
    """Sets torch's determinism switch (``switch(on)``) for the test and restores it after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield torch.use_deterministic_algorithms
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.mark.parametrize("ordered", [False, True], ids=["as-finished", "ordered"])
@pytest.mark.parametrize("tile", [None, 16])
@pytest.mark.parametrize("width", [3, 40])
@pytest.mark.parametrize("layer,schedule", [(layer, schedule) for layer in LAYERS for schedule in ("csr", "rows")
                                            if (layer, schedule) != ("addend", "rows")])   # rows: plain sums only
def test_split_rows_meet_in_a_workspace_left_zero_after_every_call(layer, schedule, width, tile, ordered, switch,
                                                                   monkeypatch):
    """Ordered (``torch.use_deterministic_algorithms(True)``): a slot per segment, six."""
    switch(ordered)
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)     # vertex 0's 90 in-edges: 6 segments
    fills = []
    real = torch.Tensor.index_fill_
    monkeypatch.setattr(torch.Tensor, "index_fill_", lambda t, *args: fills.append(args) or real(t, *args))
    graph = hub_graph().to(DEVICE)
    with forcing(ForcedSchedule(feature_tile=tile) if tile else None), torch.no_grad():
        for seed in range(4):      # the plan's first launches, then its bound launch
            _call(layer, graph, _feeds(graph, width, seed))
            plans = [p for p in _plans(graph) if p.workspace is not None]
            assert plans, "no plan took a workspace for the split hub row"
            for plan in plans:
                rows, lanes, dtype, programs = plan.workspace
                assert not plan.zeros and plan.zero_rows is None
                assert (rows, lanes, dtype) == (6 if ordered else 1, width, f64)
                assert programs == -(-width // (tile or 128 if schedule == "csr" else tile or 64))
                for work, arrived in plan.workspaces.values():
                    assert work.shape == (rows, lanes) and arrived.numel() == rows * programs
                    assert not work.any() and not arrived.any(), "a run left its workspace dirty"
    assert not fills


def test_split_slots_number_each_split_rows_segments_and_put_them_first():
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.triton.schedule import segments, split_slots
    graph = hub_graph()
    segs, slots = segments(GraphContext(graph), "dst", 16), split_slots(GraphContext(graph), "dst", 16)
    assert segs.split_rows.tolist() == [0] and slots.segments.tolist() == [6]       # 90 edges, 16 a segment
    assert slots.split_segments == 6 and slots.slot[:6].tolist() == [0] * 6 and (slots.slot[6:] == -1).all()
    segs, slots = segments(GraphContext(graph), "src", 16), split_slots(GraphContext(graph), "src", 16)
    pieces = -(-int((graph.src == 1).sum()) // 16)
    assert segs.split_rows.tolist() == [1] and slots.segments.tolist() == [pieces] and slots.split_segments == pieces


def test_float32_outputs_sum_their_split_rows_in_the_accumulators_dtype(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)
    graph = hub_graph().to(DEVICE)
    for seed in range(3):
        _call("gcn", graph, _feeds(graph, 5, seed, torch.float32))
    (plan,) = [p for p in _plans(graph) if p.workspace is not None]
    assert plan.workspace[2] == torch.float32


def test_a_graph_without_split_rows_takes_no_workspace(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    graph = hub_graph().to(DEVICE)          # SEGMENT_EDGES = 512: no row is split
    for seed in range(3):
        _call("gcn", graph, _feeds(graph, 3, seed))
    plans = _plans(graph)
    assert plans and all(p.workspace is None and not p.zeros and p.zero_rows is None for p in plans)


def test_gradients_through_split_rows_match_the_reference(monkeypatch):
    """The backward's sums over the reverse CSR split vertex 1's 60 out-edges too."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)
    graph = hub_graph().to(DEVICE)
    fn, oracle = LAYERS["gcn"]
    for seed in range(3):
        feeds = {k: t.requires_grad_() for k, t in _feeds(graph, 4, seed).items()}
        weight = torch.linspace(-1, 1, graph.num_nodes * 4, dtype=f64, device=DEVICE).view(-1, 4)
        ours = torch.autograd.grad((fn(graph, feeds) * weight).sum(), (feeds["h"], feeds["norm"]))
        theirs = torch.autograd.grad((oracle(graph, feeds) * weight).sum(), (feeds["h"], feeds["norm"]))
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(hub=st.integers(1, 120), segment=st.sampled_from([2, 3, 8, 16]), width=st.sampled_from([1, 2, 7]),
       schedule=st.sampled_from(["csr", "rows"]), seed=st.integers(0, 2**16), ordered=st.booleans())
def test_drawn_hub_graphs_match_on_repeated_calls(hub, segment, width, schedule, seed, ordered):
    mp = pytest.MonkeyPatch()
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(ordered)
        mp.setenv("GNNFUSE_BACKEND", "triton")
        mp.setenv("GNNFUSE_SCHEDULE", schedule)
        mp.setattr(triton_executor, "SEGMENT_EDGES", segment)
        g = torch.Generator().manual_seed(seed)
        nodes = 9
        src = torch.randint(0, nodes, (hub + 20,), generator=g)
        dst = torch.cat([torch.full((hub,), 2, dtype=torch.long), torch.randint(0, nodes, (20,), generator=g)])
        graph = gnnfuse.Graph(src, dst, nodes).to(DEVICE)
        for call in range(3):
            _call("sum", graph, _feeds(graph, width, seed + call))
        for plan in _plans(graph):
            for work, arrived in (plan.workspaces or {}).values():
                assert not work.any() and not arrived.any()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        mp.undo()


@pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="streams: a GPU's")
def test_each_stream_gets_its_own_workspace(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)
    graph = hub_graph().to(DEVICE)
    for seed in range(3):
        _call("sum", graph, _feeds(graph, 3, seed))
    streams = [torch.cuda.Stream() for _ in range(triton_executor._MOST_WORKSPACES + 1)]
    for n, stream in enumerate(streams):
        with torch.cuda.stream(stream):
            _call("sum", graph, _feeds(graph, 3, 10 + n))
        stream.synchronize()
    (plan,) = [p for p in _plans(graph) if p.workspace is not None]
    assert len(plan.workspaces) == triton_executor._MOST_WORKSPACES        # the oldest dropped
    assert streams[-1].cuda_stream in plan.workspaces and streams[0].cuda_stream not in plan.workspaces
    assert len({id(w) for w, _ in plan.workspaces.values()}) == len(plan.workspaces)


def test_stand_ins_for_an_unsplit_graph_have_the_workspaces_dtypes(monkeypatch):
    """A graph with no split row passes one-element stand-ins where the workspace and its
    counters go, of their dtypes: the kernel is specialized on its arguments' types, and
    the same kernel then serves graphs with and without split rows."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    for segment, graph in ((512, hub_graph().to(DEVICE)), (16, hub_graph().to(DEVICE))):
        monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", segment)
        _call("sum", graph, _feeds(graph, 3, 0))
        (plan,) = _plans(graph)
        if plan.workspace is None:
            assert [(t.dtype, t.numel()) for t in plan.after] == [(f64, 1), (torch.int32, 1)]
            unsplit = plan.signature
        else:
            assert plan.after == () and plan.signature == unsplit
