"""What a training step computes from its batch's labels: whether a padded batch's step
gives the unpadded batch's numbers.

A batch padded to fixed shapes (`loader.padded_graph_batch`) labels its padding graphs
and padded vertices `IGNORE_LABEL`. That changes nothing only where the labels reach the
loss through cross-entropy or nll (whose ``ignore_index`` is that label) reduced by
``"mean"`` or ``"sum"``: a binary loss over ``y.float()`` counts every padding graph
with target -100, a mean of ``pred == y`` counts it as a miss, and a mean of
cross-entropy's ``reduction="none"`` losses counts its zero. `LabelWatch` follows the
label tensors through a step (views, ``long()`` and ``to()`` an integer dtype keep them
labels) and names the first op that computes anything else from them;
`training.GraphStepCapture` runs its first batch, unpadded, under it.

With masked labels (``DataLoader(static_shapes=True, label_mask=True)``: a regression's
float ``y`` padded with 0, and ``y_mask`` 0 on the padded rows) the watch also follows
``y_mask``. A value computed row by row from the labels (``y - out``, an unreduced loss)
stays theirs until it is multiplied by the mask, or selected by ``torch.where`` on it
against zeros; the product is then 0 on the padded rows, and stays so through products,
quotients, sign changes and reshapes, until a sum reduces it, which the zeros do not
change. Anything else done with either -- a mean (which divides by the padded count),
a reduction before the mask, an op moving values along the rows -- is named. So is a
row count read from the labels, the mask or a value of them (``len(y)``, ``y.numel()``,
``y.shape[0]``: a padded batch's, padding included), and labels used to index a table
(``table[y]``: a padding label reads entry -100). So
``(F.l1_loss(out, y, reduction="none") * y_mask).sum() / y_mask.sum()`` passes and
``F.l1_loss(out, y)`` or ``(F.l1_loss(out, y, reduction="none") * y_mask).mean()`` do not.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch.nn import _reduction
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from ..loader.static_shapes import IGNORE_LABEL

# Ops whose result is still the labels, rows rearranged or not (an integer result only).
_KEEP_LABELS = frozenset({
    torch.Tensor.view, torch.Tensor.view_as, torch.Tensor.reshape, torch.Tensor.reshape_as, torch.Tensor.squeeze,
    torch.Tensor.unsqueeze, torch.Tensor.flatten, torch.Tensor.contiguous, torch.Tensor.clone, torch.Tensor.detach,
    torch.Tensor.to, torch.Tensor.long, torch.Tensor.__getitem__, torch.reshape, torch.squeeze, torch.unsqueeze,
    torch.flatten})
# Losses ignoring targets equal to their ``ignore_index`` argument.
_IGNORING = (F.cross_entropy, F.nll_loss)
# Products: a label's value times the mask (or a value of it) is 0 on the padded rows.
_MASKING = frozenset({torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.mul_})
# Ops that keep a value 0 where it was 0 (a quotient's numerator only), and sums, which
# the zeros do not change.
_ZERO_KEEPING = _MASKING | frozenset({
    torch.neg, torch.Tensor.neg, torch.Tensor.__neg__, torch.abs, torch.Tensor.abs, torch.Tensor.__abs__,
    torch.square, torch.Tensor.square, torch.Tensor.view, torch.Tensor.view_as, torch.Tensor.reshape,
    torch.Tensor.reshape_as, torch.Tensor.squeeze, torch.Tensor.unsqueeze, torch.Tensor.flatten, torch.reshape,
    torch.squeeze, torch.unsqueeze, torch.flatten, torch.Tensor.to, torch.Tensor.float, torch.Tensor.double,
    torch.Tensor.type_as, torch.Tensor.contiguous, torch.Tensor.clone, torch.Tensor.detach})
_DIVIDING = frozenset({torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.__truediv__, torch.Tensor.div_})
_SUMS = frozenset({torch.sum, torch.Tensor.sum, torch.nansum, torch.Tensor.nansum})
# Ops keeping each row's values in that row whose names nonetheless move values along
# the rows (a cumulative sum over them, a sort): never row by row.
_ROW_MIXING = ("cum", "sort", "flip", "roll", "gather", "scatter", "index", "take", "logcumsumexp", "diff")


class LabelWatch(TorchFunctionMode):
    """``with LabelWatch([batch.y]) as watch: step(batch)``; then ``watch.misuse`` names
    the first torch function that computed something from the labels other than a loss
    ignoring `IGNORE_LABEL` and reduced over its rows (None: there was none)."""

    def __init__(self, labels: Iterable[torch.Tensor], masks: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._labels = [t for t in labels if isinstance(t, torch.Tensor)]    # kept alive: ids stay theirs
        self._ids = {id(t) for t in self._labels}
        self._masks = [t for t in masks if isinstance(t, torch.Tensor)]      # y_mask and values of it
        self._mask_ids = {id(t) for t in self._masks}
        self._zeroed: list[torch.Tensor] = []    # label values times the mask: 0 on the padded rows
        self._zeroed_ids: set[int] = set()
        self.misuse: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.misuse is not None:
            return out
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        labelled = [t for t in inputs if id(t) in self._ids]
        masked = any(id(t) in self._mask_ids for t in inputs)
        zeroed = [t for t in inputs if id(t) in self._zeroed_ids]
        if not labelled and not masked and not zeroed:
            return out
        if _counts_rows(func, args, kwargs):      # of the labels, the mask or a value of them
            self.misuse = f"{_name(func)} (a row count, which includes the padding)"
            return out
        results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if zeroed and not labelled:
            if func in _SUMS or (func in _DIVIDING and args[0] is zeroed[0]) or func in _ZERO_KEEPING:
                if not (func in _SUMS and all(t.dim() == 0 for t in results)):
                    self._keep(self._zeroed, self._zeroed_ids, results)     # still 0 on the padded rows
                return out
        elif not labelled:        # the mask itself, converted or reshaped: still the mask
            if _row_by_row(func, [t for t in inputs if id(t) in self._mask_ids], results):
                self._keep(self._masks, self._mask_ids, results)
            return out
        elif masked and (func in _MASKING or (func is torch.where and len(args) == 3 and id(args[0]) in self._mask_ids
                                              and id(args[1]) in self._ids and _zero(args[2]))):
            self._keep(self._zeroed, self._zeroed_ids, results)      # 0 on the padded rows
            return out
        ignoring = func in _IGNORING and _ignores_padding(func, args, kwargs)
        if not results or ignoring is True:
            return out            # a dtype, a dimension count; or a loss that ignores the padding
        if self._mask_ids and _row_by_row(func, labelled, results):
            self._keep(self._labels, self._ids, results)      # still the labels' rows: to be masked
            return out
        if func in _KEEP_LABELS and id(args[0]) in self._ids and not any(
                t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool for t in results):
            self._labels += results
            self._ids.update(id(t) for t in results)
            return out
        self.misuse = _name(func)
        if func is torch.Tensor.__getitem__ and id(args[0]) not in self._ids:
            self.misuse += " (the labels as an index: a padding label reads entry -100)"
        if ignoring == "unreduced":
            self.misuse += "(reduction='none')"
        return out

    @staticmethod
    def _keep(kept: list, ids: set, results: list[torch.Tensor]) -> None:
        kept += results
        ids.update(id(t) for t in results)


def _name(func: Any) -> str:
    if getattr(func, "__self__", None) is torch.Tensor.shape:
        return "Tensor.shape"
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


# Reads of a tensor's row count: on a padded batch it includes the padding, so ``sum / len(y)``
# divides by the padded count (the shape's getter comes as the descriptor's ``__get__``)
_ROW_COUNTS = (torch.Tensor.__len__, torch.Tensor.numel, torch.Tensor.size)


def _counts_rows(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` reads the row count of its tensor: ``len(y)``, ``y.numel()``,
    ``y.shape``, ``y.size()`` or ``y.size(0)`` (not another dim's size)."""
    if getattr(func, "__self__", None) is torch.Tensor.shape:
        return True
    if func not in _ROW_COUNTS:
        return False
    if func is torch.Tensor.size:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        return dim is None or dim in (0, -args[0].dim())
    return True


def _zero(value: Any) -> bool:
    """Whether ``value`` (the other branch of a ``torch.where``) is 0 everywhere."""
    if isinstance(value, torch.Tensor):
        return bool((value == 0).all())
    return isinstance(value, (int, float)) and value == 0


def _row_by_row(func: Any, sources: list[torch.Tensor], results: list[torch.Tensor]) -> bool:
    """Whether ``func`` computed ``results`` from ``sources`` row by row: each result has
    the rows of a source (the shape of one, or of them broadcast), and the op's name moves
    nothing along the rows."""
    name = getattr(func, "__name__", "")
    if any(part in name for part in _ROW_MIXING):
        return False
    rows = {t.shape[0] for t in sources if t.dim()}
    return bool(results) and all(t.dim() and t.shape[0] in rows for t in results)


def _ignores_padding(loss: Any, args: tuple, kwargs: dict) -> bool | str:
    """True where the loss ignores `IGNORE_LABEL` and reduces over the rows it keeps;
    ``"unreduced"`` where it ignores them but returns a loss per row, whose padding rows'
    zeros a later mean would count (a step's ``.mean()`` of it divides by the padded
    graph count); False where it does not ignore them."""
    bound = inspect.signature(loss).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    if arguments.get("ignore_index") != IGNORE_LABEL:
        return False
    reduction, legacy = arguments.get("reduction", "mean"), (arguments.get("size_average"), arguments.get("reduce"))
    if legacy != (None, None):       # torch's older arguments, which override ``reduction``
        reduction = _reduction.legacy_get_string(*legacy, emit_warning=False)
    return True if reduction in ("mean", "sum") else "unreduced"
