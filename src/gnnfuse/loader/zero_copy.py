"""Rows of a page-locked host table gathered by a GPU kernel (zero-copy UVA reads).

A feature table too large for GPU memory stays in pinned host memory. Gathering a
batch's rows on the host (``index_select`` into a pinned buffer, then a copy) keeps a
CPU thread busy for about 8 ms per products-sized batch and made the pinned epoch 1.6x
slower than the device one on an H100. With unified virtual addressing a pinned page is
readable from a kernel at its own address, so here the GPU gathers the rows itself,
reading across PCIe only the bytes the batch needs, on the loader's stream, with no host
work and no host sync (the ids never leave the device).

Triton takes any tensor-like argument with ``data_ptr()`` and asks the CUDA driver for
its device address, which for pinned memory is the mapped host page. A driver that
refuses (memory not mapped) raises at launch; the loader then warns once and gathers on
the host, so the result is never wrong, only slower.
"""
from __future__ import annotations

import functools
import math
import warnings

import torch

_BLOCK_ROWS = 32


@functools.cache
def _kernel():
    """The Triton gather kernel, defined on first use (the loader runs without Triton on a CPU)."""
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rows(table, ids, out, num_ids, width, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = r < num_ids
        row = tl.load(ids + r, mask=rmask, other=0).to(tl.int64)
        target = r.to(tl.int64)
        for f0 in range(0, width, BLOCK_F):
            f = f0 + tl.arange(0, BLOCK_F)
            mask = rmask[:, None] & (f < width)[None, :]
            values = tl.load(table + row[:, None] * width + f[None, :], mask=mask)
            tl.store(out + target[:, None] * width + f[None, :], values, mask=mask)
    return gather_rows


_REFUSED: set[str] = set()   # devices whose driver would not map pinned pages


def gather_rows(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[i] = table[ids[i]]`` by the kernel; ``table`` is contiguous, pinned host
    memory or on ``out``'s device (what the tests run under Triton's interpreter)."""
    import triton

    from ..backend.triton.launch import launch
    width = math.prod(table.shape[1:])
    if ids.numel() and width:
        launch(_kernel(), (triton.cdiv(ids.numel(), _BLOCK_ROWS),), (), (table, ids, out, ids.numel(), width),
               {"BLOCK_R": _BLOCK_ROWS, "BLOCK_F": min(triton.next_power_of_2(width), 128)})
    return out


def zero_copy_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor | None:
    """``table[ids]`` on ``ids.device``, read straight from ``table`` (pinned host memory)
    by a kernel; None when this cannot be done here (the caller gathers on the host)."""
    if ids.device.type != "cuda" or not table.is_pinned() or str(ids.device) in _REFUSED:
        return None
    out = torch.empty((ids.numel(),) + table.shape[1:], dtype=table.dtype, device=ids.device)
    try:
        return gather_rows(table, ids, out)
    except (ValueError, RuntimeError) as exc:    # the driver did not map the pinned pages
        _REFUSED.add(str(ids.device))
        warnings.warn(f"gnnfuse loader: a kernel could not read the pinned feature table in place "
                      f"({exc}); gathering rows on the host instead, which is slower", RuntimeWarning,
                      stacklevel=3)
        return None


def register_host_memory(table: torch.Tensor) -> bool:
    """Page-lock ``table``'s host storage in place (``cudaHostRegister``), so kernels read
    it as they read pinned memory; whether that worked. A loader worker process does
    this to the shared-memory feature table it received: ``pin_memory()`` copies into a
    new allocation this process alone could see, so a table meant for several processes
    is put in shared memory first and registered by each process that reads it."""
    storage = table.untyped_storage()
    if table.device.type != "cpu":
        return False
    if table.is_pinned() or not storage.nbytes():      # nothing left to lock
        return True
    try:
        torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(storage.data_ptr(), storage.nbytes(), 0))
    except (RuntimeError, torch.cuda.CudaError):
        return False
    return table.is_pinned()
