"""The comparison every layer test makes against its oracle (a PyG layer or a plain
PyTorch one): outputs, the input gradient and every parameter gradient in float64."""
from __future__ import annotations

from typing import Callable

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def assert_same_outputs_and_grads(ours: torch.nn.Module, ref: torch.nn.Module,
                                  run_ours: Callable[[torch.Tensor], torch.Tensor],
                                  run_ref: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                                  ref_prefix: str = "") -> None:
    """Outputs, input gradient and every parameter gradient agree to 1e-9 relative.
    ``ref``'s parameters carry ``ref_prefix`` before ours' names (an oracle holding the
    layer as ``layer`` has ``layer.``); both must have the same parameters."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = run_ours(xa), run_ref(xb)
    assert out.shape == expected.shape
    seed = torch.randn_like(expected)
    (out * seed).sum().backward()
    (expected * seed).sum().backward()
    assert rel_err(out, expected) < 1e-9
    assert rel_err(xa.grad, xb.grad) < 1e-9
    ours_params, ref_params = dict(ours.named_parameters()), dict(ref.named_parameters())
    assert {ref_prefix + key for key in ours_params} == ref_params.keys()
    for key, p in ours_params.items():
        q = ref_params[ref_prefix + key]
        assert p.grad is not None and q.grad is not None, key
        assert rel_err(p.grad, q.grad) < 1e-9, key
