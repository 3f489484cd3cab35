"""Kernel text for a division and a square root rounded as torch's are.

Torch's CUDA kernels divide and take square roots correctly rounded (nvcc's default
``div.rn.f32`` and ``sqrt.rn.f32``). Triton lowers a float32 ``/`` to ``div.full.f32``
(within 2 ulps) and ``tl.sqrt`` to the approximate square root (``sqrt.approx``,
Triton's "fast square root"); ``tl.div_rn`` and ``tl.sqrt_rn`` are the correctly rounded ones, and
take float32 only. Float64 ``/`` and ``tl.sqrt`` are correctly rounded already. So a
kernel computing in float32 -- float32 values, and float16/bfloat16 ones computed in
float32 -- writes the ``_rn`` forms, a float64 one the plain ones. The interpreter (and
the CPU backend's scalar ``tl``) computes both forms exactly, so only a GPU shows the
difference (tests/test_gpu_rounding.py).

The cost: ``div.rn.f32`` is a refined reciprocal with a check and a slow path where
``div.full.f32`` is two instructions. A row's normalisation (a mean's degree, a
softmax's sum) runs once per row, but a division evaluated per edge and feature lane
costs measurably: GAT's backward recomputes each attention weight ``p / T`` on every
lane of its head, and SAGE's divides the output gradient by the degree per edge. On an
H200 the arxiv-sized training step took 2.83 instead of 2.62 ms (GAT) and 1.52 instead
of 1.43 ms (SAGE) with the rounded forms (2026-12-01, `benchmarks/bench_training.py`).
"""
from __future__ import annotations


def quotient(num: str, den: str, wide: bool) -> str:
    """``num / den`` in kernel text; ``wide``: the kernel computes in float64."""
    return f"({num} / {den})" if wide else f"tl.div_rn({num}, {den})"


def square_root(x: str, wide: bool) -> str:
    """``sqrt(x)`` in kernel text; ``wide``: the kernel computes in float64."""
    return f"tl.sqrt({x})" if wide else f"tl.sqrt_rn({x})"
