"""Counting the ops that would stop the host until the GPU catches up, on any device.

On a GPU, an op whose result size or value the host must know -- ``.item()``,
``int(t)``, ``bool(t)``, ``.tolist()``, ``equal``, ``allclose``, ``nonzero``, boolean-mask indexing, ``unique``,
``bincount``, ``repeat_interleave`` without ``output_size`` -- waits for every queued
kernel. In a training step each one empties the device's queue, and the step's time
becomes the host's time plus the device's instead of the larger of the two.
``torch.cuda.set_sync_debug_mode`` only reports them on a GPU; this counts the same
ops on the CPU too (through a `TorchDispatchMode`, which sees every aten op a Python
call issues), so a test on a CPU-only machine can fail when one creeps into a path
that must have none.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Ops whose CUDA implementations read a value back to the host before returning (and,
# in `op_syncs`, blocking copies from the device to host memory).
SYNCING_OPS = frozenset({
    "aten._local_scalar_dense.default",     # .item(), int(t), float(t), bool(t), .tolist()
    "aten.nonzero.default", "aten.masked_select.default", "aten.equal.default",
    "aten.allclose.default",                # a bool, as equal's (one op on the CPU, not isclose + item)
    "aten._unique2.default", "aten.unique_dim.default", "aten.unique_consecutive.default",
    "aten.bincount.default",
})
_MASK_INDEXING = ("aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default")
# Reads of a whole tensor into Python or numpy: on a GPU a blocking copy to the host (seen
# as ``aten._to_copy``); on the CPU they issue no aten op at all, so they are watched by name.
_HOST_READS = {torch.Tensor.tolist: "Tensor.tolist", torch.Tensor.numpy: "Tensor.numpy"}


def op_syncs(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the aten op ``name`` (its overload's string) on these arguments makes the
    host wait for the device (`HostSyncCounter`'s test, also used by
    benchmarks/count_step_ops.py's own dispatch mode)."""
    if name in SYNCING_OPS:
        return True
    if name == "aten._to_copy.default":      # .cpu(), .to("cpu") of a GPU tensor
        device = kwargs.get("device")
        return (args[0].is_cuda and device is not None and torch.device(device).type == "cpu"
                and not kwargs.get("non_blocking", False))
    if name == "aten.copy_.default":
        return args[0].device.type == "cpu" and args[1].is_cuda and not (len(args) > 2 and args[2])
    if name == "aten.repeat_interleave.Tensor":
        return kwargs.get("output_size") is None
    if name in _MASK_INDEXING and len(args) > 1:        # a boolean mask index runs a nonzero
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])
    return False


class HostSyncCounter(TorchDispatchMode):
    """Counts, by aten op name, the syncing ops issued while active (``syncs``), and
    every op (``ops``); `paused` leaves a region out (e.g. a kernel launch under
    Triton's CPU interpreter, which reads its arguments on the host by design)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self._paused = 0
        self._reads = _HostReads(self)

    def __enter__(self) -> HostSyncCounter:
        self._reads.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._reads.__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self._paused:
            name = str(func)
            self.ops[name] += 1
            if op_syncs(name, args, kwargs):
                self.syncs[name] += 1
        return func(*args, **kwargs)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1


class _HostReads(TorchFunctionMode):
    """The part of `HostSyncCounter` that sees `_HOST_READS` of CPU tensors (a CUDA
    tensor's are counted by their copy, once)."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self._counter = counter

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = _HOST_READS.get(func)
        if name is not None and not self._counter._paused and not args[0].is_cuda:
            self._counter.syncs[name] += 1
            self._counter.ops[name] += 1
        return func(*args, **(kwargs or {}))
