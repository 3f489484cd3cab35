"""Traced values a user function stores where they outlive its trace.

A traced function runs once, on gnnfuse's symbolic `SymTensor` rows. Code that keeps one
of them -- ``KEPT.append(x)`` into a list it reaches, ``LOG["m"] = m``, ``global LAST;
LAST = x``, ``nonlocal`` -- left that symbolic value behind where eager code keeps a
tensor: the list held a ``SymTensor``, and using it later failed with an error about
the traced line, or computed another symbolic value, silently. `KeptTraced` watches what
the traced functions reach by name (their globals and closure variables, and those of
the user's functions they name) and refuses such a store, naming the variable and its
line, after putting the container or variable back as it was.
"""
from __future__ import annotations

import dis
import functools
import linecache
import types
from typing import Any, Callable

import torch

from ..ir import CompileError
from .tracer import SymTensor

_ABSENT = object()
# whose functions keep nothing of a caller's: not walked
_LIBRARIES = ("torch", "torch_geometric", "gnnfuse", "numpy", "functools")


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


def same_contents(now: list | None, before: list) -> bool:
    return now is not None and len(now) == len(before) and all(a is b for a, b in zip(now, before))


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


def _plain(fn: Callable | None) -> types.FunctionType | None:
    """The Python function whose code a call of ``fn`` runs (a partial's, a method's, an
    ``nn.Module``'s ``forward``, a callable object's ``__call__``)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    elif isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    elif fn is not None and not isinstance(fn, types.FunctionType):
        fn = getattr(type(fn), "__call__", None)
    return fn if isinstance(fn, types.FunctionType) else None


class KeptTraced:
    """What ``functions`` reach by name, snapshotted before a trace; `check` after it."""

    def __init__(self, functions: tuple[Callable | None, ...]):
        # (function, ("global" | "cell", name), the value bound there, its contents)
        self._watched: list[tuple[types.FunctionType, tuple[str, str], Any, list | None]] = []
        seen: set[int] = set()
        for fn in functions:
            self._watch(_plain(fn), seen)

    def _watch(self, fn: types.FunctionType | None, seen: set[int]) -> None:
        if fn is None or id(fn) in seen or (fn.__module__ or "").split(".")[0] in _LIBRARIES:
            return
        seen.add(id(fn))
        for where in _outside_names(fn.__code__):
            value = _bound(fn, where)
            self._watched.append((fn, where, value, contents(value)))
            self._watch(value if isinstance(value, types.FunctionType) else None, seen)

    def check(self) -> None:
        """Raise a `CompileError` at the first variable or container the trace left a
        traced value in; every one is put back as it was first."""
        leaked = []
        for fn, where, before, kept in self._watched:
            now = _bound(fn, where)
            if now is not before and holds_traced(now):
                leaked.append((fn, where, "sets"))
                _rebind(fn, where, before)
            elif kept is not None and not same_contents(contents(now), kept) and holds_traced(now):
                leaked.append((fn, where, "stores a traced value in"))
                restore(now, kept)
        if leaked:
            fn, (kind, name), verb = leaked[0]
            line = _outside_names(fn.__code__)[(kind, name)]
            what = "the global" if kind == "global" else "the closure variable"
            verb = f"{verb} {what} {name!r}" + (" to a traced value" if verb == "sets" else "")
            raise CompileError(
                f"{fn.__qualname__} {verb}, which outlives the trace: the function runs once, on symbolic "
                "values, so it would keep gnnfuse's SymTensor there, not a tensor, and not follow later calls; "
                "return the value as an output instead",
                f"{fn.__code__.co_filename}:{line}: {linecache.getline(fn.__code__.co_filename, line).strip()}")


def _bound(fn: types.FunctionType, where: tuple[str, str]) -> Any:
    kind, name = where
    if kind == "global":
        return fn.__globals__.get(name, _ABSENT)
    cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
    try:
        return cell.cell_contents
    except ValueError:      # not yet assigned
        return _ABSENT


def _rebind(fn: types.FunctionType, where: tuple[str, str], value: Any) -> None:
    kind, name = where
    if kind == "cell":
        cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
        if value is _ABSENT:
            del cell.cell_contents
        else:
            cell.cell_contents = value
    elif value is _ABSENT:
        fn.__globals__.pop(name, None)
    else:
        fn.__globals__[name] = value
