"""``cat([a, b, c]) @ W = a @ W[:Fa] + b @ W[Fa:Fa+Fb] + c @ W[Fa+Fb:]``
(passes/split_concat_products.py): the products of a concatenation with gathered endpoint
rows become one product per part, so the endpoint parts run per vertex and the [E, sum of
widths] table is never written. CGConv against PyG is in test_narrow_products.

Checked: the rewrite takes exactly the concatenations it may (every use a product by a
parameter matrix, not returned, a part gathered from an endpoint) and the rewritten
program computes what the original did, values and gradients, in float64."""
from __future__ import annotations

import pytest
import torch

from gnnfuse.graph import Graph
from gnnfuse.ir import Program, Residency
from gnnfuse.passes.dce import eliminate_dead_code
from gnnfuse.passes.reorder import reorder_broadcasts
from gnnfuse.passes.split_concat_products import split_concat_products
from gnnfuse.backend.reference.context import GraphContext
from gnnfuse.backend.reference.executor import execute

F, D, H, N = 3, 2, 4, 6
EDGES = torch.tensor([[0, 1, 1, 2, 3, 5, 4], [1, 2, 2, 3, 3, 0, 5]])   # a duplicate edge, a self loop


def _program(extra_use: str | None = None, parts: tuple[str, ...] = ("dst", "src", "edge")) -> Program:
    p = Program()
    x = p.input("x", Residency.NODE, (F,), torch.float64)
    e = p.input("e", Residency.EDGE, (D,), torch.float64)
    rows = [e if side == "edge" else p.add("broadcast", x, by=side) for side in parts]
    z = p.add("concat", *rows, dim=-1)
    width = sum(r.shape[-1] for r in rows)
    products = [p.add("matmul", z, p.input(f"w{i}", Residency.SHARED, (width, H), torch.float64)) for i in range(2)]
    p.outputs["out"] = p.add("reduce", p.add("mul", p.add("sigmoid", products[0]), products[1]), op="sum", by="dst")
    if extra_use == "returned":
        p.outputs["z"] = z
    elif extra_use == "read again":
        p.outputs["again"] = p.add("reduce", p.add("relu", z), op="sum", by="dst")
    return p


def test_products_of_endpoint_parts_move_to_the_vertices():
    p = eliminate_dead_code(reorder_broadcasts(split_concat_products(_program())))
    assert not [v for v in p.values if v.op == "concat"]
    moved = [v for v in p.values if v.op == "matmul" and v.inputs[0].residency is Residency.NODE]
    assert len(moved) == 4          # two endpoint parts, two products
    assert not [v for v in p.values if v.residency is Residency.EDGE and v.shape[-1] > H]


@pytest.mark.parametrize("extra_use", ["returned", "read again"])
def test_a_concatenation_formed_anyway_is_left(extra_use):
    p = _program(extra_use)
    before = p.pretty()
    assert split_concat_products(p).pretty() == before


def test_a_concatenation_without_gathered_rows_is_left():
    p = _program(parts=("edge", "edge"))
    before = p.pretty()
    assert split_concat_products(p).pretty() == before


def test_the_split_program_computes_the_same_values_and_gradients():
    gen = torch.Generator().manual_seed(0)
    graph = Graph.from_edge_index(EDGES, N)
    x = torch.randn(N, F, dtype=torch.float64, generator=gen, requires_grad=True)
    e = torch.randn(EDGES.shape[1], D, dtype=torch.float64, generator=gen, requires_grad=True)
    w = [torch.randn(2 * F + D, H, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(2)]
    inputs = {"x": x, "e": e, "w0": w[0], "w1": w[1]}

    def value_and_grads(program):
        out = execute(program, GraphContext(graph), inputs)[0]["out"]
        return out, torch.autograd.grad(out.sum(), [x, e, *w])
    original, split = value_and_grads(_program()), value_and_grads(split_concat_products(_program()))
    torch.testing.assert_close(split[0], original[0])
    for a, b in zip(split[1], original[1]):
        torch.testing.assert_close(a, b)
