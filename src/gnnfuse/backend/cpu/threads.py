"""Numba's parallel loops run on torch's thread count, the CPU budget both share."""
from __future__ import annotations

from typing import Any, Callable, TypeVar

import numba
import torch

T = TypeVar("T")


def on_torch_threads(kernel: Callable[..., T], *args: Any) -> T:
    """``kernel(*args)`` with Numba's parallel loops on as many threads as torch uses
    (at most Numba's pool). Starting Numba's pool (its first parallel call) resets
    OpenMP's thread count, torch's too, so torch's count is put back afterwards: a
    user's ``torch.set_num_threads(1)`` stays 1."""
    torch_threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(torch_threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        return kernel(*args)
    finally:
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
