"""Index arithmetic shared by the code generators (Triton and CPU): how a value's
per-element shape maps to coordinates.

Generated kernels evaluate values at *coordinates*: one output element's index in every
value's per-element shape, broadcast right-aligned, as symbolic expressions (strings)
the generator splices into the kernel. Both backends evaluate the same fused units, so
the mapping lives here once.
"""
from __future__ import annotations

import math

from ..ir import Value


def strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major element strides of ``shape``."""
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def project(coords: tuple[str, ...], shape: tuple[int, ...], in_shape: tuple[int, ...]) -> tuple[str, ...]:
    """Coordinates in an operand of shape ``in_shape`` broadcast (right-aligned) to ``shape``."""
    k = len(shape) - len(in_shape)
    return tuple("0" if n == 1 else coords[d + k] for d, n in enumerate(in_shape))


def summed_coords(root: Value, coords: tuple[str, ...]) -> list[tuple[str, ...]]:
    """For a feature-dim sum ``root``, the input coordinates of every term that adds
    into the output element at ``coords``, as literal indices (the sum is unrolled)."""
    in_shape = root.inputs[0].shape
    if root.op == "sum_dim":
        dims = sorted(d % len(in_shape) for d in root.attrs["dim"])
        if root.attrs["keepdim"]:
            fixed = {d: c for d, c in enumerate(coords) if d not in dims}
        else:
            rest = iter(coords)
            fixed = {d: next(rest) for d in range(len(in_shape)) if d not in dims}
    else:   # sum_to: leading extra dims and size-1 target dims are summed
        extra = len(in_shape) - len(root.shape)
        fixed = {extra + i: c for i, (c, n) in enumerate(zip(coords, root.shape))
                 if not (n == 1 and in_shape[extra + i] != 1)}
    summed = [d for d in range(len(in_shape)) if d not in fixed]
    terms = []
    for flat in range(math.prod(in_shape[d] for d in summed)):
        picked, rem = {}, flat
        for d in reversed(summed):
            picked[d], rem = str(rem % in_shape[d]), rem // in_shape[d]
        terms.append(tuple(fixed.get(d, picked.get(d)) for d in range(len(in_shape))))
    return terms
