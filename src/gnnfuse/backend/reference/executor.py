"""Interprets a program op by op, freeing each intermediate as soon as nothing needs it
(Seastar §5.3), except the values the backward program will read."""
from __future__ import annotations

import weakref
from typing import Callable, Iterable, Mapping, Sequence

import torch

from ...ir import CompileError, Program, Residency, Value, get_op
from ...ir.registry import align_rows
from ...ir.sides import BOTH, check_sides, sides_of
from .context import GraphContext
from .overwrite import overwritable, run_over
from .per_graph import per_graph_ops


# ((item, ids read, out id, ids freed after it, op, input ids, residencies, the input position
# the op may write its result over or None), ...): `schedule_steps`
_Schedule = tuple


class _ProgramRuns:
    """What every run of one program reuses, in one record: the executor's own plan (its
    values in order, `execute`), the schedules by plan and kept values (`schedule_steps`),
    the inputs' specs and their expected shapes by graph
    (`input_shapes`). One weak lookup per run finds them all; a run looked each up in a
    weak dictionary of its own (three Python calls more per run, and a small graph's
    training step runs a program per layer, forward and backward)."""
    __slots__ = ("plan", "own", "schedules", "specs", "shapes")

    def __init__(self, program: Program) -> None:
        self.plan: list[Value] | None = None       # built on `execute`'s first run
        self.own: dict[tuple, tuple] = {}          # kept values -> `plan`'s schedule
        self.schedules: dict[tuple, tuple] = {}    # (id(plan), kept values) -> (plan, keep, steps)
        # (key, value id, residency, per-row shape, residency name) per input
        self.specs = tuple((v.attrs["key"], v.id, v.residency, tuple(v.shape), v.residency.name)
                           for v in program.inputs.values())
        self.shapes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # graph -> `input_shapes`


_SCHEDULES: "weakref.WeakKeyDictionary[Program, _ProgramRuns]" = weakref.WeakKeyDictionary()


def _runs(program: Program) -> _ProgramRuns:
    """``program``'s record, made on its first run (not setdefault: a weak dictionary's
    builds a weak reference per call)."""
    runs = _SCHEDULES.get(program)
    if runs is None:
        runs = _SCHEDULES[program] = _ProgramRuns(program)
    return runs


def execute(program: Program, ctx: GraphContext, feeds: Mapping[str, torch.Tensor],
            keep: Iterable[int] = ()) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """Run ``program`` on ``feeds``; return its outputs and the kept values by value id."""
    runs = _SCHEDULES.get(program)      # (inline `_runs`: one call per run)
    if runs is None:
        runs = _SCHEDULES[program] = _ProgramRuns(program)
    keep = keep if type(keep) is tuple else tuple(keep)
    found = runs.own.get(keep)
    if found is None:
        if runs.plan is None:
            runs.plan = [v for v in program.values if v.op != "input"]
        found = runs.own[keep] = _schedule(program, runs, runs.plan, keep)
    return _run(program, runs, found[0], found[1], ctx, feeds, None)


def run_plan(program: Program, plan: Sequence, ctx: GraphContext, feeds: Mapping[str, torch.Tensor],
             keep: Iterable[int], run_unit: Callable | None
             ) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """Run ``plan``: values run through their torch reference; fused units (anything
    with ``root`` and ``leaves``) run through ``run_unit(unit, ctx, {leaf id: tensor})``,
    and a step with ``roots`` instead of a ``root`` returns one tensor per root.

    What a call does besides running the steps -- which values each step reads, when
    each dies, the inputs' expected shapes on this graph -- is worked out on the first
    call per (program, plan, kept values) and per (program, graph), not on every call:
    on small graphs that bookkeeping was a visible share of a training step."""
    runs = _runs(program)
    keep, steps = _schedule(program, runs, plan, keep)
    return _run(program, runs, keep, steps, ctx, feeds, run_unit)


def _run(program: Program, runs: _ProgramRuns, keep: frozenset[int], steps: _Schedule, ctx: GraphContext,
         feeds: Mapping[str, torch.Tensor], run_unit: Callable | None
         ) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """`run_plan` once its schedule is found: the inputs checked against ``ctx``'s graph, then the steps."""
    env: dict[int, torch.Tensor] = {}
    shapes = runs.shapes.get(ctx.graph)     # (the usual hit inline: `_input_shapes` on a miss)
    if shapes is None:
        shapes = _input_shapes(program, runs, ctx)
    for key, value_id, expected, residency in shapes:
        if key not in feeds:
            raise CompileError(f"no tensor was given for program input {key!r}")
        t = feeds[key]
        if t.shape != expected:
            raise ValueError(f"input {key!r} ({residency}) should have shape {list(expected)}, got {list(t.shape)}")
        env[value_id] = t
    return run_steps(program, steps, ctx, env, keep, run_unit)


def run_steps(program: Program, steps: _Schedule, ctx: GraphContext, env: dict[int, torch.Tensor],
              keep: frozenset[int], run_unit: Callable | None
              ) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """`run_plan`'s steps (from `schedule_steps`) on ``env``, its inputs by value id, checked.
    Operands are read by ``map`` and the results gathered by loops, not comprehensions:
    each of those is a Python call in 3.11, one per step and two per run. A step is run
    over an operand's buffer only on the CPU (`run_over` declines any other device's), so
    elsewhere it is not asked."""
    read = env.__getitem__
    on_cpu = ctx.device.type == "cpu"
    for item, reads, out, frees, op, input_ids, residencies, over in steps:
        if op is not None:
            tensors = list(map(read, input_ids))
            result = None if over is None or not on_cpu else run_over(item.op, align_rows(tensors, residencies), over)
            env[out] = op.run(ctx, tensors, residencies, item.attrs) if result is None else result
        elif type(out) is tuple:     # a step with several outputs (passes.siblings.SiblingGroup)
            env.update(zip(out, run_unit(item, ctx, dict(zip(reads, map(read, reads))))))
        else:
            env[out] = run_unit(item, ctx, dict(zip(reads, map(read, reads))))
        for i in frees:
            del env[i]
    kept = {}
    for i in keep:
        if i in env:
            kept[i] = env[i]
    outputs = {}
    for k, v in program.outputs.items():
        outputs[k] = env[v.id]
    return outputs, kept


def schedule_steps(program: Program, plan: Sequence, keep: Iterable[int]) -> tuple[frozenset[int], _Schedule]:
    """The values a run keeps (``keep`` and the outputs), and each step of ``plan`` with
    what it reads and the values that die after it (read for the last time and not
    kept), for a value its op and operands' ids and residencies, and which operand it
    may overwrite (`overwrite.overwritable`); built once per (program, plan, keep)."""
    return _schedule(program, _runs(program), plan, keep)


def _schedule(program: Program, runs: _ProgramRuns, plan: Sequence, keep: Iterable[int]
              ) -> tuple[frozenset[int], _Schedule]:
    """`schedule_steps` with ``program``'s record found."""
    cache = runs.schedules
    keep = keep if type(keep) is tuple else tuple(keep)
    lookup = (id(plan), keep)
    entry = cache.get(lookup)
    if entry is not None and entry[0] is plan:
        return entry[1], entry[2]
    keep = frozenset(keep) | {v.id for v in program.outputs.values()}
    reads = [_reads(item) for item in plan]
    last: dict[int, int] = {}
    for position, values in enumerate(reads):
        for i in values:
            last[i.id] = position
    frees: list[list[int]] = [[] for _ in plan]
    for value_id, position in last.items():
        if value_id not in keep:
            frees[position].append(value_id)
    overwrites = overwritable(plan, reads, frees)
    # a value of the graph alone runs once per graph (per_graph.py)
    per_graph = per_graph_ops(plan, {v.id for v in program.outputs.values()})
    steps = tuple((item, tuple(i.id for i in r), item.id, tuple(f), per_graph.get(item.id) or get_op(item.op),
                   tuple(i.id for i in item.inputs),
                   tuple(i.residency for i in item.inputs), over) if isinstance(item, Value) else
                  (item, tuple(i.id for i in r), _outputs(item), tuple(f), None, None, None, None)
                  for item, r, f, over in zip(plan, reads, frees, overwrites))
    cache[lookup] = (plan, keep, steps)
    return keep, steps


def input_shapes(program: Program, ctx: GraphContext) -> list[tuple[str, int, torch.Size, str]]:
    """(key, value id, expected shape, residency name) per program input on ``ctx``'s
    graph; a bipartite graph's sides are checked here, once per (program, graph). What
    does not depend on the graph -- each input's key, id, residency and per-row shape --
    is read from the program once (`_ProgramRuns.specs`): a loader's new graph per step
    meets every program anew, and reading them per input (an enum's ``name`` is a Python
    property) was most of that first call's work."""
    return _input_shapes(program, _runs(program), ctx)


def _input_shapes(program: Program, runs: _ProgramRuns, ctx: GraphContext) -> list[tuple[str, int, torch.Size, str]]:
    """`input_shapes` with ``program``'s record found."""
    graph = ctx.graph
    per_graph = runs.shapes
    found = per_graph.get(graph)
    if found is None:
        sides: dict[int, str | None] = {}
        if graph.is_bipartite:
            check_sides(program, graph.num_src_nodes, ctx.num_nodes)
            sides = sides_of(program)
        found = []
        for key, value_id, residency, shape, name in runs.specs:
            if residency is Residency.SHARED:
                expected = torch.Size(shape)
            else:       # a NODE input of a bipartite graph: a row per vertex of the set it is read as
                side = sides.get(value_id)      # (undecided: destinations)
                expected = torch.Size((ctx.rows(residency, "dst" if side in (None, BOTH) else side),) + shape)
            found.append((key, value_id, expected, name))
        per_graph[graph] = found
    return found


def _outputs(item) -> int | tuple[int, ...]:
    """The value id a fused step writes, or the ids, in order, of a step with several."""
    roots = getattr(item, "roots", None)
    return item.root.id if roots is None else tuple(r.id for r in roots)


def _reads(item) -> list[Value]:
    if isinstance(item, Value):
        return list(item.inputs)
    return [v for v in item.leaves if v.op != "const"]
