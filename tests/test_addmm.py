"""``addmm``: a bias add (or a second product) folded into the matrix product before it (passes/addmm.py), and
views in place of per-edge copies of a table that is in memory anyway (passes/fusion.py's
`_view_of_table`).

Checked on NNConv with an edge network (``Linear -> ReLU -> Linear(hidden, in x out)``,
the benchmark's layer): PyG's outputs and every gradient in float64 on both backends; the
forward writes the [E, in x out] per-edge weights once (the addmm) and the backward
writes one table of that width (the weight gradient's outer products), where before the
forward wrote two and the backward three. And the rewrite taking exactly the
``matmul(x, W) + b`` it may, with the op's own derivative checked in float64."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg_nn
from layer_check import assert_compiled_matches
from oracle_check import device_for

import gnnfuse
import gnnfuse.nn
from gnnfuse.ir import Program, Residency
from gnnfuse.passes.addmm import fold_product_adds
from gnnfuse.passes.dce import eliminate_dead_code
from gnnfuse.passes.reorder import reorder_broadcasts

IN, OUT, EDGE_DIM, HIDDEN, N = 3, 4, 2, 5, 7
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 1, 2, 2, 6], [1, 2, 3, 4, 5, 6, 0, 0, 4, 4, 6]])


def _nnconv(cls):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(EDGE_DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, IN * OUT))
    return cls(IN, OUT, net, aggr="add").double()


def _inputs(device):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(N, IN, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    edge_attr = torch.randn(EDGES.shape[1], EDGE_DIM, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    return x, EDGES.to(device), edge_attr


def _out_and_grads(layer, x, edge_index, edge_attr):
    out = layer(x, edge_index, edge_attr)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    return out, torch.autograd.grad((out * weight).sum(), [x, edge_attr, *layer.parameters()])


def test_nnconv_edge_network_matches_pyg(device):
    ours, theirs = _nnconv(gnnfuse.nn.NNConv).to(device), _nnconv(pyg_nn.NNConv).to(device)
    theirs.load_state_dict(ours.state_dict())
    assert_compiled_matches(ours, theirs, lambda layer: _out_and_grads(layer, *_inputs(device)))


def test_nnconv_writes_its_per_edge_weights_once():
    x, edge_index, edge_attr = _inputs("cpu")
    [program] = gnnfuse.explain(_nnconv(gnnfuse.nn.NNConv), x, edge_index, edge_attr).programs
    wide = {plan.phase: [t.value.op for t in plan.edge_tensors if t.width == IN * OUT]
            for plan in (program.forward, program.backward)}
    assert wide == {"forward": ["addmm"], "backward": ["row_matmul"]}


def _program(bias_shape=(OUT,), rows=Residency.EDGE, extra_use=False, edge_input_width=HIDDEN):
    p = Program()
    h = p.input("h", rows, (edge_input_width,), torch.float64)
    if rows is not Residency.SHARED:
        h = p.add("relu", h)       # not the user's edge features: a product cuBLAS runs
    w = p.input("w", Residency.SHARED, (edge_input_width, OUT), torch.float64)
    b = p.input("b", Residency.SHARED, bias_shape, torch.float64)
    product = p.add("matmul", h, w)
    p.outputs["out"] = p.add("add", product, b)
    if extra_use:
        p.outputs["product"] = product
    return p


def test_rewrite_folds_the_bias_into_the_product():
    p = eliminate_dead_code(fold_product_adds(_program()))
    assert p.op_count("addmm") == 1 and p.op_count("matmul") == 0 and p.op_count("add") == 0


def test_rewrite_accumulates_a_second_product():
    """``x @ W1 + y @ W2`` (a concatenation's gradient through two ``Linear``s): the
    second GEMM adds onto the first's result; the sum's table is never written."""
    p = Program()
    x, y = (p.add("relu", p.input(name, Residency.EDGE, (HIDDEN,), torch.float64)) for name in "xy")
    w1, w2 = (p.input(name, Residency.SHARED, (HIDDEN, OUT), torch.float64) for name in ("w1", "w2"))
    p.outputs["out"] = p.add("add", p.add("matmul", x, w1), p.add("matmul", y, w2))
    p = eliminate_dead_code(fold_product_adds(p))
    assert p.op_count("addmm") == 1 and p.op_count("matmul") == 1 and p.op_count("add") == 0


def test_rewrite_folds_a_product_moved_above_its_gather():
    """``relu(x_src) @ W + b`` runs per vertex after `reorder_broadcasts`, which leaves
    the product's first gather dead but in the program: counted as a second user, it kept
    the product and the add apart (found by a helper's fuzzing)."""
    p = Program()
    x = p.add("broadcast", p.input("x", Residency.NODE, (HIDDEN,), torch.float64), by="src")
    w = p.input("w", Residency.SHARED, (HIDDEN, OUT), torch.float64)
    b = p.input("b", Residency.SHARED, (OUT,), torch.float64)
    p.outputs["out"] = p.add("add", p.add("matmul", p.add("relu", x), w), b)
    p = eliminate_dead_code(fold_product_adds(reorder_broadcasts(p)))
    assert p.op_count("addmm") == 1 and p.op_count("matmul") == 0 and p.op_count("add") == 0


@pytest.mark.parametrize("why", ["bias not one row", "table of other rows", "product used again", "parameter rows",
                                 "edge features", "vector weight"])
def test_rewrite_leaves_what_it_may_not_fold(why):
    if why == "vector weight":     # [4, 4] @ [4] + [4]: the shapes line up, but there is no GEMM column to add onto
        p = Program()
        h = p.add("relu", p.input("h", Residency.EDGE, (OUT, OUT), torch.float64))
        w = p.input("w", Residency.SHARED, (OUT,), torch.float64)
        p.outputs["out"] = p.add("add", p.add("matmul", h, w), p.input("b", Residency.SHARED, (OUT,), torch.float64))
    elif why == "bias not one row":
        p = _program(bias_shape=(1, OUT))
    elif why == "table of other rows":       # a vertex table added to edge rows: a broadcast, not an addend
        p = Program()
        h = p.add("relu", p.input("h", Residency.EDGE, (HIDDEN,), torch.float64))
        w = p.input("w", Residency.SHARED, (HIDDEN, OUT), torch.float64)
        src = p.add("broadcast", p.input("t", Residency.NODE, (OUT,), torch.float64), by="src")
        p.outputs["out"] = p.add("add", p.add("matmul", h, w), src)
    elif why == "product used again":
        p = _program(extra_use=True)
    elif why == "parameter rows":
        p = _program(rows=Residency.SHARED)
    else:                   # a narrow product of the user's edge features: kernels evaluate it in registers
        p = Program()
        e = p.input("e", Residency.EDGE, (EDGE_DIM,), torch.float64)
        w = p.input("w", Residency.SHARED, (EDGE_DIM, OUT), torch.float64)
        p.outputs["out"] = p.add("add", p.add("matmul", e, w), p.input("b", Residency.SHARED, (OUT,), torch.float64))
    before = p.pretty()
    assert fold_product_adds(p).pretty() == before


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_nnconv_gradcheck(backend, monkeypatch):
    """The backward program (addmm's derivative included) against finite differences."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    layer = _nnconv(gnnfuse.nn.NNConv).to(device)
    x, edge_index, edge_attr = _inputs(device)
    assert torch.autograd.gradcheck(lambda x, e: layer(x, edge_index, e), (x, edge_attr))


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"])
def test_an_addmm_output_can_be_written_in_place(backend, monkeypatch):
    """``addmm``'s result is a reshape of the GEMM's rows, a view: autograd refused an
    in-place edit of it ("Output 0 of _ProgramFunction is a view and is being modified
    inplace") where eager code, and the same product without the bias, run."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    src, dst = EDGES.to(device)
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(N, IN, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    w = torch.randn(IN, OUT, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    b = torch.randn(OUT, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    scores = gnnfuse.apply_edges(gnnfuse.Graph(src, dst, N), lambda edges: {"s": (edges.src["h"] * edges.dst["h"]) @ w + b},
                                 ndata={"h": h})["s"]
    eager = (h[src] * h[dst]) @ w + b
    for s in (scores, eager):
        s *= 2.0
    torch.testing.assert_close(scores, eager)
    weight = torch.linspace(-1, 1, eager.numel(), dtype=eager.dtype, device=device).view_as(eager)
    for got, want in zip(torch.autograd.grad((scores * weight).sum(), [h, w, b]),
                         torch.autograd.grad((eager * weight).sum(), [h, w, b])):
        torch.testing.assert_close(got, want)
