"""Scatter of scaled gathered rows in Triton: ``out[scatter[e]] += s[e] * table[gather[e]]``
over the edges ``e``, without an [E, F] table in between.

The relation-typed linear aggregation (ir/ops/typed_aggregate.py) moves rows between a
vertex table, the (vertex, relation) pairs and the edges: it sums each edge's scaled
source row into its pair (the ``after`` order and the weight gradient), and each edge's
scaled pair product into its destination (the ``before`` order). In torch each of those
is a gather, a scale and an ``index_add_`` -- an [E, F] table written and read back, the
largest transient of an R-GCN step and the per-edge write the IO rule forbids
(passes/io_rule.py). Here one program takes a block of edges and a block of features,
loads the rows through ``gather``, scales them in registers and adds them into ``out``
with atomics, as ``index_add_`` on a GPU does (so the summation order is not fixed
either). Sums are float32 whatever the operands' float type; float64 and mixed dtypes
keep the torch form, as the segment matmul does.

Under ``torch.use_deterministic_algorithms(True)`` the atomics would add in arrival
order, and torch's deterministic ``index_add_`` sorts the [E, F] table's writes (most of
an R-GCN step there: 297 of 645 ms on reddit2-like, H200). Instead the edges are ordered
by target once per scatter index (a stable sort, remembered while the index tensor is
unchanged) and one program per target row walks its edges in that order, blocks of a
fixed size, and stores the row's sum: the same bits on every run, nothing atomic.
"""
from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...graph.index_cache import _LOCK, _forget, _stamp, put_recent
from ...ir.ops.compact import scatter_scaled_rows as torch_scatter_scaled_rows
from ..determinism import deterministic
from .launch import launch, wide_ids
from .segment_matmul import kernel_applies

BLOCK_E = 32
MAX_BLOCK_F = 128


@triton.jit
def _scatter_scaled_rows(table_ptr, gather_ptr, scatter_ptr, scale_ptr, out_ptr, E, F, stride_t, stride_o,
                         SCALED: tl.constexpr, GATHER: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
                         WIDE: tl.constexpr):
    first = tl.program_id(0)
    if WIDE:        # 2^31 edges or more (`launch.wide_ids`)
        first = first.to(tl.int64)
    edges = first * BLOCK_E + tl.arange(0, BLOCK_E)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    edge_ok = edges < E
    ok = edge_ok[:, None] & (cols < F)[None, :]
    source = edges.to(tl.int64)
    if GATHER:
        source = tl.load(gather_ptr + edges, mask=edge_ok, other=0).to(tl.int64)
    # int64 before the product: the compact tables' int32 indices (`compact.narrow_index`)
    # times a row width wrapped once ``out`` held 2^31 elements
    target = tl.load(scatter_ptr + edges, mask=edge_ok, other=0).to(tl.int64)
    rows = tl.load(table_ptr + source[:, None] * stride_t + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if SCALED:
        rows = rows * tl.load(scale_ptr + edges, mask=edge_ok, other=0.0).to(tl.float32)[:, None]
    tl.atomic_add(out_ptr + target[:, None] * stride_o + cols[None, :], rows, mask=ok)


@triton.jit
def _scatter_rows_in_order(table_ptr, gather_ptr, order_ptr, offsets_ptr, scale_ptr, out_ptr, F, stride_t, stride_o,
                           SCALED: tl.constexpr, GATHER: tl.constexpr, BLOCK_E: tl.constexpr,
                           BLOCK_F: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    col_ok = cols < F
    start = tl.load(offsets_ptr + row)
    end = tl.load(offsets_ptr + row + 1)
    total = tl.zeros([BLOCK_F], dtype=tl.float32)
    for first in range(start, end, BLOCK_E):      # the row's edges in target order, blocks of a fixed size
        at = first + tl.arange(0, BLOCK_E)
        edge_ok = at < end
        edges = tl.load(order_ptr + at, mask=edge_ok, other=0).to(tl.int64)
        source = edges
        if GATHER:
            source = tl.load(gather_ptr + edges, mask=edge_ok, other=0).to(tl.int64)
        rows = tl.load(table_ptr + source[:, None] * stride_t + cols[None, :],
                       mask=edge_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        if SCALED:
            rows = rows * tl.load(scale_ptr + edges, mask=edge_ok, other=0.0).to(tl.float32)[:, None]
        total += tl.sum(rows, axis=0)
    tl.store(out_ptr + row.to(tl.int64) * stride_o + cols, total, mask=col_ok)


class TargetOrder(NamedTuple):
    """The edges of a scatter index grouped by target: ``edges`` sorted stably by target,
    and each target row's range ``offsets[r]:offsets[r + 1]`` in it."""
    edges: torch.Tensor
    offsets: torch.Tensor


# scatter index's id -> (weak reference to it, its stamp, rows, its TargetOrder): the
# typed aggregation scatters along the same graph-cached indices every step
_ORDERS: OrderedDict[int, tuple[weakref.ref, tuple, int, TargetOrder]] = OrderedDict()
_ORDERS_KEPT = 32


def target_order(scatter: torch.Tensor, rows: int) -> TargetOrder:
    """`TargetOrder` of ``scatter`` (entries below ``rows``), remembered while the tensor
    is unchanged (`index_cache`'s stamp: version, memory, shape)."""
    stamp, slot = _stamp([scatter]), id(scatter)
    with _LOCK:
        entry = _ORDERS.get(slot)
        if entry is not None and entry[0]() is scatter and entry[1] == stamp and entry[2] == rows:
            _ORDERS.move_to_end(slot)
            return entry[3]
    targets, edges = torch.sort(scatter, stable=True)
    offsets = torch.searchsorted(targets, torch.arange(rows + 1, dtype=targets.dtype, device=targets.device))
    order = TargetOrder(edges.to(torch.int32) if scatter.numel() <= torch.iinfo(torch.int32).max else edges,
                        offsets)
    if stamp is not None:       # (an inference tensor has none: sorted on each call)
        ref = weakref.ref(scatter, lambda dead: _forget(slot, dead, _ORDERS))    # its order goes with it
        with _LOCK:
            put_recent(_ORDERS, slot, (ref, stamp, rows, order), _ORDERS_KEPT)
    return order


def scatter_scaled_rows(table: torch.Tensor, gather: torch.Tensor | None, scatter: torch.Tensor,
                        scale: torch.Tensor | None, rows: int) -> torch.Tensor:
    """``out[scatter[e]] += scale[e] * table[gather[e]]`` (``scale`` one value per edge, or
    None; ``gather`` None reads row ``e``), ``out`` of ``rows`` rows shaped like
    ``table``'s; one launch, nothing per edge written. The torch form where the kernel
    does not apply; under ``torch.use_deterministic_algorithms(True)`` the edges walked
    in target order (`target_order`), not added atomically."""
    operands = (table,) if scale is None else (table, scale)
    width = math.prod(table.shape[1:])
    if not kernel_applies(*operands) or scatter.numel() == 0 or width == 0:    # (an empty table: no edges)
        return torch_scatter_scaled_rows(table, gather, scatter, scale, rows)
    flat = table.reshape(table.shape[0], width)
    flat = flat if flat.stride(1) == 1 else flat.contiguous()
    block_f = min(MAX_BLOCK_F, max(16, triton.next_power_of_2(width)))     # narrow rows: lanes masked
    edges = scatter.numel()
    gather_arg = scatter if gather is None else gather.contiguous()    # (not read without GATHER)
    flags = {"SCALED": scale is not None, "GATHER": gather is not None, "BLOCK_E": BLOCK_E, "BLOCK_F": block_f}
    if deterministic():
        order = target_order(scatter, rows)
        out = torch.empty((rows, width), dtype=torch.float32, device=table.device)
        if rows:
            scale_arg = out if scale is None else scale.reshape(-1)
            launch(_scatter_rows_in_order, lambda meta: (rows, triton.cdiv(width, block_f)), (rows, width),
                   (flat, gather_arg, order.edges, order.offsets, scale_arg, out, width, flat.stride(0),
                    out.stride(0)), {**flags, "num_warps": 1})
    else:
        out = torch.zeros((rows, width), dtype=torch.float32, device=table.device)
        scale_arg = out if scale is None else scale.reshape(-1)
        launch(_scatter_scaled_rows, lambda meta: (triton.cdiv(edges, BLOCK_E), triton.cdiv(width, block_f)),
               (edges, width), (flat, gather_arg, scatter.contiguous(), scale_arg, out, edges, width,
                                flat.stride(0), out.stride(0)), {**flags, "WIDE": wide_ids(edges, BLOCK_E)})
    return out.to(table.dtype).reshape((rows,) + tuple(table.shape[1:]))
