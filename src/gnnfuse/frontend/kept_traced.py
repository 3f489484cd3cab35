"""Traced values a user function stores where they outlive its trace.

A traced function runs once, on gnnfuse's symbolic `SymTensor` rows. Code that keeps one
of them -- ``KEPT.append(x)`` into a list it reaches, ``LOG["m"] = m``, ``global LAST;
LAST = x``, ``nonlocal``, ``self.last = x`` in a method or module -- left that symbolic
value behind where eager code keeps a tensor: the list held a ``SymTensor``, and using
it later failed with an error about the traced line, or computed another symbolic value,
silently. `KeptTraced` watches what the traced functions reach by name (their globals
and closure variables, and those of the user's functions they name), their ``self`` and
a partial's bound arguments, and refuses such a store, naming the variable and its line,
after putting the container or variable back as it was.
"""
from __future__ import annotations

import dis
import functools
import linecache
import operator
import types
from typing import Any, Callable

import torch

from ..ir import CompileError
from .tracer import SymTensor

_ABSENT = object()
# whose functions keep nothing of a caller's: not walked
_LIBRARIES = ("torch", "torch_geometric", "gnnfuse", "numpy", "functools", "math", "operator", "builtins")


def from_library(module_name: str | None) -> bool:
    """Whether code of the module ``module_name`` is a library's, which keeps nothing of
    a caller's traced values (its namespace is not watched)."""
    return (module_name or "").split(".")[0] in _LIBRARIES


def holds_traced(value: Any) -> bool:
    """Whether ``value`` is a traced value or holds one (`contents`)."""
    return isinstance(value, SymTensor) or any(isinstance(item, SymTensor) for item in contents(value) or ())


def contents(value: Any) -> list | None:
    """What writing into ``value`` changes, to compare by identity (`same_contents`): a
    list's items, a set's, a dict's keys and values, a plain object's attribute names and
    values; None for anything else (a number, a tensor, a function: nothing traced code
    can write into)."""
    if isinstance(value, (list, set)):
        return list(value)
    if isinstance(value, dict):
        return [item for pair in value.items() for item in pair]
    if isinstance(getattr(value, "__dict__", None), dict) and not isinstance(
            value, (type, types.ModuleType, types.FunctionType, types.MethodType, torch.Tensor, torch.nn.Module)):
        return [item for pair in vars(value).items() for item in pair]
    return None


def containers_within(roots: list[tuple[Any, Any]], depth: int = 3) -> list[tuple[Any, Any, list, bool]]:
    """(label, container, its `contents` now, whether it is nested) for each container
    among ``roots``' (label, value) pairs and those nested in them, ``depth`` levels down,
    each once by identity, labelled by the root it was reached from: ``LOG["m"].append(x)``
    writes into a dict's list and leaves the dict's own contents as they were."""
    found: dict[int, tuple[Any, Any, list, bool]] = {}
    level = [(label, value, False) for label, value in roots]
    for _ in range(depth + 1):
        nested = []
        for label, value, inner in level:
            kept = contents(value)
            if kept is not None and id(value) not in found:
                found[id(value)] = (label, value, kept, inner)
                nested += [(label, item, True) for item in kept]
        level = nested
    return list(found.values())


def same_contents(now: list | None, before: list) -> bool:
    # map over operator.is_ runs in C: this compares every list a traced function reaches, each trace
    return now is not None and len(now) == len(before) and all(map(operator.is_, now, before))


def restore(value: Any, kept: list) -> None:
    """Put ``kept`` (from `contents`) back into ``value``."""
    if isinstance(value, list):
        value[:] = kept
    elif isinstance(value, set):
        value.clear()
        value.update(kept)
    else:
        table = value if isinstance(value, dict) else vars(value)
        table.clear()
        table.update(zip(kept[::2], kept[1::2]))


@functools.lru_cache(maxsize=1024)
def _outside_names(code: types.CodeType) -> dict[tuple[str, str], int]:
    """Each global (``("global", name)``) and closure variable (``("cell", name)``) that
    ``code`` or code nested in it reads or writes, with the line of its first use."""
    found: dict[tuple[str, str], int] = {}
    line = code.co_firstlineno
    for ins in dis.get_instructions(code):
        line = ins.positions.lineno if ins.positions and ins.positions.lineno else line
        if ins.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"):
            found.setdefault(("global", ins.argval), line)
        elif ins.opname in ("LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF") and ins.argval in code.co_freevars:
            found.setdefault(("cell", ins.argval), line)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            for key, at in _outside_names(const).items():
                if key[0] == "global" or key[1] in code.co_freevars:
                    found.setdefault(key, at)
    return found


def _plain(fn: Callable | None) -> tuple[types.FunctionType | None, Any, tuple]:
    """The Python function whose code a call of ``fn`` runs (a partial's, a method's, an
    ``nn.Module``'s ``forward``, a callable object's ``__call__``), the object it runs on
    (its ``self``) or None, and the (position or keyword, value) pairs a partial binds."""
    bound: tuple = ()
    while isinstance(fn, functools.partial):
        bound += (*enumerate(fn.args), *fn.keywords.items())
        fn = fn.func
    holder = None
    if isinstance(fn, types.MethodType):
        fn, holder = fn.__func__, fn.__self__
    elif fn is not None and not isinstance(fn, types.FunctionType):
        holder = fn
        fn = type(fn).forward if isinstance(fn, torch.nn.Module) else getattr(type(fn), "__call__", None)
    return (fn if isinstance(fn, types.FunctionType) else None), holder, bound


class KeptTraced:
    """What ``functions`` reach by name or through their ``self``, snapshotted before a
    trace; `check` after it."""

    def __init__(self, functions: tuple[Callable | None, ...]):
        # (function, (kind, name, holder), the value bound there, its contents); kind is
        # "global", "cell", "attr" (of holder, the function's self) or "bound" (a partial's)
        self._watched: list[tuple[types.FunctionType, tuple[str, str, Any], Any, list | None]] = []
        self._labels: dict[int, str] = {}     # id(holder) -> how the function names it
        seen: set[int] = set()
        for function in functions:
            fn, holder, bound = _plain(function)
            if fn is None:
                continue
            for name, value in bound:
                self._watched.append((fn, ("bound", name, value), value, contents(value)))
            self._watch_attributes(fn, holder, "self")
            self._watch_hooks(holder, seen)
            self._watch(fn, seen)
        self._watch_nested()

    def _watch_nested(self) -> None:
        """The containers inside the watched ones (`containers_within`): a forward hook
        recording into a dict of lists (``ACTS["lin"].append(out)``) kept gnnfuse's
        SymTensor there."""
        roots = [((fn, where), value) for fn, where, value, kept in self._watched if kept is not None]
        for (fn, where), item, kept, nested in containers_within(roots):
            if nested:
                self._watched.append((fn, ("item", where, item), item, kept))

    def _watch_attributes(self, fn: types.FunctionType, holder: Any, label: str) -> None:
        """The attributes of ``holder``, ``fn``'s self or an ``nn.Module`` it names (whose
        attributes `contents` leaves out), and which of them there are."""
        if isinstance(getattr(holder, "__dict__", None), dict):
            self._labels[id(holder)] = label
            for name, value in vars(holder).items():
                self._watched.append((fn, ("attr", name, holder), value, contents(value)))
            self._watched.append((fn, ("attr", None, holder), set(vars(holder)), None))

    def _watch(self, fn: types.FunctionType | None, seen: set[int]) -> None:
        if fn is None or id(fn) in seen or from_library(fn.__module__):
            return
        seen.add(id(fn))
        for kind, name in _outside_names(fn.__code__):
            value = _bound(fn, (kind, name, None))
            self._watched.append((fn, (kind, name, None), value, contents(value)))
            if isinstance(value, torch.nn.Module):
                self._watch_attributes(fn, value, name)
            self._watch_hooks(value, seen)
            self._watch(value if isinstance(value, types.FunctionType) else None, seen)

    def _watch_hooks(self, module: Any, seen: set[int]) -> None:
        """The forward (pre-)hooks of ``module`` and its submodules: a call of the module
        runs them on the traced values, so a hook recording what it is given
        (``acts.append(out)``) kept gnnfuse's SymTensor in the user's list, each trace."""
        if isinstance(module, torch.nn.Module):
            for sub in module.modules():
                for hook in (*sub._forward_pre_hooks.values(), *sub._forward_hooks.values()):
                    self._watch(_plain(hook)[0], seen)

    def check(self) -> None:
        """Raise a `CompileError` at the first variable or container the trace left a
        traced value in; every one is put back as it was first."""
        leaked = []
        for fn, where, before, kept in self._watched:
            if where[0] == "attr" and where[1] is None:     # attributes the trace added
                leaked += [(fn, ("attr", name, where[2]), "sets") for name in _added_traced(where[2], before)]
                continue
            now = _bound(fn, where)
            if where[0] != "bound" and now is not before and holds_traced(now):
                leaked.append((fn, where, "sets"))
                _rebind(fn, where, before)
            elif kept is not None and not same_contents(contents(now), kept) and holds_traced(now):
                leaked.append((fn, where, "stores a traced value in"))
                restore(now, kept)
        if leaked:
            fn, where, verb = leaked[0]
            verb = f"{verb} {_named(where, self._labels)}" + (" to a traced value" if verb == "sets" else "")
            line = _line(fn, where)
            raise CompileError(
                f"{fn.__qualname__} {verb}, which outlives the trace: the function runs once, on symbolic "
                "values, so it would keep gnnfuse's SymTensor there, not a tensor, and not follow later calls; "
                "return the value as an output instead",
                f"{fn.__code__.co_filename}:{line}: {linecache.getline(fn.__code__.co_filename, line).strip()}")


def _added_traced(holder: Any, names: set[str]) -> list[str]:
    """The attributes of ``holder`` not among ``names`` that hold a traced value, removed."""
    added = [name for name, value in vars(holder).items() if name not in names and holds_traced(value)]
    for name in added:
        del vars(holder)[name]
    return added


def _named(where: tuple[str, str | None, Any], labels: dict[int, str]) -> str:
    kind, name, holder = where
    if kind == "item":
        return f"a container inside {_named(name, labels)}"
    return {"global": f"the global {name!r}", "cell": f"the closure variable {name!r}",
            "bound": f"the functools.partial's argument {name!r}",
            "attr": f"{labels.get(id(holder))}.{name}"}[kind]


def _line(fn: types.FunctionType, where: tuple[str, str | None, Any]) -> int:
    """The line of ``where``'s first use in ``fn``: of the name, or of the attribute."""
    kind, name, _ = where
    if kind == "item":
        return _line(fn, name)
    if kind in ("global", "cell"):
        return _outside_names(fn.__code__)[(kind, name)]
    return _attribute_lines(fn.__code__).get(name, fn.__code__.co_firstlineno)


@functools.lru_cache(maxsize=1024)
def _attribute_lines(code: types.CodeType) -> dict[str, int]:
    """Each attribute name ``code`` reads or writes, with the line of its first use."""
    found: dict[str, int] = {}
    line = code.co_firstlineno
    for ins in dis.get_instructions(code):
        line = ins.positions.lineno if ins.positions and ins.positions.lineno else line
        if ins.opname in ("LOAD_ATTR", "STORE_ATTR", "LOAD_METHOD", "DELETE_ATTR"):
            found.setdefault(ins.argval, line)
    return found


def _bound(fn: types.FunctionType, where: tuple[str, str | None, Any]) -> Any:
    kind, name, holder = where
    if kind == "item":       # a container inside a watched one, held by identity
        return holder
    if kind == "attr":
        return vars(holder).get(name, _ABSENT)
    if kind == "global":
        return fn.__globals__.get(name, _ABSENT)
    if kind == "bound":
        return holder
    cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
    try:
        return cell.cell_contents
    except ValueError:      # not yet assigned
        return _ABSENT


def _rebind(fn: types.FunctionType, where: tuple[str, str | None, Any], value: Any) -> None:
    kind, name, holder = where
    if kind == "cell":
        cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
        if value is _ABSENT:
            del cell.cell_contents
        else:
            cell.cell_contents = value
        return
    table = vars(holder) if kind == "attr" else fn.__globals__
    if value is _ABSENT:
        table.pop(name, None)
    else:
        table[name] = value
