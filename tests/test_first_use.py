"""Kernels compiled on their first call are counted, timed and announced once
(`backend.first_use`): a cold CPU-backend epoch spent a silent minute compiling."""
from __future__ import annotations

import time

import pytest
import torch

import gnnfuse
from gnnfuse.backend import first_use, kernel_cache

SOURCE = "def twice(x):\n    return 2 * x\n"


def test_a_source_new_to_the_cache_folder_compiles_on_its_first_call_only(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNFUSE_CACHE", str(tmp_path))
    monkeypatch.setattr(kernel_cache, "_KERNELS", {})
    kernel = kernel_cache.load_kernel(SOURCE, "twice")
    assert kernel_cache.first_call_compiles(kernel)
    assert first_use.call_compiling(kernel, kernel, 21) == 42
    assert not kernel_cache.first_call_compiles(kernel)
    monkeypatch.setattr(kernel_cache, "_KERNELS", {})             # a later process: the file is there
    again = kernel_cache.load_kernel(SOURCE, "twice")
    assert again is not kernel and not kernel_cache.first_call_compiles(again)


def test_compiles_are_tallied_and_the_first_is_announced_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(first_use, "_ANNOUNCED", [])
    monkeypatch.setattr(first_use, "stderr_is_terminal", lambda: True)
    before = first_use.compiled_so_far()
    assert first_use.compiled_since(before) == ""
    for _ in range(2):
        first_use.call_compiling(object(), time.sleep, 0.01)
    kernels, seconds = first_use.compiled_so_far()
    assert kernels == before[0] + 2 and seconds >= before[1] + 0.02
    assert first_use.compiled_since(before).startswith(" (of which 0.0 s compiling 2 kernels on first use")
    assert capsys.readouterr().err.count("gnnfuse: compiling CPU kernels on first use") == 1


def test_the_cpu_backend_counts_the_compile_of_a_kernel_new_to_this_machine(tmp_path, monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_CACHE", str(tmp_path))
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    monkeypatch.setattr(kernel_cache, "_KERNELS", {})        # not one an earlier test loaded

    @gnnfuse.vertex
    def scaled_sum(v):
        return sum([u.h for u in v.innbs]) * 3.0

    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    x = torch.randn(3, 2)
    before = first_use.compiled_so_far()
    out = scaled_sum(graph, {"h": x})
    after = first_use.compiled_so_far()
    assert after[0] > before[0] and after[1] > before[1]
    torch.testing.assert_close(out, 3 * torch.zeros(3, 2).index_add_(0, graph.dst, x[graph.src]))
    scaled_sum(graph, {"h": x})
    assert first_use.compiled_so_far() == after                      # compiled once


def test_a_slow_first_launch_of_an_autotuned_triton_kernel_is_counted_once(monkeypatch, capsys):
    """The Triton path: a first launch per signature that takes `COMPILE_SECONDS` or
    more compiled and tuned (a fast one loaded from Triton's caches and is not counted);
    later launches replay the chosen config and are never counted."""
    triton = pytest.importorskip("triton")
    import triton.language as tl
    from gnnfuse.backend.triton.launch import launch

    @triton.autotune(configs=[triton.Config({"B": 4})], key=["n"])
    @triton.jit
    def add_one(x, n, B: tl.constexpr):
        offs = tl.arange(0, B)
        tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)

    monkeypatch.setattr(first_use, "_ANNOUNCED", [])
    monkeypatch.setattr(first_use, "stderr_is_terminal", lambda: True)
    monkeypatch.setattr(first_use, "COMPILE_SECONDS", 0.0)
    x = torch.zeros(4, device="cuda" if torch.cuda.is_available() else "cpu")
    before = first_use.compiled_so_far()
    for _ in range(3):
        launch(add_one, lambda meta: (1,), (4,), (x, 4), {})
    assert x.tolist() == [3.0] * 4
    assert first_use.compiled_so_far()[0] == before[0] + 1
    assert "compiled and tuned a GPU kernel" in capsys.readouterr().err
    monkeypatch.setattr(first_use, "COMPILE_SECONDS", 1e9)       # as fast as a load from the caches
    launch(add_one, lambda meta: (1,), (8,), (x, 4), {})          # another signature: a first launch
    assert first_use.compiled_so_far()[0] == before[0] + 1
