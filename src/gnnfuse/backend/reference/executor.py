"""Interprets a program op by op, freeing each intermediate as soon as nothing needs it
(Seastar §5.3), except the values the backward program will read."""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import torch

from ...ir import CompileError, Program, Residency, Value, get_op
from ...ir.sides import BOTH, check_sides, sides_of
from .context import GraphContext


def execute(program: Program, ctx: GraphContext, feeds: Mapping[str, torch.Tensor],
            keep: Iterable[int] = ()) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """Run ``program`` on ``feeds``; return its outputs and the kept values by value id."""
    plan = [v for v in program.values if v.op != "input"]
    return run_plan(program, plan, ctx, feeds, keep, None)


def run_plan(program: Program, plan: Sequence, ctx: GraphContext, feeds: Mapping[str, torch.Tensor],
             keep: Iterable[int], run_unit: Callable | None
             ) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """Run ``plan``: values run through their torch reference; fused units (anything
    with ``root`` and ``leaves``) run through ``run_unit(unit, ctx, {leaf id: tensor})``."""
    keep = set(keep) | {v.id for v in program.outputs.values()}
    steps = [(item, _reads(item), item if isinstance(item, Value) else item.root) for item in plan]
    remaining: dict[int, int] = {}
    for _, reads, _ in steps:
        for i in reads:
            remaining[i.id] = remaining.get(i.id, 0) + 1
    sides: dict[int, str | None] = {}
    if ctx.graph.is_bipartite:
        check_sides(program, ctx.graph.num_src_nodes, ctx.num_nodes)
        sides = sides_of(program)
    env: dict[int, torch.Tensor] = {v.id: _feed(v, feeds, ctx, sides.get(v.id)) for v in program.inputs.values()}
    for item, reads, out in steps:
        if isinstance(item, Value):
            args = [env[i.id] for i in item.inputs]
            env[out.id] = get_op(item.op).run(ctx, args, [i.residency for i in item.inputs], item.attrs)
        else:
            env[out.id] = run_unit(item, ctx, {i.id: env[i.id] for i in reads})
        for i in reads:
            remaining[i.id] -= 1
            if remaining[i.id] == 0 and i.id not in keep:
                del env[i.id]
    kept = {i: env[i] for i in keep if i in env}
    return {k: env[v.id] for k, v in program.outputs.items()}, kept


def _reads(item) -> list[Value]:
    if isinstance(item, Value):
        return list(item.inputs)
    return [v for v in item.leaves if v.op != "const"]


def _feed(v: Value, feeds: Mapping[str, torch.Tensor], ctx: GraphContext, side: str | None) -> torch.Tensor:
    """The input tensor for ``v``, its shape checked; a NODE input of a bipartite graph has
    one row per vertex of the set it is read as (``side``; undecided means destinations)."""
    key = v.attrs["key"]
    if key not in feeds:
        raise CompileError(f"no tensor was given for program input {key!r}")
    t = feeds[key]
    side = "dst" if side in (None, BOTH) else side
    expected = ((ctx.rows(v.residency, side),) if v.residency is not Residency.SHARED else ()) + v.shape
    if tuple(t.shape) != expected:
        raise ValueError(f"input {key!r} ({v.residency.name}) should have shape {list(expected)}, "
                         f"got {list(t.shape)}")
    return t
