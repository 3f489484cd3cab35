"""Whether tensors come from a ``torch.func`` transform or carry a forward-mode AD tangent.

gnnfuse's dropout counter path and its chunked linear cross-entropy are
``torch.autograd.Function``s without a jvp or a ``setup_context``: given such tensors they
stopped in torch's "You must implement the jvp function" or "must override the
setup_context staticmethod", naming neither gnnfuse nor the op. Both ask `transformed`
and run torch's own ops instead, which carry tangents and transforms.
"""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD


def transformed(*tensors: torch.Tensor | None) -> bool:
    """Whether a tensor is a ``torch.func`` transform's (grad, jvp, vmap) or carries a
    forward-mode AD tangent (asked only inside a ``forward_ad.dual_level``)."""
    present = [t for t in tensors if t is not None]
    if any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in present):
        return True
    return fwAD._current_level >= 0 and any(fwAD.unpack_dual(t).tangent is not None for t in present)
