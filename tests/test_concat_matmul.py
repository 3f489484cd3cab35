"""`passes.concat_matmul`: a linear map of a concatenation split into one map per part,
so the endpoint parts move before their gathers (PyG's CGConv; GAT-style scores). The
rewritten programs against plain-PyTorch oracles in float64, outputs and every gradient,
on each backend, and the plans it makes."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse import nn as gnn
from oracle_check import BACKENDS, assert_matches_oracle, device_for

N = 6
SRC = torch.tensor([0, 1, 2, 3, 4, 5, 0, 2, 2, 5])
DST = torch.tensor([1, 2, 3, 4, 5, 0, 3, 3, 1, 1])


def _concat_layer(w: torch.Tensor):
    @gnnfuse.vertex
    def layer(v):
        return sum([torch.tanh(torch.cat([e.src.h, v.h, e.a], dim=-1) @ w) for e in v.inedges])
    return layer


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_concat_product_matches_torch(backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    gen = torch.Generator().manual_seed(0)
    inputs = {"h": torch.randn(N, 3, generator=gen, dtype=torch.float64),
              "a": torch.randn(len(SRC), 2, generator=gen, dtype=torch.float64),
              "w": torch.randn(8, 4, generator=gen, dtype=torch.float64)}
    inputs = {k: t.to(device) for k, t in inputs.items()}
    src, dst = graph.src.long(), graph.dst.long()

    def ours(h, a, w):
        return {"out": _concat_layer(w)(graph, {"h": h}, {"a": a})}

    def oracle(h, a, w):
        msg = torch.tanh(torch.cat([h[src], h[dst], a], dim=-1) @ w)
        return {"out": torch.zeros(N, 4, dtype=h.dtype, device=h.device).index_add(0, dst, msg)}

    assert_matches_oracle(ours, oracle, inputs)


def test_endpoint_parts_are_multiplied_per_vertex():
    """The plan: no concatenation is left, and each endpoint's part is a matmul over
    vertex rows, gathered after; only the edge part's 2-lane product stays per edge."""
    graph = gnnfuse.Graph(SRC, DST, N)
    w = torch.randn(8, 4, requires_grad=True)
    report = gnnfuse.explain(_concat_layer(w), graph, {"h": torch.randn(N, 3, requires_grad=True)},
                             {"a": torch.randn(len(SRC), 2)})
    [program] = report.programs
    values = program.call.compiled.program.values
    assert not any(v.op == "concat" for v in values)
    products = [v for v in values if v.op == "matmul"]
    assert sorted(v.residency.name for v in products) == ["EDGE", "NODE", "NODE"]


def test_cgconv_matches_pyg_and_multiplies_per_vertex():
    import torch_geometric.nn as pyg
    torch.manual_seed(1)
    ours, ref = gnn.CGConv(5, dim=3).double(), pyg.CGConv(5, dim=3).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, 5, dtype=torch.float64, requires_grad=True)
    edge_index, edge_attr = torch.stack([SRC, DST]), torch.randn(len(SRC), 3, dtype=torch.float64)
    got, expected = ours(x, edge_index, edge_attr), ref(x, edge_index, edge_attr)
    torch.testing.assert_close(got, expected)
    for a, b in zip(torch.autograd.grad(got.sum(), [x, *ours.parameters()]),
                    torch.autograd.grad(expected.sum(), [x, *ref.parameters()])):
        torch.testing.assert_close(a, b)
    report = gnnfuse.explain(ours, x, edge_index, edge_attr)
    [program] = report.programs
    assert sum(v.op == "matmul" and v.residency.name == "NODE" for v in program.call.compiled.program.values) == 4


def test_a_concatenation_along_another_dim_is_left_whole():
    """``cat`` of two [1, 3] rows along dim -2 is a [2, 3] operand whose rows the matmul
    keeps apart: splitting it over the contraction would be wrong, so it stays."""
    graph = gnnfuse.Graph(SRC, DST, N)
    w = torch.randn(3, 2, dtype=torch.float64)

    @gnnfuse.vertex
    def layer(v):
        return sum([torch.cat([e.src.h.view(1, 3), v.h.view(1, 3)], dim=-2) @ w for e in v.inedges])
    h = torch.randn(N, 3, dtype=torch.float64)
    out = layer(graph, {"h": h})
    src, dst = graph.src.long(), graph.dst.long()
    msg = torch.stack([h[src], h[dst]], dim=1) @ w
    torch.testing.assert_close(out, torch.zeros(N, 2, 2, dtype=h.dtype).index_add(0, dst, msg))
