"""Row-by-row matrix products in Triton: ``out[r] = x[r] @ w[r]`` for [R, I, K] and
[R, K, M] operands (the ``row_matmul`` op, ir/ops/row_matmul.py).

A per-edge weight matrix (NNConv's ``x_j @ W_e``, a DGL UDF's ``torch.bmm(x.unsqueeze(1),
W_e)``) and its backward's products are batched matmuls of tiny matrices: [1, 16] @
[16, 64] per edge. cuBLAS runs them as batched matrix-vector kernels at a fraction of the
bandwidth (on the arxiv-sized NNConv step, an H200, the forward's and backward's three
such products took 11.8 of its 24 ms in torch's ``bmm``). Here each program loads a few
rows' whole matrices as one tile and sums over ``K`` in registers (float32, float64 for
float64 operands): the bytes of the operands and the output, once. A first version looped
over ``K`` loading one [rows, M] slice at a time; the backward's transposed matrices
(``W_e^T``, packed along ``K``) then read each sector from cache once per ``k``, and
NNConv's step took 45 ms. Operands may be any strided views; the output is packed.
Matrices over `TILE` elements (padded to powers of two), other ranks (broadcast batch
dims), dtypes, empty operands and devices Triton cannot launch on keep torch's ``matmul``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch
from .segment_matmul import launchable

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
TILE = 8192            # elements of the rows' matrices one program loads at once
MAX_GRID = 65535       # CUDA's limit on a grid's second dim


@triton.jit
def _row_matmul(x_ptr, w_ptr, out_ptr, R, I, K, M, sxr, sxi, sxk, swr, swk, swm,
                BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, WIDE: tl.constexpr):
    # one program: BLOCK_R rows' whole [K, M] matrices as one tile (each row's bytes read
    # together, whichever of K and M is the packed one), times row i of their x matrices
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    i = tl.program_id(1).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    cols = tl.arange(0, BLOCK_M)
    row_ok = rows < R
    x_ok = row_ok[:, None] & (ks < K)[None, :]
    x = tl.load(x_ptr + rows[:, None] * sxr + i * sxi + ks[None, :] * sxk, mask=x_ok, other=0.0)
    w_ok = x_ok[:, :, None] & (cols < M)[None, None, :]
    w = tl.load(w_ptr + rows[:, None, None] * swr + ks[None, :, None] * swk + cols[None, None, :] * swm,
                mask=w_ok, other=0.0)
    if WIDE:
        out = tl.sum(x.to(tl.float64)[:, :, None] * w.to(tl.float64), axis=1)
    else:
        out = tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32), axis=1)
    ok = row_ok[:, None] & (cols < M)[None, :]
    tl.store(out_ptr + rows[:, None] * (I * M) + i * M + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)


def row_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(x, w)`` for row-aligned operands: one launch for [R, I, K] @ [R, K, M]
    where the module doc allows, torch otherwise."""
    if not _fits(x, w):
        return torch.matmul(x, w)
    rows, inner, k = x.shape
    m = w.shape[2]
    out = torch.empty((rows, inner, m), dtype=x.dtype, device=x.device)
    block_k, block_m = triton.next_power_of_2(k), triton.next_power_of_2(m)
    block_r = max(1, TILE // (block_k * block_m))
    launch(_row_matmul, lambda meta: (triton.cdiv(rows, block_r), inner), (rows, k, m),
           (x, w, out, rows, inner, k, m, *x.stride(), *w.stride()),
           {"BLOCK_R": block_r, "BLOCK_K": block_k, "BLOCK_M": block_m, "WIDE": x.dtype == torch.float64})
    return out


def _fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (x.dim() == w.dim() == 3 and x.shape[0] == w.shape[0] and x.shape[2] == w.shape[1]
            and x.dtype == w.dtype and x.dtype in DTYPES and x.numel() > 0 and w.numel() > 0
            and triton.next_power_of_2(w.shape[1]) * triton.next_power_of_2(w.shape[2]) <= TILE
            and x.shape[1] <= MAX_GRID and launchable(x))
