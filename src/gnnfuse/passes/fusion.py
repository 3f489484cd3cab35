"""Partition a program into fused aggregation units and plain ops.

A unit is Seastar's Source->Edge->Aggregate pattern (§6.2) and Graphiler's
broadcast-compute-reduce (§4.3.2): one ``reduce`` plus the per-edge elementwise work that
feeds it, with broadcasts turned into in-kernel gathers. Per-edge values inside a unit
never reach memory; a cheap per-edge value that several units need is recomputed in each
(see `partition`). A unit stops at values that are kept for the backward pass, at ops
with no Triton emitter and at ops that are not elementwise (matmuls on edges, random
masks): those stay torch ops and the unit reads their result. Per-edge values that must
reach memory anyway (read by such an op, or returned) are computed by edge units:
gathers and arithmetic fused into one pass that writes only the result. A sum of
per-edge work into a parameter-shaped (SHARED) result -- the gradient of an attention
vector or of any parameter used on edges -- is a shared-reduce unit: the per-edge values
are reduced in registers and only the parameter-sized result is written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from ..ir import Program, Residency, Value, get_op
from .type_sums import TYPE_INDEX, TypeSumUnit, type_summed

FUSIBLE_REDUCERS = ("sum", "mean", "max", "min")
# A kernel reads their input at remapped coordinates: an ``expand`` (the gradient of a
# feature sum spread back over the summed dims) is a broadcast in registers, never an
# |E| x H x D tensor.
COORDINATE_MAPS = ("reshape", "slice_features", "expand")


@dataclass(eq=False)
class AggregateUnit:
    """Source->Edge->Aggregate: per-edge work reduced into one row per vertex."""
    reduce: Value                                       # the reduction
    body: list[Value] = field(default_factory=list)     # per-edge values computed in registers
    leaves: list[Value] = field(default_factory=list)   # values the kernel reads from memory
    scale: Value | None = None    # a per-row scalar leaf the reduced row is multiplied or divided by
    scaled: Value | None = None   # that product or quotient, the unit's output when there is a scale
    addend: Value | None = None   # a vertex-table leaf added to the finished row (`_row_added`)
    added: Value | None = None    # that sum, the unit's output when there is an addend

    @property
    def by(self) -> str:
        return self.reduce.attrs["by"]

    @property
    def root(self) -> Value:
        if self.added is not None:
            return self.added
        return self.scaled if self.scaled is not None else self.reduce

    def describe(self) -> str:
        """The unit in words, as its leaves are named (op and shape, never a value's id):
        it heads the kernel's source, which programs of one structure -- one for each value
        of a changing constant -- then share (backend/constant_args.py)."""
        times = "" if self.scale is None else \
            f" {'times' if self.scaled.op == 'mul' else 'over'} {_reads([self.scale])} per row"
        plus = "" if self.addend is None else f" plus {_reads([self.addend])} per row"
        return (f"unit reduce[{self.reduce.attrs['op']} by {self.by}]{times}{plus} fuses "
                f"{[v.op for v in self.body]} reading ({_reads(self.leaves)})")


@dataclass(eq=False)
class EdgeUnit:
    """Source->Edge (Graphiler's broadcast-compute, FeatGraph's generalized SDDMM): an
    edge value computed from gathered endpoint rows, written once per edge, optionally
    summed over feature dims on the way out (attention logits, edge-weight gradients)."""
    root: Value
    body: list[Value] = field(default_factory=list)
    leaves: list[Value] = field(default_factory=list)

    def describe(self) -> str:
        return (f"unit edge[{self.root.op} -> {self.root.residency.name}{list(self.root.shape)}] fuses "
                f"{[v.op for v in self.body]} reading ({_reads(self.leaves)})")


@dataclass(eq=False)
class SharedReduceUnit:
    """Per-edge work summed over every edge into one SHARED (parameter-shaped) value: a
    parameter's gradient where the parameter is used on edges (GAT's attention vector
    ``att``: ``sum_to(g_e * leaky_relu(x_i + x_j))``; a weight applied to edge features,
    ``matmul_tn(edge_attr, g_e)``; see `summed_operand`). The kernel evaluates the body in
    registers and reduces its edges there, so the per-edge product, |E| x H x D
    elements, never reaches memory; only one parameter-sized partial per program does."""
    root: Value
    body: list[Value] = field(default_factory=list)
    leaves: list[Value] = field(default_factory=list)

    def describe(self) -> str:
        return (f"unit reduce[sum over edges -> {self.root.residency.name}{list(self.root.shape)}] fuses "
                f"{[v.op for v in self.body]} reading ({_reads(self.leaves)})")


Unit = AggregateUnit | EdgeUnit | SharedReduceUnit
MAX_UNROLLED_FEATURE_SUM = 64   # an edge unit's closing feature sum is unrolled in the kernel


def _reads(leaves: list[Value]) -> str:
    return ", ".join(f"{v.op}:{v.residency.name}{list(v.shape)}" for v in leaves)


def _fusible_body(v: Value) -> bool:
    """Ops a kernel can evaluate in registers: per-edge elementwise work, broadcasts (which
    become gathers) and per-vertex elementwise work on the gathered rows.

    The last kind undoes broadcast reordering where it does not pay: ``h * norm`` moved
    before the gather saves flops, but as a separate op it costs a launch and an |V|-row
    round trip to memory, while in the kernel it is one multiply on rows gathered anyway.
    Such values only join a unit through a broadcast (partition grows units from edges).
    Integer results (an index computed from integer data) stay torch ops: a kernel
    computes in its float accumulator, which would round integers above 2**24."""
    if v.op == "input":
        return False
    if v.op == "broadcast":
        return v.attrs["by"] in ("src", "dst")
    if not v.dtype.is_floating_point:
        return False
    opdef = get_op(v.op)
    if v.residency not in (Residency.SRC, Residency.DST, Residency.EDGE, Residency.NODE):
        return False
    return opdef.pure and ((opdef.elementwise and opdef.emit_steps(v) is not None) or v.op in COORDINATE_MAPS
                           or edge_feature_matmul(v))


MAX_EDGE_FEATURES = 16   # terms of the unrolled dot an edge-feature matmul costs per output element


def edge_feature_matmul(v: Value) -> bool:
    """``edge_attr @ W``: a per-edge input of at most ``MAX_EDGE_FEATURES`` features (the
    user's edge features) times a parameter. A kernel evaluates it as an unrolled dot
    where it is used, and the backward recomputes it, so its [E, out] result (GAT's
    ``lin_edge(edge_attr)``, heads x channels wide) never reaches memory when it is
    traced into the program."""
    if v.op != "matmul":
        return False
    x, w = v.inputs
    return (x.op == "input" and x.residency.is_edge_rowed and len(x.shape) == 1 and x.shape[0] <= MAX_EDGE_FEATURES
            and w.residency is Residency.SHARED and len(w.shape) == 2)


def feature_sum_terms(v: Value) -> int | None:
    """How many input elements one output element of a feature-dim sum adds up, or None
    if ``v`` is not a per-edge float sum over feature dims. An integer sum (``t.sum(-1)``
    of integer edge data, exact in torch) stays a torch op, as integer bodies do
    (`_fusible_body`): a kernel adds in its float accumulator, which rounded int64 terms
    near 2**53 (1e8 off) and an int32 row summing to 2**30 - 1 (2**30)."""
    if (not v.inputs or not v.inputs[0].residency.is_edge_rowed or not v.residency.is_edge_rowed
            or not v.dtype.is_floating_point):
        return None
    if v.op in ("sum_to", "sum_dim"):
        return math.prod(v.inputs[0].shape) // max(math.prod(v.shape), 1)
    return None


class RowSum(NamedTuple):
    """A per-edge sum over trailing feature dims, evaluated as a [edges, heads, padded]
    tile whose lanes past ``summed`` are masked and whose rows past ``kept`` are never
    read (see `row_sum_split`)."""
    kept: int
    summed: int
    padded: int      # next power of two >= summed

    @property
    def heads(self) -> int:
        """``kept`` rounded up to a power of two: Triton's tensor dims must be one."""
        return 1 << max(self.kept - 1, 0).bit_length()

    @property
    def tile(self) -> int:
        """Elements per edge in the whole tile, every head's lanes."""
        return self.heads * self.padded


def row_sum_split(root: Value) -> RowSum | None:
    """The tile for ``root`` when it sums the trailing feature dims of its input and the
    padded tile is at most 128 elements, else None. Such a sum
    (attention scores ``(h * a).sum(-1)`` per head, a GAT attention gradient) is evaluated
    as one coalesced [edges, kept, summed] tile reduced in registers; unrolled, it loaded
    every term separately at a stride of ``summed`` elements."""
    split = row_sum_tile(root)
    return split if split is not None and split.tile <= 128 else None


def row_sum_tile(root: Value) -> RowSum | None:
    """`row_sum_split`'s tile at any width: an edge unit whose root is such a sum walks
    it in blocks of whole heads (`RowSum.block`), one program each, where a unit body
    recomputing it holds every head's tile at once and so is held to 128 lanes."""
    if feature_sum_terms(root) is None:
        return None
    in_shape = root.inputs[0].shape
    if root.op == "sum_dim":
        summed_dims = {d % len(in_shape) for d in root.attrs["dim"]}
    elif len(in_shape) == len(root.shape):
        summed_dims = {d for d, (n, m) in enumerate(zip(in_shape, root.shape)) if m == 1 and n != 1}
    else:
        return None
    kept_dims = [d for d, n in enumerate(in_shape) if d not in summed_dims and n != 1]
    if kept_dims and summed_dims and max(kept_dims) > min(summed_dims):
        return None
    kept = math.prod(root.shape)
    summed = math.prod(in_shape) // max(kept, 1)
    return RowSum(kept, summed, 1 << max(summed - 1, 0).bit_length()) if kept > 0 else None


# Heads whose scores a unit body may recompute: the Triton emitter evaluates each kept
# head's score as a tile of its own (codegen's `row_sum`), unrolled, so a kernel's size
# and compile time grow with the head count (Triton 3.6, sm_90: GATv2 8 heads x 8 at most
# 1.8 s per autotuner config, 32 x 4 5 s); past this, the scores are written once.
MAX_TILED_HEADS = 16


def tiles_in_body(v: Value) -> bool:
    """Whether per-edge feature sum ``v`` can be recomputed in the bodies of the units
    that read it: it fits a row tile (`row_sum_split`) of at most `MAX_TILED_HEADS` kept
    elements."""
    split = row_sum_split(v)
    return split is not None and split.kept <= MAX_TILED_HEADS


def summed_operand(v: Value) -> Value | None:
    """The per-edge operand a shared-reduce unit evaluates in registers when ``v`` can be
    its root, else None. Two roots: a row sum into a parameter shape (``sum_to``, the
    gradient of a parameter used elementwise on edges) and the weight gradient of a
    per-edge matmul, ``matmul_tn(x, g)`` = sum over edges of outer(x_e, g_e), with ``x``
    an edge value read from memory (the user's edge features) and ``g`` per-edge work."""
    if v.op == "sum_to" and v.residency is Residency.SHARED:
        x = v.inputs[0]
        terms = math.prod(x.shape) // max(math.prod(v.shape), 1)
        return x if x.residency.is_edge_rowed and _fusible_body(x) and terms <= MAX_UNROLLED_FEATURE_SUM else None
    if v.op == "matmul_tn":
        x, g = v.inputs
        one_row = all(i.residency.is_edge_rowed and len(i.shape) == 1 for i in (x, g))
        return g if one_row and not _fusible_body(x) and _fusible_body(g) else None
    return None


def _edge_root(v: Value) -> bool:
    if v.op in ("input", "broadcast") or not v.residency.is_edge_rowed:
        return False
    terms = feature_sum_terms(v)
    if terms is not None:
        return terms <= MAX_UNROLLED_FEATURE_SUM
    return _fusible_body(v)


def _row_scaled(v: Value, users: dict[int, int], needed: set[int]) -> tuple[Value, Value] | None:
    """(reduce, scale) when ``v`` multiplies or divides a sum over neighbours by a
    per-row scalar and is the sum's only use (GCN's ``sum(...) * v.norm`` and its
    backward, a mean's ``sum(...) / degree``): the kernel then scales each finished row
    before storing it. As a separate op the product read and wrote every row once more
    -- 4.7 of the 38 ms of a products-sized GCN step on an H100. Only a sum: scaling is
    linear, so split rows' partial sums and the edge-parallel schedule's per-edge atomic
    terms may each be scaled."""
    if v.op not in ("mul", "div") or len(v.inputs) != 2:
        return None
    for reduce, scale in (v.inputs, v.inputs[::-1]) if v.op == "mul" else (v.inputs,):
        if (_kernel_reduce(reduce) and reduce.attrs["op"] == "sum" and reduce.residency is Residency.NODE
                and scale.residency is Residency.NODE
                and math.prod(scale.shape) == 1 and _finite_scale(scale, v.op) and reduce.shape == v.shape
                and reduce.dtype == v.dtype == scale.dtype and users.get(reduce.id) == 1
                and reduce.id not in needed):
            return reduce, scale
    return None


def _finite_scale(scale: Value, op: str) -> bool:
    """Whether ``scale`` is a per-row table the UDF was given (GCN's norm, a saved
    forward value), the in-degree clamped to at least one (a mean's divisor) or, as a
    multiplier, the in-degree itself.

    Scaling each edge's term (edge-parallel schedule) or each part of a split row
    equals scaling the finished sum only for a finite, nonzero-divisor scale: where
    eager code divides a row's empty sum by an empty sum (``sum(w * h) / sum(w)``, a
    hand-written softmax's normaliser) or multiplies it by ``len(v.innbs) ** -0.5``,
    the row is NaN, and the per-term form left it 0 (found by differential fuzzing).
    Scales computed in the UDF therefore stay a separate op after the sum. A given
    table holding inf or NaN is not caught here (README, "Non-finite values")."""
    if scale.op == "input":
        return True
    return (scale.op == "clamp_min" and scale.attrs["min"] >= 1.0 and scale.inputs[0].op == "degree") or (
        op == "mul" and scale.op == "degree")


def _row_added(v: Value, users: dict[int, int], needed: set[int]
               ) -> tuple[Value, tuple[Value, Value] | None, Value] | None:
    """(the reduced or row-scaled row, its `_row_scaled` (reduce, scale) or None, the
    addend) when ``v`` adds a vertex table of the output's shape to a reduction by
    ``src`` or ``dst`` (after at most a per-row scale) that feeds nothing else -- SAGE's
    and GraphConv's ``mean(neighbours) + x W_r`` -- or a parameter row (GCN's bias):
    the kernel adds the vertex's row when it stores its own (in a split row's first
    segment only; an edge-parallel launch adds it after its atomics), where as a separate
    op the sum read and wrote every row once more. On a products-sized SAGE step (47
    classes, H100, one process) the add took 0.51 ms and the aggregation's kernel grew
    by 0.43: 36.44 -> 36.35 ms, and one [N, out] table fewer. Not when the addend is
    itself a reduction (or a scaled one): two sums added share one walk as siblings
    (passes/siblings.py) instead."""
    if v.op != "add" or len(v.inputs) != 2 or v.residency is not Residency.NODE:
        return None
    for inner, addend in (v.inputs, v.inputs[::-1]):
        reduce, scaled = inner, None
        if inner.op in ("mul", "div"):
            scaled = _row_scaled(inner, users, needed)
            if scaled is None:
                continue
            reduce = scaled[0]
        if (_kernel_reduce(reduce) and reduce.residency is Residency.NODE
                and addend.residency in (Residency.NODE, Residency.SHARED)
                and addend.op != "const" and addend is not inner and not _reduced(addend)
                and inner.shape == addend.shape == v.shape
                and inner.dtype == addend.dtype == v.dtype and users.get(inner.id) == 1
                and inner.id not in needed):
            return inner, scaled, addend
    return None


def _kernel_reduce(v: Value) -> bool:
    """``v`` is a reduction by ``src`` or ``dst`` a kernel can run: of float values.
    An integer one (a sum or max of integer messages, DGL's ``mailbox[k].sum(1)`` of
    type ids) stays a torch op, as integer bodies do (`_fusible_body`): a kernel
    accumulates in its float ACC, so a sum of 2**24 + 1 and 2 gave 2**24 + 2."""
    return (v.op == "reduce" and v.attrs["by"] in ("src", "dst") and v.attrs["op"] in FUSIBLE_REDUCERS
            and v.dtype.is_floating_point)


def _reduced(v: Value) -> bool:
    """``v`` is a reduction, or one multiplied or divided by something."""
    return v.op == "reduce" or (v.op in ("mul", "div") and any(i.op == "reduce" for i in v.inputs))


def partition(program: Program, keep: Iterable[int] = (), tile_feature_sums: bool = False,
              row_addends: bool = False, type_sums: bool = False) -> list[Unit | TypeSumUnit | Value]:
    """The program's computing values in order, with fused units replacing what they cover.

    ``keep`` holds ids of values that must be materialized (saved for backward). Every
    fusible reduce becomes a unit that pulls in all the per-edge work feeding it. Cheap
    per-edge values (gathers, elementwise arithmetic) are *recomputed* in every unit that
    needs them rather than written once and read back: an edge softmax's scores, say,
    feed its max pass, its sum pass and the weighted aggregation, and recomputing them
    from gathered vertex rows costs far less than an |E|-sized round trip to memory.
    A value reaches memory only if a plain op reads it, a unit reads it as a leaf, or
    it is kept or returned; a per-edge one then becomes the root of an edge unit.

    ``tile_feature_sums`` (the Triton backend): a per-edge feature sum that fits a row
    tile (`tiles_in_body`) joins the body of every unit that reads it, which evaluates
    it from its own gathered rows as a [edges, kept, summed] tile reduced in registers.
    An edge softmax's [E, H] scores then never reach memory: its max pass, sum pass and
    weighted aggregation each recompute them (flash-attention style), and so do the
    backward units, where the gathered rows are mostly read anyway.

    A sum multiplied by a per-row scalar joins the sum's unit (`_row_scaled`), and with
    ``row_addends`` (the Triton backend) a vertex table added to the result does too
    (`_row_added`). With ``type_sums`` (the Triton backend) a sum by edge type of
    per-edge work is a `TypeSumUnit`, which `passes/siblings.py` lets ride a CSR walk,
    and per-edge-type tables are read in bodies (`type_gather`)."""
    def in_body(x: Value) -> bool:
        return _fusible_body(x) or (tile_feature_sums and tiles_in_body(x)) or (type_sums and type_gather(x))

    def grow(unit: Unit) -> Unit:
        root = unit.reduce if isinstance(unit, AggregateUnit) else unit.root
        members: set[int] = set()
        reachable = {i.id for i in root.inputs}
        for x in reversed(program.values[: program.values.index(root)]):
            if x.id in reachable and x.id not in keep and in_body(x):
                members.add(x.id)
                reachable.update(i.id for i in x.inputs)
        unit.body = [x for x in program.values if x.id in members]
        unit.leaves = [x for x in program.values if x.id in reachable and x.id not in members]
        for per_row in (getattr(unit, "scale", None), getattr(unit, "addend", None)):
            if per_row is not None and per_row not in unit.leaves:
                unit.leaves.append(per_row)     # read from memory once per row, after the loop
        return unit

    if has_empty_rows(program):
        return [v for v in program.values if v.op != "input"]
    keep = set(keep)
    needed = keep | {v.id for v in program.outputs.values()}
    users: dict[int, int] = {}
    for v in program.values:
        for i in v.inputs:
            users[i.id] = users.get(i.id, 0) + 1
    for v in program.outputs.values():
        users[v.id] = users.get(v.id, 0) + 1
    returned = {v.id for v in program.outputs.values()}
    chosen: dict[int, Unit | Value] = {}
    # Reverse topological order decides every user of a value before the value itself.
    for v in reversed(program.values):
        if v.op == "input" or v.id not in needed:
            continue
        if row_addends and (added := _row_added(v, users, needed)) is not None:
            inner, scaled, addend = added
            item: Unit | Value = grow(AggregateUnit(scaled[0], scale=scaled[1], scaled=inner, addend=addend, added=v)
                                      if scaled else AggregateUnit(inner, addend=addend, added=v))
        elif (scaled := _row_scaled(v, users, needed)) is not None:
            item = grow(AggregateUnit(scaled[0], scale=scaled[1], scaled=v))
        elif _kernel_reduce(v):
            item = grow(AggregateUnit(v))
        elif (type_sums and (operand := type_summed(v, users)) is not None and operand.id not in keep
              and _edge_root(operand)):
            item = TypeSumUnit(v, grow(EdgeUnit(operand)))
        elif _edge_root(v) and not (v.id not in returned and _view_of_table(v, keep, in_body)):
            item = grow(EdgeUnit(v))
        elif (operand := summed_operand(v)) is not None and operand.id not in keep:
            item = grow(SharedReduceUnit(v))
        else:
            item = v
        chosen[v.id] = item
        reads = item.inputs if isinstance(item, Value) else item.leaves
        needed.update(i.id for i in reads)
    return [chosen[v.id] for v in program.values if v.id in chosen]


def _view_of_table(v: Value, keep: set[int], in_body) -> bool:
    """``v`` reshapes a value that reaches memory anyway (an input, a kept value, a torch
    op's result): torch's reshape is then a view of it, where an edge unit copied every
    row -- in NNConv's backward, a second [E, in x out] table (4.8 GB on the arxiv-sized
    graph) holding the per-edge weight gradient again. Not for a returned value: a view
    of a table the backward may save would let an in-place edit of the output reach it."""
    x = v.inputs[0] if v.op == "reshape" else None
    return x is not None and (x.id in keep or not in_body(x))


def has_empty_rows(program: Program) -> bool:
    """Whether some value of ``program`` has a feature dim of size 0 (``x`` of shape
    [N, 0]). The kernel generators assume every row holds an element: a Triton kernel
    loaded from the empty table with only the edge mask (the interpreter crashed with a
    segmentation fault; on a GPU an out-of-bounds read), and a Numba edge kernel summing
    no terms wrote ``out[...] =`` with nothing after it (a SyntaxError). Such a program
    has nothing to gather, so every op runs through its torch reference."""
    return any(0 in v.shape for v in program.values)


def gathered_leaves(unit: Unit) -> dict[int, list[str]]:
    """For every vertex leaf a unit reads through a gather, the indices (``"src"``,
    ``"dst"``) it is gathered by -- directly, or through per-vertex work in the body."""
    members = {v.id: v for v in unit.body}
    sides: dict[int, list[str]] = {}

    def visit(x: Value, by: str) -> None:
        if x.id in members and x.residency is Residency.NODE:
            for i in x.inputs:
                visit(i, by)
        elif x.residency is Residency.NODE and by not in sides.setdefault(x.id, []):
            sides[x.id].append(by)

    for b in unit.body:
        if b.op == "broadcast":
            visit(b.inputs[0], b.attrs["by"])
    return sides


def leaf_kind(leaf: Value) -> str:
    """How a kernel reads a leaf: ``const`` (inlined), ``shared`` (no row), ``node``
    (gathered through a fused broadcast), ``type`` (a per-edge-type table, gathered by
    each edge's type through a fused broadcast by ``etype``) or ``edge`` (rows by edge id)."""
    if leaf.op == "const":
        return "const"
    if leaf.residency is Residency.SHARED:
        return "shared"
    if leaf.residency is Residency.EDGE_TYPE:
        return "type"
    return "node" if leaf.residency is Residency.NODE else "edge"


def type_gather(v: Value) -> bool:
    """``broadcast(table, by=etype)``: a per-edge-type float table read on each edge.
    With ``type_sums`` (the Triton backend) it joins unit bodies, where the kernel loads
    the edge's type and reads the table's row for it (a few rows, cached), instead of a
    torch gather writing the [E, ...] table every unit then reads: on the mag-sized HGT
    step four such gathers of 21.1M edges took 0.8 ms on an H200."""
    return (v.op == "broadcast" and v.attrs["by"] == TYPE_INDEX and v.inputs[0].residency is Residency.EDGE_TYPE
            and v.dtype.is_floating_point)


def gather_side(broadcast: Value, unit: Unit | TypeSumUnit, walk: str | None = None) -> str:
    """In a reduce unit, a fused broadcast along the unit's own index reads the row's
    vertex (``center``) and along the other endpoint gathers the ``neighbour``; an edge
    unit gathers by the edge's ``src`` or ``dst``. ``walk``: the CSR a kernel walks
    (``src`` or ``dst``) when it is not the unit's own index, as for a sum by edge type
    riding a sibling group's walk (`passes/type_sums.py`)."""
    if broadcast.attrs["by"] == TYPE_INDEX:
        return "type"
    if walk not in ("src", "dst"):
        if not isinstance(unit, AggregateUnit):
            return broadcast.attrs["by"]
        walk = unit.by
    return "center" if broadcast.attrs["by"] == walk else "neighbour"
