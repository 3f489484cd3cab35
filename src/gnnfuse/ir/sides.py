"""Which vertex set each per-vertex value of a program is a table of.

On a bipartite graph (`Graph.is_bipartite`) edges go from one vertex set, the sources,
to another, the destinations, and the two may have different sizes. The IR keeps one
residency, NODE, for both: a program's meaning does not depend on whether the sets are
the same, and on an ordinary graph they are. Which set a NODE value belongs to follows
from how it is used, so it is inferred here rather than declared by every front end:

- a value gathered onto edges by ``broadcast by src`` is a source-side table, one
  gathered ``by dst`` a destination-side table;
- ``reduce`` and ``degree`` by src / by dst produce a table of that side (a gradient
  flowing back through a broadcast by src is a reduce by src: it has one row per source);
- every other op with NODE operands (arithmetic, matmuls, row sums for parameter
  gradients) works row by row, so its NODE inputs and NODE output share one side.

A group of values tied together this way that reaches both sides is the same table
read as sources and as destinations (``u.h`` and ``v.h`` with one key): well defined
only when both sets have the same size. A group that reaches neither is never read
through a graph index; callers treat it as destination-side (the vertices a vertex
function runs on), which is also what it is on an ordinary graph.
"""
from __future__ import annotations

import weakref

from .errors import CompileError
from .ops.typed_aggregate import OTHER_SIDE
from .program import Program
from .residency import Residency

SIDES = ("src", "dst")
TWO_SIDED = ("typed_aggregate", "typed_aggregate_tn")
BOTH = "both"


def node_sides(program: Program, seeds: dict[int, str] | None = None) -> dict[int, str | None]:
    """For every NODE value id: ``"src"``, ``"dst"``, `BOTH` or None (not decided by the
    program). ``seeds`` fixes the side of given value ids (a backward program's saved
    forward values and output gradients, whose sides the forward program decided)."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        parent.setdefault(i, i)
        while parent[i] != i:
            i = parent[i]
        return i

    marks: dict[int, set[str]] = {}

    def mark(i: int, side: str) -> None:
        marks.setdefault(i, set()).add(side)

    for v in program.values:
        by = v.attrs.get("by")
        nodes = [i.id for i in v.inputs if i.residency is Residency.NODE]
        if v.op == "broadcast" and by in SIDES:
            mark(v.inputs[0].id, by)
            continue
        if v.op in ("reduce", "degree") and by in SIDES:
            mark(v.id, by)
            continue
        if v.op in TWO_SIDED:   # ir/ops/typed_aggregate.py: rows of one endpoint aggregated onto the other
            mark(v.inputs[0].id, OTHER_SIDE[by])
            for i in v.inputs[1:] + (v,):
                if i.residency is Residency.NODE:
                    mark(i.id, by)
            continue
        if v.attrs.get("side") in SIDES:   # ops reading or writing one endpoint's table (ir/ops/compact.py)
            for i in v.inputs + (v,):
                if i.residency is Residency.NODE:
                    mark(i.id, v.attrs["side"])
            continue
        if v.residency is Residency.NODE and v.op != "broadcast":
            nodes.append(v.id)
        for i in nodes[1:]:
            parent[find(i)] = find(nodes[0])
    for i, side in (seeds or {}).items():
        if side in SIDES:
            mark(i, side)
        elif side == BOTH:
            marks.setdefault(i, set()).update(SIDES)

    by_root: dict[int, set[str]] = {}
    for i, sides in marks.items():
        by_root.setdefault(find(i), set()).update(sides)
    out: dict[int, str | None] = {}
    for v in program.values:
        if v.residency is Residency.NODE:
            sides = by_root.get(find(v.id), set())
            out[v.id] = BOTH if len(sides) == 2 else next(iter(sides), None)
    return out


_DECLARED: "weakref.WeakKeyDictionary[Program, dict[int, str | None]]" = weakref.WeakKeyDictionary()
_SIDES: "weakref.WeakKeyDictionary[Program, dict[int, str | None]]" = weakref.WeakKeyDictionary()


def declare_sides(program: Program, seeds: dict[int, str | None]) -> None:
    """Fix the sides of some of ``program``'s values for `sides_of` (the runtime does
    this for a backward program, whose inputs are forward values)."""
    _DECLARED[program] = seeds
    _SIDES.pop(program, None)


def sides_of(program: Program) -> dict[int, str | None]:
    """`node_sides` of ``program`` with its declared seeds, computed once per program
    (programs are final once they run)."""
    if program not in _SIDES:
        _SIDES[program] = node_sides(program, _DECLARED.get(program))
    return _SIDES[program]


def check_sides(program: Program, num_src: int, num_dst: int) -> None:
    """Raise CompileError if a table is read as both sources and destinations of a
    bipartite graph whose vertex sets differ in size."""
    if num_src == num_dst:
        return
    sides = sides_of(program)
    for v in program.values:
        if sides.get(v.id) == BOTH:
            what = f"input {v.attrs['key']!r}" if v.op == "input" else f"value {v.name} ({v.op})"
            where = f" (traced at {v.source})" if v.source else ""
            raise CompileError(
                f"{what}{where} is read both as a source-side table (u.<key>, edges.src[...]) and as a "
                f"destination-side table (v.<key>, edges.dst[...]), but the bipartite graph has {num_src} "
                f"sources and {num_dst} destinations; give the two tables different keys")
