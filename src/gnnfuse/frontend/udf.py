"""The plain Python function behind a user-defined function.

DGL and Graphiler code passes more than plain functions as UDFs: ``nn.Module`` instances
whose ``forward`` is the UDF (DGL's ``NodeApplyModule``, GraphSAGE's aggregators), bound
methods, ``functools.partial`` objects and other callable objects. The front ends need the
function underneath to find the user's source lines, and the vertex front end to run it
with its own ``sum``/``max``/``min``/``len``; `unwrap` finds it and the arguments bound
before the one the front end passes.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Callable

import torch


def unwrap(udf: Callable) -> tuple[types.FunctionType, tuple[Any, ...], dict[str, Any]]:
    """``(function, leading_args, keywords)`` such that ``udf(x)`` is
    ``function(*leading_args, x, **keywords)``. A Module's forward is called directly,
    so its hooks do not run while tracing."""
    if isinstance(udf, types.FunctionType):
        return udf, (), {}
    if isinstance(udf, types.MethodType):
        fn, args, keywords = unwrap(udf.__func__)
        return fn, (*args, udf.__self__), keywords
    if isinstance(udf, functools.partial):
        fn, args, keywords = unwrap(udf.func)
        return fn, (*args, *udf.args), {**keywords, **udf.keywords}
    if isinstance(udf, torch.nn.Module):
        return unwrap(types.MethodType(type(udf).forward, udf))
    call = getattr(type(udf), "__call__", None)
    if isinstance(call, types.FunctionType):
        return call, (udf,), {}
    raise TypeError(f"a UDF must be a Python function, a bound method, a functools.partial, an "
                    f"nn.Module or an object with a Python __call__; got {type(udf).__name__}")
