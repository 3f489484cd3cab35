"""A sum over long rows reads its neighbours through a copy of the CSR's column array
sorted within rows (`backend/triton/sorted_sources.py`): the copy holds the same
neighbours per row, in ascending order; the rows and scan kernels that follow only the
index take it on graphs whose rows are long on average, and give the reference
backend's results, forward and backward; a unit reading edge data, and a walk, keep
the edge-id order its edge ids pair with."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle_check import device_for

import gnnfuse
from gnnfuse.backend.reference import GraphContext
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.backend.triton import sorted_sources as sorting
from graph_strategies import graphs
from test_one_lane_schedules import check_neighbour_sum, hub_graph, launched, low_degree, run

DEVICE = device_for("triton")


def taken(monkeypatch) -> list[str]:
    """Which index (``by``) each kernel planned read through the sorted copy."""
    byes = []
    real = triton_executor.sorted_sources
    monkeypatch.setattr(triton_executor, "sorted_sources", lambda ctx, by: byes.append(by) or real(ctx, by))
    return byes


@pytest.mark.parametrize("by", ["dst", "src"])
@settings(max_examples=20, deadline=None)
@given(case=graphs(max_nodes=12, max_edges=60))
def test_the_sorted_copy_holds_each_rows_neighbours_in_ascending_order(by, case):
    graph = gnnfuse.Graph(case.given[0], case.given[1], case.num_nodes)
    ctx = GraphContext(graph)
    rowptr, col = ctx.grouped(by)
    ordered = sorting.sorted_sources(ctx, by)
    assert ordered.dtype == col.dtype and ordered.shape == col.shape
    for row in range(rowptr.numel() - 1):
        begin, end = int(rowptr[row]), int(rowptr[row + 1])
        assert ordered[begin:end].tolist() == sorted(col[begin:end].tolist())
    assert sorting.sorted_sources(ctx, by) is ordered     # built once per graph


def test_a_bipartite_block_sorts_by_the_other_sides_vertex_count():
    """Sources and destinations counted apart (a sampled block): the row-major key must
    use the other side's count, or rows with high-numbered neighbours would spill."""
    src, dst = torch.tensor([7, 2, 9, 0, 5, 9]), torch.tensor([1, 1, 0, 1, 0, 2])
    graph = gnnfuse.Graph(src, dst, 3, num_src_nodes=10)
    ctx = GraphContext(graph)
    assert sorting.sorted_sources(ctx, "dst").tolist() == [5, 9, 0, 2, 7, 9]
    assert sorting.sorted_sources(ctx, "src").tolist() == [1, 1, 0, 1, 0, 2]


def test_only_long_rows_on_average_take_the_copy(monkeypatch):
    graph = hub_graph()     # 154 edges over 12 vertices: degree 12.8
    ctx = GraphContext(graph)
    monkeypatch.setattr(sorting, "SORTED_SOURCES_MIN_DEGREE", 12.0)
    assert sorting.sorts_sources(ctx, "dst") and sorting.sorts_sources(ctx, "src")
    monkeypatch.setattr(sorting, "SORTED_SOURCES_MIN_DEGREE", 13.0)
    assert not sorting.sorts_sources(ctx, "dst")
    assert not sorting.sorts_sources(ctx, "etype")      # per-type sums have no neighbour order
    empty = GraphContext(gnnfuse.Graph(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 0))
    assert not sorting.sorts_sources(empty, "dst")


@pytest.mark.parametrize("schedule, width", [("rows", (1,)), ("rows", (3,)), ("scan", (1,))])   # a scan: one lane
def test_sums_through_the_sorted_copy_equal_the_reference(schedule, width, monkeypatch):
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)    # hubs split over segments too
    monkeypatch.setattr(sorting, "SORTED_SOURCES_MIN_DEGREE", 0.0)
    low_degree(monkeypatch, schedule)
    monkeypatch.setattr(triton_executor, "prefers_rows", lambda *a: True)
    schedules, byes = launched(monkeypatch), taken(monkeypatch)
    graph = hub_graph()
    ours = run("sum", graph.to(DEVICE), width, "triton", monkeypatch)
    theirs = run("sum", graph, width, "reference", monkeypatch)
    # rows widen past one lane by destination only where the rule would otherwise walk
    assert schedule in schedules and set(byes) == {"dst", "src"}
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("layer", ["weighted", "own scalar"])
def test_units_reading_edge_data_keep_the_edge_id_order(layer, monkeypatch):
    """An edge-weighted sum pairs each position's neighbour with its edge id's weight,
    so it keeps the CSR the edge ids index; a sum scaled at its own vertex follows the
    index only and takes the copy."""
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)
    monkeypatch.setattr(sorting, "SORTED_SOURCES_MIN_DEGREE", 0.0)
    low_degree(monkeypatch, "rows")
    byes = taken(monkeypatch)
    graph = hub_graph()
    ours = run(layer, graph.to(DEVICE), (1,), "triton", monkeypatch)
    theirs = run(layer, graph, (1,), "reference", monkeypatch)
    assert (byes == []) == (layer == "weighted")
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@settings(max_examples=8, deadline=None)
@given(case=graphs(max_nodes=12, max_edges=60))
def test_sums_through_the_sorted_copy_on_the_graphs_users_have(case):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GNNFUSE_BACKEND", "triton")
        patch.setattr(sorting, "SORTED_SOURCES_MIN_DEGREE", 0.0)
        low_degree(patch, "rows")
        check_neighbour_sum(case.to(DEVICE), 1)


@pytest.mark.parametrize("by", ["dst", "src"])
@settings(max_examples=15, deadline=None)
@given(case=graphs(max_nodes=12, max_edges=60, hub_degrees=st.integers(0, 30)), chunk=st.integers(1, 20))
def test_the_copy_built_in_chunks_of_rows_equals_one_sort(by, case, chunk):
    """A large graph's copy is sorted a chunk of whole rows at a time (a hub longer than
    a chunk is one of its own): the same array as one sort of every edge."""
    graph = gnnfuse.Graph(case.given[0], case.given[1], case.num_nodes)
    whole = sorting.sorted_sources(GraphContext(graph), by)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sorting, "SORT_CHUNK_EDGES", chunk)
        again = gnnfuse.Graph(case.given[0], case.given[1], case.num_nodes)
        assert torch.equal(sorting.sorted_sources(GraphContext(again), by), whole)
