"""Outputs that eager code would hand back as views of another output.

A UDF returning ``{"a": s, "b": s.reshape(E, 2, 3)}`` gives, in eager code, a ``b`` that
is a view of ``a``: an in-place edit of one shows in the other. The reference executor
runs the reshape as torch does and returns that view (with gradients, autograd then
refuses to read the view after an edit of either, naming ``_ProgramFunction``), but the
fused backends write each output into a buffer of its own, so after ``out["a"].mul_(2)``
the CPU and Triton backends' ``b`` still held the old values, silently unlike eager code
(2.6 off on a 6-edge graph). `rebuild_views` remakes each such output from the output it
views, by the same torch ops, so every backend returns what the reference one does. Two
outputs viewing one value the UDF does not return (``{"a": s.reshape(E, 2, 3), "b":
s.reshape(E, 3, 2)}``) share its memory in eager code too: where one of them is ``s``
through reshapes alone, ``s`` is that output reshaped back, and the other is remade from
it.
"""
from __future__ import annotations

from typing import Any

import torch

from ..ir import Program, get_op

# One view op as `rebuild_views` runs it: (op name, its operand's residency, attributes).
ViewStep = tuple[str, Any, dict]
# (the viewing output's position, the viewed output's position, the view ops from the
# viewed output's value to the viewing one's, in the order they apply)
OutputView = tuple[int, int, tuple[ViewStep, ...]]


def views_of_outputs(program: Program) -> tuple[OutputView, ...]:
    """The outputs of ``program`` that are view ops applied to another output, or to a
    value another output reshapes (once per compiled program: the per-call path reads
    only whether there are any)."""
    position = {}
    for n, value in enumerate(program.outputs.values()):
        position.setdefault(value.id, n)
    # a value an output the backend writes is made of by reshapes alone -> (that output,
    # the value): the output reshaped to the value's shape is the value, in its memory
    reshaped_from: dict[int, tuple[int, Any]] = {}
    views = []
    for n, value in enumerate(program.outputs.values()):
        chain, v = [], value
        while v.op != "input" and get_op(v.op).view:       # ops whose reference returns a view
            chain.append(v)
            v = v.inputs[0]
            if position.get(v.id, n) != n:
                views.append((n, position[v.id], _steps(reversed(chain))))
                break
            if v.id in reshaped_from:
                m, base = reshaped_from[v.id]
                views.append((n, m, (("reshape", base.residency, {"shape": base.shape}),
                                     *_steps(reversed(chain)))))
                break
        else:       # written by the backend, not remade: the values it reshapes are read from it
            v = value
            while v.op == "reshape":
                v = v.inputs[0]
                reshaped_from.setdefault(v.id, (n, v))
    base_of = {n: base for n, base, _ in views}

    def depth(n: int) -> int:       # an output viewing a viewing output is remade after it
        return 0 if n not in base_of else 1 + depth(base_of[n])
    return tuple(sorted(views, key=lambda view: depth(view[0])))


def rebuild_views(outputs: tuple[torch.Tensor, ...], views: tuple[OutputView, ...],
                  ctx: Any) -> tuple[torch.Tensor, ...]:
    """``outputs`` with each output of ``views`` remade from the output it views."""
    rebuilt = list(outputs)
    for n, base, chain in views:
        t = rebuilt[base]
        for op, residency, attrs in chain:
            t = get_op(op).run(ctx, (t,), (residency,), attrs)
        rebuilt[n] = t
    return tuple(rebuilt)


def _steps(chain: Any) -> tuple[ViewStep, ...]:
    """The view ops ``chain`` (values, in the order they apply) as `rebuild_views` runs them."""
    return tuple((v.op, v.inputs[0].residency, v.attrs) for v in chain)
