"""A fused unit evaluated one op at a time through the ops' torch references, and the test
that sends a unit there because a kernel could not reproduce torch's rounding.

A generated kernel (Numba or Triton) computes a whole unit in one accumulator dtype; torch
computes each op in its own result dtype. A unit that mixes float32 and float64 values --
float32 features times float64 edge weights, a 0-dim float64 constant, which does not
widen float32 data -- would keep its float32 values unrounded in a float64 kernel:
``(((a - b) + 1e8) - 1e8) * e`` summed was 6.04 off torch on both backends. Such a unit
runs op by op instead (`mixed_floats`, `run_by_ops`): the same values as torch's.
"""
from __future__ import annotations

import torch

from ..ir import Value, get_op
from ..passes.fusion import AggregateUnit, Unit
from .reference import GraphContext


def mixed_floats(unit: Unit, leaves: dict[int, torch.Tensor]) -> list[torch.dtype]:
    """The floating dtypes ``unit`` reads and computes, sorted by name, when float64 is
    among them beside another (a kernel would compute them all in float64); else an empty
    list."""
    # Computed values count as well as leaves: a cast brings its dtype in whatever the
    # leaves are, and integer leaves made float take the default dtype (`computes_float64`).
    floats = {t.dtype for t in leaves.values() if t.dtype.is_floating_point}
    floats |= {v.dtype for v in _values(unit) if v.dtype.is_floating_point}
    # float64 beside a narrower float: the kernel's float64 accumulator keeps the narrower
    # values unrounded. Without float64 the accumulator is float32, and bfloat16/float16
    # values rounded at each store are those kernels' documented tolerance (README), not this.
    return sorted(floats, key=str) if torch.float64 in floats and len(floats) > 1 else []


def computes_float64(unit: Unit, leaves: dict[int, torch.Tensor]) -> bool:
    """Whether a kernel of ``unit`` must compute in float64: a leaf is float64, or the unit
    makes float64 values of integer leaves (``t / 3``, ``exp(t)`` under
    ``torch.set_default_dtype(torch.float64)``, as torch does). Chosen by the leaves alone,
    such a unit computed in float32 and stored the rounded values as float64 (exp of
    integers 2.4e-7 off torch's on an H200)."""
    return (any(t.dtype == torch.float64 for t in leaves.values())
            or any(v.dtype == torch.float64 for v in _values(unit)))


def _values(unit: Unit) -> list[Value]:
    values = [*unit.body, unit.root, *[v for v in unit.leaves if v.op != "const"]]
    if isinstance(unit, AggregateUnit):
        values.append(unit.reduce)
    return values


def mixed_floats_message(backend: str, floats: list[torch.dtype]) -> str:
    """The warning a backend gives, once per mix, when `mixed_floats` sends a unit to
    `run_by_ops`."""
    return (f"gnnfuse {backend} backend: a fused unit mixes {' and '.join(map(str, floats))} values; it runs as "
            "torch ops (a kernel computes in one dtype, which rounds them unlike torch)")


def run_by_ops(unit: Unit, ctx: GraphContext, leaves: dict[int, torch.Tensor]) -> torch.Tensor:
    """The unit's values evaluated one op at a time through their torch references. An
    aggregate unit's reduction, and its row scale and addend, are not in its body (a
    bf16/fp16 neighbour mean or sum failed with a KeyError when they were left out)."""
    env = dict(leaves)
    for v in unit.leaves:
        if v.op == "const":
            env[v.id] = get_op("const").run(ctx, [], [], v.attrs)
    for v in unit_values(unit):
        env[v.id] = get_op(v.op).run(ctx, [env[i.id] for i in v.inputs], [i.residency for i in v.inputs], v.attrs)
    return env[unit.root.id]


def unit_values(unit: Unit) -> list[Value]:
    """The values `run_by_ops` computes, in order (`gnnfuse.explain` lists them so)."""
    tail = [unit.reduce, unit.scaled, unit.added] if isinstance(unit, AggregateUnit) else [unit.root]
    return [*unit.body, *[t for t in tail if t is not None]]
