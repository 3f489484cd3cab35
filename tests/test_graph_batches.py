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
slice; batches of other sizes trace nothing again. Then the cases one at a time: an
index edited in place between steps, a new index over the memory of an earlier one (a
loader refilling one buffer), a batch without edges, `SGConv`/`GCNConv(cached=True)` on
changing graphs, evaluation under ``torch.no_grad()`` and ``torch.inference_mode()``,
PyG's ``DataLoader`` with ``follow_batch``, and attention weights whose returned
``edge_index`` the caller edits."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg_nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool

from gnnfuse import nn as gnn
from gnnfuse.graph import clear_index_cache
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


# --- the cases one at a time ------------------------------------------------------------------
# two graphs then a last one whose vertices 3 and 4 have no edges, and a graph of one vertex
TRAILING = [(3, [(0, 1), (1, 2), (2, 2)], 1), (1, [], 2), (5, [(0, 1), (1, 0), (1, 2), (1, 2)], 3)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_last_graphs_vertices_without_edges_are_counted(kind, layout, monkeypatch):
    """``edge_index.max() + 1`` is 7 of the batch's 9 vertices: the vertex count is
    ``x.size(0)``, as PyG takes it, in every index layout."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    batch = make_batch(TRAILING)
    assert int(batch.edge_index.max()) + 1 < batch.num_nodes
    ours, theirs = twins(kind, "mean")
    assert_step_matches(ours, theirs, batch, laid_out(batch.edge_index, layout), layout)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_batch_without_edges_between_batches_with_edges(kind, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    ours, theirs = twins(kind, "max")
    for graphs in (TRAILING, [(2, [], 1), (3, [], 2)], [(0, [], 3), (1, [], 4)], TRAILING):
        batch = make_batch(graphs)
        assert_step_matches(ours, theirs, batch, what=f"{batch.num_edges} edges")


@pytest.mark.parametrize("kind", ["gcn", "sage_max", "gat_edge", "gine", "transformer"])
def test_an_edge_index_edited_in_place_between_steps_is_read_anew(kind, monkeypatch):
    """A plain ``edge_index`` (no `Graph`) edited in place between calls: its cached graph
    must not be served. Also for an index whose graph was lent by an equal one (the
    second and later equal tensors of one shape are matched by contents), and for the
    lender edited after lending."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    ours, theirs = twins(kind)
    batch = make_batch(TRAILING)
    edge_index = batch.edge_index
    assert_step_matches(ours, theirs, batch, what="first call")
    edge_index[0, 0] = 3
    assert_step_matches(ours, theirs, batch, what="after edge_index[0, 0] = 3")
    edge_index[1].copy_(edge_index[1].flip(0))
    assert_step_matches(ours, theirs, batch, what="after a write through a view")
    copies = [edge_index.clone() for _ in range(3)]
    for i, copy in enumerate(copies):
        assert_step_matches(ours, theirs, batch, copy, what=f"equal copy {i}")
    copies[1][1, 2] = 0                         # an input that borrowed its graph
    batch.edge_index = copies[1]
    assert_step_matches(ours, theirs, batch, what="borrower edited")
    copies[0][0, 1] = 4                         # the input the graph was first built for
    batch.edge_index = copies[2]
    assert_step_matches(ours, theirs, batch, what="lender edited")


def index_over(memory, fill: torch.Tensor, how: str) -> torch.Tensor:
    """A new ``edge_index`` tensor over ``memory`` (a numpy array, or a torch storage)
    holding ``fill``: as a collate function that fills one preallocated buffer makes it."""
    if how == "numpy":
        memory[:] = fill.numpy()
        return torch.from_numpy(memory)
    edge_index = torch.empty(0, dtype=torch.long).set_(memory, 0, fill.shape)
    return edge_index.copy_(fill)


@pytest.mark.parametrize("how", ["numpy", "set_"])
@pytest.mark.parametrize("kind", ["gcn", "sage_mean", "gat", "gine", "transformer"])
def test_a_new_edge_index_over_the_memory_of_an_earlier_one(kind, how, monkeypatch):
    """Each step's ``edge_index`` is a new tensor over the same memory (a loader filling
    one buffer: ``torch.from_numpy`` of it, or a tensor ``set_`` on one storage), with
    other contents: no graph built for an earlier tensor may be served. (Memory that torch
    frees and hands out again cannot alias a remembered graph: a graph keeps the memory
    of the input it was built from.) The equal-contents match compared the new tensor
    with the remembered one -- the same memory, so always equal -- and from the third
    step on served the second step's graph: outputs 0.2-1.2 off PyG's."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    clear_index_cache()         # no shape marked as changing by an earlier test: contents are compared
    ours, theirs = twins(kind)
    batch = make_batch(TRAILING)
    gen = torch.Generator().manual_seed(5)
    shape = (2, batch.num_edges)
    memory = torch.empty(shape, dtype=torch.long).numpy() if how == "numpy" else torch.UntypedStorage(16 * shape[1])
    addresses = set()
    for step in range(5):
        batch.edge_index = index_over(memory, torch.randint(0, batch.num_nodes, shape, generator=gen), how)
        addresses.add(batch.edge_index.data_ptr())
        assert_step_matches(ours, theirs, batch, what=f"step {step}")
    assert len(addresses) == 1


def test_sgconv_cached_keeps_the_first_batch_as_pyg_does(monkeypatch):
    """``SGConv(cached=True)`` caches its first input's propagation for good, in PyG: a
    later batch gets that batch's rows, as in gnnfuse. A batch of another size got them
    too in both (5 rows of output for a batch of 12 vertices): gnnfuse refuses it by name,
    as GCNConv(cached=True), which keeps the first graph, refuses a batch of another
    vertex count instead of propagating it over the wrong graph."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    batches = [make_batch(graphs) for graphs in growing_batches(3)]
    same_count = make_batch([(n, list(reversed(pairs)), seed + 1) for n, pairs, seed in growing_batches(1)[0]])
    assert same_count.num_nodes == batches[0].num_nodes
    torch.manual_seed(0)
    theirs = pyg_nn.SGConv(IN, HIDDEN, K=2, cached=True).double()
    ours = gnn.SGConv(IN, HIDDEN, K=2, cached=True).double()
    ours.load_state_dict(theirs.state_dict())
    for batch in (batches[0], same_count):
        torch.testing.assert_close(ours(batch.x, batch.edge_index), theirs(batch.x, batch.edge_index))
    for batch in batches[1:]:
        assert theirs(batch.x, batch.edge_index).shape[0] != batch.num_nodes
        with pytest.raises(ValueError, match=rf"SGConv\(cached=True\): x is \[{batch.num_nodes}, {IN}\] but the "
                                             rf"cached A\^K X of the first call is \[{batches[0].num_nodes}, {IN}\]"):
            ours(batch.x, batch.edge_index)
    torch.manual_seed(0)
    theirs = pyg_nn.GCNConv(IN, HIDDEN, cached=True).double()
    ours = gnn.GCNConv(IN, HIDDEN, cached=True).double()
    ours.load_state_dict(theirs.state_dict())
    first = batches[0]
    torch.testing.assert_close(ours(first.x, first.edge_index), theirs(first.x, first.edge_index))
    torch.testing.assert_close(ours(same_count.x, same_count.edge_index),
                               theirs(same_count.x, same_count.edge_index))
    with pytest.raises(ValueError, match="cached=True"):
        ours(batches[1].x, batches[1].edge_index)


@pytest.mark.parametrize("kind", ["gcn", "sage_max", "gat_edge", "gine", "transformer", "edge"])
def test_evaluation_without_gradients_and_in_inference_mode(kind, monkeypatch):
    """Evaluation calls between training steps: under ``torch.no_grad()`` and
    ``torch.inference_mode()`` (whose tensors have no version counter, so nothing is
    cached for them), then training again on the same batches."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    ours, theirs = twins(kind, "mean")
    batches = [make_batch(graphs) for graphs in growing_batches(3)]
    assert_step_matches(ours, theirs, batches[0], what="training")
    for mode in (torch.no_grad, torch.inference_mode):
        ours.eval(), theirs.eval()
        for batch in batches:
            with mode():
                inputs = (batch.x, batch.edge_index.clone(), batch.edge_attr, batch.batch, batch.num_graphs)
                torch.testing.assert_close(ours(*inputs), theirs(*inputs), rtol=1e-9, atol=1e-11)
        ours.train(), theirs.train()
        for batch in batches:
            assert_step_matches(ours, theirs, batch, what=f"training after {mode.__name__}")


def test_a_data_loader_with_follow_batch(monkeypatch):
    """PyG's ``DataLoader`` (shuffled, two epochs) with ``follow_batch``: the node pooling
    reads ``x_batch``, and the edge features are pooled per graph by ``edge_attr_batch``
    into the head as well."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    graphs = [graph for batch in growing_batches(4) for graph in batch] + TRAILING + [(0, [], 9)]
    dataset = make_batch(graphs).to_data_list()

    class WithEdges(torch.nn.Module):
        def __init__(self, lib):
            super().__init__()
            self.inner = Classifier(lib, "gine", "add")
            self.edges = torch.nn.Linear(EDGE_DIM, 2)

        def forward(self, batch):
            out = self.inner(batch.x, batch.edge_index, batch.edge_attr, batch.x_batch, batch.num_graphs)
            return out + self.edges(global_mean_pool(batch.edge_attr, batch.edge_attr_batch, batch.num_graphs))
    torch.manual_seed(0)
    theirs = WithEdges(pyg_nn).double()
    ours = WithEdges(gnn).double()
    ours.load_state_dict(theirs.state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ours, theirs)]
    loader = DataLoader(dataset, batch_size=4, shuffle=True, follow_batch=["x", "edge_attr"],
                        generator=torch.Generator().manual_seed(0))
    for epoch in range(2):
        for batch in loader:
            outs = []
            for model, optimizer in zip((ours, theirs), optimizers):
                optimizer.zero_grad()
                out = model(batch)
                out.square().sum().backward()
                outs.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
                optimizer.step()
            torch.testing.assert_close(outs[0], outs[1], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", ["gat", "gat_edge", "gatv2_edge"])
@pytest.mark.parametrize("self_loops", [True, False])
def test_attention_weights_returned_on_a_batch_are_the_callers_to_edit(kind, self_loops, monkeypatch):
    """``return_attention_weights=True`` hands back ``(edge_index, alpha)``; code that
    explains a batch per graph shifts that ``edge_index`` to each graph's own vertex ids
    in place. In PyG it is a new tensor (or, without self loops to add, the caller's
    own): the edit must not reach the layers' cached graph, whose next use raised
    GraphModifiedError for that batch and every equal edge_index after it."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    ours, theirs = twins(kind)
    for model in (ours, theirs):
        model.conv1.add_self_loops = self_loops
        model.eval()
    batch = make_batch(TRAILING)
    extra = (batch.edge_attr,) if KINDS[kind][1] else ()
    outputs = []
    for model in (ours, theirs):
        edge_index = batch.edge_index.clone()
        out, (attended, alpha) = model.conv1(batch.x, edge_index, *extra, return_attention_weights=True)
        outputs.append((out, attended.clone(), alpha))
        attended -= batch.ptr[batch.batch[attended[0]]]           # each graph's own ids
        with torch.no_grad():
            outputs.append(model(batch.x, edge_index, batch.edge_attr, batch.batch, batch.num_graphs))
            outputs.append(model(batch.x, edge_index.clone(), batch.edge_attr, batch.batch, batch.num_graphs))
    half = len(outputs) // 2
    torch.testing.assert_close(outputs[:half], outputs[half:], rtol=1e-9, atol=1e-11)
