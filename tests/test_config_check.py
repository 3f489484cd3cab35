"""``GNNFUSE_CHECK_CONFIGS=1``: every autotuning config of a kernel runs on the same
arguments and must write the same values (backend/triton/config_check.py says why).

On a CPU the autotuner cannot time (Triton's interpreter has no benchmarker), so the
kernels here are small autotuned kernels given a stand-in timer, run in the interpreter
on any machine (so they call no ``tl`` function that Triton defines with ``@triton.jit``,
such as ``tl.zeros`` or ``tl.sum``: those are interpretable only when TRITON_INTERPRET
was set before Triton was imported, which on a GPU machine it is not); one of them writes a
value that depends on its block size, standing in for a miscompiled config. On a GPU the
last test runs gnnfuse's own generated kernels (edge units, CSR, COO and scan
reductions, forward and backward) under the check, through the real autotuner.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import gnnfuse
import gnnfuse.nn
from gnnfuse.backend.triton import config_check, executor
from gnnfuse.backend.triton.config_check import ConfigMismatch
from gnnfuse.backend.triton.launch import launch

from every_config import interpret_every_config, untimed

CONFIGS = [triton.Config({"B": 16}, num_warps=1), triton.Config({"B": 32}, num_warps=1)]
N = 100


def _tuned(fn, **kw):
    return triton.autotune(CONFIGS, key=["n"], do_bench=untimed, **kw)(triton.jit(fn))


def _double(x, out, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(out + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)


def _block_dependent(x, out, n, B: tl.constexpr):
    """Right at 16 lanes, NaN in the second half of every block at 32: one config's bug."""
    o = tl.program_id(0) * B + tl.arange(0, B)
    value = tl.load(x + o, mask=o < n) * 2
    value = tl.where((tl.arange(0, B) >= 16) & (B == 32), float("nan"), value)
    tl.store(out + o, value, mask=o < n)


def _atomic_sum(x, out, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.atomic_add(out + o % 4, tl.load(x + o, mask=o < n), mask=o < n)


def _with_scratch(x, out, work, n, B: tl.constexpr):
    """Writes its block size into ``work`` (scratch, like split rows' partial sums)."""
    o = tl.program_id(0) * B + tl.arange(0, B)
    value = tl.load(x + o, mask=o < n)
    tl.store(out + o, value + 1, mask=o < n)
    tl.store(work + o, value * 0 + B, mask=o < n)


def _per_program(x, partials, n, B: tl.constexpr):
    """Block ``b`` adds into ``partials[b % 4]``: which values land in which row depends
    on ``B``, their total does not (a shared reduce's partials)."""
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.atomic_add(partials + tl.program_id(0) % 4 + o * 0, tl.load(x + o, mask=o < n), mask=o < n)


def _per_program_rows(x, rows, n, B: tl.constexpr):
    """`_per_program` writing an ordinary output."""
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.atomic_add(rows + tl.program_id(0) % 4 + o * 0, tl.load(x + o, mask=o < n), mask=o < n)


def _per_program_numbered(x, partials2, n, B: tl.constexpr):
    """`_per_program` with its output numbered, as a sibling kernel numbers its riders'."""
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.atomic_add(partials2 + tl.program_id(0) % 4 + o * 0, tl.load(x + o, mask=o < n), mask=o < n)


def _count_rows(x, counts, n, B: tl.constexpr):
    """An integer output off by one at 32 lanes."""
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(counts + o, (tl.load(x + o, mask=o < n) > 0).to(tl.int32) + (B == 32), mask=o < n)


def _grid(meta):
    return (triton.cdiv(N, meta["B"]),)


@pytest.fixture
def checking(monkeypatch):
    """The check on, on the interpreter's host tensors (these kernels are plain Triton)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(config_check.VARIABLE, "1")


def _launch(kernel, *args):
    launch(kernel, _grid, (N,), args, {})


def test_configs_that_agree_launch_and_are_counted(checking):
    kernel, x, out = _tuned(_double), torch.randn(N), torch.zeros(N)
    before = config_check.checked()
    _launch(kernel, x, out, N)
    after = config_check.checked()
    assert torch.equal(out, x * 2)
    assert after["launches"] == before["launches"] + 1
    assert after["configs"] == before["configs"] + len(CONFIGS)


def test_a_config_writing_other_values_raises_naming_kernel_configs_and_argument(checking):
    kernel, x, out = _tuned(_block_dependent), torch.randn(N), torch.zeros(N)
    with pytest.raises(ConfigMismatch) as raised:
        _launch(kernel, x, out, N)
    message = str(raised.value)
    assert "_block_dependent" in message and "`out`" in message
    assert "B=32" in message and "B=16" in message
    assert "48 of 100 elements differ, the first at index (16,)" in message
    assert torch.equal(out, torch.zeros(N)), "the arguments are restored after the check"


def test_off_by_default(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv(config_check.VARIABLE, raising=False)
    kernel, x, out = _tuned(_block_dependent), torch.randn(N), torch.zeros(N)
    before = config_check.checked()
    _launch(kernel, x, out, N)
    assert config_check.checked() == before


def test_each_config_starts_from_the_arguments_as_given_and_they_are_left_so(checking):
    """An accumulating kernel adds into ``out`` (ones here): each config must add into
    the ones, not into the previous config's sums, and the check leaves the ones for the
    launch that follows it."""
    kernel = _tuned(_atomic_sum)
    x, out = torch.randn(N), torch.ones(4)
    config_check.check_configs(kernel, _grid, (x, out, N), {})
    assert torch.equal(out, torch.ones(4))


def _three_sums(x, out, n, B: tl.constexpr):
    """Adds three float32 values per row into a float64 output, in an order that
    depends on ``B``: float32 rounding then differs in the last bits."""
    o = tl.program_id(0) * B + tl.arange(0, B)
    a = tl.load(x + 3 * o, mask=o < n)
    b = tl.load(x + 3 * o + 1, mask=o < n)
    c = tl.load(x + 3 * o + 2, mask=o < n)
    total = tl.where(B == 16, (a + b) + c, a + (b + c))
    tl.store(out + o, total.to(tl.float64), mask=o < n)


def test_float32_inputs_set_the_tolerance_of_a_float64_output(checking):
    kernel = _tuned(_three_sums)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(N, 3, generator=gen) * torch.tensor([1e4, 1.0, -1e4])
    out = torch.zeros(N, dtype=torch.float64)
    _launch(kernel, x, out, N)
    assert torch.allclose(out, x.double().sum(1), atol=1e-2)


def test_sums_that_cancel_are_compared_at_the_scale_of_their_terms(checking):
    """Every output is a sum that cancels to (almost) zero, e.g. a softmax's gradient
    summed over a row: another order of additions leaves another residue of the terms'
    rounding (0.1 + 0.2 - 0.3 is 5.6e-17 one way and 2.8e-17 the other), so the
    tolerance is taken against the kernel's inputs too, not the outputs alone (on an
    H200, GNNFUSE_CHECK_CONFIGS=1 failed PointTransformerConv's and the pairwise UDFs'
    gradients on such residues)."""
    kernel = _tuned(_three_sums)
    x = torch.tensor([0.1, 0.2, -0.3], dtype=torch.float64).repeat(N, 1)
    out = torch.zeros(N, dtype=torch.float64)
    _launch(kernel, x, out, N)
    assert out.abs().max() < 1e-15


def test_only_the_configs_the_autotuner_keeps_are_compared(checking):
    """A kernel's ``early_config_prune`` hook (segment matmul's `fitting_configs`) drops
    configs the autotuner then never times; the check compares the kept ones only (here
    the pruned config is the block-dependent one, which would otherwise raise)."""
    def keep_16(configs, named_args, **kwargs):
        assert named_args["n"] == N          # the hook sees the call's arguments by name
        return [c for c in configs if c.kwargs["B"] == 16]
    kernel = _tuned(_block_dependent, prune_configs_by={"early_config_prune": keep_16})
    x, out = torch.randn(N), torch.zeros(N)
    before = config_check.checked()
    _launch(kernel, x, out, N)
    assert torch.equal(out, x * 2)
    assert config_check.checked()["configs"] == before["configs"] + 1


def test_partials_are_compared_by_their_total(checking):
    x = torch.randn(N)
    partials = torch.zeros(4)
    _launch(_tuned(_per_program, reset_to_zero=["partials"]), x, partials, N)
    assert torch.allclose(partials.sum(), x.sum(), atol=1e-5)
    with pytest.raises(ConfigMismatch, match="`rows`"):
        _launch(_tuned(_per_program_rows, reset_to_zero=["rows"]), x, torch.zeros(4), N)
    numbered = torch.zeros(4)
    _launch(_tuned(_per_program_numbered, reset_to_zero=["partials2"]), x, numbered, N)
    assert torch.allclose(numbered.sum(), x.sum(), atol=1e-5)


def test_graph_tensors_keep_their_version_counters(checking):
    """A graph's index and layout tensors are kernel arguments; an input whose version
    changed would read as a graph edited after it was built, and an output restored
    between configs is no in-place edit of the caller's either."""
    kernel = _tuned(_atomic_sum)
    x, out = torch.randn(N), torch.ones(4)
    versions = (x._version, out._version)
    config_check.check_configs(kernel, _grid, (x, out, N), {})
    assert (x._version, out._version) == versions


def test_scratch_arguments_are_not_compared(checking):
    kernel, x, out, work = _tuned(_with_scratch), torch.randn(N), torch.zeros(N), torch.zeros(N)
    _launch(kernel, x, out, work, N)
    assert torch.equal(out, x + 1)


def test_integer_outputs_must_match_exactly(checking):
    kernel, x, counts = _tuned(_count_rows), torch.randn(N), torch.zeros(N, dtype=torch.int32)
    with pytest.raises(ConfigMismatch, match="`counts`"):
        _launch(kernel, x, counts, N)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_tolerance_passes_reordered_sums_and_catches_a_lost_sign(dtype):
    gen = torch.Generator().manual_seed(0)
    terms = torch.randn(64, 16, generator=gen, dtype=torch.float64)
    forward = terms.to(dtype).sum(0)
    backward = terms.to(dtype).flip(0).sum(0)    # the same sums in another order
    rtol = config_check.RTOL[dtype]
    assert config_check._difference(forward, backward, rtol) == ""
    flipped = forward.clone()
    flipped[3] = -flipped[3]
    assert "1 of 16 elements differ, the first at index (3,)" in config_check._difference(forward, flipped, rtol)
    with_nan = forward.clone()
    with_nan[5] = float("nan")
    assert "index (5,)" in config_check._difference(forward, with_nan, rtol)
    assert config_check._difference(with_nan, with_nan.clone(), rtol) == "", "NaN in the same place on both sides"


@pytest.fixture
def every_config_interpreted(monkeypatch):
    """gnnfuse's generated kernels built autotuned and run in the interpreter with the
    check on, on the Triton backend: every config of each runs on the same arguments
    (tests/every_config.py says why)."""
    interpret_every_config(monkeypatch)
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")


def _small_graph(gen: torch.Generator, hub: int = 0, types: int = 0) -> gnnfuse.Graph:
    """20 vertices and 90 random edges, plus ``hub`` edges into vertex 0 (past
    `executor.SEGMENT_EDGES` its row is split across programs that meet in a workspace),
    of ``types`` edge types if any."""
    n = 20
    src = torch.cat([torch.randint(0, n, (90,), generator=gen), torch.arange(hub) % n])
    dst = torch.cat([torch.randint(0, n, (90,), generator=gen), torch.zeros(hub, dtype=torch.long)])
    if not types:
        return gnnfuse.Graph(src, dst, n)
    return gnnfuse.Graph(src, dst, n, edge_type=torch.randint(0, types, (len(src),), generator=gen),
                         num_edge_types=types)


def _rows(gen: torch.Generator, graph: gnnfuse.Graph, width: int) -> torch.Tensor:
    return torch.randn(graph.num_nodes, width, generator=gen, requires_grad=True)


def _per_edge(gen: torch.Generator, graph: gnnfuse.Graph) -> torch.Tensor:
    return torch.randn(graph.num_edges, 1, generator=gen, requires_grad=True)


PROGRAMS = {
    "gatv2": lambda gen, g: gnnfuse.nn.GATv2Conv(2, 2)(_rows(gen, g, 2), g),     # attention, shared reduce
    "sage": lambda gen, g: gnnfuse.nn.SAGEConv(4, 4)(_rows(gen, g, 4), g),
    "coo-sum": lambda gen, g: gnnfuse.ops.gspmm(g, lambda s, w: torch.relu(s * w), "sum", src=_rows(gen, g, 4),
                                                edge=_per_edge(gen, g), schedule="coo"),
    "rows-sum": lambda gen, g: gnnfuse.ops.gspmm(g, lambda s, w: torch.relu(s * w), "sum", src=_rows(gen, g, 4),
                                                 edge=_per_edge(gen, g), schedule="rows"),
    "one-lane-sum": lambda gen, g: gnnfuse.ops.gspmm(g, lambda s, d: torch.relu(s * d), "sum", src=_rows(gen, g, 1),
                                                     dst=_rows(gen, g, 1)),
    "max": lambda gen, g: gnnfuse.ops.gspmm(g, lambda s, d: s * d, "max", src=_rows(gen, g, 2), dst=_rows(gen, g, 2)),
    "edge": lambda gen, g: gnnfuse.ops.gsddmm(g, lambda s, w: torch.sqrt(torch.abs(s * w)), src=_rows(gen, g, 4),
                                              edge=_per_edge(gen, g)),
    "split-csr-sum": lambda gen, g: gnnfuse.ops.gspmm(g, lambda s, w: torch.relu(s * w), "sum",
                                                      src=_rows(gen, g, 2), edge=_per_edge(gen, g), schedule="csr"),
    # per-type weights: their gradient rides the backward's sibling kernel as per-program tiles
    "typed-rider": lambda gen, g: gnnfuse.vertex(lambda v: sum([e.src.h * e.type.p for e in v.inedges]))(
        g, {"h": _rows(gen, g, 2)}, None, etype_feature={"p": torch.randn(3, 2, generator=gen, requires_grad=True)}),
}
# What a program needs besides its graph: edge types, a schedule that walks rows
SETTINGS = {"typed-rider": {"types": 3, "GNNFUSE_SCHEDULE": "rows"}}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_config_of_the_generated_kernels_computes_the_same(every_config_interpreted, monkeypatch, name):
    settings = dict(SETTINGS.get(name, {}))
    types = settings.pop("types", 0)
    for variable, value in settings.items():
        monkeypatch.setenv(variable, value)
    gen = torch.Generator().manual_seed(0)
    device = "cpu"      # the interpreter's host tensors (the fixture skips on a GPU machine)
    split = name.startswith("split")
    if split:       # rows past 16 edges split (512 on real graphs): a short hub row keeps the interpreter quick
        monkeypatch.setattr(executor, "SEGMENT_EDGES", 16)
    graph = _small_graph(gen, hub=40 if split else 0, types=types).to(device)
    before = config_check.checked()
    PROGRAMS[name](gen, graph).sum().backward()
    launches, configs = (config_check.checked()[k] - before[k] for k in ("launches", "configs"))
    assert launches >= 2, "forward and backward kernels were checked"
    assert configs > launches, "the kernels ran more than one config each"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="gnnfuse's generated kernels are autotuned on a GPU only")
def test_generated_kernels_agree_across_every_config_on_a_gpu(monkeypatch):
    """Programs of each kernel family (an edge unit, COO and CSR sums with a split hub
    row, a scan over one lane, a max, their backward passes, GATv2's shared reduce, GAT's
    sibling kernels, R-GCN's typed kernels) launched for the first time with the check on:
    every config of every tuned kernel must write what the first wrote."""
    monkeypatch.setenv(config_check.VARIABLE, "1")
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = "cuda"
    gen = torch.Generator().manual_seed(3)
    n, e = 3001, 40_003      # sizes no other test launches, so these launches are first ones
    hub = 700                # edges into vertex 0: its row is split across programs
    src = torch.cat([torch.randint(0, n, (e - hub,), generator=gen), torch.arange(hub) % n])
    dst = torch.cat([torch.randint(0, n, (e - hub,), generator=gen), torch.zeros(hub, dtype=torch.long)])
    graph = gnnfuse.Graph(src, dst, n).to(device)
    before = config_check.checked()
    for width in (1, 8, 40):
        x = torch.randn(n, width, generator=gen).to(device).requires_grad_()
        w = torch.randn(e, 1, generator=gen).to(device).requires_grad_()
        parts = [
            gnnfuse.ops.gsddmm(graph, lambda s, ew: torch.sqrt(torch.abs(s * ew)), src=x, edge=w),
            gnnfuse.ops.gspmm(graph, lambda s, ew: torch.relu(s * ew), "sum", src=x, edge=w, schedule="coo"),
            gnnfuse.ops.gspmm(graph, lambda s, ew: torch.relu(s * ew), "sum", src=x, edge=w, schedule="csr"),
            gnnfuse.ops.gspmm(graph, lambda s, d: s * d, "max", src=x, dst=x),
        ]
        sum(p.sum() for p in parts).backward()
    x = torch.randn(n, 8, generator=gen).to(device)
    gnnfuse.nn.GATv2Conv(8, 4, heads=2).to(device)(x, graph).sum().backward()   # a shared reduce
    gnnfuse.nn.GATConv(8, 4, heads=2).to(device)(x, graph).sum().backward()     # sibling kernels
    relations = torch.randint(0, 3, (e,), generator=gen).to(device)
    gnnfuse.nn.RGCNConv(8, 4, 3).to(device)(x, graph.edge_index, relations).sum().backward()   # typed kernels
    after = config_check.checked()
    launches, configs = (after[k] - before[k] for k in ("launches", "configs"))
    assert launches > 8
    assert configs > launches, "tuned kernels ran more than one config each"
