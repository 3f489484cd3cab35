"""Front-end calls while ``torch.compile`` traces a model: one opaque operator per call.

Eagerly, a vertex function or message/reduce UDF is traced into a program on each call
(or found in the trace cache) and run. Dynamo cannot trace that Python into a graph, so
under ``torch.compile`` (`torch.compiler.is_compiling`) a call instead

1. asks `program_at_compile_time` -- run by dynamo once, as a constant (its result is
   assumed fixed for the UDF and the tables' keys, per-row shapes and dtypes, exactly
   what the trace cache keys on) -- for the compiled program's operator name, inputs
   and outputs, tracing on stand-in tables that hold no data;
2. runs the program as ``gnnfuse::run_program`` (`runtime.compile_op`), which builds the
   graph layouts and launches the fused kernels at run time.

A UDF is named to the operator by the key of its registration here (`register_udf`),
so only UDF objects that exist outside the traced code qualify: module-level
`VertexFunction` s and the objects `udf_factory` factories return. A call that
cannot run so -- a UDF whose trace captures tensors from outside its arguments (they
would be frozen into the compiled graph), a typed graph, a program drawing random
numbers, a UDF reaching state the trace cache cannot guard (a dict, a list, a random
draw) or reading a tensor's value in Python (``.item()``; both traced anew on every
eager call) -- runs eagerly behind a graph break, with a warning.

Dynamo never sees what the UDF's code reads (it calls step 1 as a constant), so it puts
no guard on a global or closure value the trace depended on. The operator's name carries
the trace cache's guard instead (`_unchanged`): each run checks that the UDF still reads
what it read when traced, and raises where a global was rebound since (a compiled graph
would otherwise keep running the old program: a scale of 2.0 rebound to 3.0 still gave
2.0 x the sum).
"""
from __future__ import annotations

import functools
import itertools
import operator
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable, Mapping

import torch

from ..graph import Graph
from ..ir import CompileError
from ..runtime.compile_op import GraphRef, graph_input_problem, register_program, run_eagerly, run_program
from .autocast import stand_ins_under
from .trace_cache import guard_key, program_feeds, same_reads, shallow_reads, signature

_UDFS: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def register_udf(udf: Any) -> str:
    """A key naming ``udf`` (an object with ``compiled(tables)``, the tuple of user
    functions it traces, ``functions``, and the `TraceCache` ``compiled`` asks,
    ``traces``) to `program_at_compile_time`."""
    key = f"{type(udf).__name__}-{next(_KEYS)}"
    _UDFS[key] = udf
    return key


def _constant_result(fn: Callable) -> Callable:
    """Mark ``fn`` as `torch.compiler.assume_constant_result` does: dynamo calls it at
    trace time and keeps the result as a constant. Set directly because the public
    spelling imports dynamo (seconds) at gnnfuse's import."""
    fn._dynamo_marked_constant = True
    return fn


def udf_factory(build: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a function building a UDF from constants (a reduction list, a
    slope): memoised per argument tuple, built outside any traced code, so a model
    torch.compile traces meets the same registered UDF object the eager path uses."""
    name = f"{build.__module__}.{build.__qualname__}"
    _BUILDERS[name] = build

    @functools.wraps(build)
    def make(*args: Hashable) -> Any:
        if torch.compiler.is_compiling():
            args = tuple(_specialized(arg) for arg in args)
        return getattr(_MADE, _made(name, args))
    return make


def _specialized(value: Hashable) -> Hashable:
    """``value`` as a constant to dynamo. Under torch.compile(dynamic=True) a module's
    float and int attributes (GAT's slope and dropout) are symbolic, and `_made` could not
    be a constant: fullgraph=True refused GATConv. ``as_integer_ratio`` and
    ``operator.index`` specialize them (a guard on the value; ``float()`` and ``int()``
    keep them symbolic), and the ratio gives the float back exactly."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return operator.index(value)
    if isinstance(value, float):
        numerator, denominator = value.as_integer_ratio()
        return numerator / denominator
    return value


class _Made:
    """The UDFs `udf_factory` built, one attribute each (`_made` names them). Not a
    dict: dynamo copies a global dict's items where its trace first reads it, so a UDF
    built later in the same trace -- a model's second SAGEConv with another aggr list --
    was a KeyError there (fullgraph=True refused the model; without it the model's
    whole forward ran eagerly). An object's attributes it reads when asked."""


_BUILDERS: dict[str, Callable[..., Any]] = {}
_MADE = _Made()
_NAMES: OrderedDict[tuple[str, tuple], str] = OrderedDict()     # least recently asked first
# UDFs kept; beyond that the least recently asked is dropped (a layer still using it builds
# it again). Their arguments are hyperparameters: a random search over GAT's slope or
# APPNP's alpha built two per trial (training and eval), kept for the process (6.8 KiB a
# trial on the CPU once the trace caches were full).
_MADE_LIMIT = 256
_MADE_COUNT = itertools.count()     # attribute names are never reused: dynamo guards on them


@_constant_result
def _made(name: str, args: tuple) -> str:
    """The `_MADE` attribute holding ``name(*args)``, built on first use. A constant to
    dynamo, which then reads the UDF from the module's table, a lookup it can guard."""
    key = (name, args)
    attribute = _NAMES.get(key)
    if attribute is not None:
        _NAMES.move_to_end(key)
        return attribute
    made = _BUILDERS[name](*args)       # first: a builder may itself make another UDF
    while len(_NAMES) >= _MADE_LIMIT:
        delattr(_MADE, _NAMES.popitem(last=False)[1])
    _NAMES[key] = attribute = f"udf_{next(_MADE_COUNT)}"
    setattr(_MADE, attribute, made)
    return attribute


@_constant_result
def program_at_compile_time(udf_key: str, table_signature: Hashable
                            ) -> tuple[str, tuple[str, ...], tuple[str, ...]] | str:
    """(operator name of the compiled program, its input names, its output names) for the
    UDF registered under ``udf_key`` called on tables of ``table_signature``; or, when it
    cannot run as the operator, why not."""
    default_dtype, autocast, tables = table_signature
    with stand_ins_under(autocast):     # the meta device has no autocast: traced under the call's
        # never traced by dynamo itself: where the signature is no constant (under
        # torch.compile(dynamic=True) feature widths are symbolic) dynamo breaks the graph
        # at this call and runs it as Python, and then traced its frames, the tracer's
        # included, on symbolic values ('torch.Size' object has no attribute
        # 'is_floating_point'), and the trace cache kept that failure for eager calls too
        return torch.compiler.disable(_program_for)(udf_key, tables)


def _program_for(udf_key: str, tables: Hashable) -> tuple[str, tuple[str, ...], tuple[str, ...]] | str:
    """`program_at_compile_time` for the tables' keys, per-row shapes and dtypes."""
    udf = _UDFS[udf_key]
    guard = guard_key(udf.functions)
    if guard is None:
        return ("a UDF reaches state that cannot be guarded (a mutable object, a random draw, globals()), "
                "which a compiled graph would read once")
    stand_ins = tuple({key: torch.empty((1, *rest) if dim else (), dtype=dtype, device="meta")
                       for key, dim, rest, dtype in table} for table in tables)
    compiled, captured = udf.compiled(stand_ins)
    if captured:
        return (f"a UDF reads tensors {sorted(captured)} from outside its arguments (pass them as node or edge "
                "features to trace it)")
    if not udf.traces.holds(guard, stand_ins, compiled):
        # traced every eager call, as its trace baked a tensor's value in: a compiled graph kept
        # the first value (2x the sum after the tensor said 4x), and the guard sees no change
        return ("a UDF reads a tensor's value in Python (.item(), float(t), if t:), which a compiled graph "
                "would read once")
    named = (udf_key, guard, id(compiled))      # compiled programs stay registered: their ids stay theirs
    if named not in _CHECKED_NAMES:
        try:
            _CHECKED_NAMES[named] = register_program(compiled, _unchanged(udf_key, udf.functions, guard))
        except CompileError as exc:
            return str(exc)
    return _CHECKED_NAMES[named], tuple(compiled.program.inputs), tuple(compiled.program.outputs)


# One operator name per UDF, guard and program. Under torch.compile(dynamic=True) the
# signature is symbolic, so dynamo calls `program_at_compile_time` on every call: a fresh
# name each time registered a check per call (kept for the process) and, being a constant
# of the graph after the break, recompiled that graph every call until dynamo's limit.
_CHECKED_NAMES: dict[tuple[str, Hashable, int], str] = {}


def _unchanged(udf_key: str, functions: tuple[Callable | None, ...], guard: Hashable) -> Callable[[], None]:
    """A check, run before each run of the operator, that ``functions`` still have the
    guard key ``guard`` they were traced with (by identities where those decide it, as a
    repeated eager call checks: `repeat_call.RepeatCall`); it raises where they do not."""
    udf, reads = weakref.ref(_UDFS[udf_key]), shallow_reads(functions)
    del functions       # read through the UDF: a compiled graph outliving it keeps nothing alive

    def check() -> None:
        live = udf()
        if live is None:
            return
        if (reads is None or not same_reads(live.functions, reads)) and guard_key(live.functions) != guard:
            names = ", ".join(fn.__qualname__ for fn in live.functions if fn is not None)
            raise RuntimeError(f"gnnfuse: {names} now read(s) a global or closure value other than when "
                               "torch.compile or torch.export traced the call, and the compiled graph or exported "
                               "program still runs the program traced then (neither watches what a gnnfuse UDF "
                               "reads): under torch.compile call torch.compiler.reset() to trace again; an "
                               "exported program must be exported again; or pass the value as a feature")
    return check


def _widths_fixed(table_signature: Hashable) -> Hashable:
    """``table_signature`` with its per-row sizes as plain ints. Under
    torch.compile(dynamic=True) they are symbolic, so the program lookup could not be a
    constant: dynamo broke the graph there and retraced the frames after it on every call
    with a new edge_index (65-76 ms a call until its recompile limit, then a warning).
    ``operator.index`` specializes each (``int()`` keeps it symbolic): a program is traced
    for its per-row shapes anyway, so the guard on them costs nothing."""
    default_dtype, autocast, tables = table_signature
    return default_dtype, autocast, tuple(tuple((key, dim, tuple(operator.index(size) for size in rest), dtype)
                                                for key, dim, rest, dtype in table) for table in tables)


def call_compiled(udf_key: str, graph: Any, tables: tuple[Mapping[str, torch.Tensor], ...],
                  eager: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A UDF call as torch.compile traces it, or ``eager()`` behind a graph break when it
    has no traced form. On a raw index tensor the vertex count is the node table's row
    count (under compile the ids cannot be read to infer it)."""
    problem = graph_input_problem(graph)
    rows = next((t.shape[0] for t in tables[0].values()), None)
    if problem is None and rows is None and not isinstance(graph, (Graph, GraphRef)):
        problem = "a UDF called on an edge_index without node features (whose rows give the vertex count)"
    found = program_at_compile_time(udf_key, _widths_fixed(signature(tables))) if problem is None else problem
    if isinstance(found, str):
        return run_eagerly(found, eager)
    program, inputs, outputs = found
    feeds = program_feeds(tables, {})
    return dict(zip(outputs, run_program(program, GraphRef.of(graph, rows), [feeds[k] for k in inputs])))
