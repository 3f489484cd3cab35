"""PyG's parameter initialisers, drawn from the global generator as PyG draws them.

Why a module of its own: a PyG script switched to gnnfuse by its import gives PyG's
numbers only if each layer starts from PyG's weights, and under one ``torch.manual_seed``
that takes the same draws, in the same order, by the same formulas. torch's own
initialisers differ from PyG's in three ways that each change the weights:

- PyG's ``glorot`` reads the fans from a tensor's last two sizes; ``xavier_uniform_``
  multiplies them by the other sizes (a GAT's [1, heads, C] attention vector: a bound of
  sqrt(6 / (heads + C)) in PyG, sqrt(6 / (heads * C + C)) in torch).
- torch's ``kaiming_uniform_`` and PyG's compute the same bound by other float
  operations, which differ in the last bit for many fans (2 of every 5 fans below 300):
  float32 rounds that away, float64 weights differ.
- PyG's ``Linear`` draws at construction, and the layer's ``reset_parameters``, which PyG
  layers call at the end of ``__init__``, draws again; a lazy one (``in_channels=-1``)
  draws once, at its first call. `linear` and `materialize` draw the same way.

The functions here take the formulas from PyG's ``nn/inits.py`` and ``nn/dense/linear.py``.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Iterable, Iterator

import torch
from torch import nn

_LAZY = nn.modules.lazy.LazyModuleMixin


def glorot(value: torch.Tensor | None) -> None:
    """PyG's ``glorot``: uniform in +-sqrt(6 / (size(-2) + size(-1))), whatever the rank."""
    if value is not None:
        bound = math.sqrt(6.0 / (value.size(-2) + value.size(-1)))
        value.data.uniform_(-bound, bound)


def kaiming_uniform(value: torch.Tensor, fan: int, a: float) -> None:
    """PyG's ``kaiming_uniform`` (its ``Linear``'s default weight initializer)."""
    bound = math.sqrt(6 / ((1 + a ** 2) * fan))
    value.data.uniform_(-bound, bound)


def uniform(size: int, value: torch.Tensor | None) -> None:
    """PyG's ``uniform``: uniform in +-1/sqrt(size) (its ``Linear``'s default bias)."""
    if value is not None:
        bound = 1.0 / math.sqrt(size)
        value.data.uniform_(-bound, bound)


def reset_linear(lin: nn.Linear | None, weight_initializer: str | None = None,
                 bias_initializer: str | None = None) -> None:
    """PyG's ``Linear.reset_parameters`` for ``lin`` built with these initializers
    (None: PyG's defaults, torch's bounds by PyG's formulas). A lazy map draws nothing,
    as in PyG: `materialize` initialises it at its first call."""
    if lin is None or is_lazy(lin):
        return
    fan = lin.in_features
    if fan <= 0:
        # no input features (an [N, 0] x): PyG draws nothing and leaves its bias as
        # ``torch.empty`` made it; zeros here, as torch's own Linear draws it (+-0)
        if lin.bias is not None:
            lin.bias.data.zero_()
        return
    if weight_initializer == "glorot":
        glorot(lin.weight)
    elif weight_initializer is None:
        kaiming_uniform(lin.weight, fan, math.sqrt(5))
    else:
        raise ValueError(f"weight initializer {weight_initializer!r} is not one gnnfuse's layers use")
    if lin.bias is None:
        return
    if bias_initializer == "zeros":
        lin.bias.data.zero_()
    elif bias_initializer is None:
        uniform(fan, lin.bias)
    else:
        raise ValueError(f"bias initializer {bias_initializer!r} is not one gnnfuse's layers use")


def linear(in_channels: int, out_channels: int, bias: bool = True, weight_initializer: str | None = None,
           bias_initializer: str | None = None) -> nn.Linear:
    """PyG's ``Linear(in_channels, out_channels, bias, ...)`` as an ``nn.Linear``: drawn as
    PyG's constructor draws it (torch's own draw is not made), or for PyG's lazy
    ``in_channels <= 0`` a `_LazyWeightLinear`, which draws nothing until `materialize`.

    Its ``reset_parameters`` is PyG's ``Linear``'s (`reset_linear` with these
    initializers), an attribute of the map itself, so that the class stays torch's
    ``nn.Linear`` (`plain_linear`): a loop resetting every module (``for m in
    model.modules()``) drew torch's kaiming bound where PyG's GCN, GAT, GATv2 and Cheb
    maps draw glorot's (GCN's weights 0.34 off PyG's under one seed)."""
    if isinstance(in_channels, int) and in_channels <= 0:
        lin = _LazyWeightLinear(out_channels, bias=bias)
    else:
        lin = nn.Linear(in_channels, out_channels, bias=bias, device="meta")
        lin = lin.to_empty(device=torch.empty(0).device)       # torch's default device, as PyG's torch.empty
        reset_linear(lin, weight_initializer, bias_initializer)
    lin.reset_parameters = functools.partial(reset_linear, lin, weight_initializer, bias_initializer)
    return lin


class _LazyWeightLinear(nn.LazyLinear):
    """torch's ``LazyLinear`` with PyG's lazy ``Linear``'s parameters: only the weight
    waits for the first call; the bias is an ``[out_features]`` parameter from the start
    (PyG's ``torch.empty(out_channels)``), so the two layers' ``state_dict`` hold the same
    tensors before that call. With torch's lazy bias a lazy PyG layer's state dict loaded
    here made the bias a plain parameter beside a lazy weight, and the first call failed
    ("'Parameter' object has no attribute 'materialize'"); ours loaded into PyG's failed
    on the bias's shape. Becomes an ``nn.Linear`` once its width is known, as torch's does."""

    cls_to_become = nn.Linear

    def __init__(self, out_features: int, bias: bool = True) -> None:
        super().__init__(out_features, bias=bias)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features))

    def initialize_parameters(self, input: torch.Tensor) -> None:   # noqa: A002 (torch's name)
        """torch's ``LazyLinear.initialize_parameters`` for the weight alone."""
        if self.has_uninitialized_params():
            with torch.no_grad():
                self.in_features = input.shape[-1]
                self.weight.materialize((self.out_features, self.in_features))
                self.reset_parameters()


def reset_module(module: Any) -> None:
    """PyG's ``reset`` of a user's network: its own ``reset_parameters`` when it has one,
    else its children's, recursively (a ``Sequential`` has none)."""
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
    elif isinstance(module, nn.Module):
        for child in module.children():
            reset_module(child)


def is_lazy(lin: nn.Module | None) -> bool:
    """Whether ``lin`` has not learnt its input width yet."""
    return isinstance(lin, _LAZY) and lin.has_uninitialized_params()


def materialize(pairs: Iterable[tuple[nn.Module | None, torch.Tensor | int | None]], weight_initializer: str | None = None,
                bias_initializer: str | None = None, times: int = 1) -> None:
    """Give each lazy map of ``pairs`` the width of the rows it maps (or that width) and draw it as PyG's
    lazy ``Linear`` with these initializers does at its first call, in ``pairs``' order
    (that of PyG's calls). ``times``: how often PyG resets it then (its
    ``HeteroDictLinear`` resets a lazy map once more itself).

    A layer calls this on entry: torch's ``LazyLinear`` learns its width only when it is
    called, and a layer that reads ``lin.weight`` first (a folded attention, a transform
    moved across the propagation) would read an uninitialised parameter."""
    for lin, rows in pairs:     # `is_lazy` inline: this runs on every call of the layers using it
        if rows is not None and isinstance(lin, _LAZY) and lin.has_uninitialized_params():
            with torch.no_grad(), _draws_undone(lin.weight.device):
                # no rows, in the map's own dtype (sparse or integer rows too); torch's
                # lazy map initialises itself here, by its own formulas: undone
                width = rows if isinstance(rows, int) else rows.shape[-1]
                lin(torch.empty((0, width), dtype=lin.weight.dtype, device=lin.weight.device))
            with torch.no_grad():
                for _ in range(times):
                    reset_linear(lin, weight_initializer, bias_initializer)


@contextlib.contextmanager
def _draws_undone(device: torch.device) -> Iterator[None]:
    """The generator of ``device`` as it was before the block (the CPU's is always kept)."""
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        yield
