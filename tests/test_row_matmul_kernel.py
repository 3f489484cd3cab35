"""The row-by-row matrix product kernel (backend/triton/row_matmul.py), which the Triton
backend runs for the ``row_matmul`` op (per-edge weight matrices: NNConv, a DGL UDF's
``torch.bmm``), against ``torch.matmul`` under Triton's interpreter (or on the GPU): the
three shapes NNConv's forward and backward give it, strided views, dtypes, and the cases
that keep torch's matmul; and that NNConv's compiled step launches it."""
from __future__ import annotations

import pytest
import torch
from oracle_check import device_for

from gnnfuse.backend.triton import row_matmul as rm

DEVICE = device_for("triton")


@pytest.mark.parametrize("rows, inner, k, m", [(37, 1, 16, 64), (37, 16, 1, 64), (33, 1, 64, 16), (3, 2, 3, 130),
                                               (1, 1, 1, 1), (5, 3, 64, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_matches_torch(rows, inner, k, m, dtype, monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inner, k, dtype=dtype, generator=g).to(DEVICE)
    w = torch.randn(rows, k, m, dtype=dtype, generator=g).to(DEVICE)
    monkeypatch.setattr(rm.torch, "matmul", _refuse)
    got = rm.row_matmul(x, w)
    monkeypatch.undo()
    assert got.shape == (rows, inner, m) and got.dtype == dtype
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got, torch.matmul(x, w), **tol)


def test_kernel_reads_strided_views(monkeypatch):
    """The backward hands it transposes: ``g @ W_e^T`` and ``x_j^T @ g``."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(21, 64, 16, dtype=torch.float64, generator=g).to(DEVICE).transpose(1, 2)     # [21, 16, 64]
    x = torch.randn(21, 1, 16, dtype=torch.float64, generator=g).to(DEVICE)
    x_t = torch.randn(21, 1, 16, dtype=torch.float64, generator=g).to(DEVICE).transpose(1, 2)    # [21, 16, 1]
    row = torch.randn(21, 1, 64, dtype=torch.float64, generator=g).to(DEVICE)
    monkeypatch.setattr(rm.torch, "matmul", _refuse)
    got = [rm.row_matmul(x, w), rm.row_matmul(x_t, row), rm.row_matmul(row, w.transpose(1, 2))]
    monkeypatch.undo()
    for out, (a, b) in zip(got, [(x, w), (x_t, row), (row, w.transpose(1, 2))]):
        torch.testing.assert_close(out, torch.matmul(a, b), rtol=1e-12, atol=1e-12)


def test_kernel_half_accumulates_in_float32():
    x = torch.full((4, 1, 256), 0.1, dtype=torch.float16).to(DEVICE)
    w = torch.full((4, 256, 8), 0.1, dtype=torch.float16).to(DEVICE)
    got = rm.row_matmul(x, w)
    torch.testing.assert_close(got.float(), torch.full((4, 1, 8), 2.56).to(DEVICE), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("case", ["batch dims", "mixed dtypes", "inner sizes differ", "no rows", "integers",
                                  "large matrices"])
def test_kernel_falls_back_to_torch(case):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 1, 3, dtype=torch.float64, generator=g).to(DEVICE)
    w = torch.randn(5, 3, 4, dtype=torch.float64, generator=g).to(DEVICE)
    if case == "batch dims":
        x, w = x.unsqueeze(1).expand(5, 2, 1, 3), w.unsqueeze(1).expand(5, 2, 3, 4)
    elif case == "mixed dtypes":
        w = w.float()
    elif case == "inner sizes differ":      # [5, 1, 3] @ [5, 2, 4]: no product
        w = w[:, :2]
    elif case == "no rows":
        x, w = x[:0], w[:0]
    elif case == "integers":
        x, w = (x * 10).long().cpu(), (w * 10).long().cpu()      # (CUDA's matmul takes no integers)
    else:
        x = torch.randn(2, 1, 128, dtype=torch.float64, generator=g).to(DEVICE)
        w = torch.randn(2, 128, 128, dtype=torch.float64, generator=g).to(DEVICE)
    if case in ("mixed dtypes", "inner sizes differ"):
        with pytest.raises(RuntimeError):       # torch's own error, not a kernel's guess
            rm.row_matmul(x, w)
        return
    torch.testing.assert_close(rm.row_matmul(x, w), torch.matmul(x, w))


def test_nnconv_step_launches_the_kernel(monkeypatch):
    """NNConv's forward (``x_j @ W_e``) and backward (``g @ W_e^T``, ``x_j^T @ g``) run
    their per-edge products in the kernel, and the gradients match the reference backend."""
    import gnnfuse.nn
    launched = []

    def recording_launch(kernel, *args, **kwargs):
        launched.append(kernel)
        return launch(kernel, *args, **kwargs)

    launch = rm.launch
    monkeypatch.setattr(rm, "launch", recording_launch)
    edges = torch.tensor([[0, 1, 2, 3, 1, 2], [1, 2, 3, 0, 0, 0]])
    results = {}
    for backend in ("reference", "triton"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        device = device_for(backend)
        torch.manual_seed(0)
        layer = gnnfuse.nn.NNConv(3, 4, torch.nn.Linear(2, 12), aggr="add").double().to(device)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(4, 3, dtype=torch.float64, generator=gen).to(device).requires_grad_()
        e = torch.randn(6, 2, dtype=torch.float64, generator=gen).to(device)
        out = layer(x, edges.to(device), e)
        results[backend] = (out, *torch.autograd.grad(out.square().sum(), [x, *layer.parameters()]))
    assert launched.count(rm._row_matmul) == 3
    for got, want in zip(results["triton"], results["reference"], strict=True):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-12, atol=1e-12)


def _refuse(*args):
    raise AssertionError("row_matmul fell back to torch")
