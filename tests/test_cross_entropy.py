"""gnnfuse.nn.functional.cross_entropy: torch's loss, and over selected rows (``rows=``)
without the gather. The kernel path (backend/triton/cross_entropy.py) runs on host
tensors under Triton's interpreter here (`_SelectedCrossEntropy` directly, on DEVICE);
the choice of path inside `cross_entropy` needs a GPU. torch's F.cross_entropy on
``input[rows]`` is the oracle throughout."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse.nn.functional as gF
from gnnfuse.nn.cross_entropy import _SelectedCrossEntropy, assert_in_range
from gnnfuse.runtime.cuda_graph import StepCapture

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
RUNS = settings(max_examples=25, deadline=None, derandomize=True, database=None)


def _oracle(x, target, rows, reduction, ignore_index=-100):
    return F.cross_entropy(x if rows is None else x[rows], target, reduction=reduction, ignore_index=ignore_index)


def _both(x, target, rows, reduction, ignore_index=-100):
    """(kernel loss, kernel gradient, torch loss, torch gradient) on leaf copies of ``x``."""
    ours, theirs = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    a = _SelectedCrossEntropy.apply(ours, target, rows, ignore_index, reduction)
    b = _oracle(theirs, target, rows, reduction, ignore_index)
    return a, torch.autograd.grad(a, ours)[0], b, torch.autograd.grad(b, theirs)[0]


@st.composite
def problems(draw):
    """Logits of a few rows and 1-70 classes, and a selection as users make one: every
    row, or indices with repeats and negative ones, some targets ignored."""
    n = draw(st.integers(1, 40))
    classes = draw(st.integers(1, 70))
    selected = None
    if draw(st.booleans()):
        selected = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=60))
    count = n if selected is None else len(selected)
    targets = draw(st.lists(st.one_of(st.integers(0, classes - 1), st.just(-100)), min_size=count, max_size=count))
    if all(t == -100 for t in targets):
        targets[0] = 0
    return n, classes, selected, targets, draw(st.sampled_from(["mean", "sum"]))


@RUNS
@given(problems(), st.sampled_from([torch.float32, torch.float64]))
def test_the_kernels_give_torchs_loss_and_gradient(problem, dtype):
    n, classes, selected, targets, reduction = problem
    g = torch.Generator().manual_seed(n * 97 + classes)
    x = (3 * torch.randn(n, classes, generator=g, dtype=dtype)).to(DEVICE)
    rows = None if selected is None else torch.tensor(selected, device=DEVICE)
    target = torch.tensor(targets, device=DEVICE)
    a, ga, b, gb = _both(x, target, rows, reduction)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-13}
    torch.testing.assert_close(a, b, **tol)
    torch.testing.assert_close(ga, gb, **tol)


@pytest.mark.parametrize("rows", [None, [4, 0, 4, -2, 7, 1]])
def test_gradcheck_in_float64(rows):
    x = torch.randn(9, 5, dtype=torch.float64, device=DEVICE, requires_grad=True)
    rows = None if rows is None else torch.tensor(rows, device=DEVICE)
    count = 9 if rows is None else rows.numel()
    target = torch.randint(0, 5, (count,), device=DEVICE)
    target[1] = -100
    for reduction in ("mean", "sum"):
        assert torch.autograd.gradcheck(lambda t: _SelectedCrossEntropy.apply(t, target, rows, -100, reduction), (x,))


def test_int32_rows_and_a_strided_matrix():
    """A view with row-contiguous storage (a padded batch's first rows: ``out[:n]``)."""
    full = torch.randn(30, 12, dtype=torch.float64, device=DEVICE)
    x = full[:, :10]                                  # stride (12, 1)
    rows = torch.tensor([5, 0, 29], dtype=torch.int32, device=DEVICE)
    target = torch.tensor([9, 0, 3], device=DEVICE)
    a, ga, b, gb = _both(x, target, rows, "mean")
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)
    a, ga, b, gb = _both(x, torch.randint(0, 10, (30,), device=DEVICE), None, "sum")
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)


def test_the_kernels_refuse_a_matrix_of_strided_columns():
    """They read a row's classes one apart: every other column of a matrix would be read
    as the row's first classes (and past it)."""
    x = torch.randn(6, 8, dtype=torch.float64, device=DEVICE)[:, ::2]
    with pytest.raises(ValueError, match="contiguous rows"):
        _SelectedCrossEntropy.apply(x, torch.tensor([0, 1, 2, 3, 0, 1], device=DEVICE), None, -100, "mean")


@pytest.mark.parametrize("rows, target", [([1, 2], [0, 7]), ([1, 2], [-3, 0]), ([1, 5], [0, 0]), ([-7, 0], [1, 1])],
                         ids=["target past classes", "negative target", "row past the end", "row before the start"])
def test_bad_indices_make_the_loss_nan_instead_of_a_number(rows, target):
    x = torch.randn(5, 4, device=DEVICE, requires_grad=True)
    loss = _SelectedCrossEntropy.apply(x, torch.tensor(target, device=DEVICE), torch.tensor(rows, device=DEVICE),
                                       -100, "mean")
    assert torch.isnan(loss)


def test_only_ignored_targets_give_torchs_nan_mean_and_zero_sum():
    x = torch.randn(4, 3, device=DEVICE)
    target = torch.full((4,), -100, device=DEVICE)
    assert torch.isnan(_SelectedCrossEntropy.apply(x, target, None, -100, "mean"))
    assert torch.isnan(F.cross_entropy(x, target))
    assert _SelectedCrossEntropy.apply(x, target, None, -100, "sum").item() == 0.0


def test_a_second_derivative_is_refused_not_wrong():
    x = torch.randn(6, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    loss = _SelectedCrossEntropy.apply(x, torch.tensor([0, 1, 2, 0, 1, 2], device=DEVICE), None, -100, "mean")
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(loss, x, create_graph=True)
    assert torch.autograd.grad(loss, x)[0].shape == x.shape          # a plain backward is fine


def test_the_loss_keeps_the_selected_rows_not_the_whole_matrix():
    """With rows, what the backward keeps is [selected, classes], as torch's log-softmax."""
    x = torch.randn(1000, 8, device=DEVICE, requires_grad=True)
    rows = torch.tensor([3, 500], device=DEVICE)
    loss = _SelectedCrossEntropy.apply(x, torch.tensor([1, 2], device=DEVICE), rows, -100, "mean")
    saved = [t for t in loss.grad_fn.saved_tensors if t is not None]
    assert all(t.numel() < x.numel() for t in saved)


def test_cross_entropy_takes_torchs_arguments_off_the_kernel_path():
    """On host tensors (and with weights or smoothing anywhere) it is torch's loss; rows
    may be a boolean mask."""
    x = torch.randn(10, 4, dtype=torch.float64)
    mask = torch.arange(10) % 3 == 0
    target = torch.tensor([0, 3, 1, 2])
    torch.testing.assert_close(gF.cross_entropy(x, target, rows=mask), F.cross_entropy(x[mask], target))
    weight = torch.rand(4, dtype=torch.float64)
    torch.testing.assert_close(gF.cross_entropy(x, target, weight, rows=mask.nonzero().squeeze(1),
                                                label_smoothing=0.1),
                               F.cross_entropy(x[mask], target, weight, label_smoothing=0.1))
    y = torch.randint(0, 4, (10,))
    torch.testing.assert_close(gF.cross_entropy(x, y, reduction="none"), F.cross_entropy(x, y, reduction="none"))


@pytest.mark.parametrize("rows, message", [(torch.tensor([0, 1]), "one target per selected row"),
                                           (torch.tensor([[0, 1, 2]]), "1-D"),
                                           (torch.tensor([0.0, 1.0, 2.0]), "row indices"),
                                           (torch.tensor([True, False]), "one entry per row")])
def test_bad_rows_are_refused_naming_the_problem(rows, message):
    with pytest.raises(ValueError, match=message):
        gF.cross_entropy(torch.randn(5, 3), torch.tensor([0, 1, 2]), rows=rows)


def test_rows_as_a_list_and_a_scalar_target_are_taken_as_indexing_takes_them():
    """``rows`` given as a list (as ``input[rows]`` takes it) was an AttributeError
    ('list' object has no attribute 'dtype'); a 0-d target with rows an IndexError."""
    x = torch.randn(5, 3, dtype=torch.float64)
    target = torch.tensor([2, 0])
    torch.testing.assert_close(gF.cross_entropy(x, target, rows=[4, 1]), F.cross_entropy(x[[4, 1]], target))
    mask = [True, False, False, True, False]
    torch.testing.assert_close(gF.cross_entropy(x, target, rows=mask), F.cross_entropy(x[torch.tensor(mask)], target))
    with pytest.raises(ValueError, match=r"rows selects 2 rows of input but target has shape \(\)"):
        gF.cross_entropy(x, torch.tensor(1), rows=[4, 1])


@pytest.mark.parametrize("target, rows, message", [
    (torch.tensor([0, 3]), None, "outside the 3 classes"),
    (torch.tensor([-1, 0]), None, "outside the 3 classes"),
    (torch.tensor([0, 1]), torch.tensor([0, 5]), "outside input's 5 rows"),
    (torch.tensor([0, 1]), torch.tensor([-6, 0]), "outside input's 5 rows")])
def test_a_launched_kernel_call_asserts_its_ranges_as_torchs_loss_does(target, rows, message):
    """On the GPU these are device-side asserts (no read back); on host tensors they raise here."""
    with pytest.raises(RuntimeError, match=message):
        assert_in_range(torch.randn(5, 3), target, rows, -100)


def test_in_range_targets_ignored_ones_and_negative_rows_pass_the_asserts():
    assert_in_range(torch.randn(5, 3), torch.tensor([0, 2, -100]), torch.tensor([-5, 4, 0]), -100)
    assert_in_range(torch.randn(5, 3), torch.tensor([0, 7]), None, 7)


def _gpu_kernel_calls(monkeypatch) -> tuple[list, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A list the loss kernels' forward appends to when it runs, and a products-shaped
    problem on the GPU: logits, 700 selected rows and their targets."""
    from gnnfuse.backend.triton import cross_entropy as kernels
    calls = []
    forward = kernels.forward
    monkeypatch.setattr(kernels, "forward", lambda *args: calls.append(1) or forward(*args))
    x = torch.randn(2000, 47, device="cuda", requires_grad=True)
    rows = torch.randperm(2000, device="cuda")[:700]
    return calls, x, rows, torch.randint(0, 47, (700,), device="cuda")


@needs_gpu
def test_on_the_gpu_a_large_launched_selection_takes_the_kernels(monkeypatch):
    from gnnfuse.nn import cross_entropy as module
    calls, x, rows, target = _gpu_kernel_calls(monkeypatch)
    monkeypatch.setattr(module, "LAUNCHED_ELEMENTS", 700 * 47)
    loss = gF.cross_entropy(x, target, rows=rows)
    assert calls == [1]
    expected = F.cross_entropy(x[rows], target)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(torch.autograd.grad(loss, x)[0], torch.autograd.grad(expected, x)[0])
    monkeypatch.setattr(module, "LAUNCHED_ELEMENTS", 700 * 47 + 1)
    gF.cross_entropy(x, target, rows=rows)
    assert calls == [1]


@needs_gpu
def test_on_the_gpu_the_kernels_run_in_a_captured_step_and_torchs_loss_in_a_launched_one(monkeypatch):
    calls, x, rows, target = _gpu_kernel_calls(monkeypatch)
    # the oracle on its own leaf: a graph through x built outside the step keeps x's
    # AccumulateGrad node on the default stream, and the captured backward would reach it
    oracle = x.detach().clone().requires_grad_()
    expected = F.cross_entropy(oracle[rows], target)
    (expected_grad,) = torch.autograd.grad(expected, oracle)
    expected = expected.detach()

    def step():
        loss = gF.cross_entropy(x, target, rows=rows)
        return loss.detach(), torch.autograd.grad(loss, x)[0]
    launched = step()
    assert calls == []
    torch.testing.assert_close(launched[0], expected)
    capture = StepCapture(step, mode="on", copy_outputs=False, warmup=2)
    for _ in range(3):
        loss, grad = capture()
    assert capture.captured and calls == [1]
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
