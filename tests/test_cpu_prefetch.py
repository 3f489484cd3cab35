"""Software prefetch in the CPU backend's kernels (codegen.PREFETCH_DISTANCE): the
aggregate walks and the edge kernel ask for the rows of the edge `PREFETCH_DISTANCE`
positions ahead, guarded so no index past the last edge is read, and setting the
distance to 0 generates kernels without it. A launch turns it off (``prefetch_end`` 0)
where the gathered table is below `schedule.PREFETCH_MIN_BYTES`. Values with prefetching
forced on are checked against the reference executor on a graph long enough that the
prefetching branch runs (most edges have an edge 8 positions later), forward and
backward, GAT's units gathering neighbour rows, per-edge rows and both endpoints."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

import gnnfuse  # noqa: E402
import zoo  # noqa: E402
from gnnfuse.backend.cpu import codegen, schedule  # noqa: E402
from gnnfuse.backend.cpu import executor as cpu_executor  # noqa: E402
from gnnfuse.passes.fusion import AggregateUnit, EdgeUnit  # noqa: E402
from test_cpu_backend import assert_same, launched  # noqa: E402,F401  (launched: the fixture)


def ring_graph() -> gnnfuse.Graph:
    """40 vertices, each with in-edges from its next three: 120 edges, so the walks and
    the edge kernel pass the prefetch guard on all but their last 8 edges."""
    dst = torch.arange(40).repeat_interleave(3)
    src = (dst + torch.tensor([1, 2, 3]).repeat(40)) % 40
    return gnnfuse.Graph(src, dst, 40)


@pytest.fixture
def prefetch_ends(monkeypatch):
    """The ``prefetch_end`` argument of every kernel launch planned (the last argument
    before the output: after the graph arrays, rowptr, col, eid for a walk, src, dst for
    an edge kernel)."""
    ends = []
    real = cpu_executor._plan

    def recording(*args):
        launch = real(*args)
        if launch.kernel is not None:
            ends.append(launch.head[-1])
        return launch
    monkeypatch.setattr(cpu_executor, "_plan", recording)
    return ends


def gat_model(graph, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=gen)
    p = zoo.params("gat", gen)

    def model(x, *values):
        return zoo.vertex_models(x, graph, dict(zip(p, values)))["gat"]()
    return model, [x, *p.values()]


def test_small_tables_launch_without_prefetching(prefetch_ends, monkeypatch):
    model, inputs = gat_model(ring_graph(), 5)
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    model(*[t.requires_grad_() for t in inputs]).sum().backward()
    assert prefetch_ends and set(prefetch_ends) == {0}
    assert not schedule.prefetch(schedule.PREFETCH_MIN_BYTES - 1) and schedule.prefetch(schedule.PREFETCH_MIN_BYTES)


def test_gat_kernels_prefetch_and_match_the_reference(launched, monkeypatch):
    monkeypatch.setattr(schedule, "PREFETCH_MIN_BYTES", 0)      # these tables are tiny: prefetch anyway
    graph = ring_graph()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=gen)
    p = zoo.params("gat", gen)

    def model(x, *values):
        return zoo.vertex_models(x, graph, dict(zip(p, values)))["gat"]()
    assert_same(model, [x, *p.values()], monkeypatch, rtol=1e-10, atol=1e-12)

    aggregates = [u for u in launched if isinstance(u, AggregateUnit)]
    edges = [u for u in launched if isinstance(u, EdgeUnit)]
    assert aggregates and edges
    walk = codegen.generate_aggregate(aggregates[0], "k", "float64", False, False, False)[0]
    distance = codegen.PREFETCH_DISTANCE
    assert distance > 0 and f"ahead = U(p) + U({distance})" in walk and "tl.prefetch(" in walk
    assert "if ahead < links:" in walk and "links = U(prefetch_end)" in walk
    edge = codegen.generate_edge(edges[0], "k", "float64", False)[0]
    assert f"ahead = edge + U({distance})" in edge and "tl.prefetch(" in edge

    monkeypatch.setattr(codegen, "PREFETCH_DISTANCE", 0)
    for unit in aggregates:
        assert "tl.prefetch" not in codegen.generate_aggregate(unit, "k", "float64", False, False, False)[0]
    for unit in edges:
        assert "tl.prefetch" not in codegen.generate_edge(unit, "k", "float64", False)[0]
