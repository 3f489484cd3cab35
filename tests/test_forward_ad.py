"""Forward-mode AD (dual tensors) through gnnfuse: the reference backend's torch ops, with
grad enabled and no input needing a gradient, carry the tangents (checked against the
layer's reverse-mode Jacobian-vector product); everywhere else the tangents would be lost
and the call is refused naming the layer. The Triton and CPU kernels read raw memory: a
GIN layer's tangent came back as its input's, the neighbour sum's part dropped, and a GCN
layer's came back None, without a word."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import gnnfuse
import gnnfuse.nn as gnn
from gnnfuse.runtime.compiled import ForwardADError

SRC = torch.tensor([0, 1, 2, 3, 4, 5, 0, 3])
DST = torch.tensor([1, 2, 3, 4, 5, 0, 3, 3])
LAYERS = {"gcn": lambda: gnn.GCNConv(3, 4), "gin": lambda: gnn.GINConv(torch.nn.Linear(3, 4)),
          "sage-max": lambda: gnn.SAGEConv(3, 4, aggr="max"), "gat": lambda: gnn.GATConv(3, 2, heads=2),
          # a PyG class compiled by gnnfuse (its propagate's refusal was not named)
          "transformer": lambda: gnn.TransformerConv(3, 2, heads=2)}


def _layer(name: str, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = LAYERS[name]().double().to(device)
    layer.requires_grad_(False)      # only x carries a tangent
    return layer


def _finite_difference(fn, x: torch.Tensor, tangent: torch.Tensor, step: float = 1e-6) -> torch.Tensor:
    with torch.no_grad(), fwAD.dual_level():       # (no dual input: the plain path)
        return (fn(x + step * tangent) - fn(x - step * tangent)) / (2 * step)


def _tangent_matches_or_is_refused(layer: torch.nn.Module, edge_index: torch.Tensor, width: int,
                                   weights_need_grad: bool) -> None:
    """``layer``'s tangent on a dual input equals the finite difference, or the call is
    refused naming the layer, only where its weights need a gradient."""
    gen = torch.Generator().manual_seed(1)
    x, tangent = (torch.randn(6, width, dtype=torch.float64, generator=gen) for _ in range(2))
    try:
        with fwAD.dual_level():
            out = fwAD.unpack_dual(layer(fwAD.make_dual(x, tangent), edge_index))
    except ForwardADError as error:
        assert weights_need_grad and str(error).startswith(f"{type(layer).__name__}: ")
        assert "needs a gradient" in str(error)
        return
    assert out.tangent is not None
    torch.testing.assert_close(out.tangent, _finite_difference(lambda v: layer(v, edge_index), x, tangent),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weights_need_grad", [False, True])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_reference_tangents_equal_finite_differences_or_are_refused_by_name(name, weights_need_grad,
                                                                             monkeypatch):
    """With grad enabled the reference backend's torch ops carry x's tangent; a program
    input that needs a gradient (GAT's attention vectors, when its weights do) runs in an
    autograd.Function without a jvp: refused, naming the layer (torch's own message named
    neither)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    layer, edge_index = _layer(name, "cpu"), torch.stack([SRC, DST])
    layer.requires_grad_(weights_need_grad)
    _tangent_matches_or_is_refused(layer, edge_index, 3, weights_need_grad)


@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"], indirect=True)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_where_tangents_would_be_lost_the_layer_is_refused_by_name(name, backend, device):
    """Under no_grad the reference backend writes its outputs in place (out= ops: torch's
    'add_out that does not support it'); the Triton and CPU kernels carry no tangent."""
    layer, edge_index = _layer(name, device), torch.stack([SRC, DST]).to(device)
    x = torch.randn(6, 3, dtype=torch.float64, device=device)
    mode = torch.no_grad if backend == "reference" else torch.enable_grad
    with fwAD.dual_level(), mode(), pytest.raises(ForwardADError, match=f"{type(layer).__name__}: gnnfuse "
                                                                       "cannot carry forward-mode AD"):
        layer(fwAD.make_dual(x, torch.ones_like(x)), edge_index)


@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
def test_a_udf_on_a_raw_kernel_backend_is_refused(backend, device):
    graph = gnnfuse.Graph(SRC, DST, 6).to(device)
    x = torch.randn(6, 3, dtype=torch.float64, device=device)
    with fwAD.dual_level(), pytest.raises(ForwardADError, match=f"the {backend} backend's kernels"):
        gnnfuse.ops.gspmm(graph, lambda s: s * 3, "sum", src=fwAD.make_dual(x, torch.ones_like(x)))


@pytest.mark.parametrize("weights_need_grad", [False, True])
@pytest.mark.parametrize("make", [lambda: gnn.SAGEConv(4, 3), lambda: gnn.GraphConv(4, 3), lambda: gnn.TAGConv(4, 3)],
                         ids=["sage", "graph", "tag"])
def test_layers_mapping_through_gnnfuses_linear_functions_carry_tangents(make, weights_need_grad, monkeypatch):
    """SAGEConv (mean), GraphConv and TAGConv map their input through gnnfuse's own
    autograd Functions (`nn.aligned_linear`: a paired map, a map before the hops), which
    had no jvp: a dual input stopped in torch's "You must implement the jvp function",
    naming no layer, where PyG's layers carry the tangent. (Narrowing maps, 4 -> 3, on a
    path whose last vertex no edge leaves: these layers then map before they aggregate,
    the weight's gradient summed over the rows read.) They carry it now (or the program
    after them refuses by name, as for the other layers)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    torch.manual_seed(0)
    layer, edge_index = make().double(), torch.stack([SRC[:5], DST[:5]])     # 0 -> 1 -> ... -> 5
    layer.requires_grad_(weights_need_grad)
    _tangent_matches_or_is_refused(layer, edge_index, 4, weights_need_grad)
