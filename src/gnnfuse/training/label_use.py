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
(``table[y]``: a padding label reads entry -100). Before the mask, the labels' values
may only go through ops that keep a padding row's finite values finite with a finite
gradient (sums, differences, products, powers of at least 1, quotients by anything but
the labels, the regression losses, `_FINITE_ON_ZEROS`), since the mask's 0 does not
cancel an inf or a NaN (``y.log()``, ``(out - y) / y``), and through no broadcast
spreading the rows over columns (a ``[G]`` label against a ``[G, 1]`` output). So
``(F.l1_loss(out, y, reduction="none") * y_mask).sum() / y_mask.sum()`` passes and
``F.l1_loss(out, y)`` or ``(F.l1_loss(out, y, reduction="none") * y_mask).mean()`` do not.
"""
from __future__ import annotations

import inspect
import operator
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch.nn import _reduction
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from ..loader.static_shapes import IGNORE_LABEL
from ..nn import functional as gF

# Ops whose result is still the labels, rows rearranged or not (an integer result only).
_KEEP_LABELS = frozenset({
    torch.Tensor.view, torch.Tensor.view_as, torch.Tensor.reshape, torch.Tensor.reshape_as, torch.Tensor.squeeze,
    torch.Tensor.unsqueeze, torch.Tensor.flatten, torch.Tensor.contiguous, torch.Tensor.clone, torch.Tensor.detach,
    torch.Tensor.to, torch.Tensor.long, torch.Tensor.__getitem__, torch.reshape, torch.squeeze, torch.unsqueeze,
    torch.flatten})
# Losses ignoring targets equal to their ``ignore_index`` argument (gnnfuse's two are
# single ops to a torch-function mode, as torch's are; seen op by op, their checks of the
# target's shape were taken for a row count, and their steps ran eagerly).
_IGNORING = (F.cross_entropy, F.nll_loss, gF.cross_entropy, gF.linear_cross_entropy)
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
# Ops on the mask whose result is still 0 on the padded rows, so it still masks: those
# keeping zeros, and conversions and views of it. Not ``1 - y_mask``, ``y_mask + 1``,
# ``y_mask.clamp(min=0.5)`` or ``ones_like(y_mask)``: a label value times one of those
# keeps the padded rows (taken for the mask, their sum counted the padding silently).
_MASK_KEEPING = _ZERO_KEEPING | frozenset({
    torch.Tensor.bool, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.type, torch.Tensor.expand,
    torch.Tensor.expand_as, torch.logical_and, torch.Tensor.logical_and, torch.Tensor.__and__,
    torch.bitwise_and, torch.Tensor.bitwise_and})
_MASK_ROW_REDUCTIONS = frozenset({"sum", "nansum", "mean", "amax", "amin", "any", "all", "prod"})
# Reductions over the rows whose value a padded batch's mask gives as the plain one's
# does: padding rows add 0s, which a sum, a count of non-zeros, a maximum of a 0/1 mask,
# an ``any`` and the non-zero rows' indices leave as they were (not a mean, which divides
# by the padded count, a product, a minimum or an ``all``, which the 0s turn to 0/False).
_PADDING_BLIND = frozenset({"sum", "nansum", "count_nonzero", "amax", "max", "any", "nonzero", "argwhere"})
# A comparison of the mask with a number is False where the mask is 0 when the number
# compares so with 0 (``y_mask > 0``, ``y_mask != 0``, ``y_mask == 1``; not ``y_mask < 1``).
_COMPARISONS = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le, "eq": operator.eq,
                "ne": operator.ne}
_SUMS = frozenset({torch.sum, torch.Tensor.sum, torch.nansum, torch.Tensor.nansum})
# Ops keeping each row's values in that row whose names nonetheless move values along
# the rows (a cumulative sum over them, a sort): never row by row.
_ROW_MIXING = ("cum", "sort", "flip", "roll", "gather", "scatter", "index", "take", "logcumsumexp", "diff")
# What a value of masked labels may go through before the mask: ops taking a padded
# row's finite values (labels 0, outputs of a padding graph) to finite values with finite
# gradients, since the mask multiplies them by 0 and ``inf * 0`` is NaN, in the forward
# (``y.log()``, a quotient by ``y``) or in the backward (``sqrt``'s gradient at 0).
_FINITE_ON_ZEROS = frozenset({
    "add", "sub", "subtract", "mul", "multiply", "neg", "negative", "abs", "square", "sigmoid", "tanh", "relu",
    "clamp", "clip", "exp", "float", "double", "half", "bfloat16", "to", "type_as", "view", "view_as", "reshape",
    "reshape_as", "squeeze", "unsqueeze", "flatten", "contiguous", "clone", "detach", "__add__", "__radd__",
    "__sub__", "__rsub__", "__mul__", "__rmul__", "__neg__", "__abs__", "mse_loss", "l1_loss", "smooth_l1_loss",
    "huber_loss", "binary_cross_entropy_with_logits", "where"})
_ROW_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "nansum"})    # over the other dims only
_POWERS = frozenset({"pow", "__pow__"})


class LabelWatch(TorchFunctionMode):
    """``with LabelWatch([batch.y]) as watch: step(batch)``; then ``watch.misuse`` names
    the first torch function that computed something from the labels other than a loss
    ignoring `IGNORE_LABEL` and reduced over its rows (None: there was none), and
    ``watch.unmaskable`` says why, where it is an op on masked labels' values that
    multiplying by the mask would not repair (a quotient by the labels, a broadcast);
    ``watch.mask_use`` says what, where it is a reduction of the mask itself over its
    rows whose value the padded rows change (``y_mask.mean()``, ``(1 - y_mask).sum()``)."""

    def __init__(self, labels: Iterable[torch.Tensor], masks: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self._labels = [t for t in labels if isinstance(t, torch.Tensor)]    # kept alive: ids stay theirs
        self._ids = {id(t) for t in self._labels}
        self._masks = [t for t in masks if isinstance(t, torch.Tensor)]      # y_mask and values of it
        self._mask_ids = {id(t) for t in self._masks}
        self._zeroed: list[torch.Tensor] = []    # label values times the mask: 0 on the padded rows
        self._zeroed_ids: set[int] = set()
        # row by row from the mask alone, but no longer 0 on the padded rows (``1 - y_mask``)
        self._derived: list[torch.Tensor] = []
        self._derived_ids: set[int] = set()
        self.misuse: str | None = None
        self.unmaskable: str | None = None    # why masking cannot repair `misuse`, when that is the reason
        self.mask_use: str | None = None      # `misuse` read the mask itself, counting the padded rows

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.misuse is not None:
            return out
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        labelled = [t for t in inputs if id(t) in self._ids]
        masked = any(id(t) in self._mask_ids for t in inputs)
        zeroed = [t for t in inputs if id(t) in self._zeroed_ids]
        derived = [t for t in inputs if id(t) in self._derived_ids]
        if not labelled and not masked and not zeroed and not derived:
            return out
        if _counts_rows(func, args, kwargs):      # of the labels, the mask or a value of them
            self.misuse = f"{_name(func)} (a row count, which includes the padding)"
            return out
        results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if zeroed and not labelled:
            if func in _SUMS or (func in _DIVIDING and args[0] is zeroed[0] and _constant_rows(args[1])) or (
                    func in _ZERO_KEEPING and _rows_aligned(zeroed, results)):
                if not (func in _SUMS and all(t.dim() == 0 for t in results)):
                    self._keep(self._zeroed, self._zeroed_ids, results)     # still 0 on the padded rows
                return out
        elif masked and not labelled:        # the mask itself, converted, reshaped or scaled: still the mask
            mask_inputs = [t for t in inputs if id(t) in self._mask_ids]
            if _keeps_mask(func, args, kwargs, mask_inputs) and _row_by_row(func, mask_inputs, results):
                self._keep(self._masks, self._mask_ids, results)
            elif getattr(func, "__name__", "") in _PADDING_BLIND:
                pass          # y_mask.sum(), y_mask.nonzero(): the plain batch's (its G rows may look row by row)
            elif results and _row_by_row(func, mask_inputs, results):
                self._keep(self._derived, self._derived_ids, results)
            elif results:
                self._mask_misuse(func, "batch.y_mask (or a value multiplied by it)")
            return out
        elif derived and not labelled:        # a reduction of ``1 - y_mask`` counts the padded rows' 1s
            if results and _row_by_row(func, derived, results):
                self._keep(self._derived, self._derived_ids, results)
            elif results:
                self._mask_misuse(func, "a value computed row by row from batch.y_mask")
            return out
        elif masked and _rows_aligned(inputs, results) and (
                func in _MASKING or (func is torch.where and len(args) == 3 and id(args[0]) in self._mask_ids
                                     and id(args[1]) in self._ids and _zero(args[2]))):
            self._keep(self._zeroed, self._zeroed_ids, results)      # 0 on the padded rows
            return out
        ignoring = func in _IGNORING and _ignores_padding(func, args, kwargs)
        if not results or ignoring is True:
            return out            # a dtype, a dimension count; or a loss that ignores the padding
        if self._mask_ids and _row_by_row(func, labelled, results):
            if not _rows_aligned(inputs, results):
                self.misuse = _name(func)
                self.unmaskable = (f"broadcasting shapes {[tuple(t.shape) for t in inputs]} to "
                                   f"{tuple(results[0].shape)}, which spreads rows over columns that a mask of the "
                                   f"rows does not zero")
            elif not _finite_on_zeros(func, args, kwargs, self._ids):
                self.misuse = _name(func)
                self.unmaskable = ("which on a padding row (label 0) may be inf or NaN, or have an inf or NaN "
                                   "gradient, and multiplying by the mask's 0 leaves NaN")
            else:
                self._keep(self._labels, self._ids, results)      # still the labels' rows: to be masked
            return out
        if func in _KEEP_LABELS and id(args[0]) in self._ids and not any(
                t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool for t in results):
            self._labels += results
            self._ids.update(id(t) for t in results)
            return out
        self.misuse = _name(func)
        if func is torch.Tensor.__getitem__ and id(args[0]) not in self._ids and id(args[0]) not in self._zeroed_ids:
            self.misuse += " (the labels as an index: a padding label reads entry -100)"
        if ignoring == "unreduced":
            self.misuse += "(reduction='none')"
        return out

    def _mask_misuse(self, func: Any, what: str) -> None:
        """``func`` reduced the mask (or ``what`` else came of it) over its rows to a value
        that a padded batch's 0 rows change: ``y_mask.mean()``, ``(1 - y_mask).sum()``."""
        self.misuse = _name(func)
        self.mask_use = f"{self.misuse} of {what}"

    @staticmethod
    def _keep(kept: list, ids: set, results: list[torch.Tensor]) -> None:
        kept += results
        ids.update(id(t) for t in results)


def _name(func: Any) -> str:
    if getattr(func, "__self__", None) is torch.Tensor.shape:
        return "Tensor.shape"
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


# Reads of a tensor's row count: on a padded batch it includes the padding, so ``sum / len(y)``
# divides by the padded count (the shape's getter comes as the descriptor's ``__get__``;
# ``torch.numel(y)`` comes as itself, not as the method)
_ROW_COUNTS = (torch.Tensor.__len__, torch.Tensor.numel, torch.numel, torch.Tensor.size)


def _counts_rows(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` reads the row count of its tensor: ``len(y)``, ``y.numel()``,
    ``torch.numel(y)``, ``y.shape``, ``y.size()`` or ``y.size(0)`` (not another dim's size)."""
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


def _rows_aligned(inputs: list[torch.Tensor], results: list[torch.Tensor]) -> bool:
    """Whether every input with rows meets the result row for row: of the result's rank
    and row count, or one value for all (a ``[G]`` label against a ``[G, 1]`` output
    broadcasts to ``[G, G]``, its rows spread over the columns, which a mask of the rows
    does not zero)."""
    broadcast = [t for t in inputs if t.numel() != 1]
    if len(broadcast) < 2:
        return True       # a view or a reduction of one tensor: its rows are `_row_by_row`'s
    ranked = [t for t in results if t.dim()]
    return all(t.numel() == 1 or (t.dim() == r.dim() and t.shape[0] == r.shape[0])
               for t in inputs for r in ranked)


def _keeps_mask(func: Any, args: tuple, kwargs: dict, masks: list[torch.Tensor]) -> bool:
    """Whether ``func`` of the mask ``masks`` is 0 where the mask is (`_MASK_KEEPING`, a
    quotient of the mask by the same value for every row, whole rows of it: ``y_mask[:,
    None]``, a reduction of each row: ``y_mask.any(dim=1)``), so that a label value
    multiplied by it is 0 on the padded rows."""
    if func in _MASK_KEEPING:
        return True
    if getattr(func, "__name__", "") in _MASK_ROW_REDUCTIONS:     # a padded row is all 0: so is its reduction
        return any(args[0] is mask for mask in masks) and _over_other_dims(args, kwargs)
    if func in _DIVIDING:
        return len(args) > 1 and any(args[0] is mask for mask in masks) and _constant_rows(args[1])
    if func is torch.Tensor.__getitem__:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(args[0] is mask for mask in masks) and bool(index) and index[0] == slice(None)
    compare = _COMPARISONS.get(getattr(func, "__name__", "").strip("_"))
    if compare is not None and len(args) > 1 and isinstance(args[1], (int, float)):
        return any(args[0] is mask for mask in masks) and not compare(0, args[1])    # y_mask > 0: False at 0
    return False


def _constant_rows(divisor: Any) -> bool:
    """Whether ``divisor`` is the same for every row (a number, a tensor of one value or of
    fewer dims than the rows'), so a masked row's 0 stays 0, not ``0 / 0``."""
    return not isinstance(divisor, torch.Tensor) or divisor.numel() == 1 or divisor.dim() == 0


def _finite_on_zeros(func: Any, args: tuple, kwargs: dict, label_ids: set[int]) -> bool:
    """Whether ``func``, given label values, keeps a padded row finite with a finite
    gradient (`_FINITE_ON_ZEROS`): a sum over the other dims, a non-negative whole power,
    a quotient by something other than the labels, a view of whole rows."""
    name = getattr(func, "__name__", "")
    if name in _FINITE_ON_ZEROS:
        return True
    if name in _ROW_REDUCTIONS:
        return _over_other_dims(args, kwargs)
    if name in _POWERS:
        exponent = args[1] if len(args) > 1 else kwargs.get("exponent")
        return isinstance(args[0], torch.Tensor) and isinstance(exponent, (int, float)) and (
            exponent >= 1 or exponent == 0)
    if func in _DIVIDING:
        return len(args) > 1 and id(args[1]) not in label_ids and _constant_rows(args[1])
    if func is torch.Tensor.__getitem__:      # whole rows: y[:, 0]
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return bool(index) and index[0] == slice(None)
    return False


def _over_other_dims(args: tuple, kwargs: dict) -> bool:
    """Whether a reduction of ``args[0]`` is over dims other than the rows only (``dim``
    given, not 0), so that each row reduces to its own value."""
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    dims = (dims,) if isinstance(dims, int) else dims
    return bool(dims) and all(isinstance(d, int) and d % args[0].dim() != 0 for d in dims)


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
