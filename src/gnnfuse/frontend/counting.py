"""Reject neighbour counting that tracing cannot see.

The tracer runs a loop over ``v.innbs`` once, for one symbolic neighbour. Values built
from that neighbour stay symbolic, but Python numbers do not: ``n += 1`` in the loop,
or a list of constants built from it (``len([1 for u in v.innbs])``, ``sum(1 for u in
v.innbs)``), ends up as 1 for every vertex -- a mean silently becomes a sum. Nothing at
run time distinguishes that 1 from a real one, so the function's syntax is checked
before it is traced; ``len(v.innbs)`` is the symbolic spelling.
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
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and _walks_neighbours(node.iter):
            found += [(n.lineno, _LOOP) for stmt in node.body for n in ast.walk(stmt) if _increments(n)]
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and isinstance(node.elt, ast.Constant) \
                and any(_walks_neighbours(g.iter) for g in node.generators):
            found.append((node.lineno, _CONSTANTS))
    return tuple(sorted((line + first - 1, message) for line, message in found))


def _walks_neighbours(expr: ast.expr) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in NEIGHBOUR_LISTS for n in ast.walk(expr))


def _increments(node: ast.AST) -> bool:
    """``n += c`` or ``n = n + c`` with a number ``c``."""
    if isinstance(node, ast.AugAssign):
        return isinstance(node.target, ast.Name) and _is_number(node.value)
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        value = node.value
        return (isinstance(value, ast.BinOp) and isinstance(value.left, ast.Name)
                and value.left.id == node.targets[0].id and _is_number(value.right))
    return False


def _is_number(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)


_LOOP = ("counting in a Python loop over v.innbs / v.inedges gives 1 at trace time (the traced loop "
         "runs once, for one symbolic neighbour); use len(v.innbs), the per-vertex in-degree")
_CONSTANTS = ("a list of constants built from v.innbs / v.inedges has one element at trace time, so "
              "its len() or sum() is 1; use len(v.innbs), the per-vertex in-degree")
