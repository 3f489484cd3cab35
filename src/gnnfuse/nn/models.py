"""A registry of standard node-classification models, each with its paper's hyperparameters.

A model is one `ModelSpec` entry: a builder ``(in_channels, out_channels, hidden,
dropout) -> nn.Module`` and the defaults the original paper trained it with, so
``gnnfuse train --model NAME`` reproduces the paper's setting without flags and adding
a model is one `register` call. Every model is called as ``model(x, graph)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .conv import GATConv, GCNConv, SAGEConv
from .link_models import rgat_link_model, rgcn_link_model
from .propagation import APPNP, SGConv
from .functional import dropout as sparse_dropout
from .reference import GCN


@dataclass(frozen=True)
class Hyperparameters:
    """What the training loop needs to know about a model's recipe.

    `hidden` is None for models without a hidden layer (SGC); `patience` None means
    no early stopping (train all `epochs`, report the best-validation epoch).
    """
    hidden: int | None
    lr: float
    weight_decay: float
    dropout: float
    epochs: int
    patience: int | None


Builder = Callable[[int, int, "int | None", float], nn.Module]


@dataclass(frozen=True)
class ModelSpec:
    """One registered model.

    `sparse_input` says the model accepts a sparse COO feature matrix (its first
    operation is a matmul);
    `decayed` picks the parameters weight decay applies to (None: all of them), since
    some papers regularise only the first layer;
    `task` is ``"node"`` (node classification: ``build(features, classes, ...)``, called as
    ``model(x, graph)``) or ``"link"`` (link prediction on a relational data set:
    ``build(entities, relations, ...)``, a `link_models.DistMultLinkModel`).
    """
    name: str
    build: Builder
    defaults: Hyperparameters
    description: str
    sparse_input: bool = True
    decayed: Callable[[nn.Module], Iterable[nn.Parameter]] | None = None
    task: str = "node"


_REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Add `spec` to the registry; a second model under one name is a mistake, not an override."""
    if spec.name in _REGISTRY:
        raise ValueError(f"model {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def model_names(task: str | None = "node") -> tuple[str, ...]:
    """Registered model names of ``task`` (``"node"``, ``"link"``; None: every task), in
    registration order."""
    return tuple(name for name, spec in _REGISTRY.items() if task is None or spec.task == task)


def get_model(name: str) -> ModelSpec:
    """The spec of `name`; a clear `ValueError` for unknown models."""
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(model_names(task=None))}")
    return spec


def build_model(name: str, in_channels: int, out_channels: int, hidden: int | None = None,
                dropout: float | None = None) -> nn.Module:
    """Model `name` for `in_channels` features and `out_channels` classes -- for a link
    model (``task="link"``: rgcn, rgat) the counts are its entities and relations, as
    `ModelSpec.build` takes them; `hidden` and `dropout` default to the paper's values."""
    spec = get_model(name)
    if hidden is not None and spec.defaults.hidden is None:
        raise ValueError(f"model {name!r} has no hidden layer, so hidden={hidden} cannot apply")
    return spec.build(in_channels, out_channels,
                      spec.defaults.hidden if hidden is None else hidden,
                      spec.defaults.dropout if dropout is None else dropout)



class TwoLayerGNN(nn.Module):
    """dropout -> conv1 -> activation -> dropout -> conv2: the GCN/GAT papers' network.

    Dropout is `functional.dropout`: it keeps sparse COO features sparse, so bag-of-words
    inputs stay cheap, and draws dense CPU masks in one parallel pass.
    """

    def __init__(self, conv1: nn.Module, conv2: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor],
                 dropout: float):
        super().__init__()
        self.conv1, self.conv2, self.activation, self.dropout = conv1, conv2, activation, dropout

    def forward(self, x: torch.Tensor, graph) -> torch.Tensor:
        x = sparse_dropout(x, self.dropout, self.training)
        x = self.activation(self.conv1(x, graph))
        x = sparse_dropout(x, self.dropout, self.training)
        return self.conv2(x, graph)


class PropagatedMLP(nn.Module):
    """APPNP's predict-then-propagate: a two-layer MLP, then a propagation layer."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, propagate: nn.Module, dropout: float):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(in_channels, hidden), nn.Linear(hidden, out_channels)
        self.propagate, self.dropout = propagate, dropout

    def forward(self, x: torch.Tensor, graph) -> torch.Tensor:
        x = F.relu(self.lin1(sparse_dropout(x, self.dropout, self.training)))
        x = self.lin2(sparse_dropout(x, self.dropout, self.training))
        return self.propagate(x, graph)


def _gcn(in_channels: int, out_channels: int, hidden: int, p: float) -> nn.Module:
    return TwoLayerGNN(GCNConv(in_channels, hidden), GCNConv(hidden, out_channels), F.relu, p)


def _gat(in_channels: int, out_channels: int, hidden: int, p: float) -> nn.Module:
    """8 heads of `hidden` channels, concatenated, then one averaged output head; the
    paper also drops attention coefficients at the same rate."""
    heads = 8
    return TwoLayerGNN(GATConv(in_channels, hidden, heads=heads, dropout=p),
                       GATConv(heads * hidden, out_channels, heads=1, concat=False, dropout=p), F.elu, p)


def _sage(in_channels: int, out_channels: int, hidden: int, p: float) -> nn.Module:
    return TwoLayerGNN(SAGEConv(in_channels, hidden, aggr="mean"),
                       SAGEConv(hidden, out_channels, aggr="mean"), F.relu, p)


def _appnp(in_channels: int, out_channels: int, hidden: int, p: float) -> nn.Module:
    """K=10 steps with teleport alpha=0.1, dropout on the MLP's features. No edge dropout
    in the propagation, as in PyG's APPNP example: PyG's APPNP (whose semantics ours
    follows) re-drops and rescales the already-dropped weights at every hop, so with
    K=10 surviving weights grow up to 2^10 and training diverges."""
    return PropagatedMLP(in_channels, hidden, out_channels, APPNP(K=10, alpha=0.1), p)


def _sgc(in_channels: int, out_channels: int, hidden: None, p: float) -> nn.Module:
    """S^K X W with K=2: one linear map after a fixed (cached) two-step propagation."""
    return SGConv(in_channels, out_channels, K=2, cached=True)


def _first_layer(model: nn.Module) -> Iterable[nn.Parameter]:
    return model.conv1.parameters()


register(ModelSpec(
    "gcn", _gcn, Hyperparameters(hidden=16, lr=0.01, weight_decay=5e-4, dropout=0.5, epochs=200, patience=None),
    "GCN (Kipf & Welling 2017): 2 GCNConv layers, ReLU; weight decay on the first layer only",
    decayed=_first_layer))
register(ModelSpec(
    "gat", _gat, Hyperparameters(hidden=8, lr=0.005, weight_decay=5e-4, dropout=0.6, epochs=1000, patience=100),
    "GAT (Velickovic et al. 2018): GATConv 8 heads x hidden (concatenated), ELU, GATConv 1 head"))
register(ModelSpec(
    "sage", _sage, Hyperparameters(hidden=64, lr=0.01, weight_decay=5e-4, dropout=0.5, epochs=200, patience=None),
    "GraphSAGE (Hamilton et al. 2017): 2 SAGEConv layers, mean aggregation, ReLU",
    # a widening SAGEConv aggregates its input before the matmul, and the compiled
    # gather cannot read a sparse COO matrix
    sparse_input=False))
register(ModelSpec(
    "gcn-reference", lambda i, o, h, p: GCN(i, h, o, p),
    Hyperparameters(hidden=16, lr=0.01, weight_decay=5e-4, dropout=0.5, epochs=200, patience=None),
    "GCN in plain PyTorch (gnnfuse.nn.reference.GCN): an independent baseline without the compiler",
    decayed=_first_layer))
register(ModelSpec(
    "appnp", _appnp,
    Hyperparameters(hidden=64, lr=0.01, weight_decay=5e-3, dropout=0.5, epochs=10000, patience=100),
    "APPNP (Klicpera et al. 2019): 2-layer MLP, then APPNP(K=10, alpha=0.1); weight decay on the first layer",
    decayed=lambda model: model.lin1.parameters()))
register(ModelSpec(
    "sgc", _sgc, Hyperparameters(hidden=None, lr=0.2, weight_decay=5e-6, dropout=0.0, epochs=100, patience=None),
    "SGC (Wu et al. 2019): SGConv(K=2, cached), a linear model on 2-step propagated features",
    sparse_input=False))   # SGConv propagates its input before the linear map
register(ModelSpec(
    "rgcn", rgcn_link_model,
    Hyperparameters(hidden=100, lr=0.01, weight_decay=0.0, dropout=0.2, epochs=200, patience=30),
    "R-GCN link prediction (Schlichtkrull et al. 2018): learnt entity embeddings, 2 RGCNConv layers (mean, "
    "inverse relations), DistMult decoder; relational data sets (wn18rr)", task="link"))
register(ModelSpec(
    "rgat", rgat_link_model,
    Hyperparameters(hidden=100, lr=0.01, weight_decay=0.0, dropout=0.2, epochs=200, patience=30),
    "RGAT link prediction (Busbridge et al. 2019): as rgcn with 2 RGATConv layers (across-relation additive "
    "attention); relational data sets (wn18rr)", task="link"))
