"""Time every fused unit of a model's forward and backward programs under every schedule
of the space, keep the fastest per unit, and store it for the backends.

The model is run once (on whatever backend the caller set) only to learn which compiled
programs it runs, on which graph and with which gradients (`record_calls`). Each program
and its backward program is then run again by the tuner on the chosen backend, with
random inputs of the right shapes, and every fused unit's call is captured with its
input tensors; each captured unit is timed alone, under each candidate schedule forced
the way ``gnnfuse.ops.gspmm(..., schedule=...)`` forces one. Timing units alone, rather
than whole steps, gives every unit its own choice (a model's layers differ in width) and
keeps the dense layers' noise out of the comparison. The values are never checked here:
every schedule computes the same values (the backend tests check each against the
reference).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..backend import tuned_schedule
from ..backend.forced_schedule import ForcedSchedule, forcing
from ..backend.reference import GraphContext
from ..backend.reference.executor import run_plan
from ..bench.timing import time_calls
from ..ir import Program, Residency
from ..ir.sides import BOTH, sides_of
from ..passes.fusion import partition
from ..progress import progress_bar
from ..runtime.compiled import record_calls
from .space import candidates


@dataclass
class TunedUnit:
    """One unit's outcome: its description, the chosen schedule and its time and the cost
    rule's (ms, the fastest of the repeats: other work on the machine only ever adds
    time), or ``reused`` when a stored choice was kept."""
    key: str
    unit: str
    schedule: ForcedSchedule
    best_ms: float | None = None
    cost_rule_ms: float | None = None
    candidates: int = 0
    reused: bool = False


def _unit_runner(backend: str) -> Callable:
    if backend == "cpu":
        from ..backend.cpu.executor import run_unit
        return run_unit
    if backend == "triton":
        from ..backend.triton.executor import run_unit
        return run_unit
    raise ValueError(f"the tuner tunes the 'cpu' or 'triton' backend, got {backend!r}")


def _random_input(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                  gen: torch.Generator) -> torch.Tensor:
    """Positive floats (no NaN from a log or a square root to skew a timing); zeros for
    integer and boolean inputs, a valid index into any table."""
    if dtype.is_floating_point:
        return torch.rand(shape, generator=gen, dtype=dtype).add_(0.5).to(device)
    return torch.zeros(shape, dtype=dtype, device=device)


def _feeds(program: Program, ctx: GraphContext, device: torch.device, gen: torch.Generator,
           given: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    sides = sides_of(program) if ctx.graph.is_bipartite else {}
    feeds = {}
    for key, v in program.inputs.items():
        if key in given:
            feeds[key] = given[key]
            continue
        side = sides.get(v.id)
        rows = () if v.residency is Residency.SHARED else (ctx.rows(v.residency, "dst" if side in (None, BOTH)
                                                                     else side),)
        feeds[key] = _random_input(rows + tuple(v.shape), v.dtype, device, gen)
    return feeds


def _captured_units(run_model: Callable[[], Any], backend: str, device: torch.device) -> list[tuple]:
    """(unit, graph context, leaf tensors) of every fused-unit call the model's forward
    and backward programs make, each program run once on ``backend``."""
    with record_calls() as calls:
        run_model()
    run_unit = _unit_runner(backend)
    captured: list[tuple] = []

    def capture(unit, ctx, leaves):
        captured.append((unit, ctx, leaves))
        return run_unit(unit, ctx, leaves)
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for call in calls:
        if (id(call.compiled), id(call.graph), call.wrt) in seen:
            continue
        seen.add((id(call.compiled), id(call.graph), call.wrt))
        ctx = GraphContext(call.graph)
        program = call.compiled.program
        backward = call.compiled.backward_for(call.wrt) if call.wrt else None
        keep = [v.id for v in backward.saved] if backward else []
        addends = backend == "triton"     # the units the backend's executor runs (its partition)
        with torch.no_grad(), forcing(call.schedule):
            outputs, kept = run_plan(program, partition(program, keep, row_addends=addends), ctx,
                                     _feeds(program, ctx, device, gen, {}), keep, capture)
            if backward is not None:
                saved = {f"saved:{i}": t for i, t in kept.items()}
                bprog = backward.program
                run_plan(bprog, partition(bprog, row_addends=addends), ctx, _feeds(bprog, ctx, device, gen, saved),
                         (), capture)
    return captured


def _time_schedules(unit, ctx: GraphContext, leaves: dict, schedules: list[ForcedSchedule], backend: str,
                    repeats: int, device: torch.device, bar) -> list[float]:
    """The fastest of ``repeats`` calls of the unit under each schedule, in ms. One
    untimed call each first (it compiles the kernel and builds partitions), then the
    timed calls in rounds over all schedules, so that a burst of other work on the
    machine slows every schedule's calls alike instead of one schedule's run."""
    run_unit = _unit_runner(backend)

    def call(schedule: ForcedSchedule) -> float:
        with forcing(schedule):
            ms = time_calls(lambda: run_unit(unit, ctx, leaves), 1, device)[0]
        bar.update(1)
        return ms
    for schedule in schedules:
        call(schedule)
    best = [math.inf] * len(schedules)
    for _ in range(repeats):
        best = [min(b, call(s)) for b, s in zip(best, schedules)]
    return best


def tune(run_model: Callable[[], Any], backend: str, device: torch.device | str = "cpu", space: str = "full",
         repeats: int = 5, retune: bool = False, log: Callable[[str], None] = lambda message: None
         ) -> list[TunedUnit]:
    """Tune every fused unit ``run_model()`` runs (forward and backward) on ``backend``
    and store the choices (`tuned_schedule.store`); units with a stored choice are
    reused unless ``retune``. Returns one `TunedUnit` per distinct unit key. A store path
    naming a file that is not a store is a ValueError before any timing
    (`tuned_schedule.foreign_file`)."""
    device = torch.device(device)
    problem = tuned_schedule.foreign_file(tuned_schedule.cache_path())
    if problem is not None:
        raise ValueError(problem)
    units = {}
    for unit, ctx, leaves in _captured_units(run_model, backend, device):
        units.setdefault(tuned_schedule.key(unit, ctx.graph, backend), (unit, ctx, leaves))
    stored = tuned_schedule.entries()
    threads = torch.get_num_threads()
    spaces = {k: candidates(u, backend, threads, space) for k, (u, _, _) in units.items()}
    fixed = [k for k, schedules in spaces.items() if len(schedules) == 1]
    if fixed:
        log(f"{len(fixed)} unit(s) have a single schedule on the {backend} backend (nothing to tune)")
    todo = [k for k in units if len(spaces[k]) > 1 and (retune or k not in stored)]
    results = [TunedUnit(k, units[k][0].describe(), stored[k], reused=True)
               for k in units if k not in todo and k in stored]
    for result in results:
        log(f"reused: {result.unit}: {tuned_schedule.describe(result.schedule)}")
    records: dict[str, dict[str, Any]] = {}
    try:
        _search(units, spaces, todo, backend, repeats, device, results, records, log)
    finally:
        # also on Ctrl-C or an error mid-search: every unit timed to the end is a finished
        # choice, and storing only after the last one lost a long search's work; the unit
        # being timed when it stopped has no record, so nothing partial is stored
        if records:
            path = tuned_schedule.store(records)
            log(f"stored {len(records)} choice(s) in {path}"
                + ("" if len(records) == len(todo) else f" ({len(todo) - len(records)} unit(s) not tuned)"))
    return results


def _search(units: dict, spaces: dict, todo: list[str], backend: str, repeats: int, device: torch.device,
            results: list[TunedUnit], records: dict[str, dict[str, Any]], log: Callable[[str], None]) -> None:
    """Time each unit of ``todo`` under its schedules, adding its outcome to ``results``
    and ``records`` (what `tuned_schedule.store` takes) as soon as it is timed."""
    with progress_bar(total=sum(len(spaces[k]) for k in todo) * (repeats + 1), desc="tune", unit="call") as bar:
        for key in todo:
            unit, ctx, leaves = units[key]
            times = _time_schedules(unit, ctx, leaves, spaces[key], backend, repeats, device, bar)
            best = min(range(len(times)), key=times.__getitem__)
            result = TunedUnit(key, unit.describe(), spaces[key][best], times[best], times[0], len(times))
            results.append(result)
            records[key] = {"schedule": dataclasses.asdict(result.schedule), "ms": result.best_ms,
                            "cost_rule_ms": result.cost_rule_ms, "unit": result.unit,
                            "candidates": result.candidates}
            log(f"tuned: {result.unit}: {tuned_schedule.describe(result.schedule)}, {result.best_ms:.3f} ms "
                f"(cost rule {result.cost_rule_ms:.3f} ms, {len(times)} schedules)")
