"""Split a matrix product of a concatenation into one product per part.

CGConv (and any MLP over ``cat([x_i, x_j, e])``) multiplies each edge's concatenated row
by a weight: ``cat([x_i, x_j, e]) @ W``. The concatenation is an [E, 2F + D] table of
gathered rows, written for the product to read -- on the Reddit2-sized graph (602
features, 23.2M edges) 112 GB, and the layer ran out of the H200's memory. As
``cat([a, b, c]) @ W = a @ W[:Fa] + b @ W[Fa:Fa + Fb] + c @ W[Fa + Fb:]``, each product
reads one part; `reorder_broadcasts` then moves the products of gathered endpoint rows
above their gathers (two [N, H] products), and what is left per edge is the narrow
edge-feature product and the sum, which the fused kernel evaluates.

The rewrite takes a last-dim ``concat`` with at least one part gathered from an endpoint
(a broadcast: else no product moves and the split only adds work), every use of which
is a ``matmul`` by a parameter matrix, and which is not returned (else the table is
written anyway). Run before `distribute_products` (a part ``x_j - x_i``, EdgeConv's, is
then distributed too) and `reorder_broadcasts`. The two forms differ only in the order
of the sum's terms (rounding); each form's gradient is its exact derivative.
"""
from __future__ import annotations

from ..ir import Program, Value
from .narrow_products import weight_matrix


def split_concat_products(program: Program) -> Program:
    """Rewrite the products of each concatenation that `_splittable` accepts."""
    users = program.live_users()
    returned = {v.id for v in program.outputs.values()}
    for v in list(program.values):
        uses = users.get(v.id, ())
        if v.id in returned or not uses or not _splittable(v):
            continue
        if not all(u.op == "matmul" and u.inputs[0] is v and weight_matrix(u.inputs[1]) for u in uses):
            continue
        for product in uses:
            weight, start, total = product.inputs[1], 0, None
            for part in v.inputs:
                width = part.shape[-1]
                rows = program.add("narrow", weight, dim=0, start=start, length=width)
                term = program.add("matmul", part, rows, source=product.source)
                total = term if total is None else program.add("add", total, term, source=product.source)
                start += width
            program.replace_uses(product, total)
    return program


def _splittable(concat: Value) -> bool:
    """A concatenation along the last dim of like-dtyped floating parts of rank 1 per row,
    one of them rows gathered from an endpoint."""
    if concat.op != "concat" or concat.attrs["dim"] not in (-1, len(concat.shape) - 1) or len(concat.shape) != 1:
        return False
    parts = concat.inputs
    return (len(parts) > 1 and any(p.op == "broadcast" for p in parts)
            and all(len(p.shape) == 1 and p.dtype == concat.dtype for p in parts)
            and concat.dtype.is_floating_point)
