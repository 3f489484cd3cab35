"""A compiled function called again the way it was just called: one check, then its run.

Used by vertex functions (`vertex.VertexFunction`) and bound message/reduce functions
(`message.UpdateAll`), objects that live across calls. A cached call coerces the graph,
checks that each feature table is a dict of str to tensors, walks the function's
guarded state and builds and hashes the trace cache's key (`trace_cache`), and only
then reaches the compiled program, whose `PreparedCall` checks every input against the
graph and whose backend's prepared run checks shapes and settings. On an arxiv-sized
neighbour sum (a 10-70 us kernel) that front-end work was a third of the Python before
the launch, and the launched call lost to ``torch.sparse.mm`` on Python alone
(benchmarks/results/launch_floor.md).

`RepeatCall` remembers, after a call on a graph where the compiled program keeps a
prepared call, the shapes of the node table's tensors (one per key, all of them inputs of
the program), the default dtype, the gradient mode, the guard key and the trace cache's
generation. A later call with only a node table (a dict of as many tensors of those shapes),
under the same default dtype, gradient mode and trace-cache generation, and whose guard key
is still the same, is handed straight to the program's prepared call. The guard key is
re-checked by the identities of what the functions read (`trace_cache.shallow_reads`)
where those decide it, else by the walk.
The prepared call's checks (the graph object it was kept for, each input a tensor of
the dtype, device, layout and shape it ran with, not needing a gradient while
gradients are on, no `record_calls` block, the backend's variables and settings) make
the call's trace-cache key the one that found this program, so it computes what the
full path would. Anything else -- another graph, more tables, a rebound global, a
captured tensor, the prepared call declining -- takes the full path, which reports any
error.

One function object often serves several calls in turn: a two-layer model's layers call
the same aggregation at two widths, and GAT's layers one attention `UpdateAll`. Keeping
only the last call, each call found the other's repeat, checked its guard, took the full
path and built a new one: a two-layer GAT inference call entered 340 gnnfuse functions,
174 with a repeat per width. So each function object keeps its last few repeats
(`RepeatCalls`), told apart by their tables' shapes: a call checks the guard of the one
repeat whose shapes it has, if any, and the prepared call checks the rest as before.
"""
from __future__ import annotations

import operator
from typing import Callable, Mapping

import torch

from ..graph import Graph
from ..runtime import CompiledProgram
from ..runtime.prepared_call import PreparedCall
from .trace_cache import TraceCache, guard_key, same_reads, shallow_reads


class RepeatCall:
    """A repeat of a call of ``functions`` that a prepared call ran (see the module docstring)."""

    def __init__(self, cache: TraceCache, functions: tuple[Callable | None, ...], guard: object,
                 compiled: CompiledProgram, shapes: tuple, keys: tuple[str, ...]) -> None:
        self._cache, self._generation = cache, cache.generation
        # of the table's tensors, one per key (the program's inputs, which its prepared call
        # checks): which of a function's repeats a call may be, `RepeatCalls` compares them
        self.shapes = shapes
        self.keys = keys        # the table's, in its order: a call of one tensor is taken by name too
        self._functions, self._guard = functions, guard
        # the walk's inputs by identity, where comparing them decides the guard key
        self._reads = shallow_reads(functions)
        self._dtype = torch.get_default_dtype()
        # part of the trace cache's key: code may branch on ``torch.is_grad_enabled()``, and a
        # repeat kept under ``torch.no_grad()`` served a call with gradients on (3x for 2x)
        self._grad = torch.is_grad_enabled()
        self._compiled = compiled

    @classmethod
    def after(cls, cache: TraceCache, functions: tuple[Callable | None, ...], graph: Graph,
              table: Mapping[str, torch.Tensor], compiled: CompiledProgram,
              captured: Mapping[str, torch.Tensor]) -> "RepeatCall | None":
        """A `RepeatCall` for the call just made on ``graph`` with node table ``table``, or
        None where a repeat could not skip the front end safely: the program has no
        prepared call (it ran with gradients, or once only, or on another backend), its
        trace captured tensors (fetched afresh on every call), the table holds keys the
        program does not read (the full path type-checks them), or the trace cache would
        not hand this program to the next such call: the functions reach state it cannot
        guard, or their trace read a tensor's value (``.item()``, ``if t:``), so it
        traces them every call."""
        prepared = compiled.prepared
        if captured or prepared is None or prepared.graph is not graph or type(table) is not dict:
            return None
        if wants_gradient(table):     # its prepared call would decline every such call
            return None
        if set(table) != set(compiled.input_keys):
            return None
        guard = guard_key(functions)
        if guard is None or not cache.holds(guard, (table, {}, {}, {}), compiled):     # a node table alone
            return None
        return cls(cache, functions, guard, compiled, tuple(map(_SHAPE, table.values())), tuple(table))

    def __call__(self, graph: object, table: dict) -> dict[str, torch.Tensor] | None:
        """The program's outputs for a call on ``graph`` with node table ``table`` alone
        (a dict of tensors of its shapes: `RepeatCalls` checks), or None where the full path
        must run it."""
        prepared = self._prepared()
        return None if prepared is None else prepared(graph, table)

    def one(self, graph: object, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """`__call__` for a node table of one tensor, ``tensor`` (of its shape: `RepeatCalls`
        checks): the prepared call takes it without a dict to look it up in, and launches
        its kernel before this repeat's checks, which follow while it runs
        (runtime/prepared_call.py, "Launched first"): a call they send the full way
        drops what it launched."""
        prepared = self._compiled.prepared
        if prepared is None:
            return None
        outputs = prepared.call_one(graph, tensor)
        return None if outputs is None or self._prepared() is None else outputs

    def _prepared(self) -> PreparedCall | None:
        """The program's prepared call (its current one: it checks the graph) while the
        program is still the one a full call would find, else None."""
        if (self._cache.generation != self._generation or torch.get_default_dtype() is not self._dtype
                or torch.is_grad_enabled() is not self._grad):
            return None
        # the guard key still the one the program was found by: by identities where they decide it
        reads = self._reads
        if (reads is None or not same_reads(self._functions, reads)) and guard_key(self._functions) != self._guard:
            return None
        return self._compiled.prepared


class RepeatCalls:
    """The last `MOST` repeats of one function object's calls, one per node-table shape
    (see the module docstring), the latest first."""

    MOST = 4

    def __init__(self) -> None:
        self._calls: list[RepeatCall] = []

    def __call__(self, graph: object, table: object) -> dict[str, torch.Tensor] | None:
        """The outputs of the repeat whose tables had ``table``'s shapes, or None where
        there is none, it declines, or the call wants gradients (then the full path runs
        the call). Not for a call under ``torch.compile``, which its callers route apart."""
        if not self._calls or type(table) is not dict:
            return None
        if len(table) == 1:     # a neighbour sum's, a GCN aggregation's: no dict walked
            ((key, tensor),) = table.items()
            try:
                shapes = (tensor.shape,)
                if tensor.requires_grad and torch.is_grad_enabled():
                    return None
            except AttributeError:      # a value that is no tensor: the full path reports it
                return None
            for call in self._calls:
                if call.shapes == shapes:      # and the same name: the prepared call takes the tensor alone
                    return call.one(graph, tensor) if call.keys == (key,) else None
            return None
        if wants_gradient(table):
            return None
        try:
            shapes = tuple(map(_SHAPE, table.values()))
        except AttributeError:      # a value that is no tensor: the full path reports it
            return None
        for call in self._calls:
            if call.shapes == shapes:
                return call(graph, table)
        return None

    def keep(self, call: RepeatCall) -> None:
        """Hold ``call`` in place of any repeat of its shapes."""
        self._calls = [call, *[c for c in self._calls if c.shapes != call.shapes][:self.MOST - 1]]

    def __len__(self) -> int:
        return len(self._calls)

    def latest(self) -> RepeatCall | None:
        return self._calls[0] if self._calls else None


_SHAPE = operator.attrgetter("shape")


def wants_gradient(table: Mapping[str, object]) -> bool:
    """Whether a call on ``table`` records a backward (gradients on, an input needing one):
    a prepared call declines it, so neither the repeat's guard check nor a new repeat
    is worth making for it. A training step after an evaluation call found the last
    evaluation's repeat, checked its guard by the walk and built a new one on every step:
    a cached GAT forward + backward entered 289 gnnfuse functions instead of 224."""
    if not torch.is_grad_enabled():
        return False
    try:
        return any(map(_REQUIRES_GRAD, table.values()))
    except AttributeError:      # a value that is no tensor: the full path reports it
        return False


_REQUIRES_GRAD = operator.attrgetter("requires_grad")
