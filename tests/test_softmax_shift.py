"""A softmax over in-edges written out by hand, ``exp(s - max(s)) / sum(exp(s - max(s)))``:
its shift's gradient is exactly zero, so the compiler stops it (passes/softmax.py) and
the backward spends no pass on the max's ties -- but only where the exponentials are
used normalized, never when they leak out unnormalized. Gradients against plain torch
in float64 on both backends."""
from __future__ import annotations

import torch

import gnnfuse
from oracle_check import assert_matches_oracle

SRC = torch.tensor([0, 1, 2, 3, 4, 0, 2, 4, 1])
DST = torch.tensor([1, 2, 3, 4, 0, 3, 0, 1, 1])
N, F = 5, 3


@gnnfuse.vertex
def _softmax_by_hand(v):
    scores = [(u.h * v.h).sum(-1) for u in v.innbs]
    peak = max(scores)
    weights = [torch.exp(s - peak) for s in scores]
    return sum([(w / sum(weights)).unsqueeze(-1) * u.h for w, u in zip(weights, v.innbs)])


@gnnfuse.vertex
def _unnormalized_leak(v):
    """exp(s - max) also summed unnormalized: the result depends on the max."""
    scores = [(u.h * v.h).sum(-1) for u in v.innbs]
    peak = max(scores)
    weights = [torch.exp(s - peak) for s in scores]
    return sum([(w / sum(weights)).unsqueeze(-1) * u.h for w, u in zip(weights, v.innbs)]) + sum(weights).unsqueeze(-1)


def _oracle(h, src, dst, leak: bool):
    s = (h[src] * h[dst]).sum(-1)
    peak = torch.full((N,), -torch.inf, dtype=h.dtype, device=h.device).scatter_reduce(0, dst, s, "amax")
    w = torch.exp(s - peak[dst])
    total = torch.zeros(N, dtype=h.dtype, device=h.device).index_add(0, dst, w)
    out = torch.zeros(N, F, dtype=h.dtype, device=h.device).index_add(0, dst, (w / total[dst]).unsqueeze(-1) * h[src])
    return out + total.unsqueeze(-1) if leak else out


def _backward_ops(fn, graph, h) -> list[str]:
    [program] = gnnfuse.explain(fn, graph, {"h": h}).programs
    return [v.op for v in program.backward.program.values]


def test_hand_written_softmax_shift_gets_no_gradient_pass():
    graph = gnnfuse.Graph(SRC, DST, N)
    h = torch.randn(N, F, requires_grad=True)
    ops = _backward_ops(_softmax_by_hand, graph, h)
    assert "eq" not in ops   # no counting of the max's ties
    assert "eq" in _backward_ops(_unnormalized_leak, graph, h)   # there the max matters


def test_gradients_match_torch_with_and_without_the_stop(backend, device):
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    h = torch.randn(N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    src, dst = graph.src.long(), graph.dst.long()
    for fn, leak in ((_softmax_by_hand, False), (_unnormalized_leak, True)):
        assert_matches_oracle(lambda h, fn=fn: {"out": fn(graph, {"h": h})},
                              lambda h, leak=leak: {"out": _oracle(h, src, dst, leak)}, {"h": h})


def test_training_and_evaluation_forwards_share_their_units():
    """The stopped max is the identity in the forward, so the backward saves the max
    itself: a training forward (which keeps what the backward reads) then fuses the stop
    into its readers as the evaluation forward does, and the two generate the same
    kernels. Before, the training forward kept the stop as a plan step, its sum pass read
    it as a leaf, and a GATConv compiled that pass (and the weighted sum) twice."""
    from gnnfuse import nn as gnn
    torch.manual_seed(0)
    layer = gnn.GATConv(F, 4, heads=2)
    edge_index = torch.stack([SRC, DST])
    x = torch.randn(N, F)

    def units(training: bool) -> list[str]:
        layer.train(training)
        with torch.set_grad_enabled(training):
            [program] = gnnfuse.explain(lambda xs: layer(xs, edge_index), x.clone().requires_grad_(training)).programs
        assert (program.backward is not None) == training
        return [step.label for step in program.forward.steps if step.fused]
    assert units(True) == units(False)
    assert not any("stop_gradient:" in label for label in units(True))
