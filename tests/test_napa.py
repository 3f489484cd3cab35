"""GraphTensor's NAPA primitives (``gnnfuse.napa``): each primitive against a plain-PyTorch
oracle, and GraphTensor's GCN and NGCF written in them against ``gnnfuse.nn``'s GCNConv
and NGCFConv from the same weights (outputs and every gradient, float64, both backends)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import gnnfuse
import gnnfuse.nn
from gnnfuse.napa import Apply, NeighborApply, Pull
from oracle_check import BACKENDS, assert_matches_oracle, device_for

# A multi-edge 3->1 (twice), a self loop on 4, vertex 3 without in-edges, vertex 5 isolated.
SRC = torch.tensor([0, 1, 2, 2, 3, 3, 4, 1, 0])
DST = torch.tensor([1, 2, 0, 1, 1, 1, 4, 0, 2])
N, E, F_IN, F_OUT = 6, len(SRC), 4, 3


class NapaGCN(nn.Module):
    """GCN in NAPA: symmetric-normalized edge weights, a weighted Pull, Apply first (it
    narrows the rows the Pull moves, GraphTensor's dynamic kernel placement)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.apply_ = Apply(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x: torch.Tensor, graph: gnnfuse.Graph) -> torch.Tensor:
        graph = graph.remove_self_loops().add_self_loops()
        weights = NeighborApply(graph, x, "gcn")
        return Pull(graph, self.apply_(x), weights, "mul", "sum") + self.bias


class NapaNGCF(nn.Module):
    """NGCF (GraphTensor Fig. 10, one layer): edge weights 1/sqrt(|N_u||N_v|), the message
    ``p * (W1 x_u + W2 (x_u * x_v))`` summed, then the self term and LeakyReLU."""

    def __init__(self, in_channels: int, out_channels: int, negative_slope: float = 0.2):
        super().__init__()
        self.lin1 = Apply(in_channels, out_channels, bias=False)
        self.lin2 = Apply(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor, graph: gnnfuse.Graph) -> torch.Tensor:
        p = NeighborApply(graph, x, "gcn")
        aggr = Pull(graph, x, p, lambda xu, xv, p: p * (self.lin1(xu) + self.lin2(xu * xv)), "sum")
        return F.leaky_relu(self.lin1(x) + aggr + self.bias, self.negative_slope)


def randn(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# gnnfuse.nn parameter name -> the NAPA model's name for the same weight
NAPA_NAMES = {"gcn": {"lin.weight": "apply_.lin.weight", "bias": "bias"},
              "ngcf": {"lin1.weight": "lin1.lin.weight", "lin2.weight": "lin2.lin.weight", "bias": "bias"}}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAPA_NAMES)
def test_napa_models_match_the_nn_layers_from_the_same_weights(name, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    device = device_for(backend)
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    layer, napa = (gnnfuse.nn.GCNConv(F_IN, F_OUT), NapaGCN(F_IN, F_OUT)) if name == "gcn" else \
        (gnnfuse.nn.NGCFConv(F_IN, F_OUT), NapaNGCF(F_IN, F_OUT))
    layer, napa = layer.double().to(device), napa.double().to(device)
    assert set(dict(layer.named_parameters())) == set(NAPA_NAMES[name])
    weights = {"x": randn(N, F_IN, seed=1).to(device),
               **{k: randn(*p.shape, seed=i + 2).to(device) for i, (k, p) in enumerate(layer.named_parameters())}}
    assert_matches_oracle(
        lambda x, **w: {"out": functional_call(napa, {NAPA_NAMES[name][k]: t for k, t in w.items()}, (x, graph))},
        lambda x, **w: {"out": functional_call(layer, w, (x, graph))}, weights)


# --- each primitive against plain torch ----------------------------------------------------
def in_degree_power(exponent: float) -> torch.Tensor:
    deg = torch.bincount(DST, minlength=N).to(torch.float64)
    return torch.where(deg > 0, deg.pow(exponent), torch.zeros_like(deg)).unsqueeze(-1)


PRIMITIVES = {
    "neighbor_apply_gcn": (lambda g, x: NeighborApply(g, x, "gcn").expand(-1, F_IN) * x[SRC],
                           lambda x: (in_degree_power(-0.5)[SRC] * in_degree_power(-0.5)[DST]) * x[SRC]),
    "neighbor_apply_mean": (lambda g, x: NeighborApply(g, x, "mean") * x[SRC],
                            lambda x: in_degree_power(-1.0)[DST] * x[SRC]),
    "neighbor_apply_dot": (lambda g, x: NeighborApply(g, x, "dot"),
                           lambda x: (x[SRC] * x[DST]).sum(-1, keepdim=True)),
    "neighbor_apply_mul": (lambda g, x: NeighborApply(g, x, "mul"), lambda x: x[SRC] * x[DST]),
    "neighbor_apply_fn": (lambda g, x: NeighborApply(g, x, lambda xu, xv: torch.exp(-(xu - xv) ** 2)),
                          lambda x: torch.exp(-(x[SRC] - x[DST]) ** 2)),
    "pull_copy_max": (lambda g, x: Pull(g, x, None, "copy", "max"),
                      lambda x: torch.zeros(N, F_IN, dtype=x.dtype).scatter_reduce(
                          0, DST.view(-1, 1).expand(-1, F_IN), x[SRC], "amax", include_self=False)),
    "pull_mul_dot_weights": (lambda g, x: Pull(g, x, NeighborApply(g, x, "dot"), "mul", "mean"),
                             lambda x: torch.zeros(N, F_IN, dtype=x.dtype).index_add(
                                 0, DST, (x[SRC] * x[DST]).sum(-1, keepdim=True) * x[SRC])
                             / in_degree_power(1.0).clamp(min=1)),
}


@pytest.mark.parametrize("name", PRIMITIVES)
def test_primitives_match_plain_torch(name, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    ours, oracle = PRIMITIVES[name]
    graph = gnnfuse.Graph(SRC, DST, N)
    assert_matches_oracle(lambda x: {"out": ours(graph, x)}, lambda x: {"out": oracle(x)}, {"x": randn(N, F_IN)})


def test_apply_is_a_dense_layer():
    layer = Apply(F_IN, F_OUT, activation=torch.tanh).double()
    x = randn(N, F_IN)
    torch.testing.assert_close(layer(x), torch.tanh(x @ layer.lin.weight.t() + layer.lin.bias))


@pytest.mark.parametrize("call,match", [
    (lambda g, x: NeighborApply(g, x, "softmax"), "mode must be one of"),
    # a tensor of per-edge weights as mode: the message listed its values
    (lambda g, x: NeighborApply(g, x, torch.ones(len(SRC))), r"got a tensor of shape \[\d+\]: per-edge weights are "),
    (lambda g, x: NeighborApply(g, None, "dot"), r"needs the node embeddings \(embed=\)"),
    (lambda g, x: NeighborApply(g, x, "gcn", edge=x[SRC]), "reads no edge="),
    (lambda g, x: Pull(g, x, None, "mul"), "weights each message by edge="),
    (lambda g, x: Pull(g, x, x[SRC], "copy"), "'copy' reads no edge="),
    (lambda g, x: Pull(g, x, None, "div"), "mode_g must be one of"),
    (lambda g, x: Pull(g, x, None, "copy", "prod"), "Pull: mode_h must be one of"),
    # these named gnnfuse's internals (gspmm, gsddmm, a line of napa.py) or the wrong problem
    (lambda g, x: Pull(g, x, torch.rand(len(SRC)), "mul"), r"edge= must have as many dims.*got edge \[\d+\]"),
    (lambda g, x: Pull(g, x[:, 0], torch.rand(len(SRC), 1), "mul"), r"got edge \[\d+, 1\] and embed \[\d+\]"),
    (lambda g, x: Pull(g, x, torch.rand(len(SRC), F_IN - 1), "mul"),
     rf"per-edge shape \[{F_IN - 1}\], which does not broadcast with embed's per-vertex shape \[{F_IN}\]"),
    (lambda g, x: NeighborApply(g, x[:, 0], "dot"), "mode 'dot' sums x_u \\* x_v over the feature dim"),
    (lambda g, x: NeighborApply(g, None, lambda s, d: s * d), r"a function mode .* give the node embeddings"),
])
def test_bad_modes_raise_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(gnnfuse.Graph(SRC, DST, N), randn(N, F_IN))


@pytest.mark.parametrize("mode", ["gcn", "mean"])
def test_degree_weights_refuse_an_integer_embed(mode):
    """The weights take embed's dtype: an int64 embed truncated 1/sqrt(3) to 0 and 1/1 to
    1 (GCN weights [0, 0, 0, 0, 0, 1, 1] here), silently."""
    graph = gnnfuse.Graph(SRC, DST, N)
    with pytest.raises(TypeError, match=f"mode '{mode}'.*must be floating, got torch.int64"):
        NeighborApply(graph, torch.arange(N).unsqueeze(-1), mode)


@pytest.mark.parametrize("call", [
    lambda g, x: NeighborApply(g, x, "gcn"),
    lambda g, x: NeighborApply(g, x, "dot"),
    lambda g, x: NeighborApply(g, x, lambda xu, xv: xu * xv),
    lambda g, x: Pull(g, x, None, lambda xu, xv: xu * xv),
], ids=["gcn", "dot", "weight-function", "pull-function"])
def test_modes_reading_both_ends_from_one_table_refuse_a_bipartite_graph(call):
    """Sources and destinations are separate sets of 3, so one table cannot hold both
    ends' rows: 'gcn' read source 0's in-degree from destination 0 (weights [1.0, 0.71,
    0.5], silently), and the others read destinations' rows from the sources' table."""
    graph = gnnfuse.Graph(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]), 3, num_src_nodes=3)
    with pytest.raises(ValueError, match=r"one table, but this graph is bipartite \(3 sources, 3 destinations\)"):
        call(graph, randn(3, F_IN))


def test_modes_reading_one_end_run_on_a_bipartite_graph():
    src, dst = torch.tensor([0, 3, 4, 4, 1]), torch.tensor([0, 1, 1, 0, 1])
    graph = gnnfuse.Graph(src, dst, 2, num_src_nodes=5)
    x = randn(5, F_IN)
    weights = NeighborApply(graph, x, "mean")
    torch.testing.assert_close(weights, 1.0 / torch.bincount(dst)[dst].unsqueeze(-1).to(x.dtype))
    torch.testing.assert_close(Pull(graph, x, weights, "mul", "sum"),
                               torch.zeros(2, F_IN, dtype=x.dtype).index_add(0, dst, weights * x[src]))
