"""Tensors a layer remakes in the backward instead of keeping them from the forward.

A compiled attention layer keeps the vertex tables its backward reads: GAT's ``h = x W^T``
and its per-vertex logits. Both are one GEMM of ``x``, which the layer's own linear map
keeps anyway for its weight's gradient. On the products-sized GAT step the layer-1 table
(0.63 GB) and logits (0.16 GB) were alive at the step's memory peak, in the layer-2
backward, long before anything read them. Remade from ``x`` when the layer's backward
starts, they cost no memory until then; the GEMMs cost time (3.9 ms a step for both layers'
tables on the H100, measured with the logits still two GEMMs: 114.8 against 110.9 ms).

`remade_when_saved` does this with autograd's saved-tensor hooks around the layer's
compiled call: a saved tensor on the storage of a declared table is packed as its recipe
(the inputs, their versions, and where in the storage the view lay), and unpacked by
re-running the recipe and taking the same view of the new storage. A recipe whose input
was modified in place since the forward refuses, as autograd does for its own saved
tensors, rather than remaking a different table. The recipe re-runs under the autocast
state the forward saved the table in (as `torch.utils.checkpoint` does): the backward
usually runs outside the forward's ``torch.autocast`` block, where the GEMM would make a
float32 table in place of the forward's bfloat16 one and the gradients would belong to
another forward.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

# Smallest table (bytes) a layer remakes rather than keeps. Remaking costs GEMMs (about
# 3 ms per GB of tables on the H100's products-sized GAT step) and host time per call, so
# it pays only where the tables are a large share of the device's memory: an arxiv- or
# Reddit2-sized GAT (43-60 MB tables, peaks under 4 GB) keeps them.
MIN_BYTES = 1 << 28


@dataclass(frozen=True)
class Remake:
    """How to make one table again: ``make()`` returns a tensor on a storage laid out
    like the original's; ``inputs`` are what it reads (checked for in-place changes)."""
    table: torch.Tensor
    make: Callable[[], torch.Tensor]
    inputs: tuple[torch.Tensor, ...]


def made_together(make: Callable[[], Sequence[torch.Tensor]], count: int) -> list[Callable[[], torch.Tensor]]:
    """One maker for each of ``make()``'s ``count`` results, with ``make`` run once for
    all of them (GAT's two folded logits are one GEMM): the first maker called computes
    every result and keeps the others until their makers take them."""
    waiting: dict[int, torch.Tensor] = {}

    def maker(n: int) -> Callable[[], torch.Tensor]:
        def take() -> torch.Tensor:
            if n in waiting:
                return waiting.pop(n)
            results = make()
            waiting.update((k, t) for k, t in enumerate(results) if k != n)
            return results[n]
        return take
    return [maker(n) for n in range(count)]


@dataclass(frozen=True)
class _Packed:
    """A saved table as its recipe: never the table itself, which must be free to go."""
    make: Callable[[], torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
    versions: tuple[int, ...]
    size: torch.Size
    stride: tuple[int, ...]
    offset: int
    nbytes: int
    dtype: torch.dtype
    autocast: tuple[str, bool, torch.dtype]     # device type, enabled, dtype: the forward's


def _autocast_state(device_type: str) -> tuple[str, bool, torch.dtype]:
    """The autocast setting in force for ``device_type``'s tensors, to make a table again
    in the precision the forward made it."""
    return device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


def _unpack(saved: torch.Tensor | _Packed) -> torch.Tensor:
    if not isinstance(saved, _Packed):
        return saved
    for n, (tensor, version) in enumerate(zip(saved.inputs, saved.versions)):
        if tensor._version != version:
            raise RuntimeError(
                f"one of the tensors a gnnfuse layer remakes its saved table from (input {n}, shape "
                f"{tuple(tensor.shape)}) was modified by an in-place operation after the forward (version "
                f"{version} -> {tensor._version}); the backward would read a different table")
    device_type, enabled, dtype = saved.autocast
    with torch.autocast(device_type, dtype=dtype, enabled=enabled):
        base = saved.make()
    if base.dtype != saved.dtype:
        raise RuntimeError(f"a remade saved table is {base.dtype} where the forward's was {saved.dtype}")
    if base.untyped_storage().nbytes() < saved.nbytes:
        raise RuntimeError("a remade saved table is laid out differently from the forward's "
                           f"({base.untyped_storage().nbytes()} < {saved.nbytes} bytes)")
    return base.as_strided(saved.size, saved.stride, saved.offset)


@contextmanager
def remade_when_saved(remakes: Sequence[Remake]) -> Iterator[None]:
    """Within the block, autograd saves each of ``remakes``' tables (or any view of its
    storage) as its recipe instead of the tensor; other saved tensors are untouched.
    Call only where each recipe's inputs are kept by autograd anyway (so holding them
    costs nothing) and the recipe reproduces the table's exact layout."""
    # (make, inputs) only: autograd keeps the pack hook with every tensor it saved, so
    # the hook must not reference the tables themselves
    by_storage = {r.table.untyped_storage().data_ptr(): (r.make, r.inputs) for r in remakes if r.table.numel()}
    if not by_storage:
        yield
        return

    def pack(tensor: torch.Tensor) -> torch.Tensor | _Packed:
        recipe = by_storage.get(tensor.untyped_storage().data_ptr()) if tensor.numel() else None
        if recipe is None:
            return tensor
        make, inputs = recipe
        return _Packed(make, inputs, tuple(t._version for t in inputs), tensor.size(), tensor.stride(),
                       tensor.storage_offset(), tensor.untyped_storage().nbytes(), tensor.dtype,
                       _autocast_state(tensor.device.type))

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        yield
