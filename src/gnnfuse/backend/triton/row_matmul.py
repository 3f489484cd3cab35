"""Row-by-row matrix products in Triton: ``out[r] = x[r] @ w[r]`` for [R, I, K] and
[R, K, M] operands (the ``row_matmul`` op, ir/ops/row_matmul.py).

A per-edge weight matrix (NNConv's ``x_j @ W_e``, a DGL UDF's ``torch.bmm(x.unsqueeze(1),
W_e)``) and its backward's products are batched matmuls of tiny matrices: [1, 16] @
[16, 64] per edge. cuBLAS runs them as batched matrix-vector kernels at a fraction of the
bandwidth (on the arxiv-sized NNConv step, an H200, the forward's and backward's three
such products took 11.8 of its 24 ms in torch's ``bmm``). Here each program loads a block
of rows' matrices once, coalesced along ``M``, and accumulates over ``K`` in registers
(float32, float64 for float64 operands): the bytes of the operands and the output, once.
Operands may be any strided views (the backward's transposes are); the output is packed.
Other ranks (broadcast batch dims), dtypes, empty operands and devices Triton cannot
launch on keep torch's ``matmul``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch
from .segment_matmul import launchable

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
TILE = 4096            # output elements one program accumulates
MAX_BLOCK_M = 64
MAX_GRID = 65535       # CUDA's limit on a grid's second and third dims


@triton.jit
def _row_matmul(x_ptr, w_ptr, out_ptr, R, I, K, M, sxr, sxi, sxk, swr, swk, swm,
                BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr, WIDE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    i = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < R
    ok = row_ok[:, None] & (cols < M)[None, :]
    x_row = x_ptr + rows * sxr + i * sxi
    w_row = w_ptr + rows[:, None] * swr + cols[None, :] * swm
    if WIDE:
        acc = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_R, BLOCK_M), dtype=tl.float32)
    for k in range(0, K):
        xk = tl.load(x_row + k * sxk, mask=row_ok, other=0.0).to(acc.dtype)
        wk = tl.load(w_row + k * swk, mask=ok, other=0.0).to(acc.dtype)
        acc += xk[:, None] * wk
    tl.store(out_ptr + rows[:, None] * (I * M) + i * M + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=ok)


def row_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(x, w)`` for row-aligned operands: one launch for [R, I, K] @ [R, K, M]
    where the module doc allows, torch otherwise."""
    if not _fits(x, w):
        return torch.matmul(x, w)
    rows, inner, k = x.shape
    m = w.shape[2]
    out = torch.empty((rows, inner, m), dtype=x.dtype, device=x.device)
    block_m = min(triton.next_power_of_2(m), MAX_BLOCK_M)
    block_r = max(1, TILE // block_m)
    launch(_row_matmul, lambda meta: (triton.cdiv(rows, block_r), inner, triton.cdiv(m, block_m)), (rows, m),
           (x, w, out, rows, inner, k, m, *x.stride(), *w.stride()),
           {"BLOCK_R": block_r, "BLOCK_M": block_m, "WIDE": x.dtype == torch.float64})
    return out


def _fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (x.dim() == w.dim() == 3 and x.shape[0] == w.shape[0] and x.shape[2] == w.shape[1]
            and x.dtype == w.dtype and x.dtype in DTYPES and x.numel() > 0 and w.numel() > 0
            and x.shape[1] <= MAX_GRID and triton.cdiv(w.shape[2], MAX_BLOCK_M) <= MAX_GRID and launchable(x))
