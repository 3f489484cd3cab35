"""Take column slices of a matrix product from the weight, not from the product.

The gradient of ``concat([x_i, x_j, e]) @ W`` (CGConv's two ``Linear``s, any MLP over a
concatenation of endpoint rows) is ``g @ W^T``, an [E, 264] table that autodiff then
slices (``narrow``) into the parts' gradients, each summed onto its vertices. A kernel
reads its rows packed, so each [E, 128] slice of the 264-wide rows was copied before its
sum, and the edge features' part was computed for a gradient nobody asked for.
``narrow(x @ W) = x @ narrow(W)`` (and a slice of a sum is the sum of the slices) gives
each part its own packed [E, 128] product and leaves the unread part to dead-code
elimination.

The rewrite takes ``narrow`` along the last dim of a ``matmul`` by a parameter matrix
(SHARED, two dims: the product of a vector has no columns to slice)
or of an ``add`` of two like-shaped tables, when every use of that product or sum is
such a slice and it is not returned: nothing then computes a column twice.
"""
from __future__ import annotations

from ..ir import Program, Residency, Value


def narrow_products(program: Program) -> Program:
    """Move each last-dim ``narrow`` of a product or sum onto its operands (see above)."""
    while (step := _next_rewrite(program)) is not None:
        v, source = step
        start, length = v.attrs["start"], v.attrs["length"]
        if source.op == "matmul":
            x, w = source.inputs
            narrowed = program.add("matmul", x, program.add("narrow", w, dim=-1, start=start, length=length),
                                   source=v.source)
        else:
            narrowed = program.add("add", *(program.add("narrow", i, dim=-1, start=start, length=length)
                                            for i in source.inputs), source=v.source)
        program.replace_uses(v, narrowed)
    return program


def _next_rewrite(program: Program) -> tuple[Value, Value] | None:
    users = program.live_users()
    returned = {v.id for v in program.outputs.values()}
    for v in program.values:
        if v.id not in users or not _last_dim_slice(v):
            continue
        source = v.inputs[0]
        if source.id in returned or not all(_last_dim_slice(u) for u in users[source.id]):
            continue
        if source.op == "matmul" and weight_matrix(source.inputs[1]):
            return v, source
        if (source.op == "add" and len(source.inputs) == 2
                and all(i.shape == source.shape and i.residency is source.residency for i in source.inputs)):
            return v, source
    return None


def weight_matrix(w: Value) -> bool:
    """A parameter matrix (SHARED, two dims): the product of a vector has no columns."""
    return w.residency is Residency.SHARED and len(w.shape) == 2


def _last_dim_slice(v: Value) -> bool:
    return v.op == "narrow" and v.attrs["dim"] == -1
