"""Which tuned configuration a launch asks the autotuner for (its ``size_class``).

The generated kernels are tuned per `codegen.size_class`, the bit length of the edge or
segment count, so the first launch of a kernel at a new class compiles and times every
configuration. Mini-batch blocks bring new classes mid-epoch. On fresh 4-H200 machines
(cold compile caches, products-sized GraphSAGE) one step of 4-6 s stood among steps of
7-15 ms, on every data-parallel rank at once: one rank tuned while the others waited at
the next all-reduce, and the first 4-GPU invocation of the benchmark read x0.4 where
later ones read x3 (`benchmarks/results/scaling_cuda.md`). Triton's printout showed the
classes tuned inside the timed epoch were tiny ones, 1 to 9 (1 to 511 segments or
edges), of kernels whose large classes (11 to 17) had tuned in the warm-up; class 2
took 4.75 s and class 5 5.10 s, compiling every configuration for a new specialization
of the count. (Letting a class reuse a launched neighbour's choice, tried first, did not
remove them.)

So a kernel that this process has launched at some class reuses the nearest such class's
choice for a new class below `SMALL_CLASS`, where the launch takes microseconds whichever
configuration runs it. Larger classes tune as before: a process that trains on graphs of
several sizes wants each one's choice. A kernel's first launch tunes, whatever its class.
The choice only changes speed, never values.
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
