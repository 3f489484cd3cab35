"""Index arrays as users hand them over -- a PyG ``edge_index`` built by ``.t()`` or a
strided slice, int32 ids -- through the generated kernels (Triton's interpreter without
a GPU) and the reference backend, against plain torch and PyG. Kernels read indices as
contiguous arrays, so a strided view once gave wrong rows with no error."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg

import gnnfuse
from gnnfuse import nn as gnn
from layer_check import assert_same_outputs_and_grads

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 12


def _edges() -> torch.Tensor:
    """[E, 2] pairs (the layout that makes users write ``.t()``): multi-edges, a self
    loop, vertex 11 isolated."""
    gen = torch.Generator().manual_seed(3)
    pairs = torch.randint(0, N - 1, (40, 2), generator=gen)
    return torch.cat([pairs, torch.tensor([[4, 4], [2, 7], [2, 7]])]).to(DEVICE)


EDGE_INDEX = {   # name -> (the edge_index as the user passes it, the same edges as a plain one)
    "transposed": lambda e: (e.t(), e.t().contiguous()),
    "strided-slice": lambda e: (torch.cat([e, e]).t()[:, ::2], torch.cat([e, e]).t()[:, ::2].contiguous()),
    "int32": lambda e: (e.t().contiguous().int(), e.t().contiguous()),
    "int32-transposed": lambda e: (e.int().t(), e.t().contiguous()),
}


# Without self loops: a layer that adds them runs on a rebuilt (hence contiguous) graph.
LAYERS = {
    "gcn": lambda: (gnn.GCNConv(12, 6, add_self_loops=False), pyg.GCNConv(12, 6, add_self_loops=False)),
    "gat": lambda: (gnn.GATConv(12, 4, heads=2, add_self_loops=False),
                    pyg.GATConv(12, 4, heads=2, add_self_loops=False)),
    "sage-max": lambda: (gnn.SAGEConv(12, 6, aggr="max"), pyg.SAGEConv(12, 6, aggr="max")),
}


@gnnfuse.vertex
def neighbour_sum(v):
    return sum([u.h for u in v.innbs])


@pytest.mark.parametrize("layout", EDGE_INDEX)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_neighbour_sum_reads_user_layouts(layout, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    edge_index, plain = EDGE_INDEX[layout](_edges())
    x = torch.randn(N, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    out = neighbour_sum(gnnfuse.Graph(edge_index[0], edge_index[1], N), {"h": x})
    expected = torch.zeros_like(x).index_add(0, plain[1], x[plain[0]])
    torch.testing.assert_close(out, expected)
    seed = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * seed).sum(), x)
    torch.testing.assert_close(grad, seed[plain[1]].new_zeros(x.shape).index_add(0, plain[0], seed[plain[1]]))


@pytest.mark.parametrize("layout", EDGE_INDEX)
@pytest.mark.parametrize("name", LAYERS)
def test_layers_read_user_layouts_on_triton(name, layout, monkeypatch):
    """PyG's layer on the plain edge_index is the oracle; ours gets the user's layout."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    edge_index, plain = EDGE_INDEX[layout](_edges())
    torch.manual_seed(0)
    ours, ref = (m.double().to(DEVICE) for m in LAYERS[name]())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, 12, dtype=torch.float64, device=DEVICE)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index), lambda xs: ref(xs, plain), x)
