"""`gnnfuse.explain`: what the compiler made of a layer, and what it will cost on a graph.

``explain(fn, *args, **kwargs)`` calls ``fn`` once while recording every compiled program
it runs (see `record_calls`), then reports for each one the program as traced, the program
after the rewrite passes, and the forward and backward plans: the fused units and plain
torch ops the Triton backend executes (the reference backend, used for CPU tensors, runs
the same programs op by op), what each step reads and writes to memory, and an estimate of
the bytes it moves on the graph it ran on. Each program's header names the executor that
ran it: on a GPU a small graph's first pass runs on the reference backend
(`runtime/first_pass.py`), and the plans shown are then the Triton backend's, for the
graph's later passes. A call the Numba CPU backend ran shows that backend's units (no
bias added inside a sum, no sibling kernels), so its stored tuned choices are marked.

Byte model (an estimate of DRAM traffic, not a measurement; caches are ignored):

* A value of residency NODE has N rows (on a bipartite graph, a source-side table, as
  `ir.sides` tells them apart, has the source count), SRC/DST/EDGE values have E rows (N
  and E of the graph the program ran on), SHARED values (parameters, constants) one; a
  row is the product of the value's per-element shape times its dtype's size.
* A plain torch op reads each input in full once and writes its output in full, except
  a reshape, transpose or narrow, counted as a view of its input (no bytes: torch copies
  only a reshape of a non-contiguous table, and a kernel reading a strided view as a
  leaf copies it packed first, neither counted). A
  broadcast reads one input row per *edge* (a gather), and every op that moves data along
  the graph (broadcast, reduce, edge softmax, degree) also reads one index entry per edge.
* A fused unit reads each leaf once per row it is needed for: an edge-rowed leaf once
  per edge; a vertex leaf gathered through a fused broadcast once per edge -- except, in a
  unit grouped by a vertex index (a CSR walk, ``unit.by``), the grouping vertex's own row,
  which is read once per vertex; a SHARED leaf once; constants are inlined and cost
  nothing. Index traffic: a grouped unit reads the row pointer (N+1 entries) and, per
  edge, the neighbour column if it gathers neighbours and the edge id if it reads edge
  rows; an ungrouped (per-edge) unit reads the src and/or dst array per edge, as its
  gathers need. Values computed inside the unit never reach memory; the unit writes only
  its root.
* A sum or mean unit that the Triton backend would run edge-parallel (the COO schedule,
  see `prefers_coo`) is counted as an ungrouped unit: every leaf row it needs is
  gathered per edge, it reads both endpoint arrays, and it writes its output with one
  atomic read-modify-write per edge and output element.
* A shared-reduce unit (per-edge work summed into a parameter shape) reads as an
  ungrouped unit does and writes its one parameter-sized root (its per-program partial
  rows, at most a thousand, are not counted).
* A relation-typed linear aggregation (``typed_aggregate``, ``typed_aggregate_tn``:
  passes/linear_reorder.py) is counted with the byte model of the order it chose on the
  graph (ir/ops/typed_aggregate.py); its step says which order ran, with every order's
  bytes and flops. It writes nothing per edge: its edge stage is one row-scatter kernel
  (backend/triton/scatter_rows.py).
* Index entries have the graph's index dtype size.

The report is generic over unit kinds: it uses only a unit's ``root``, ``body``,
``leaves``, ``describe()`` and, if present, ``by``.

Per plan it also lists the per-edge tensors the plan writes (`Plan.edge_tensors`: every
edge-rowed value a step materializes, the forward's saved ones marked), the largest of
them and their total bytes on the graph; values exempt from the IO rule (not computed
from gathered vertex rows, see passes/io_rule.py) are marked so.
"""
from __future__ import annotations

import copy
import functools
import importlib.util
import math
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..backend import tuned_schedule
from ..backend.constant_args import constant_slots
from ..backend.forced_schedule import TILED_SCORES_FROM_EDGES, forcing, tiled_scores
from ..backend.reference import GraphContext
from ..backend.unit_ops import mixed_floats, unit_values
from ..environ import getenv
from ..graph import Graph
from ..ir import Program, Residency, Value, get_op
from ..ir.ops.movement import contended
from ..ir.ops.typed_aggregate import recorded_choice
from ..ir.residency import Movement
from ..ir.sides import sides_of
from ..passes.fusion import SharedReduceUnit, gathered_leaves, partition, tiles_in_body
from ..passes.io_rule import EdgeTensor, backward_reads_gathered_rows, edge_tensors, reads_gathered_rows
from ..passes.pair_sources import PAIR_PREFIX
from ..passes.siblings import fused_plan
from ..passes.type_sums import TypeSumUnit, rider_fits
from .compiled import ProgramCall, record_calls


# Ops outside the fused units that the Triton backend's graph context runs as a kernel of
# its own rather than as torch code (see backend/triton/context.py).
GPU_KERNEL_OPS = {"row_dot": "one Triton kernel, both tables read once (backend/triton/row_dot.py)"}

@dataclass(frozen=True)
class Traffic:
    """Estimated bytes one plan step moves (see the module docstring for the model)."""
    reads: int
    index: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.index + self.writes


@dataclass
class Step:
    """One entry of a plan: a fused unit (``fused``) or a plain torch op."""
    item: Any                       # the unit, or the op's Value
    label: str
    fused: bool
    body: list[Value]               # values a fused unit computes in registers
    reads: list[tuple[Value, str]]  # (value read from memory, how it is read)
    writes: list[Value]             # values materialized in memory
    traffic: Traffic
    source: str | None = None       # generated Triton kernel, when asked for


@dataclass
class Plan:
    """A program split into steps as the Triton backend runs it."""
    phase: str                      # "forward" or "backward"
    program: Program
    steps: list[Step]
    edge_tensors: list[EdgeTensor]  # per-edge values the steps write (passes/io_rule.py)
    num_edges: int                  # E of the graph the byte counts are for
    tiled_scores: bool              # whether per-edge feature sums were recomputed in the units reading them
    backend: str = "triton"         # whose units these are: "triton", or "cpu" (which never tiles them)

    @property
    def traffic(self) -> int:
        return sum(s.traffic.total for s in self.steps)

    def edge_bytes(self, tensor: EdgeTensor) -> int:
        """Bytes of one per-edge tensor on this graph."""
        return self.num_edges * _row_bytes(tensor.value)

    @property
    def largest_edge_tensor(self) -> EdgeTensor | None:
        """The widest per-edge tensor the plan writes (None if it writes none)."""
        return max(self.edge_tensors, key=self.edge_bytes, default=None)

    @property
    def edge_tensor_bytes(self) -> int:
        """Total bytes of the per-edge tensors the plan writes."""
        return sum(self.edge_bytes(t) for t in self.edge_tensors)


@dataclass
class ProgramReport:
    """One compiled program as it ran on one graph (``calls`` runs with the same setup)."""
    call: ProgramCall
    calls: int
    forward: Plan
    backward: Plan | None


class _Sizes:
    """Row counts and index width of the graph a program ran on; with `of`, of the
    values of one of its programs."""

    def __init__(self, graph: Graph):
        self.graph, self.num_nodes, self.num_edges = graph, graph.num_nodes, graph.num_edges
        self.num_src_nodes = graph.num_src_nodes
        self.index_bytes = torch.empty((), dtype=graph.index_dtype).element_size()
        self.types = {Residency.NODE_TYPE: graph.num_node_types or 0,
                      Residency.EDGE_TYPE: graph.num_edge_types or 0}
        self.num_pairs = int((graph.in_degrees() ** 2).sum())   # PAIR rows: in-edge pairs per vertex
        self.sides: dict[int, str | None] = {}

    def of(self, program: Program) -> _Sizes:
        """These sizes for ``program``'s values: on a bipartite graph a per-vertex value
        is a table of sources or of destinations (`ir.sides`), as the executors size it.
        Counted with the destinations' rows, a source-side table of 1,000 rows beside 10
        destinations was read as 10."""
        sized = copy.copy(self)
        sized.sides = sides_of(program) if self.graph.is_bipartite else {}
        return sized

    def value_rows(self, v: Value) -> int:
        """The rows of ``v``: `rows` of its residency, the sources' for a source-side table."""
        if v.residency is Residency.NODE and self.sides.get(v.id) == "src":
            return self.num_src_nodes
        return self.rows(v.residency)

    def group_rows(self, unit: Any) -> int:
        """Rows a unit's reduce writes: sources when it groups by src (a bipartite
        graph's source set), destinations otherwise -- what the executor allocates."""
        return self.num_src_nodes if getattr(unit, "by", None) == "src" else self.num_nodes

    def rows(self, residency: Residency) -> int:
        if residency is Residency.NODE:
            return self.num_nodes
        if residency.is_edge_rowed:
            return self.num_edges
        if residency is Residency.SHARED:
            return 1
        if residency is Residency.PAIR:
            return self.num_pairs
        return self.types[residency]


def _row_bytes(v: Value) -> int:
    return math.prod(v.shape) * torch.empty((), dtype=v.dtype).element_size()


def _names(program: Program) -> dict[int, str]:
    """The names `Program.pretty` prints, so plan listings point into the listing."""
    return {v.id: f"%{v.attrs['key']}" if v.op == "input" else f"%{n}" for n, v in enumerate(program.values)}


def _unit_step(unit: Any, sizes: _Sizes, computed: frozenset[int] = frozenset(), walk: str | None = None) -> Step:
    """``computed``: leaves the unit's sibling kernel computes instead of reading (a
    maximum taken online and a normalizer kept alongside, passes/online_softmax.py);
    such a unit walks the CSR in its group's kernel whatever its own cost rule says.
    ``walk``: the CSR a rider (a sum by edge type, passes/type_sums.py) rides."""
    by = walk or getattr(unit, "by", None)
    schedule = "csr" if computed or walk else _schedule(unit, sizes)
    grouped = by in ("src", "dst") and schedule not in ("coo", "scan")   # a scan gathers even its own rows per edge
    gathers = {leaf: ["center" if grouped and side == by else side for side in sides]
               for leaf, sides in gathered_leaves(unit).items()}   # leaf id -> gather index names
    reads: list[tuple[Value, str]] = []
    read_bytes, index_names = 0, set()
    for leaf in unit.leaves:
        if leaf.op == "const" or leaf.id in computed:
            continue
        if leaf.residency is Residency.SHARED:
            reads.append((leaf, "once (shared)"))
            read_bytes += _row_bytes(leaf)
        elif leaf.residency is Residency.EDGE_TYPE:   # a fused broadcast by etype: a few rows, cached
            reads.append((leaf, "per edge, the row of its type (each edge's type read in order)"))
            read_bytes += sizes.rows(leaf.residency) * _row_bytes(leaf)
            index_names.add("etype")
        elif leaf.residency.is_edge_rowed:
            reads.append((leaf, "per edge"))
            read_bytes += sizes.num_edges * _row_bytes(leaf)
            if grouped:
                index_names.add("eid")   # a CSR walk finds edge rows through edge ids
        elif leaf.id in gathers:
            for side in gathers[leaf.id]:
                if side == "center":
                    reads.append((leaf, f"per vertex (its own row, grouped by {by})"))
                    read_bytes += sizes.group_rows(unit) * _row_bytes(leaf)
                else:
                    reads.append((leaf, f"per edge (gathered by {side})"))
                    read_bytes += sizes.num_edges * _row_bytes(leaf)
                    index_names.add("col" if grouped else side)
        else:
            reads.append((leaf, "in full"))
            read_bytes += sizes.value_rows(leaf) * _row_bytes(leaf)
    index = sizes.num_edges * len(index_names) + (sizes.group_rows(unit) + 1 if grouped else 0)
    root = unit.root
    if schedule == "coo":   # both endpoint ids, one atomic read-modify-write per edge
        index = 2 * sizes.num_edges
        writes = 2 * sizes.num_edges * _row_bytes(root)
    elif schedule == "scan":   # CSR-ordered columns and rows (and edge ids); a zeroed row, then its atomic adds
        reads_edges = any(leaf.residency.is_edge_rowed for leaf in unit.leaves if leaf.op != "const")
        index = (2 + reads_edges) * sizes.num_edges
        writes = 2 * sizes.group_rows(unit) * _row_bytes(root)
    else:
        writes = (sizes.group_rows(unit) if root.residency is Residency.NODE else sizes.rows(root.residency)) \
            * _row_bytes(root)
    label = unit.describe() + (f" [{schedule} schedule on CUDA]" if schedule else "")
    label += f" [{tuned}]" if (tuned := tuned_schedule.note(unit, sizes.graph)) else ""
    return Step(unit, label, True, [v for v in unit.body if v is not root],
                reads, [root], Traffic(read_bytes, index * sizes.index_bytes, writes))


def _schedule(unit: Any, sizes: _Sizes) -> str | None:
    """How the Triton backend would run ``unit`` on this graph (None without Triton)."""
    try:
        from ..backend.triton.executor import schedule_for
    except ImportError:
        return None
    with forcing(tuned_schedule.forced_or_tuned(unit, sizes.graph, "triton")):   # as the executor runs it
        return schedule_for(unit, sizes.group_rows(unit), sizes.num_edges)


# Torch ops that return a view of their input (a reshape of a contiguous table, a
# transpose, a narrow): they move nothing and write no new table.
VIEW_OPS = ("reshape", "transpose", "narrow")


def _op_step(v: Value, sizes: _Sizes, names: dict[int, str]) -> Step:
    if v.op in VIEW_OPS:
        args = names[v.inputs[0].id]
        label = f"torch op {names[v.id]} = {v.op}({args}) -> {v.residency.name}{list(v.shape)}, a view (no copy)"
        return Step(v, label, False, [], [(v.inputs[0], "as a view")], [], Traffic(0, 0, 0))
    movement = get_op(v.op).movement
    rows_out = sizes.value_rows(v)
    reads, read_bytes = [], 0
    for i in v.inputs:
        if movement is Movement.BROADCAST:
            reads.append((i, "per edge (gathered)"))
            read_bytes += rows_out * _row_bytes(i)
        else:
            reads.append((i, "in full"))
            read_bytes += sizes.value_rows(i) * _row_bytes(i)
    moves = v.attrs.get("by") in ("src", "dst")
    index = sizes.num_edges * sizes.index_bytes if moves else 0
    args = ", ".join(names[i.id] for i in v.inputs)
    label = f"torch op {names[v.id]} = {v.op}({args}) -> {v.residency.name}{list(v.shape)}"
    if v.op in GPU_KERNEL_OPS:
        label += f"\n    on CUDA: {GPU_KERNEL_OPS[v.op]}"
    elif v.op == "reduce" and v.attrs.get("op") == "sum" and contended(sizes.value_rows(v.inputs[0]),
                                                                        rows_out):
        label += ("\n    on CUDA: many entries into few rows, one Triton kernel summing in registers "
                  "(backend/triton/few_rows_sum.py) where rows x width is small")
    traffic = Traffic(read_bytes, index, rows_out * _row_bytes(v))
    choice = recorded_choice(sizes.graph, v)
    if choice is not None:   # a typed linear aggregation: the order it chose here, and why
        cost = choice.costs[choice.order]
        label += f"\n    order:  {choice.describe()}"
        traffic = Traffic(cost.reads, index, cost.writes)
    return Step(v, label, False, [], reads, [v], traffic)


def _one_kernel(group: Any, sizes: _Sizes) -> bool:
    """Whether the Triton backend runs sibling ``group`` as one kernel on this graph: the
    executor's own rule (`members_run_as_one`; the leaves' tensors have their values'
    dtypes). False without Triton, as `_schedule` names no schedule then."""
    try:
        from ..backend.triton.executor import members_run_as_one
    except ImportError:
        return False
    leaves = {v.id: torch.empty(0, dtype=v.dtype) for m in (*group.members, *group.riders)
              for v in m.leaves if v.op != "const"}
    return members_run_as_one(group, sizes.graph, sizes.group_rows(group), sizes.num_edges, leaves)


def _kernel_source(unit: Any, sizes: _Sizes) -> str:
    try:
        from ..backend.triton.executor import kernel_source, schedule_for
    except ImportError as exc:
        raise RuntimeError("explain(source=True) prints generated Triton kernels and needs the 'triton' "
                           "package: pip install 'gnnfuse[gpu]'") from exc
    wide = any(leaf.dtype == torch.float64 for leaf in unit.leaves if leaf.op != "const")
    schedule = "siblings" if hasattr(unit, "members") else schedule_for(unit, sizes.group_rows(unit), sizes.num_edges)
    source = kernel_source(unit, "tl.float64" if wide else "tl.float32", schedule)[1]
    numbers = constant_slots(unit)
    if not numbers:
        return source
    # the values are not in the source (one kernel serves every value: backend/constant_args.py)
    return source + "# run with " + ", ".join(f"K{n} = {v.attrs[key]!r}" for n, (v, key) in enumerate(numbers)) + "\n"


def _plan(phase: str, program: Program, keep: list[int], sizes: _Sizes, source: bool,
          tainted: set[int], cpu: bool = False) -> Plan:
    """``cpu``: the units the Numba CPU backend runs (its executor's `partition`: no bias
    added inside a sum, no sibling kernels), whose stored tuned choices are under their
    own keys; else the Triton backend's plan."""
    names = _names(program)
    sizes = sizes.of(program)
    steps = []
    tiled = not cpu and tiled_scores(sizes.num_edges)
    by_ops = functools.partial(_by_ops_reason, GraphContext(sizes.graph) if cpu else None)
    for item in partition(program, keep) if cpu else fused_plan(program, keep, tiled):
        if isinstance(item, Value):
            steps.append(_op_step(item, sizes, names))
            continue
        if isinstance(item, TypeSumUnit):
            steps.extend(_type_sum_alone(item, sizes, names, source, by_ops))
            continue
        if cpu and isinstance(item, SharedReduceUnit):
            steps.extend(_shared_reduce_on_cpu(item, sizes, names, source, by_ops))
            continue
        one_kernel = hasattr(item, "members") and _one_kernel(item, sizes)
        for n, unit in enumerate(getattr(item, "members", [item])):
            if why := by_ops(unit):
                steps.extend(_by_ops(unit, sizes, names, why))
                continue
            online = [item.shifts[n], *([item.normalizers[n]] if n in item.normalizers else [])] \
                if one_kernel and n in getattr(item, "shifts", {}) else []   # apart, each reads the max stored
            step = _unit_step(unit, sizes, frozenset(item.members[k].root.id for k in online))
            if unit is not item and one_kernel:
                step.label += (f"\n    shares one kernel with the {len(item.roots) - 1} other unit(s) walking the "
                               f"{item.by} CSR beside it (passes/siblings.py)")
            elif unit is not item:
                step.label += (f"\n    grouped with the {len(item.roots) - 1} other unit(s) walking the {item.by} CSR "
                               "beside it, but runs on its own here: a member off the CSR schedule on this graph, a "
                               "mix of float64 with another float, or GNNFUSE_SIBLING_KERNELS=0 (passes/siblings.py)")
            if online:
                step.label += ("\n    takes its softmax shift, the max beside it, online: a running maximum and "
                               "rescaled sums, reading no stored maximum"
                               + (", and divides by its own running copy of the normalizer beside it"
                                  if len(online) == 2 else "") + " (passes/online_softmax.py)")
            step.source = _kernel_source(unit, sizes) if source else None
            if source and unit is not item and one_kernel:
                step.source = _kernel_source(item, sizes) if unit is item.members[0] else "(the kernel above)"
            steps.append(step)
        riders = getattr(item, "riders", [])
        ride = one_kernel and all(rider_fits(r, sizes.rows(Residency.EDGE_TYPE)) for r in riders)   # all or none
        for rider in riders:
            if not ride:
                steps.extend(_type_sum_alone(rider, sizes, names, source, by_ops, f"the {item.by} walk above cannot "
                                             "carry it here (a member off the CSR schedule, a mix of float64 with "
                                             "another float, too many edge types, or GNNFUSE_SIBLING_KERNELS=0)"))
                continue
            step = _unit_step(rider, sizes, walk=item.by)
            step.label += (f"\n    rides the {item.by} CSR walk of the {len(item.members)} unit(s) above: each program "
                           "sums its edges by type in registers, no per-edge tensor (passes/type_sums.py)")
            if source:
                step.source = "(the kernel above)"
            steps.append(step)
    written = [v for step in steps for v in step.writes]
    return Plan(phase, program, steps, edge_tensors(written, keep, tainted), sizes.num_edges, tiled,
                "cpu" if cpu else "triton")


def _by_ops_reason(ctx: GraphContext | None, unit: Any) -> str | None:
    """Why the backend runs ``unit`` as torch ops, or None where one kernel runs it: with
    ``ctx`` (a plan the cpu backend ran) that executor's own decision on the graph -- no
    kernel for a dtype, an op its generator cannot express, a mix of float64 with another
    float --, else that mix, which the Triton backend runs so. The leaves' tensors have
    their values' dtypes."""
    if ctx is not None:
        from ..backend.cpu.executor import by_ops_reason
        return by_ops_reason(unit, ctx, {v.id: torch.empty(0, dtype=v.dtype) for v in unit.leaves if v.op != "const"})
    floats = mixed_floats(unit, {})
    return f"it mixes {' and '.join(map(str, floats))} values (backend/unit_ops.py)" if floats else None


def _by_ops(unit: Any, sizes: _Sizes, names: dict[int, str], why: str) -> list[Step]:
    """A unit a backend runs as torch ops (`_by_ops_reason`): one torch op per value
    (backend/unit_ops.py), each written in full. Listed as one fused unit, its per-edge
    values went unreported: 'edge-rowed tensors written: none' where the run wrote its
    gathered [E, F] rows."""
    steps = [_op_step(v, sizes, names) for v in unit_values(unit) if v.op != "const"]
    steps[0].label += f"\n    from {unit.describe()}, run as torch ops: {why}"
    return steps


def _type_sum_alone(unit: TypeSumUnit, sizes: _Sizes, names: dict[int, str], source: bool,
                    by_ops: Callable[[Any], str | None], why: str = "no walk to ride") -> list[Step]:
    """A sum by edge type riding no walk, as it runs: its operand's edge unit, then the sum."""
    if reason := by_ops(unit.edge):
        return [*_by_ops(unit.edge, sizes, names, reason), _op_step(unit.reduce, sizes, names)]
    edge = _unit_step(unit.edge, sizes)
    edge.label += f"\n    the operand of a sum by edge type, written per edge: {why} (passes/type_sums.py)"
    edge.source = _kernel_source(unit.edge, sizes) if source else None
    return [edge, _op_step(unit.reduce, sizes, names)]


def _shared_reduce_on_cpu(unit: SharedReduceUnit, sizes: _Sizes, names: dict[int, str], source: bool,
                          by_ops: Callable[[Any], str | None]) -> list[Step]:
    """A sum over every edge as the CPU backend runs it (backend/cpu/executor.py
    `per_edge_part`; it has no shared-reduce kernel): an edge kernel -- or its torch ops,
    where the backend runs it so -- writes the per-edge operand, [E, H x D] for GATv2's
    attention vector, and a torch op sums it. Listed so, the report's per-edge tensors
    are the ones that run allocates, not the Triton plan's."""
    from ..backend.cpu.executor import per_edge_part
    edge_unit = per_edge_part(unit)
    if why := by_ops(edge_unit):
        return [*_by_ops(edge_unit, sizes, names, why), _op_step(unit.root, sizes, names)]
    edge = _unit_step(edge_unit, sizes)
    edge.label += ("\n    the operand of a sum over every edge, written per edge: the cpu backend has no kernel "
                   "that sums it")
    edge.source = _kernel_source(edge_unit, sizes) if source else None
    return [edge, _op_step(unit.root, sizes, names)]


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f} MB" if n >= 1e5 else f"{n:,} B"


class ExplainReport:
    """What `explain` found: ``result`` (what ``fn`` returned) and one `ProgramReport` per
    distinct (program, graph size, gradient inputs) it ran. ``str()`` is the listing."""

    def __init__(self, result: Any, programs: list[ProgramReport], source: bool, placements: list[str] = ()):
        self.result, self.programs, self.source = result, programs, source
        self.placements = list(placements)    # dynamic kernel placement: fitted model, this call's decisions

    # -- text -----------------------------------------------------------------------
    def __str__(self) -> str:
        if not self.programs:
            return "gnnfuse.explain: the call ran no compiled gnnfuse program"
        lines = [f"gnnfuse.explain: {len(self.programs)} compiled program(s); bytes are estimates "
                 "(the byte model is documented in gnnfuse/runtime/explain.py)"]
        for n, rep in enumerate(self.programs, 1):
            g = rep.call.graph
            grads = ", ".join(rep.call.wrt) or "none"
            vertices = (f"{g.num_src_nodes:,} sources and N={g.num_nodes:,} destinations" if g.is_bipartite
                        else f"N={g.num_nodes:,} nodes")
            lines += ["", f"=== program {n} of {len(self.programs)}: ran {rep.calls}x on a graph with "
                      f"{vertices}, E={g.num_edges:,} edges ({str(g.index_dtype).removeprefix('torch.')}"
                      f" indices); gradients for: {grads}; executor: {_executor_text(rep.call)} ===",
                      "--- traced ---", rep.call.compiled.traced,
                      "--- optimized ---", rep.forward.program.pretty(show_source=False)]
            pairs = [k for k in rep.forward.program.inputs if k.startswith(PAIR_PREFIX)]
            if pairs:
                lines.append(f"(run on the graph of the typed graph's (source, relation) pairs, its sources: "
                             f"{', '.join(pairs)} computed once per pair before the program, "
                             "passes/pair_sources.py)")
            lines += self._plan_lines(rep.forward)
            if rep.backward is None:
                lines += ["--- backward: none (no input needed a gradient) ---"]
            else:
                lines += ["--- backward program ---", rep.backward.program.pretty(show_source=False)]
                lines += self._plan_lines(rep.backward)
        for placement in self.placements:
            lines += ["", "=== " + placement]
        return "\n".join(lines)

    def _plan_lines(self, plan: Plan) -> list[str]:
        names = _names(plan.program)
        fused = sum(s.fused for s in plan.steps)
        lines = [f"--- {plan.phase} plan: {fused} fused unit(s), {len(plan.steps) - fused} torch op(s), "
                 f"~{_mb(plan.traffic)} moved ---", self._edge_tensor_line(plan, names)]
        for k, step in enumerate(plan.steps, 1):
            lines.append(f"[{k}] {step.label}")
            if step.fused:
                lines.append("    in registers: " + (", ".join(f"{names[v.id]} {v.op}" for v in step.body)
                                                     or "(nothing)"))
            lines.append("    reads:  " + (", ".join(f"{names[v.id]} {v.residency.name}{list(v.shape)} {how}"
                                                      for v, how in step.reads) or "(nothing)"))
            lines.append("    writes: " + ", ".join(f"{names[v.id]} {v.residency.name}{list(v.shape)} "
                                                    f"{str(v.dtype).removeprefix('torch.')}" for v in step.writes))
            t = step.traffic
            lines.append(f"    bytes:  read {_mb(t.reads)} + index {_mb(t.index)} + write {_mb(t.writes)} "
                         f"= {_mb(t.total)}")
            if step.source:
                lines += ["    kernel:"] + [f"      {line}" for line in step.source.rstrip().splitlines()]
        return lines

    @staticmethod
    def _edge_tensor_line(plan: Plan, names: dict[int, str]) -> str:
        largest = plan.largest_edge_tensor
        if largest is None:
            return "edge-rowed tensors written: none"
        v = largest.value
        marks = "".join([", saved" if largest.saved else "", ", exempt from the IO rule"
                         if largest.exempt else ""])
        line = (f"edge-rowed tensors written: {len(plan.edge_tensors)}, {_mb(plan.edge_tensor_bytes)} in all; "
                f"largest {names[v.id]} {v.op} {v.residency.name}{list((plan.num_edges,) + v.shape)} = "
                f"{_mb(plan.edge_bytes(largest))}{marks}")
        # the Triton backend's choice: the cpu backend writes them whatever GNNFUSE_TILED_SCORES says
        if plan.backend == "triton" and not plan.tiled_scores and any(tiles_in_body(t.value)
                                                                      for t in plan.edge_tensors):
            why = ("GNNFUSE_TILED_SCORES=0" if getenv("GNNFUSE_TILED_SCORES", "auto") == "0"
                   else f"the graph has under {TILED_SCORES_FROM_EDGES:,} edges")
            line += (f"\n  (per-edge feature sums such as attention scores are written once, as {why}; "
                     f"GNNFUSE_TILED_SCORES=1 recomputes them in every unit that reads them)")
        return line

    # -- graphs ---------------------------------------------------------------------
    def _sections(self) -> list[tuple[str, str, Plan]]:
        out = []
        for n, rep in enumerate(self.programs, 1):
            for plan in (rep.forward, rep.backward):
                if plan is not None:
                    out.append((f"p{n}{plan.phase[0]}", f"program {n} {plan.phase}", plan))
        return out

    def to_dot(self) -> str:
        """Graphviz DOT text of every recorded program's dataflow: one cluster per program
        and phase, a nested filled cluster per fused unit, an edge per operand."""
        lines = ["digraph gnnfuse {", "  rankdir=TB;", '  node [shape=box, fontsize=10, fontname="monospace"];']
        for prefix, title, plan in self._sections():
            names = _names(plan.program)
            lines.append(f'  subgraph cluster_{prefix} {{\n    label="{title}";')
            steps = [s for s in plan.steps if s.fused]
            units, copies = _unit_nodes(steps)
            for k, step in enumerate(steps):
                lines.append(f'    subgraph cluster_{prefix}_u{k} {{\n      label="{_escape(step.label)}";\n'
                             '      style=filled; fillcolor="#dbe9f6"; color="#4a7fb5";')
                lines += [f"      {_dot_node(_dot_name(prefix, v, k, copies), v, names)}"
                          for v in step.body + step.writes]
                lines.append("    }")
            lines += [f"    {_dot_node(_dot_name(prefix, v, None, copies), v, names)}" for v in plan.program.values
                      if not any(v.id in unit for unit in units)]
            lines.append("  }")
            for v in plan.program.values:
                for k in [k for k, unit in enumerate(units) if v.id in unit] or [None]:
                    lines += [f"  {_dot_name(prefix, i, k, copies)} -> {_dot_name(prefix, v, k, copies)};"
                              for i in v.inputs]
        lines.append("}")
        return "\n".join(lines) + "\n"

    def render(self, path: str | Path) -> Path:
        """Write the dataflow graph as an image: through Graphviz when the ``graphviz``
        package and the ``dot`` binary are both present (format from the suffix), else
        drawn with networkx and matplotlib (PNG, or any format matplotlib saves)."""
        path = Path(path)
        if graphviz_renders():
            import graphviz
            graphviz.Source(self.to_dot()).render(outfile=str(path), cleanup=True)
            return path
        try:
            import matplotlib  # noqa: F401 - drawing backend for networkx
            import networkx
        except ImportError as exc:
            raise RuntimeError("render() needs either the 'graphviz' package with Graphviz's 'dot' binary, "
                               "or 'matplotlib' and 'networkx' (pip install matplotlib networkx)") from exc
        _draw(self._sections(), path, networkx)
        return path


def graphviz_renders() -> bool:
    """Whether `ExplainReport.render` draws through Graphviz (the ``graphviz`` package and
    the ``dot`` binary both present) rather than matplotlib, whose file types differ."""
    return importlib.util.find_spec("graphviz") is not None and shutil.which("dot") is not None


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _node_label(v: Value, names: dict[int, str]) -> str:
    return f"{names[v.id]} = {v.op}\n{v.residency.name}{list(v.shape)}"


def _unit_nodes(steps: list[Step]) -> tuple[list[set[int]], set[tuple[int, int]]]:
    """The value ids each fused step of ``steps`` holds (its body and writes), and the
    (unit, value id) pairs that get a node of their own (`_dot_name`): a value recomputed
    in several units gets one in each. Drawn once, a value is shown in one unit only --
    Graphviz draws a node declared in several clusters in one of them, and the matplotlib
    drawing coloured it by the last unit -- and the others looked as if they read it."""
    units = [{v.id for v in s.body + s.writes} for s in steps]
    shared = {i for i, n in Counter(i for unit in units for i in unit).items() if n > 1}
    return units, {(k, v.id) for k, s in enumerate(steps) for v in s.body if v.id in shared}


def _dot_name(prefix: str, v: Value, unit: int | None, copies: set[tuple[int, int]]) -> str:
    """The DOT node of ``v`` as fused unit ``unit`` (None: outside every unit) sees it:
    the unit's own copy where it recomputes ``v`` (``copies``), else ``v``'s one node."""
    return f"{prefix}_u{unit}_{v.id}" if (unit, v.id) in copies else f"{prefix}_{v.id}"


def _dot_node(node: str, v: Value, names: dict[int, str]) -> str:
    shape = ', shape=ellipse' if v.op == "input" else ""
    return f'{node} [label="{_escape(_node_label(v, names))}"{shape}];'


def _draw(sections: list[tuple[str, str, Plan]], path: Path, nx: Any) -> None:
    """Layered drawing without Graphviz: x = topological generation, one band of rows per
    program and phase, fused units coloured (one colour per unit); a value recomputed in
    several units has a node in each, as in `ExplainReport.to_dot` (`_unit_nodes`)."""
    from matplotlib.figure import Figure
    graph, pos, colors, labels = nx.DiGraph(), {}, {}, {}
    palette = ["#9ecae1", "#a1d99b", "#fdae6b", "#bcbddc", "#fc9272", "#c7e9c0", "#fdd0a2"]
    y0 = 0.0
    for prefix, title, plan in sections:
        names = _names(plan.program)
        units, copies = _unit_nodes([s for s in plan.steps if s.fused])
        depth: dict[int, int] = {}
        for v in plan.program.values:
            depth[v.id] = 1 + max((depth[i.id] for i in v.inputs), default=-1)
        per_level: dict[int, int] = {}
        for v in plan.program.values:
            for k in [k for k, unit in enumerate(units) if v.id in unit] or [None]:
                node = _dot_name(prefix, v, k, copies)
                graph.add_node(node)
                graph.add_edges_from((_dot_name(prefix, i, k, copies), node) for i in v.inputs)
                row = per_level.get(depth[v.id], 0)
                per_level[depth[v.id]] = row + 1
                pos[node] = (depth[v.id], -(y0 + row))
                labels[node] = _node_label(v, names)
                colors[node] = ("#eeeeee" if v.op == "input" else
                                palette[k % len(palette)] if k is not None else "#ffffff")
        labels[f"{prefix}_title"] = title
        graph.add_node(f"{prefix}_title")
        pos[f"{prefix}_title"] = (-1, -y0)
        colors[f"{prefix}_title"] = "#ffffff"
        y0 += max(per_level.values(), default=1) + 1.5
    width = max((x for x, _ in pos.values()), default=1) + 2
    fig = Figure(figsize=(min(2.2 * width, 80), min(0.9 * y0 + 1, 120)))
    ax = fig.add_subplot()
    nodes = list(graph.nodes)
    nx.draw_networkx(graph, pos, ax=ax, nodelist=nodes, labels=labels, node_shape="s", node_size=2200,
                     node_color=[colors[n] for n in nodes], edgecolors="#555555", font_size=6,
                     arrowsize=8, edge_color="#888888")
    ax.set_axis_off()
    fig.savefig(path, dpi=80, bbox_inches="tight")


def explain(fn: Callable[..., Any], *args: Any, source: bool = False, **kwargs: Any) -> ExplainReport:
    """Run ``fn(*args, **kwargs)`` once and report every compiled gnnfuse program it ran:
    traced and optimized programs, forward/backward fused-unit plans with what each step
    reads and writes, estimated bytes moved on the actual graph, and with ``source=True``
    each unit's generated Triton kernel. ``fn`` may be a layer (``nn.Module``), a vertex
    function or any callable that ends up running compiled programs. torch's random
    generators are restored after the call, so explaining leaves later results as they
    would have been."""
    if not callable(fn):
        raise TypeError(f"explain() takes a callable (a layer, vertex function or function), "
                        f"got {type(fn).__name__}")
    placements = _placements(fn)
    before = [Counter(p.decisions) for p in placements]
    # the random generators as they were: a call drawing dropout masks advanced them, so
    # a model explained before training trained to other weights than one never explained
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda), record_calls() as calls:
        result = fn(*args, **kwargs)
    reports: dict[tuple, ProgramReport] = {}
    for call in calls:
        # one report per graph (and executor): keyed by N and E, two graphs of one size
        # shared one, whose sources, degrees and typed orders were the first graph's
        # (the calls hold their graphs, so no id is reused among them)
        key = (id(call.compiled), call.wrt, id(call.graph), call.schedule, call.executor)
        if key in reports:
            reports[key].calls += 1
            continue
        sizes = _Sizes(call.graph)
        backward = call.compiled.backward_for(call.wrt) if call.wrt else None
        keep = [v.id for v in backward.saved] if backward else []
        program = call.compiled.program
        tainted = reads_gathered_rows(program)
        with forcing(call.schedule):   # a schedule= the call forced is the one reported
            cpu = call.executor == "cpu"
            forward = _plan("forward", program, keep, sizes, source, tainted, cpu)
            back = _plan("backward", backward.program, [], sizes, source,
                         backward_reads_gathered_rows(backward.program, program, tainted), cpu) if backward else None
        reports[key] = ProgramReport(call, 1, forward, back)
    return ExplainReport(result, list(reports.values()), source,
                         [_placement_text(p, Counter(p.decisions) - old) for p, old in zip(placements, before)])


def _executor_text(call: ProgramCall) -> str:
    """The backend that ran ``call``, and why where it is not its device's default."""
    if call.executor.endswith("(first pass)"):
        backward = ("torch's autograd differentiates the forward's torch ops" if call.compiled.runs_under_autograd
                    else "the backward program below runs on the reference executor too")
        return ("reference (the graph's first pass: a small graph runs on torch ops until a backward pass "
                f"has run on it, runtime/first_pass.py; {backward}; the plans below are the Triton backend's, "
                "for later passes)")
    if call.executor == "cpu":
        return "cpu (the plans below are its units: no bias added inside a sum, no sibling kernels)"
    if call.executor == "reference":   # it writes every per-edge value the plans keep in registers
        return ("reference (torch ops one at a time, each per-edge value written in full; the plans below are the "
                "Triton backend's)")
    return call.executor


def _placements(fn: Any) -> list[Any]:
    """The distinct dynamic-kernel-placement models (`nn.placement`) installed on the
    layers of a module ``fn``, found by attribute so this layer needs no import of nn."""
    found: dict[int, Any] = {}
    for module in fn.modules() if hasattr(fn, "modules") else ():
        placement = getattr(module, "placement", None)
        if placement is not None and hasattr(placement, "describe"):
            found.setdefault(id(placement), placement)
    return list(found.values())


def _placement_text(placement: Any, decided: Counter) -> str:
    lines = [placement.describe(), "decisions in this call:"]
    lines += [f"  layer {f_in}->{f_out}: {order} x{count}" for (f_in, f_out, order), count in sorted(decided.items())]
    return "\n".join(lines if decided else lines[:1] + ["decisions in this call: none"])
