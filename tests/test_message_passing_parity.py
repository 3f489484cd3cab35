"""Differential tests of `gnnfuse.nn.MessagePassing` against PyG's eager base class:
one user layer (a class body written once, built on either base), the same weights and
inputs in float64, and every output and gradient compared -- on the reference backend
and the Triton interpreter. Each test is a PyG feature a user's layer relies on, found
to differ from PyG without an error or warning, with the numbers it gave."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn.aggr import SoftmaxAggregation

import gnnfuse.nn
from gnnfuse.runtime import record_calls

# 6 vertices (4 and 5 send nothing, 4 receives nothing), a self loop (3 -> 3) and a
# duplicate edge (0 -> 1 twice)
EDGES = torch.tensor([[0, 1, 2, 3, 1, 2, 2, 0, 5, 0],
                      [1, 2, 3, 3, 0, 0, 1, 1, 1, 1]])


def make_aggregating(Base: type) -> type:
    """Messages are the sources' rows; ``aggr`` is the constructor's."""
    class Aggregating(Base):
        def __init__(self, aggr, aggr_kwargs=None):
            super().__init__(aggr=aggr, aggr_kwargs=aggr_kwargs)

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j
    return Aggregating


def run(layer: torch.nn.Module, *args: torch.Tensor, **kwargs):
    """Output and the gradients of a fixed projection of it w.r.t. every float input and
    parameter."""
    leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    out = layer(*leaves, **kwargs)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    inputs = [a for a in leaves if a.requires_grad] + list(layer.parameters())
    return out.detach(), torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True)


def assert_same(ours, theirs) -> None:
    (out, grads), (ref, ref_grads) = ours, theirs
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        assert (g is None) == (r is None)
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def compiled_run(layer: torch.nn.Module, *args: torch.Tensor, **kwargs):
    """`run`, checking that a compiled program ran and nothing fell back."""
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(layer, *args, **kwargs)
    fallbacks = [str(w.message) for w in caught if "eager message passing" in str(w.message)]
    assert not fallbacks, fallbacks
    assert calls, "no compiled program ran"
    return result


def twins(make: type, *args, **kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The layer ``make(Base)(*args, **kwargs)`` on gnnfuse's base and on PyG's, with the
    same float64 weights."""
    ours = make(gnnfuse.nn.MessagePassing)(*args, **kwargs).double()
    theirs = make(pyg_nn.MessagePassing)(*args, **kwargs).double()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize("aggr, aggr_kwargs", [
    (lambda: SoftmaxAggregation(t=0.3), None), (lambda: SoftmaxAggregation(t=0.3, semi_grad=True), None),
    (lambda: "softmax", {"t": 0.3})], ids=["module", "semi_grad", "aggr_kwargs"])
def test_a_softmax_temperature_scales_in_the_messages_dtype(aggr, aggr_kwargs, backend, device):
    """PyG multiplies the messages by the Python float ``t``; the trace took it as a
    float32 constant (0.30000001192...): 1.4e-8 off PyG's float64 output."""
    ours, theirs = twins(make_aggregating, aggr(), aggr_kwargs)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    assert_same(compiled_run(ours.to(device), x, edges), run(theirs.to(device), x, edges))


def test_genconv_with_a_fixed_temperature_matches_pyg(backend, device):
    """PyG's GENConv(aggr='softmax', t=0.3) through the same aggregation: 1.3e-9 off PyG's
    float64 output before."""
    torch.manual_seed(0)
    theirs = pyg_nn.GENConv(6, 4, aggr="softmax", t=0.3).double().to(device)
    ours = gnnfuse.nn.GENConv(6, 4, aggr="softmax", t=0.3).double().to(device)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    assert_same(compiled_run(ours, x, edges), run(theirs, x, edges))
