"""Distribute a matrix product over a sum or difference of two endpoints' rows.

FeaStConv scores each edge by ``(x_j - x_i) @ U``: the difference is an [E, F] table of
gathered rows, written once for the product to read (on the Reddit2-sized graph, 602
features over 23.2M edges: 56 GB, and the layer ran out of the H200's memory). As
``(x_j - x_i) @ U = x_j @ U - x_i @ U``, each product has one endpoint's rows, and
`reorder_broadcasts` then moves it above its gather (Graphiler's broadcast reordering,
§4.3.1): two [N, H] products instead of an [E, F] table and an [E, F] x [F, H] one.

The rewrite takes ``matmul(add|sub(a, b), W)`` where ``a`` and ``b`` gather the rows of
different endpoints (a source and a destination broadcast; rows gathered by one endpoint
move without it), both of the sum's shape and dtype, ``W`` is a parameter matrix, and
the sum feeds nothing else and is not returned (else it would be formed anyway and each
product would only add work). Run before `reorder_broadcasts`.

The two forms round differently: ``x_j @ U - x_i @ U`` cancels where the rows are close
(a self loop gives exactly 0 in both, its two products being one per-vertex row); this
is the linear-operator reordering that Seastar and Graphiler apply, and the gradients
are each form's exact derivative.
"""
from __future__ import annotations

from ..ir import Program, Value
from .narrow_products import weight_matrix


def distribute_products(program: Program) -> Program:
    """Rewrite each product of a two-endpoint sum that `_endpoint_sum` accepts."""
    users = program.live_users()
    outputs = {v.id for v in program.outputs.values()}
    for v in list(program.values):
        if v.op != "matmul" or not weight_matrix(v.inputs[1]):
            continue
        total, w = v.inputs
        if len(users.get(total.id, ())) != 1 or total.id in outputs or not _endpoint_sum(total):
            continue
        a, b = total.inputs
        split = program.add(total.op, program.add("matmul", a, w, source=v.source),
                            program.add("matmul", b, w, source=v.source), source=v.source)
        program.replace_uses(v, split)
    return program


def _endpoint_sum(total: Value) -> bool:
    """``total`` adds or subtracts rows gathered from two different endpoints, like-shaped."""
    if total.op not in ("add", "sub") or len(total.inputs) != 2:
        return False
    a, b = total.inputs
    return (a.op == b.op == "broadcast" and {a.attrs["by"], b.attrs["by"]} == {"src", "dst"}
            and a.shape == b.shape == total.shape and a.dtype == b.dtype == total.dtype
            and total.dtype.is_floating_point)
