"""passes.softmax.normalize_after_sum: a max-shifted softmax's normalizer divides the
weighted sum once per vertex instead of every edge, which frees the numerator to walk
the CSR beside the normalizer. Values and gradients against plain torch in float64 on
both backends, on a graph with a vertex that has no in-edges (0, never 0 / 0); the
rewrite's own conditions on hand-built programs."""
from __future__ import annotations

import copy

import torch

import gnnfuse
from gnnfuse.backend.reference import GraphContext, execute
from gnnfuse.ir import Program, Residency
from gnnfuse.passes.softmax import normalize_after_sum
from oracle_check import assert_matches_oracle

N, F = 6, 3
SRC = torch.tensor([0, 1, 2, 3, 4, 0, 2, 4, 1, 5])
DST = torch.tensor([1, 2, 3, 4, 0, 3, 0, 1, 1, 2])      # vertex 5 has no in-edges


@gnnfuse.vertex
def _attention(v):
    scores = [(u.h * v.h).sum(-1) for u in v.innbs]
    peak = max(scores)
    weights = [torch.exp(s - peak) for s in scores]
    return sum([(w / sum(weights)).unsqueeze(-1) * u.h for w, u in zip(weights, v.innbs)])


@gnnfuse.vertex
def _unshifted(v):
    weights = [torch.exp((u.h * v.h).sum(-1)) for u in v.innbs]
    return sum([(w / sum(weights)).unsqueeze(-1) * u.h for w, u in zip(weights, v.innbs)])


def _oracle(h, src, dst):
    s = (h[src] * h[dst]).sum(-1)
    peak = torch.full((N,), -torch.inf, dtype=h.dtype, device=h.device).scatter_reduce(0, dst, s, "amax")
    w = torch.exp(s - peak[dst])
    total = torch.zeros(N, dtype=h.dtype, device=h.device).index_add(0, dst, w)
    return torch.zeros(N, F, dtype=h.dtype, device=h.device).index_add(0, dst, (w / total[dst]).unsqueeze(-1) * h[src])


def _forward_ops(fn, graph, h) -> list[str]:
    [program] = gnnfuse.explain(fn, graph, {"h": h}).programs
    return [v.op for v in program.forward.program.values]


def test_a_shifted_softmax_is_divided_after_the_sum_and_an_unshifted_one_is_not():
    graph = gnnfuse.Graph(SRC, DST, N)
    h = torch.randn(N, F, requires_grad=True)
    assert "nonzero_or_one" in _forward_ops(_attention, graph, h)
    # without the shift every weight of a row may underflow: the per-edge form's NaN stays
    assert "nonzero_or_one" not in _forward_ops(_unshifted, graph, h)


def test_values_and_gradients_match_torch_with_an_empty_row(backend, device):
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    h = torch.randn(N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    out = _attention(graph, {"h": h})
    assert torch.all(out[5] == 0) and torch.isfinite(out).all()
    assert_matches_oracle(lambda h: {"out": _attention(graph, {"h": h})},
                          lambda h: {"out": _oracle(h, graph.src.long(), graph.dst.long())}, {"h": h})


def _softmax_program(scale_by_total: bool) -> Program:
    """out_v = sum_e softmax_e * r_e, r_e = x_u, or x_u * s_v (which reads the normalizer)."""
    p = Program()
    x = p.input("x", Residency.NODE, (4,), torch.float64)
    score = p.add("mul", p.add("broadcast", x, by="src"), p.add("broadcast", x, by="dst"))
    peak = p.add("stop_gradient", p.add("reduce", score, op="max", by="dst"))
    weight = p.add("exp", p.add("sub", score, p.add("broadcast", peak, by="dst")))
    total = p.add("reduce", weight, op="sum", by="dst")
    normalized = p.add("div", weight, p.add("broadcast", total, by="dst"))
    rows = p.add("broadcast", x, by="src")
    if scale_by_total:
        rows = p.add("mul", rows, p.add("broadcast", total, by="dst"))
    p.output("out", p.add("reduce", p.add("mul", normalized, rows), op="sum", by="dst"))
    return p


def test_the_rewrite_keeps_values_and_needs_a_normalizer_free_multiplier():
    graph = gnnfuse.Graph(SRC, DST, N)
    x = torch.randn(N, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for scale_by_total in (False, True):
        before = _softmax_program(scale_by_total)
        after = normalize_after_sum(copy.deepcopy(before))
        rewritten = any(v.op == "nonzero_or_one" for v in after.values)
        assert rewritten is not scale_by_total
        want, _ = execute(before, GraphContext(graph), {"x": x})
        got, _ = execute(after, GraphContext(graph), {"x": x})
        torch.testing.assert_close(got["out"], want["out"], rtol=1e-12, atol=0)
        assert torch.all(got["out"][5] == 0)
