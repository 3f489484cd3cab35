"""``GNNFUSE_CHECK_CONFIGS=1``: every autotuning config of a kernel runs on the same
arguments and must write the same values (backend/triton/config_check.py says why).

On a CPU the autotuner cannot time (Triton's interpreter has no benchmarker), so the
kernels here are small autotuned kernels given a stand-in timer; one of them writes a
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
from gnnfuse.backend.triton import config_check
from gnnfuse.backend.triton.config_check import ConfigMismatch
from gnnfuse.backend.triton.launch import launch

CONFIGS = [triton.Config({"B": 16}, num_warps=1), triton.Config({"B": 32}, num_warps=1)]
N = 100


def _first(fn, quantiles):
    """The autotuner's timer on a CPU: one run, every config equally fast."""
    fn()
    return [1.0, 1.0, 1.0]


def _tuned(fn, **kw):
    return triton.autotune(CONFIGS, key=["n"], do_bench=_first, **kw)(triton.jit(fn))


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
    tl.store(out + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)
    tl.store(work + o, tl.zeros([B], tl.float32) + B, mask=o < n)


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


def _row_sums(x, out, n, B: tl.constexpr):
    """Sums rows of 64 float32 values ``B`` at a time into a float64 output: another
    block size adds in another order."""
    row = tl.program_id(0)
    acc = tl.zeros([B], tl.float32)
    for start in range(0, 64, B):
        acc += tl.load(x + row * 64 + start + tl.arange(0, B))
    tl.store(out + row, tl.sum(acc, 0).to(tl.float64))


def test_float32_inputs_set_the_tolerance_of_a_float64_output(checking):
    kernel = _tuned(_row_sums)
    x = torch.randn(N, 64, generator=torch.Generator().manual_seed(1)) * 1000
    out = torch.zeros(N, dtype=torch.float64)
    config_check.check_configs(kernel, lambda meta: (N,), (x, out, N), {})
    launch(kernel, lambda meta: (N,), (N,), (x, out, N), {})
    assert torch.allclose(out, x.double().sum(1), rtol=1e-5)


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="gnnfuse's generated kernels are autotuned on a GPU only")
def test_generated_kernels_agree_across_every_config_on_a_gpu(monkeypatch):
    """Programs of each kernel family (an edge unit, a COO and a CSR sum, a scan over one
    lane, a max, and their backward passes) launched for the first time with the check
    on: every config of every tuned kernel must write what the first wrote."""
    monkeypatch.setenv(config_check.VARIABLE, "1")
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = "cuda"
    gen = torch.Generator().manual_seed(3)
    n, e = 3001, 40_003      # sizes no other test launches, so these launches are first ones
    graph = gnnfuse.Graph(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen),
                          n).to(device)
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
    after = config_check.checked()
    launches, configs = (after[k] - before[k] for k in ("launches", "configs"))
    assert launches > 8
    assert configs > launches, "tuned kernels ran more than one config each"
