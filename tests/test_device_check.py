"""Inputs on another device than the graph's are named in a ValueError before anything
runs (issue #11 §3). The check comes first, so meta tensors (no data) reach it."""
from __future__ import annotations

import pytest
import torch

import gnnfuse


def test_inputs_on_another_device_than_the_graph_are_named():
    @gnnfuse.vertex
    def weighted_sum(v):
        return sum([u.h @ weight for u in v.innbs])

    weight = torch.randn(2, 2)
    graph = gnnfuse.Graph([0, 1], [1, 0], 2)
    with pytest.raises(ValueError, match=r"input 'h' \(shape \[2, 2\]\) is on meta but the graph is on cpu"):
        weighted_sum(graph, {"h": torch.zeros(2, 2, device="meta")})
    with pytest.raises(ValueError, match=r"input 'h' \(shape \[2, 2\]\) is on cpu but the graph is on meta"):
        weighted_sum(graph.to("meta"), {"h": torch.zeros(2, 2)})
    weight = torch.randn(2, 2, device="meta")   # a captured parameter, named as the program names it
    with pytest.raises(ValueError, match=r"input 'param0' \(shape \[2, 2\]\) is on meta but the graph is on cpu"):
        weighted_sum(graph, {"h": torch.zeros(2, 2)})


def test_forced_triton_backend_on_host_tensors_names_the_fix(monkeypatch):
    """Outside Triton's interpreter, Triton kernels read CUDA memory only: host tensors
    get a gnnfuse error naming the ways out, not Triton's raw pointer error. The
    interpreter path (TRITON_INTERPRET=1, read at call time) still runs them."""
    @gnnfuse.vertex
    def neighbour_sum(v):
        return sum([u.h for u in v.innbs])

    graph = gnnfuse.Graph([0, 1], [1, 0], 2)
    h = torch.arange(4, dtype=torch.float64).reshape(2, 2)
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"the triton backend runs CUDA tensors, but the graph and inputs "
                                         r"are on cpu: move the tensors and the graph to cuda .*unset "
                                         r"GNNFUSE_BACKEND.*TRITON_INTERPRET=1"):
        neighbour_sum(graph, {"h": h})
    if not torch.cuda.is_available():   # conftest chose the interpreter before triton's import
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert torch.equal(neighbour_sum(graph, {"h": h}), h.flip(0))


@pytest.mark.parametrize("make", [lambda: gnnfuse.nn.GCNConv(2, 3), lambda: gnnfuse.nn.GraphConv(2, 3),
                                  lambda: gnnfuse.nn.SGConv(2, 3), lambda: gnnfuse.nn.TAGConv(2, 3),
                                  lambda: gnnfuse.nn.APPNP(2, 0.1), lambda: gnnfuse.nn.ChebConv(2, 3, 2)],
                         ids=["gcn", "graph", "sgc", "tag", "appnp", "cheb"])
def test_edge_weight_on_another_device_than_the_edge_index_is_named(make):
    """A weighted layer's edge_weight on another device than its edge_index failed in
    torch's ``index_add`` ("self, index and source expected to be in the same device"),
    naming neither argument, or (GraphConv) named the program's input 'e.w'."""
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(ValueError, match=r"edge_weight is on meta but the graph \(edge_index\) is on cpu"):
        make()(torch.randn(3, 2), edge_index, torch.rand(3, device="meta"))
