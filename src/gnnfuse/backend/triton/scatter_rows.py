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
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...ir.ops.compact import scatter_scaled_rows as torch_scatter_scaled_rows
from ..determinism import deterministic
from .launch import launch
from .segment_matmul import kernel_applies

BLOCK_E = 32
MAX_BLOCK_F = 128


@triton.jit
def _scatter_scaled_rows(table_ptr, gather_ptr, scatter_ptr, scale_ptr, out_ptr, E, F, stride_t, stride_o,
                         SCALED: tl.constexpr, GATHER: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    edges = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    edge_ok = edges < E
    ok = edge_ok[:, None] & (cols < F)[None, :]
    source = edges.to(tl.int64)
    if GATHER:
        source = tl.load(gather_ptr + edges, mask=edge_ok, other=0).to(tl.int64)
    target = tl.load(scatter_ptr + edges, mask=edge_ok, other=0)
    rows = tl.load(table_ptr + source[:, None] * stride_t + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if SCALED:
        rows = rows * tl.load(scale_ptr + edges, mask=edge_ok, other=0.0).to(tl.float32)[:, None]
    tl.atomic_add(out_ptr + target[:, None] * stride_o + cols[None, :], rows, mask=ok)


def scatter_scaled_rows(table: torch.Tensor, gather: torch.Tensor | None, scatter: torch.Tensor,
                        scale: torch.Tensor | None, rows: int) -> torch.Tensor:
    """``out[scatter[e]] += scale[e] * table[gather[e]]`` (``scale`` one value per edge, or
    None; ``gather`` None reads row ``e``), ``out`` of ``rows`` rows shaped like
    ``table``'s; one launch, nothing per edge written. The torch form where the kernel
    does not apply, and under ``torch.use_deterministic_algorithms(True)`` (its
    ``index_add_`` is deterministic there; these atomics are not)."""
    operands = (table,) if scale is None else (table, scale)
    width = math.prod(table.shape[1:])
    if (not kernel_applies(*operands) or scatter.numel() == 0 or width == 0    # (an empty table: no edges)
            or deterministic()):
        return torch_scatter_scaled_rows(table, gather, scatter, scale, rows)
    flat = table.reshape(table.shape[0], width)
    flat = flat if flat.stride(1) == 1 else flat.contiguous()
    out = torch.zeros((rows, width), dtype=torch.float32, device=table.device)
    block_f = min(MAX_BLOCK_F, max(16, triton.next_power_of_2(width)))     # narrow rows: lanes masked
    edges = scatter.numel()
    scale_arg = out if scale is None else scale.reshape(-1)
    gather_arg = scatter if gather is None else gather.contiguous()    # (not read without GATHER)
    launch(_scatter_scaled_rows, lambda meta: (triton.cdiv(edges, BLOCK_E), triton.cdiv(width, block_f)),
           (edges, width), (flat, gather_arg, scatter.contiguous(), scale_arg, out, edges, width,
                            flat.stride(0), out.stride(0)),
           {"SCALED": scale is not None, "GATHER": gather is not None, "BLOCK_E": BLOCK_E, "BLOCK_F": block_f})
    return out.to(table.dtype).reshape((rows,) + tuple(table.shape[1:]))
