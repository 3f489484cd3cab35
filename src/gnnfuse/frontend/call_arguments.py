"""Torch's keyword spelling of a traced call's operands, moved to their positions.

Torch accepts every operand by its documented name -- ``torch.add(input=x, other=y)``,
``torch.mul(x, other=2)``, ``x.reshape(shape=(-1, 8))``, ``torch.matmul(input=x,
other=W)``, ``F.linear(input=x, weight=W)``, and NumPy's ``axis=`` for ``dim=`` -- while the tracer's handlers name them their
own way (``a``, ``b``, ``x``, ``*shape``). Such a call reached a handler as a keyword it
does not take and failed with a bare ``TypeError`` naming gnnfuse's internals
(``_binary.<locals>.handler() got an unexpected keyword argument 'input'``), without the
user's line. `positional` moves those operands to the positions torch gives them, read
from torch's own signatures (`torch.overrides.get_testing_overrides`), so the handler sees
the call as if it were written positionally; `misused` tells a handler's refusal of the
arguments from an error inside it, so the tracer can report the former at the user's line.
"""
from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Callable

import torch

# the names torch gives the tensor operands of the functions the tracer handles; settings
# (dim, keepdim, alpha, min, ...) keep their keywords, which the handlers take by name
_OPERANDS = frozenset({"input", "self", "other", "mat2", "exponent", "weight", "shape", "tensors"})
# Python's words for a call whose arguments do not fit the callee's parameters
_BINDING = re.compile(r"\(\) (got an unexpected keyword argument|got multiple values for argument|"
                      r"missing \d+ required|takes \d+|takes from \d+)")


@functools.cache
def _signatures() -> dict[Callable, list[str]]:
    """Each overridable torch callable's parameter names, in order."""
    return {func: list(inspect.signature(stub).parameters)
            for func, stub in torch.overrides.get_testing_overrides().items()}


def positional(func: Callable, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` of a call to ``func`` with the operands torch lets it take by
    name (``input=``, ``other=``, ...) moved to their positions after ``args``, in torch's
    order, and ``axis=`` renamed ``dim=``; a method's ``self`` is ``args[0]``. Only a run of operands that directly follows
    the positional arguments moves, so nothing lands in a position it does not hold."""
    names = _signatures().get(func)
    if not names or not (_OPERANDS.intersection(kwargs) or "axis" in kwargs):
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    if "axis" in kwargs and "dim" in names and "dim" not in kwargs:    # NumPy's name, which torch takes too
        kwargs["dim"] = kwargs.pop("axis")
    for name in names[len(args):]:
        if name not in _OPERANDS or name not in kwargs:
            break
        args.append(kwargs.pop(name))
    return tuple(args), kwargs


def misused(exc: TypeError) -> bool:
    """Whether ``exc`` says a handler was called with arguments it has no parameter for
    (a keyword torch takes and gnnfuse's op does not), rather than failing inside."""
    return _BINDING.search(str(exc)) is not None
