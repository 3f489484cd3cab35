"""A differential fuzz of the graph-classification capture path: training with
``DataLoader(static_shapes=True)`` and `training.GraphStepCapture` must give the losses and
weights of eager steps on PyG's plain ``DataLoader`` batches (float64), or run eagerly
with a `CaptureFallbackWarning` saying why -- never another number.

Small random data sets (isolated vertices, graphs without edges, one-vertex graphs, self
loops, repeated edges, integer features, edge features, graph or vertex labels), a layer
of `gnnfuse.nn` drawn from the kinds a graph classifier uses, pooled by sum, mean or max
with ``size=batch.num_graphs``, and loaders with or without shuffling, ``drop_last`` and
capacities some batches exceed, steps that assign ``batch.x``. On the CPU the capture records with test_graph_step_capture's
stand-in for a CUDA graph, whose replay runs the step on the static batch.
"""
from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from hypothesis import given, settings, strategies as st
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader as PyGDataLoader
from torch_geometric.nn.resolver import normalization_resolver

import gnnfuse.nn as G
from gnnfuse.loader import DataLoader, GraphCapacities
from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning
from gnnfuse.training import GraphStepCapture
from oracle_check import device_for
from test_graph_step_capture import _Recorder

RUNS = settings(max_examples=60, deadline=None, derandomize=True, database=None)
f64 = torch.float64
WIDTH, EDGE_DIM, CLASSES = 4, 2, 3

# each: (needs edge features, layer of WIDTH -> WIDTH); the step passes edge_attr where asked
LAYERS = {
    "GIN": (False, lambda: G.GINConv(torch.nn.Linear(WIDTH, WIDTH))),
    "GINE": (True, lambda: G.GINEConv(torch.nn.Linear(WIDTH, WIDTH), edge_dim=EDGE_DIM)),
    "GCN": (False, lambda: G.GCNConv(WIDTH, WIDTH)),
    "GCN-no-loops": (False, lambda: G.GCNConv(WIDTH, WIDTH, add_self_loops=False)),
    "GCN-improved": (False, lambda: G.GCNConv(WIDTH, WIDTH, improved=True)),
    "SAGE-mean": (False, lambda: G.SAGEConv(WIDTH, WIDTH)),
    "SAGE-max": (False, lambda: G.SAGEConv(WIDTH, WIDTH, aggr="max")),
    "GAT": (False, lambda: G.GATConv(WIDTH, 2, heads=2)),
    "GAT-mean-heads": (False, lambda: G.GATConv(WIDTH, WIDTH, heads=2, concat=False)),
    "GAT-edges": (True, lambda: G.GATConv(WIDTH, 2, heads=2, edge_dim=EDGE_DIM)),
    "GATv2": (False, lambda: G.GATv2Conv(WIDTH, 2, heads=2)),
    "Transformer": (True, lambda: G.TransformerConv(WIDTH, 2, heads=2, edge_dim=EDGE_DIM)),
    "GraphConv": (False, lambda: G.GraphConv(WIDTH, WIDTH)),
    "GIN-jk-cat": (False, lambda: G.GIN(WIDTH, WIDTH, 2, jk="cat")),
    "EdgeCNN": (False, lambda: G.EdgeCNN(WIDTH, WIDTH, 2)),
    "Cheb-sym": (False, lambda: G.ChebConv(WIDTH, WIDTH, K=3)),
    "Cheb-none": (False, lambda: G.ChebConv(WIDTH, WIDTH, K=2, normalization=None)),
}


# PyG's norms over all rows (mostly none): the step is refused and runs on PyG's batches
NORMS = st.sampled_from([None] * 5 + ["batch_norm", "layer_norm", "graph_norm"])


@st.composite
def datasets(draw):
    """(graphs, integer features, vertex labels): 5-12 graphs of 1-6 vertices, 0-9 edges."""
    int_x, node_y = draw(st.booleans()), draw(st.booleans())
    graphs = []
    for _ in range(draw(st.integers(5, 12))):
        n, m = draw(st.integers(1, 6)), draw(st.integers(0, 9))
        ids = st.lists(st.integers(0, n - 1), min_size=m, max_size=m)
        values = st.lists(st.integers(-3, 3), min_size=n * WIDTH, max_size=n * WIDTH)
        x = (torch.tensor(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))) if int_x
             else torch.tensor(draw(values), dtype=f64).reshape(n, WIDTH) / 2)
        labels = st.lists(st.integers(0, CLASSES - 1), min_size=n if node_y else 1, max_size=n if node_y else 1)
        graphs.append(Data(x=x, edge_index=torch.tensor([draw(ids), draw(ids)], dtype=torch.long).reshape(2, m),
                           edge_attr=torch.linspace(-1, 1, m * EDGE_DIM, dtype=f64).reshape(m, EDGE_DIM),
                           y=torch.tensor(draw(labels))))
    return graphs, int_x, node_y


class _Model(torch.nn.Module):
    """A layer, PyG's norm ``norm`` over all rows (None: none), a pooling (none for
    vertex labels), a linear head."""

    def __init__(self, layer: str, int_x: bool, node_y: bool, pool: str, norm: str | None = None):
        super().__init__()
        self.edges, make = LAYERS[layer]
        self.embed = torch.nn.Embedding(5, WIDTH) if int_x else None
        self.conv, self.head = make(), torch.nn.Linear(WIDTH, CLASSES)
        self.norm = normalization_resolver(norm, WIDTH) if norm else None
        self.pool = None if node_y else getattr(pyg_nn, f"global_{pool}_pool")

    def forward(self, batch):
        x = self.embed(batch.x) if self.embed is not None else batch.x
        h = (self.conv(x, batch.edge_index, edge_attr=batch.edge_attr) if self.edges
             else self.conv(x, batch.edge_index)).relu()
        if self.norm is not None:
            h = self.norm(h)
        return self.head(h if self.pool is None else self.pool(h, batch.batch, size=batch.num_graphs))


def _train(graphs, make_model, captured: bool, batch_size: int, loader_kw: dict, capacities=None,
           device: str = "cpu", epochs: int = 1, rebind: bool = False):
    torch.manual_seed(0)
    model = make_model().double().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(batch):
        if rebind:          # as a step casting its features does: the batch's x is another tensor
            batch.x = batch.x.clone()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(batch), batch.y)
        loss.backward()
        optimizer.step()
        return loss.detach()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if captured:
            loader = DataLoader(graphs, batch_size, static_shapes=True, capacities=capacities, **loader_kw)
            recorder = type("R", (_Recorder,), {"model": model, "optimizer": optimizer})
            run = GraphStepCapture(step, optimizers=[optimizer], modules=[model], warmup=1, _graph_factory=recorder)
        else:
            loader, run = PyGDataLoader(graphs, batch_size, **loader_kw), step
        losses = [float(run(batch.to(device))) for _ in range(epochs) for batch in loader]
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, CaptureFallbackWarning)]
    return losses, [p.detach().clone() for p in model.parameters()], run, fallbacks


def _tight(graphs, batch_size: int, loader_kw: dict) -> GraphCapacities:
    """Capacities that about half the batches exceed."""
    sizes = sorted((int(b.num_nodes), int(b.num_edges)) for b in PyGDataLoader(graphs, batch_size, **loader_kw))
    nodes, edges = sizes[len(sizes) // 2]
    return GraphCapacities(max(nodes + 1, 2), edges, batch_size + 1)


@RUNS
@given(datasets(), st.sampled_from(sorted(LAYERS)), st.sampled_from(["add", "mean", "max"]), NORMS,
       st.integers(2, 4), st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_captured_training_is_eager_training_on_pygs_batches(data, layer, pool, norm, batch_size, shuffle, drop_last,
                                                              tight, rebind):
    graphs, int_x, node_y = data
    kw = {"drop_last": drop_last, "shuffle": shuffle}
    caps = _tight(graphs, batch_size, _seeded(kw)) if tight else None
    _same_training(graphs, lambda: _Model(layer, int_x, node_y, pool, norm), batch_size, kw, caps, rebind=rebind)


def _seeded(loader_kw: dict) -> dict:
    """The loader's arguments with a fresh generator: both runs draw the same batches."""
    return {**loader_kw, "generator": torch.Generator().manual_seed(1)}


def _same_training(graphs, make_model, batch_size: int, loader_kw: dict, capacities=None, **kw):
    """Captured training gives eager training's losses and weights, or says why it ran
    eagerly; where eager training fails (batch norm over one row), so does it."""
    try:
        eager = _train(graphs, make_model, False, batch_size, _seeded(loader_kw), **kw)
    except ValueError as error:
        with pytest.raises(ValueError, match=re.escape(str(error))):
            _train(graphs, make_model, True, batch_size, _seeded(loader_kw), capacities, **kw)
        return None
    losses, weights, run, fallbacks = _train(graphs, make_model, True, batch_size, _seeded(loader_kw), capacities,
                                             **kw)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager[0]), rtol=1e-9, atol=1e-12)
    for ours, theirs in zip(weights, eager[1], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)
    if run.reason is not None:          # eager, and said why
        assert any(run.reason in message for message in fallbacks), (run.reason, fallbacks)
    assert run.eager + run.replayed == len(losses)
    return run


def _hubs(count: int, seed: int) -> list[Data]:
    """Graphs whose first vertex receives 12-24 edges and sends as many (rows that split
    a kernel's segments where others do not), among graphs of 1-3 vertices."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for k in range(count):
        n = 6 if k % 2 else int(torch.randint(1, 4, (1,), generator=gen))
        hub = int(torch.randint(12, 25, (1,), generator=gen)) if k % 2 else 0
        others = torch.randint(0, n, (hub + n,), generator=gen)
        src = torch.cat([others[:hub], torch.zeros(hub, dtype=torch.long), others[hub:]])
        dst = torch.cat([torch.zeros(hub, dtype=torch.long), others[:hub], others[hub:].flip(0)])
        graphs.append(Data(x=torch.randn(n, WIDTH, generator=gen, dtype=f64), edge_index=torch.stack([src, dst]),
                           edge_attr=torch.randn(src.numel(), EDGE_DIM, generator=gen, dtype=f64),
                           y=torch.tensor([k % CLASSES])))
    return graphs


@pytest.mark.parametrize("layer", ["GAT", "GCN", "SAGE-max", "Transformer"])
def test_captured_training_on_the_triton_backend_is_eager_training(monkeypatch, layer):
    """The Triton kernels read the static graph's whole-row segments and reverse CSR and
    GAT's and GCN's fixed-shape self loops, rebuilt per batch; hub rows come and go
    between batches."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    graphs = _hubs(8, 0)
    sizes = [(int(b.num_nodes), int(b.num_edges)) for b in PyGDataLoader(graphs, 2)]
    caps = GraphCapacities(max(n for n, _ in sizes) + 2, max(e for _, e in sizes) + 3, 3)   # small: interpreted
    run = _same_training(graphs, lambda: _Model(layer, False, False, "max"), 2, {}, caps, device=device_for("triton"))
    assert run.status == "captured" and run.replayed == 2


def test_several_epochs_of_graphs_without_vertices_or_features_replay_as_eager_steps():
    """Graphs of no vertex in the batches (PyG's pooling gives them a zero row), data sets
    without ``x`` (a vertex count per graph, an embedding of one row), three epochs."""
    class NoFeatures(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.model = torch.nn.Embedding(1, WIDTH), _Model("GINE", False, False, "mean")

        def forward(self, batch):
            x = self.embed(batch.edge_index.new_zeros(batch.num_nodes))
            return self.model.head(self.model.pool(self.model.conv(x, batch.edge_index, edge_attr=batch.edge_attr),
                                                   batch.batch, size=batch.num_graphs))
    graphs = [Data(edge_index=g.edge_index, edge_attr=g.edge_attr, y=g.y, num_nodes=g.num_nodes) for g in _hubs(9, 1)]
    graphs[3] = Data(edge_index=torch.zeros(2, 0, dtype=torch.long), edge_attr=torch.zeros(0, EDGE_DIM, dtype=f64),
                     y=torch.tensor([1]), num_nodes=0)
    run = _same_training(graphs, NoFeatures, 3, {"shuffle": True}, epochs=3)
    assert run.status == "captured" and run.replayed == 6


def test_chebconv_without_normalization_is_not_replayed_on_padded_batches():
    """ChebConv(normalization=None)'s default lambda_max is twice the largest degree over
    all rows of the batch: the padded ring's vertices, 2 out-edges each where the spare
    edges outnumber the spare vertices, raised it from 2 to 4 over chains of out-degree
    1, and the replayed losses were 0.5-1.1 off the eager ones. It now runs eagerly."""
    graphs = [Data(x=torch.linspace(-1, 1, 3 * WIDTH, dtype=f64).reshape(3, WIDTH) * (k + 1),
                   edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([k % CLASSES])) for k in range(6)]
    run = _same_training(graphs, lambda: _Model("Cheb-none", False, False, "add"), 2, {},
                         GraphCapacities(8, 12, 3))
    assert run.replayed == 0 and "ChebConv" in run.reason


@pytest.mark.parametrize("readout", ["LSTMAggregation", "GRUAggregation", "LCMAggregation", "EquilibriumAggregation",
                                     "SortAggregation", "PatchTransformerAggregation"])
def test_sequence_readouts_are_not_run_on_padded_batches(readout):
    """PyG's LSTM, GRU and LCM aggregations read each graph as a sequence (a tree) as
    long as the batch's largest, and the padding graph is longer; Equilibrium's
    regulariser averages over the graphs, padding ones included: the audited step ran on
    the padded batch, and its loss (0.023 off PyG's for the LSTM, 0.11 for Equilibrium)
    and update went into the run reported as eager. Such a model now runs every step on
    PyG's batches. SortAggregation orders the rows tied on its key (ReLU's zeros) by
    their place in rows as wide as the batch's largest graph: 0.52 off.
    PatchTransformerAggregation attends over as many patches as the largest graph fills
    (it masks none): 0.031 off."""
    class Readout(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = G.GINConv(torch.nn.Linear(WIDTH, WIDTH))
            self.pool = {"EquilibriumAggregation": lambda: pyg_nn.aggr.EquilibriumAggregation(WIDTH, WIDTH, [4]),
                         "SortAggregation": lambda: pyg_nn.aggr.SortAggregation(3),
                         "PatchTransformerAggregation": lambda: pyg_nn.aggr.PatchTransformerAggregation(
                             WIDTH, WIDTH, patch_size=2, hidden_channels=4)}.get(
                readout, lambda: getattr(pyg_nn.aggr, readout)(WIDTH, WIDTH))()
            self.head = torch.nn.Linear(WIDTH * (3 if readout == "SortAggregation" else 1), CLASSES)

        def forward(self, batch):
            return self.head(self.pool(self.conv(batch.x, batch.edge_index).relu(), batch.batch,
                                       dim_size=batch.num_graphs))
    run = _same_training(_hubs(8, 0), Readout, 2, {})
    assert run.replayed == 0 and readout in run.reason
