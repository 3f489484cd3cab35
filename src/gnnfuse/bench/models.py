"""The two-layer models `gnnfuse bench` compares, built from gnnfuse's and PyG's layers
with one set of weights, and the data they run on."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import nn as gnn_nn
from ..nn.functional import dropout as gnn_dropout
from ..data import load_node_dataset
from ..graph import Graph
from .timing import synchronize


MODELS = ("gcn", "gat", "sage")
FRAMEWORKS = ("gnnfuse", "pyg", "pyg-compile")     # the default comparison
# torch.compile(mode="reduce-overhead"): PyG compiled with CUDA graphs of its own, the fair
# peer of gnnfuse's captured step on host-bound graphs; opt-in (--frameworks).
KNOWN_FRAMEWORKS = FRAMEWORKS + ("pyg-compile-ro",)
COMPILED = ("pyg-compile", "pyg-compile-ro")

HIDDEN = 64                  # gcn and sage hidden width
GAT_HEADS, GAT_HIDDEN = 8, 8  # gat first layer: 8 heads x 8 channels, concatenated
DROPOUT = 0.5
LR, WEIGHT_DECAY = 0.01, 5e-4


class MissingDependency(RuntimeError):
    """An optional package the benchmark needs is not installed."""


def require_pyg() -> Any:
    """``torch_geometric.nn``, or an error that says how to get it."""
    try:
        import torch_geometric.nn as pyg_nn
    except ImportError as exc:
        raise MissingDependency("benchmarking against PyG needs torch_geometric, which is not installed: "
                           "pip install 'gnnfuse[bench]' (or torch_geometric>=2.5)") from exc
    return pyg_nn


class TwoLayer(nn.Module):
    """conv -> activation -> conv, with feature dropout before each conv (as in the GCN
    and GAT papers); the same module wraps PyG's and gnnfuse's layers.

    `dropout` is each library's user's: ``torch.nn.functional.dropout`` for PyG, and
    ``gnnfuse.nn.functional.dropout`` for gnnfuse, which draws its masks from a counter
    (on a CPU in one parallel pass, where torch's took most of a step; on a GPU without
    the keep mask torch's writes for its backward) and torch's for small tensors."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor],
                 dropout: Callable[..., torch.Tensor] = F.dropout):
        super().__init__()
        self.conv1, self.conv2, self.activation, self.dropout = conv1, conv2, activation, dropout

    def forward(self, x: torch.Tensor, graph: Any) -> torch.Tensor:
        x = self.dropout(x, DROPOUT, self.training)
        x = self.activation(self.conv1(x, graph))
        x = self.dropout(x, DROPOUT, self.training)
        return self.conv2(x, graph)


def build_model(framework: str, model: str, in_dim: int, num_classes: int) -> TwoLayer:
    """The two-layer `model` from gnnfuse's (``framework="gnnfuse"``) or PyG's layers; both
    libraries share constructor arguments and parameter names, so one state dict fits both.

    PyG's GCNConv gets ``cached=True`` -- its documented setting for transductive
    full-graph training -- so it does not recompute self loops and normalisation every
    step, which gnnfuse caches on the `Graph`; the baseline should not lose on that.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    lib = gnn_nn if framework == "gnnfuse" else require_pyg()
    dropout = gnn_dropout if lib is gnn_nn else F.dropout
    if model == "gcn":
        conv = lib.GCNConv if lib is gnn_nn else functools.partial(lib.GCNConv, cached=True)
        return TwoLayer(conv(in_dim, HIDDEN), conv(HIDDEN, num_classes), F.relu, dropout)
    if model == "gat":
        return TwoLayer(lib.GATConv(in_dim, GAT_HIDDEN, heads=GAT_HEADS),
                        lib.GATConv(GAT_HEADS * GAT_HIDDEN, num_classes, heads=1, concat=False), F.elu, dropout)
    return TwoLayer(lib.SAGEConv(in_dim, HIDDEN, aggr="mean"),
                    lib.SAGEConv(HIDDEN, num_classes, aggr="mean"), F.relu, dropout)


@dataclass
class DeviceData:
    """One data set's tensors on the device, shared by every framework measured on it.

    `edge_index` is PyG's input; gnnfuse graphs are views of its two rows, so both
    frameworks read the same resident edge tensors and memory peaks compare fairly.
    """
    name: str
    x: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor
    edge_index: torch.Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    def gnnfuse_graph(self) -> Graph:
        """A fresh `Graph` per measurement: its cache (CSR layouts, self-looped copy,
        norms) is built inside that measurement and freed with it, so one framework's
        cached layouts never count towards another's peak memory."""
        return Graph(self.edge_index[0], self.edge_index[1], self.num_nodes)


def load_data(name: str, root: str | None, device: torch.device,
              log: Callable[[str], None] = lambda message: None) -> DeviceData:
    """Load (or, for seeded presets, generate on CPU) a data set and move it over."""
    begin = time.perf_counter()
    dataset = load_node_dataset(name, root)
    if dataset.train_mask is None:
        raise ValueError(f"{name} has no train/validation/test split to time training on")
    loaded = time.perf_counter() - begin
    graph = dataset.graph
    data = DeviceData(name, dataset.x.to(device), dataset.y.to(device),
                      dataset.train_mask.nonzero().squeeze(1).to(device),   # index, not mask: no sync per step
                      torch.stack([graph.src, graph.dst]).to(device), dataset.num_classes)
    synchronize(device)
    log(f"[{name}] loaded in {loaded:.1f} s, on {device} after {time.perf_counter() - begin:.1f} s: "
        f"{graph.num_nodes:,} nodes, {graph.num_edges:,} edges, {dataset.num_features} features, "
        f"{dataset.num_classes} classes, {len(data.train_idx):,} training nodes")
    return data


def graph_input(framework: str, data: DeviceData) -> Any:
    return data.gnnfuse_graph() if framework == "gnnfuse" else data.edge_index


def instantiate(framework: str, model: str, data: DeviceData, state: dict[str, torch.Tensor],
                device: torch.device) -> nn.Module:
    """A fresh model with the shared initial weights; compiled for ``pyg-compile`` (and
    with CUDA graphs, ``mode="reduce-overhead"``, for ``pyg-compile-ro``).

    Dynamo is reset first: its caches are keyed by code object, so without a reset
    every new data set would count as a recompile of the same forward, turning on
    dynamic shapes and eventually hitting the recompile limit (silent eager fallback).
    """
    module = build_model(framework, model, data.x.shape[1], data.num_classes).to(device)
    module.load_state_dict(state)
    if framework in COMPILED:
        torch._dynamo.reset()
        module = torch.compile(module, mode="reduce-overhead" if framework == "pyg-compile-ro" else None)
    return module


def reference_state(model: str, data: DeviceData, seed: int = 0) -> dict[str, torch.Tensor]:
    """The PyG model's seeded initial weights (on CPU), loaded by every framework."""
    torch.manual_seed(seed)
    module = build_model("pyg", model, data.x.shape[1], data.num_classes)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}
