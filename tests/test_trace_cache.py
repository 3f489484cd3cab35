"""A cached trace is reused only when a fresh trace would come out the same.

Each test counts traces (by wrapping `Tracer.__init__`) and checks results against a
plain-torch oracle, so a stale program shows up as a wrong number, not just a count.
"""
from __future__ import annotations

import functools
import random
import sys
from random import random as draw_uniform

import numpy
import pytest
import torch

import gnnfuse
from gnnfuse import frontend, nn
from gnnfuse.frontend import tracer as tracer_module
from gnnfuse.frontend.trace_cache import clear_trace_caches

SCALE = 2.0
SETTINGS = {"scale": 2.0}


@pytest.fixture
def traces(monkeypatch):
    """Traces made during the test: the caches start empty, so a trace cached by an
    earlier test (the same layer in another file) is not counted as a reuse."""
    clear_trace_caches()
    count = [0]
    init = tracer_module.Tracer.__init__

    def counting(self, *args, **kwargs):
        count[0] += 1
        init(self, *args, **kwargs)
    monkeypatch.setattr(tracer_module.Tracer, "__init__", counting)
    return count


@pytest.fixture
def graph():
    src = torch.tensor([0, 1, 2, 3, 0, 2])
    dst = torch.tensor([1, 2, 3, 0, 2, 2])
    return gnnfuse.Graph(src, dst, 4)


def neighbour_sum(graph, h):
    return torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src])


def test_repeated_call_traces_once(graph, traces):
    @gnnfuse.vertex
    def f(v):
        return sum([u.h * 3.0 for u in v.innbs])
    h = torch.randn(4, 5, dtype=torch.float64)
    for _ in range(3):
        torch.testing.assert_close(f(graph, {"h": h}), 3.0 * neighbour_sum(graph, h))
    assert traces[0] == 1


def test_new_shape_or_dtype_retraces(graph, traces):
    @gnnfuse.vertex
    def f(v):
        return sum([u.h for u in v.innbs])
    for h in (torch.randn(4, 5), torch.randn(4, 7), torch.randn(4, 7, dtype=torch.float64)):
        torch.testing.assert_close(f(graph, {"h": h}), neighbour_sum(graph, h))
    assert traces[0] == 3


def test_rebound_global_scalar_retraces(graph, traces):
    global SCALE

    @gnnfuse.vertex
    def f(v):
        return sum([u.h * SCALE for u in v.innbs])
    h = torch.randn(4, 3, dtype=torch.float64)
    try:
        torch.testing.assert_close(f(graph, {"h": h}), 2.0 * neighbour_sum(graph, h))
        SCALE = 5.0
        torch.testing.assert_close(f(graph, {"h": h}), 5.0 * neighbour_sum(graph, h))
    finally:
        SCALE = 2.0
    assert traces[0] == 2


def test_closure_constant_is_part_of_the_key(graph, traces):
    """Message/reduce UDFs defined anew in every forward (as GATConv does) share a cache
    entry by code, and a different closure constant gets its own."""
    h = torch.randn(4, 3, dtype=torch.float64)

    def run(factor):
        def message(edges):
            return {"m": edges.src["h"] * factor}

        def reduce(nodes):
            return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
        return frontend.message_passing(graph, message, reduce, ndata={"h": h})["out"]
    for factor in (2.0, 2.0, 3.0, 2.0):
        torch.testing.assert_close(run(factor), factor * neighbour_sum(graph, h))
    assert traces[0] == 2


def test_a_zero_and_a_negative_zero_are_told_apart(graph, traces):
    """-0.0 == 0.0 and they hash alike, but h / -0.0 is -inf: the trace cache's key took
    one for the other, and so did the compiled programs' key (their structure), so the
    second call gave inf where torch gives -inf."""
    h = torch.rand(4, 3, dtype=torch.float64) + 1.0

    def run(zero):
        @gnnfuse.vertex
        def f(v):
            return sum([u.h for u in v.innbs]) / zero
        return f(graph, {"h": h})
    for zero in (0.0, -0.0, 0.0, numpy.float64(-0.0)):      # numpy's float64 is a float: told apart too
        torch.testing.assert_close(run(zero), neighbour_sum(graph, h) / float(zero))
    assert traces[0] == 2


def test_attributes_set_on_a_function_are_part_of_the_key(graph, traces):
    """``helper.k = ...`` (a function's "static variable") changes neither the function's
    identity nor its code: the first call's program was reused for every later value."""
    h = torch.randn(4, 3, dtype=torch.float64)

    def helper(x):
        return x * helper.k

    def message(edges):
        return {"m": helper(edges.src["h"]) * message.scale}
    for k, scale in ((1.0, 2.0), (-3.0, 2.0), (1.0, 5.0), (1.0, 5.0)):
        helper.k, message.scale = k, scale
        out = frontend.message_passing(graph, message, lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)},
                                       ndata={"h": h})["o"]
        torch.testing.assert_close(out, k * scale * neighbour_sum(graph, h))
    assert traces[0] == 3


def test_compiled_structures_are_bounded(graph, monkeypatch):
    """A closure constant is part of a program's structure: an annealed temperature added
    a compiled program per step, kept for good. The oldest are dropped; a program a
    cached trace still holds keeps running."""
    from gnnfuse.runtime import compiled as compiled_module
    monkeypatch.setattr(compiled_module, "_STRUCTURE_LIMIT", 3)
    monkeypatch.setattr(compiled_module, "_BY_STRUCTURE", {})     # (other tests' programs)
    h = torch.randn(4, 3, dtype=torch.float64)
    for tau in (1.0, 0.9, 0.8, 0.7, 0.6, 1.0):
        out = frontend.message_passing(graph, lambda e: {"m": e.src["h"] / tau},
                                       lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": h})["o"]
        torch.testing.assert_close(out, neighbour_sum(graph, h) / tau)
        assert len(compiled_module._BY_STRUCTURE) <= 3


def test_a_function_writing_a_closure_variable_traces_on_every_call(graph, traces):
    """A cached program runs without the Python code, so ``nonlocal sign; sign = -sign``
    stopped flipping once its values repeated a cached key: -1, 1, -1, -1, -1, ..."""
    h = torch.randn(4, 3, dtype=torch.float64)
    sign = 1.0

    def message(edges):
        nonlocal sign
        sign = -sign
        return {"m": edges.src["h"] * sign}
    for expected in (-1.0, 1.0, -1.0, 1.0, -1.0):
        out = frontend.message_passing(graph, message, lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)},
                                       ndata={"h": h})["o"]
        torch.testing.assert_close(out, expected * neighbour_sum(graph, h))
    assert traces[0] == 5


FLIPS = 0


@frontend.vertex
def _flipping_vertex_sum(v):
    global FLIPS
    FLIPS += 1
    return sum([u.h for u in v.innbs]) * (-1.0) ** FLIPS


@frontend.vertex
def _keeping_vertex_sum(v):
    global KEPT
    KEPT = [u.h for u in v.innbs]
    return sum(KEPT)


def test_a_vertex_function_rebinding_a_global_rebinds_its_modules(graph, traces):
    """A vertex function runs on a copy of its globals (holding the counting builtins), so
    ``global FLIPS; FLIPS += 1`` never reached the module: every call traced with FLIPS = 1
    and gave -1, -1, -1 where eager code alternates. A traced value set there is refused,
    naming the line."""
    global FLIPS
    FLIPS = 0
    h = torch.randn(4, 3, dtype=torch.float64)
    for step in range(4):
        expected = (-1.0) ** (step + 1) * neighbour_sum(graph, h)
        torch.testing.assert_close(_flipping_vertex_sum(graph, {"h": h}), expected)
    assert FLIPS == 4 and traces[0] == 4
    with pytest.raises(gnnfuse.CompileError, match=r"sets the global 'KEPT' to a traced value(.|\n)*KEPT = \["):
        _keeping_vertex_sum(graph, {"h": h})
    assert "KEPT" not in globals()


def test_a_function_writing_an_attribute_it_reads_traces_on_every_call(graph, traces):
    """``message.sign = -message.sign`` is part of the key by value, but a cached program
    skips the write: once the key cycled back to 1 its program (traced when the write gave
    -1) ran for good, -1, 1, -1, -1, -1 where eager code alternates. The same for an
    attribute written on a module the function calls."""
    h = torch.randn(4, 3, dtype=torch.float64)

    def message(edges):
        message.sign = -message.sign
        return {"m": edges.src["h"] * message.sign}
    message.sign = 1.0
    scale = torch.nn.Identity()
    scale.factor = 1.0

    def doubling(edges):
        scale.factor = scale.factor * 2.0
        return {"m": scale(edges.src["h"]) * scale.factor}
    for step in range(5):
        out = frontend.message_passing(graph, message, lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)},
                                       ndata={"h": h})["o"]
        torch.testing.assert_close(out, (-1.0) ** (step + 1) * neighbour_sum(graph, h))
    for step in range(3):
        out = frontend.message_passing(graph, doubling, lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)},
                                       ndata={"h": h})["o"]
        torch.testing.assert_close(out, 2.0 ** (step + 1) * neighbour_sum(graph, h))
    assert traces[0] == 8


def test_mutable_global_is_never_cached(graph, traces):
    @gnnfuse.vertex
    def f(v):
        return sum([u.h * SETTINGS["scale"] for u in v.innbs])
    h = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(f(graph, {"h": h}), 2.0 * neighbour_sum(graph, h))
    SETTINGS["scale"] = 4.0
    try:
        torch.testing.assert_close(f(graph, {"h": h}), 4.0 * neighbour_sum(graph, h))
    finally:
        SETTINGS["scale"] = 2.0
    assert traces[0] == 2


def test_captured_closure_tensor_is_fed_anew_on_every_call(graph, traces):
    """A closure tensor becomes a program input: a reused trace feeds whatever tensor the
    closure holds now (rebound, or edited in place), never the one it was traced with."""
    h = torch.randn(4, 3, dtype=torch.float64)
    weight = torch.randn(3, 2, dtype=torch.float64)

    @gnnfuse.vertex
    def f(v):
        return sum([u.h @ weight for u in v.innbs])
    torch.testing.assert_close(f(graph, {"h": h}), neighbour_sum(graph, h @ weight))
    weight = torch.randn(3, 2, dtype=torch.float64)
    torch.testing.assert_close(f(graph, {"h": h}), neighbour_sum(graph, h @ weight))
    weight.mul_(-3.0)
    torch.testing.assert_close(f(graph, {"h": h}), neighbour_sum(graph, h @ weight))
    assert traces[0] == 1
    weight = torch.randn(3, 4, dtype=torch.float64)     # a new shape is a new program
    torch.testing.assert_close(f(graph, {"h": h}), neighbour_sum(graph, h @ weight))
    assert traces[0] == 2


def test_a_tensor_value_read_at_trace_time_retraces(graph, traces):
    """``float(scale)`` bakes the value into the program as a constant: such a trace is
    never reused, so a changed value is honoured."""
    h = torch.randn(4, 3, dtype=torch.float64)
    scale = torch.tensor(2.0, dtype=torch.float64)

    @gnnfuse.vertex
    def f(v):
        return sum([u.h * float(scale) for u in v.innbs])
    torch.testing.assert_close(f(graph, {"h": h}), 2.0 * neighbour_sum(graph, h))
    scale.fill_(5.0)
    torch.testing.assert_close(f(graph, {"h": h}), 5.0 * neighbour_sum(graph, h))
    assert traces[0] == 2


ONES = torch.ones(3)
VALUE_BRANCHES = {
    "torch.equal": lambda flag: 2.0 if torch.equal(flag, ONES) else 1.0,
    "allclose": lambda flag: 2.0 if flag.allclose(ONES) else 1.0,
    "in": lambda flag: 2.0 if 0.0 not in flag else 1.0,
    "is_nonzero": lambda flag: 2.0 if torch.is_nonzero(flag.min()) else 1.0,
    "len(nonzero)": lambda flag: float(len(flag.nonzero())) - 1.0,
    "boolean mask": lambda flag: float(flag[flag > 0].shape[0]) - 1.0,
    "unique": lambda flag: float(flag.unique().numel() == 1) + 1.0,
    "len(where(cond))": lambda flag: float(len(torch.where(flag > 0)[0])) - 1.0,
}


@pytest.mark.parametrize("read", VALUE_BRANCHES)
def test_values_read_through_comparisons_or_value_dependent_shapes_retrace(graph, traces, read):
    """These hand the captured tensor's values to Python too (found by fuzzing: the
    program of the first call was reused after the flag changed)."""
    h = torch.randn(4, 3, dtype=torch.float64)
    flag = torch.ones(3)
    branch = VALUE_BRANCHES[read]

    @gnnfuse.vertex
    def f(v):
        return sum([u.h for u in v.innbs]) * branch(flag)
    torch.testing.assert_close(f(graph, {"h": h}), 2.0 * neighbour_sum(graph, h))
    flag[0] = 0.0
    torch.testing.assert_close(f(graph, {"h": h}), 1.0 * neighbour_sum(graph, h))


def test_closure_tensors_that_were_one_object_and_no_longer_are(graph, traces):
    """Traced with ``a is b`` the program has one parameter for both; once they are two
    tensors it must not feed one of them twice."""
    h = torch.randn(4, 3, dtype=torch.float64)
    a = b = torch.randn(3, dtype=torch.float64)

    def make():
        @gnnfuse.vertex
        def f(v):
            return sum([u.h * a + u.h * b for u in v.innbs])
        return f
    torch.testing.assert_close(make()(graph, {"h": h}), neighbour_sum(graph, h * a + h * b))
    b = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(make()(graph, {"h": h}), neighbour_sum(graph, h * a + h * b))
    assert traces[0] == 2


def test_a_tensor_made_inside_the_function_is_traced_each_call(graph, traces):
    """A tensor the function builds from its closure (``w.t()``) is captured without a
    place to find it again, so the trace is not reused."""
    h = torch.randn(4, 3, dtype=torch.float64)
    w = torch.randn(2, 3, dtype=torch.float64)

    @gnnfuse.vertex
    def f(v):
        return sum([u.h @ w.t() for u in v.innbs])
    for _ in range(2):
        torch.testing.assert_close(f(graph, {"h": h}), neighbour_sum(graph, h @ w.t()))
        w = torch.randn(2, 3, dtype=torch.float64)
    assert traces[0] == 2


def test_called_helper_is_guarded_recursively(graph, traces):
    scale = [2.0]

    def helper(x):
        return x * scale[0]

    @gnnfuse.vertex
    def f(v):
        return sum([helper(u.h) for u in v.innbs])
    h = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(f(graph, {"h": h}), 2.0 * neighbour_sum(graph, h))
    scale[0] = 3.0
    torch.testing.assert_close(f(graph, {"h": h}), 3.0 * neighbour_sum(graph, h))
    assert traces[0] == 2


def test_layers_trace_once_per_structure(graph, traces):
    """The nn layers' UDFs read only their features and scalars, so training steps
    after the first do no tracing."""
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    layers = [nn.GCNConv(6, 3), nn.GATConv(6, 2, heads=2), nn.SAGEConv(6, 3), nn.GATv2Conv(6, 2, heads=2),
              nn.GATv2Conv(6, 2, heads=2, edge_dim=3)]
    attr = torch.randn(graph.num_edges, 3)
    def step(layer):
        edge = (attr,) if getattr(layer, "edge_dim", None) else ()
        layer(x, graph, *edge).sum().backward()
    for layer in layers:
        step(layer)
    first = traces[0]
    for layer in layers:
        step(layer)
    assert traces[0] == first


def test_user_module_attributes_are_never_cached(graph, traces):
    """``settings.scale`` can be rebound without the module changing identity."""
    import types
    settings = types.ModuleType("user_settings")
    settings.scale = 2.0

    @gnnfuse.vertex
    def f(v):
        return sum([u.h * settings.scale for u in v.innbs])
    h = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(f(graph, {"h": h}), 2.0 * neighbour_sum(graph, h))
    settings.scale = 6.0
    torch.testing.assert_close(f(graph, {"h": h}), 6.0 * neighbour_sum(graph, h))
    assert traces[0] == 2


h = torch.zeros(1)   # a global tensor named like the feature the function reads as u.h


def test_attribute_named_like_a_global_does_not_block_reuse(graph, traces):
    """Only names the bytecode loads as globals are guarded, not attribute names."""
    @gnnfuse.vertex
    def f(v):
        return sum([u.h for u in v.innbs])
    x = torch.randn(4, 3, dtype=torch.float64)
    for _ in range(3):
        torch.testing.assert_close(f(graph, {"h": x}), neighbour_sum(graph, x))
    assert traces[0] == 1


def test_a_function_decorated_anew_each_call_reuses_its_trace(graph, traces):
    """Seastar's Figure 3 decorates inside forward; the closure constant still counts."""
    x = torch.randn(4, 3, dtype=torch.float64)

    def forward(factor):
        @gnnfuse.compile(graph, v_feature={"h": x})
        def vc_compute(v):
            return sum([u.h * factor for u in v.innbs])
        return vc_compute()
    for factor in (2.0, 2.0, 2.0, 5.0):
        torch.testing.assert_close(forward(factor), factor * neighbour_sum(graph, x))
    assert traces[0] == 2


# --- values that must not be reused (issue #11 §1.4) -------------------------------------
def _torch_draw():
    return torch.rand(()).item()


def _numpy_draw():
    return float(numpy.random.rand())


def _random_draw():
    return random.random()


def _imported_draw():
    return draw_uniform()


def _library_draw():
    """A draw inside library code: no name of `_IMPURE` in the user's code to find."""
    return float(torch.distributions.Normal(0.0, 1.0).rsample())


def _in_place_draw():
    return float(torch.full((), 0.5).bernoulli_()) + 1.0


@pytest.mark.parametrize("draw", [_torch_draw, _numpy_draw, _random_draw, _imported_draw, _library_draw,
                                  _in_place_draw],
                         ids=["torch.rand.item", "numpy.random.rand", "random.random", "from-random-import",
                              "Normal.rsample", "bernoulli_"])
def test_a_random_draw_at_trace_time_is_drawn_on_every_call(graph, draw):
    """Each call must see its own draw, as eager code would; a cached trace would keep the
    first. The draw is in a helper, so the guard must follow calls to find it. (A message
    function runs once per call in eager code too, so one draw per call is its meaning.)"""
    h = torch.randn(4, 3, dtype=torch.float64)

    def message(edges):
        return {"m": edges.src["h"] * draw()}
    for seed in (1, 2, 3):
        for seed_all in (torch.manual_seed, numpy.random.seed, random.seed):
            seed_all(seed)
        expected = draw() * neighbour_sum(graph, h)
        for seed_all in (torch.manual_seed, numpy.random.seed, random.seed):
            seed_all(seed)
        torch.testing.assert_close(frontend.message_passing(
            graph, message, lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": h})["o"], expected)


@pytest.mark.parametrize("draw", [_torch_draw, _numpy_draw, _random_draw, _imported_draw, _library_draw,
                                  _in_place_draw],
                         ids=["torch.rand.item", "numpy.random.rand", "random.random", "from-random-import",
                              "Normal.rsample", "bernoulli_"])
def test_a_random_draw_in_a_vertex_function_is_refused(graph, draw):
    """Eager code runs a vertex function once per vertex and its neighbour loop once per
    in-edge, each drawing anew; the trace drew once, and every edge of every vertex shared
    that number (``u.h * random.random()`` on 200 vertices and 4,000 edges: one scale for
    all of them), silently."""
    @gnnfuse.vertex
    def scaled(v):
        return sum([u.h * draw() for u in v.innbs])
    for _ in range(2):      # refused again, not served from a cache
        with pytest.raises(gnnfuse.CompileError, match="draws a random number"):
            scaled(graph, {"h": torch.randn(4, 3, dtype=torch.float64)})


@pytest.mark.parametrize("lazy", ["torch", "pyg"])
def test_a_lazy_module_in_a_vertex_function_initialises_once_on_its_first_call(graph, lazy):
    """A lazy module draws its parameters at its first call, once, as eager code does at
    the first vertex; the trace saw the generator move and refused the function as
    drawing a random number per vertex, leaving the module initialised so that the same
    call then worked. Its weights are those eager code draws under the same seed."""
    def make():
        if lazy == "torch":
            return torch.nn.LazyLinear(3, dtype=torch.float64)
        from torch_geometric.nn import Linear
        return Linear(-1, 3).double()
    h = torch.randn(4, 5, dtype=torch.float64)
    torch.manual_seed(0)
    expected = make()
    expected(h[0])
    torch.manual_seed(0)
    lin = make()

    @gnnfuse.vertex
    def projected(v):
        return sum([lin(u.h) for u in v.innbs])
    out = projected(graph, {"h": h})
    torch.testing.assert_close(lin.weight, expected.weight)
    torch.testing.assert_close(out, neighbour_sum(graph, h @ lin.weight.T + lin.bias))


def test_dropout_in_a_vertex_function_draws_per_element(graph):
    """F.dropout on graph values draws its masks at run time, per element: no trace-time draw."""
    @gnnfuse.vertex
    def dropped(v):
        return sum([torch.nn.functional.dropout(u.h, 0.5) for u in v.innbs])
    out = dropped(graph, {"h": torch.ones(4, 64, dtype=torch.float64)})
    assert (out == 0).any() and (out != 0).any()


_DROP = torch.nn.Dropout(0.5)


def _drop_in_loop(v):
    return sum([u.h * _DROP(v.h) for u in v.innbs])


def _drop_by_position(v):
    hs = [u.h for u in v.innbs]
    return sum([hs[i] * _DROP(v.h) for i in range(len(v.innbs))])


def _drop_over_zipped_lists(v):
    hs, gs = [u.h for u in v.innbs], [u.h * 1 for u in v.innbs]
    return sum([h * g * _DROP(v.h) for h, g in zip(hs, gs)])


def _drop_before_loop(v):
    d = _DROP(v.h)
    return sum([u.h * d for u in v.innbs])


@pytest.mark.parametrize("fn, per_edge", [(_drop_in_loop, True), (_drop_by_position, True),
                                          (_drop_over_zipped_lists, True), (_drop_before_loop, False)],
                         ids=["in-the-loop", "range-len", "zip-of-lists", "named-before-the-loop"])
def test_dropout_of_v_in_the_neighbour_loop_draws_per_in_edge(backend, device, fn, per_edge):
    """``u.h * dropout(v.h)`` in the loop over v.innbs (or by position over lists of the
    neighbours): eager code runs the loop's body once per neighbour, each pass drawing a
    fresh mask, so a vertex with two in-edges of ones sums to 0, 2 or 4 per element; the
    one mask drawn for v's row was shared by both in-edges (only 0 or 4). Named before
    the loop, one mask per vertex is eager's too."""
    g = gnnfuse.Graph(torch.tensor([0, 0, 1, 2]), torch.tensor([1, 2, 0, 0]), 3).to(device)
    ones = torch.ones(3, 512, dtype=torch.float64, device=device, requires_grad=True)
    out = gnnfuse.vertex(fn)(g, {"h": ones})
    values = set(out[0].tolist())      # vertex 0: in-edges from 1 and 2
    assert values == ({0.0, 2.0, 4.0} if per_edge else {0.0, 4.0})
    out.sum().backward()       # the backward regenerates each in-edge's mask
    if fn is _drop_in_loop:    # d/dh_0: its in-edges' masks (its sum) plus its out-edges' to 1 and 2
        torch.testing.assert_close(ones.grad[0], out[0] + out[1] + out[2])


def test_an_in_place_dropout_of_v_in_the_neighbour_loop_is_refused(graph):
    """Eager code drops the per-vertex value again in every neighbour's pass, compounding;
    one traced pass cannot say so."""
    @gnnfuse.vertex
    def compounding(v):
        x = v.h * 1.0
        return sum([u.h * torch.nn.functional.dropout(x, 0.5, True, inplace=True) for u in v.innbs])
    with pytest.raises(gnnfuse.CompileError, match="in-place dropout of a per-vertex value"):
        compounding(graph, {"h": torch.ones(4, 3, dtype=torch.float64)})


def test_globals_lookup_by_name_is_never_cached(graph, traces):
    global SCALE

    @gnnfuse.vertex
    def f(v):
        return sum([u.h * globals()["SCALE"] for u in v.innbs])
    h = torch.randn(4, 3, dtype=torch.float64)
    try:
        torch.testing.assert_close(f(graph, {"h": h}), 2.0 * neighbour_sum(graph, h))
        SCALE = 5.0
        torch.testing.assert_close(f(graph, {"h": h}), 5.0 * neighbour_sum(graph, h))
    finally:
        SCALE = 2.0
    assert traces[0] == 2


def test_partial_udf_is_guarded_by_its_bound_arguments(graph, traces):
    h = torch.randn(4, 3, dtype=torch.float64)

    def message(factor, edges):
        return {"m": edges.src["h"] * factor}

    def reduce(nodes, *, op):
        return {"o": op(nodes.mailbox["m"], dim=1)}
    for factor in (2.0, 2.0, 3.0):
        out = frontend.message_passing(graph, functools.partial(message, factor),
                                       functools.partial(reduce, op=torch.sum), ndata={"h": h})["o"]
        torch.testing.assert_close(out, factor * neighbour_sum(graph, h))
    assert traces[0] == 2


def test_gatv2_reused_trace_reads_the_current_attention_vector(graph, traces):
    """GATv2Conv closes over a fresh view of ``att`` on every forward: the reused trace
    must feed the parameter as it is now -- edited in place, or replaced."""
    import torch_geometric.nn as pyg
    torch.manual_seed(0)
    ours = nn.GATv2Conv(6, 2, heads=2).double()
    ref = pyg.GATv2Conv(6, 2, heads=2).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    edge_index = torch.stack([graph.src, graph.dst])

    def same():
        ref.load_state_dict(ours.state_dict())
        torch.testing.assert_close(ours(x, graph), ref(x, edge_index))
    same()
    with torch.no_grad():
        ours.att.mul_(-2.0)
    same()
    ours.att = torch.nn.Parameter(torch.randn_like(ours.att))
    same()
    assert traces[0] == 1


def test_a_remembered_guard_walk_is_redone_when_what_the_function_reads_changes(graph, traces, monkeypatch):
    """A vertex function and a bound UpdateAll keep their guard walk (`GuardMemo`) from the
    second call on; a rebound global, closure variable or default afterwards still
    changes the result, and an unchanged call skips the walk."""
    from gnnfuse.frontend import trace_cache
    global SCALE
    walks = [0]
    real = trace_cache._guards
    monkeypatch.setattr(trace_cache, "_guards", lambda functions: walks.__setitem__(0, walks[0] + 1) or real(functions))
    factor = 3.0

    @gnnfuse.vertex
    def f(v, offset=0.0):
        return sum([u.h * SCALE * factor + offset for u in v.innbs])

    def message(edges):
        return {"m": edges.src["h"] * factor}

    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1) * SCALE}
    update_all = frontend.UpdateAll(message, reduce)
    h = torch.randn(4, 3, dtype=torch.float64)
    total = neighbour_sum(graph, h)
    ones = neighbour_sum(graph, torch.ones_like(h))

    def check(scale, times, offset=0.0):
        torch.testing.assert_close(f(graph, {"h": h}), scale * times * total + offset * ones)
        torch.testing.assert_close(update_all(graph, ndata={"h": h})["out"], scale * times * total)
    try:
        for _ in range(3):
            check(2.0, 3.0)
        walks[0] = 0
        check(2.0, 3.0)
        assert walks[0] == 0, "an unchanged call walked the guards again"
        SCALE = 5.0
        check(5.0, 3.0)
        factor = 7.0
        check(5.0, 7.0)
        f.fn.__defaults__ = (1.0,)
        check(5.0, 7.0, offset=1.0)
    finally:
        SCALE = 2.0


def test_a_closure_variable_not_yet_assigned_traces_until_it_is(graph, traces):
    """A vertex function closing over a variable its enclosing function assigns later
    (a helper defined after it, read on a branch not taken) runs eagerly; the guard walk
    raised ``ValueError: Cell is empty`` on the empty cell instead."""
    h = torch.randn(4, 3, dtype=torch.float64)

    def make():
        @gnnfuse.vertex
        def f(v):
            if use_helper:
                return sum([helper(u) for u in v.innbs])
            return sum([u.h for u in v.innbs])
        use_helper = False
        for _ in range(2):
            torch.testing.assert_close(f(graph, {"h": h}), neighbour_sum(graph, h))
        assert traces[0] == 2, "a function with an empty closure cell was cached"

        def helper(u):
            return u.h * 3.0
        use_helper = True
        for _ in range(2):
            torch.testing.assert_close(f(graph, {"h": h}), 3.0 * neighbour_sum(graph, h))
        assert traces[0] == 3
    make()


def test_a_tensor_written_in_place_from_outside_the_arguments_is_written_on_every_call(graph, traces):
    """A vertex function or message UDF that writes a global tensor in place (a call
    counter, a weight decayed each call) runs the write once per call, as eager code
    does: a kept trace ran it once, so after three calls the counter read 1 (0 for an
    `UpdateAll` of the same functions, whose trace was already cached) and the decayed
    weight kept its first value."""
    calls = torch.zeros((), dtype=torch.float64)
    weight = torch.ones(5, dtype=torch.float64)
    h = torch.randn(4, 5, dtype=torch.float64)

    @gnnfuse.vertex
    def counted(v):
        calls.add_(1)
        return sum([u.h for u in v.innbs])

    @gnnfuse.vertex
    def decayed(v):
        weight.mul_(0.5)
        return sum([u.h * weight for u in v.innbs])

    def message(edges):
        calls.add_(1)
        return {"m": edges.src["h"]}

    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
    update_all = frontend.UpdateAll(message, reduce)
    for run in (lambda: counted(graph, {"h": h}),
                lambda: gnnfuse.message_passing(graph, message, reduce, ndata={"h": h}),
                lambda: update_all(graph, ndata={"h": h})):
        calls.zero_()
        for _ in range(3):
            run()
        assert calls.item() == 3
    for scale in (0.5, 0.25, 0.125):
        torch.testing.assert_close(decayed(graph, {"h": h}), scale * neighbour_sum(graph, h))


def test_a_module_imported_inside_the_function_is_read_on_every_call(graph, traces, monkeypatch):
    """``from config import SCALE`` (or ``import config; config.SCALE``) inside a vertex
    function or message UDF reads a module attribute that no global or closure cell of
    the function holds: the guard walk did not see it, and after ``config.SCALE = 3.0``
    the cached program still gave 2x the sum. Such a function now traces on every call."""
    import types as types_module
    config = types_module.ModuleType("gnnfuse_test_config")
    config.SCALE = 2.0
    monkeypatch.setitem(sys.modules, "gnnfuse_test_config", config)

    @gnnfuse.vertex
    def imported_name(v):
        from gnnfuse_test_config import SCALE
        return sum([u.h * SCALE for u in v.innbs])

    @gnnfuse.vertex
    def imported_module(v):
        import gnnfuse_test_config
        return sum([u.h * gnnfuse_test_config.SCALE for u in v.innbs])

    def message(edges):
        import gnnfuse_test_config as settings
        return {"m": edges.src["h"] * settings.SCALE}

    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
    h = torch.randn(4, 5, dtype=torch.float64)
    for scale in (2.0, 3.0, 5.0):
        config.SCALE = scale
        expected = scale * neighbour_sum(graph, h)
        torch.testing.assert_close(imported_name(graph, {"h": h}), expected)
        torch.testing.assert_close(imported_module(graph, {"h": h}), expected)
        torch.testing.assert_close(gnnfuse.message_passing(graph, message, reduce, ndata={"h": h})["out"], expected)


def test_a_standard_library_module_imported_inside_the_function_keeps_it_cached(graph, traces):
    """Only a user's module is read on every call (above): ``import itertools`` or
    ``import collections`` inside a vertex function names no setting a user edits, and
    such a function stays one trace."""
    @gnnfuse.vertex
    def with_stdlib_imports(v):
        import collections
        import itertools
        del collections, itertools
        return sum([u.h for u in v.innbs])

    h = torch.randn(4, 5, dtype=torch.float64)
    for _ in range(3):
        torch.testing.assert_close(with_stdlib_imports(graph, {"h": h}), neighbour_sum(graph, h))
    assert traces[0] == 1


def test_partial_udf_is_guarded_by_its_bound_keywords(graph, traces):
    """A partial's keyword arguments are part of the key as its positional ones are: a
    changed ``scale=`` or ``op=`` traces again instead of serving the first program."""
    h = torch.randn(4, 3, dtype=torch.float64)

    def message(edges, *, scale):
        return {"m": edges.src["h"] * scale}

    def reduce(nodes, *, op):
        return {"o": op(nodes.mailbox["m"], dim=1)}
    eager_max = torch.full_like(h, -torch.inf).index_reduce_(0, graph.dst, h[graph.src], "amax")
    for scale, op, expected in ((2.0, torch.sum, neighbour_sum(graph, h)), (3.0, torch.sum, neighbour_sum(graph, h)),
                                (3.0, torch.amax, eager_max)):
        out = frontend.message_passing(graph, functools.partial(message, scale=scale),
                                       functools.partial(reduce, op=op), ndata={"h": h})["o"]
        torch.testing.assert_close(out, scale * expected)
    assert traces[0] == 3


def test_a_closure_tensor_of_another_dtype_traces_again(graph, traces):
    """A tensor the function closes over is keyed by its dtype: a float32 weight rebound to
    a float64 one gives the float64 product eager torch gives, not the float32 program's."""
    h = torch.randn(4, 3, dtype=torch.float64)

    def run(w):
        @gnnfuse.vertex
        def f(v):
            return sum([u.h for u in v.innbs]) * w
        return f(graph, {"h": h})
    for w in (torch.tensor(1.1, dtype=torch.float32), torch.tensor(1.1, dtype=torch.float64)):
        out = run(w)
        expected = neighbour_sum(graph, h) * w
        assert out.dtype == expected.dtype
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert traces[0] == 2



def test_a_remembered_guard_walk_sees_a_keyword_default_set_in_place(graph, traces):
    """`GuardMemo` compares what a vertex function read by identity; ``__kwdefaults__`` is a
    dict, changed in place by ``fn.__kwdefaults__["k"] = 5.0`` without a new object, so the
    memo must compare its values or serve the program traced with the old default."""
    @gnnfuse.vertex
    def f(v, *, k=2.0):
        return sum([u.h for u in v.innbs]) * k
    h = torch.randn(4, 3, dtype=torch.float64)
    total = neighbour_sum(graph, h)
    for _ in range(3):
        torch.testing.assert_close(f(graph, {"h": h}), 2.0 * total)
    f.fn.__kwdefaults__["k"] = 5.0
    for _ in range(2):
        torch.testing.assert_close(f(graph, {"h": h}), 5.0 * total)
    assert traces[0] == 2
