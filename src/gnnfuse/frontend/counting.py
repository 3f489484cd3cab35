"""Reject Python over neighbour lists that tracing cannot see.

The tracer runs a loop over ``v.innbs`` once, for one symbolic neighbour. Values built
from that neighbour stay symbolic, but Python's own bookkeeping does not: ``n += 1`` in
the loop, or a list of constants built from it (``len([1 for u in v.innbs])``, ``sum(1
for u in v.innbs)``), ends up as 1 for every vertex -- a mean silently becomes a sum.
So do a position (``enumerate``), a pair of neighbours (two loops over ``v.innbs``), a
prefix (slicing the list, ``break``, ``islice``) and the list's truth (``if nb:`` is true
at trace time for a vertex with no neighbour). Nothing at run time distinguishes that 1,
0 or one-element list from a real one, so the function's syntax is checked before it is
traced; ``len(v.innbs)`` is the symbolic count.
"""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import textwrap
import types

from ..ir import CompileError

NEIGHBOUR_LISTS = ("innbs", "inedges")


def check_counting(fn: types.FunctionType) -> None:
    """Raise a CompileError at the first line of ``fn`` that counts neighbours in Python."""
    found = _counting_lines(fn.__code__)
    if found:
        line, message = found[0]
        text = linecache.getline(fn.__code__.co_filename, line).strip()
        raise CompileError(message, f"{fn.__code__.co_filename}:{line}: {text}")


@functools.lru_cache(maxsize=1024)
def _counting_lines(code: types.CodeType) -> tuple[tuple[int, str], ...]:
    try:
        lines, first = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):   # no source (exec'd code) or a lambda inside an expression
        return ()
    found = []
    lists = _names_of_neighbour_lists(tree)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and _walks_neighbours(node.iter):
            derived, rebound = _per_neighbour_names(node)
            found += [(n.lineno, _LOOP) for stmt in node.body for n in ast.walk(stmt)
                      if _accumulates(n, derived, rebound)]
            found += [(n.lineno, _STOPS) for n in _statements(node.body) if isinstance(n, (ast.Break, ast.Return))]
            found += [(n.lineno, _PAIRS) for stmt in node.body for n in ast.walk(stmt)
                      if _iterates_neighbours(n) and _reads(n, derived)]
        elif _is_comprehension(node) and any(_walks_neighbours(g.iter) for g in node.generators):
            outer = set().union(*(_names(g.target) for g in node.generators))
            if hasattr(node, "elt") and not _reads(node.elt, outer):      # 1, ONE, -1, v.h: one per neighbour
                found.append((node.lineno, _CONSTANTS))
            inner = [n for part in _comprehension_body(node) for n in ast.walk(part)
                     if _iterates_neighbours(n) and _reads(n, outer)]
            if sum(_walks_neighbours(g.iter) for g in node.generators) > 1 or inner:
                found.append((node.lineno, _PAIRS))
        elif isinstance(node, ast.Call) and any(_is_neighbour_list(a) for a in node.args):
            name = _called_name(node.func)
            if name == "enumerate" and _positions_only_index(node, parents):
                pass        # i only picks the same neighbour's item of another list: traced per neighbour
            elif name in _ONE_PASS_CALLS:
                found.append((node.lineno, _ONE_PASS_CALLS[name]))
            elif name == "zip" and any(_numbers_positions(a) for a in node.args):
                found.append((node.lineno, _ZIP))
        elif isinstance(node, ast.Subscript) and _fixed_position(node.slice) and _built_from_neighbours(node.value, lists):
            found.append((node.lineno, _SLICED))       # v.innbs[0] included: the first neighbour, not traced
        elif (isinstance(node, (ast.For, ast.comprehension)) and _over_degree_range(node.iter)
              and not _positions_only_index(node.iter, parents, whole_target=True)):
            found.append((getattr(node, "lineno", node.iter.lineno), _POSITIONS))
        for test in _truth_tests(node):
            if _built_from_neighbours(test, lists):
                found.append((test.lineno, _TRUTH))
    return tuple(sorted(set((line + first - 1, message) for line, message in found)))


def _walks_neighbours(expr: ast.expr) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in NEIGHBOUR_LISTS for n in ast.walk(expr))


def _is_neighbour_list(expr: ast.expr) -> bool:
    """``v.innbs`` / ``v.inedges`` itself."""
    return isinstance(expr, ast.Attribute) and expr.attr in NEIGHBOUR_LISTS


def _is_comprehension(node: ast.AST) -> bool:
    return isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp))


def _comprehension_body(node: ast.AST) -> list[ast.AST]:
    """What a comprehension computes per element: its element (key and value) and conditions."""
    parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    return parts + [cond for g in node.generators for cond in g.ifs]


def _iterates_neighbours(node: ast.AST) -> bool:
    """A loop or comprehension over a neighbour list."""
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return _walks_neighbours(node.iter)
    return _is_comprehension(node) and any(_walks_neighbours(g.iter) for g in node.generators)


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
    return derived, rebound


def _accumulates(node: ast.AST, derived: set[str], rebound: set[str]) -> bool:
    """``n += c`` or ``n = n + c`` on a name carried across iterations, where ``c`` holds
    nothing per neighbour: per neighbour in eager code, once at trace time. A name the
    body assigns afresh first (``m = u.h @ W; m = m + b``) carries nothing across."""
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


def _names_of_neighbour_lists(tree: ast.AST) -> set[str]:
    """Names only ever assigned a list built from a neighbour list (``nb = [u.h for u in
    v.innbs]``); a name also bound to something else (``h = sum(h)``) is not followed."""
    assigned: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            listed = isinstance(node, ast.Assign) and _built_from_neighbours(node.value, set())
            for name in set().union(*(_names(t) for t in targets)):
                assigned[name] = assigned.get(name, True) and listed
    return {name for name, listed in assigned.items() if listed}


def _built_from_neighbours(expr: ast.expr, names: set[str]) -> bool:
    """A neighbour list, a list made from one (a comprehension over it, ``list(v.innbs)``)
    or a name holding such a list."""
    if _is_neighbour_list(expr) or (isinstance(expr, ast.Name) and expr.id in names):
        return True
    if _is_comprehension(expr) and not isinstance(expr, ast.GeneratorExp):
        return any(_walks_neighbours(g.iter) for g in expr.generators)
    return (isinstance(expr, ast.Call) and _called_name(expr.func) in ("list", "tuple")
            and len(expr.args) == 1 and _built_from_neighbours(expr.args[0], names))


def _over_degree_range(expr: ast.expr) -> bool:
    """``range(len(v.innbs))``."""
    return (isinstance(expr, ast.Call) and _called_name(expr.func) == "range" and len(expr.args) == 1
            and isinstance(expr.args[0], ast.Call) and _called_name(expr.args[0].func) == "len"
            and len(expr.args[0].args) == 1 and _is_neighbour_list(expr.args[0].args[0]))


def _positions_only_index(call: ast.Call, parents: dict[ast.AST, ast.AST], whole_target: bool = False) -> bool:
    """``for i, u in enumerate(v.innbs)`` or ``for i in range(len(v.innbs))`` (a loop or
    comprehension; ``whole_target``: the target is ``i`` itself) whose ``i`` is used only
    as a subscript, ``a[i]``: it lines up lists built from the same neighbours (their one
    traced item at trace time). Arithmetic on ``i`` needs real positions."""
    owner = parents.get(call)
    if not isinstance(owner, (ast.For, ast.comprehension)) or owner.iter is not call:
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
    return all(isinstance(parents.get(n), ast.Subscript) and parents[n].slice is n for n in uses)


def _numbers_positions(expr: ast.expr) -> bool:
    """Something zipped with a neighbour list that numbers or lists positions, not
    neighbours: ``range(...)``, ``itertools.count()``, a literal list or tuple. (A list
    built from the same neighbours, a helper's result included, lines up with them.)"""
    return isinstance(expr, (ast.List, ast.Tuple, ast.Constant)) or (
        isinstance(expr, ast.Call) and _called_name(expr.func) in ("range", "count", "repeat", "cycle"))


def _fixed_position(index: ast.expr) -> bool:
    """A slice or a constant position (``[:2]``, ``[0]``, ``[-1]``): not the ``i`` of a loop
    over ``range(len(v.innbs))``, which lines up lists built from the same neighbours
    (Seastar's GAT: ``a[i] * hu[i]``) and is traced per neighbour."""
    if isinstance(index, ast.UnaryOp):
        index = index.operand
    return isinstance(index, (ast.Slice, ast.Constant))


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
_ZIP = ("zip() of v.innbs / v.inedges with positions (range, count, a literal list) pairs the one traced "
        "neighbour with the first; zip lists of the same neighbours only (zip(v.innbs, v.inedges))")
_SLICED = ("indexing or slicing a list built from v.innbs / v.inedges: at trace time it holds one symbolic "
           "neighbour, so a prefix or a position is not known; aggregate every neighbour (sum, max, min)")
_TRUTH = ("the truth of a list built from v.innbs / v.inedges (if nb:, nb and ...) is True at trace time for "
          "every vertex, even one without neighbours; test len(v.innbs) in torch.where instead")
_ONE_PASS_CALLS = {
    name: f"{name}() over v.innbs / v.inedges sees one traced neighbour; {advice}"
    for names, advice in (
        (("enumerate",), "a neighbour's position is not known (every vertex's neighbours would be numbered 0)"),
        (("map", "filter"), "write a comprehension ([f(u) for u in v.innbs]), which gnnfuse traces per neighbour"),
        (("islice", "takewhile", "dropwhile", "next", "iter", "reversed", "sorted", "combinations",
          "permutations", "product", "pairwise", "accumulate"),
         "an order, a prefix or a pairing of neighbours is not known; aggregate every neighbour (sum, max, min)"))
    for name in names}
_CONSTANTS = ("a list of values that do not come from the neighbour (constants, v.h) built from v.innbs / "
              "v.inedges has one element at trace time, so its len() or sum() counts 1; use len(v.innbs), the "
              "per-vertex in-degree")
