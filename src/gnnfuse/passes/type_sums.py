"""Sums of per-edge work by edge type, fused into a walk over the graph.

A per-type parameter used on edges -- HGT's relation prior ``p_rel``, any ``e.type.p``
-- gets as gradient a sum over every edge of per-edge work, grouped by the edge's
type: ``reduce(ds * score, op='sum', by='etype')``. Planned like any other reduce it
was an edge unit writing that per-edge value (|E| x heads) and a second pass summing it
into a few rows. On the ogbn-mag-sized HGT step (21.1M edges) the edge unit alone was
4.3 of its 35.6 ms on an H200, and it gathers the same rows and recomputes the same
scores as the backward's aggregations walking the graph beside it.

A `TypeSumUnit` is that sum with its per-edge work (the body of an `EdgeUnit` for its
operand, which is also how it runs on its own). `passes/siblings.py` lets it ride a
group walking the source or destination CSR: the walk visits every edge exactly once,
so each program adds its edges' values into a [types, width] tile in registers (an
edge reaches its type's row by comparison with every type id, as
`backend/triton/few_rows_sum.py` does) and stores that tile; a sum over programs
finishes. No per-edge tensor and no atomics.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir import Residency, Value

if TYPE_CHECKING:
    from .fusion import EdgeUnit

TYPE_INDEX = "etype"
# Types x width (each padded to a power of two) a walk keeps per edge lane as one rider's
# accumulator in registers, [BLOCK_E, types, width]; a wider sum runs on its own (its
# edge unit, then the sum). The walk's edge block is cut to fit it (codegen `_fit_tiles`).
MAX_RIDER_TILE = 32


@dataclass(eq=False)
class TypeSumUnit:
    """``reduce`` (a sum by edge type) with its operand's per-edge work ``edge``."""
    reduce: Value
    edge: "EdgeUnit"

    @property
    def root(self) -> Value:
        return self.reduce

    @property
    def operand(self) -> Value:
        return self.edge.root

    @property
    def body(self) -> list[Value]:
        return [*self.edge.body, self.edge.root]

    @property
    def leaves(self) -> list[Value]:
        return self.edge.leaves

    @property
    def width(self) -> int:
        return math.prod(self.reduce.shape)

    def describe(self) -> str:
        return (f"unit reduce[sum by {TYPE_INDEX} -> {self.reduce.residency.name}{list(self.reduce.shape)}] "
                f"of {self.edge.describe()}")


def type_summed(v: Value, users: dict[int, int]) -> Value | None:
    """The per-edge operand of ``v`` when ``v`` is a float sum of it by edge type that
    nothing else reads (so the operand need never reach memory), else None."""
    if v.op != "reduce" or v.attrs["op"] != "sum" or v.attrs["by"] != TYPE_INDEX:
        return None
    x = v.inputs[0]
    if x.residency is not Residency.EDGE or not x.dtype.is_floating_point or users.get(x.id) != 1:
        return None
    return x


def rider_fits(unit: TypeSumUnit, num_types: int) -> bool:
    """Whether a walk can keep ``unit``'s [types, width] accumulator in registers."""
    pad = 1 << max(num_types - 1, 0).bit_length()
    return num_types > 0 and pad * (1 << max(unit.width - 1, 0).bit_length()) <= MAX_RIDER_TILE
