"""`cross_entropy` with torch's arguments, plus ``rows``: the loss over selected rows of
the logits without gathering them first.

``gnnfuse.nn.functional.cross_entropy(out, y[train_idx], rows=train_idx)`` is
``F.cross_entropy(out[train_idx], y[train_idx])``; without ``rows`` it is
``F.cross_entropy(out, target)``. Inside a step being captured in a CUDA graph (as
`StepCapture` captures gnnfuse's training steps), for a float32/float64 [rows, classes]
matrix with torch's default weighting (no class weights, no label smoothing) and a
``mean`` or ``sum`` reduction, it records `backend.triton.cross_entropy`'s two kernels in
place of torch's gather, log-softmax, single-block NLL loss and their backwards (why:
that module's doc). Anything else runs torch's, with the same result, as does a selection
by ``rows`` under ``torch.use_deterministic_algorithms(True)`` (backend/determinism.py).

Launched from Python (an eager step) the kernels run only for selections of at least
`LAUNCHED_ELEMENTS` logits. Why (`benchmarks/results/loss.md`, an H200): replayed, the
kernels took 0.126 ms for a loss and its gradient where torch's took 0.475 (Reddit2-sized
logits, 3.8x) and 0.259 against 0.716 (products-sized, 2.8x), and an arxiv-sized
training step lost 0.24-0.30 ms; launched, they cost more host time than their kernels
save at the smaller sizes (0.78 against 0.56 ms at Reddit2's size, 6.3M logits
selected; 0.70-0.88 against 0.79-0.80 ms at products', 9.2M) and much less at
ogbn-mag's (1.97 against 3.96 ms, 154M). At large selections they
also hold less: torch's gathered copy and its log-softmax are two [selected, classes]
tensors, alive with the whole logit matrix, where the kernels keep one copy and a
log-sum-exp per row -- 0.62 GB less at ogbn-mag's size (442K rows x 349 classes).

Differences from torch's loss on the kernel path: in a captured step an out-of-range
target or row makes the loss NaN where torch stops with a device-side assert (the
kernels never read back from the device; launched, the same ranges are asserted on the
device first, as torch's kernels do); and the loss cannot be differentiated twice (the
backward is a kernel; a backward with ``create_graph=True`` through it raises rather
than leave a term out).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function_variadic

from ..backend.determinism import deterministic

_REDUCTIONS = ("mean", "sum")
# Selected logits (rows x classes) from which a launched call takes the kernels. Launched
# kernels against torch's time, H200: Reddit2-sized (6.3M) 0.73-0.89x, products-sized
# (9.2M) 0.91-1.13x over two runs, ogbn-mag-sized (154M) 2.0x.
LAUNCHED_ELEMENTS = 32_000_000


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                  size_average: bool | None = None, ignore_index: int = -100, reduce: bool | None = None,
                  reduction: str = "mean", label_smoothing: float = 0.0, *,
                  rows: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.nn.functional.cross_entropy` over ``input[rows]`` (all rows when ``rows`` is
    None); ``rows`` holds row indices (negative ones count from the end) or a boolean
    mask over the rows (a tensor, or a list as ``input[rows]`` takes), and ``target`` one
    class per selected row.

    Under a `TorchFunctionMode` the call is one op, as torch's own losses are: a mode
    sees ``cross_entropy`` and its arguments, not the checks below (which read
    ``target.shape`` and would look like a use of the labels' row count to
    `training.label_use.LabelWatch`)."""
    if has_torch_function_variadic(input, target, weight, rows):
        return handle_torch_function(cross_entropy, (input, target, weight, rows), input, target, weight,
                                     size_average, ignore_index, reduce, reduction, label_smoothing, rows=rows)
    if rows is not None and not isinstance(rows, torch.Tensor):
        rows = torch.as_tensor(rows, device=input.device)
    if rows is not None and rows.dtype == torch.bool:
        if rows.shape != input.shape[:1]:
            raise ValueError(f"a boolean rows mask needs one entry per row of input ({input.shape[0]}), "
                             f"got shape {tuple(rows.shape)}")
        rows = rows.nonzero().squeeze(1)          # as input[mask] does: one read back from the device
    if rows is not None and (rows.dim() != 1 or rows.dtype not in (torch.int64, torch.int32)):
        raise ValueError(f"rows must be a 1-D tensor of row indices (int64/int32) or a boolean mask, got "
                         f"{tuple(rows.shape)} {rows.dtype}")
    if rows is not None and (target.dim() == 0 or rows.numel() != target.shape[0]):
        raise ValueError(f"rows selects {rows.numel()} rows of input but target has shape {tuple(target.shape)}: "
                         "give one target per selected row")
    if _kernels_apply(input, target, weight, size_average, reduce, reduction, label_smoothing, rows):
        if not torch.cuda.is_current_stream_capturing():
            assert_in_range(input, target, rows, ignore_index)
        return _SelectedCrossEntropy.apply(input, target, rows.contiguous() if rows is not None else None,
                                           ignore_index, reduction)
    selected = input if rows is None else input[rows]
    return F.cross_entropy(selected, target, weight, size_average, ignore_index, reduce, reduction,
                           label_smoothing)


def _kernels_apply(input: torch.Tensor, target: torch.Tensor, weight, size_average, reduce, reduction: str,
                   label_smoothing: float, rows: torch.Tensor | None) -> bool:
    from ..backend.triton.cross_entropy import DTYPES, MAX_CLASSES
    return (input.is_cuda and input.dim() == 2 and input.dtype in DTYPES and 0 < input.shape[1] <= MAX_CLASSES
            and input.stride(1) == 1 and target.dim() == 1 and target.dtype == torch.int64     # torch's rule
            and target.device == input.device and (rows is None or rows.device == input.device)
            and weight is None and size_average is None and reduce is None
            and reduction in _REDUCTIONS and label_smoothing == 0.0 and not torch.compiler.is_compiling()
            # a row selected twice gets its two gradient terms added atomically, in either order
            and (rows is None or not deterministic())
            and (torch.cuda.is_current_stream_capturing()
                 or (input.shape[0] if rows is None else rows.numel()) * input.shape[1] >= LAUNCHED_ELEMENTS))


def assert_in_range(input: torch.Tensor, target: torch.Tensor, rows: torch.Tensor | None, ignore_index: int) -> None:
    """Device-side asserts, as torch's loss kernels make, that every target is a class of
    ``input`` (or ``ignore_index``) and every row one of its rows: without reading back
    from the device, a launched kernel call fails where torch's would, not with a NaN."""
    classes, count = input.shape[1], input.shape[0]
    torch._assert_async(((target >= 0) & (target < classes) | (target == ignore_index)).all(),
                        f"cross_entropy: a target is outside the {classes} classes (and not ignore_index)")
    if rows is not None:
        torch._assert_async(((rows >= -count) & (rows < count)).all(),
                            f"cross_entropy: a row index is outside input's {count} rows")


class _SelectedCrossEntropy(torch.autograd.Function):
    """The kernel path of `cross_entropy`: ``(input, target, rows, ignore_index,
    reduction) -> loss``, any device the Triton kernels run on (a GPU, or host tensors
    under Triton's interpreter, as the tests do)."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, target: torch.Tensor, rows: torch.Tensor | None, ignore_index: int,
                reduction: str) -> torch.Tensor:
        from ..backend.triton import cross_entropy as kernels
        lse, partial, kept = kernels.forward(input, target, rows, ignore_index)
        total = partial.sum(0)                      # (loss sum, counted rows)
        ctx.save_for_backward(input if kept is None else None, kept, target, rows, lse, total[1:])
        ctx.ignore_index, ctx.reduction, ctx.shape = ignore_index, reduction, input.shape
        return total[0] / total[1] if reduction == "mean" else total[0].clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if torch.is_grad_enabled():     # create_graph=True: a derivative of this gradient would be missing
            raise RuntimeError("gnnfuse.nn.functional.cross_entropy's GPU kernels have no second derivative "
                               "(a backward with create_graph=True through the loss): use "
                               "torch.nn.functional.cross_entropy for that step")
        from ..backend.triton import cross_entropy as kernels
        input, kept, target, rows, lse, count = ctx.saved_tensors
        scale = (grad / count if ctx.reduction == "mean" else grad).reshape(1).to(lse.dtype)
        if rows is not None and deterministic():    # switched on since the forward: no atomic adds
            grad_input = _selected_gradient(kept, target, rows, lse, scale, ctx.ignore_index, ctx.shape)
            return grad_input, None, None, None, None
        grad_input = kernels.backward(input, kept, target, rows, lse, scale, ctx.ignore_index, ctx.shape)
        return grad_input, None, None, None, None


def _selected_gradient(kept: torch.Tensor, target: torch.Tensor, rows: torch.Tensor, lse: torch.Tensor,
                       scale: torch.Tensor, ignore_index: int, shape: torch.Size) -> torch.Tensor:
    """The backward kernel's gradient, ``(softmax - one_hot(target)) * scale`` per selected
    row added into its row, by torch ops whose accumulation ``use_deterministic_algorithms``
    makes deterministic (the kernel adds a row selected twice atomically): for a forward
    run before the switch was turned on, whose backward runs after."""
    row_grad = torch.exp(kept - lse[:, None])
    counted = target != ignore_index
    picked = torch.nonzero(counted).squeeze(1)
    row_grad[picked, target[picked]] -= 1
    row_grad = row_grad * (scale * counted.to(row_grad.dtype))[:, None]
    return torch.zeros(shape, dtype=row_grad.dtype, device=row_grad.device).index_put_(
        (rows.long(),), row_grad, accumulate=True)
