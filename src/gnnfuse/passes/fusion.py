"""Partition a program into fused aggregation units and plain ops.

A unit is Seastar's Source->Edge->Aggregate pattern (§6.2) and Graphiler's
broadcast-compute-reduce (§4.3.2): one ``reduce`` plus the per-edge elementwise work that
feeds it, with broadcasts turned into in-kernel gathers. Per-edge values inside a unit
never reach memory. A unit stops where a value is needed elsewhere (by another op or by
the backward program), where an op has no Triton emitter, or at ops that are not
elementwise (edge softmax, matmul): those stay torch ops and the unit reads their result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..ir import Program, Residency, Value, get_op

FUSIBLE_REDUCERS = ("sum", "mean", "max", "min")


@dataclass(eq=False)
class AggregateUnit:
    reduce: Value                                       # the unit's output
    body: list[Value] = field(default_factory=list)     # per-edge values computed in registers
    leaves: list[Value] = field(default_factory=list)   # values the kernel reads from memory

    @property
    def by(self) -> str:
        return self.reduce.attrs["by"]

    def describe(self) -> str:
        reads = ", ".join(f"{v.op}:{v.residency.name}{list(v.shape)}" for v in self.leaves)
        return (f"unit reduce[{self.reduce.attrs['op']} by {self.by}] fuses "
                f"{[v.op for v in self.body]} reading ({reads})")


def _fusible_body(v: Value) -> bool:
    """Per-edge ops a kernel can evaluate in registers; a broadcast becomes a gather."""
    if v.op == "input":
        return False
    if v.op == "broadcast":
        return v.attrs["by"] in ("src", "dst")
    opdef = get_op(v.op)
    return v.residency.is_edge_rowed and opdef.pure and (
        (opdef.elementwise and opdef.emit is not None) or v.op == "reshape")


def partition(program: Program, keep: Iterable[int] = ()) -> list[AggregateUnit | Value]:
    """The program's computing values in order, with fused units replacing what they cover.

    ``keep`` holds ids of values that must be materialized (saved for backward)."""
    users = program.users()
    keep = set(keep) | {v.id for v in program.outputs.values()}
    covered: dict[int, AggregateUnit] = {}
    units: list[AggregateUnit] = []
    for v in program.values:
        if v.op != "reduce" or v.attrs["by"] not in ("src", "dst") or v.attrs["op"] not in FUSIBLE_REDUCERS:
            continue
        unit = AggregateUnit(v)
        members: set[int] = set()
        reachable = {v.inputs[0].id}
        # Reverse topological order sees every user of a value before the value itself,
        # so a value joins exactly when all of its users are already inside the unit.
        for x in reversed(program.values[: program.values.index(v)]):
            if x.id not in reachable:
                continue
            if (_fusible_body(x) and x.id not in keep and x.id not in covered
                    and all(u.id in members or u is v for u in users[x.id])):
                members.add(x.id)
                reachable.update(i.id for i in x.inputs)
        unit.body = [x for x in program.values if x.id in members]
        unit.leaves = [x for x in program.values if x.id in reachable and x.id not in members]
        for x in unit.body:
            covered[x.id] = unit
        covered[v.id] = unit
        units.append(unit)

    plan: list[AggregateUnit | Value] = []
    for v in program.values:
        if v.op == "input":
            continue
        unit = covered.get(v.id)
        if unit is None:
            plan.append(v)
        elif v is unit.reduce:
            plan.append(unit)
    return plan


def leaf_kind(leaf: Value) -> str:
    """How a kernel reads a leaf: ``const`` (inlined), ``shared`` (no row), ``node``
    (gathered through a fused broadcast) or ``edge`` (rows by edge id)."""
    if leaf.op == "const":
        return "const"
    if leaf.residency is Residency.SHARED:
        return "shared"
    return "node" if leaf.residency is Residency.NODE else "edge"


def gather_side(broadcast: Value, unit: AggregateUnit) -> str:
    """A fused broadcast along the unit's own index reads the row's vertex (``center``);
    along the other endpoint it gathers the ``neighbour``."""
    return "center" if broadcast.attrs["by"] == unit.by else "neighbour"
