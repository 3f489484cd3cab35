"""torch.func transforms (grad, vmap, ...) over gnnfuse layers: refused by name where they
cannot be followed, and never leaving behind a graph or layout built from the
transform's tensors. A failed torch.func.grad call on the Triton backend used to keep
the graph it built for its edge_index, and every later plain call on that edge_index
failed with "Cannot access storage of TensorWrapper"."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, vmap

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.graph import index_cache
from oracle_check import device_for

REFUSED = r"gnnfuse layers do not support torch.func transforms"


def _inputs(device: str = "cpu"):
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 12, (2, 40), generator=gen).to(device), torch.randn(12, 6, generator=gen).to(device)


def _wrapped(graph: gnnfuse.Graph) -> bool:
    return any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in (graph.src, graph.dst))


@pytest.mark.parametrize("backend", ["triton", "cpu"])
def test_grad_is_refused_by_name_and_leaves_the_edge_index_usable(backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    torch.manual_seed(0)
    device = device_for(backend)
    edge_index, x = _inputs(device)
    sage = gnn.SAGEConv(6, 5).to(device)
    params = {k: v.detach() for k, v in sage.named_parameters()}
    with pytest.raises(NotImplementedError, match=rf"SAGEConv: {REFUSED}.*: the {backend} backend's kernels"):
        grad(lambda p: functional_call(sage, p, (x, edge_index)).sum())(params)
    gin = gnn.GINConv(torch.nn.Linear(6, 5)).to(device)
    torch.testing.assert_close(gin(x, edge_index), gin(x, edge_index.clone()))     # failed: a wrapper kept
    torch.testing.assert_close(sage(x, edge_index), sage(x, edge_index.clone()))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_vmap_over_features_is_refused_by_name(backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    edge_index, x = _inputs(device)
    conv = gnn.GCNConv(6, 5).to(device)
    with pytest.raises(NotImplementedError, match=f"GCNConv: {REFUSED}"):
        vmap(lambda xs: conv(xs, edge_index))(torch.randn(3, 12, 6, device=device))
    assert not _wrapped(gnnfuse.Graph.coerce(edge_index, num_nodes=12))
    torch.testing.assert_close(conv(x, edge_index), conv(x, edge_index.clone()))


def test_reference_backend_grad_of_the_weights_is_autograds(monkeypatch):
    """What the reference backend runs -- torch ops on features the transform does not
    reach -- is followed by the transform: PyG-equivalent weight gradients, and no graph
    built inside it is kept."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    torch.manual_seed(0)
    edge_index, x = _inputs()
    x = x.double()      # outside the transform: a tensor made inside it is the transform's
    index_cache.clear_index_cache()
    for layer in (gnn.SAGEConv(6, 8), gnn.GINConv(torch.nn.Linear(6, 5))):
        layer = layer.double()
        params = {k: v.detach() for k, v in layer.named_parameters()}
        got = grad(lambda p: functional_call(layer, p, (x, edge_index)).square().sum())(params)
        assert not _wrapped(gnnfuse.Graph.coerce(edge_index, num_nodes=12))
        layer(x, edge_index).square().sum().backward()
        for k, p in layer.named_parameters():
            torch.testing.assert_close(got[k], p.grad)


def test_grad_through_a_fused_program_is_refused_by_name(monkeypatch):
    """Differentiating the features runs the fused program's autograd.Function, which
    the transform cannot enter: torch's message about setup_context became one naming
    the layer."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    edge_index, x = _inputs()
    for layer in (gnn.SAGEConv(6, 8), gnn.SAGEConv(6, 2), gnn.GCNConv(6, 5)):
        with pytest.raises(NotImplementedError, match=f"{type(layer).__name__}: {REFUSED}"):
            grad(lambda xs: layer(xs, edge_index).sum())(x)
        assert not _wrapped(gnnfuse.Graph.coerce(edge_index, num_nodes=12))
    layer = gnn.GCNConv(6, 5)
    graph = gnnfuse.Graph.from_edge_index(edge_index, num_nodes=12)
    with pytest.raises(NotImplementedError, match=f"GCNConv: {REFUSED}"):
        grad(lambda xs: layer(xs, graph).sum())(x)
    assert not any(torch._C._functorch.is_functorch_wrapped_tensor(v) for v in graph._cache.values()
                   if isinstance(v, torch.Tensor))      # a layout built inside the transform is not kept
    layer(x, graph)


BATCHED = r"a batched backward \(torch.autograd.grad\(\.\.\., is_grads_batched=True\).* is not supported"


@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"])
def test_a_batched_backward_is_refused_by_name_or_matches_row_by_row_gradients(backend, monkeypatch):
    """``is_grads_batched=True`` (and ``jacobian(vectorize=True)``) runs a backward under
    vmap: where its ops batch (the reference backend's GCN) it gives the row-by-row
    gradients; where they do not, the refusal names the option, not only torch's "Batching
    rule not implemented for aten::mul.out"."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    edge_index, x = _inputs(device)
    x = x.double().requires_grad_()
    for layer in (gnn.GCNConv(6, 2), gnn.GATConv(6, 2, heads=2)):
        out = layer.double().to(device)(x, edge_index)
        rows = torch.eye(out.numel(), dtype=out.dtype, device=device).view(-1, *out.shape)
        if backend == "reference" and isinstance(layer, gnn.GCNConv):
            (batched,) = torch.autograd.grad(out, x, rows, is_grads_batched=True, retain_graph=True)
            for row, got in zip(rows, batched):
                torch.testing.assert_close(got, torch.autograd.grad(out, x, row, retain_graph=True)[0])
            continue
        with pytest.raises(NotImplementedError, match=BATCHED):
            torch.autograd.grad(out, x, rows, is_grads_batched=True)
        with pytest.raises(NotImplementedError, match=BATCHED):
            torch.autograd.functional.jacobian(lambda xs: layer(xs, edge_index), x, vectorize=True)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_typed_graph_layers_name_themselves_when_refused(backend, monkeypatch):
    """RGCNConv and HGTConv run their programs outside the wrapper that names a layer in a
    transform's refusal: "gnnfuse layers do not support torch.func transforms" named no layer."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    edge_index, x = _inputs(device)
    edge_type = (torch.arange(40) % 3).to(device)
    rgcn = gnn.RGCNConv(6, 5, 3).to(device)
    params = {k: v.detach() for k, v in rgcn.named_parameters()}
    with pytest.raises(NotImplementedError, match=f"^RGCNConv: {REFUSED}"):
        grad(lambda p: functional_call(rgcn, p, (x, edge_index, edge_type)).sum())(params)
    xs = {"a": x[:8], "b": x[8:]}
    edges = {("a", "to", "b"): torch.stack([torch.arange(8), torch.arange(8) % 4]).to(device),
             ("b", "to", "a"): torch.stack([torch.arange(4), torch.arange(4)]).to(device)}
    hgt = gnn.HGTConv(6, 4, (["a", "b"], list(edges)), heads=2).to(device)
    params = {k: v.detach() for k, v in hgt.named_parameters()}
    with pytest.raises(NotImplementedError, match=f"^HGTConv: {REFUSED}"):
        grad(lambda p: sum(o.sum() for o in functional_call(hgt, p, (xs, edges)).values()))(params)
