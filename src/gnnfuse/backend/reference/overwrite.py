"""Which steps of an op-by-op run may write their result over an operand that dies there.

The executor frees each intermediate after its last read; an edge-sized product then
still takes a new buffer while the one it was computed from is freed right after. On a
CPU every such buffer is memory the allocator may have handed back to the kernel, so its
first write takes a page fault per 4 KB page: a GAT training step on a batch of 128
molecule-sized graphs (about 10K edges, [E, 4, 32] float32 tables of 5 MB) allocated
24 edge tables per step and took 1.4-7.7K page faults per step, most of them in the
products. Written into the gathered table it multiplies, a product needs no new buffer.

Only steps whose overwritten operand nothing else can see qualify, decided once per
schedule from the program alone: the operand is made by an op whose result is always new
storage (`FRESH`), every step that reads it is such an op too or a reduction (so no view
of it outlives its last read), it is read once by the overwriting step, and it dies there
(not kept, not an output). At run time the operand must have the result's exact shape and
dtype, be on the CPU (measured there only), and autograd must be off (a backward that is
itself differentiated keeps its intermediates' history).
"""
from __future__ import annotations

from typing import Sequence

import torch

# Binary ops the executor can run into a given buffer (torch's ``out=``).
OVERWRITING = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
# Ops whose result is new storage, never a view of an operand (broadcast gathers rows).
FRESH = frozenset({"broadcast", "add", "sub", "mul", "div", "exp", "neg", "leaky_relu"})
# Readers that keep no view of what they read.
_SAFE_READERS = FRESH | {"reduce"}


def overwritable(plan: Sequence, reads: Sequence[Sequence], frees: Sequence[Sequence[int]]) -> list[int | None]:
    """Per step of ``plan``, the position among its op's inputs of the operand it may
    overwrite, or None. ``reads[k]`` are the values step k reads, ``frees[k]`` the ids
    that die after it (both as `executor.schedule_steps` works them out)."""
    producers, readers = {}, {}
    for item, values in zip(plan, reads):
        for v in values:
            readers.setdefault(v.id, []).append(item)
        if getattr(item, "op", None) is not None and hasattr(item, "inputs"):
            producers[item.id] = item
    out: list[int | None] = []
    for item, dying in zip(plan, frees):
        out.append(_position(item, dying, producers, readers))
    return out


def _position(item, dying: Sequence[int], producers: dict, readers: dict) -> int | None:
    if getattr(item, "op", None) not in OVERWRITING or not hasattr(item, "inputs"):
        return None
    ids = [i.id for i in item.inputs]
    for position, value in enumerate(item.inputs):
        maker = producers.get(value.id)
        if (value.id in dying and ids.count(value.id) == 1 and maker is not None and maker.op in FRESH
                and value.dtype == item.dtype and tuple(value.shape) == tuple(item.shape)
                and all(getattr(r, "op", None) in _SAFE_READERS and hasattr(r, "inputs")
                        for r in readers.get(value.id, ()))):
            return position
    return None


def run_over(op: str, tensors: list[torch.Tensor], position: int) -> torch.Tensor | None:
    """``op`` of the (row-aligned) ``tensors`` written into ``tensors[position]``, or None
    where that buffer cannot take the result (another shape or dtype, not on the CPU,
    or autograd on)."""
    target = tensors[position]
    if target.device.type != "cpu" or torch.is_grad_enabled() or target.requires_grad:
        return None
    a, b = tensors
    if not _broadcasts_to(tensors[1 - position].shape, target.shape):
        return None
    # operands of the target's dtype give it (torch.result_type, an op dispatch, only otherwise)
    if (a.dtype is not b.dtype or a.dtype is not target.dtype) and torch.result_type(a, b) != target.dtype:
        return None
    return OVERWRITING[op](a, b, out=target)


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without widening it (torch's own
    ``broadcast_shapes`` took 30 us a call, more than the op on a small table)."""
    if shape == target:
        return True
    offset = len(target) - len(shape)
    if offset < 0:
        return False
    for n, t in zip(shape, target[offset:]):     # a loop: a generator's every step was a Python call
        if n != t and n != 1:
            return False
    return True
