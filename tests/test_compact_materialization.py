"""Compact materialization (passes/compact.py, ir/ops/compact.py): a relation-typed
transform of an endpoint's row is computed once per (vertex, relation) pair and gathered,
forward and backward; `explain` shows it; outputs and every gradient match a plain-torch
oracle in float64 on both backends, for source and destination endpoints, on an ordinary
and a bipartite graph."""
from __future__ import annotations

import pytest
import torch
from oracle_check import assert_matches_oracle, device_for

import gnnfuse
from gnnfuse.backend.reference import GraphContext
from gnnfuse.ir.ops.compact import narrow_index, relation_pairs

f64 = torch.float64
RELATIONS, F_IN, F_OUT = 3, 4, 2


def typed_graph(device: str = "cpu", num_src: int | None = None) -> gnnfuse.Graph:
    """Multi-edges of one (source, relation) pair -- what the rewrite shares -- a relation
    without edges and a vertex without in-edges."""
    g = torch.Generator().manual_seed(0)
    n_src = num_src or 6
    src = torch.randint(0, n_src, (30,), generator=g)
    dst = torch.randint(0, 5, (30,), generator=g)
    etype = torch.randint(0, RELATIONS - 1, (30,), generator=g)
    kw = {"edge_type": etype.to(device), "num_edge_types": RELATIONS}
    if num_src is not None:
        return gnnfuse.Graph.bipartite(src.to(device), dst.to(device), num_src, 6, **kw)
    return gnnfuse.Graph(src.to(device), dst.to(device), 6, **kw)


def both_endpoints(graph, h_src, h_dst, w, v):
    """R-GCN's ``e.src.h @ e.type.W`` scaled by a destination-side relation transform."""
    def fn(vertex):
        return sum([(e.src.h @ e.type.W) * (vertex.g @ e.type.V).sum(-1, keepdim=True) for e in vertex.inedges])
    return {"out": gnnfuse.vertex(fn)(graph, {"h": h_src, "g": h_dst}, etype_feature={"W": w, "V": v})}


def oracle(graph, h_src, h_dst, w, v):
    src, dst, rel = graph.src, graph.dst, graph.edge_type
    message = torch.einsum("ei,eio->eo", h_src[src], w[rel])
    scale = torch.einsum("ei,eio->eo", h_dst[dst], v[rel]).sum(-1, keepdim=True)
    out = torch.zeros(graph.num_nodes, F_OUT, dtype=f64, device=h_src.device)
    return {"out": out.index_add(0, dst, message * scale)}


def inputs(graph, device):
    g = torch.Generator().manual_seed(1)
    return {"h_src": torch.randn(graph.num_src_nodes, F_IN, dtype=f64, generator=g).to(device),
            "h_dst": torch.randn(graph.num_nodes, F_IN, dtype=f64, generator=g).to(device),
            "w": torch.randn(RELATIONS, F_IN, F_OUT, dtype=f64, generator=g).to(device),
            "v": torch.randn(RELATIONS, F_IN, 3, dtype=f64, generator=g).to(device)}


def test_relation_transforms_of_endpoints_run_per_pair_and_explain_shows_it():
    graph = typed_graph()
    values = {k: t.requires_grad_() for k, t in inputs(graph, "cpu").items()}
    report = gnnfuse.explain(lambda: both_endpoints(graph, **values)["out"].sum().backward())
    (program,) = report.programs
    # The source side's transform, summed with a scalar per edge, is a typed linear
    # aggregation (passes/linear_reorder.py), which runs it per pair or after aggregating.
    forward = [(v.op, v.attrs.get("side")) for v in program.forward.program.values
               if "matmul" in v.op or v.op == "typed_aggregate"]
    assert sorted(forward) == [("compact_typed_matmul", "dst"), ("typed_aggregate", None)]
    backward = {v.op for v in program.backward.program.values if "matmul" in v.op}
    assert backward == {"compact_typed_matmul", "compact_typed_matmul_t", "compact_typed_matmul_tn"}
    assert "compact_typed_matmul(%g, %etype.V, side='dst')" in str(report)


def test_pairs_are_the_distinct_vertex_relation_pairs():
    graph = typed_graph()
    pairs = relation_pairs(GraphContext(graph), "src")
    keys = torch.unique(graph.src * RELATIONS + graph.edge_type)
    assert len(pairs.vertex) == len(keys) < graph.num_edges        # the graph really shares pairs
    assert torch.equal(pairs.vertex[pairs.of_edge], graph.src)
    relation_of_pair = torch.empty_like(pairs.vertex)
    for r, rows in enumerate(pairs.groups):
        relation_of_pair[rows] = r
    assert torch.equal(relation_of_pair[pairs.of_edge], graph.edge_type)
    assert pairs.of_edge.dtype == torch.int32       # kept for the graph's lifetime: half of int64's bytes


@pytest.mark.parametrize("num_src", [None, 8], ids=["graph", "bipartite"])
def test_compact_transforms_match_the_oracle(num_src, backend, device):
    graph = typed_graph(device, num_src)
    assert_matches_oracle(lambda **kw: both_endpoints(graph, **kw), lambda **kw: oracle(graph, **kw),
                          inputs(graph, device))


# --- a relation read from edge data: Graphiler's R-GCN message ----------------------------
def graphiler_message(graph, relation, h_src, h_dst, w, v):
    """``bmm(edges.src['h'].unsqueeze(1), W[edges.data['type']])`` (Graphiler's R-GCN), scaled
    by the destination's row through another table indexed the same way."""
    def message(edges):
        rel = edges.data["type"]
        m = torch.bmm(edges.src["h"].unsqueeze(1), w[rel]).squeeze(1)
        scale = torch.bmm(edges.dst["g"].unsqueeze(1), v[rel]).squeeze(1).sum(-1, keepdim=True)
        return {"m": m * scale}

    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
    return gnnfuse.message_passing(graph, message, reduce, ndata={"h": h_src, "g": h_dst},
                                   edata={"type": relation})


def test_relation_from_edge_data_runs_per_pair():
    graph = typed_graph()
    values = {k: t.requires_grad_() for k, t in inputs(graph, "cpu").items()}
    report = gnnfuse.explain(lambda: graphiler_message(graph, graph.edge_type, **values)["out"].sum().backward())
    (program,) = report.programs
    forward = sorted((v.op, v.attrs.get("side")) for v in program.forward.program.values
                     if "matmul" in v.op or v.op == "typed_aggregate")
    assert forward == [("compact_indexed_matmul", "dst"), ("typed_aggregate", None)]
    backward = {v.op for v in program.backward.program.values if "matmul" in v.op}
    assert backward == {"compact_indexed_matmul", "compact_indexed_matmul_t", "compact_indexed_matmul_tn"}


def test_relation_from_edge_data_matches_the_oracle(backend, device):
    """Negative relation ids count from the end, as torch's indexing does."""
    graph = typed_graph(device)
    relation = torch.where(graph.edge_type == 1, -2, graph.edge_type)        # -2 is relation 1 of 3
    assert_matches_oracle(lambda **kw: graphiler_message(graph, relation, **kw),
                          lambda **kw: oracle(graph, **kw), inputs(graph, device))


def test_relation_from_edge_data_out_of_range_is_an_index_error():
    graph = typed_graph()
    with pytest.raises(IndexError, match="out of range for a table of 3 entries"):
        graphiler_message(graph, graph.edge_type + 2, **inputs(graph, "cpu"))   # ids 2 and 3


@pytest.mark.parametrize("backend", ["reference", "cpu"], indirect=True)     # numpy: host tensors
@pytest.mark.parametrize("write", ["numpy", "data"])
def test_a_relation_table_refilled_behind_torchs_version_counter_is_read_anew(backend, write):
    """A CPU relation tensor refilled where its version counter does not move -- through
    numpy (a ``torch.from_numpy`` buffer a loader refills) or ``.data`` -- is data the
    next call must read: its (vertex, relation) pairs were remembered by that counter, so
    the call ran on the pairs of the old contents, silently (outputs 51.7 off the oracle)."""
    graph = typed_graph()
    relation = torch.from_numpy(graph.edge_type.numpy().copy())
    values = inputs(graph, "cpu")
    graphiler_message(graph, relation, **values)
    refill = torch.roll(graph.edge_type, 1)
    if write == "numpy":
        relation.numpy()[:] = refill.numpy()
    else:
        relation.data.copy_(refill)
    refilled = gnnfuse.Graph(graph.src, graph.dst, 6, edge_type=refill, num_edge_types=RELATIONS)
    assert_matches_oracle(lambda **kw: graphiler_message(graph, relation, **kw),
                          lambda **kw: oracle(refilled, **kw), values)


@pytest.mark.parametrize("backend_name", ["reference", "triton"])
def test_the_input_and_weight_gradients_sum_the_edge_rows_per_pair_once(backend_name, monkeypatch):
    """Both gradients of a compact matmul start from the per-edge gradient summed per
    (vertex, relation) pair: one [E, F] -> [P, F] sum per program run, not one each."""
    from gnnfuse.ir.ops import compact
    monkeypatch.setenv("GNNFUSE_BACKEND", backend_name)
    device = device_for(backend_name)
    sums = []
    original = compact._pair_sums
    monkeypatch.setattr(compact, "_pair_sums", lambda ctx, g, pairs: sums.append(g.shape) or original(ctx, g, pairs))
    graph = typed_graph(device)
    values = {k: t.requires_grad_() for k, t in inputs(graph, device).items()}
    out = both_endpoints(graph, **values)["out"]
    expected = oracle(graph, **{k: t.detach().requires_grad_() for k, t in values.items()})["out"]
    grads = torch.autograd.grad(out.sum(), [values["h_dst"], values["v"]])
    sums_per_run = len(sums)
    assert sums_per_run == 1, sums
    torch.testing.assert_close(out, expected.detach())
    x, v = (t.detach().requires_grad_() for t in (values["h_dst"], values["v"]))
    reference = oracle(graph, values["h_src"].detach(), x, values["w"].detach(), v)["out"].sum()
    for got, want in zip(grads, torch.autograd.grad(reference, [x, v])):
        torch.testing.assert_close(got, want)


def test_narrowed_indices_keep_int64_where_int32_cannot_hold_the_bound():
    index = torch.tensor([0, 5, 2])
    assert narrow_index(index, 6).dtype == torch.int32 and torch.equal(narrow_index(index, 6).long(), index)
    assert narrow_index(index, 2**31).dtype == torch.int64
