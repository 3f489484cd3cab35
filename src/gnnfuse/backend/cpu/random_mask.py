"""Dropout's keep mask drawn from a counter, applied in one parallel pass.

torch's CPU dropout draws one Mersenne-Twister number per element (`bernoulli_`), on
one thread, then multiplies in two more passes; on pubmed's 19.7K x 500 input that
was 73 ms of a 124 ms GCN training step on two cores. Here element ``i``'s decision is
a pure function of ``(seed, i)``: the ``i // 2``-th output of SplitMix64 (Steele, Lea
and Flood, OOPSLA 2014; the generator Java's ``SplittableRandom`` uses, which passes
BigCrush) started at ``seed``, whose high 32 bits decide the even element and low 32
bits the odd one. So the pass needs no generator state, splits across threads with no
coordination, and the backward regenerates the mask from the seed instead of keeping
an N x F mask alive between forward and backward (the IO-aware trade: recompute a
cheap function rather than store a tensor).

An element is kept when its 32 bits are at least ``threshold = round(p * 2**32)``, so
it is kept with probability ``1 - p`` to within 2**-32, and scaled by ``1 / (1 - p)``.
"""
from __future__ import annotations

import numpy as np
import torch

try:
    import numba
except ImportError:     # the optional 'cpu' extra is not installed: callers take torch's dropout
    numba = None

from . import pool
from ..kernel_cache import guard_numba_disk_cache

GOLDEN = np.uint64(0x9E3779B97F4A7C15)     # SplitMix64's increment between states
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_LOW32 = np.uint64(0xFFFFFFFF)


def available() -> bool:
    """Whether the counter kernel can run: Numba is installed, and its pool can start
    here (`pool.USABLE`: not in a fork of a process whose pool was GNU OpenMP's)."""
    return numba is not None and pool.USABLE[0]


def apply_mask(source: torch.Tensor, out: torch.Tensor, seed: int, p: float) -> torch.Tensor:
    """Write ``source`` with each element kept with probability ``1 - p`` (decided by
    ``seed`` and its flat position) and scaled by ``1 / (1 - p)`` into ``out`` (contiguous
    CPU tensors of one float dtype; ``out`` may be ``source``), and return ``out``.

    Runs on as many threads as torch uses, launched as every parallel kernel is
    (`pool.launch`: torch's thread count kept, turns taken on a pool that needs them)."""
    threshold = np.uint64(min(round(p * 2.0 ** 32), 2 ** 32))
    scale = np.dtype(str(source.dtype).removeprefix("torch.")).type(1.0 / (1.0 - p))
    pool.launch(_on_torch_threads, torch.get_num_threads(), source.detach().numpy().reshape(-1),
                out.detach().numpy().reshape(-1), np.uint64(seed), threshold, scale)
    return out


def _on_torch_threads(threads: int, *args) -> None:
    """`_masked_scale` on ``threads`` of Numba's pool. Setting the count starts the pool,
    which resets torch's count: done inside `pool.launch`, which puts torch's back (set
    before it, a tuning run's torch count went from 1 to every core after its first
    dropout, and its choices were stored for the wrong thread count)."""
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    _masked_scale(*args)


def _njit(**options):
    return numba.njit(**options) if numba is not None else (lambda function: function)


@_njit(inline="always", cache=True)
def splitmix64(state):
    """SplitMix64's output for ``state`` (a uint64): its mixing function."""
    z = state
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@_njit(parallel=True, cache=True)
def _masked_scale(source, out, seed, threshold, scale):
    """``out[i] = source[i] * scale`` where element ``i`` is kept, else 0 (flat arrays of
    one dtype; ``out`` may be ``source`` for the in-place form)."""
    n = source.shape[0]
    pairs = (n + 1) // 2
    for j in numba.prange(pairs):
        bits = splitmix64(seed + np.uint64(j + 1) * GOLDEN)
        i = 2 * j
        out[i] = source[i] * scale if (bits >> np.uint64(32)) >= threshold else source[i] * 0.0
        if i + 1 < n:
            out[i + 1] = source[i + 1] * scale if (bits & _LOW32) >= threshold else source[i + 1] * 0.0


guard_numba_disk_cache(_masked_scale)    # compiled per dtype, maybe by two processes at once
