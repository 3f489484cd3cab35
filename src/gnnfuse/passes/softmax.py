"""Edge softmax as plain reductions, so fusion can keep its scores out of memory.

``edge_softmax(x)`` becomes ``p / sum(p)`` with ``p = exp(x - max(x))``, the max and the
sum taken over each destination's in-edges. Each step is an ordinary Reduce or
elementwise op, so the fusion pass puts the score computation into every kernel that
needs it -- the max pass, the sum pass and the weighted aggregation -- and no |E|-sized
score or attention tensor is ever written (the online-softmax idea of flash attention,
by recomputation instead of a running rescale). The max is only a shift for numerical
safety: the softmax does not depend on it, so it sits behind ``stop_gradient`` and
autodiff differentiates ``p / sum(p)`` alone, which is exact.
"""
from __future__ import annotations

from ..ir import Program


def decompose_edge_softmax(program: Program) -> Program:
    """Rewrite every ``edge_softmax`` into max-reduce, exp, sum-reduce and divide."""
    for v in [v for v in program.values if v.op == "edge_softmax"]:
        x, by, src = v.inputs[0], v.attrs["by"], v.source
        peak = program.add("stop_gradient", program.add("reduce", x, op="max", by=by, source=src), source=src)
        p = program.add("exp", program.add("sub", x, program.add("broadcast", peak, by=by, source=src),
                                           source=src), source=src)
        total = program.add("reduce", p, op="sum", by=by, source=src)
        y = program.add("div", p, program.add("broadcast", total, by=by, source=src), source=src)
        program.replace_uses(v, y)
    return program
