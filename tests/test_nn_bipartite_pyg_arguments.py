"""PyG's bipartite input (``in_channels=(a, b)``, ``forward((x_src, x_dst), ...)``) combined
with PyG's constructor arguments -- SAGE ``project``/``normalize``/lazy ``in_channels``,
GAT/GATv2 ``residual`` and ``edge_dim`` with ``edge_attr`` and ``fill_value`` -- against
PyG 2.8 with copied weights: outputs and the gradients of x_src, x_dst and every
parameter in float64, on both backends. PyG projects only the source features, maps
``x_dst`` through ``res`` (width ``in_channels[1]``) and gives self loops, which join
source i to destination i below both counts, the ``fill_value`` features. The
combinations whose PyG result is not checked here are refused by name (an aggregated
``fill_value`` with more destinations than sources, where PyG's scatter fails)."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg
from hypothesis import given, settings

from gnnfuse import nn as gnn
from layer_check import assert_same_values
from oracle_check import device_for
from test_nn_bipartite import EDGE_INDEX, F_DST, F_SRC, NUM_DST, NUM_SRC, bipartite_graphs, compare_with_pyg

EDGE_DIM = 2
EDGE_ATTR = torch.linspace(-1.5, 2.0, EDGE_INDEX.shape[1] * EDGE_DIM, dtype=torch.float64).view(-1, EDGE_DIM)
LOOP_FEATURE = torch.tensor([0.75, -0.5], dtype=torch.float64)

# (id, layer class name, constructor arguments in PyG's positional order, forward extras, uses x_dst)
CASES = [
    ("sage-project-normalize", "SAGEConv", lambda: ((F_SRC, F_DST), 4, "mean", True, True, True), {}, True),
    ("sage-project-narrowing", "SAGEConv", lambda: ((F_SRC, F_DST), 2, "sum", False, True, True), {}, True),
    ("sage-project-no-x_dst", "SAGEConv", lambda: ((F_SRC, F_DST), 4, "max", True, True, True), {}, False),
    ("gat-residual", "GATConv", lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, True, None, "mean", True, True),
     {}, True),
    ("gat-residual-mean-heads", "GATConv",
     lambda: ((F_SRC, F_DST), 3, 2, False, 0.2, 0.0, False, None, "mean", True, True), {}, True),
    ("gat-residual-no-x_dst", "GATConv",
     lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, True, None, "mean", True, True), {}, False),
    ("gat-int-channels-residual", "GATConv", lambda: (F_SRC, 3, 2, True, 0.2, 0.0, True, None, "mean", True, True),
     {}, "same-width"),
    ("gat-edge-attr-no-loops", "GATConv", lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, False, EDGE_DIM),
     {"edge_attr": EDGE_ATTR}, True),
    ("gat-edge-attr-fill-number", "GATConv",
     lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, True, EDGE_DIM, 0.5, True, True), {"edge_attr": EDGE_ATTR}, True),
    ("gat-edge-attr-fill-tensor", "GATConv", lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, True, EDGE_DIM,
                                                      LOOP_FEATURE), {"edge_attr": EDGE_ATTR}, True),
    ("gat-edge-attr-fill-mean", "GATConv", lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, True, EDGE_DIM, "mean",
                                                    True, True), {"edge_attr": EDGE_ATTR}, True),
    ("gatv2-residual", "GATv2Conv",
     lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, True, None, "mean", True, False, True), {}, True),
    ("gatv2-edge-attr-no-loops", "GATv2Conv", lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, False, EDGE_DIM),
     {"edge_attr": EDGE_ATTR}, True),
    ("gatv2-edge-attr-fill-number", "GATv2Conv",
     lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, True, EDGE_DIM, -0.25, True, False, True),
     {"edge_attr": EDGE_ATTR}, True),
    ("gatv2-edge-attr-fill-max", "GATv2Conv",
     lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, True, EDGE_DIM, "max", True, False, True),
     {"edge_attr": EDGE_ATTR}, True),
]

TRITON_CASES = ("sage-project-narrowing", "gat-edge-attr-fill-number", "gatv2-edge-attr-fill-number",
                "gat-edge-attr-fill-mean")
PARAMS = [pytest.param(case, backend, id=f"{backend}-{case[0]}") for backend in ("reference", "triton")
          for case in CASES if backend == "reference" or case[0] in TRITON_CASES]


@pytest.mark.parametrize("case, backend", PARAMS)
def test_bipartite_layer_with_pyg_arguments_matches_pyg(case, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    _, name, arguments, extra, with_dst = case
    extra = {k: v.to(device_for(backend)) for k, v in extra.items()}
    compare_with_pyg(name, arguments, extra, with_dst, EDGE_INDEX, NUM_SRC, NUM_DST, device_for(backend))


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("gat-edge-attr-fill-number",
                                                              "gatv2-edge-attr-fill-number")], ids=lambda c: c[0])
@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(graph=bipartite_graphs())
def test_edge_features_and_loops_match_pyg_on_random_bipartite_graphs(case, graph):
    """More destinations than sources, none of either, multi-edges and i -> i edges: the
    loops (one per i below both counts) and their filled features line up with PyG's."""
    _, name, arguments, _, with_dst = case
    edge_index, num_src, num_dst = graph
    edge_attr = torch.linspace(-1.0, 2.0, edge_index.shape[1] * EDGE_DIM, dtype=torch.float64).view(-1, EDGE_DIM)
    compare_with_pyg(name, arguments, {"edge_attr": edge_attr}, with_dst, edge_index, num_src, num_dst)


def test_lazy_in_channels_take_each_side_its_width():
    """``in_channels=-1`` on bipartite input: lin_l is sized by x_src, lin_r by x_dst, as
    PyG's lazy Linear layers are; the result is PyG's with the same weights."""
    torch.manual_seed(0)
    x_src = torch.randn(NUM_SRC, F_SRC, dtype=torch.float64)
    x_dst = torch.randn(NUM_DST, F_DST, dtype=torch.float64)
    ours = gnn.SAGEConv(-1, 3).double()
    out = ours((x_src, x_dst), EDGE_INDEX)
    assert ours.lin_l.weight.shape == (3, F_SRC) and ours.lin_r.weight.shape == (3, F_DST)
    ref = pyg.SAGEConv((F_SRC, F_DST), 3).double()
    ref.load_state_dict(ours.state_dict())
    assert_same_values(out, ref((x_src, x_dst), EDGE_INDEX), "output")
    with pytest.raises(ValueError, match="does not support lazy initialization with `project=True`"):
        gnn.SAGEConv((-1, F_DST), 3, project=True)


def test_project_uses_the_source_width():
    ours, ref = gnn.SAGEConv((F_SRC, F_DST), 4, project=True), pyg.SAGEConv((F_SRC, F_DST), 4, project=True)
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
           {k: tuple(v.shape) for k, v in ref.state_dict().items()}


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_attention_weights_of_bipartite_input_are_refused_by_name(name):
    layer = getattr(gnn, name)((F_SRC, F_DST), 3).eval()
    with pytest.raises(NotImplementedError, match=rf"{name}\(..., return_attention_weights=True\) with bipartite"):
        layer((torch.randn(NUM_SRC, F_SRC), torch.randn(NUM_DST, F_DST)), EDGE_INDEX, return_attention_weights=True)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_aggregated_loop_features_with_more_destinations_than_sources_are_refused_by_name(name):
    """Loops join i to i below both counts; a ``fill_value`` aggregation over a
    destination past them has no loop to go to (PyG's scatter fails on such an edge)."""
    layer = getattr(gnn, name)((F_SRC, F_DST), 3, edge_dim=EDGE_DIM, fill_value="mean")
    with pytest.raises(ValueError, match=rf"{name}\(fill_value='mean'\) with add_self_loops on bipartite input "
                                         r"with more destinations \(6\) than sources \(4\)"):
        layer((torch.randn(NUM_DST, F_SRC), torch.randn(NUM_SRC, F_DST)), EDGE_INDEX.flip(0), EDGE_ATTR.float())


@pytest.mark.parametrize("name", ["SAGEConv", "GraphConv", "GATConv"])
def test_batched_features_in_a_bipartite_pair_are_refused_by_name(name):
    layer = getattr(gnn, name)((F_SRC, F_DST), 3)
    with pytest.raises(NotImplementedError, match=rf"{name}: bipartite input with batched node features"):
        layer((torch.randn(2, NUM_SRC, F_SRC), torch.randn(2, NUM_DST, F_DST)), EDGE_INDEX)
