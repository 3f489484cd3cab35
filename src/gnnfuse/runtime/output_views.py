"""Outputs that eager code would hand back as views of another output.

A UDF returning ``{"a": s, "b": s.reshape(E, 2, 3)}`` gives, in eager code, a ``b`` that
is a view of ``a``: an in-place edit of one shows in the other. The reference executor
runs the reshape as torch does and returns that view (with gradients, autograd then
refuses to read the view after an edit of either, naming ``_ProgramFunction``), but the
fused backends write each output
into a buffer of its own, so after ``out["a"].mul_(2)`` the CPU and Triton backends'
``b`` still held the old values, silently unlike eager code (2.6 off on a 6-edge graph).
`rebuild_views` remakes each such output from the output it views, by the same torch
ops, so every backend returns what the reference one does.
"""
from __future__ import annotations

from typing import Any

import torch

from ..ir import Program, get_op

# (the viewing output's position, the viewed output's position, the view ops from the
# viewed output's value to the viewing one's, in the order they apply)
OutputView = tuple[int, int, tuple[Any, ...]]


def views_of_outputs(program: Program) -> tuple[OutputView, ...]:
    """The outputs of ``program`` that are view ops applied to another output (once per
    compiled program: the per-call path reads only whether there are any)."""
    position = {}
    for n, value in enumerate(program.outputs.values()):
        position.setdefault(value.id, n)
    views = []
    for n, value in enumerate(program.outputs.values()):
        chain, v = [], value
        while v.op != "input" and get_op(v.op).view:       # ops whose reference returns a view
            chain.append(v)
            v = v.inputs[0]
            if position.get(v.id, n) != n:
                views.append((n, position[v.id], tuple(reversed(chain))))
                break
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
        for v in chain:
            t = get_op(v.op).run(ctx, (t,), (v.inputs[0].residency,), v.attrs)
        rebuilt[n] = t
    return tuple(rebuilt)
