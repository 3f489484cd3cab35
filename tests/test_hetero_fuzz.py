"""A fuzz of the heterogeneous layers against PyG 2.8 over the hetero graphs users have:
node types without nodes or without in-edges, edge types without edges or left out of the
dict, self relations and reverse relations (as ``ToUndirected`` adds), repeated edges,
sizes and feature widths that differ per type, read through lazy (-1) channels. HGTConv,
HeteroConv (every grouping) and `to_hetero` (every combination, of a model with a skip
connection, dropout in eval mode and its layers in a ``ModuleList``), PyG's weights
copied: outputs and every gradient in float64, on the reference backend for many graphs
and on Triton's interpreter for a few."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg_nn
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnfuse import nn as gnn
from test_nn_hetero import assert_same, randomized

f64 = torch.float64
GROUPINGS = ["sum", "mean", "max", "min", "cat", None]
COMBINATIONS = ["sum", "mean", "max", "min"]


def hetero_graph(seed: int, every_type_a_destination: bool = False, device: str = "cpu"):
    """``(metadata, x_dict, edge_index_dict)`` drawn from ``seed``: one to four node types
    (a sixth of them without nodes), relations between random pairs plus, half the time,
    their reverses; a sixth of the relations without edges and a tenth left out of the
    dict (HGTConv and HeteroConv take both); repeated edges half the time. For
    `to_hetero` every type gets a self relation if nothing else ends at it (PyG's
    transformer refuses a type no relation updates)."""
    g = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=g))
    types = [f"t{i}" for i in range(draw(1, 4))]
    counts = {t: 0 if draw(0, 5) == 0 else draw(1, 6) for t in types}
    widths = {t: draw(1, 5) for t in types}
    relations = [(s, "r", d) for s in types for d in types if draw(0, 2) == 0] or [(types[0], "r", types[-1])]
    if draw(0, 1):
        relations += [(d, "rev_r", s) for s, _, d in list(relations) if s != d]
    if every_type_a_destination:
        relations += [(t, "self", t) for t in types if t not in {d for _, _, d in relations}]
    x = {t: torch.randn(counts[t], widths[t], dtype=f64, generator=g) for t in types}
    edges = {}
    for s, r, d in relations:
        if not every_type_a_destination and draw(0, 9) == 0:
            continue                                   # left out of the dict
        k = 0 if counts[s] == 0 or counts[d] == 0 or draw(0, 5) == 0 else draw(1, 10)
        index = torch.stack([torch.randint(0, max(counts[s], 1), (k,), generator=g),
                             torch.randint(0, max(counts[d], 1), (k,), generator=g)])
        edges[(s, r, d)] = torch.cat([index, index[:, :draw(0, 2)]], dim=1)
    return ((types, relations), {t: v.to(device) for t, v in x.items()},
            {t: v.to(device) for t, v in edges.items()})


def lazy_init_inputs(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``x`` with a row of zeros for each type without nodes: PyG's lazy ``Linear`` cannot
    learn its width from zero rows, so both libraries' layers are sized on these first."""
    return {t: v if v.shape[0] else v.new_zeros(1, v.shape[1]) for t, v in x.items()}


def hetero_convs(lib, relations: list) -> dict:
    """A layer per relation, lazy widths: GCN/GAT on self relations, SAGE/GraphConv/GATv2
    between types (no self loops there, as PyG requires)."""
    convs = {}
    for i, (s, _, d) in enumerate(relations):
        if s == d:
            convs[(s, _, d)] = lib.GCNConv(-1, 4) if i % 2 else lib.GATConv(-1, 4, heads=2, concat=False)
        else:
            convs[(s, _, d)] = [lib.SAGEConv((-1, -1), 4), lib.GraphConv((-1, -1), 4, aggr="max"),
                                lib.GATv2Conv((-1, -1), 4, add_self_loops=False)][i % 3]
    return convs


def check_hgt(seed: int, device: str) -> None:
    metadata, x, edges = hetero_graph(seed, device=device)
    if not edges:
        return                       # an empty dict is refused, as PyG does (test_nn_hetero)
    widths = {t: v.shape[1] for t, v in x.items()}
    heads = 1 + seed % 2
    pyg = randomized(pyg_nn.HGTConv(widths, 4, metadata, heads=heads).double(), seed).to(device)
    ours = gnn.HGTConv(widths, 4, metadata, heads=heads).double().to(device)
    ours.load_state_dict(pyg.state_dict())
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges))


def check_hetero_conv(seed: int, aggr: str | None, device: str) -> None:
    metadata, x, edges = hetero_graph(seed, device=device)
    torch.manual_seed(0)
    pyg = pyg_nn.HeteroConv(hetero_convs(pyg_nn, metadata[1]), aggr=aggr).double().to(device)
    ours = gnn.HeteroConv(hetero_convs(gnn, metadata[1]), aggr=aggr).double().to(device)
    init, every = lazy_init_inputs(x), {r: edges.get(r, torch.zeros(2, 0, dtype=torch.long, device=device))
                                         for r in metadata[1]}
    pyg(init, every), ours(init, every)          # every layer sized, the left-out relations' too
    ours.load_state_dict(randomized(pyg, seed).state_dict())
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges))


def skip_model(lib) -> torch.nn.Module:
    """Two layers held in a ModuleList, a lazy linear skip connection and dropout."""
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = torch.nn.ModuleList([lib.SAGEConv((-1, -1), 5), lib.GraphConv((-1, -1), 4, aggr="max")])
            self.skip = pyg_nn.Linear(-1, 5)
            self.dropout = torch.nn.Dropout(0.5)

        def forward(self, x, edge_index):
            h = self.dropout((self.convs[0](x, edge_index) + self.skip(x)).relu())
            return self.convs[1](h, edge_index)
    return Model()


def check_to_hetero(seed: int, aggr: str, device: str) -> None:
    metadata, x, edges = hetero_graph(seed, every_type_a_destination=True, device=device)
    torch.manual_seed(0)
    theirs = pyg_nn.to_hetero(skip_model(pyg_nn), metadata, aggr=aggr).double().to(device)
    ours = gnn.to_hetero(skip_model(gnn), metadata, aggr=aggr).double().to(device)
    init = lazy_init_inputs(x)
    theirs(init, edges), ours(init, edges)
    ours.load_state_dict(randomized(theirs, seed).state_dict())
    theirs.eval(), ours.eval()
    assert_same(ours, theirs, x, lambda model, xs: model(xs, edges))


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2 ** 20))
def test_hgt_matches_pyg_on_random_hetero_graphs(seed):
    check_hgt(seed, "cpu")


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2 ** 20), aggr=st.sampled_from(GROUPINGS))
def test_hetero_conv_matches_pyg_on_random_hetero_graphs(seed, aggr):
    check_hetero_conv(seed, aggr, "cpu")


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2 ** 20), aggr=st.sampled_from(COMBINATIONS))
def test_to_hetero_matches_pyg_on_random_hetero_graphs(seed, aggr):
    check_to_hetero(seed, aggr, "cpu")


@pytest.mark.parametrize("seed", [5, 9])
def test_hetero_layers_match_pyg_on_both_backends(seed, backend, device):
    """The same checks on both backends, on graphs with every kind of type above (seed 5:
    a type without nodes, relations without edges, one left out, reverses, repeats; 9:
    a self relation, reverses, relations left out)."""
    check_hgt(seed, device)
    check_hetero_conv(seed, GROUPINGS[seed % len(GROUPINGS)], device)
    check_to_hetero(seed, COMBINATIONS[seed % len(COMBINATIONS)], device)
