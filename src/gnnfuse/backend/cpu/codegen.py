"""Turn a fused unit into the source of one Numba kernel: an aggregate unit into a
destination-parallel CSR loop (`generate_aggregate`), an edge unit into an edge-parallel
loop writing each edge's row (`generate_edge`).

The units are the Triton backend's (passes.fusion.partition) and so are the expressions:
each op's emit string from its registry entry, evaluated one element at a time against
`scalar` imported as ``tl``. What differs is the loop nest. A CPU thread runs scalar
(auto-vectorized) code, so the generator places every value at the outermost loop it
depends on, by the variables its expression names (`_Emitter.tmp`): constants before all
loops, values of the row's own vertex (a GCN norm of the destination) once per row,
values of one edge (gathered scalars, attention logits) once per edge, and only values
that vary along the feature axis in the innermost loop, which LLVM vectorizes.

Aggregate kernel (FeatGraph's CPU SpMM template, §III-B): ``prange`` over rows of the
CSR grouped by the unit's index (destinations forward; sources, over the reverse CSR,
for the backward's reductions), each row's edges walked sequentially and reduced into
the row's output, which stays in L1 while its edges stream by -- no atomics and no
per-edge values in memory. The feature axis can be cut into tiles of ``f_tile``
columns, one pass over the graph per tile (FeatGraph's feature-dimension tiling; a
launch argument, so one compiled kernel serves every tile: `schedule.feature_tile`
says when it is used).

Both walks gather rows at random (a neighbour's features, an edge's attention row), so
one core spends most of a large graph's pass waiting on cache misses. Each kernel asks
for the rows of the edge `PREFETCH_DISTANCE` positions ahead (`scalar.prefetch`, LLVM's
prefetch, which never faults), so those misses overlap the current edge's work.
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import torch

from ...ir import Residency, Value, get_op
from ...passes.fusion import AggregateUnit, EdgeUnit, Unit, feature_sum_terms, gather_side, leaf_kind
from ..constant_args import constant_slots
from ..coords import project, strides, summed_coords
from . import scalar

# The loop a variable is first known in: before all loops, per row, per edge, per feature.
_KERNEL, _ROW, _EDGE, _FEATURE = range(4)
_LOOP_VARS = {"row": _ROW, "start": _ROW, "end": _ROW, "nbr": _EDGE, "edge": _EDGE, "src_id": _EDGE,
              "dst_id": _EDGE, "f": _FEATURE, "k": _FEATURE}
# The kernel variable holding the row id of each gather kind (see passes.fusion.gather_side).
_ROW_INDEX = {"center": "row", "neighbour": "nbr", "edge": "edge", "src": "src_id", "dst": "dst_id"}
_IDENTITY = {"sum": "0.0", "mean": "0.0", "max": "-np.inf", "min": "np.inf"}
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
_TL_CALL = re.compile(r"\btl\.(\w+)")


class UnsupportedUnit(Exception):
    """The unit uses something the CPU generator cannot express (the executor then runs
    it with torch ops)."""


# Names a constant expression may hold (`_Emitter.inline_constants`).
_CONSTANT_NAMES = frozenset({"U", "ACC", "np", "inf", "nan"})


# Numba has no float16 or bfloat16 arrays: the executor passes such tables as their int16
# bits (`executor._flat`), which a load widens (`scalar.from_float16_bits`).
_FROM_BITS = {torch.float16: "tl.from_float16_bits", torch.bfloat16: "tl.from_bfloat16_bits"}


_TO_BITS = {torch.float16: "tl.to_float16_bits", torch.bfloat16: "tl.to_bfloat16_bits"}
# An op's result of these dtypes is rounded to them (`_Emitter.narrowed`).
_NARROW = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}


def widened(v: Value, element: str) -> str:
    """The kernel expression reading ``element`` of leaf ``v``'s array as a number."""
    return f"{_FROM_BITS[v.dtype]}({element})" if v.dtype in _FROM_BITS else element


def stored(root: Value, value: str) -> str:
    """The kernel expression storing ``value`` into ``root``'s output array: a float16 or
    bfloat16 output (passed as its int16 bits) takes the value rounded as torch rounds it."""
    return f"{_TO_BITS[root.dtype]}({value})" if root.dtype in _TO_BITS else value


def _literal(value: float) -> str:
    """A float as kernel source: ``repr`` writes inf and NaN as the bare names ``inf`` and
    ``nan``, which no kernel defines (``x * float('inf')`` or ``clamp(max=float('inf'))``
    failed to compile with a NameError)."""
    value = float(value)
    return repr(value) if math.isfinite(value) else f"{'-' if value < 0 else ''}np.{'nan' if value != value else 'inf'}"


class _Emitter:
    def __init__(self, unit: Unit, inline_constants: bool = False):
        self.unit = unit
        self.inline_constants = inline_constants
        self.lines: dict[int, list[str]] = {level: [] for level in range(4)}
        self.names: dict[str, str] = {}
        self.level: dict[str, int] = dict(_LOOP_VARS)
        self.memo: dict[tuple, str] = {}
        self.leaf_args: list[Value] = [v for v in unit.leaves if leaf_kind(v) != "const"]
        self.leaf_index = {v.id: n for n, v in enumerate(self.leaf_args)}
        # numbers the kernel reads from its ``K`` arguments, not as literals (constant_args.py)
        self.constant_index = {(v.id, key): n for n, (v, key) in enumerate(constant_slots(unit))}
        # (argument, row index kind) -> (row width, bytes per element) of every row read
        self.gathered: dict[tuple[str, str], tuple[int, int]] = {}

    def tmp(self, expr: str) -> str:
        """A variable holding ``expr``, defined in the outermost loop whose variables it reads;
        with ``inline_constants``, an expression of literals alone stays an expression:
        a kernel-level variable reaches a ``prange`` body as an argument of Numba's
        outlined function, where LLVM no longer sees the constant (the column offsets
        of a register-row kernel must be constants for SLP to pack them)."""
        if self.inline_constants and set(_NAME.findall(expr)) <= _CONSTANT_NAMES:
            return f"({expr})"
        if expr not in self.names:
            level = max((self.level.get(n, _KERNEL) for n in _NAME.findall(expr)), default=_KERNEL)
            name = f"t{len(self.names)}"
            self.names[expr], self.level[name] = name, level
            self.lines[level].append(f"{name} = {expr}")
        return self.names[expr]

    def params(self) -> str:
        """The leaves' array parameters, then the constants' (`constant_args`), each
        followed by a comma."""
        return "".join(f"L{n}, " for n in range(len(self.leaf_args))) + "".join(
            f"K{n}, " for n in range(len(self.constant_index)))

    def number(self, v: Value, key: str) -> str:
        """``v.attrs[key]`` (a constant's value, an op's numeric setting) in the accumulator
        type: read from its ``K`` argument where the kernel takes one (`constant_args`),
        else as a literal."""
        n = self.constant_index.get((v.id, key))
        return self.tmp(f"ACC({_literal(v.attrs[key])})" if n is None else f"ACC(K{n}[0])")

    def uint(self, n: int) -> str:
        """An index constant as an unsigned 64-bit value (see `generate_aggregate` on why
        every index is unsigned): mixing it with a signed one would make Numba compute
        the index in float64."""
        return self.tmp(f"U({n})")

    def coords(self, shape: tuple[int, ...], flat: str) -> tuple[str, ...]:
        """Coordinates in ``shape`` of the flat element index ``flat``."""
        width = math.prod(shape)
        out = []
        for st, n in zip(strides(shape), shape):
            if n == 1:
                out.append("0")
                continue
            expr = flat if st == 1 else f"({flat} // {self.uint(st)})"
            out.append(self.tmp(expr if st * n == width else f"{expr} % {self.uint(n)}"))
        return tuple(out)

    def constant_coords(self, shape: tuple[int, ...], flat: int) -> tuple[str, ...]:
        """`coords` of the constant flat index ``flat``, folded to constants: the columns
        that share a coordinate (the head of a [heads, channels] row) then share its
        text, so `value`'s memo writes out what depends on that coordinate alone once.
        Unfolded, a register-row kernel of GAT's 8 heads x 8 wrote each head's attention
        weight out once per column: a thousand lines, 12.5-14 s to compile."""
        return tuple("0" if n == 1 else self.uint((flat // st) % n) for st, n in zip(strides(shape), shape))

    def offset(self, shape: tuple[int, ...], coords: tuple[str, ...]) -> str:
        terms = [(self.uint(int(c)) if c.isdigit() else c) if s == 1 else
                 f"{self.uint(int(c)) if c.isdigit() else c} * {self.uint(s)}"
                 for c, s in zip(coords, strides(shape)) if c != "0"]
        return self.tmp(" + ".join(terms)) if terms else "0"

    def value(self, v: Value, coords: tuple[str, ...], side: str | None = None) -> str:
        """Expression for ``v`` at ``coords``; ``side`` is how a per-vertex value's row is
        found while evaluating it on a gathered row (see the Triton emitter)."""
        key = (v.id, coords, side)
        if key in self.memo:
            return self.memo[key]
        if v.id in self.leaf_index or v.op == "const":
            kind = leaf_kind(v)
            out = self.load(v, coords, side if kind == "node" and side else kind)
        elif v.op == "broadcast":
            out = self.value(v.inputs[0], coords, gather_side(v, self.unit))
        elif v.op == "reshape":
            src = v.inputs[0]
            out = self.value(src, self.coords(src.shape, self.offset(v.shape, coords)), side)
        elif v.op == "expand":   # size-1 dims read the input's one element (see the Triton emitter)
            out = self.value(v.inputs[0], project(coords, v.shape, v.inputs[0].shape), side)
        elif v.op == "matmul":   # an edge-feature matmul, unrolled (see the Triton emitter)
            x, w = v.inputs
            out = self.narrowed(v, self.tmp(" + ".join(
                f"{self.value(x, (str(k),), side)} * {self.value(w, (str(k), coords[-1]), side)}"
                for k in range(x.shape[0]))))
        elif v.op == "slice_features":   # output coordinate c reads input start + step * c
            out = self.value(v.inputs[0], tuple(self.sliced(c, start, step)
                                                for c, (start, step, _) in zip(coords, v.attrs["window"])), side)
        else:
            steps = get_op(v.op).emit_steps(v)
            if steps is None:
                raise UnsupportedUnit(f"op {v.op!r} has no expression the CPU generator can use")
            args = [self.promoted(i, self.value(i, project(coords, v.shape, i.shape), side), v) for i in v.inputs]
            attrs = {k: self.number(v, k) for k, a in v.attrs.items()
                     if isinstance(a, (int, float)) and not isinstance(a, bool)}
            for n, step in enumerate(steps):
                expr = step.format(*args, **attrs)
                missing = set(_TL_CALL.findall(expr)) - scalar.NAMES
                if missing:
                    raise UnsupportedUnit(f"op {v.op!r} calls tl.{sorted(missing)[0]}, which the CPU backend lacks")
                # Rounded to the accumulator type: an emit's float literals (``1.0 +
                # tl.exp(x)``) are float64 to Numba, so a float32 kernel would carry the
                # op's value in float64 -- while the forward stores it (a max) in
                # float32, and a backward kernel comparing the recomputed value with
                # that max found no edge equal to it (NaN gradients).
                out = attrs[f"s{n}"] = self.tmp(f"ACC({expr})")
            out = self.narrowed(v, out)
        self.memo[key] = out
        return out

    def narrowed(self, v: Value, out: str) -> str:
        """``out``, the value of op ``v``, rounded to ``v``'s dtype where that is float16 or
        bfloat16, as torch rounds each op's result (and the reference executor, running
        those ops). Carried unrounded in the float32 accumulator, a recomputed score
        exceeded the maximum a unit before had stored rounded to bfloat16 -- by up to half
        a unit in its last place, 2048 at 1e6 -- and ``exp(score - max)`` overflowed: a
        bfloat16 edge softmax of large scores came out inf and NaN."""
        if v.dtype not in _NARROW:
            return out
        return self.tmp(f"ACC(tl.cast({out}, {_NARROW[v.dtype]}))")

    def promoted(self, i: Value, arg: str, v: Value) -> str:
        """``arg``, the value of ``v``'s input ``i``, as torch's type promotion hands it to
        ``v``: an integer or bool input of a float16/bfloat16 op rounded to that dtype
        first, as torch casts every operand to the op's dtype. Read straight into the
        float32 accumulator, 2051 * 3 in float16 came out 6152 (6153 rounded) where torch
        gives 6156 (2052 * 3), and a bfloat16 259 * 3 776 for 780."""
        return arg if i.dtype.is_floating_point else self.narrowed(v, arg)

    def sliced(self, c: str, start: int, step: int) -> str:
        """The input coordinate a slice window ``start::step`` reads at output coordinate ``c``."""
        if c.isdigit():
            return str(start + step * int(c))
        if (start, step) == (0, 1):
            return c
        return self.tmp(f"{self.uint(start)} + {self.uint(step)} * {c}" if start else f"{self.uint(step)} * {c}")

    def load(self, v: Value, coords: tuple[str, ...], kind: str) -> str:
        if kind == "const":
            return self.number(v, "value")
        ptr, width = f"L{self.leaf_index[v.id]}", math.prod(v.shape)
        off = self.offset(v.shape, coords)
        if kind == "shared":
            return self.tmp(f"ACC({widened(v, f'{ptr}[{off}]')})")
        index = _ROW_INDEX[kind]
        self.gathered[(ptr, kind)] = (width, v.dtype.itemsize)
        row = index if width == 1 else f"{index} * {self.uint(width)}"
        return self.tmp(f"ACC({widened(v, f'{ptr}[{row}' + ('' if off == '0' else ' + ' + off) + ']')})")

    def prefetches(self, ahead: dict[str, str], indent: int) -> str:
        """Lines prefetching every cache line of the rows read through the index kinds in
        ``ahead`` (kind -> the variable holding that kind's row id a few edges ahead)."""
        lines = []
        for (ptr, kind), (width, itemsize) in sorted(self.gathered.items()):
            if kind not in ahead:
                continue
            row = ahead[kind] if width == 1 else f"{ahead[kind]} * U({width})"
            per_line = max(1, CACHE_LINE_BYTES // itemsize)
            for off in sorted(set(range(0, width, per_line)) | {width - 1}):
                lines.append(f"tl.prefetch({ptr}, {row}{f' + U({off})' if off else ''})")
        return "".join(" " * indent + line + "\n" for line in lines)

    def block(self, level: int, indent: int) -> str:
        return "".join(" " * indent + line + "\n" for line in self.lines[level])


# Kernels inline `scalar`'s functions, and Numba's disk cache is keyed by the kernel's own
# file alone: the digest of scalar.py in every kernel's source (hence in its file name)
# keeps a changed scalar.py from reusing machine code compiled against the old one.
_SCALAR_DIGEST = hashlib.sha1(Path(scalar.__file__).read_bytes()).hexdigest()[:16]


def _header(acc: str) -> str:
    return (f"# inlines gnnfuse.backend.cpu.scalar {_SCALAR_DIGEST}\n"
            "import numba\nimport numpy as np\nfrom numba import prange\n\n"
            "from gnnfuse.backend.cpu import scalar as tl\n\n"
            f"ACC = np.{acc}\nU = np.uint64\n\n\n")


def _definition(name: str, params: str, parallel: bool, fastmath: frozenset[str] = frozenset()) -> str:
    """A kernel's decorator and ``def`` line taking ``params``. Serial kernels (one
    thread: the test suite, small graphs) compile in a third of the time of
    ``parallel=True`` ones (0.7 s against 2.2 s for a neighbour sum), where ``prange`` is
    a plain ``range``. A parallel kernel takes its thread count first and applies it
    itself (`scalar.use_threads`). ``fastmath``: LLVM fast-math flags (see
    `REGISTER_ROW_FASTMATH`)."""
    # written in sorted order: a set's repr follows string hashing, which changes per
    # process, and the kernel's source names its disk cache entry
    flags = f", fastmath={{{', '.join(repr(f) for f in sorted(fastmath))}}}" if fastmath else ""
    decorator = f"@numba.njit(parallel={parallel}, cache=True, nogil=True, error_model='numpy'{flags})"
    if not parallel:
        return f"{decorator}\ndef {name}({params}):\n"
    return f"{decorator}\ndef {name}(threads, {params}):\n    tl.use_threads(threads)\n"


# The fast-math flags of register-row kernels: with them, LLVM's SLP vectorizer packs a
# per-edge product (a row times its source's scalar, GCN's ``h_u * norm_u``) into vector
# multiplies; without, it multiplied the 16 columns one by one and shuffled them in
# (pubmed, F=16, one core of the AMD EPYC: 0.168 against 0.124 ms, the sum alone 0.11).
# Neither flag alone did it. ``reassoc`` lets LLVM regroup additions and ``nsz`` ignore
# the sign of a zero; no NaN or infinity is assumed away. They apply to the whole
# kernel, so a unit takes them only when its body is products and moves
# (`register_row_fastmath`).
REGISTER_ROW_FASTMATH = frozenset({"reassoc", "nsz"})
# Body ops under which regrouping changes values in the last bits only, as a different
# summation order of the row does.
_REGROUPABLE = frozenset({"mul", "neg", "broadcast", "reshape", "expand", "slice_features"})
# Operands the same on every edge of a row: constants and parameters, a destination's values
_SAME_ON_A_ROW = frozenset({Residency.SHARED, Residency.DST})


def register_row_fastmath(unit: AggregateUnit) -> frozenset[str]:
    """`REGISTER_ROW_FASTMATH` for a unit whose per-edge body is products and moves of
    values that vary from edge to edge, none for any other. Regrouping is not harmless
    across a subtraction or inside an op's kernel expression: LLVM turned log_softmax's
    ``(x - max) - log(total)`` into ``x - (max + log(total))``, which rounds ``max +
    log(total)`` to the spacing of ``max`` -- -0.4076080 for torch's -0.4076059 at
    logits [88, 89, 90] in float32 -- and undid the corrections that expressions such as
    tanh's expm1 are written for. Nor is it with a factor the same on every edge of a row
    (a constant, a destination's value): LLVM multiplied constants first (``h * 1e30 *
    1e30`` as ``h * inf``: NaN at h = 0 where eager code gives 1e30 at h = 1e-30) and
    took a common factor out of the sum (``sum(x * -inf)`` as ``sum(x) * -inf``: inf
    where eager code adds inf and -inf to NaN). Nor with two products or more, even of
    values that vary per edge: LLVM computed ``h_u * w_e * s_u`` as ``h_u * (w_e * s_u)``
    (one scalar product per edge rather than one per column), which moves an overflow or
    underflow -- ``(big * big) * 0`` is eager code's NaN, ``big * (big * 0)`` is 0. One
    product has no order to change (GCN's ``h_u * norm_u``: the flagged units of GCN,
    SAGE, GIN and APPNP, with or without edge weights, hold at most one)."""
    regroupable = (all(v.op in _REGROUPABLE and not any(i.residency in _SAME_ON_A_ROW for i in v.inputs)
                       for v in unit.body)
                   and sum(v.op == "mul" for v in unit.body) <= 1)
    return REGISTER_ROW_FASTMATH if regroupable else frozenset()


ROWS_PER_BLOCK = 64   # rows one prange iteration reduces, sharing one accumulator buffer
CACHE_LINE_BYTES = 64
# How many edges ahead a walk prefetches the rows it will gather. A graph walk's row
# gathers are random, and out of order execution overlaps only the few misses within
# its window; asking for the rows of later edges first overlapped them. Measured on one
# core of the 2-core AMD EPYC, a CSR neighbour sum: arxiv-sized at F=64 239 -> 86 ms,
# pubmed at F=256 30 -> 21 ms; distances 4 to 16 within 5% of each other. 0 generates no
# prefetching; a launch turns it off for tables that stay in cache (`schedule.prefetch`).
PREFETCH_DISTANCE = 8


def _prefetch_ahead(em: "_Emitter", position: str, index_arrays: dict[str, str], indent: int) -> str:
    """The lines that prefetch, at walk position ``position``, the rows the kernel will
    gather `PREFETCH_DISTANCE` positions later: for each gather kind in ``index_arrays``
    (kind -> the array holding that kind's row id per position: ``col``/``eid`` in a CSR
    walk, ``src``/``dst`` in an edge kernel) that the unit reads. Nothing where it reads
    none; ``links`` (the kernel's ``prefetch_end``) bounds the read-ahead."""
    kinds = sorted({kind for _, kind in em.gathered} & set(index_arrays))
    if not kinds or not PREFETCH_DISTANCE:
        return ""
    pad = " " * indent
    return (f"{pad}ahead = {position} + U({PREFETCH_DISTANCE})\n{pad}if ahead < links:\n"
            + "".join(f"{pad}    {kind}_ahead = U({index_arrays[kind]}[ahead])\n" for kind in kinds)
            + em.prefetches({kind: f"{kind}_ahead" for kind in kinds}, indent + 4))


_WALK_INDEXES = {"neighbour": "col", "edge": "eid"}     # row ids per position: a CSR walk's
_EDGE_INDEXES = {"src": "src", "dst": "dst"}            # and an edge kernel's


def generate_aggregate(unit: AggregateUnit, name: str, acc: str, parallel: bool,
                       partitioned: bool = False, register_row: bool = False) -> tuple[str, list[Value]]:
    """Kernel source for an aggregate unit and its leaf values in argument order.

    ``name(rowptr, col, eid, prefetch_end, out, f_tile, L0, ...)`` (a parallel build takes
    its thread count first, `_definition`): ``out`` is the flat
    output of ``num_rows * width`` elements, filled completely (no zeroing needed);
    rows are prefetched for CSR positions below ``prefetch_end`` (the edge count, or 0
    for none: `schedule.prefetch`). With ``partitioned``,
    ``name(rowptr, part_ptr, rows, ptr, col, eid, prefetch_end, out, f_tile, L0, ...)``
    walks the source ranges of `partition.Partitions` one after the other (all threads on
    one range at a time, as FeatGraph does, so the range's rows stay in the shared
    cache), each range's rows reduced in parallel and combined into ``out``.

    Two details carry most of the speed (a neighbour sum on pubmed at F=64 ran 5x
    faster with both than without). Every array index is an unsigned 64-bit integer:
    for a signed index Numba emits a wrap-around check (negative indices count from
    the end), which keeps LLVM from vectorizing the feature loop. And a row is reduced
    into a local accumulator, written to ``out`` once: accumulating into ``out``
    itself, which LLVM must assume may alias the gathered inputs, stored and reloaded
    every element of every edge.

    With ``register_row`` (see `generate_register_row`) the kernel holds the row in
    registers instead and takes the whole width in one pass (``f_tile`` is unused)."""
    if register_row:
        return generate_register_row(unit, name, acc, parallel)
    if partitioned and unit.root.dtype in _TO_BITS:     # ranges add their partial rows in ``out``
        raise UnsupportedUnit(f"a partitioned walk accumulates in its {unit.root.dtype} output")
    width = math.prod(unit.reduce.shape)
    em = _Emitter(unit)
    val = em.value(unit.reduce.inputs[0], em.coords(unit.reduce.shape, "f"))
    op, join, result, scale = _reduction(unit, em)
    combine = "{0} += {1}" if op in ("sum", "mean") else f"{{0}} = {join}"
    leaves = em.params()
    reduction = f'''{em.block(_ROW, 16)}                for k in range(f_hi - f_lo):
                    acc[k] = {_IDENTITY[op]}
                for p in range(start, end):
                    nbr = U(col[p])
                    edge = U(eid[p])
{_prefetch_ahead(em, "U(p)", _WALK_INDEXES, 20)}{em.block(_EDGE, 20)}                    for fi in range(f_lo, f_hi):
                        f = U(fi)
                        k = U(fi - f_lo)
{em.block(_FEATURE, 24)}                        {combine.format("acc[k]", val)}
                base = row * width
                for fi in range(f_lo, f_hi):
                    k = U(fi - f_lo)
'''
    blocks = f"(num_rows + {ROWS_PER_BLOCK - 1}) // {ROWS_PER_BLOCK}"
    rows_of_block = f"range(block * {ROWS_PER_BLOCK}, min(block * {ROWS_PER_BLOCK} + {ROWS_PER_BLOCK}, num_rows))"
    params = f"rowptr, {'part_ptr, rows, ptr, ' if partitioned else ''}col, eid, prefetch_end, out, f_tile, {leaves}"
    head = _header(acc) + f'''{_definition(name, params, parallel)}    # {unit.describe()}
{em.block(_KERNEL, 4)}    num_rows = rowptr.shape[0] - 1
    links = U(prefetch_end)
    width = U({width})
    for f_lo in range(0, {width}, f_tile):
        f_hi = min(f_lo + f_tile, {width})
'''
    if not partitioned:
        return head + f'''        for block in prange({blocks}):
            acc = np.empty(f_hi - f_lo, ACC)
            for r in {rows_of_block}:
                row = U(r)
                start = rowptr[row]
                end = rowptr[row + U(1)]
{reduction}                    out[base + U(fi)] = {stored(unit.root, result.format("acc[k]") + scale)}
''', em.leaf_args
    finish = "" if op == "sum" and not scale else f'''        for block in prange({blocks}):
            for r in {rows_of_block}:
                row = U(r)
                start = rowptr[row]
                end = rowptr[row + U(1)]
                for fi in range(f_lo, f_hi):
                    i = row * width + U(fi)
                    out[i] = {result.format("out[i]")}{scale}
'''
    return head + f'''        for block in prange({blocks}):
            for r in {rows_of_block}:
                for fi in range(f_lo, f_hi):
                    out[U(r) * width + U(fi)] = {_IDENTITY[op]}
        for part in range(part_ptr.shape[0] - 1):
            first = part_ptr[part]
            count = part_ptr[part + 1] - first
            for block in prange((count + {ROWS_PER_BLOCK - 1}) // {ROWS_PER_BLOCK}):
                acc = np.empty(f_hi - f_lo, ACC)
                for i in range(block * {ROWS_PER_BLOCK}, min(block * {ROWS_PER_BLOCK} + {ROWS_PER_BLOCK}, count)):
                    pair = U(first + i)
                    row = U(rows[pair])
                    start = ptr[pair]
                    end = ptr[pair + U(1)]
{_indent(reduction, 4)}                        {combine.format("out[base + U(fi)]", "acc[k]")}
{finish}''', em.leaf_args


def _reduction(unit: AggregateUnit, em: _Emitter) -> tuple[str, str, str, str]:
    """(reduce op, the accumulator joined with one edge's value, how the accumulator
    becomes the output, the per-row scale's suffix) as format strings on the
    accumulator ``{0}`` and the value ``{1}``."""
    op = unit.reduce.attrs["op"]
    # NaN wins and stays, as torch's scatter_reduce amax/amin propagate it: the rule
    # lives once, in scalar.maximum / scalar.minimum.
    pick = "tl.maximum" if op == "max" else "tl.minimum"
    join = "{0} + {1}" if op in ("sum", "mean") else f"{pick}({{1}}, {{0}})"
    if op == "mean":
        result = "{0} / ACC(max(end - start, 1))"
    elif op in ("max", "min"):   # a row with no edges holds 0, as reduce's reference does
        result = "{0} if end > start else ACC(0.0)"
    else:
        result = "{0}"
    # a per-row scale (passes.fusion._row_scaled, sums only) multiplies or divides the finished row
    scale = "" if unit.scale is None else \
        f" {'*' if unit.scaled.op == 'mul' else '/'} ACC({widened(unit.scale, f'L{em.leaf_index[unit.scale.id]}[row]')})"
    return op, join, result, scale


def generate_register_row(unit: AggregateUnit, name: str, acc: str, parallel: bool) -> tuple[str, list[Value]]:
    """Kernel source for an aggregate unit of a narrow row (`schedule.register_row`)
    that keeps the row's accumulator in registers: one scalar per column, the feature
    loop written out column by column, so each edge is a gather of one row and a few
    vector adds.

    The loop kernel's feature loop has the width as a run-time bound and accumulates in
    an array: at 16 columns LLVM's vectorized body (64 floats per step) never ran, and
    every edge paid alias checks between the accumulator and the gathered row and a
    scalar remainder loop -- the neighbour sum on pubmed at F=16 ran at 0.8x of torch's
    CSR matmul (MKL). Written out, the columns are independent scalar chains that LLVM's
    SLP vectorizer packs into vector registers; the executor compiles these kernels with
    it on (`executor._compile_vectorized`; Numba leaves it off by default) and with the
    fast-math flags `REGISTER_ROW_FASTMATH` where they are safe (`register_row_fastmath`),
    which let it pack a per-edge product too. Each column is reduced over the edges in
    CSR order, as in the loop kernel, unless LLVM regroups the additions (``reassoc``):
    then the values differ in the last bits.
    The edge loop's index is unsigned, for the reason given in `generate_aggregate`: a
    signed one costs a wrap-around check per edge."""
    width = math.prod(unit.reduce.shape)
    em = _Emitter(unit, inline_constants=True)
    # each column's value, at the outermost loop it depends on (an edge's, mostly)
    vals = [em.value(unit.reduce.inputs[0], em.constant_coords(unit.reduce.shape, c)) for c in range(width)]
    op, join, result, scale = _reduction(unit, em)
    if em.lines[_FEATURE]:   # every coordinate is a constant here, so nothing should vary per feature
        raise UnsupportedUnit(f"a register-row kernel would drop feature-level code of {unit.describe()}")
    init = "".join(f"            a{c} = ACC({_IDENTITY[op]})\n" for c in range(width))
    step = "".join(f"                a{c} = ACC({join.format(f'a{c}', val)})\n" for c, val in enumerate(vals))
    store = "".join(f"            out[base + U({c})] = {stored(unit.root, result.format(f'a{c}') + scale)}\n"
                    for c in range(width))
    params = f"rowptr, col, eid, prefetch_end, out, f_tile, {em.params()}"
    source = _header(acc) + f'''{_definition(name, params, parallel, register_row_fastmath(unit))}    # {unit.describe()} (row in registers)
{em.block(_KERNEL, 4)}    num_rows = rowptr.shape[0] - 1
    links = U(prefetch_end)
    width = U({width})
    for block in prange((num_rows + {ROWS_PER_BLOCK - 1}) // {ROWS_PER_BLOCK}):
        for r in range(block * {ROWS_PER_BLOCK}, min(block * {ROWS_PER_BLOCK} + {ROWS_PER_BLOCK}, num_rows)):
            row = U(r)
            start = rowptr[row]
            end = rowptr[row + U(1)]
{em.block(_ROW, 12)}{init}            for p in range(U(start), U(end)):
                nbr = U(col[p])
                edge = U(eid[p])
{_prefetch_ahead(em, "U(p)", _WALK_INDEXES, 16)}{em.block(_EDGE, 16)}{step}            base = row * width
{store}'''
    return source, em.leaf_args


def _indent(text: str, by: int) -> str:
    return "".join(" " * by + line if line.strip() else line for line in text.splitlines(keepends=True))


def generate_edge(unit: EdgeUnit, name: str, acc: str, parallel: bool) -> tuple[str, list[Value]]:
    """Kernel source for an edge unit: ``prange`` over edges, each gathering its
    endpoints' rows and writing its own output row (FeatGraph's SDDMM template).

    ``name(src, dst, prefetch_end, out, L0, ...)`` (a parallel build takes its thread count
    first, `_definition`); a per-edge sum over feature dims (attention logits) is unrolled
    over its terms, as in the Triton generator."""
    root = unit.root
    width = math.prod(root.shape)
    em = _Emitter(unit)
    coords = em.coords(root.shape, "f")
    if feature_sum_terms(root) is not None:
        val = " + ".join(em.value(root.inputs[0], c) for c in summed_coords(root, coords))
    else:
        val = em.value(root, coords)
    params = f"src, dst, prefetch_end, out, {em.params()}"
    source = _header(acc) + f'''{_definition(name, params, parallel)}    # {unit.describe()}
{em.block(_KERNEL, 4)}    width = U({width})
    links = U(prefetch_end)
    for e in prange(src.shape[0]):
        edge = U(e)
        src_id = U(src[edge])
        dst_id = U(dst[edge])
        base = edge * width
{_prefetch_ahead(em, "edge", _EDGE_INDEXES, 8)}{em.block(_ROW, 8)}{em.block(_EDGE, 8)}        for fi in range({width}):
            f = U(fi)
{em.block(_FEATURE, 12)}            out[base + f] = {stored(root, val)}
'''
    return source, em.leaf_args
