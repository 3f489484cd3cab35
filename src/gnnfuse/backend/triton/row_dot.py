"""Per-row dot products over trailing feature dims in Triton: ``(x * y).sum(dims, keepdim=True)``.

The ``row_dot`` op (ir/ops/dense.py, made by passes/row_dot.py) stands for what a
softmax-normalized sum's backward computes per vertex and head: ``<grad_out, out>`` over
the channels. As torch ops that is a product kernel writing an [N, heads, channels] table
and a reduction reading it back; here one pass reads both tables and writes the
[N, heads, 1] sums, accumulating in float32 (float64 for float64 tables), as torch's sum
does. Summed dims that are not the trailing ones, rows wider than
`MAX_BLOCK_K` and devices Triton cannot launch on keep torch's two ops. Rows may be any
stride apart (the views of padded tables that GPU layers pass their gradients as); the
elements of a row must be packed.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...ir.ops.dense import row_dot_reference
from .launch import launch
from .segment_matmul import launchable

MAX_BLOCK_K = 1024
TILE = 4096            # elements of each operand a program loads: enough to hide latency
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@triton.jit
def _row_dot(x_ptr, y_ptr, out_ptr, M, K, KEPT, stride_x, stride_y, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
             WIDE: tl.constexpr):
    # output element m is table row m // KEPT, kept index m % KEPT: rows are stride_* apart
    # (a padded table's view), the elements within a row packed
    outs = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    ok = (outs < M)[:, None] & (cols < K)[None, :]
    row, kept = outs // KEPT, outs % KEPT
    inner = kept[:, None] * K + cols[None, :]
    x = tl.load(x_ptr + row[:, None] * stride_x + inner, mask=ok, other=0.0)
    y = tl.load(y_ptr + row[:, None] * stride_y + inner, mask=ok, other=0.0)
    if WIDE:
        product = x.to(tl.float64) * y.to(tl.float64)
    else:
        product = x.to(tl.float32) * y.to(tl.float32)
    total = tl.sum(product, axis=1)
    tl.store(out_ptr + outs, total.to(out_ptr.dtype.element_ty), mask=outs < M)


def row_dot(x: torch.Tensor, y: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``(x * y).sum(dims, keepdim=True)`` for two tables of one shape and dtype: one
    launch where `row_dot`'s module doc allows, torch's two ops otherwise."""
    rank = x.dim()
    summed = sorted(d % rank for d in dims)
    trailing = summed == list(range(rank - len(summed), rank)) and summed and summed[0] >= 1
    width = math.prod(x.shape[summed[0]:]) if trailing else 0
    if (not trailing or x.shape != y.shape or x.dtype != y.dtype or x.dtype not in DTYPES
            or not (_packed_rows(x) and _packed_rows(y)) or not launchable(x)
            or width == 0 or width > MAX_BLOCK_K or x.numel() == 0):
        return row_dot_reference(x, y, dims)
    out_shape = tuple(n if i < summed[0] else 1 for i, n in enumerate(x.shape))
    out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    kept = math.prod(x.shape[1:summed[0]])
    count = x.shape[0] * kept
    block_k = triton.next_power_of_2(width)
    block_m = max(1, TILE // block_k)
    launch(_row_dot, lambda meta: (triton.cdiv(count, block_m),), (count, width),
           (x, y, out, count, width, kept, x.stride(0), y.stride(0)),
           {"BLOCK_M": block_m, "BLOCK_K": block_k, "WIDE": x.dtype == torch.float64})
    return out


def _packed_rows(t: torch.Tensor) -> bool:
    """Whether each row of ``t`` is packed (its rows may be any stride apart, as the
    views of padded tables the kernels hand each other are). A single row is checked
    too: a one-vertex graph's backward hands over a stride-0 ``expand`` of one row,
    which the kernel, reading the row as packed, got wrong gradients from."""
    return t.shape[0] == 0 or t[0].is_contiguous()
