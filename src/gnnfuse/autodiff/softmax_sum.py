"""The gradient of a softmax-weighted neighbour sum without an edge pass for the
softmax's normalizer (flash attention's ``rowsum(dO * O)``).

For ``out_v = sum_e y_e * r_e`` with ``y_e = p_e / S_v`` and ``S_v = sum_e p_e`` (both
sums over the same group of edges -- a destination's in-edges -- per head), the gradient
reaching ``p`` is ``(g_e - c_v) / S_v`` with ``c_v = sum_e y_e * g_e``. Differentiated
op by op, ``c_v`` is a reduction of ``-g_e * p_e / S_v**2`` over every in-edge: one more
fused pass over the edges that gathers every ``r_e`` again to form ``g_e``. But
``g_e = <G_v, r_e>`` (the output's gradient dotted with the edge's row over the head's
feature lanes), so ``c_v = <G_v, sum_e y_e r_e> = <G_v, out_v>``: a per-vertex product
of two vertex rows. On the products-sized GAT that pass was 8-10 ms per layer of a
146 ms step (H100). The price is keeping ``out`` (vertex-sized) for the backward.

The rewrite applies only where the identity is exact: ``y`` is read by nothing but the
weighting (through reshapes), the weighted product by nothing but the sum, and the
normalizer ``S`` by nothing but ``y``'s denominator.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Program, Residency, Value


@dataclass(frozen=True)
class SoftmaxWeightedSum:
    weights: Value      # y = div(p, broadcast(S, by))
    weighting: Value    # the reshape of y (or y itself) that multiplies the rows
    total: Value        # out = reduce(mul(weighting, rows), op="sum", by)

    def gradient(self, builder, g_weights: Value, g_total: Value) -> list[Value | None]:
        """Gradients of ``y``'s inputs (p, broadcast(S)) given ``y``'s own gradient and
        the gradient of ``out``: all of it goes to ``p``, the normalizer's share folded
        in through ``c_v = <G_v, out_v>``."""
        y, by = self.weights, self.total.attrs["by"]
        dot = builder.add("sum_to", builder.add("mul", g_total, builder.fwd(self.total)),
                          shape=self.weighting.shape, residency=Residency.NODE)
        if dot.shape != y.shape:
            dot = builder.add("reshape", dot, shape=y.shape)
        shifted = builder.add("sub", g_weights, builder.add("broadcast", dot, by=by))
        return [builder.add("div", shifted, builder.fwd(y.inputs[1])), None]


def find_softmax_weighted_sums(program: Program) -> dict[int, SoftmaxWeightedSum]:
    """The softmax-weighted sums of ``program`` the identity holds for, by the id of
    their weights ``y``."""
    users = program.users()
    outputs = {v.id for v in program.outputs.values()}

    def sole_user(value: Value) -> Value | None:
        found = users[value.id]
        return found[0] if len(found) == 1 and value.id not in outputs else None

    matches = {}
    for y in program.values:
        if y.op != "div" or y.inputs[1].op != "broadcast":
            continue
        p, spread = y.inputs
        by, total_of_p = spread.attrs["by"], spread.inputs[0]
        if not (total_of_p.op == "reduce" and total_of_p.attrs.get("op") == "sum" and
                total_of_p.attrs.get("by") == by and total_of_p.inputs[0] is p and
                sole_user(total_of_p) is spread and sole_user(spread) is y):
            continue
        weighting = y
        while (nxt := sole_user(weighting)) is not None and nxt.op == "reshape":
            weighting = nxt
        product = sole_user(weighting)
        if product is None or product.op != "mul" or weighting not in product.inputs or \
                product.inputs[0] is product.inputs[1]:
            continue
        out = sole_user(product)
        if out is None or out.op != "reduce" or out.attrs.get("op") != "sum" or out.attrs.get("by") != by \
                or out.shape != product.shape:
            continue
        matches[y.id] = SoftmaxWeightedSum(y, weighting, out)
    return matches
