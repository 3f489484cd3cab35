"""The Numba CPU backend (GNNFUSE_BACKEND=cpu) against the torch reference executor, on
outputs and every gradient: the fused units of the zoo's models (neighbour sum, GCN
norm, mean with zero in-degree, max, GAT and dot-product attention with their edge
softmax, the edge units of their backward passes), NaN propagation through max/min,
float32, gradcheck, the nn layers, the parallel kernels and the fallbacks.

Graphs are tiny and kernels are compiled serially (one torch thread, see conftest) and
cached on disk, so a warm run of this module costs a few seconds."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

pytest.importorskip("numba")

import gnnfuse  # noqa: E402
import zoo  # noqa: E402
from mixed_floats import CASES as MIXED_CASES, mixed_float_model  # noqa: E402
from gnnfuse import nn as gnn  # noqa: E402
from gnnfuse.backend.cpu import executor as cpu_executor  # noqa: E402
from gnnfuse.backend.forced_schedule import ForcedSchedule, forcing  # noqa: E402
from gnnfuse.passes.fusion import AggregateUnit, EdgeUnit  # noqa: E402


def small_graph() -> gnnfuse.Graph:
    """Self loops (2, 4), a multi-edge (0 -> 1 twice), a vertex of in-degree 3, and
    vertices 5 and 6 with no in-edges (6 has none at all)."""
    src = torch.tensor([0, 0, 2, 3, 1, 4, 0, 5, 3])
    dst = torch.tensor([1, 1, 2, 1, 3, 4, 3, 3, 0])
    return gnnfuse.Graph(src, dst, 7)


@pytest.fixture
def launched(monkeypatch):
    """The units the CPU backend ran as kernels (not through its torch fallback)."""
    units = []
    real_kernel_for = cpu_executor._kernel_for

    def recording(unit, *args):
        compiled = real_kernel_for(unit, *args)
        if compiled is not None:
            units.append(unit)
        return compiled
    monkeypatch.setattr(cpu_executor, "_kernel_for", recording)
    return units


def run(fn, inputs, backend, monkeypatch):
    """Output of ``fn(*inputs)`` and the gradients of a fixed projection of it, under ``backend``."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out.nan_to_num() * weight).sum(), leaves, allow_unused=True)
    return out.detach(), grads


def assert_same(fn, inputs, monkeypatch, **tol):
    out, grads = run(fn, inputs, "cpu", monkeypatch)
    ref, ref_grads = run(fn, inputs, "reference", monkeypatch)
    torch.testing.assert_close(out, ref, equal_nan=True, **tol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, equal_nan=True, **tol)


@pytest.mark.parametrize("name", ["gcn", "gat", "sage_mean", "sage_max", "dotgat"])
def test_zoo_units_match_reference(name, launched, monkeypatch):
    graph = small_graph()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=gen)
    p = zoo.params(name, gen)
    keys = list(p)

    def model(x, *values):
        return zoo.vertex_models(x, graph, dict(zip(keys, values)))[name]()
    assert_same(model, [x, *p.values()], monkeypatch, rtol=1e-10, atol=1e-12)
    assert any(isinstance(u, AggregateUnit) and u.by == "dst" for u in launched), "no forward kernel ran"
    assert any(isinstance(u, AggregateUnit) and u.by == "src" for u in launched), \
        "no backward kernel over the reverse CSR ran"
    if name in ("gat", "dotgat"):
        assert any(isinstance(u, EdgeUnit) for u in launched), "no edge kernel ran"


@pytest.mark.parametrize("reducer", ["max", "min"])
def test_max_and_min_propagate_nan_like_scatter_reduce(reducer, launched, monkeypatch):
    graph = small_graph()
    h = torch.randn(graph.num_nodes, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    h[0, 0] = float("nan")    # vertex 1: a NaN among finite in-neighbours (0, 0, 3)
    h[2, 1] = float("nan")    # vertex 2: its only in-neighbour (a self loop) is NaN
    pick = getattr(torch, reducer)

    def model(h):
        return gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"] * 2.0},
                                       lambda n: {"o": pick(n.mailbox["m"], dim=1).values}, ndata={"h": h})["o"]
    assert_same(model, [h], monkeypatch, rtol=0, atol=0)
    out, _ = run(model, [h], "cpu", monkeypatch)
    assert out[1, 0].isnan() and out[2, 1].isnan() and not out[1, 1].isnan()
    assert launched


@gnnfuse.vertex
def _max_of_three_terms(v):
    return max([u.a + v.b + v.c for u in v.innbs])


def test_max_of_a_regrouped_sum_sends_its_gradient_to_the_arg_max(launched, monkeypatch):
    """``u.a + v.b + v.c`` in a register-row kernel, whose fast-math flags let LLVM add
    ``v.b + v.c`` once per vertex: recomputed by another kernel the edge values need not
    round the same, and the max's backward compares them with the saved maximum. They
    lost their gradient on 207 of 1200 source entries before the compared values were
    saved (autodiff `recomputed_exactly`); every gradient now matches the reference."""
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 300, (3000,), generator=gen), torch.randint(0, 300, (3000,), generator=gen)
    graph = gnnfuse.Graph(src, dst, 300)
    a, b, c = (torch.randn(300, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    assert_same(lambda a, b, c: _max_of_three_terms(graph, {"a": a, "b": b, "c": c}), [a, b, c], monkeypatch,
                rtol=1e-12, atol=1e-12)
    assert launched


@pytest.mark.parametrize("op", [torch.tanh, torch.sigmoid])
def test_float32_max_of_an_op_with_literals_keeps_its_gradient(op, launched, monkeypatch):
    """``tanh(u.x * v.y)``'s kernel expression, ``2.0 * sigmoid(2.0 * t) - 1.0``, mixes
    float64 literals into float32 values, which Numba evaluates in float64: the forward
    kernel kept the maximum rounded to float32 and the backward compared it with the
    recomputed, unrounded float64 value, so no edge matched it and every entry of both
    gradients was NaN (the reference's are finite)."""
    graph = small_graph()
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(graph.num_nodes, 2, generator=gen) * 3, torch.randn(graph.num_nodes, 2, generator=gen)
    assert_same(lambda x, y: gnnfuse.ops.gspmm(graph, lambda xs, yd: op(xs * yd), "max", src=x, dst=y), [x, y],
                monkeypatch, rtol=1e-5, atol=1e-6)
    assert launched


def test_register_row_keeps_a_subtraction_in_order(launched, monkeypatch):
    """log_softmax of float32 logits near 90 in a register-row kernel: under the kernel's
    fast-math flags LLVM regrouped ``(x - max) - log(total)`` as ``x - (max +
    log(total))``, rounding the sum to the spacing of 90 -- -0.4076080 for -0.4076059, 2e-6
    off on every entry. Only bodies of products and moves now take the flags."""
    graph = small_graph()
    x = 88.0 + (torch.arange(graph.num_nodes * 3, dtype=torch.float32).view(-1, 3) % 4)
    ones = torch.ones(graph.num_edges, 1)
    assert_same(lambda x: gnnfuse.ops.gspmm(graph, lambda xs, w: torch.log_softmax(xs * w, -1), "sum",
                                            src=x, edge=ones), [x], monkeypatch, rtol=5e-7, atol=1e-7)
    assert launched


def test_float32_matches_reference(launched, monkeypatch):
    graph = small_graph()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(graph.num_nodes, zoo.F_IN, generator=gen)
    p = {k: v.float() for k, v in zoo.params("sage_mean", gen).items()}   # few kernels: each is a cold compile on CI

    def model(x, *values):
        return zoo.vertex_models(x, graph, dict(zip(p, values)))["sage_mean"]()
    out, grads = run(model, [x, *p.values()], "cpu", monkeypatch)
    assert out.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)
    assert_same(model, [x, *p.values()], monkeypatch, rtol=1e-5, atol=1e-6)
    assert launched


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layer", ["SAGEConv", "GCNConv"])
def test_half_precision_runs_the_units_as_torch_ops(layer, dtype, monkeypatch):
    """No kernel takes fp16/bf16, so the units run through their ops' torch references;
    an aggregate unit's reduction (not in its body) was missed there: a KeyError for a
    bf16 SAGE or GCN on the CPU backend. The result is the reference backend's."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    torch.manual_seed(0)
    x, edge_index = torch.randn(12, 6).to(dtype), torch.randint(0, 12, (2, 40))
    conv = getattr(gnn, layer)(6, 5).to(dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "gnnfuse cpu backend: no kernels for", RuntimeWarning)   # once a process
        out = conv(x, edge_index)
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    assert out.dtype == dtype
    torch.testing.assert_close(out, conv(x, edge_index), rtol=1e-2, atol=1e-2)     # the order of a half sum


def test_gradcheck_through_cpu_kernels(launched, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    graph = small_graph()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(graph.num_nodes, zoo.F_IN, dtype=torch.float64, generator=gen, requires_grad=True)
    p = zoo.params("gcn", gen)
    w = p["W"].requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: zoo.vertex_models(x, graph, {"W": w})["gcn"](), (x, w))
    assert launched


@pytest.mark.parametrize("layer", [
    lambda: gnn.GCNConv(6, 4), lambda: gnn.GATConv(6, 3, heads=2), lambda: gnn.SAGEConv(6, 4)],
    ids=["GCNConv", "GATConv", "SAGEConv"])
def test_nn_layers_match_reference_backend(layer, launched, monkeypatch):
    torch.manual_seed(0)
    module = layer().double()
    graph = small_graph()
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64)
    params = list(module.parameters())

    def model(x, *values):
        with torch.no_grad():
            for param, value in zip(params, values):
                param.copy_(value)
        return torch.func.functional_call(module, dict(zip([n for n, _ in module.named_parameters()], values)),
                                          (x, graph))
    assert_same(model, [x, *params], monkeypatch, rtol=1e-10, atol=1e-12)
    assert launched


def test_parallel_kernels_and_feature_tiles_match_reference(launched, monkeypatch):
    """Two threads compile the prange kernels; a feature tile narrower than the width
    makes the aggregate kernel take several passes over the graph."""
    monkeypatch.setenv("GNNFUSE_CPU_FEATURE_TILE", "3")
    monkeypatch.setattr(cpu_executor.schedule, "PARALLEL_MIN_WORK", 0)   # this graph is far below it
    parallel_flags = []
    recording = cpu_executor._kernel_for
    monkeypatch.setattr(cpu_executor, "_kernel_for",
                        lambda unit, acc, parallel, *parts: parallel_flags.append(parallel)
                        or recording(unit, acc, parallel, *parts))
    graph = small_graph()
    h = torch.randn(graph.num_nodes, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def model(h):
        return gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"]},
                                       lambda n: {"o": n.mailbox["m"].sum(dim=1)}, ndata={"h": h})["o"]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
            out = model(h)
            with forcing(ForcedSchedule(partition_bytes=16, chunk=1)):   # source ranges of 2 rows
                partitioned = model(h)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    torch.testing.assert_close(out, model(h), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(partitioned, model(h), rtol=1e-12, atol=1e-12)
    assert launched and all(parallel_flags), "the prange kernel did not run"


def test_parallel_kernels_called_from_several_threads_under_the_workqueue_layer():
    """Numba's workqueue pool (its threading layer where neither OpenMP nor TBB is
    installed) aborts the whole process when two Python threads launch parallel kernels
    at once ("Concurrent access has been detected"): a model served from a thread pool
    with GNNFUSE_BACKEND=cpu died. Launches on that pool take turns, and every thread's
    result matches the reference."""
    script = """
import os, sys, threading
os.environ["GNNFUSE_BACKEND"] = "cpu"
import torch, gnnfuse
from gnnfuse.backend.cpu import schedule
schedule.PARALLEL_MIN_WORK = 0
torch.set_num_threads(2)
sys.setswitchinterval(1e-6)
def model(graph, h):
    return gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"]},
                                   lambda n: {"o": n.mailbox["m"].sum(dim=1)}, ndata={"h": h})["o"]
cases = []
for seed in range(4):
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, 3000, (2, 30000), generator=gen)
    cases.append((gnnfuse.Graph(edges[0], edges[1], 3000), torch.randn(3000, 4, dtype=torch.float64, generator=gen)))
model(*cases[0])     # compiled (or loaded) once, before the threads start
outs = {}
def serve(k):
    for _ in range(40):
        outs[k] = model(*cases[k])
threads = [threading.Thread(target=serve, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
import numba
assert numba.threading_layer() == "workqueue", numba.threading_layer()
os.environ["GNNFUSE_BACKEND"] = "reference"
for k, (graph, h) in enumerate(cases):
    torch.testing.assert_close(outs[k], model(graph, h), rtol=1e-12, atol=1e-12)
print("ok")
"""
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_a_process_forked_after_a_parallel_kernel_runs_layers_and_dropout():
    """GNU OpenMP cannot run in a fork of a process that started its threads: Numba
    terminated the child at its first parallel launch ("fork() called from a process
    already using GNU OpenMP"), so a DataLoader worker (forked on Linux) calling a layer
    was killed once the training process had run one parallel kernel. The child runs
    serial kernels (the launches it inherited too) and torch's dropout mask."""
    script = """
import os, sys, torch, faulthandler
os.environ["GNNFUSE_BACKEND"] = "cpu"
import gnnfuse, numba
from gnnfuse.backend.cpu import schedule
from gnnfuse.nn import functional
schedule.PARALLEL_MIN_WORK = 0
torch.set_num_threads(2)
def model(graph, h):
    return gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"]},
                                   lambda n: {"o": n.mailbox["m"].sum(dim=1)}, ndata={"h": h})["o"]
gen = torch.Generator().manual_seed(0)
edges = torch.randint(0, 3000, (2, 30000), generator=gen)
graph, h = gnnfuse.Graph(edges[0], edges[1], 3000), torch.randn(3000, 4, dtype=torch.float64, generator=gen)
out = model(graph, h)
functional.dropout(torch.ones(1 << 20), 0.5, True)
from numba.np.ufunc import omppool
if numba.threading_layer() != "omp" or omppool.openmp_vendor != "GNU":
    print("skip: Numba's pool is not GNU OpenMP's")
    sys.exit(0)
pid = os.fork()
if pid == 0:
    faulthandler.dump_traceback_later(60, exit=True)
    same = torch.equal(model(graph, h), out)      # the launch planned before the fork
    torch.set_num_threads(1)     # torch's own OpenMP ops hang in the child otherwise (as DataLoader does)
    kept = functional.dropout(torch.ones(1 << 20), 0.5, True).mean().item()
    os._exit(0 if same and abs(kept - 1) < 0.01 else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    if done.stdout.startswith("skip"):
        pytest.skip(done.stdout.strip())
    assert "child 0" in done.stdout, (done.stdout, done.stderr[-2000:])


def test_numba_functions_outside_generated_kernels_compile_while_a_trace_swaps_builtins(monkeypatch):
    """A vertex function's trace replaces ``sum``/``max``/``min``/``len``/``zip`` in the
    builtins for the whole process (frontend/vertex.py). Generated kernels bind their own
    (kernel_cache), but the loader's hop sampler (``min``) and the float16/bfloat16
    rounding helper (``max``) read the process's: compiled in another thread during such a
    trace (a loader thread's first hop beside the model's first call), Numba failed with
    "Untyped global name 'min'". Fresh compiles under stand-ins like the trace's work."""
    import builtins
    import numba
    import numpy as np
    from gnnfuse.backend.cpu import scalar
    from gnnfuse.loader import hop_numba
    numba.core.registry.cpu_target.typing_context.refresh()    # loaded, as after any earlier compile (below)
    for name in ("sum", "max", "min", "len", "zip"):
        original = getattr(builtins, name)
        monkeypatch.setattr(builtins, name, lambda *args, _original=original, **kw: _original(*args, **kw))
    rowptr, col, seeds = np.array([0, 2, 4]), np.array([0, 1, 1, 0]), np.array([0, 1])
    slots = [np.zeros(2, np.int64) for _ in range(3)]
    assert numba.njit(hop_numba.sample.py_func)(rowptr, col, seeds, 1, 7, *slots, 2) == -1
    assert slots[2].tolist() == [1, 1]
    assert numba.njit(scalar._rounded.py_func)(1.0 / 3.0, 11, -24, 65504.0) == float(torch.tensor(1 / 3).half())


def test_a_processs_first_numba_compile_during_a_trace_leaves_numba_working(tmp_path):
    """Numba loads its typing and lowering registries at a process's first compile,
    registering the builtins it then finds: a first compile in another thread during a
    vertex function's trace (a loader thread's first hop beside the model's first call)
    met the trace's stand-ins and failed inside Numba ("module 'gnnfuse.frontend.vertex'
    has no attribute 'call'"). The trace holds Numba's compiler lock, so that compile
    waits for the real builtins. In a fresh process: the first compile is the point. The
    function waits (bounded) for the other thread's compile, which ran mid-swap before."""
    script = """
import threading
import numba, numpy as np, torch, gnnfuse
from gnnfuse.loader import hop_numba

result = {}
def first_hop():
    try:
        slots = [np.zeros(2, np.int64) for _ in range(3)]
        result["hop"] = numba.njit(hop_numba.sample.py_func)(np.array([0, 2, 4]), np.array([0, 1, 1, 0]),
                                                             np.array([0, 1]), 1, 7, *slots, 2)
    except Exception as error:
        result["hop"] = repr(error)[:200]
    done.set()
done, hop = threading.Event(), threading.Thread(target=first_hop)

@gnnfuse.vertex
def mean(v):
    if not hop.is_alive() and "hop" not in result:
        hop.start()
        done.wait(5)      # mid-swap: the compile ran here (in well under 5 s), unless it waits for the trace
    return sum([u.h for u in v.innbs]) / len(v.innbs)

graph = gnnfuse.Graph(torch.tensor([0, 1, 1]), torch.tensor([1, 0, 1]), 2)
print(mean(graph, {"h": torch.tensor([[1.0], [3.0]])}).flatten().tolist())
hop.join()
print(result["hop"])
print(numba.njit(lambda a: len(a) + max(a[0], a[1]))(np.arange(3)))
"""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"} | {"GNNFUSE_BACKEND": "reference"}
    (tmp_path / "first_compile.py").write_text(script)     # a file: a vertex function's source is read
    done = subprocess.run([sys.executable, str(tmp_path / "first_compile.py")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[3.0,", "2.0]", "-1", "4"], done.stdout


def test_without_numba_the_reference_runs_with_one_warning(monkeypatch):
    monkeypatch.setattr(cpu_executor, "numba", None)
    monkeypatch.setattr(cpu_executor, "_WARNED", set())
    graph = small_graph()
    h = torch.randn(graph.num_nodes, 2, dtype=torch.float64)
    model = gnn.SAGEConv(2, 2).double()
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    expected = model(h, graph)
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    with pytest.warns(RuntimeWarning, match="needs numba"):
        out = model(h, graph)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(h, graph)    # warned once, not per call
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_a_machine_without_numba_imports_the_backend_and_falls_back():
    """numba absent for real (not patched after import): the backend still imports."""
    script = """
import sys, warnings
sys.modules["numba"] = None          # any 'import numba' now raises ImportError
import os; os.environ["GNNFUSE_BACKEND"] = "cpu"
import torch, gnnfuse
g = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = gnnfuse.message_passing(g, lambda e: {"m": e.src["h"]},
                                  lambda n: {"o": n.mailbox["m"].sum(dim=1)}, ndata={"h": torch.ones(3, 2)})["o"]
assert out.tolist() == [[0, 0], [1, 1], [1, 1]], out
assert any("needs numba" in str(w.message) for w in caught), [str(w.message) for w in caught]
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_as_a_kernel(dtype, monkeypatch):
    """float16/bfloat16 tables are read and written as their bits (Numba has neither), so
    the unit runs as a kernel -- it ran as torch ops with a warning -- summing in float32
    and rounding the row once where it stores it, within one rounding of torch's."""
    monkeypatch.setattr(cpu_executor, "_WARNED", set())
    graph = small_graph()
    h = torch.randn(graph.num_nodes, 2).to(dtype)

    def model(h):
        return gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"]},
                                       lambda n: {"o": n.mailbox["m"].sum(dim=1)}, ndata={"h": h})["o"]
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    expected = model(h)
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    monkeypatch.setattr(cpu_executor, "run_by_ops", lambda *a: pytest.fail("the unit ran as torch ops"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = model(h)
    exact = torch.zeros(graph.num_nodes, 2).index_add(0, graph.dst, h[graph.src].float()).to(dtype)
    assert out.dtype == dtype and torch.equal(out, exact)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("dtype, count", [(torch.float16, 2051), (torch.bfloat16, 259)])
def test_integer_operand_of_a_half_precision_op_is_rounded_to_it_first(dtype, count, launched, monkeypatch):
    """torch casts an integer operand to a float16/bfloat16 op's dtype before the op:
    3 * 2051 in float16 is 3 * 2052 = 6156 (and 3 * 259 in bfloat16 3 * 260 = 780). The
    kernels read the integer straight into their float32 accumulator and gave 6152 and
    776 (3 * 2051 = 6153, rounded once), in an edge unit and in a sum alike."""
    graph = small_graph()
    h = torch.full((graph.num_nodes, 2), 3.0, dtype=dtype)
    counts = torch.full((graph.num_nodes, 2), count)

    def per_edge():
        return gnnfuse.ops.gsddmm(graph, lambda hs, c: hs * c, src=h, dst=counts)

    def summed():
        return gnnfuse.ops.gspmm(graph, lambda hs, c: hs * c, "sum", src=h, dst=counts)
    for model in (per_edge, summed):
        monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
        expected = model()
        monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
        assert torch.equal(model(), expected)
    assert torch.equal(per_edge()[0], (h[0] * counts[0]))     # torch's 6156 / 780
    assert len(launched) == 2, "a unit ran as torch ops"


@pytest.mark.parametrize("case", MIXED_CASES)
def test_units_mixing_float_dtypes_compute_float32_values_in_float32(case, monkeypatch):
    """torch computes each op in its result dtype: the float32 part of
    ``(((a - b) + 1e8) - 1e8) * w`` rounds to float32's spacing of 8 before a float64
    ``w`` widens it, and a 0-dim float64 tensor does not widen float32 data at all. The
    kernels computed a whole unit in float64 once any leaf was float64, so the float32
    values came out unrounded: the sum was 6.04 off the reference backend's with float64
    edge weights and 7.62 off with the float64 constant. Such a unit runs as torch ops."""
    monkeypatch.setattr(cpu_executor, "_WARNED", set())
    model, inputs = mixed_float_model(small_graph(), case)
    with pytest.warns(RuntimeWarning, match="mixes torch.float32 and torch.float64"):
        assert_same(model, inputs, monkeypatch, rtol=0, atol=0)


@pytest.mark.parametrize("value", ["0", "-4", "wide"])
def test_feature_tile_setting_is_checked(value, monkeypatch):
    monkeypatch.setenv("GNNFUSE_CPU_FEATURE_TILE", value)
    with pytest.raises(ValueError, match="GNNFUSE_CPU_FEATURE_TILE must be a positive integer"):
        cpu_executor.schedule.feature_tile(8)


@pytest.fixture
def no_fallback(monkeypatch):
    """Fails the test if the CPU backend runs any unit as torch ops (its fallback warns)."""
    monkeypatch.setattr(cpu_executor, "_WARNED", set())
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="gnnfuse cpu backend")
        yield


def test_feature_slices_run_as_kernels(launched, no_fallback, monkeypatch):
    """``slice_features`` is a coordinate map inside the kernel (strided, offset and a
    one-wide slice broadcast against a wider one), forward and backward."""
    graph = small_graph()
    h = torch.randn(graph.num_nodes, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def model(h):
        return gnnfuse.message_passing(
            graph, lambda e: {"m": e.src["h"][:, 1:6:2] * e.dst["h"][:, 0:1] + e.src["h"][:, 3:]},
            lambda n: {"o": n.mailbox["m"].sum(dim=1)}, ndata={"h": h})["o"]
    assert_same(model, [h], monkeypatch, rtol=1e-12, atol=1e-12)
    assert any(u.root.op == "reduce" and "slice_features" in [v.op for v in u.body] for u in launched)


@pytest.mark.parametrize("pick", [torch.maximum, torch.minimum], ids=["maximum", "minimum"])
def test_binary_max_and_min_propagate_nan_in_kernels(pick, launched, no_fallback, monkeypatch):
    """NaN in either operand of torch.maximum/minimum gives NaN (Triton's
    ``propagate_nan=ALL``), in the output and in the gradients, as in torch."""
    graph = small_graph()
    h = torch.randn(graph.num_nodes, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    h[0, 0] = float("nan")   # a source operand
    h[3, 2] = float("nan")   # a destination operand (vertex 3) and a source one
    h[4, 1] = h[4, 1]        # a self loop: ties split the gradient evenly

    def model(h):
        return gnnfuse.message_passing(graph, lambda e: {"m": pick(e.src["h"], e.dst["h"] * 0.5)},
                                       lambda n: {"o": n.mailbox["m"].sum(dim=1)}, ndata={"h": h})["o"]
    assert_same(model, [h], monkeypatch, rtol=1e-12, atol=1e-12)
    out, _ = run(model, [h], "cpu", monkeypatch)
    assert out[1, 0].isnan() and out[3, 2].isnan() and not out[1, 1].isnan()
    assert launched


def test_bipartite_backward_rows_are_the_source_set(launched, monkeypatch):
    """A unit grouped by source on a bipartite graph writes one row per *source* vertex
    (the gradient of the source features), not one per destination."""
    src = torch.tensor([0, 1, 4, 4, 2, 0])
    dst = torch.tensor([0, 0, 1, 2, 2, 1])
    graph = gnnfuse.Graph(src, dst, num_nodes=3, num_src_nodes=5)
    x_src = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(7))

    def model(x_src):
        return gnn.SAGEConv((4, 4), 2).double()((x_src, torch.ones(3, 4, dtype=torch.float64)), graph)
    torch.manual_seed(0)
    assert_same(lambda x: (torch.manual_seed(0), model(x))[1], [x_src], monkeypatch, rtol=1e-10, atol=1e-12)
    assert any(isinstance(u, AggregateUnit) and u.by == "src" for u in launched)


@pytest.mark.parametrize("reducer", ["sum", "mean", "max", "min"])
def test_source_partitions_match_reference(reducer, monkeypatch):
    """FeatGraph's source-range partitioning: ranges of one to a few source rows (tiny
    cache budgets), each range's partial aggregation combined into the output, with
    feature tiles and dynamic thread chunks, forward and backward (whose reverse-CSR
    units are partitioned by destination ranges); NaN in max/min still wins."""
    partitioned = []
    real_kernel_for = cpu_executor._kernel_for

    def recording(unit, acc, parallel, parts=False, *kind):
        partitioned.append(parts)
        return real_kernel_for(unit, acc, parallel, parts, *kind)
    monkeypatch.setattr(cpu_executor, "_kernel_for", recording)
    graph = small_graph()
    x = torch.randn(graph.num_nodes, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    if reducer in ("max", "min"):
        x[0, 1] = float("nan")
    for budget, tile in ((8, 4), (48, 2)):   # one source per range at F=4; three per range on 2-column tiles
        schedule = gnnfuse.ops.Schedule(feature_tile=tile, partition_bytes=budget, chunk=1)

        def model(x):
            return gnnfuse.ops.gspmm(graph, lambda xs, xd: xs * torch.sigmoid(xd), reducer, src=x, dst=x,
                                     schedule=schedule)
        assert_same(model, [x], monkeypatch, rtol=1e-12, atol=1e-12)
    assert any(partitioned), "no partitioned kernel ran"


def test_source_partitions_read_edge_rows_by_edge_id(monkeypatch):
    """Edge operands are read through the partitioned layout's edge ids (ranges reorder
    the edges), forward and in the backward's reverse-CSR unit."""
    graph = small_graph()
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(graph.num_nodes, 3, dtype=torch.float64, generator=gen)
    w = torch.randn(graph.num_edges, 1, dtype=torch.float64, generator=gen)

    def model(x, w):
        return gnnfuse.ops.gspmm(graph, lambda xs, w: w * xs, "sum", src=x, edge=w,
                                 schedule=gnnfuse.ops.Schedule(partition_bytes=24))   # one source per range
    assert_same(model, [x, w], monkeypatch, rtol=1e-12, atol=1e-12)
    for by in ("dst", "src"):   # the layouts were built (not a silent unpartitioned run)
        assert graph.cached(f"cpu_partitions_{by}_1", lambda g: None) is not None


def test_partition_layout_covers_every_edge_once():
    from gnnfuse.backend.cpu.partition import source_partitions
    from gnnfuse.backend.reference import GraphContext
    ctx = GraphContext(small_graph())
    parts = source_partitions(ctx, "dst", 2)
    assert len(parts.part_ptr) == 4   # sources 0-1, 2-3, 4-5 (none from 6)
    seen = []
    for p in range(len(parts.part_ptr) - 1):
        for i in range(parts.part_ptr[p], parts.part_ptr[p + 1]):
            for j in range(parts.ptr[i], parts.ptr[i + 1]):
                assert parts.col[j] // 2 == p
                seen.append((int(parts.col[j]), int(parts.rows[i]), int(parts.eid[j])))
    graph = small_graph()
    assert sorted(seen) == sorted(zip(graph.src.tolist(), graph.dst.tolist(), range(graph.num_edges)))


def test_sum_times_row_scalar_runs_as_one_scaled_kernel(monkeypatch):
    """GCN's ``sum(...) * v.norm`` and a mean's ``sum / degree`` are one unit with a
    per-row scale (passes.fusion), in the plain and the source-partitioned kernel alike;
    both match the reference in float64, forward and backward."""
    scaled_units = []
    recording = cpu_executor._kernel_for
    monkeypatch.setattr(cpu_executor, "_kernel_for",
                        lambda unit, *rest: scaled_units.append(getattr(unit, "scale", None) is not None)
                        or recording(unit, *rest))

    @gnnfuse.vertex
    def normalized_sum(v):
        return sum([u.h * u.norm for u in v.innbs]) * v.norm

    @gnnfuse.vertex
    def mean(v):     # sum / degree: forward only (its backward divides before the gather)
        return sum([u.h for u in v.innbs]) / len(v.innbs)

    graph = small_graph()
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(graph.num_nodes, 5, dtype=torch.float64, generator=gen)
    norm = torch.rand(graph.num_nodes, 1, dtype=torch.float64, generator=gen) + 0.5
    weights = torch.randn(graph.num_nodes, 5, dtype=torch.float64, generator=gen)

    def run(fn, backend: str, schedule: ForcedSchedule | None = None):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        hs = h.clone().requires_grad_()
        with forcing(schedule or ForcedSchedule()):
            out = fn(graph, {"h": hs, "norm": norm})
            (out * weights).sum().backward()
        return out.detach(), hs.grad

    for fn in (normalized_sum, mean):
        want = run(fn, "reference")
        scaled_units.clear()
        for schedule in (None, ForcedSchedule(partition_bytes=16, chunk=1)):
            for got, expected in zip(run(fn, "cpu", schedule), want):
                torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        assert scaled_units[0], "the scaled sum did not run as one unit"
        assert all(scaled_units) or fn is mean


def test_the_fallback_warning_names_the_dtype_without_kernels(monkeypatch):
    """An int16 leaf beside a float32 result runs as torch ops; the warning named the
    result's dtype ("no kernels for torch.float32 data"), which has kernels."""
    pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    monkeypatch.setattr(cpu_executor, "_WARNED", set())
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    t, h = torch.tensor([[1], [2], [3]], dtype=torch.int16), torch.randn(3, 2)
    with pytest.warns(RuntimeWarning, match=r"no kernels for torch\.int16 data"):
        got = gnnfuse.apply_edges(graph, lambda edges: {"m": edges.src["h"] * edges.data["t"]},
                                  ndata={"h": h}, edata={"t": t})["m"]
    torch.testing.assert_close(got, h[graph.src] * t)
