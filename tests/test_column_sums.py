"""`column_sums` (a parameter gradient summed over rows; ir/ops/dense.py): a matrix-vector
product on the GPU, ``sum(0)`` elsewhere. On the GPU it must equal torch's sum to
rounding for every shape a bias or edge-weight gradient has, with TF32 matmuls allowed
too (gemv has no TF32 path), and a layer routing its bias through it must train as
before (a bias gradient in float64 against torch's)."""
from __future__ import annotations

import pytest
import torch

from gnnfuse.ir.ops.dense import column_sums
from gnnfuse.nn import aligned_linear as aligned_linear_module
from gnnfuse.nn.aligned_linear import aligned_linear

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("shape", [(1, 5), (7, 3), (1000, 64), (513, 4, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equals_the_sum_over_rows(shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, dtype=dtype, generator=gen)
    devices = ["cpu"] + (["cuda"] if CUDA else [])
    for device in devices:
        got = column_sums(x.to(device)).cpu()
        assert got.shape == shape[1:]
        torch.testing.assert_close(got, x.sum(0), rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-5)


@pytest.mark.skipif(not CUDA, reason="the matrix-vector path runs on CUDA tensors only")
def test_keeps_float32_precision_when_tf32_is_allowed(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    x = (1 + torch.arange(4096, dtype=torch.float32) * 1e-6).view(-1, 1).repeat(1, 16).cuda()
    torch.testing.assert_close(column_sums(x).cpu(), x.double().sum(0).float().cpu(), rtol=1e-6, atol=0)


@pytest.mark.skipif(not CUDA, reason="the bias gradient's matrix-vector path runs on CUDA tensors only")
@pytest.mark.parametrize("from_rows", [1, aligned_linear_module.GEMV_BIAS_FROM_ROWS])
def test_linear_bias_gradient_matches_torch_and_gradchecks(monkeypatch, from_rows):
    """Both sides of `GEMV_BIAS_FROM_ROWS`: the Function summing the bias gradient as a
    matrix-vector product (the bound lowered to 1) and, below it, torch's own map, whose
    backward is autograd's (no Python Function for a small graph's map)."""
    monkeypatch.setattr(aligned_linear_module, "GEMV_BIAS_FROM_ROWS", from_rows)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50, 6, dtype=torch.float64, generator=gen).cuda().requires_grad_()
    w = torch.randn(4, 6, dtype=torch.float64, generator=gen).cuda().requires_grad_()
    b = torch.randn(4, dtype=torch.float64, generator=gen).cuda().requires_grad_()
    assert torch.autograd.gradcheck(aligned_linear, (x, w, b))
    ours = torch.autograd.grad(aligned_linear(x, w, b).square().sum(), (x, w, b))
    theirs = torch.autograd.grad(torch.nn.functional.linear(x, w, b).square().sum(), (x, w, b))
    for a, c in zip(ours, theirs):
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-12)
    took_function = isinstance(aligned_linear(x, w, b).grad_fn, aligned_linear_module._AlignedLinear._backward_cls)
    assert took_function == (x.shape[0] >= from_rows)
