"""``narrow(x @ W) = x @ narrow(W)`` (passes/narrow_products.py): the gradient of a
concatenation fed to ``Linear``s is sliced from the weights, so each part's gradient is
its own packed product and an unread part is never computed.

Checked: the rewrite takes exactly the slices it may (every use of the product or sum a
last-dim slice, not returned); CGConv's backward writes no concatenation-wide product
and matches PyG's gradients in float64 on both backends, with and without a gradient
for the edge features (the part the rewrite drops when nobody reads it)."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg_nn
from layer_check import assert_compiled_matches

import gnnfuse
import gnnfuse.nn
from gnnfuse.ir import Program, Residency
from gnnfuse.passes.dce import eliminate_dead_code
from gnnfuse.passes.narrow_products import narrow_products

F, EDGE_DIM, N = 4, 2, 6
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 2, 5], [1, 2, 3, 4, 5, 0, 0, 4, 4, 5]])


def _program(extra_use: str | None = None) -> Program:
    """``g @ W1^T + h @ W2^T`` sliced into three parts, as CGConv's backward has it."""
    p = Program()
    g, h = (p.add("relu", p.input(name, Residency.EDGE, (F,), torch.float64)) for name in "gh")
    w1, w2 = (p.input(name, Residency.SHARED, (F, 2 * F + EDGE_DIM), torch.float64) for name in ("w1", "w2"))
    product = p.add("matmul", g, w1)
    total = p.add("add", product, p.add("matmul", h, w2))
    for n, (start, length) in enumerate([(0, F), (F, F), (2 * F, EDGE_DIM)][:2]):
        p.outputs[f"part{n}"] = p.add("narrow", total, dim=-1, start=start, length=length)
    if extra_use == "sum returned":
        p.outputs["total"] = total
    elif extra_use == "product read whole":
        p.outputs["whole"] = p.add("relu", product)
    return p


def test_rewrite_slices_the_weights():
    p = eliminate_dead_code(narrow_products(_program()))
    widths = sorted(v.shape[-1] for v in p.values if v.op == "matmul")
    assert widths == [F, F, F, F]                     # two parts x two products, the third part dropped
    assert all(v.inputs[0].residency is Residency.SHARED for v in p.values if v.op == "narrow")


def test_rewrite_leaves_a_product_by_a_vector():
    """[4, 4] @ [4] is [4]: its last dim is the rows of ``x``, not columns of the weight."""
    p = Program()
    h = p.add("relu", p.input("h", Residency.EDGE, (F, F), torch.float64))
    product = p.add("matmul", h, p.input("w", Residency.SHARED, (F,), torch.float64))
    p.outputs["out"] = p.add("narrow", product, dim=-1, start=1, length=2)
    before = p.pretty()
    assert narrow_products(p).pretty() == before


@pytest.mark.parametrize("extra_use", ["sum returned", "product read whole"])
def test_rewrite_leaves_a_product_read_whole(extra_use):
    p = narrow_products(_program(extra_use))
    wide = [v for v in eliminate_dead_code(p).values if v.op == "matmul" and v.shape[-1] == 2 * F + EDGE_DIM]
    assert wide, "a product (or sum) read whole must still be computed whole"


def _cgconv(cls):
    torch.manual_seed(0)
    return cls(F, dim=EDGE_DIM, aggr="add").double()


@pytest.mark.parametrize("edge_grad", [False, True])
def test_cgconv_matches_pyg(device, edge_grad):
    ours, theirs = _cgconv(gnnfuse.nn.CGConv).to(device), _cgconv(pyg_nn.CGConv).to(device)
    theirs.load_state_dict(ours.state_dict())

    def run(layer):
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(N, F, dtype=torch.float64, generator=gen).to(device).requires_grad_()
        e = torch.randn(EDGES.shape[1], EDGE_DIM, dtype=torch.float64, generator=gen).to(device)
        e.requires_grad_(edge_grad)
        out = layer(x, EDGES.to(device), e)
        wanted = [x, *([e] if edge_grad else []), *layer.parameters()]
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=device).view_as(out)
        return out, torch.autograd.grad((out * weight).sum(), wanted)

    assert_compiled_matches(ours, theirs, run)


def test_cgconv_backward_writes_no_concatenation_wide_product():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, requires_grad=True, generator=gen)
    e = torch.randn(EDGES.shape[1], EDGE_DIM, generator=gen)
    [program] = gnnfuse.explain(gnnfuse.nn.CGConv(F, dim=EDGE_DIM), x, EDGES, e).programs
    products = [(t.value.op, t.width) for t in program.backward.edge_tensors if t.value.op in ("matmul", "addmm")]
    assert products and all(width == F for _, width in products), products
