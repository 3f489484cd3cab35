"""The PyG-compatible layers against PyG itself: same state dict, same outputs and
gradients in float64, with a PyG edge_index or a gnnfuse Graph, on the reference backend and on generated
kernels (Triton's interpreter without a GPU)."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.graph.index_cache import clear_index_cache
from layer_check import assert_same_outputs_and_grads
from oracle_check import device_for

LAYERS = {
    "gcn": lambda: (gnn.GCNConv(12, 6), pyg.GCNConv(12, 6)),
    "gcn-no-loops": lambda: (gnn.GCNConv(12, 6, add_self_loops=False), pyg.GCNConv(12, 6, add_self_loops=False)),
    "gat": lambda: (gnn.GATConv(12, 4, heads=3), pyg.GATConv(12, 4, heads=3)),
    "gat-mean-heads": lambda: (gnn.GATConv(12, 4, heads=3, concat=False), pyg.GATConv(12, 4, heads=3, concat=False)),
    "sage-mean-narrowing": lambda: (gnn.SAGEConv(12, 6), pyg.SAGEConv(12, 6)),
    "sage-mean-widening": lambda: (gnn.SAGEConv(12, 20), pyg.SAGEConv(12, 20)),
    "sage-max": lambda: (gnn.SAGEConv(12, 6, aggr="max"), pyg.SAGEConv(12, 6, aggr="max")),
    "sage-sum": lambda: (gnn.SAGEConv(12, 6, aggr="sum"), pyg.SAGEConv(12, 6, aggr="sum")),
}


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("as_graph", [True, False], ids=["Graph", "edge_index"])
@pytest.mark.parametrize("backend", ["reference", "triton", pytest.param("first-pass", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="a new small edge_index on a GPU runs on the reference backend "
    "(runtime/first_pass.py); on a CPU that is the reference case"))])
def test_layer_matches_pyg(name, as_graph, backend, monkeypatch):
    if backend == "first-pass":      # the device's default: the reference backend's torch ops on CUDA tensors
        monkeypatch.delenv("GNNFUSE_BACKEND", raising=False)
        clear_index_cache()     # a graph of these edges kept by an earlier case is no new one
    else:
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    torch.manual_seed(0)
    n = 40
    edge_index = torch.randint(0, n - 3, (2, 200))              # last three vertices isolated
    device = "cuda" if backend != "reference" and torch.cuda.is_available() else "cpu"
    ours, ref = (m.double().to(device) for m in LAYERS[name]())
    ours.load_state_dict(ref.state_dict())
    edge_index = edge_index.to(device)
    x = torch.randn(n, 12, dtype=torch.float64).to(device)
    graph = gnnfuse.Graph.from_edge_index(edge_index, num_nodes=n) if as_graph else edge_index
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, graph), lambda xs: ref(xs, edge_index), x)


def test_unknown_aggregation_is_rejected():
    with pytest.raises(ValueError, match="Could not resolve 'nosuch'"):
        gnn.SAGEConv(4, 4, aggr="nosuch")


def test_graph_size_must_match_features():
    graph = gnnfuse.Graph(torch.tensor([0]), torch.tensor([1]), 5)
    with pytest.raises(ValueError, match="x has 3 rows but the graph has 5 nodes"):
        gnn.GCNConv(4, 4)(torch.randn(3, 4), graph)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_gcn_on_sparse_features_that_widen_equals_the_dense_call(backend, monkeypatch):
    """A widening GCNConv aggregates first, which the compiled aggregation cannot do on a
    sparse COO input ("input 'h' is a torch.sparse_coo tensor"); the registry's gcn takes
    bag-of-words features sparse, so a data set with few of them failed to train."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 2]), 3).to(device)
    x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0]], dtype=torch.float64, device=device)
    torch.manual_seed(0)
    conv = gnn.GCNConv(3, 4).double().to(device)
    grads = []
    for features in (x.to_sparse(), x):
        conv.zero_grad()
        out = conv(features, graph)
        out.square().sum().backward()
        grads.append((out.detach(), conv.lin.weight.grad.clone()))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)
