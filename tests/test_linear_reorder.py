"""Linear-operator reordering of relation-typed aggregations (passes/linear_reorder.py,
ir/ops/typed_aggregate.py): a sum or mean of ``s_e * x[u] @ W[relation]`` runs with the
transform before aggregation (per source pair) or after it (hierarchical: per (destination,
relation) partials, then across relations), whichever the byte model says moves fewer
bytes. Outputs and every gradient match plain-torch oracles and PyG's layers in float64
in both orders and on both backends; the pass leaves alone what the algebra does not allow;
the chosen order flips with the widths and pair counts; `explain` shows it."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg_nn
from oracle_check import assert_matches_oracle
from test_compact_materialization import typed_graph   # RELATIONS relations, as here
from test_nn_hetero import IN_CHANNELS, METADATA, assert_same, hetero_inputs, randomized, typed_edges

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.frontend import trace_message_passing
from gnnfuse.ir.ops.typed_aggregate import ORDER_ENV, choose_order, order_costs, recorded_choice
from gnnfuse.passes import pipeline
from gnnfuse.runtime.compiled import CompiledProgram

f64 = torch.float64
RELATIONS, F_IN, F_OUT = 3, 4, 2


@pytest.fixture(params=["before", "after", "dense"])
def order(request, monkeypatch) -> str:
    """Forces each order in turn: both must give the oracle's values."""
    monkeypatch.setenv(ORDER_ENV, request.param)
    return request.param


def inputs(graph: gnnfuse.Graph, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"h": torch.randn(graph.num_src_nodes, F_IN, dtype=f64, generator=g).to(device),
            "w": torch.randn(RELATIONS, F_IN, F_OUT, dtype=f64, generator=g).to(device),
            "s": torch.rand(graph.num_edges, dtype=f64, generator=g).to(device) + 0.5}


# --- the flat typed programs and their oracles ---------------------------------------------
def scaled_sum(graph, h, w, s):
    """R-GCN's message, vertex-centric, with a per-edge scale that needs a gradient."""
    fn = gnnfuse.vertex(lambda v: sum([(e.src.h @ e.type.W) * e.s for e in v.inedges]))
    return {"out": fn(graph, {"h": h}, {"s": s}, etype_feature={"W": w})}


def typed_bmm(reduce_name: str):
    """``bmm(edges.src['h'].unsqueeze(1), edges.type['W'])`` summed or averaged (DGL style)."""
    def run(graph, h, w, s):
        def message(edges):
            return {"m": torch.bmm(edges.src["h"].unsqueeze(1), edges.type["W"]).squeeze(1) * edges.data["s"]}

        def reduce(nodes):
            return {"out": getattr(torch, reduce_name)(nodes.mailbox["m"], dim=1)}
        return gnnfuse.message_passing(graph, message, reduce, ndata={"h": h}, edata={"s": s.unsqueeze(-1)},
                                       etype_data={"W": w})
    return run


def graphiler_rgcn(graph, h, w, s, squeeze=lambda t: t.squeeze()):
    """Graphiler's R-GCN UDF as published (relation weights read through edge data, DGL's
    [E, 1] norm), compiled unchanged; ``squeeze`` is how the bmm's [E, 1, out] becomes
    [E, out] (the published ``squeeze()``)."""
    def message(edges):
        relation_weight = w[edges.data["_TYPE"]]
        msg = squeeze(torch.bmm(edges.src["h"].unsqueeze(1), relation_weight))
        msg = msg * edges.data["norm"]
        return {"m": msg}

    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
    return gnnfuse.message_passing(graph, message, reduce, ndata={"h": h},
                                   edata={"_TYPE": graph.edge_type, "norm": s.unsqueeze(-1)})


def oracle(graph, h, w, s, mean: bool = False):
    messages = torch.einsum("ei,eio->eo", h[graph.src], w[graph.edge_type]) * s.unsqueeze(-1)
    out = torch.zeros(graph.num_nodes, w.shape[-1], dtype=f64, device=h.device).index_add(0, graph.dst, messages)
    if mean:
        out = out / torch.bincount(graph.dst, minlength=graph.num_nodes).clamp_min(1).unsqueeze(-1)
    return {"out": out}


CASES = {"scaled-sum": (scaled_sum, False), "bmm-sum": (typed_bmm("sum"), False),
         "bmm-mean": (typed_bmm("mean"), True), "graphiler-rgcn": (graphiler_rgcn, False)}


@pytest.mark.parametrize("case", list(CASES))
def test_flat_typed_programs_match_the_oracle_in_both_orders(case, order, backend, device):
    fn, mean = CASES[case]
    graph = typed_graph(device)
    assert_matches_oracle(lambda **kw: fn(graph, **kw), lambda **kw: oracle(graph, **kw, mean=mean),
                          inputs(graph, device))


def test_graphiler_rgcn_with_one_output_feature(order):
    """With one output feature, ``squeeze()`` drops it too: an [E] message times DGL's
    [E, 1] norm is [E, E] in torch, as DGL would run it, so the UDF is refused at that
    line (it used to compile to the per-edge product, silently unlike DGL); squeezing
    the bmm's axis alone, ``squeeze(1)``, compiles to one typed aggregate."""
    graph = typed_graph()
    values = inputs(graph, "cpu")
    values["w"] = values["w"][..., :1].contiguous()
    with pytest.raises(gnnfuse.CompileError, match=r"a \[E\] and a \[E, 1\] graph value") as info:
        graphiler_rgcn(graph, **values)
    assert 'msg = msg * edges.data["norm"]' in str(info.value)
    squeeze_one = {"squeeze": lambda t: t.squeeze(1)}
    (program,) = gnnfuse.explain(lambda: graphiler_rgcn(graph, **values, **squeeze_one)).programs
    assert program.forward.program.op_count("typed_aggregate") == 1
    assert_matches_oracle(lambda **kw: graphiler_rgcn(graph, **kw, **squeeze_one), lambda **kw: oracle(graph, **kw),
                          values)


def test_bipartite_graph_matches_the_oracle_in_both_orders(order, backend, device):
    graph = typed_graph(device, num_src=8)
    assert_matches_oracle(lambda **kw: scaled_sum(graph, **kw), lambda **kw: oracle(graph, **kw),
                          inputs(graph, device))


def test_a_weight_row_no_edge_reads_does_not_reach_the_output_in_any_order(order, backend, device):
    """Relation 2 of a 3-row table occurs on no edge and holds NaN (a spare row of a table
    sized for more relations): eager torch never reads it. The dense order multiplied
    its all-zero table block by it, 0 * NaN, and every output and the input gradient
    came out NaN."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 2]), edge_type=torch.tensor([0, 1, 0, 1]),
                          num_edge_types=RELATIONS).to(device)
    values = inputs(graph, device)
    values["w"][2] = float("nan")
    leaves = {k: t.clone().requires_grad_() for k, t in values.items()}
    got = typed_bmm("sum")(graph, **leaves)["out"]
    torch.testing.assert_close(got, oracle(graph, **values)["out"], rtol=1e-9, atol=1e-12)
    got.sum().backward()
    assert torch.isfinite(leaves["h"].grad).all() and torch.isfinite(leaves["w"].grad).all()


def test_a_weighted_mean_over_a_graph_with_isolated_vertices_in_every_order(order, backend, device):
    """``sum(m * s) / sum(s)`` in reduce_fn: a vertex without in-edges gets DGL's 0 by a
    selection, behind which the division's gradient is 0/0 = NaN on its row. The pair
    orders never read that row; the dense weight gradient multiplied it by the vertex's
    all-zero table row and the whole gradient of W came out NaN (vertices 3 and 4 have no
    in-edges here)."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 0, 1]), torch.tensor([1, 2, 0, 2, 1]), 5,
                          edge_type=torch.tensor([0, 1, 0, 1, 2])).to(device)

    def weighted_mean(h, w, s):
        def message(edges):
            m = torch.bmm(edges.src["h"].unsqueeze(1), edges.type["W"]).squeeze(1)
            return {"m": m * edges.data["s"], "s": edges.data["s"]}

        def reduce(nodes):
            return {"out": nodes.mailbox["m"].sum(1) / nodes.mailbox["s"].sum(1)}
        return gnnfuse.message_passing(graph, message, reduce, ndata={"h": h}, edata={"s": s.unsqueeze(-1)},
                                       etype_data={"W": w})

    def expected(h, w, s):
        messages = torch.einsum("ei,eio->eo", h[graph.src], w[graph.edge_type]) * s.unsqueeze(-1)
        total = torch.zeros(graph.num_nodes, w.shape[-1], dtype=f64, device=h.device).index_add(0, graph.dst, messages)
        weights = torch.zeros(graph.num_nodes, dtype=f64, device=h.device).index_add(0, graph.dst, s)
        return {"out": total / weights.where(weights > 0, 1).unsqueeze(-1)}
    assert_matches_oracle(weighted_mean, expected, inputs(graph, device))


def test_a_nan_gradient_on_a_row_without_edges_does_not_reach_the_weights_in_any_order(order, backend, device):
    """A loss that is finite on a zero output row but not differentiable there (the
    row's length, ``sqrt(sum(out ** 2))``) sends NaN back on the rows of vertices
    without in-edges (3 and 4 here). Eager torch and the pair orders never read those
    rows for the weight gradient; the dense order's GEMM multiplied them by the vertices'
    all-zero table rows, 0 * NaN, and W's whole gradient came out NaN."""
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 0, 1]), torch.tensor([1, 2, 0, 2, 1]), 5,
                          edge_type=torch.tensor([0, 1, 0, 1, 2])).to(device)
    values = inputs(graph, device)
    leaves = {k: t.clone().requires_grad_() for k, t in values.items()}
    typed_bmm("sum")(graph, **leaves)["out"].square().sum(-1).sqrt().sum().backward()
    expected = {k: t.clone().requires_grad_() for k, t in values.items()}
    oracle(graph, **expected)["out"].square().sum(-1).sqrt().sum().backward()
    for name in ("h", "w"):
        torch.testing.assert_close(leaves[name].grad, expected[name].grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_flat_typed_programs_are_rewritten_forward_and_backward(case):
    graph = typed_graph()
    values = {k: t.requires_grad_() for k, t in inputs(graph, "cpu").items()}
    (program,) = gnnfuse.explain(lambda: CASES[case][0](graph, **values)["out"].sum().backward()).programs
    forward = {v.op for v in program.forward.program.values}
    assert "typed_aggregate" in forward and not forward & {"compact_typed_matmul", "compact_indexed_matmul"}
    backward = {v.op for v in program.backward.program.values}
    assert {"typed_aggregate", "typed_aggregate_tn"} <= backward
    assert not backward & {"compact_typed_matmul_t", "compact_indexed_matmul_t"}


def test_source_side_and_parameter_scales_match_the_oracle_in_both_orders(order, backend, device):
    """A scale read from the source's row (``e.src.d``) is per edge; a parameter scalar
    multiplies the aggregated result. Both get their gradients."""
    graph = typed_graph(device)

    def ours(h, w, d, c):
        fn = gnnfuse.vertex(lambda v: sum([(e.src.h @ e.type.W) * e.src.d * c for e in v.inedges]))
        return {"out": fn(graph, {"h": h, "d": d}, etype_feature={"W": w})}

    def expected(h, w, d, c):
        return {"out": oracle(graph, h, w, d[graph.src])["out"] * c}
    values = inputs(graph, device)
    values = {"h": values["h"], "w": values["w"], "d": values["s"][:graph.num_nodes],
              "c": torch.tensor(0.7, dtype=f64, device=device)}
    assert_matches_oracle(ours, expected, values)
    (program,) = gnnfuse.explain(lambda: ours(**values)).programs
    assert program.forward.program.op_count("typed_aggregate") == 1


def test_a_flat_mean_stays_one_mean_over_all_in_edges(order):
    """A vertex with one edge of relation 0 and three of relation 1: the flat mean divides
    by 4; a sum or a mean of per-relation means (the hierarchy R-GCN's norm builds) would not."""
    graph = gnnfuse.Graph(torch.tensor([1, 2, 3, 4]), torch.zeros(4, dtype=torch.long), 5,
                          edge_type=torch.tensor([0, 1, 1, 1]), num_edge_types=2)
    h = torch.arange(10, dtype=f64).view(5, 2)
    w = torch.stack([torch.eye(2, dtype=f64), 2 * torch.eye(2, dtype=f64)])
    got = typed_bmm("mean")(graph, h, w, torch.ones(4, dtype=f64))["out"][0]
    per_relation = [h[1], 2 * h[2:5].mean(0)]
    torch.testing.assert_close(got, (h[1] + 2 * h[2:5].sum(0)) / 4, rtol=1e-12, atol=0)
    assert not torch.allclose(got, sum(per_relation)) and not torch.allclose(got, sum(per_relation) / 2)


# --- PyG layers with copied weights, in both orders ------------------------------------------
LAYERS = {
    "RGCNConv-mean": lambda: (pyg_nn.RGCNConv(4, 3, RELATIONS), gnn.RGCNConv(4, 3, RELATIONS)),
    "RGCNConv-add": lambda: (pyg_nn.RGCNConv(4, 3, RELATIONS, aggr="add"), gnn.RGCNConv(4, 3, RELATIONS, aggr="add")),
    "FastRGCNConv": lambda: (pyg_nn.FastRGCNConv(4, 3, RELATIONS, num_bases=2),
                             gnn.FastRGCNConv(4, 3, RELATIONS, num_bases=2)),
    "RGATConv": lambda: (pyg_nn.RGATConv(4, 2, RELATIONS), gnn.RGATConv(4, 2, RELATIONS)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_relational_layers_match_pyg_in_both_orders(name, order, backend, device):
    pyg, ours = (layer.double().to(device) for layer in LAYERS[name]())
    randomized(pyg, 2)
    ours.load_state_dict(pyg.state_dict())
    index, types = typed_edges(3, device=device)
    x = {"x": torch.randn(8, 4, dtype=f64, device=device)}
    with_rewrite = gnnfuse.explain(lambda: ours(x["x"], index, types))
    # R-GCN's root term and bias fold into the sum as well (passes/typed_root.py)
    assert any(v.op in ("typed_aggregate", "typed_aggregate_rooted")
               for p in with_rewrite.programs for v in p.forward.program.values)
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs["x"], index, types))


def test_hgt_with_one_head_matches_pyg_in_both_orders(order, backend, device):
    """One head: the attention is a scalar per edge, so HGT's message sum is rewritten;
    with more heads it is a per-head weight and is left alone (see below)."""
    torch.manual_seed(0)
    pyg = randomized(pyg_nn.HGTConv(IN_CHANNELS, 6, METADATA, heads=1).double().to(device), 1)
    ours = gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=1).double().to(device)
    ours.load_state_dict(pyg.state_dict())
    x, edges = hetero_inputs(1, device)
    (program,) = gnnfuse.explain(lambda: ours(x, edges)).programs
    assert "typed_aggregate" in {v.op for v in program.forward.program.values}
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges))


# --- what the pass must leave alone ---------------------------------------------------------
def _bmm(edges, w, side="src"):
    return torch.bmm(edges.src["h"].unsqueeze(1) if side == "src" else edges.dst["h"].unsqueeze(1),
                     edges.type["W"]).squeeze(1)


REFUSED = {
    "max": (lambda e: {"m": _bmm(e, None)}, lambda n: {"o": torch.max(n.mailbox["m"], dim=1)[0]}),
    "relu-before-sum": (lambda e: {"m": torch.relu(_bmm(e, None))}, lambda n: {"o": n.mailbox["m"].sum(1)}),
    "per-feature-weight": (lambda e: {"m": _bmm(e, None) * e.data["a"]}, lambda n: {"o": n.mailbox["m"].sum(1)}),
    "product-used-twice": (lambda e: {"m": _bmm(e, None)},
                           lambda n: {"o": n.mailbox["m"].sum(1), "p": torch.max(n.mailbox["m"], dim=1)[0]}),
    "own-row-transformed": (lambda e: {"m": _bmm(e, None, side="dst")}, lambda n: {"o": n.mailbox["m"].sum(1)}),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_pass_leaves_programs_alone_where_the_algebra_forbids(name, monkeypatch):
    """Max, a nonlinearity or a per-feature weight between W_r and the sum, a product
    needed elsewhere too, a destination's own row: optimized exactly as without the pass."""
    message, reduce = REFUSED[name]
    feeds = ({"h": torch.randn(6, F_IN, dtype=f64)}, {"a": torch.randn(30, F_OUT, dtype=f64)},
             {"W": torch.randn(RELATIONS, F_IN, F_OUT, dtype=f64)})

    def optimized() -> CompiledProgram:
        return CompiledProgram(trace_message_passing(message, reduce, None, *feeds).program)
    with_pass = optimized()
    monkeypatch.setattr(pipeline, "reorder_typed_linear", lambda program: program)
    without_pass = optimized()
    assert with_pass.program.fingerprint() == without_pass.program.fingerprint()
    assert with_pass.program.op_count("compact_typed_matmul") == 1
    assert with_pass.program.op_count("typed_aggregate") == 0


def test_hgt_with_several_heads_is_left_alone():
    layer = gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double()
    x, edges = hetero_inputs(2)
    (program,) = gnnfuse.explain(lambda: layer(x, edges)).programs
    ops = {v.op for v in program.forward.program.values}
    assert "typed_aggregate" not in ops
    # its compact products run as tables of the pair graph (passes/pair_sources.py)
    assert {"pair:k@etype.w_k", "pair:v@etype.w_v"} <= set(program.forward.program.inputs)


# --- the byte model and its choice ------------------------------------------------------------
def test_byte_model_counts_each_stage():
    """E=10 edges, 4 gathered and 3 aggregated pairs, 5 output rows, in=2, out=3, 8-byte
    elements: the stage sums written out by hand."""
    costs = order_costs(10, 4, 3, 5, 2, 3, 8)
    before_reads = 4 * 2 + 10 * 3 + 10                 # pair rows of x, gathered pair products, scales
    before_writes = 4 * 3 + 5 * 3                      # pair products, output (nothing per edge)
    after_reads = 10 * 2 + 10 + 3 * (2 + 3)            # gathered edge rows, scales, partials, products
    after_writes = 3 * (2 + 3) + 5 * 3                 # partials, products, output
    assert costs["before"].bytes == 8 * (before_reads + before_writes)
    assert costs["after"].bytes == 8 * (after_reads + after_writes)
    assert costs["before"].flops == 2 * 4 * 2 * 3 + 2 * 10 * 3
    assert costs["after"].flops == 2 * 3 * 2 * 3 + 2 * 10 * 2


def many_relations_graph(num_src: int = 40, num_dst: int = 40, relations: int = 12, edges: int = 400):
    g = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, num_src, (edges,), generator=g), torch.randint(0, num_dst, (edges,), generator=g)
    etype = torch.randint(0, relations, (edges,), generator=g)
    if num_src == num_dst:
        return gnnfuse.Graph(src, dst, num_dst, edge_type=etype, num_edge_types=relations)
    return gnnfuse.Graph.bipartite(src, dst, num_src, num_dst, edge_type=etype, num_edge_types=relations)


def _forward_choice(graph: gnnfuse.Graph, width_in: int, width_out: int):
    layer = gnn.RGCNConv(width_in, width_out, graph.num_edge_types, root_weight=False)
    x = torch.randn(graph.num_src_nodes, width_in, requires_grad=True)
    if graph.is_bipartite:
        x = (x, torch.zeros(graph.num_nodes, width_in))
    report = gnnfuse.explain(lambda: layer(x, graph).sum().backward())
    (program,) = report.programs
    (op,) = [v for v in program.forward.program.values if v.op == "typed_aggregate"]
    return recorded_choice(graph, op), str(report)


@pytest.mark.parametrize("width_in, width_out, expected", [(32, 2, "before"), (2, 32, "dense")],
                         ids=["wide-in-narrow-out", "narrow-in-wide-out"])
def test_the_order_flips_with_the_widths(width_in, width_out, expected):
    """12 relations on 40 vertices: a wide input is transformed first, per source pair; a
    narrow one is aggregated first, here into the dense (vertex, relation) table."""
    choice, text = _forward_choice(many_relations_graph(), width_in, width_out)
    assert choice.order == expected and not choice.forced
    assert choice.costs[expected].bytes == min(c.bytes for c in choice.costs.values())


def test_the_order_flips_with_the_pair_counts():
    """Equal widths, relations too many for a dense table: few (destination, relation)
    pairs put the transform after the aggregation, few source pairs before it."""
    few_dst_pairs = choose_order("typed_aggregate", 400, 300, 30, 200, 8, 8, 8, rows_by=200, relations=100)
    few_src_pairs = choose_order("typed_aggregate", 400, 30, 300, 200, 8, 8, 8, rows_by=200, relations=100)
    assert (few_dst_pairs.order, few_src_pairs.order) == ("after", "before")
    assert few_dst_pairs.costs["dense"].bytes > few_dst_pairs.costs["after"].bytes


def test_few_relations_and_a_wide_output_aggregate_into_a_dense_table():
    """Three relations: every destination's three partial rows side by side cost less
    than the (destination, relation) products at the output's width."""
    choice, text = _forward_choice(many_relations_graph(relations=3), 2, 32)
    assert choice.order == "dense" and not choice.forced
    assert "aggregate into a dense (vertex, relation) table, then one GEMM (fewer bytes); in=2 out=32" in text


@pytest.mark.parametrize("relations, rows, expected", [(4, 1_939_743, "dense"), (266, 1_666_764, "after")],
                         ids=["mag-like", "am-like"])
def test_the_dense_table_is_chosen_by_its_size(relations, rows, expected):
    """R-GCN's second layer (16 -> 349 classes) on ogbn-mag-sized graphs: 4 relations make a
    [rows, 64] table, smaller than 1.5M products of 349; 266 relations (AM) make one of
    [rows, 4256], larger than the pairs' products, so the pairs stay."""
    edges, gathered, aggregated = 21_111_007, 3_050_661, 1_513_733
    choice = choose_order("typed_aggregate", edges, gathered, aggregated, rows, 16, 349, 4,
                          rows_by=rows, relations=relations)
    assert choice.order == expected


def test_the_backward_runs_its_own_choice_and_explain_lists_it():
    """Narrow in, wide out: the forward aggregates first (into the dense table); the input
    gradient (out -> in) then transforms first, by the same model with the widths swapped."""
    choice, text = _forward_choice(many_relations_graph(), 2, 32)
    assert choice.order == "dense"
    assert "transform before aggregation (fewer bytes); in=32 out=2" in text      # the input gradient
    assert "typed_aggregate EDGE[" not in text              # its edge stage writes nothing per edge


def test_a_bad_forced_order_is_refused(monkeypatch):
    monkeypatch.setenv(ORDER_ENV, "sideways")
    graph = typed_graph()
    with pytest.raises(ValueError, match="GNNFUSE_TYPED_ORDER must be one of"):
        scaled_sum(graph, **inputs(graph, "cpu"))
