"""A program's runs on one graph with the per-call choosing done once.

`execute` works out, on every call, which fused plan the program runs (from the values
kept and whether scores are tiled), the settings it runs under, and for every fused unit
its launch plan (a lookup keyed by the unit, the graph, those settings and the leaves'
dtypes). Each is cached, but the lookups and the settings tuples are Python work that a
neighbour sum on a small graph pays as often as it launches its one kernel.

A `PreparedRun` holds the fused plan of one (program, graph, kept values) and, per unit, the
launch plan it last ran with; a run reads the settings once (`run_settings`), and
compares them with those it was prepared under. Equal settings are exactly what the
cached plans were made under, so the run launches each unit from its held plan after
comparing only its leaves' dtypes; anything else (other settings, dtypes, a sibling
group or a sum by type, which keep plans of another kind) goes through `run_unit` as
`execute` would. Other settings make `run` return None: the caller runs `execute`.

The backend's `execute` (this module's) keeps one per (program, kept values) from a
program's second run in a row on one graph; a prepared inference call
(runtime/prepared_call.py) shares that one (`held_run`).
"""
from __future__ import annotations

import weakref
from typing import Hashable, Mapping

import torch

from ...graph import Graph
from ...ir import Program
from ..reference import GraphContext
from ..reference.executor import input_shapes, run_steps, schedule_steps
from .context import TritonGraphContext
from .executor import (execute as execute_unprepared, program_plan, planned_launch, run_launch, run_settings, run_unit,
                       run_with_environment)


class PreparedRun:
    """`execute(program, ..., keep)` on graphs whose runs are made under the settings read
    when it was prepared (see the module docstring)."""

    def __init__(self, program: Program, graph: Graph, keep: tuple[int, ...] = ()) -> None:
        self.settings: Hashable = run_settings(graph.num_edges)
        self._graph = weakref.ref(graph)      # the launch plans held are this graph's
        self._program = program
        keep = tuple(sorted(set(keep)))      # as `execute` orders it
        self._keep, self._steps = schedule_steps(program, program_plan(program, keep, self.settings[3]), keep)
        self._inputs = tuple([(key, value_id, shape) for key, value_id, shape, _ in
                              input_shapes(program, TritonGraphContext(graph))])
        self._outputs = tuple([(key, value.id) for key, value in program.outputs.items()])
        self._single = self._single_route()
        self._num_edges = graph.num_edges
        # (the unit, its one input's value id and shape, the output's key) where `run_one` serves
        self._lone = None if self._single is None or len(self._single[1]) != 1 else \
            (self._single[0], self._single[1][0][1], self._single[1][0][2], self._single[2])
        # id(unit) -> (the leaves' dtypes, the unit's launch plan under self.settings), or _OTHER_KIND.
        # A plan holds the graph's index arrays: they go when the graph does, not with self
        # (which a program keeps until its next run on another graph).
        self._launches: dict[int, object] = {}
        weakref.finalize(graph, self._launches.clear)

    def run(self, graph: Graph, feeds: Mapping[str, torch.Tensor]
            ) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]] | None:
        """`execute`'s result on ``graph``, or None when that is not the graph it was
        prepared for, an input is missing or not of the shape `execute` checks for, or
        the settings now are not those it was prepared under."""
        if self._graph() is not graph:
            return None
        settings = run_settings(self._num_edges)
        if settings != self.settings:
            return None
        single = self._single
        if single is not None:
            held = self._launches.get(id(single[0]))
            if held is not None and held is not _OTHER_KIND:
                result = _run_single(single, held, feeds)
                if result is not None:
                    return result
        env: dict[int, torch.Tensor] = {}
        for key, value_id, shape in self._inputs:
            t = feeds.get(key)
            if t is None or t.shape != shape:
                return None
            env[value_id] = t
        return run_with_environment(settings[1], run_steps, self._program, self._steps, TritonGraphContext(graph),
                                    env, self._keep, self._run_unit)

    def run_one(self, graph: Graph, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """`run`'s outputs (not the kept values: an inference call keeps nothing for a
        backward) for a program of one input that launches one held plan (an inference
        call of a neighbour sum), fed ``tensor``, or None where `run` must decide (another
        program, no plan held yet, another graph, or ``tensor`` not a dense tensor of the
        plan's device, dtype and shape) or the settings now are not those it was
        prepared under.

        It launches before it reads the settings (runtime/prepared_call.py, "Launched
        first"): what it checks first is what makes the launch safe (the plan was made
        for this graph, and ``tensor`` is what its kernel reads), and a launch under
        other settings only writes outputs it made, which a None return drops."""
        lone = self._lone
        if lone is None or self._graph() is not graph:
            return None
        unit, value_id, shape, out_key = lone
        held = self._launches.get(id(unit))
        if held is None or held is _OTHER_KIND:
            return None
        plan = held[1]
        if (not isinstance(tensor, torch.Tensor) or tensor.dtype != held[0][0] or tensor.shape != shape
                or tensor.device != plan.device or tensor.layout is not torch.strided):
            return None
        out = run_launch(plan, {value_id: tensor})
        return None if run_settings(self._num_edges) != self.settings else {out_key: out}

    def _single_route(self) -> tuple | None:
        """How a program of one fused unit (a neighbour sum, GCN's aggregation) runs straight
        from the unit's held plan: `run_steps` would only look the one step up and hand it
        over. (the unit, its inputs as (key, value id, shape) in the order the unit reads
        them, the output's key and value id, the kept values' ids), or None for any other
        program, or one whose unit reads other than exactly the inputs."""
        if len(self._steps) != 1:
            return None
        (item, reads, out, _, op, _, _, _), = self._steps
        by_id = {value_id: (key, value_id, shape) for key, value_id, shape in self._inputs}
        if (item is None or op is not None or type(out) is tuple or len(self._outputs) != 1
                or self._outputs[0][1] != out or sorted(reads) != sorted(by_id)):
            return None
        return (item, tuple([by_id[i] for i in reads]), self._outputs[0][0], out,
                tuple([i for i in self._keep if i in by_id or i == out]))

    def _run_unit(self, unit: object, ctx: TritonGraphContext, leaves: dict[int, torch.Tensor]):
        held = self._launches.get(id(unit))
        if held is _OTHER_KIND:
            return run_unit(unit, ctx, leaves)
        if held is not None and held[0] == tuple([t.dtype for t in leaves.values()]):
            return run_launch(held[1], leaves)
        out = run_unit(unit, ctx, leaves)
        plan = planned_launch(unit, ctx.graph, leaves)
        # the units of self._plan live as long as self: their ids stay theirs
        self._launches[id(unit)] = _OTHER_KIND if plan is None else (tuple([t.dtype for t in leaves.values()]), plan)
        return out


def _run_single(single: tuple, held: tuple, feeds: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]] | None:
    """`run_steps`' result for a one-unit program (`PreparedRun._single_route`) launched from
    its held (leaves' dtypes, launch plan), or None where an input is missing or not of
    the shape and dtype that plan was made for. Nothing else reads the settings."""
    _, inputs, out_key, out_id, kept_ids = single
    dtypes, plan = held
    leaves: dict[int, torch.Tensor] = {}
    for (key, value_id, shape), dtype in zip(inputs, dtypes):
        t = feeds.get(key)
        if t is None or t.shape != shape or t.dtype != dtype:
            return None
        leaves[value_id] = t
    out = run_launch(plan, leaves)
    return {out_key: out}, ({i: out if i == out_id else leaves[i] for i in kept_ids} if kept_ids else {})


# A unit whose plan is not a single launch (a sibling group, a sum by type): always `run_unit`.
_OTHER_KIND = object()


# program -> {kept ids: (weak reference to the graph of its last run, its PreparedRun or None)}
_HELD: "weakref.WeakKeyDictionary[Program, dict]" = weakref.WeakKeyDictionary()


def held_run(program: Program, graph: Graph, keep: tuple[int, ...] = ()) -> PreparedRun:
    """The `PreparedRun` `execute` keeps for (``program``, ``keep``) on ``graph``, made
    now if it keeps none there: a prepared inference call (runtime/prepared_call.py)
    shares it rather than planning a second one."""
    keep = tuple(sorted(set(keep)))
    held = _HELD.get(program)
    if held is None:
        held = _HELD[program] = {}
    entry = held.get(keep)
    if entry is None or entry[0]() is not graph or entry[1] is None:
        entry = held[keep] = (weakref.ref(graph), PreparedRun(program, graph, keep))
    return entry[1]


def execute(program: Program, ctx: GraphContext, feeds: Mapping[str, torch.Tensor],
            keep: tuple[int, ...] = ()) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """The Triton backend's `execute`, through a `PreparedRun` of (program, kept values)
    from its second run in a row on one graph: a training step's forward and backward
    programs run on the same graph every step, while a mini-batch loop (a new graph per
    call) never pays to prepare one. A run the prepared one declines (other settings or
    shapes) runs `execute` unprepared, and the next run on that graph prepares afresh."""
    keep = tuple(sorted(set(keep)))
    held = _HELD.get(program)
    if held is None:
        held = _HELD[program] = {}
    graph = ctx.graph
    entry = held.get(keep)
    if entry is not None and entry[0]() is graph:
        result = held_run(program, graph, keep).run(graph, feeds)
        if result is not None:
            return result
        held[keep] = (entry[0], None)
    else:
        held[keep] = (weakref.ref(graph), None)
    return execute_unprepared(program, ctx, feeds, keep)
