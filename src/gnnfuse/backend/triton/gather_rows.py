"""Row gather in Triton: ``out[e] = table[index[e]]``.

The typed programs gather whole rows onto the edges outside the fused kernels -- each
edge's (vertex, relation) product from its pair (ir/ops/compact.py), a vertex row
through ``broadcast`` where a unit reads it as a leaf. torch's ``index_select`` on the
GPU (torch 2.11, H100) took 12.7 ms to gather 21.1M rows of 16 floats from 3.05M, and
the same at 64 floats: bound by the index count, not the bytes. This kernel moves one
block of rows per program at copy speed (1.14 ms and 3.74 ms for those; a plain copy of
the output took 0.90 and 3.57 ms), with the rows' element order unchanged, so its result
is bit-identical to ``index_select``'s. Other dtypes and devices keep ``index_select``.

Unlike ``index_select`` it does not range-check ``index``: callers pass the graph's own
indices (validated when the `Graph` was built) or ids derived from them.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .launch import launch, wide_ids
from .segment_matmul import launchable

BLOCK_E = 64
MAX_BLOCK_F = 256
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@triton.jit
def _gather_rows(table_ptr, index_ptr, out_ptr, E, F, stride_t,
                 BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, WIDE: tl.constexpr):
    first = tl.program_id(0)
    if WIDE:        # 2^31 edges or more (`launch.wide_ids`)
        first = first.to(tl.int64)
    edges = first * BLOCK_E + tl.arange(0, BLOCK_E)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    edge_ok = edges < E
    ok = edge_ok[:, None] & (cols < F)[None, :]
    rows = tl.load(index_ptr + edges, mask=edge_ok, other=0).to(tl.int64)
    values = tl.load(table_ptr + rows[:, None] * stride_t + cols[None, :], mask=ok)
    tl.store(out_ptr + edges.to(tl.int64)[:, None] * F + cols[None, :], values, mask=ok)


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table.index_select(0, index)``: one launch on a GPU (or under Triton's
    interpreter) for floating tables; ``index_select`` otherwise."""
    width = math.prod(table.shape[1:])
    if table.dim() == 0 or table.dtype not in DTYPES or not launchable(table) or index.numel() == 0 or width == 0:
        return table.index_select(0, index)
    flat = table.reshape(table.shape[0], width)
    flat = flat if flat.stride(1) == 1 else flat.contiguous()
    edges = index.numel()
    out = torch.empty((edges, width), dtype=table.dtype, device=table.device)
    block_f = min(MAX_BLOCK_F, triton.next_power_of_2(width))
    launch(_gather_rows, lambda meta: (triton.cdiv(edges, BLOCK_E), triton.cdiv(width, block_f)), (edges, width),
           (flat, index.contiguous(), out, edges, width, flat.stride(0)),
           {"BLOCK_E": BLOCK_E, "BLOCK_F": block_f, "WIDE": wide_ids(edges, BLOCK_E)})
    return out.reshape((edges,) + tuple(table.shape[1:]))

