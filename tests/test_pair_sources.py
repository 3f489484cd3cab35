"""Programs that read their sources through relation matrices run on the graph of
(source, relation) pairs (passes/pair_sources.py): the same outputs and gradients as the
per-edge compact form (``GNNFUSE_PAIR_SOURCES=0``) on both backends, in float64, with a
plain source table lifted onto the pairs beside the products; and the programs whose
meaning would change left as compiled."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from test_pair_graph import typed_graphs

import gnnfuse
from gnnfuse.frontend import trace_message_passing
from gnnfuse.ir import Program, Residency
from gnnfuse.passes import optimize
from gnnfuse.passes.pair_sources import rewrite_for_source_pairs
from gnnfuse.runtime.compiled import PAIR_SOURCES_ENV

f64 = torch.float64
N, RELATIONS, F_IN, F_OUT = 9, 3, 4, 6


def typed_graph(device: str) -> gnnfuse.Graph:
    """Multi-edges, a self loop, a source with edges of two relations, an isolated vertex
    (8) and a relation without edges (2)."""
    src = torch.tensor([0, 0, 0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 0, 3])
    dst = torch.tensor([1, 2, 1, 0, 3, 3, 4, 5, 6, 5, 7, 0, 7, 1])
    types = torch.tensor([0, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0])
    return gnnfuse.Graph(src, dst, N, edge_type=types, num_edge_types=RELATIONS).to(device)


@gnnfuse.vertex
def attention(v):
    """HGT's attention with a plain source table ``g`` read beside the transformed keys
    and values, and a per-edge weight."""
    scores = [((e.src.k @ e.type.wk) * v.q).sum(-1) * e.type.p + e.w for e in v.inedges]
    peak = max(scores)
    weights = [torch.exp(s - peak) for s in scores]
    total = sum(weights)
    return sum([(weights[i] / total).unsqueeze(-1) * (e.src.v @ e.type.wv + e.src.g) for i, e in enumerate(v.inedges)])


def _inputs(device: str) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(4)

    def r(*shape):
        return torch.randn(*shape, dtype=f64, generator=g).to(device).requires_grad_()
    return {"v": {"k": r(N, F_IN), "q": r(N, F_OUT), "v": r(N, F_IN), "g": r(N, F_OUT)},
            "e": {"w": r(14)},
            "t": {"wk": r(RELATIONS, F_IN, F_OUT), "wv": r(RELATIONS, F_IN, F_OUT), "p": r(RELATIONS)}}


def _run(graph, inputs):
    out = attention(graph, inputs["v"], inputs["e"], etype_feature=inputs["t"])
    leaves = [t for group in inputs.values() for t in group.values()]
    weight = torch.linspace(-1, 1, out.numel(), dtype=f64, device=out.device).view_as(out)
    return [out.detach(), *torch.autograd.grad((out * weight).sum(), leaves)]


def test_pair_graph_form_matches_the_per_edge_form(backend, device, monkeypatch):
    graph, inputs = typed_graph(device), _inputs(device)
    report = gnnfuse.explain(lambda: attention(graph, inputs["v"], inputs["e"], etype_feature=inputs["t"]))
    (program,) = report.programs
    assert {"pair:k@etype.wk", "pair:v@etype.wv", "g"} <= set(program.forward.program.inputs)
    assert "compact_typed_matmul" not in {v.op for v in program.forward.program.values}
    text = str(report)
    assert "(source, relation) pairs" in text
    assert "sources and N=9 destinations" in text
    on_pairs = _run(graph, inputs)
    monkeypatch.setenv(PAIR_SOURCES_ENV, "0")
    per_edge = _run(graph, inputs)
    for got, want in zip(on_pairs, per_edge):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def _program(message, reduce):
    graph_feeds = ({"h": torch.randn(N, F_IN, dtype=f64)}, None, {"W": torch.randn(RELATIONS, F_IN, F_OUT, dtype=f64)})
    return optimize(trace_message_passing(message, reduce, None, *graph_feeds).program)


def _mean(nodes):
    return {"o": nodes.mailbox["m"].mean(1)}


def _max(nodes):      # not linear: the typed-aggregation rewrite leaves the products alone
    return {"o": torch.max(nodes.mailbox["m"], dim=1)[0]}


LEFT_ALONE = {
    # a destination's own row times the relation matrix: pairs of destinations
    "destination-product": (lambda e: {"m": torch.bmm(e.dst["h"].unsqueeze(1), e.type["W"]).squeeze(1)}, _mean),
    # one table read as both a source and a destination table besides the product
    "both-sides": (lambda e: {"m": torch.bmm(e.src["h"].unsqueeze(1), e.type["W"]).squeeze(1)
                              * (e.src["h"] * e.dst["h"]).sum(-1, keepdim=True)}, _max),
}


@pytest.mark.parametrize("name", list(LEFT_ALONE))
def test_programs_whose_meaning_would_change_are_left_alone(name):
    message, reduce = LEFT_ALONE[name]
    program = _program(message, reduce)
    assert program.op_count("compact_typed_matmul") == 1
    assert rewrite_for_source_pairs(program) is None


def test_a_sum_onto_the_sources_is_left_alone():
    """An aggregation by source (a vertex's out-edges) sums per vertex, not per pair."""
    program = Program()
    x = program.input("x", Residency.NODE, (F_IN,), f64)
    w = program.input("W", Residency.EDGE_TYPE, (F_IN, F_OUT), f64)
    message = program.add("compact_typed_matmul", x, w, side="src")
    program.output("into", program.add("reduce", message, op="sum", by="dst"))
    assert rewrite_for_source_pairs(program) is not None
    program.output("out_of", program.add("reduce", message, op="sum", by="src"))
    assert rewrite_for_source_pairs(program) is None


def _graphiler_hgt(graph, k, q, v, table, types, prior=None):
    """Graphiler's HGT message/reduce UDF (per-edge ``bmm`` with the edge's relation
    matrix read from a parameter table through ``edges.data['type']``, and with
    ``prior`` the score scaled by the relation's prior read the same way)."""
    def message(edges):
        key = torch.bmm(edges.src["k"].unsqueeze(1), table[edges.data["type"]]).squeeze(1)
        value = torch.bmm(edges.src["v"].unsqueeze(1), table[edges.data["type"]]).squeeze(1)
        score = (key * edges.dst["q"]).sum(-1)
        return {"s": score if prior is None else score * prior[edges.data["type"]], "m": value}

    def reduce(nodes):
        alpha = torch.softmax(nodes.mailbox["s"], dim=1)
        return {"o": torch.sum(alpha.unsqueeze(-1) * nodes.mailbox["m"], dim=1)}
    return gnnfuse.message_passing(graph, message, reduce, ndata={"k": k, "q": q, "v": v},
                                   edata={"type": types})["o"]


@pytest.mark.parametrize("with_prior", [False, True])
@pytest.mark.parametrize("index", ["edge-types", "other-tensor"])
def test_graphiler_udf_runs_on_pairs_when_it_reads_the_graph_edge_types(index, with_prior, backend, device,
                                                                        monkeypatch):
    """Its index is data: the pair graph serves it when that data is the graph's own edge
    types; any other tensor (here an equal copy) keeps the per-edge compact form. On
    pairs, a prior read through the same index is a lookup by edge type, whose gradient
    is a sum by type (passes/type_sums.py), not a scatter into the table."""
    graph, inputs = typed_graph(device), _inputs(device)
    types = graph.edge_type if index == "edge-types" else graph.edge_type.clone()
    k, q, v = inputs["v"]["k"], inputs["v"]["q"], inputs["v"]["v"]
    table = inputs["t"]["wk"]
    prior = torch.randn(RELATIONS, dtype=f64, generator=torch.Generator().manual_seed(2)).to(device)
    prior = prior.requires_grad_() if with_prior else None
    wrt = [k, q, v, table] + ([prior] if with_prior else [])

    def run():
        out = _graphiler_hgt(graph, k, q, v, table, types, prior)
        weight = torch.linspace(-1, 1, out.numel(), dtype=f64, device=out.device).view_as(out)
        return [out.detach(), *torch.autograd.grad((out * weight).sum(), wrt)]
    (program,) = gnnfuse.explain(lambda: _graphiler_hgt(graph, k, q, v, table, types, prior)).programs
    inputs_read = program.forward.program.inputs
    on_pairs = any(key.startswith("pair:") for key in inputs_read)
    assert on_pairs == (index == "edge-types")
    typed = [key for key, value in inputs_read.items() if value.residency is Residency.EDGE_TYPE]
    assert len(typed) == (on_pairs and with_prior)
    if typed:
        backward = program.backward.program
        assert any(x.op == "reduce" and x.attrs["by"] == "etype" for x in backward.values)
        assert not any(x.op == "index_rows_grad" for x in backward.values)
    got = run()
    monkeypatch.setenv(PAIR_SOURCES_ENV, "0")
    for a, b in zip(got, run()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(typed_graphs())
def test_same_values_on_the_typed_graphs_users_have(graph):
    """Multi-edges, self loops, isolated vertices, relations without edges, no edges at
    all: the pair-graph run equals the per-edge compact run, outputs and gradients."""
    gen = torch.Generator().manual_seed(graph.num_edges + 7 * graph.num_nodes)
    relations = graph.num_edge_types

    def r(*shape):
        return torch.randn(*shape, dtype=f64, generator=gen).requires_grad_()
    inputs = {"v": {"k": r(graph.num_nodes, F_IN), "q": r(graph.num_nodes, F_OUT), "v": r(graph.num_nodes, F_IN),
                    "g": r(graph.num_nodes, F_OUT)},
              "e": {"w": r(graph.num_edges)},
              "t": {"wk": r(relations, F_IN, F_OUT), "wv": r(relations, F_IN, F_OUT), "p": r(relations)}}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GNNFUSE_BACKEND", "reference")
        on_pairs = _run(graph, inputs)
        patch.setenv(PAIR_SOURCES_ENV, "0")
        per_edge = _run(graph, inputs)
    for got, want in zip(on_pairs, per_edge):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
