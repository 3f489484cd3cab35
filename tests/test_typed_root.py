"""R-GCN's root term and bias folded into the typed sum (passes/typed_root.py,
``typed_aggregate_rooted``): ``sum_e s_e x[u] W_r + x_v W_root + b`` runs as one op -- in
the dense order one GEMM over the per-relation table with the vertex's own row as one more
block -- and gives the plain-torch oracle's values and every gradient in float64, in all
three orders and on both backends. What the algebra or the program's other uses forbid
is left as it was."""
from __future__ import annotations

import pytest
import torch
from oracle_check import assert_matches_oracle
from test_compact_materialization import typed_graph
from test_linear_reorder import F_IN, F_OUT, RELATIONS, inputs, oracle, order  # noqa: F401  (fixture)

import gnnfuse

f64 = torch.float64


def rooted_inputs(graph: gnnfuse.Graph, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return {**inputs(graph, device), "root": torch.randn(F_IN, F_OUT, dtype=f64, generator=g).to(device),
            "bias": torch.randn(F_OUT, dtype=f64, generator=g).to(device)}


def rooted(graph, h, w, s, root, bias, root_first: bool = False):
    def fn(v):
        typed = sum([(e.src.h @ e.type.W) * e.s for e in v.inedges])
        own = v.h @ root
        return (own + typed if root_first else typed + own) + bias
    return {"out": gnnfuse.vertex(fn)(graph, {"h": h}, {"s": s}, etype_feature={"W": w})}


def rooted_oracle(graph, h, w, s, root, bias):
    return {"out": oracle(graph, h, w, s)["out"] + h @ root + bias}


def ops(fn) -> tuple[list[str], list[str]]:
    """The forward's and (if one ran) the backward's ops, inputs left out."""
    (program,) = gnnfuse.explain(fn).programs
    backward = [] if program.backward is None else program.backward.program.values
    return ([v.op for v in program.forward.program.values if v.op != "input"],
            [v.op for v in backward if v.op != "input"])


@pytest.mark.parametrize("root_first", [False, True])
def test_the_root_term_and_bias_fold_and_match_the_oracle(order, backend, device, root_first):
    graph = typed_graph(device)
    values = rooted_inputs(graph, device)
    assert_matches_oracle(lambda **kw: rooted(graph, **kw, root_first=root_first),
                          lambda **kw: rooted_oracle(graph, **kw), values)
    leaves = {k: t.requires_grad_() for k, t in rooted_inputs(graph, device).items()}
    forward, backward = ops(lambda: rooted(graph, **leaves, root_first=root_first)["out"].sum().backward())
    assert forward == ["typed_aggregate_rooted"]
    # the input gradient is a typed sum by source plus the root's g @ W_root^T: folded too
    assert "typed_aggregate_rooted" in backward and "typed_aggregate" not in backward


def test_a_root_term_without_bias_folds_alone(order):
    graph = typed_graph()
    values = rooted_inputs(graph, "cpu")
    values.pop("bias")

    def ours(h, w, s, root):
        fn = gnnfuse.vertex(lambda v: sum([(e.src.h @ e.type.W) * e.s for e in v.inedges]) + v.h @ root)
        return {"out": fn(graph, {"h": h}, {"s": s}, etype_feature={"W": w})}

    def expected(h, w, s, root):
        return {"out": oracle(graph, h, w, s)["out"] + h @ root}
    assert_matches_oracle(ours, expected, values)
    assert ops(lambda: ours(**values))[0] == ["typed_aggregate_rooted"]


def test_a_bias_is_not_folded_when_the_sum_before_it_is_an_output_too():
    graph = typed_graph()
    values = rooted_inputs(graph, "cpu")

    def ours(h, w, s, root, bias):
        def fn(v):
            summed = sum([(e.src.h @ e.type.W) * e.s for e in v.inedges]) + v.h @ root
            return {"summed": summed, "out": summed + bias}
        return gnnfuse.vertex(fn)(graph, {"h": h}, {"s": s}, etype_feature={"W": w})

    def expected(h, w, s, root, bias):
        summed = oracle(graph, h, w, s)["out"] + h @ root
        return {"summed": summed, "out": summed + bias}
    assert_matches_oracle(ours, expected, values)
    assert ops(lambda: ours(**values))[0] == ["typed_aggregate_rooted", "add"]


@pytest.mark.parametrize("after", ["times parameter", "minus parameter", "plus vertex table"])
def test_only_a_parameter_vector_added_after_the_sum_is_folded_as_its_bias(after):
    """The rooted op adds a bias row: a product or difference with the parameter after the
    sum, or a per-vertex addend, stays outside it (each folded as ``+ bias`` passed every
    other test). Checked against the plain-torch oracle, values and float64 gradients."""
    graph = typed_graph()
    values = rooted_inputs(graph, "cpu")
    t = torch.randn(graph.num_nodes, F_OUT, dtype=f64, generator=torch.Generator().manual_seed(4))
    combine = {"times parameter": lambda x, bias, t: x * bias, "minus parameter": lambda x, bias, t: x - bias,
               "plus vertex table": lambda x, bias, t: x + t + bias}[after]

    def ours(h, w, s, root, bias):
        def fn(v):
            return combine(sum([(e.src.h @ e.type.W) * e.s for e in v.inedges]) + v.h @ root, bias, v.t)
        return {"out": gnnfuse.vertex(fn)(graph, {"h": h, "t": t}, {"s": s}, etype_feature={"W": w})}

    def expected(h, w, s, root, bias):
        return {"out": combine(oracle(graph, h, w, s)["out"] + h @ root, bias, t)}
    assert_matches_oracle(ours, expected, values)


@pytest.mark.parametrize("kept", ["root", "sum"])
def test_terms_the_program_uses_elsewhere_are_not_folded(kept):
    """A root product or typed sum that is an output as well is computed anyway: folding
    it would compute it twice."""
    graph = typed_graph()
    values = rooted_inputs(graph, "cpu")

    def ours(h, w, s, root, bias):
        def fn(v):
            typed = sum([(e.src.h @ e.type.W) * e.s for e in v.inedges])
            own = v.h @ root
            return {"out": typed + own + bias, "kept": own if kept == "root" else typed}
        return gnnfuse.vertex(fn)(graph, {"h": h}, {"s": s}, etype_feature={"W": w})

    def expected(h, w, s, root, bias):
        typed, own = oracle(graph, h, w, s)["out"], h @ root
        return {"out": typed + own + bias, "kept": own if kept == "root" else typed}
    assert_matches_oracle(ours, expected, values)
    assert "typed_aggregate_rooted" not in ops(lambda: ours(**values))[0]


def test_a_destination_side_product_of_a_non_parameter_is_not_a_root_term():
    """``v.h * v.g`` (elementwise, no matmul) added to the sum stays an addition."""
    graph = typed_graph()
    values = {k: t for k, t in rooted_inputs(graph, "cpu").items() if k not in ("root", "bias")}
    values["g"] = torch.randn(graph.num_nodes, F_OUT, dtype=f64)

    def ours(h, w, s, g):
        fn = gnnfuse.vertex(lambda v: sum([(e.src.h @ e.type.W) * e.s for e in v.inedges]) + v.g * 2.0)
        return {"out": fn(graph, {"h": h, "g": g}, {"s": s}, etype_feature={"W": w})}

    def expected(h, w, s, g):
        return {"out": oracle(graph, h, w, s)["out"] + g * 2.0}
    assert_matches_oracle(ours, expected, values)
    assert "typed_aggregate_rooted" not in ops(lambda: ours(**values))[0]
