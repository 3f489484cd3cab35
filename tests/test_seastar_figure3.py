"""Seastar's Figure 3 (GCN and GAT), compiled as printed, against plain PyTorch.

The two ``forward`` methods below are the paper's (/work/shared/papers/000_*.txt, Figure 3)
line for line, with these changes, each marked ``# paper:`` where it is made:

* ``Seastar.compile`` is ``gnnfuse.compile``, which takes the graph as its first argument
  (the paper's decorator finds the graph elsewhere), so ``forward`` receives the graph.
* The final ``return`` of each forward is indented into the method (the figure's layout
  puts it at column 0).
* GAT line 11 ``torch.mm(self.W, h)`` is ``torch.mm(h, self.W)``: h is [N, F_in].
* GAT lines 12-13 ``h * self.attn_u.sum(dim=-1)`` is ``(h * self.attn_u).sum(dim=-1)``:
  the attention logit is the dot product a_u . W h_u (the paper's Figure 2 formula).
* GAT line 17 ``u.eu + u.ev`` is ``u.eu + v.ev``: the logit pairs the neighbour's term with
  the center vertex's, otherwise ``ev`` would never be read from v.
* GAT line 20 ``u.hu`` is ``u.h``: ``v_feature`` has no key ``hu``.

Everything else -- the decorator applied inside ``forward`` on every call, the
``nn.LeakyReLU`` module called on symbolic rows, ``[c/sum(e) for c in e]``,
``range(len(v.innbs))`` -- is compiled as written.
"""
from __future__ import annotations

import torch
from torch import nn

import gnnfuse
from gnnfuse.runtime.compiled import _BY_STRUCTURE

f64 = torch.float64


class GCN(nn.Module):
    def __init__(self, in_feats: int, out_feats: int):
        super().__init__()
        self.W = nn.Parameter(torch.randn(in_feats, out_feats, dtype=f64))
        self.bias = nn.Parameter(torch.randn(out_feats, dtype=f64))

    def gcn_forward(self, graph, h, norm):
        @gnnfuse.compile(graph, v_feature={'norm': norm, 'h': h})   # paper: Seastar.compile, no graph
        def vc_compute(v):
            return sum([torch.mm(u.h, self.W) * u.norm
                        for u in v.innbs])
        return torch.sigmoid(vc_compute() + self.bias)              # paper: at column 0

    forward = gcn_forward


class GAT(nn.Module):
    def __init__(self, in_feats: int, out_feats: int):
        super().__init__()
        self.W = nn.Parameter(torch.randn(in_feats, out_feats, dtype=f64))
        self.attn_u = nn.Parameter(torch.randn(out_feats, dtype=f64))
        self.attn_v = nn.Parameter(torch.randn(out_feats, dtype=f64))
        self.leakyRelu = nn.LeakyReLU(0.2)

    def gat_forward(self, graph, h):
        h = torch.mm(h, self.W)                      # paper: torch.mm(self.W, h)
        eu = (h * self.attn_u).sum(dim=-1)           # paper: h * self.attn_u.sum(dim=-1)
        ev = (h * self.attn_v).sum(dim=-1)           # paper: h * self.attn_v.sum(dim=-1)
        @gnnfuse.compile(graph,                      # paper: Seastar.compile, no graph
            v_feature={"eu" : eu, "ev" : ev, "h" : h})
        def vc_compute(v):
            e = [torch.exp(self.leakyRelu(u.eu+v.ev))    # paper: u.ev
                for u in v.innbs]
            a = [c/sum(e) for c in e]
            hu = [u.h for u in v.innbs]                  # paper: u.hu
            return sum([a[i]*hu[i]
                      for i in range(len(v.innbs))])
        return vc_compute()                          # paper: at column 0

    forward = gat_forward


def gcn_oracle(model: GCN, graph, h, norm):
    msg = (h[graph.src] @ model.W) * norm[graph.src].unsqueeze(-1)
    agg = torch.zeros(graph.num_nodes, model.W.shape[1], dtype=f64).index_add(0, graph.dst, msg)
    return torch.sigmoid(agg + model.bias)


def gat_oracle(model: GAT, graph, h):
    h = h @ model.W
    eu, ev = (h * model.attn_u).sum(-1), (h * model.attn_v).sum(-1)
    e = torch.exp(torch.nn.functional.leaky_relu(eu[graph.src] + ev[graph.dst], 0.2))
    total = torch.zeros(graph.num_nodes, dtype=f64).index_add(0, graph.dst, e)
    a = e / total[graph.dst]
    return torch.zeros_like(h).index_add(0, graph.dst, a.unsqueeze(-1) * h[graph.src])


def graph_and_features(seed: int):
    g = torch.Generator().manual_seed(seed)
    src = torch.cat([torch.randint(0, 8, (30,), generator=g), torch.tensor([1, 2, 3, 4])])
    dst = torch.cat([torch.randint(0, 8, (30,), generator=g), torch.tensor([0, 0, 0, 0])])
    graph = gnnfuse.Graph(src, dst, 10)                     # vertices 8, 9 isolated
    h = torch.randn(10, 5, dtype=f64, generator=g)
    norm = graph.in_degrees().to(f64).clamp_min(1).pow(-0.5)
    return graph, h, norm


def assert_matches(model: nn.Module, ours, theirs) -> None:
    """Outputs, and gradients of every parameter and of the input, to float64 precision."""
    results = []
    for fn in (ours, theirs):
        model.zero_grad()
        out = fn()
        out.pow(2).sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (out, grads), (ref, ref_grads) = results
    assert out.shape == ref.shape and torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-10, atol=1e-12)


def test_figure3_gcn():
    torch.manual_seed(0)
    graph, h, norm = graph_and_features(0)
    model = GCN(5, 4)
    assert_matches(model, lambda: model(graph, h, norm), lambda: gcn_oracle(model, graph, h, norm))


def test_figure3_gat():
    torch.manual_seed(1)
    graph, h, _ = graph_and_features(1)
    model = GAT(5, 4)
    assert_matches(model, lambda: model(graph, h), lambda: gat_oracle(model, graph, h))
    # Decorating inside forward on every call must not recompile: the program is shared.
    before = len(_BY_STRUCTURE)
    model(graph, h)
    assert len(_BY_STRUCTURE) == before
