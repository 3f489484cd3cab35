"""PyG's constructor arguments and input forms on gnnfuse's layers, each checked against
PyG's own layer with the same weights (outputs, input and every parameter gradient, float64,
both backends): SAGE's ``project``/``normalize``, lazy ``in_channels=-1``, GCN's ``flow``,
APPNP's ``dropout=1``, static graphs (node features ``[B, N, F]``), R-GCN's PyG
initialisation, ``num_blocks`` and featureless input, and PyG's one-line ``repr``.
What is still unsupported fails by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg

from gnnfuse import nn as gnn
from layer_check import assert_same_outputs_and_grads, assert_same_under_autocast
from oracle_check import device_for

BACKENDS = ["reference", "triton"]
N, F_IN = 6, 5
EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 3, 5, 1, 4], [1, 2, 0, 4, 1, 3, 1, 0]])   # a self loop, no loop on 5


def copied(ours: torch.nn.Module, ref: torch.nn.Module, device: str = "cpu") -> tuple[torch.nn.Module, torch.nn.Module]:
    """Both layers in float64 on ``device`` (the Triton backend's is CUDA on a GPU
    machine), ours holding PyG's weights."""
    ours, ref = ours.double().to(device), ref.double().to(device)
    ours.load_state_dict(ref.state_dict())
    return ours, ref


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["mean", "max"])
@pytest.mark.parametrize("normalize", [False, True])
def test_sage_project_and_normalize_match_pyg(aggr, normalize, backend, monkeypatch):
    """``project=True`` maps and relus the neighbours' features only (the root term reads
    the raw ``x``); ``normalize=True`` L2-normalises the output rows."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(0)
    ours, ref = copied(gnn.SAGEConv(F_IN, 3, aggr=aggr, normalize=normalize, project=True),
                       pyg.SAGEConv(F_IN, 3, aggr=aggr, normalize=normalize, project=True), device)
    x, edge_index = torch.randn(N, F_IN, dtype=torch.float64).to(device), EDGE_INDEX.to(device)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index), lambda xs: ref(xs, edge_index), x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
@pytest.mark.parametrize("width", [8, 7])
def test_sage_aggregating_first_adds_its_root_in_the_gemm(aggr, width, backend, monkeypatch):
    """A layer that aggregates before mapping (here a widening 5 -> 8 or 7) computes
    ``lin_l(aggregated) + lin_r(x)`` as one GEMM adding onto the root term, which carries
    lin_l's bias: PyG's outputs and every gradient, and the output an addmm's (on a GPU
    the 7-wide root term is a padded table's view, which the GEMM adds onto out of place)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(2)
    ours, ref = copied(gnn.SAGEConv(F_IN, width, aggr=aggr), pyg.SAGEConv(F_IN, width, aggr=aggr), device)
    x, edge_index = torch.randn(N, F_IN, dtype=torch.float64).to(device), EDGE_INDEX.to(device)
    assert type(ours(x.requires_grad_(), edge_index).grad_fn).__name__ == "AddmmBackward0"
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index), lambda xs: ref(xs, edge_index),
                                  x.detach())



@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("width", [8, 2])
def test_sage_under_autocast_matches_pyg(aggr, bipartite, width):
    """Under CPU bf16 autocast the aggregate-first path's root term comes back in bf16
    while the weight and the aggregation stay float32: its in-place addmm_, which autocast
    does not cast, failed with "self and mat2 must have the same dtype" where PyG runs.
    Narrowing (width 2), mean and sum map first, through `paired_linear`, whose backward
    multiplied the bf16 gradient by the saved float32 weight ("expected m1 and m2 to have
    the same dtype"). Outputs and gradients are PyG's autocast ones within bf16 rounding."""
    torch.manual_seed(2)
    ours, ref = gnn.SAGEConv(F_IN, width, aggr=aggr), pyg.SAGEConv(F_IN, width, aggr=aggr)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, F_IN)
    results = []
    for layer in (ours, ref):
        xs = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer((xs, xs[:4]) if bipartite else xs, EDGE_INDEX[:, EDGE_INDEX[1] < 4] if bipartite else EDGE_INDEX)
        out.float().square().sum().backward()
        results.append((out, xs.grad, layer.lin_l.weight.grad))
    (out, grad_x, grad_w), (ref_out, ref_grad_x, ref_grad_w) = results
    assert out.dtype == ref_out.dtype == torch.bfloat16
    for a, b in [(out, ref_out), (grad_x, ref_grad_x), (grad_w, ref_grad_w)]:
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2 * b.abs().max().item())

@pytest.mark.parametrize("name,width,weighted", [("GCNConv", 8, False), ("GraphConv", 2, True)])
def test_reordered_layers_under_autocast_match_pyg(name, width, weighted):
    """A map moved across a normalised or weighted sum changes the dtype under autocast:
    PyG's GCNConv maps (bf16) and then sums with float32 coefficients (float32), where
    gnnfuse's aggregate-first order (a widening first layer) gave bf16; PyG's GraphConv
    sums with float32 weights and then maps (bf16), where mapping first (narrowing) gave
    float32. Under autocast these layers keep PyG's order: its dtype and values."""
    torch.manual_seed(3)
    ours, ref = getattr(gnn, name)(F_IN, width), getattr(pyg, name)(F_IN, width)
    ours.load_state_dict(ref.state_dict())
    x, weight = torch.randn(N, F_IN), torch.rand(EDGE_INDEX.shape[1]) if weighted else None
    assert_same_under_autocast(ours, ref, lambda layer, xs: layer(xs, EDGE_INDEX, weight), x)


LAZY_LAYERS = {"SAGEConv": {}, "GATConv": {"heads": 2}, "GATv2Conv": {"heads": 2}, "GraphConv": {},
               "GCNConv": {}, "SGConv": {"K": 2}, "TAGConv": {"K": 2}, "ChebConv": {"K": 3}}
BIPARTITE = ("SAGEConv", "GATConv", "GATv2Conv", "GraphConv")


@pytest.mark.parametrize("name, bipartite", [(name, False) for name in sorted(LAZY_LAYERS)]
                         + [(name, True) for name in BIPARTITE])
def test_lazy_in_channels_matches_pyg(name, bipartite):
    """``in_channels=-1`` (or ``(-1, -1)``) reads the width from the first call; after it,
    PyG's weights load and the layer matches PyG. GAT and GATv2 read their map's weight
    before calling it, and the others decide the map's place by its width, so they fix the
    width on entry (`nn.pyg_init.materialize`)."""
    torch.manual_seed(1)
    x = torch.randn(N, F_IN, dtype=torch.float64)
    inputs = (x, torch.randn(N, F_IN + 2, dtype=torch.float64)) if bipartite else x
    in_channels = (-1, -1) if bipartite else -1
    out_channels = 3 if name in BIPARTITE else 2     # GCN, SGC and TAG narrow 5 -> 2: their map runs first
    ours = getattr(gnn, name)(in_channels, out_channels, **LAZY_LAYERS[name]).double()
    # PyG 2.8's own lazy TAGConv and ChebConv fail in their forward (their later maps are
    # never given a width): compared with PyG's sized layer there
    sized = name in ("TAGConv", "ChebConv")
    ref = getattr(pyg, name)(F_IN if sized else in_channels, out_channels, **LAZY_LAYERS[name]).double()
    assert sized or str(ours) == str(ref)
    ours(inputs, EDGE_INDEX), ref(inputs, EDGE_INDEX)
    ours.load_state_dict(ref.state_dict())
    def call(layer):     # x_src differentiated; x_dst's gradient is SAGE's own test's
        return lambda xs: layer((xs, inputs[1]) if bipartite else xs, EDGE_INDEX)
    assert_same_outputs_and_grads(ours, ref, call(ours), call(ref), x)


def test_lazy_attention_maps_are_initialised_as_pygs():
    """PyG initialises a lazy map when it learns its width, with the layer's initializer:
    glorot for GAT (bound sqrt(6 / (5 + 6)) = 0.74 here), not torch's LazyLinear default
    (bound 1 / sqrt(5) = 0.45)."""
    torch.manual_seed(0)
    layer = gnn.GATConv(-1, 3, heads=2)
    layer(torch.randn(N, F_IN), EDGE_INDEX)
    weight = layer.lin.weight.detach()
    assert weight.shape == (6, F_IN)
    assert 0.45 < weight.abs().max() <= (6 / (F_IN + 6)) ** 0.5


def test_sage_project_is_refused_lazily_as_pyg_does():
    with pytest.raises(ValueError, match="does not support lazy"):
        gnn.SAGEConv(-1, 3, project=True)


def test_sage_root_weight_reads_as_pygs_and_is_not_silently_changed():
    """PyG reads ``conv.root_weight`` in its forward; ours was no attribute, so setting
    it to False did nothing and the root term stayed. Set to False it now drops the root
    term and keeps ``lin_r``, as PyG's does (its DirGNNConv sets it so); True needs lin_r."""
    assert gnn.SAGEConv(F_IN, 3).root_weight and not gnn.SAGEConv(F_IN, 3, root_weight=False).root_weight
    conv = gnn.SAGEConv(F_IN, 3)
    conv.root_weight = True
    x, edge_index = torch.randn(5, F_IN), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    with_root = conv(x, edge_index)
    conv.root_weight = False
    torch.testing.assert_close(conv(x, edge_index), with_root - conv.lin_r(x))
    assert conv.lin_r is not None and not conv.root_weight
    with pytest.raises(AttributeError, match="root_weight=True needs lin_r"):
        gnn.SAGEConv(F_IN, 3, root_weight=False).root_weight = True


def test_sage_project_set_on_a_layer_without_lin_is_named():
    """``conv.project = True`` on a SAGEConv built with project=False failed in forward with
    "TypeError: 'NoneType' object is not callable" (its ``lin`` is None), naming neither
    the layer nor the setting; it is refused as root_weight=True without lin_r is. Set to
    False on a projecting layer, the projection is skipped as in PyG."""
    x, edge_index = torch.randn(5, F_IN, dtype=torch.float64), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    conv = gnn.SAGEConv(F_IN, 3).double()
    conv.project = True
    with pytest.raises(AttributeError, match="SAGEConv: project=True needs lin"):
        conv(x, edge_index)
    torch.manual_seed(0)
    ours, ref = copied(gnn.SAGEConv(F_IN, 3, project=True), pyg.SAGEConv(F_IN, 3, project=True), "cpu")
    ours.project = ref.project = False
    torch.testing.assert_close(ours(x, edge_index), ref(x, edge_index), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gcn_target_to_source_flow_matches_pyg(backend, monkeypatch):
    """``flow="target_to_source"`` sends along edge_index[1] -> edge_index[0]; setting the
    attribute after construction (as PyG users do) takes effect too."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(2)
    ours, ref = copied(gnn.GCNConv(F_IN, 3, flow="target_to_source"), pyg.GCNConv(F_IN, 3, flow="target_to_source"),
                       device)
    x, edge_index = torch.randn(N, F_IN, dtype=torch.float64).to(device), EDGE_INDEX.to(device)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index), lambda xs: ref(xs, edge_index), x)
    ours.flow = ref.flow = "source_to_target"
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index), lambda xs: ref(xs, edge_index), x)
    with pytest.raises(ValueError, match="flow must be one of"):
        gnn.GCNConv(F_IN, 3, flow="sideways")


def test_appnp_dropout_one_drops_every_edge_like_pyg():
    x = torch.randn(N, F_IN, dtype=torch.float64)
    ours, ref = gnn.APPNP(K=2, alpha=0.1, dropout=1.0), pyg.APPNP(K=2, alpha=0.1, dropout=1.0)
    torch.testing.assert_close(ours(x, EDGE_INDEX), ref(x, EDGE_INDEX), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours(x, EDGE_INDEX), 0.1 * x, rtol=1e-12, atol=1e-12)


# name -> factory of (ours, PyG) for the layers whose PyG counterpart takes [B, N, F] features
STATIC = {
    "gcn": lambda: (gnn.GCNConv(F_IN, 3), pyg.GCNConv(F_IN, 3)),
    "gin": lambda: (gnn.GINConv(torch.nn.Linear(F_IN, 3), train_eps=True),
                    pyg.GINConv(torch.nn.Linear(F_IN, 3), train_eps=True)),
    "tag": lambda: (gnn.TAGConv(F_IN, 3, K=2), pyg.TAGConv(F_IN, 3, K=2)),
    "sgc": lambda: (gnn.SGConv(F_IN, 3, K=2), pyg.SGConv(F_IN, 3, K=2)),
    "graphconv": lambda: (gnn.GraphConv(F_IN, 3, aggr="max"), pyg.GraphConv(F_IN, 3, aggr="max")),
    "sage": lambda: (gnn.SAGEConv(F_IN, 3), pyg.SAGEConv(F_IN, 3)),
    "appnp": lambda: (gnn.APPNP(K=2, alpha=0.3), pyg.APPNP(K=2, alpha=0.3)),
    # cached=True kept the first matrix's propagation and gave it to every other matrix
    # of the batch (1.35 off PyG); the cache holds the whole batch, as PyG's
    "sgc-cached": lambda: (gnn.SGConv(F_IN, 3, K=2, cached=True), pyg.SGConv(F_IN, 3, K=2, cached=True)),
}


@pytest.mark.parametrize("name", STATIC)
def test_static_graph_features_match_pyg(name):
    """Node features [B, N, F] on one graph (PyG's static graphs): [B, N, F'] as PyG."""
    torch.manual_seed(3)
    ours, ref = copied(*STATIC[name]())
    x = torch.randn(3, N, F_IN, dtype=torch.float64)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, EDGE_INDEX), lambda xs: ref(xs, EDGE_INDEX), x)


def test_static_graph_features_on_the_triton_backend(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    torch.manual_seed(4)
    ours, ref = copied(*STATIC["gcn"](), device)
    x, edge_index = torch.randn(2, N, F_IN, dtype=torch.float64).to(device), EDGE_INDEX.to(device)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index), lambda xs: ref(xs, edge_index), x)


@pytest.mark.parametrize("make", [lambda: gnn.GATConv(F_IN, 3), lambda: gnn.GATv2Conv(F_IN, 3),
                                  lambda: gnn.EdgeConv(torch.nn.Linear(2 * F_IN, 3))])
def test_batched_features_are_refused_where_pyg_refuses_them(make):
    """Before, a [B, N, F] input was read as B vertices of [N, F] features: a wrong
    answer (or a confusing error) instead of a refusal."""
    with pytest.raises(NotImplementedError, match=r"node features of shape \[3, 6, 5\]"):
        make()(torch.randn(3, N, F_IN), EDGE_INDEX)


@pytest.mark.parametrize("name", STATIC)
def test_an_empty_batch_of_features_is_refused_by_name(name):
    """[0, N, F] failed in torch.stack with "stack expects a non-empty TensorList"."""
    with pytest.raises(ValueError, match=r"node features of shape \[0, 6, 5\] are a batch of no feature matrices"):
        STATIC[name]()[0](torch.randn(0, N, F_IN), EDGE_INDEX)


NODE_DIM_0 = {
    "gcn": lambda: gnn.GCNConv(F_IN, 3, node_dim=0),
    "gin": lambda: gnn.GINConv(torch.nn.Linear(F_IN, 3), node_dim=0),
    "tag": lambda: gnn.TAGConv(F_IN, 3, node_dim=0),
    "sgc": lambda: gnn.SGConv(F_IN, 3, node_dim=0),
    "graphconv": lambda: gnn.GraphConv(F_IN, 3, node_dim=0),
    "sage": lambda: gnn.SAGEConv(F_IN, 3, node_dim=0),
    "appnp": lambda: gnn.APPNP(K=2, alpha=0.3, node_dim=0),
}


@pytest.mark.parametrize("name", NODE_DIM_0)
def test_node_dim_0_refuses_batched_features(name):
    """``node_dim=0`` is PyG's node axis of [N, F] features, so it is taken; but PyG's layer
    built with it propagates over dim 0 of [B, N, F] features, where gnnfuse's ran each of
    the B matrices over its N vertices: GINConv, SAGEConv and GraphConv gave 1.4-2.6 off
    PyG's output without an error."""
    layer = NODE_DIM_0[name]()
    assert layer(torch.randn(N, F_IN), EDGE_INDEX).shape[0] == N      # [N, F]: the same node axis
    with pytest.raises(ValueError, match=rf"{type(layer).__name__}: built with node_dim=0"):
        layer(torch.randn(3, N, F_IN), EDGE_INDEX)


EDGE_TYPE = torch.tensor([0, 1, 1, 0, 2, 2, 1, 0])
RGCN_CONFS = [dict(), dict(num_bases=2), dict(num_blocks=1), dict(num_blocks=2)]   # widths 4 -> 6


@pytest.mark.parametrize("conf", RGCN_CONFS)
def test_rgcn_initialisation_is_pygs(conf):
    """From the same seed the parameters equal PyG's: glorot's fans are read from the last
    two dimensions (xavier_uniform_ gave a ~2.7x smaller range on the 3-D weight)."""
    torch.manual_seed(5)
    ours = gnn.RGCNConv(4, 6, 3, **conf)
    torch.manual_seed(5)
    ref = pyg.RGCNConv(4, 6, 3, **conf)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("conf", RGCN_CONFS[2:] + [dict(num_bases=2, aggr="add")])
def test_rgcn_block_diagonal_matches_pyg(conf, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(6)
    ours, ref = copied(gnn.RGCNConv(4, 6, 3, **conf), pyg.RGCNConv(4, 6, 3, **conf), device)
    x = torch.randn(N, 4, dtype=torch.float64).to(device)
    edge_index, edge_type = EDGE_INDEX.to(device), EDGE_TYPE.to(device)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index, edge_type),
                                  lambda xs: ref(xs, edge_index, edge_type), x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["mean", "add"])
def test_rgcn_featureless_input_matches_pyg(aggr, backend, monkeypatch):
    """``x=None`` (one learnt row per node) and ``x`` a vector of node indices, as PyG: the
    outputs and every parameter gradient agree."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(7)
    ours, ref = copied(gnn.RGCNConv(N, 3, 3, aggr=aggr), pyg.RGCNConv(N, 3, 3, aggr=aggr), device)
    index = torch.tensor([2, 0, 1, 5, 4, 3], device=device)
    edge_index, edge_type = EDGE_INDEX.to(device), EDGE_TYPE.to(device)
    for x in (None, index):
        for layer in (ours, ref):
            layer.zero_grad()
        out, expected = ours(x, edge_index, edge_type), ref(x, edge_index, edge_type)
        torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
        cotangent = torch.randn_like(expected)
        (out * cotangent).sum().backward()
        (expected * cotangent).sum().backward()
        for key, p in ours.named_parameters():
            torch.testing.assert_close(p.grad, dict(ref.named_parameters())[key].grad, rtol=1e-9, atol=1e-12)


def test_rgcn_blocks_refuse_featureless_input_like_pyg():
    with pytest.raises(ValueError, match="num_blocks.*needs float node features"):
        gnn.RGCNConv(N, 4, 3, num_blocks=2)(None, EDGE_INDEX, EDGE_TYPE)
    with pytest.raises(ValueError, match="cannot both be given"):
        gnn.RGCNConv(4, 6, 3, num_bases=2, num_blocks=2)


REPR = {
    "GCNConv": lambda lib: lib.GCNConv(16, 32),
    "GATConv": lambda lib: lib.GATConv(8, 32, heads=2),
    "GATv2Conv": lambda lib: lib.GATv2Conv(8, 32, heads=2),
    "SAGEConv": lambda lib: lib.SAGEConv(8, 32, aggr="max"),
    "GINConv": lambda lib: lib.GINConv(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())),
    "GraphConv": lambda lib: lib.GraphConv(8, 32),
    "APPNP": lambda lib: lib.APPNP(K=3, alpha=0.1),
    "SGConv": lambda lib: lib.SGConv(16, 32, K=10),
    "TAGConv": lambda lib: lib.TAGConv(16, 32, K=3),
    "ChebConv": lambda lib: lib.ChebConv(16, 32, K=3),
    "EdgeConv": lambda lib: lib.EdgeConv(torch.nn.Linear(4, 2)),
    "RGCNConv": lambda lib: lib.RGCNConv(4, 32, num_relations=2),
}


@pytest.mark.parametrize("name", REPR)
def test_repr_is_pygs_one_line_form(name):
    assert str(REPR[name](gnn)) == str(REPR[name](pyg))


ATTENTION_CONFS = [dict(edge_dim=3), dict(edge_dim=3, fill_value=0.5), dict(edge_dim=1, fill_value="max"),
                   dict(edge_dim=3, fill_value=torch.tensor([0.1, -0.2, 0.3])), dict(residual=True),
                   dict(residual=True, concat=False, edge_dim=3, fill_value="add"),
                   dict(edge_dim=3, fill_value="min"), dict(edge_dim=3, fill_value="mul"),
                   dict(edge_dim=3, add_self_loops=False),
                   dict(edge_dim=17)]   # wider than passes.fusion.MAX_EDGE_FEATURES: lin_edge run by torch


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("conf", ATTENTION_CONFS, ids=str)
@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_attention_edge_features_and_residual_match_pyg(name, conf, backend, monkeypatch):
    """``edge_dim`` with ``edge_attr`` (the self loops' features made by ``fill_value``, the
    given loop at vertex 1 replaced) and ``residual``: outputs and the gradients of x, the
    edge features and every parameter agree with PyG's layer."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(8)
    ours, ref = copied(getattr(gnn, name)(F_IN, 4, heads=2, **conf), getattr(pyg, name)(F_IN, 4, heads=2, **conf),
                       device)
    x, edge_index = torch.randn(N, F_IN, dtype=torch.float64).to(device), EDGE_INDEX.to(device)
    edge_dim = conf.get("edge_dim")
    attr = None if edge_dim is None else torch.randn(EDGE_INDEX.shape[1], edge_dim, dtype=torch.float64).squeeze(1)
    attr_a = None if attr is None else attr.to(device).clone().requires_grad_()
    attr_b = None if attr is None else attr.to(device).clone().requires_grad_()
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index, attr_a),
                                  lambda xs: ref(xs, edge_index, attr_b), x)
    if attr is not None:
        torch.testing.assert_close(attr_a.grad, attr_b.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_attention_edge_feature_errors_are_named(name):
    x, attr = torch.randn(N, F_IN), torch.randn(EDGE_INDEX.shape[1], 3)
    with pytest.raises(NotImplementedError, match=rf"edge_attr=\.\.\.\) needs the layer built with edge_dim"):
        getattr(gnn, name)(F_IN, 4)(x, EDGE_INDEX, attr)
    with pytest.raises(ValueError, match=r"edge_attr must have shape \[8, 2\]"):
        getattr(gnn, name)(F_IN, 4, edge_dim=2)(x, EDGE_INDEX, attr)
    with pytest.raises(NotImplementedError, match="fill_value='median'"):
        getattr(gnn, name)(F_IN, 4, edge_dim=3, fill_value="median")(x, EDGE_INDEX, attr)


WEIGHTED_ADJACENCY = {
    "GCNConv": lambda lib: lib.GCNConv(F_IN, 3),
    "GraphConv": lambda lib: lib.GraphConv(F_IN, 3, aggr="mean"),
    "SGConv": lambda lib: lib.SGConv(F_IN, 3, K=2),
    "TAGConv": lambda lib: lib.TAGConv(F_IN, 3, K=2),
    "APPNP": lambda lib: lib.APPNP(K=2, alpha=0.2),
    "ChebConv": lambda lib: lib.ChebConv(F_IN, 3, K=2),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", WEIGHTED_ADJACENCY)
def test_weighted_sparse_adjacency_weights_the_edges_like_pyg(name, backend, monkeypatch):
    """A sparse ``adj_t`` holding values other than 1: PyG weights each edge by its entry
    (as ``edge_weight``), which gnnfuse used to refuse."""
    from torch_geometric.utils import to_torch_csc_tensor
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(9)
    ours, ref = copied(WEIGHTED_ADJACENCY[name](gnn), WEIGHTED_ADJACENCY[name](pyg), device)
    value = (torch.rand(EDGE_INDEX.shape[1], dtype=torch.float64) + 0.5).to(device)
    edge_index = EDGE_INDEX.to(device)
    adj_t = to_torch_csc_tensor(edge_index, value, size=(N, N)).t()
    x = torch.randn(N, F_IN, dtype=torch.float64).to(device)
    if name in ("GCNConv", "SGConv", "APPNP"):      # PyG adds loops on top of stored ones: refused
        with pytest.raises(ValueError, match="the torch sparse adj_t stores self loops"):
            ours(x, adj_t)
        kept = edge_index[0] != edge_index[1]
        edge_index, value = edge_index[:, kept], value[kept]
        adj_t = to_torch_csc_tensor(edge_index, value, size=(N, N)).t()
        assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, adj_t), lambda xs: ref(xs, adj_t), x)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, adj_t), lambda xs: ref(xs, edge_index, value), x)
    with pytest.raises(ValueError, match="edge_weight beside a sparse adj_t, which PyG ignores"):
        ours(x, adj_t, value)


@pytest.mark.parametrize("name", WEIGHTED_ADJACENCY)
def test_weighted_scipy_matrix_weights_the_edges_or_is_refused(name):
    """A scipy matrix (row = source) given as the graph: its values are edge weights, as a
    torch ``adj_t``'s are. They were dropped without a word: GCNConv on a matrix of weights
    in [0.5, 1.5) gave the unweighted output, 0.36 off PyG's with those weights. A layer or
    function without edge weights refuses them by name; a matrix of ones is a pattern."""
    import scipy.sparse as sp
    torch.manual_seed(11)
    ours, ref = copied(WEIGHTED_ADJACENCY[name](gnn), WEIGHTED_ADJACENCY[name](pyg))
    value = torch.rand(EDGE_INDEX.shape[1], dtype=torch.float64) + 0.5
    matrix = sp.coo_matrix((value.numpy(), (EDGE_INDEX[0].numpy(), EDGE_INDEX[1].numpy())), shape=(N, N))
    x = torch.randn(N, F_IN, dtype=torch.float64)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, matrix), lambda xs: ref(xs, EDGE_INDEX, value), x)
    with pytest.raises(ValueError, match="scipy sparse matrix holds edge weights .* and edge_weight was given too"):
        ours(x, matrix, value)
    ones = sp.coo_matrix((np.ones(EDGE_INDEX.shape[1]), (EDGE_INDEX[0].numpy(), EDGE_INDEX[1].numpy())), shape=(N, N))
    torch.testing.assert_close(ours(x, ones), ref(x, EDGE_INDEX))
    sage = gnn.SAGEConv(F_IN, 3).double()
    with pytest.raises(ValueError, match="scipy sparse matrix holds values other than 1"):
        sage(x, matrix)
    torch.testing.assert_close(sage(x, ones), sage(x, EDGE_INDEX))
    # an entry stored twice holds 2, as a torch COO adj_t's does: weights for GCN; refused by
    # SAGE's mean and GAT, as the same matrix in CSR is (SAGE counted the source twice); two
    # edges for GIN's sum, which is the same either way
    doubled = sp.coo_matrix((np.ones(3), (np.array([0, 0, 2]), np.array([1, 1, 1]))), shape=(N, N))
    for adj in (doubled, doubled.tocsr()):
        for layer in (gnn.SAGEConv(F_IN, 3, aggr="mean"), gnn.GATConv(F_IN, 3, add_self_loops=False)):
            with pytest.raises(ValueError, match="scipy sparse matrix holds values other than 1"):
                layer.double()(x, adj)
    gcn = gnn.GCNConv(F_IN, 3).double()
    torch.testing.assert_close(gcn(x, doubled), gcn(x, doubled.tocsr()))
    # the weighted layers sum it too, in COO as in CSR: GraphConv's mean and max read the
    # COO one as two edges of weight 1 (up to 0.9 off the CSR one's single edge of weight 2)
    for aggr in ("mean", "max"):
        conv = gnn.GraphConv(F_IN, 3, aggr=aggr).double()
        weighted = sp.coo_matrix((np.array([0.5, 1.0, 2.0]), (np.array([0, 0, 2]), np.array([1, 1, 1]))), shape=(N, N))
        for adj in (doubled, weighted):
            torch.testing.assert_close(conv(x, adj), conv(x, adj.tocsr()))
    gin = gnn.GINConv(torch.nn.Linear(F_IN, 3)).double()
    torch.testing.assert_close(gin(x, doubled), gin(x, torch.tensor([[0, 0, 2], [1, 1, 1]])))


@pytest.mark.parametrize("name", WEIGHTED_ADJACENCY)
def test_weighted_sparse_adjacency_of_another_shape_than_x_is_refused(name):
    """A weighted adj_t (or scipy matrix) whose shape is not [N, N] for an x of N rows,
    its entries all below N: PyG raises, and the unweighted matrix is refused, but the
    weights' edge_index had lost the shape and these layers returned a result."""
    import scipy.sparse as sp
    layer = WEIGHTED_ADJACENCY[name](gnn).double()
    kept = EDGE_INDEX[0] != EDGE_INDEX[1]          # no stored loops (GCN, SGConv, APPNP refuse them)
    edges = EDGE_INDEX[:, kept]
    value = torch.rand(edges.shape[1], dtype=torch.float64) + 0.5
    x = torch.randn(N, F_IN, dtype=torch.float64)
    for shape in ((N + 2, N + 2), (N, N + 1), (N + 1, N)):
        adj_t = torch.sparse_coo_tensor(edges.flip(0), value, shape).coalesce()
        for adj in (adj_t, adj_t.to_sparse_csr(), sp.coo_matrix((value.numpy(), tuple(edges.numpy())), shape=shape)):
            with pytest.raises(ValueError, match=rf"{name}: the sparse adjacency \(edge_index\) has shape "
                                                 rf"\[{shape[0]}, {shape[1]}\] but x has {N} rows"):
                layer(x, adj)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("conf", [dict(), dict(edge_dim=3), dict(add_self_loops=False, concat=False)], ids=str)
@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_return_attention_weights_matches_pyg(name, conf, backend, monkeypatch):
    """``(out, (edge_index, alpha))``: the edges attended over (PyG's loop order) and one
    weight per edge and head, with gradients through both parts of the result."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(10)
    ours, ref = copied(getattr(gnn, name)(F_IN, 4, heads=2, **conf), getattr(pyg, name)(F_IN, 4, heads=2, **conf),
                       device)
    attr = torch.randn(EDGE_INDEX.shape[1], 3, dtype=torch.float64).to(device) if "edge_dim" in conf else None
    edge_index = EDGE_INDEX.to(device)
    results = {}

    def run(layer, xs):
        out, (edges, alpha) = layer(xs, edge_index, attr, return_attention_weights=True)
        results[layer] = edges, alpha
        return torch.cat([out.flatten(), alpha.flatten()])

    x = torch.randn(N, F_IN, dtype=torch.float64).to(device)
    assert_same_outputs_and_grads(ours, ref, lambda xs: run(ours, xs), lambda xs: run(ref, xs), x)
    assert torch.equal(results[ours][0].long(), results[ref][0])


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_return_attention_weights_for_an_edge_index_gives_an_edge_index_as_pyg(name):
    """Given PyG's ``EdgeIndex``, PyG's self loops keep its type: so do the edges returned
    here (they were a plain tensor of the same values)."""
    from torch_geometric import EdgeIndex
    torch.manual_seed(12)
    ours, ref = copied(getattr(gnn, name)(F_IN, 4, heads=2), getattr(pyg, name)(F_IN, 4, heads=2))
    edge_index = EdgeIndex(EDGE_INDEX, sparse_size=(N, N))
    x = torch.randn(N, F_IN, dtype=torch.float64)
    (out, (edges, alpha)), (expected, (expected_edges, expected_alpha)) = (
        layer(x, edge_index, return_attention_weights=True) for layer in (ours, ref))
    assert type(edges) is type(expected_edges) is EdgeIndex and edges.sparse_size() == expected_edges.sparse_size()
    assert torch.equal(edges.as_tensor(), expected_edges.as_tensor())
    torch.testing.assert_close(alpha, expected_alpha, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_returned_attention_weights_of_scores_past_exp_s_range_match_pyg(name):
    """Scores in the thousands, whose exp overflows float64: the returned weights are
    PyG's softmax (shifted by each vertex's largest score), finite, not inf / inf."""
    torch.manual_seed(13)
    ours, ref = copied(getattr(gnn, name)(F_IN, 4, heads=2), getattr(pyg, name)(F_IN, 4, heads=2))
    x = 1e5 * torch.randn(N, F_IN, dtype=torch.float64)
    (_, (_, alpha)), (_, (_, expected)) = (layer(x, EDGE_INDEX, return_attention_weights=True) for layer in (ours, ref))
    assert bool(expected.isfinite().all())
    torch.testing.assert_close(alpha, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_return_attention_weights_for_a_sparse_adjacency_matches_pyg(name):
    """Given a torch sparse ``adj_t``, PyG returns the adjacency (loops added) in its layout
    with the weights as [N, N, heads] values; before, this was refused."""
    from torch_geometric.utils import to_torch_csc_tensor
    torch.manual_seed(11)
    ours, ref = copied(getattr(gnn, name)(F_IN, 4, heads=2), getattr(pyg, name)(F_IN, 4, heads=2))
    adj_t = to_torch_csc_tensor(EDGE_INDEX.unique(dim=1), size=(N, N)).t()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    (out, (adj, _)), (expected, (expected_adj, _)) = (layer(x, adj_t, return_attention_weights=True)
                                                      for layer in (ours, ref))
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
    assert adj.layout == expected_adj.layout and adj.shape == expected_adj.shape == (N, N, 2)
    torch.testing.assert_close(adj.to_dense(), expected_adj.to_dense(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=str)
@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_attention_weights_of_a_sparse_adjacency_line_up_with_its_entries(name, layout):
    """PyG's ``alpha`` beside a sparse adjacency holds the weights in the order of the
    adjacency's stored entries (``set_sparse_value(adj_t, alpha)``), row = target. It was
    in gnnfuse's edge order instead -- the given entries, then the added self loops -- so
    ``alpha[i]`` belonged to another edge than ``adj.values()[i]``: GAT's first row 0.32
    off PyG's on this graph."""
    torch.manual_seed(12)
    ours, ref = copied(getattr(gnn, name)(F_IN, 4, heads=2), getattr(pyg, name)(F_IN, 4, heads=2))
    edges = EDGE_INDEX.unique(dim=1)          # one self loop (1 -> 1): the other N - 1 are added
    adj_t = torch.sparse_coo_tensor(edges.flip(0), torch.ones(edges.shape[1]), (N, N)).coalesce()
    adj_t = adj_t.to_sparse_csr() if layout is torch.sparse_csr else adj_t
    weights = torch.linspace(-1, 1, 2 * (edges.shape[1] + N - 1), dtype=torch.float64).view(-1, 2)
    results = {}

    def run(layer, xs):
        out, (adj, alpha) = layer(xs, adj_t, return_attention_weights=True)
        stored = adj.coalesce().values() if adj.layout is torch.sparse_coo else adj.values()
        results[layer] = stored.detach(), alpha.detach()
        return torch.cat([out.flatten(), (alpha * weights).sum(0)])

    x = torch.randn(N, F_IN, dtype=torch.float64)
    assert_same_outputs_and_grads(ours, ref, lambda xs: run(ours, xs), lambda xs: run(ref, xs), x)
    stored, alpha = results[ours]
    torch.testing.assert_close(alpha, stored, rtol=0, atol=0)
    torch.testing.assert_close(alpha, results[ref][1], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("make", [lambda: gnn.GCNConv(F_IN, 3, cached=True), lambda: gnn.APPNP(2, 0.1, cached=True)])
def test_cached_graph_is_cleared_by_pygs_idiom(make):
    """PyG users drop a ``cached=True`` layer's graph with ``conv._cached_edge_index = None``
    (or ``_cached_adj_t``); the next call then uses the graph it is given."""
    layer, x = make(), torch.randn(N, F_IN)
    assert layer._cached_edge_index is None
    layer(x, EDGE_INDEX)
    assert layer._cached_edge_index is not None and layer._cached_adj_t is not None
    other = EDGE_INDEX.flip(0)
    stale = layer(x, other)                        # the kept graph, as in PyG
    layer._cached_edge_index = None
    fresh = layer(x, other)
    assert not torch.allclose(stale, fresh)
    layer._cached_adj_t = None
    assert layer._cached_edge_index is None
    torch.testing.assert_close(layer(x, other), fresh)
    with pytest.raises(ValueError, match="can only be set to None"):
        layer._cached_edge_index = EDGE_INDEX


def test_pyg_names_with_other_arguments_are_refused_by_name():
    """``gnnfuse.nn.gcn_norm`` would be the plain-PyTorch baseline's helper, which takes a
    gnnfuse Graph where PyG's takes (edge_index, edge_weight, num_nodes): a changed import
    would call other code. It refuses and points at `gnnfuse.nn.reference`. (``GCN`` did
    the same until gnnfuse.nn had PyG's model: tests/test_pyg_models.py.)"""
    name = "gcn_norm"
    namespace: dict = {}
    with pytest.raises(ImportError, match=rf"gnnfuse.nn has no '{name}'.*gnnfuse.nn.reference.{name}"):
        exec(f"from gnnfuse.nn import {name}", namespace)
    assert name not in gnn.__all__
    from gnnfuse.nn import reference
    assert callable(getattr(reference, name))


MESSAGE_PASSING_LAYERS = {
    "GCNConv": lambda **kw: gnn.GCNConv(4, 3, **kw), "SAGEConv": lambda **kw: gnn.SAGEConv(4, 3, **kw),
    "GATConv": lambda **kw: gnn.GATConv(4, 3, **kw), "GATv2Conv": lambda **kw: gnn.GATv2Conv(4, 3, **kw),
    "GINConv": lambda **kw: gnn.GINConv(torch.nn.Linear(4, 3), **kw),
    "GraphConv": lambda **kw: gnn.GraphConv(4, 3, **kw), "APPNP": lambda **kw: gnn.APPNP(2, 0.1, **kw),
    "SGConv": lambda **kw: gnn.SGConv(4, 3, **kw), "TAGConv": lambda **kw: gnn.TAGConv(4, 3, **kw),
    "ChebConv": lambda **kw: gnn.ChebConv(4, 3, 2, **kw),
    "EdgeConv": lambda **kw: gnn.EdgeConv(torch.nn.Linear(8, 3), **kw)}


# the layers whose PyG forms pass their own aggr (or have it as an argument of their own);
# each a (layer, call on x and edge_index) pair
OWN_AGGR_LAYERS = {
    "RGCNConv": (lambda **kw: gnn.RGCNConv(4, 3, 2, **kw), lambda m, x, e: m(x, e, e[0] % 2)),
    "FastRGCNConv": (lambda **kw: gnn.FastRGCNConv(4, 3, 2, **kw), lambda m, x, e: m(x, e, e[0] % 2)),
    "RGATConv": (lambda **kw: gnn.RGATConv(4, 3, 2, **kw), lambda m, x, e: m(x, e, e[0] % 2)),
    "HGTConv": (lambda **kw: gnn.HGTConv(4, 4, (["a"], [("a", "to", "a")]), **kw),
                lambda m, x, e: m({"a": x}, {("a", "to", "a"): e})["a"])}


@pytest.mark.parametrize("name", OWN_AGGR_LAYERS)
def test_relational_and_hgt_layers_take_pygs_message_passing_options_as_the_others_do(name):
    """R-GCN, RGAT and HGT refused PyG's MessagePassing options even at the values they
    compute with (RGCNConv(flow='source_to_target'): "not supported ... R-GCN's flow is
    source_to_target"), and RGAT and HGT refused a misspelt keyword with a
    NotImplementedError calling it a MessagePassing argument, where PyG's TypeError is
    what code catches."""
    make, call = OWN_AGGR_LAYERS[name]
    x, edge_index = torch.randn(5, 4), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    torch.manual_seed(0)
    plain = make()
    torch.manual_seed(0)
    spelt = make(flow="source_to_target", decomposed_layers=1)
    torch.testing.assert_close(call(spelt, x, edge_index), call(plain, x, edge_index))
    for key, value in (("flow", "target_to_source"), ("decomposed_layers", 2), ("heeds", 2)):
        with pytest.raises(TypeError, match=rf"^{name}: {key}={value!r} is not taken"):
            make(**{key: value})


@pytest.mark.parametrize("name", MESSAGE_PASSING_LAYERS)
def test_pyg_message_passing_options_at_the_layers_values_are_taken_and_others_refused_by_name(name):
    """PyG's layers pass ``flow``, ``node_dim``, ``decomposed_layers`` (and ``aggr``) on to
    MessagePassing; code spelling them out at their defaults got Python's bare
    "unexpected keyword argument" here."""
    make = MESSAGE_PASSING_LAYERS[name]
    options = {"flow": "source_to_target", "node_dim": -2, "decomposed_layers": 1}
    if name not in ("SAGEConv", "GraphConv", "EdgeConv"):       # (their aggr is an argument of their own)
        options["aggr"] = "add"
    x, edge_index = torch.randn(5, 4), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    torch.manual_seed(0)
    plain = make()
    torch.manual_seed(0)
    spelt = make(**options)
    torch.testing.assert_close(spelt(x, edge_index), plain(x, edge_index))
    for refused in ({"flow": "target_to_source"}, {"decomposed_layers": 2}, {"heeds": 2}):
        if name == "GCNConv" and "flow" in refused:       # its flow is an argument of its own, both taken
            continue
        key, value = next(iter(refused.items()))
        with pytest.raises(TypeError, match=rf"^{name}: {key}={value!r} is not taken"):
            make(**refused)
