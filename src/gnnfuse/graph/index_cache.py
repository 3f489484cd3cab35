"""The `Graph` made for a raw index input, remembered while the input is unchanged.

A PyG script passes the same ``edge_index`` tensor to every layer on every step. The
layouts kernels need (the CSR sort, the self-looped copy, GCN's norms) are cached on a
`Graph` object, so a fresh `Graph` per call rebuilt them all every time: 2.4-3.9x the
step time of passing a `Graph` (issue #12). Here the `Graph` built for an input object
is kept and served again while that object is unchanged.

Unchanged means: the very same Python object (checked through a weak reference, so a
new tensor that reuses a freed one's id and address is not mistaken for it), and every
tensor it holds has the same version counter, data pointer, shape, strides, dtype and
device. Every in-place torch
op bumps the version counter, views included, so an edited ``edge_index`` gets a new
`Graph`. Writes that bypass the counter -- through ``.data``, ``.numpy()`` or DLPack --
are not seen; autograd has the same blind spot. Inference-mode tensors have no version
counter, so they are never cached.

An entry lives while its input does: when the user drops the input, its graph and
layouts are dropped too (builders must not keep the input object alive, only its
memory: see `Graph._from_torch`), so a loop that makes a new ``edge_index`` per epoch
does not pile up graphs on the GPU. The cache is also small (`CAPACITY` entries, least
recently used evicted first): a training loop needs one entry per graph.

Nothing built inside a ``torch.func`` transform (grad, vmap, jacrev, ...) is kept: every
tensor made there, the layouts built from a plain ``edge_index`` included, is the
transform's wrapper, which outlives it unusable (the Triton kernels cannot read its
storage). A failed ``torch.func.grad`` call kept such a graph for its ``edge_index``, and
every later plain call on that ``edge_index`` failed with "Cannot access storage of
TensorWrapper".
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable

import torch

CAPACITY = 8

# The innermost torch.func transform's interpreter, None outside every transform: one C
# call, cheap enough for a check on every program call (runtime/compiled.py).
functorch_interpreter: Callable[[], Any] = torch._C._functorch.peek_interpreter_stack

_ENTRIES: OrderedDict[tuple[int, Hashable], tuple[weakref.ref, tuple, Any]] = OrderedDict()


def cached_graph(obj: Any, parts: list[torch.Tensor], key: Hashable, build: Callable[[], Any]) -> Any:
    """``build()`` for ``obj``, or the result of an earlier call for the same object in
    the same state. ``parts`` are the tensors holding ``obj``'s indices (the tensor
    itself, or a sparse tensor's components) whose stamps decide "the same state";
    ``key`` adds what else the result depends on (the requested vertex count)."""
    stamp = _stamp(parts)
    if stamp is None:
        return build()
    slot = (id(obj), key)
    entry = _ENTRIES.get(slot)
    if entry is not None and entry[0]() is obj and entry[1] == stamp:
        _ENTRIES.move_to_end(slot)
        return entry[2]
    graph = build()
    if functorch_interpreter() is not None:     # its tensors are the transform's: see the module docstring
        return graph
    try:
        ref = weakref.ref(obj, lambda dead: _forget(slot, dead))
    except TypeError:      # an object without weak references: not cached
        return graph
    _ENTRIES[slot] = (ref, stamp, graph)
    _ENTRIES.move_to_end(slot)
    while len(_ENTRIES) > CAPACITY:
        _ENTRIES.popitem(last=False)
    return graph


def clear_index_cache() -> None:
    """Forget every remembered graph (and free its layouts)."""
    _ENTRIES.clear()


def _forget(slot: tuple[int, Hashable], dead: weakref.ref) -> None:
    """Drop the entry of an input that was just freed (unless the slot was reused)."""
    entry = _ENTRIES.get(slot)
    if entry is not None and entry[0] is dead:
        del _ENTRIES[slot]


def _stamp(parts: list[torch.Tensor]) -> tuple | None:
    """What changes when a tensor's contents may have changed; None if not trackable."""
    try:
        return tuple((t._version, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device) for t in parts)
    except RuntimeError:   # an inference tensor: no version counter
        return None
