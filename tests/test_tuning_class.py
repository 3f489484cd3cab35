"""A new size class next to one a kernel was already launched at reuses that tuned
choice (`backend.triton.tuning_class`): a mini-batch block crossing a power of two must
not stop the epoch to tune every configuration again."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from gnnfuse.backend.triton.codegen import size_class  # noqa: E402
from gnnfuse.backend.triton.tuning_class import tuning_class  # noqa: E402


class Kernel:
    """Stands in for a tuned kernel: only its identity matters."""


def test_a_kernels_first_class_and_far_classes_tune_and_neighbours_reuse():
    kernel = Kernel()
    first = 3000                                          # class 12
    assert tuning_class(kernel, first) == size_class(first) == 12
    assert tuning_class(kernel, 5000) == 12, "class 13 next to 12 reuses 12's choice"
    assert tuning_class(kernel, 1500) == 12, "class 11 too"
    assert tuning_class(kernel, 4000) == 12, "its own class stays"
    assert tuning_class(kernel, 60_000) == 16, "a count 20x larger (another graph) tunes its own"
    assert tuning_class(kernel, 40_000) == 16, "and class 15 then sits next to 16"
    assert tuning_class(kernel, 10_000) == 14, "class 14 is next to neither 12 nor 16: it tunes"


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
    assert tuning_class(kernel, 3000) == 12, "class 12 is not small and not next to 17: it tunes"
    assert tuning_class(kernel, 20) == 12, "the nearest launched class serves a small one"
    first_small = Kernel()
    assert tuning_class(first_small, 1) == 1, "a kernel's first launch tunes, small or not"
    assert tuning_class(first_small, 5000) == 13
