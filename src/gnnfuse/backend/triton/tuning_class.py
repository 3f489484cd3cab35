"""Which tuned configuration a launch asks the autotuner for (its ``size_class``).

The generated kernels are tuned per `codegen.size_class`, the bit length of the edge or
segment count: counts within a factor of two share a choice. Mini-batch blocks change
size from batch to batch, so a block whose count crosses a power of two had the
autotuner compile and time every configuration in the middle of an epoch. On a fresh
H200 (cold compile caches) that was one step of 4.5 s among steps of 9 ms in a
products-sized GraphSAGE epoch; with several data-parallel ranks, each rank's stall held
up every other rank at the next all-reduce, and the first 4-GPU invocation of the
benchmark on a fresh machine read x0.41 where later ones read x3
(`benchmarks/results/scaling_cuda.md`).

A first fix let a new class next to a launched one (counts within a factor of four)
reuse its choice, and did not remove that stall: on a second fresh machine (Triton
printing its tuning) the launches that tuned inside the timed epoch were tiny ones,
classes 1, 2, 5, 6 and 9 (1 to 511 segments or edges), while the larger classes (11 to
17) had tuned in the warm-up; class 2 took 4.75 s and class 5 5.10 s, compiling every
configuration for a new specialization of the count.

So a kernel that this process has launched at some class reuses the nearest such class's
choice for a new class below `SMALL_CLASS`, where the launch takes microseconds whichever
configuration runs it. Larger classes tune as before (neighbouring ones were not seen to
stall, and a process that trains on graphs of several sizes wants each one's choice). A
kernel's first launch tunes, whatever its class. The choice only changes speed, never
values.
"""
from __future__ import annotations

import weakref
from typing import Any

from .codegen import size_class

SMALL_CLASS = 10       # counts below 2**(SMALL_CLASS - 1) = 512 edges or segments
_CLASSES: "weakref.WeakKeyDictionary[Any, set[int]]" = weakref.WeakKeyDictionary()


def tuning_class(kernel: Any, count: int) -> int:
    """The ``size_class`` argument of ``kernel``'s launch over ``count`` edges or
    segments: ``size_class(count)``, or a class this process has launched ``kernel`` at,
    when it has not launched it at that one and the new class is small (see the
    module doc)."""
    exact = size_class(count)
    if not count:                    # nothing is launched, so nothing is tuned
        return exact
    try:
        launched = _CLASSES.setdefault(kernel, set())
    except TypeError:                # None (nothing to launch), or not weakly referenceable
        return exact
    if exact in launched or not launched:
        launched.add(exact)
        return exact
    if exact < SMALL_CLASS:
        return min(launched, key=lambda tuned: (abs(tuned - exact), tuned))
    launched.add(exact)
    return exact
