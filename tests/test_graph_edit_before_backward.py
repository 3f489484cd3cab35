"""An ``edge_index`` written in place between a layer's forward and its backward.

The `Graph` shares a contiguous int64 ``edge_index``'s memory, and a backward builds the
layouts it walks (the reverse CSR) when it runs: after ``edge_index[1, :8] = ...`` (an
index buffer refilled for the next batch before ``loss.backward()``) the gradients mixed
the two graphs, silently -- NaN for a max. torch refuses a tensor saved for backward and
then modified; PyG's layers that save ``edge_index`` do. gnnfuse refuses it too (found by
differential fuzzing of what users do between calls)."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg

from gnnfuse import nn as gnn

N, F = 10, 4


def _graph() -> torch.Tensor:
    return torch.randint(0, N, (2, 30), generator=torch.Generator().manual_seed(0))


LAYERS = {
    "sage": lambda: gnn.SAGEConv(F, 3),
    "sage-max": lambda: gnn.SAGEConv(F, 3, aggr="max"),
    "gin": lambda: gnn.GINConv(torch.nn.Linear(F, 3)),
    "gcn": lambda: gnn.GCNConv(F, 3),
    "gat": lambda: gnn.GATConv(F, 3, heads=2),
    "appnp": lambda: gnn.APPNP(K=2, alpha=0.1),
}


def _wrapped(ei: torch.Tensor):
    """PyG's ``EdgeIndex`` around ``ei``: a write through it moves its own version counter only."""
    from torch_geometric import EdgeIndex
    return EdgeIndex(ei, sparse_size=(N, N))


@pytest.mark.parametrize("wrap", [False, True], ids=["tensor", "EdgeIndex"])
@pytest.mark.parametrize("name", LAYERS)
def test_an_edit_before_backward_is_refused_or_harmless(name, wrap, backend, device):
    """Each layer raises, or (where its backward reads only layouts built in the
    forward, on a copy such as GCN's self-looped graph) returns the forward graph's
    gradient; never a gradient of some other graph."""
    torch.manual_seed(0)
    layer = LAYERS[name]().double().to(device)
    x0 = torch.randn(N, F, dtype=torch.float64, device=device)
    probe = None

    def grad(edit: bool):
        nonlocal probe
        ei = _graph().to(device)
        ei = _wrapped(ei) if wrap else ei
        x = x0.clone().requires_grad_()
        out = layer(x, ei)
        probe = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1)).to(device)
        loss = (out * probe).sum()
        if edit:
            ei[1, :8] = torch.arange(8, device=device) + 1
        loss.backward()
        return x.grad

    clean = grad(edit=False)
    try:
        edited = grad(edit=True)
    except RuntimeError as error:
        assert "modified by an in-place operation" in str(error) and "backward" in str(error)
    else:
        torch.testing.assert_close(edited, clean, rtol=1e-9, atol=1e-12)


def test_sage_refuses_as_pyg_does():
    torch.manual_seed(0)
    ours, ref = gnn.SAGEConv(F, 3).double(), pyg.SAGEConv(F, 3).double()
    ours.load_state_dict(ref.state_dict())
    for layer in (ref, ours):
        ei = _graph()
        loss = layer(torch.randn(N, F, dtype=torch.float64, requires_grad=True), ei).sum()
        ei[0, 0] = (ei[0, 0] + 1) % N
        with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
            loss.backward()
