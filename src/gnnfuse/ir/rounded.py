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

The cost is a few instructions per division: a row's normalisation (a mean's degree,
a softmax's sum) runs once per row; an elementwise op's once per element, which the
kernels' loads outweigh.
"""
from __future__ import annotations


def quotient(num: str, den: str, wide: bool) -> str:
    """``num / den`` in kernel text; ``wide``: the kernel computes in float64."""
    return f"({num} / {den})" if wide else f"tl.div_rn({num}, {den})"


def square_root(x: str, wide: bool) -> str:
    """``sqrt(x)`` in kernel text; ``wide``: the kernel computes in float64."""
    return f"tl.sqrt({x})" if wide else f"tl.sqrt_rn({x})"
