"""Reuse a trace when a later call would trace to the same program.

Front ends trace the user's function on every call, because tracing is the only way to
see what it computes. On a small graph that Python work is a visible share of a
training step, and it almost always yields the same program again. A trace depends on

1. the keys, shapes and dtypes of the tensors passed (and the default dtype),
2. the code of the traced functions,
3. whatever else that code can read: closure variables, default arguments, globals,
   attributes set on the function, and the same for any plain Python function it calls.

(1) and (2) are the cache key. (3) is *guarded*: every value the code can reach from
outside its arguments is snapshotted on each call -- immutable scalars by value,
library modules, classes and functions by identity, user functions recursively -- and
becomes part of the key, so a changed closure constant or a rebound global traces
afresh. A function that can reach anything else (a list, a dict, an object with
attributes, a module or class of the user's own) is never cached: such state can change
without changing identity, and a stale program would compute the wrong thing silently.
The exception is a torch or PyG ``nn.Module`` the code calls (EdgeConv's closed-over
``nn``, a PyG layer's ``self.lin``): its class is trusted like a library function, and
everything else it computes from -- its ``__dict__``: the training flag, settings such as
``negative_slope``, parameters, buffers and submodules -- is snapshotted by value on
every call, so an edited setting or a swapped submodule traces afresh (`_module_state`).

Tensors it reaches (a layer's attention vector in a closure, a global weight) are
guarded by their metadata -- shape, dtype, device, layout, requires_grad, and which of
them are the same object -- and the place they were found (closure cell, global name,
default, partial argument) is remembered. Such a trace is reused only when every tensor
the tracer captured as a program parameter was found at one of those places, so a
later call feeds the tensor that is there *now*; and only when the trace read no
tensor's value in Python (``.item()``, ``float(t)``, ``if t:`` -- watched by a
`torch.overrides.TorchFunctionMode`), which would have baked the value in. Anything
else -- a tensor made inside the function and captured, a value read -- traces on
every call, as before.

Some reads cannot be snapshotted at all. A random draw or a clock read at trace time
(``torch.rand(()).item()``, ``numpy.random.rand()``, ``random.random()``) is baked into
the program as a constant, so code that calls a function of that name (``_IMPURE``)
is traced on every call and draws anew, as eager code would -- and so is any trace that
moved a random generator's state (`random_draws`: a draw inside library code); so is
code that reads its namespace by name (``globals()['NAME']``, ``vars()``, ``eval``),
or imports a module of the user's (``from config import SCALE`` inside the function:
`user_import`), which the guard walk cannot follow, and code that writes a global or
closure variable (`outside_writes`) or a tensor it reaches in place (`_written`), whose
write a cached program would skip, or whose trace changed an attribute its key snapshots
(`_wrote_state`). A ``functools.partial`` UDF is guarded by its function and bound
arguments; bound methods, ``nn.Module`` UDFs and other callable objects hold state
of their own and are traced on every call.

A trace that raised is remembered under its key like one that succeeded, and a later
call of that key raises a copy of the error without tracing (`_remember_failure`): it
would fail the same way.
"""
from __future__ import annotations

import builtins
import contextlib
import copy
import dis
import enum
import functools
import math
import sys
import types
import weakref
from typing import Any, Callable, Hashable, Mapping

import torch

from ..runtime import CompiledProgram, compiled_for
from ..runtime.autocast import AUTOCAST_DEVICE_TYPES, outside_autocast
from ..user_warning import warn
from .autocast import autocast_state
from .module_hooks import GLOBAL_HOOK_TABLES
from .random_draws import RandomDraws
from .kept_traced import KeptTraced
from .tracer import Tracer

_MISSING = object()
_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)
# Functions of these packages are trusted to behave the same while their identity holds.
_LIBRARIES = ("torch", "math", "operator", "functools", "builtins", "numpy", "gnnfuse")
_LIMIT = 256     # distinct structures kept per cache; beyond that the oldest is dropped
# Traces kept of one function after which its cache warns (once) that what they read keeps changing
RETRACE_WARNING = 64
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


_OUTSIDE_WRITES = ("STORE_GLOBAL", "DELETE_GLOBAL")


@functools.lru_cache(maxsize=1024)
def outside_writes(code: types.CodeType, free: frozenset[str] | None = None) -> tuple[tuple[str, str, int], ...]:
    """The writes the code makes to variables that outlive the call -- a global, a closure
    variable (``nonlocal``) -- each as ("global" or "nonlocal", name, line), in code
    order, those of nested code after. A cached program runs without the code, so the
    write would stop: a ``nonlocal sign; sign = -sign`` stuck once its values repeated a
    cached key. The function's own cell variables (a local a comprehension reads) are
    local to the call. (Attribute writes are not refused: PyG's ``message`` methods keep
    ``self._alpha``, which gnnfuse's attention-weight path handles.)"""
    free = frozenset(code.co_freevars) if free is None else free
    found, line = [], code.co_firstlineno
    for ins in dis.get_instructions(code):
        line = ins.positions.lineno if ins.positions and ins.positions.lineno else line
        if ins.opname in _OUTSIDE_WRITES or (ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in free):
            found.append(("global" if "GLOBAL" in ins.opname else "nonlocal", ins.argval, line))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.extend(outside_writes(const, free))
    return tuple(found)


@functools.lru_cache(maxsize=1024)
def impure_name(code: types.CodeType) -> str | None:
    """The first name in ``_IMPURE`` that ``code`` (or code nested in it) loads or calls."""
    for ins in dis.get_instructions(code):
        if ins.opname in _NAME_LOADS and ins.argval in _IMPURE:
            return ins.argval
    return next((name for const in code.co_consts if isinstance(const, types.CodeType)
                 for name in [impure_name(const)] if name), None)


# Modules whose import inside a traced function keeps it cacheable: PyG and Python's
# standard library (``import itertools`` there is no setting a user edits between calls;
# counted as a user module, such a UDF traced on every call, slower and no more right)
_IMPORTED_LIBRARIES = frozenset({"torch_geometric", *sys.stdlib_module_names})


@functools.lru_cache(maxsize=1024)
def user_import(code: types.CodeType, module: str | None = None) -> str | None:
    """The first module outside the libraries (``_LIBRARIES``, `_IMPORTED_LIBRARIES`)
    that ``code`` (or code nested in it) imports: ``from config import SCALE`` or
    ``import config; config.SCALE`` inside the function reads a module attribute no global
    or closure cell holds, so the guard walk never saw it, and a cached program kept the value of its trace (2x the sum
    after ``config.SCALE = 3.0``). A relative import is named by its dots; it is a
    library's own where ``module`` (the code's module, by name) is a library's."""
    if _from_library(module, _IMPORTED_LIBRARIES):
        return None
    level = 0
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_CONST" and isinstance(ins.argval, int):
            level = ins.argval      # IMPORT_NAME's level, pushed just before its fromlist
        elif ins.opname == "IMPORT_NAME" and (level or not _from_library(ins.argval, _IMPORTED_LIBRARIES)):
            return "." * level + ins.argval
    return next((name for const in code.co_consts if isinstance(const, types.CodeType)
                 for name in [user_import(const)] if name), None)


# Where a guarded value was found, step by step from the traced functions: ("fn", i),
# ("cell", k), ("global", name), ("default", i), ("kwdefault", name), ("item", i),
# ("func",), ("arg", i), ("keyword", name), ("attr", name) (of an nn.Module), ("key", k).
Path = tuple[tuple[Any, ...], ...]


class _Walk:
    """State of one guard walk: the functions already entered (recursion), every
    tensor met, with the path it was found at, and whether it met state that the
    identity of what holds it does not vouch for (`shallow_reads`): a user function the
    traced ones call, or a ``functools.partial``, whose keywords are a dict."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.tensors: list[tuple[Path, torch.Tensor]] = []
        self.deep = False


def _freeze(value: Any, walk: _Walk, path: Path) -> Hashable:
    if isinstance(value, (*_SCALARS, enum.Enum)):
        if isinstance(value, float) and value == 0.0:     # -0.0 == 0.0, but 1 / -0.0 is -inf (numpy's too)
            return float, value, math.copysign(1.0, value)
        return type(value), value
    if isinstance(value, torch.Tensor):
        walk.tensors.append((path, value))
        return torch.Tensor, tuple(value.shape), value.dtype, value.device, value.layout, value.requires_grad
    if isinstance(value, tuple):
        return tuple, tuple(_freeze(v, walk, path + (("item", i),)) for i, v in enumerate(value))
    if isinstance(value, frozenset):
        if any(isinstance(v, torch.Tensor) for v in value):
            raise _Uncacheable("a tensor in a frozenset")      # no order to find it by again
        return frozenset, tuple(_freeze(v, walk, path) for v in value)
    if isinstance(value, types.BuiltinFunctionType):
        bound = getattr(value, "__self__", None)
        if value.__name__ in _IMPURE or not (bound is None or isinstance(bound, (types.ModuleType, type))):
            # random.random is bound to a Random instance: its result is that object's state
            raise _Uncacheable(f"builtin {value.__name__}")
        return value
    if isinstance(value, functools.partial):
        walk.deep = True        # ``p.keywords["k"] = 3.0`` changes it in place
        return (functools.partial, _freeze(value.func, walk, path + (("func",),)),
                tuple(_freeze(a, walk, path + (("arg", i),)) for i, a in enumerate(value.args)),
                tuple((k, _freeze(a, walk, path + (("keyword", k),))) for k, a in value.keywords.items()))
    if isinstance(value, torch.nn.Module):
        walk.deep = True        # ``layer.p = 0.3`` changes it in place
        return _module_state(value, walk, path)
    if isinstance(value, (types.ModuleType, type)):
        # A library's attributes are trusted; a user's module or class is a namespace whose
        # attributes (``settings.scale``) can be rebound without changing its identity.
        if _from_library(value.__name__ if isinstance(value, types.ModuleType) else value.__module__):
            return value
        raise _Uncacheable(f"{type(value).__name__} {value.__name__}")
    if isinstance(value, types.FunctionType):
        if _from_library(value.__module__) and "<locals>" not in value.__qualname__:
            return value
        # by code and state, not identity: a helper defined inside a layer's forward is a
        # new object on every call, with the same code and (guarded) closure
        walk.deep = True
        return _function_state(value, walk, path)
    raise _Uncacheable(type(value).__name__)


# nn.Module classes whose forward is trusted to compute from the module's own state alone
_MODULE_LIBRARIES = ("torch", "torch_geometric")
_STATE = ("_parameters", "_buffers", "_modules")


def _module_state(module: torch.nn.Module, walk: _Walk, path: Path) -> Hashable:
    """Snapshot of a library module (``torch.nn.Linear``, a ``Sequential`` of them, PyG's
    ``Linear``) that traced code calls: its class by name, and every entry of its
    ``__dict__`` -- the training flag, settings such as ``negative_slope`` or ``p``, and
    its parameters, buffers and submodules, each found again by attribute name. A user's
    module class (its ``forward`` may read anything), a hook (run at trace time only),
    a module whose forward writes its own state (batch norm's running statistics while
    training) and an uninitialised lazy parameter cannot be snapshotted."""
    kind = type(module)
    if (kind.__module__ or "").split(".")[0] not in _MODULE_LIBRARIES or "<locals>" in kind.__qualname__:
        raise _Uncacheable(f"module {kind.__qualname__}")
    if any(GLOBAL_HOOK_TABLES) or module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or \
            getattr(module, "_backward_pre_hooks", None):
        raise _Uncacheable(f"hooks on {kind.__qualname__}")
    if isinstance(module, torch.nn.modules.batchnorm._NormBase) and module.training and module.track_running_stats:
        raise _Uncacheable(f"{kind.__qualname__} updates its running statistics")
    if id(module) in walk.seen:
        return "recursive"
    walk.seen.add(id(module))
    state: list[Hashable] = [kind.__module__, kind.__qualname__]
    for name, value in vars(module).items():
        if "state_dict" in name:        # state_dict hooks: state_dict() runs them, never forward
            continue
        if name in _STATE:
            for key, item in value.items():
                if isinstance(item, torch.nn.parameter.UninitializedTensorMixin):
                    raise _Uncacheable(f"uninitialised lazy parameter {key}")
                state.append((key, _freeze(item, walk, path + (("attr", key),))))
        else:
            state.append((name, _freeze_plain(value, walk, path + (("attr", name),))))
    return tuple(state)


def _freeze_plain(value: Any, walk: _Walk, path: Path) -> Hashable:
    """`_freeze` of a value in a library module's ``__dict__``, where its containers hold
    settings (PyG's ``powers=[0, 1, 2]``, an empty hook dict): by value, walked on every call."""
    if isinstance(value, list):
        return list, tuple([_freeze_plain(v, walk, path + (("item", i),)) for i, v in enumerate(value)])
    if isinstance(value, dict):
        if not all(isinstance(k, _SCALARS) for k in value):
            raise _Uncacheable("a dict keyed by other than str or numbers")
        return dict, tuple([(k, _freeze_plain(v, walk, path + (("key", k),))) for k, v in value.items()])
    if isinstance(value, (set, frozenset)):
        if not all(isinstance(v, _SCALARS) for v in value):
            raise _Uncacheable("a set of other than str or numbers")
        return frozenset, frozenset(value)
    return _freeze(value, walk, path)


def _from_library(module_name: str | None, more: frozenset[str] = frozenset()) -> bool:
    top = (module_name or "").split(".")[0]
    return top in _LIBRARIES or top in more


def _function_state(fn: types.FunctionType, walk: _Walk, path: Path) -> Hashable:
    """Snapshot of everything ``fn`` reads besides its arguments."""
    if id(fn) in walk.seen:          # recursion: the function is already being snapshotted
        return "recursive"
    walk.seen.add(id(fn))
    if impure_name(fn.__code__):
        raise _Uncacheable(f"{fn.__qualname__} calls {impure_name(fn.__code__)}")
    imported = user_import(fn.__code__, fn.__globals__.get("__name__"))
    if imported:
        raise _Uncacheable(f"{fn.__qualname__} imports {imported}")
    written = outside_writes(fn.__code__)
    if written:
        raise _Uncacheable(f"{fn.__qualname__} writes the {written[0][0]} {written[0][1]!r}")
    # attributes set on the function (``helper.k = 2.0``, the "static variable" idiom)
    # change without changing its identity: snapshotted by value, and walked on every call
    attributes = ()
    if fn.__dict__:
        walk.deep = True
        attributes = tuple([(k, _freeze_plain(v, walk, path + (("attr", k),))) for k, v in fn.__dict__.items()])
    # List comprehensions, and none over an empty sequence: this walk runs on every call
    # of a traced function, and a generator per tuple cost a visible share of a cached call.
    env, closure, positional, keyword = fn.__globals__, fn.__closure__, fn.__defaults__, fn.__kwdefaults__
    globals_ = tuple([_freeze(env[name], walk, path + (("global", name),)) if name in env else _MISSING
                      for name in _global_names(fn.__code__) if name in env or not hasattr(builtins, name)])
    try:
        cells = tuple([_freeze(cell.cell_contents, walk, path + (("cell", k),))
                       for k, cell in enumerate(closure)]) if closure else ()
    except ValueError:
        # an empty cell: a variable of the enclosing function assigned after this one is made
        # (a helper defined later, read on a branch not taken yet). Eager code runs while it
        # is not read; uncacheable until it is filled, as pyg_message_passing's `_filled` does
        raise _Uncacheable(f"{fn.__qualname__} closes over a variable not yet assigned") from None
    defaults = (tuple([_freeze(d, walk, path + (("default", i),)) for i, d in enumerate(positional)])
                if positional else (),
                tuple([(k, _freeze(d, walk, path + (("kwdefault", k),))) for k, d in keyword.items()])
                if keyword else ())
    return fn.__code__, globals_, cells, defaults, attributes


def _guards(functions: tuple[Callable | None, ...]) -> tuple[Hashable, list[tuple[Path, torch.Tensor]]] | None:
    """The guard part of the key for tracing ``functions`` and the tensors met on the
    way, or None when one of them can reach state that cannot be snapshotted (then every
    call traces). Which reached tensors are one object is part of the key: a program
    traced with two names for one tensor feeds it once."""
    walk = _Walk()
    try:
        key = tuple([None if fn is None else _function_state(fn, walk, (("fn", i),))
                     if isinstance(fn, types.FunctionType) else _freeze(fn, walk, (("fn", i),))
                     for i, fn in enumerate(functions)])
    except _Uncacheable:
        return None
    first: dict[int, int] = {}
    aliases = tuple([first.setdefault(id(t), n) for n, (_, t) in enumerate(walk.tensors)]) if walk.tensors else ()
    return (key, aliases), walk.tensors


class GuardMemo:
    """`_guards` of one caller's fixed tuple of functions (a `vertex.VertexFunction`'s, a
    `message.UpdateAll`'s), walked again only when something they read may have changed.

    Where the functions' reads are identities that decide the guard key (`shallow_reads`:
    plain functions reaching only scalars and library objects), `same_reads` of those
    objects means the walk would give the same key, for a few identity comparisons
    instead of the walk on every call (a neighbour sum's walk was a third of its trace
    cache lookup). Functions whose walk meets a tensor, a partial, a module or a helper of
    the user's are walked on every call, as without the memo."""

    __slots__ = ("_functions", "_reads", "_found")

    def __init__(self) -> None:
        self._functions: tuple | None = None
        self._reads: tuple | None = None
        self._found: tuple | None = None

    def __call__(self, functions: tuple[Callable | None, ...]) -> tuple | None:
        reads = self._reads
        if reads is not None and functions is self._functions and same_reads(functions, reads):
            return self._found
        found = _guards(functions)
        # what to compare is worked out from the second call on: an object made for one call
        # (`vertex.compile`'s, a partial's) pays the walk alone, as without the memo
        seen, self._functions, self._found = functions is self._functions, functions, found
        self._reads = shallow_reads(functions) if seen and found is not None and not found[1] else None
        return found


def _wrote_state(functions: tuple[Callable | None, ...], before: Hashable) -> bool:
    """Whether tracing ``functions`` changed what their guard key snapshots: an attribute
    written on a function (``msg.sign = -msg.sign``) or on a module it calls. A program
    cached under the key read before the trace would skip that write on every later hit,
    so a key that cycles (1, -1, 1, ...) served the first value for good where eager code
    alternates. Such code traces on every call, as code writing a global does."""
    after = _guards(functions)
    return after is None or after[0] != before


def _versions(tensors: list[tuple[Path, torch.Tensor]]) -> list[tuple[torch.Tensor, int | torch.Tensor]]:
    """Each tensor the guard walk reached (a global, a closure variable, a module's
    parameter or buffer) with its version counter, which every in-place op bumps -- or,
    for an inference tensor, which has none, a copy of its values -- for `_written`."""
    return [(t, t.clone() if t.is_inference() else t._version) for _, t in tensors]


def _written(versions: list[tuple[torch.Tensor, int | torch.Tensor]]) -> bool:
    """Whether the trace wrote in place a tensor the traced functions reach from outside
    their arguments (``calls.add_(1)``, ``W.mul_(0.5)`` on a global, an ``Embedding``
    with ``max_norm`` renormalising its weight). The trace ran the write once, on the real
    tensor; a cached program skips the code, so the write stopped: a counter read 1 after
    three calls, a decayed weight kept its first value. Such code traces on every call,
    as the PyG front end's does (pyg_message_passing's ``_in_place_writes_checked``)."""
    for t, before in versions:
        if isinstance(before, int):
            if t._version != before:
                return True
        elif changed_values(t, before):
            return True
    return False


def changed_values(tensor: torch.Tensor, copy: torch.Tensor) -> bool:
    """Whether ``tensor`` no longer holds ``copy``'s values (a NaN kept in place is unchanged)."""
    if torch.equal(tensor, copy):
        return False
    return not (tensor.is_floating_point() and bool(torch.isclose(tensor, copy, rtol=0, atol=0, equal_nan=True).all()))


def guard_key(functions: tuple[Callable | None, ...]) -> Hashable | None:
    """The guard part of the key for tracing ``functions`` (see `_guards`), or None."""
    found = _guards(functions)
    return None if found is None else found[0]


def shallow_reads(functions: tuple[Callable | None, ...]) -> tuple | None:
    """What ``functions`` read besides their arguments, by identity, where that decides
    their guard key: each one's code, defaults, closure cells' contents and the value
    (or absence) of each global name its code loads. None unless every one is a plain
    function whose guard walk met no tensor, no ``functools.partial`` and entered no
    other user function: then
    each value it reached is immutable or trusted by identity (a scalar, a library
    function, module or class), so `same_reads` of these objects means an equal guard
    key, for a few identity comparisons instead of the walk.

    A global that was missing (a builtin's name) and is now defined differs; so does a
    rebound global, a new ``__code__`` or ``__defaults__``, a rebound closure variable,
    and a keyword-only default set in place (``__kwdefaults__`` is a dict: its values
    are kept too).
    A changed value inside a tensor, a helper or a partial's keywords would not show
    here, which is why functions reaching one get None and keep the walk."""
    if not all(fn is None or type(fn) is types.FunctionType for fn in functions):
        return None
    walk = _Walk()
    try:
        for i, fn in enumerate(functions):
            if fn is not None:
                _function_state(fn, walk, (("fn", i),))
    except _Uncacheable:
        return None
    if walk.tensors or walk.deep:
        return None
    return tuple([_identity_reads(fn) for fn in functions])


def _identity_reads(fn: types.FunctionType | None) -> tuple:
    if fn is None:
        return ()
    env, cells, names, keyword = fn.__globals__, fn.__closure__, _global_names(fn.__code__), fn.__kwdefaults__
    return (fn.__code__, fn.__defaults__, keyword, tuple(keyword.items()) if keyword else (),
            tuple([cell.cell_contents for cell in cells]) if cells else (),
            names, tuple([env.get(name, _MISSING) for name in names]))


def same_reads(functions: tuple[Callable | None, ...], reads: tuple) -> bool:
    """Whether every object in ``reads`` (`shallow_reads` of ``functions``) is still the
    one ``functions`` read. Plain loops, not list comprehensions (each a Python frame in
    3.11): a repeated call checks this first, and for one global name the loop took
    0.22 us on the 2-core CI machine against the comprehension's 0.38."""
    for fn, before in zip(functions, reads):
        if fn is None:
            continue
        code, defaults, kwdefaults, keywords, cells, names, values = before
        if fn.__code__ is not code or fn.__defaults__ is not defaults or fn.__kwdefaults__ is not kwdefaults:
            return False
        if fn.__dict__:     # an attribute set since (one there before kept the walk: `shallow_reads`)
            return False
        if keywords:        # a dict, which ``fn.__kwdefaults__["k"] = 3.0`` changes in place
            if len(kwdefaults) != len(keywords):
                return False
            for name, was in keywords:
                if kwdefaults.get(name, _MISSING) is not was:
                    return False
        closure = fn.__closure__
        if closure:
            try:
                for cell, was in zip(closure, cells):
                    if cell.cell_contents is not was:
                        return False
            except ValueError:      # a closure variable deleted since
                return False
        env = fn.__globals__
        for name, was in zip(names, values):
            if env.get(name, _MISSING) is not was:
                return False
    return True


def _fetch(functions: tuple[Callable | None, ...], path: Path) -> Any:
    """The value at ``path`` now (see `Path`)."""
    obj: Any = functions
    for step, *arg in path:
        if step in ("fn", "item", "arg", "default"):
            obj = (obj.args if step == "arg" else obj.__defaults__ if step == "default" else obj)[arg[0]]
        elif step == "cell":
            obj = obj.__closure__[arg[0]].cell_contents
        elif step == "global":
            obj = obj.__globals__[arg[0]]
        elif step == "kwdefault":
            obj = obj.__kwdefaults__[arg[0]]
        elif step == "keyword":
            obj = obj.keywords[arg[0]]
        elif step == "attr":
            obj = getattr(obj, arg[0])
        elif step == "key":
            obj = obj[arg[0]]
        else:       # "func"
            obj = obj.func
    return obj


# Functions that hand a tensor's values to Python, where a trace would bake them in:
# directly (a number, a bool, a list), or as a shape that depends on them (the rows
# ``nonzero`` or a boolean mask picks), which a later ``len()`` or loop reads.
_VALUE_READS = frozenset(getattr(owner, name) for owner, names in (
    (torch.Tensor, ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__complex__",
                    "__array__", "__format__", "__repr__", "__str__", "__contains__", "equal", "allclose",
                    "is_nonzero", "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select",
                    "bincount", "repeat_interleave", "nonzero_static")),
    (torch, ("equal", "allclose", "is_nonzero", "nonzero", "argwhere", "unique", "unique_consecutive",
             "masked_select", "bincount", "repeat_interleave"))) for name in names if hasattr(owner, name))
_GETITEM = torch.Tensor.__getitem__
_WHERE = torch.where


class _ValueReads(torch.overrides.TorchFunctionMode):
    """Notes whether code run under it read a real tensor's values in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if args and isinstance(args[0], torch.Tensor) and (
                func in _VALUE_READS or (func is _GETITEM and len(args) > 1 and _masks(args[1]))
                or (func is _WHERE and len(args) == 1 and not kwargs)):     # where(cond): nonzero's rows
            self.seen = True
        return func(*args, **(kwargs or {}))


def _masks(index: Any) -> bool:
    """Whether a ``t[index]`` picks rows by a boolean mask (a value-dependent shape)."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype in (torch.bool, torch.uint8) for p in parts)


def signature(tables: tuple[Mapping[str, torch.Tensor], ...]) -> Hashable:
    """The argument part of the key: the default dtype, the torch.autocast state of the
    tables' device (its casts are traced: a trace made outside autocast served a call
    inside it), and the keys, dtypes and per-row shapes of every tensor passed. The row
    count (dim 0: vertices, edges or types) is left out: the tracer sees it only as a
    symbolic `RowCount`, so a trace never depends on it, and the batches of a sampled
    mini-batch run (a different vertex count each) reuse one trace."""
    # loops, not comprehensions (each a Python call in 3.11): every cached call asks, and
    # test_host_path counts calls; tuples grown by ``+=`` and ``ndim`` (an attribute) rather
    # than ``append`` and ``dim()``, a C call each per tensor and table
    autocast = first = None     # the first tensor, whose device's autocast state is read
    parts: tuple = ()
    for table in tables:
        if not table:
            parts += ((),)
            continue
        entries: tuple = ()
        for key, t in table.items():
            entries += ((key, t.ndim, tuple(t.shape[1:]), t.dtype),)
            if first is None:
                first = t
        parts += (entries,)
    if first is not None:
        kind = first.device.type
        if kind == "meta":      # stand-ins under torch.compile: the state they stand in for
            autocast = autocast_state(kind)
        elif kind in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(kind):
            autocast = kind, torch.get_autocast_dtype(kind)
    return torch.get_default_dtype(), autocast, parts


def _warn_retraces(functions: tuple[Callable | None, ...]) -> None:
    """Say, once per function, that it was traced `RETRACE_WARNING` times. Why:
    a Python number the trace reads (an annealed temperature in a closure, ``self.temp``
    read in ``message``) is a constant of the program, so a value changing every step
    traces and plans a program every step, silently: milliseconds of host work a step,
    and programs kept (the kernels read such a number as an argument and are shared,
    backend/constant_args.py; they were compiled anew for every value before)."""
    names = ", ".join(f.__qualname__ for f in functions if callable(f) and hasattr(f, "__qualname__")) or "a function"
    warn(f"gnnfuse has traced {names} {RETRACE_WARNING} times: a value the trace reads keeps changing "
         "between calls (a Python number in a closure, a global or an attribute, such as a temperature "
         "changed every step; or new feature shapes or dtypes). Every trace compiles and keeps a program. "
         "Hold a number that changes in a tensor (torch.tensor(t)), which is fed to the same program.",
         UserWarning)


class TraceCache:
    """Compiled programs by (guard key, argument signature), for traces that captured no
    tensors. A lookup costs a walk over the functions' globals and closure cells."""

    def __init__(self) -> None:
        # key -> (program, [(parameter name, path of the tensor fed to it)])
        self._entries: dict[Hashable, tuple[CompiledProgram, list[tuple[str, Path]]]] = {}
        # key -> the error its trace raised, raised again (`_remember_failure`)
        self._failures: dict[Hashable, Exception] = {}
        # counts the clears: a `repeat_call.RepeatCall` made before one is not reused after it
        self.generation = 0
        # per function (its code), the traces kept so far (`RETRACE_WARNING`)
        self._kept: dict[tuple, int] = {}
        # set by a trace that wrote state its key does not see (a tensor written in place,
        # `pyg_message_passing`): such a trace is not kept, so the code traces on every call
        # and the write recurs once per call, as in eager code
        self.side_effects = False
        _ALL.add(self)

    def compiled(self, functions: tuple[Callable | None, ...], tables: tuple[Mapping[str, torch.Tensor], ...],
                 trace: Callable[[], Tracer], guards: GuardMemo | None = None
                 ) -> tuple[CompiledProgram, dict[str, torch.Tensor]]:
        """The compiled program for ``functions`` called on ``tables``, and the tensors
        its trace captured (program inputs beside the tables); ``trace`` runs only when
        no reusable trace is cached. ``guards``: the caller's memo of the guard walk of
        these very functions (`GuardMemo`), else the walk runs."""
        found = _guards(functions) if guards is None else guards(functions)
        # with the gradient mode: code may branch on ``torch.is_grad_enabled()``, and a trace
        # from a training call served under ``torch.no_grad()`` ran the other branch
        key = None if found is None else (found[0], signature(tables), torch.is_grad_enabled())
        entry = self._entries.get(key)      # one hash of the nested key, not two
        if entry is not None:
            compiled, params = entry
            return compiled, {name: _fetch(functions, path) for name, path in params} if params else {}
        failed = self._failures.get(key)
        if failed is not None:
            raise copy.copy(failed)
        # the generators' states only where the trace may be kept: a function that cannot be
        # cached (key None) traces on every call, and reading them would be its cost alone
        reads, draws = _ValueReads(), None if key is None else RandomDraws()
        versions = None if key is None else _versions(found[1])
        kept = KeptTraced(functions)    # what the trace may leave a traced value in
        outer, self.side_effects = self.side_effects, False
        try:
            with reads, draws or contextlib.nullcontext():
                tracer = trace()
            kept.check()
        except Exception as exc:
            # not while dynamo traces this code (whose symbolic values fail the tracer in ways
            # of their own): the failure then answered every later eager call of the function
            if (key is not None and not (found[1] and reads.seen) and not draws.drew
                    and not torch.compiler.is_compiling()):
                self._remember_failure(key, exc)
            raise
        finally:
            wrote, self.side_effects = self.side_effects, outer
        if wrote:
            key = None
        if key is not None and draws.drew:   # a draw `_IMPURE` does not name (rsample, bernoulli_)
            key = None
        if key is not None and _wrote_state(functions, found[0]):
            key = None
        if key is not None and _written(versions):      # ``counter.add_(1)`` on a global: once per call
            key = None
        with outside_autocast(tracer.autocast):     # the passes' torch ops compute in the program's dtypes
            compiled = compiled_for(tracer.program)
        captured = dict(tracer.captured.values())
        if key is not None and not (found[1] and reads.seen):      # a value read: traced every call
            where = {id(t): path for path, t in reversed(found[1])}     # the first place each was met
            params = [(name, where.get(id(t))) for name, t in captured.items()]
            if all(path is not None for _, path in params):
                if len(self._entries) >= _LIMIT:
                    del self._entries[next(iter(self._entries))]
                self._entries[key] = (compiled, params)
                self._count_trace(functions)
        return compiled, captured

    def _count_trace(self, functions: tuple[Callable | None, ...]) -> None:
        """Count a kept trace of ``functions`` (by their code: a lambda made anew each call
        counts as one), warning at the `RETRACE_WARNING`-th (`_warn_retraces`)."""
        code = tuple(f.__code__ for f in functions if hasattr(f, "__code__"))
        count = self._kept.pop(code, 0) + 1
        if len(self._kept) >= _LIMIT:
            del self._kept[next(iter(self._kept))]
        self._kept[code] = count
        if count == RETRACE_WARNING:
            _warn_retraces(functions)

    def _remember_failure(self, key: Hashable, exc: Exception) -> None:
        """Keep a copy of the error a trace raised (without its traceback, whose frames hold
        the call's tensors) for the next call of this key: it would trace the same way and
        fail the same way. PyG's layers that run eagerly (DNAConv's transpose) traced
        ``message`` afresh on every call only to fall back again. Not for running out of
        memory or stack, which depend on more than the key."""
        if isinstance(exc, (MemoryError, RecursionError)):
            return
        try:
            kept = copy.copy(exc)
        except Exception:       # an exception class copy cannot rebuild: traced again next time
            return
        if len(self._failures) >= _LIMIT:
            del self._failures[next(iter(self._failures))]
        self._failures[key] = kept

    def holds(self, guard: Hashable, tables: tuple[Mapping[str, torch.Tensor], ...],
              compiled: CompiledProgram) -> bool:
        """Whether a call on ``tables`` of functions with guard key ``guard`` (`guard_key`)
        finds ``compiled`` here, so the next such call would run it untraced. Asked of
        the call's own key, not of the program: programs are shared by structure
        (`compiled_for`), and one traced after a value read (kept by no entry) is also
        the program of every function that computes the same with a constant -- marking
        the program kept those functions from their repeats (`repeat_call`) for good."""
        entry = self._entries.get((guard, signature(tables), torch.is_grad_enabled()))
        return entry is not None and entry[0] is compiled


_ALL: "weakref.WeakSet[TraceCache]" = weakref.WeakSet()


def clear_trace_caches() -> None:
    """Forget every cached trace, so the next call of each function traces (and asks
    `compiled_for`) again: for tests that inspect freshly compiled programs, since a
    trace is reused across graphs of any size."""
    for cache in list(_ALL):
        cache._entries.clear()
        cache._failures.clear()
        cache.generation += 1


def plain_table(table: Any) -> bool:
    """Whether ``table`` is a dict of tensors by str names, the usual call's, which then
    passes `check_tables` without its walk over every table (a layer call's callers ask:
    `vertex.VertexFunction._run`, `message._run`). A loop, not a comprehension (a Python
    call in 3.11), and a plain tensor without an isinstance call."""
    if type(table) is not dict:
        return False
    for key, tensor in table.items():
        if type(key) is not str or (type(tensor) is not torch.Tensor and not isinstance(tensor, torch.Tensor)):
            return False
    return True


def check_tables(**tables: Mapping[str, torch.Tensor] | None) -> None:
    """Each feature argument (``ndata=``, ``v_feature=``, ...) is a dict of name -> tensor;
    anything else would fail deep inside tracing with an unrelated message."""
    for argument, table in tables.items():
        if table is None:
            continue
        if type(table) is not dict and not isinstance(table, Mapping):   # the ABC check is slow: dicts skip it
            raise TypeError(f"{argument} must be a dict of feature name -> tensor (e.g. {argument}={{'h': x}}), "
                            f"got {type(table).__name__}")
        for key, tensor in table.items():
            if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{argument} must map str names to tensors; {argument}[{key!r}] is "
                                f"{type(tensor).__name__}")


def program_feeds(tables: tuple[Mapping[str, torch.Tensor], ...],
                  captured: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A traced program's inputs by name: node tensors as given, edge and per-type
    tensors under the prefixes the tracers give them, then the captured parameters.
    A call passing node tensors only (the usual one) gets its node table itself: the
    programs read their feeds, never change them."""
    if not captured and not any(tables[1:]):
        return tables[0]
    feeds = dict(tables[0])
    for prefix, table in zip(_PREFIXES[1:], tables[1:]):
        for key, t in table.items():
            feeds[prefix + key] = t
    if captured:
        feeds.update(captured)
    return feeds


_PREFIXES = ("", "e.", "etype.", "ntype.")   # node, edge, edge-type, node-type tables
