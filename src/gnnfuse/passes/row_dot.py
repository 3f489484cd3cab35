"""Per-row dot products over feature dims as one op (``row_dot``).

The backward of a softmax-normalized sum ``out = sum_e (p_e / T) m_e`` needs, per vertex
and head, ``<grad_out, out>`` over the channels. Autodiff writes it as the product of the
two vertex tables followed by ``sum_to`` over the channel dim: two torch kernels, the
first writing an [N, heads, channels] table that the second reads back. On the arxiv-sized
GAT step (H200) these pairs were about a tenth of its non-fused work. ``row_dot`` does the
multiply and the sum in one pass (a Triton kernel on the GPU, ``backend/triton/row_dot.py``;
torch's two ops elsewhere), writing only the [N, heads, 1] result.

The rewrite takes ``sum_to(mul(x, y))`` where ``x`` and ``y`` are tables of the same rows
(vertex rows) with one shape and dtype, the product feeds nothing else, and the
sum keeps the rows and reduces feature dims only (a parameter-shaped sum over rows is a
shared-reduce unit's work, and an edge-rowed one an edge unit's: fusion fuses those).
"""
from __future__ import annotations

from ..ir import Program, Residency, Value

ROWED = (Residency.NODE, Residency.SRC, Residency.DST)


def fuse_row_dots(program: Program) -> Program:
    """Rewrite each per-row ``sum_to(mul(x, y))`` over feature dims into ``row_dot``."""
    users = program.users()
    outputs = {v.id for v in program.outputs.values()}
    for v in list(program.values):
        dims = _summed_dims(v)
        if dims is None:
            continue
        product = v.inputs[0]
        if len(users[product.id]) != 1 or product.id in outputs:
            continue
        dot = program.add("row_dot", *product.inputs, source=v.source, dims=dims)
        program.replace_uses(v, dot)
    return program


def _summed_dims(v: Value) -> tuple[int, ...] | None:
    """The feature dims (negative) ``v`` sums if it is a per-row ``sum_to`` of a product
    of two like tables that keeps every other dim, else None."""
    if v.op != "sum_to" or v.attrs.get("residency") not in ROWED or v.residency not in ROWED:
        return None
    product = v.inputs[0]
    if product.op != "mul" or len(product.inputs) != 2:
        return None
    x, y = product.inputs
    if not (x.residency is y.residency is product.residency is v.residency
            and x.shape == y.shape == product.shape and x.dtype == y.dtype == product.dtype
            and x.dtype.is_floating_point):
        return None
    rank = len(product.shape)
    target = tuple(v.attrs["shape"])
    if len(target) != rank:
        return None
    dims = tuple(i - rank for i, (n, t) in enumerate(zip(product.shape, target)) if n != t)
    if not dims or any(target[d] != 1 for d in dims):
        return None
    return dims
