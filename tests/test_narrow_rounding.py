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
