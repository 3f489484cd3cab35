"""PyG's ready-made models from `gnnfuse.nn` (`gnnfuse.nn.pyg_models`): ``gnnfuse.nn.GCN``
and its siblings are PyG's classes building gnnfuse's layers, so with PyG's weights they
must give PyG's outputs and every parameter gradient in float64 (reference backend and a
few cases on the Triton interpreter), start from PyG's weights under one seed, and run
gnnfuse's compiled programs, not PyG's layers."""
from __future__ import annotations

import io
import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.data import Data
from torch_geometric.utils import degree

import gnnfuse.nn
from gnnfuse.loader import NeighborLoader
from gnnfuse.runtime import record_calls
from oracle_check import device_for

# 10 vertices (9 has no in-edges), a self loop (3 -> 3), a repeated edge (1 -> 2 twice)
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 2, 3, 0, 5, 1, 6, 7, 4, 8, 9, 9],
                      [1, 2, 3, 4, 5, 0, 0, 0, 4, 3, 2, 1, 2, 0, 2, 6, 7, 8, 5]])
NUM_NODES, F, HIDDEN, OUT, EDGE_DIM = 10, 5, 8, 3, 2
PNA_DEG = torch.bincount(degree(EDGES[1], NUM_NODES, dtype=torch.long))

# id -> (model name, constructor arguments after (F, HIDDEN, num_layers), the forward's extra inputs)
CASES = {
    "gcn": ("GCN", {"num_layers": 2}, ()),
    "gcn-cat-batchnorm-weights": ("GCN", {"num_layers": 3, "out_channels": OUT, "jk": "cat", "norm": "batch_norm"},
                                  ("edge_weight",)),
    "sage-max-layernorm-project": ("GraphSAGE", {"num_layers": 3, "out_channels": OUT, "jk": "max",
                                                 "norm": "layer_norm", "project": True}, ()),
    "gin-lstm": ("GIN", {"num_layers": 3, "out_channels": OUT, "jk": "lstm", "train_eps": True}, ()),
    "gat-heads": ("GAT", {"num_layers": 2, "out_channels": OUT, "heads": 2}, ()),
    "gatv2-cat": ("GAT", {"num_layers": 2, "out_channels": OUT, "heads": 2, "v2": True, "jk": "cat"}, ()),
    "gat-edge-attr": ("GAT", {"num_layers": 2, "out_channels": OUT, "heads": 2, "edge_dim": EDGE_DIM},
                      ("edge_attr",)),
    "pna": ("PNA", {"num_layers": 2, "out_channels": OUT, "aggregators": ["mean", "max", "std"],
                    "scalers": ["identity", "amplification", "attenuation"], "deg": PNA_DEG, "edge_dim": EDGE_DIM},
            ("edge_attr",)),
    "edgecnn-last": ("EdgeCNN", {"num_layers": 2, "out_channels": OUT, "jk": "last", "aggr": "mean"}, ()),
    "edgecnn-batchnorm": ("EdgeCNN", {"num_layers": 2, "out_channels": OUT, "norm": "batch_norm", "act_first": True},
                          ()),
    "edgecnn-layernorm": ("EdgeCNN", {"num_layers": 3, "norm": "layer_norm", "jk": "cat"}, ()),
    "edgecnn-gelu": ("EdgeCNN", {"num_layers": 2, "out_channels": OUT, "act": "gelu"}, ()),
}
# cases whose layers run PyG's formula eagerly, with a warning: PNAConv's propagate is PyG's;
# EdgeConv's MLP holding a norm over all edges has no per-edge form, and GELU no gnnfuse op
# (nn/edge_conv_eager.py)
EAGER_CASES = {"pna", "edgecnn-batchnorm", "edgecnn-layernorm", "edgecnn-gelu"}
TRITON_CASES = ["gcn-cat-batchnorm-weights", "gatv2-cat"]


def build(case: str, module, seed: int) -> torch.nn.Module:
    name, kwargs, _ = CASES[case]
    kwargs = dict(kwargs)
    torch.manual_seed(seed)
    return getattr(module, name)(F, HIDDEN, kwargs.pop("num_layers"), **kwargs)


def inputs(device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    tensors = {"x": torch.randn(NUM_NODES, F, dtype=torch.float64, generator=gen),
               "edge_weight": torch.rand(EDGES.shape[1], dtype=torch.float64, generator=gen) + 0.1,
               "edge_attr": torch.randn(EDGES.shape[1], EDGE_DIM, dtype=torch.float64, generator=gen)}
    return {name: t.to(device) for name, t in tensors.items()}


def run(model: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor, **extra):
    """Output and the gradients of a fixed projection of it w.r.t. x and every parameter."""
    x = x.clone().requires_grad_()
    out = model(x, edge_index, **extra)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    names, params = zip(*model.named_parameters())
    grads = torch.autograd.grad((out * weight).sum(), [x, *params])
    return out.detach(), dict(zip(("x", *names), grads))


def assert_same(got, expected) -> None:
    torch.testing.assert_close(got[0], expected[0], rtol=1e-9, atol=1e-10)
    assert got[1].keys() == expected[1].keys()
    for name, grad in expected[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-9, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


def compare(case: str, device: str) -> None:
    ours = build(case, gnnfuse.nn, seed=0).double().to(device)
    theirs = build(case, pyg_nn, seed=1).double().to(device)
    theirs.load_state_dict(ours.state_dict())
    assert all(type(conv).__module__.startswith("gnnfuse.nn") for conv in ours.convs)
    tensors = inputs(device)
    extra = {key: tensors[key] for key in CASES[case][2]}
    edge_index = EDGES.to(device)
    expected = run(theirs, tensors["x"], edge_index, **extra)
    with warnings.catch_warnings(), record_calls() as calls:
        warnings.simplefilter("ignore")          # the EAGER_CASES' "runs eagerly" warnings
        got = run(ours, tensors["x"], edge_index, **extra)
    assert bool(calls) == (case not in EAGER_CASES)       # gnnfuse's programs ran
    assert_same(got, expected)


@pytest.mark.parametrize("case", CASES)
def test_model_matches_pyg_on_the_reference_backend(case, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    compare(case, "cpu")


@pytest.mark.parametrize("case", TRITON_CASES)
def test_model_matches_pyg_on_triton(case, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    compare(case, device_for("triton"))


@pytest.mark.parametrize("case", CASES)
def test_same_seed_gives_pyg_s_weights(case):
    ours, theirs = build(case, gnnfuse.nn, seed=3), build(case, pyg_nn, seed=3)
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert list(ours_state) == list(theirs_state)
    for key, value in theirs_state.items():
        torch.testing.assert_close(ours_state[key], value, rtol=0, atol=0, msg=lambda m, k=key: f"{k}: {m}")
    assert repr(ours) == repr(theirs) and repr(ours.convs) == repr(theirs.convs)


def test_is_pyg_s_class_and_pickles():
    model = gnnfuse.nn.GAT(F, HIDDEN, 2, out_channels=OUT, heads=2)
    assert isinstance(model, pyg_nn.GAT) and type(model) is gnnfuse.nn.GAT
    assert type(model).__module__ == "gnnfuse.nn" and type(model).__qualname__ == "GAT"
    assert [type(c) for c in model.convs] == [gnnfuse.nn.GATConv] * 2
    # PyG's init_conv: the last layer averages its heads (concat=False) when it maps to out_channels
    assert (model.convs[0].concat, model.convs[1].concat) == (True, False)
    assert type(gnnfuse.nn.GAT(F, HIDDEN, 2, v2=True).convs[0]) is gnnfuse.nn.GATv2Conv
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is gnnfuse.nn.GAT
    x = inputs("cpu")["x"].float()
    torch.testing.assert_close(loaded(x, EDGES), model(x, EDGES))


def test_an_argument_a_gnnfuse_layer_refuses_is_named():
    with pytest.raises(TypeError, match="GINConv: aggr='mean' is not taken"):
        gnnfuse.nn.GIN(F, HIDDEN, 2, aggr="mean")
    with pytest.raises(TypeError, match="GCNConv: decomposed_layers=2 is not taken"):
        gnnfuse.nn.GCN(F, HIDDEN, 2, decomposed_layers=2)
    with pytest.raises(ValueError, match="divisible by the number of heads"):      # PyG's own check
        gnnfuse.nn.GAT(F, 7, 2, heads=2)


@pytest.mark.parametrize("name", ["GraphSAGE", "GCN"])
def test_trimmed_mini_batch_matches_pyg(name):
    """``num_sampled_nodes_per_hop`` (PyG's trim_to_layer) on a gnnfuse NeighborLoader batch."""
    gen = torch.Generator().manual_seed(2)
    n = 40
    edge_index = torch.randint(0, n, (2, 160), generator=gen)
    data = Data(x=torch.randn(n, F, dtype=torch.float64, generator=gen), edge_index=edge_index, num_nodes=n)
    batch = next(iter(NeighborLoader(data, num_neighbors=[3, 2], batch_size=4)))
    assert len(batch.num_sampled_nodes) == 3
    torch.manual_seed(0)
    ours = getattr(gnnfuse.nn, name)(F, HIDDEN, 2, out_channels=OUT).double()
    theirs = getattr(pyg_nn, name)(F, HIDDEN, 2, out_channels=OUT).double()
    theirs.load_state_dict(ours.state_dict())
    trim = {"num_sampled_nodes_per_hop": batch.num_sampled_nodes, "num_sampled_edges_per_hop": batch.num_sampled_edges}
    expected = run(theirs, batch.x, batch.edge_index, **trim)
    got = run(ours, batch.x, batch.edge_index, **trim)
    assert got[0].shape[0] < batch.x.shape[0]          # trimmed: the last layer's output covers fewer vertices
    assert_same(got, expected)


def test_to_hetero_of_a_lazy_graphsage_matches_pyg():
    """PyG's heterogeneous recipe, ``to_hetero(GraphSAGE((-1, -1), ...), metadata)``, with
    gnnfuse.nn's names: lazy bipartite layers per edge type, PyG's numbers."""
    metadata = (["a", "b"], [("a", "to", "b"), ("b", "to", "a"), ("a", "self", "a")])
    gen = torch.Generator().manual_seed(4)
    x = {"a": torch.randn(5, 4, dtype=torch.float64, generator=gen),
         "b": torch.randn(3, 6, dtype=torch.float64, generator=gen)}
    edges = {("a", "to", "b"): torch.tensor([[0, 1, 2, 4], [0, 1, 2, 2]]),
             ("b", "to", "a"): torch.tensor([[0, 1, 2], [3, 4, 0]]),
             ("a", "self", "a"): torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])}
    models = []
    for module in (gnnfuse.nn, pyg_nn):
        torch.manual_seed(0)
        model = module.to_hetero(module.GraphSAGE((-1, -1), HIDDEN, 2, out_channels=OUT), metadata).double()
        model(x, edges)                                     # materialises the lazy weights
        models.append(model)
    ours, theirs = models
    for key, value in theirs.state_dict().items():        # drawn as PyG draws them at the first call
        torch.testing.assert_close(ours.state_dict()[key], value, rtol=0, atol=0)
    got, want = ours(x, edges), theirs(x, edges)
    assert got.keys() == want.keys()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    sum(v.square().sum() for v in got.values()).backward()
    sum(v.square().sum() for v in want.values()).backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("name", ["GraphSAGE", "GAT", "GIN"])
def test_layerwise_inference_takes_a_gnnfuse_loader(name):
    """PyG's ``model.inference(subgraph_loader)`` with gnnfuse's NeighborLoader: PyG's method
    asserts its own loader class (a bare AssertionError); each layer over every vertex in
    one-hop batches gives the full graph's output, and a loader whose batches would not
    line up with the vertices is refused by name."""
    gen = torch.Generator().manual_seed(5)
    data = Data(x=torch.randn(NUM_NODES, F, dtype=torch.float64, generator=gen), edge_index=EDGES,
                num_nodes=NUM_NODES)
    torch.manual_seed(0)
    model = getattr(gnnfuse.nn, name)(F, HIDDEN, 2, out_channels=OUT, norm="batch_norm").double().eval()
    expected = model(data.x, data.edge_index)
    for cache in (False, True):
        got = model.inference(NeighborLoader(data, num_neighbors=[-1], batch_size=3), cache=cache)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="every vertex in id order"):
        model.inference(NeighborLoader(data, num_neighbors=[-1], batch_size=3, shuffle=True))
    with pytest.raises(ValueError, match="samples 2 hops"):
        model.inference(NeighborLoader(data, num_neighbors=[-1, -1], batch_size=3))
    with pytest.raises(ValueError, match="model.eval"):
        model.train().inference(NeighborLoader(data, num_neighbors=[-1], batch_size=3))


def test_layerwise_inference_refuses_what_would_give_other_rows():
    """Refused by name, as each would silently give wrong rows: a jk mode that combines
    layers (PyG's method asserts jk None or 'last'; layer by layer the combination is never
    made), seeds that are not every vertex in id order (rows stacked by position), and
    drop_last with a short last batch (its vertices' rows missing)."""
    data = Data(x=torch.randn(NUM_NODES, F, dtype=torch.float64), edge_index=EDGES, num_nodes=NUM_NODES)
    model = gnnfuse.nn.GraphSAGE(F, HIDDEN, 2).double().eval()
    with pytest.raises(ValueError, match="jk='cat' needs jk=None or 'last'"):
        gnnfuse.nn.GraphSAGE(F, HIDDEN, 2, jk="cat").eval().inference(NeighborLoader(data, num_neighbors=[-1]))
    with pytest.raises(ValueError, match="every vertex in id order"):
        model.inference(NeighborLoader(data, num_neighbors=[-1], batch_size=3, input_nodes=torch.arange(4)))
    with pytest.raises(ValueError, match="drop_last=True, which drops the last 1 vertices"):
        model.inference(NeighborLoader(data, num_neighbors=[-1], batch_size=3, drop_last=True))


def test_layerwise_inference_names_a_loader_it_cannot_take():
    """Neither PyG's nor gnnfuse's NeighborLoader: a TypeError naming the loader, where
    PyG's method gave a bare AssertionError."""
    model = gnnfuse.nn.GraphSAGE(F, HIDDEN, 2).eval()
    with pytest.raises(TypeError, match="takes a NeighborLoader .* not list"):
        model.inference([])
