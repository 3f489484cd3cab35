"""gnnfuse used from several threads of one process: a vertex function's trace swaps some
builtins for the whole process (frontend/vertex.py), and kernel modules are written,
imported and registered once (backend/kernel_cache.py)."""
from __future__ import annotations

import builtins
import pickle
import queue
import threading
from typing import Callable

import pytest
import torch
import torch_geometric.nn

import gnnfuse
import gnnfuse.nn
from gnnfuse.backend import kernel_cache
from gnnfuse.nn import pyg_layers


def test_another_threads_zip_is_the_builtin_while_a_vertex_function_traces():
    """The swapped zip drained a generator argument into a list in every thread:
    ``zip(gen, range(2))`` consumed the whole generator, silently."""
    seen = []

    def other_thread():
        gen = (i for i in range(10))
        pairs = list(zip(gen, range(2)))
        seen.append((pairs, list(gen), builtins.len([1, 2, 3])))

    def neighbour_sum(v):
        thread = threading.Thread(target=other_thread)      # runs while the builtins are swapped
        thread.start()
        thread.join()
        return {"h": sum([u.h for u in v.innbs])}
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    x = torch.randn(3, 2)
    out = gnnfuse.vertex(neighbour_sum)(graph, {"h": x})["h"]
    torch.testing.assert_close(out, x[[2, 0, 1]])
    assert seen and seen[0] == ([(0, 0), (1, 1)], list(range(3, 10)), 3)


def test_kernel_modules_bind_the_builtins_as_at_import(tmp_path, monkeypatch):
    """A Numba kernel compiled in another thread during a trace read the swapped ``min``
    ("Untyped global name 'min'"), and kept failing afterwards."""
    monkeypatch.setenv("GNNFUSE_CACHE", str(tmp_path))
    real_min = builtins.min
    monkeypatch.setattr(builtins, "min", lambda *args: real_min(*args))      # as a trace's swap does
    kernel = kernel_cache.load_kernel("def smallest(a, b):\n    return min(a, b)\n", "smallest")
    assert kernel.__globals__["min"] is real_min and kernel(3, 2) == 2


def test_threads_loading_kernels_at_once_each_get_them(tmp_path, monkeypatch):
    """Threads shared one temporary file name (the process id's): one's rename found it gone
    (FileNotFoundError), or another imported a half-initialised module."""
    monkeypatch.setenv("GNNFUSE_CACHE", str(tmp_path))
    sources = [f"def kernel_{i}(a):\n    return a + {i}\n" for i in range(6)]
    barrier, results, errors = threading.Barrier(8), [], []

    def load():
        barrier.wait()
        try:
            results.append([kernel_cache.load_kernel(src, f"kernel_{i}")(1) for i, src in enumerate(sources)])
        except Exception as error:  # noqa: BLE001 - any failure is the finding
            errors.append(repr(error))
    threads = [threading.Thread(target=load) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and results == [[1 + i for i in range(6)]] * 8
    assert not list(tmp_path.rglob("*.tmp"))


class _ServedConv(torch_geometric.nn.MessagePassing):
    """A user's layer, compiled by `test_threads_compiling_one_class_at_once_share_its_compiled_class`."""

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


def _both_threads_in(build: Callable) -> Callable:
    """``build``, made to wait (up to 1 s) until a second thread calls it too: where
    nothing stops the second thread, both build."""
    both_building = threading.Barrier(2)

    def waiting(*args):
        try:
            both_building.wait(timeout=1)
        except threading.BrokenBarrierError:
            pass
        return build(*args)
    return waiting


def test_threads_compiling_one_class_at_once_share_its_compiled_class(monkeypatch):
    """Two threads that first compiled a class at once each built a class of their own: the
    layers of the one that lost the race were not ``isinstance`` of ``compiled_class(cls)``,
    and pickling them failed ("it's not the same object as ...compiled:...")."""
    monkeypatch.setattr(pyg_layers, "_compiling_subclass", _both_threads_in(pyg_layers._compiling_subclass))
    monkeypatch.delattr(_ServedConv, "_gnnfuse_compiled_class", raising=False)
    layers = []
    threads = [threading.Thread(target=lambda: layers.append(gnnfuse.nn.compiled_class(_ServedConv)()))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    compiled = gnnfuse.nn.compiled_class(_ServedConv)
    assert [type(layer) for layer in layers] == [compiled, compiled]
    for layer in layers:
        assert type(pickle.loads(pickle.dumps(layer))) is compiled


def test_threads_first_asking_for_a_pyg_model_class_at_once_share_it(monkeypatch):
    """``gnnfuse.nn.GCN`` was built under ``functools.cache``, which let every thread
    asking at once build a class of its own (eight threads: eight classes), and a model of
    any but the one kept failed to pickle ("it's not the same object as gnnfuse.nn.GCN")."""
    from torch_geometric.nn.models import basic_gnn

    from gnnfuse.nn import pyg_models
    monkeypatch.setattr(pyg_models, "inference_method", _both_threads_in(pyg_models.inference_method))   # a build step
    monkeypatch.setattr(basic_gnn.GCN, "_gnnfuse_model_class", None, raising=False)     # built afresh, then restored
    models = []
    threads = [threading.Thread(target=lambda: models.append(gnnfuse.nn.GCN(4, 8, 2, 3))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [type(model) for model in models] == [gnnfuse.nn.GCN] * 2
    for model in models:
        assert type(pickle.loads(pickle.dumps(model))) is gnnfuse.nn.GCN


def test_another_threads_random_draws_during_a_trace_are_not_the_functions():
    """The generators' states are the process's: a vertex function traced while another
    thread drew (a training thread's dropout, a model's initial weights) was refused as
    drawing a random number itself, at every first call (20 of 20 beside a thread calling
    ``torch.rand``). Its own draw is still refused there."""
    asks, answers = queue.Queue(), queue.Queue()

    def drawing_thread():
        while asks.get() is not None:
            torch.rand(8)
            answers.put(True)
    thread = threading.Thread(target=drawing_thread)
    thread.start()

    def another_thread_draws():
        asks.put(True)
        answers.get(timeout=10)

    @gnnfuse.vertex
    def neighbour_sum(v):
        another_thread_draws()
        return {"h": sum([u.h for u in v.innbs])}

    @gnnfuse.vertex
    def scaled_by_a_draw(v):
        another_thread_draws()
        return {"h": sum([u.h * float(torch.rand(())) for u in v.innbs])}
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    x = torch.randn(3, 2)
    try:
        torch.testing.assert_close(neighbour_sum(graph, {"h": x})["h"], x[[2, 0, 1]])
        with pytest.raises(gnnfuse.CompileError, match="draws a random number"):
            scaled_by_a_draw(graph, {"h": x})
    finally:
        asks.put(None)
        thread.join()
