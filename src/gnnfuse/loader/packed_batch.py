"""A PyG ``Batch`` collated in a loader's worker process, sent to the training process as
one buffer.

torch's loader sends a worker's batch through a queue, each tensor's storage moved into
shared memory and passed as its own file descriptor, which the training process maps
one by one. A collated ``Batch`` of small graphs holds some fifteen tensors (its
attributes, ``batch``, ``ptr``, and PyG's slice and increment tables), so moving it cost
more than collating it: on an H200's host, gnnfuse's padded loader took 0.27-0.34 s an
epoch with four workers against 0.11-0.20 s in the training process, and 0.089-0.119 s
with four workers once batches crossed this way (`results/graph_batches.md`). `for_transfer` marks a batch to be pickled as
`loader.packing` packs a sampled mini-batch -- its tensors copied into one buffer, the
rest pickled with references to them -- and the training process gets the batch of
PyG's own class back, each tensor with a storage of its own in that buffer's memory.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from .packing import pack, unpack


def for_transfer(batch: Any) -> Any:
    """``batch``, pickled from now on as one buffer (`_reduce`) where `_packable`: its
    class becomes a subclass of its own whose only change is how it pickles."""
    if _packable(batch):
        object.__setattr__(batch, "__class__", _packing_class(type(batch)))     # Data's own __setattr__ stores
    return batch


def _packable(batch: Any) -> bool:
    """Whether one buffer can carry ``batch``: its tensors plain, dense and without
    autograd. `packing` refuses the others (a sparse tensor, one requiring grad) and
    would rebuild a tensor subclass (PyG's ``EdgeIndex``) as a plain tensor; refused in
    the worker's queue thread, the loader waited for ever. Such a batch crosses as PyG's
    does, and fails where PyG's fails."""
    return all(type(value) is torch.Tensor and value.layout == torch.strided and not value.requires_grad
               for store in batch.stores for value in store.values() if isinstance(value, torch.Tensor))


@functools.lru_cache(maxsize=None)
def _packing_class(cls: type) -> type:
    """``cls`` with `_reduce` as its pickling; the class is never pickled itself."""
    return type(cls.__name__, (cls,), {"__reduce__": _reduce, "_unpacked_class": cls,
                                       "__module__": cls.__module__})


def _reduce(batch: Any) -> tuple:
    """What pickling ``batch`` sends: the batch, of its own class again, packed."""
    marked = type(batch)
    object.__setattr__(batch, "__class__", marked._unpacked_class)
    try:
        return unpack, pack(batch)
    finally:
        object.__setattr__(batch, "__class__", marked)
