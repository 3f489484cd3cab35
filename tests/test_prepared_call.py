"""Inference calls kept as a `PreparedCall` compute what the full call path computes.

A program called twice in a row without gradients on one graph keeps a prepared call
(runtime/prepared_call.py) that skips the per-call choosing. Each test changes one thing
the full path would decide on between calls -- the graph, an input's shape, dtype or
layout, gradients, the backend, the schedule, the tiling, the segment length, an open
`record_calls` -- and checks that the next call takes the full path again and matches
the oracle; a hypothesis test draws sequences of such calls.
"""
from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse
from gnnfuse.backend.forced_schedule import ForcedSchedule, forcing
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.graph.graph import GraphModifiedError
from gnnfuse.runtime import compiled as runtime_compiled
from gnnfuse.runtime.compiled import record_calls
from oracle_check import device_for


@gnnfuse.vertex
def _neighbour_sum(v):
    return sum([u.h for u in v.innbs])


@gnnfuse.vertex
def _scaled_sum(v):
    return sum([u.h * u.w for u in v.innbs]) * v.w


DEVICE = device_for("triton")


def _graph(seed: int = 0, nodes: int = 12, edges: int = 60, hub: bool = True, device: str = DEVICE) -> gnnfuse.Graph:
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, nodes, (edges,), generator=gen), torch.randint(0, nodes, (edges,), generator=gen)
    if hub:     # a long row, split into segments at SEGMENT_EDGES = 4 below
        dst[: edges // 2] = 0
    return gnnfuse.Graph(src, dst, nodes).to(device)


def _oracle(graph: gnnfuse.Graph, h: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src])


@pytest.fixture
def full_path(monkeypatch):
    """The list of programs run through the full path (`_run_forward`), appended per call."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    runs = []
    real = runtime_compiled._run_forward

    def counted(compiled, graph_ctx, keys, tensors, backward):
        runs.append(compiled)
        return real(compiled, graph_ctx, keys, tensors, backward)
    monkeypatch.setattr(runtime_compiled, "_run_forward", counted)
    return runs


def _call(graph: gnnfuse.Graph, h: torch.Tensor, runs: list, full: bool) -> None:
    before = len(runs)
    out = _neighbour_sum(graph, {"h": h})
    torch.testing.assert_close(out, _oracle(graph, h), rtol=1e-12 if h.dtype == torch.float64 else 1e-5, atol=1e-6)
    took = "the full path" if len(runs) > before else "the prepared call"
    assert (len(runs) > before) == full, f"the call took {took}"


def _inputs(graph: gnnfuse.Graph, width: int = 3, dtype=torch.float64, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(graph.num_nodes, width, dtype=dtype, generator=gen).to(graph.device)


def _prepared_on(graph: gnnfuse.Graph, h: torch.Tensor, runs: list) -> None:
    """Two full calls (the second keeps a prepared call), then one through it."""
    _call(graph, h, runs, full=True)
    _call(graph, h, runs, full=True)
    _call(graph, h, runs, full=False)


def test_the_third_inference_call_on_a_graph_runs_prepared_and_matches(full_path):
    graph = _graph(device=DEVICE)
    _prepared_on(graph, _inputs(graph), full_path)
    for seed in range(2, 5):      # new values, same metadata: still prepared
        _call(graph, _inputs(graph, seed=seed), full_path, full=False)


def test_another_graph_or_input_metadata_takes_the_full_path(full_path):
    graph, other = _graph(0, device=DEVICE), _graph(1, device=DEVICE)
    _prepared_on(graph, _inputs(graph), full_path)
    _call(other, _inputs(other), full_path, full=True)                    # another graph of the same size
    _call(graph, _inputs(graph, width=5), full_path, full=True)           # another row width
    _call(graph, _inputs(graph, dtype=torch.float32), full_path, full=True)
    _call(graph, _inputs(graph).t().contiguous().t(), full_path, full=False)   # strides are the run's own


def test_a_compiled_program_called_with_another_dtype_takes_the_full_path(full_path):
    """Front ends trace a float32 call to a program of its own; a program called
    directly (as `gnnfuse.ops` and the compile path do) can meet one anyway."""
    graph = _graph(device=DEVICE)
    h = _inputs(graph)
    _prepared_on(graph, h, full_path)
    compiled, _ = _neighbour_sum.compiled(({"h": h}, {}, {}, {}))
    before = len(full_path)
    out = compiled(graph, {"h": h.float()})["out"]
    assert len(full_path) == before + 1
    torch.testing.assert_close(out.float(), _oracle(graph, h.float()), rtol=1e-5, atol=1e-5)


def test_an_input_needing_a_gradient_takes_the_autograd_path(full_path):
    graph = _graph(device=DEVICE)
    _prepared_on(graph, _inputs(graph), full_path)
    h = _inputs(graph).requires_grad_()
    _call(graph, h, full_path, full=True)
    grad, = torch.autograd.grad(_neighbour_sum(graph, {"h": h}).square().sum(), h)
    expected, = torch.autograd.grad(_oracle(graph, h).square().sum(), h)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    with torch.no_grad():           # no gradient recorded: the prepared call serves it
        _call(graph, h, full_path, full=False)



def test_a_graph_edited_in_place_after_preparing_is_refused_not_run_on_old_plans(full_path):
    """The prepared run's plans hold the layouts of the edges it was built with: a
    ``graph.src`` edited in place since is a GraphModifiedError on the prepared path too
    (without the check a two-input program returned the old edges' sums, 1.6 off)."""
    graph = _graph(device=DEVICE)
    h, w = _inputs(graph), _inputs(graph, width=1, seed=9)
    with torch.no_grad():
        for _ in range(3):
            _scaled_sum(graph, {"h": h, "w": w})
        assert _scaled_sum.compiled(({"h": h, "w": w}, {}, {}, {}))[0].prepared is not None
        graph.src[0] = (graph.src[0] + 1) % graph.num_nodes
        with pytest.raises(GraphModifiedError, match="in-place operation"):
            _scaled_sum(graph, {"h": h, "w": w})

@pytest.mark.parametrize("change", ["backend", "schedule", "forced", "tiled", "segment", "autotune", "siblings"])
def test_a_setting_changed_between_calls_takes_the_full_path(full_path, monkeypatch, change):
    graph = _graph(device=DEVICE)
    h = _inputs(graph)
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 4)
    _prepared_on(graph, h, full_path)
    if change == "backend":
        monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    elif change == "schedule":
        monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    elif change == "tiled":
        monkeypatch.setenv("GNNFUSE_TILED_SCORES", "1")
    elif change == "segment":
        monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 8)
    elif change == "autotune":
        monkeypatch.setenv("GNNFUSE_AUTOTUNE", "0" if triton_executor._autotune() else "1")
    elif change == "siblings":
        monkeypatch.setenv("GNNFUSE_SIBLING_KERNELS", "0")
    if change == "forced":
        with forcing(ForcedSchedule("coo")):
            _call(graph, h, full_path, full=True)
    elif change == "autotune" and DEVICE == "cpu":
        # the interpreter never autotunes, whatever GNNFUSE_AUTOTUNE says: nothing changed
        _call(graph, h, full_path, full=False)
    else:
        _call(graph, h, full_path, full=True)


def test_a_changed_backend_runs_that_backend(full_path, monkeypatch):
    graph = _graph(device=DEVICE)
    h = _inputs(graph)
    _prepared_on(graph, h, full_path)
    ran = []
    real = runtime_compiled.select_backend
    monkeypatch.setattr(runtime_compiled, "select_backend",
                        lambda device, *rest: ran.append(device) or real(device, *rest))
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    _call(graph, h, full_path, full=True)
    assert ran and real(graph.device).__module__.endswith("reference.executor")


def test_a_record_calls_block_sees_every_call(full_path):
    graph = _graph(device=DEVICE)
    h = _inputs(graph)
    _prepared_on(graph, h, full_path)
    with record_calls() as calls:
        _call(graph, h, full_path, full=True)
    assert len(calls) == 1 and calls[0].graph is graph


def test_bad_inputs_get_the_full_paths_errors(full_path):
    graph = _graph(device=DEVICE)
    h = _inputs(graph)
    _prepared_on(graph, h, full_path)
    with pytest.raises(ValueError, match="should have shape"):
        _neighbour_sum(graph, {"h": torch.zeros(graph.num_nodes + 1, 3, dtype=h.dtype, device=h.device)})
    with pytest.raises(ValueError, match="sparse_coo"):
        _neighbour_sum(graph, {"h": h.to_sparse()})
    with pytest.raises(TypeError, match="must map str names to tensors"):
        _neighbour_sum(graph, {"h": h.tolist()})
    _call(graph, h, full_path, full=False)


def test_a_prepared_call_keeps_its_graph_only_weakly(full_path):
    graph = _graph(device=DEVICE)
    h = _inputs(graph)
    _prepared_on(graph, h, full_path)
    compiled, _ = _neighbour_sum.compiled(({"h": h}, {}, {}, {}))
    assert compiled.prepared is not None
    dead = []
    import weakref
    weakref.finalize(graph, dead.append, True)
    del graph
    gc.collect()
    assert dead == [True], "a prepared call kept its graph (and the graph's layouts) alive"


def test_a_one_input_call_launches_its_held_plan_and_declines_as_the_general_run_would(full_path, monkeypatch):
    """A prepared call of a one-input, one-unit program (the neighbour sum) is served by
    the backend's `run_one`, never reaching the general `run`; a two-input program is
    served by `run`. Where the one-input call meets a plan held for float32 leaves
    (another program's run on the graph made it), `run_one` declines and `run` decides."""
    from gnnfuse.backend.triton import prepared_run
    general = []
    real = prepared_run.PreparedRun.run
    monkeypatch.setattr(prepared_run.PreparedRun, "run",
                        lambda self, graph, feeds: general.append(tuple(feeds)) or real(self, graph, feeds))
    graph = _graph(device=DEVICE)
    for _ in range(2):      # the second full call's backend run is a prepared one: `run`
        _call(graph, _inputs(graph), full_path, full=True)
    general.clear()
    for seed in range(2, 5):
        _call(graph, _inputs(graph, seed=seed), full_path, full=False)
    assert not general, "a one-input prepared call went through the general run"
    h, w = _inputs(graph), _inputs(graph, width=1, seed=9)
    for _ in range(3):
        out = _scaled_sum(graph, {"h": h, "w": w})
    torch.testing.assert_close(out, torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src] * w[graph.src]) * w,
                               rtol=1e-12, atol=1e-12)
    assert general, "the two-input program's prepared call did not run"
    prepared = _neighbour_sum.compiled(({"h": h}, {}, {}, {}))[0].prepared
    run = prepared._run_one.__self__
    unit = run._lone[0]
    dtypes, plan = run._launches[id(unit)]
    run._launches[id(unit)] = ((torch.float32,), plan)
    assert run.run_one(graph, h) is None
    general.clear()
    _call(graph, h, full_path, full=False)
    assert general == [("h",)]


def test_a_one_input_call_launches_only_what_its_kernel_can_read(full_path, monkeypatch):
    """`run_one` launches before the settings and the callers' checks (`launched_first`),
    so what it checks first must make the launch safe: a tensor of another dtype or
    shape, a sparse one or no tensor at all launches nothing there (the full path then
    answers or reports it), while a strided view of the right shape is laid out and
    launched."""
    from gnnfuse.backend.triton import prepared_run
    launched = []
    real = prepared_run.run_launch
    monkeypatch.setattr(prepared_run, "run_launch", lambda plan, leaves: launched.append(plan) or real(plan, leaves))
    graph = _graph(device=DEVICE)
    h = _inputs(graph)
    _prepared_on(graph, h, full_path)
    run = _neighbour_sum.compiled(({"h": h}, {}, {}, {}))[0].prepared._run_one.__self__
    for bad in (h.float(), torch.zeros(graph.num_nodes + 1, 3, dtype=h.dtype, device=h.device), h.to_sparse(),
                h[:, :2], h.tolist()):
        launched.clear()
        assert run.run_one(graph, bad) is None and not launched
    _call(graph, h.float(), full_path, full=True)
    view = _inputs(graph, seed=3).t().contiguous().t()      # [N, 3], rows 1 apart
    launched.clear()
    _call(graph, view, full_path, full=False)
    assert launched


def test_a_two_input_program_with_split_rows_matches_through_the_prepared_call(full_path, monkeypatch):
    """A scaled sum (two inputs, a fused epilogue) on a hub row split into segments,
    called until it runs prepared: its split rows meet in the plan's workspace, so no
    call zeroes any row of the output, and each matches the oracle."""
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 4)
    fills = []
    real = torch.Tensor.index_fill_
    monkeypatch.setattr(torch.Tensor, "index_fill_", lambda t, *args: fills.append(args) or real(t, *args))
    graph = _graph(device=DEVICE)
    for seed in range(4):
        h, w = _inputs(graph, seed=seed), _inputs(graph, width=1, seed=seed + 10)
        out = _scaled_sum(graph, {"h": h, "w": w})
        expected = torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src] * w[graph.src]) * w
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert not fills and len(full_path) == 2, (fills, full_path)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1]), st.sampled_from([1, 3]), st.sampled_from(["64", "32"]),
                          st.sampled_from(["auto", "coo", "csr"])), min_size=1, max_size=8))
def test_any_sequence_of_calls_matches_the_oracle(calls):
    """Calls alternating graphs, widths, dtypes and schedules, each checked against the
    oracle whichever path it took."""
    graphs = [_graph(0, device=DEVICE), _graph(3, nodes=9, edges=40, device=DEVICE)]
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("GNNFUSE_BACKEND", "triton")
        for which, width, bits, schedule in calls:
            mp.setenv("GNNFUSE_SCHEDULE", schedule)
            graph = graphs[which]
            h = _inputs(graph, width=width, dtype=torch.float64 if bits == "64" else torch.float32, seed=width)
            for _ in range(2):
                out = _neighbour_sum(graph, {"h": h})
                torch.testing.assert_close(out, _oracle(graph, h), rtol=1e-5, atol=1e-5)
    finally:
        mp.undo()


def _weighted(graph: gnnfuse.Graph, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (_inputs(graph, seed=seed).requires_grad_(), _inputs(graph, width=1, seed=seed + 10).requires_grad_())


def _train_check(graph: gnnfuse.Graph, h: torch.Tensor, w: torch.Tensor) -> None:
    """A forward and backward of the scaled sum against the oracle's, gradients included."""
    out = _scaled_sum(graph, {"h": h, "w": w})
    expected = torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src] * w[graph.src]) * w
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), (h, w))
    torch.testing.assert_close(grads, torch.autograd.grad(expected.square().sum(), (h, w)), rtol=1e-12, atol=1e-12)


@pytest.fixture
def prepared_runs(monkeypatch):
    """How many runs the Triton backend's `execute` served through a `PreparedRun`."""
    from gnnfuse.backend.triton import prepared_run
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    served = []
    real = prepared_run.PreparedRun.run

    def counted(self, graph, feeds):
        result = real(self, graph, feeds)
        served.append(result is not None)
        return result
    monkeypatch.setattr(prepared_run.PreparedRun, "run", counted)
    return served


def test_training_steps_on_one_graph_run_their_programs_prepared(prepared_runs, monkeypatch):
    """Forward and backward programs, from their second run on a graph, run through a
    `PreparedRun`; a schedule set between steps is declined and prepared afresh."""
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 4)
    graph = _graph(device=DEVICE)
    for seed in range(3):
        _train_check(graph, *_weighted(graph, seed))
    assert prepared_runs and all(prepared_runs), "the third step's programs did not run prepared"
    prepared_runs.clear()
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    for seed in range(3, 6):
        _train_check(graph, *_weighted(graph, seed))
    assert prepared_runs[:2] == [False, False] and all(prepared_runs[2:]), prepared_runs


def test_training_steps_alternating_graphs_never_prepare(prepared_runs):
    graphs = [_graph(0, device=DEVICE), _graph(1, nodes=9, edges=30, device=DEVICE)]
    for step in range(6):
        graph = graphs[step % 2]
        _train_check(graph, *_weighted(graph, step))
    assert prepared_runs == [], "a run on a graph other than the last one's was prepared"


def test_held_plans_free_the_graphs_index_arrays_with_the_graph(prepared_runs):
    """Programs outlive graphs (compiled once per structure), and so do the prepared runs
    they keep; the launch plans those hold, and the index arrays in them, go with the graph."""
    import weakref
    graph = _graph(device=DEVICE)
    for seed in range(3):
        _train_check(graph, *_weighted(graph, seed))
    with torch.no_grad():
        for _ in range(3):
            _neighbour_sum(graph, {"h": _inputs(graph)})
    assert prepared_runs and all(prepared_runs)
    arrays = []
    for per_graph in list(triton_executor._LAUNCHES._plans.values()):
        entry = per_graph.get(graph)
        if entry is not None:
            arrays += [weakref.ref(a) for a in getattr(entry[1], "before", ()) if isinstance(a, torch.Tensor)]
    assert arrays, "no launch plan held an index array to watch"
    del graph, entry
    gc.collect()
    assert all(ref() is None for ref in arrays), "a prepared run kept a dead graph's index arrays"


@gnnfuse.vertex
def _product_sum(v):
    return sum([u.h * u.w for u in v.innbs])


def test_a_one_unit_program_runs_from_its_held_plan_as_run_steps_would(prepared_runs, monkeypatch):
    """A prepared run of a program of one fused unit launches it from its held plan
    without `run_steps`; its outputs and kept values (this forward keeps its inputs for
    the backward) are those `run_steps` gives on the same inputs."""
    from gnnfuse.backend.triton import prepared_run
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 4)
    graph = _graph(device=DEVICE)

    def step(seed: int) -> None:
        h, w = _weighted(graph, seed)
        out = _product_sum(graph, {"h": h, "w": w})
        torch.testing.assert_close(out, torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src] * w[graph.src]),
                                   rtol=1e-12, atol=1e-12)
        out.square().sum().backward()
    for seed in range(2):
        step(seed)
    stepped = []
    real = prepared_run.run_steps
    monkeypatch.setattr(prepared_run, "run_steps", lambda *args: stepped.append(args[1]) or real(*args))
    step(2)
    runs = [entry[1] for held in prepared_run._HELD.values() for entry in held.values()
            if entry[0]() is graph and entry[1] is not None]
    single = [run for run in runs if run._single is not None]
    assert single, "no prepared run of one unit to check"
    assert not any(steps is run._steps for run in single for steps in stepped), "a one-unit program stepped"
    kept = 0
    for run in single:
        gen = torch.Generator().manual_seed(7)
        feeds = {key: torch.randn(shape, dtype=torch.float64, generator=gen).to(DEVICE)
                 for key, _, shape in run._inputs}
        fast = run.run(graph, feeds)
        one_unit, run._single = run._single, None
        through_steps = run.run(graph, feeds)
        run._single = one_unit
        for got, expected in zip(fast, through_steps):
            assert got.keys() == expected.keys()
            for key in got:
                torch.testing.assert_close(got[key], expected[key], rtol=1e-12, atol=1e-12)
        kept += len(fast[1])
    assert kept, "no one-unit program kept values to compare"
