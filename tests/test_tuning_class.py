"""A small launch of a kernel already launched at another size class reuses that tuned
choice (`backend.triton.tuning_class`): a mini-batch block with a handful of segments
must not stop the epoch to compile and time every configuration."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

import gnnfuse  # noqa: E402
from gnnfuse.backend.triton import executor  # noqa: E402
from gnnfuse.backend.triton.codegen import size_class  # noqa: E402
from gnnfuse.backend.triton.tuning_class import tuning_class  # noqa: E402
from oracle_check import device_for  # noqa: E402


class Kernel:
    """Stands in for a tuned kernel: only its identity matters."""


def test_large_classes_tune_their_own_choice():
    kernel = Kernel()
    assert tuning_class(kernel, 3000) == size_class(3000) == 12
    assert tuning_class(kernel, 5000) == 13, "a graph twice the size gets its own choice"
    assert tuning_class(kernel, 4000) == 12, "and a class launched before stays its own"
    assert tuning_class(kernel, 60_000) == 16


def test_kernels_keep_their_own_classes_and_empty_launches_record_nothing():
    one, other = Kernel(), Kernel()
    assert tuning_class(one, 0) == 0
    assert tuning_class(one, 3000) == 12, "an empty launch did not make 0 the first class"
    assert tuning_class(other, 5000) == 13, "another kernel has launched nothing yet"
    assert tuning_class(None, 5000) == 13, "no kernel: the count's own class"


def test_small_launches_reuse_the_nearest_launched_class_whatever_the_distance():
    """A block's launch over a handful of segments (classes 1 to 9) is microseconds with
    any configuration; tuning it compiled every configuration mid-epoch (4.75 s)."""
    kernel = Kernel()
    assert tuning_class(kernel, 100_000) == 17
    assert tuning_class(kernel, 2) == 17 and tuning_class(kernel, 300) == 17
    assert tuning_class(kernel, 3000) == 12, "class 12 is not small: it tunes"
    assert tuning_class(kernel, 20) == 12, "the nearest launched class serves a small one"
    first_small = Kernel()
    assert tuning_class(first_small, 1) == 1, "a kernel's first launch tunes, small or not"
    assert tuning_class(first_small, 5000) == 13


def test_the_executor_launches_with_the_class_tuning_class_gives(monkeypatch):
    """The Triton backend's launches (a GAT layer's forward and backward: sibling,
    aggregate and edge kernels) pass the class `tuning_class` gives -- a spy's 99 here
    -- as their ``size_class`` and key size, so the rule above decides what the
    autotuner is asked for."""
    asked, launched = [], []

    def spy(kernel, count):
        asked.append(count)
        return 99

    def recording_launch(kernel, grid, sizes, args, kwargs, known_signature=None):
        launched.append((sizes[0], 99 in [a for a in args if isinstance(a, int)]))
        launch(kernel, grid, sizes, args, kwargs, known_signature)
    launch = executor.launch
    monkeypatch.setattr(executor, "tuning_class", spy)
    monkeypatch.setattr(executor, "launch", recording_launch)
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    generator = torch.Generator().manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 30, (120,), generator=generator),
                          torch.randint(0, 30, (120,), generator=generator), 30).to(device)
    layer = gnnfuse.nn.GATConv(8, 4, heads=2).to(device)
    layer(torch.randn(30, 8, device=device, requires_grad=True), graph).sum().backward()
    assert asked and all(count > 0 for count in asked)
    assert launched and all(size == 99 and passed for size, passed in launched), launched
