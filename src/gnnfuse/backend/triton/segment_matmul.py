"""Segment (grouped) matmul in Triton: ``out[i] = x[i] @ w[type(i)]`` for rows grouped by
type, and its weight gradient ``out[t] = sum over rows i of type t of outer(x[i], g[i])``.

Every per-type transform (``typed_matmul``, the compact (vertex, relation) pairs of
``compact_typed_matmul``, Graphiler's ``indexed_matmul``) hands its rows over as one
group of row ids per type (ir/ops/typed.py). The torch form loops over the types and
runs one small GEMM each: with 90-266 relations (AIFB..AM) that is hundreds of launches
per transform, most of them on a few rows. Here one launch covers every type: the groups'
row ids are concatenated (type-sorted, so a tile of ``BLOCK_M`` consecutive positions
never straddles two types) and a program takes one tile, gathers its rows of ``x``
through the ids, multiplies them by its type's weight with ``tl.dot`` and scatters the
result rows back -- no type-sorted copy of ``x`` or of the output is made.

The type-sorted order is where sorting by relation pays: every program's rows share one
weight matrix, which it streams once through ``tl.dot``. The fused aggregation kernels
need no edge-type-sorted CSR: after compact materialization (passes/compact.py) no
relation matrix is read inside them (at most a per-relation scalar, HGT's prior) -- the
typed product is computed here, per (vertex, relation) pair, and they only gather its rows.

The weight gradient cuts each type's rows into chunks of ``TN_CHUNK`` positions; a
program sums one chunk's outer products in registers and adds its [K, N] block into its
type's matrix atomically, so a relation holding half the edges is spread over many
programs instead of one.

Precision follows the one torch applies to the same matmul: float32 runs in tf32 only
where ``torch.backends.cuda.matmul.allow_tf32`` allows it (off by default), bf16/fp16
operands multiply in their own type; accumulation is float32 in every case. Float64
(and mixed-dtype operands) keep the torch loop: ``tl.dot`` has no float64 tensor-core
path worth taking, and the loop is exact.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from ...ir.ops.dense import row_matrix
from ...ir.ops.typed import RowGroups, typed_matmul, typed_matmul_tn
from ..determinism import deterministic
from .launch import launch
from ...environ import getenv

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_M = 64          # forward tile: positions of one type per program
TN_CHUNK = 256        # weight gradient: positions of one type per program
_FIXED = {"BLOCK_N": 16, "BLOCK_K": 16}        # interpreter blocks (tl.dot needs >= 16)
_FIXED_TN = {"BLOCK_M": 16, **_FIXED}


def _configs(tn: bool) -> list[triton.Config]:
    """A few shapes, not a grid: every config compiles per (dtype, precision) on first use.
    Blocks 16 wide are there for the narrow outputs hetero layers have (R-GCN's hidden 16):
    a 32-wide block there multiplies zeros for half its lanes, and the autotuner, which
    had nothing narrower, took it -- 2.36 ms where a 16-wide block takes 0.71 (mag-like,
    3.05M rows, 128 -> 16, H100)."""
    rows = [{"BLOCK_M": 32}, {"BLOCK_M": 64}] if tn else [{}]
    if tn:
        shapes = ((16, 16, 4, 2), (16, 32, 4, 2), (16, 64, 4, 3), (32, 32, 4, 2), (64, 32, 4, 3), (128, 64, 8, 3))
    else:
        shapes = ((16, 16, 2, 2), (16, 32, 2, 2), (16, 32, 4, 2), (16, 64, 4, 3), (32, 16, 4, 2), (32, 32, 4, 3),
                  (64, 32, 4, 3), (64, 64, 4, 3), (128, 32, 8, 3), (128, 64, 8, 3))
    return [triton.Config({**r, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=st)
            for r in rows for n, k, w, st in shapes]


def fitting_configs(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The configs whose blocks are no wider than the dimensions they tile need (the
    power of two at or above the size, at least 16, `tl.dot`'s minimum): a wider block
    only multiplies masked zeros, and timing it is wasted autotuning. (The autotuner's
    ``early_config_prune`` hook; never empty: a 16 x 16 config always fits.)"""
    def fits(config: triton.Config, block: str, size: int) -> bool:
        return config.kwargs[block] <= max(16, triton.next_power_of_2(size))
    kept = [c for c in configs if fits(c, "BLOCK_N", named_args["N"]) and fits(c, "BLOCK_K", named_args["K"])]
    return kept or configs


@triton.jit
def _segment_matmul(x_ptr, w_ptr, out_ptr, order_ptr, tiles_ptr, gather_ptr, num_tiles, K, N,
                    stride_xm, stride_xk, stride_wt, stride_wk, stride_wn, stride_om, stride_on,
                    PRECISION: tl.constexpr, TILE: tl.constexpr, GATHER: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    tile = tl.program_id(0)
    t = tl.load(tiles_ptr + tile)
    start = tl.load(tiles_ptr + num_tiles + tile)
    end = tl.load(tiles_ptr + 2 * num_tiles + tile)
    pos = start + tl.arange(0, TILE)
    row_ok = pos < end
    rows = tl.load(order_ptr + pos, mask=row_ok, other=0)
    x_rows = rows
    if GATHER:
        x_rows = tl.load(gather_ptr + rows, mask=row_ok, other=0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_base = w_ptr + t * stride_wt
    acc = tl.zeros((TILE, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(x_ptr + x_rows[:, None] * stride_xm + ks[None, :] * stride_xk,
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_base + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _segment_matmul_tn(x_ptr, g_ptr, out_ptr, order_ptr, tiles_ptr, gather_ptr, num_tiles, K, N,
                       stride_xm, stride_xk, stride_gm, stride_gn, stride_ot, stride_ok, stride_on,
                       PRECISION: tl.constexpr, TILE: tl.constexpr, GATHER: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tile = tl.program_id(0)
    t = tl.load(tiles_ptr + tile)
    start = tl.load(tiles_ptr + num_tiles + tile)
    end = tl.load(tiles_ptr + 2 * num_tiles + tile)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_ok = ks < K
    col_ok = cols < N
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for m0 in range(0, TILE, BLOCK_M):
        pos = start + m0 + tl.arange(0, BLOCK_M)
        row_ok = pos < end
        rows = tl.load(order_ptr + pos, mask=row_ok, other=0)
        x_rows = rows
        if GATHER:
            x_rows = tl.load(gather_ptr + rows, mask=row_ok, other=0)
        a = tl.load(x_ptr + x_rows[:, None] * stride_xm + ks[None, :] * stride_xk,
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(g_ptr + rows[:, None] * stride_gm + cols[None, :] * stride_gn,
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(tl.trans(a), b, acc, input_precision=PRECISION)
    tl.atomic_add(out_ptr + t * stride_ot + ks[:, None] * stride_ok + cols[None, :] * stride_on, acc,
                  mask=k_ok[:, None] & col_ok[None, :])


_PRUNE = {"early_config_prune": fitting_configs}
_TUNED = {"forward": triton.autotune(_configs(False), key=["K", "N"], prune_configs_by=_PRUNE)(_segment_matmul),
          # the weight gradient adds into `out`: zeroed between the autotuner's trial runs
          "tn": triton.autotune(_configs(True), key=["K", "N"], reset_to_zero=["out_ptr"],
                                prune_configs_by=_PRUNE)(_segment_matmul_tn)}


class _Layout(NamedTuple):
    """Rows of every type as one type-sorted id list, and the tile map over it: per tile
    its type, first position and the end of its type's positions ([3, tiles] int64)."""
    order: torch.Tensor
    tiles: torch.Tensor

    @property
    def num_tiles(self) -> int:
        return self.tiles.shape[1]


def _layout(groups: list[torch.Tensor], per_row: int, tile: int) -> _Layout:
    """The type-sorted ids of ``groups``' rows, each row standing for ``per_row``
    consecutive kernel rows (a row's middle dimensions flattened), cut into tiles of
    ``tile`` positions that never straddle two types.

    Groups from the graph's caches (`RowGroups`: ctx.groups, the compact pairs) carry
    their sizes and keep the layout in their memo, so a call reads neither a tensor
    length nor builds anything, whatever the number of types; a plain list is laid out
    per call."""
    if isinstance(groups, RowGroups):
        counts, memo = groups.counts, groups.memo
    else:
        counts, memo = tuple(len(g) for g in groups), {}
    key = ("segment_layout", per_row, tile)
    if key not in memo:
        order = memo.get(("segment_order", per_row))     # shared by the forward's and the gradient's tiles
        if order is None:
            order = torch.cat(groups)
            if per_row > 1:
                order = (order[:, None] * per_row + torch.arange(per_row, device=order.device)).reshape(-1)
            memo[("segment_order", per_row)] = order
        sizes = np.asarray(counts, dtype=np.int64) * per_row
        ends = np.cumsum(sizes)
        per_type = -(-sizes // tile)
        tile_type = np.repeat(np.arange(len(sizes)), per_type)
        first_tile = np.cumsum(per_type) - per_type
        start = ends[tile_type] - sizes[tile_type] + (np.arange(len(tile_type)) - first_tile[tile_type]) * tile
        tiles = torch.from_numpy(np.stack([tile_type, start, ends[tile_type]])).to(order.device)
        memo[key] = _Layout(order, tiles)
    return memo[key]


def kernel_applies(*tensors: torch.Tensor) -> bool:
    """Whether the Triton kernels take these operands: one floating dtype they multiply
    natively (not float64), on a CUDA device or under Triton's interpreter."""
    dtype = tensors[0].dtype
    return dtype in KERNEL_DTYPES and all(t.dtype == dtype for t in tensors) and all(map(launchable, tensors))


def dot_applies(*tensors: torch.Tensor) -> bool:
    """`kernel_applies` for the kernels that multiply with ``tl.dot``: not bfloat16 off a
    GPU, which the interpreter's numpy has no type for -- its tl.dot read the bits as
    another type and returned values near 5e9 for an R-GCN's -0.8, silently."""
    if tensors[0].dtype == torch.bfloat16 and not all(t.is_cuda for t in tensors):
        return False
    return kernel_applies(*tensors)


def launchable(tensor: torch.Tensor) -> bool:
    """Whether a Triton kernel can read ``tensor``: on a CUDA device, or anywhere under
    Triton's interpreter."""
    return tensor.is_cuda or getenv("TRITON_INTERPRET") == "1"


def _precision(dtype: torch.dtype) -> str:
    return "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _autotuning() -> bool:
    from .executor import _autotune    # the executor imports this module: read at call time
    return _autotune()


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` [R, *mid, K] as [R * prod(mid), K] kernel rows, and prod(mid)."""
    per_row = int(np.prod(x.shape[1:-1], dtype=np.int64))
    return row_matrix(x), per_row


def _gathered(x: torch.Tensor, gather: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(x, gather)`` as the kernels read them: they follow ``gather`` for one kernel row
    per table row; rows with middle dimensions are gathered here instead."""
    if gather is not None and x.dim() > 2:
        return x.index_select(0, gather), None
    return x, gather


def segment_matmul(x: torch.Tensor, w: torch.Tensor, groups: list[torch.Tensor],
                   gather: torch.Tensor | None = None) -> torch.Tensor:
    """``out[i] = x[gather[i]] @ w[t]`` for every row i in ``groups[t]`` (`typed_matmul`'s
    contract; ``gather`` None reads ``x[i]``), one launch for all types, no gathered copy
    of ``x``; the torch loop where the kernel does not apply."""
    if not groups or not dot_applies(x, w) or x.shape[0] == 0 or w.shape[-1] == 0:
        return typed_matmul(x, w, groups, gather)
    x, gather = _gathered(x, gather)
    rows, per_row = _rows(x)
    k, n = rows.shape[1], w.shape[-1]
    lead = tuple(x.shape[:-1]) if gather is None else (gather.shape[0],)
    out = torch.empty((math.prod(lead), n), dtype=x.dtype, device=x.device)
    layout = _layout(groups, per_row, BLOCK_M)
    if k == 0 or layout.num_tiles == 0:
        return out.zero_().reshape(lead + (n,))
    tuned = _autotuning()
    kernel: Callable = _TUNED["forward"] if tuned else _segment_matmul
    fixed = {} if tuned else _FIXED
    launch(kernel, lambda meta: (layout.num_tiles, triton.cdiv(n, meta["BLOCK_N"])), (k, n),
           (rows, w, out, layout.order, layout.tiles, out if gather is None else gather, layout.num_tiles, k, n,
            *rows.stride(), *w.stride(), *out.stride()),
           {"PRECISION": _precision(x.dtype), "TILE": BLOCK_M, "GATHER": gather is not None, **fixed})
    return out.reshape(lead + (n,))


def segment_matmul_tn(x: torch.Tensor, g: torch.Tensor, groups: list[torch.Tensor],
                      gather: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = sum over rows i in groups[t] of outer(x[gather[i]], g[i])``
    (`typed_matmul_tn`'s contract: types without rows get zeros; ``gather`` None reads
    ``x[i]``), accumulated in float32; the torch loop under
    ``torch.use_deterministic_algorithms(True)``, since chunks add into a type's matrix
    atomically."""
    if not groups or not dot_applies(x, g) or x.shape[0] == 0 or deterministic():
        return typed_matmul_tn(x, g, groups, gather)
    x, gather = _gathered(x, gather)
    rows, per_row = _rows(x)
    grads = row_matrix(g)
    k, n = rows.shape[1], grads.shape[1]
    out = torch.zeros((len(groups), k, n), dtype=torch.float32, device=x.device)
    layout = _layout(groups, per_row, TN_CHUNK)
    if k and n and layout.num_tiles:
        tuned = _autotuning()
        kernel: Callable = _TUNED["tn"] if tuned else _segment_matmul_tn
        fixed = {} if tuned else _FIXED_TN
        def grid(meta):
            return layout.num_tiles, triton.cdiv(k, meta["BLOCK_K"]), triton.cdiv(n, meta["BLOCK_N"])
        launch(kernel, grid,
               (k, n), (rows, grads, out, layout.order, layout.tiles, out if gather is None else gather,
                        layout.num_tiles, k, n, *rows.stride(), *grads.stride(), *out.stride()),
               {"PRECISION": _precision(x.dtype), "TILE": TN_CHUNK, "GATHER": gather is not None, **fixed})
    return out.to(x.dtype)
