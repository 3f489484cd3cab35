"""A differential fuzz of graph classification: many small graphs batched by PyG into one
disjoint union (`Batch.from_data_list`, PyG's `DataLoader`), a two-layer model of
gnnfuse layers, a global pooling and a linear head, trained for a few steps against the
same model of PyG's layers from the same weights. Outputs and every gradient in float64,
each step.

Every step hands the layers a new ``edge_index`` of another size over another vertex
count, which is what exercises gnnfuse's caches (the `Graph` kept per index tensor,
`graph/index_cache.py`; the trace kept per structure, `frontend/trace_cache.py`): graphs
without nodes or edges, single vertices, self loops, repeated edges, vertices without
in-edges, a last graph whose last vertices have no edges (so ``edge_index.max() + 1 <
x.size(0)``), ``edge_attr``; the index as int64, int32, a transposed view or a strided
slice. Then the cases one at a time: an index edited in place between steps, a freed
index whose memory the next batch's reuses, a batch without edges, `SGConv(cached=True)`
on changing graphs, eval mode under ``torch.no_grad()`` and PyG's ``follow_batch``."""
from __future__ import annotations


import pytest
import torch
import torch_geometric.nn as pyg_nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch_geometric.data import Batch, Data
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool

from gnnfuse import nn as gnn
from gnnfuse.runtime import record_calls
from oracle_check import device_for
from test_retrace import count_traces

f64 = torch.float64
IN, HIDDEN, EDGE_DIM = 4, 5, 3
POOLS = {"add": global_add_pool, "mean": global_mean_pool, "max": global_max_pool}
LAYOUTS = ("int64", "int32", "transposed", "strided")


def mlp(a: int, b: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, b))


# kind -> (the two layers from a library's namespace, whether they take edge_attr)
KINDS = {
    "gcn": (lambda lib: (lib.GCNConv(IN, HIDDEN), lib.GCNConv(HIDDEN, HIDDEN)), False),
    "sage_mean": (lambda lib: (lib.SAGEConv(IN, HIDDEN), lib.SAGEConv(HIDDEN, HIDDEN, root_weight=False)), False),
    "sage_max": (lambda lib: (lib.SAGEConv(IN, HIDDEN, aggr="max"), lib.SAGEConv(HIDDEN, HIDDEN, aggr="max")), False),
    "gat": (lambda lib: (lib.GATConv(IN, HIDDEN, heads=2), lib.GATConv(2 * HIDDEN, HIDDEN, heads=2, concat=False)),
            False),
    "gat_edge": (lambda lib: (lib.GATConv(IN, HIDDEN, heads=2, edge_dim=EDGE_DIM),
                              lib.GATConv(2 * HIDDEN, HIDDEN, heads=2, concat=False, edge_dim=EDGE_DIM,
                                          fill_value="mean")), True),
    "gatv2_edge": (lambda lib: (lib.GATv2Conv(IN, HIDDEN, heads=2, edge_dim=EDGE_DIM),
                                lib.GATv2Conv(2 * HIDDEN, HIDDEN, concat=False, edge_dim=EDGE_DIM)), True),
    "gin": (lambda lib: (lib.GINConv(mlp(IN, HIDDEN)), lib.GINConv(mlp(HIDDEN, HIDDEN), train_eps=True)), False),
    "gine": (lambda lib: (lib.GINEConv(mlp(IN, HIDDEN), edge_dim=EDGE_DIM),
                          lib.GINEConv(mlp(HIDDEN, HIDDEN), train_eps=True, edge_dim=EDGE_DIM)), True),
    "graph": (lambda lib: (lib.GraphConv(IN, HIDDEN), lib.GraphConv(HIDDEN, HIDDEN, aggr="max")), False),
    "transformer": (lambda lib: (lib.TransformerConv(IN, HIDDEN, heads=2, edge_dim=EDGE_DIM),
                                 lib.TransformerConv(2 * HIDDEN, HIDDEN, edge_dim=EDGE_DIM, beta=True)), True),
    "edge": (lambda lib: (lib.EdgeConv(mlp(2 * IN, HIDDEN)), lib.EdgeConv(mlp(2 * HIDDEN, HIDDEN), aggr="mean")),
             False),
}


class Classifier(torch.nn.Module):
    """conv -> relu -> conv -> global pooling -> linear, as a graph classifier is built."""

    def __init__(self, lib, kind: str, pool: str) -> None:
        super().__init__()
        layers, self.with_edges = KINDS[kind]
        self.conv1, self.conv2 = layers(lib)
        self.pool = POOLS[pool]
        self.head = torch.nn.Linear(HIDDEN, 2)

    def forward(self, x, edge_index, edge_attr, batch, num_graphs):
        extra = (edge_attr,) if self.with_edges else ()
        h = self.conv1(x, edge_index, *extra).relu()
        h = self.conv2(h, edge_index, *extra)
        return self.head(self.pool(h, batch, num_graphs))


def twins(kind: str, pool: str = "add", device: str = "cpu") -> tuple[Classifier, Classifier]:
    """(gnnfuse's model, PyG's) with PyG's weights in both."""
    torch.manual_seed(0)
    theirs = Classifier(pyg_nn, kind, pool).double().to(device)
    ours = Classifier(gnn, kind, pool).double().to(device)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


@st.composite
def small_graphs(draw) -> tuple[int, list[tuple[int, int]], int]:
    """(vertex count 0-6, edges as pairs, up to 12: loops and repeats are common, and
    the last vertices are often left without edges; a seed for the features)."""
    n = draw(st.integers(0, 6))
    active = draw(st.integers(1, n)) if n else 0          # the vertices edges may touch
    pairs = draw(st.lists(st.tuples(st.integers(0, active - 1), st.integers(0, active - 1)), max_size=12)) if n else []
    return n, pairs, draw(st.integers(0, 2 ** 16))


def make_batch(graphs: list[tuple[int, list, int]], device: str = "cpu") -> Batch:
    data = []
    for n, pairs, seed in graphs:
        g = torch.Generator().manual_seed(seed)
        edge_index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).t().contiguous()
        data.append(Data(x=torch.randn(n, IN, dtype=f64, generator=g), edge_index=edge_index,
                         edge_attr=torch.randn(len(pairs), EDGE_DIM, dtype=f64, generator=g)))
    return Batch.from_data_list(data).to(device)


def laid_out(edge_index: torch.Tensor, layout: str) -> torch.Tensor:
    """The same edges as a user may hand them: int32, a transposed view of an [E, 2]
    list, or every second column of a tensor interleaving them with other ids."""
    if layout == "int32":
        return edge_index.to(torch.int32)
    if layout == "transposed":
        return edge_index.t().contiguous().t()
    if layout == "strided":
        wide = torch.stack([edge_index, edge_index.flip(0)], dim=2).reshape(2, -1)
        return wide[:, ::2]
    return edge_index


def run(model: Classifier, batch: Batch, edge_index: torch.Tensor | None = None):
    """(output, gradients of x, edge_attr and every parameter) of a loss on ``batch``."""
    model.zero_grad()
    x = batch.x.clone().requires_grad_()
    edge_attr = batch.edge_attr.clone().requires_grad_()
    out = model(x, batch.edge_index if edge_index is None else edge_index, edge_attr, batch.batch, batch.num_graphs)
    weights = torch.linspace(-1, 1, out.numel(), dtype=f64, device=out.device).view_as(out)
    (out * weights).sum().backward()
    zero = torch.zeros_like
    grads = {"x": zero(x) if x.grad is None else x.grad, "edge_attr": zero(edge_attr) if edge_attr.grad is None
             else edge_attr.grad}
    grads.update({n: zero(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
    return out.detach(), grads


def assert_step_matches(ours, theirs, batch: Batch, edge_index: torch.Tensor | None = None, what: str = "") -> None:
    out, grads = run(ours, batch, edge_index)
    ref, ref_grads = run(theirs, batch)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11, msg=lambda m: f"{what} output: {m}")
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-9, atol=1e-11,
                                   msg=lambda m, name=name: f"{what} gradient of {name}: {m}")


def train(ours, theirs, steps, device: str = "cpu", lr: float = 0.05) -> None:
    """One optimizer step per batch on each model, checking outputs and gradients first."""
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m in (ours, theirs)]
    for i, (graphs, layout) in enumerate(steps):
        batch = make_batch(graphs, device)
        assert_step_matches(ours, theirs, batch, laid_out(batch.edge_index, layout), f"step {i} ({layout})")
        for optimizer in optimizers:
            optimizer.step()


batches = st.lists(small_graphs(), min_size=1, max_size=5)
steps = st.lists(st.tuples(batches, st.sampled_from(LAYOUTS)), min_size=2, max_size=3)


@pytest.mark.parametrize("kind", sorted(KINDS))
# the backend set through monkeypatch is the same for every example
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps, pool=st.sampled_from(sorted(POOLS)))
def test_training_on_batches_of_small_graphs_matches_pyg(kind, steps, pool, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    ours, theirs = twins(kind, pool)
    with record_calls() as calls:
        train(ours, theirs, steps)
    assert calls, "no compiled program ran: the model fell back to PyG silently"


@pytest.mark.parametrize("kind", ["gcn", "sage_max", "gat_edge", "gine", "transformer"])
@settings(max_examples=2, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_training_on_batches_matches_pyg_on_triton(kind, steps, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    ours, theirs = twins(kind, device=device)
    with record_calls() as calls:
        train(ours, theirs, steps, device)
    assert calls, "no compiled program ran"


def growing_batches(count: int) -> list[list[tuple[int, list, int]]]:
    """Batches of 2 + i graphs: every one another vertex and edge count."""
    gen = torch.Generator().manual_seed(3)
    batches = []
    for i in range(count):
        graphs = []
        for j in range(2 + i):
            n = 2 + (i + j) % 5
            e = int(torch.randint(1, 3 * n, (1,), generator=gen))
            pairs = torch.randint(0, n, (e, 2), generator=gen).tolist()
            graphs.append((n, [tuple(p) for p in pairs], i * 10 + j))
        batches.append(graphs)
    return batches


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_batches_of_other_sizes_reuse_the_first_steps_traces(kind, monkeypatch):
    """A data loader's batches differ in vertex and edge counts: after the first training
    step (and the first evaluation call) no batch traces the layers' Python again, which
    would cost host time on every step of a host-bound small-graph workload."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    ours, theirs = twins(kind)
    batches = [make_batch(graphs) for graphs in growing_batches(4)]
    assert len({(b.num_nodes, b.num_edges) for b in batches}) == len(batches)
    traced = count_traces(monkeypatch)
    for i, batch in enumerate(batches):
        before = len(traced)
        assert_step_matches(ours, theirs, batch, what=f"batch {i}")
        assert i == 0 or len(traced) == before, f"training batch {i} traced {len(traced) - before} time(s) again"
    ours.eval(), theirs.eval()
    for i, batch in enumerate(batches):
        before = len(traced)
        with torch.no_grad():
            out = ours(batch.x, batch.edge_index, batch.edge_attr, batch.batch, batch.num_graphs)
            ref = theirs(batch.x, batch.edge_index, batch.edge_attr, batch.batch, batch.num_graphs)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)
        assert i == 0 or len(traced) == before, f"evaluation batch {i} traced {len(traced) - before} time(s) again"
