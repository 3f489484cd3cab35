"""Many rows summed into a few, in Triton: ``out[index[e]] += x[e]`` when the entries
outnumber the rows by thousands (an edge table summed per relation type: the gradient
of a per-type parameter, HGT's relation prior).

`index_add_` straight into so few rows makes every atomic add of a warp hit the same
addresses; the reference form (`movement._slotted_sum`) spreads them over slots, but
builds the slotted index per call from an ``arange``, a remainder, a product and a sum
over all entries: on the mag-sized HGT step (21.1M edges, 4 relations, 2 heads) about
0.37 ms of index arithmetic and 0.33 ms of adds per layer (H200 profile). Here each
program sums its chunks of entries into a [rows, width] tile in registers -- an entry
lands in its row through a comparison with every row id, cheap while rows x width is
small -- and stores the tile as its partial result; one torch sum over the programs'
partials finishes. No atomics, so the result does not depend on scheduling. Tables of
more rows x width than `MAX_TILE`, other dtypes and devices Triton cannot launch on
keep the reference form, as does a configuration whose first launch fails (with a
warning): the kernel was checked against ``index_add`` under Triton's interpreter, not
yet compiled for a GPU.
"""
from __future__ import annotations

import math
import warnings

import torch
import triton
import triton.language as tl

from ...ir.ops.movement import reduce_rows
from .launch import launch
from .segment_matmul import launchable

MAX_TILE = 64            # rows x width (both padded to powers of two) one program accumulates
ELEMENTS = 4096          # entries x rows x width one chunk compares in registers
CHUNKS = 8               # chunks a program sums before storing its partial result
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@triton.jit
def _few_rows_sum(x_ptr, index_ptr, partial_ptr, E, W, stride_x, BLOCK_E: tl.constexpr, R_PAD: tl.constexpr,
                  W_PAD: tl.constexpr, CHUNKS: tl.constexpr, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.arange(0, R_PAD)
    cols = tl.arange(0, W_PAD)
    if WIDE:
        acc = tl.zeros([R_PAD, W_PAD], tl.float64)
    else:
        acc = tl.zeros([R_PAD, W_PAD], tl.float32)
    for c in range(CHUNKS):
        e = (pid.to(tl.int64) * CHUNKS + c) * BLOCK_E + tl.arange(0, BLOCK_E)
        emask = e < E
        idx = tl.load(index_ptr + e, mask=emask, other=-1)
        vals = tl.load(x_ptr + e[:, None] * stride_x + cols[None, :], mask=emask[:, None] & (cols < W)[None, :],
                       other=0.0)
        if WIDE:
            vals = vals.to(tl.float64)
        else:
            vals = vals.to(tl.float32)
        hit = idx[:, None, None] == rows[None, :, None]          # [BLOCK_E, R_PAD, 1]
        acc += tl.sum(tl.where(hit, vals[:, None, :], 0.0), axis=0)
    tl.store(partial_ptr + pid * R_PAD * W_PAD + rows[:, None] * W_PAD + cols[None, :], acc)


def few_rows_sum(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """``zeros(rows, *x.shape[1:]).index_add_(0, index, x)`` (`reduce_rows`' sum): one
    launch and a sum of its partials where the module doc allows, the reference form
    otherwise."""
    width = math.prod(x.shape[1:])
    r_pad, w_pad = triton.next_power_of_2(max(rows, 1)), triton.next_power_of_2(max(width, 1))
    table = x.reshape(x.shape[0], width) if x.numel() else x
    if (r_pad * w_pad > MAX_TILE or x.dtype not in DTYPES or x.shape[0] == 0 or width == 0 or rows == 0
            or not launchable(x) or index.dtype not in (torch.int32, torch.int64) or table.stride(-1) != 1):
        return reduce_rows(x, index, rows, "sum")
    block_e = max(16, ELEMENTS // (r_pad * w_pad))
    programs = triton.cdiv(x.shape[0], block_e * CHUNKS)
    wide = x.dtype == torch.float64
    partial = torch.empty((programs, r_pad, w_pad), dtype=torch.float64 if wide else torch.float32,
                          device=x.device)
    args = (table, index.contiguous(), partial, x.shape[0], width, table.stride(0))
    config = {"BLOCK_E": block_e, "R_PAD": r_pad, "W_PAD": w_pad, "CHUNKS": CHUNKS, "WIDE": wide}
    key = (x.device.type, block_e, r_pad, w_pad, wide, x.dtype, index.dtype)
    built = _BUILT.get(key)
    if built is False:
        return reduce_rows(x, index, rows, "sum")
    try:
        launch(_few_rows_sum, lambda meta: (programs,), (), args, config)
    except Exception as exc:  # noqa: BLE001 - a kernel that does not build here: the reference form
        if built:      # it ran before: this is no build failure
            raise
        _BUILT[key] = False
        first = str(exc).splitlines()[0] if str(exc) else ""
        warnings.warn(f"gnnfuse: the Triton few-rows sum kernel failed to build or launch for {key} "
                      f"({type(exc).__name__}: {first}); such sums take the reference form (index_add_ "
                      "through slots) from now on", RuntimeWarning, stacklevel=2)
        return reduce_rows(x, index, rows, "sum")
    _BUILT[key] = True
    return partial.sum(0)[:rows, :width].to(x.dtype).reshape((rows,) + tuple(x.shape[1:]))


# Per launch configuration: whether its first launch built and ran (False: it failed, and
# its sums take the reference form, the warning given once)
_BUILT: dict[tuple, bool] = {}
