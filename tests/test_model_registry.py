"""The registry's node-classification models (`gnnfuse.nn.models`: ``gnnfuse train --model``)
against the networks their papers describe, built from PyG's layers with the same weights:
outputs and every gradient in float64, in eval mode; and in training mode at dropout 1,
where every dropout zeroes its input, so each dropout's place shows in the output."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn

from gnnfuse.nn.models import build_model

# 7 vertices, a self loop (3 -> 3), a repeated edge (1 -> 2 twice), vertex 6 without in-edges
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 3, 0, 6, 1],
                      [1, 2, 3, 4, 5, 0, 0, 4, 3, 2, 5, 2]])
NUM_NODES, FEATURES, CLASSES, HIDDEN = 7, 6, 3, 4


class PaperNetwork(torch.nn.Module):
    """``conv2(act(conv1(x)))`` (GCN, GAT, GraphSAGE), ``propagate(lin2(relu(lin1(x))))``
    (APPNP) or ``conv1(x)`` (SGC) of PyG's layers, dropout left out (eval mode)."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        if name == "gcn":
            self.conv1, self.conv2 = pyg_nn.GCNConv(FEATURES, HIDDEN), pyg_nn.GCNConv(HIDDEN, CLASSES)
        elif name == "gat":        # 8 concatenated heads, then one averaged output head
            self.conv1 = pyg_nn.GATConv(FEATURES, HIDDEN, heads=8)
            self.conv2 = pyg_nn.GATConv(8 * HIDDEN, CLASSES, heads=1, concat=False)
        elif name == "sage":
            self.conv1 = pyg_nn.SAGEConv(FEATURES, HIDDEN, aggr="mean")
            self.conv2 = pyg_nn.SAGEConv(HIDDEN, CLASSES, aggr="mean")
        elif name == "appnp":      # Klicpera et al.: K = 10 hops, teleport alpha = 0.1
            self.lin1, self.lin2 = torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, CLASSES)
            self.propagate = pyg_nn.APPNP(K=10, alpha=0.1)
        else:                      # SGC (Wu et al.): K = 2
            self.conv1 = pyg_nn.SGConv(FEATURES, CLASSES, K=2)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        if self.name == "appnp":
            return self.propagate(self.lin2(F.relu(self.lin1(x))), edge_index)
        if self.name == "sgc":
            return self.conv1(x, edge_index)
        act = F.elu if self.name == "gat" else F.relu
        return self.conv2(act(self.conv1(x, edge_index)), edge_index)


def _pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    ours = build_model(name, FEATURES, CLASSES, hidden=None if name == "sgc" else HIDDEN).double()
    theirs = PaperNetwork(name).double()
    state = {("conv1." + key if name == "sgc" else key): value for key, value in ours.state_dict().items()}
    theirs.load_state_dict(state)
    return ours, theirs


def _run(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_()
    out = model(x, EDGES)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return out.detach(), list(torch.autograd.grad((out * weight).sum(), [x, *model.parameters()]))


def _features() -> torch.Tensor:
    return torch.randn(NUM_NODES, FEATURES, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", ["gcn", "gat", "sage", "appnp", "sgc"])
def test_registry_model_is_its_paper_s_network(name):
    ours, theirs = _pair(name)
    ours.eval(), theirs.eval()
    (got, got_grads), (expected, expected_grads) = _run(ours, _features()), _run(theirs, _features())
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)
    assert len(got_grads) == len(expected_grads)
    for got_grad, expected_grad in zip(got_grads, expected_grads):
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["gcn", "sage", "appnp"])
def test_dropout_one_zeroes_the_input_of_every_layer(name):
    """At dropout 1 each layer reads zeros, so only the last layer's bias (propagated, for
    APPNP) is left: a dropout missing before a layer lets the earlier layers through."""
    ours, theirs = _pair(name)
    ours = build_model(name, FEATURES, CLASSES, hidden=HIDDEN, dropout=1.0).double()
    ours.load_state_dict(theirs.state_dict())
    ours.train()
    out = ours(_features(), EDGES)
    if name == "appnp":
        expected = theirs.propagate(ours.lin2.bias.detach().expand(NUM_NODES, CLASSES), EDGES)
    else:
        # conv2 of zero rows: GCN's and GraphSAGE's output is then their bias on every row
        expected = (ours.conv2.bias if name == "gcn" else ours.conv2.lin_l.bias).detach().expand(NUM_NODES, CLASSES)
    torch.testing.assert_close(out.detach(), expected, rtol=1e-9, atol=1e-10)


def test_build_model_takes_the_dropout_it_is_given():
    """dropout=0 in training mode is the eval-mode network (not the paper's default 0.5)."""
    model = build_model("gcn", FEATURES, CLASSES, hidden=HIDDEN, dropout=0.0).double()
    x = _features()
    model.train()
    trained = model(x, EDGES)
    model.eval()
    torch.testing.assert_close(trained, model(x, EDGES), rtol=0, atol=0)
