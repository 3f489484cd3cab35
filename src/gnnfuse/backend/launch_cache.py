"""Launch plans of fused units, worked out once per (unit, graph, settings).

Running a fused unit means choosing its schedule (a forced or tuned one, else the cost
rule), its kernel, block sizes, threads and grid, and fetching the graph's index arrays
-- all functions of the unit, the graph and a few settings, none of the call's tensor
values. On a small graph that choosing cost several times the kernel (about 25 us of
Python per unit against 1 us of kernel on the CPU backend), so each backend keeps what
it chose per (unit, graph) in a `LaunchCache`, with the settings it chose under: a
later call reuses the plan only when its settings compare equal, so a changed
environment variable, forced schedule, tuned-schedule file, thread count or input
dtype plans afresh. Graphs are immutable, and both keys are held weakly, so a plan
dies with its unit's program or its graph (a mini-batch block's plans go with it).

Settings read from the environment are read once per program run, not once per unit
(`CallSettings`), since each read costs about as much as the rest of a cached lookup.
"""
from __future__ import annotations

import weakref
from contextvars import ContextVar
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")


class LaunchCache:
    """Plans by (unit, graph), each valid for the settings it was made under."""

    def __init__(self) -> None:
        self._plans: "weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary]" = weakref.WeakKeyDictionary()

    def get(self, unit: Any, graph: Any, settings: Hashable, plan: Callable[[], T]) -> T:
        """The plan for ``unit`` on ``graph`` under ``settings``; ``plan()`` makes it when
        none is stored or the stored one was made under other settings."""
        per_graph = self._plans.get(unit)
        if per_graph is None:
            per_graph = self._plans[unit] = weakref.WeakKeyDictionary()
        entry = per_graph.get(graph)
        if entry is None or entry[0] != settings:
            entry = per_graph[graph] = (settings, plan())
        return entry[1]

    def peek(self, unit: Any, graph: Any, settings: Hashable) -> Any:
        """The plan for ``unit`` on ``graph`` if one was made under ``settings``, else None."""
        per_graph = self._plans.get(unit)
        entry = None if per_graph is None else per_graph.get(graph)
        return entry[1] if entry is not None and entry[0] == settings else None


class CallSettings:
    """Settings read by ``read()`` (environment variables, the tuned-schedule table),
    read once per program run: inside `run` every `current` call returns the values
    read at its start; outside one (a unit run directly, as the tuner does) each reads
    afresh. A context variable, so threads and nested runs each see their own."""

    def __init__(self, name: str, read: Callable[[], Hashable]) -> None:
        self._read = read
        self._current: ContextVar[Hashable | None] = ContextVar(name, default=None)

    def current(self) -> Hashable:
        found = self._current.get()
        return self._read() if found is None else found

    def enclosing(self) -> Hashable | None:
        """The settings of the `run` the caller is inside, or None outside one (where
        `current` reads afresh)."""
        return self._current.get()

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        return self.run_with(self._read(), fn, *args)

    def run_with(self, settings: Hashable, fn: Callable[..., T], *args: Any) -> T:
        """`run` with ``settings`` already read (by the caller, who compared them)."""
        token = self._current.set(settings)
        try:
            return fn(*args)
        finally:
            self._current.reset(token)
