"""``torch.use_deterministic_algorithms(True)`` reaches gnnfuse's Triton kernels
(backend/determinism.py): split hub rows sum their segments' partial results in one
order (`schedule.OrderedSlots`) instead of adding them into a workspace as they finish,
no ``coo`` or ``scan`` schedule, no atomic row scatter or typed weight gradient, fixed
block sizes instead of the autotuner's timed choice; a forced ``coo`` is refused as
torch refuses its own nondeterministic operations, or warned about under
``warn_only=True``. The interpreter runs atomics in program order, so these tests check
what runs (the segments and slots asked for, the schedules, the kernels launched), that
the values equal the reference backend's, and that a split row's bits do not change
when its segments run in another order; benchmarks/check_determinism.py compares bits
on a GPU.
"""
from __future__ import annotations

import pytest
import torch
from oracle_check import device_for

import gnnfuse
import gnnfuse.nn as gnn
from gnnfuse.backend import determinism
from gnnfuse.backend.forced_schedule import ForcedSchedule, forcing
from gnnfuse.backend.triton import executor as triton_executor, schedule, scatter_rows, segment_matmul
from test_one_lane_schedules import hub_graph

DEVICE = device_for("triton")
f64 = torch.float64


@pytest.fixture
def deterministic():
    """Turns torch's switch on for the test (``warn_only`` as the test sets it later) and
    restores both settings after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.fixture
def spied(monkeypatch):
    """Records the segment lengths the executor asks for, the tables its split rows meet
    by and the schedules it plans."""
    asked: dict[str, list] = {"segments": [], "slots": [], "schedules": []}
    for name in ("segments", "split_slots", "partial_slots", "ordered_slots"):
        real = getattr(triton_executor, name)
        monkeypatch.setattr(triton_executor, name,
                            lambda ctx, by, max_edges, *rest, real=real, name=name, **kw:
                            asked["segments"].append(max_edges) or (name != "segments" and asked["slots"].append(name))
                            or real(ctx, by, max_edges, *rest, **kw))
    real_kernel = triton_executor._kernel_for
    monkeypatch.setattr(triton_executor, "_kernel_for",
                        lambda unit, acc, schedule: asked["schedules"].append(schedule) or
                        real_kernel(unit, acc, schedule))
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 16)   # the hub's 90 in-edges: 6 segments
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")    # what torch's own matmuls ask for
    return asked


def _layer_step(layer: torch.nn.Module, graph: gnnfuse.Graph) -> list[torch.Tensor]:
    """Output and every gradient of one forward and backward of ``layer`` on ``graph``."""
    x = torch.randn(graph.num_nodes, 5, dtype=f64, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    x.requires_grad_()
    layer.zero_grad()
    out = layer(x, graph)
    out.square().sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in layer.parameters())]


LAYERS = {"gcn": lambda: gnn.GCNConv(5, 4), "sage": lambda: gnn.SAGEConv(5, 4),
          "gat": lambda: gnn.GATConv(5, 3, heads=2), "gatv2": lambda: gnn.GATv2Conv(5, 3, heads=2)}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_hub_rows_split_in_order_and_values_match_the_reference(name, spied, deterministic, monkeypatch):
    graph = hub_graph().to(DEVICE)
    layer = LAYERS[name]().double().to(DEVICE)
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    expected = _layer_step(layer, graph)
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    got = _layer_step(layer, graph)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # the hub is split, and its segments meet in order or in a merge kernel, never as they finish
    assert 16 in spied["segments"] and "split_slots" not in spied["slots"], spied
    assert spied["schedules"] and not {"coo", "scan"} & set(spied["schedules"]), spied["schedules"]


def _reverse_split_segments(patch: pytest.MonkeyPatch) -> None:
    """Segments built from now on run their split rows' segments in reverse order (they
    stay ahead of the rest, as the ``rows`` kernel needs): in the interpreter, which runs
    programs in order, another order of finishing."""
    real = schedule._build

    def build(rowptr, max_edges, in_order=False):
        segs = real(rowptr, max_edges, in_order)
        split = int((segs.split != 0).sum())

        def flipped(t):
            return torch.cat([t[:split].flip(0), t[split:]])
        return schedule.Segments(flipped(segs.row), flipped(segs.start), flipped(segs.end), flipped(segs.split),
                                 segs.split_rows)
    patch.setattr(schedule, "_build", build)


# (schedule, the tables split rows meet by with the switch off and on)
SPLIT_SUMS = {"csr": ("csr", "split_slots", "ordered_slots"), "rows": ("rows", "split_slots", "ordered_slots"),
              # two sums in one kernel add their split rows into ``out`` atomically; ordered, a merge kernel sums them
              "siblings": ("csr", None, "partial_slots")}


@pytest.mark.parametrize("kind", sorted(SPLIT_SUMS))
def test_a_split_row_has_the_same_bits_whichever_segment_finishes_first(kind, spied, monkeypatch):
    """The hub's 90 in-edges in 6 segments, over features of magnitudes 1e-4 to 1e8 in
    float32, so that the order of the partial sums shows in the bits: with the switch on,
    running the segments in reverse order gives the same bits; with it off the segments
    add as they finish, which in the interpreter is program order, so the bits change
    (on a GPU the order is the hardware's, and may or may not)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    g = torch.Generator().manual_seed(7)
    h = (torch.randn(12, 2, generator=g) * 10.0 ** torch.randint(-4, 9, (12, 1), generator=g)).to(DEVICE)
    w = torch.rand(12, 1, generator=g).to(DEVICE)
    if kind == "siblings":
        layer = gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]) + sum([u.h * u.w for u in v.innbs]))
    else:
        layer = gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]))
    schedule_kind, *tables = SPLIT_SUMS[kind]

    def hub_row(reverse: bool) -> torch.Tensor:
        with monkeypatch.context() as patch:
            if reverse:
                _reverse_split_segments(patch)
            with forcing(ForcedSchedule(schedule_kind)):
                return layer(hub_graph().to(DEVICE), {"h": h, "w": w} if kind == "siblings" else {"h": h})[0]
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    rows = {}
    try:
        for on in (False, True):
            torch.use_deterministic_algorithms(on)
            rows[on] = hub_row(False), hub_row(True)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    assert torch.equal(*rows[True]), rows[True]
    torch.testing.assert_close(rows[True][0], rows[False][0], rtol=1e-5, atol=1e-3)
    if torch.device(DEVICE).type == "cpu":
        assert not torch.equal(*rows[False]), rows[False]
    assert spied["slots"] == [t for t in tables for _ in range(2) if t], spied["slots"]
    assert (kind == "siblings") == ("siblings" in spied["schedules"]), spied["schedules"]


def test_switching_determinism_plans_the_graph_again(spied, monkeypatch):
    """The launch plans are kept per settings: the same graph and layer meet the hub's
    segments as they finish with the switch off, in order with it on, and as they finish
    again after."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    graph, layer = hub_graph().to(DEVICE), gnn.GCNConv(5, 4).double().to(DEVICE)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    seen = []
    try:
        for on in (False, True, False):
            torch.use_deterministic_algorithms(on)
            spied["slots"].clear()
            _layer_step(layer, graph)
            seen.append(set(spied["slots"]))
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    assert seen == [{"split_slots"}, {"ordered_slots"}, {"split_slots"}], seen


def test_low_degree_sums_walk_the_csr_instead_of_adding_atomically(spied, deterministic, monkeypatch):
    """A narrow sum over a graph of average degree below 4 is COO or scan by the cost
    rule; under the switch it walks the CSR."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    g = torch.Generator().manual_seed(5)
    graph = gnnfuse.Graph(torch.randint(0, 40, (60,), generator=g), torch.randint(0, 40, (60,), generator=g),
                          40).to(DEVICE)
    h = torch.randn(40, 1, dtype=f64, generator=g).to(DEVICE)
    layer = gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]))
    out = layer(graph, {"h": h})
    torch.testing.assert_close(out, torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src]))
    torch.use_deterministic_algorithms(False)
    layer(graph, {"h": h * 2})
    assert spied["schedules"][0] == "csr" and spied["schedules"][-1] in ("coo", "scan"), spied["schedules"]


def test_a_forced_coo_schedule_is_refused_or_warned_about(deterministic, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    graph = hub_graph().to(DEVICE)
    h = torch.randn(graph.num_nodes, 3, dtype=f64).to(DEVICE)
    layer = gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]))
    expected = torch.zeros_like(h).index_add_(0, graph.dst, h[graph.src])
    with forcing(ForcedSchedule("coo")), pytest.raises(RuntimeError, match=r"coo\) schedule.*use_deterministic"):
        layer(graph, {"h": h})
    torch.use_deterministic_algorithms(True, warn_only=True)
    with forcing(ForcedSchedule("coo")), pytest.warns(UserWarning, match="deterministic implementation"):
        out = layer(graph, {"h": h})
    torch.testing.assert_close(out, expected)


def test_no_atomic_scatter_or_typed_weight_gradient_kernel(deterministic, monkeypatch):
    """The typed aggregation's row scatter and the segment matmul's weight gradient add
    atomically: under the switch the scatter walks each target's edges in order (its own
    kernel) and the weight gradient takes the torch form, with the same values."""
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    launched = []
    for module in (scatter_rows, segment_matmul):
        def record(*args, launch=module.launch, **kwargs):
            launched.append(args[0])
            launch(*args, **kwargs)
        monkeypatch.setattr(module, "launch", record)
    g = torch.Generator().manual_seed(2)
    table = torch.randn(7, 4, generator=g).to(DEVICE)
    scatter, scale = torch.randint(0, 5, (12,), generator=g).to(DEVICE), torch.rand(12, generator=g).to(DEVICE)
    gather = torch.randint(0, 7, (12,), generator=g).to(DEVICE)
    out = scatter_rows.scatter_scaled_rows(table, gather, scatter, scale, 5)
    expected = torch.zeros(5, 4, device=DEVICE).index_add_(0, scatter, table[gather] * scale[:, None])
    torch.testing.assert_close(out, expected)
    x, grad = torch.randn(10, 4, generator=g).to(DEVICE), torch.randn(10, 3, generator=g).to(DEVICE)
    groups = [torch.tensor([0, 3, 4], device=DEVICE), torch.tensor([1, 2, 5, 6, 7, 8, 9], device=DEVICE)]
    weight_grad = segment_matmul.segment_matmul_tn(x, grad, groups)
    torch.testing.assert_close(weight_grad, torch.stack([x[i].T @ grad[i] for i in groups]))
    assert [kernel.__name__ for kernel in launched] == ["_scatter_rows_in_order"], launched


def test_kernels_launch_fixed_blocks_instead_of_autotuning(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("GNNFUSE_AUTOTUNE", "1")
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        tuned = triton_executor._autotune()
        torch.use_deterministic_algorithms(True)
        assert tuned and not triton_executor._autotune()
        assert determinism.state() == (True, False)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_walks_launch_the_deterministic_blocks_on_one_warp(deterministic, monkeypatch):
    """Under the switch a walk's plan and a sibling group's take `deterministic_csr_blocks`
    (one warp, one segment a program, an edge block by width: 8 for 40 lanes); with it
    off the interpreter's fixed blocks, also on one warp (a plain launch defaults to four)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    monkeypatch.setenv("GNNFUSE_AUTOTUNE", "0")     # on a GPU the switch off would autotune
    h = torch.randn(12, 40, dtype=f64).to(DEVICE)
    walk = gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]))
    group = gnnfuse.vertex(lambda v: sum([u.h for u in v.innbs]) + sum([u.h * 2 for u in v.innbs]) / len(v.innbs))
    launched = []
    real_plan, real_group = triton_executor._launch_plan, triton_executor._SiblingLaunch
    monkeypatch.setattr(triton_executor, "_launch_plan", lambda *a, **k: launched.append(a[5]) or real_plan(*a, **k))
    monkeypatch.setattr(triton_executor, "_SiblingLaunch", lambda *a: launched.append(a[12]) or real_group(*a))
    for layer in (walk, group):
        layer(hub_graph().to(DEVICE), {"h": h})
    torch.use_deterministic_algorithms(False)
    for layer in (walk, group):
        layer(hub_graph().to(DEVICE), {"h": h})
    ordered, fixed = {"BLOCK_E": 8, "ROWS": 1, "num_warps": 1}, {"BLOCK_E": 32, "ROWS": 2, "num_warps": 1}
    assert launched == [{"BLOCK_F": 64, **ordered}, ordered, {"BLOCK_F": 64, **fixed}, fixed], launched


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the loss kernels take CUDA tensors only")
def test_a_loss_over_selected_rows_takes_torch_form(deterministic, monkeypatch):
    """A row selected twice gets its two gradient terms added atomically by the loss
    kernel: under the switch the selection takes torch's loss, with its gradient."""
    from gnnfuse.nn import cross_entropy as loss
    monkeypatch.setattr(loss, "LAUNCHED_ELEMENTS", 0)      # the kernels at any size, launched
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(30, 7, generator=g).cuda().requires_grad_()
    rows = torch.tensor([3, 3, 8, 0, 29, 8], device="cuda")
    target = torch.randint(0, 7, (6,), generator=g).cuda()
    arguments = (logits, target, None, None, None, "mean", 0.0, rows)
    assert not loss._kernels_apply(*arguments)
    out = loss.cross_entropy(logits, target, rows=rows)
    out.backward()
    expected = logits.detach().clone().requires_grad_()
    torch.nn.functional.cross_entropy(expected[rows], target).backward()
    torch.testing.assert_close(out, torch.nn.functional.cross_entropy(expected[rows], target))
    torch.testing.assert_close(logits.grad, expected.grad)
    torch.use_deterministic_algorithms(False)
    assert loss._kernels_apply(*arguments)


def test_a_loss_forward_before_the_switch_takes_a_deterministic_backward_after_it(monkeypatch):
    """The loss kernel ran (switch off); the switch goes on before ``backward()``: the
    gradient is summed by torch's deterministic accumulation, not the kernel's atomics."""
    from gnnfuse.nn import cross_entropy as loss
    if DEVICE == "cpu":     # (not on a GPU: a kernel module first imported under it would be interpreted)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr("gnnfuse.backend.triton.cross_entropy.backward",
                        lambda *a, **k: pytest.fail("the atomic backward kernel ran under the switch"))
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(30, 7, dtype=f64, generator=g).to(DEVICE).requires_grad_()
    rows = torch.tensor([3, 3, 8, 0, -1, 8], device=DEVICE)
    target = torch.tensor([1, 1, 6, -100, 2, 0], device=DEVICE)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        out = loss._SelectedCrossEntropy.apply(logits, target, rows, -100, "mean")     # the kernel path
        torch.use_deterministic_algorithms(True)
        out.backward()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    expected = logits.detach().clone().requires_grad_()
    torch.nn.functional.cross_entropy(expected[rows], target).backward()
    torch.testing.assert_close(logits.grad, expected.grad)
