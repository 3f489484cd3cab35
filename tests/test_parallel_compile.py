"""An autotuner's first tuning round compiles its configs side by side
(backend/triton/parallel_compile.py), and the CSR walks that recompute per-head values
lane by lane leave out the edge chunks whose tiles spill (`codegen.recomputed_lanes`).

This machine has no GPU, so Triton's autotuner never runs here: the round is driven
through a stand-in with the autotuner's two methods the module relies on and a JIT
function that compiles the way Triton's does (inside an asynchronous compile mode it
submits the compile and returns a placeholder; outside it compiles in place). That
Triton's own classes still have those methods, and that its JIT function still consults
the asynchronous mode, is checked against the installed Triton. On a GPU the last test
compiles a real autotuned kernel's configs."""
from __future__ import annotations

import inspect
import re
import threading
import time

import pytest
import torch

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.backend.triton import codegen, parallel_compile
from gnnfuse.passes.fusion import AggregateUnit, partition


class _Config:
    def __init__(self, block: int) -> None:
        self.block = block

    def all_kwargs(self) -> dict[str, int]:
        return {"BLOCK": self.block}


class _JitFunction:
    """Compiles per ``BLOCK`` as Triton's JIT function does: under an active
    asynchronous compile mode it submits the compile (with the finalize step that puts
    the kernel in its cache, and the cleanup step where this Triton's mode takes one);
    otherwise it compiles in place. Records each compile's thread."""

    def __init__(self) -> None:
        self.cache: dict[int, str] = {}
        self.compiles: list[tuple[int, str]] = []
        self.launches: list[int] = []

    def run(self, *args, grid, warmup, BLOCK: int, **kwargs):
        from triton.runtime import _async_compile
        kernel = self.cache.get(BLOCK)
        if kernel is None:
            mode = _async_compile.active_mode.get()
            if mode is not None:
                steps = [lambda: self._compile(BLOCK), lambda done: self.cache.__setitem__(BLOCK, done),
                         lambda failed: self.cache.pop(BLOCK, None)]    # compile, finalize, cleanup (3.7+)
                taken = len(inspect.signature(mode.submit).parameters) - 1     # but the key
                kernel = self.cache[BLOCK] = mode.submit(("kernel", BLOCK), *steps[:taken])
            else:
                kernel = self.cache[BLOCK] = self._compile(BLOCK)
        if not warmup:
            self.launches.append(BLOCK)
        return kernel

    def _compile(self, block: int) -> str:
        time.sleep(0.02)
        self.compiles.append((block, threading.current_thread().name))
        return f"compiled {block}"


class _Autotuner:
    """The two methods of Triton's ``Autotuner`` that `parallel_compile.install` uses,
    and a tuning round that benchmarks each config in turn, as ``Autotuner.run`` does."""

    def __init__(self, blocks: tuple[int, ...]) -> None:
        self.fn = _JitFunction()
        self.configs = [_Config(b) for b in blocks]
        self.benchmarked: list[int] = []

    def prune_configs(self, kwargs):
        return self.configs

    def _bench(self, *args, config, **meta):
        self.fn.run(*args, **meta, **config.all_kwargs())
        self.benchmarked.append(config.block)
        return [1.0 / config.block]

    def tuning_round(self, *args, grid):
        for config in self.prune_configs({"grid": grid, "warmup": False}):
            self._bench(*args, config=config, grid=grid, warmup=False)


def test_a_tuning_round_compiles_every_config_on_its_own_threads_before_timing_them(monkeypatch):
    monkeypatch.setenv(parallel_compile.VARIABLE, "3")
    tuner = _Autotuner((4, 8, 16, 64))
    before = parallel_compile.compiled()
    parallel_compile.install(tuner)
    parallel_compile.install(tuner)             # once per autotuner: not wrapped twice
    tuner.tuning_round("x", grid=(1,))
    assert sorted(block for block, _ in tuner.fn.compiles) == [4, 8, 16, 64]     # each once
    assert all(name.startswith("gnnfuse-compile") for _, name in tuner.fn.compiles), tuner.fn.compiles
    assert tuner.benchmarked == [4, 8, 16, 64] and tuner.fn.launches == [4, 8, 16, 64]
    assert all(isinstance(tuner.fn.cache[b], str) for b in (4, 8, 16, 64))    # placeholders resolved
    after = parallel_compile.compiled()
    assert (after["rounds"] - before["rounds"], after["configs"] - before["configs"]) == (1, 4)
    tuner.tuning_round("x", grid=(1,))          # a later round (another size class): nothing new
    assert len(tuner.fn.compiles) == 4


def test_one_thread_leaves_compiling_to_the_timed_runs(monkeypatch):
    monkeypatch.setenv(parallel_compile.VARIABLE, "1")
    tuner = _Autotuner((4, 8))
    parallel_compile.install(tuner)
    tuner.tuning_round("x", grid=(1,))
    assert tuner.fn.compiles == [(4, threading.current_thread().name), (8, threading.current_thread().name)]


def test_a_triton_without_the_async_mode_compiles_in_the_timed_runs(monkeypatch):
    """Older Triton releases: nothing is wrapped and nothing compiled ahead, config
    check included (it calls `compile_configs` directly), and the round still runs."""
    monkeypatch.setattr(parallel_compile, "AsyncCompileMode", None)
    monkeypatch.setenv(parallel_compile.VARIABLE, "4")
    tuner = _Autotuner((4, 8))
    parallel_compile.install(tuner)
    parallel_compile.compile_configs(tuner, tuner.configs, ("x",), {"grid": (1,)})
    assert tuner.fn.compiles == []
    tuner.tuning_round("x", grid=(1,))
    assert [name for _, name in tuner.fn.compiles] == [threading.current_thread().name] * 2


@pytest.mark.parametrize("value", ["0", "-2", "many", "1.5"])
def test_a_bad_thread_count_says_what_was_wrong(monkeypatch, value):
    monkeypatch.setenv(parallel_compile.VARIABLE, value)
    with pytest.raises(ValueError, match=parallel_compile.VARIABLE):
        parallel_compile.threads()


def test_the_installed_triton_offers_what_parallel_compile_uses():
    """If a Triton release renames these, the stand-ins above would still pass while
    real autotuners silently compiled serially again: this fails instead."""
    from triton.runtime import _async_compile, jit
    from triton.runtime.autotuner import Autotuner
    assert parallel_compile.AsyncCompileMode is _async_compile.AsyncCompileMode
    assert {"config"} <= set(inspect.signature(Autotuner._bench).parameters)
    assert callable(Autotuner.prune_configs)
    assert "_async_compile.active_mode" in inspect.getsource(jit.JITFunction._do_compile)


def _gat_csr_sources(heads: int, channels: int, concat: bool):
    """(unit, kernel source as the GPU gets it) for the CSR walks of GATConv's forward
    and backward plans."""
    layer = gnn.GATConv(5, channels, heads=heads, concat=concat)
    x = torch.randn(9, 5, requires_grad=True)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 0], [1, 2, 3, 4, 5, 6, 7, 8, 0, 4]])
    [program] = gnnfuse.explain(lambda xs: layer(xs, edge_index), x).programs
    compiled = program.call.compiled
    for plan in (compiled.program, compiled.backward_for(program.call.wrt).program):
        for unit in partition(plan):
            if isinstance(unit, AggregateUnit):
                yield unit, codegen.generate(unit, "fused_aggregate", "tl.float32", tuned=True)[0]


def _edge_blocks(source: str) -> set[int]:
    return {int(b) for b in re.findall(r"'BLOCK_E': (\d+)", source)}


def test_walks_recomputing_head_values_per_lane_leave_out_spilling_edge_chunks():
    """PyG's GAT's last layer (8 heads x 47 classes, averaged) walks rows in 128-lane
    blocks whose every lane evaluates its own head's attention weight: with 64-edge
    chunks over one warp that tile held 256 values a thread, and each such config took
    Triton 3.6 11-16 s to compile on an H200 (the autotuner picked 4-edge chunks). Those
    walks keep only chunks within `TILE_VALUES_PER_THREAD`; walks of whole heads (8 x 32)
    and per-head score sums keep the whole space."""
    limit = codegen.TILE_VALUES_PER_THREAD * 32     # one warp per CSR program
    per_lane = [(unit, source) for unit, source in _gat_csr_sources(8, 47, concat=False)
                if unit.reduce.shape == (8, 47)]
    assert len(per_lane) >= 2       # the forward weighted sum and the backward's by-source sum
    for unit, source in per_lane:
        assert codegen.recomputed_lanes(unit) == codegen.CSR_WIDEST_BLOCK
        assert _edge_blocks(source) == {b for b in codegen.CSR_EDGE_BLOCKS if b * codegen.CSR_WIDEST_BLOCK <= limit}
    whole = list(_gat_csr_sources(8, 32, concat=True))
    assert len(whole) >= 4
    for unit, source in whole:
        assert codegen.recomputed_lanes(unit) == 0
        assert _edge_blocks(source) == set(codegen.CSR_EDGE_BLOCKS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles for a GPU")
def test_a_real_autotuned_kernel_compiles_its_configs_on_compile_threads(monkeypatch, tmp_path):
    import triton.language as tl
    import triton.compiler
    from gnnfuse.backend.triton.launch import launch
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))     # nothing found compiled on disk
    monkeypatch.setenv(parallel_compile.VARIABLE, "4")
    monkeypatch.setenv("GNNFUSE_CHECK_CONFIGS", "0")     # its runs of every config would compile them first
    threads = []
    compile_ = triton.compiler.compile

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return compile_(*args, **kwargs)
    monkeypatch.setattr(triton.compiler, "compile", recording)

    @triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (64, 128) for w in (1, 2)],
                     key=["n"])
    @triton.jit
    def double(x, y, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)

    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    before = parallel_compile.compiled()
    launch(double, lambda meta: (triton.cdiv(1000, meta["BLOCK"]),), (1000,), (x, y, 1000), {})
    torch.testing.assert_close(y, x * 2)
    assert parallel_compile.compiled()["configs"] - before["configs"] == 4
    assert len(threads) == 4, threads
    assert all(name.startswith("gnnfuse-compile") for name in threads), threads
