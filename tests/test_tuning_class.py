"""A small launch of a kernel already launched at another size class reuses that tuned
choice (`backend.triton.tuning_class`): a mini-batch block with a handful of segments
must not stop the epoch to compile and time every configuration."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from gnnfuse.backend.triton.codegen import size_class  # noqa: E402
from gnnfuse.backend.triton.tuning_class import tuning_class  # noqa: E402


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
