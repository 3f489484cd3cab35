"""Reuse a trace when a later call would trace to the same program.

Front ends trace the user's function on every call, because tracing is the only way to
see what it computes. On a small graph that Python work is a visible share of a
training step, and it almost always yields the same program again. A trace depends on

1. the keys, shapes and dtypes of the tensors passed (and the default dtype),
2. the code of the traced functions,
3. whatever else that code can read: closure variables, default arguments, globals,
   and the same for any plain Python function it calls.

(1) and (2) are the cache key. (3) is *guarded*: every value the code can reach from
outside its arguments is snapshotted on each call -- immutable scalars by value,
library modules, classes and functions by identity, user functions recursively -- and
becomes part of the key, so a changed closure constant or a rebound global traces
afresh. A function that can reach anything else (a tensor it captured, a list, a dict,
an object with attributes, a module or class of the user's own) is never cached: such
state can change without changing identity, and a stale program would compute the
wrong thing silently. Programs that captured tensors as parameters are not cached for
the same reason.

Some reads cannot be snapshotted at all. A random draw or a clock read at trace time
(``torch.rand(()).item()``, ``numpy.random.rand()``, ``random.random()``) is baked into
the program as a constant, so code that calls a function of that name (``_IMPURE``)
is traced on every call and draws anew, as eager code would; so is code that reads its
namespace by name (``globals()['NAME']``, ``vars()``, ``eval``), which the guard walk
cannot follow. A ``functools.partial`` UDF is guarded by its function and bound
arguments; bound methods, ``nn.Module`` UDFs and other callable objects hold state
of their own and are traced on every call.
"""
from __future__ import annotations

import builtins
import dis
import enum
import functools
import types
import weakref
from typing import Any, Callable, Hashable, Mapping

import torch

from ..runtime import CompiledProgram, compiled_for
from .tracer import Tracer

_MISSING = object()
_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)
# Functions of these packages are trusted to behave the same while their identity holds.
_LIBRARIES = ("torch", "math", "operator", "functools", "builtins", "numpy", "gnnfuse")
_LIMIT = 256     # distinct structures kept per cache; beyond that the oldest is dropped
# Functions whose result differs between calls (random draws, clocks) and builtins that
# read a namespace by name: code that names one is never cached.
_IMPURE = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
    "multinomial", "normal", "poisson", "random", "random_", "uniform", "uniform_", "normal_",
    "exponential_", "geometric_", "cauchy_", "log_normal_", "choice", "choices", "shuffle",
    "permutation", "sample", "gauss", "randrange", "getrandbits", "random_sample", "standard_normal",
    "default_rng", "time", "time_ns", "perf_counter", "monotonic", "urandom",
    "globals", "locals", "vars", "eval", "exec", "__import__"})
_NAME_LOADS = ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD", "LOAD_DEREF", "IMPORT_NAME", "IMPORT_FROM")


class _Uncacheable(Exception):
    """Raised inside the guard walk when a reachable value cannot be snapshotted."""


@functools.lru_cache(maxsize=1024)
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """Names ``code`` (and the comprehensions and lambdas nested in it) looks up as
    globals, read from its bytecode. ``co_names`` would also list attribute names, and
    ``u.h`` next to a global tensor ``h`` would then make the function uncacheable."""
    names = [ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_global_names(const))
    return tuple(dict.fromkeys(names))


@functools.lru_cache(maxsize=1024)
def _impure_name(code: types.CodeType) -> str | None:
    """The first name in ``_IMPURE`` that ``code`` (or code nested in it) loads or calls."""
    for ins in dis.get_instructions(code):
        if ins.opname in _NAME_LOADS and ins.argval in _IMPURE:
            return ins.argval
    return next((name for const in code.co_consts if isinstance(const, types.CodeType)
                 for name in [_impure_name(const)] if name), None)


def _freeze(value: Any, seen: set[int]) -> Hashable:
    if isinstance(value, (*_SCALARS, enum.Enum)):
        return type(value), value
    if isinstance(value, (tuple, frozenset)):
        return type(value), tuple(_freeze(v, seen) for v in value)
    if isinstance(value, types.BuiltinFunctionType):
        bound = getattr(value, "__self__", None)
        if value.__name__ in _IMPURE or not (bound is None or isinstance(bound, (types.ModuleType, type))):
            # random.random is bound to a Random instance: its result is that object's state
            raise _Uncacheable(f"builtin {value.__name__}")
        return value
    if isinstance(value, functools.partial):
        return (functools.partial, _freeze(value.func, seen), _freeze(value.args, seen),
                _freeze(tuple(value.keywords.items()), seen))
    if isinstance(value, (types.ModuleType, type)):
        # A library's attributes are trusted; a user's module or class is a namespace whose
        # attributes (``settings.scale``) can be rebound without changing its identity.
        if _from_library(value.__name__ if isinstance(value, types.ModuleType) else value.__module__):
            return value
        raise _Uncacheable(f"{type(value).__name__} {value.__name__}")
    if isinstance(value, types.FunctionType):
        if _from_library(value.__module__):
            return value
        return value, _function_state(value, seen)
    raise _Uncacheable(type(value).__name__)


def _from_library(module_name: str | None) -> bool:
    return (module_name or "").split(".")[0] in _LIBRARIES


def _function_state(fn: types.FunctionType, seen: set[int]) -> Hashable:
    """Snapshot of everything ``fn`` reads besides its arguments."""
    if id(fn) in seen:          # recursion: the function is already being snapshotted
        return "recursive"
    seen.add(id(fn))
    if _impure_name(fn.__code__):
        raise _Uncacheable(f"{fn.__qualname__} calls {_impure_name(fn.__code__)}")
    env = fn.__globals__
    globals_ = tuple(_freeze(env[name], seen) if name in env else _MISSING
                     for name in _global_names(fn.__code__) if name in env or not hasattr(builtins, name))
    cells = tuple(_freeze(cell.cell_contents, seen) for cell in fn.__closure__ or ())
    defaults = _freeze(fn.__defaults__ or (), seen), _freeze(tuple((fn.__kwdefaults__ or {}).items()), seen)
    return fn.__code__, globals_, cells, defaults


def guard_key(functions: tuple[Callable | None, ...]) -> Hashable | None:
    """The guard part of the key for tracing ``functions``, or None when one of them can
    reach state that cannot be snapshotted (then every call traces)."""
    seen: set[int] = set()
    try:
        return tuple(None if fn is None else _function_state(fn, seen) if isinstance(fn, types.FunctionType)
                     else _freeze(fn, seen) for fn in functions)
    except _Uncacheable:
        return None


def signature(tables: tuple[Mapping[str, torch.Tensor], ...]) -> Hashable:
    """The argument part of the key: keys, dtypes and per-row shapes of every tensor
    passed. The row count (dim 0: vertices, edges or types) is left out: the tracer
    sees it only as a symbolic `RowCount`, so a trace never depends on it, and the
    batches of a sampled mini-batch run (a different vertex count each) reuse one trace."""
    return torch.get_default_dtype(), tuple(
        tuple((key, t.dim(), tuple(t.shape[1:]), t.dtype) for key, t in table.items()) for table in tables)


class TraceCache:
    """Compiled programs by (guard key, argument signature), for traces that captured no
    tensors. A lookup costs a walk over the functions' globals and closure cells."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, CompiledProgram] = {}
        _ALL.add(self)

    def compiled(self, functions: tuple[Callable | None, ...], tables: tuple[Mapping[str, torch.Tensor], ...],
                 trace: Callable[[], Tracer]) -> tuple[CompiledProgram, dict[str, torch.Tensor]]:
        """The compiled program for ``functions`` called on ``tables``, and the tensors
        its trace captured (program inputs beside the tables); ``trace`` runs only when
        no reusable trace is cached."""
        guards = guard_key(functions)
        key = None if guards is None else (guards, signature(tables))
        if key in self._entries:
            return self._entries[key], {}
        tracer = trace()
        compiled, captured = compiled_for(tracer.program), dict(tracer.captured.values())
        if key is not None and not captured:
            if len(self._entries) >= _LIMIT:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = compiled
        return compiled, captured


_ALL: "weakref.WeakSet[TraceCache]" = weakref.WeakSet()


def clear_trace_caches() -> None:
    """Forget every cached trace, so the next call of each function traces (and asks
    `compiled_for`) again: for tests that inspect freshly compiled programs, since a
    trace is reused across graphs of any size."""
    for cache in list(_ALL):
        cache._entries.clear()


def check_tables(**tables: Mapping[str, torch.Tensor] | None) -> None:
    """Each feature argument (``ndata=``, ``v_feature=``, ...) is a dict of name -> tensor;
    anything else would fail deep inside tracing with an unrelated message."""
    for argument, table in tables.items():
        if table is None:
            continue
        if not isinstance(table, Mapping):
            raise TypeError(f"{argument} must be a dict of feature name -> tensor (e.g. {argument}={{'h': x}}), "
                            f"got {type(table).__name__}")
        for key, tensor in table.items():
            if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{argument} must map str names to tensors; {argument}[{key!r}] is "
                                f"{type(tensor).__name__}")


def program_feeds(tables: tuple[Mapping[str, torch.Tensor], ...],
                  captured: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A traced program's inputs by name: node tensors as given, edge and per-type
    tensors under the prefixes the tracers give them, then the captured parameters."""
    feeds = {f"{prefix}{key}": t for prefix, table in zip(_PREFIXES, tables) for key, t in table.items()}
    return {**feeds, **captured}


_PREFIXES = ("", "e.", "etype.", "ntype.")   # node, edge, edge-type, node-type tables
