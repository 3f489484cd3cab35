"""FeatGraph's templates, ``gnnfuse.ops.gspmm`` / ``gsddmm``: user functions over the
gathered operand rows against plain-PyTorch gather + index_add / scatter_reduce oracles
(outputs and every gradient, float64, both backends), gradcheck, the per-call schedule,
trace reuse, and every argument error."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.backend.forced_schedule import forced_schedule
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.frontend import templates
from gnnfuse.ops import Schedule, gsddmm, gspmm
from oracle_check import BACKENDS, assert_matches_oracle, device_for

# A multi-edge 3->1 (twice), a self loop on 4, vertex 3 without in-edges, vertex 5 isolated.
SRC = torch.tensor([0, 1, 2, 2, 3, 3, 4, 1, 0])
DST = torch.tensor([1, 2, 0, 1, 1, 1, 4, 0, 2])
N, E, F = 6, len(SRC), 3


def inputs(device: str, **shapes: tuple[int, ...]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, dtype=torch.float64, generator=gen).to(device) for k, s in shapes.items()}


def aggregate(messages: torch.Tensor, dst: torch.Tensor, reduce: str) -> torch.Tensor:
    """The oracle's aggregation: index_add for sum, scatter_reduce for the others, 0 where
    a vertex has no in-edges."""
    out = messages.new_zeros((N,) + messages.shape[1:])
    if reduce == "sum":
        return out.index_add(0, dst, messages)
    index = dst.view(-1, *([1] * (messages.dim() - 1))).expand_as(messages)
    return out.scatter_reduce(0, index, messages, {"mean": "mean", "max": "amax", "min": "amin"}[reduce],
                              include_self=False)


LINEAR = torch.nn.Linear(F, 2).double()   # a module as the user function (FeatGraph's UDF)


# name -> (operand shapes, template call, oracle): the oracle gathers with s = SRC, d = DST.
CASES = {
    "sddmm_dot": (dict(x=(N, F)),
                  lambda g, x: gsddmm(g, lambda xs, xd: (xs * xd).sum(-1, keepdim=True), src=x, dst=x),
                  lambda s, d, x: (x[s] * x[d]).sum(-1, keepdim=True)),
    "sddmm_src_dst_edge": (dict(x=(N, F), y=(N, F), e=(E, F)),
                           lambda g, x, y, e: gsddmm(g, lambda xs, xd, w: torch.sigmoid(xs - xd) * w,
                                                     src=x, dst=y, edge=e),
                           lambda s, d, x, y, e: torch.sigmoid(x[s] - y[d]) * e),
    "sddmm_copy_dst": (dict(y=(N, F)), lambda g, y: gsddmm(g, None, dst=y), lambda s, d, y: y[d]),
    "spmm_weighted_sum": (dict(x=(N, F), w=(E, 1)),
                          lambda g, x, w: gspmm(g, lambda xs, w: w * xs, "sum", src=x, edge=w),
                          lambda s, d, x, w: aggregate(w * x[s], d, "sum")),
    "spmm_mean_src_dst": (dict(x=(N, F)),
                          lambda g, x: gspmm(g, lambda xs, xd: xs * torch.tanh(xd), "mean", src=x, dst=x),
                          lambda s, d, x: aggregate(x[s] * torch.tanh(x[d]), d, "mean")),
    "spmm_max_all_operands": (dict(x=(N, F), y=(N, F), e=(E, F)),
                              lambda g, x, y, e: gspmm(g, lambda xs, xd, w: xs + w * xd, "max",
                                                       src=x, dst=y, edge=e),
                              lambda s, d, x, y, e: aggregate(x[s] + e * y[d], d, "max")),
    "spmm_min_copy_edge": (dict(e=(E, F)), lambda g, e: gspmm(g, None, "min", edge=e),
                           lambda s, d, e: aggregate(e, d, "min")),
    "spmm_captured_weight": (dict(x=(N, F), W=(F, 2)),
                             lambda g, x, W: gspmm(g, lambda xs: torch.relu(xs @ W), "sum", src=x),
                             lambda s, d, x, W: aggregate(torch.relu(x[s] @ W), d, "sum")),
    "spmm_module_message": (dict(x=(N, F)), lambda g, x: gspmm(g, LINEAR, "mean", src=x),
                            lambda s, d, x: aggregate(LINEAR(x[s]), d, "mean")),
}
TRITON_CASES = ["sddmm_src_dst_edge", "spmm_weighted_sum", "spmm_max_all_operands"]


def check_case(name: str, backend: str, monkeypatch) -> None:
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    shapes, call, oracle = CASES[name]
    g = gnnfuse.Graph(SRC, DST, N).to(device)
    s, d = SRC.to(device), DST.to(device)
    assert_matches_oracle(lambda **t: {"out": call(g, **t)}, lambda **t: {"out": oracle(s, d, **t)},
                          inputs(device, **shapes))


@pytest.mark.parametrize("name", CASES)
def test_template_matches_torch_oracle_on_reference(name, monkeypatch):
    check_case(name, "reference", monkeypatch)


@pytest.mark.parametrize("name", TRITON_CASES)
def test_template_matches_torch_oracle_on_triton(name, monkeypatch):
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    check_case(name, "triton", monkeypatch)


def test_gradcheck_gspmm_and_gsddmm(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    g = gnnfuse.Graph(SRC, DST, N)
    x, w = (t.requires_grad_() for t in inputs("cpu", x=(N, F), w=(E, 1)).values())
    assert torch.autograd.gradcheck(
        lambda x, w: gspmm(g, lambda xs, xd, w: torch.tanh(w * xs * xd), "mean", src=x, dst=x, edge=w), (x, w))
    assert torch.autograd.gradcheck(
        lambda x, w: gsddmm(g, lambda xs, xd, w: (xs * xd).sum(-1, keepdim=True) * torch.exp(w),
                            src=x, dst=x, edge=w), (x, w))


@pytest.mark.parametrize("backend", BACKENDS)
def test_graphs_without_edges_and_edge_index_input(backend, monkeypatch):
    """No edges: every vertex aggregates to 0 and gsddmm gives [0, ...]. An edge_index
    takes its node count from the operands, keeping trailing vertices without edges."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    x = inputs(device, x=(N, F))["x"]
    empty = gnnfuse.Graph(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), N).to(device)
    assert torch.equal(gspmm(empty, lambda xs: xs * 2, "max", src=x), torch.zeros_like(x))
    assert gsddmm(empty, lambda xs, xd: xs * xd, src=x, dst=x).shape == (0, F)
    edge_index = torch.stack([SRC, DST]).to(device)   # vertex 5 appears in no edge
    torch.testing.assert_close(gspmm(edge_index, None, "sum", src=x),
                               aggregate(x[SRC.to(device)], DST.to(device), "sum"))


@pytest.mark.parametrize("backend", BACKENDS + ["cpu"])
def test_zero_width_features(backend, monkeypatch):
    """[N, 0] rows: the weight's gradient sums no terms per edge (0) and so does a dot
    product over no features. The Numba edge kernel for those sums was a SyntaxError and
    the Triton kernel read the empty table (a segmentation fault in the interpreter)."""
    if backend == "cpu":
        pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    g = gnnfuse.Graph(SRC, DST, N).to(device)
    s, d = SRC.to(device), DST.to(device)
    assert_matches_oracle(
        lambda x, w: {"sum": gspmm(g, lambda xs, w: w * xs, "sum", src=x, edge=w),
                      "dot": gsddmm(g, lambda xs, xd, w: (xs * xd).sum(-1, keepdim=True) + w,
                                     src=x, dst=x, edge=w)},
        lambda x, w: {"sum": aggregate(w * x[s], d, "sum"), "dot": (x[s] * x[d]).sum(-1, keepdim=True) + w},
        inputs(device, x=(N, 0), w=(E, 1)))


# --- schedule= -------------------------------------------------------------------------
def chosen_schedules(monkeypatch) -> list[str]:
    """Every schedule the Triton executor picks from now on, in order."""
    chosen = []
    real = triton_executor.schedule_for
    monkeypatch.setattr(triton_executor, "schedule_for",
                        lambda unit, n, e: chosen.append(real(unit, n, e)) or chosen[-1])
    return chosen


@pytest.mark.parametrize("forced,env", [("csr", "auto"), ("coo", "csr")])
def test_schedule_overrides_the_cost_rule_and_the_environment_in_forward_and_backward(forced, env, monkeypatch):
    """The cost rule picks rows (forward) and COO (backward) on a graph this small
    (average degree 1.5, width 3), so forcing CSR changes it; forcing COO wins over
    GNNFUSE_SCHEDULE=csr."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", env)
    device = device_for("triton")
    g = gnnfuse.Graph(SRC, DST, N).to(device)
    chosen = chosen_schedules(monkeypatch)
    assert_matches_oracle(
        lambda x, w: {"out": gspmm(g, lambda xs, w: w * xs, "sum", src=x, edge=w, schedule=forced)},
        lambda x, w: {"out": aggregate(w * x[SRC.to(device)], DST.to(device), "sum")},
        inputs(device, x=(N, F), w=(E, 1)))
    aggregations = [s for s in chosen if s != "edge"]
    assert len(aggregations) >= 2, f"forward and backward aggregations expected, got {chosen}"
    assert set(aggregations) == {forced}
    assert forced_schedule() is None, "the override leaked out of the call"
    chosen.clear()
    gspmm(g, lambda xs, w: w * xs, "sum", src=inputs(device, x=(N, F))["x"],
          edge=torch.ones(E, 1, dtype=torch.float64).to(device))     # one dtype: a kernel, not torch ops
    # the rule's own choice: a plain sum by destination, 3 lanes at degree 1.5 (`prefers_rows`)
    assert chosen == [env if env != "auto" else "rows"], "without schedule= the usual choice applies"


def test_explain_reports_the_schedule_a_call_forced():
    """explain plans after the call returns; it must report the schedule the call ran
    with, not the cost rule's (COO on this graph)."""
    g = gnnfuse.Graph(SRC, DST, N)
    x = inputs("cpu", x=(N, F))["x"].requires_grad_()
    report = str(gnnfuse.explain(lambda: gspmm(g, lambda xs: xs * 2, "sum", src=x, schedule="csr")))
    assert "[csr schedule on CUDA]" in report and "coo schedule" not in report
    assert "[coo schedule on CUDA]" in str(gnnfuse.explain(lambda: gspmm(g, lambda xs: xs * 2, "sum", src=x)))


def test_schedule_feature_tile_sets_the_kernel_feature_block(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    blocks = []
    real_kernel_for = triton_executor._kernel_for

    class Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            launch = self.kernel[grid]
            return lambda *a, **kw: blocks.append(kw["BLOCK_F"]) or launch(*a, **kw)

    monkeypatch.setattr(triton_executor, "_kernel_for",
                        lambda *a: real_kernel_for(*a)._replace(kernel=Spy(real_kernel_for(*a).kernel)))
    g = gnnfuse.Graph(SRC, DST, N).to(device)
    x = inputs(device, x=(N, F))["x"]
    out = gspmm(g, None, "sum", src=x, schedule=Schedule("csr", feature_tile=1))
    assert blocks == [1]
    torch.testing.assert_close(out, aggregate(x[SRC.to(device)], DST.to(device), "sum"))


# --- trace reuse -------------------------------------------------------------------------
def test_traces_are_reused_across_calls(monkeypatch):
    traced = []
    real = templates.trace_template
    monkeypatch.setattr(templates, "trace_template", lambda *a: traced.append(1) or real(*a))
    g = gnnfuse.Graph(SRC, DST, N)
    x = inputs("cpu", x=(N, F))["x"]
    for scale in (2.0, 2.0, 3.0):
        out = gspmm(g, lambda xs: xs * scale, "max", src=x)
        torch.testing.assert_close(out, aggregate(x[SRC] * scale, DST, "max"))
    assert len(traced) == 2, "the second call with the same closure value must reuse the trace"


@pytest.mark.parametrize("backend", BACKENDS)
def test_templates_run_on_bipartite_blocks(backend, monkeypatch):
    """A loader block has more sources than destinations: src= has a row per source
    (both templates once asked for one per destination, and so refused every block)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    src, dst = torch.tensor([0, 3, 4, 4, 1]), torch.tensor([0, 1, 1, 0, 1])
    graph = gnnfuse.Graph(src, dst, 2, num_src_nodes=5).to(device)
    x = torch.randn(5, 3, dtype=torch.float64, device=device)
    y = torch.randn(2, 3, dtype=torch.float64, device=device)
    src, dst = src.to(device), dst.to(device)
    assert_matches_oracle(
        lambda x, y: {"sum": gspmm(graph, lambda xs, yd: xs * yd, "sum", src=x, dst=y),
                      "edge": gsddmm(graph, lambda xs, yd: (xs * yd).sum(-1), src=x, dst=y)},
        lambda x, y: {"sum": torch.zeros(2, 3, dtype=x.dtype, device=device).index_add(0, dst, x[src] * y[dst]),
                      "edge": (x[src] * y[dst]).sum(-1)},
        {"x": x, "y": y})


def test_templates_read_a_raw_graph_as_bipartite_from_the_tables_row_counts():
    """An edge_index or a rectangular [num_dst, num_src] adj_t with src= and dst= tables of
    different row counts is PyG's bipartite ``size=(num_src, num_dst)``: the first table's
    rows were taken for every vertex (the other refused), and the adj_t asked for a
    num_src_nodes no template takes."""
    src, dst = torch.tensor([0, 3, 4, 4, 1]), torch.tensor([0, 1, 1, 0, 1])
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    expected = torch.zeros(2, 3, dtype=torch.float64).index_add(0, dst, x[src] * y[dst])
    adj_t = torch.sparse_coo_tensor(torch.stack([dst, src]), torch.ones(5), (2, 5)).coalesce()
    for graph in (torch.stack([src, dst]), adj_t):
        torch.testing.assert_close(gspmm(graph, lambda xs, yd: xs * yd, "sum", src=x, dst=y), expected)
    torch.testing.assert_close(gsddmm(torch.stack([src, dst]), lambda xs, yd: (xs * yd).sum(-1), src=x, dst=y),
                               (x[src] * y[dst]).sum(-1))


# --- errors --------------------------------------------------------------------------------
def graph_and_x():
    return gnnfuse.Graph(SRC, DST, N), inputs("cpu", x=(N, F))["x"]


@pytest.mark.parametrize("call,error,match", [
    (lambda g, x: gspmm(g, None, "prod", src=x), ValueError, "reduce must be one of"),
    (lambda g, x: gspmm(g, None, max, src=x), TypeError, "reduce must be one of"),
    (lambda g, x: gspmm(g, None, "sum", src=x[:4]), ValueError, r"src= must have one row per graph node \(6"),
    (lambda g, x: gsddmm(g, None, edge=x), ValueError, r"edge= must have one row per graph edge \(9"),
    (lambda g, x: gspmm(gnnfuse.Graph(g.src % 4, g.dst, 6, num_src_nodes=4), None, "sum", src=x), ValueError,
     r"src= must have one row per graph source node \(4"),
    (lambda g, x: gspmm(g, None, "sum", dst=x.tolist()), TypeError, "dst= must be a tensor"),
    (lambda g, x: gspmm(g, None, "sum"), ValueError, "at least one operand"),
    (lambda g, x: gsddmm(g, None, src=x, dst=x), ValueError, "edge_fn=None copies a single operand"),
    (lambda g, x: gspmm(g, "sum", "sum", src=x), TypeError, "message must be a function"),
    (lambda g, x: gspmm(g, lambda xs: xs, "sum", src=x, dst=x), TypeError,
     r"called with the 2 operand\(s\) given, \(src, dst\)"),
    (lambda g, x: gspmm(g, None, "sum", src=x, schedule="vertex"), ValueError, "schedule= must be one of"),
    (lambda g, x: gspmm(g, None, "sum", src=x, schedule=2), TypeError, "schedule= must be one of"),
    (lambda g, x: gspmm(g, None, "max", src=x, schedule="coo"), ValueError, "'coo'.*sum.*mean"),
    (lambda g, x: gspmm(g, None, "sum", src=x, schedule=Schedule("csr", 24)), ValueError, "power of two"),
])
def test_bad_arguments_raise_errors_naming_the_argument(call, error, match):
    g, x = graph_and_x()
    with pytest.raises(error, match=match):
        call(g, x)


def test_untraceable_functions_raise_compile_errors_naming_their_line():
    g, x = graph_and_x()
    with pytest.raises(gnnfuse.CompileError, match=r"test_templates.py:\d+: .*xs.numpy\(\)"):
        gspmm(g, lambda xs: xs.numpy(), "sum", src=x)
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)(edge|row) axis.*test_templates.py:\d+: .*xs.sum\(0\)"):
        gsddmm(g, lambda xs: xs.sum(0), src=x)
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)unsqueeze\(0\) adds an axis among the graph dims \(dim 0.*"
                                                   r"xs.unsqueeze\(0\)"):
        gsddmm(g, lambda xs: xs.unsqueeze(0).squeeze(0), src=x)

    def helper(rows):
        return rows.numpy()
    with pytest.raises(gnnfuse.CompileError, match=r"test_templates.py:\d+: return rows.numpy\(\)"):
        gspmm(g, lambda xs: helper(xs), "sum", src=x)

    def returns_a_number(xs):
        return 1.0
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)one per-edge tensor.*got a float.*test_templates.py:\d+"):
        gsddmm(g, returns_a_number, src=x)


def test_complex_operands_and_captured_tensors_are_refused_by_name():
    """The derivative rules are written for real values: a complex operand's output was
    right but its gradients lacked torch's conjugates (5.6 off for ``a * b``), silently."""
    g = gnnfuse.Graph(SRC, DST, N)
    z = torch.randn(N, F, dtype=torch.complex128, requires_grad=True)
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)input 'src' \(\[6, 3\]\) is torch.complex128.*"
                                                   r"test_templates.py:\d+"):
        gspmm(g, lambda xs, xd: xs * xd, "sum", src=z, dst=z)
    scale = torch.ones(F, dtype=torch.complex64)
    with pytest.raises(gnnfuse.CompileError, match=r"a captured \[3\] tensor is torch.complex64"):
        gsddmm(g, lambda xs: xs * scale, src=torch.randn(N, F))


def test_an_in_place_op_on_the_edge_operand_is_refused_and_on_gathered_rows_is_not():
    """The edge operand is the caller's tensor in eager code (``fn(x[src], w)``), so
    ``w *= 2`` there doubles the caller's ``w``; the compiled call left it as it was,
    silently. The gathered src/dst rows are copies, which the function may write."""
    g, x = graph_and_x()
    w = torch.rand(E, 1, dtype=x.dtype)

    def doubled_weight(xs, e):
        e *= 2.0
        return xs * e

    def doubled_rows(xs, e):
        xs *= 2.0
        return xs * e
    with pytest.raises(gnnfuse.CompileError, match=r"in-place op on the edge operand") as info:
        gspmm(g, doubled_weight, "sum", src=x, edge=w)
    assert "e *= 2.0" in str(info.value)
    torch.testing.assert_close(gsddmm(g, doubled_rows, src=x, edge=w), 2 * x[SRC] * w)


KEPT: list = []
LAST = None


def test_a_function_keeping_its_traced_rows_outside_the_call_is_refused_at_its_line():
    """``KEPT.append(xs)`` (or ``global LAST; LAST = xs``) keeps a tensor in eager code;
    the function runs once, on symbolic rows, so the list was left holding gnnfuse's
    SymTensor, silently. It is refused, naming the variable and its line, and the list
    or global is put back; a value that is not traced is kept as eager code keeps it."""
    g, x = graph_and_x()
    calls = []

    def appends(xs):
        calls.append(1)
        KEPT.append(xs)
        return xs * 2.0

    def rebinds(xs, xd):
        global LAST
        LAST = xs * xd
        return LAST
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)traced value in the global 'KEPT'.*KEPT.append\(xs\)"):
        gsddmm(g, appends, src=x)
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)sets the global 'LAST'.*LAST = xs \* xd"):
        gspmm(g, rebinds, "sum", src=x, dst=x)
    assert KEPT == [] and LAST is None and calls == [1]
