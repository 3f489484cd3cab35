"""Dropout's keep mask drawn from a counter on the GPU, in one Triton pass.

torch's CUDA dropout writes its output and a one-byte keep mask, which it keeps until the
backward reads it back (`masked_scale`). On a products-sized [2.45M, 100] input that is
0.24 GB more written per step, and on the hidden [2.45M, 64] table 0.16 GB written and
read again. Here element ``i``'s decision is a pure function of ``(seed, i)``, so the
forward writes only the output and the backward regenerates the mask from the seed, as
the CPU kernel (backend/cpu/random_mask.py) does.

The numbers are Philox4x32-10 (Salmon et al., SC 2011: the generator torch's CUDA
dropout uses too), one draw of four for elements ``4g .. 4g + 3`` keyed by the group
``g`` -- a function of the element's flat position only, so any block size gives the same
mask. The seed is a one-element device tensor drawn by torch's CUDA generator, never a
host number: a step captured in a CUDA graph draws a new seed in every replay (a host
seed would be baked into the graph, and every replay would drop the same elements).
An element is kept when its uniform number in [0, 1) is at least ``p``, and scaled by
``1 / (1 - p)``.

Measured on an H200 (`benchmarks/results/dropout.md`, kernels replayed from CUDA graphs):
forward and backward together 1.23-1.26x torch's at [2.45M, 64], [169K, 128] and
[169K, 64], but 0.84x at [2.45M, 100] (forward 707 against 668 us: 2.8 TB/s where the
other shapes reach 3.6-4.2; not understood yet).
"""
from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from .launch import launch

DTYPES = (torch.float32, torch.float64)
BLOCK = 2048          # elements per program: 512 Philox draws
_SEED_BOUND = 1 << 62


@triton.jit(do_not_specialize=["scale_bits"])
def _masked(src_ptr, out_ptr, seed_ptr, n, p, scale_bits, BLOCK: tl.constexpr):
    # a [groups, 4] tile: element 4g + m reads draw m of group g; each thread holds whole
    # groups, so picking the draw per column moves nothing between threads
    groups = tl.program_id(0).to(tl.int64) * (BLOCK // 4) + tl.arange(0, BLOCK // 4)
    u0, u1, u2, u3 = tl.rand4x(tl.load(seed_ptr), groups)
    column = tl.arange(0, 4)[None, :]
    uniform = tl.where(column == 0, u0[:, None], tl.where(column == 1, u1[:, None],
                                                          tl.where(column == 2, u2[:, None], u3[:, None])))
    offs = groups[:, None] * 4 + column
    inside = offs < n
    x = tl.load(src_ptr + offs, mask=inside, other=0.0)
    scale = scale_bits.to(tl.float64, bitcast=True).to(x.dtype)     # exact in float64: no float32 argument
    kept = tl.where(uniform >= p, x * scale, 0.0)
    tl.store(out_ptr + offs, kept.to(out_ptr.dtype.element_ty), mask=inside)


def new_seed(device: torch.device) -> torch.Tensor:
    """A one-element int64 seed on ``device``, drawn by torch's generator for it (so
    ``torch.manual_seed`` repeats a run, and a captured graph draws anew per replay)."""
    return torch.randint(_SEED_BOUND, (1,), device=device)


def apply_mask(source: torch.Tensor, out: torch.Tensor, seed: torch.Tensor, p: float) -> torch.Tensor:
    """Write ``source`` with each element kept with probability ``1 - p`` (decided by
    ``seed`` and its flat position) and scaled by ``1 / (1 - p)`` into ``out``; both
    contiguous, of one shape and of a dtype in `DTYPES`, ``0 <= p < 1``."""
    if not (source.is_contiguous() and out.is_contiguous() and source.shape == out.shape):
        raise ValueError("apply_mask takes contiguous source and out tensors of one shape")
    if source.dtype not in DTYPES or out.dtype != source.dtype:
        raise ValueError(f"apply_mask takes {', '.join(map(str, DTYPES))}, got {source.dtype} and {out.dtype}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"apply_mask needs 0 <= p < 1, got {p}")
    count = source.numel()
    if count:
        scale_bits = struct.unpack("<q", struct.pack("<d", 1.0 / (1.0 - p)))[0]    # a positive int64
        launch(_masked, lambda meta: (triton.cdiv(count, BLOCK),), (count,),
               (source, out, seed, count, p, scale_bits), {"BLOCK": BLOCK})
    return out
