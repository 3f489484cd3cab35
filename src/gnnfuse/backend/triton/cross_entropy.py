"""Cross-entropy over selected rows of a logit matrix: one Triton pass forward, one back.

A node classifier's loss is ``F.cross_entropy(out[train_idx], y[train_idx])``. On a GPU
torch runs it as a gather of the training rows, a log-softmax, and an NLL loss whose
forward and backward are single-block kernels (one block of threads for the whole loss:
78 and 103 us on arxiv's 91K training rows on an H200), then the gather's backward, an
``index_put_`` that sorts the indices before it scatters. On an arxiv-sized training step
that is about 0.27 ms of 1.7, shared by every framework that calls torch's loss.

Here the forward reads each selected row once (``rows[r]``, or row ``r`` when no rows
are given), keeps its log-sum-exp, and sums the losses of a block of rows per program
(the sum of the blocks is a torch reduction, so the result does not depend on the order
in which programs finish). With rows given it also copies the selected rows into a
compact [R, classes] buffer for the backward -- the same memory torch's log-softmax
keeps -- rather than keeping the whole [N, classes] matrix alive. The backward writes
``(softmax - one_hot(target)) * scale`` for each selected row straight into the input's
gradient: stored when rows are not given, added atomically (a row selected twice gets
both terms) into a zero-filled gradient otherwise. `nn.functional.cross_entropy` runs
them in steps captured in a CUDA graph, where they measured 2.8-3.8x faster than torch's
(its module doc says why not elsewhere).

Bad indices give NaN, not an assert and not a wrong number: a target outside
``[0, classes)`` other than ``ignore_index``, or a row outside ``[-N, N)`` (negative rows
count from the end, as indexing does), makes that row's loss NaN and so the whole loss
NaN, without a device-to-host read per step (which would stop a step from being captured
in a CUDA graph).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch

DTYPES = (torch.float32, torch.float64)
MAX_CLASSES = 4096            # one row in one tile
# Rows x padded classes per program, and its warps: a sweep on an H200 (tiles of 256 to
# 4096 elements, 1 to 8 warps; logits of 41 and 47 classes) found 4096-element tiles on 4
# warps 2-3x slower than small ones each way, and 256 on 2 among the fastest at every
# size; small tiles keep the [rows, classes] pointer tiles in registers.
TILE_ELEMENTS = 256
NUM_WARPS = 2


@triton.jit
def _row_tile(x_ptr, rows_ptr, target_ptr, n_sel, n_rows, classes, stride, ignore_index, start,
              HAS_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """The selected rows ``start .. start + BLOCK_R`` as a [BLOCK_R, BLOCK_C] tile of
    logits (-inf outside the classes), with each row's index into ``x``, its target,
    and which rows exist, count (target not ignored) and have in-range indices."""
    r = start + tl.arange(0, BLOCK_R)
    live = r < n_sel
    if HAS_ROWS:
        row = tl.load(rows_ptr + r, mask=live, other=0).to(tl.int64)
        row = tl.where(row < 0, row + n_rows, row)
    else:
        row = r.to(tl.int64)
    target = tl.load(target_ptr + r, mask=live, other=ignore_index).to(tl.int64)
    counted = live & (target != ignore_index)
    sound = (row >= 0) & (row < n_rows) & (target >= 0) & (target < classes)
    c = tl.arange(0, BLOCK_C)
    readable = live & (row >= 0) & (row < n_rows)
    inside = readable[:, None] & (c[None, :] < classes)
    x = tl.load(x_ptr + row[:, None] * stride + c[None, :], mask=inside, other=-float("inf"))
    return r, row, target, live, counted, sound, c, inside, x


@triton.jit
def _forward(x_ptr, rows_ptr, target_ptr, lse_ptr, kept_ptr, partial_ptr, n_sel, n_rows, classes, stride,
             ignore_index, HAS_ROWS: tl.constexpr, KEEP: tl.constexpr, BLOCK_R: tl.constexpr,
             BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    r, row, target, live, counted, sound, c, inside, x = _row_tile(
        x_ptr, rows_ptr, target_ptr, n_sel, n_rows, classes, stride, ignore_index, pid * BLOCK_R,
        HAS_ROWS, BLOCK_R, BLOCK_C)
    peak = tl.max(x, axis=1)
    peak = tl.where(tl.max(inside.to(tl.int32), axis=1) > 0, peak, 0.0)   # a row read nothing: keep exp() finite
    lse = peak + tl.log(tl.sum(tl.exp(x - peak[:, None]), axis=1))
    picked = tl.sum(tl.where(c[None, :] == target[:, None], x, 0.0), axis=1)
    loss = tl.where(counted, tl.where(sound, lse - picked, float("nan")), 0.0)
    tl.store(lse_ptr + r, lse, mask=live)
    if KEEP:      # the selected rows, compact, for the backward
        tl.store(kept_ptr + r[:, None].to(tl.int64) * classes + c[None, :], x,
                 mask=live[:, None] & (c[None, :] < classes))
    tl.store(partial_ptr + 2 * pid, tl.sum(loss, axis=0))
    tl.store(partial_ptr + 2 * pid + 1, tl.sum(counted.to(partial_ptr.dtype.element_ty), axis=0))


@triton.jit
def _backward(x_ptr, rows_ptr, target_ptr, lse_ptr, scale_ptr, grad_ptr, n_sel, n_rows, classes, stride,
              ignore_index, HAS_ROWS: tl.constexpr, KEPT: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    if KEPT:      # x is the forward's compact copy: selected row r sits at row r
        r, _, target, live, counted, sound, c, inside, x = _row_tile(
            x_ptr, rows_ptr, target_ptr, n_sel, n_sel, classes, classes, ignore_index, pid * BLOCK_R,
            False, BLOCK_R, BLOCK_C)
        row = tl.load(rows_ptr + r, mask=live, other=0).to(tl.int64)
        row = tl.where(row < 0, row + n_rows, row)
        inside = inside & ((row >= 0) & (row < n_rows))[:, None]
    else:
        r, row, target, live, counted, sound, c, inside, x = _row_tile(
            x_ptr, rows_ptr, target_ptr, n_sel, n_rows, classes, stride, ignore_index, pid * BLOCK_R,
            HAS_ROWS, BLOCK_R, BLOCK_C)
    lse = tl.load(lse_ptr + r, mask=live, other=0.0)
    scale = tl.load(scale_ptr)
    grad = tl.exp(x - lse[:, None]) * scale - tl.where(c[None, :] == target[:, None], scale, 0.0)
    grad = tl.where(counted[:, None], grad, 0.0)
    where = grad_ptr + row[:, None] * classes + c[None, :]
    if HAS_ROWS:
        tl.atomic_add(where, grad, mask=inside, sem="relaxed")     # no ordering needed: a relaxed reduction
    else:
        tl.store(where, grad, mask=inside)


def _blocks(classes: int) -> tuple[int, int]:
    block_c = triton.next_power_of_2(max(classes, 1))
    return max(1, min(64, TILE_ELEMENTS // block_c)), block_c


def check(input: torch.Tensor, target: torch.Tensor, rows: torch.Tensor | None) -> None:
    """What the kernels take: a 2-D row-contiguous logit matrix of a dtype in `DTYPES`
    with at most `MAX_CLASSES` classes, integer targets, one per selected row."""
    if input.dim() != 2 or input.stride(1) != 1 or input.dtype not in DTYPES:
        raise ValueError(f"the cross-entropy kernels take a [rows, classes] matrix of {DTYPES} with contiguous "
                         f"rows, got {tuple(input.shape)} {input.dtype} strides {input.stride()}")
    if input.shape[1] > MAX_CLASSES:
        raise ValueError(f"the cross-entropy kernels take at most {MAX_CLASSES} classes, got {input.shape[1]}")
    if rows is not None and (rows.dim() != 1 or not rows.is_contiguous()
                             or rows.dtype not in (torch.int64, torch.int32)):
        raise ValueError(f"rows must be a contiguous 1-D int64/int32 tensor, got {tuple(rows.shape)} {rows.dtype}")
    selected = input.shape[0] if rows is None else rows.numel()
    if target.dim() != 1 or target.numel() != selected or target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"target must hold one int64/int32 class per selected row ({selected}), got "
                         f"{tuple(target.shape)} {target.dtype}")


def forward(input: torch.Tensor, target: torch.Tensor, rows: torch.Tensor | None, ignore_index: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per selected row the log-sum-exp, per program of rows the (loss sum, counted rows)
    and, with ``rows``, the selected rows' compact copy (None otherwise)."""
    check(input, target, rows)
    n_rows, classes = input.shape
    selected = target.numel()
    block_r, block_c = _blocks(classes)
    programs = triton.cdiv(selected, block_r)
    lse = torch.empty(selected, dtype=input.dtype, device=input.device)
    partial = torch.zeros(max(programs, 1), 2, dtype=input.dtype, device=input.device)
    kept = torch.empty(selected, classes, dtype=input.dtype, device=input.device) if rows is not None else None
    if selected:
        launch(_forward, lambda meta: (programs,), (classes,),
               (input, rows if rows is not None else target, target, lse, kept if kept is not None else lse, partial,
                selected, n_rows, classes, input.stride(0), ignore_index),
               {"HAS_ROWS": rows is not None, "KEEP": kept is not None, "BLOCK_R": block_r, "BLOCK_C": block_c,
                "num_warps": NUM_WARPS})
    return lse, partial, kept


def backward(input: torch.Tensor | None, kept: torch.Tensor | None, target: torch.Tensor,
             rows: torch.Tensor | None, lse: torch.Tensor, scale: torch.Tensor, ignore_index: int,
             shape: torch.Size) -> torch.Tensor:
    """The gradient of the loss with respect to the [N, classes] input, ``scale`` being
    the loss's incoming gradient divided by the mean's count (a one-element device
    tensor). Reads ``kept`` (the forward's copy of the selected rows) when given, else
    ``input``."""
    n_rows, classes = shape
    selected = target.numel()
    block_r, block_c = _blocks(classes)
    dtype, device = lse.dtype, lse.device
    grad = (torch.zeros if rows is not None else torch.empty)(n_rows, classes, dtype=dtype, device=device)
    source = kept if kept is not None else input
    if selected:
        launch(_backward, lambda meta: (triton.cdiv(selected, block_r),), (classes,),
               (source, rows if rows is not None else target, target, lse, scale, grad, selected, n_rows, classes,
                source.stride(0), ignore_index),
               {"HAS_ROWS": rows is not None, "KEPT": kept is not None, "BLOCK_R": block_r, "BLOCK_C": block_c,
                "num_warps": NUM_WARPS})
    return grad
