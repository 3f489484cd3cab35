"""Defects a differential hunt (gnnfuse against PyG, float64) found in the PyG models,
``EdgeConv`` and the loaders, each pinned by the case that showed it."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch import nn

import gnnfuse.nn

# 7 vertices, a self loop, a repeated edge, vertex 6 without in-edges
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 1, 3, 0, 2, 6],
                      [1, 2, 3, 4, 5, 0, 0, 0, 3, 2, 4, 5]])


class _Centred(nn.Module):
    """Each edge's row minus the mean over all edges' rows (dim 0: the edges)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h - h.mean(0)


class _RowSum(nn.Module):
    """Each edge's row scaled by its own sum (dim 1: the features, as PyG's nn sees them)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * h.sum(dim=1, keepdim=True)


# nn -> whether it combines edges' rows (dim 0 of PyG's [E, 2F] input) or stays per row
EDGE_NNS = {
    "softmax-over-edges": (lambda: nn.Sequential(nn.Linear(6, 4), nn.Softmax(dim=0)), True),
    "centred-over-edges": (lambda: nn.Sequential(nn.Linear(6, 4), _Centred()), True),
    "softmax-dim1": (lambda: nn.Sequential(nn.Linear(6, 4), nn.Softmax(dim=1)), False),
    "row-sum-dim1": (lambda: nn.Sequential(nn.Linear(6, 4), _RowSum()), False),
}


@pytest.mark.parametrize("case", EDGE_NNS)
def test_edge_conv_nn_sees_pygs_edge_axis(case):
    """PyG's EdgeConv applies ``nn`` to the [E, 2F] table of all edges, so in ``nn`` dim 0
    is the edge axis and dim 1 the first feature dim. Traced per edge, ``nn`` had seen a
    row without that axis: ``Softmax(dim=0)`` and ``h - h.mean(0)`` ran over each edge's
    own features (a silently wrong answer), and ``dim=1`` was refused as out of range.
    Now a per-row ``nn`` gives PyG's output and one combining rows is refused by name."""
    make, combines_rows = EDGE_NNS[case]
    torch.manual_seed(0)
    h = make().double()
    ours, theirs = gnnfuse.nn.EdgeConv(h, aggr="add"), pyg_nn.EdgeConv(h, aggr="add")    # each resets h
    x = torch.randn(7, 3, dtype=torch.float64)
    if combines_rows:
        with pytest.raises(Exception, match="dim 0 is the row axis"):
            ours(x, EDGES)
        return
    outputs = []
    for layer in (ours, theirs):
        xs = x.clone().requires_grad_()
        out = layer(xs, EDGES)
        outputs.append((out, torch.autograd.grad(out.square().sum(), [xs, *h.parameters()])))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-9, atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # compiled, not run eagerly
        gnnfuse.nn.EdgeConv(h, aggr="max")(x, EDGES)
