"""A generated kernel rounds each float16 or bfloat16 op's result as torch does.

The kernels compute in a float32 accumulator. A value carried unrounded there disagreed
with the same value a unit before had stored rounded: an edge softmax's scores, summed
from bfloat16 features, exceeded the maximum stored in bfloat16 by up to half a unit in
its last place (2048 at 1e6), and ``exp(score - max)`` overflowed to inf, so the output
came out inf and NaN where torch's is finite.
"""
from __future__ import annotations

import pytest
import torch
from oracle_check import device_for

from gnnfuse import frontend
from gnnfuse.graph import Graph


def _softmax_sum(graph: Graph, h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    def message(edges):
        return {"m": edges.src["k"] + edges.dst["k"], "v": edges.src["h"]}

    def reduce(nodes):
        return {"o": torch.sum(torch.softmax(nodes.mailbox["m"], 1) * nodes.mailbox["v"], 1)}
    # the first call, with a backward, ends the graph's first pass (run by the reference executor)
    out = frontend.message_passing(graph, message, reduce, ndata={"h": h, "k": k.clone().requires_grad_(True)})["o"]
    out.float().sum().backward()
    return frontend.message_passing(graph, message, reduce, ndata={"h": h, "k": k})["o"].detach()


def _eager(src: torch.Tensor, dst: torch.Tensor, h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    scores = k[src] + k[dst]
    return torch.stack([(torch.softmax(scores[dst == v], 0) * h[src][dst == v]).sum(0) for v in range(h.shape[0])])


@pytest.mark.parametrize("backend_name, dtype, scale", [
    ("cpu", torch.bfloat16, 1e6),
    ("cpu", torch.float16, 2e4),
    ("triton", torch.float16, 2e4),
    # Triton's interpreter has no bfloat16 (such programs run on the reference backend)
    pytest.param("triton", torch.bfloat16, 1e6, marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                          reason="needs a GPU")),
])
def test_an_edge_softmax_of_large_narrow_scores_is_torchs(backend_name, dtype, scale, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend_name)
    device = device_for(backend_name)
    gen = torch.Generator().manual_seed(0)
    num_nodes, num_edges = 12, 40
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = torch.cat([torch.arange(num_nodes), torch.randint(0, num_nodes, (num_edges - num_nodes,), generator=gen)])
    h = torch.randn(num_nodes, 4, generator=gen, dtype=torch.float64).to(dtype)
    k = (torch.randn(num_nodes, 4, generator=gen, dtype=torch.float64) * scale).to(dtype)
    out = _softmax_sum(Graph(src, dst, num_nodes).to(device), h.to(device), k.to(device)).cpu()
    expected = _eager(src, dst, h, k)
    assert torch.equal(out.isfinite(), expected.isfinite())     # float16's sums overflow in torch as well
    finite = expected.isfinite()
    assert finite.sum() > 20
    torch.testing.assert_close(out[finite].float(), expected[finite].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype, count", [
    (torch.float16, 2051),
    pytest.param(torch.bfloat16, 259, marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="Triton's interpreter has no bfloat16")),
])
def test_an_integer_operand_of_a_narrow_op_is_rounded_to_its_dtype_first(dtype, count, monkeypatch):
    """torch casts an integer operand of a float16/bfloat16 op to that dtype before the op:
    3 * 2051 in float16 is 3 * 2052 = 6156 (3 * 259 in bfloat16, 3 * 260 = 780). The Triton
    kernels read the integer straight into their float32 accumulator and gave 6152 (6153
    rounded once), per edge and in a sum; the CPU backend's test is in test_cpu_backend."""
    from gnnfuse.ops import gsddmm, gspmm
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    graph = Graph(torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 2]), 3).to(device)
    h = torch.full((3, 2), 3.0, dtype=dtype, device=device)
    counts = torch.full((3, 2), count, device=device)
    per_edge = gsddmm(graph, lambda hs, c: hs * c, src=h, dst=counts).cpu()
    summed = gspmm(graph, lambda hs, c: hs * c, "sum", src=h, dst=counts).cpu()
    product = (h.cpu() * counts.cpu())[0, 0]          # an int64 tensor is cast first (a Python int is not)
    assert product.item() == 3 * (count + 1)           # torch's rounding, the oracle
    assert torch.equal(per_edge, torch.full((4, 2), product.item(), dtype=dtype))
    assert torch.equal(summed, (torch.tensor([[1.0], [1.0], [2.0]], dtype=dtype) * product).expand(3, 2))
