"""Reject Python over neighbour lists that tracing cannot see.

The tracer runs a loop over ``v.innbs`` once, for one symbolic neighbour. Values built
from that neighbour stay symbolic, but Python's own bookkeeping does not: ``n += 1`` in
the loop, or a list of constants built from it (``len([1 for u in v.innbs])``, ``sum(1
for u in v.innbs)``), ends up as 1 for every vertex -- a mean silently becomes a sum.
So do a position (``enumerate``), a pair of neighbours (two loops over ``v.innbs``), a
prefix (slicing the list, ``break``, ``islice``), the list's truth (``if nb:`` is true
at trace time for a vertex with no neighbour) and a value one neighbour's pass of a loop
leaves for the next (a running total used in the loop, the previous neighbour's value). Nothing at run time distinguishes that 1,
0 or one-element list from a real one, so the function's syntax is checked before it is
traced; ``len(v.innbs)`` is the symbolic count. Names bound to such a list (an alias
``nbs = v.innbs``, a list a loop over it fills) are followed, and so are the helpers the
function calls by a name or its attributes (``first_two``, ``self.first_two``, a partial,
a staticmethod, ``module.helper``), with the parameters it hands a list to. What syntax
cannot see -- ``zip`` with a list of values held anywhere, ``len`` of a set of neighbours -- the
builtins that `vertex` swaps in refuse while tracing.
"""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import textwrap
import types
from typing import Any, Callable, Mapping

from ..ir import CompileError
from .trace_cache import outside_writes
from .tracer import is_library
from .udf import unwrap

NEIGHBOUR_LISTS = ("innbs", "inedges")


def check_counting(fn: types.FunctionType, args: tuple[Any, ...] = (), keywords: Mapping[str, Any] | None = None
                   ) -> None:
    """Raise a CompileError at the first line of ``fn``, or of a helper it calls, that
    counts neighbours in Python. ``args`` and ``keywords`` are bound before the vertex, as
    `udf.unwrap` returns them (a method's ``self``, a partial's arguments): through them a
    call of ``self.first_two(...)`` is followed to the method it reaches."""
    keywords = keywords or {}
    known = _known(fn, args, keywords, (len(args) + 1, tuple(keywords)))
    found, _ = _found_in(fn, frozenset(), known, {})
    if found:
        filename, line, message = found[0]
        text = linecache.getline(filename, line).strip()
        raise CompileError(message, f"{filename}:{line}: {text}")


def _known(fn: types.FunctionType, args: tuple[Any, ...], keywords: Mapping[str, Any],
           passed: tuple[int, tuple[str, ...]] | None) -> dict[str, Any]:
    """The parameters of ``fn`` bound to ``args`` (leading) and ``keywords``, by name, and
    to their defaults where the call (``passed``: how many positional arguments it gives
    and which keywords; None where a ``*``/``**`` hides that) leaves them out: ``def f(v,
    first=first_two)`` calls ``first_two``."""
    code = fn.__code__
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    known = {**dict(zip(names[:code.co_argcount], args)), **{k: v for k, v in keywords.items() if k in names}}
    if passed is not None:
        count, named = passed
        defaults = fn.__defaults__ or ()
        left_out = dict(zip(names[code.co_argcount - len(defaults):code.co_argcount], defaults))
        left_out.update(fn.__kwdefaults__ or {})
        known.update({name: value for name, value in left_out.items()
                      if name not in known and name not in named and names.index(name) >= min(count, code.co_argcount)})
    return known


def _found_in(fn: types.FunctionType, given: frozenset[str], known: dict[str, Any], done: dict
              ) -> tuple[list[tuple[str, int, str]], bool]:
    """(the lines of ``fn`` -- its parameters ``given`` holding neighbour lists, those in
    ``known`` bound to these objects -- and of the helpers it calls that count neighbours;
    whether ``fn`` returns a neighbour list). A helper is checked with the parameters the
    call passes a neighbour list to: ``def first_two(xs): return sum(xs[:2])`` slices the
    one-neighbour list it gets as surely as inline code; and a name bound to what a helper
    returns (``hs = messages(v)``) is a neighbour list when the helper returns one. A list
    handed to a helper's ``*args`` or ``**kwargs`` is refused at the call: what the helper
    does with the packed list is not followed (a decorator's wrapper is, through
    ``__wrapped__``)."""
    key = (fn.__code__, given, tuple(sorted((name, id(value)) for name, value in known.items())))
    if key in done:
        return done[key]
    done[key] = ([], False)         # a recursive call finds nothing more
    listing: frozenset[str] = frozenset()
    while True:
        lines, calls, returns = _analysis(fn.__code__, given, listing)
        found, giving = [(fn.__code__.co_filename, line, message) for line, message in lines], set()
        for line, written, path, positions, keywords, passed, shared in calls:
            for helper, leading, bound in _resolve(fn, path, known):
                if is_library(helper.__code__.co_filename):     # torch's and gnnfuse's own
                    continue
                if shared is not None and _helper_keeps_state(helper.__code__, len(leading), _listed_parameters(
                        helper.__code__, tuple(i + len(leading) for i in shared[0]), shared[1])):
                    found.append((fn.__code__.co_filename, line, _HELPER_STATE))
                shifted = tuple(i + len(leading) for i in positions)
                given_to = _listed_parameters(helper.__code__, shifted, keywords)
                if len(given_to) < len(shifted) + len(keywords) and not hasattr(helper, "__wrapped__"):
                    found.append((fn.__code__.co_filename, line, _PACKED))      # into *args / **kwargs
                call = None if passed is None else (passed[0] + len(leading), (*passed[1], *bound))
                inner, gives = _found_in(helper, given_to, _known(helper, leading, bound, call), done)
                found += inner
                if gives:
                    giving.add(_spelled(written))
        if giving <= listing:
            done[key] = (found, returns)
            return done[key]
        listing |= giving


def _resolve(fn: types.FunctionType, path: tuple, known: dict[str, Any]
             ) -> list[tuple[types.FunctionType, tuple[Any, ...], dict[str, Any]]]:
    """What a call of ``path`` (`_dotted`: ``helper``, ``self.first_two``,
    ``module.helper``, ``HELPERS["f"]``, ``super().f``) in ``fn`` runs, as `udf.unwrap`
    gives it: the function, the arguments bound before the call's (a method's object, a
    partial's) and the keywords bound; and what a decorator's wrapper calls
    (``__wrapped__``), with the same arguments. Empty where it is not known. The first
    name is a parameter in ``known``, a closure cell or a global (another local is not
    known; a method of a new instance, ``Helper().f``, is the class's function, its
    instance unknown); the attributes and items are looked up as the call will, so a method, a
    staticmethod or classmethod, a partial, a module's function or a callable object (an
    ``nn.Module`` runs its ``forward``) is followed like a plain helper."""
    root, *steps = path
    if isinstance(root, str) or root[0] == "new":
        value = _value_of(fn, root if isinstance(root, str) else root[1], known)
    elif root[0] == "type":
        value = _value_of(fn, root[1], known)
        value = _MISSING if value is _MISSING else type(value)
    else:       # super(): the method's class cell and its first argument
        owner = _value_of(fn, "__class__", known)
        first = fn.__code__.co_varnames[0] if fn.__code__.co_argcount else None
        value = _MISSING if owner is _MISSING or first not in known else super(owner, known[first])
    if value is _MISSING:
        return []
    if not isinstance(root, str) and root[0] == "new":     # Helper().first_two: a method of a new instance
        name = steps[0] if steps else "__call__"       # h = Helper(); h(xs) calls its __call__
        if len(steps) > 1 or not (isinstance(value, type) and isinstance(name, str)
                                  and isinstance(inspect.getattr_static(value, name, None), types.FunctionType)):
            return []
        return [(getattr(value, name), (_MISSING,), {})]
    try:
        for step in steps:
            value = getattr(value, step) if isinstance(step, str) else value[step[1]]
    except Exception:       # no such attribute or item: the call itself will tell
        return []
    return _targets(value)


def _targets(value: Any) -> list[tuple[types.FunctionType, tuple[Any, ...], dict[str, Any]]]:
    """`udf.unwrap` of ``value``, and of each function a decorator wrapped in it."""
    try:
        found = [unwrap(value)]
    except TypeError:       # not Python code (a builtin, an lru_cache wrapper)
        found = []
    wrapped = getattr(found[0][0] if found else value, "__wrapped__", None)
    if wrapped is None:
        return found
    leading, bound = (found[0][1], found[0][2]) if found else ((), {})
    return found + [(inner, (*args, *leading), {**keywords, **bound}) for inner, args, keywords in _targets(wrapped)]


_MISSING = object()


def _value_of(fn: types.FunctionType, name: str, known: dict[str, Any]) -> Any:
    """The value ``name`` has in ``fn``: a known parameter's, a closure cell's or a
    global's; `_MISSING` for another local or an empty cell."""
    code = fn.__code__
    if name in known:
        return known[name]
    if name in code.co_freevars:
        try:
            return fn.__closure__[code.co_freevars.index(name)].cell_contents
        except ValueError:      # an empty cell: not bound yet
            return _MISSING
    if name in code.co_varnames or name in code.co_cellvars:
        return _MISSING
    return fn.__globals__.get(name, _MISSING)


def _listed_parameters(code: types.CodeType, positions: tuple[int, ...], keywords: tuple[str, ...]) -> frozenset[str]:
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return frozenset([names[i] for i in positions if i < code.co_argcount] + [k for k in keywords if k in names])


_Call = tuple[int, tuple, tuple, tuple[int, ...], tuple[str, ...], "tuple[int, tuple[str, ...]] | None",
              "tuple[tuple[int, ...], tuple[str, ...]] | None"]
"""A call: its line, its callee as written and as resolved (`_dotted`), the positions and
the keywords given a neighbour list, what it passes (`_passed`), and -- where it is made
once per neighbour (in a loop or comprehension over a neighbour list), else None -- the
positions and keywords given an object every neighbour's call shares (`_made_outside`)."""


@functools.lru_cache(maxsize=1024)
def _analysis(code: types.CodeType, given: frozenset[str], listing: frozenset[str]
              ) -> tuple[tuple[tuple[int, str], ...], tuple[_Call, ...], bool]:
    """(the lines of ``code`` that count neighbours, with their messages; the calls it
    makes by a name or its attributes (`_Call`); whether it returns a neighbour list).
    ``listing``: the functions it calls that return one, as called (`_spelled`)."""
    try:
        tree, first = _source(code)
    except (OSError, TypeError, SyntaxError):   # no source (exec'd code)
        # these checks read syntax: without it a count, a position or a running total over
        # the neighbours passed unseen and the trace's one-neighbour value came back as the
        # result (enumerate weights all 0, ``n += 1`` 1 for every vertex)
        reads = bool(given) or _names_neighbour_lists(code)
        return ((code.co_firstlineno, _NO_SOURCE.format(name=code.co_qualname)),) if reads else (), (), False
    lists = _names_of_neighbour_lists(tree, given, listing)
    per_neighbour = _per_neighbour_nodes(tree, lists)
    fresh = _bound_per_neighbour(tree, lists)
    found = _counting_lines(tree, lists) + [(line, _HELPER_STATE)
                                            for line in _stateful_local_calls(tree, per_neighbour, fresh)]
    aliases = _aliases(tree)
    calls = tuple((node.lineno + first - 1, written, aliases.get(written[0], written[:1]) + written[1:],
                   *_arguments_where(node, lambda arg: _passes_neighbours(arg, lists)), _passed(node),
                   _arguments_where(node, lambda arg: _made_outside(arg, fresh)) if id(node) in per_neighbour
                   else None)
                  for node in ast.walk(tree) if isinstance(node, ast.Call) and (written := _dotted(node.func)))
    returns = any(isinstance(node, ast.Return) and node.value is not None and _built_from_neighbours(node.value, lists)
                  for node in ast.walk(tree)) or (
        code.co_name == "<lambda>" and any(_built_from_neighbours(node.value.body, lists) for node in tree.body))
    return tuple(sorted(set((line + first - 1, message) for line, message in found))), calls, returns


def _source(code: types.CodeType) -> tuple[ast.Module, int]:
    """The syntax of ``code`` and the file line its first line is. A lambda's is the
    lambda alone, found in its file by line and parameters: the lines `inspect` gives for
    one may be part of an expression (``HELPERS = {...,`` then ``"g": lambda xs: xs}``)
    that does not parse, or hold other code."""
    if code.co_name != "<lambda>":
        lines, first = inspect.getsourcelines(code)
        return ast.parse(textwrap.dedent("".join(lines))), first
    lines = linecache.getlines(code.co_filename)
    if not lines:
        raise OSError(f"no source for {code.co_filename}")
    module = ast.parse("".join(lines))
    params = list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    return ast.Module(body=[ast.Expr(n) for n in ast.walk(module) if isinstance(n, ast.Lambda)
                            and n.lineno == code.co_firstlineno and _parameters(n) == params], type_ignores=[]), 1


def _names_neighbour_lists(code: types.CodeType) -> bool:
    """Whether ``code`` or a function, lambda or comprehension defined in it reads an
    attribute ``innbs`` or ``inedges`` (a vertex's neighbour lists)."""
    return bool({"innbs", "inedges"} & set(code.co_names)) or any(
        _names_neighbour_lists(const) for const in code.co_consts if isinstance(const, types.CodeType))


def _parameters(definition: ast.FunctionDef | ast.Lambda) -> list[str]:
    """The names of a definition's parameters, positional first, then keyword-only."""
    arguments = definition.args
    return [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]


def _dotted(func: ast.expr) -> tuple:
    """The callee ``func`` as a path `_resolve` looks up: a root -- a name, ``("super",)``
    for ``super()``, ``("type", name)`` for ``type(name)``, ``("new", name)`` for a call
    of ``name`` whose result's attribute is called (``Helper().f``) -- then attributes (``.f``,
    ``getattr(x, "f")``) and constant items (``("item", "f")`` for ``["f"]``). Empty for
    another callee."""
    steps: list = []
    while True:
        if isinstance(func, ast.Attribute):
            steps.append(func.attr)
            func = func.value
        elif isinstance(func, ast.Subscript) and isinstance(func.slice, ast.Constant):
            steps.append(("item", func.slice.value))
            func = func.value
        elif _called_name(getattr(func, "func", None)) == "getattr" and len(func.args) == 2 and not func.keywords \
                and isinstance(func.args[1], ast.Constant) and isinstance(func.args[1].value, str):
            steps.append(func.args[1].value)
            func = func.args[0]
        else:
            break
    if isinstance(func, ast.Name):
        root = func.id
    elif isinstance(func, ast.Call) and _called_name(func.func) == "super" and not func.args:
        root = ("super",)
    elif (isinstance(func, ast.Call) and _called_name(func.func) == "type" and len(func.args) == 1
          and isinstance(func.args[0], ast.Name)):
        root = ("type", func.args[0].id)
    elif isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and steps:
        root = ("new", func.func.id)
    else:
        return ()
    return (root, *reversed(steps))


def _spelled(path: tuple) -> str:
    """``path`` as a key of the names holding neighbour lists, never an identifier."""
    return repr(path)


def _passed(call: ast.Call) -> tuple[int, tuple[str, ...]] | None:
    """How many positional arguments ``call`` gives and which keywords; None where
    ``*args`` or ``**kwargs`` hides that."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    return len(call.args), tuple(k.arg for k in call.keywords)


def _aliases(tree: ast.AST) -> dict[str, tuple[str, ...]]:
    """Local names bound once, to a name or its attributes (``f = self.first_two``) or a
    new instance (`_instance`): a call of ``f`` runs what that path names, so it is
    followed as that path."""
    stores: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            stores.setdefault(node.id, []).append(node)
    return {node.targets[0].id: path for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and len(stores[node.targets[0].id]) == 1 and (path := _dotted(node.value) or _instance(node.value))}


def _instance(value: ast.expr) -> tuple:
    """``(("new", "Helper"),)`` for ``Helper(...)``: a local bound to a new instance
    (``h = Helper()``), whose methods `_resolve` finds on the class."""
    return (("new", value.func.id),) if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else ()


def _arguments_where(call: ast.Call, test: Callable[[ast.expr], bool]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The positions (up to a ``*args``, after which they are not known) and the keywords
    at which ``call`` passes an argument that passes ``test``."""
    positions = []
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):        # later positions are not known
            break
        if test(arg):
            positions.append(i)
    return tuple(positions), tuple(k.arg for k in call.keywords if k.arg and test(k.value))


def _given_parameters(definition: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, call: ast.Call,
                      test: Callable[[ast.expr], bool]) -> list[str]:
    """The parameters of ``definition`` to which ``call`` passes an argument that passes
    ``test`` (`_arguments_where`), by position or by keyword."""
    arguments = definition.args
    positional = [a.arg for a in arguments.posonlyargs + arguments.args]
    positions, keywords = _arguments_where(call, test)
    return [positional[i] for i in positions if i < len(positional)] + list(keywords)


def _passes_neighbours(expr: ast.expr, lists: set[str]) -> bool:
    """An argument that hands a helper a neighbour list (a generator over one included)."""
    return _built_from_neighbours(expr, lists) or (
        isinstance(expr, ast.GeneratorExp) and any(_walks_neighbours(g.iter, lists) for g in expr.generators))


def _counting_lines(tree: ast.AST, lists: set[str]) -> list[tuple[int, str]]:
    found = []
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    degrees, fixed = _degree_names(tree, lists), _constant_names(tree, parents)
    several = _several_per_neighbour(tree, lists)
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and _walks_neighbours(node.iter, lists):
            derived, rebound = _per_neighbour_names(node)
            items = _item_aliases(node, _neighbour_items(node.target, node.iter))
            found += [(n.lineno, IDENTITY) for stmt in node.body for n in ast.walk(stmt)
                      if _compares_vertices(n, items)]
            found += [(n.lineno, _LOOP) for stmt in node.body for n in ast.walk(stmt)
                      if _accumulates(n, derived, rebound)]
            found += [(n.lineno, _STOPS) for n in _statements(node.body) if isinstance(n, (ast.Break, ast.Return))]
            found += [(n.lineno, _PAIRS) for stmt in node.body for n in ast.walk(stmt)
                      if _iterates_neighbours(n, lists) and _reads(n, derived)]
            found += [(n.lineno, message) for stmt in node.body for n in ast.walk(stmt)
                      for message in _fills(n, derived)]
            found += [(n.lineno, _INNER) for stmt in node.body for n in ast.walk(stmt) if _inner_reduction(n, derived, lists)]
            found += [(line, _LAST) for line in _read_after(node, derived, tree, parents)]
            found += [(line, _CARRIED) for line in _carried(node, derived)]
            found += [(n.lineno, _STATEFUL) for stmt in node.body for n in ast.walk(stmt) if _steps_outside(n, node)]
            found += [(line, _LATE) for line in _late_bound(list(_own_scope(node.body)), derived, node, tree, parents)]
        elif _is_comprehension(node) and any(_walks_neighbours(g.iter, lists) for g in node.generators):
            outer = set().union(*(_names(g.target) for g in node.generators))
            items = set().union(*(_neighbour_items(g.target, g.iter) for g in node.generators))
            found += [(n.lineno, IDENTITY) for part in _comprehension_body(node) for n in ast.walk(part)
                      if _compares_vertices(n, items)]
            if hasattr(node, "elt") and not _reads(node.elt, outer):      # 1, ONE, -1, v.h: one per neighbour
                found.append((node.lineno, _CONSTANTS))
            inner = [n for part in _comprehension_body(node) for n in ast.walk(part)
                     if _iterates_neighbours(n, lists) and _reads(n, outer)]
            if sum(_walks_neighbours(g.iter, lists) for g in node.generators) > 1 or inner:
                found.append((node.lineno, _PAIRS))
            found += [(n.lineno, _LOOP) for part in _comprehension_body(node) for n in ast.walk(part)
                      if isinstance(n, ast.NamedExpr) and _accumulates(n, outer, set())]
            found += [(n.lineno, _INNER) for part in _comprehension_body(node) for n in ast.walk(part)
                      if _inner_reduction(n, outer, lists)]
            walrus = {n.target.id for part in _comprehension_body(node) for n in ast.walk(part)
                      if isinstance(n, ast.NamedExpr) and _reads(n.value, outer)}
            found += [(line, _LAST) for line in _read_after(node, walrus, tree, parents)]
            found += [(n.lineno, _CARRIED) for part in _comprehension_body(node) for n in ast.walk(part)
                      if _carries(n, outer)]
            found += [(n.lineno, message) for part in _comprehension_body(node) for n in ast.walk(part)
                      for message in _fills(n, outer)]
            found += [(n.lineno, _STATEFUL) for part in _comprehension_body(node) for n in ast.walk(part)
                      if _steps_outside(n, node)]
            found += [(line, _LATE) for line in _late_bound(
                [n for part in _comprehension_body(node) for n in ast.walk(part)], outer, node, tree, parents)]
        elif isinstance(node, ast.Call) and any(_passes_neighbours(a, lists) for a in node.args):
            name = _called_name(node.func)
            if name == "enumerate" and _positions_only_index(node, parents, lists):
                pass        # i only picks the same neighbour's item of another list: traced per neighbour
            elif name in _ONE_PASS_CALLS:
                found.append((node.lineno, _ONE_PASS_CALLS[name]))
        elif isinstance(node, ast.Subscript) and _fixed_position(node.slice, fixed) \
                and _built_from_neighbours(node.value, lists):
            found.append((node.lineno, _SLICED))       # v.innbs[0] included: the first neighbour, not traced
        elif isinstance(node, ast.Assign) and any(isinstance(t, (ast.Tuple, ast.List)) for t in node.targets) \
                and _built_from_neighbours(node.value, lists):
            found.append((node.lineno, _SLICED))       # first, *rest = nb: a position
        elif isinstance(node, ast.Starred) and _built_from_neighbours(node.value, lists):
            found.append((node.lineno, _SPREAD))
        elif _packs_neighbours(node, lists, parents):
            found.append((node.lineno, _CONTAINED))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _REORDERING
                and _built_from_neighbours(node.func.value, lists)):
            found.append((node.lineno, _REORDERS))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__getitem__"
                and (_built_from_neighbours(node.func.value, lists)
                     or (node.args and _built_from_neighbours(node.args[0], lists)))):
            found.append((node.lineno, _SLICED))       # nb.__getitem__(0), list.__getitem__(nb, 0): nb[0]
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and (isinstance(node.value, ast.Name) and node.value.id in several
                     or _several_items(node.value, lists))):
            found.append((node.lineno, _SEVERAL))      # hs[i] of 2 x deg items: not the i-th neighbour's
        if _degree_as_a_number(node, lists, parents, degrees):
            found.append((node.lineno, _DEGREE_NUMBER))
        if (isinstance(node, (ast.For, ast.comprehension)) and _over_degree_range(node.iter, lists, degrees)
                and not _positions_only_index(node.iter, parents, lists, whole_target=True)):
            found.append((getattr(node, "lineno", node.iter.lineno), _POSITIONS))
        for test in _truth_tests(node):
            if _built_from_neighbours(test, lists):
                found.append((test.lineno, _TRUTH))
        if isinstance(node, ast.Match) and _built_from_neighbours(node.subject, lists):
            found.append((node.lineno, _MATCHED))
    return found


def _neighbour_items(target: ast.expr, iterated: ast.expr) -> set[str]:
    """The names a loop binds to a neighbour or in-edge: its target's, less the position
    ``enumerate`` pairs them with (``j == 0`` compares a number, refused as a position, not
    as a neighbour compared with a vertex)."""
    if (isinstance(iterated, ast.Call) and _called_name(iterated.func) == "enumerate"
            and isinstance(target, ast.Tuple) and target.elts):
        return _names(target) - _names(target.elts[0])
    return _names(target)


def _item_aliases(loop: ast.For, items: set[str]) -> set[str]:
    """``items`` and the names the loop's body binds to one of them or its ``src`` / ``dst``
    (``w = u``, ``s = e.src``): comparing those with ``v`` compares the neighbour too."""
    found = set(items)
    for node in _own_scope(loop.body):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Attribute) and value.attr in ("src", "dst"):
                value = value.value
            if isinstance(value, ast.Name) and value.id in found:
                found.add(node.targets[0].id)
    return found


def _compares_vertices(node: ast.AST, items: set[str]) -> bool:
    """``u is v``, ``u is not v``, ``e.src == e.dst``: a comparison, by identity or
    equality, of a loop's neighbour item (``u``, ``e``, ``e.src``, ``e.dst``) with anything
    but None. The loop runs once, for one symbolic neighbour, so Python answers it for
    every edge alike (``u is not v`` kept every self loop); ``==`` and ``!=`` the proxies
    refuse while tracing, wherever written, but ``is`` cannot be intercepted."""
    if not isinstance(node, ast.Compare) or not any(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq))
                                                    for op in node.ops):
        return False
    operands = [node.left, *node.comparators]
    if any(isinstance(o, ast.Constant) and o.value is None for o in operands):
        return False
    # id(u) != id(v) asks the same as u is not v
    operands = [o.args[0] if isinstance(o, ast.Call) and _called_name(o.func) == "id" and len(o.args) == 1 else o
                for o in operands]
    return any((isinstance(o, ast.Name) and o.id in items) or (
        isinstance(o, ast.Attribute) and o.attr in ("src", "dst") and isinstance(o.value, ast.Name)
        and o.value.id in items) for o in operands)


def _packs_neighbours(node: ast.AST, lists: set[str], parents: dict[ast.AST, ast.AST]) -> bool:
    """A tuple, list, set or dict display holding a neighbour list as an item (``pair =
    (hs, 2)``, ``helper((hs, 2))``, ``return hs, 2``): what is done with the list inside
    is not followed (``pair[0][:2]`` slices it), so it is refused; a display unpacked
    where it is written (``hs, k = [...], 2``) binds the list to a name, which is."""
    if isinstance(node, ast.Dict):
        items = [*node.keys, *node.values]
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and not isinstance(getattr(node, "ctx", None), ast.Store):
        items = node.elts
    else:
        return False
    owner = parents.get(node)
    if isinstance(owner, ast.Assign) and owner.value is node and all(
            all(item is not None for _, item in _bound_items(t, node)) for t in owner.targets):
        return False
    return any(item is not None and _built_from_neighbours(item, lists) for item in items)


def _walks_neighbours(expr: ast.expr, lists: set[str]) -> bool:
    """Whether iterating ``expr`` walks a neighbour list: it names ``v.innbs`` /
    ``v.inedges`` or a name holding a list built from one (``for x in hs``,
    ``zip(a, v.innbs)``, ``range(len(v.innbs))``)."""
    return any((isinstance(n, ast.Attribute) and n.attr in NEIGHBOUR_LISTS) or (isinstance(n, ast.Name) and n.id in lists)
               for n in ast.walk(expr))


def _is_neighbour_list(expr: ast.expr) -> bool:
    """``v.innbs`` / ``v.inedges`` itself, also spelled ``getattr(v, "innbs")``."""
    if isinstance(expr, ast.Call) and _called_name(expr.func) == "getattr" and len(expr.args) >= 2:
        name = expr.args[1]
        return isinstance(name, ast.Constant) and name.value in NEIGHBOUR_LISTS
    return isinstance(expr, ast.Attribute) and expr.attr in NEIGHBOUR_LISTS


def _is_comprehension(node: ast.AST) -> bool:
    return isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp))


def _comprehension_body(node: ast.AST) -> list[ast.AST]:
    """What a comprehension computes per element: its element (key and value) and conditions."""
    parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    return parts + [cond for g in node.generators for cond in g.ifs]


def _iterates_neighbours(node: ast.AST, lists: set[str]) -> bool:
    """A loop or comprehension over a neighbour list."""
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return _walks_neighbours(node.iter, lists)
    return _is_comprehension(node) and any(_walks_neighbours(g.iter, lists) for g in node.generators)


def _statements(body: list[ast.stmt]):
    """The statements of a loop body, into its ifs, withs and trys but not into nested
    loops (whose ``break`` is theirs) or function definitions."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef, ast.Lambda)):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list):
                yield from _statements([s for s in inner if isinstance(s, ast.stmt)] +
                                       [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])


def _names(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _reads(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` reads one of ``names`` (an inner loop that pairs with the outer
    neighbour; one that does not, ``sum([exp(w.s) for w in v.innbs])`` inside a loop over
    ``u``, is a per-vertex aggregate, traced once, as eager code computes it per ``u``)."""
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _per_neighbour_names(loop: ast.For) -> tuple[set[str], set[str]]:
    """(names holding per-neighbour values in the loop's body: its targets and what is
    assigned from them, in order; names the body assigns afresh, ``m = u.h @ W``)."""
    derived, rebound = _names(loop.target), set()
    for stmt in _statements(loop.body):
        if isinstance(stmt, ast.Assign):
            targets = set().union(*(_names(t) for t in stmt.targets))
            if _reads(stmt.value, derived):
                derived |= targets
            if not (isinstance(stmt.value, ast.BinOp) and _reads(stmt.value.left, targets)):
                rebound |= targets
    # the same values kept other ways, also in a loop nested in this one (which
    # `_statements` leaves out for break's sake): ``last: T = u.h``, ``(last := u.h)``,
    # ``for last in [u.h]``, a running total ``acc += u.h`` (``st["s"] += u.h``, ``st.t +=
    # u.h``) or ``acc.add_(u.h)``, a container or object written by a call (``box.update(s=u.h)``,
    # ``setattr(b, "s", u.h)``); ``hs += [m]`` fills a list, as ``hs.append(m)``
    for node in _own_scope(loop.body):
        written: set[str] = set()
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None \
                and _reads(node.value, derived):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            written = {_base_name(t) for t in targets} | set().union(*(_names(t) for t in targets))
        elif isinstance(node, ast.For) and _reads(node.iter, derived):
            written = _names(node.target)
        elif isinstance(node, ast.AugAssign) and not _fill_assign(node) and _reads(node.value, derived):
            written = {_base_name(node.target)}
        elif isinstance(node, ast.Expr):
            written = {_written_in_place(node.value, derived), _written_by_call(node.value, derived)}
        derived |= written - {None}
    return derived, rebound


def _written_by_call(call: ast.expr, derived: set[str]) -> str | None:
    """The name a call stores a per-neighbour value into: ``box.update(s=u.h)``,
    ``box.__setitem__("s", u.h)``, ``box.setdefault(k, u.h)``, ``setattr(b, "s", u.h)``."""
    if not isinstance(call, ast.Call) or not any(
            _reads(a, derived) for a in (*call.args, *(k.value for k in call.keywords))):
        return None
    if isinstance(call.func, ast.Attribute) and call.func.attr in ("update", "__setitem__", "setdefault", "add"):
        return _base_name(call.func.value)
    if _called_name(call.func) == "setattr" and call.args:
        return _base_name(call.args[0])
    return None


def _written_in_place(call: ast.expr, derived: set[str]) -> str | None:
    """The name an in-place method chain writes with a per-neighbour value (``acc.add_(u.h)``,
    ``h.mul_(0.5).add_(u.h)``), or None."""
    reads = False
    while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
        method = call.func.attr
        if not (method.endswith("_") and not method.startswith("_")):
            return None
        reads = reads or any(_reads(a, derived) for a in (*call.args, *(k.value for k in call.keywords)))
        call = call.func.value
    return call.id if reads and isinstance(call, ast.Name) else None


def _accumulates(node: ast.AST, derived: set[str], rebound: set[str]) -> bool:
    """``n += c``, ``n = n + c`` or ``(n := n + c)`` on a name carried across iterations,
    where ``c`` holds nothing per neighbour: per neighbour in eager code, once at trace
    time. A name the body assigns afresh first (``m = u.h @ W; m = m + b``) carries
    nothing across."""
    if isinstance(node, ast.NamedExpr):
        value, name = node.value, node.target.id
        return (isinstance(value, ast.BinOp) and isinstance(value.left, ast.Name) and value.left.id == name
                and not _reads(value.right, derived))
    if isinstance(node, ast.AugAssign):
        target = node.target
        return isinstance(target, ast.Name) and target.id not in rebound and not _reads(node.value, derived)
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        value, name = node.value, node.targets[0].id
        return (isinstance(value, ast.BinOp) and isinstance(value.left, ast.Name) and value.left.id == name
                and name not in rebound and not _reads(value.right, derived))
    return False


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _names_of_neighbour_lists(tree: ast.AST, given: frozenset[str], listing: frozenset[str]) -> set[str]:
    """Names holding a list built from a neighbour list: ``given`` (a helper's parameters
    passed one), and names only ever assigned one (``nb = [u.h for u in v.innbs]``, ``nbs
    = v.innbs``, ``hs = [f(x) for x in nbs]``) or an empty list that a loop over one fills
    (``msgs = []``, then ``msgs.append(m)`` in the loop); a name also bound to something
    else (``h = sum(h)``) is not followed. Aliases chain, so this runs to a fixed point.
    ``listing`` names the helpers that return such a list, as `_built_from_neighbours`
    reads a call of one; a function defined inside the checked one is followed the same
    way, its parameters given a list and its name if it returns one."""
    lists = set(given) | listing
    local = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    local.update({n.targets[0].id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Lambda)})
    while True:
        assigned, filled = {name: True for name in given}, set(_local_lists(tree, local, lists))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.List) \
                        and not node.value.elts:
                    continue        # msgs = []: a list only what fills it makes
                if _fill_assign(node):
                    continue        # msgs += [m]: filling, as msgs.append(m)
                listed = isinstance(node, (ast.Assign, ast.NamedExpr, ast.AnnAssign)) and node.value is not None \
                    and _built_from_neighbours(node.value, lists)
                for target in targets:      # first, *rest = nb binds items, not the list; nb[0] = x binds none
                    for name, item in _bound_items(target, node.value):
                        listed_here = listed if item is None else _built_from_neighbours(item, lists)
                        assigned[name] = assigned.get(name, True) and listed_here and (
                            isinstance(target, ast.Name) or item is not None)
            elif isinstance(node, ast.For) and _walks_neighbours(node.iter, lists):
                filled |= {n.func.value.id for stmt in node.body for n in ast.walk(stmt) if _fill_call(n)}
                filled |= {n.target.id for stmt in node.body for n in ast.walk(stmt) if _fill_assign(n)}
        found = {name for name, listed in assigned.items() if listed} | {n for n in filled if assigned.get(n, True)}
        if found <= lists:
            return lists
        lists |= found


def _local_lists(tree: ast.AST, local: dict[str, ast.FunctionDef | ast.Lambda], lists: set[str]):
    """The parameters of functions defined in ``tree`` (a ``def``, a lambda bound to a
    name or called where it is written) that a call of theirs hands a neighbour list, and
    the names of those that return one."""
    for name, definition in local.items():
        if isinstance(definition, ast.Lambda):
            if _built_from_neighbours(definition.body, lists):
                yield name
        elif any(isinstance(n, ast.Return) and n.value is not None and _built_from_neighbours(n.value, lists)
                 for n in ast.walk(definition)):
            yield name
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        if isinstance(call.func, ast.Lambda):
            definition = call.func
        elif isinstance(call.func, ast.Name) and call.func.id in local:
            definition = local[call.func.id]
        else:
            continue
        yield from _given_parameters(definition, call, lambda arg: _passes_neighbours(arg, lists))


def _bound_items(target: ast.expr, value: ast.expr | None, inner: bool = False
                 ) -> list[tuple[str, ast.expr | None]]:
    """The names an assignment of ``value`` to ``target`` binds, each with the item of a
    tuple or list display it takes (``hs, k = [u.h for u in v.innbs], 2`` binds ``hs`` to
    the list), or None where that is not written out."""
    if (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts)
            and not any(isinstance(x, ast.Starred) for x in (*target.elts, *value.elts))):
        return [pair for t, item in zip(target.elts, value.elts) for pair in _bound_items(t, item, True)]
    if inner and isinstance(target, ast.Name):
        return [(target.id, value)]
    return [(name, None) for name in _bound_names(target)]


def _bound_names(target: ast.expr) -> set[str]:
    """The names an assignment to ``target`` binds (``a``, ``a, *b``; not ``a[0]`` or ``a.x``)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound_names(t) for t in target.elts))
    return _bound_names(target.value) if isinstance(target, ast.Starred) else set()


def _fill_assign(node: ast.AST) -> bool:
    """``name += [x]`` (or a tuple display): a list filled as ``name.append(x)`` fills it."""
    return (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.target, ast.Name)
            and isinstance(node.value, (ast.List, ast.Tuple)))


def _fill_call(node: ast.AST) -> bool:
    """``name.append(x)``, ``name.extend(xs)`` or ``name.insert(i, x)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "insert") and isinstance(node.func.value, ast.Name))


def _fills(node: ast.AST, derived: set[str]) -> list[str]:
    """What is wrong with filling a list in a loop over a neighbour list: appending
    something that does not come from the neighbour counts (one item at trace time, one
    per neighbour in eager code); ``extend`` adds an unknown number per neighbour and
    ``insert`` puts them in another order than the neighbours'."""
    if not _fill_call(node):
        return []
    if node.func.attr != "append":
        return [_FILLS]
    return [] if node.args and _reads(node.args[0], derived) else [_LOOP]


def _read_after(scope: ast.AST, names: set[str], tree: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[int]:
    """Lines reading, after ``scope`` (a loop or comprehension over the neighbours), a name
    it bound to a per-neighbour value (``u``, ``m = u.h @ W``, ``(y := u.h)``): eager code
    reads the last neighbour's, the trace its one symbolic neighbour. A loop's ``else:``
    block runs after its last pass too. A name bound again after the scope (another
    loop's ``u``) is not followed."""
    end = (scope.end_lineno, scope.end_col_offset)
    orelse = [n for stmt in getattr(scope, "orelse", []) for n in ast.walk(stmt) if isinstance(n, ast.Name)]
    after = orelse + [n for n in ast.walk(tree) if isinstance(n, ast.Name) and (n.lineno, n.col_offset) > end]
    again = {n.id for n in after if not isinstance(n.ctx, ast.Load)}
    return [n.lineno for n in after if isinstance(n.ctx, ast.Load) and n.id in names - again] + \
        _closure_reads(scope, names, tree, parents)


def _closure_reads(scope: ast.AST, names: set[str], tree: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[int]:
    """Lines of a function or lambda defined outside ``scope`` (before the loop: ``def
    msg(): return u.h``) that reads one of ``names`` from the enclosing function: called
    after the loop it has the last neighbour's value in eager code (called in it, it reads
    nothing per neighbour the loop's checks see, and a per-neighbour result is refused as
    a count)."""
    inside = {id(n) for n in ast.walk(scope)}
    outermost = {id(n) for n in getattr(tree, "body", [])}
    lines = []
    for function in ast.walk(tree):
        if (not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or id(function) in inside
                or id(function) in outermost or id(scope) in {id(n) for n in ast.walk(function)}):
            continue
        own = {a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs,
                               *filter(None, (function.args.vararg, function.args.kwarg)))}
        body = function.body if isinstance(function.body, list) else [function.body]
        own |= {n.id for part in body for n in ast.walk(part)
                if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        outer = parents.get(function)
        while outer is not None:        # a loop or comprehension around it binds the name: its own
            if _is_comprehension(outer):
                own |= set().union(*(_names(g.target) for g in outer.generators))
            elif isinstance(outer, ast.For):
                own |= _names(outer.target)
            outer = parents.get(outer)
        lines += [n.lineno for part in body for n in ast.walk(part)
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names - own]
    return lines


def _carried(loop: ast.For, derived: set[str]) -> list[int]:
    """Lines of a loop over the neighbours that use a value an earlier iteration left in a
    name, or in a container's item or an attribute (``st["a"]``, ``box.a``): a running total
    appended (``acc = acc + u.h; hs.append(acc)``), the previous neighbour's value (``hs.append(
    u.h - prev); prev = u.h``), a walrus carrying one. Eager code reads the earlier neighbours'
    values there, the trace -- one pass of the body -- the value from before the loop. The
    carrying assignment itself (``acc = acc + u.h``) is no such use: read after the loop,
    `_read_after` refuses it, and a count is `_accumulates`'."""
    parents = {child: parent for parent in ast.walk(loop) for child in ast.iter_child_nodes(parent)}
    writes: dict[str, list[tuple[tuple[int, int], ast.AST]]] = {}
    reads: list[tuple[str, tuple[int, int], ast.AST]] = []
    for node in _own_scope(loop.body):
        if isinstance(node, ast.NamedExpr):
            writes.setdefault(node.target.id, []).append(((node.end_lineno, node.end_col_offset), node))
        elif isinstance(node, (ast.Name, ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            writer, base = _statement_of(node, parents), _base_name(node)
            if base is not None and not isinstance(parents.get(node), (ast.comprehension, ast.NamedExpr)):
                writes.setdefault(base, []).append(((writer.end_lineno, writer.end_col_offset), writer))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and not _written_place(node, parents):
            reads.append((node.id, (node.lineno, node.col_offset), node))
        if isinstance(node, ast.AugAssign) and _base_name(node.target) is not None:    # reads the old value
            reads.append((_base_name(node.target), (node.target.lineno, node.target.col_offset), node.target))
    carried = {name for name, at, _ in reads if name in writes and at < min(p for p, _ in writes[name])}
    lines = []
    for name, _, node in reads:
        writers = {id(w) for _, w in writes.get(name, [])}
        chain = [node]
        while chain[-1] in parents and chain[-1] is not loop:
            chain.append(parents[chain[-1]])
        if name in carried and not any(id(a) in writers and not isinstance(a, ast.NamedExpr) for a in chain):
            lines.append(node.lineno)
    return lines + [n.lineno for n in _own_scope(loop.body) if _carries(n, derived)]


def _late_bound(nodes: list[ast.AST], names: set[str], scope: ast.AST, tree: ast.AST,
                parents: dict[ast.AST, ast.AST]) -> list[int]:
    """Lines of a function or lambda defined among ``nodes`` (the body of ``scope``, a loop
    or comprehension over the neighbours) that reads one of ``names`` (per-neighbour values)
    as a free variable and is kept to be called later (``fs = [lambda: u.h for u in
    v.innbs]``, ``fs.append(f)``): Python looks the name up when it is called, after the
    loop, so eager code gives every such function the last neighbour's value, the trace its
    one symbolic neighbour. One called where it is made -- ``(lambda: u.h)()``, a lambda
    passed to a call other than ``append``/``extend``/``insert``, a ``def`` only called
    inside the loop -- and one taking the value as a default (``lambda u=u: u.h``) read the
    current neighbour, as the trace does."""
    lines = []
    end = (scope.end_lineno, scope.end_col_offset)
    for node in nodes:
        if not isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        free = names - {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                                        *filter(None, (node.args.vararg, node.args.kwarg)))}
        if not any(_reads(part, free) for part in (node.body if isinstance(node.body, list) else [node.body])):
            continue
        user = parents.get(node)
        if isinstance(node, ast.Lambda):
            if isinstance(user, ast.Call) and (user.func is node or (node in user.args and not _fill_call(user))):
                continue
        else:
            uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == node.name
                    and isinstance(n.ctx, ast.Load)]
            if all(isinstance(parents.get(n), ast.Call) and parents[n].func is n and (n.lineno, n.col_offset) < end
                   for n in uses):
                continue
        lines.append(node.lineno)
    return lines


def _carries(node: ast.AST, derived: set[str]) -> bool:
    """A walrus that reads its own target, ``(acc := acc + u.h)``: its value is a running
    one (a count, ``(n := n + 1)``, is `_accumulates`')."""
    return (isinstance(node, ast.NamedExpr) and _reads(node.value, {node.target.id})
            and not _accumulates(node, derived, set()))


def _own_scope(body: list[ast.stmt]):
    """The nodes of ``body``, not into the functions, lambdas and classes it defines (their
    names are theirs)."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _statement_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST:
    while not isinstance(node, ast.stmt) and node in parents:
        node = parents[node]
    return node


def _base_name(node: ast.expr) -> str | None:
    """``st`` of ``st``, ``st["a"]``, ``st.a[0]``: the name whose value a store writes."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _written_place(node: ast.Name, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` is the container an item or attribute store writes into (``st`` in
    ``st["a"] = x``), which the store does not read."""
    child, parent = node, parents.get(node)
    while isinstance(parent, (ast.Subscript, ast.Attribute)) and parent.value is child:
        if isinstance(parent.ctx, ast.Store):
            return True
        child, parent = parent, parents.get(parent)
    return False


def _per_neighbour_nodes(tree: ast.AST, lists: set[str]) -> set[int]:
    """The ids of the nodes in the bodies of the loops and comprehensions over a neighbour
    list: what runs once per neighbour in eager code, once at trace time."""
    return {id(n) for node in ast.walk(tree) if _iterates_neighbours(node, lists)
            for part in (node.body if isinstance(node, (ast.For, ast.AsyncFor)) else _comprehension_body(node))
            for n in ast.walk(part)}


def _stateful_local_calls(tree: ast.AST, per_neighbour: set[int], fresh: set[str]) -> list[int]:
    """Lines calling, once per neighbour (``per_neighbour``: `_per_neighbour_nodes`), a
    function defined in the traced one that keeps state (`_keeps_state`: ``def bump(x):
    nonlocal n; n += 1``, or ``def push(acc, h): acc.append(h); return len(acc)`` given a
    list made before the loop: `_made_outside`, a name not ``fresh``): eager code
    changes it once per neighbour, the trace once. A helper defined elsewhere is
    `_found_in`'s."""
    local = {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = []
    for n in ast.walk(tree):
        if id(n) in per_neighbour and isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in local:
            definition = local[n.func.id]
            shared = frozenset(_given_parameters(definition, n, lambda arg: _made_outside(arg, fresh)))
            if _keeps_state(definition, shared=shared):
                found.append(n.lineno)
    return found


def _bound_per_neighbour(tree: ast.AST, lists: set[str]) -> set[str]:
    """The names bound in the loops and comprehensions over a neighbour list, their
    targets included: a fresh object each neighbour, where a name bound only outside
    holds one object every neighbour's pass shares."""
    return {n.id for node in ast.walk(tree) if _iterates_neighbours(node, lists)
            for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def _made_outside(arg: ast.expr, fresh: set[str]) -> bool:
    """Whether an argument of a per-neighbour call is an object made outside the loop (a
    name not ``fresh``, or its attribute or item: ``acc``, ``self.seen``), which a helper
    changing it carries from one neighbour's call to the next. ``[]`` or ``u.h`` written in
    the call is made anew each time."""
    name = _base_name(arg)
    return name is not None and name not in fresh


def _helper_keeps_state(code: types.CodeType, bound: int, shared: frozenset[str] = frozenset()) -> bool:
    """`_keeps_state` of a helper's definition whose first ``bound`` parameters are bound
    before the call (a method's ``self``, a partial's arguments) and whose parameters
    ``shared`` are given an object made outside the loop: those are state too; without
    source, its bytecode's writes to globals and closure variables."""
    try:
        tree, _ = _source(code)
    except (OSError, TypeError, SyntaxError):
        return bool(outside_writes(code))
    definition = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))),
                      None)
    return definition is not None and _keeps_state(definition, bound, shared)


# methods that change the list, dict or set they are called on
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard",
                       "setdefault", "popitem", "sort", "reverse"})


def _keeps_state(definition: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, bound: int = 0,
                 shared: frozenset[str] = frozenset()) -> bool:
    """Whether a function reads back state it changes that outlives its call -- a
    ``nonlocal`` or ``global`` name, or a container it neither takes per call nor makes (a
    closure's, a module's, among the first ``bound`` parameters, the object a method is
    bound to, or a parameter in ``shared``, given one object on every call): ``n += 1``,
    ``COUNT[0] += 1``, ``self.calls += 1``, ``seen.append(1)`` then ``len(seen)``. Only
    writing it -- ``msgs.append(m)`` filling a list with per-neighbour values, which the
    traced builtins aggregate as a neighbour list -- is no such state."""
    body = list(ast.walk(definition))
    parents = {child: parent for parent in body for child in ast.iter_child_nodes(parent)}
    declared = {name for n in body if isinstance(n, (ast.Nonlocal, ast.Global)) for name in n.names}
    local = ((set(_parameters(definition)[bound:]) - shared) | {n.id for n in body if isinstance(n, ast.Name)
                                                                and isinstance(n.ctx, ast.Store)}) - declared
    changed, read = set(), set()
    for node in body:
        if isinstance(node, ast.AugAssign) and _base_name(node.target) is not None:
            changed.add(_base_name(node.target))
            read.add(_base_name(node.target))
        elif isinstance(node, (ast.Name, ast.Subscript, ast.Attribute)) and isinstance(node.ctx, ast.Store):
            changed.add(_base_name(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            changed.add(_base_name(node.func.value))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and not _written_place(node, parents) \
                and not _mutated_receiver(node, parents):
            read.add(node.id)
    return bool((changed & read) - local - {None})


def _mutated_receiver(node: ast.Name, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` is what a mutating method is called on (``msgs`` in ``msgs.append(m)``)."""
    attribute = parents.get(node)
    call = parents.get(attribute)
    return (isinstance(attribute, ast.Attribute) and attribute.value is node and attribute.attr in _MUTATORS
            and isinstance(call, ast.Call) and call.func is attribute)


def _steps_outside(node: ast.AST, scope: ast.AST) -> bool:
    """``next(it)`` in a loop or comprehension over the neighbours, of an iterator made
    outside it (``itertools.count()``, ``iter(weights)``): eager code steps it once per
    neighbour, the trace once."""
    if not (isinstance(node, ast.Call) and _called_name(node.func) == "next" and node.args
            and isinstance(node.args[0], ast.Name)):
        return False
    name = node.args[0].id
    return not any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(scope))


def _inner_reduction(node: ast.AST, derived: set[str], lists: set[str]) -> bool:
    """``sum([u.h * k for k in ks])`` or ``max([a, b])`` in the per-neighbour part of a
    loop or comprehension over the neighbours: a Python reduction of each neighbour's own
    values, over a list that is not the neighbour list. Traced, a one-item list of them
    cannot be told from the neighbour list and would be aggregated over the neighbours."""
    if not (isinstance(node, ast.Call) and _called_name(node.func) in ("sum", "max", "min") and node.args):
        return False
    items = node.args[0]
    per_neighbour = isinstance(items, (ast.List, ast.Tuple, ast.Set)) or (
        _is_comprehension(items) and not any(_walks_neighbours(g.iter, lists) for g in items.generators))
    return per_neighbour and _reads(items, derived)


def _built_from_neighbours(expr: ast.expr, names: set[str]) -> bool:
    """A neighbour list, a list made from one (a comprehension over it, ``list(v.innbs)``),
    a name holding such a list or a call of a helper in ``names`` that returns one."""
    if _is_neighbour_list(expr) or (isinstance(expr, ast.Name) and expr.id in names):
        return True
    if isinstance(expr, ast.Call) and (_spelled(_dotted(expr.func)) in names or (      # hs = self.messages(v)
            isinstance(expr.func, ast.Name) and expr.func.id in names)):
        return True
    if _is_comprehension(expr) and not isinstance(expr, ast.GeneratorExp):
        return any(_walks_neighbours(g.iter, names) for g in expr.generators)
    if isinstance(expr, ast.Call) and _called_name(expr.func) == "zip":      # zip(v.innbs, v.inedges)
        return any(_built_from_neighbours(a, names) for a in expr.args)
    if isinstance(expr, ast.IfExp):     # hs = [u.h for u in v.innbs] if cond else []
        return _built_from_neighbours(expr.body, names) or _built_from_neighbours(expr.orelse, names)
    if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "copy"
            and not expr.args and _built_from_neighbours(expr.func.value, names)):
        return True                     # hs.copy()
    return (isinstance(expr, ast.Call) and _called_name(expr.func) in ("list", "tuple") and len(expr.args) == 1
            and (_built_from_neighbours(expr.args[0], names) or (     # list(u.h for u in v.innbs)
                isinstance(expr.args[0], ast.GeneratorExp)
                and any(_walks_neighbours(g.iter, names) for g in expr.args[0].generators))))


def _over_degree_range(expr: ast.expr, lists: set[str], degrees: set[str] = frozenset()) -> bool:
    """``range(len(v.innbs))``, or of a list built from it, or of a name only ever bound to
    one (`_degree_names`: ``d = len(v.innbs)``, then ``range(d)``)."""
    if not (isinstance(expr, ast.Call) and _called_name(expr.func) == "range" and len(expr.args) == 1):
        return False
    bound = expr.args[0]
    return _is_degree_call(bound, lists) or (isinstance(bound, ast.Name) and bound.id in degrees)


def _several_items(expr: ast.expr, lists: set[str]) -> bool:
    """A comprehension (or ``list``/``tuple`` of a generator) over the neighbours with a
    second ``for`` clause that is not a one-item display: ``[x for u in v.innbs for x in
    (u.h, u.h * 2)]`` holds several items per neighbour (the trace sees one pass)."""
    if isinstance(expr, ast.Call) and _called_name(expr.func) in ("list", "tuple") and len(expr.args) == 1:
        expr = expr.args[0]
    if not _is_comprehension(expr) or not any(_walks_neighbours(g.iter, lists) for g in expr.generators):
        return False
    return any(not (isinstance(g.iter, (ast.List, ast.Tuple)) and len(g.iter.elts) == 1
                    and not isinstance(g.iter.elts[0], ast.Starred))
               for g in expr.generators if not _walks_neighbours(g.iter, lists))


def _several_per_neighbour(tree: ast.AST, lists: set[str]) -> set[str]:
    """Names of lists holding more than one item per neighbour: assigned a comprehension
    `_several_items` accepts, or filled in a loop over the neighbours with more than one
    item a pass (two appends, ``hs += [a, b]``, an ``extend``, an append in an inner
    loop). In eager code such a list has k x in-degree items, so ``hs[i]`` with ``i``
    from ``enumerate(v.innbs)`` mixes neighbours; the trace's one pass cannot tell."""
    several = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and _walks_neighbours(node.iter, lists):
            several |= {name for name, count in _filled_per_pass(node.body).items() if count > 1}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None \
                and _several_items(node.value, lists):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            several |= {t.id for t in targets if isinstance(t, ast.Name)}
    return several


def _filled_per_pass(body: list[ast.stmt]) -> dict[str, int]:
    """How many items, at most, ``body`` (one pass of a loop) adds to each list it fills:
    an ``if``'s branches count apart (one append in each is one a pass); a fill in an
    inner loop or an ``extend`` counts as several."""
    counts: dict[str, int] = {}
    for stmt in body:
        if isinstance(stmt, ast.If):
            first, second = _filled_per_pass(stmt.body), _filled_per_pass(stmt.orelse)
            part = {name: max(first.get(name, 0), second.get(name, 0)) for name in first.keys() | second.keys()}
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            part = {name: 2 for name in _filled_per_pass(stmt.body + stmt.orelse)}
        else:
            part = {}
            for n in ast.walk(stmt):
                if _fill_call(n):
                    part[n.func.value.id] = part.get(n.func.value.id, 0) + (2 if n.func.attr == "extend" else 1)
                elif _fill_assign(n):
                    part[n.target.id] = part.get(n.target.id, 0) + len(n.value.elts)
        for name, count in part.items():
            counts[name] = counts.get(name, 0) + count
    return counts


def _positions_only_index(call: ast.Call, parents: dict[ast.AST, ast.AST], lists: set[str],
                          whole_target: bool = False) -> bool:
    """``for i, u in enumerate(v.innbs)`` or ``for i in range(len(v.innbs))`` (a loop or
    comprehension; ``whole_target``: the target is ``i`` itself) whose ``i`` is used only
    as a subscript of a list built from the neighbours, ``a[i]``: it lines up lists built
    from the same neighbours (their one traced item at trace time). Arithmetic on ``i``
    needs real positions, and so does a subscript of anything else -- a list or tensor of
    per-position weights ``W[i]``, a feature lane ``u.h[i]`` -- which the trace would read
    at position 0 for every neighbour."""
    owner = parents.get(call)
    if not isinstance(owner, (ast.For, ast.comprehension)) or owner.iter is not call:
        return False
    if not whole_target and (len(call.args) != 1 or call.keywords):     # enumerate(nb, 1): shifted positions
        return False
    target = owner.target
    if whole_target:
        if not isinstance(target, ast.Name):
            return False
        index = target.id
    elif not (isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name)):
        return False
    else:
        index = target.elts[0].id
    scope = parents.get(owner) if isinstance(owner, ast.comprehension) else owner
    uses = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == index and isinstance(n.ctx, ast.Load)]
    return all(isinstance(parents.get(n), ast.Subscript) and parents[n].slice is n
               and _built_from_neighbours(parents[n].value, lists) for n in uses)


# functions that take an int argument through ``__index__`` (a size, a position, a digit
# string), where the traced count is 1: operator.index(len(nb)), np.zeros(len(nb)), bin(...)
_TAKES_AN_INT = frozenset({"index", "bin", "hex", "oct", "chr", "zeros", "ones", "empty", "full", "arange",
                           "linspace", "eye", "tile", "repeat", "islice"})


def _degree_names(tree: ast.AST, lists: set[str]) -> set[str]:
    """Names only ever assigned ``len(v.innbs)`` (``d = len(v.innbs)``): `_degree_as_a_number`
    checks their reads as it checks the call (``sum(range(d))`` counted 1 silently)."""
    assigned: dict[str, list[ast.expr | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.NamedExpr)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for name, value in _bindings(target, node.value):
                    assigned.setdefault(name, []).append(value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.comprehension, ast.With)):
            for target in ([i.optional_vars for i in node.items if i.optional_vars] if isinstance(node, ast.With)
                           else [node.target]):
                for name in _names(target):
                    assigned.setdefault(name, []).append(None)
    return {name for name, values in assigned.items()
            if all(v is not None and _is_degree_call(v, lists) for v in values)}


def _bindings(target: ast.expr, value: ast.expr) -> list[tuple[str, ast.expr | None]]:
    """(name, the expression bound to it, or None where it is not one of ``value``'s
    items): ``d, k = len(v.innbs), 2`` binds ``d`` to ``len(v.innbs)``."""
    if isinstance(target, ast.Name):
        return [(target.id, value)]
    if (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts) and not any(isinstance(t, ast.Starred) for t in target.elts)):
        return [pair for t, v in zip(target.elts, value.elts) for pair in _bindings(t, v)]
    return [(name, None) for name in _names(target)]


def _is_degree_call(node: ast.AST, lists: set[str]) -> bool:
    """``len(v.innbs)``, or of a list built from it."""
    return (isinstance(node, ast.Call) and _called_name(node.func) == "len" and len(node.args) == 1
            and _built_from_neighbours(node.args[0], lists))


def _degree_as_a_number(node: ast.AST, lists: set[str], parents: dict[ast.AST, ast.AST],
                        degrees: set[str] = frozenset()) -> bool:
    """``len(v.innbs)`` where Python takes it as an int other than ``range(len(v.innbs))``
    (which lines up lists of the same neighbours): a range from or to another bound, a
    list repeated, an index. The traced count is 1 there; arithmetic on it (``len(nb) -
    1``) is a graph value, which ``range`` cannot take either."""
    if not (_is_degree_call(node, lists)
            or (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in degrees)):
        return False
    user, inside = parents.get(node), node
    while isinstance(user, (ast.BinOp, ast.UnaryOp, ast.NamedExpr)):      # len(nb) - 1: still a count
        inside, user = user, parents.get(user)
    if isinstance(user, ast.Call) and _called_name(user.func) == "range":
        # only a loop's range lines lists up: sum(range(len(nb))), len(range(...)) or
        # list(range(...)) count the one traced position (0 for eager code's d (d - 1) / 2)
        owner = parents.get(user)
        return user.args != [node] or not (isinstance(owner, (ast.For, ast.comprehension)) and owner.iter is user)
    if isinstance(user, ast.Subscript) and user.slice is inside:
        return True
    if isinstance(user, ast.Slice):         # x[:len(nb)]: a bound of 1
        return True
    if isinstance(user, ast.Call) and inside in user.args and _called_name(user.func) in _TAKES_AN_INT:
        return True
    parent = parents.get(node)
    return (isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mult)
            and any(isinstance(side, (ast.List, ast.Tuple, ast.ListComp)) or _built_from_neighbours(side, lists)
                    for side in (parent.left, parent.right)))


def _fixed_position(index: ast.expr, fixed: set[str] = frozenset()) -> bool:
    """A slice or a constant position (``[:2]``, ``[0]``, ``[-1]``, or a name ``fixed``
    holds only such a constant: ``k = -1``, then ``[k]``): not the ``i`` of a loop over
    ``range(len(v.innbs))``, which lines up lists built from the same neighbours
    (Seastar's GAT: ``a[i] * hu[i]``) and is traced per neighbour."""
    if isinstance(index, ast.UnaryOp):
        index = index.operand
    if isinstance(index, ast.IfExp):        # [0 if c else -1]
        return _fixed_position(index.body, fixed) and _fixed_position(index.orelse, fixed)
    return (isinstance(index, (ast.Slice, ast.Constant)) or (isinstance(index, ast.Name) and index.id in fixed)
            or (isinstance(index, ast.Call) and _called_name(index.func) == "slice"))      # [slice(2)]


def _constant_names(tree: ast.AST, parents: dict[ast.AST, ast.AST]) -> set[str]:
    """Names every binding of which in ``tree`` (whose nodes ``parents`` maps to their
    parents) is an integer written out (``k = 0``, ``k = -1``): a subscript by one is a
    fixed position, as ``[0]`` is."""
    constant: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            owner = parents.get(node)
            value = getattr(owner, "value", None) if isinstance(owner, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
                value = value.operand
            written = (isinstance(value, ast.Constant) and type(value.value) is int
                       and node in (owner.targets if isinstance(owner, ast.Assign) else [owner.target]))
            constant[node.id] = constant.get(node.id, True) and written
    return {name for name, only in constant.items() if only}


def _truth_tests(node: ast.AST) -> list[ast.expr]:
    """The expressions Python takes the truth of at ``node``."""
    if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
        return [node.test]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return [node.operand]
    if isinstance(node, ast.Call) and _called_name(node.func) == "bool" and len(node.args) == 1:
        return [node.args[0]]
    if isinstance(node, ast.Compare) and any(isinstance(side, (ast.List, ast.Tuple)) and not side.elts
                                             for side in (node.left, *node.comparators)):
        return [side for side in (node.left, *node.comparators)]       # nb == [], nb != []
    return []


_LOOP = ("counting in a Python loop over v.innbs / v.inedges (adding or multiplying in something that does "
         "not come from the neighbour) happens once at trace time (the traced loop runs once, for one "
         "symbolic neighbour); use len(v.innbs), the per-vertex in-degree")
_STOPS = ("break or return in a loop over v.innbs / v.inedges: the traced loop runs once, for one symbolic "
          "neighbour, so what it stops after is not known; aggregate every neighbour (sum, max, min)")
_PAIRS = ("a loop over v.innbs / v.inedges inside another pairs each traced neighbour with itself only (the "
          "traced loop runs once); pairs of neighbours are not supported -- aggregate each list on its own")
_POSITIONS = ("a position from range(len(v.innbs)) used other than to index lists of the same neighbours "
              "(a[i]) is 0 at trace time for every neighbour; aggregate every neighbour (sum, max, min)")
_SEVERAL = ("indexing a list holding several items per neighbour of v.innbs / v.inedges (two appends or "
            "hs += [a, b] a pass, an inner loop, a second for clause): eager code's hs[i] for i < in-degree "
            "mixes neighbours' items, the traced pass sees one neighbour's; keep one list per kind of item")
_SLICED = ("indexing or slicing a list built from v.innbs / v.inedges: at trace time it holds one symbolic "
           "neighbour, so a prefix or a position is not known; aggregate every neighbour (sum, max, min)")
_PACKED = ("a list built from v.innbs / v.inedges handed to a helper's *args or **kwargs is not followed into the "
           "helper, which may slice or count it (it holds one symbolic neighbour at trace time); pass it to a "
           "named parameter")
_CONTAINED = ("a list built from v.innbs / v.inedges put in a tuple, list, set or dict is not followed there (at trace "
              "time it holds one symbolic neighbour, so slicing or counting it later is not caught); keep it in a name "
              "of its own, or aggregate it (sum, max, min) first")
_SPREAD = ("*list of a list built from v.innbs / v.inedges spreads the one traced neighbour as one argument or "
           "item; aggregate every neighbour (sum, max, min) instead")
_FILLS = ("extend() or insert() on a list in a loop over v.innbs / v.inedges: the traced loop runs once, so how "
          "many items it adds or in what order is not known; append() one per-neighbour value, or use a "
          "comprehension")
_INNER = ("sum/max/min of a list of one neighbour's values (not the neighbour list) inside a loop or comprehension "
          "over v.innbs / v.inedges cannot be told from an aggregate over the neighbours at trace time; write it "
          "out (a + b, torch.maximum(a, b))")
_LAST = ("a name bound in a loop or comprehension over v.innbs / v.inedges to a per-neighbour value (the loop "
         "variable, m = u.h @ W, acc = acc + u.h), read after it: the traced loop runs once, so it holds one "
         "symbolic neighbour's value where eager code has the last neighbour's or a running total; aggregate "
         "every neighbour with sum/max/min over a list built from v.innbs")
_LATE = ("a function or lambda defined in a loop or comprehension over v.innbs / v.inedges that reads the "
         "neighbour (or a value made from it) as a free variable and is called after the pass: Python looks the "
         "name up at the call, so eager code gives every such function the last neighbour's value (late "
         "binding), the trace its one symbolic neighbour; pass the value in as a default (lambda u=u: u.h) or "
         "compute it in the loop")
_CARRIED = ("a value an earlier pass of a loop over v.innbs / v.inedges left (a running total, the previous "
            "neighbour's value, a walrus carried from one neighbour to the next) used in the loop: the traced loop "
            "runs once, for one symbolic neighbour, so it holds the value from before the loop where eager code "
            "has the earlier neighbours'; aggregate every neighbour with sum/max/min over a list built from v.innbs")
_STATEFUL = ("next() in a loop or comprehension over v.innbs / v.inedges of an iterator made outside it steps it "
             "once at trace time, once per neighbour in eager code; a neighbour's position is not known -- "
             "aggregate every neighbour (sum, max, min)")
_NO_SOURCE = ("the source of {name} cannot be read (code run by exec() or compile() from a string): gnnfuse checks "
              "a vertex function's syntax, and that of the helpers given a neighbour list, for Python that counts or "
              "orders neighbours (n += 1, enumerate, a running total, break), which the trace, run for one symbolic "
              "neighbour, would turn into a constant; define it in a file or a notebook cell, whose source Python "
              "keeps")
_HELPER_STATE = ("a function called once per neighbour (in a loop or comprehension over v.innbs / v.inedges) "
                 "keeps state between calls (changes and reads back a nonlocal or global name, or a container it "
                 "does not make anew each call -- a closure's, a module's, or one made before the loop and passed "
                 "in: a count): eager code changes it once per neighbour, the trace once, for one "
                 "symbolic neighbour; compute per-neighbour values without state and aggregate them (sum, max, min)")
_REORDERS = ("pop, remove, reverse, sort, insert, index or count on a list built from v.innbs / v.inedges: at "
             "trace time it holds one symbolic neighbour, so a position or an order is not known; aggregate "
             "every neighbour (sum, max, min)")
_DEGREE_NUMBER = ("len(v.innbs) taken as a Python int other than in range(len(v.innbs)) (another range, a "
                  "repeated list, an index) is 1 at trace time; use it in tensor arithmetic")
# what the refusals of a list's truth and of a match suggest (torch.where of a comparison is refused too)
_WITHOUT_IN_EDGES = ("for vertices without in-edges use arithmetic on the in-degree: has = min(len(v.innbs), 1), "
                     "then sum([...]) + (1 - has) * v.h")
_TRUTH = ("the truth of a list built from v.innbs / v.inedges (if nb:, nb and ...) is True at trace time for "
          "every vertex, even one without neighbours; " + _WITHOUT_IN_EDGES)
_MATCHED = ("match on a list built from v.innbs / v.inedges: at trace time it holds one symbolic neighbour, so "
            "a pattern sees one item for every vertex (case [] never matches, case [first, *rest] binds the traced "
            "neighbour as the first); aggregate every neighbour (sum, max, min); " + _WITHOUT_IN_EDGES)
_REORDERING = ("pop", "remove", "reverse", "sort", "insert", "index", "count")
_ONE_PASS_CALLS = {
    name: f"{name}() over v.innbs / v.inedges sees one traced neighbour; {advice}"
    for names, advice in (
        (("enumerate",), "a neighbour's position is not known (every vertex's neighbours would be numbered 0)"),
        (("map", "filter"), "write a comprehension ([f(u) for u in v.innbs]), which gnnfuse traces per neighbour"),
        (("islice", "takewhile", "dropwhile", "next", "iter", "reversed", "sorted", "combinations",
          "permutations", "product", "pairwise", "accumulate", "reduce", "getitem", "deque"),
         "an order, a prefix or a pairing of neighbours is not known; aggregate every neighbour (sum, max, min)"),
        (("prod",), "a product over the neighbours would be the one traced neighbour's value; aggregate with sum, "
                    "max or min (a product of positive values: torch.exp(sum([torch.log(x) for ...])))"),
        (("cat", "concat", "concatenate", "stack", "hstack", "vstack", "tensor", "as_tensor"),
         "it would stack one traced neighbour, not every neighbour; aggregate every neighbour (sum, max, min)"))
    for name in names}
_CONSTANTS = ("a list of values that do not come from the neighbour (constants, v.h) built from v.innbs / "
              "v.inedges has one element at trace time, so its len() or sum() counts 1; use len(v.innbs), the "
              "per-vertex in-degree")
# also the proxies' refusal of == and != (`vertex._Proxy`), which syntax cannot see in a helper
IDENTITY = ("comparing a neighbour with a vertex (u is v, u is not v, u == v, e.src != e.dst) is not compiled: the "
            "traced loop holds one symbolic neighbour, so Python answers by object, the same for every edge; to leave "
            "out self loops, remove them from the graph (torch_geometric.utils.remove_self_loops) or pass a per-edge "
            "0/1 mask in e_feature")
