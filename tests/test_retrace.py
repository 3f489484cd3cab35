"""Traces per call: a compiled layer traces its Python once per distinct structure and
reuses that trace (frontend/trace_cache.py), because a retrace costs host time on every
step and small graphs are host-bound. Every layer of ``gnnfuse.nn.__all__``, every
compiled PyG class, the user layers of pyg_user_layers.py and the examples' models are
called five times in training (forward + backward) and in evaluation (``no_grad``); the
2nd..5th calls must trace nothing. Switching between two graphs, two feature widths,
train and eval, or dropout on and off keeps one trace per distinct structure. Where a
reused trace would bake in a value (a submodule's weight or setting, an attribute
``message`` probes with ``hasattr``), a test changes it between calls and checks that
the output follows PyG's. Graphs of every vertex count (a sampled mini-batch's) reuse one
trace, and a layer whose trace fails (it runs PyG's propagate instead) tries it once.
Layers that must trace more often are listed with the reason (`RETRACES`)."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch import nn

import gnnfuse
import test_pyg_layers as pyg_cases
import test_pyg_message_passing as user_cases
from gnnfuse import nn as gnn
from gnnfuse.frontend.tracer import Tracer
from oracle_check import device_for
from pyg_user_layers import make_layers
from test_io_rule import _example

N, F_IN, EDGE_DIM, RELATIONS, HEADS, CHANNELS = 9, 6, 3, 3, 2, 4     # vertices 7 and 8 isolated
SRC = torch.tensor([0, 1, 2, 3, 4, 5, 6, 0, 2, 4, 1])
DST = torch.tensor([1, 2, 3, 4, 5, 6, 0, 3, 5, 1, 1])
EDGE_INDEX = torch.stack([SRC, DST])
EDGE_TYPE = torch.arange(len(SRC)) % RELATIONS
HETERO_EDGES = {("a", "r", "b"): torch.tensor([[0, 1, 2, 3, 0], [0, 1, 2, 0, 2]]),
                ("b", "s", "a"): torch.tensor([[0, 1, 2, 2], [1, 2, 3, 0]]),
                ("a", "t", "a"): torch.tensor([[0, 1, 2], [1, 2, 3]])}
HETERO_METADATA = (["a", "b"], list(HETERO_EDGES))


def count_traces(monkeypatch) -> list[int]:
    """A list that grows by one whenever any front end starts a trace (every one builds a
    `Tracer`: vertex functions, message/reduce, templates, PyG's message)."""
    traced: list[int] = []
    real = Tracer.__init__

    def counting(self, *args, **kwargs):
        traced.append(1)
        real(self, *args, **kwargs)
    monkeypatch.setattr(Tracer, "__init__", counting)
    return traced


def _graph(num_nodes: int = N) -> gnnfuse.Graph:
    return gnnfuse.Graph(SRC, DST, num_nodes)


def _typed_graph() -> gnnfuse.Graph:
    return gnnfuse.Graph(SRC, DST, N, edge_type=EDGE_TYPE, num_edge_types=RELATIONS)


def _mlp(width_in: int, width_out: int = 5) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, width_out), nn.ReLU(), nn.Linear(width_out, width_out))


def _hetero(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = layer({"a": x[:4], "b": x[4:]}, HETERO_EDGES)
    return torch.cat([out[t] for t in sorted(out)])


def _edge_attr() -> torch.Tensor:
    return torch.randn(len(SRC), EDGE_DIM, generator=torch.Generator().manual_seed(2))


def _plain(layer, x):
    return layer(x, _graph())


# name -> (build the layer, call it on x): gnnfuse.nn's layers and registered models
NN_LAYERS: dict[str, tuple[Callable[[], nn.Module], Callable]] = {
    "GCNConv": (lambda: gnn.GCNConv(F_IN, CHANNELS), _plain),
    "GATConv-dropout": (lambda: gnn.GATConv(F_IN, CHANNELS, heads=HEADS, dropout=0.5), _plain),
    "GATConv-edge_dim": (lambda: gnn.GATConv(F_IN, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM),
                         lambda layer, x: layer(x, _graph(), _edge_attr())),
    "GATv2Conv-dropout": (lambda: gnn.GATv2Conv(F_IN, CHANNELS, heads=HEADS, dropout=0.5), _plain),
    "GATv2Conv-edge_dim": (lambda: gnn.GATv2Conv(F_IN, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM),
                           lambda layer, x: layer(x, _graph(), _edge_attr())),
    "SAGEConv-mean": (lambda: gnn.SAGEConv(F_IN, CHANNELS), _plain),
    "SAGEConv-max": (lambda: gnn.SAGEConv(F_IN, CHANNELS, aggr="max"), _plain),
    "GINConv": (lambda: gnn.GINConv(_mlp(F_IN), train_eps=True), _plain),
    "GraphConv": (lambda: gnn.GraphConv(F_IN, CHANNELS), _plain),
    "APPNP-dropout": (lambda: gnn.APPNP(K=2, alpha=0.1, dropout=0.5), _plain),
    "SGConv": (lambda: gnn.SGConv(F_IN, CHANNELS, K=2), _plain),
    "TAGConv": (lambda: gnn.TAGConv(F_IN, CHANNELS, K=2), _plain),
    "ChebConv": (lambda: gnn.ChebConv(F_IN, CHANNELS, K=3), _plain),
    "EdgeConv": (lambda: gnn.EdgeConv(_mlp(2 * F_IN)), _plain),
    "RGCNConv": (lambda: gnn.RGCNConv(F_IN, CHANNELS, RELATIONS), lambda layer, x: layer(x, _typed_graph())),
    "RGCNConv-bases": (lambda: gnn.RGCNConv(F_IN, CHANNELS, RELATIONS, num_bases=2),
                       lambda layer, x: layer(x, _typed_graph())),
    "FastRGCNConv": (lambda: gnn.FastRGCNConv(F_IN, CHANNELS, RELATIONS), lambda layer, x: layer(x, _typed_graph())),
    "RGATConv": (lambda: gnn.RGATConv(F_IN, CHANNELS, RELATIONS, heads=HEADS),
                 lambda layer, x: layer(x, EDGE_INDEX, EDGE_TYPE)),
    "HGTConv": (lambda: gnn.HGTConv(F_IN, CHANNELS * HEADS, HETERO_METADATA, heads=HEADS), _hetero),
    "HeteroConv": (lambda: gnn.HeteroConv({t: gnn.SAGEConv(F_IN, CHANNELS) for t in HETERO_EDGES}), _hetero),
    "CGATConv": (lambda: gnn.CGATConv(F_IN, CHANNELS, heads=HEADS), _plain),
    "DotGATConv": (lambda: gnn.DotGATConv(F_IN, CHANNELS, heads=HEADS), _plain),
    "MLPAggConv": (lambda: gnn.MLPAggConv(F_IN, CHANNELS), _plain),
    "NGCFConv": (lambda: gnn.NGCFConv(F_IN, CHANNELS), _plain),
    **{f"model-{name}": ((lambda name=name: gnn.build_model(name, F_IN, 3)), _plain) for name in gnn.model_names()},
    # to_hetero of a model of gnnfuse.nn layers
    "to_hetero": (lambda: gnn.to_hetero(_SageModel(), HETERO_METADATA), _hetero),
}


class _SageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = gnn.SAGEConv((-1, -1), CHANNELS)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index).relu()


def _pyg_layer(name: str) -> tuple[Callable[[], nn.Module], Callable]:
    case = pyg_cases.CONFIGS[name]
    tensors = {key: t.float() for key, t in pyg_cases.inputs("cpu").items()}
    return (lambda: case.make(getattr(gnn, name)),
            lambda layer, x: case.forward(layer, {**tensors, "x": x},
                                          pyg_cases.EDGES))


USER_CLASSES = make_layers(gnn.MessagePassing)


def _user_layer(name: str) -> tuple[Callable[[], nn.Module], Callable]:
    edge_data = {"edge_weighted": torch.rand(len(SRC)), "edge_mlp": torch.randn(len(SRC), 2)}
    extra = (edge_data[name],) if name in edge_data else ()
    return (lambda: USER_CLASSES[name][0](*user_cases.ARGS[name]),
            lambda layer, x: layer(x[:, :3], EDGE_INDEX, *extra))


EXAMPLES = {
    "example-gat_vertex": (lambda: _example("gat_vertex", "GAT")(F_IN, 4, HEADS, 3), _plain),
    "example-gat_message": (lambda: _example("gat_vertex", "GAT")(
        F_IN, 4, HEADS, 3, layer=_example("gat_message", "MessageGATLayer")), _plain),
    "example-custom_attention": (lambda: _example("custom_attention", "Model")(
        F_IN, 4, 3, torch.randn(len(SRC), 1)), _plain),
}

# PyG's eager layers and the user layers that fall back run PyG's propagate: their trace,
# where one is tried, fails the same way every call, so it is tried once
LAYERS = {**NN_LAYERS,
          **{f"pyg-{name}": _pyg_layer(name) for name in (*pyg_cases.COMPILED, *pyg_cases.EAGER)},
          **{f"user-{name}": _user_layer(name) for name in USER_CLASSES},
          **EXAMPLES}
# Layers that trace on every call, each for a reason: name -> traces in the 2nd..5th calls.
RETRACES: dict[str, int] = {
    # message() computes views of its parameters eagerly (``self.mu.view(1, K, D)``): the
    # trace captures those new tensors, which a later call cannot find again, so it traces
    # every call rather than feed a stale view (trace_cache.py: "a tensor made inside the
    # function and captured")
    "pyg-GMMConv": 4,
}


def _x(width: int = F_IN, rows: int = N, grad: bool = False) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(1)).requires_grad_(grad)


def _step(layer: nn.Module, forward: Callable, x: torch.Tensor, training: bool) -> torch.Tensor:
    """One training step's forward + backward, or one evaluation call."""
    layer.train(training)
    if training:
        out = forward(layer, x)
        out.square().sum().backward()
        return out.detach()
    with torch.no_grad():
        return forward(layer, x)


def test_every_layer_is_audited():
    layers = set(gnn.__all__) - {"Hyperparameters", "ModelSpec", "build_model", "get_model", "model_names",
                                 "to_hetero"}
    audited = {name.split("-")[0] for name in NN_LAYERS}
    assert layers <= audited, f"not audited: {sorted(layers - audited)}"


def _skip_on_a_cuda_device(backend: str) -> None:
    """Skip on a GPU machine's Triton backend: the audited layers' inputs are this
    module's CPU tensors, which only Triton's interpreter runs. What is counted, traces,
    does not depend on where the kernels run; CI counts them on the interpreter."""
    if device_for(backend) != "cpu":
        pytest.skip("the audit's inputs are CPU tensors; its Triton cases run in Triton's interpreter")


# on generated kernels too (Triton's interpreter here, slower): a few of each kind
ON_TRITON = ("GCNConv", "GATConv-dropout", "EdgeConv", "pyg-NNConv", "pyg-GENConv", "pyg-TransformerConv",
             "user-edge_mlp", "example-gat_vertex")


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name, backend", [(name, "reference") for name in LAYERS]
                         + [(name, "triton") for name in ON_TRITON])
@pytest.mark.filterwarnings("ignore:.*(runs|running) PyG's")
def test_repeat_calls_trace_nothing(name, backend, training, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    _skip_on_a_cuda_device(backend)
    make, forward = LAYERS[name]
    torch.manual_seed(0)
    layer = make()
    x = _x(grad=training)
    _step(layer, forward, x, training)
    traced = count_traces(monkeypatch)
    for _ in range(4):
        _step(layer, forward, x, training)
    # strict: a layer of RETRACES that stops retracing fails here until taken off the list
    assert len(traced) == RETRACES.get(name, 0), f"{name}: {len(traced)} traces in 4 repeat calls"


# --- a reused trace reads what it baked in afresh ------------------------------------------
def _twins(make: Callable[[type], nn.Module], name: str) -> tuple[nn.Module, nn.Module]:
    """gnnfuse's compiled ``name`` and PyG's, with the same float64 weights."""
    torch.manual_seed(0)
    ours = make(getattr(gnn, name)).double()
    theirs = make(getattr(pyg_nn, name)).double()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _both(ours: nn.Module, theirs: nn.Module, edit: Callable[[nn.Module], None]) -> None:
    with torch.no_grad():
        edit(ours)
        edit(theirs)


def _assert_follows(ours, theirs, forward, edits, traces: int, monkeypatch) -> None:
    """Call both layers, apply each edit to both, call again: gnnfuse gives PyG's output
    and gradients every time, in ``traces`` traces in all."""
    traced = count_traces(monkeypatch)
    x = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for edit in (lambda layer: None, *edits):
        _both(ours, theirs, edit)
        for _ in range(2):
            user_cases.assert_same(*(pyg_cases.run(layer, forward, {"x": x}, EDGE_INDEX) for layer in (ours, theirs)),
                                  rtol=1e-10, atol=1e-10)
    assert len(traced) == traces


def _nnconv(c):
    return c(F_IN, 2, nn.Sequential(nn.Linear(EDGE_DIM, 5), nn.LeakyReLU(0.1), nn.Linear(5, F_IN * 2)))


def _with_edges(layer, t, ei):
    return layer(t["x"], ei, _edge_attr().double())


def _set_slope(layer):
    layer.nn[1].negative_slope = 0.6


def _scale_weight(layer):
    layer.nn[0].weight.mul_(-2.0)


def _new_weight(layer):
    layer.nn[2].weight = nn.Parameter(layer.nn[2].weight.detach() + 0.5)


def test_a_submodule_read_in_message_follows_its_weights_and_settings(monkeypatch):
    """NNConv's message calls self.nn (a Sequential): once traced on every call, now one
    trace serves calls while its weights change in place or are replaced, and a setting
    baked into the program (LeakyReLU's slope) traces afresh."""
    ours, theirs = _twins(_nnconv, "NNConv")
    _assert_follows(ours, theirs, _with_edges, [_scale_weight, _new_weight, _set_slope], 2, monkeypatch)


def _add_lin_edge(layer):
    torch.manual_seed(4)
    layer.lin_edge = pyg_nn.Linear(CHANNELS, CHANNELS).double()


def test_an_attribute_message_probes_with_hasattr_follows_it(monkeypatch):
    """GENConv's message asks hasattr(self, 'lin_edge'): the answer is part of the key,
    so adding the attribute between calls runs the branch PyG's message runs."""
    make = lambda c: c(F_IN, CHANNELS, edge_dim=CHANNELS)
    ours, theirs = _twins(make, "GENConv")
    assert not hasattr(ours, "lin_edge")

    def forward(layer, t, ei):
        return layer(t["x"], ei, torch.linspace(-1, 1, len(SRC) * CHANNELS, dtype=torch.float64).view(-1, CHANNELS))
    _assert_follows(ours, theirs, forward, [_add_lin_edge], 2, monkeypatch)


def test_edge_conv_follows_its_network(monkeypatch):
    """gnnfuse.nn.EdgeConv's vertex function closes over its nn (traced on every call
    before); swapping the activation or editing a weight between calls is followed."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    torch.manual_seed(0)
    net = _mlp(2 * F_IN).double()
    ours, theirs = gnn.EdgeConv(net), pyg_nn.EdgeConv(net)      # one network: edits reach both

    def activation(layer):
        layer.nn[1] = nn.Tanh()
    _assert_follows(ours, theirs, pyg_cases.PLAIN, [lambda layer: net[2].bias.add_(1.0), activation], 2,
                    monkeypatch)


def _helper_layer(Base: type) -> type:
    class Helper(Base):
        """message() probes an attribute with hasattr and calls a method of its own, which
        reads a setting with getattr."""

        def __init__(self):
            super().__init__(aggr="add")
            self.scale = 2.0

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            out = self.scaled(x_j)
            if hasattr(self, "gate"):
                out = out * (-1.0 if self.gate is None else self.gate)
            return out

        def scaled(self, x_j):
            return x_j * getattr(self, "scale", 1.0)
    return Helper


def test_a_method_message_calls_and_an_attribute_it_probes_are_followed(monkeypatch):
    """A setting read only in a helper method (self.scale), and an attribute that
    hasattr(self, 'gate') finds once it is set -- to None first, which is not the same
    as absent -- change between calls: each traces afresh and gives PyG's output, and one
    trace serves the calls between."""
    ours, theirs = _helper_layer(gnn.MessagePassing)(), _helper_layer(pyg_nn.MessagePassing)()

    def set_scale(layer):
        layer.scale = 0.5

    def gate_none(layer):
        layer.gate = None

    def gate_three(layer):
        layer.gate = 3.0
    _assert_follows(ours, theirs, pyg_cases.PLAIN, [set_scale, gate_none, gate_three], 4, monkeypatch)


# --- graphs of many sizes (sampled mini-batches) ---------------------------------------------
def _sized_layer(Base: type) -> type:
    class Sized(Base):
        """message() computes with size_i as a number: a trace bakes it in."""

        def __init__(self):
            super().__init__(aggr="add")

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j, size_i):
            return x_j / size_i
    return Sized


SIZED_CASES = {
    # message takes no size: one trace serves every graph
    "GENConv": (lambda c: c(F_IN, CHANNELS), 1),
    # size_i only goes to softmax(alpha, index, ptr, size_i), which the trace does not read
    "TransformerConv": (lambda c: c(F_IN, CHANNELS, heads=HEADS), 1),
    # size_i read as a number: one trace per vertex count, each the right one (and the
    # first call's trace with a symbolic size_i, which refuses the division)
    "Sized": (lambda c: c(), 6),
}


@pytest.mark.parametrize("name", SIZED_CASES)
def test_graphs_of_every_size_reuse_one_trace_unless_message_reads_the_size(name, monkeypatch):
    make, traces = SIZED_CASES[name]
    if name == "Sized":
        ours, theirs = make(_sized_layer(gnn.MessagePassing)).double(), make(_sized_layer(pyg_nn.MessagePassing))
    else:
        ours, theirs = _twins(make, name)
    traced = count_traces(monkeypatch)
    gen = torch.Generator().manual_seed(6)
    for rows in (10, 11, 12, 13, 14):
        edge_index = torch.randint(0, rows, (2, 3 * rows), generator=gen)
        x = torch.randn(rows, F_IN, dtype=torch.float64, generator=gen)
        runs = [pyg_cases.run(layer, pyg_cases.PLAIN, {"x": x}, edge_index) for layer in (ours, theirs)]
        user_cases.assert_same(*runs, rtol=1e-10, atol=1e-10)
    assert len(traced) == traces


# --- switching between structures ------------------------------------------------------------
def _sizes(layer, forward):
    """Two graphs of 9 and 14 vertices, in evaluation."""
    gen = torch.Generator().manual_seed(7)
    graphs = [(torch.randint(0, rows, (2, 2 * rows), generator=gen), rows) for rows in (N, 14)]

    def call(edge_index, rows):
        layer.eval()
        with torch.no_grad():
            forward(layer, torch.randn(rows, F_IN), edge_index)
    return [lambda g=g: call(*g) for g in graphs]


def _widths(layer, forward):
    def call(width):
        with torch.no_grad():
            forward(layer, torch.randn(N, width), EDGE_INDEX)
    return [lambda w=w: call(w) for w in (F_IN, 3)]


def _modes(layer, forward):
    """Training steps and evaluation calls in turn."""
    return [lambda: _step(layer, lambda m, x: forward(m, x, EDGE_INDEX), _x(grad=True), True),
            lambda: _step(layer, lambda m, x: forward(m, x, EDGE_INDEX), _x(), False)]


def _dropout(layer, forward):
    """Training steps with the layer's dropout off and on in turn."""
    def call(p):
        layer.dropout = p
        _step(layer, lambda m, x: forward(m, x, EDGE_INDEX), _x(grad=True), True)
    return [lambda p=p: call(p) for p in (0.0, 0.5)]


def _on_edges(layer, x, edge_index):
    return layer(x, edge_index)


SWITCHING = {
    "GATConv": (lambda: gnn.GATConv(F_IN, CHANNELS, heads=HEADS, dropout=0.5), (_sizes, _modes, _dropout)),
    "EdgeConv": (lambda: gnn.EdgeConv(nn.Sequential(nn.Linear(2 * F_IN, 5), nn.Dropout(0.5))), (_sizes, _modes)),
    "APPNP": (lambda: gnn.APPNP(K=2, alpha=0.1), (_sizes, _widths)),
    "pyg-TransformerConv": (lambda: gnn.TransformerConv(F_IN, CHANNELS, heads=HEADS, dropout=0.5),
                            (_sizes, _modes, _dropout)),
    "pyg-GENConv": (lambda: gnn.GENConv(F_IN, CHANNELS), (_sizes, _modes)),
    "pyg-SimpleConv": (lambda: gnn.SimpleConv(aggr="max"), (_sizes, _widths)),
    "user-attention": (lambda: USER_CLASSES["attention"][0](F_IN, CHANNELS), (_sizes, _modes, _dropout)),
}


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("name, switch", [(name, switch) for name, (_, switches) in SWITCHING.items()
                                          for switch in switches],
                         ids=lambda v: v if isinstance(v, str) else v.__name__.strip("_"))
def test_switching_keeps_one_trace_per_structure(name, switch, backend, monkeypatch):
    """After one call of each state, calls that switch between them trace nothing."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    _skip_on_a_cuda_device(backend)
    torch.manual_seed(0)
    layer = SWITCHING[name][0]()
    states = switch(layer, _on_edges)
    for state in states:
        state()
    traced = count_traces(monkeypatch)
    for _ in range(2):
        for state in states:
            state()
    assert not traced, f"{len(traced)} traces in {2 * len(states)} calls switching between {len(states)} states"


# a module whose own ``hasattr`` answers by another attribute than the one named: what it
# reads of self is not in the key
_PROBING = {"__name__": "probing"}
exec("def hasattr(obj, name):\n    return obj.switch\n\n"
     "def message(self, x_j):\n    return -x_j if hasattr(self, 'flip') else x_j\n", _PROBING)


def _shadowed_probe_layer(Base: type) -> type:
    class Probing(Base):
        message = _PROBING["message"]

        def __init__(self):
            super().__init__(aggr="add")
            self.switch = False

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)
    return Probing


def test_a_message_calling_its_own_hasattr_follows_what_it_reads(monkeypatch):
    """``hasattr`` rebound in the message's module is not the builtin: what it reads of
    self is unknown, so the trace is not reused (a reuse kept the first call's sign)."""
    ours, theirs = _shadowed_probe_layer(gnn.MessagePassing)(), _shadowed_probe_layer(pyg_nn.MessagePassing)()

    def switch_on(layer):
        layer.switch = True
    _assert_follows(ours, theirs, pyg_cases.PLAIN, [switch_on], 4, monkeypatch)     # every call traces


def test_a_number_changing_every_call_is_warned_about_once(monkeypatch):
    """A Python number a trace reads is a constant of its program: one changed every step
    (an annealed temperature) traced and compiled every step -- and on the cpu and Triton
    backends built kernels kept for the process -- without a word. The cache warns once
    when it has kept `RETRACE_WARNING` traces, naming the function and the fix; the
    results stay right, and a tensor holding the number traces once."""
    import warnings
    from gnnfuse.frontend import trace_cache
    monkeypatch.setattr(trace_cache, "RETRACE_WARNING", 5)

    class Tempered(gnn.MessagePassing):
        def __init__(self):
            super().__init__(aggr="add")
            self.temp = 1.0

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j / self.temp

    layer, x = Tempered(), torch.randn(6, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(8):
            layer.temp = 1.0 + step
            expected = x.new_zeros(6, 3).index_add_(0, ei[1], x[ei[0]] / layer.temp)
            torch.testing.assert_close(layer(x, ei), expected)
    said = [str(w.message) for w in caught if "times: a value the trace reads keeps changing" in str(w.message)]
    assert len(said) == 1 and "Tempered.message 5 times" in said[0] and "torch.tensor(t)" in said[0], said
    kept = sum(sum(cache._kept.values()) for cache in list(trace_cache._ALL))
    for step in range(8):      # a tensor: one trace, fed its value
        layer.temp = torch.tensor(1.0 + step, dtype=torch.float64)
        expected = x.new_zeros(6, 3).index_add_(0, ei[1], x[ei[0]] / layer.temp)
        torch.testing.assert_close(layer(x, ei), expected)
    assert sum(sum(cache._kept.values()) for cache in list(trace_cache._ALL)) - kept == 1


def test_the_retrace_warning_is_shown_at_the_callers_line(monkeypatch):
    """It pointed at gnnfuse/frontend/trace_cache.py (a fixed stacklevel=2); it is now
    shown at the user's line that led there: here their forward's call of propagate."""
    import sys
    import warnings
    from gnnfuse.frontend import trace_cache
    monkeypatch.setattr(trace_cache, "RETRACE_WARNING", 3)

    class Scaled(gnn.MessagePassing):
        def __init__(self):
            super().__init__(aggr="add")
            self.scale = 1.0

        def forward(self, x, edge_index):
            self.line = sys._getframe().f_lineno + 1
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j * self.scale

    layer, x = Scaled(), torch.randn(6, 3, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            layer.scale = 1.0 + step
            layer(x, ei)
    said = [(w.filename, w.lineno) for w in caught if "keeps changing" in str(w.message)]
    assert said == [(__file__, layer.line)]
