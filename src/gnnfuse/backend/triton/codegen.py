"""Turn a fused unit into the source of one Triton kernel: an aggregate unit into a
vertex-parallel CSR kernel (`generate`) or an edge-parallel COO one with atomic adds
(`generate_coo`), an edge unit into an edge-parallel kernel that writes each edge's row
(`generate_edge`), a shared-reduce unit into an edge-parallel kernel that sums its
edges into one parameter-shaped partial per program (`generate_shared_reduce`), and a
group of aggregate units over the same CSR into one walk with an output each
(`generate_siblings`).

CSR schedule (fuseGNN's GAR, Seastar's locality-centric execution): one program owns one
segment of a group row's edges (the row is a destination vertex for forward reductions,
a source vertex for backward ones over the reverse CSR) and one block of output
features; it walks the segment in chunks of BLOCK_E, gathers what the unit reads,
evaluates the unit's per-edge expression in registers and accumulates. A row short
enough to be one segment -- almost every row -- is written once with no atomics; a
high-degree row is split into several segments, so one hub cannot serialize the launch
(FeatGraph's hybrid partitioning), which add their partial sums into a workspace, and
the last to arrive stores the row (`_split_row_fixup`). Segments are visited
longest first (Seastar §6.3.3's degree sorting).

Values are evaluated at *coordinates*: each output feature index f maps to coordinates
in every value's per-element shape (right-aligned broadcasting, reshapes remapped through
the flat index), so multi-head shapes such as scores (H,) against messages (H, C) need no
materialized broadcast. Values with one element per row are loaded once per row and
broadcast in registers (`_Emitter.scalar_load`); vertex rows of odd width are read from
a copy padded for aligned vector loads (`row_stride`); a per-edge sum over trailing
feature dims reduces a whole row tile (`row_sum_split`).
"""
from __future__ import annotations

import inspect
import itertools
import math

import torch
import triton

from ...ir import Residency, Value, get_op
from ...ir.rounded import quotient
from ...passes.fusion import (AggregateUnit, EdgeUnit, RowSum, SharedReduceUnit, Unit, feature_sum_terms,
                              gather_side, leaf_kind, row_sum_split, row_sum_tile)
from ...passes.siblings import SiblingGroup
from ..constant_args import constant_slots
from ...passes.type_sums import MAX_RIDER_TILE, TypeSumUnit
from ..row_layout import aligned_row_width
from ..coords import project as _project, strides as _strides, summed_coords as _summed_coords

# An op's result of these dtypes is rounded to them (`_Emitter.narrowed`).
_NARROW = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}
_IDENTITY = {"sum": "0.0", "mean": "0.0", "max": "float('-inf')", "min": "float('inf')"}
# The kernel variable holding the row id of each edge's gathered row, by gather kind.
_ROW_INDEX = {"neighbour": "nbr", "edge": "edge", "src": "src_id", "dst": "dst_id", "type": "etp"}


# The line loading a chunk's edge types: a kernel that has it takes the types argument.
TYPE_LOAD = "etp = tl.load(etype + e, mask=emask, other=0).to(tl.int64)"


class _Emitter:
    def __init__(self, unit: Unit | SiblingGroup, sides: dict[str, str] | None = None):
        self.unit = unit    # for a sibling group: the member being emitted (`use_lanes`)
        self.walk = getattr(unit, "by", None)   # the CSR a walk groups by (a rider's gathers follow it)
        self.sides = sides or {}     # gather side -> the index variable a schedule names it by
        self.lines: list[str] = []
        self.memo: dict[tuple, str] = {}
        self.names: dict[str, str] = {}
        self.leaf_args: list[Value] = [v for v in unit.leaves if leaf_kind(v) != "const"]
        self.leaf_index = {v.id: n for n, v in enumerate(self.leaf_args)}
        # numbers the kernel reads from its ``K`` arguments, not as literals (constant_args.py)
        self.constant_index = {(v.id, key): n for n, (v, key) in enumerate(constant_slots(unit))}
        # the feature lanes values are evaluated on: the kernel's [BLOCK_F] block, or a
        # row tile's lanes while a feature sum in the body is evaluated (`row_sum`)
        self.lane, self.zero, self.lanes = "f", "fzero", "BLOCK_F"
        # expressions with one value per program (see `head_block`): loads at them are one
        # per gathered row, and arithmetic on them runs once per edge, not per feature lane
        self.uniform: set[str] = set()
        self.tile_lanes = 0   # the widest row tile a feature sum in the body evaluates (`row_sum`)
        self.row_lanes: tuple[str, ...] | None = None   # the coordinates of a flat output's lanes
        # while a sibling member taking a maximum online is emitted: (maximum, its scores,
        # member position, lane block, the normalizer it divides by or None), see `online_shift`
        self.shift: tuple[Value, Value, int, int, Value | None] | None = None
        self.shift_coords: dict[int, tuple[str, ...]] = {}
        self.typed = False    # whether the chunk's edge types ``etp`` are loaded (`edge_types`)
        # names standing for a normalizer read as 1 (`own_total`): a division by one is its
        # numerator, exactly; emitted, it was a correctly rounded division per edge and lane
        self.ones: set[str] = set()

    def use_lanes(self, unit: AggregateUnit | TypeSumUnit, lane: str) -> None:
        """Emit ``unit`` (a sibling group's member or rider) on feature lanes named ``lane``: its
        values get their own lane coordinates, while row-level values (scalar loads,
        head score tiles) are shared with the members emitted before."""
        self.unit, self.lane, self.zero, self.row_lanes = unit, lane, f"{lane}zero", None

    def online_shift(self, peak: Value | None, scores: Value | None = None, member: int = 0, block: int = 0,
                     total: Value | None = None) -> None:
        """Evaluate the maximum ``peak`` (of ``scores``) as member ``member``'s running
        maximum from here on (None: stop), and ``total``, a sum of the exponentials
        it shifts, as 1 while the member keeps its own copy ``den{member}`` to divide
        by at the end. `generate_siblings` declares ``run{member}`` and accumulates
        with ``rescale{member}``; `running_peak` defines them."""
        self.shift = None if peak is None else (peak, scores, member, block, total)

    def own_total(self, coords: tuple[str, ...]) -> str:
        """1 in place of the normalizer ``T = sum p`` at ``coords`` (``p / T``'s divisor),
        adding this chunk's ``p`` there to the member's own running ``den{n}``."""
        _, _, n, block, total = self.shift
        p = self.value(total.inputs[0], coords)
        self.lines.append(f"den{n} = den{n} * rescale{n} + tl.sum(tl.where(emask[:, None], {p} + "
                          f"tl.zeros([BLOCK_E, {block}], ACC), 0.0), axis=0)")
        one = self.constant(1.0)
        self.ones.add(one)
        return one

    def running_peak(self, coords: tuple[str, ...]) -> str:
        """The running maximum at ``coords`` (of the maximum's shape), [1, lanes]: this
        chunk's scores raise ``run{n}`` to ``peak{n}``, and ``rescale{n}`` (1 where it
        did not move) carries what was summed before to the new shift. A maximum still
        -inf is read as 0, so a chunk of -inf scores adds exp(-inf) = 0, not NaN; the
        kernel writes NaN for a row that ends so."""
        peak, scores, n, block, _ = self.shift
        if self.shift_coords.setdefault(n, coords) != coords:
            raise AssertionError("a member reads its softmax shift at two coordinates (online_softmax.online_terms)")
        tile = self.value(scores, coords)
        self.lines.append(f"peak{n} = tl.maximum(run{n}, tl.max(tl.where(emask[:, None], {tile} + "
                          f"tl.zeros([BLOCK_E, {block}], ACC), float('-inf')), axis=0))")
        self.lines.append(f"rescale{n} = tl.where(run{n} == peak{n}, 1.0, tl.exp(run{n} - peak{n}))")
        return self.tmp(f"tl.where(peak{n} == float('-inf'), 0.0, peak{n})[None, :]")

    def tmp(self, expr: str) -> str:
        if expr not in self.names:
            self.names[expr] = f"t{len(self.names)}"
            self.lines.append(f"{self.names[expr]} = {expr}")
        return self.names[expr]

    def uniform_tmp(self, expr: str) -> str:
        name = self.tmp(expr)
        self.uniform.add(name)
        return name

    def feature_coords(self, shape: tuple[int, ...], block: int | None) -> tuple[str, ...]:
        """The coordinates in ``shape`` of the kernel's feature lanes ``f``. With a
        `head_block`, every coordinate but the last is the same on all lanes of a program
        (its block of BLOCK_F lanes lies inside one row of the last dim), so it is computed
        from the block's first lane as a scalar; a static assert keeps the launch honest."""
        if block is None:
            coords = tuple("0" if n == 1 else self.tmp(f"({self.lane} // {st}) % {n}")
                           for st, n in zip(_strides(shape), shape))
            if len(shape) == 1:   # lane f is column f of a flat row: see `padded_lanes`
                self.row_lanes = coords
            return coords
        self.lines.append(f"tl.static_assert({shape[-1]} % BLOCK_F == 0)")
        first = self.uniform_tmp("tl.program_id(1) * BLOCK_F")
        lead = tuple("0" if n == 1 else self.uniform_tmp(f"({first} // {st}) % {n}")
                     for st, n in zip(_strides(shape)[:-1], shape[:-1]))
        return lead + (self.tmp(f"f % {shape[-1]}"),)

    def number(self, v: Value, key: str) -> str:
        """``v.attrs[key]`` (a constant's value, an op's numeric setting) in the accumulator
        type: read from its ``K`` argument, [1] like the literal it stands for, where the
        kernel takes one (`constant_args`), else that literal."""
        n = self.constant_index.get((v.id, key))
        if n is None:
            return self.constant(v.attrs[key])
        return self.tmp(f"tl.load(K{n} + tl.zeros([1], tl.int32)).to(ACC)")

    def constant(self, value: float) -> str:
        """A constant in the accumulator type: a bare literal would be float32 in Triton
        and round, e.g., a 0.2 slope by 1.5e-8 in a float64 kernel."""
        return self.tmp(f"tl.full([1], {_literal(value)}, ACC)")

    def offset(self, shape: tuple[int, ...], coords: tuple[str, ...]) -> str:
        """The flat offset of ``coords`` in ``shape``: uniform (one per program, `uniform`)
        when every coordinate is, a literal included. A literal is what an unrolled
        per-edge matmul reads its operand at (``edge_attr[e, k] * W[k, f]`` for each k):
        as a lane vector each k was BLOCK_E x BLOCK_F loads of one address per row, and
        GINEConv's forward kernel (eight k) took Triton 3.6 129 s to autotune on an H200;
        uniform, it is one load per row."""
        terms = [f"{c} * {s}" if s != 1 else c for c, s in zip(coords, _strides(shape)) if c != "0"]
        if all(c in self.uniform or c.isdigit() for c in coords):
            return self.uniform_tmp(" + ".join(terms) or "0")
        return self.tmp(" + ".join(terms) + f" + {self.zero}" if terms else self.zero)

    def derived(self, expr: str, *parts: str) -> str:
        """A coordinate computed from ``parts``: uniform when they all are."""
        return self.uniform_tmp(expr) if all(p in self.uniform for p in parts) else self.tmp(expr)

    def value(self, v: Value, coords: tuple[str, ...], side: str | None = None) -> str:
        """Expression for ``v`` at ``coords``. ``side`` is set while evaluating per-vertex
        values on a gathered row: how that row is found (``center``, ``neighbour``,
        ``src``, ``dst``)."""
        key = (v.id, coords, side, self.zero)
        if key in self.memo:
            return self.memo[key]
        if self.shift is not None and v is self.shift[0]:
            out = self.running_peak(coords)
        elif self.shift is not None and v is self.shift[4]:
            out = self.own_total(coords)
        elif v.id in self.leaf_index or v.op == "const":
            kind = leaf_kind(v)
            out = self.load(v, coords, side if kind == "node" and side else kind)
        elif feature_sum_terms(v) is not None:   # a per-edge feature sum in the body (scores)
            out = self.narrowed(v, self.row_sum(v, coords))
        elif v.op == "broadcast":
            side = gather_side(v, self.unit, self.walk)
            out = self.value(v.inputs[0], coords, self.sides.get(side, side))
        elif v.op == "reshape":
            flat = self.offset(v.shape, coords)
            src = v.inputs[0]
            out = self.value(src, tuple(self.derived(f"({flat} // {st}) % {n}", flat) if n != 1 else "0"
                                        for st, n in zip(_strides(src.shape), src.shape)), side)
        elif v.op == "expand":   # a size-1 (or missing leading) dim reads the input's one element
            out = self.value(v.inputs[0], _project(coords, v.shape, v.inputs[0].shape), side)
        elif v.op == "matmul":   # an edge-feature matmul (passes.fusion.edge_feature_matmul), unrolled
            x, w = v.inputs
            out = self.narrowed(v, self.tmp(" + ".join(
                f"{self.value(x, (str(k),), side)} * {self.value(w, (str(k), coords[-1]), side)}"
                for k in range(x.shape[0]))))
        elif v.op == "slice_features":   # output coordinate c reads input start + step * c
            out = self.value(v.inputs[0], tuple(
                str(start) if c == "0" else c if (start, step) == (0, 1) else self.derived(f"{start} + {step} * {c}", c)
                for c, (start, step, _) in zip(coords, v.attrs["window"])), side)
        else:
            args = [self.promoted(i, self.value(i, _project(coords, v.shape, i.shape), side), v) for i in v.inputs]
            if v.op == "div" and args[1] in self.ones:
                self.memo[key] = args[0]
                return args[0]
            attrs = {k: self.number(v, k) for k, a in v.attrs.items()
                     if isinstance(a, (int, float)) and not isinstance(a, bool)}
            for n, step in enumerate(get_op(v.op).emit_steps(v)):
                out = attrs[f"s{n}"] = self.tmp(step.format(*args, **attrs))
            out = self.narrowed(v, out)
        self.memo[key] = out
        return out

    def promoted(self, i: Value, arg: str, v: Value) -> str:
        """``arg``, the value of ``v``'s input ``i``, as torch's type promotion hands it to
        ``v``: an integer or bool input of a float16/bfloat16 op rounded to that dtype
        first, as torch casts every operand to the op's dtype. Read straight into the
        float32 accumulator, 2051 * 3 in float16 came out 6152 (6153 rounded) where torch
        gives 6156 (2052 * 3); the CPU generator does the same (`backend.cpu.codegen`)."""
        return arg if i.dtype.is_floating_point else self.narrowed(v, arg)

    def narrowed(self, v: Value, out: str) -> str:
        """``out``, the value of op ``v``, rounded to ``v``'s dtype where that is float16 or
        bfloat16, as torch rounds each op's result (and the reference executor, running
        those ops). Carried unrounded in the float32 accumulator, a recomputed score
        could exceed the maximum a unit before had stored rounded to bfloat16 -- by up
        to half a unit in its last place, 2048 at 1e6 -- and ``exp(score - max)``
        overflowed: an edge softmax of large bfloat16 scores came out inf and NaN (found
        on the CPU backend, whose kernels computed the same way)."""
        if v.dtype not in _NARROW:
            return out
        return self.tmp(f"{out}.to({_NARROW[v.dtype]}).to(ACC)")

    def row_sum(self, v: Value, coords: tuple[str, ...]) -> str:
        """A per-edge feature sum at ``coords`` (an attention score per head), [BLOCK_E, 1]
        or [BLOCK_E, lanes]. In a program whose lanes lie in one head (`head_block`) only
        that head's score is evaluated (`head_score`); otherwise every kept head's score
        is, and each lane picks its head's with a chain of ``tl.where``. partition only
        puts sums that fit a tile (`passes.fusion.tiles_in_body`) in a body.

        Why per head: the first form evaluated the whole [BLOCK_E, kept x padded] row
        tile, reduced it through a 3-D reshape and cut each head's column out with a
        masked sum; in a program of one head (GATv2 4 x 32's weighted sum: four
        programs per row) that was four heads' gathers and arithmetic for the one score
        it needs, and the reshape and column sums made Triton 3.6's compile of GATv2
        8 x 8 the slowest of the tiled kernels. Per-head tiles are 2-D loads and row
        reductions, the forms every kernel here compiles. Before that, a ``tl.gather`` per
        lane asserted in TritonGPUOptimizeThreadLocality on an H100 (2 x 3). The selects
        keep a non-finite score in its own head."""
        split = row_sum_split(v)
        head = self.offset(v.shape, coords)
        if head in self.uniform:
            return self.head_score(v, split, head)
        self.tile_lanes = max(self.tile_lanes, split.tile)   # all heads' tiles are live in one chunk
        scores = [self.head_score(v, split, str(h)) for h in range(split.kept)]
        out = scores[0]
        for h in range(1, split.kept):
            out = self.tmp(f"tl.where(({head} == {h})[None, :], {scores[h]}, {out})")
        return out

    def head_score(self, v: Value, split: RowSum, head: str) -> str:
        """Head ``head``'s sum, [BLOCK_E, 1]: its [BLOCK_E, padded] tile of the summed
        operand, evaluated on lanes of its own (lane j at flat index head * summed + j;
        coordinates wrap within the operand's shape, so padding lanes read in-bounds
        elements, which are zeroed), summed over the lanes."""
        key = ("head score", v.id, head)
        if key in self.memo:
            return self.memo[key]
        kept, summed, padded = split
        self.tile_lanes = max(self.tile_lanes, padded)
        outer = self.zero, self.lanes
        lanes = self.tmp(f"tl.arange(0, {padded})")
        self.zero, self.lanes = self.tmp(f"{lanes} * 0"), str(padded)
        flat = self.tmp(f"{head} * {summed} + {lanes}")
        in_shape = v.inputs[0].shape
        tile = self.value(v.inputs[0], tuple("0" if n == 1 else self.tmp(f"({flat} // {st}) % {n}")
                                             for st, n in zip(_strides(in_shape), in_shape)))
        tile = self.tmp(f"{tile} + tl.zeros([BLOCK_E, {padded}], ACC)")
        if padded != summed:
            tile = self.tmp(f"tl.where(({lanes} < {summed})[None, :], {tile}, 0.0)")
        self.zero, self.lanes = outer
        self.memo[key] = self.tmp(f"tl.sum({tile}, axis=1)[:, None]")
        return self.memo[key]

    def params(self) -> str:
        """The kernel's leaf pointer parameters, its constants' (`constant_args`), then
        ``etype`` where it loads each edge's type (`edge_types`): the types, one per
        position ``e`` it walks."""
        return self.leaf_params() + ("etype, " if self.typed else "")

    def leaf_params(self) -> str:
        """The leaves' and the constants' pointer parameters, each followed by a comma."""
        return "".join(f"L{n}, " for n in range(len(self.leaf_args))) + "".join(
            f"K{n}, " for n in range(len(self.constant_index)))

    def edge_types(self) -> str:
        """``etp``, the types of the chunk's edges (loaded once per chunk): position ``e``
        of the array the executor passes, in CSR order for a walk and edge order
        otherwise (`executor.types_at`), so they are read in order, not gathered
        through the edge ids."""
        if not self.typed:
            self.lines.append(TYPE_LOAD)
            self.typed = True
        return "etp"

    def load(self, v: Value, coords: tuple[str, ...], kind: str) -> str:
        if kind == "const":
            return self.number(v, "value")
        if kind == "type":
            self.edge_types()
        ptr, width = f"L{self.leaf_index[v.id]}", math.prod(v.shape)
        if width == 1:
            return self.scalar_load(ptr, kind)
        off, stride = self.offset(v.shape, coords), row_stride(v)
        if stride != width and coords == self.row_lanes:
            off = self.padded_lanes(stride)
        if off in self.uniform:        # one element per row for the whole program
            if kind == "shared":
                return self.tmp(f"tl.load({ptr} + {off}).to(ACC)")
            if kind == "center":
                return self.tmp(f"tl.load({ptr} + row * {stride} + {off}).to(ACC)")
            return self.tmp(f"tl.load({ptr} + {_ROW_INDEX[kind]} * {stride} + {off}, mask=emask, "
                            "other=0.0).to(ACC)[:, None]")
        if kind == "shared":
            return self.tmp(f"tl.load({ptr} + {off}[None, :]).to(ACC)")
        if kind == "center":
            return self.tmp(f"tl.load({ptr} + row * {stride} + {off}[None, :]).to(ACC)")
        index = _ROW_INDEX[kind]
        return self.tmp(f"tl.load({ptr} + {index}[:, None] * {stride} + {off}[None, :], "
                        f"mask=emask[:, None], other=0.0).to(ACC)")


    def padded_lanes(self, stride: int) -> str:
        """Offsets of the lanes in a padded vertex row (`row_stride`) read at the lanes of
        a flat (one-dim) output of the same width: lane f reads column
        f % stride, which is column f for every stored lane (f < width) and stays inside
        the row (the zero pad, or wrapped) for the rest, which the store masks off. Read
        at f % width instead, no lane run is provably contiguous (width is odd), every
        load is scalar, and GCN's aggregation at 47 classes ran 1.7x slower than at 64
        on an H100, padding and all."""
        return self.tmp(f"{self.lane} % {stride} + {self.zero}")

    def scalar_load(self, ptr: str, kind: str) -> str:
        """A value with one element per row (a GCN norm, a degree) is loaded once per row
        and broadcast over the feature block in registers; loading it at every feature
        coordinate issued BLOCK_F loads of one address and made a GCN unit 3x slower
        than a plain neighbour sum."""
        if kind == "shared":
            return self.tmp(f"tl.load({ptr}).to(ACC)")
        if kind == "center":
            return self.tmp(f"tl.load({ptr} + row).to(ACC)")
        return self.tmp(f"tl.load({ptr} + {_ROW_INDEX[kind]}, mask=emask, other=0.0).to(ACC)[:, None]")


def _literal(value: float) -> str:
    """A float as kernel source: ``repr`` writes inf and NaN as the bare names ``inf`` and
    ``nan``, which no kernel defines (``x * float('inf')`` or ``clamp(max=float('inf'))``
    failed to compile with a NameError)."""
    value = float(value)
    return repr(value) if math.isfinite(value) else f"float('{value}')"


def _tile(expr: str, shape: str) -> str:
    """``expr`` broadcast to a tile of ``shape`` in ACC, by adding -0.0: the identity of
    addition for every value. Adding ``tl.zeros`` (+0.0) made a -0.0 +0.0, which a
    stored edge value or a max keeps: ``1 / s`` of an edge value ``-h`` at h = 0 then
    gave inf where torch gives -inf."""
    return f"{expr} + tl.full({shape}, -0.0, ACC)"


def head_block(unit: Unit) -> int | None:
    """The largest feature block (BLOCK_F) whose lanes share every coordinate but the
    last, for a unit with a multi-head output (H, D) that also reads or computes narrower
    per-head values (attention scores and weights, [H] or [H, 1]); None when that does
    not apply. A block inside one head lets those values be loaded once per edge and
    their exp/div run once per edge, not once per lane: with the whole [H * D] row in
    one block they were gathered and recomputed D times, which made GATv2's backward
    aggregations at 4 heads x 32 seven times slower than at 1 x 64 on an H100. D must be
    a power of two (a block is), and at least 16 so a block still fills vector loads;
    the executor caps its launch's BLOCK_F at this value (`feature_block`)."""
    shape = unit.reduce.shape if isinstance(unit, AggregateUnit) else unit.root.shape
    last = shape[-1] if shape else 1
    if last < 16 or last & (last - 1) or not _per_head_values(unit, shape):
        return None
    return min(last, 128)


def _per_head_values(unit: Unit, shape: tuple[int, ...]) -> bool:
    """Whether ``unit``'s output ``shape`` is multi-head (H, D) and the unit reads or
    computes narrower per-head values beside it (attention scores and weights, [H] or
    [H, 1]): what `head_block` and `recomputed_lanes` lay their lanes out for."""
    width = math.prod(shape)
    return (len(shape) >= 2 and width != shape[-1]
            and any(1 < math.prod(v.shape) < width for v in (*unit.leaves, *unit.body)))


def row_stride(v: Value) -> int:
    """Elements between consecutive rows of leaf ``v`` as the kernel reads it: vertex
    rows at `aligned_row_width` (backend/row_layout.py says why), other rows packed."""
    width = math.prod(v.shape)
    return aligned_row_width(width) if v.residency is Residency.NODE else width


def size_class(count: int) -> int:
    """The autotuner's key for a launch over ``count`` edges or segments: counts within
    a factor of two share one tuned configuration (a small launch may pass another
    class instead: `tuning_class`)."""
    return int(count).bit_length()


def _decorator(tuned: bool, space: dict[str, tuple[int, ...]], key: str, reset: bool | tuple[str, ...],
               warps: tuple[int, ...] = (4,), pruned: list[tuple[tuple[int, ...], int]] | None = None) -> str:
    """``@triton.jit``, behind an autotuner over ``space`` (block sizes and rows per
    program) and ``warps`` when ``tuned``: the best choice depends on degree distribution
    and feature width, which a first timed run measures better than a rule. Every config
    is compiled before it is timed, so the space stays small (a GAT layer has a dozen
    kernels). Atomic kernels reset ``out`` (or the outputs ``reset`` names) between trials.
    ``pruned``, if given, lists the configs (values of ``space``'s names, warps) instead of
    all of ``space`` x ``warps``. The tuning key is the kernel's ``size_class`` argument
    (`size_class`: the bit length of its edge or segment count), not the count itself:
    mini-batch training gives every batch a new count, and keying on it re-tuned every
    kernel on every batch. The kernel never reads
    ``size_class``, so Triton does not specialize on it (it compiles a variant per integer
    argument that is 1 or a multiple of 16: a size class of 16 would have made one of
    every kernel and config). The edge and segment counts stay specialized: their
    divisibility lets masked loads vectorize, and they make at most a few variants."""
    jit = '@triton.jit(do_not_specialize=["size_class"])'
    if not tuned:
        return jit
    names = list(space)
    chosen = pruned if pruned is not None else [(values, w) for values in itertools.product(*space.values())
                                                for w in warps]
    configs = ", ".join(
        "triton.Config({" + ", ".join(f"'{n}': {v}" for n, v in zip(names, values)) + f"}}, num_warps={w})"
        for values, w in chosen)
    # milliseconds per trial: tuning costs well under a second per kernel. Through
    # `do_bench`, not the autotuner's own ``warmup=3, rep=10``: Triton deprecated those
    # (3.6 warns on every kernel loaded), and a program run with warnings as errors
    # (``-W error``, pytest's filterwarnings) failed to load any tuned kernel on a GPU
    extra = (", do_bench=lambda call, quantiles: triton.testing.do_bench(call, warmup=3, rep=10, quantiles=quantiles)"
             if "do_bench" in inspect.signature(triton.autotune).parameters else ", warmup=3, rep=10")
    reset = ("out",) if reset is True else reset or ()
    extra += f", reset_to_zero={list(reset)}" if reset else ""
    if "cache_results" in inspect.signature(triton.autotune).parameters:
        extra += ", cache_results=True"   # the choice persists on disk across processes
    return f"@triton.autotune(configs=[{configs}], key=['{key}']{extra})\n{jit}"


# The CSR kernels' autotuning space: edges per chunk and segments per program. The small
# ends are for low-degree graphs: on an arxiv-sized graph (average in-degree 7.9) a
# 16-edge chunk left half its lanes masked, and four rows per one-warp program left
# too little independent work to hide the gathers' latency. Adding chunks of 4 and 8
# edges and 8 or 16 rows per program took the GAT training step from 4.70 to 3.51 ms
# and the products-sized one from 107 to 85 ms (H200, same call; benchmarks/README.md).
# The price is compile time on first use: 16 configs per kernel instead of 4
# (Triton's autotuner keeps its choice on disk, so once per kernel and machine).
CSR_EDGE_BLOCKS = (4, 8, 16, 64)
CSR_ROWS = (1, 4, 8, 16)

# 32-bit values of a body's row tiles one thread may hold: the autotuner's edge blocks are
# cut to what keeps [BLOCK_E, tile] within it (`_fit_tiles`).
TILE_VALUES_PER_THREAD = 64


def _fit_tiles(block_e: tuple[int, ...], em: _Emitter, warps: int, acc_dtype: str, lanes: int = 0
               ) -> tuple[int, ...]:
    """The edge blocks of ``block_e`` at which the row tiles of ``em``'s body (tiled
    attention scores, `_Emitter.row_sum`), or a feature block of ``lanes`` whose every
    lane recomputes its head's values (`recomputed_lanes`), fit `TILE_VALUES_PER_THREAD`
    32-bit values per thread (a float64 value is two); at least the smallest. A [256, 128]
    score tile over 128 threads (256 values each) spilled registers and took 20 s of
    Triton 3.6's compile for one config; the tile is a second [BLOCK_E, 128] live beside
    the feature block. In float64, [64, 32] tiles over one warp were GATv2 4 x 32's
    slowest configs (3.5 s each, against 1 s in float32)."""
    tile = max(em.tile_lanes, lanes)
    if not tile:
        return block_e
    words = 2 if acc_dtype == "tl.float64" else 1
    fitting = tuple(b for b in block_e if b * tile * words <= TILE_VALUES_PER_THREAD * 32 * warps)
    return fitting or (min(block_e),)


# The widest feature block (BLOCK_F) of a CSR walk's launch (`executor.feature_block`)
CSR_WIDEST_BLOCK = 128


def recomputed_lanes(unit: AggregateUnit) -> int:
    """The feature block of ``unit``'s CSR walk if each of its lanes recomputes per-head
    values (attention scores and weights, [H] or [H, 1]) for its own head, else 0: a
    multi-head output [H, D] whose D cannot hold a block within one head (`head_block`:
    D not a power of two, as PyG's GAT's last layer, 8 heads x 47 classes averaged) is
    walked in blocks of the whole row, and every lane gathers and evaluates its head's
    terms. With 64-edge chunks over one warp, such a [64, 128] block held 256 values a
    thread: Triton 3.6 took 11-16 s to compile each of those four configs on an H200 (the
    PTX was eight times a 16-edge chunk's), and the autotuner picked 4-edge chunks."""
    shape = unit.reduce.shape
    if not _per_head_values(unit, shape) or head_block(unit) is not None:
        return 0
    return min(1 << (math.prod(shape) - 1).bit_length(), CSR_WIDEST_BLOCK)


# The edge-parallel kernels' edge blocks, at most `EDGE_BLOCK_LIMIT` edges (below). Above
# that, Triton 3.6 loads each operand in a layout of two edges per thread and moves it to
# the tile's layout through shared memory, every operand through the same addresses; and
# ptxas (12.8 to 13.0, sm_90) then takes two values loaded from one address across the
# barrier for one value: ``x * w`` for a square, so the sign of the product "cannot" be
# negative and ``|x * w|`` or ``where(x * w < 0, ...)`` lose their sign handling for the
# first edge of each pair. On an H200, ``sqrt(|x * w|)`` at 256 edges a program came out
# NaN for 1,007 of 4,096 edges (tests/test_gpu_rounding.py), with no error; at 64 or 128
# no operand passes through shared memory (tests/test_kernel_smem_staging.py checks).
EDGE_BLOCKS = (64, 128)
EDGE_BLOCK_LIMIT = max(EDGE_BLOCKS)


def _edge_parallel_source(name: str, comment: str, acc_dtype: str, em: _Emitter, width: int, params: str,
                          tail: str, tuned: bool, reset: bool, block_e: tuple[int, ...] = EDGE_BLOCKS) -> str:
    """A kernel with one program per block of edges (in edge-id order) and features:
    the COO endpoints are loaded, the emitted per-edge expression evaluated, and
    ``tail`` writes the result. Edge units store it; edge-parallel reductions add it."""
    body = "\n".join(f"    {line}" for line in em.lines)
    leaf_params = em.params()
    return f'''import triton
import triton.language as tl


{_decorator(tuned, {"BLOCK_E": _fit_tiles(block_e, em, 4, acc_dtype)}, "size_class", reset)}
def {name}(src, dst, num_edges, size_class, out, {params}{leaf_params}BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    # {comment}
    ACC: tl.constexpr = {acc_dtype}
    e = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    emask = e < num_edges
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < {width}
    fzero = f * 0
    edge = e
    src_id = tl.load(src + e, mask=emask, other=0).to(tl.int64)
    dst_id = tl.load(dst + e, mask=emask, other=0).to(tl.int64)
{body}
{tail}
'''


# Lanes of one program's tile in an edge unit that sums each edge's heads (`edge_tile_block`)
EDGE_TILE_LANES = 128


def edge_tile_block(split: RowSum) -> int:
    """The feature block (BLOCK_F) of an edge unit whose root sums each edge's heads
    (`row_sum_tile`): as many whole heads' padded lanes as `EDGE_TILE_LANES` holds, one
    program per block. GAT's attention gradient at 8 heads x 64 had been unrolled into 64
    loads of one element per head, 256 bytes apart, per edge: on an H200 at 2.2M edges
    that kernel took 52 ms of the layer's 62 ms forward and backward (8 x 40: 5.9 ms),
    where each 2-head block of coalesced [edges, 2, 64] tiles reads the rows once. At
    least one head; the whole tile where it is narrower."""
    return min(split.tile, max(split.padded, EDGE_TILE_LANES))


def generate_edge(unit: EdgeUnit, name: str, acc_dtype: str, tuned: bool = False) -> tuple[str, list[Value]]:
    """Kernel source for an edge unit: one program per block of edges and features,
    gathering endpoint rows through the COO arrays, writing each edge's row once."""
    root = unit.root
    width = math.prod(root.shape)
    em = _Emitter(unit)
    split = row_sum_tile(root)
    if split is not None:   # the launcher gives BLOCK_F = edge_tile_block(split): whole heads
        kept, summed, padded = split   # tile lanes past `summed` are masked to 0
        heads = edge_tile_block(split) // padded    # per program
        in_shape = root.inputs[0].shape
        flat = "f" if padded == summed else em.tmp(f"(f // {padded}) * {summed} + f % {padded}")
        coords = tuple("0" if n == 1 else em.tmp(f"({flat} // {st}) % {n}")
                       for st, n in zip(_strides(in_shape), in_shape))
        tile = em.value(root.inputs[0], coords)
        lanes = "" if padded == summed else f"\n    tile = tl.where((f % {padded} < {summed})[None, :], tile, 0.0)"
        tail = (f"    tile = {tile} + tl.zeros([BLOCK_E, BLOCK_F], ACC){lanes}\n"
                f"    val = tl.sum(tl.reshape(tile, [BLOCK_E, {heads}, {padded}]), axis=2)\n"
                f"    fo = tl.program_id(1) * {heads} + tl.arange(0, {heads})\n"
                f"    tl.store(out + e[:, None] * {kept} + fo[None, :], val.to(out.dtype.element_ty),\n"
                f"             mask=emask[:, None]{'' if split.heads == kept else f' & (fo < {kept})[None, :]'})")
        source = _edge_parallel_source(name, unit.describe(), acc_dtype, em, split.tile, "", tail, tuned,
                                       reset=False, block_e=(16, 64))   # whole rows: fewer edges per tile
        return source, em.leaf_args
    coords = tuple("0" if n == 1 else em.tmp(f"(f // {st}) % {n}")
                   for st, n in zip(_strides(root.shape), root.shape))
    if feature_sum_terms(root) is not None:
        terms = [em.value(root.inputs[0], c) for c in _summed_coords(root, coords)]
        result = " + ".join(terms)
    else:
        result = em.value(root, coords)
    tail = (f"    val = {_tile(result, '[BLOCK_E, BLOCK_F]')}\n"
            f"    tl.store(out + e[:, None] * {width} + f[None, :], val.to(out.dtype.element_ty),\n"
            f"             mask=emask[:, None] & fmask[None, :])")
    source = _edge_parallel_source(name, unit.describe(), acc_dtype, em, width, "", tail, tuned, reset=False)
    return source, em.leaf_args


def generate(unit: AggregateUnit, name: str, acc_dtype: str, tuned: bool = False,
             ordered: bool = False) -> tuple[str, list[Value]]:
    """Kernel source for ``unit`` and the leaf values its pointer arguments take, in order.
    ``ordered``: split rows meet in a fixed order (`_split_row_fixup`)."""
    out_shape = unit.reduce.shape
    width = math.prod(out_shape)
    em = _Emitter(unit)
    coords = em.feature_coords(out_shape, head_block(unit))
    root = em.value(unit.reduce.inputs[0], coords)
    op = unit.reduce.attrs["op"]
    combine = {"sum": "acc + tl.sum(tile, axis=0)", "mean": "acc + tl.sum(tile, axis=0)",
               "max": "tl.maximum(acc, tl.max(tile, axis=0))", "min": "tl.minimum(acc, tl.min(tile, axis=0))"}[op]
    finish = {"sum": "acc", "mean": quotient("acc", "tl.maximum(row_end - row_start, 1).to(ACC)", _wide(acc_dtype)),
              "max": "tl.where(end > start, acc, 0.0)", "min": "tl.where(end > start, acc, 0.0)"}[op]
    # tl.max / tl.min skip NaN (hardware fmax), but torch's amax and PyG propagate it, so
    # max and min count the NaN they meet and write NaN where there was any.
    nan_init, nan_count, nan_finish = "", "", ""
    if op in ("max", "min"):
        nan_init = "\n            nans = tl.zeros([BLOCK_F], tl.int32)"
        nan_count = "\n                nans += tl.sum((tile != tile).to(tl.int32), axis=0)"
        nan_finish = "\n            acc = tl.where(nans > 0, float('nan'), acc)"
    # The segments of a split row meet in a workspace and the last stores the row (sum
    # and mean only: the executor never splits max/min rows); an unsplit row is written once.
    store = f"tl.store(out + row * {width} + f, acc.to(out.dtype.element_ty), mask=fmask)"
    split_params = "seg_split, "
    if op in ("sum", "mean"):
        split_params = "seg_slot, slot_segments, "
        store = (f"slot = tl.load(seg_slot + seg)\n"
                 f"            if slot >= 0:{_split_row_fixup(width, ordered)}\n"
                 f"            else:\n                {store}")
    body = "\n".join(f"                {line}" for line in em.lines)
    leaf_params = em.params()
    source = f'''import triton
import triton.language as tl


{_decorator(tuned, {"BLOCK_E": _fit_tiles(CSR_EDGE_BLOCKS, em, 1, acc_dtype, recomputed_lanes(unit)),
                   "ROWS": CSR_ROWS}, "size_class", False, warps=(1,))}
def {name}(rowptr, col, eid, seg_row, seg_start, seg_end, {split_params}num_segments, size_class, out, {"work, arrived, " if op in ("sum", "mean") else ""}{leaf_params}BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, ROWS: tl.constexpr):
    # {unit.describe()}
    # Each program reduces ROWS consecutive segments (feature-adaptive grouping, Seastar
    # §6.3.1): segments are sorted by length, so neighbours cost alike, and on a graph
    # of average degree ~10 one segment alone is too little work for a program. One
    # warp per program: the per-chunk tl.sum over edges then stays within the warp
    # (shuffles); across four warps it went through shared memory with a barrier per
    # chunk and ran 2-3x slower on an H100 (benchmarks/README.md). Segment ids are int64:
    # past 2^31 segments (a graph of 2^31 vertices) an int32 product wrapped.
    ACC: tl.constexpr = {acc_dtype}
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < {width}
    fzero = f * 0
    for r in range(ROWS):
        seg = tl.program_id(0).to(tl.int64) * ROWS + r
        if seg < num_segments:
            row = tl.load(seg_row + seg).to(tl.int64)
            start = tl.load(seg_start + seg).to(tl.int64)
            end = tl.load(seg_end + seg).to(tl.int64)
            row_start = tl.load(rowptr + row).to(tl.int64)
            row_end = tl.load(rowptr + row + 1).to(tl.int64)
            acc = tl.full([BLOCK_F], {_IDENTITY[op]}, ACC){nan_init}
            for e0 in range(start, end, BLOCK_E):
                e = e0 + tl.arange(0, BLOCK_E)
                emask = e < end
                nbr = tl.load(col + e, mask=emask, other=0).to(tl.int64)
                edge = tl.load(eid + e, mask=emask, other=0).to(tl.int64)
{body}
                tile = tl.where(emask[:, None], {_tile(root, "[BLOCK_E, BLOCK_F]")}, {_IDENTITY[op]})
                acc = {combine}{nan_count}
            acc = {finish}{nan_finish}{_row_scale(em, unit, "acc", " " * 12, False, acc_dtype)}{_row_addend(em, unit, width)}
            {store}
'''
    return source, em.leaf_args


def _split_row_fixup(width: int, ordered: bool = False) -> str:
    """`generate`'s lines for a segment of a split row (scalar ``row`` and ``slot``, a
    finished ``acc`` of BLOCK_F lanes): add ``acc`` into the row's slot of the workspace
    ``work`` ([split rows, width], ACC), count the segment in ``arrived`` (one counter per
    split row and feature program), and if it is the row's last to arrive, take the sum
    out of the workspace, leaving zeros, store it, and set the counter back to zero.

    Why: with segments adding into ``out`` atomically, ``out``'s split rows had to be
    zeroed by a launch before the kernel's (``torch.zeros``, or ``index_fill_`` of those
    rows): 7-20 us of host time per call on the H200's host, and a memset on the GPU.
    The workspace starts at zero once, when it is made, and every run leaves it so.

    Ordering: each segment's workspace adds are acq_rel atomics (Triton's default), and
    the barrier orders the program's adds before its counter increment (an acq_rel
    atomic at GPU scope, cumulative over what the barrier ordered), so the segment that
    sees the count complete sees every add. It reads the sum by an atomic add of zero,
    at the L2 where the adds were made (Triton's interpreter has no float exchange),
    then zeroes the slot with plain stores: no segment of the row touches it again in
    this run, and the next run is ordered after this one on the stream.

    ``ordered`` (``torch.use_deterministic_algorithms(True)``, `schedule.OrderedSlots`):
    each segment has a slot of its own, which its add makes exactly its partial sum,
    and counts in the counter of its row's first slot; the last to arrive sums the
    row's slots from the first, reading each as above and zeroing it. The partial sums
    are fixed by the segments, and the order they are added in by the slots, so the
    row's bits no longer depend on the order the segments finish in."""
    added = f"""
                part = work + slot.to(tl.int64) * {width} + f
                tl.atomic_add(part, acc, mask=fmask)
                tl.debug_barrier()"""
    if ordered:
        return added + f"""
                first = tl.load(slot_segments + 2 * slot).to(tl.int64)
                pieces = tl.load(slot_segments + 2 * slot + 1)
                counter = arrived + first * tl.num_programs(1) + tl.program_id(1)
                if tl.atomic_add(counter, 1) == pieces - 1:
                    total = tl.zeros([BLOCK_F], ACC)
                    for s in range(first, first + pieces):
                        piece = work + s * {width} + f
                        total += tl.atomic_add(piece, tl.zeros([BLOCK_F], ACC), mask=fmask)
                        tl.store(piece, tl.zeros([BLOCK_F], ACC), mask=fmask)
                    tl.store(out + row * {width} + f, total.to(out.dtype.element_ty), mask=fmask)
                    tl.atomic_xchg(counter, 0)"""
    return added + f"""
                counter = arrived + slot.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
                if tl.atomic_add(counter, 1) == tl.load(slot_segments + slot) - 1:
                    total = tl.atomic_add(part, tl.zeros([BLOCK_F], ACC), mask=fmask)
                    tl.store(out + row * {width} + f, total.to(out.dtype.element_ty), mask=fmask)
                    tl.store(part, tl.zeros([BLOCK_F], ACC), mask=fmask)
                    tl.atomic_xchg(counter, 0)"""


def generate_siblings(group: SiblingGroup, name: str, acc_dtype: str, tuned: bool = False,
                      ordered: bool = False) -> tuple[str, list[Value]]:
    """Kernel source for a `SiblingGroup`: `generate`'s CSR walk, with every member's
    per-edge expression evaluated in the same chunk loop on feature lanes of its own
    (``f0``, ``f1``, ...; each member's whole output row is one block, which the
    executor checks) and one accumulator per member. The walk, the index loads and the
    gathered rows are paid once for all members; rows and expressions they share are
    emitted once. Outputs ``out0``, ``out1``, ... in member order, then each rider's
    per-program tiles ``partials{n}`` (summed by the executor).

    A max member counts NaN as `generate` does. In a group with one (``group.merges``),
    and in every group where split rows must meet in a fixed order (``ordered``:
    ``torch.use_deterministic_algorithms(True)``), the segments of a split row store
    partial results for `generate_sibling_merge` instead of adding them atomically. A member that takes a max member's maximum as its softmax shift (``group.shifts``,
    `passes/online_softmax.py`) reads no stored maximum: on its own lanes it keeps a
    running maximum ``m`` of the scores, evaluates its expression with ``m`` in place
    of the maximum, and rescales what it summed by ``exp(m_old - m_new)`` whenever a
    chunk raises ``m``. A row whose scores are all -inf ends with NaN, as the stored
    maximum (-inf) would give. A member dividing by another's sum of the exponentials
    (``group.normalizers``) keeps its own copy ``den{n}``, rescaled alike, and divides
    by it at the end."""
    em = _Emitter(group)
    merging = group.merges or ordered
    members = []
    for n, unit in enumerate(group.members):
        em.use_lanes(unit, f"f{n}")
        width = math.prod(unit.reduce.shape)
        block = triton.next_power_of_2(width)
        if n in group.shifts:
            peak = group.members[group.shifts[n]].reduce
            total = group.members[group.normalizers[n]].reduce if n in group.normalizers else None
            em.online_shift(peak, peak.inputs[0], n, block, total)
        root = em.value(unit.reduce.inputs[0], em.feature_coords(unit.reduce.shape, None))
        em.online_shift(None)
        members.append((n, unit, width, block, root))
    riders = []
    if group.riders:    # each rider's [BLOCK_E, types, width] accumulator lives beside the row tiles
        em.tile_lanes = max(em.tile_lanes, MAX_RIDER_TILE)
    for n, rider in enumerate(group.riders, start=len(group.members)):
        em.use_lanes(rider, f"f{n}")
        block = triton.next_power_of_2(rider.width)
        riders.append((n, rider.width, block, em.value(rider.operand, em.feature_coords(rider.operand.shape, None))))
    lanes = "".join(f"    f{n} = tl.arange(0, {block})\n    f{n}mask = f{n} < {width}\n    f{n}zero = f{n} * 0\n"
                    for n, width, block in [(n, w, b) for n, _, w, b, _ in members] + [r[:3] for r in riders])
    if riders:
        lanes += "    types = tl.arange(0, TYPES)\n"
    init, adds, stores = [], [], []
    for n, unit, width, block, root in members:
        op = unit.reduce.attrs["op"]
        tile = _tile(root, f"[BLOCK_E, {block}]")
        if op == "max":
            init.append(f"            acc{n} = tl.full([{block}], float('-inf'), ACC)\n"
                        f"            nans{n} = tl.zeros([{block}], tl.int32)\n")
            adds.append(f"                acc{n} = tl.maximum(acc{n}, tl.max(tl.where(emask[:, None], {tile}, "
                        f"float('-inf')), axis=0))\n"
                        f"                nans{n} += tl.sum((tl.where(emask[:, None], {tile}, 0.0) != "
                        f"tl.where(emask[:, None], {tile}, 0.0)).to(tl.int32), axis=0)\n")
            partial = f"\n                acc{n} = tl.where(nans{n} > 0, float('nan'), acc{n})"
        else:
            init.append(f"            acc{n} = tl.zeros([{block}], ACC)\n")
            summed = f"tl.sum(tl.where(emask[:, None], {tile}, 0.0), axis=0)"
            if n in group.shifts:
                init.append(f"            run{n} = tl.full([{block}], float('-inf'), ACC)\n")
                if n in group.normalizers:
                    init.append(f"            den{n} = tl.zeros([{block}], ACC)\n")
                adds.append(f"                acc{n} = acc{n} * rescale{n} + {summed}\n                run{n} = peak{n}\n")
            else:
                adds.append(f"                acc{n} += {summed}\n")
            partial = ""
        target = f"out{n} + row * {width} + f{n}, acc{n}.to(out{n}.dtype.element_ty), mask=f{n}mask"
        finished = f"{_finish(group, n, 12, acc_dtype)}{_row_scale(em, unit, f'acc{n}', ' ' * 12, False, acc_dtype)}"
        if merging:     # a split row's segment leaves its partial result to `generate_sibling_merge`
            running = "".join(f"\n                tl.store({kept}{n}_part + slot * {block} + f{n}, {kept}{n})"
                              for kept, among in (("run", group.shifts), ("den", group.normalizers)) if n in among)
            stores.append(f"\n            if split:{partial}\n                tl.store(acc{n}_part + slot * {block} + f{n}, acc{n})"
                          f"{running}\n            else:{_indented(finished)}\n                tl.store({target})")
        else:
            stores.append(f"{finished}\n            if split:\n                tl.atomic_add({target})\n"
                          f"            else:\n                tl.store({target})")
    # A rider (passes/type_sums.py) adds each edge's value into its type's row of a
    # [BLOCK_E, TYPES, width] tile: lane by lane, no reduction across the warp per chunk
    # (summed over edges per chunk, a first form cost the mag-sized HGT step's walk 1.3 ms
    # on an H200). The program sums the tile once, after its last segment, and stores it.
    rider_init = "".join(f"    acc{n} = tl.zeros([BLOCK_E, TYPES, {block}], ACC)\n" for n, _, block, _ in riders)
    rider_store = "".join(f"\n    tl.store(partials{n} + tl.program_id(0).to(tl.int64) * (TYPES * {block}) + types[:, None] * "
                          f"{block} + f{n}[None, :], tl.sum(acc{n}, axis=0))" for n, _, block, _ in riders)
    if riders:
        adds.append(f"                hit = (({em.edge_types()}[:, None] == types[None, :]) & emask[:, None])[:, :, None]\n")
    for n, width, block, root in riders:
        adds.append(f"                acc{n} += tl.where(hit, ({root} + tl.zeros([BLOCK_E, {block}], ACC))[:, None, :], 0.0)\n")
    # a rider's output holds one tile per program, which segments a program walks depending
    # on ROWS: named `partials` as `config_check.SUMMED` expects, which compares their sum
    outs = (*(f"out{n}" for n, *_ in members), *(f"partials{n}" for n, *_ in riders))
    body = "\n".join(f"                {line}" for line in em.lines)
    leaf_params = em.params()
    slot_param, slot_load, part_params = "", "", ""
    types = ", TYPES: tl.constexpr" if riders else ""
    if merging:
        slot_param = "seg_slot, "
        slot_load = "\n            slot = tl.load(seg_slot + seg).to(tl.int64)"
        part_params = "".join(f"{kept}{n}_part, " for kept, n in partial_buffers(group))
    source = f'''import triton
import triton.language as tl


{_decorator(tuned, {"BLOCK_E": _fit_tiles(CSR_EDGE_BLOCKS, em, 1, acc_dtype), "ROWS": CSR_ROWS}, "size_class",
            () if merging else outs, warps=(1,))}
def {name}(rowptr, col, eid, seg_row, seg_start, seg_end, seg_split, {slot_param}num_segments, size_class, {", ".join(outs)}, {part_params}{leaf_params}BLOCK_E: tl.constexpr, ROWS: tl.constexpr{types}):
    # {group.describe()}
    ACC: tl.constexpr = {acc_dtype}
{lanes}{rider_init}    for r in range(ROWS):
        seg = tl.program_id(0).to(tl.int64) * ROWS + r     # int64: as `generate`'s
        if seg < num_segments:
            row = tl.load(seg_row + seg).to(tl.int64)
            start = tl.load(seg_start + seg).to(tl.int64)
            end = tl.load(seg_end + seg).to(tl.int64)
            row_start = tl.load(rowptr + row).to(tl.int64)
            row_end = tl.load(rowptr + row + 1).to(tl.int64)
            split = tl.load(seg_split + seg) != 0{slot_load}
{"".join(init)}            for e0 in range(start, end, BLOCK_E):
                e = e0 + tl.arange(0, BLOCK_E)
                emask = e < end
                nbr = tl.load(col + e, mask=emask, other=0).to(tl.int64)
                edge = tl.load(eid + e, mask=emask, other=0).to(tl.int64)
{body}
{"".join(adds)}{"".join(stores)}{rider_store}
'''
    return source, em.leaf_args


def partial_buffers(group: SiblingGroup) -> list[tuple[str, int]]:
    """The partial-result buffers of a merging group's kernels, in argument order, as
    (what it keeps, member position): each member's accumulator ``acc``, then the
    running maximum ``run`` of each member taking one online, then the own normalizer
    ``den`` of each member dividing by one. Each buffer is one slot by the member's lanes."""
    return ([("acc", n) for n in range(len(group.members))] + [("run", n) for n in sorted(group.shifts)]
            + [("den", n) for n in sorted(group.normalizers)])


def _finish(group: SiblingGroup, n: int, indent: int, acc_dtype: str) -> str:
    """The lines turning member ``n``'s accumulator ``acc{n}`` over a whole row into its
    result (before any row scale): an empty row's max is 0 and a NaN seen makes it NaN
    (``nans{n}``, counted by the walk; a merged row has it folded into ``acc{n}``), a
    row whose online maximum ``run{n}`` stayed -inf is NaN, a mean divides by the degree."""
    pad = "\n" + " " * indent
    op = group.members[n].reduce.attrs["op"]
    if op == "max":
        return (f"{pad}acc{n} = tl.where(end > start, acc{n}, 0.0)"
                f"{pad}acc{n} = tl.where(nans{n} > 0, float('nan'), acc{n})")
    lines = ""
    if n in group.normalizers:     # rows without edges: 0 / 0, keep the 0
        lines += f"{pad}acc{n} = tl.where(den{n} == 0.0, acc{n}, {quotient(f'acc{n}', f'den{n}', _wide(acc_dtype))})"
    if n in group.shifts:
        lines += f"{pad}acc{n} = tl.where((run{n} == float('-inf')) & (end > start), float('nan'), acc{n})"
    if op == "mean":
        lines += f"{pad}acc{n} = {quotient(f'acc{n}', 'tl.maximum(row_end - row_start, 1).to(ACC)', _wide(acc_dtype))}"
    return lines


def _indented(lines: str) -> str:
    return lines.replace("\n", "\n    ")


def generate_sibling_merge(group: SiblingGroup, name: str, acc_dtype: str) -> str:
    """Kernel source merging the partial results a merging group's segments stored for
    the rows they split (`generate_siblings`, `schedule.PartialSlots`), one program per
    split row: a max is the largest partial (NaN where any partial is), a sum the sum
    of its partials, and a sum taken online the sum of each partial rescaled from its
    segment's running maximum to the row's, ``exp(m_segment - m_row)``; then each
    result is finished as a whole row's would be. It takes the group kernel's leaves
    too, for the members' row scales."""
    em = _Emitter(group)
    body = []
    for n, unit in enumerate(group.members):
        width = math.prod(unit.reduce.shape)
        block = triton.next_power_of_2(width)
        at = f"s * {block} + f{n}"
        body.append(f"    f{n} = tl.arange(0, {block})\n    f{n}mask = f{n} < {width}")
        op = unit.reduce.attrs["op"]
        if op == "max":
            body.append(f"    acc{n} = tl.full([{block}], float('-inf'), ACC)\n    nans{n} = tl.zeros([{block}], tl.int32)\n"
                        f"    for s in range(lo, hi):\n        x = tl.load(acc{n}_part + {at})\n"
                        f"        nans{n} += (x != x).to(tl.int32)\n        acc{n} = tl.maximum(acc{n}, x)")
        elif n in group.shifts:
            summed = ("acc", "den") if n in group.normalizers else ("acc",)
            body.append(f"    run{n} = tl.full([{block}], float('-inf'), ACC)\n"
                        f"    for s in range(lo, hi):\n        run{n} = tl.maximum(run{n}, tl.load(run{n}_part + {at}))\n"
                        + "".join(f"    {k}{n} = tl.zeros([{block}], ACC)\n" for k in summed)
                        + f"    for s in range(lo, hi):\n        m = tl.load(run{n}_part + {at})\n"
                        f"        rescale = tl.where(m == run{n}, 1.0, tl.exp(m - run{n}))"
                        + "".join(f"\n        {k}{n} += tl.load({k}{n}_part + {at}) * rescale" for k in summed))
        else:
            body.append(f"    acc{n} = tl.zeros([{block}], ACC)\n    for s in range(lo, hi):\n"
                        f"        acc{n} += tl.load(acc{n}_part + {at})")
        body.append(f"{_finish(group, n, 4, acc_dtype)}{_row_scale(em, unit, f'acc{n}', ' ' * 4, False, acc_dtype)}\n"
                    f"    tl.store(out{n} + row * {width} + f{n}, acc{n}.to(out{n}.dtype.element_ty), mask=f{n}mask)")
    outs = "".join(f"out{n}, " for n in range(len(group.members)))
    parts = "".join(f"{kept}{n}_part, " for kept, n in partial_buffers(group))
    leaves = em.leaf_params().removesuffix(", ")
    newline = "\n"
    return f'''import triton
import triton.language as tl


@triton.jit
def {name}(merge_row, slot_ptr, rowptr, {outs}{parts}{leaves}):
    # merges the split rows of: {group.describe()}
    ACC: tl.constexpr = {acc_dtype}
    i = tl.program_id(0)
    row = tl.load(merge_row + i).to(tl.int64)
    lo = tl.load(slot_ptr + i).to(tl.int64)
    hi = tl.load(slot_ptr + i + 1).to(tl.int64)
    row_start = tl.load(rowptr + row).to(tl.int64)
    row_end = tl.load(rowptr + row + 1).to(tl.int64)
    start, end = row_start, row_end
{newline.join(body)}
'''


def _row_scale(em: _Emitter, unit: AggregateUnit, value: str, indent: str, per_edge: bool, acc_dtype: str) -> str:
    """The line multiplying (or dividing, rounded as torch's: `rounded`) ``value`` -- a
    finished row (CSR) or each edge's term (COO, ``per_edge``: one scale per edge's row,
    masked edges divide by 1.0, never 0) -- by the unit's per-row scale
    (`passes.fusion._row_scaled`); nothing without one."""
    if unit.scale is None:
        return ""
    load = f"tl.load(L{em.leaf_index[unit.scale.id]} + row{', mask=emask, other=1.0' if per_edge else ''}).to(ACC)"
    return f"\n{indent}{value} = {_scaled(unit, value, load + ('[:, None]' if per_edge else ''), acc_dtype)}"


def _scaled(unit: AggregateUnit, value: str, scale: str, acc_dtype: str) -> str:
    """``value`` times, or divided by, the row scale ``scale``, as the unit's ``scaled`` op."""
    return f"{value} * {scale}" if unit.scaled.op == "mul" else quotient(value, scale, _wide(acc_dtype))


def _wide(acc_dtype: str) -> bool:
    """Whether a kernel of accumulator ``acc_dtype`` computes in float64 (`rounded`)."""
    return acc_dtype == "tl.float64"


def _row_addend(em: _Emitter, unit: AggregateUnit, width: int) -> str:
    """The lines adding the unit's addend row (`passes.fusion._row_added`) to the
    finished ``acc`` of a CSR kernel, in the row's first segment only (a split row's
    later segments add their partial sums to it atomically; every row, empty ones too,
    has a first segment); nothing without one. Lane ``f`` of the flat output row is
    element ``f`` of the addend's row, which lies ``row_stride`` elements from the next
    (one row for all: a parameter, ``shared``)."""
    if unit.addend is None:
        return ""
    leaf = f"L{em.leaf_index[unit.addend.id]}"
    row = "" if leaf_kind(unit.addend) == "shared" else f"row * {row_stride(unit.addend)} + "
    return (f"\n            if start == row_start:\n"
            f"                acc += tl.load({leaf} + {row}f, mask=fmask, other=0.0).to(ACC)")


def generate_coo(unit: AggregateUnit, name: str, acc_dtype: str, tuned: bool = False) -> tuple[str, list[Value]]:
    """Kernel source for a sum or mean ``unit`` in the edge-parallel schedule (fuseGNN's
    GAS): one program per block of edges in edge-id order, gathering both endpoints'
    rows through the COO arrays, evaluating the unit's per-edge expression and adding it
    into its row atomically. No CSR and no degree skew to balance, at the price of one
    atomic add per edge and feature; a mean divides each term by the row's degree. A
    unit's addend is not read here: the executor starts ``out`` from it (`_plan_coo_unit`)."""
    op = unit.reduce.attrs["op"]
    if op not in ("sum", "mean"):
        raise ValueError(f"the edge-parallel schedule accumulates with atomic adds; {op} needs the CSR one")
    out_shape = unit.reduce.shape
    width = math.prod(out_shape)
    other = "src" if unit.by == "dst" else "dst"
    em = _Emitter(unit, {"center": unit.by, "neighbour": other})
    coords = em.feature_coords(out_shape, head_block(unit))
    root = em.value(unit.reduce.inputs[0], coords)
    degree = "tl.maximum(tl.load(degree + row, mask=emask, other=1), 1).to(ACC)[:, None]"
    mean = f"\n    val = {quotient('val', degree, _wide(acc_dtype))}" if op == "mean" else ""
    tail = (f"    val = {root} + tl.zeros([BLOCK_E, BLOCK_F], ACC)\n"
            f"    row = {unit.by}_id{mean}{_row_scale(em, unit, 'val', ' ' * 4, True, acc_dtype)}\n"
            f"    tl.atomic_add(out + row[:, None] * {width} + f[None, :], val.to(out.dtype.element_ty),\n"
            f"                  mask=emask[:, None] & fmask[None, :])")
    source = _edge_parallel_source(name, f"{unit.describe()}, edge-parallel", acc_dtype, em, width, "degree, ",
                                   tail, tuned, reset=True)
    return source, em.leaf_args


def one_lane(unit: AggregateUnit) -> bool:
    """A sum or mean of one value per row (a scalar per vertex: F = 1) with nothing added
    or scaled per row: what `generate_scan` reduces, and `generate_rows` by default."""
    return plain_sum(unit) and math.prod(unit.reduce.shape) == 1 and unit.scale is None


def plain_sum(unit: AggregateUnit) -> bool:
    """A sum or mean with no addend row (`passes.fusion._row_added`) and no head-blocked
    lanes (`head_block`): what `generate_rows` reduces at any width; a per-row scale (a
    GCN's destination norm) it applies to the finished rows."""
    return (unit.reduce.attrs["op"] in ("sum", "mean") and unit.addend is None and head_block(unit) is None)


# The rows kernel's autotuning space: segments side by side per program, edges per
# segment and step (their product is one step's edge lanes), warps. A one-lane unit
# takes the first; a wider one segments x edges x feature lanes within `ROWS_TILE`.
ROWS_BLOCKS = (32, 64, 128)
ROWS_EDGES = (4, 8, 16)
# Long one-lane rows (Reddit2-sized, average degree 100): 32 edges of a row per step, up
# to eight warps. On an H200 (F = 1, replayed) the autotuner picked 16 x 32 over eight
# warps from a 51-config space and took 0.165 ms against this space without them 0.170
# (cuSPARSE 0.166-0.167 in the same processes); these four keep that choice's neighbours.
ROWS_LONG = ((16, 32, 4), (16, 32, 8), (32, 32, 8), (64, 32, 8))
ROWS_WIDE_BLOCKS = (4, 8, 16, 32)
ROWS_WIDEST = 64            # feature lanes per program (BLOCK_F) of a wide unit
ROWS_TILE = 4096            # a step's values, BLOCK_R x K x BLOCK_F, over four warps: 32 a thread


def rows_space(width: int) -> list[tuple[int, int, int]]:
    """(BLOCK_R, K, warps) configs of `generate_rows` for rows of ``width`` lanes: for one
    lane `ROWS_BLOCKS` x `ROWS_EDGES` and `ROWS_LONG`; wider, a feature block of at most
    `ROWS_WIDEST` and one warp only where the step's tile is at most a quarter of
    `ROWS_TILE`."""
    if width == 1:
        return [(r, k, w) for r in ROWS_BLOCKS for k in ROWS_EDGES for w in (1, 4)] + list(ROWS_LONG)
    block_f = min(triton.next_power_of_2(width), ROWS_WIDEST)
    return [(r, k, w) for r in ROWS_WIDE_BLOCKS for k in ROWS_EDGES for w in (1, 4)
            if r * k * block_f <= ROWS_TILE * w // 4]


def generate_rows(unit: AggregateUnit, name: str, acc_dtype: str, tuned: bool = False,
                  ordered: bool = False) -> tuple[str, list[Value]]:
    """Kernel source for a `plain_sum` unit: a program reduces BLOCK_R segments side by
    side, K edges of each per step, evaluated as a [BLOCK_R x K, BLOCK_F] tile of edge
    and feature lanes (gathers by the edges' own endpoint ids, as in `generate_coo`) and
    summed per segment.

    Why: `generate`'s one-segment-at-a-time walk is a chain of dependent loads per row
    (segment bounds, column ids, the gathered rows) in one warp, and on a graph of low
    average degree each row is a few edges: the chain, not the bytes, sets its time.
    Here every load of a step is issued for BLOCK_R rows at once. A split row's
    segments meet in a workspace, as in `generate`. Measured on an H200 (neighbour sum, F = 1,
    replayed from a CUDA graph, `results/aggregate.md`): on the Reddit2-sized graph
    (average degree 100) 0.165 ms against the CSR walk's 0.177 (cuSPARSE 0.162); on the
    arxiv-sized one (average degree 7) 0.038 ms against the COO schedule's 0.029, so
    where `prefers_coo` picks COO a one-lane unit takes `generate_scan` instead. Wider
    rows on low-degree graphs gain the most: arxiv-sized F = 16 0.037 ms against COO's
    0.056 and cuSPARSE's 0.107; where they do not, `executor.prefers_rows` keeps the
    walk."""
    op = unit.reduce.attrs["op"]
    width = math.prod(unit.reduce.shape)
    other = "src" if unit.by == "dst" else "dst"
    em = _Emitter(unit, {"center": unit.by, "neighbour": other})
    root = em.value(unit.reduce.inputs[0], em.feature_coords(unit.reduce.shape, None))
    body = "\n".join(f"        {line}" for line in em.lines)
    degree = ("tl.maximum(tl.load(rowptr + row + 1, mask=smask, other=1).to(tl.int64) - "
              "tl.load(rowptr + row, mask=smask, other=0).to(tl.int64), 1).to(ACC)[:, None]")
    finish = f"\n    acc = {quotient('acc', degree, _wide(acc_dtype))}" if op == "mean" else ""
    if unit.scale is not None:
        scale = f"tl.load(L{em.leaf_index[unit.scale.id]} + row, mask=smask, other=1.0).to(ACC)[:, None]"
        finish += f"\n    acc = {_scaled(unit, 'acc', scale, acc_dtype)}"
    decorator = _decorator(tuned, {"BLOCK_R": (), "K": ()}, "size_class", False,
                           pruned=[((r, k), w) for r, k, w in rows_space(width)])
    source = f'''import triton
import triton.language as tl


{decorator}
def {name}(rowptr, col, eid, seg_row, seg_start, seg_end, seg_slot, slot_segments, split_segments, num_segments, size_class, out, work, arrived, {em.params()}BLOCK_R: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr):
    # {unit.describe()}, BLOCK_R segments side by side
    ACC: tl.constexpr = {acc_dtype}
    BLOCK_E: tl.constexpr = BLOCK_R * K     # a step's edge lanes, the name the body's tiles use
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < {width}
    fzero = f * 0
    s = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    smask = s < num_segments
    row = tl.load(seg_row + s, mask=smask, other=0).to(tl.int64)
    start = tl.load(seg_start + s, mask=smask, other=0).to(tl.int64)
    end = tl.load(seg_end + s, mask=smask, other=0).to(tl.int64)
    slot = tl.load(seg_slot + s, mask=smask, other=-1)
    split = smask & (slot >= 0)
    {unit.by}_rows = tl.reshape(row[:, None] + tl.zeros([BLOCK_R, K], tl.int64), [BLOCK_E])
    acc = tl.zeros([BLOCK_R, BLOCK_F], ACC)
    for k0 in range(0, tl.max(end - start, axis=0), K):
        at = start[:, None] + k0 + tl.arange(0, K)[None, :]
        e = tl.reshape(at, [BLOCK_E])
        emask = tl.reshape((at < end[:, None]) & smask[:, None], [BLOCK_E])
        nbr = tl.load(col + e, mask=emask, other=0).to(tl.int64)
        edge = tl.load(eid + e, mask=emask, other=0).to(tl.int64)
        {unit.by}_id = {unit.by}_rows
        {other}_id = nbr
{body}
        tile = tl.where(emask[:, None] & fmask[None, :], {root} + tl.zeros([BLOCK_E, BLOCK_F], ACC), 0.0)
        acc += tl.sum(tl.reshape(tile, [BLOCK_R, K, BLOCK_F]), axis=1){finish}
    at = out + row[:, None] * {width} + f[None, :]
    tl.store(at, acc.to(out.dtype.element_ty), mask=(smask & (slot < 0))[:, None] & fmask[None, :])
    if tl.program_id(0) * BLOCK_R < split_segments:     # split rows' segments come first (`schedule._build`)
        # split rows meet in the workspace, and each row's last segment stores it (`_split_row_fixup`,
        # here for BLOCK_R segments at once: two of one row in this program count twice)
        at_slot = tl.maximum(slot, 0).to(tl.int64)
        part = work + at_slot[:, None] * {width} + f[None, :]
        tl.atomic_add(part, acc, mask=split[:, None] & fmask[None, :])
        tl.debug_barrier()
{_rows_fixup_tail(ordered, width)}
'''
    return source, em.leaf_args


def _rows_fixup_tail(ordered: bool, width: int) -> str:
    """`generate_rows`' lines after its split segments' adds: count each in its row's
    counter and let the row's last segment store the row, as `_split_row_fixup` does one
    segment at a time (``ordered`` as there: each segment's own slot, summed from the
    row's first by its last segment)."""
    if not ordered:
        return """        counter = arrived + at_slot * tl.num_programs(1) + tl.program_id(1)
        seen = tl.atomic_add(counter, tl.full([BLOCK_R], 1, tl.int32), mask=split)
        last = split & (seen == tl.load(slot_segments + at_slot, mask=split, other=0) - 1)
        finished = last[:, None] & fmask[None, :]
        total = tl.atomic_add(part, tl.zeros([BLOCK_R, BLOCK_F], ACC), mask=finished)
        tl.store(at, total.to(out.dtype.element_ty), mask=finished)
        tl.store(part, tl.zeros([BLOCK_R, BLOCK_F], ACC), mask=finished)
        tl.atomic_xchg(counter, tl.zeros([BLOCK_R], tl.int32), mask=last)"""
    return f"""        first = tl.load(slot_segments + 2 * at_slot, mask=split, other=0).to(tl.int64)
        pieces = tl.load(slot_segments + 2 * at_slot + 1, mask=split, other=0)
        counter = arrived + first * tl.num_programs(1) + tl.program_id(1)
        seen = tl.atomic_add(counter, tl.full([BLOCK_R], 1, tl.int32), mask=split)
        last = split & (seen == pieces - 1)
        total = tl.zeros([BLOCK_R, BLOCK_F], ACC)
        for k in range(0, tl.max(tl.where(last, pieces, 0), axis=0)):
            taken = (last & (k < pieces))[:, None] & fmask[None, :]
            piece = work + (first + k)[:, None] * {width} + f[None, :]
            total += tl.where(taken, tl.atomic_add(piece, tl.zeros([BLOCK_R, BLOCK_F], ACC), mask=taken), 0.0)
            tl.store(piece, tl.zeros([BLOCK_R, BLOCK_F], ACC), mask=taken)
        tl.store(at, total.to(out.dtype.element_ty), mask=last[:, None] & fmask[None, :])
        tl.atomic_xchg(counter, tl.zeros([BLOCK_R], tl.int32), mask=last)"""


# The scan kernel's autotuning space: edges per program (256 was the fastest on both
# graphs of the docstring's measurement, 512 slower on both), and warps, at most one edge
# per thread (`scan_configs`).
SCAN_BLOCKS = (64, 128, 256)
SCAN_WARPS = (4, 8)


def scan_configs(blocks: tuple[int, ...]) -> list[tuple[tuple[int], int]]:
    """The (BLOCK_E,), warps configs `generate_scan` tunes over: ``blocks`` by
    `SCAN_WARPS` where a program has at most one edge per thread. At 256 edges over four
    warps Triton (3.6 and 3.9) loads each one-lane operand two edges per thread and moves
    it into the tile's layout through shared memory, every operand through the same
    addresses, and ptxas (12.8 to 13.0, sm_90) takes the two reads of one address for one
    value: ``u.h * v.h`` is "a square", and ``relu(u.h * v.h)`` summed kept its
    ``max(., 0)`` for the second edge of each pair only (the SASS of Triton 3.6's ptxas).
    The edge-parallel kernels lost a sign so at 256 edges too (`EDGE_BLOCKS`);
    tests/test_kernel_smem_staging.py checks every config compiled here. 256 edges over
    eight warps, the measured best, stays."""
    return [((block,), warps) for block in blocks for warps in SCAN_WARPS if block <= 32 * warps]


def generate_scan(unit: AggregateUnit, name: str, acc_dtype: str, tuned: bool = False) -> tuple[str, list[Value]]:
    """Kernel source for a `one_lane` unit: one program per block of edges in the order
    of the CSR by the unit's index (so a row's edges are adjacent), each edge's value
    evaluated as in `generate_coo` and the block summed per row by a segmented scan; the
    last edge of each row in the block adds the row's total atomically into a zeroed
    ``out``. One atomic per (row, block) instead of one per edge, every program the same
    size whatever the degrees, and no per-row loop of dependent loads.

    Why: it replaces the COO schedule for one-lane units, which pays an atomic per edge.
    Measured on an H200 (neighbour sum, F = 1, replayed from a CUDA graph, 256 edges and
    8 warps per program, memset included; an exploration script at 99b1b96): arxiv-sized
    graph 10.7 us against COO's 29.1 and cuSPARSE's 20.1. On the Reddit2-sized graph it
    took 161.9 us against `generate_rows`' 168.7 and cuSPARSE's 165.0 -- every method
    there is bound by the gathers -- so walks keep `generate_rows`, which needs no
    per-edge row array (`executor.rows_in_csr_order`, 4 bytes an edge: 0.25 GB on a
    products-sized graph, whose GAT step must stay under 8 GB). A mean divides each
    edge's term by its row's degree.

    Why into a zeroed ``out``: a kernel that writes every row itself would spare a
    launched call ``torch.zeros``' 8 us of host time over ``torch.empty``, but each
    block's rows that cross into a neighbouring block then need finishing, and that
    doubled the kernel (H200, arxiv-sized, F = 1, replayed; 9eadc6a, reverted): 19.4 us
    with crossing rows meeting in a workspace whose last block stores them (a counter
    per row, as `generate_rows`' split rows), 18.5-25 us with the block that starts a
    row walking its rest, against 10.0 us for the same kernel leaving crossing rows
    out and 10.5 us for this one, memset included.

    So the zeros come from the kernel before: each run also zeroes ``next_out`` (its
    programs share its ``out_numel`` elements), which the executor hands to the next
    call on the same stream as that call's ``out`` (`executor._carried_outputs`). The
    call then makes its output with ``torch.empty``, and no memset runs between the
    launches; the extra stores are the output's bytes, which the memset wrote anyway."""
    op = unit.reduce.attrs["op"]
    other = "src" if unit.by == "dst" else "dst"
    em = _Emitter(unit, {"center": unit.by, "neighbour": other})
    root = em.value(unit.reduce.inputs[0], em.feature_coords(unit.reduce.shape, None))
    body = "\n".join(f"    {line}" for line in em.lines)
    degree = "tl.maximum(tl.load(degree + row, mask=emask, other=1), 1).to(ACC)"
    mean = f"\n    val = {quotient('val', degree, _wide(acc_dtype))}" if op == "mean" else ""
    source = f'''import triton
import triton.language as tl


@triton.jit
def _segment_add(total_a, start_a, total_b, start_b):
    # (running total, whether a row starts in the span): a span that starts a row restarts the total
    return tl.where(start_b != 0, total_b, total_a + total_b), start_a | start_b


{_decorator(tuned, {"BLOCK_E": ()}, "size_class", True, pruned=scan_configs(_fit_tiles(SCAN_BLOCKS, em, 4, acc_dtype)))}
def {name}(col, rows, eid, degree, num_edges, size_class, out_numel, out, next_out, {em.params()}BLOCK_E: tl.constexpr):
    # {unit.describe()}, a segmented scan over CSR-ordered edges
    ACC: tl.constexpr = {acc_dtype}
    lane = tl.arange(0, BLOCK_E)
    program = tl.program_id(0).to(tl.int64)
    # this program's share of the next call's output, zeroed (see the docstring)
    share = tl.cdiv(out_numel, tl.num_programs(0))
    first = program * share
    end = tl.minimum(first + share, out_numel)
    for start in range(first, end, BLOCK_E):
        tl.store(next_out + start + lane, tl.zeros([BLOCK_E], next_out.dtype.element_ty), mask=start + lane < end)
    e = program * BLOCK_E + lane
    emask = e < num_edges
    f = tl.arange(0, 1)
    fmask = f < 1
    fzero = f * 0
    row = tl.load(rows + e, mask=emask, other=0).to(tl.int64)
    before = tl.load(rows + e - 1, mask=emask & (e > 0), other=-1).to(tl.int64)
    after = tl.load(rows + e + 1, mask=e + 1 < num_edges, other=-1).to(tl.int64)
    {unit.by}_id = row
    {other}_id = tl.load(col + e, mask=emask, other=0).to(tl.int64)
    edge = tl.load(eid + e, mask=emask, other=0).to(tl.int64)
{body}
    tile = tl.where(emask[:, None], {root} + tl.zeros([BLOCK_E, 1], ACC), 0.0)
    val = tl.sum(tile, axis=1){mean}
    total, _ = tl.associative_scan((val, (row != before).to(tl.int32)), 0, _segment_add)
    last = (row != after) | (lane == BLOCK_E - 1)
    tl.atomic_add(out + row, total.to(out.dtype.element_ty), mask=emask & last, sem="relaxed")
'''
    return source, em.leaf_args


SHARED_REDUCE_PROGRAMS = 1024   # programs of a shared-reduce kernel: a few per SM of an H100
# Edges per step: the [BLOCK_E, BLOCK_F] accumulator lives in registers (at most 128 x 64
# over 128 threads, 64 registers each), summed across edges once, at the end.
SHARED_REDUCE_BLOCK_E = (32, 128)


# The edge loop of both shared-reduce kernels: the programs take blocks of edges in turn,
# in edge-id order, with each edge's endpoints.
_SHARED_EDGE_LOOP = """    for e0 in range(tl.program_id(0).to(tl.int64) * BLOCK_E, num_edges, tl.num_programs(0) * BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E).to(tl.int64)
        emask = e < num_edges
        edge = e
        src_id = tl.load(src + e, mask=emask, other=0).to(tl.int64)
        dst_id = tl.load(dst + e, mask=emask, other=0).to(tl.int64)
"""


# The most rows of a weight gradient's tile product one program accumulates
# (`shared_dot_rows`): its [rows, BLOCK_F] accumulator stays within 64 float32 registers
# per thread at 128 lanes. A wider left operand is cut into tiles of rows, one per
# program along the launch grid's third dimension (`shared_dot_tiles`).
SHARED_DOT_ROWS = 128


def shared_dot_rows(unit: SharedReduceUnit, acc_dtype: str) -> int | None:
    """The padded rows per program of the tile product `_generate_shared_dot`
    accumulates for a weight gradient ``matmul_tn(x, g)`` over edges, or None where the
    unit keeps the per-element form: float64 (``tl.dot`` has no float64 tensor-core
    form; the element form keeps its precision). At least 16, ``tl.dot``'s smallest
    dimension, at most `SHARED_DOT_ROWS`."""
    root = unit.root
    if root.op != "matmul_tn" or acc_dtype == "tl.float64":
        return None
    return min(SHARED_DOT_ROWS, max(16, triton.next_power_of_2(root.shape[0])))


def shared_dot_tiles(unit: SharedReduceUnit, acc_dtype: str) -> int:
    """How many tiles of `shared_dot_rows` rows a tile product's left operand is cut into
    (1 for the element form): each evaluates ``g`` once per edge, so CGConv's 264-lane
    concatenation costs three evaluations where the element form made 264."""
    rows = shared_dot_rows(unit, acc_dtype)
    return 1 if rows is None else triton.cdiv(unit.root.shape[0], rows)


def _generate_shared_dot(unit: SharedReduceUnit, name: str, acc_dtype: str, tuned: bool) -> tuple[str, list[Value]]:
    """`generate_shared_reduce` for a weight gradient ``out[k, j] = sum_e x[e, k] g[e, j]``
    as a tile product: each block of edges evaluates ``g`` once on the program's lanes of
    j and ``x`` once on lanes of its own (the program's tile of k, `shared_dot_tiles`),
    and adds ``x^T g`` with ``tl.dot``.

    Why: the element form spreads the flattened [K, J] output over lanes, so every
    program evaluates g's whole per-edge chain for its one k; GINEConv's ``lin(edge_attr)``
    gradient (K = 8 edge features, J = 128) recomputed the message 8 times, and its
    backward took 0.34x PyG's time on an arxiv-sized graph (H200). Padding rows and edges
    past the end are zeros in both tiles, so they add nothing."""
    root = unit.root
    x, g = root.inputs
    rows, count, width = shared_dot_rows(unit, acc_dtype), root.shape[0], math.prod(root.shape[1:])
    em = _Emitter(unit)
    g_tile = em.value(g, em.feature_coords(g.shape, None))
    outer = em.zero, em.lanes      # x on lanes kk of its own, as `_Emitter.head_score` does
    em.zero, em.lanes = "kzero", str(rows)
    x_tile = em.value(x, (em.tmp(f"kk % {count}"),))
    em.zero, em.lanes = outer
    em.tile_lanes = max(em.tile_lanes, rows)
    body = "\n".join(f"        {line}" for line in em.lines)
    source = f'''import triton
import triton.language as tl


{_decorator(tuned, {"BLOCK_E": _fit_tiles(SHARED_REDUCE_BLOCK_E, em, 4, acc_dtype)}, "size_class", reset=False)}
def {name}(src, dst, num_edges, size_class, partials, {em.params()}BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    # {unit.describe()}, as a tile product over edge blocks
    ACC: tl.constexpr = {acc_dtype}
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < {width}
    fzero = f * 0
    kk = tl.program_id(2) * {rows} + tl.arange(0, {rows})
    kzero = kk * 0
    acc = tl.zeros([{rows}, BLOCK_F], tl.float32)
{_SHARED_EDGE_LOOP}{body}
        right = tl.where(emask[:, None] & fmask[None, :], {g_tile} + tl.zeros([BLOCK_E, BLOCK_F], ACC), 0.0)
        left = tl.where(emask[:, None] & (kk < {count})[None, :], {x_tile} + tl.zeros([BLOCK_E, {rows}], ACC), 0.0)
        acc = tl.dot(tl.trans(left), right, acc, input_precision="ieee")
    tl.store(partials + tl.program_id(0).to(tl.int64) * {count * width} + kk[:, None] * {width} + f[None, :],
             acc.to(partials.dtype.element_ty), mask=(kk < {count})[:, None] & fmask[None, :])
'''
    return source, em.leaf_args


def generate_shared_reduce(unit: SharedReduceUnit, name: str, acc_dtype: str,
                           tuned: bool = False) -> tuple[str, list[Value]]:
    """Kernel source for a shared-reduce unit: a fixed number of programs (the launch's
    first grid dim) stride over blocks of edges, evaluate the unit's per-edge
    expression in registers, sum it over their edges and write one partial row each
    into ``partials[program, :]``; the executor adds them with one torch sum. (Which
    edges a program takes depends on ``BLOCK_E``, so the partials do too; only their sum
    is the kernel's result, which is what `config_check` compares.)

    Why partials and not atomics: every program's result goes to the same few hundred
    addresses, so atomic adds would serialize on them and make a parameter's gradient
    change in its last bits from run to run; a fixed partial per program keeps the
    result deterministic and the extra traffic to ``SHARED_REDUCE_PROGRAMS`` rows of
    the parameter's width, whatever |E| is. A program's row starts at its id times the
    parameter's size in int64: in int32 the last programs of a [2048, 1100] weight's
    gradient (2^31 elements of partials) stored at a wrapped, negative offset."""
    root = unit.root
    if shared_dot_rows(unit, acc_dtype):
        return _generate_shared_dot(unit, name, acc_dtype, tuned)
    width = math.prod(root.shape)
    em = _Emitter(unit)
    coords = em.feature_coords(root.shape, head_block(unit))
    if root.op == "matmul_tn":   # out[k, j] adds x[e, k] * g[e, j] over edges e
        x, g = root.inputs
        terms = f"{em.value(x, coords[:1])} * {em.value(g, coords[1:])}"
    else:
        terms = " + ".join(em.value(root.inputs[0], c) for c in _summed_coords(root, coords))
    body = "\n".join(f"        {line}" for line in em.lines)
    leaf_params = em.params()
    source = f'''import triton
import triton.language as tl


{_decorator(tuned, {"BLOCK_E": _fit_tiles(SHARED_REDUCE_BLOCK_E, em, 4, acc_dtype)}, "size_class", reset=False)}
def {name}(src, dst, num_edges, size_class, partials, {leaf_params}BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    # {unit.describe()}
    ACC: tl.constexpr = {acc_dtype}
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < {width}
    fzero = f * 0
    acc = tl.zeros([BLOCK_E, BLOCK_F], ACC)
{_SHARED_EDGE_LOOP}{body}
        acc += tl.where(emask[:, None], {terms} + tl.zeros([BLOCK_E, BLOCK_F], ACC), 0.0)
    partial = tl.sum(acc, axis=0)
    tl.store(partials + tl.program_id(0).to(tl.int64) * {width} + f, partial.to(partials.dtype.element_ty), mask=fmask)
'''
    return source, em.leaf_args
