"""Runs a program with one compiled Numba kernel per fused unit and torch ops elsewhere.

Why Numba: it is on PyPI as wheels for every platform torch supports, so ``pip install
gnnfuse[cpu]`` works on a fresh machine with no C++ toolchain (torch's extension
loader needs one on the user's machine), its ``prange`` gives OpenMP-style parallel
loops over LLVM, and it caches compiled machine code on disk.

Compile cost is kept off the hot path three ways. Kernels are generated per fused unit
and named by a digest of their source, so every unit with the same structure (each
GCN layer of a model, the same layer in every test) shares one module and one compile.
The module is written to the gnnfuse cache folder (as the Triton backend does) because
Numba's ``cache=True`` keys its on-disk cache by a real source file; a later process
loads machine code instead of compiling. Measured on the 2-core CI-like machine: a
serial kernel compiles in 0.3-0.7 s, a ``parallel=True`` one in about 2 s (so small
work runs serial kernels, `schedule.parallel`); from the disk cache a process pays about
1 s of Numba start-up once, then milliseconds per kernel (tests/test_cpu_backend.py: 41
kernels, 16 s cold, 3 s warm). And the backend is opt-in (``GNNFUSE_BACKEND=cpu``): the
torch reference stays the default for CPU tensors and the oracle.

Numba has no float16 or bfloat16: kernels read and write such tensors as their int16 bits
(`codegen.widened`, `codegen.stored`) and compute in float32. A unit the generator
cannot express, a unit mixing float32 and float64 values (`unit_ops.mixed_floats`) or a tensor off the CPU runs
through its ops' torch references instead, with a warning once per reason; without
Numba the whole program runs on the reference executor, with one warning. Never a
silent difference: the fallback computes the same values.
"""
from __future__ import annotations

import functools
import math
import weakref
from typing import Callable, Iterable, Mapping, NamedTuple

import torch

from ...ir import Program, Value, get_op
from ...passes.fusion import AggregateUnit, EdgeUnit, SharedReduceUnit, Unit, partition, summed_operand
from .. import tuned_schedule
from ..forced_schedule import forced_schedule
from ..launch_cache import CallSettings, LaunchCache
from ..reference import GraphContext
from ..reference import execute as reference_execute
from ..reference.executor import run_plan
from ..first_use import call_compiling
from ..unit_ops import mixed_floats, mixed_floats_message, run_by_ops
from ..kernel_cache import first_call_compiles, load_kernel
from ..constant_args import constant_tensors
from . import pool, schedule
from .partition import Partitions, source_partitions
from ...environ import getenv
from ...user_warning import warn

try:
    import numba

    from .codegen import UnsupportedUnit, generate_aggregate, generate_edge   # needs numba (scalar.py)
except ImportError:   # the optional 'cpu' extra is not installed: `execute` runs the reference
    numba = None

_KERNEL_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_READABLE = set(_KERNEL_DTYPES) | {torch.int32, torch.int64, torch.bool, torch.uint8, torch.int8, torch.float16,
                                    torch.bfloat16}
_AS_BITS = (torch.float16, torch.bfloat16)     # read and written as their int16 bits (codegen.widened, stored)
_WRITABLE = (*_KERNEL_DTYPES, *_AS_BITS)
_PLANS: "weakref.WeakKeyDictionary[Program, dict]" = weakref.WeakKeyDictionary()
_UNIT_KERNELS: "weakref.WeakKeyDictionary[Unit, dict]" = weakref.WeakKeyDictionary()
_PER_EDGE: "weakref.WeakKeyDictionary[SharedReduceUnit, EdgeUnit]" = weakref.WeakKeyDictionary()
_WARNED: set[str] = set()
# The ids of the kernels whose next call compiles them (`kernel_cache.first_call_compiles`):
# that call is timed (`backend.first_use`).
_FIRST_CALLS: set[int] = set()


def available() -> bool:
    """Whether Numba is importable, i.e. whether units can run as compiled kernels."""
    return numba is not None


def _warn_once(reason: str, message: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        warn(message, RuntimeWarning)


def _kernel_for(unit: Unit, acc: str, parallel: bool, partitioned: bool = False, register_row: bool = False):
    """(kernel, leaf values in argument order), or where the unit cannot be generated the
    warning saying why (`_plan` gives it); decided once per unit, accumulator type, parallelism, partitioning and
    kernel kind (plans are cached per program, so steady-state training never
    regenerates source)."""
    per_unit = _UNIT_KERNELS.setdefault(unit, {})
    key = acc, parallel, partitioned, register_row
    if key not in per_unit:
        aggregate = isinstance(unit, AggregateUnit)
        name = "cpu_aggregate" if aggregate else "cpu_edge"
        try:
            source, leaf_args = (generate_aggregate(unit, name, acc, parallel, partitioned, register_row)
                                 if aggregate else generate_edge(unit, name, acc, parallel))
            kernel = load_kernel(source, name)
            if first_call_compiles(kernel):
                _FIRST_CALLS.add(id(kernel))
            per_unit[key] = (kernel, leaf_args)
        except UnsupportedUnit as exc:
            per_unit[key] = f"gnnfuse cpu backend: {exc}; that unit runs as torch ops"
    return per_unit[key]


def _compile_vectorized(kernel: Callable, args: tuple) -> None:
    """Compile a register-row kernel (codegen.generate_register_row) for the types of
    ``args`` with LLVM's SLP vectorizer on: that kernel's columns are separate scalar
    chains that only SLP packs into vector registers (without it the neighbour sum on
    pubmed at F=16 ran 2x slower). Numba turned SLP off by default in 0.57 after
    miscompilations in the LLVM of the day (numba PR #8852) and reads the setting per
    compilation, so this turns it on for these kernels alone; the tests check each of
    them against the reference. Done when the launch is planned, with arguments of the
    launch's types, so its calls go straight to the compiled kernel: turning SLP on
    around every call cost about 1 us a call. Machine code already compiled or in the
    disk cache is loaded, not compiled; a kernel compiled without SLP (a call whose
    argument types differ after all, or another thread restoring the setting mid-way)
    is slower, never different."""
    signature = tuple([numba.typeof(a) for a in args])
    before = numba.config.SLP_VECTORIZE
    numba.config.SLP_VECTORIZE = 1
    try:
        if id(kernel) in _FIRST_CALLS:      # this compile is the kernel's first
            _FIRST_CALLS.discard(id(kernel))
            call_compiling(kernel, pool.launch, kernel.compile, signature)
        else:
            pool.launch(kernel.compile, signature)
    finally:
        numba.config.SLP_VECTORIZE = before


def _flat(tensor: torch.Tensor):
    """A CPU tensor's elements as a flat numpy array sharing its memory (copied only if
    the tensor is not contiguous, or is a lazily negated view); a float16 or bfloat16
    tensor's as their int16 bits, which Numba can read (and the kernel widens)."""
    if tensor.dtype in _AS_BITS:
        return tensor.resolve_neg().contiguous().view(torch.int16).numpy().ravel()
    return tensor.numpy(force=True).ravel()


def per_edge_part(unit: SharedReduceUnit) -> EdgeUnit:
    """The edge unit computing the per-edge operand a shared-reduce unit sums, for the
    CPU, which has no shared-reduce kernel: it runs the plan it ran before that unit
    kind existed (an edge kernel, then the torch op), so neither slower nor different.
    On a CPU the |E|-row intermediate lives in host memory, which the IO rule (a GPU
    memory budget) does not count."""
    per_edge = summed_operand(unit.root)
    return _PER_EDGE.setdefault(unit, EdgeUnit(per_edge, [v for v in unit.body if v is not per_edge], unit.leaves))


class _Launch(NamedTuple):
    """What running a unit on one graph needs besides the call's tensors, under one
    `_settings`: the kernel (None: the unit runs through its ops' torch references),
    its leaves' ids in argument order, the arguments it takes before the output (a
    parallel kernel's thread count, the graph's index arrays it walks and its prefetch
    end) and between the output and the leaves (an aggregate kernel's feature tile;
    none for an edge kernel), the output's shape and dtype, and its threads (0: a
    serial kernel) and thread chunk. The arguments are laid out here, once, so a call
    only adds its own arrays."""
    kernel: Callable | None
    leaf_ids: tuple[int, ...]
    head: tuple
    tail: tuple
    out_shape: tuple[int, ...]
    out_dtype: torch.dtype
    threads: int
    chunk: int | None
    constants: tuple = ()   # the arrays of the unit's constants, taken after the leaves (`constant_args`)
    why: str = ""           # without a kernel: the warning saying why (`by_ops_reason`)


def _read_environment() -> tuple:
    """The feature-tile override and the tuner's stored choices (one object until the
    file changes): read once per program run (`CallSettings`)."""
    return getenv(schedule.FEATURE_TILE_ENV), tuned_schedule.entries()


_ENVIRONMENT = CallSettings("gnnfuse_cpu_environment", _read_environment)
_LAUNCHES = LaunchCache()


def _settings(tensors: Iterable[torch.Tensor]) -> tuple:
    """Everything a unit's launch on a given graph depends on that can change between
    calls: a schedule the call forces, the environment (`_read_environment`), torch's
    thread count and the work below which one thread runs, whether parallel kernels can
    run (`pool.USABLE`: false in a forked child, whose parent's launches it inherits), and
    each leaf's dtype and whether it is on the CPU."""
    return (forced_schedule(), _ENVIRONMENT.current(), torch.get_num_threads(), schedule.PARALLEL_MIN_WORK,
            pool.USABLE[0], tuple([(t.dtype, t.is_cpu) for t in tensors]))


def run_unit(unit: Unit, ctx: GraphContext, leaves: dict[int, torch.Tensor]) -> torch.Tensor:
    """Run ``unit``'s kernel on ``leaves``. The launch is planned once per (unit, graph,
    `_settings`) and reused while the settings hold: on a small graph, choosing the
    schedule, threads and kernel and converting the graph's index arrays cost more than
    the kernel itself (tests/test_host_path.py bounds the Python calls left)."""
    if isinstance(unit, SharedReduceUnit):
        root, part = unit.root, per_edge_part(unit)
        env = {**leaves, part.root.id: run_unit(part, ctx, leaves)}
        return get_op(root.op).run(ctx, [env[i.id] for i in root.inputs], [i.residency for i in root.inputs],
                                   root.attrs)
    settings = _settings(leaves.values())
    launch = _LAUNCHES.get(unit, ctx.graph, settings, lambda: _plan(unit, ctx, leaves))
    kernel = launch.kernel
    if kernel is None:
        return run_by_ops(unit, ctx, leaves)
    out = torch.empty(launch.out_shape, dtype=launch.out_dtype)
    flat_out = (out.view(torch.int16) if launch.out_dtype in _AS_BITS else out).numpy().ravel()   # no call: host path
    args = (*launch.head, flat_out, *launch.tail, *[_flat(leaves[i]) for i in launch.leaf_ids], *launch.constants)
    if _FIRST_CALLS and id(kernel) in _FIRST_CALLS:       # this call compiles it
        _FIRST_CALLS.discard(id(kernel))
        kernel = functools.partial(call_compiling, kernel, kernel)
    if not launch.threads:
        kernel(*args)
    elif launch.chunk and launch.threads > 1:
        pool.launch(_call_chunked, kernel, launch.chunk, args)
    else:
        pool.launch(kernel, *args)
    return out


def _call_chunked(kernel: Callable, chunk: int, args: tuple) -> None:
    """``kernel(*args)`` handing its threads ``chunk`` iterations at a time (a tuned schedule's)."""
    with numba.parallel_chunksize(chunk):
        kernel(*args)


def _plan(unit: Unit, ctx: GraphContext, leaves: dict[int, torch.Tensor]) -> _Launch:
    """The launch of ``unit`` on ``ctx``'s graph for leaves of the dtypes and devices of
    ``leaves``, under the settings in force now (see `_Launch`)."""
    root = unit.root
    metas = [(t.dtype, t.is_cpu) for t in leaves.values()]
    if not all(on_cpu for _, on_cpu in metas) or ctx.device.type != "cpu":
        return _fallback(root, "device", "gnnfuse cpu backend: tensors are not on the CPU; fused units run as torch "
                                         "ops (use the triton backend for GPU tensors)")
    # named by the dtype without kernels: an int16 leaf beside a float32 result was
    # reported as "no kernels for torch.float32 data"
    missing = sorted({dtype for dtype, _ in metas if dtype not in _READABLE} | ({root.dtype} - set(_WRITABLE)), key=str)
    if missing:
        names = " and ".join(map(str, missing))
        return _fallback(root, f"dtype:{names}",
                         f"gnnfuse cpu backend: no kernels for {names} data; fused units run as torch ops")
    floats = mixed_floats(unit, leaves)
    if floats:
        return _fallback(root, f"mixed:{floats}", mixed_floats_message("cpu", floats))
    acc = _KERNEL_DTYPES.get(root.dtype, "float32")     # float16/bfloat16 results are computed in float32
    width = math.prod(root.shape)
    work = ctx.num_edges * width
    threads = schedule.threads(work, numba.config.NUMBA_NUM_THREADS)
    choice = schedule.chosen(unit, ctx)
    tile = schedule.feature_tile(width, choice.feature_tile)
    ranges = None
    if isinstance(unit, AggregateUnit):
        neighbours = ctx.num_rows("dst" if unit.by == "src" else "src")
        # a narrow output cannot hold the partial rows of source ranges (`generate_aggregate`)
        ranges = None if root.dtype in _AS_BITS else schedule.range_rows(unit, choice.partition_bytes, tile,
                                                                          neighbours)
    parallel = schedule.parallel(work, threads, root.shape)
    register_row = isinstance(unit, AggregateUnit) and schedule.register_row(width, tile, ranges is not None)
    compiled = _kernel_for(unit, acc, parallel, ranges is not None, register_row)
    if isinstance(compiled, str):
        return _fallback(root, f"unit:{compiled}", compiled)
    kernel, leaf_args = compiled
    # the rows a walk gathers come from tables of about this many bytes (the other side's
    # vertices, as wide as the output)
    gathered = (neighbours if isinstance(unit, AggregateUnit) else max(ctx.num_rows("src"), ctx.num_rows("dst")))
    prefetching = schedule.prefetch(gathered * width * root.dtype.itemsize)
    if isinstance(unit, AggregateUnit):
        rowptr, col, eid = ctx.csr(unit.by)
        graph_args = (rowptr.numpy(), col.numpy(), eid.numpy()) if ranges is None else \
            _partitioned(rowptr, source_partitions(ctx, unit.by, ranges))
        rows = ctx.num_rows(unit.by)
    else:
        graph_args, rows = (ctx.src.numpy(), ctx.dst.numpy()), ctx.num_edges
    walked = graph_args[-2] if isinstance(unit, AggregateUnit) else graph_args[0]    # col, or src
    head = (*graph_args, walked.shape[0] if prefetching else 0)     # the kernel's prefetch_end
    if parallel:
        head = (threads, *head)
    tail = (tile,) if isinstance(unit, AggregateUnit) else ()      # edge kernels take no tile
    constants = tuple(t.numpy() for t in constant_tensors(unit, "cpu"))
    if register_row:
        example_out = _flat(torch.empty(0, dtype=root.dtype))
        _compile_vectorized(kernel, (*head, example_out, *tail, *[_flat(leaves[v.id]) for v in leaf_args], *constants))
    return _Launch(kernel, tuple(v.id for v in leaf_args), head, tail, (rows,) + root.shape, root.dtype,
                   threads if parallel else 0, choice.chunk, constants)


def _fallback(root: Value, reason: str, message: str) -> _Launch:
    """The launch of a unit that runs as torch ops, for the reason ``message`` gives (once
    per ``reason``)."""
    _warn_once(reason, message)
    return _Launch(None, (), (), (), (), root.dtype, 1, None, why=message)


def by_ops_reason(unit: Unit, ctx: GraphContext, leaves: dict[int, torch.Tensor]) -> str | None:
    """Why `run_unit` runs ``unit`` as torch ops on ``ctx``'s graph for leaves of the dtypes
    and devices of ``leaves`` (the warning it gave), or None where a kernel runs it: the
    launch `run_unit` plans, the one it keeps where it ran. `gnnfuse.explain` lists such
    a unit as the ops it runs, and their per-edge writes."""
    if numba is None:
        return "GNNFUSE_BACKEND=cpu needs numba; the program runs on the torch reference executor"
    launch = _LAUNCHES.get(unit, ctx.graph, _settings(leaves.values()), lambda: _plan(unit, ctx, leaves))
    return launch.why if launch.kernel is None else None


def _partitioned(rowptr: torch.Tensor, parts: Partitions) -> tuple:
    return rowptr.numpy(), parts.part_ptr, parts.rows, parts.ptr, parts.col, parts.eid


def execute(program: Program, ctx: GraphContext, feeds: Mapping[str, torch.Tensor],
            keep: Iterable[int] = ()) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    if numba is None:
        _warn_once("numba", "GNNFUSE_BACKEND=cpu needs numba (pip install 'gnnfuse[cpu]'); running the torch "
                            "reference executor instead")
        return reference_execute(program, ctx, feeds, keep)
    keep = tuple(sorted(set(keep))) if keep else ()
    plans = _PLANS.get(program)
    if plans is None:     # not setdefault: a weak dictionary's builds a weak reference per call
        plans = _PLANS[program] = {}
    if keep not in plans:
        plans[keep] = partition(program, keep)
    return _ENVIRONMENT.run(run_plan, program, plans[keep], ctx, feeds, keep, run_unit)
