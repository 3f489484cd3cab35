"""Pairwise mailbox terms in reduce UDFs: ``m.unsqueeze(1) - m.unsqueeze(2)``.

In DGL a mailbox value ``m`` is [N, D, ...]; ``m.unsqueeze(1)`` ([N, 1, D, ...]) meeting
``m.unsqueeze(2)`` ([N, D, 1, ...]) broadcasts to [N, D, D, ...]: entry ``[v, i, j]``
combines the ``i``-th and ``j``-th in-edge of ``v``. The tracer tells the three shapes
apart by the leading graph dims a value shows (its prefix) and its residency:

* [N, D, 1, ...] is an ordinary mailbox value (prefix 2) whose first feature dim has
  size 1, as ``m.unsqueeze(2)`` always was;
* [N, 1, D, ...] -- ``m.unsqueeze(1)`` -- keeps its edge rows but shows three graph dims
  (prefix 3, edge residency): ops on it alone stay per edge, and a reduction over its
  size-1 axis 1 is the identity, as in torch, and one over axis 2 the mailbox reduction,
  a per-vertex [N, 1, ...] value;
* [N, D, D, ...] lives on the PAIR residency (prefix 3; see ir/ops/pairwise.py): made
  when the first two meet, ``pair_broadcast`` reading each side through the pair's
  edge ``i`` or ``j``; a sum/mean/max/min over dim 1 or 2 is ``pair_reduce`` back to
  one edge per row (``by='j'`` keeps axis 2, ``by='i'`` axis 1).

Any operand whose graph dims do not line up under torch's right-aligned broadcasting
is rejected with the line, never reinterpreted.
"""
from __future__ import annotations

from typing import Sequence

from ..ir import Residency, Value
from .tracer import EDGE_ROWED, SymTensor, Tracer, counts_in_edges, shown

PAIR_PREFIX = 3   # [N, D, D]: the vertex, the pair's edge i, its edge j


def is_pairwise(x: SymTensor) -> bool:
    """[N, 1, D, ...] or [N, D, D, ...]."""
    return x.prefix == PAIR_PREFIX


def pair_view(tracer: Tracer, x: SymTensor) -> SymTensor:
    """``x.unsqueeze(1)`` of a mailbox value: [N, 1, D, ...], still one row per edge."""
    return SymTensor(tracer, x.value, PAIR_PREFIX)


def _node_view(tracer: Tracer, x: SymTensor) -> SymTensor:
    """A per-vertex [N, 1, 1, ...] value (``nodes.data[k].unsqueeze(1).unsqueeze(1)``),
    the same for every pair of its vertex: read onto the vertex's in-edges as an
    [N, 1, D, ...] view. (A mailbox value with two graph dims is always [N, D, ...]: a
    node value meets the mailbox only through a size-1 neighbour axis, see
    message._MessageTracer.apply.)"""
    row = tracer.program.add("reshape", x.value, shape=x.value.shape[2:], source=tracer.source())
    return SymTensor(tracer, SymTensor(tracer, row, 1).broadcast_dst().value, PAIR_PREFIX)


def line_up(tracer: Tracer, operands: Sequence[SymTensor]) -> list[SymTensor]:
    """Operands of one op, at least one pairwise. [N, 1, D, ...] values alone stay per
    edge; once [N, D, 1, ...] or [N, D, D, ...] values join, all are read onto PAIR
    rows. Parameters and constants stay SHARED: they broadcast over feature dims only."""
    rank = max(x.dim() for x in operands)
    sides: list[str | None] = []
    for x in operands:
        residency = x.value.residency
        if residency is Residency.SHARED and x.dim() <= rank - PAIR_PREFIX:
            sides.append(None)
        elif is_pairwise(x) and x.dim() == rank:
            sides.append("pair" if residency is Residency.PAIR else "j")
        elif residency in EDGE_ROWED and x.prefix == 2 and x.dim() == rank and x.value.shape[0] == 1:
            sides.append("i")
        elif residency is Residency.NODE and x.prefix == 1 and (
                counts_in_edges(x.value) or (x.dim() == rank and x.value.shape[:2] == (1, 1))):
            sides.append("node")     # a count of in-edges (x.shape[2]) scales every pair, as DGL's int does
        else:
            raise tracer.error(
                f"a {shown(x)} value ({residency.name}) does not line up with a pairwise "
                f"[N, D, D, ...] term of rank {rank}: its graph dims would broadcast against other "
                "axes; give mailbox values as m.unsqueeze(1) ([N, 1, D, ...]) or m.unsqueeze(2) "
                "([N, D, 1, ...]) of the same rank")
    operands = [_node_view(tracer, x) if side == "node" else x for x, side in zip(operands, sides)]
    sides = ["j" if side == "node" else side for side in sides]
    if not {"i", "pair"} & set(sides):
        return list(operands)
    lined = []
    for x, side in zip(operands, sides):
        if side in ("i", "j"):
            value = _squeezed(tracer, x.value) if side == "i" else x.value
            x = SymTensor(tracer, tracer.program.add("pair_broadcast", value, by=side, source=tracer.source()),
                          PAIR_PREFIX)
        lined.append(x)
    return lined


def _squeezed(tracer: Tracer, value: Value) -> Value:
    """``value`` without its leading size-1 feature dim; the mailbox value itself when that
    dim came from ``m.unsqueeze(2)``, so the pass that sorts hinge sums sees one value
    on both sides of ``m.unsqueeze(1) - m.unsqueeze(2)``."""
    if value.op == "reshape" and value.inputs[0].shape == value.shape[1:]:
        return value.inputs[0]
    return tracer.program.add("reshape", value, shape=value.shape[1:], source=tracer.source())


def _unsqueezed(tracer: Tracer, value: Value) -> SymTensor:
    """A mailbox-level value shown as [N, D, 1, ...] (prefix 2, leading size-1 dim)."""
    return SymTensor(tracer, tracer.program.add("reshape", value, shape=(1,) + value.shape,
                                                source=tracer.source()), 2)


def reduce_pairs(tracer: Tracer, x: SymTensor, op: str, dim, keepdim: bool) -> SymTensor:
    """``op`` over axis 1 or 2 of a pairwise value, with torch's shapes: [N, D, D, ...]
    gives [N, D, ...] (``keepdim``: [N, 1, D, ...] or [N, D, 1, ...]); [N, 1, D, ...]
    over its size-1 axis 1 is itself, over axis 2 the per-vertex [N, 1, ...]."""
    axis = dim[0] if isinstance(dim, (tuple, list)) and len(dim) == 1 else dim
    axis = axis + x.dim() if isinstance(axis, int) and axis < 0 else axis
    if axis not in (1, 2):
        raise tracer.error(f"a pairwise [N, D, D, ...] term reduces over dim 1 or 2 (one neighbour "
                           f"axis at a time), got dim={dim}")
    if x.value.residency is not Residency.PAIR:          # [N, 1, D, ...]
        if axis == 2:   # the mailbox reduction, shown as [N, 1, ...] (or [N, 1, 1, ...])
            total = tracer.reduce(SymTensor(tracer, x.value, 2), op, 1)
            return tracer.apply("reshape", total, shape=(1,) * (1 + keepdim) + total.value.shape)
        return x if keepdim else SymTensor(tracer, x.value, 2)
    kept = "j" if axis == 1 else "i"
    value = tracer.program.add("pair_reduce", x.value, op=op, by=kept, source=tracer.source())
    if not keepdim:
        return SymTensor(tracer, value, 2)
    return SymTensor(tracer, value, PAIR_PREFIX) if kept == "j" else _unsqueezed(tracer, value)
