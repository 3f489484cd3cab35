"""Seastar's multi-hop propagation: a K-hop loop inside one vertex function that ends each
hop with ``v.update_allnode({...})`` (Seastar's APPNP example) compiles into one program
of K chained aggregations. Checked against plain PyTorch and gnnfuse.nn.APPNP on outputs
and gradients in float64, on both backends."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
import gnnfuse.nn
from gnnfuse.runtime import record_calls
from oracle_check import BACKENDS, assert_matches_oracle, device_for

F = 3
# Every vertex has an in-edge; a multi-edge 2->0 twice and a self loop on 3.
SRC = torch.tensor([0, 1, 2, 3, 1, 2, 0, 3, 3, 2])
DST = torch.tensor([1, 2, 0, 0, 3, 3, 2, 1, 3, 0])
N = 4


def features(device: str, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, dtype=torch.float64, generator=gen).to(device) for s in shapes]


def inv_sqrt_in_degree(dst: torch.Tensor) -> torch.Tensor:
    return torch.bincount(dst, minlength=N).to(torch.float64).pow(-0.5).unsqueeze(-1)


def torch_appnp(src, dst, x, K, alpha):
    norm = inv_sqrt_in_degree(dst)
    h = x
    for _ in range(K):
        h = (1 - alpha) * torch.zeros_like(x).index_add(0, dst, (h * norm)[src]) * norm + alpha * x
    return h


class SeastarAPPNP(torch.nn.Module):
    """Seastar's APPNP layer shape: the vertex function is decorated inside ``forward`` and
    loops over the module's hop count, writing each hop's features back for the next."""

    def __init__(self, k: int, alpha: float):
        super().__init__()
        self._k, self._alpha = k, alpha

    def forward(self, graph: gnnfuse.Graph, feat: torch.Tensor) -> torch.Tensor:
        norm = inv_sqrt_in_degree(graph.dst).to(feat.device)

        @gnnfuse.compile(graph, v_feature={"feat": feat, "feat_0": feat, "norm": norm})
        def nb_compute(v):
            for _ in range(self._k):
                feat = sum([nb.feat * nb.norm for nb in v.innbs])
                feat = feat * v.norm
                feat = (1 - self._alpha) * feat + self._alpha * v.feat_0
                v.update_allnode({"feat": feat})
            return feat
        return nb_compute()


@pytest.mark.parametrize("K", [3, 10])
@pytest.mark.parametrize("backend", BACKENDS)
def test_seastar_appnp_matches_torch_and_nn_appnp(K, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    src, dst = SRC.to(device), DST.to(device)
    layer, alpha = SeastarAPPNP(K, 0.15), 0.15
    (x,) = features(device, (N, F))

    def ours(x):
        with record_calls() as calls:
            out = layer(graph, x)
        assert len(calls) == 1 and calls[0].compiled.program.op_count("reduce") == K
        return {"h": out}

    assert_matches_oracle(ours, lambda x: {"h": torch_appnp(src, dst, x, K, alpha)}, {"x": x})
    pyg_style = gnnfuse.nn.APPNP(K, alpha, add_self_loops=False)
    assert_matches_oracle(ours, lambda x: {"h": pyg_style(x, graph)}, {"x": x})


def appnp_with_hops(K: int, alpha: float) -> gnnfuse.VertexFunction:
    @gnnfuse.vertex
    def appnp(v):
        for _ in range(K):
            v.update_allnode({"h": (1 - alpha) * sum([u.h * u.norm for u in v.innbs]) * v.norm
                              + alpha * v.h0})
        return v.h
    return appnp


def test_the_hop_count_closure_constant_is_guarded_by_the_trace_cache():
    """Every ``appnp_with_hops(K)`` has the same code; only the closure's K differs, so a
    trace cached for one K must not answer another."""
    (x,) = features("cpu", (N, F))
    norm = inv_sqrt_in_degree(DST)
    graph = gnnfuse.Graph(SRC, DST, N)
    for K in (3, 5, 3, 4):
        out = appnp_with_hops(K, 0.1)(graph, {"h": x, "h0": x, "norm": norm})
        torch.testing.assert_close(out, torch_appnp(SRC, DST, x, K, 0.1), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_updated_features_reach_in_edge_sources_and_the_center(backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    src, dst = SRC.to(device), DST.to(device)

    @gnnfuse.vertex
    def two_hops(v):
        for _ in range(2):
            v.update_allnode({"h": torch.tanh(sum([e.src.h * e.w for e in v.inedges]) + v.h)})
        return v.h

    def oracle(x, w):
        h = x
        for _ in range(2):
            h = torch.tanh(torch.zeros_like(x).index_add(0, dst, h[src] * w) + h)
        return {"h": h}

    x, w = features(device, (N, F), (len(SRC), 1))
    assert_matches_oracle(lambda x, w: {"h": two_hops(graph, {"h": x}, {"w": w})}, oracle, {"x": x, "w": w})


def test_update_allnode_misuse_is_rejected_at_its_line():
    graph = gnnfuse.Graph(SRC, DST, N)
    x = torch.randn(N, F, dtype=torch.float64)

    @gnnfuse.vertex
    def per_edge(v):
        for u in v.innbs:
            v.update_allnode({"h": u.h * 2.0})
        return v.h

    @gnnfuse.vertex
    def on_a_neighbour(v):
        for u in v.innbs:
            u.update_allnode({"h": v.h})
        return v.h

    @gnnfuse.vertex
    def reserved_name(v):
        v.update_allnode({"type": v.h})
        return v.h

    for fn, match in [(per_edge, r"(?s)needs a per-vertex value, got SRC.*u.h \* 2.0"),
                      (on_a_neighbour, r"(?s)only available on the center vertex.*u.update_allnode"),
                      (reserved_name, r"(?s)cannot set 'type'.*update_allnode\(\{\"type\""),]:
        with pytest.raises(gnnfuse.CompileError, match=match):
            fn(graph, {"h": x})


def test_multihop_gradcheck():
    graph = gnnfuse.Graph(SRC, DST, N)
    norm = inv_sqrt_in_degree(DST)
    x, x0 = features("cpu", (N, 2), (N, 2))
    appnp = appnp_with_hops(2, 0.3)
    assert torch.autograd.gradcheck(lambda x, x0: appnp(graph, {"h": x, "h0": x0, "norm": norm}),
                                    (x.requires_grad_(), x0.requires_grad_()))
