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

