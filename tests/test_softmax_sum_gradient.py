"""A softmax-weighted neighbour sum's backward takes the normalizer's share from
``<G_v, out_v>`` (autodiff/softmax_sum.py) instead of one more reduction over the
in-edges -- only where that identity is exact. Gradients against plain torch in float64
on both backends, with a hub, a vertex without in-edges and multi-head rows (GAT and
GATv2 against PyG: tests/test_nn_attention.py)."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from oracle_check import assert_matches_oracle

SRC = torch.tensor([0, 1, 2, 3, 0, 2, 3, 1, 2, 3, 0])
DST = torch.tensor([1, 2, 3, 0, 3, 0, 1, 1, 1, 1, 2])     # vertex 4 has no in-edges, vertex 1 is a hub
N, H, D = 5, 2, 3


def _softmax(scores):
    peak = max(scores)
    weights = [torch.exp(s - peak) for s in scores]
    return [w / sum(weights) for w in weights]


@gnnfuse.vertex
def _attention(v):
    scores = [(u.h * v.h).sum(-1) for u in v.innbs]              # [H] per edge
    return sum([a.unsqueeze(-1) * u.h for a, u in zip(_softmax(scores), v.innbs)])


@gnnfuse.vertex
def _attention_and_weights(v):
    """The weights are read twice (also summed as a second output): the identity's
    precondition fails, the op-by-op gradient must be used."""
    scores = [(u.h * v.h).sum(-1) for u in v.innbs]
    weights = _softmax(scores)
    return sum([a.unsqueeze(-1) * u.h for a, u in zip(weights, v.innbs)]) + sum([a * a for a in weights]).unsqueeze(-1)


def _oracle(h, src, dst, squares: bool):
    s = (h[src] * h[dst]).sum(-1)
    peak = torch.full((N, H), -torch.inf, dtype=h.dtype).scatter_reduce(0, dst[:, None].expand(-1, H), s, "amax")
    w = torch.exp(s - peak[dst])
    total = torch.zeros(N, H, dtype=h.dtype).index_add(0, dst, w)
    a = w / total[dst]
    out = torch.zeros(N, H, D, dtype=h.dtype).index_add(0, dst, a.unsqueeze(-1) * h[src])
    if squares:
        out = out + torch.zeros(N, H, dtype=h.dtype).index_add(0, dst, a * a).unsqueeze(-1)
    return out


def _edge_reductions(fn, graph, h) -> int:
    [program] = gnnfuse.explain(fn, graph, {"h": h}).programs
    return sum(1 for v in program.backward.program.values if v.op == "reduce")


def test_the_normalizer_costs_no_edge_reduction_where_the_identity_holds():
    graph, h = gnnfuse.Graph(SRC, DST, N), torch.randn(N, H, D, requires_grad=True)
    # by src: h's gradient through the sum and the scores' source side; by dst: their
    # destination side; and, op by op, the normalizer's (by dst)
    assert _edge_reductions(_attention, graph, h) == 2
    assert _edge_reductions(_attention_and_weights, graph, h) == 3


@pytest.mark.parametrize("fn, squares", [(_attention, False), (_attention_and_weights, True)])
def test_gradients_match_torch(fn, squares, backend, device):
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    h = torch.randn(N, H, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert_matches_oracle(lambda h: {"out": fn(graph, {"h": h}).cpu()},
                          lambda h: {"out": _oracle(h.cpu(), SRC, DST, squares)}, {"h": h.to(device)})



def _normalized_sum_gradients(normalizer_by: str, spread_by: str, sum_by: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(backward program's, torch's) gradient of p for ``out = reduce(p / broadcast(
    reduce(p, normalizer_by), spread_by) * r, sum_by)``, run on the reference executor."""
    from gnnfuse.autodiff import build_backward
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.reference.executor import execute
    from gnnfuse.ir import Program, Residency
    p = Program()
    weights, rows = p.input("p", Residency.EDGE, (H,), torch.float64), p.input("r", Residency.EDGE, (H,), torch.float64)
    total = p.add("reduce", weights, op="sum", by=normalizer_by)
    y = p.add("div", weights, p.add("broadcast", total, by=spread_by))
    p.output("out", p.add("reduce", p.add("mul", y, rows), op="sum", by=sum_by))
    backward = build_backward(p, ["p"])
    ctx = GraphContext(gnnfuse.Graph(SRC, DST, N))
    g = torch.Generator().manual_seed(4)
    feeds = {"p": torch.rand(len(SRC), H, dtype=torch.float64, generator=g) + 0.5,
             "r": torch.randn(len(SRC), H, dtype=torch.float64, generator=g)}
    grad_out = torch.randn(N, H, dtype=torch.float64, generator=g)
    _, kept = execute(p, ctx, feeds, keep=[v.id for v in backward.saved])
    names = {v.id: k for k, v in p.inputs.items()}
    saved = {f"saved:{v.id}": feeds[names[v.id]] if v.id in names else kept[v.id] for v in backward.saved}
    got, _ = execute(backward.program, ctx, {"grad:out": grad_out, **saved})
    index = {"src": SRC, "dst": DST}
    w = feeds["p"].clone().requires_grad_()
    s = torch.zeros(N, H, dtype=torch.float64).index_add(0, index[normalizer_by], w)
    out = torch.zeros(N, H, dtype=torch.float64).index_add(0, index[sum_by], w / s[index[spread_by]] * feeds["r"])
    return got["grad:p"], torch.autograd.grad(out, w, grad_out)[0]


@pytest.mark.parametrize("normalizer_by, spread_by, sum_by", [("dst", "dst", "dst"), ("src", "src", "dst"),
                                                             ("dst", "src", "src")],
                         ids=["one group: the identity", "normalized over out-edges, summed into targets",
                              "normalizer spread by the other end"])
def test_a_normalizer_of_other_edge_groups_than_the_sum_takes_the_op_by_op_gradient(normalizer_by, spread_by,
                                                                                    sum_by):
    """The identity ``c_v = <G_v, out_v>`` needs the normalizer summed, spread and the
    weighted rows summed over one group of edges; over two, the op-by-op gradient.
    Checked against torch's autograd in float64."""
    ours, torchs = _normalized_sum_gradients(normalizer_by, spread_by, sum_by)
    torch.testing.assert_close(ours, torchs, rtol=1e-12, atol=1e-12)
