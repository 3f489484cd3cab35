"""Aggregation units that walk the same CSR, grouped to run as one kernel.

Two fused sums grouped by the same index (``by``) whose inputs do not depend on each
other walk the same rows and the same edges. A GAT layer's backward has two by source
-- the gradient of the messages and that of the source logits -- and each gathers the
output gradient of every edge's destination row and recomputes the edge's attention
weight from gathered logits. On a products-sized graph these pairs were the four
slowest steps of the training step (21.5, 13.5, 12.0 and 10.8 ms on an H100), each
pair paying its walk and its gathers twice. A `SiblingGroup` is the pair (or more) as
one step: a backend that can run it as one kernel does (the Triton backend's
``generate_siblings``: one walk, one accumulator per member), and one that cannot runs
the members one by one, which is exactly the plan without the group.

Placement: the group runs where its last member ran. That is sound when no step
between the first member and the last reads a member's output (then delaying the
earlier members changes no value any step sees) and no member reads another's;
`group_siblings` closes a group at the first step that reads one of its outputs --
except a reshape (a view: no work, and nothing but later steps reads it), which moves
to just after the group instead. A layer's backward often reshapes one gradient for
its output right after computing it: HGT's value gradient [N, H, D] -> [N, H x D]
sat between its two sums by source and kept them two kernels, each walking the
21.1M-edge graph of an ogbn-mag-sized step.

A softmax's max by destination may be a member too, and a sum that reads it only as
its shift joins the max's group instead of closing it (`passes/online_softmax.py`):
the kernel keeps a running maximum and rescales, so GAT's and HGT's forward walk their
graph once instead of three times. A group with a max adds no partial results
atomically (a running maximum cannot be): the segments of a split hub row store theirs
for a second, small kernel to merge, flash-decoding style.

A sum by edge type (`passes/type_sums.py`: a per-type parameter's gradient) rides a
group as a *rider*: the walk visits every edge once whichever CSR it walks, so the
rider joins a group open when it comes, or else the next one to open, unless a step
in between reads its result (then it stays where it was, on its own).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..ir import Program, Value
from .fusion import AggregateUnit, partition
from .online_softmax import online_terms
from .type_sums import TypeSumUnit

GROUPED_REDUCERS = ("sum", "mean", "max")   # a group with a max merges split rows' partials
MAX_SIBLINGS = 4                     # members per kernel: each holds an accumulator and a body in registers
MAX_RIDERS = 2                       # sums by edge type riding one walk (each a [types, width] tile)


@dataclass(eq=False)
class SiblingGroup:
    """Aggregate units over the same CSR run as one step, outputs in member order.
    ``shifts`` maps a member's position to the position of the max member whose
    maximum it takes online as its softmax shift, and ``normalizers`` one that divides
    by another member's sum of its exponentials to that member's position
    (`online_softmax.online_terms`). ``riders`` are sums by edge type computed in the
    same walk, their outputs after the members'."""
    members: list[AggregateUnit]
    shifts: dict[int, int] = field(default_factory=dict)
    normalizers: dict[int, int] = field(default_factory=dict)
    riders: list[TypeSumUnit] = field(default_factory=list)
    _core: object = field(default=None, repr=False)

    @property
    def by(self) -> str:
        return self.members[0].by

    @property
    def roots(self) -> list[Value]:
        return [m.root for m in (*self.members, *self.riders)]

    @property
    def core(self) -> "SiblingGroup | AggregateUnit":
        """The group without its riders (its one member if it has one), for a graph whose
        edge types are too many for a rider's tile: the riders then run on their own."""
        if self._core is None:
            self._core = (SiblingGroup(self.members, self.shifts, self.normalizers) if len(self.members) > 1
                          else self.members[0])
        return self._core

    @property
    def merges(self) -> bool:
        """A split row's segments store partial results that a second kernel merges,
        instead of adding them atomically: a max is a member."""
        return any(m.reduce.attrs["op"] == "max" for m in self.members)

    @property
    def leaves(self) -> list[Value]:
        """Every member's leaves, each once, in first-read order; a maximum computed in
        the group itself (read as a shift) is none."""
        roots = {m.root.id for m in self.members}
        seen: dict[int, Value] = {}
        for m in (*self.members, *self.riders):
            for leaf in m.leaves:
                if leaf.id not in roots:
                    seen.setdefault(leaf.id, leaf)
        return list(seen.values())

    def describe(self) -> str:
        return (f"{len(self.members) + len(self.riders)} units sharing one walk by {self.by}: "
                + "; ".join(m.describe() for m in (*self.members, *self.riders)))


def groupable(item: object) -> bool:
    """A fused sum, mean or max over the source or destination CSR."""
    return (isinstance(item, AggregateUnit) and item.by in ("src", "dst")
            and item.reduce.attrs["op"] in GROUPED_REDUCERS and item.addend is None)


def _reads(item: object) -> set[int]:
    return {v.id for v in (item.inputs if isinstance(item, Value) else item.leaves)}


DEFERRABLE = ("reshape",)      # steps that may move to after a group: views, costing nothing


def _deferrable(item: object) -> bool:
    return isinstance(item, Value) and item.op in DEFERRABLE


def fused_plan(program: Program, keep: Sequence[int], tile_feature_sums: bool) -> list:
    """The steps the Triton backend runs ``program`` as (and `gnnfuse.explain` reports):
    `partition` with every fusion a generated kernel supports, then sibling groups."""
    return group_siblings(partition(program, keep, tile_feature_sums=tile_feature_sums, row_addends=True,
                                    type_sums=True))


def group_siblings(plan: Sequence) -> list:
    """``plan`` (a `partition` result) with independent groupable units of the same
    ``by`` merged into `SiblingGroup` steps, each placed at its last member, and the
    reshapes of member outputs read while the group was open placed right after it
    (see the module doc); sums by edge type ride groups as the module doc says; a group
    of one without riders stays the plain unit."""
    groups: list[list[AggregateUnit]] = []
    moved: dict[int, list[Value]] = {}           # id(group) -> reshapes placed after it
    open_by: dict[str, list[AggregateUnit]] = {}
    shifts: dict[int, dict[int, int]] = {}        # id(group) -> SiblingGroup.shifts
    normalizers: dict[int, dict[int, int]] = {}   # id(group) -> SiblingGroup.normalizers
    riders: dict[int, list[TypeSumUnit]] = {}     # id(group) -> SiblingGroup.riders
    last: dict[int, object] = {}                  # id(group) -> its last step in plan order
    pending: list[TypeSumUnit] = []               # riders waiting for a group to open

    def outputs(members: list[AggregateUnit]) -> set[int]:
        return ({m.root.id for m in members} | {r.root.id for r in riders.get(id(members), [])}
                | {v.id for v in moved.get(id(members), [])})

    def board(members: list[AggregateUnit]) -> None:
        """Pending riders join ``members``' group, as far as it has room."""
        room = MAX_RIDERS - len(riders.get(id(members), []))
        if pending and room > 0:
            riders.setdefault(id(members), []).extend(pending[:room])
            del pending[:room]

    for item in plan:
        reads = _reads(item)
        pending[:] = [r for r in pending if r.root.id not in reads]   # read here: it stays put, alone
        readers = [by for by, members in open_by.items() if reads & outputs(members)]
        if (online := _online_join(item, open_by, moved, shifts, reads)) is not None:
            for by in readers:
                if by != item.by:
                    del open_by[by]
            members = open_by[item.by]
            peak, total = online
            shifts.setdefault(id(members), {})[len(members)] = members.index(peak)
            if total is not None:
                normalizers.setdefault(id(members), {})[len(members)] = members.index(total)
            members.append(item)
            last[id(members)] = item
            board(members)
            continue
        if len(readers) == 1 and _deferrable(item):
            moved.setdefault(id(open_by[readers[0]]), []).append(item)
            continue
        for by in readers:     # a step reading a member's output closes its group
            del open_by[by]
        if isinstance(item, TypeSumUnit):
            room = [m for m in open_by.values() if len(riders.get(id(m), [])) < MAX_RIDERS]
            if room:
                riders.setdefault(id(room[-1]), []).append(item)
                last[id(room[-1])] = item
            else:
                pending.append(item)
            continue
        if not groupable(item):
            continue
        members = open_by.get(item.by)
        if members is None or len(members) == MAX_SIBLINGS:
            members = open_by[item.by] = []
            groups.append(members)
        members.append(item)
        last[id(members)] = item
        board(members)
    # A merging group's kernel stores split rows' partials for a second kernel; riders
    # stay out of it, as steps of their own (where they were: nothing reads them before).
    ejected = {id(r) for g in groups if any(m.reduce.attrs["op"] == "max" for m in g) for r in riders.pop(id(g), [])}
    placed = {id(last[id(g)]): g for g in groups if len(g) > 1 or id(g) in moved or id(g) in riders}
    grouped = {id(m) for g in placed.values() for m in (*g, *riders.get(id(g), []))}
    after = {id(v) for steps in moved.values() for v in steps}
    out = []
    for item in plan:
        if id(item) in placed:
            group = placed[id(item)]
            aboard = riders.get(id(group), [])
            out.append(SiblingGroup(group, shifts.get(id(group), {}), normalizers.get(id(group), {}), aboard)
                       if len(group) > 1 or aboard else item)
            out.extend(moved.get(id(group), []))
            if id(item) in ejected:
                out.append(item)
        elif id(item) in ejected or (id(item) not in grouped and id(item) not in after):
            out.append(item)
    return out


def _online_join(item: object, open_by: dict[str, list[AggregateUnit]], moved: dict[int, list[Value]],
                 shifts: dict[int, dict[int, int]], reads: set[int]) -> tuple[AggregateUnit, AggregateUnit | None] | None:
    """(the max member, the normalizer member or None) of ``item``'s open group when
    ``item`` reads no member output but that maximum, as its softmax shift, and that
    member's sum of the exponentials it divides by (`online_softmax.online_terms`); else None."""
    if not groupable(item) or item.by not in open_by or len(open_by[item.by]) == MAX_SIBLINGS:
        return None
    members = open_by[item.by]
    read = [m for m in members if m.root.id in reads]
    if reads & {v.id for v in moved.get(id(members), [])}:
        return None
    online = set(shifts.get(id(members), {}))
    for peak in (m for m in read if m.reduce.attrs["op"] == "max"):
        totals = [m for n, m in enumerate(members) if n in online and m in read]
        ok, total = online_terms(item, peak, totals)
        if ok and set(map(id, read)) == {id(peak)} | ({id(total)} if total is not None else set()):
            return peak, total
    return None
