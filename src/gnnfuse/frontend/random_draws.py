"""Whether code run while a function is traced drew a random number.

A trace that draws bakes the number into the program as a constant, where eager code
draws anew on every call (and, in a vertex function, per vertex and per in-edge): a
message function's trace is then not kept, a vertex function's refused
(`trace_cache`, `vertex`). Draws are found by the generators' states moving, which also
catches a draw made inside library code (``Normal(0, 1).rsample()``, ``t.bernoulli_()``).

Those states are the process's, so another thread's draw moved them too: while a
training or loader thread drew dropout masks or initial weights, every first call of a
vertex function in another thread was refused as drawing a random number (20 of 20 in a
loop beside a thread calling ``torch.rand``), and a message function's trace was never
kept. Where other threads run, a move of torch's generators therefore counts only with a
draw of the tracing thread's own, seen by a dispatch mode (`_SeededOps`: modes are per
thread). Python's ``random`` and NumPy's generators cannot be told apart by thread: a move
of theirs always counts.
"""
from __future__ import annotations

import random
import sys
import threading
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes


def random_states() -> tuple:
    """The states of the random generators a function may draw from in Python: torch's
    (CPU, and each CUDA device's once CUDA is initialised), Python's ``random`` and
    NumPy's global one. The torch states are read as their storage's bytes, which is no
    value read `trace_cache._ValueReads` notes: a vertex function's trace reads them and
    stays cacheable."""
    return _torch_states() + _library_states()


def _torch_states() -> tuple:
    try:
        # under torch.export the states came back as fake tensors, and their storage's bytes
        # could not be read under its tracing mode (NotImplementedError: a new object each
        # call, so every vertex function's trace was refused as drawing a random number)
        with unset_fake_temporarily(), _disable_current_modes():
            states: tuple = (bytes(torch.default_generator.get_state().untyped_storage()),)
            if torch.cuda.is_initialized():
                states += tuple(bytes(g.get_state().untyped_storage()) for g in torch.cuda.default_generators)
    except RuntimeError:    # unreadable (inside a torch.func transform on a GPU): unequal to any, so not cached
        return (object(),)
    return states


def _library_states() -> tuple:
    states: tuple = (random.getstate(),)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        _, keys, position, *_ = numpy.random.get_state()
        states += (position, keys.tobytes())
    return states


class _SeededOps(TorchDispatchMode):
    """Notes whether an op that draws from a generator (torch's ``nondeterministic_seeded``
    tag: ``rand``, ``normal``, ``bernoulli_``, ``uniform_``, ...) ran on this thread."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.seen = True
        return func(*args, **(kwargs or {}))


class RandomDraws:
    """``with RandomDraws() as draws: ...``; then ``draws.drew``: whether the code inside
    drew a random number (see the module docstring for what counts where other threads run).
    Set also when the code raised."""

    def __init__(self) -> None:
        self.drew = False
        self._ops: _SeededOps | None = None
        self._torch: tuple = ()
        self._library: tuple = ()

    def __enter__(self) -> RandomDraws:
        self._torch, self._library = _torch_states(), _library_states()
        # only beside other threads: alone, a move of torch's states is this thread's
        self._ops = _SeededOps() if threading.active_count() > 1 else None
        if self._ops is not None:
            self._ops.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ops is not None:
            self._ops.__exit__(*exc)
        torch_moved = _torch_states() != self._torch
        self.drew = _library_states() != self._library or (
            torch_moved and (self._ops is None or self._ops.seen))
