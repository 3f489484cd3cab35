"""Every compiler-core model, in both front ends, against its oracle: outputs to 1e-6
relative in float64, gradients by gradcheck on small graphs and against the oracle's
autograd gradients on cora's topology."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
import zoo

KINDS = {"vertex": zoo.vertex_models, "message": zoo.message_models}


def small_graph(seed: int) -> gnnfuse.Graph:
    """Random multigraph with self loops, a high-degree hub and isolated vertices."""
    g = torch.Generator().manual_seed(seed)
    n = 9
    src = torch.randint(0, n - 2, (24,), generator=g)
    dst = torch.randint(0, n - 2, (24,), generator=g)
    src = torch.cat([src, torch.tensor([1, 2, 3, 4, 5, 3])])
    dst = torch.cat([dst, torch.tensor([0, 0, 0, 0, 0, 3])])   # hub 0, self loop on 3
    return gnnfuse.Graph(src, dst, n)                            # vertices 7, 8 isolated


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", zoo.MODELS)
def test_outputs_match_oracle(name, kind):
    g = torch.Generator().manual_seed(1)
    graph = small_graph(1)
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=g)
    p = zoo.params(name, g)
    out = KINDS[kind](x, graph, p)[name]()
    ref = zoo.oracle(name, x, graph, p)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-6


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", zoo.MODELS)
def test_gradcheck(name, kind):
    g = torch.Generator().manual_seed(2)
    graph = small_graph(2)
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=g, requires_grad=True)
    p = {k: v.requires_grad_() for k, v in zoo.params(name, g).items()}
    keys = list(p)

    def run(x, *values):
        return KINDS[kind](x, graph, dict(zip(keys, values)))[name]()

    assert torch.autograd.gradcheck(run, (x, *p.values()), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def cora_graph(shared_data):
    from gnnfuse.data import load_planetoid
    return load_planetoid("cora", root=shared_data).graph


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", zoo.MODELS)
def test_cora_outputs_and_gradients_match_oracle(name, kind, cora_graph):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(cora_graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=g)
    p = zoo.params(name, g)
    seed = torch.randn(cora_graph.num_nodes, dtype=torch.float64, generator=g)

    def grads(fn):
        xs = x.clone().requires_grad_()
        ps = {k: v.clone().requires_grad_() for k, v in p.items()}
        out = fn(xs, ps)
        (out * seed.view(-1, *[1] * (out.dim() - 1))).sum().backward()
        return out.detach(), [xs.grad] + [ps[k].grad for k in p]

    out, g_ours = grads(lambda xs, ps: KINDS[kind](xs, cora_graph, ps)[name]())
    ref, g_ref = grads(lambda xs, ps: zoo.oracle(name, xs, cora_graph, ps))
    assert rel_err(out, ref) < 1e-6
    for a, b in zip(g_ours, g_ref):
        assert rel_err(a, b) < 1e-6
