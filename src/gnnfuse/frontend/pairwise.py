"""Pairwise mailbox terms in reduce UDFs: ``m.unsqueeze(1) - m.unsqueeze(2)``.

In DGL a mailbox value ``m`` is [N, D, ...]; ``m.unsqueeze(1)`` ([N, 1, D, ...]) meeting
``m.unsqueeze(2)`` ([N, D, 1, ...]) broadcasts to [N, D, D, ...]: entry ``[v, i, j]``
combines the ``i``-th and ``j``-th in-edge of ``v``. Traced, such values live on the
PAIR residency (see ir/ops/pairwise.py) and carry three leading graph dims (prefix 3):

* ``m.unsqueeze(1)`` is ``pair_broadcast(m, by='j')`` right away (its edge runs along
  axis 2), so unary ops and feature-dim ops on it stay pairwise;
* ``m.unsqueeze(2)`` is a mailbox value whose first feature dim has size 1; when it
  meets a pairwise value, that dim is the broadcast axis 2 and it becomes
  ``pair_broadcast(m, by='i')``;
* a sum/mean/max/min over dim 1 or 2 of a pairwise value is ``pair_reduce`` back to a
  mailbox value (``by='j'`` keeps axis 2, ``by='i'`` keeps axis 1).

Any operand whose graph dims do not line up with [N, D, D] under torch's right-aligned
broadcasting is rejected with the line, never reinterpreted.
"""
from __future__ import annotations

from typing import Sequence

from ..ir import Residency
from .tracer import EDGE_ROWED, SymTensor, Tracer

PAIR_PREFIX = 3   # [N, D, D]: the vertex, the pair's edge i, its edge j


def is_pairwise(x: SymTensor) -> bool:
    return x.value.residency is Residency.PAIR


def pair_view(tracer: Tracer, x: SymTensor) -> SymTensor:
    """``x.unsqueeze(1)`` of a mailbox value: [N, 1, D, ...], varying along axis 2."""
    value = tracer.program.add("pair_broadcast", x.value, by="j", source=tracer.source())
    return SymTensor(tracer, value, PAIR_PREFIX)


def line_up(tracer: Tracer, operands: Sequence[SymTensor]) -> list[SymTensor]:
    """Operands of one op, at least one pairwise, all brought onto PAIR rows (parameters
    and constants stay SHARED: they broadcast over feature dims only)."""
    rank = max(x.dim() for x in operands)
    lined = []
    for x in operands:
        residency = x.value.residency
        if (residency is Residency.SHARED and x.dim() <= rank - PAIR_PREFIX) or (
                is_pairwise(x) and x.dim() == rank):
            lined.append(x)
        elif residency in EDGE_ROWED and x.prefix == 2 and x.dim() == rank and x.value.shape[0] == 1:
            # [N, D, 1, ...]: the size-1 dim broadcasts along the pair's edge j.
            lined.append(SymTensor(tracer, tracer.program.add("pair_broadcast", _squeezed(tracer, x.value),
                                                              by="i", source=tracer.source()), PAIR_PREFIX))
        else:
            raise tracer.error(
                f"a {list(x.shape)} value ({residency.name}) does not line up with a pairwise "
                f"[N, D, D, ...] term of rank {rank}: its graph dims would broadcast against other "
                "axes; give mailbox values as m.unsqueeze(1) ([N, 1, D, ...]) or m.unsqueeze(2) "
                "([N, D, 1, ...]) of the same rank")
    return lined


def _squeezed(tracer: Tracer, value):
    """``value`` without its leading size-1 feature dim; the mailbox value itself when that
    dim came from ``m.unsqueeze(2)``, so the pass that sorts hinge sums sees one value
    on both sides of ``m.unsqueeze(1) - m.unsqueeze(2)``."""
    if value.op == "reshape" and value.inputs[0].shape == value.shape[1:]:
        return value.inputs[0]
    return tracer.program.add("reshape", value, shape=value.shape[1:], source=tracer.source())


def reduce_pairs(tracer: Tracer, x: SymTensor, op: str, dim, keepdim: bool) -> SymTensor:
    """``op`` over axis 1 or 2 of a pairwise value: back to a mailbox value [N, D, ...]
    (with ``keepdim``, the pairwise [N, 1, D, ...] or [N, D, 1, ...] view of it)."""
    axis = dim + x.dim() if isinstance(dim, int) and dim < 0 else dim
    if axis not in (1, 2):
        raise tracer.error(f"a pairwise [N, D, D, ...] term reduces over dim 1 or 2 (one neighbour "
                           f"axis at a time), got dim={dim}")
    kept = "j" if axis == 1 else "i"
    value = tracer.program.add("pair_reduce", x.value, op=op, by=kept, source=tracer.source())
    if keepdim:
        value = tracer.program.add("pair_broadcast", value, by=kept, source=tracer.source())
        return SymTensor(tracer, value, PAIR_PREFIX)
    return SymTensor(tracer, value, 2)
