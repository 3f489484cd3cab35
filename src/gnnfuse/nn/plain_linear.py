"""Which of a layer's linear maps may be computed from their parameters in another form.

gnnfuse's layers move a map where it costs less than PyG's order: before or after an
aggregation (`maps_first`), folded into per-head attention logits (``x @ (W a)``), into
an edge kernel (``edge_attr @ w_edge``), or into a GEMM that also adds another map's
bias. That reads the map's ``weight`` and ``bias`` and never calls the module. PyG calls
it, so anything a user attached to the map runs there: a forward hook or pre-hook (also
``torch.nn.utils.weight_norm``, ``spectral_norm`` and pruning, which recompute the
weight in a pre-hook), a hook registered for every module, a subclass's own ``forward``
(a LoRA adapter), a parametrized weight, or another module in its place. Read from its
parameters, such a map gave PyG's layer's numbers only by chance, with no error.

`plain_linear` is the test each of those paths takes; a map that fails it is called, in
PyG's order.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from ..frontend.module_hooks import GLOBAL_HOOK_TABLES


def plain_linear(lin: Any, bias: bool = True) -> bool:
    """Whether ``lin`` is exactly torch's ``nn.Linear`` (not a subclass: a parametrized
    weight makes one) with no hook of its own and none for every module, so its call is
    ``x W^T + b`` and nothing else; with ``bias=False``, also without a bias (a path that
    has no place for one)."""
    return (type(lin) is nn.Linear and not (lin._forward_hooks or lin._forward_pre_hooks or lin._backward_hooks
                                            or getattr(lin, "_backward_pre_hooks", None))
            and not any(GLOBAL_HOOK_TABLES) and (bias or lin.bias is None))
