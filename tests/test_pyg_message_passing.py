"""`gnnfuse.nn.MessagePassing` against PyG's own base class: the same user layer (one
definition, two bases: `pyg_user_layers.make_layers`) with the same weights must give the
same outputs and gradients in float64, on the reference backend and the Triton
interpreter, and must really run compiled (a compiled program ran, no fallback warning)
-- or, for the layers gnnfuse leaves to PyG, fall back with one warning naming why."""
from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn

import gnnfuse.nn
from gnnfuse.frontend import pyg_message_passing
from gnnfuse.frontend.trace_cache import TraceCache
from gnnfuse.runtime import record_calls
from oracle_check import device_for
from pyg_user_layers import make_layers, scaled_in_a_function

OURS, THEIRS = make_layers(gnnfuse.nn.MessagePassing), make_layers(pyg_nn.MessagePassing)
# 7 vertices (6 isolated), 13 edges with a self loop (3 -> 3) and a multi-edge (1 -> 2
# twice).
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 2, 3, 0, 5, 1],
                      [1, 2, 3, 4, 5, 0, 0, 0, 4, 3, 2, 1, 2]])
NUM_NODES = 7
ARGS = {"edge_weighted": (3, 5), "attention": (3, 4), "edge_mlp": (3, 2), "gin_like": (3, 5), "own_aggregate": (),
        "edge_conv_like": (3, 5), "mean_sage": (3, 5), "min_reverse": (), "untraceable": (),
        "softmax_learnt": (3, 4, {"learn": True, "channels": 4}),
        "softmax_semi_grad": (3, 4, {"t": 0.5, "semi_grad": True})}


def inputs(name: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Node features and the layer's edge data (as forward takes them after edge_index)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_NODES, 3, dtype=torch.float64, generator=gen)
    edge_data = {"edge_weighted": torch.rand(EDGES.shape[1], dtype=torch.float64, generator=gen),
                 "edge_mlp": torch.randn(EDGES.shape[1], 2, dtype=torch.float64, generator=gen)}
    return (x,) + ((edge_data[name],) if name in edge_data else ())


def twins(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The layer on gnnfuse's base and on PyG's, with the same float64 weights."""
    torch.manual_seed(0)
    ours = OURS[name][0](*ARGS[name]).double()
    theirs = THEIRS[name][0](*ARGS[name]).double()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def run(layer: torch.nn.Module, data: tuple[torch.Tensor, ...], edge_index: torch.Tensor = EDGES):
    """Output and the gradients of a fixed projection of it w.r.t. inputs and parameters."""
    data = [t.clone().requires_grad_() for t in data]
    out = layer(data[0], edge_index, *data[1:])
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), data + list(layer.parameters()), allow_unused=True)
    return out.detach(), grads


def assert_same(ours, theirs, rtol: float = 1e-9, atol: float = 1e-10) -> None:
    """Two runs' (output, gradients) agree: each gradient, or both None."""
    (out, grads), (ref, ref_grads) = ours, theirs
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        assert (g is None) == (r is None)
        if r is not None:
            torch.testing.assert_close(g, r, rtol=rtol, atol=atol)


def fallback_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "eager message passing" in str(w.message)]


COMPILED = [name for name, (_, compiles) in OURS.items() if compiles]


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("name", COMPILED)
def test_layer_compiles_and_matches_pyg(name, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)     # the Triton backend runs CUDA tensors on a GPU machine
    ours, theirs = (layer.to(device) for layer in twins(name))
    data = tuple(t.to(device) for t in inputs(name))
    edge_index = EDGES.to(device)
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, data, edge_index)
    assert not fallback_warnings(caught), fallback_warnings(caught)
    assert calls, "no compiled program ran: the layer fell back silently"
    assert_same(result, run(theirs, data, edge_index))


@pytest.mark.parametrize("name, construct", [("own_aggregate", "overrides aggregate() (line"),
                                             ("untraceable", ".cumsum() has no gnnfuse op")])
def test_untraceable_layer_falls_back_once_naming_the_construct(name, construct):
    ours, theirs = twins(name)
    data = inputs(name)
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        first = run(ours, data)
        second = run(ours, data)
    messages = fallback_warnings(caught)
    assert len(messages) == 1 and construct in messages[0], messages
    assert "pyg_user_layers.py" in messages[0]
    if name == "untraceable":
        assert "return x_j.cumsum(-1)" in messages[0]       # the offending line, quoted
    assert not calls
    reference = run(theirs, data)
    assert_same(first, reference)
    assert_same(second, reference)


def test_a_layer_without_source_overriding_aggregate_falls_back_as_pyg_runs_it():
    """Naming the overriding aggregate() read its source, and a class exec'd from a string
    (a REPL, ``python -c``) has none: the call died with inspect's "OSError: could not get
    source code" where PyG's layer runs. It falls back, naming the line and file."""
    source = ("class Own(Base):\n"
              "    def __init__(self):\n        super().__init__(aggr='add')\n"
              "    def forward(self, x, edge_index):\n        return self.propagate(edge_index, x=x)\n"
              "    def message(self, x_j):\n        return x_j * 2\n"
              "    def aggregate(self, inputs, index, ptr=None, dim_size=None):\n"
              "        return super().aggregate(inputs, index, ptr, dim_size) * 3\n")
    ours, theirs = {"Base": gnnfuse.nn.MessagePassing}, {"Base": pyg_nn.MessagePassing}
    exec(source, ours)
    exec(source, theirs)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ours["Own"]()(x, EDGES)
    assert any("Own overrides aggregate() (line 8 of <string>)" in m for m in fallback_warnings(caught))
    torch.testing.assert_close(got, theirs["Own"]()(x, EDGES), rtol=0, atol=1e-12)

def test_a_fallback_warns_once_per_cause_not_once_per_class():
    """A class warned about one cause (decomposed_layers on one layer) stayed silent about
    another (a hook on a second layer of the class); each cause now warns once, a
    100-step loop once, and bipartite sizes changing every step count as one cause. Both
    fallbacks give PyG's numbers, outputs and gradients, in float64."""
    class Weighted(gnnfuse.nn.MessagePassing):
        def __init__(self, **kwargs):
            super().__init__(aggr="add", **kwargs)

        def forward(self, x, edge_index, w, size=None):
            return self.propagate(edge_index, x=x, w=w, size=size)

        def message(self, x_j, w):
            return x_j * w.view(-1, 1)

    class PyGWeighted(pyg_nn.MessagePassing):
        def forward(self, x, edge_index, w):
            return self.propagate(edge_index, x=x, w=w)

        def message(self, x_j, w):
            return x_j * w.view(-1, 1)

    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 6, (2, 20), generator=gen)
    x = torch.randn(6, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(20, dtype=torch.float64, generator=gen, requires_grad=True)
    split, hooked, plain = Weighted(decomposed_layers=2), Weighted(), Weighted()
    hooked.register_propagate_forward_hook(lambda module, inputs, out: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(100):
            outs = [split(x, edge_index, w), hooked(x, edge_index, w)]
        for rows in range(7, 11):       # bipartite: a mini-batch's sizes
            plain(x, edge_index, w, size=(6, rows))
    messages = fallback_warnings(caught)
    assert len(messages) == 3, messages
    assert "decomposed_layers=2" in messages[0] and "registered hooks" in messages[1], messages
    assert "bipartite" in messages[2], messages
    expected = PyGWeighted(aggr="add")(x, edge_index, w)
    for out in outs:
        got = torch.autograd.grad(out, (x, w), torch.ones_like(out))
        want = torch.autograd.grad(expected, (x, w), torch.ones_like(expected), retain_graph=True)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, rtol=0, atol=1e-12)



def test_a_fallback_class_made_in_a_loop_is_freed_with_its_closure():
    """The once-per-class warning record (`message_passing._WARNED`) held every class that
    fell back, strongly: a sweep defining its layer class in a loop (here a hook forces
    PyG's propagate) kept all 20 classes, and the [1000, 100] tensor each one's message
    closed over, alive for good. The record now lets a class go with its last layer."""
    import gc
    import weakref

    refs = []
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(20):
            cls, scale = scaled_in_a_function(gnnfuse.nn.MessagePassing)
            layer = cls()
            layer.register_propagate_forward_hook(lambda module, inputs, out: None)
            layer(torch.randn(3, 4), edge_index)
            refs += [weakref.ref(cls), weakref.ref(scale)]
            del cls, scale, layer
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0

def count_traces(monkeypatch) -> list[int]:
    traced = []
    real = pyg_message_passing.trace_message

    def counting(*args, **kwargs):
        traced.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(pyg_message_passing, "trace_message", counting)
    monkeypatch.setattr(pyg_message_passing, "_TRACES", TraceCache())   # nothing traced yet
    return traced


def test_trace_is_reused_and_guarded_by_the_scalars_message_reads(monkeypatch):
    """The attention message reads self.negative_slope, self.dropout and self.training:
    one trace serves repeated calls, and changing one of them traces afresh (a stale
    program would keep the old slope)."""
    traced = count_traces(monkeypatch)
    ours, theirs = twins("attention")
    data = inputs("attention")
    for _ in range(3):
        assert_same(run(ours, data), run(theirs, data))
    assert len(traced) == 1
    ours.negative_slope = theirs.negative_slope = 0.7
    assert_same(run(ours, data), run(theirs, data))
    ours.eval(), theirs.eval()
    assert_same(run(ours, data), run(theirs, data))
    assert len(traced) == 3


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_in_place_edited_edge_index_is_not_served_stale(backend, monkeypatch):
    """Both backends: the reference one reads the index arrays themselves, the Triton one
    a CSR layout built from them, which a cache keyed without the tensor's version
    would serve stale."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    ours, theirs = (layer.to(device) for layer in twins("edge_conv_like"))
    data = tuple(t.to(device) for t in inputs("edge_conv_like"))
    edge_index = EDGES.to(device).clone()
    assert_same(run(ours, data, edge_index), run(theirs, data, edge_index))
    edge_index[1, :4] = torch.tensor([6, 6, 5, 0], device=device)     # rewire four edges in place
    after = run(ours, data, edge_index)
    assert_same(after, run(theirs, data, edge_index))
    assert not torch.allclose(after[0], run(theirs, data, EDGES.to(device))[0])


def test_graph_data_read_outside_the_arguments_falls_back():
    """A per-edge tensor message() reads off the module (not passed to propagate) could
    be traced as one shared value; gnnfuse must leave it to PyG rather than guess."""
    def build(base):
        class Masked(base):
            def __init__(self):
                super().__init__(aggr="add")
                self.mask = torch.linspace(0, 1, EDGES.shape[1], dtype=torch.float64).view(-1, 1)

            def forward(self, x, edge_index):
                return self.propagate(edge_index, x=x)

            def message(self, x_j):
                return x_j * self.mask
        return Masked()
    ours, theirs = build(gnnfuse.nn.MessagePassing), build(pyg_nn.MessagePassing)
    data = inputs("untraceable")
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, data)
    assert not calls and "to propagate() as a keyword argument" in fallback_warnings(caught)[0]
    assert_same(result, run(theirs, data))


def test_pyg_features_fall_back_to_pyg_semantics():
    """Hooks and bipartite sizes run PyG's propagate; explain mode toggled back off
    compiles again (PyG swaps propagate implementations when it toggles)."""
    ours, theirs = twins("mean_sage")
    data = inputs("mean_sage")
    seen = []
    handle = ours.register_message_forward_hook(lambda module, inputs, out: seen.append(out.shape))
    with warnings.catch_warnings(record=True), record_calls() as calls:
        warnings.simplefilter("always")
        assert_same(run(ours, data), run(theirs, data))
    assert seen == [torch.Size([EDGES.shape[1], 3])] and not calls
    handle.remove()
    ours.explain = True
    ours.explain = False
    with record_calls() as calls:
        assert_same(run(ours, data), run(theirs, data))
    assert calls

    x_src, x_dst = torch.randn(8, 3, dtype=torch.float64), torch.randn(NUM_NODES, 3, dtype=torch.float64)
    edge_index = torch.tensor([[0, 7, 3, 5], [1, 6, 0, 1]])
    with warnings.catch_warnings(record=True), record_calls() as calls:
        warnings.simplefilter("always")
        out = ours.propagate(edge_index, x=(x_src, x_dst))
    assert not calls
    torch.testing.assert_close(out, theirs.propagate(edge_index, x=(x_src, x_dst)))


def test_complex_features_fall_back_to_pyg_with_its_gradients():
    """A complex ``x`` was traced, and its gradients lacked the conjugates torch's complex
    autograd takes (5.6 off PyG's for ``x_i * x_j``); now the trace refuses it, so PyG's
    propagate runs it."""
    class Product(gnnfuse.nn.MessagePassing):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_i, x_j):
            return x_i * x_j

    x = torch.randn(NUM_NODES, 3, dtype=torch.complex128)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    with pytest.warns(UserWarning, match="complex values are not compiled"):
        out = Product()(ours, EDGES)
    src, dst = EDGES
    expected = torch.zeros_like(x).index_add(0, dst, theirs[src] * theirs[dst])
    torch.testing.assert_close(out, expected)
    out.abs().sum().backward()
    expected.abs().sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)


def test_is_a_pyg_message_passing_module():
    layer = OURS["gin_like"][0](3, 5)
    assert isinstance(layer, pyg_nn.MessagePassing)
    assert "GINLike" in repr(layer)


def softmax_by_module(base, size=None, full_path=False):
    """Attention written with ``torch_geometric.utils.softmax`` reached through the module
    (a closure variable here) or the package (``full_path``), propagating with an
    explicit ``size``."""
    import torch_geometric
    import torch_geometric.utils as pyg_utils

    class ModuleSoftmax(base):
        def __init__(self):
            super().__init__(aggr="add")

        def forward(self, x, edge_index, score):
            return self.propagate(edge_index, x=x, score=score, size=size)

        def message(self, x_j, score, index, size_i):
            if full_path:
                return x_j * torch_geometric.utils.softmax(score, index, num_nodes=size_i)
            return x_j * pyg_utils.softmax(score, index, num_nodes=size_i)
    return ModuleSoftmax()


@pytest.mark.parametrize("form", ["tensor", "size", "size_tensor", "edge_index_class", "no_edges", "full_path"])
def test_pyg_input_forms_compile(form):
    """``utils.softmax`` through the module or the package (which fell back to eager with
    a warning about a ``.detach()`` the user never wrote), ``size=(N, N)`` (as a tuple or
    a tensor, which fell back as 'bipartite': its two 0-dim tensors are two objects), PyG's
    ``EdgeIndex`` and a graph without edges all run compiled and match PyG."""
    from torch_geometric import EdgeIndex
    size = {"size": (NUM_NODES, NUM_NODES), "size_tensor": torch.tensor([NUM_NODES, NUM_NODES])}.get(form)
    full = form == "full_path"
    ours = softmax_by_module(gnnfuse.nn.MessagePassing, size, full)
    theirs = softmax_by_module(pyg_nn.MessagePassing, size, full)
    edge_index = EDGES[:, :0] if form == "no_edges" else EDGES
    x, score = torch.randn(NUM_NODES, 3, dtype=torch.float64), torch.randn(edge_index.shape[1], 1, dtype=torch.float64)
    if form == "edge_index_class":
        edge_index = EdgeIndex(EDGES, sparse_size=(NUM_NODES, NUM_NODES)).sort_by("col")[0]
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, (x, score), edge_index)
    assert calls and not fallback_warnings(caught), fallback_warnings(caught)
    assert_same(result, run(theirs, (x, score), edge_index))


def test_sparse_adjacency_runs_pyg_semantics():
    ours, theirs = twins("mean_sage")
    x = inputs("mean_sage")[0]
    adj_t = torch.sparse_coo_tensor(EDGES.flip(0), torch.ones(EDGES.shape[1], dtype=torch.float64),
                                    (NUM_NODES, NUM_NODES)).coalesce()
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        out = ours(x, adj_t)
    assert not calls and "edge_index given as Tensor (torch.sparse_coo)" in fallback_warnings(caught)[0]
    torch.testing.assert_close(out, theirs(x, adj_t))


def test_without_pyg_only_message_passing_is_unavailable(monkeypatch):
    """PyG is optional: gnnfuse.nn loads MessagePassing (the one thing needing PyG) on
    first use, and without PyG that use says what to install."""
    monkeypatch.setitem(sys.modules, "torch_geometric.nn", None)      # as if not installed
    monkeypatch.delitem(sys.modules, "gnnfuse.nn.message_passing")
    with pytest.raises(ImportError, match="extends PyG's base class and needs torch_geometric: pip install"):
        gnnfuse.nn.MessagePassing


def test_edge_only_messages_size_the_output_by_the_largest_target():
    """No node tensor: PyG gives one row per vertex up to the largest target, while the
    sources may go beyond it."""
    def build(base):
        class EdgeOnly(base):
            def forward(self, edge_attr, edge_index):
                return self.propagate(edge_index, edge_attr=edge_attr)

            def message(self, edge_attr):
                return torch.sigmoid(edge_attr) * 2
        return EdgeOnly(aggr="mean")
    edge_index = torch.tensor([[0, 6, 5, 6], [1, 3, 1, 0]])
    edge_attr = torch.randn(4, 3, dtype=torch.float64)
    ours, theirs = build(gnnfuse.nn.MessagePassing), build(pyg_nn.MessagePassing)
    with record_calls() as calls:
        result = run(ours, (edge_attr,), edge_index)
    assert calls and result[0].shape == (4, 3)
    assert_same(result, run(theirs, (edge_attr,), edge_index))


def scaled_message_layer(Base: type) -> type:
    """A layer whose message reads a parameter directly (``x_j * self.scale``)."""
    class ScaledMessage(Base):
        def __init__(self):
            super().__init__(aggr="add")
            self.scale = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j * self.scale
    return ScaledMessage


def test_a_parameter_read_in_message_reuses_the_trace_and_its_current_value(monkeypatch):
    """``self.scale`` is a captured program parameter: later calls reuse the trace and
    feed the parameter as it is now -- edited in place by an optimizer, or replaced."""
    traced = count_traces(monkeypatch)
    torch.manual_seed(0)
    ours, theirs = scaled_message_layer(gnnfuse.nn.MessagePassing)(), scaled_message_layer(pyg_nn.MessagePassing)()
    x = torch.randn(NUM_NODES, 3, dtype=torch.float64)

    def same():
        theirs.load_state_dict(ours.state_dict())
        assert_same(run(ours, (x,)), run(theirs, (x,)))
    same()
    with torch.no_grad():
        ours.scale.mul_(-2.0)
    same()
    ours.scale = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    same()
    assert len(traced) == 1


def in_place_residual(Base: type, variant: str) -> type:
    """A message that writes a value in place and reads it again through another name:
    PyG's eager run sees the write everywhere (``h + act(h)`` is ``2 relu(h)``)."""
    class InPlaceResidual(Base):
        def __init__(self):
            super().__init__(aggr="add")
            self.lin = torch.nn.Linear(3, 3)
            self.act = torch.nn.ReLU(inplace=True)

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_i, x_j):
            h = self.lin(x_j - x_i)
            if variant == "module":
                return h + self.act(h)
            if variant == "positional":
                return torch.nn.functional.leaky_relu(h, 0.2, True) + h
            m = h
            m += x_i
            return m + h
    InPlaceResidual.__name__ = InPlaceResidual.__qualname__ = f"InPlaceResidual_{variant}_{Base.__module__.split('.')[0]}"
    return InPlaceResidual


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("variant", ["module", "positional", "iadd"])
def test_in_place_ops_in_message_write_every_name_bound_to_the_value(variant, backend, monkeypatch):
    """``ReLU(inplace=True)``, ``leaky_relu(h, 0.2, True)`` and ``m += ...`` were traced
    as out-of-place ops: the other name kept the old value, and the compiled layer gave
    ``h + relu(h)`` where PyG gives ``2 relu(h)`` (up to 1.3 off, gradients too), silently."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(0)
    ours = in_place_residual(gnnfuse.nn.MessagePassing, variant)().double().to(device)
    theirs = in_place_residual(pyg_nn.MessagePassing, variant)().double().to(device)
    theirs.load_state_dict(ours.state_dict())
    data = (torch.randn(NUM_NODES, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device),)
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, data, EDGES.to(device))
    assert calls and not fallback_warnings(caught)
    assert_same(result, run(theirs, data, EDGES.to(device)))


def stop_gradient_attention(Base: type) -> type:
    """``softmax`` under ``torch.no_grad()`` in message (a stop-gradient attention), and a
    ``try/except`` around an op gnnfuse refuses: PyG's eager semantics are the answer."""
    from torch_geometric.utils import softmax

    class StopGradientAttention(Base):
        def __init__(self):
            super().__init__(aggr="add", node_dim=0)

        def forward(self, x, edge_index, a):
            return self.propagate(edge_index, x=x, a=a)

        def message(self, x_j, a_j, index, ptr, size_i):
            with torch.no_grad():
                alpha = softmax(a_j, index, ptr, size_i)
            try:
                gate = torch.where(x_j > 0, 1.0, 0.5)
            except Exception:
                gate = 1.0
            return x_j * alpha.view(-1, 1) * gate
    StopGradientAttention.__name__ = StopGradientAttention.__qualname__ = \
        f"StopGradientAttention_{Base.__module__.split('.')[0]}"
    return StopGradientAttention


def test_no_grad_and_caught_errors_in_message_run_pyg_semantics():
    """Both were compiled as the trace saw them: the softmax got a gradient (0.09 where
    PyG has none), and the except branch ran where PyG's torch.where does not fail."""
    x = torch.randn(NUM_NODES, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).requires_grad_()
    results = []
    for Base in (gnnfuse.nn.MessagePassing, pyg_nn.MessagePassing):
        a = torch.linspace(-1, 1, NUM_NODES, dtype=torch.float64).requires_grad_()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = stop_gradient_attention(Base)()(x, EDGES, a)
        results.append((out, torch.autograd.grad(out.sum(), a, allow_unused=True)[0], fallback_warnings(caught)))
    (ours, our_grad, warned), (theirs, their_grad, _) = results
    assert warned and "torch.no_grad()" in warned[0]
    torch.testing.assert_close(ours, theirs)
    assert our_grad is None and their_grad is None


def integer_messages(Base: type) -> type:
    class IntegerMessages(Base):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j.long()
    return IntegerMessages


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("aggr", ["mean", "add", "max"])
def test_integer_messages_aggregate_as_pyg_does(aggr, backend, monkeypatch):
    """PyG's mean of integer messages is their float mean; the compiled Reduce kept the
    dtype and rounded down (2 where PyG gives 2.5, -2 for -1.6667), silently. And an
    ``x`` that requires grad made every compiled form raise "program has no outputs"
    (a backward built for integer outputs), where PyG returns the integer aggregate."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    x = torch.tensor([[1.0], [4.0], [-2.0], [-3.0]], dtype=torch.float64, device=device).requires_grad_()
    edge_index = torch.tensor([[0, 1, 2, 3, 3], [2, 2, 0, 0, 0]], device=device)
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        ours = integer_messages(gnnfuse.nn.MessagePassing)(aggr=aggr)(x, edge_index)
    theirs = integer_messages(pyg_nn.MessagePassing)(aggr=aggr)(x, edge_index)
    assert ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs)
    assert bool(calls) == (aggr != "mean")
    assert any("over torch.int64 messages" in w for w in fallback_warnings(caught)) == (aggr == "mean")


def grad_mode_branch(Base: type) -> type:
    class GradModeBranch(Base):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j * 2 if torch.is_grad_enabled() else x_j
    return GradModeBranch


def test_trace_from_a_training_call_is_not_served_under_no_grad(monkeypatch):
    """The trace cache's key left out the gradient mode: the training call's trace (x_j * 2)
    was served under torch.no_grad(), giving twice PyG's output (its eager message takes
    the other branch)."""
    count_traces(monkeypatch)
    ours, theirs = grad_mode_branch(gnnfuse.nn.MessagePassing)(), grad_mode_branch(pyg_nn.MessagePassing)()
    x = inputs("untraceable")[0]
    with record_calls() as calls:
        torch.testing.assert_close(ours(x, EDGES), theirs(x, EDGES))
        with torch.no_grad():
            torch.testing.assert_close(ours(x, EDGES), theirs(x, EDGES))
        torch.testing.assert_close(ours(x, EDGES), theirs(x, EDGES))
    assert len(calls) == 3


def test_autocast_runs_pyg_semantics():
    """Under torch.autocast the MLP inside message was traced in float32, where PyG's runs
    in bfloat16: outputs 0.009 apart (a Linear message: float32 where PyG returns
    bfloat16), silently."""
    ours, theirs = twins("edge_mlp")
    ours, theirs = ours.float(), theirs.float()
    x, edge_attr = (t.float() for t in inputs("edge_mlp"))
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ours(x, EDGES, edge_attr)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = theirs(x, EDGES, edge_attr)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)
    assert not calls and "torch.autocast" in fallback_warnings(caught)[0]


def in_place_update(Base: type, aggr: str) -> type:
    """An ``update`` adding the root features in place (``aggr_out += x``) after a softmax:
    PyG's ``aggr="softmax"``, or PyG's ``softmax`` inside ``message`` under a sum."""
    from torch_geometric.utils import softmax

    class InPlaceUpdate(Base):
        def __init__(self):
            super().__init__(aggr=aggr, aggr_kwargs={"learn": True} if aggr == "softmax" else None)
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j, x_i, index, ptr, size_i):
            h = self.lin(x_j)
            if aggr == "softmax":
                return h
            return h * softmax((h * x_i).sum(-1, keepdim=True), index, ptr, size_i)

        def update(self, aggr_out, x):
            aggr_out += x
            return aggr_out
    return InPlaceUpdate


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("aggr", ["softmax", "add"])
def test_update_writing_a_softmax_aggregate_in_place_matches_pyg(aggr, backend, monkeypatch):
    """The softmax-weighted sum's backward reads the aggregate back
    (autodiff/softmax_sum.py), so ``aggr_out += x`` in update() made it raise torch's
    "modified by an inplace operation ... output 0 of _ProgramFunction" at backward, where
    PyG's layer computes the gradient."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(0)
    ours = in_place_update(gnnfuse.nn.MessagePassing, aggr)().double().to(device)
    theirs = in_place_update(pyg_nn.MessagePassing, aggr)().double().to(device)
    theirs.load_state_dict(ours.state_dict())
    data = (inputs("untraceable")[0].to(device),)
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, data, EDGES.to(device))
    assert calls and not fallback_warnings(caught)
    assert_same(result, run(theirs, data, EDGES.to(device)))


def test_softmax_aggregate_written_in_place_after_the_call_names_the_cause():
    """Written in place outside update() (in forward, after propagate), the aggregate the
    backward reads back is gone: the error says so and how to write it instead."""
    layer, _ = twins("softmax_learnt")
    out = layer(inputs("softmax_learnt")[0].requires_grad_(), EDGES)
    out.mul_(2.0)
    with pytest.raises(RuntimeError, match=rf"^an output of {type(layer).__name__}'s gnnfuse program was modified "
                                           r"in place after the call.*out = out \+ x"):
        out.sum().backward()


def edge_attr_written_in_place(Base: type) -> type:
    class EdgeAttrWritten(Base):
        def forward(self, x, edge_index, edge_attr):
            return self.propagate(edge_index, x=x, edge_attr=edge_attr)

        def message(self, x_j, edge_attr):
            edge_attr += 1.0
            return x_j * edge_attr
    return EdgeAttrWritten


def test_message_writing_its_edge_argument_in_place_runs_pyg_semantics():
    """PyG hands message() the very edge_attr given to propagate(), so ``edge_attr += 1``
    writes the caller's tensor and a second call reads 3 where the first read 2; the
    compiled call wrote only its traced copy (2 both times, edge_attr untouched)."""
    x = torch.ones(NUM_NODES, 1, dtype=torch.float64)
    results = []
    for Base in (gnnfuse.nn.MessagePassing, pyg_nn.MessagePassing):
        edge_attr = torch.ones(EDGES.shape[1], 1, dtype=torch.float64)
        layer = edge_attr_written_in_place(Base)()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = [layer(x, EDGES, edge_attr) for _ in range(2)]
        results.append((outs, edge_attr, fallback_warnings(caught)))
    (ours, our_attr, warned), (theirs, their_attr, _) = results
    for out, expected in zip(ours, theirs):
        torch.testing.assert_close(out, expected)
    torch.testing.assert_close(our_attr, their_attr)
    assert "in-place op on message()'s argument 'edge_attr'" in warned[0]


def test_a_weight_with_a_row_per_edge_or_node_compiles():
    """A captured tensor with one row per edge or node is taken for graph data read off
    the module (PyG's propagate runs it), but a parameter is a weight: TransformerConv's
    edge projection, [heads * out, edge_dim], on a graph of heads * out edges ran PyG's
    propagate with a warning. Here the weights have 13 and 7 rows (EDGES' and NUM_NODES)."""
    def build(base):
        class Projected(base):
            def __init__(self):
                super().__init__(aggr="add")
                self.down = torch.nn.Linear(3, EDGES.shape[1])
                self.up = torch.nn.Parameter(torch.randn(EDGES.shape[1], NUM_NODES))

            def forward(self, x, edge_index):
                return self.propagate(edge_index, x=x)

            def message(self, x_j):
                return self.down(x_j) @ self.up
        return Projected()
    torch.manual_seed(0)
    ours = build(gnnfuse.nn.MessagePassing).double()
    theirs = build(pyg_nn.MessagePassing).double()
    theirs.load_state_dict(ours.state_dict())
    data = inputs("untraceable")
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, data)
    assert calls and not fallback_warnings(caught)
    assert_same(result, run(theirs, data))


def _scaled_layers(base: type) -> tuple[type, type]:
    """Layers whose message is a classmethod reading a class attribute that an instance
    attribute of the same name shadows, and a staticmethod."""
    class ClassScaled(base):
        scale = 2.0                   # what message reads, through cls

        def __init__(self):
            super().__init__(aggr="add")
            self.scale = 7.0          # the instance's, which message does not read

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        @classmethod
        def message(cls, x_j):
            return cls.scale * x_j

    class StaticScaled(ClassScaled):
        @staticmethod
        def message(x_j):
            return 3.0 * x_j
    return ClassScaled, StaticScaled


def test_class_and_static_message_methods_compile_as_pyg_calls_them(monkeypatch):
    """PyG calls self.message(...), which binds a classmethod to the class and a
    staticmethod to nothing; the trace called message(layer, ...) for both: the
    classmethod read the instance's scale (7) where PyG reads the class's (2), giving
    [14, 0, 7] for [4, 0, 2], and the staticmethod failed and ran eagerly. The class
    attribute, not the instance's, guards the cached trace."""
    traced = count_traces(monkeypatch)
    edge_index, x = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.arange(3.0).view(-1, 1)
    for ours, theirs in zip(_scaled_layers(gnnfuse.nn.MessagePassing), _scaled_layers(pyg_nn.MessagePassing)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")       # no fallback
            with record_calls() as calls:
                torch.testing.assert_close(ours()(x, edge_index), theirs()(x, edge_index))
        assert calls
    assert len(traced) == 2
    class_scaled = _scaled_layers(gnnfuse.nn.MessagePassing)[0]
    torch.testing.assert_close(class_scaled()(x, edge_index), 2 * x[[2, 0, 1]])
    assert len(traced) == 2                   # the same message code and class scale: reused
    class_scaled.scale = 5.0
    torch.testing.assert_close(class_scaled()(x, edge_index), 5 * x[[2, 0, 1]])
    assert len(traced) == 3


def _identity_class(base: type) -> type:
    """A layer on ``base`` whose message is x_j, summed (the instance-attribute tests
    replace one of its methods per instance)."""
    class Identity(base):
        def __init__(self):
            super().__init__(aggr="add")

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j
    return Identity


def test_a_message_set_on_the_instance_is_the_one_traced():
    """PyG's propagate calls self.message, so a message set on the instance (a bound
    method, or a plain function) replaces the class's; the trace read the class's: with
    the class's x_j and the instance's 10 * x_j, compiled gave [2, 0, 1] where PyG gives
    [20, 0, 10]."""
    edge_index, x = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.arange(3.0).view(-1, 1)
    layers = {}
    for base in (gnnfuse.nn.MessagePassing, pyg_nn.MessagePassing):
        Identity = _identity_class(base)
        bound, plain = Identity(), Identity()
        bound.message = types.MethodType(lambda self, x_j: 10 * x_j, bound)
        plain.message = lambda x_j: 5 * x_j
        layers[base] = bound, plain
    for ours, theirs in zip(layers[gnnfuse.nn.MessagePassing], layers[pyg_nn.MessagePassing]):
        with record_calls() as calls:
            torch.testing.assert_close(ours(x, edge_index), theirs(x, edge_index))
        assert calls
    torch.testing.assert_close(layers[pyg_nn.MessagePassing][0](x, edge_index), 10 * x[[2, 0, 1]])


def test_an_aggregate_set_on_the_instance_runs_pyg_semantics():
    """An aggregate() assigned to the instance is the one PyG's propagate calls; only the
    class's was checked, so the compiled sum ran instead of it: [2, 0, 1] where PyG gives
    [6, 0, 3] for three times the sum. It runs eagerly, warning why."""
    edge_index, x = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.arange(3.0).view(-1, 1)
    outs, caught = [], []
    for base in (gnnfuse.nn.MessagePassing, pyg_nn.MessagePassing):
        layer = _identity_class(base)()
        summed = layer.aggregate
        layer.aggregate = lambda inputs, index, ptr=None, dim_size=None: 3 * summed(inputs, index, ptr, dim_size)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            outs.append(layer(x, edge_index))
        caught += [str(w.message) for w in seen]
    torch.testing.assert_close(outs[0], outs[1])
    assert any("aggregate() is set on the instance" in message for message in caught)


def test_update_set_on_the_instance_writing_a_softmax_aggregate_in_place_matches_pyg():
    """The clone that lets update() write the aggregate in place was taken only for an
    update() defined on the class; one assigned to the instance (which PyG's propagate
    calls) made backward raise torch's "modified by an inplace operation" where PyG's layer
    computes the gradient."""
    def add_root_in_place(aggr_out, x):
        aggr_out += x
        return aggr_out
    results = []
    for base in (gnnfuse.nn.MessagePassing, pyg_nn.MessagePassing):
        torch.manual_seed(0)
        layer = in_place_update(base, "softmax")().double()
        del type(layer).update           # the class's update is the base's: the instance's writes in place
        layer.update = add_root_in_place
        results.append(run(layer, inputs("untraceable"), EDGES))
    assert_same(*results)


def _attend(score, index, ptr, size_i):       # a helper of the user's, calling PyG's softmax
    from torch_geometric.utils import softmax
    return softmax(score, index, ptr, size_i)


class _AttentionInAHelper(gnnfuse.nn.MessagePassing):
    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j, index, ptr, size_i):
        return x_j * _attend((x_i * x_j).sum(-1, keepdim=True), index, ptr, size_i)


def test_a_refusal_inside_pyg_code_names_the_users_line_that_called_it():
    """PyG's softmax reached through a helper fell back naming a line of PyG's own code
    (torch_geometric/utils/_scatter.py), not the user's call."""
    layer = _AttentionInAHelper()
    gnnfuse.nn.message_passing._WARNED.pop(type(layer), None)
    x, edge_index = torch.randn(5, 3, dtype=torch.float64), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = layer(x, edge_index)
    messages = fallback_warnings(caught)
    assert len(messages) == 1 and "return softmax(score, index, ptr, size_i)" in messages[0], messages
    assert "torch_geometric" not in messages[0]
    with gnnfuse.nn.message_passing.eagerly(layer):
        torch.testing.assert_close(out, layer(x, edge_index))


def test_an_edge_index_sorted_by_target_runs_what_pyg_runs():
    """PyG hands an ``EdgeIndex`` sorted by column to ``message_and_aggregate`` where the
    class sets ``SUPPORTS_FUSED_EDGE_INDEX``, and passes ``message`` its pointer as
    ``ptr``; the compiled layer took ``message`` with ``ptr=None`` (2x off for layers whose
    paths differ, as these do to show which ran). Both run PyG's eager path now, with a
    warning; an unsorted EdgeIndex still compiles."""
    from torch_geometric import EdgeIndex

    def make(base):
        class Fused(base):
            SUPPORTS_FUSED_EDGE_INDEX = True

            def forward(self, x, edge_index):
                return self.propagate(edge_index, x=x)

            def message(self, x_j):
                return x_j

            def message_and_aggregate(self, edge_index, x):
                return 2 * edge_index.matmul(x, transpose=True)

        class Pointer(base):
            def forward(self, x, edge_index):
                return self.propagate(edge_index, x=x)

            def message(self, x_j, ptr):
                return x_j if ptr is None else 2 * x_j
        return Fused(), Pointer()
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 6, (2, 15), generator=g)
    x = torch.randn(6, 3, generator=g)     # float32: PyG's EdgeIndex.matmul multiplies float32 values
    by_col = EdgeIndex(ei, sparse_size=(6, 6)).sort_by("col")[0]
    for ours, theirs in zip(make(gnnfuse.nn.MessagePassing), make(pyg_nn.MessagePassing)):
        with pytest.warns(UserWarning, match="eager message passing"):
            got = ours(x, by_col)
        torch.testing.assert_close(got, theirs(x, by_col))
    unsorted = EdgeIndex(ei, sparse_size=(6, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(make(gnnfuse.nn.MessagePassing)[1](x, unsorted),
                                   make(pyg_nn.MessagePassing)[1](x, unsorted))


@pytest.mark.parametrize("hook, reason", [
    ("forward", "SumAggregation (the layer's aggr_module) has forward_hooks registered"),
    ("pre", "SumAggregation (the layer's aggr_module) has forward_pre_hooks registered"),
    ("every module", "global module forward_hooks are registered"),
])
def test_a_hook_pyg_runs_on_the_aggregation_module_runs_pyg_propagate(hook, reason, backend, monkeypatch):
    """PyG's propagate calls ``self.aggr_module(...)``, running its hooks (and those on
    every module); the compiled call never calls the module, so a forward hook tripling
    the aggregate left the output 14.1 off PyG's (a pre-hook doubling the messages 2.3
    off), with no warning. They now run PyG's propagate, warning why."""
    from torch.nn.modules import module as torch_module
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    ours, theirs = (layer.to(device) for layer in twins("gin_like"))
    data, edges = tuple(t.to(device) for t in inputs("gin_like")), EDGES.to(device)
    register = {"forward": lambda layer: layer.aggr_module.register_forward_hook(lambda m, args, out: out * 3),
                "pre": lambda layer: layer.aggr_module.register_forward_pre_hook(
                    lambda m, args: (args[0] * 2,) + args[1:]),
                "every module": lambda layer: torch_module.register_module_forward_hook(
                    lambda m, args, out: out * 3 if isinstance(m, pyg_nn.aggr.Aggregation) else None)}[hook]
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    handles = [register(ours)] + ([register(theirs)] if hook != "every module" else [])
    try:
        with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
            warnings.simplefilter("always")
            result = run(ours, data, edges)
        expected = run(theirs, data, edges)
    finally:
        for handle in handles:
            handle.remove()
    assert not calls and reason in fallback_warnings(caught)[0], fallback_warnings(caught)
    assert_same(result, expected)
    with record_calls() as calls:       # the hooks removed: compiled again
        assert_same(run(ours, data, edges), run(theirs, data, edges))
    assert calls


@pytest.mark.parametrize("method", ["reduce", "forward"])
def test_a_method_set_on_the_aggregation_module_runs_pyg_propagate(method, backend, monkeypatch):
    """PyG's propagate calls ``self.aggr_module(...)``, whose forward calls its
    ``reduce``: either set on the instance replaces the class's for that call. The
    compiled call never calls the module, so a ``reduce`` tripling its result left the
    output 18.8 off PyG's (a 9-vertex repro), with no warning (a forward set there was
    refused already). It now runs PyG's propagate, warning which method."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    ours, theirs = (layer.to(device) for layer in twins("gin_like"))
    data, edges = tuple(t.to(device) for t in inputs("gin_like")), EDGES.to(device)
    for layer in (ours, theirs):
        own = getattr(layer.aggr_module, method)
        setattr(layer.aggr_module, method, lambda *args, own=own, **kwargs: own(*args, **kwargs) * 3)
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, data, edges)
    assert not calls and f"has {method} set on the instance" in fallback_warnings(caught)[0]
    assert_same(result, run(theirs, data, edges))
    for layer in (ours, theirs):
        delattr(layer.aggr_module, method)
    with record_calls() as calls:       # the class's method again: compiled again
        assert_same(run(ours, data, edges), run(theirs, data, edges))
    assert calls


def test_a_backward_hook_on_a_module_message_calls_runs_pyg_propagate(backend, monkeypatch):
    """A full backward hook on ``self.edge_mlp``'s first Linear, scaling its input's
    gradient by 5, never ran on the compiled gradients (torch attaches it to the call's
    tensors, which a traced call does not have): the edge features' gradient was 1.46 off
    PyG's, silently. It now runs PyG's propagate, warning why."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    ours, theirs = (layer.to(device) for layer in twins("edge_mlp"))
    data, edges = tuple(t.to(device) for t in inputs("edge_mlp")), EDGES.to(device)
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    for layer in (ours, theirs):
        layer.edge_mlp[0].register_full_backward_hook(lambda m, grad_in, grad_out: (grad_in[0] * 5,))
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, data, edges)
    assert not calls and "Linear has a backward hook (register_full_backward_hook" in fallback_warnings(caught)[0]
    assert "self.edge_mlp(edge_attr)" in fallback_warnings(caught)[0]
    assert_same(result, run(theirs, data, edges))


def test_a_forward_hook_recording_a_module_message_calls_runs_pyg_propagate(backend, monkeypatch):
    """A forward hook keeping the outputs of ``self.edge_mlp``'s first Linear (for
    feature extraction: ``recorded.append(out)``) runs while ``message`` is traced, on
    the tracer's symbolic values: the compiled call left gnnfuse's SymTensor in the list,
    where PyG's holds the Linear's [E, hidden] output, with no warning. The call now runs
    PyG's propagate, warning why, and the list holds PyG's tensors; a hook that only
    scales the output still compiles."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    ours, theirs = (layer.to(device) for layer in twins("edge_mlp"))
    data, edges = tuple(t.to(device) for t in inputs("edge_mlp")), EDGES.to(device)
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    recorded_ours, recorded_theirs = [], []
    handles = [ours.edge_mlp[0].register_forward_hook(lambda module, args, out: recorded_ours.append(out.detach())),
               theirs.edge_mlp[0].register_forward_hook(lambda module, args, out: recorded_theirs.append(out))]
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, data, edges)
    assert not calls and "a forward hook of a module message() calls" in fallback_warnings(caught)[0]
    assert_same(result, run(theirs, data, edges))
    assert [type(t) for t in recorded_ours] == [torch.Tensor]
    torch.testing.assert_close(recorded_ours[0], recorded_theirs[0])
    for handle in handles:
        handle.remove()
    for layer in (ours, theirs):
        layer.edge_mlp[0].register_forward_hook(lambda module, args, out: out * 2)
    with record_calls() as calls:
        assert_same(run(ours, data, edges), run(theirs, data, edges))
    assert calls


def make_index_users(base):
    from torch_geometric.utils import degree

    class IndexAsTensor(base):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j, index):
            return x_j * (index.view(-1, 1).to(x_j.dtype) + 1)

    class SourceDegree(base):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j, edge_index_j, size_j):
            return x_j / degree(edge_index_j, size_j, dtype=x_j.dtype)[edge_index_j].view(-1, 1)
    return {"index": IndexAsTensor, "edge_index_j": SourceDegree}


INDEX_USERS = make_index_users(gnnfuse.nn.MessagePassing), make_index_users(pyg_nn.MessagePassing)


@pytest.mark.parametrize("name, reason", [
    ("index", "message()'s `index` argument (edge indices) is used as a tensor (.view); a compiled message takes "
              "it only as the index of torch_geometric.utils.softmax"),
    ("edge_index_j", "message()'s `edge_index_j` argument (edge indices) is used as a tensor (.device); a compiled "
                     "message takes no edge indices but its target's"),
])
def test_edge_indices_used_as_tensors_name_the_argument_when_falling_back(name, reason):
    """The fallback warning said "'_Marker' object has no attribute 'view'", naming
    neither the argument nor what compiles."""
    ours, theirs = INDEX_USERS[0][name](), INDEX_USERS[1][name]()
    x = inputs("untraceable")
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, x)
    assert not calls and reason in fallback_warnings(caught)[0], fallback_warnings(caught)
    assert "test_pyg_message_passing.py" in fallback_warnings(caught)[0]
    assert_same(result, run(theirs, x))


def test_a_gnnfuse_graph_of_other_counts_than_the_node_tables_is_refused():
    """A gnnfuse `Graph` reached ``propagate`` as its bare edge_index, without its vertex
    counts: a graph of NUM_NODES + 2 vertices (or NUM_NODES + 1 sources) beside x of
    NUM_NODES rows gave NUM_NODES output rows, where gnnfuse's own layers refuse it and PyG
    refuses an EdgeIndex of that sparse size. Its counts are now propagate's size."""
    import gnnfuse
    ours, _ = twins("edge_mlp")
    x, edge_attr = inputs("edge_mlp")
    for graph, expected in ((gnnfuse.Graph.from_edge_index(EDGES, NUM_NODES + 2), NUM_NODES + 2),
                            (gnnfuse.Graph.from_edge_index(EDGES, NUM_NODES, num_src_nodes=NUM_NODES + 1),
                             NUM_NODES + 1)):
        with pytest.raises(ValueError, match=f"Encountered tensor with size {NUM_NODES} in dimension -2, "
                                             f"but expected size {expected}"):
            run(ours, (x, edge_attr), graph)


def test_a_gnnfuse_graph_as_edge_index_runs_as_its_edges():
    """A gnnfuse `Graph` where ``propagate`` takes an ``edge_index`` (a loader block's
    ``block.graph``, which gnnfuse's own layers take, with its ``edge_attr`` rows) fell back
    to PyG's propagate with a warning, which then failed on "`MessagePassing.propagate`
    only supports integer tensors of shape `[2, num_messages]`". A whole graph now
    compiles; a block (bipartite) runs as PyG's layer on the block's edges."""
    from torch_geometric.data import Data

    import gnnfuse
    from gnnfuse.loader import NeighborLoader
    ours, theirs = twins("edge_mlp")
    x, edge_attr = inputs("edge_mlp")
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(ours, (x, edge_attr), gnnfuse.Graph.from_edge_index(EDGES, NUM_NODES))
    assert calls and not fallback_warnings(caught), fallback_warnings(caught)
    assert_same(result, run(theirs, (x, edge_attr)))
    data = Data(x=x, edge_index=EDGES, edge_attr=edge_attr, num_nodes=NUM_NODES)
    for batch in NeighborLoader(data, [-1], batch_size=3, prefetch=0):
        block = batch.blocks[0]
        pair = (batch.x, batch.x[:block.num_dst])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # bipartite: PyG's propagate, with a warning
            out = ours(pair, block.graph, block.edge_attr)
        torch.testing.assert_close(out, theirs(pair, block.edge_index.long(), block.edge_attr))
