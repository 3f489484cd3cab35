"""Graphs with distinct source and destination vertex sets (PyG's ``size=(num_src,
num_dst)``): the graph's layouts, and vertex functions and message/reduce UDFs compiled
on one, against plain torch (gather, index_add, scatter_reduce) in float64, forward and
backward, on the reference backend and the Triton kernels (on device_for(backend):
CUDA on a GPU machine, Triton's CPU interpreter elsewhere)."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import gnnfuse
from gnnfuse import CompileError, frontend
from gnnfuse.graph import Graph
from layer_check import assert_same_values

# 6 sources, 4 destinations: destination 3 has no in-edges, sources 3 and 5 no out-edges.
NUM_SRC, NUM_DST = 6, 4
SRC = torch.tensor([0, 1, 4, 4, 2, 1, 0, 2])
DST = torch.tensor([0, 0, 1, 0, 2, 1, 2, 2])


def bipartite(device: str = "cpu") -> Graph:
    return Graph(SRC, DST, NUM_DST, num_src_nodes=NUM_SRC).to(device)


def test_layouts_have_one_row_per_vertex_of_their_side():
    g = bipartite()
    assert g.is_bipartite and (g.num_src_nodes, g.num_dst_nodes, g.num_nodes) == (NUM_SRC, NUM_DST, NUM_DST)
    assert g.csr().rowptr.tolist() == [0, 3, 5, 8, 8]
    assert g.reverse_csr().rowptr.tolist() == [0, 2, 4, 6, 6, 8, 8]
    assert g.in_degrees().tolist() == [3, 2, 3, 0]
    assert g.out_degrees().tolist() == [2, 2, 2, 0, 2, 0]
    assert g.to_scipy().shape == (NUM_SRC, NUM_DST)
    flipped = g.reverse()
    assert (flipped.num_src_nodes, flipped.num_nodes) == (NUM_DST, NUM_SRC)
    assert Graph.bipartite(SRC, DST, NUM_SRC, NUM_DST).num_src_nodes == NUM_SRC
    assert not Graph(SRC, DST).is_bipartite and Graph(SRC, DST).num_src_nodes == 5


def test_ids_are_checked_against_their_own_side():
    with pytest.raises(ValueError, match="src has id 4 .* num_src_nodes=4"):
        Graph(SRC, DST, NUM_DST, num_src_nodes=4)
    with pytest.raises(ValueError, match="dst has id 2 .* num_nodes=2"):
        Graph(SRC, DST, 2, num_src_nodes=NUM_SRC)
    with pytest.raises(ValueError, match="to_undirected needs one vertex set"):
        bipartite().to_undirected()


def test_self_loops_join_source_i_to_destination_i_below_both_counts():
    """PyG's attention layers on bipartite input: add_self_loops(num_nodes=min(size))."""
    looped = bipartite().add_self_loops()
    assert looped.src[-NUM_DST:].tolist() == looped.dst[-NUM_DST:].tolist() == list(range(NUM_DST))
    assert looped.num_src_nodes == NUM_SRC


def test_self_loops_with_fewer_sources_than_destinations_stop_at_the_sources():
    """With more destinations than sources the loops stop at the last source, as PyG's
    ``add_self_loops(num_nodes=(3, 5))`` does; counted by destinations, loops 3 -> 3 and
    4 -> 4 named sources the graph does not have."""
    from torch_geometric.utils import add_self_loops
    ei = torch.tensor([[0, 2, 1], [4, 0, 3]])
    looped = Graph.bipartite(ei[0], ei[1], 3, 5).add_self_loops()
    assert looped.edge_index.tolist() == add_self_loops(ei, num_nodes=(3, 5))[0].tolist()


@pytest.fixture
def schedule(request, monkeypatch):
    """GNNFUSE_SCHEDULE for a Triton case (None: the backend's own choice)."""
    if request.param:
        monkeypatch.setenv("GNNFUSE_SCHEDULE", request.param)
    return request.param


def on_each_backend(test):
    """The shared ``backend`` fixture (conftest), its Triton cases under both schedules:
    ids reference, triton-csr and triton-coo. Tensors go on the ``device`` fixture."""
    cases = [pytest.param("reference", None, id="reference"),
             pytest.param("triton", "csr", id="triton-csr"),
             pytest.param("triton", "coo", id="triton-coo")]
    test = pytest.mark.parametrize("backend, schedule", cases, indirect=True)(test)
    return pytest.mark.usefixtures("schedule")(test)


def tables(device: str = "cpu"):
    """Drawn on the CPU (one stream for every device), then moved: leaves on ``device``."""
    torch.manual_seed(0)
    hs = torch.randn(NUM_SRC, 3, dtype=torch.float64).to(device).requires_grad_()
    hd = torch.randn(NUM_DST, 3, dtype=torch.float64).to(device).requires_grad_()
    return hs, hd


def check(ours: torch.Tensor, expected: torch.Tensor, leaves) -> None:
    assert ours.shape == expected.shape
    assert_same_values(ours, expected, "output")
    cotangent = torch.randn(expected.shape, dtype=expected.dtype).to(expected.device)
    got = torch.autograd.grad(ours, leaves, cotangent)
    want = torch.autograd.grad(expected, leaves, cotangent)
    for name, a, b in zip(("source table", "destination table"), got, want):
        assert a.shape == b.shape
        assert_same_values(a, b, f"gradient of the {name}")


def per_destination(values: torch.Tensor, reduce: str) -> torch.Tensor:
    out = values.new_zeros((NUM_DST,) + values.shape[1:])
    index = DST.to(values.device).view(-1, 1).expand_as(values)
    return out.scatter_reduce(0, index, values, reduce, include_self=False)


@on_each_backend
def test_vertex_function_reads_sources_and_destinations_from_their_own_tables(device):
    hs, hd = tables(device)
    src, dst = SRC.to(device), DST.to(device)

    def fn(v):
        total = sum([torch.tanh(u.hs) * v.hd for u in v.innbs])
        return v.hd * total + max([u.hs for u in v.innbs]) + total / len(v.innbs)

    out = frontend.VertexFunction(fn)(bipartite(device), {"hs": hs, "hd": hd})
    total = per_destination(torch.tanh(hs[src]) * hd[dst], "sum")
    degree = torch.bincount(dst, minlength=NUM_DST).clamp(min=1).unsqueeze(-1)
    expected = hd * total + per_destination(hs[src], "amax") + total / degree
    check(out, expected, (hs, hd))


@on_each_backend
def test_message_passing_on_a_bipartite_graph(device):
    hs, hd = tables(device)
    src, dst = SRC.to(device), DST.to(device)

    def message(edges):
        return {"m": F.relu(edges.src["hs"] - edges.dst["hd"])}

    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1) * nodes.data["hd"]}

    out = frontend.message_passing(bipartite(device), message, reduce, ndata={"hs": hs, "hd": hd})["out"]
    expected = per_destination(F.relu(hs[src] - hd[dst]), "sum") * hd
    expected = expected * (torch.bincount(dst, minlength=NUM_DST) > 0).unsqueeze(-1)  # DGL: no reduce without in-edges
    check(out, expected, (hs, hd))


def test_a_table_read_as_both_sides_of_unequal_sets_is_refused():
    hs, _ = tables()
    with pytest.raises(CompileError, match="input 'hs' .* both as a source-side table .* 6 sources and 4 destinations"):
        frontend.VertexFunction(lambda v: sum([u.hs for u in v.innbs]) + v.hs)(bipartite(), {"hs": hs})


def test_a_table_of_the_wrong_side_has_its_rows_checked():
    hs, hd = tables()
    with pytest.raises(ValueError, match=r"input 'hs' \(NODE\) should have shape \[6, 3\], got \[4, 3\]"):
        frontend.VertexFunction(lambda v: sum([u.hs for u in v.innbs]))(bipartite(), {"hs": hd})


def test_explain_sizes_a_reduce_by_src_by_the_source_set(monkeypatch):
    """The gradient of a source table is a reduce by src: the executor writes one row per
    source and picks its schedule by the source set's average degree; explain must say
    the same (it counted destinations: 1 row here, and a walk's schedule)."""
    pytest.importorskip("triton")
    num_src = 20
    graph = Graph(torch.arange(num_src), torch.zeros(num_src, dtype=torch.long), 1, num_src_nodes=num_src)
    hs = torch.randn(num_src, 4, requires_grad=True)

    def run():
        return frontend.VertexFunction(lambda v: sum([u.hs for u in v.innbs]))(graph, {"hs": hs})

    def backward_unit():
        (program,) = gnnfuse.explain(run).programs
        (step,) = [s for s in program.backward.steps if s.fused]
        return step

    assert "[coo schedule on CUDA]" in backward_unit().label      # average out-degree 1, as the executor sees it
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    assert backward_unit().traffic.writes == num_src * 4 * 4


@pytest.mark.parametrize("dst, count, said", [
    ([0, 1], 1, "dst has id 1 at position 1, but num_dst_nodes=1"),
    ([0, 0], -1, "num_dst_nodes must be >= 0, got -1"),
])
def test_a_destination_count_refused_by_bipartite_is_named_as_given(dst, count, said):
    """``Graph.bipartite(src, dst, 2, 1)`` with a destination id of 1 named ``num_nodes``,
    the constructor's name for the count the caller passed as ``num_dst_nodes``."""
    with pytest.raises(ValueError, match=re.escape(said)):
        Graph.bipartite(torch.tensor([0, 1]), torch.tensor(dst), 2, count)
