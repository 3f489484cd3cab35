"""A classifier's last linear layer and its cross-entropy loss in one function that never
holds the whole [rows, classes] logit matrix.

``F.cross_entropy(lin(h)[idx], y)`` keeps, between the loss and its backward, the
log-softmax of every training row, and the backward adds its gradient and a zero-filled
gradient of the full logit matrix: on an ogbn-mag-sized graph (736K papers, 349 fields)
that is 2.5 GB at the step's peak -- more than the two HGT layers beneath it hold. Here
the rows go through in chunks of a bounded size: each chunk's logits are made, reduced to
the loss, turned into the gradients of the input, weight and bias (softmax minus the
one-hot target), and dropped. What stays between forward and backward is the input's
gradient (the input's size) and the weight's and bias's; the backward only scales them by
the loss's incoming gradient. So the extra memory is one chunk's logits, and the work is
the three matmuls the autograd chain would run anyway.

No host synchronisation: the mean divides by a count kept on the device, so a step using
this can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function_variadic

from .transformed import transformed

# Each chunk's logits take at most this many elements (64 MiB in float32).
CHUNK_ELEMENTS = 1 << 24
_REDUCTIONS = ("mean", "sum")


def linear_cross_entropy(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         target: torch.Tensor, reduction: str = "mean", ignore_index: int = -100,
                         chunk_rows: int | None = None) -> torch.Tensor:
    """``F.cross_entropy(F.linear(input, weight, bias), target, reduction=reduction,
    ignore_index=ignore_index)`` without materialising the logits of every row.

    ``input`` is [rows, in_features], ``weight`` [classes, in_features] and ``bias``
    [classes] (an ``nn.Linear``'s parameters), ``target`` [rows] class indices, rows whose
    target is ``ignore_index`` left out of the loss and the mean's count. ``chunk_rows``
    bounds the rows whose logits exist at once (default: `CHUNK_ELEMENTS` / classes).
    The gradients are computed in the forward when any input needs one, so the result
    cannot be differentiated twice: a backward with ``create_graph=True`` through it (a
    gradient penalty) raises rather than give gradients without the second-order term.
    Under a `TorchFunctionMode` the call is one op, as torch's losses are (so
    `training.label_use.LabelWatch` sees the loss, not its shape checks). Under
    ``torch.jit.trace``, forward-mode AD (a dual input) and ``torch.func`` transforms it is
    torch's linear and cross-entropy (logits held).
    """
    if has_torch_function_variadic(input, weight, bias, target):
        return handle_torch_function(linear_cross_entropy, (input, weight, bias, target), input, weight, bias,
                                     target, reduction, ignore_index, chunk_rows)
    _check(input, weight, bias, target, reduction, chunk_rows)
    # as torch's loss reads them: int64 class ids (a uint8 target compared with -100 wraps it
    # to 156, which would drop class 156's rows as ignored; `gather` refused uint8 besides)
    target = target.to(torch.int64)
    if torch._C._get_tracing_state() is not None:
        # torch.jit.trace would record the grad mode read below as a constant: a module traced
        # under no_grad and then trained would never make the input's and weight's gradients.
        # torch's ops are traced as ops, and give the same loss
        return F.cross_entropy(F.linear(input, weight, bias), target, reduction=reduction, ignore_index=ignore_index)
    if transformed(input, weight, bias):
        # `_LinearCrossEntropy` has no jvp and no setup_context: torch's "You must implement
        # the jvp function" or "must override the setup_context staticmethod" named neither
        # gnnfuse nor the loss. torch's ops carry the tangents and transforms
        return F.cross_entropy(F.linear(input, weight, bias), target, reduction=reduction, ignore_index=ignore_index)
    _check_classes(target, weight.shape[0], ignore_index)
    rows = chunk_rows or max(1, CHUNK_ELEMENTS // max(1, weight.shape[0]))
    # autograd.Function marks inputs needing a gradient under no_grad too, and inside
    # forward the grad mode is always off: whether a backward can come is read here
    return _LinearCrossEntropy.apply(input, weight, bias, target, reduction, ignore_index, rows,
                                     torch.is_grad_enabled())


def _check(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
           reduction: str, chunk_rows: int | None) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r} "
                         "(per-row losses would need the per-row gradients kept: use F.cross_entropy)")
    if input.dim() != 2 or weight.dim() != 2 or input.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: input {tuple(input.shape)} and weight {tuple(weight.shape)} "
                         "must be [rows, in_features] and [classes, in_features]")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"linear_cross_entropy: bias {tuple(bias.shape)} must be [classes] = [{weight.shape[0]}]")
    if target.dim() != 1 or target.shape[0] != input.shape[0]:
        raise ValueError(f"linear_cross_entropy: target {tuple(target.shape)} must hold one class index per "
                         f"input row ({input.shape[0]})")
    if target.dtype.is_floating_point or target.dtype == torch.bool:
        raise TypeError(f"linear_cross_entropy: target must hold class indices (an integer tensor), "
                        f"got {target.dtype}; class probabilities are not supported")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"linear_cross_entropy: chunk_rows must be at least 1, got {chunk_rows}")


def _check_classes(target: torch.Tensor, classes: int, ignore_index: int) -> None:
    """Name a target outside [0, classes) as ``F.cross_entropy`` does, where reading it
    costs no device sync (a CPU target); `gather` failed on it with "index 4 is out of
    bounds for dimension 1 with size 4", which names neither the target nor the class
    count. On a GPU an out-of-range class fails in `gather`'s device assert, as in torch."""
    if target.device.type != "cpu" or target.numel() == 0:
        return
    bad = (target != ignore_index) & ((target < 0) | (target >= classes))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise IndexError(f"linear_cross_entropy: target {int(target[row])} (row {row}) is out of bounds for "
                         f"{classes} classes (weight has {classes} rows)")


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, target, reduction, ignore_index, chunk_rows, graded):
        wants = ctx.needs_input_grad[:3] if graded else (False,) * 3
        accumulate = torch.promote_types(input.dtype, torch.float32)
        kept = target != ignore_index
        total = torch.zeros((), dtype=accumulate, device=input.device)
        grad_input = torch.empty_like(input) if wants[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=accumulate, device=weight.device) if wants[1] else None
        grad_bias = (torch.zeros(weight.shape[0], dtype=accumulate, device=weight.device)
                     if bias is not None and wants[2] else None)
        for start in range(0, input.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            h, keep = input[rows], kept[rows]
            logits = (h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())).to(accumulate)
            # an ignored row reads class 0 and is then zeroed; any other target is read as
            # given, so an out-of-range class fails in `gather` as in cross_entropy
            classes = torch.where(keep, target[rows], 0).unsqueeze(1)
            lse = torch.logsumexp(logits, dim=1)
            # where, not a product with the mask: an ignored row's NaN stays out of the loss
            total += torch.where(keep, lse - logits.gather(1, classes).squeeze(1), 0.0).sum()
            if not any(wants):
                continue
            grad = logits.sub_(lse.unsqueeze(1)).exp_()                  # softmax, in place of the logits
            grad.scatter_add_(1, classes, torch.full_like(classes, -1, dtype=grad.dtype))
            grad.mul_(keep.unsqueeze(1))
            if grad_input is not None:
                grad_input[rows] = (grad.to(weight.dtype) @ weight).to(input.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(grad.t(), h.to(accumulate))
            if grad_bias is not None:
                grad_bias += grad.sum(0)
        count = kept.sum().to(accumulate) if reduction == "mean" else None
        ctx.save_for_backward(grad_input, grad_weight, grad_bias, count)
        ctx.dtypes = (input.dtype, weight.dtype, None if bias is None else bias.dtype)
        return (total if count is None else total / count).to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        # create_graph=True: the saved gradients are constants, so a penalty on them would
        # silently contribute nothing (once_differentiable raises only when the incoming
        # gradient itself needs one, which a loss's seldom does)
        if torch.is_grad_enabled():
            raise RuntimeError("gnnfuse.nn.functional.linear_cross_entropy has no second derivative (a backward "
                               "with create_graph=True through the loss, as a gradient penalty makes): use "
                               "torch.nn.functional.cross_entropy(F.linear(...)) for that step")
        grad_input, grad_weight, grad_bias, count = ctx.saved_tensors
        # No kept row: torch's mean loss is 0 / 0 = NaN, but its gradients are zeros (as
        # every row's are), not 0 / 0.
        scale = grad_output if count is None else grad_output / count.clamp(min=1)
        grads = [None if g is None else (g * scale).to(dtype)
                 for g, dtype in zip((grad_input, grad_weight, grad_bias), ctx.dtypes)]
        return (*grads, None, None, None, None, None)
