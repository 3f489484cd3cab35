"""PyG's lazy ``in_channels=-1`` for layers that read a linear map's weight themselves.

PyG's ``Linear(-1, out)`` learns its input width from the first call, and PyG's
heterogeneous models rely on it (``to_hetero`` of ``GATConv((-1, -1), ...)``). torch's
``LazyLinear`` does the same, but only when it is *called*; a layer that reads
``lin.weight`` first -- a folded attention, a transform moved across the propagation --
would read an uninitialised parameter. Such a layer calls `materialize` on entry with
each lazy map and the rows it maps: a call on none of the rows fixes the width, and the
weight is then initialised as the layer's ``reset_parameters`` does (PyG initialises a
lazy ``Linear`` at that moment, with the layer's initializer).
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn


_LAZY = nn.modules.lazy.LazyModuleMixin


def linear(in_channels: int, out_channels: int, bias: bool = True) -> nn.Linear:
    """PyG's ``Linear``: ``nn.Linear``, or for PyG's lazy ``in_channels <= 0`` (PyG writes
    -1) ``nn.LazyLinear``, the input width being read from the first call."""
    if isinstance(in_channels, int) and in_channels <= 0:
        return nn.LazyLinear(out_channels, bias=bias)
    return nn.Linear(in_channels, out_channels, bias=bias)


def is_lazy(lin: nn.Module | None) -> bool:
    """Whether ``lin`` has not learnt its input width yet."""
    return isinstance(lin, _LAZY) and lin.has_uninitialized_params()


def reset(lin: nn.Module | None, init: Callable[[nn.Linear], object]) -> None:
    """``init(lin)``, skipped for a lazy map (`materialize` initialises it later)."""
    if lin is not None and not is_lazy(lin):
        init(lin)


def materialize(pairs: Iterable[tuple[nn.Module | None, torch.Tensor | None]],
                init: Callable[[nn.Linear], object] | None = None) -> None:
    """Give each lazy map of ``pairs`` the width of the rows it maps, then ``init`` it
    (None: torch's default, which is PyG's ``Linear`` default too)."""
    for lin, rows in pairs:     # `is_lazy` inline: this runs on every call of the layers using it
        if rows is not None and isinstance(lin, _LAZY) and lin.has_uninitialized_params():
            with torch.no_grad():     # no rows, in the map's own dtype (sparse or integer rows too)
                lin(torch.empty((0, rows.shape[-1]), dtype=lin.weight.dtype, device=lin.weight.device))
                if init is not None:
                    init(lin)
