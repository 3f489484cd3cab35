"""Compare a compiled function with a plain-PyTorch oracle of the same maths: every
output and the gradient of every input, in float64, on the backend the test selected."""
from __future__ import annotations

from typing import Callable, Mapping

import torch

BACKENDS = ["reference", "triton"]


def device_for(backend: str) -> str:
    """Triton kernels need CUDA tensors on a GPU machine; elsewhere they run in Triton's
    interpreter on CPU tensors (see conftest)."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def assert_matches_oracle(ours: Callable[..., Mapping[str, torch.Tensor]],
                          oracle: Callable[..., Mapping[str, torch.Tensor]],
                          inputs: Mapping[str, torch.Tensor]) -> None:
    """``ours(**inputs)`` and ``oracle(**inputs)`` return dicts of tensors: they must hold
    the same keys and values, and back-propagating the same random projection of the
    outputs through each must give every input the same gradient (1e-9 relative)."""
    leaves_a = {k: t.clone().requires_grad_() for k, t in inputs.items()}
    leaves_b = {k: t.clone().requires_grad_() for k, t in inputs.items()}
    got, expected = dict(ours(**leaves_a)), dict(oracle(**leaves_b))
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    gen = torch.Generator().manual_seed(1)
    seeds = {k: torch.randn(t.shape, dtype=t.dtype, generator=gen).to(t.device) for k, t in expected.items()}
    sum((got[k] * s).sum() for k, s in seeds.items()).backward()
    sum((expected[k] * s).sum() for k, s in seeds.items()).backward()
    for key in inputs:
        assert leaves_a[key].grad is not None, f"no gradient for {key!r}"
        torch.testing.assert_close(leaves_a[key].grad, leaves_b[key].grad, rtol=1e-9, atol=1e-12,
                                   msg=lambda m, key=key: f"gradient of {key!r}: {m}")
