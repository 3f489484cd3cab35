"""Sums by edge type riding a CSR walk (passes/type_sums.py): a per-type parameter's
gradient computed in the walk of the backward's aggregations, checked against the
reference backend under Triton's interpreter (or on the GPU), and the plans that put
it there."""
from __future__ import annotations

import pytest
import torch
from graph_strategies import graphs
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_check import device_for

import gnnfuse
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.passes.fusion import EdgeUnit
from gnnfuse.passes.siblings import SiblingGroup, fused_plan
from gnnfuse.passes.type_sums import TypeSumUnit

DEVICE = device_for("triton")


def typed_graph(types: int, seed: int = 0) -> gnnfuse.Graph:
    """60 edges with a hub (vertex 0 receives and sends 25), a self-loop, a repeated
    edge and a vertex without edges (7), each edge of one of ``types`` types."""
    g = torch.Generator().manual_seed(seed)
    src = torch.cat([torch.randint(1, 7, (25,), generator=g), torch.zeros(25, dtype=torch.long),
                     torch.tensor([3, 3, 4, 5, 2, 6, 1, 2, 5, 6])])
    dst = torch.cat([torch.zeros(25, dtype=torch.long), torch.randint(1, 7, (25,), generator=g),
                     torch.tensor([3, 4, 4, 1, 6, 2, 5, 5, 6, 1])])
    return gnnfuse.Graph(src, dst, 8, edge_type=torch.randint(0, types, (60,), generator=g), num_edge_types=types)


LAYER = gnnfuse.vertex(lambda v: sum([e.src.h * e.type.p for e in v.inedges]))


def run(backend: str, graph: gnnfuse.Graph, h0: torch.Tensor, p0: torch.Tensor, monkeypatch) -> list[torch.Tensor]:
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = DEVICE if backend == "triton" else "cpu"
    h, p = h0.detach().to(device).requires_grad_(), p0.detach().to(device).requires_grad_()
    out = LAYER(graph.to(device), {"h": h}, etype_feature={"p": p})
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * weight).sum().backward()
    return [t.detach().cpu() for t in (out, h.grad, p.grad)]


def record(monkeypatch) -> dict[str, int]:
    """Counts of group launches with riders aboard and of sums by type run on their own."""
    seen = {"riding": 0, "alone": 0}
    plan, alone = triton_executor._plan_siblings, triton_executor._run_type_sum

    def planned(group, *args):
        found = plan(group, *args)
        seen["riding"] += bool(group.riders) and found not in (None, triton_executor._WITHOUT_RIDERS)
        return found

    def by_itself(*args):
        seen["alone"] += 1
        return alone(*args)
    monkeypatch.setattr(triton_executor, "_plan_siblings", planned)
    monkeypatch.setattr(triton_executor, "_run_type_sum", by_itself)
    return seen


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("types, p_shape", [(3, (1,)), (4, (2,)), (1, (2,)), (8, (4,))])   # 8 x 4: a full tile
def test_a_type_sum_riding_the_walk_equals_the_reference(dtype, types, p_shape, monkeypatch):
    """The relation scalar's gradient (every edge summed into its type's row: HGT's
    ``p_rel``) computed by the reverse-CSR walk of the source rows' gradient, with the
    hub split into segments; p of one column is a feature sum per edge, of two a
    product per head."""
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 8)     # the hub's 25 edges: 4 segments
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    seen = record(monkeypatch)
    g = torch.Generator().manual_seed(types)
    graph = typed_graph(types)
    width = max(p_shape[-1], 2)
    h, p = torch.randn(8, width, generator=g, dtype=dtype), torch.randn((types,) + p_shape, generator=g, dtype=dtype)
    ours, theirs = run("triton", graph, h, p, monkeypatch), run("reference", graph, h, p, monkeypatch)
    assert seen == {"riding": 1, "alone": 0}
    tol = {"rtol": 1e-9, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **tol)


def test_too_many_types_for_a_tile_run_the_sum_on_its_own(monkeypatch):
    """40 types x 2 columns pad past a rider's 32-value tile: the walk runs without the
    rider and the sum runs as its edge unit and a reduce, with the same results."""
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    seen = record(monkeypatch)
    g = torch.Generator().manual_seed(5)
    graph = typed_graph(40)
    h, p = torch.randn(8, 2, generator=g, dtype=torch.float64), torch.randn(40, 2, generator=g, dtype=torch.float64)
    ours, theirs = run("triton", graph, h, p, monkeypatch), run("reference", graph, h, p, monkeypatch)
    assert seen == {"riding": 0, "alone": 1}
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_a_gradcheck_through_the_rider(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 8)
    seen = record(monkeypatch)
    g = torch.Generator().manual_seed(9)
    graph = typed_graph(3).to(DEVICE)
    h = torch.randn(8, 2, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    p = torch.randn(3, 2, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    # nondet_tol: split hub rows of the walk add their partial gradients atomically on a GPU
    assert torch.autograd.gradcheck(lambda h, p: LAYER(graph, {"h": h}, etype_feature={"p": p}), (h, p),
                                    nondet_tol=1e-12)
    assert seen["riding"] >= 1


def _hgt_backward_plan(tiled: bool) -> list:
    """The Triton plan of a small HGT layer's backward program."""
    from gnnfuse.runtime.compiled import record_calls
    torch.manual_seed(0)
    metadata = (["a", "b"], [("a", "r", "b"), ("b", "s", "a"), ("b", "t", "b")])
    layer = gnnfuse.nn.HGTConv(4, 8, metadata, heads=2)
    x = {"a": torch.randn(5, 4), "b": torch.randn(6, 4)}
    edges = {("a", "r", "b"): torch.tensor([[0, 1, 2, 4], [0, 1, 1, 5]]),
             ("b", "s", "a"): torch.tensor([[0, 2, 3], [1, 2, 4]]),
             ("b", "t", "b"): torch.tensor([[1, 2, 5], [0, 0, 3]])}
    with record_calls() as calls:
        sum(out.sum() for out in layer(x, edges).values()).backward()
    call = next(c for c in calls if c.wrt)
    return fused_plan(call.compiled.backward_for(call.wrt).program, [], tiled)


@pytest.mark.parametrize("tiled", [False, True])
def test_hgt_relation_prior_gradient_rides_a_walk(tiled):
    """HGT's ``p_rel`` gradient is a rider of a group walking the graph, and no edge
    unit writes its per-edge operand (with scores tiled, no edge unit at all)."""
    plan = _hgt_backward_plan(tiled)
    groups = [item for item in plan if isinstance(item, SiblingGroup) and item.riders]
    assert len(groups) == 1 and len(groups[0].riders) == 1
    rider = groups[0].riders[0]
    assert rider.reduce.attrs["by"] == "etype" and rider.operand.residency.name == "EDGE"
    assert not any(isinstance(item, TypeSumUnit) for item in plan)
    edge_roots = [item.root for item in plan if isinstance(item, EdgeUnit)]
    assert rider.operand not in edge_roots
    if tiled:
        assert edge_roots == []


def test_explain_says_the_sum_rides_the_walk(monkeypatch):
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    graph = typed_graph(3)
    h = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    p = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    text = str(gnnfuse.explain(lambda: LAYER(graph, {"h": h}, etype_feature={"p": p}).sum().backward()))
    assert "reduce[sum by etype" in text and "rides the src CSR walk" in text


@pytest.mark.parametrize("schedule", ["csr", "coo"])
@pytest.mark.parametrize("types", [3, 200])      # 200: the types kernels read are int32, not int8
def test_a_per_type_table_is_read_by_each_edge_type_in_the_kernels(schedule, types, monkeypatch):
    """``e.type.p`` joins the units' bodies (`passes.fusion.type_gather`): each kernel
    loads its edges' types in the order it walks them (CSR order for a walk, edge order
    for the edge-parallel schedule) and reads p's row for each; no [E, ...] gather of p
    is written. Outputs and gradients equal the reference backend's."""
    monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    loaded = []
    kernel_for = triton_executor._kernel_for
    monkeypatch.setattr(triton_executor, "_kernel_for",
                        lambda unit, *a: loaded.append(kernel_for(unit, *a)) or loaded[-1])
    g = torch.Generator().manual_seed(types)
    graph = typed_graph(types)
    h, p = torch.randn(8, 2, generator=g, dtype=torch.float64), torch.randn(types, 2, generator=g, dtype=torch.float64)
    ours, theirs = run("triton", graph, h, p, monkeypatch), run("reference", graph, h, p, monkeypatch)
    assert any(k.reads_types for k in loaded)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    explained = str(gnnfuse.explain(lambda: LAYER(graph, {"h": h}, etype_feature={"p": p})))
    assert "0 torch op(s)" in explained.split("--- forward plan")[1]
    assert "the row of its type" in explained


@pytest.mark.parametrize("types", [3, 200])
def test_kernels_read_types_in_the_order_they_walk(types):
    from gnnfuse.backend.triton.context import TritonGraphContext
    graph = typed_graph(types)
    ctx = TritonGraphContext(graph)
    for by in ("dst", "src", None):
        got = triton_executor.types_at(ctx, by)
        assert got.dtype == (torch.int8 if types <= 127 else torch.int32)
        order = torch.arange(graph.num_edges) if by is None else ctx.csr(by)[2].long()
        assert torch.equal(got.long(), graph.edge_type[order])


@settings(max_examples=8, deadline=None)
@given(graphs(max_nodes=10, max_edges=40, hub_degrees=st.sampled_from([0, 20])))
def test_riders_on_the_typed_graphs_users_have(case):
    """Loops, multi-edges, isolated vertices, a hub split into segments, no edges at all,
    int32 or strided indices: the relation scalar's gradient summed in the walk equals
    the reference backend's, as do the output and the source rows' gradient."""
    from graph_strategies import NUM_RELATIONS
    g = torch.Generator().manual_seed(case.num_nodes)
    h = torch.randn(case.num_nodes, 2, generator=g, dtype=torch.float64)
    p = torch.randn(NUM_RELATIONS, 2, generator=g, dtype=torch.float64)
    results = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GNNFUSE_SCHEDULE", "csr")
        patch.setattr(triton_executor, "SEGMENT_EDGES", 8)
        seen = record(patch)
        for backend in ("triton", "reference"):
            device = DEVICE if backend == "triton" else "cpu"
            on = case.to(device)
            graph = gnnfuse.Graph(on.given[0], on.given[1], case.num_nodes, edge_type=on.edge_type,
                                  num_edge_types=NUM_RELATIONS)
            results.append(run(backend, graph, h, p, patch))
    assert seen == {"riding": 1, "alone": 0}
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
