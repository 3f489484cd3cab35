"""A whole ``from torch_geometric.nn import ...`` line switched to ``gnnfuse.nn``
(`gnnfuse.nn.pyg_reexports`): PyG's names without message passing come back as PyG's own
objects, those that would build or run propagation gnnfuse does not compile raise an
ImportError saying why, and gnnfuse.nn's own names and submodules win."""
from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn import MessagePassing as PyGMessagePassing

import gnnfuse.nn
from gnnfuse.nn.hetero_transform import to_hetero as gnnfuse_to_hetero
from gnnfuse.nn.pyg_layers import NOT_EXPORTED
from gnnfuse.nn.pyg_models import PYG_MODELS
from gnnfuse.nn.pyg_reexports import MODELS, NOT_REEXPORTED, reexported_names

SAMPLE = ["global_mean_pool", "global_add_pool", "BatchNorm", "LayerNorm", "GraphNorm", "Linear", "HeteroLinear",
          "MLP", "JumpingKnowledge", "Sequential", "SumAggregation", "SoftmaxAggregation", "Set2Set", "TopKPooling",
          "dense_diff_pool", "DenseGCNConv", "knn_interpolate", "TransE", "bro", "DeepGraphInfomax", "GAE",
          "DataParallel", "summary", "to_fixed_size", "GlobalAttention"]


def test_a_whole_pyg_import_line_works():
    namespace: dict = {}
    exec("from gnnfuse.nn import GCNConv, global_mean_pool, BatchNorm, Linear, JumpingKnowledge, Sequential, MLP",
         namespace)
    assert namespace["GCNConv"] is gnnfuse.nn.conv.GCNConv
    for name in ("global_mean_pool", "BatchNorm", "Linear", "JumpingKnowledge", "Sequential", "MLP"):
        assert namespace[name] is getattr(pyg_nn, name), name


@pytest.mark.parametrize("name", SAMPLE)
def test_name_is_pyg_s_own_object(name):
    assert name in reexported_names()
    assert getattr(gnnfuse.nn, name) is getattr(pyg_nn, name)


def test_gnnfuse_s_own_names_and_submodules_win():
    assert gnnfuse.nn.to_hetero is gnnfuse_to_hetero is not pyg_nn.to_hetero
    assert gnnfuse.nn.SAGEConv is not pyg_nn.SAGEConv and gnnfuse.nn.GCN is not pyg_nn.GCN
    submodules = {info.name for info in pkgutil.iter_modules(gnnfuse.nn.__path__)}
    assert {"functional", "aggregation", "attention", "models", "conv"} <= submodules
    # a re-exported name equal to a submodule's would hide the submodule from
    # ``from gnnfuse.nn import <submodule>`` whenever it was not imported yet
    assert submodules.isdisjoint(reexported_names())
    for name in ("functional", "aggregation", "attention", "models", "conv"):
        assert importlib.import_module(f"gnnfuse.nn.{name}") is getattr(gnnfuse.nn, name)
        assert sys.modules[f"gnnfuse.nn.{name}"].__name__ == f"gnnfuse.nn.{name}"


def test_no_convolution_is_handed_back():
    """PyG's convolutions stay gnnfuse's, PyG's compiled through gnnfuse, or refused."""
    assert reexported_names().isdisjoint(pyg_nn.conv.__all__)
    assert reexported_names().isdisjoint(PYG_MODELS)
    with pytest.raises(ImportError, match="gnnfuse.nn has no 'SplineConv': .*pyg-lib"):
        exec("from gnnfuse.nn import SplineConv", {})
    assert NOT_EXPORTED.keys().isdisjoint(reexported_names())


def _message_passing_inside(obj) -> list[str]:
    """PyG MessagePassing classes (its base aside) the module defining ``obj`` holds."""
    module = vars(sys.modules[obj.__module__])
    return [name for name, value in module.items() if isinstance(value, type)
            and issubclass(value, PyGMessagePassing) and value is not PyGMessagePassing]


def test_no_handed_back_name_builds_message_passing():
    """A PyG upgrade that adds a pooling or model building a convolution inside fails here
    until the name joins NOT_REEXPORTED (SAGPooling's module holds GraphConv, for one)."""
    builders = {name: inside for name in sorted(reexported_names())
                if (inside := _message_passing_inside(getattr(pyg_nn, name)))}
    # GPSENodeEncoder shares gpse.py with GPSE (refused) but only maps precomputed encodings
    assert builders == {"GPSENodeEncoder": ["ResGatedGraphConv"]}
    assert "ResGatedGraphConv" not in pyg_nn.GPSENodeEncoder.__init__.__code__.co_names
    assert _message_passing_inside(pyg_nn.SAGPooling) == ["GraphConv"]


def test_every_pyg_model_is_classified():
    """Each of torch_geometric.nn.models is handed back, built from gnnfuse's layers, or
    refused with a reason: a model PyG adds fails here until it is classified."""
    models = set(pyg_nn.models.__all__)
    assert set(MODELS) <= models
    assert models - set(MODELS) - set(PYG_MODELS) == models & NOT_REEXPORTED.keys()
    assert all(hasattr(pyg_nn, name) for name in NOT_REEXPORTED)


@pytest.mark.parametrize("name, why", [("SAGPooling", "GNN=gnnfuse.nn.GraphConv"), ("LightGCN", "LGConv"),
                                       ("to_hetero_with_bases", "gnnfuse.nn.to_hetero"), ("DimeNet", "scatter"),
                                       ("to_captum_model", "edge masks")])
def test_a_name_needing_propagation_is_refused_with_advice(name, why):
    with pytest.raises(ImportError, match=rf"gnnfuse.nn has no '{name}': torch_geometric.nn.{name} .*{why}"):
        exec(f"from gnnfuse.nn import {name}", {})


def test_a_name_in_neither_is_a_clear_attribute_error():
    with pytest.raises(AttributeError, match="'NotAName': it is neither a gnnfuse.nn name nor one of torch_geometric"):
        gnnfuse.nn.NotAName
    with pytest.raises(ImportError, match="cannot import name 'NotAName'"):
        exec("from gnnfuse.nn import NotAName", {})
    assert not hasattr(gnnfuse.nn, "NotAName") and not hasattr(gnnfuse.nn, "__wrapped__")


def test_sag_pooling_advice_gives_pyg_s_numbers():
    """What SAGPooling's ImportError advises: PyG's pooling scoring with gnnfuse's GraphConv."""
    x = torch.randn(8, 4, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 1, 2, 7], [1, 2, 3, 4, 5, 0, 0, 0, 6, 6]])
    torch.manual_seed(0)
    ours = pyg_nn.SAGPooling(4, ratio=0.5, GNN=gnnfuse.nn.GraphConv).double()
    theirs = pyg_nn.SAGPooling(4, ratio=0.5).double()
    theirs.load_state_dict(ours.state_dict())
    assert type(ours.gnn) is gnnfuse.nn.GraphConv
    for got, want in zip(ours(x, edge_index)[:3], theirs(x, edge_index)[:3], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_pyg_sequential_runs_gnnfuse_layers():
    """PyG's Sequential generates its forward from the signature strings; handed back by
    gnnfuse.nn, with gnnfuse's convolutions and PyG's pooling in it, it gives PyG's numbers."""
    def model(m):
        return m.Sequential("x, edge_index, batch", [
            (m.GCNConv(4, 8), "x, edge_index -> x"), torch.nn.ReLU(), (m.SAGEConv(8, 8), "x, edge_index -> x"),
            (m.global_mean_pool, "x, batch -> x"), m.Linear(8, 3)])
    torch.manual_seed(0)
    ours, theirs = model(gnnfuse.nn).double(), model(pyg_nn).double()
    theirs.load_state_dict(ours.state_dict())
    assert type(ours) is pyg_nn.Sequential and type(ours.module_0) is gnnfuse.nn.GCNConv
    x = torch.randn(8, 4, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 1, 2, 7], [1, 2, 3, 4, 5, 0, 0, 0, 6, 6]])
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    got, want = ours(x, edge_index, batch), theirs(x, edge_index, batch)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    got.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
