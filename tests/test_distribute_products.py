"""``(x_j - x_i) @ U = x_j @ U - x_i @ U`` (passes/distribute_products.py): a product of
two endpoints' gathered rows becomes one product per endpoint, which then runs per
vertex, so FeaStConv's [E, F] difference of features is never written.

Checked: the rewrite takes exactly the products it may (a sum or difference of a source
and a destination gather, feeding nothing else, not returned); FeaStConv writes no
feature-wide edge table in its forward or backward and matches PyG's output and every
gradient in float64 on both backends, with duplicate edges, self loops and an isolated
vertex."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg_nn
from layer_check import assert_compiled_matches
from oracle_check import assert_matches_oracle

import gnnfuse
import gnnfuse.nn
from gnnfuse.ir import Program, Residency
from gnnfuse.passes.dce import eliminate_dead_code
from gnnfuse.passes.distribute_products import distribute_products
from gnnfuse.passes.reorder import reorder_broadcasts

F, HEADS, N = 5, 3, 7
# duplicate edges (1 -> 2 twice), self loops (2 -> 2, 5 -> 5), vertex 6 isolated
EDGES = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 2, 5], [1, 2, 2, 3, 4, 5, 0, 2, 5]])


def _program(op: str = "sub", sides: tuple[str, str] = ("src", "dst"), extra_use: str | None = None) -> Program:
    p = Program()
    x = p.input("x", Residency.NODE, (F,), torch.float64)
    a, b = (p.add("broadcast", x, by=side) for side in sides)
    total = p.add(op, a, b)
    p.outputs["out"] = p.add("matmul", total, p.input("u", Residency.SHARED, (F, HEADS), torch.float64))
    if extra_use == "sum returned":
        p.outputs["total"] = total
    elif extra_use == "sum read again":
        p.outputs["again"] = p.add("relu", total)
    return p


@pytest.mark.parametrize("op", ["add", "sub"])
def test_rewrite_moves_each_product_to_the_vertices(op):
    p = eliminate_dead_code(reorder_broadcasts(distribute_products(_program(op))))
    products = [v for v in p.values if v.op == "matmul"]
    assert len(products) == 2 and all(v.inputs[0].residency is Residency.NODE for v in products)
    assert not [v for v in p.values if v.residency is Residency.EDGE and v.shape[-1] == F]


@pytest.mark.parametrize("extra_use", ["sum returned", "sum read again"])
def test_rewrite_leaves_a_sum_that_is_formed_anyway(extra_use):
    p = _program(extra_use=extra_use)
    before = p.pretty()
    assert distribute_products(p).pretty() == before


def test_rewrite_leaves_rows_gathered_by_one_endpoint():
    """Both from the source: `reorder_broadcasts` moves the sum itself, one product."""
    p = _program(sides=("src", "src"))
    before = p.pretty()
    assert distribute_products(p).pretty() == before


@pytest.mark.parametrize("op", [torch.mul, torch.div, torch.maximum], ids=lambda f: f.__name__)
def test_a_product_of_endpoints_combined_otherwise_than_by_a_sum_stays_whole(op, backend, device):
    """``(x_j * x_i) @ W`` is not ``x_j @ W * x_i @ W``: only a sum or difference distributes
    (a rewrite taking any two-operand op passed every other test). Checked against eager
    PyTorch, outputs and float64 gradients."""
    src, dst = EDGES[0].to(device), EDGES[1].to(device)
    graph = gnnfuse.Graph(src, dst, N)
    gen = torch.Generator().manual_seed(3)
    x = (torch.rand(N, F, dtype=torch.float64, generator=gen) + 0.5).to(device)
    w = torch.randn(F, HEADS, dtype=torch.float64, generator=gen).to(device)

    def ours(x, w):
        def message(edges):
            return {"m": op(edges.src["h"], edges.dst["h"]) @ w}

        def reduce(nodes):
            return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
        return {"out": gnnfuse.message_passing(graph, message, reduce, ndata={"h": x})["out"]}

    def eager(x, w):
        terms = op(x[src], x[dst]) @ w
        return {"out": torch.zeros(N, HEADS, dtype=x.dtype, device=x.device).index_add(0, dst, terms)}
    assert_matches_oracle(ours, eager, {"x": x, "w": w})


def _feast(cls):
    torch.manual_seed(0)
    return cls(F, 4, heads=HEADS).double()


def test_feastconv_matches_pyg(device):
    ours, theirs = _feast(gnnfuse.nn.FeaStConv).to(device), _feast(pyg_nn.FeaStConv).to(device)
    theirs.load_state_dict(ours.state_dict())

    def run(layer):
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(N, F, dtype=torch.float64, generator=gen).to(device).requires_grad_()
        out = layer(x, EDGES.to(device))
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=device).view_as(out)
        return out, torch.autograd.grad((out * weight).sum(), [x, *layer.parameters()])

    assert_compiled_matches(ours, theirs, run)


def test_feastconv_writes_no_feature_wide_edge_table():
    x = torch.randn(N, F, requires_grad=True, generator=torch.Generator().manual_seed(1))
    [program] = gnnfuse.explain(gnnfuse.nn.FeaStConv(F, 4, heads=HEADS), x, EDGES).programs
    for plan in (program.forward, program.backward):
        assert all(t.width != F for t in plan.edge_tensors), [(t.value.op, t.width) for t in plan.edge_tensors]
