"""torch.jit.script and torch.jit.trace are refused with a message naming them.

Scripting a gnnfuse layer stopped on whatever TorchScript met first ("Unknown type
annotation: 'Graph | None'", "Lambda aren't supported"); tracing one failed on "num_nodes
must be an int, got Tensor", a numba typing error or a C++ ``unordered_map::at``, and once
crashed the interpreter ("double free or corruption"). README promises an error naming
TorchScript."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnnfuse
import gnnfuse.nn as ours
from gnnfuse.nn import message_passing
from gnnfuse.nn.pyg_layers import COMPILED_PYG_LAYERS, EAGER_PYG_LAYERS

EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 3]])


def _public_modules() -> list[type]:
    names = [*ours.__all__, *COMPILED_PYG_LAYERS, *EAGER_PYG_LAYERS, "MessagePassing"]
    return sorted({getattr(ours, n) for n in names
                   if isinstance(getattr(ours, n), type) and issubclass(getattr(ours, n), torch.nn.Module)},
                  key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", _public_modules(), ids=lambda c: c.__name__)
def test_every_public_layer_refuses_torchscript(cls):
    assert hasattr(cls, "__prepare_scriptable__"), f"{cls.__name__} would reach TorchScript's own errors"


@pytest.mark.parametrize("make", [lambda: ours.GCNConv(4, 3), lambda: ours.GATConv(4, 3, heads=2),
                                  lambda: ours.SAGEConv(4, 3), lambda: ours.TransformerConv(4, 3),
                                  lambda: ours.RGCNConv(4, 3, num_relations=2)],
                         ids=["GCNConv", "GATConv", "SAGEConv", "TransformerConv", "RGCNConv"])
def test_scripting_a_model_holding_a_layer_names_the_layer(make):
    layer = make()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ModuleList([layer]))
    with pytest.raises(NotImplementedError, match=f"torch.jit.script cannot compile gnnfuse's {type(layer).__name__}"):
        torch.jit.script(model)


@pytest.mark.parametrize("backend", ["reference", "cpu", "triton"], indirect=True)
@pytest.mark.parametrize("make", [lambda: ours.GCNConv(4, 3), lambda: ours.GATConv(4, 3, heads=2),
                                  lambda: ours.SAGEConv(4, 3)], ids=["GCNConv", "GATConv", "SAGEConv"])
def test_tracing_is_refused_on_edge_index_and_on_a_warm_graph(make, backend, device):
    """With an ``edge_index`` the graph is built under the tracer; with a ``Graph`` called
    twice before (a prepared call that runs the kernels directly) the program is."""
    torch.manual_seed(0)
    layer, x = make().to(device), torch.randn(6, 4, device=device)
    edge_index, graph = EDGE_INDEX.to(device), gnnfuse.Graph.from_edge_index(EDGE_INDEX, 6).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        with pytest.raises(NotImplementedError, match="under torch.jit.trace"):
            torch.jit.trace(layer, (x, edge_index), check_trace=False)
        with torch.no_grad():
            expected = layer(x, graph)
            layer(x, graph)

        class OnGraph(torch.nn.Module):
            def forward(self, x):
                return layer(x, graph)

        with pytest.raises(NotImplementedError, match="under torch.jit.trace"):
            torch.jit.trace(OnGraph(), (x,), check_trace=False)
        with torch.no_grad():
            torch.testing.assert_close(layer(x, graph), expected)     # the layer still runs afterwards


@pytest.mark.parametrize("backend", ["reference", "triton"], indirect=True)
def test_a_compiled_pyg_layer_is_traced_as_pygs_eager_propagate(backend, device):
    """A PyG class compiled by gnnfuse runs PyG's own propagate under the tracer (it warns
    why), so the traced module computes the layer on new inputs. Its sizes read as
    tensors there, and the fallback was reported as "bipartite message passing"."""
    torch.manual_seed(0)
    layer, edge_index = ours.TransformerConv(4, 3).to(device), EDGE_INDEX.to(device)
    x, other = torch.randn(6, 4, device=device), torch.randn(6, 4, device=device)
    message_passing._WARNED.pop(type(layer), None)      # its reason is told once per class and cause
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(layer, (x, edge_index), check_trace=False)
    assert any("under torch.jit.trace" in str(w.message) for w in caught)
    torch.testing.assert_close(traced(other, edge_index), layer(other, edge_index))
