"""A vertex function called again as it was just called skips the front end, and only then.

`frontend/repeat_call.py`: after a call that a prepared call ran, the next call on the same
graph object with only a node table goes from the guard check straight to that prepared
call, without the table checks or the trace cache's lookup. Each test changes one thing
the front end decides on -- a global or default the function reads, its code, the
default dtype, the graph, the tables, a cleared trace cache, gradients -- and checks
that the call is not served by the repeat (the trace cache is asked again, or the full
path runs) and that it computes what eager code would.
"""
from __future__ import annotations

import functools

import pytest
import torch

import gnnfuse
from gnnfuse.frontend import trace_cache
from gnnfuse.frontend.trace_cache import clear_trace_caches
from gnnfuse.frontend.vertex import VertexFunction
from gnnfuse.runtime.compiled import record_calls
from oracle_check import device_for

DEVICE = device_for("triton")
SCALE = 2.0


@gnnfuse.vertex
def _neighbour_sum(v):
    return sum([u.h for u in v.innbs])


def _scaled(v):
    return sum([u.h for u in v.innbs]) * SCALE


def _graph(device: str, seed: int = 0, nodes: int = 12, edges: int = 50) -> gnnfuse.Graph:
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, nodes, (edges,), generator=gen), torch.randint(0, nodes, (edges,), generator=gen)
    dst[: edges // 2] = 0       # a hub row, split into segments below
    return gnnfuse.Graph(src, dst, nodes).to(device)


def _features(graph: gnnfuse.Graph, width: int = 3, dtype=torch.float64, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(graph.num_nodes, width, dtype=dtype, generator=gen).to(graph.device)


def _oracle(graph: gnnfuse.Graph, h: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src])


@pytest.fixture
def lookups(monkeypatch):
    """Triton backend, segments of 4 edges; the list of trace-cache lookups, one per call
    the front end handled in full."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setattr("gnnfuse.backend.triton.schedule.SEGMENT_EDGES", 4)
    found = []
    real = trace_cache.TraceCache.compiled

    def counted(self, functions, tables, trace, guards=None):
        found.append(functions)
        return real(self, functions, tables, trace, guards)
    monkeypatch.setattr(trace_cache.TraceCache, "compiled", counted)
    return found


def _check(fn, graph, table, expected, lookups: list, repeat: bool, **kwargs):
    before = len(lookups)
    out = fn(graph, table, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    served = len(lookups) == before
    assert served == repeat, "the call was " + ("served by the repeat" if served else "handled in full")
    return out


def _warm(fn, graph, table, expected, lookups):
    """Full calls until a prepared call is kept, then one served by the repeat."""
    for _ in range(3):
        fn(graph, table)
    assert len(fn._repeats)
    _check(fn, graph, table, expected, lookups, repeat=True)


def test_a_repeated_inference_call_skips_the_front_end(lookups):
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    h2 = _features(graph, seed=5)       # new values, same metadata: still the repeat
    _check(_neighbour_sum, graph, {"h": h2}, _oracle(graph, h2), lookups, repeat=True)


def test_a_rebound_global_is_seen(lookups, monkeypatch):
    fn = gnnfuse.vertex(_scaled)
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(fn, graph, {"h": h}, _oracle(graph, h) * SCALE, lookups)
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    _check(fn, graph, {"h": h}, _oracle(graph, h) * 3.0, lookups, repeat=False)


TEMPERATURE = torch.tensor(2.0)
USE_MEAN = torch.tensor(True)


def _by_value(v):
    return sum([u.h for u in v.innbs]) * TEMPERATURE.item()


def _source_rows(edges):
    return {"m": edges.src["h"]}


def _reduce_by_flag(nodes):
    if USE_MEAN:
        return {"h": nodes.mailbox["m"].mean(1)}
    return {"h": nodes.mailbox["m"].sum(1)}


def test_a_function_reading_a_tensors_value_is_never_repeated(lookups):
    """``.item()`` or ``if t:`` on a reachable tensor: the trace cache traces such a
    function every call, and the repeat reused the first call's program, the value
    baked in (the result kept 2x after the tensor said 4x; a mean after the flag said sum)."""
    graph = _graph(device=DEVICE)
    h = _features(graph)
    fn = gnnfuse.vertex(_by_value)
    for _ in range(3):
        _check(fn, graph, {"h": h}, _oracle(graph, h) * 2.0, lookups, repeat=False)
    TEMPERATURE.fill_(4.0)
    try:
        _check(fn, graph, {"h": h}, _oracle(graph, h) * 4.0, lookups, repeat=False)
    finally:
        TEMPERATURE.fill_(2.0)
    layer = gnnfuse.frontend.message.UpdateAll(_source_rows, _reduce_by_flag)
    degree = torch.bincount(graph.dst, minlength=graph.num_nodes).clamp(min=1).unsqueeze(1).to(h)
    for _ in range(3):
        torch.testing.assert_close(layer(graph, ndata={"h": h})["h"], _oracle(graph, h) / degree)
    USE_MEAN.fill_(False)
    try:
        torch.testing.assert_close(layer(graph, ndata={"h": h})["h"], _oracle(graph, h))
    finally:
        USE_MEAN.fill_(True)


def _doubled(v):
    return sum([u.h for u in v.innbs]) * abs(-2)


def test_a_builtin_shadowed_by_a_new_global_is_seen(lookups, monkeypatch):
    graph = _graph(device=DEVICE)
    h = _features(graph)
    fn = gnnfuse.vertex(_doubled)
    _warm(fn, graph, {"h": h}, _oracle(graph, h) * 2, lookups)
    # `abs` was the builtin when traced; a module-level `abs` now shadows it
    monkeypatch.setitem(globals(), "abs", lambda x: 3)
    _check(fn, graph, {"h": h}, _oracle(graph, h) * 3, lookups, repeat=False)


def test_new_code_is_seen(lookups):
    def body(v):
        return sum([u.h for u in v.innbs])
    fn = gnnfuse.vertex(body)
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(fn, graph, {"h": h}, _oracle(graph, h), lookups)
    body.__code__ = (lambda v: sum([u.h * 2 for u in v.innbs])).__code__
    _check(fn, graph, {"h": h}, _oracle(graph, h) * 2, lookups, repeat=False)


def _keyword_scaled(v, *, scale=2.0):
    return sum([u.h for u in v.innbs]) * scale


def test_a_keyword_default_set_in_place_is_seen(lookups, monkeypatch):
    """``__kwdefaults__`` is a dict, the same object after ``[k] = 3.0``: the repeat's
    identity check passed and the call kept 2x the sum where eager code gives 3x."""
    fn = gnnfuse.vertex(_keyword_scaled)
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(fn, graph, {"h": h}, _oracle(graph, h) * 2.0, lookups)
    monkeypatch.setitem(_keyword_scaled.__kwdefaults__, "scale", 3.0)
    _check(fn, graph, {"h": h}, _oracle(graph, h) * 3.0, lookups, repeat=False)


CLAMP = functools.partial(torch.clamp, max=2.0)


def _clamped(v):
    return CLAMP(sum([u.h for u in v.innbs]))


def test_a_partials_keyword_set_in_place_is_seen(lookups, monkeypatch):
    """A global ``functools.partial`` is the same object after ``.keywords["max"] = 3.0``:
    the repeat's identity check passed and the call kept clamping at 2 where eager code
    clamps at 3."""
    fn = gnnfuse.vertex(_clamped)
    graph = _graph(device=DEVICE)
    h = _features(graph) * 4.0
    _warm(fn, graph, {"h": h}, _oracle(graph, h).clamp(max=2.0), lookups)
    monkeypatch.setitem(CLAMP.keywords, "max", 3.0)
    _check(fn, graph, {"h": h}, _oracle(graph, h).clamp(max=3.0), lookups, repeat=False)


def test_another_graph_dtype_or_table_takes_the_front_end(lookups):
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    other = _graph(seed=3, device=DEVICE)
    _check(_neighbour_sum, other, {"h": h}, _oracle(other, h), lookups, repeat=False)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    h32 = h.float()
    out = _neighbour_sum(graph, {"h": h32})
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _oracle(graph, h32), rtol=1e-5, atol=1e-5)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    wide = _features(graph, width=5)
    _check(_neighbour_sum, graph, {"h": wide}, _oracle(graph, wide), lookups, repeat=False)
    _warm(_neighbour_sum, graph, {"h": wide}, _oracle(graph, wide), lookups)
    # an extra key: the full path checks it (and rejects a non-tensor)
    _check(_neighbour_sum, graph, {"h": wide, "g": wide}, _oracle(graph, wide), lookups, repeat=False)
    with pytest.raises(TypeError, match=r"v_feature\['g'\]"):
        _neighbour_sum(graph, {"h": wide, "g": [1.0]})
    with pytest.raises(TypeError, match=r"v_feature\['h'\]"):
        _neighbour_sum(graph, {"h": [1.0]})
    with pytest.raises(TypeError, match="v_feature must be a dict"):
        _neighbour_sum(graph, [wide])


def test_a_table_of_one_tensor_under_another_name_takes_the_front_end(lookups):
    """A call of one tensor is matched to a repeat by its shape and its key: the prepared
    call takes the tensor alone, so a same-shaped tensor named otherwise must reach the
    full path and its error, not be summed as the repeat's input."""
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    with pytest.raises(gnnfuse.CompileError, match="vertex feature 'h' does not exist"):
        _neighbour_sum(graph, {"x": h})
    _check(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups, repeat=True)


def test_the_default_dtype_is_part_of_the_key(lookups):
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _check(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups, repeat=False)
    finally:
        torch.set_default_dtype(previous)


def test_a_cleared_trace_cache_traces_again(lookups, monkeypatch):
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    traced = []
    real = VertexFunction.trace
    monkeypatch.setattr(VertexFunction, "trace", lambda self, *a: traced.append(1) or real(self, *a))
    clear_trace_caches()
    _check(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups, repeat=False)
    assert traced == [1]


def test_gradients_and_recorded_calls_take_the_full_path(lookups):
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    leaf = h.clone().requires_grad_()
    out = _neighbour_sum(graph, {"h": leaf})
    out.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.bincount(graph.src, minlength=graph.num_nodes)
                               .to(h.dtype)[:, None].expand_as(h))
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    with record_calls() as calls:
        _neighbour_sum(graph, {"h": h})
    assert len(calls) == 1


def test_training_calls_after_inference_neither_check_nor_build_a_repeat(lookups, monkeypatch):
    """An evaluation call leaves a repeat; the training calls after it (gradients wanted)
    skip its guard check, build no other and compute what eager code would; the next
    evaluation call is served by the repeat again."""
    from gnnfuse.frontend import repeat_call
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    held = _neighbour_sum._repeats.latest()
    walks, built = [], []
    real_guard_key, real_after = repeat_call.guard_key, repeat_call.RepeatCall.after.__func__
    monkeypatch.setattr(repeat_call, "guard_key", lambda fns: walks.append(fns) or real_guard_key(fns))
    monkeypatch.setattr(repeat_call, "same_reads", lambda fns, reads: walks.append(fns) or False)
    monkeypatch.setattr(repeat_call.RepeatCall, "after",
                        classmethod(lambda cls, *args: built.append(real_after(cls, *args)) or built[-1]))
    degree = torch.bincount(graph.src, minlength=graph.num_nodes).to(h.dtype)[:, None].expand_as(h)
    for _ in range(3):
        leaf = h.clone().requires_grad_()
        out = _neighbour_sum(graph, {"h": leaf})
        torch.testing.assert_close(out, _oracle(graph, h), rtol=1e-12, atol=1e-12)
        out.sum().backward()
        torch.testing.assert_close(leaf.grad, degree)
    assert walks == [] and built == [None, None, None] and _neighbour_sum._repeats.latest() is held
    with torch.no_grad():       # gradients off: an input that wants one is still served
        _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)      # by a repeat kept with them off
        _check(_neighbour_sum, graph, {"h": h.clone().requires_grad_()}, _oracle(graph, h), lookups, repeat=True)
    assert walks


def test_calls_at_several_widths_each_keep_a_repeat(lookups):
    """One function called in turn at two widths (a two-layer model's aggregation) keeps a
    repeat for each, so both are served; at most `RepeatCalls.MOST` are kept, the oldest
    dropped first, and a new one for the same shapes replaces the old."""
    from gnnfuse.frontend.repeat_call import RepeatCalls
    graph = _graph(device=DEVICE)
    wide, narrow = _features(graph, width=5), _features(graph, width=2, seed=3)
    _warm(_neighbour_sum, graph, {"h": wide}, _oracle(graph, wide), lookups)
    _warm(_neighbour_sum, graph, {"h": narrow}, _oracle(graph, narrow), lookups)
    for _ in range(2):
        for h in (wide, narrow):
            _check(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups, repeat=True)
    widths = range(6, 6 + RepeatCalls.MOST)
    for width in widths:
        h = _features(graph, width=width)
        _warm(_neighbour_sum, graph, {"h": h}, _oracle(graph, h), lookups)
    assert [c.shapes[0][1] for c in _neighbour_sum._repeats._calls] == list(reversed(widths))
    _check(_neighbour_sum, graph, {"h": wide}, _oracle(graph, wide), lookups, repeat=False)   # dropped
    latest = _neighbour_sum._repeats.latest()
    _neighbour_sum._repeats.keep(latest)
    assert len(_neighbour_sum._repeats) == RepeatCalls.MOST and _neighbour_sum._repeats._calls.count(latest) == 1


def test_edge_tables_take_the_full_path(lookups):
    @gnnfuse.vertex
    def weighted(v):
        return sum([u.h * e.w for u, e in zip(v.innbs, v.inedges)])
    graph = _graph(device=DEVICE)
    h = _features(graph)
    w = torch.rand(graph.num_edges, 1, dtype=h.dtype, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    expected = torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src] * w)
    for _ in range(4):
        before = len(lookups)
        torch.testing.assert_close(weighted(graph, {"h": h}, {"w": w}), expected, rtol=1e-12, atol=1e-12)
        assert len(lookups) == before + 1


OFFSET = 1.0


def _helper(x):
    return x * OFFSET


def _through_helper(v):
    return _helper(sum([u.h for u in v.innbs]))


def test_a_global_a_helper_reads_is_seen(lookups, monkeypatch):
    fn = gnnfuse.vertex(_through_helper)
    graph = _graph(device=DEVICE)
    h = _features(graph)
    _warm(fn, graph, {"h": h}, _oracle(graph, h), lookups)
    assert fn._repeats.latest()._reads is None      # a helper: the repeat walks the guards
    monkeypatch.setitem(globals(), "OFFSET", 4.0)
    _check(fn, graph, {"h": h}, _oracle(graph, h) * 4.0, lookups, repeat=False)


def _closure_pair():
    factor = 2.0

    def body(v):
        return sum([u.h for u in v.innbs]) * factor

    def rebind(value):
        nonlocal factor
        factor = value
    return body, rebind


def test_shallow_reads_imply_an_equal_guard_key(monkeypatch):
    """`same_reads` may say no where the key is equal (an equal value, a new object) but
    never yes where it differs; and each change below makes it say no."""
    body, rebind = _closure_pair()
    functions = (_scaled, body, None)
    reads = trace_cache.shallow_reads(functions)
    key = trace_cache.guard_key(functions)
    assert reads is not None and trace_cache.same_reads(functions, reads)

    def rebound_global():
        monkeypatch.setitem(globals(), "SCALE", 5.0)

    def shadowed_builtin():
        monkeypatch.setitem(globals(), "sum", max)

    def new_defaults():
        monkeypatch.setattr(_scaled, "__defaults__", (1,))

    def new_code():
        monkeypatch.setattr(_scaled, "__code__", _doubled.__code__)
    for change in (rebound_global, shadowed_builtin, new_defaults, new_code, lambda: rebind(7.0)):
        change()
        assert not trace_cache.same_reads(functions, reads), change
        assert trace_cache.guard_key(functions) != key
        monkeypatch.undo()
        rebind(2.0)
        assert trace_cache.guard_key(functions) == key
    monkeypatch.setitem(globals(), "SCALE", float("2.0"))      # an equal float
    assert trace_cache.guard_key(functions) == key


def test_state_the_identities_cannot_vouch_for_keeps_the_walk():
    weight = torch.ones(3)

    def reads_tensor(v):
        return sum([u.h for u in v.innbs]) * weight
    assert trace_cache.shallow_reads((reads_tensor,)) is None
    assert trace_cache.shallow_reads((_through_helper,)) is None
    assert trace_cache.shallow_reads((_neighbour_sum,)) is None       # not a plain function
    assert trace_cache.shallow_reads((_neighbour_sum.fn,)) is not None


def _message(edges):
    return {"m": edges.src["h"] * SCALE}


def _reduce(nodes):
    return {"out": torch.sum(nodes.mailbox["m"], dim=1)}


def test_bound_message_and_reduce_functions_repeat_too(lookups, monkeypatch):
    update = gnnfuse.frontend.UpdateAll(_message, _reduce)
    graph = _graph(device=DEVICE)
    h = _features(graph)

    def call(**tables):
        return update(graph, ndata={"h": h}, **tables)["out"]
    for _ in range(3):
        call()
    assert update._repeats.latest() is not None and update._repeats.latest()._reads is not None
    before = len(lookups)
    torch.testing.assert_close(call(), _oracle(graph, h) * SCALE, rtol=1e-12, atol=1e-12)
    assert len(lookups) == before, "the repeat did not serve the call"
    monkeypatch.setitem(globals(), "SCALE", 0.5)
    torch.testing.assert_close(call(), _oracle(graph, h) * 0.5, rtol=1e-12, atol=1e-12)
    assert len(lookups) == before + 1
    torch.testing.assert_close(call(edata={"w": torch.ones(graph.num_edges, 1, dtype=h.dtype, device=DEVICE)}),
                               _oracle(graph, h) * 0.5, rtol=1e-12, atol=1e-12)
    assert len(lookups) == before + 2


def test_a_function_traced_like_one_that_read_a_value_still_repeats(lookups):
    """Programs are shared by structure (`compiled_for`): ``_by_value``, reading
    TEMPERATURE (2.0), traces to the program of ``_scaled`` (times SCALE, 2.0). The
    program was marked as one never to repeat, so ``_scaled`` called after ``_by_value``
    kept no repeat ever (test_trace_cache.py's value-read tests, then this file, failed so)."""
    graph = _graph(device=DEVICE)
    h = _features(graph)
    torch.testing.assert_close(gnnfuse.vertex(_by_value)(graph, {"h": h}), _oracle(graph, h) * 2.0)
    _warm(gnnfuse.vertex(_scaled), graph, {"h": h}, _oracle(graph, h) * SCALE, lookups)


def _by_gradient_mode(v):
    total = sum([u.h for u in v.innbs])
    return total * 2.0 if torch.is_grad_enabled() else total * 3.0


def test_a_repeat_is_served_only_in_the_gradient_mode_it_was_kept_in(lookups):
    """The trace cache keys by ``torch.is_grad_enabled()``, which code may branch on; a
    repeat kept under ``torch.no_grad()`` served the next call with gradients on (inputs
    needing none) with the no-grad branch: 3x where eager code gives 2x."""
    fn = gnnfuse.vertex(_by_gradient_mode)
    graph = _graph(device=DEVICE)
    h = _features(graph)
    with torch.no_grad():
        _warm(fn, graph, {"h": h}, _oracle(graph, h) * 3.0, lookups)
    _check(fn, graph, {"h": h}, _oracle(graph, h) * 2.0, lookups, repeat=False)
    _warm(fn, graph, {"h": h}, _oracle(graph, h) * 2.0, lookups)
    with torch.no_grad():
        _check(fn, graph, {"h": h}, _oracle(graph, h) * 3.0, lookups, repeat=False)


def test_vertex_and_bound_functions_pickle_after_calls():
    """Sent to a spawned worker (a multiprocessing pool, torch.multiprocessing), a
    module-level ``@gnnfuse.vertex`` function failed to pickle ("it's not the same object
    as test_repeat_call._neighbour_sum": pickle looked its ``fn`` up by name and found the
    wrapper), and an `UpdateAll` that had run refused with "cannot pickle code objects"
    (its caches' programs). Both now travel as their functions and compute the same."""
    import pickle
    graph = _graph(device="cpu")
    h = _features(graph)
    update = gnnfuse.frontend.UpdateAll(_message, _reduce)
    wrapped = gnnfuse.vertex(_scaled)        # a plain module-level function, wrapped under another name
    for _ in range(2):
        _neighbour_sum(graph, {"h": h}), update(graph, ndata={"h": h}), wrapped(graph, {"h": h})
    assert pickle.loads(pickle.dumps(_neighbour_sum)) is _neighbour_sum
    torch.testing.assert_close(pickle.loads(pickle.dumps(update))(graph, ndata={"h": h})["out"],
                               _oracle(graph, h) * SCALE, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pickle.loads(pickle.dumps(wrapped))(graph, {"h": h}),
                               _oracle(graph, h) * SCALE, rtol=1e-12, atol=1e-12)
