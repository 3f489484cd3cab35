"""``torch.compile`` of gnnfuse.nn layers: one captured graph (no graph breaks), each fused
program one opaque operator, and the eager answer -- outputs and every gradient -- which
is also PyG's (float64, weights copied from PyG's layer). Compiled with ``aot_eager``
(dynamo and AOT autograd, no code generation: what decides graph breaks and gradients)
and ``fullgraph=True``, which raises at any graph break; one test runs inductor."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch_geometric.nn as pyg

import gnnfuse.nn as ours
from gnnfuse import vertex
from gnnfuse.frontend.compiled_call import udf_factory
from gnnfuse.graph import Graph
from layer_check import assert_same_values, outputs_and_grads

SRC = str(Path(__file__).resolve().parent.parent / "src")
# A self loop (0 -> 0), a vertex without in-edges (3), one without any edge (4).
EDGE_INDEX = [[0, 1, 2, 3, 3, 1], [0, 0, 1, 1, 2, 2]]
NUM_NODES = 5

# name -> (gnnfuse layer, PyG layer of the same configuration); inputs are 8 wide.
LAYERS = {
    "sage_aggr_list": lambda: (ours.SAGEConv(8, 6, aggr=["mean", "sum", "min", "max", "std"]),
                               pyg.SAGEConv(8, 6, aggr=["mean", "sum", "min", "max", "std"])),
    "sage_narrowing_mean": lambda: (ours.SAGEConv(8, 4), pyg.SAGEConv(8, 4)),
    "gcn": lambda: (ours.GCNConv(8, 4), pyg.GCNConv(8, 4)),
    "gcn_target_to_source": lambda: (ours.GCNConv(8, 4, flow="target_to_source"),
                                     pyg.GCNConv(8, 4, flow="target_to_source")),
    "gcn_unnormalized": lambda: (ours.GCNConv(8, 4, normalize=False), pyg.GCNConv(8, 4, normalize=False)),
    "gat": lambda: (ours.GATConv(8, 3, heads=2), pyg.GATConv(8, 3, heads=2)),
    "gin": lambda: (ours.GINConv(torch.nn.Linear(8, 4), train_eps=True),
                    pyg.GINConv(torch.nn.Linear(8, 4), train_eps=True)),
    "graph_conv_mean": lambda: (ours.GraphConv(8, 4, aggr="mean"), pyg.GraphConv(8, 4, aggr="mean")),
    "sgc": lambda: (ours.SGConv(8, 4, K=2), pyg.SGConv(8, 4, K=2)),
    "appnp": lambda: (ours.APPNP(K=2, alpha=0.1), pyg.APPNP(K=2, alpha=0.1)),
    "tag": lambda: (ours.TAGConv(8, 4, K=2), pyg.TAGConv(8, 4, K=2)),
}
TRITON_LAYERS = ("sage_aggr_list", "gcn", "gat")     # the interpreter is slow: one per program shape


def _pair(name: str, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    layer, oracle = (m.double().to(device) for m in LAYERS[name]())
    layer.load_state_dict(oracle.state_dict())
    return layer, oracle


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return (torch.randn(NUM_NODES, 8, dtype=torch.float64, device=device),
            torch.tensor(EDGE_INDEX, device=device))


def _assert_compiled_matches(name: str, device: str) -> None:
    """Compiled (one graph) == eager == PyG, on the output and every gradient."""
    layer, oracle = _pair(name, device)
    x, edge_index = _inputs(device)
    eager = outputs_and_grads(layer, lambda h: layer(h, edge_index), x)     # first, as a user's eager warm-up
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    got = outputs_and_grads(layer, lambda h: compiled(h, edge_index), x)
    expected = outputs_and_grads(oracle, lambda h: oracle(h, edge_index), x)
    assert got.keys() == eager.keys() == expected.keys()
    for key in got:
        assert_same_values(got[key], eager[key], f"{name} {key} (compiled vs eager)")
        assert_same_values(got[key], expected[key], f"{name} {key} (compiled vs PyG)")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles anew: dynamo's caches are per code object, so a layer class
    compiled by an earlier test would otherwise be reused (or hit the recompile limit)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_compiles_to_one_graph_with_eager_and_pyg_results(name):
    _assert_compiled_matches(name, "cpu")


@pytest.mark.parametrize("name", TRITON_LAYERS)
def test_layer_compiles_on_the_triton_backend(name, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    from oracle_check import device_for
    _assert_compiled_matches(name, device_for("triton"))


def test_a_nan_on_a_row_no_edge_reads_stays_out_of_the_compiled_gradients():
    """Vertex 4 is no edge's source: PyG never gathers its NaN, so its x gradient is 0
    and t's is finite. Compiled, std's squares and softmax's scaling ran on that row
    as read: x's gradient there and t's were NaN."""
    torch.manual_seed(0)
    kwargs = {"aggr": ["std", "softmax"], "aggr_kwargs": {"aggrs_kwargs": [{}, {"learn": True}]}}
    layer, oracle = ours.SAGEConv(8, 4, **kwargs).double(), pyg.SAGEConv(8, 4, **kwargs).double()
    layer.load_state_dict(oracle.state_dict())
    x, edge_index = _inputs("cpu")
    x[4, 3] = float("nan")
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    got = outputs_and_grads(layer, lambda h: compiled(h, edge_index), x)
    expected = outputs_and_grads(oracle, lambda h: oracle(h, edge_index), x)
    for key in got:
        assert_same_values(got[key], expected[key], f"{key} (compiled vs PyG)")


def test_explain_finds_no_graph_break_in_a_list_aggregation():
    """PyG's own check, in our words: dynamo's explanation of a SAGE layer with a list of
    aggregations (std included) counts no graph break, and its graph calls our operator."""
    layer, _ = _pair("sage_aggr_list", "cpu")
    x, edge_index = _inputs("cpu")
    explanation = torch._dynamo.explain(layer)(x, edge_index)
    assert explanation.graph_break_count == 0
    assert "gnnfuse.run_program" in explanation.graphs[0].code


def test_an_edited_edge_index_is_never_served_stale():
    """The compiled graph keeps no layout: the operator builds it per index tensor, and
    an in-place edit (a new version) or another tensor of the same shape gets its own."""
    layer, _ = _pair("sage_aggr_list", "cpu")
    x, edge_index = _inputs("cpu")
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    compiled(x, edge_index)
    edge_index[1, 0] = 4
    assert_same_values(compiled(x, edge_index), layer(x, edge_index), "after an in-place edit")
    other = torch.tensor([[4, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 4]])
    assert_same_values(compiled(x, other), layer(x, other), "on another edge_index")


def test_a_graph_object_runs_in_the_compiled_graph():
    layer, oracle = _pair("gcn", "cpu")
    x, edge_index = _inputs("cpu")
    graph = Graph.from_edge_index(edge_index, NUM_NODES)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    assert_same_values(compiled(x, graph), oracle(x, edge_index), "GCN on a Graph")



def test_a_graph_read_from_an_edge_index_object_is_refused_after_its_edit_as_eagerly():
    """A Graph built from PyG's ``EdgeIndex``: a write through the EdgeIndex moves its own
    version counter, not its tensor's, and only the graph's seal reads it. Traced as its
    src/dst alone, the compiled layer kept the graph's layouts of the old edges under the
    edited ids (SAGEConv 0.058 off a fresh graph's output) where the eager call refuses the
    graph; it runs eagerly now, the edit refused as there."""
    from torch_geometric import EdgeIndex

    from gnnfuse.graph import GraphModifiedError
    layer, _ = _pair("sage_aggr_list", "cpu")
    x, edge_index = _inputs("cpu")
    wrapped = EdgeIndex(edge_index, sparse_size=(NUM_NODES, NUM_NODES))
    graph = Graph.from_edge_index(wrapped)
    compiled = torch.compile(lambda features: layer(features, graph), backend="aot_eager")
    with pytest.warns(UserWarning, match="a Graph read from a PyG EdgeIndex"):
        assert_same_values(compiled(x), layer(x, graph), "before the edit")
    wrapped[1, 0] = 4
    with pytest.raises(GraphModifiedError, match="a PyG EdgeIndex"):
        compiled(x)


@pytest.mark.parametrize("derive", ["add_self_loops", "remove_self_loops"])
def test_a_graph_made_by_a_self_loop_step_is_refused_after_its_edge_index_edit_as_eagerly(derive, monkeypatch):
    """``Graph.from_edge_index(edge_index).add_self_loops()`` reads its edges from the
    caller's edge_index, whose in-place edit refuses it eagerly. Traced as its own src/dst
    arrays, built from the old edges, the compiled layer ran the old graph after the edit
    (SAGEConv 1.3-3.5 off a fresh graph's output); it runs eagerly now, the edit refused
    as there."""
    from gnnfuse.graph import GraphModifiedError
    from gnnfuse.runtime import compile_op
    monkeypatch.setattr(compile_op, "_WARNED", set())      # warned once per reason: each case warns
    layer, _ = _pair("sage_narrowing_mean", "cpu")
    x, edge_index = _inputs("cpu")
    graph = getattr(Graph.from_edge_index(edge_index, NUM_NODES), derive)()
    compiled = torch.compile(lambda features: layer(features, graph), backend="aot_eager")
    with pytest.warns(UserWarning, match="a Graph made by add_self_loops or remove_self_loops"):
        assert_same_values(compiled(x), layer(x, graph), "before the edit")
    assert_same_values(compiled(x), layer(x, graph), "again")
    edge_index[0, 0] = 4
    with pytest.raises(GraphModifiedError, match="edge_index"):
        layer(x, graph)
    with pytest.raises(GraphModifiedError, match="edge_index"):
        compiled(x)


def test_a_graph_built_inside_compiled_code_breaks_the_graph_by_name():
    """A `Graph` built in the compiled code reads its ids' range (`id_bounds`), which
    dynamo traced as data-dependent values: fullgraph=True refused it with dynamo's
    "Could not guard on data-dependent expression u0 < 0 ... if low < 0", a gnnfuse line
    naming neither the Graph nor what to do. It now breaks the graph naming why; without
    fullgraph the layer still gives PyG's answer."""
    layer, oracle = _pair("gcn", "cpu")
    x, edge_index = _inputs("cpu")

    def on_a_graph_built_here(x, edge_index):
        return layer(x, Graph(edge_index[0], edge_index[1], NUM_NODES))
    with pytest.raises(Exception, match="a gnnfuse Graph built inside torch.compile'd code"):
        torch.compile(on_a_graph_built_here, backend="aot_eager", fullgraph=True)(x, edge_index)
    torch._dynamo.reset()
    got = torch.compile(on_a_graph_built_here, backend="aot_eager")(x, edge_index)
    assert_same_values(got, oracle(x, edge_index), "GCN on a Graph built in the compiled code")

@udf_factory
def _scaled_sum(k: float):
    def scaled(v):
        return sum([u.h * k for u in v.innbs])
    return vertex(scaled)


def test_two_udfs_first_built_in_one_trace_compile_to_one_graph():
    """A UDF `udf_factory` builds on first use (SAGEConv's per-aggr-list reductions, a
    slope's) was kept in a dict, whose items dynamo copies where its trace first reads
    it: the second one built in the same trace -- a model with two SAGEConvs of other
    aggr lists -- was a KeyError there, so fullgraph=True refused the model and without
    it the whole forward ran eagerly."""
    graph = Graph(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    x = torch.randn(3, 4, dtype=torch.float64)

    def both(x, graph):
        return _scaled_sum(2.0)(graph, {"h": x}) + _scaled_sum(3.0)(graph, {"h": x})
    compiled = torch.compile(both, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, graph), 5.0 * vertex(lambda v: sum([u.h for u in v.innbs]))(graph, {"h": x}))


def test_an_uncovered_call_runs_eagerly_with_a_warning():
    """GCN with edge_weight has no traced path: it runs the eager layer behind one graph
    break, says so, and gives the eager answer."""
    layer, oracle = _pair("gcn", "cpu")
    x, edge_index = _inputs("cpu")
    weight = torch.rand(edge_index.shape[1], dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(layer, backend="eager")(x, edge_index, weight)
    assert any("GCNConv: edge_weight" in str(w.message) for w in caught)
    assert_same_values(out, oracle(x, edge_index, weight), "GCN with edge_weight")


def test_inductor_compiles_after_an_eager_call_in_a_fresh_process():
    """Inductor (the default backend) compiles a list aggregation to one graph with the
    eager result, after an eager call. In a fresh process, because the first trace of a
    process imports dynamo (torch's meta kernels do, lazily) while the vertex tracer has
    ``len``/``sum``/``max``/``min`` swapped: dynamo kept the swapped ``len`` and could not
    compile any model afterwards."""
    script = ("import torch\nfrom gnnfuse.nn import SAGEConv\ntorch.manual_seed(0)\n"
              "x, edge_index = torch.randn(4, 8), torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])\n"
              "layer = SAGEConv(8, 32, aggr=['mean', 'sum', 'min', 'max', 'std'])\n"
              "expected = layer(x, edge_index)\n"
              "out = torch.compile(layer, fullgraph=True)(x, edge_index)\n"
              "assert torch.allclose(out, expected, atol=1e-6)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


# A fresh process whose first calls of these layers and of a message/reduce pair are the
# compiled ones: dynamo traced gnnfuse's tracer itself there (under dynamic=True, where the
# feature widths are symbolic; in message_passing and apply_edges always) and failed on its
# symbolic values, with an error that the trace cache then gave every later eager call.
_COMPILED_FIRST = """
import warnings
import torch, torch_geometric.nn as pyg
import gnnfuse, gnnfuse.nn as ours
torch.manual_seed(0)
for make in (lambda m: m.SAGEConv(8, 6), lambda m: m.GATConv(8, 3, heads=2),
             lambda m: m.GINConv(torch.nn.Linear(8, 4))):
    layer, oracle = make(ours).double(), make(pyg).double()
    oracle.load_state_dict(layer.state_dict())
    compiled = torch.compile(layer, backend="eager", dynamic=True)
    for n in (7, 11):
        x, edge_index = torch.randn(n, 8, dtype=torch.float64), torch.randint(0, n, (2, 3 * n))
        torch.testing.assert_close(compiled(x, edge_index), oracle(x, edge_index))
    torch.testing.assert_close(make(ours).double()(x, edge_index).shape, oracle(x, edge_index).shape)
graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]))
h = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
def step(h):
    node = gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"] * 2}, lambda n: {"h": n.mailbox["m"].sum(1)},
                                   ndata={"h": h})["h"]
    edge = gnnfuse.apply_edges(graph, lambda e: {"s": e.src["h"] * e.dst["h"]}, ndata={"h": h})["s"]
    return node.sum() + edge.sum()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    (grad,) = torch.autograd.grad(torch.compile(step, backend="aot_eager")(h), h)
assert sum("gnnfuse runs eagerly under torch.compile" in str(w.message) for w in caught) == 2, caught
plain = h.detach().requires_grad_()
node = torch.zeros(3, 4, dtype=torch.float64).index_add(0, graph.dst, plain[graph.src] * 2)
(expected,) = torch.autograd.grad(node.sum() + (plain[graph.src] * plain[graph.dst]).sum(), plain)
torch.testing.assert_close(grad, expected)
torch.testing.assert_close(step(h), node.sum() + (plain[graph.src] * plain[graph.dst]).sum())   # eager after
from gnnfuse.ops import gspmm, gsddmm
from gnnfuse.napa import NeighborApply, Pull
def templates(h):
    spmm = gspmm(graph, lambda s: s * 2, "sum", src=h)
    sddmm = gsddmm(graph, lambda s, d: s * d, src=h, dst=h)
    pulled = Pull(graph, h, NeighborApply(graph, h, "mean"), "mul", "sum")
    return spmm.sum() + sddmm.sum() + pulled.sum()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    (grad,) = torch.autograd.grad(torch.compile(templates, backend="aot_eager")(h), h)
assert any("gnnfuse.ops.gspmm" in str(w.message) for w in caught), caught
(expected,) = torch.autograd.grad(templates(plain), plain)
torch.testing.assert_close(grad, expected)
torch.testing.assert_close(templates(h), templates(plain))      # eager after
"""


def test_compiled_first_calls_under_dynamic_shapes_and_udfs_per_call_give_the_eager_results():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", _COMPILED_FIRST], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


_DYNAMIC_LAYERS = {"SAGEConv": lambda m: m.SAGEConv(8, 6), "GATConv": lambda m: m.GATConv(8, 3, heads=2),
                   "GINConv": lambda m: m.GINConv(torch.nn.Linear(8, 4))}


@pytest.mark.parametrize("name", sorted(_DYNAMIC_LAYERS))
def test_dynamic_shapes_compile_to_one_graph_and_trace_no_new_graphs_per_call(name):
    # Under dynamic=True the program lookup got symbolic widths (and GAT's factory a
    # symbolic slope), could not be a constant, and broke the graph (fullgraph=True
    # refused); dynamo then called it on every call, registering a check of its own each
    # time, kept for the process, under a new operator name that recompiled the graph after
    # the break until dynamo's recompile limit
    from torch._dynamo.utils import counters
    from gnnfuse.runtime import compile_op
    torch.manual_seed(0)
    layer, oracle = _DYNAMIC_LAYERS[name](ours).double(), _DYNAMIC_LAYERS[name](pyg).double()
    oracle.load_state_dict(layer.state_dict())
    compiled = torch.compile(layer, backend="eager", dynamic=True, fullgraph=True)

    def call(n: int) -> None:
        x, edge_index = torch.randn(n, 8, dtype=torch.float64), torch.randint(0, n, (2, 3 * n))
        torch.testing.assert_close(compiled(x, edge_index), oracle(x, edge_index))
    for n in (7, 11, 13):
        call(n)
    checks, graphs = len(compile_op._CHECKS), counters["stats"]["unique_graphs"]
    for n in (17, 19, 23):
        call(n)
    assert (len(compile_op._CHECKS), counters["stats"]["unique_graphs"]) == (checks, graphs)
    if name == "GATConv":       # a setting changed between calls is guarded, not baked in
        layer.negative_slope = oracle.negative_slope = 0.5
        call(29)


# (layer maker, the change made to ours and PyG's between compiled calls)
_SETTING_CHANGES = {
    "sage-root_weight": (lambda m: m.SAGEConv(4, 3), lambda layer: setattr(layer, "root_weight", False)),
}


@pytest.mark.parametrize("name", sorted(_SETTING_CHANGES))
def test_a_setting_changed_between_compiled_calls_is_followed(name):
    # SAGEConv kept root_weight in a __dict__ read dynamo did not guard: after
    # ``root_weight = False`` (PyG's DirGNNConv sets it) the compiled layer still added lin_r(x)
    make, change = _SETTING_CHANGES[name]
    torch.manual_seed(0)
    layer, oracle = make(ours).double(), make(pyg).double()
    oracle.load_state_dict(layer.state_dict())
    x, edge_index = torch.randn(6, 4, dtype=torch.float64), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    compiled = torch.compile(layer, backend="eager")
    torch.testing.assert_close(compiled(x, edge_index), oracle(x, edge_index))
    change(layer)
    change(oracle)
    torch.testing.assert_close(compiled(x, edge_index), oracle(x, edge_index))


@pytest.mark.parametrize("make", [lambda m: m.TAGConv(4, 3, K=2, normalize=False),
                                  lambda m: m.SGConv(4, 3, K=2)], ids=["tag-unnormalized", "sgc"])
def test_more_layer_settings_compile_to_one_graph(make):
    # TAGConv(normalize=False) made its ones on graph.device, which a GraphRef lacked: the
    # frame failed, ran uncompiled without a warning, and fullgraph=True refused it
    torch.manual_seed(0)
    layer, oracle = make(ours).double(), make(pyg).double()
    oracle.load_state_dict(layer.state_dict())
    x, edge_index = torch.randn(6, 4, dtype=torch.float64), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, edge_index), oracle(x, edge_index))


def test_fullgraph_refusal_of_an_eager_call_names_gnnfuses_reason():
    layer = ours.GATv2Conv(8, 3, heads=2)
    x, edge_index = torch.randn(7, 8), torch.randint(0, 7, (2, 21))
    with pytest.raises(Exception, match="GATv2Conv: it has no torch.compile path yet"):
        torch.compile(layer, backend="eager", fullgraph=True)(x, edge_index)


@pytest.mark.parametrize("name", ["RGCNConv", "RGATConv"])
def test_a_typed_graph_layer_runs_eagerly_behind_one_break(name):
    # dynamo traced the forward up to the typed graph's (untraceable) call, breaking the
    # graph at each data-dependent step of its build: 9 graphs for one R-GCN call
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    layer = getattr(ours, name)(8, 4, num_relations=3).double()
    x, edge_index = torch.randn(7, 8, dtype=torch.float64), torch.randint(0, 7, (2, 21))
    edge_type = torch.randint(0, 3, (21,))
    graphs = counters["stats"]["unique_graphs"]
    with pytest.warns(UserWarning, match=f"{name}: a typed graph has no torch.compile path yet"):
        out = torch.compile(lambda *a: layer(*a).relu(), backend="eager")(x, edge_index, edge_type)
    assert counters["stats"]["unique_graphs"] - graphs <= 2       # before and after the break
    torch.testing.assert_close(out, layer(x, edge_index, edge_type).relu())


def _weighted_adj_t(n: int, seed: int) -> torch.Tensor:
    """A coalesced COO adj_t of weights other than 1, without self loops."""
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.unique(torch.randint(0, n, (2, 3 * n), generator=g), dim=1)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    values = torch.rand(edge_index.shape[1], dtype=torch.float64, generator=g) + 0.5
    return torch.sparse_coo_tensor(edge_index.flip(0), values, (n, n)).coalesce()


_SPARSE_LAYOUTS = {"coo": lambda a: a, "csr": torch.Tensor.to_sparse_csr, "csc": torch.Tensor.to_sparse_csc}


@pytest.mark.parametrize("name, layout", [("GCNConv", "coo"), ("GraphConv", "coo"), ("SGConv", "coo"),
                                          ("TAGConv", "coo"), ("GCNConv", "csr")])
def test_a_weighted_sparse_adj_t_runs_eagerly_behind_a_graph_break(name, layout):
    """Dynamo cannot take a sparse tensor: it ran the layer's frame as Python and compiled
    its helpers on their own, one of which returned the graph as a GraphRef to that
    Python ('GraphRef' object has no attribute 'num_edges'); another failed wrapping a
    CSR's index tensors, views of a sparse base (an IndexError in dynamo)."""
    torch.manual_seed(0)
    layer, oracle = getattr(ours, name)(8, 4).double(), getattr(pyg, name)(8, 4).double()
    oracle.load_state_dict(layer.state_dict())
    compiled = torch.compile(layer, backend="aot_eager")
    for n in (9, 13):
        coo, x = _weighted_adj_t(n, n), torch.randn(n, 8, dtype=torch.float64)
        adj_t = _SPARSE_LAYOUTS[layout](coo)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = outputs_and_grads(layer, lambda h: compiled(h, adj_t), x)
            expected = outputs_and_grads(oracle, lambda h: oracle(h, coo), x)     # PyG's gcn_norm takes no CSC
        for key in got:
            assert_same_values(got[key], expected[key], f"{name} {key}, {n} vertices")


@pytest.mark.parametrize("name, layout", [("sage_narrowing_mean", "coo"), ("sage_narrowing_mean", "csr"),
                                          ("gat", "csr"), ("gin", "csc")])
def test_a_sparse_adj_t_of_ones_gives_the_eager_answer(name, layout):
    """The pattern-only layers with a sparse adj_t under compile. With a CSR or CSC,
    dynamo failed wrapping the compressed index tensors of the graph coercion's frame;
    SAGE's backward operator returned an incoming gradient as its own output, which a
    custom operator may not (torch's aliasing check raised)."""
    layer, oracle = _pair(name, "cpu")
    compiled = torch.compile(layer, backend="aot_eager")
    for n in (9, 13):
        pattern = _weighted_adj_t(n, n)
        coo = torch.sparse_coo_tensor(pattern.indices(), torch.ones(pattern._nnz(), dtype=torch.float64), (n, n))
        adj_t, x = _SPARSE_LAYOUTS[layout](coo), torch.randn(n, 8, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = outputs_and_grads(layer, lambda h: compiled(h, adj_t), x)
            # (PyG's edge_index: its SAGEConv takes no sparse input once a SAGEConv with a
            # list of aggregations was built in the process, PyG 2.8's generated propagate)
            expected = outputs_and_grads(oracle, lambda h: oracle(h, pattern.indices().flip(0)), x)
        for key in got:
            assert_same_values(got[key], expected[key], f"{name} {key}, {layout}, {n} vertices")


def test_a_refused_adj_t_leaves_the_compiled_layer_working():
    """GCNConv refuses a torch sparse adj_t storing self loops; afterwards the compiled
    layer, and another compiled GCNConv, failed on a plain edge_index ('cannot make a
    Graph from GraphRef') until torch.compiler.reset()."""
    layer, oracle = _pair("gcn", "cpu")
    x, edge_index = _inputs("cpu")
    compiled = torch.compile(layer, backend="eager")
    looped = torch.sparse_coo_tensor(torch.tensor([[0, 1], [0, 2]]), torch.ones(2, dtype=torch.float64),
                                     (NUM_NODES, NUM_NODES)).coalesce()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="stores self loops"):
            compiled(x, looped)
        assert_same_values(compiled(x, edge_index), oracle(x, edge_index), "GCN after the refusal")
        other, other_oracle = _pair("gcn", "cpu")
        assert_same_values(torch.compile(other, backend="eager")(x, edge_index), other_oracle(x, edge_index),
                           "a fresh compiled GCN after the refusal")


@pytest.mark.parametrize("name", ["TransformerConv", "LEConv"])
def test_a_layer_behind_a_graph_break_takes_sizes_marked_dynamic(name):
    """These PyG classes run their propagate behind a graph break; its output's rows were
    a constant after the break, and adding x's root term (marked dynamic by the user)
    specialized them: dynamo refused with a ConstraintViolationError naming x."""
    torch.manual_seed(0)
    layer, oracle = getattr(ours, name)(8, 4).double(), getattr(pyg, name)(8, 4).double()
    oracle.load_state_dict(layer.state_dict())
    compiled = torch.compile(layer, backend="aot_eager")
    for n in (7, 12):
        x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
        edge_index = torch.randint(0, n, (2, 3 * n))
        torch._dynamo.mark_dynamic(x, 0)        # the very tensors passed: a clone drops the marks
        torch._dynamo.mark_dynamic(edge_index, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = compiled(x, edge_index)
        expected = oracle(x, edge_index)
        assert_same_values(got, expected, f"{name}, {n} vertices")
        weight = torch.linspace(-1, 1, got.numel(), dtype=got.dtype).view_as(got)
        assert_same_values(torch.autograd.grad((got * weight).sum(), x)[0],
                           torch.autograd.grad((expected * weight).sum(), x)[0], f"{name} x.grad, {n} vertices")


_WEIGHT = torch.ones(3, dtype=torch.float64)


@vertex
def _weighted_neighbour_sum(v):
    return sum([u.h * _WEIGHT for u in v.innbs])     # reads a tensor from outside its arguments


def test_a_udf_reading_an_outside_tensor_runs_eagerly_and_sees_its_edits():
    """Frozen into a compiled graph, the tensor's later edits would be missed: such a UDF
    runs eagerly behind a graph break, says so, and sees every edit."""
    x, edge_index = torch.randn(NUM_NODES, 3, dtype=torch.float64), Graph.from_edge_index(EDGE_INDEX, NUM_NODES)
    compiled = torch.compile(lambda h, e: _weighted_neighbour_sum(e, {"h": h}), backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(x, edge_index)
    assert any("reads tensors" in str(w.message) for w in caught)
    _WEIGHT.mul_(3.0)
    try:
        assert_same_values(compiled(x, edge_index), _weighted_neighbour_sum(edge_index, {"h": x}), "after an edit")
        assert_same_values(compiled(x, edge_index), 3.0 * _weighted_neighbour_sum(edge_index, {"h": x / 3.0}),
                           "scaled")
    finally:
        _WEIGHT.fill_(1.0)


def test_a_padded_linear_output_compiles_to_one_graph(monkeypatch):
    """On CUDA GATConv's 6-wide map (2 heads x 3) writes a table padded to 8 and hands
    on its view (nn/aligned_linear.py); compiled, that is one graph with eager's and
    PyG's values and gradients. Forced here, where the CPU would not pad."""
    from gnnfuse.backend.row_layout import aligned_row_width
    from gnnfuse.nn import aligned_linear
    padded = []

    def stride(x, width):
        padded.append(aligned_row_width(width) != width)
        return aligned_row_width(width)
    monkeypatch.setattr(aligned_linear, "kernel_row_stride", stride)
    _assert_compiled_matches("gat", "cpu")
    assert any(padded), "the layer's map was never padded"


_SCALE = 2.0
_SETTINGS = {"scale": 2.0}


@vertex
def _scaled_neighbour_sum(v):
    return sum([u.h * _SCALE for u in v.innbs])     # a global scalar, which the trace bakes in


@vertex
def _configured_neighbour_sum(v):
    return sum([u.h * _SETTINGS["scale"] for u in v.innbs])     # a dict, which no guard can snapshot


def test_a_global_a_compiled_udf_read_is_rebound_raises_until_recompiled(monkeypatch):
    """Dynamo puts no guard on what a UDF reads (it sees the traced program as a constant):
    a compiled graph kept running the program traced with _SCALE = 2.0 after _SCALE was
    rebound to 3.0, 2x the sum where eager code gives 3x. Now the run raises, and a
    recompile traces the new value."""
    x, edge_index = torch.randn(NUM_NODES, 3, dtype=torch.float64), Graph.from_edge_index(EDGE_INDEX, NUM_NODES)
    plain = _neighbour_sum(x)
    compiled = torch.compile(lambda h, e: _scaled_neighbour_sum(e, {"h": h}), backend="eager", fullgraph=True)
    assert_same_values(compiled(x, edge_index), 2.0 * plain, "as traced")
    monkeypatch.setattr(sys.modules[__name__], "_SCALE", 3.0)
    with pytest.raises(RuntimeError, match="_scaled_neighbour_sum now read"):
        compiled(x, edge_index)
    torch.compiler.reset()
    assert_same_values(compiled(x, edge_index), 3.0 * plain, "recompiled")


def test_a_udf_reaching_unguardable_state_runs_eagerly_and_sees_its_changes(monkeypatch):
    """A UDF reading a dict is traced on every eager call; compiled, it was traced once and
    kept the dict's first value. It runs eagerly behind a graph break, with a warning."""
    x, edge_index = torch.randn(NUM_NODES, 3, dtype=torch.float64), Graph.from_edge_index(EDGE_INDEX, NUM_NODES)
    compiled = torch.compile(lambda h, e: _configured_neighbour_sum(e, {"h": h}), backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same_values(compiled(x, edge_index), 2.0 * _neighbour_sum(x), "first")
    monkeypatch.setitem(_SETTINGS, "scale", 5.0)
    assert_same_values(compiled(x, edge_index), 5.0 * _neighbour_sum(x), "after the change")
    assert any("cannot be guarded" in str(w.message) for w in caught)


_TEMPERATURE = torch.tensor(2.0)


@vertex
def _valued_neighbour_sum(v):
    return sum([u.h for u in v.innbs]) * _TEMPERATURE.item()     # a tensor's value, which the trace bakes in


def test_a_udf_reading_a_tensors_value_runs_eagerly_and_sees_its_edits():
    """``.item()`` of a reachable tensor: traced on every eager call, but compiled it was
    traced once and the guard (the tensor's metadata) saw no change, so the graph kept
    2x the sum after the tensor said 4x. It runs eagerly behind a graph break, with a warning."""
    x, edge_index = torch.randn(NUM_NODES, 3, dtype=torch.float64), Graph.from_edge_index(EDGE_INDEX, NUM_NODES)
    compiled = torch.compile(lambda h, e: _valued_neighbour_sum(e, {"h": h}), backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same_values(compiled(x, edge_index), 2.0 * _neighbour_sum(x), "first")
    assert any("a tensor's value" in str(w.message) for w in caught)
    _TEMPERATURE.fill_(4.0)
    try:
        assert_same_values(compiled(x, edge_index), 4.0 * _neighbour_sum(x), "after the edit")
    finally:
        _TEMPERATURE.fill_(2.0)


def _neighbour_sum(x: torch.Tensor) -> torch.Tensor:
    src, dst = torch.tensor(EDGE_INDEX)
    return torch.zeros_like(x).index_add_(0, dst, x[src])


def test_layers_compile_where_dynamo_cannot_trace_the_autocast_availability_check(monkeypatch):
    """torch 2.11's dynamo (the GPU machine's) has no rule for
    ``torch._C._is_autocast_available``: every fullgraph compile of a gnnfuse layer failed
    on the availability check that the call path made before asking for autocast's state.
    Here that check is made untraceable, as it is there; the call path must not make it."""
    monkeypatch.setattr(torch.amp, "is_autocast_available", torch._dynamo.disable(torch.amp.is_autocast_available))
    layer, oracle = _pair("gcn", "cpu")
    x, edge_index = _inputs("cpu")
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    assert_same_values(compiled(x, edge_index), oracle(x, edge_index), "GCN")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compiled(x, edge_index).dtype == layer(x, edge_index).dtype


@pytest.mark.parametrize("backend", ["reference", "triton"], indirect=True)
@pytest.mark.parametrize("name", ["TransformerConv", "LEConv"])
def test_a_compiled_pyg_layer_trains_under_torch_compile(name, backend, device):
    """Dynamo traced into the compiled propagate's autograd.Function, which it cannot
    follow: a training step failed naming torch.func transforms (on Triton, inference
    failed too). The propagate runs behind a graph break, with the eager gradients."""
    torch.manual_seed(0)
    layer = getattr(ours, name)(4, 3).to(device, torch.float64)
    x, edge_index = torch.randn(6, 4, dtype=torch.float64, device=device), torch.tensor(
        [[5, 5, 2, 0, 4, 1, 1], [1, 2, 2, 4, 3, 0, 0]], device=device)
    compiled = torch.compile(layer, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = outputs_and_grads(layer, lambda x: compiled(x, edge_index), x)
    expected = outputs_and_grads(layer, lambda x: layer(x, edge_index), x)
    for key in expected:
        assert_same_values(got[key], expected[key], f"compiled {name} {key}")


@pytest.mark.parametrize("edge_index, message", [
    (torch.tensor([[0, 1, 2], [1, 2, 9]]), "dst has id 9 at position 2, but num_nodes=6"),
    (torch.tensor([[0., 1, 2], [1, 2, 3]]), "must hold integer ids, got torch.float32"),
    (torch.tensor([[0, 1, 2], [1, 2, 3], [0, 0, 0]]), r"edge_index must have shape \[2, E\], got \[3, 3\]"),
])
def test_compiled_gcn_names_a_bad_edge_index_as_eager_does(edge_index, message):
    """GCN's degrees were computed in traced torch on the unchecked ids: an id out of range
    gave torch's 'index out of range in self', float ids index_add's dtype error."""
    torch._dynamo.reset()
    conv = ours.GCNConv(4, 3)
    with pytest.raises(ValueError, match=message):
        conv(torch.randn(6, 4), edge_index)
    with pytest.raises(ValueError, match=message):
        torch.compile(conv, backend="eager")(torch.randn(6, 4), edge_index)


def test_a_second_derivative_through_a_compiled_layer_is_refused_by_name():
    """A gradient penalty (create_graph=True, then a backward through the gradient) under
    backend="eager" reached the backward operator, which has no derivative: torch refused
    it in words for the operator's author ("no autograd formula was registered. Please use
    register_autograd to add one"). It is refused naming the second derivative and what
    to do instead; the first derivative with create_graph=True is still the eager one."""
    layer, _ = _pair("gcn", "cpu")
    x, edge_index = _inputs("cpu")
    compiled = torch.compile(layer, backend="eager")
    xs = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(torch.tanh(compiled(xs, edge_index)).pow(2).sum(), xs, create_graph=True)
    plain = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(torch.tanh(layer(plain, edge_index)).pow(2).sum(), plain)
    assert_same_values(grad.detach(), expected, "first derivative")
    with pytest.raises(NotImplementedError, match=r"a second derivative \(backward with create_graph=True\).*"
                                                  r"under torch.compile is not supported"):
        grad.pow(2).sum().backward()


@vertex
def _in_degree_and_h(v):
    return {"d": len(v.innbs), "h": v.h}      # the in-degree alone: the graph's cached count


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_compiled_udf_output_written_in_place_leaves_the_graph_unchanged(backend):
    """A vertex function returning ``len(v.innbs)`` ran as an operator whose output was the
    graph's cached in-degrees itself. Inductor writes in place without moving a version
    counter: ``d.add_(1)`` raised the cached degrees by 1 per call (2, then 3 where the
    degree was 1); eager dynamo's write raised GraphModifiedError, blaming a write to
    ``Graph.in_degrees`` the user never made. The output is now a copy."""
    graph = Graph.from_edge_index(torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 3]]), 4)
    h = torch.randn(4, 2)

    def degree_plus_one(graph, h):
        d = _in_degree_and_h(graph, {"h": h})["d"]
        d.add_(1)
        return d
    compiled = torch.compile(degree_plus_one, backend=backend)
    expected = torch.tensor([2, 2, 2, 3])
    for call in range(3):
        assert torch.equal(compiled(graph, h), expected), f"call {call}"
    assert torch.equal(_in_degree_and_h(graph, {"h": h})["d"], expected - 1)
