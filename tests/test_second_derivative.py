"""Second derivatives (backward with ``create_graph=True``) through compiled programs are
exact or refused, never silently wrong: on the reference backend a program whose backward
reads only its inputs (GCN's and SAGE's sums) passes gradgradcheck; generated kernels,
and backwards that read forward intermediates (GAT's softmax), raise a clear error where
autograd would have returned wrong second derivatives."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
import gnnfuse.nn
from oracle_check import device_for


def _graph(device: str) -> gnnfuse.Graph:
    gen = torch.Generator().manual_seed(0)
    return gnnfuse.Graph(torch.randint(0, 8, (20,), generator=gen), torch.randint(0, 8, (20,), generator=gen),
                         8).to(device)


LAYERS = {"gcn": lambda: gnnfuse.nn.GCNConv(4, 3), "sage": lambda: gnnfuse.nn.SAGEConv(4, 3),
          "gat": lambda: gnnfuse.nn.GATConv(4, 3, heads=2)}


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_programs_linear_in_their_inputs_differentiate_twice_on_the_reference_backend(name, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    layer = LAYERS[name]().double()
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a: layer(a, _graph("cpu")), (x,))


@pytest.mark.parametrize("backend, name, reason", [
    ("reference", "gat", "reads values the forward computed without autograd"),
    ("triton", "gcn", "generated kernels"),
    ("triton", "sage", "generated kernels"),
    ("triton", "gat", "generated kernels"),
])
def test_other_second_derivatives_are_refused(backend, name, reason, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    layer = LAYERS[name]().double().to(device)
    x = torch.randn(8, 4, dtype=torch.float64, device=device, requires_grad=True)
    out = layer(x, _graph(device))
    (first,) = torch.autograd.grad(out.sum(), x, retain_graph=True)     # first order: fine
    assert torch.isfinite(first).all()
    with pytest.raises(NotImplementedError, match=f"second derivative.*{reason}"):
        torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)


def test_the_refusal_names_the_layer_that_ran_the_program(monkeypatch):
    """The refusal comes in the backward, after the forwards returned; it named only the
    program's inputs (``h``), so a model of several SAGE layers could not tell which one
    refused. It names the layer that ran the program, also a PyG class run by gnnfuse and
    a layer outside the compile path (RGAT)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    torch.manual_seed(0)
    graph, edge_type = _graph("cpu"), torch.randint(0, 2, (20,))
    edge_index = graph.edge_index
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    sums = torch.nn.Sequential(*[gnnfuse.nn.SAGEConv(4, 4) for _ in range(2)]).double()
    calls = {"SAGEConv": lambda: gnnfuse.nn.SAGEConv(4, 3, aggr="max").double()(sums[1](sums[0](x, graph), graph),
                                                                                  graph),
             "TransformerConv": lambda: gnnfuse.nn.TransformerConv(4, 3).double()(x, graph),
             "RGATConv": lambda: gnnfuse.nn.RGATConv(4, 3, 2).double()(x, edge_index, edge_type)}
    for name, call in calls.items():
        out = call()
        with pytest.raises(NotImplementedError, match=f"^{name}: a second derivative .*reduce.*PyG counterpart"):
            torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)


def test_the_refusal_of_a_vertex_function_names_the_line_that_made_the_value(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")

    @gnnfuse.vertex
    def largest(v):
        return max([u.h for u in v.innbs]) * 2

    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    out = largest(_graph("cpu"), {"h": x})
    with pytest.raises(NotImplementedError, match=r"program on \(h\).*reduce\[max\] at .*test_second_derivative"
                                                  r".*max\(\[u\.h for u in v\.innbs\]\).*in plain torch"):
        torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
