"""The schedules of a sum or mean of one lane per row: ``rows`` (`codegen.generate_rows`,
many segments side by side per program, where the cost rule leaves the unit to a walk)
and ``scan`` (`codegen.generate_scan`, blocks of CSR-ordered edges summed per row by a
segmented scan, where it would be COO), against the reference backend (under Triton's
interpreter, or on the GPU) on the graphs that break such kernels: a hub split into
segments or spanning many blocks (its partial sums added atomically), isolated vertices,
self loops, multi-edges, no edges; with edge data, per-type data and a scalar read at
the row's own vertex."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from oracle_check import device_for

import gnnfuse
from gnnfuse.backend.triton import executor as triton_executor
from graph_strategies import graphs

DEVICE = device_for("triton")
f64 = torch.float64


def hub_graph(types: int = 3) -> gnnfuse.Graph:
    """Vertex 0 receives 90 edges and vertex 1 sends 60 (each over the 16-edge segments
    the tests set), self loops on 3 and 5, a doubled edge, 10 and 11 isolated."""
    g = torch.Generator().manual_seed(3)
    src = torch.cat([torch.randint(1, 10, (90,), generator=g), torch.ones(60, dtype=torch.long),
                     torch.tensor([3, 5, 2, 2])])
    dst = torch.cat([torch.zeros(90, dtype=torch.long), torch.randint(2, 10, (60,), generator=g),
                     torch.tensor([3, 5, 4, 4])])
    return gnnfuse.Graph(src, dst, 12, edge_type=torch.randint(0, types, (154,), generator=g), num_edge_types=types)


LAYERS = {
    "sum": gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs])),
    "weighted": gnnfuse.vertex(lambda v: sum([e.src.h * e.w for e in v.inedges])),
    "typed": gnnfuse.vertex(lambda v: sum([e.src.h * e.type.p for e in v.inedges])),
    "own scalar": gnnfuse.vertex(lambda v: sum([e.src.h * v.c for e in v.inedges])),
}


def feeds(graph: gnnfuse.Graph, width: tuple[int, ...], device: str) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)

    def r(*shape):
        return torch.randn(*shape, dtype=f64, generator=g).to(device).requires_grad_()
    return {"v": {"h": r(graph.num_nodes, *width), "c": r(graph.num_nodes, *width)},
            "e": {"w": r(graph.num_edges, *width)}, "t": {"p": r(graph.num_edge_types or 1, *width)}}


def run(layer: str, graph: gnnfuse.Graph, width: tuple[int, ...], backend: str, monkeypatch) -> list[torch.Tensor]:
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = DEVICE if backend == "triton" else "cpu"
    graph, data = graph.to(device), feeds(graph, width, device)
    fn = LAYERS[layer]
    names = {"sum": ("v",), "weighted": ("e",), "typed": ("t",), "own scalar": ("v",)}[layer]
    vertex = {"h": data["v"]["h"], **({"c": data["v"]["c"]} if layer == "own scalar" else {})}
    kwargs = {"etype_feature": data["t"]} if layer == "typed" else {}
    out = fn(graph, vertex, data["e"] if layer == "weighted" else None, **kwargs)
    wrt = [data["v"]["h"]] + [t for n in names for k, t in data[n].items() if n != "v" or k == "c" and layer == "own scalar"]
    weight = torch.linspace(-1, 1, out.numel(), dtype=f64, device=out.device).view_as(out)
    return [t.detach().cpu() for t in (out, *torch.autograd.grad((out * weight).sum(), wrt))]


def launched(monkeypatch) -> list[str]:
    names = []
    kernel_for = triton_executor._kernel_for
    monkeypatch.setattr(triton_executor, "_kernel_for",
                        lambda unit, acc, schedule: names.append(schedule) or kernel_for(unit, acc, schedule))
    return names


def low_degree(monkeypatch, schedule: str) -> None:
    """Make the cost rule see the test graphs as COO's (``scan``) or a walk's (``rows``)."""
    monkeypatch.setattr(triton_executor, "prefers_coo", lambda *a: schedule == "scan")


@pytest.mark.parametrize("schedule", ["rows", "scan"])
@pytest.mark.parametrize("width", [(1,), ()])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_one_lane_sums_equal_the_reference(layer, width, schedule, monkeypatch):
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)    # the walk's hubs split into 6 and 4 segments
    low_degree(monkeypatch, schedule)
    schedules = launched(monkeypatch)
    graph = hub_graph()
    ours, theirs = run(layer, graph, width, "triton", monkeypatch), run(layer, graph, width, "reference", monkeypatch)
    # the forward's sum by dst and the backward's by src; in a walk p's gradient rides the
    # backward's (one kernel), a scan's group runs member by member and p's gradient alone.
    # The interpreter's 16-edge scan blocks cut the 90- and 60-edge hubs across 6 and 4 of them
    assert schedules.count(schedule) >= (1 if layer == "typed" and schedule == "rows" else 2)
    assert ("siblings" in schedules) == (layer == "typed" and schedule == "rows")
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("schedule", ["rows", "scan"])
def test_a_mean_of_one_lane_divides_by_the_degree(schedule, monkeypatch):
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)
    low_degree(monkeypatch, schedule)
    schedules = launched(monkeypatch)
    graph = hub_graph()
    h = torch.randn(graph.num_nodes, 1, dtype=f64)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        x = h.clone().to(DEVICE if backend == "triton" else "cpu").requires_grad_()
        out = gnnfuse.message_passing(graph.to(x.device), lambda e: {"m": e.src["h"]},
                                      lambda n: {"o": torch.mean(n.mailbox["m"], dim=1)}, ndata={"h": x})["o"]
        results.append([t.detach().cpu() for t in (out, *torch.autograd.grad(out.square().sum(), [x]))])
    assert schedule in schedules
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def _one_unit(message, ndata):
    from gnnfuse.frontend import trace_message_passing
    from gnnfuse.passes.fusion import AggregateUnit, partition
    from gnnfuse.runtime import CompiledProgram
    tracer = trace_message_passing(message, lambda n: {"out": torch.sum(n.mailbox["m"], dim=1)}, None,
                                   ndata=ndata, edata={})
    (unit,) = [u for u in partition(CompiledProgram(tracer.program).program, tile_feature_sums=True)
               if isinstance(u, AggregateUnit)]
    return unit


def test_a_wide_row_read_at_the_own_vertex_keeps_the_walk(monkeypatch):
    """One lane reduced, but a 64-wide row of the row's own vertex read per edge (GAT's
    backward): rows or a scan would re-read it per edge, so the CSR walk (or COO) runs; a
    narrow one takes rows where the cost rule says walk and a scan where it says COO; a
    forced schedule wins over both."""
    wide = _one_unit(lambda e: {"m": (e.src["h"] * e.dst["g"]).sum(-1, keepdim=True)},
                     {"h": torch.randn(12, 64, dtype=f64), "g": torch.randn(12, 64, dtype=f64)})
    narrow = _one_unit(lambda e: {"m": e.src["h"]}, {"h": torch.randn(12, 1, dtype=f64)})
    monkeypatch.delenv("GNNFUSE_SCHEDULE", raising=False)
    assert triton_executor.schedule_for(wide, 1000, 20_000) == "csr"
    assert triton_executor.schedule_for(wide, 1000, 2000) == "coo"
    assert triton_executor.schedule_for(narrow, 1000, 20_000) == "rows"
    assert triton_executor.schedule_for(narrow, 1000, 6000) == "scan"     # low degree: where COO was
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    assert triton_executor.schedule_for(narrow, 1000, 20_000) == "csr"
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    assert triton_executor.schedule_for(narrow, 1000, 20_000) == "coo"


@pytest.mark.parametrize("schedule", ["rows", "scan"])
@settings(max_examples=8, deadline=None)
@given(case=graphs(max_nodes=12, max_edges=60))
def test_one_lane_schedules_on_the_graphs_users_have(schedule, case):
    """Loops, multi-edges, isolated vertices, no edges at all, int32 or strided indices:
    the one-lane neighbour sum equals index_add, forward and backward."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GNNFUSE_BACKEND", "triton")
        low_degree(patch, schedule)
        schedules = launched(patch)
        check_neighbour_sum(case.to(DEVICE), 1)
        assert set(schedules) == {schedule}


def check_neighbour_sum(case, width: int) -> None:
    """The neighbour sum of a drawn graph (`graph_strategies.graphs`, on the Triton
    backend's device) at ``width`` equals index_add, forward and backward."""
    graph = gnnfuse.Graph(case.given[0], case.given[1], case.num_nodes)
    h = torch.randn(case.num_nodes, width, dtype=f64, device=DEVICE, requires_grad=True)
    out = LAYERS["sum"](graph, {"h": h})
    src, dst = case.edge_index
    expected = torch.zeros_like(out).index_add_(0, dst, h.detach()[src])
    torch.testing.assert_close(out.detach(), expected, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(out.sum(), [h])
    torch.testing.assert_close(grad, torch.zeros_like(grad).index_add_(0, src, torch.ones_like(h)[dst]),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("nodes", [12, 1000])
def test_a_scan_adds_into_the_output_its_last_run_zeroed(nodes, monkeypatch):
    """A scan's output is the one its previous run's kernel zeroed (`executor._carried_outputs`):
    the next output is handed over filled with NaN here, so a kernel that did not zero
    all of it (1000 rows: each program zeroes a share of many blocks) would put NaN in
    the next call's sums. Forward (a repeated inference call) and backward, the caller
    writing into its results in between."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    low_degree(monkeypatch, "scan")
    pairs = []
    carried = triton_executor._carried_outputs

    def spy(plan, stream):
        out, following = carried(plan, stream)
        pairs.append((out, following.fill_(float("nan"))))
        return out, following
    monkeypatch.setattr(triton_executor, "_carried_outputs", spy)
    hub = hub_graph()
    graph = gnnfuse.Graph(hub.src, hub.dst, nodes).to(DEVICE)
    g = torch.Generator().manual_seed(5)
    for grad in (False, False, False, True, True):
        h = torch.randn(nodes, 1, dtype=f64, generator=g).to(DEVICE).requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            out = LAYERS["sum"](graph, {"h": h})
        expected = torch.zeros_like(h).index_add_(0, graph.dst, h.detach()[graph.src])
        torch.testing.assert_close(out.detach(), expected, rtol=1e-12, atol=1e-12)
        if grad:
            (grad_h,) = torch.autograd.grad(out, [h], torch.ones_like(out))
            torch.testing.assert_close(grad_h, torch.zeros_like(h).index_add_(0, graph.src, torch.ones_like(h)[graph.dst]),
                                       rtol=1e-12, atol=1e-12)
        out.detach().fill_(7.0)
    # the three inference calls: each one's output is the one the last handed over
    assert len(pairs) >= 7 and pairs[1][0] is pairs[0][1] and pairs[2][0] is pairs[1][1]


def test_a_scan_whose_launch_raised_keeps_no_output(monkeypatch):
    """A scan's next output is kept only once its kernel (which zeroes it) has been
    launched (`executor._keep_carried`): after a launch that raised, the next call makes
    zeros, not an output nothing zeroed. Each next output is handed over filled with NaN,
    so one kept after the failed launch would put NaN in the following sums."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    low_degree(monkeypatch, "scan")
    carried, launch = triton_executor._carried_outputs, triton_executor._launch_bound
    failing = [False]

    def spy(plan, stream):
        out, following = carried(plan, stream)
        return out, following.fill_(float("nan"))

    def flaky(plan, args, *made):
        if failing[0]:
            raise RuntimeError("launch failed")
        return launch(plan, args, *made)
    monkeypatch.setattr(triton_executor, "_carried_outputs", spy)
    monkeypatch.setattr(triton_executor, "_launch_bound", flaky)
    monkeypatch.setattr(triton_executor, "_BIND_ATTEMPTS", 0)      # every launch through `_launch_bound`
    hub = hub_graph()
    graph = gnnfuse.Graph(hub.src, hub.dst, 40).to(DEVICE)
    g = torch.Generator().manual_seed(11)
    for call in range(6):
        h = torch.randn(40, 1, dtype=f64, generator=g).to(DEVICE)
        failing[0] = call == 3
        if call == 3:
            with pytest.raises(RuntimeError, match="launch failed"):
                LAYERS["sum"](graph, {"h": h})
            continue
        out = LAYERS["sum"](graph, {"h": h})
        expected = torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src])
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and streams need a GPU")
def test_gpu_a_scan_captured_or_on_two_streams_adds_into_zeros(monkeypatch):
    """Under a CUDA graph capture a scan takes no carried output (the graph would add into
    the same memory on every replay); on two streams each keeps its own (a stream orders
    the zeroing kernel before the one adding into its output). Replays and alternating
    streams give index_add's sums every time."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    low_degree(monkeypatch, "scan")
    schedules = launched(monkeypatch)
    hub = hub_graph()
    graph = gnnfuse.Graph(hub.src, hub.dst, 1000).to("cuda")
    g = torch.Generator().manual_seed(7)

    def expected(h):
        return torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src])
    static = torch.randn(1000, 1, dtype=f64, generator=g).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            LAYERS["sum"](graph, {"h": static})
    torch.cuda.current_stream().wait_stream(side)
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        out = LAYERS["sum"](graph, {"h": static})
    for _ in range(3):
        static.copy_(torch.randn(1000, 1, dtype=f64, generator=g))
        captured.replay()
        torch.testing.assert_close(out, expected(static), rtol=1e-12, atol=1e-12)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for n in range(6):
        h = torch.randn(1000, 1, dtype=f64, generator=g).cuda()
        streams[n % 2].wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(streams[n % 2]):
            result = LAYERS["sum"](graph, {"h": h})
        torch.cuda.synchronize()
        torch.testing.assert_close(result, expected(h), rtol=1e-12, atol=1e-12)
    assert "scan" in schedules
