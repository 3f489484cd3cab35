"""R-GCN's self-connection folded into its typed aggregation (``typed_aggregate_rooted``).

R-GCN adds each vertex's own row times a root matrix and a bias to the relation sum:

    out = typed_aggregate(x, W, ...) + x_root @ W_root (+ b)

Written so, the root term is a GEMM writing an [N, out] table, and each addition another
pass over [N, out] -- on the ogbn-mag-sized graph (16 -> 349) 3.2 ms for the GEMM and 2.7
ms for the addition of a 34 ms training step. Schlichtkrull et al. treat the
self-connection as one more relation, and in the dense order (ir/ops/typed_aggregate.py:
the [N, relations x in] table of per-relation sums, then one GEMM) it is exactly that:
one more block of ``in`` columns in the table (the vertex's own row) and of rows in the
stacked weights, with the bias as the GEMM's epilogue -- no [N, out] intermediate at
all. In the pair orders the op adds the root term into the sum's output in place.

The pass rewrites ``add(typed_aggregate, matmul(x_root, W_root))``, in either operand
order and optionally followed by ``add(., bias)``, where

- the matmul's right operand is a parameter matrix and its left a vertex table of row
  vectors (``x_root @ W_root`` row by row, what ``matmul`` computes),
- the bias is a parameter vector of the output's width,
- everything has the sum's dtype, and the sum and the matmul (and the first addition,
  when the bias folds) feed nothing else: otherwise they are computed anyway.

The gradients are the ones of the three terms apart (``_rooted_derivative``).
"""
from __future__ import annotations

from ..ir import Program, Residency, Value


def fold_typed_root(program: Program) -> Program:
    """Rewrite each typed sum plus a root term (plus a bias) into ``typed_aggregate_rooted``."""
    for v in list(program.values):
        if v.op != "add":
            continue
        match = _root_term(program, v)
        if match is None:
            continue
        typed, x_root, w_root = match
        bias, target = _bias(program, v)
        rooted = program.add("typed_aggregate_rooted", x_root, w_root, *([bias] if bias is not None else []),
                             *typed.inputs, source=v.source, by=typed.attrs["by"], scaled=typed.attrs["scaled"],
                             biased=bias is not None)
        program.replace_uses(target, rooted)
    return program


def _only_feeds(program: Program, value: Value, user: Value) -> bool:
    """``value`` is used by ``user`` alone and is no program output."""
    return ([u.id for u in program.users()[value.id]] == [user.id]
            and value.id not in {o.id for o in program.outputs.values()})


def _root_term(program: Program, add: Value) -> tuple[Value, Value, Value] | None:
    """``(typed_aggregate, x_root, W_root)`` if ``add`` sums a typed aggregation and a
    root term that may fold into it, else None."""
    if len(add.inputs) != 2:
        return None
    for typed, product in (add.inputs, add.inputs[::-1]):
        if typed.op != "typed_aggregate" or product.op != "matmul" or typed is product:
            continue
        x_root, w_root = product.inputs
        if (x_root.residency is Residency.NODE and len(x_root.shape) == 1
                and w_root.residency is Residency.SHARED and len(w_root.shape) == 2
                and product.shape == typed.shape == add.shape
                and x_root.dtype == w_root.dtype == typed.dtype == add.dtype
                and _only_feeds(program, typed, add) and _only_feeds(program, product, add)):
            return typed, x_root, w_root
    return None


def _bias(program: Program, add: Value) -> tuple[Value | None, Value]:
    """``(bias, the value the rooted sum replaces)``: the next addition's parameter
    vector and that addition when one follows ``add`` alone, else ``(None, add)``."""
    users = program.users()[add.id]
    if len(users) != 1 or not _only_feeds(program, add, users[0]):
        return None, add
    after = users[0]
    if after.op != "add" or len(after.inputs) != 2:
        return None, add
    bias = after.inputs[1] if after.inputs[0] is add else after.inputs[0]
    if (bias is add or bias.residency is not Residency.SHARED or bias.shape != add.shape
            or bias.dtype != add.dtype or after.shape != add.shape or after.dtype != add.dtype):
        return None, add
    return bias, after
