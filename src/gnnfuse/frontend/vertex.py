"""Seastar's vertex-centric API (§4): write what one vertex ``v`` computes.

    @gnnfuse.vertex
    def gcn(v):
        return sum([torch.mm(u.h, W) * u.norm for u in v.innbs])

    out = gcn(graph, v_feature={"h": h, "norm": norm})

``v.<key>`` is the vertex's own feature, ``u.<key>`` a neighbour's (``for u in v.innbs``),
``e.<key>`` an in-edge's (``for e in v.inedges``, with ``e.src``/``e.dst``). ``sum``,
``max`` and ``min`` over a list built from the neighbour list aggregate per vertex;
``len(v.innbs)`` (or ``len`` of a list built from it) is the in-degree, also in a helper
the function calls; Python's ``max(a, b)`` of two tensors is an error (use
``torch.maximum``), as eager PyTorch's comparison is for multi-element tensors. The traced loop
over ``v.innbs`` runs once, for one symbolic neighbour, so counting in Python (``n += 1``
in the loop, a list of constants built from it) is rejected: it would count 1.
The function may also be a bound method, a ``functools.partial``, an ``nn.Module``
(its ``forward`` is traced alone, so one with hooks is refused) or an object with a
``__call__`` method.

The function is traced into the IR on the first call and again whenever a call could
trace differently (other shapes or dtypes, a changed closure constant or global: see
`trace_cache`); compiled programs are cached by the traced program's structure.

Typed graphs (``Graph(..., edge_type=..., node_type=...)``) carry per-type data, passed
as ``etype_feature={key: [num_edge_types, ...]}`` and ``ntype_feature={key:
[num_node_types, ...]}`` and read through a row's type: ``e.type.<key>`` is the in-edge's
relation's row, ``u.type.<key>`` / ``e.src.type.<key>`` the source's node type's,
``e.dst.type.<key>`` and ``v.type.<key>`` the destination's. ``x @ e.type.W`` with W of
shape [R, in, out] multiplies by each edge's own relation matrix (R-GCN):

    @gnnfuse.vertex
    def rgcn(v):
        return sum([(e.src.h @ e.type.W) * e.norm for e in v.inedges]) + v.h @ root

    out = rgcn(graph, {"h": x}, {"norm": norm}, etype_feature={"W": W})

``type`` is therefore reserved and cannot name a vertex or edge feature.

Multi-hop propagation (Seastar's APPNP): ``v.update_allnode({"h": new_h})`` sets every
vertex's ``h`` to the per-vertex value ``new_h`` for the rest of the function, so reads of
``u.h`` / ``v.h`` / ``e.src.h`` after it see the new value and a loop of K hops compiles
into one program of K chained aggregations (K is a trace-time constant, guarded by the
trace cache like any closure constant):

    @gnnfuse.vertex
    def appnp(v):
        for _ in range(K):
            h = (1 - alpha) * sum([u.h * u.norm for u in v.innbs]) * v.norm + alpha * v.h0
            v.update_allnode({"h": h})
        return v.h
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import sys
import threading
import types
from typing import Any, Callable, Iterator, Mapping

import torch

from ..backend import kernel_cache  # noqa: F401  (takes the builtins before any trace swaps them)
from ..graph import Graph
from ..ir import CompileError, Residency
from ..passes.reorder import mask_rows_only_gathers_read
from ..runtime import CompiledProgram
from .compiled_call import call_compiled, register_udf
from .counting import IDENTITY, check_counting
from .module_hooks import registered_hooks
from .graph_input import call_graph
from .repeat_call import RepeatCall, RepeatCalls
from .random_draws import RandomDraws
from .trace_cache import (GuardMemo, TraceCache, check_tables, impure_name, outside_writes, plain_table,
                          program_feeds)
from .tracer import EDGE_ROWED, Degree, SymTensor, Tracer, definition_site, is_library
from .udf import unwrap


class _Walks:
    """How many loops over ``v.innbs`` / ``v.inedges`` have ended whose lists no aggregate
    or count has taken yet. Such a list holds the loop's one traced item; when that item
    does not depend on the neighbour (a helper returning only ``v``'s values, a constant,
    ``v.h if u is not None else 0``), Python's ``sum``/``max``/``len`` of it is the item
    itself, one value per vertex where eager code has one per neighbour (a sum of ``f(v)``
    came out ``f(v)``, not ``deg(v) * f(v)``, and a vertex without in-edges ``f(v)``, not
    0). The syntax check refuses the spellings it can see (`counting`); the builtins refuse
    a one-item list without neighbour values while a loop has ended untaken.

    ``passes`` holds, for each loop whose one pass is running now, the id of the last IR
    value made before it and the neighbour it yielded: a one-item list whose item was made
    after that (``box = [u.h]``, a helper appending ``u.h`` to ``[]`` or to a list from
    before the loop) is a list of that pass, where eager code takes one pass's items or
    the passes so far -- never the in-degree or the sum over every neighbour, which
    Python's ``len`` or ``sum`` of a finished list gives (`_in_its_pass`). A list from an
    earlier loop, counted in this one (``w / sum(weights)``), holds older values, and one
    from an inner loop that has ended (``sum([w.s for w in v.innbs])`` inside the pass)
    values made between that loop's first and last (``finished``)."""

    def __init__(self):
        self.ended = 0
        # loops running now that line up neighbours by position (over ``zip`` of neighbour
        # lists, or ``range(len(v.innbs))``): eager code runs their body once per neighbour too
        self.aligned = 0
        self.passes: list[tuple[int, Any]] = []
        self.finished: list[tuple[int, int]] = []

    def made_in_a_pass(self, item: Any) -> bool:
        """Whether ``item`` (a list's one item) was built in a loop pass running now,
        not by an inner loop that has ended."""
        if not self.passes:
            return False
        if isinstance(item, SymTensor):
            start, made = self.passes[-1][0], item.value.id
            return made > start and not any(first >= start and first < made <= last for first, last in self.finished)
        if isinstance(item, (list, tuple)):
            return any(self.made_in_a_pass(x) for x in item)
        return any(item is made or (isinstance(made, _Edge) and (item is made.src or item is made.dst))
                   for _, made in self.passes)

    def take(self) -> None:
        """A list built from a loop was aggregated or counted."""
        self.ended = max(self.ended - 1, 0)


def _neighbour_free(tracer: Tracer, call: str) -> CompileError:
    return tracer.error(f"{call} of a list built from v.innbs / v.inedges whose item does not depend on the "
                        "neighbour (a helper returning only v's values, a constant) would give one value per "
                        "vertex, not one per neighbour: read the neighbour (u.h, e.src.h) in each item, or "
                        "multiply a per-vertex value by len(v.innbs)")


def _in_its_pass(tracer: Tracer, call: str) -> CompileError:
    return tracer.error(f"{call} of a list holding a neighbour's value, inside the loop over v.innbs / v.inedges "
                        "that made it (a list filled in the loop's pass, or by a helper called there): eager code "
                        "takes what that pass, or the passes so far, put in it, where the traced loop runs once and "
                        "would take every neighbour's; aggregate after the loop, or use len(v.innbs) for the in-degree")


class _Neighbours:
    """``v.innbs`` / ``v.inedges``: iterates once, yielding one symbolic neighbour."""

    def __init__(self, tracer: Tracer, make: Callable[[], Any], walks: _Walks):
        self.tracer, self._make, self._walks = tracer, make, walks

    def __iter__(self):
        values = self.tracer.program.values
        running = (values[-1].id if values else -1, self._make())
        self._walks.passes.append(running)
        try:
            yield running[1]
        finally:        # also when the loop is abandoned (an error in its pass)
            self._walks.passes.remove(running)
        self._walks.finished.append((running[0], values[-1].id if values else -1))
        self._walks.ended += 1       # the loop asked for the next neighbour: its list is complete

    def __getitem__(self, i):
        if i != 0:
            raise self.tracer.error("index the neighbour list only through range(len(v.innbs))")
        return self._make()

    def __len__(self):
        raise _LengthError("len(v.innbs) is the in-degree only through Python's len() called in the vertex "
                           "function or a helper of yours", self.tracer.source())


class _LengthError(CompileError, TypeError):
    """Also a TypeError, so ``list(v.innbs)``, which asks for a length hint first and
    ignores a TypeError there, still builds the one-neighbour list."""


class _Proxy:
    """What `_Vertex` and `_Edge` share: ``==`` and ``!=`` between them refused, as
    Python would compare the objects, not which vertex each edge has (`counting.IDENTITY`)."""
    _tracer: Tracer

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Proxy):
            raise self._tracer.error(IDENTITY)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if isinstance(other, _Proxy):
            raise self._tracer.error(IDENTITY)
        return NotImplemented

    __hash__ = object.__hash__     # a set of neighbours still reaches `len`'s refusal


class _Vertex(_Proxy):
    def __init__(self, tracer: Tracer, side: str, features: Mapping[str, torch.Tensor]):
        self._tracer, self._side, self._features = tracer, side, features

    @property
    def innbs(self) -> _Neighbours:
        self._center_only("innbs")
        return _Neighbours(self._tracer, lambda: _Vertex(self._tracer, "src", self._features), self._features["walks"])

    @property
    def type(self) -> "_TypeData":
        """This vertex's node type's row of each ``ntype_feature`` tensor."""
        by = {"center": "ntype", "src": "srctype", "dst": "dsttype"}[self._side]
        return _TypeData(self._tracer, "ntype", by, self._features)

    @property
    def inedges(self) -> _Neighbours:
        self._center_only("inedges")
        return _Neighbours(self._tracer, lambda: _Edge(self._tracer, self._features), self._features["walks"])

    def update_allnode(self, features: Mapping[str, SymTensor]) -> None:
        """Seastar's multi-hop step: every vertex's ``key`` becomes ``features[key]`` for
        the rest of the function, so ``u.<key>`` / ``v.<key>`` read after it see the new
        per-vertex value. A loop of K hops that ends each hop with this traces into K
        chained aggregations in one program (Seastar's APPNP)."""
        self._center_only("update_allnode")
        if not isinstance(features, Mapping):
            raise self._tracer.error(f"update_allnode takes a dict of per-vertex values, got "
                                     f"{type(features).__name__}")
        for key, value in features.items():
            if not isinstance(key, str) or key.startswith("_") or hasattr(_Vertex, key):
                raise self._tracer.error(f"update_allnode cannot set {key!r}: not a feature name "
                                         "(a string that is not a vertex attribute such as innbs or type)")
            if not isinstance(value, SymTensor) or value.value.residency is not Residency.NODE:
                what = value.value.residency.name if isinstance(value, SymTensor) else type(value).__name__
                raise self._tracer.error(f"update_allnode({{{key!r}: ...}}) needs a per-vertex value, got "
                                         f"{what}; aggregate neighbour values with sum/max/min first")
        self._features["updated"].update(features)

    def _center_only(self, what: str) -> None:
        if self._side != "center":
            raise self._tracer.error(f"{what} is only available on the center vertex v (one hop per call)")

    def __getattr__(self, key: str) -> SymTensor:
        if key.startswith("_"):
            raise AttributeError(key)
        nodes, updated = self._features["nodes"], self._features["updated"]
        if key not in nodes and key not in updated:
            raise self._tracer.error(f"vertex feature {key!r} does not exist; v_feature has {sorted(nodes)}")
        if key in updated:
            x = updated[key]
        else:
            x = _callers(self._tracer.input(key, Residency.NODE, nodes[key], 0), f"v.{key}")
        if self._side == "center":
            return x
        by = "src" if self._side == "src" else "dst"
        row = SymTensor(self._tracer, self._tracer.program.add("broadcast", x.value, by=by,
                                                               source=self._tracer.source()), 0)
        return row if key in updated else _callers(row, f"{'u' if self._side == 'src' else 'e.dst'}.{key}")


class _TypeData:
    """``e.type`` / ``u.type`` / ``v.type``: per-type data read through the row's type."""

    _ARGUMENT = {"etype": "etype_feature", "ntype": "ntype_feature"}
    _RESIDENCY = {"etype": Residency.EDGE_TYPE, "ntype": Residency.NODE_TYPE}

    def __init__(self, tracer: Tracer, table: str, by: str, features):
        self._tracer, self._table, self._by, self._features = tracer, table, by, features

    def __getattr__(self, key: str) -> SymTensor:
        if key.startswith("_"):
            raise AttributeError(key)
        tables = self._features[self._table]
        if key not in tables:
            raise self._tracer.error(f"per-type feature {key!r} does not exist; "
                                     f"{self._ARGUMENT[self._table]} has {sorted(tables)}")
        x = self._tracer.input(f"{self._table}.{key}", self._RESIDENCY[self._table], tables[key], 0)
        return _callers(SymTensor(self._tracer, self._tracer.program.add("broadcast", x.value, by=self._by,
                                                                         source=self._tracer.source()), 0),
                        f"{self._table[0]}.type.{key}")


class _Edge(_Proxy):
    def __init__(self, tracer: Tracer, features):
        self._tracer, self._features = tracer, features
        self.src = _Vertex(tracer, "src", features)
        self.dst = _Vertex(tracer, "dst", features)

    @property
    def type(self) -> _TypeData:
        """This edge's relation's row of each ``etype_feature`` tensor."""
        return _TypeData(self._tracer, "etype", "etype", self._features)

    def __getattr__(self, key: str) -> SymTensor:
        if key.startswith("_"):
            raise AttributeError(key)
        edges = self._features["edges"]
        if key not in edges:
            raise self._tracer.error(f"edge feature {key!r} does not exist; e_feature has {sorted(edges)}")
        return _callers(self._tracer.input(f"e.{key}", Residency.EDGE, edges[key], 0), f"e.{key}")


def _callers(x: SymTensor, name: str) -> SymTensor:
    """``x``, a read of the caller's table (``v.h``, ``u.h``, ``e.w``, ``e.type.W``),
    marked so that an in-place op on it is refused at its line: in eager code the read is
    the caller's row, so ``x = v.h; x += 1`` writes the table and a later ``v.h`` sees it,
    where each traced read gave the unwritten value (``v.h * 2`` read 2.0 for 4.0,
    silently). Values set by ``update_allnode`` are the function's own, not marked."""
    x.caller_table = name
    return x


def _counts_and_numbers(operands: tuple) -> bool:
    """Whether Python's ``max``/``min`` compares in-degrees (``len(v.innbs)``) with numbers
    only, as ``max(len(v.inedges), 1)`` does: per vertex, eager code compares two Python
    numbers, which `_counts_compared` computes elementwise, exactly."""
    return (any(isinstance(x, Degree) for x in operands)
            and all(isinstance(x, Degree) or (isinstance(x, (int, float)) and not isinstance(x, bool))
                    for x in operands))


def _counts_compared(tracer: Tracer, op: str, operands: tuple) -> SymTensor:
    """``max``/``min`` of in-degrees and numbers, per vertex (no gradient: a count has none)."""
    result = operands[0]
    for other in operands[1:]:
        result = tracer.apply(f"{op}imum", result, other)
    return result


def _aggregate(tracer: Tracer, builtin: Callable, op: str, walks: _Walks):
    """``sum``/``max``/``min`` that aggregate a traced neighbour list per vertex."""

    def aggregate(iterable, *args, **kwargs):
        if op != "sum" and args:   # max(a, b, ...): Python compares the operands
            operands = (iterable, *args)
            if _counts_and_numbers(operands) and not kwargs:
                return _counts_compared(tracer, op, operands)
            if any(isinstance(x, SymTensor) for x in operands):
                raise tracer.error(f"Python's {op}(a, b) compares tensors with < / >, which has no per-element "
                                   f"meaning (eager PyTorch raises on multi-element tensors); use "
                                   f"torch.{op}imum(a, b)")
            return builtin(iterable, *args, **kwargs)
        if isinstance(iterable, SymTensor):
            # Python iterates a tensor over its first dim: eager code's sum(v.h) adds the
            # elements of each vertex's row, and sum(u.h) in the loop those of the neighbour's;
            # taken as a one-item list, the first gave v.h back and the second summed u.h over
            # the neighbours, silently
            raise tracer.error(f"Python's {op}() of a tensor iterates over its first dim (each vertex's or "
                               f"neighbour's row), which cannot be compiled; {op}() aggregates a list built from "
                               f"v.innbs / v.inedges, and x.{'sum' if op == 'sum' else 'a' + op}(dim) reduces "
                               "feature dims")
        items = list(iterable)
        syms = [x for x in items if isinstance(x, SymTensor)]
        if not syms or not any(x.value.residency in EDGE_ROWED for x in syms):
            if walks.ended and len(items) == 1 and not _from_neighbour(items[0]):
                raise _neighbour_free(tracer, f"{op}()")
            return builtin(items, *args, **kwargs)
        if len(items) == 1 and walks.made_in_a_pass(items[0]):
            raise _in_its_pass(tracer, f"{op}()")
        walks.take()
        if len(items) != 1:
            raise tracer.error(f"{op}() over a neighbour list must take exactly the list built from "
                               "v.innbs / v.inedges")
        if kwargs or (args and op != "sum"):
            raise tracer.error(f"{op}() over a neighbour list takes no extra arguments")
        result = SymTensor(tracer, tracer.program.add("reduce", items[0].value, op=op, by="dst",
                                                      source=tracer.source()), 0)
        start = args[0] if args else 0      # sum(list, start): a tensor start is added (`!= 0` on it was ambiguous)
        return result if isinstance(start, (int, float)) and start == 0 else tracer.apply("add", result, start)

    return aggregate


def _length(tracer: Tracer, walks: _Walks):
    """``len`` that counts a neighbour list symbolically: ``len(v.innbs)``, and the one
    element of a list built from it (``len([u for u in v.innbs])``, ``len(list(v.innbs))``).
    Any other container holding traced neighbours -- a set or dict of them, a list with
    more (``hs + [v.h]``, ``hs * 2``) -- holds one per neighbour, plus or times something,
    in eager code; Python's count of the traced one would be a constant."""
    def length(obj):
        if isinstance(obj, SymTensor):      # not a probe: the user's code asked, and may catch the error
            raise tracer.error("len() of a symbolic feature value cannot be compiled")
        if isinstance(obj, _Neighbours):
            return tracer.in_degree()
        one = isinstance(obj, (list, tuple)) and _BUILTINS["len"](obj) == 1
        if one and _from_neighbour(obj[0]):
            if walks.made_in_a_pass(obj[0]):
                raise _in_its_pass(tracer, "len()")
            walks.take()
            return tracer.in_degree()
        if _holds_neighbours(obj):
            raise tracer.error("len() of a container holding v.innbs / v.inedges items that is not a list built "
                               "from them one per neighbour (a set or dict of them, a list joined or repeated) "
                               "counts the one traced neighbour; use len(v.innbs), the per-vertex in-degree")
        if one and walks.ended:
            raise _neighbour_free(tracer, "len()")
        return _BUILTINS["len"](obj)
    return length


def _zip(tracer: Tracer, walks: _Walks):
    """``zip`` that lines up neighbour lists only with lists of the same neighbours: the
    traced list holds one neighbour, so zipped with positions or values (``range``, a list
    of weights, ``itertools.count()``) it would pair every neighbour with the first. A loop
    over it is a pass per neighbour (`_aligned`)."""
    def zipped(*iterables, **kwargs):
        if any(_neighbour_list(x) for x in iterables):
            if not all(_one_per_neighbour(x) for x in iterables):
                raise tracer.error("zip() of v.innbs / v.inedges with something not built from the same "
                                   "neighbours one item each (range, count, a list of values, a neighbour list "
                                   "joined with other items) pairs the one traced neighbour with its first item; "
                                   "zip lists of the same neighbours only (zip(v.innbs, v.inedges))")
            return _aligned(walks, _BUILTINS["zip"](*iterables, **kwargs))
        return _BUILTINS["zip"](*iterables, **kwargs)
    return zipped


def _positions(walks: _Walks) -> Callable:
    """``range`` for the vertex function's own code: ``range(len(v.innbs))`` iterates its
    one traced position as a pass per neighbour (`_aligned`); any other range is Python's."""
    def ranged(*args):
        if len(args) == 1 and isinstance(args[0], Degree):
            return _aligned(walks, iter(range(args[0])))
        return range(*args)
    return ranged


def _aligned(walks: _Walks, items: Iterator) -> Iterator:
    """``items`` while counting a positional pass as running (``walks.aligned``): a dropout
    of a per-vertex value in its body draws per in-edge, as in a loop over v.innbs."""
    walks.aligned += 1
    try:
        yield from items
    finally:
        walks.aligned -= 1


_BUILTINS = {name: getattr(builtins, name) for name in ("sum", "max", "min", "len", "zip")}
_BUILTINS_SWAP = threading.RLock()   # re-entrant: a UDF may call another vertex function


def _counting_builtins(tracer: Tracer, walks: _Walks) -> dict[str, Callable]:
    """``sum``, ``max``, ``min`` and ``len`` that aggregate or count a traced neighbour
    list, and ``zip`` that lines it up only with lists of the same neighbours."""
    return {name: _aggregate(tracer, _BUILTINS[name], name, walks) for name in ("sum", "max", "min")} | {
        "len": _length(tracer, walks), "zip": _zip(tracer, walks)}


@contextlib.contextmanager
def _in_helpers(counting: Mapping[str, Callable]):
    """While the function runs, ``sum``/``max``/``min``/``len``/``zip`` called from user code
    outside it (a helper taking the neighbour list: ``def mean(xs): return sum(xs) /
    len(xs)``) aggregate and count too: a helper's globals cannot be patched, and there
    the list built from ``v.innbs`` holds one traced neighbour, so the builtin ``len``
    would count 1. The builtins are replaced for the trace only; a call reaches the
    counting version only from the tracing thread's code outside gnnfuse and torch and on
    a neighbour list (``v.innbs`` or a container holding its items), every other call the
    original builtin."""
    tracing = threading.get_ident()

    def user_only(name: str) -> Callable:
        original, patched = builtins.__dict__[name], counting[name]

        def call(*args, **kwargs):
            # another thread's code meets the swapped builtins too: it gets the original, as
            # it is (its generator argument was drained into a list here: zip(gen, range(2))
            # consumed the whole generator)
            if not args or threading.get_ident() != tracing or is_library(sys._getframe(1).f_code.co_filename):
                return original(*args, **kwargs)
            if name != "len" and isinstance(args[0], types.GeneratorType):
                args = (list(args[0]),) + args[1:]
            counted = any(_holds_neighbours(x) or isinstance(x, SymTensor) for x in args)
            return (patched if counted else original)(*args, **kwargs)
        return call
    import torch._dynamo  # noqa: F401  (see below)
    # Module-level code run while the builtins are swapped would keep the wrappers. Torch
    # imports dynamo lazily from inside its meta kernels, which the tracer's shape rules
    # run, so the first trace of a process imported it mid-swap, and dynamo, holding a
    # wrapper for ``len``, could no longer trace ``len`` (torch.compile after an eager
    # call failed). Imported first, at no extra cost: that first trace imports it anyway.
    # Numba's typing and lowering registries: it loads them at a process's first compile,
    # registering the builtins it then finds, so a first compile in another thread during
    # the swap (a loader thread's first hop) failed inside Numba ("module has no attribute
    # 'call'") or left ``len`` without a lowering for the rest of the process. Numba
    # compiles under its global compiler lock: held through the swap, another thread's
    # compile waits for the real builtins (loading the registries here instead ran under
    # whatever else was patched then: torch.export's math functions).
    numba = sys.modules.get("numba")       # the CPU backend and the loader's samplers import it
    compiling = numba.core.compiler_lock.global_compiler_lock if numba is not None else contextlib.nullcontext()
    with compiling, _BUILTINS_SWAP:   # one trace at a time: interleaved swaps would restore another's wrappers
        saved = {name: builtins.__dict__[name] for name in counting}
        builtins.__dict__.update({name: user_only(name) for name in counting})
        try:
            yield
        finally:
            builtins.__dict__.update(saved)


def _neighbour_list(obj) -> bool:
    """``v.innbs`` / ``v.inedges``, or a list or tuple built from its traced neighbour."""
    return isinstance(obj, _Neighbours) or (isinstance(obj, (list, tuple)) and any(_from_neighbour(x) for x in obj))


def _one_per_neighbour(obj) -> bool:
    """``v.innbs`` / ``v.inedges``, or a list or tuple built from them one item per
    neighbour: at trace time exactly one item, from the traced neighbour. ``[v.h] + hs``
    also holds it, but eager code's zip would pair each neighbour with the item before it."""
    return isinstance(obj, _Neighbours) or (isinstance(obj, (list, tuple)) and len(obj) == 1
                                            and _from_neighbour(obj[0]))


def _holds_neighbours(obj) -> bool:
    """A neighbour list, or a set, dict (keys or values) or dict view holding its items."""
    if isinstance(obj, dict):
        return _neighbour_list(list(obj)) or _neighbour_list(list(obj.values()))
    if isinstance(obj, (set, frozenset, type({}.keys()), type({}.values()), type({}.items()))):
        return _neighbour_list(list(obj))
    return _neighbour_list(obj)


def _from_neighbour(item) -> bool:
    """Whether ``item`` was built from the one traced neighbour (or in-edge) of v."""
    if isinstance(item, SymTensor):
        return item.value.residency in EDGE_ROWED
    if isinstance(item, (list, tuple)):
        return any(_from_neighbour(x) for x in item)
    return isinstance(item, _Edge) or (isinstance(item, _Vertex) and item._side == "src")


_UNSET = object()


def _per_pass_rows(walks: _Walks, x: SymTensor) -> SymTensor:
    """A per-vertex ``x`` a dropout draws for inside a loop over v.innbs / v.inedges, as a
    value per in-edge (broadcast from each edge's destination), else ``x`` itself. Eager
    code runs the loop's body once per neighbour, drawing a fresh mask each pass; the
    mask drawn for the one per-vertex row was shared by every in-edge (``u.h * dp(v.h)``
    summed over two in-edges of ones gave 0 or 4 per element, eager code 0, 2 or 4)."""
    if not (walks.passes or walks.aligned) or x.value.residency is not Residency.NODE:
        return x
    return x.broadcast_dst()


def _refuse_module_hooks(module: torch.nn.Module) -> None:
    """Refuse a vertex function that is a module with hooks: the trace runs its
    ``forward`` alone (with the vertex front end's own ``sum``/``len``), so a forward hook
    scaling the result by 10 was skipped without a word where ``module(v)`` runs it. (A
    message-passing UDF module is called as a module, its hooks running on the traced
    values; hooks of modules the function calls run as well.)"""
    own, every = registered_hooks(module)
    if own or every:
        where = " and ".join([*(f"{name} of its own" for name in own), *(f"{name} on every module" for name in every)])
        raise CompileError(f"{type(module).__qualname__} is a vertex function with hooks ({where}), which are "
                           "not run: the vertex trace runs its forward alone, so the result would differ from "
                           "module(v); remove the hooks or apply them to the result outside the function")


def _random_draw(plain: types.FunctionType) -> CompileError:
    """The refusal of a vertex function that drew a random number while traced (torch's,
    Python's or NumPy's generators, also inside library code): eager code runs the function
    once per vertex and its neighbour loop once per in-edge, drawing anew each time, but the
    trace drew once, a constant every vertex and edge of the program would share (a
    per-neighbour ``u.h * random.random()`` scaled every edge alike). F.dropout on graph
    values draws per element at run time and is no such draw."""
    code = plain.__code__
    name = impure_name(code)
    return CompileError(
        f"{plain.__qualname__} draws a random number{f' ({name})' if name else ''} while traced: eager code draws "
        "once per vertex (per in-edge in a loop over v.innbs), the trace once, a constant every vertex and edge "
        "would share; pass random values in as vertex or edge features, or use F.dropout on graph values",
        definition_site(code))


def _write_back_globals(plain: types.FunctionType, env: dict[str, Any], before: dict[str, Any]) -> None:
    """Carry the globals the traced function rebound in ``env`` (the copy of its globals
    it runs with, holding the counting builtins) over to its module, as the eager call
    would have: a ``global step; step += 1`` counter stayed 0 in the module, and every
    call traced with step 1 (the messages times 1, 1, 1 where eager code gave 1, 2, 3).
    Such a function is traced on every call (`trace_cache.outside_writes`), so the
    counter advances once a call; a traced value carried over is refused, and put back,
    by the trace cache's check (`kept_traced.KeptTraced`)."""
    for name, old in before.items():
        new = env.get(name, _UNSET)
        if new is old:
            continue
        if new is _UNSET:
            plain.__globals__.pop(name, None)
        else:
            plain.__globals__[name] = new


class VertexFunction:
    """A vertex-centric function, compiled on first use for each traced structure."""

    def __init__(self, fn: Callable):
        functools.update_wrapper(self, fn, updated=())   # a Module's __dict__ is its state, not a wrapper's
        self.fn = fn
        self.functions = (fn,)      # what the trace cache guards (`compiled_call.register_udf`)
        self.traces = _TRACES       # the cache `compiled` asks
        self.udf_key = register_udf(self)
        self._repeats = RepeatCalls()     # the last prepared calls, for the next (repeat_call.py)
        self._guards = GuardMemo()        # the trace cache's guard walk of `functions`, reused while valid

    def __reduce__(self) -> str | tuple:
        """Pickled (sent to a spawned worker) as its function: by name where the decorator
        bound it at module level, as pickle sends a function, else rebuilt around ``fn``.
        Pickled with its ``__dict__``, the function under ``fn`` was looked up by its name
        and found to be this wrapper ("it's not the same object as ..."), and after a call
        the caches' programs held code objects, which pickle refuses."""
        module = sys.modules.get(self.__module__)
        if module is not None and _attribute_path(module, self.__qualname__) is self:
            return self.__qualname__
        return VertexFunction, (self.fn,)

    def trace(self, v_feature: Mapping[str, torch.Tensor],
              e_feature: Mapping[str, torch.Tensor] | None = None,
              etype_feature: Mapping[str, torch.Tensor] | None = None,
              ntype_feature: Mapping[str, torch.Tensor] | None = None, *, retry_draw: bool = True
              ) -> tuple[Tracer, dict[str, torch.Tensor]]:
        """Trace the function into a program; returns the tracer and the captured tensors.
        A trace that drew a random number is traced once more (``retry_draw``): a lazy
        module (``nn.LazyLinear``, PyG's ``Linear(-1, ...)``) draws its parameters at its
        first call only, once, as eager code does at the first vertex, and was refused as
        a per-vertex draw; a function that draws on every call draws again and is refused."""
        for argument, table in (("v_feature", v_feature), ("e_feature", e_feature or {})):
            if "type" in table:     # ``v.type`` / ``e.type`` read the per-type tables instead
                raise ValueError(f"{argument} has a feature named 'type', which a vertex function cannot read: "
                                 "v.type, u.type and e.type are the per-type rows (ntype_feature=, etype_feature=); "
                                 "rename the feature")
        feats = {"nodes": dict(v_feature), "edges": dict(e_feature or {}),
                 "etype": dict(etype_feature or {}), "ntype": dict(ntype_feature or {})}
        feats["updated"] = {}   # vertex features set by v.update_allnode, by key
        feats["walks"] = walks = _Walks()
        tracer = Tracer(self.fn, "vertex")
        tracer.per_pass_rows = functools.partial(_per_pass_rows, walks)
        if isinstance(self.fn, torch.nn.Module):
            _refuse_module_hooks(self.fn)
        plain, args, keywords = unwrap(self.fn)
        check_counting(plain, args, keywords)
        counting = _counting_builtins(tracer, walks)
        env = dict(plain.__globals__, **counting, range=_positions(walks))
        rebound = {name: env.get(name, _UNSET) for kind, name, _ in outside_writes(plain.__code__) if kind == "global"}
        fn = types.FunctionType(plain.__code__, env, plain.__name__, plain.__defaults__, plain.__closure__)
        fn.__kwdefaults__ = plain.__kwdefaults__
        with RandomDraws() as draws, _in_helpers(counting):
            result = tracer.call(lambda v: fn(*args, v, **keywords), _Vertex(tracer, "center", feats))
        _write_back_globals(plain, env, rebound)
        if draws.drew:
            if retry_draw:
                return self.trace(v_feature, e_feature, etype_feature, ntype_feature, retry_draw=False)
            raise _random_draw(plain)
        outputs = result if isinstance(result, dict) else {"out": result}
        for key, out in outputs.items():
            if not isinstance(out, SymTensor) or out.value.residency is not Residency.NODE:
                where = getattr(out, "value", None)
                raise tracer.error(
                    f"a vertex function must return per-vertex values; output {key!r} is "
                    f"{where.residency.name if where is not None else type(out).__name__} — aggregate "
                    "neighbour values with sum/max/min over the list built from v.innbs")
            tracer.program.output(key, out.value)
        # ``scale(v.d)`` in the loop over v.innbs: eager code skips it on vertices without in-edges
        mask_rows_only_gathers_read(tracer.program)
        return tracer, {name: t for name, t in tracer.captured.values()}

    def __call__(self, graph: Graph | Any, v_feature: Mapping[str, torch.Tensor],
                 e_feature: Mapping[str, torch.Tensor] | None = None, *,
                 etype_feature: Mapping[str, torch.Tensor] | None = None,
                 ntype_feature: Mapping[str, torch.Tensor] | None = None):
        compiling = torch.compiler.is_compiling()
        if e_feature is None and etype_feature is None and ntype_feature is None and not compiling:
            # a repeat first, before building the tables it does not read
            outputs = self._repeats(graph, v_feature)
            if outputs is not None:     # `_unwrapped`, inline: every repeated call returns here
                return outputs["out"] if len(outputs) == 1 and "out" in outputs else outputs
        tables = (v_feature, e_feature or {}, etype_feature or {}, ntype_feature or {})
        if compiling:
            return _unwrapped(call_compiled(self.udf_key, graph, tables, lambda: self._run(graph, tables)))
        return _unwrapped(self._run(graph, tables))

    def _run(self, graph: Graph | Any, tables: tuple[Mapping[str, torch.Tensor], ...]) -> dict[str, torch.Tensor]:
        v_feature, e_feature, etype_feature, ntype_feature = tables
        # the usual call, a dict of tensors by str alone, passes `check_tables`' checks here;
        # anything else goes to `check_tables`, which names what is wrong
        if (e_feature or etype_feature or ntype_feature) or not plain_table(v_feature):
            check_tables(v_feature=v_feature, e_feature=e_feature, etype_feature=etype_feature,
                         ntype_feature=ntype_feature)
        graph = call_graph(graph, (v_feature or {}).values())
        compiled, captured = self.compiled(tables)
        outputs = compiled(graph, program_feeds(tables, captured))
        if compiled.prepared is not None and not any(tables[1:]):     # else there is nothing to repeat
            repeat = RepeatCall.after(_TRACES, self.functions, graph, v_feature, compiled, captured)
            if repeat is not None:
                self._repeats.keep(repeat)
        return outputs

    def compiled(self, tables: tuple[Mapping[str, torch.Tensor], ...]
                 ) -> tuple[CompiledProgram, dict[str, torch.Tensor]]:
        """The compiled program for a call on ``tables`` and the tensors its trace captured."""
        return self.traces.compiled(self.functions, tables, lambda: self.trace(*tables)[0], self._guards)


def as_table_rows(fn: Callable, row: Any) -> Any:
    """``fn(row)`` for torch code written for a whole table, one row per edge or vertex
    (PyG's ``EdgeConv`` nn, which PyG applies to the [E, 2F] table of every edge's
    input), called inside a vertex function on one edge's row: ``fn`` sees the row with
    its leading row axis, so ``x.shape[0]`` is the row count, a reduction or softmax over
    dim 0 (which combines rows) is refused by name, and dim 1 is the first feature dim, as
    in torch. A vertex function's own values show no row axis (``u.x`` is one row), and
    ``fn`` read there had taken dim 0 for the first feature dim: a softmax over the
    edges became one over each edge's features, silently. Outside a trace, ``fn(row)``."""
    if not isinstance(row, SymTensor) or row.prefix:
        return fn(row)
    out = fn(SymTensor(row.tracer, row.value, 1))
    if isinstance(out, SymTensor) and out.prefix == 1:
        return SymTensor(out.tracer, out.value, 0)
    raise row.tracer.error(f"a function applied to every row of a table must give one row per row, got "
                           f"{out!r}")


def _unwrapped(outputs: dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
    """A vertex function's result: its one output where it returned a value, else the dict."""
    return outputs["out"] if len(outputs) == 1 and "out" in outputs else outputs


# Keyed by the function's code and guarded state, not by the decorated object, so a
# function decorated anew on every call (Seastar's Figure 3 style, `compile`) reuses it.
_TRACES = TraceCache()


def _attribute_path(owner: Any, qualname: str) -> Any:
    """``owner.a.b`` for ``qualname`` "a.b", or None where a part is missing."""
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    return owner


def vertex(fn: Callable) -> VertexFunction:
    """Decorator: compile a vertex-centric function (see module docstring)."""
    return VertexFunction(fn)


def compile(graph: Graph | Any = None, v_feature: Mapping[str, torch.Tensor] | None = None,
            e_feature: Mapping[str, torch.Tensor] | None = None, *,
            etype_feature: Mapping[str, torch.Tensor] | None = None,
            ntype_feature: Mapping[str, torch.Tensor] | None = None) -> Callable[[Callable], Callable[[], Any]]:
    """Seastar's spelling: ``@compile(graph, v_feature={...})`` on ``vc_compute(v)`` gives a
    zero-argument callable that runs it on that graph (Seastar Figure 3).

    Figure 3 applies the decorator inside a module's ``forward``, so every call decorates
    a fresh function; traces are reused by the function's code and guarded state (see
    `trace_cache`) and compiled programs by structure (`compiled_for`), so a fresh
    decoration costs no new trace unless something it reads changed."""

    def decorate(fn: Callable) -> Callable[[], Any]:
        compiled = VertexFunction(fn)
        return functools.wraps(fn)(lambda: compiled(graph, v_feature or {}, e_feature,
                                                    etype_feature=etype_feature,
                                                    ntype_feature=ntype_feature))

    return decorate
