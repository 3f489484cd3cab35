"""Interprets a program op by op, freeing each intermediate as soon as nothing needs it
(Seastar §5.3), except the values the backward program will read."""
from __future__ import annotations

from typing import Iterable, Mapping

import torch

from ...ir import CompileError, Program, Residency, get_op
from .context import GraphContext


def execute(program: Program, ctx: GraphContext, feeds: Mapping[str, torch.Tensor],
            keep: Iterable[int] = ()) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """Run ``program`` on ``feeds``; return its outputs and the kept values by value id."""
    keep = set(keep) | {v.id for v in program.outputs.values()}
    remaining = {v.id: 0 for v in program.values}
    for v in program.values:
        for i in v.inputs:
            remaining[i.id] += 1
    env: dict[int, torch.Tensor] = {}
    kept: dict[int, torch.Tensor] = {}
    for v in program.values:
        if v.op == "input":
            env[v.id] = _feed(v, feeds, ctx)
        else:
            args = [env[i.id] for i in v.inputs]
            env[v.id] = get_op(v.op).run(ctx, args, [i.residency for i in v.inputs], v.attrs)
            for i in v.inputs:
                remaining[i.id] -= 1
                if remaining[i.id] == 0 and i.id not in keep:
                    del env[i.id]
        if v.id in keep:
            kept[v.id] = env[v.id]
    return {k: env[v.id] for k, v in program.outputs.items()}, kept


def _feed(v, feeds: Mapping[str, torch.Tensor], ctx: GraphContext) -> torch.Tensor:
    key = v.attrs["key"]
    if key not in feeds:
        raise CompileError(f"no tensor was given for program input {key!r}")
    t = feeds[key]
    expected = ((ctx.rows(v.residency),) if v.residency is not Residency.SHARED else ()) + v.shape
    if tuple(t.shape) != expected:
        raise ValueError(f"input {key!r} ({v.residency.name}) should have shape {list(expected)}, "
                         f"got {list(t.shape)}")
    return t
