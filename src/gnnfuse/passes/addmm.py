"""Fold an add into the matrix product before it (``addmm``).

``x @ W + b`` traced from a ``Linear`` is two ops. Where the product is a torch op
(cuBLAS) -- anything but the narrow edge-feature products a kernel evaluates in
registers (`passes.fusion.edge_feature_matmul`) -- the add then runs as its own pass
over the product's rows: on NNConv's edge network, ``Linear(32, in x out)`` over the
arxiv-sized graph's 1.17M edges, it wrote a second [E, 1024] table (4.8 GB) and the
backward, which recomputed the sum from the saved product, a third. ``addmm`` adds
``b`` in the GEMM's epilogue and writes one table, as torch's own ``Linear`` does.
The same holds for a sum of two products, ``x @ W1 + y @ W2`` (the gradient of a
concatenation's two ``Linear``s, CGConv's backward): the second GEMM accumulates onto
the first's result, and the sum's third [E, 264] table is never written.

The rewrite takes ``add(matmul(x, W), c)`` where ``x`` has rows, ``W`` is a parameter
matrix (SHARED, two dims: a vector's product has no column to add onto), ``c`` is a
parameter row of the product's width or a table of the product's rows and shape, all of
one floating dtype, and the product feeds nothing else.
"""
from __future__ import annotations

from ..ir import Program, Residency, Value
from .fusion import edge_feature_matmul
from .narrow_products import weight_matrix


def fold_product_adds(program: Program) -> Program:
    """Rewrite each ``matmul(x, W) + c`` that `_product_add` accepts into ``addmm``."""
    users = program.live_users()     # a gather moved above (`reorder_broadcasts`) leaves a dead user
    outputs = {v.id for v in program.outputs.values()}
    for v in list(program.values):
        parts = _product_add(v)
        if parts is None:
            continue
        product, addend = parts
        if len(users.get(product.id, ())) != 1 or product.id in outputs:
            continue
        fused = program.add("addmm", *product.inputs, addend, source=v.source)
        program.replace_uses(v, fused)
    return program


def _product_add(v: Value) -> tuple[Value, Value] | None:
    """(product, addend) if ``v`` adds a parameter row or a like table to a cuBLAS
    matrix product, else None."""
    if v.op != "add" or len(v.inputs) != 2:
        return None
    for product, addend in (v.inputs, v.inputs[::-1]):
        if product.op != "matmul" or edge_feature_matmul(product):
            continue
        x, w = product.inputs
        bias_row = addend.residency is Residency.SHARED and addend.shape == (w.shape[-1],)
        like_table = addend.residency is product.residency and addend.shape == product.shape
        if (x.residency is not Residency.SHARED and weight_matrix(w)
                and addend.op != "const"
                and (bias_row or like_table) and product.shape == v.shape
                and x.dtype == w.dtype == addend.dtype == v.dtype and v.dtype.is_floating_point):
            return product, addend
    return None
