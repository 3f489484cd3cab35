"""Ops that move data across the row dimension: Broadcast, Reduce and Norm.

``by`` names the index that connects the rows of one place to another:

========== ============================== ============= ==================
by         index (one entry per ...)      broadcast     reduce
========== ============================== ============= ==================
src, dst   edge: its endpoint's vertex id NODE -> SRC/DST edge -> NODE
etype      edge: its type id              EDGE_TYPE->EDGE edge -> EDGE_TYPE
srctype,   edge: its endpoint's node type NODE_TYPE ->   edge -> NODE_TYPE
dsttype                                   SRC / DST
ntype      vertex: its node type          NODE_TYPE->NODE NODE -> NODE_TYPE
========== ============================== ============= ==================

Type broadcasts are how per-relation and per-node-type parameters (R-GCN's W_r, HGT's
per-type projections; Graphiler §4.1 Table 1) reach edges and vertices; their derivative
is a reduce along the same index, which sums each type's gradient over its edges or
vertices. Empty groups reduce to 0, as PyG's scatter does, so isolated vertices get
zeros, never NaN or -inf.
"""
from __future__ import annotations

import torch

from ..errors import CompileError
from ..registry import OpDef, register
from ..residency import EDGE_ROWED, Movement, Residency

BROADCAST_FROM = {"src": Residency.NODE, "dst": Residency.NODE, "etype": Residency.EDGE_TYPE,
                  "srctype": Residency.NODE_TYPE, "dsttype": Residency.NODE_TYPE,
                  "ntype": Residency.NODE_TYPE}
BROADCAST_TO = {"src": Residency.SRC, "dst": Residency.DST, "etype": Residency.EDGE,
                "srctype": Residency.SRC, "dsttype": Residency.DST, "ntype": Residency.NODE}
REDUCE_TO = BROADCAST_FROM
TYPE_INDICES = ("etype", "srctype", "dsttype", "ntype")
REDUCERS = ("sum", "mean", "max", "min")


def _same_shape(inputs, attrs, residency):
    return inputs[0].shape, inputs[0].dtype


def _check_by(attrs: dict) -> str:
    by = attrs["by"]
    if by not in BROADCAST_FROM:
        raise ValueError(f"by must be one of {sorted(BROADCAST_FROM)}, got {by!r}")
    return by


def _is_row_of(residency: Residency, by: str) -> bool:
    """Whether ``residency`` has one row per entry of index ``by`` (what reduce reads)."""
    if BROADCAST_TO[by] is Residency.NODE:
        return residency is Residency.NODE
    return residency in EDGE_ROWED


# --- broadcast --------------------------------------------------------------------------
def _broadcast_residency(rs, attrs):
    by = _check_by(attrs)
    if rs[0] is not BROADCAST_FROM[by]:
        raise ValueError(f"broadcast by {by} takes {BROADCAST_FROM[by].name} data, got {rs[0].name}")
    return BROADCAST_TO[by]


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` along rows: the contexts' ``gather_rows`` in torch (the Triton
    backend's is a kernel, backend/triton/gather_rows.py)."""
    return table.index_select(0, index)


register(OpDef("broadcast", Movement.BROADCAST,
               lambda ctx, x, by: ctx.gather_rows(x, ctx.index(by)),
               residency=_broadcast_residency, shape=_same_shape, arity=1,
               derivative=lambda b, v, g: [b.add("reduce", g, op="sum", by=v.attrs["by"])],
               doc="gather vertex (or type) rows onto edges (or vertices) through one index (see module doc)",
               autograd_reference=True))


# --- reduce ---------------------------------------------------------------------------
def _reduce_residency(rs, attrs):
    by = _check_by(attrs)
    if attrs["op"] not in REDUCERS:
        raise ValueError(f"reduce op must be one of {REDUCERS}, got {attrs['op']!r}")
    if not _is_row_of(rs[0], by):
        if BROADCAST_TO[by] is Residency.NODE:
            raise ValueError(f"reduce by {by} takes vertex data (NODE), got {rs[0].name}")
        raise ValueError(f"reduce takes edge data (SRC, DST or EDGE) when grouped by {by}, got {rs[0].name}")
    return REDUCE_TO[by]


# A GPU sum of many more entries than rows (an edge table summed per relation type: a
# per-type parameter's gradient) spreads each row over this many slots, entry e adding
# into slot e % SLOTS of its row, and then sums the slots: `index_add_` straight into 4
# rows took 14.3 ms for 21.1M entries of width 2 on an H100 (every atomic add of a warp
# hitting the same few addresses), the slotted form 0.96 ms.
CONTENDED_ENTRIES_PER_ROW = 4096
SLOTS = 4096
SLOTTED_ELEMENTS = 1 << 24        # at most this many partial sums (64 MB in float32)
SLOTTED_DEVICES = ("cuda",)       # where atomics contend (a CPU index_add_ adds in order)


def contended(entries: int, rows: int) -> bool:
    """Whether a sum of ``entries`` entries into ``rows`` rows puts so many entries on
    each row that atomic adds straight into them would queue on a GPU."""
    return entries > CONTENDED_ENTRIES_PER_ROW * rows


# Sums of these dtypes accumulate in float32 and round once, as ``torch.sum`` and PyG's
# ``scatter`` (on the CPU) do: torch's CPU ``index_add_`` of a 1-D half tensor adds in the
# half type, and a bfloat16 sum of 2,000 scalar messages near 0.6 stopped at 512 (1,224
# in float64; DGL-style ``torch.sum(mailbox, 1)`` gives 1,224), and a GPU's atomic adds
# round each add to the half type whatever the width (the Triton backend's atomic sums
# read it too).
WIDENED_SUMS = (torch.float16, torch.bfloat16)


def reduce_rows(x: torch.Tensor, index: torch.Tensor, rows: int, op: str) -> torch.Tensor:
    if op == "sum" and x.dtype in WIDENED_SUMS:
        return reduce_rows(x.float(), index, rows, op).to(x.dtype)
    out = x.new_zeros((rows,) + tuple(x.shape[1:]))
    if op == "sum":
        if x.device.type in SLOTTED_DEVICES and contended(index.numel(), rows):
            return _slotted_sum(x, index, rows)
        return out.index_add_(0, index, x)
    expanded = index.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    return out.scatter_reduce_(0, expanded, x, reduce={"mean": "mean", "max": "amax", "min": "amin"}[op],
                               include_self=False)


def _slotted_sum(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """``index_add_`` of ``x`` into ``rows`` rows through partial sums per (row, slot)."""
    width = x[0].numel()
    slots = max(1, min(SLOTS, SLOTTED_ELEMENTS // max(1, rows * width)))
    slot = torch.arange(index.numel(), device=index.device) % slots
    partial = x.new_zeros((rows * slots,) + tuple(x.shape[1:])).index_add_(0, index * slots + slot, x)
    return partial.view((rows, slots) + tuple(x.shape[1:])).sum(1)


# Half-precision values a kernel computes in float32: recomputed in the backward they are
# not yet the rounded bits the forward's maximum was stored as, so no edge equalled it and
# every gradient was 0 / 0 = NaN (an EdgeConv or MLP message under max, fp16, on the GPU).
_STORED_AS = {torch.float16: "stored_float16", torch.bfloat16: "stored_bfloat16"}


def _gathered_input(value) -> bool:
    """Whether ``value`` is an input's rows as they are, or gathered per edge."""
    return value.op == "input" or (value.op == "broadcast" and value.inputs[0].op == "input")


def _reduce_derivative(b, v, g):
    by, op = v.attrs["by"], v.attrs["op"]
    if op == "sum":
        return [b.add("broadcast", g, by=by)]
    if op == "mean":
        count = b.add("clamp_min", b.add("degree", by=by, dtype=g.dtype), min=1.0)
        return [b.add("broadcast", b.add("div", g, count), by=by)]
    # max / min: the gradient goes to the arg-extreme edges, split evenly among ties. A
    # NaN result equals no input, so its row has 0 ties and every in-edge gets g / 0 * 0
    # = NaN, as torch's scatter_reduce("amax") backward (PyG's max) gives. Rows without
    # edges also divide by 0, but no edge reads their quotient. The edges' values are the
    # forward's own bits (`fwd_exact`): the hits and their count are compared in two kernels.
    # Where the edges' values are computed (not an input's rows gathered), the extreme
    # they are compared with is taken again from those very values, not read from the
    # forward's saved result: a saved-tensor hook that stores tensors lossily
    # (torch.autograd.graph.saved_tensors_hooks casting them to float32) hands back the
    # saved maximum and the saved input of a recomputed tanh rounded apart, so no edge
    # equalled its row's maximum and every gradient was 0 / 0 = NaN (an EdgeConv under max).
    # Gathered input rows and the saved maximum are rounded alike (a maximum is one of
    # them), so they keep the saved one: a max of features (SAGE) takes no third kernel.
    # (Differentiated again the retaken extreme would be wrong:
    # runtime.compiled._check_second_derivative refuses a backward holding it.)
    x = b.fwd_exact(v.inputs[0])
    if x.dtype in _STORED_AS:       # the forward stored its maximum rounded; compare rounded values
        x = b.add(_STORED_AS[x.dtype], x)
    extreme = b.fwd(v) if _gathered_input(v.inputs[0]) else b.add("reduce", x, op=op, by=by)
    hit = b.add("eq", x, b.add("broadcast", extreme, by=by))
    ties = b.add("reduce", hit, op="sum", by=by)
    return [b.add("mul", b.add("broadcast", b.add("div", g, ties), by=by), hit)]


def _reduce(ctx, x: torch.Tensor, op: str, by: str) -> torch.Tensor:
    """A contended sum (many entries per row: a per-type parameter's gradient) goes to
    the context's ``contended_sum``, a kernel on the Triton backend
    (backend/triton/few_rows_sum.py), `reduce_rows` on the reference backend."""
    index, rows = ctx.index(by), ctx.num_rows(by)
    if op == "sum" and contended(index.numel(), rows):
        return ctx.contended_sum(x, index, rows)
    return reduce_rows(x, index, rows, op)


def contended_sum_reference(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    return reduce_rows(x, index, rows, "sum")


def _reduce_shape(inputs, attrs, residency):
    """The input's shape and dtype; a sum or mean of booleans is refused: torch counts
    them (int64), a dtype-keeping reduction would give their "any" (index_add on bool),
    and the Triton kernels have no boolean atomics. A mean of integers is refused too:
    torch.mean rejects them and PyG's mean divides in floating point, where a
    dtype-keeping mean truncated (2 for the mean of 1, 2 and 4)."""
    if inputs[0].dtype == torch.bool and attrs["op"] in ("sum", "mean"):
        raise ValueError(f"a {attrs['op']} of boolean values is not compiled (torch counts them as int64); "
                         "convert them first, e.g. flag.long()")
    if attrs["op"] == "mean" and not inputs[0].dtype.is_floating_point:
        raise ValueError(f"a mean of {inputs[0].dtype} values is not compiled (torch.mean rejects integer "
                         "tensors, and PyG's mean divides in floating point); pass them in as floats, or use x * 1.0")
    return _same_shape(inputs, attrs, residency)


register(OpDef("reduce", Movement.REDUCE, _reduce,
               residency=_reduce_residency, shape=_reduce_shape, arity=1,
               derivative=_reduce_derivative,
               doc="aggregate edge rows into vertex (or type) rows with sum, mean, max or min",
               # not max or min: torch's scatter_reduce backward (include_self=False) counts the
               # zero its output starts from as one more tie where a row's extreme is 0, and
               # gives each edge holding it half the gradient (or less) where this rule gives all
               autograd_reference=lambda attrs: attrs["op"] in ("sum", "mean")))

# --- norm -----------------------------------------------------------------------------


def edge_softmax(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    peak = reduce_rows(x, index, rows, "max").index_select(0, index)
    e = torch.exp(x - peak)
    return e / reduce_rows(e, index, rows, "sum").index_select(0, index)


def _softmax_residency(rs, attrs):
    if not _is_row_of(rs[0], _check_by(attrs)) or rs[0] not in EDGE_ROWED:
        raise ValueError(f"edge_softmax takes edge data grouped by an edge index, got {rs[0].name} "
                         f"by {attrs['by']}")
    return Residency.EDGE


def _softmax_derivative(b, v, g):
    y = b.fwd(v)
    gy = b.add("mul", g, y)
    total = b.add("broadcast", b.add("reduce", gy, op="sum", by=v.attrs["by"]), by=v.attrs["by"])
    return [b.add("sub", gy, b.add("mul", y, total))]


def _softmax_shape(inputs, attrs, residency):
    """The input's shape and dtype, which must be floating: torch.softmax rejects
    integer tensors (and the traced program claimed an integer result)."""
    if not inputs[0].dtype.is_floating_point:
        raise ValueError(f"a softmax of {inputs[0].dtype} values is not compiled (torch.softmax rejects them); "
                         "pass them in as floats, or use x * 1.0")
    return _same_shape(inputs, attrs, residency)


register(OpDef("edge_softmax", Movement.NORM,
               lambda ctx, x, by: edge_softmax(x, ctx.index(by), ctx.num_rows(by)),
               residency=_softmax_residency, shape=_softmax_shape, arity=1,
               derivative=_softmax_derivative,
               doc="softmax over each destination's in-edges (by='dst')"))


# --- graph-derived values -------------------------------------------------------------
def _degree_residency(rs, attrs):
    if attrs["by"] not in BROADCAST_FROM:
        raise CompileError(f"degree is counted by one of {sorted(BROADCAST_FROM)}, got {attrs['by']!r}")
    return REDUCE_TO[attrs["by"]]


register(OpDef("degree", Movement.REDUCE, lambda ctx, by, dtype: ctx.degree(by).to(dtype),
               residency=_degree_residency, shape=lambda inputs, a, r: ((), a["dtype"]), arity=0,
               doc="how many index entries each row owns: in-degree (by='dst'), out-degree "
                   "(by='src'), edges per type (etype/srctype/dsttype), vertices per type (ntype)",
                   autograd_reference=True))


def _zero_unread_residency(rs, attrs):
    if attrs["by"] not in ("src", "dst") or rs[0] is not Residency.NODE:
        raise ValueError(f"zero_unread_rows takes NODE data by 'src' or 'dst', got {rs[0].name} by {attrs['by']!r}")
    return rs[0]


register(OpDef("zero_unread_rows", Movement.DENSE, lambda ctx, x, by: ctx.zero_unread_rows(x, by),
               residency=_zero_unread_residency, shape=_same_shape, arity=1, bounded_derivative=True,
               derivative=lambda b, v, g: [b.add("zero_unread_rows", g, by=v.attrs["by"])],
               doc="x with the rows a broadcast by `by` never reads zeroed (by index, the ids "
                   "cached per graph); x itself when it reads every row",
               autograd_reference=True))
