"""Values of a program computed from the graph alone, kept per graph across runs.

A mean aggregation divides by ``clamp_min(degree, 1)``; the degree itself is kept by the
graph (`Graph.in_degrees`), but the clamp ran again on every run of the program. A model
runs every layer on the same graph, and a graph-classification step on a new batch of
small graphs is bound by the host's time per op dispatched (a CUDA launch each): a
4-layer GraphSAGE clamped the same degrees four times a step. So a step whose value
depends only on the graph -- a ``degree`` op, or an elementwise op of such values and
constants -- is run once per graph and kept in the graph's cache under the value's
recipe (op, attributes, dtype, shape and those of its operands, recursively), which
every program run on that graph shares.

Not kept: a program output (its caller may write to it); an op whose result the
executor may later overwrite in place or write over an operand with
(`overwrite.FRESH`, `overwrite.OVERWRITING`); an impure op (random masks); on anything
but a `Graph` (a torch.compile trace's graph reference has no cache); and on a graph
padded to fixed capacities (`graph.fixed_shape`): a captured step's batch graph, whose
edges its owner rewrites between replays, so a value kept from the first batch would be
reused by the next (the captured steps' audit finds a key the step added and runs the
step eagerly instead).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ...graph import Graph
from ...graph.fixed_shape import is_padded
from ...ir import Residency, Value
from ...ir.registry import OpDef, get_op
from .overwrite import FRESH, OVERWRITING


class PerGraph:
    """An op whose value is kept per graph under ``key``: the executor calls its `run`
    in place of the op's own."""
    __slots__ = ("op", "key")

    def __init__(self, op: OpDef, key: str) -> None:
        self.op, self.key = op, key

    def run(self, ctx: Any, tensors: Sequence[torch.Tensor], residencies: Sequence[Residency],
            attrs: dict) -> torch.Tensor:
        graph = ctx.graph
        if not isinstance(graph, Graph) or is_padded(graph):
            return self.op.run(ctx, tensors, residencies, attrs)
        return graph.cached(self.key, lambda g: self.op.run(ctx, tensors, residencies, attrs))


def per_graph_ops(plan: Sequence, outputs: set[int]) -> dict[int, PerGraph]:
    """By value id, the steps of ``plan`` (in order) whose value depends on the graph
    alone and may be kept per graph (module doc), with their keys; a constant is such a
    value but not worth a step of its own."""
    recipes: dict[int, tuple] = {}
    found: dict[int, PerGraph] = {}
    for item in plan:
        if not isinstance(item, Value):
            continue
        op = get_op(item.op)
        if item.op == "const":
            recipes[item.id] = ("const", repr(item.attrs.get("value")), str(item.dtype))
            continue
        if not (item.op == "degree" or (op.elementwise and op.pure and item.inputs
                                       and all(i.id in recipes for i in item.inputs))):
            continue
        recipes[item.id] = (item.op, repr(sorted((k, v) for k, v in item.attrs.items() if k != "source")),
                            str(item.dtype), tuple(item.shape), item.residency.name,
                            tuple(recipes[i.id] for i in item.inputs))
        if item.id not in outputs and item.op not in FRESH and item.op not in OVERWRITING:
            found[item.id] = PerGraph(op, f"reference_per_graph:{recipes[item.id]!r}")
    return found
