"""gnnfuse.nn.functional.linear_cross_entropy against torch's linear + cross_entropy:
loss and all three gradients, chunked or not, with ignored rows, and gradcheck."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from gnnfuse.nn.functional import linear_cross_entropy


def _operands(rows, features, classes, dtype=torch.float32, seed=0, ignored=()):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, features, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(classes, features, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(classes, generator=g, dtype=dtype, requires_grad=True)
    y = torch.randint(0, classes, (rows,), generator=g)
    y[list(ignored)] = -100
    return h, w, b, y


def _loss_and_grads(fn, h, w, b, y, **kw):
    for t in (h, w, b):
        t.grad = None
    loss = fn(h, w, b, y, **kw)
    loss.backward(torch.tensor(1.7, dtype=loss.dtype))        # a non-unit incoming gradient
    return loss.detach(), h.grad.clone(), w.grad.clone(), b.grad.clone()


def _torch(h, w, b, y, reduction="mean", **_):
    return F.cross_entropy(F.linear(h, w, b), y, reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_rows", [None, 1, 7, 64])
def test_matches_torch(reduction, chunk_rows):
    h, w, b, y = _operands(50, 6, 11, ignored=(3, 17, 49))
    ours = _loss_and_grads(linear_cross_entropy, h, w, b, y, reduction=reduction, chunk_rows=chunk_rows)
    theirs = _loss_and_grads(_torch, h, w, b, y, reduction=reduction)
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_no_bias_and_frozen_weight():
    h, w, _, y = _operands(20, 4, 5)
    w.requires_grad_(False)
    loss = linear_cross_entropy(h, w, None, y, chunk_rows=6)
    loss.backward()
    h2 = h.detach().clone().requires_grad_(True)
    F.cross_entropy(F.linear(h2, w), y).backward()
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(h, w), y))
    torch.testing.assert_close(h.grad, h2.grad)
    assert w.grad is None


def test_no_grad_forward_equals_torch():
    h, w, b, y = _operands(30, 3, 9)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, b, y, chunk_rows=4), _torch(h, w, b, y))


def test_no_grad_makes_no_gradients(monkeypatch):
    """Under torch.no_grad (a validation loss) autograd still marks the parameters as
    needing gradients: the forward made an input-sized gradient and the weight's anyway."""
    h, w, b, y = _operands(20, 3, 5)
    made = []
    real = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: made.append(a[0].shape) or real(*a, **k))
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, b, y, chunk_rows=4), _torch(h, w, b, y))
    assert made == []


def test_every_row_ignored_gives_nan_like_torch():
    """A batch with no labelled row: torch's mean loss is NaN but its gradients are
    zeros, so a step changes nothing; ours were 0 * (1 / 0) = NaN and poisoned the weights."""
    h, w, b, y = _operands(5, 3, 4, ignored=range(5))
    ours = _loss_and_grads(linear_cross_entropy, h, w, b, y)
    theirs = _loss_and_grads(_torch, h, w, b, y)
    assert torch.isnan(ours[0]) and torch.isnan(theirs[0])
    for a, e in zip(ours[1:], theirs[1:]):
        assert torch.equal(a, e) and not a.any()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_an_ignored_rows_nan_stays_out_of_the_loss_as_in_torch(reduction):
    """torch skips an ignored row's loss term; a product with the keep mask made it
    0 * NaN. Its gradients are NaN in both (softmax's backward multiplies it by 0)."""
    h, w, b, y = _operands(6, 3, 4, dtype=torch.float64, ignored=(2,))
    with torch.no_grad():
        h[2, 1] = float("nan")
    ours = _loss_and_grads(linear_cross_entropy, h, w, b, y, reduction=reduction, chunk_rows=4)
    theirs = _loss_and_grads(_torch, h, w, b, y, reduction=reduction)
    assert torch.isfinite(ours[0])
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_gradcheck_float64():
    h, w, b, y = _operands(9, 3, 5, dtype=torch.float64, ignored=(2,))
    assert torch.autograd.gradcheck(lambda h, w, b: linear_cross_entropy(h, w, b, y, chunk_rows=4), (h, w, b))
    assert torch.autograd.gradcheck(
        lambda h, w, b: linear_cross_entropy(h, w, b, y, reduction="sum", chunk_rows=2), (h, w, b))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), features=st.integers(1, 6), classes=st.integers(1, 12),
       chunk_rows=st.integers(1, 50), seed=st.integers(0, 2**16))
def test_drawn_shapes_match_torch(rows, features, classes, chunk_rows, seed):
    h, w, b, y = _operands(rows, features, classes, dtype=torch.float64, seed=seed)
    ours = _loss_and_grads(linear_cross_entropy, h, w, b, y, chunk_rows=chunk_rows)
    theirs = _loss_and_grads(_torch, h, w, b, y)
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("kwargs, message", [
    (dict(reduction="none"), "reduction must be one of"),
    (dict(chunk_rows=0), "chunk_rows must be at least 1"),
])
def test_refuses_bad_arguments(kwargs, message):
    h, w, b, y = _operands(4, 3, 5)
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(h, w, b, y, **kwargs)


def test_refuses_mismatched_shapes_and_float_targets():
    h, w, b, y = _operands(4, 3, 5)
    with pytest.raises(ValueError, match="input .* and weight"):
        linear_cross_entropy(h[:, :2], w, b, y)
    with pytest.raises(ValueError, match="bias"):
        linear_cross_entropy(h, w, b[:3], y)
    with pytest.raises(ValueError, match="one class index per input row"):
        linear_cross_entropy(h, w, b, y[:3])
    with pytest.raises(TypeError, match="integer tensor"):
        linear_cross_entropy(h, w, b, y.float())


def test_out_of_range_class_is_an_error_not_a_loss():
    h, w, b, y = _operands(4, 3, 5)
    y[1] = 5        # named, as F.cross_entropy names it (gather's "index 5 is out of bounds" named neither)
    with pytest.raises(IndexError, match=r"target 5 \(row 1\) is out of bounds for 5 classes"):
        linear_cross_entropy(h, w, b, y)
    y[1] = -3                                    # negative but not ignore_index
    with pytest.raises(IndexError, match=r"target -3 \(row 1\)"):
        linear_cross_entropy(h, w, b, y)
    y[1] = -100                                  # ignore_index is no class, and no error
    linear_cross_entropy(h, w, b, y)


def test_a_gradient_penalty_through_the_loss_is_refused_not_left_out():
    """The backward's gradients are constants made in the forward: a penalty on them
    would add nothing to the weight's gradient (0.539 where torch gives 0.677 on this
    problem), so a create_graph=True backward refuses."""
    h, w, _, y = _operands(6, 3, 4, dtype=torch.float64)
    loss = linear_cross_entropy(h, w, None, y)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(loss, h, create_graph=True)


def test_keeps_nothing_logit_sized_for_the_backward():
    """What autograd holds between forward and backward is the inputs' gradients, not
    the [rows, classes] logits or their softmax (torch's chain keeps the log-softmax)."""
    h, w, b, y = _operands(64, 3, 40)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        linear_cross_entropy(h, w, b, y, chunk_rows=16)
    assert saved and max(saved) < 64 * 40
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        _torch(h, w, b, y)
    assert max(saved) >= 64 * 40                   # the check can fail: torch's chain does keep them


def test_a_uint8_target_is_read_as_torchs_loss_reads_it():
    """torch takes a uint8 (Byte) target; here `gather` refused it ("Expected dtype
    int32/int64 for index"), and ``target != -100`` on uint8 wraps -100 to 156, which
    would have left class 156's rows out as ignored."""
    h, w, b, _ = _operands(4, 3, 200, dtype=torch.float64)
    y = torch.tensor([156, 3, 156, 199], dtype=torch.uint8)
    ours = _loss_and_grads(linear_cross_entropy, h, w, b, y)
    theirs = _loss_and_grads(_torch, h, w, b, y)
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("traced_without_grad", [True, False], ids=["traced_under_no_grad", "traced_with_grad"])
def test_a_traced_module_gives_torchs_loss_and_gradients(traced_without_grad):
    """torch.jit.trace recorded the grad mode the function reads as a constant: a module
    traced under no_grad, then trained, gave the input and weight no gradient (an encoder
    below the loss got only its weight-decay term, 0.002 where torch's traced module gave
    0.236; the classifier's weight gradient was None)."""
    import contextlib
    import warnings

    class Model(torch.nn.Module):
        def __init__(self, ours: bool):
            super().__init__()
            self.enc, self.lin, self.ours = torch.nn.Linear(3, 5), torch.nn.Linear(5, 4), ours

        def forward(self, x, y):
            h = self.enc(x)
            if self.ours:
                return linear_cross_entropy(h, self.lin.weight, self.lin.bias, y, chunk_rows=3)
            return F.cross_entropy(self.lin(h), y)
    x, y = torch.randn(7, 3, dtype=torch.float64), torch.randint(0, 4, (7,))
    grads = []
    for ours in (True, False):
        torch.manual_seed(0)
        model = Model(ours).double()
        with warnings.catch_warnings(), (torch.no_grad() if traced_without_grad else contextlib.nullcontext()):
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(model, (x, y), check_trace=False)
        other_x, other_y = torch.randn(11, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 3, -100, 1, 2, 3, 0, 1, 2])
        loss = traced(other_x, other_y)
        grads.append((loss.detach(), *torch.autograd.grad(loss, list(model.parameters()))))
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("transform", ["dual", "func.jvp", "func.grad", "vmap"])
def test_forward_ad_and_torch_func_transforms_give_torchs_loss(transform):
    """The loss's autograd Function has no ``jvp`` and no ``setup_context``: a dual input
    (forward-mode AD) stopped in torch's "You must implement the jvp function", and
    ``torch.func.grad`` of a classifier's weights (per-sample gradients, model ensembles)
    in "it must override the setup_context staticmethod", naming neither gnnfuse nor the
    loss. Those inputs take torch's linear and cross-entropy, as under torch.jit.trace."""
    h, w, b, y = (t.detach() if t.is_floating_point() else t
                  for t in _operands(12, 5, 4, dtype=torch.float64, ignored=(2,)))
    tangent = torch.randn_like(w)
    if transform == "dual":
        with fwAD.dual_level():
            got = fwAD.unpack_dual(linear_cross_entropy(h, fwAD.make_dual(w, tangent), b, y)).tangent
        expected = torch.func.jvp(lambda v: _torch(h, v, b, y), (w,), (tangent,))[1]
    elif transform == "func.jvp":
        got = torch.func.jvp(lambda v: linear_cross_entropy(h, v, b, y), (w,), (tangent,))[1]
        expected = torch.func.jvp(lambda v: _torch(h, v, b, y), (w,), (tangent,))[1]
    elif transform == "func.grad":
        got = torch.func.grad(lambda v: linear_cross_entropy(h, v, b, y))(w)
        expected = torch.func.grad(lambda v: _torch(h, v, b, y))(w)
    else:         # per-sample gradients: one row each
        def per_row(fn):
            def loss(v, row, label):
                return fn(row.unsqueeze(0), v, b, label.unsqueeze(0))
            return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(w, h, y)
        got, expected = per_row(linear_cross_entropy), per_row(_torch)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, equal_nan=True)   # (row 2's is ignored)
