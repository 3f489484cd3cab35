"""Launching a generated kernel with as little host work per call as Triton allows.

An autotuned kernel's every launch goes through ``Autotuner.run``: it rebuilds dicts of
the arguments, formats every tensor's dtype into its cache key, looks the key up and
merges the chosen config into the keyword arguments -- host work repeated on every call
of every fused unit, which on small graphs is a visible share of a training step. Its
choice never changes once made, so `launch` remembers it per call signature (the
autotuner's key argument, the feature block and the tensors' dtypes: what the
autotuner's own key is made of) and launches the JIT function underneath directly with
that config (the grid is computed per call: the key holds size classes, not sizes). Anything unusual (a config with a pre-hook, an
autotuner without ``best_config``) keeps going through the autotuner. Below the
autotuner, and for a plain JIT function, `direct_launch.Replays` skips Triton's binder
and cache lookup too, once a specialization has been launched through them.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable, Sequence

import torch
from triton.runtime.autotuner import Autotuner

from ..first_use import first_launch
from . import config_check, parallel_compile
from .direct_launch import BoundLaunch, Replays

_CHOSEN: "weakref.WeakKeyDictionary[Autotuner, dict]" = weakref.WeakKeyDictionary()
_THROUGH_AUTOTUNER = object()   # a signature whose config cannot be replayed directly


def signature(sizes: tuple[int, ...], kwargs: dict[str, Any], dtypes: tuple[torch.dtype, ...]) -> Hashable:
    """A launch's call signature: the autotuner's key sizes, the keyword arguments and
    the dtypes of the tensor arguments, in order."""
    return sizes, tuple(kwargs.items()), dtypes


def launch(kernel: Any, grid: Callable[[dict], tuple], sizes: tuple[int, ...], args: Sequence[Any],
           kwargs: dict[str, Any], known_signature: Hashable | None = None) -> None:
    """``kernel[grid](*args, **kwargs)``, where ``sizes`` are what the autotuner's key
    depends on (the size class of the rows or edges, the feature width), and
    ``known_signature``, if given, the `signature` of this call (the executor works it
    out once per launch plan)."""
    if not isinstance(kernel, Autotuner):
        replays = _plain_replays(kernel, kwargs)
        if replays is None:
            kernel[grid](*args, **kwargs)
        else:
            replays(grid, args)
        return
    key = known_signature or signature(sizes, kwargs, tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
    chosen = _CHOSEN.get(kernel)
    if chosen is None:
        chosen = _CHOSEN[kernel] = {}
    entry = chosen.get(key)
    if entry is None:       # the autotuner compiles and times its configs, or finds them in Triton's caches
        parallel_compile.install(kernel)
        if config_check.enabled():
            config_check.check_configs(kernel, grid, args, kwargs)
        first_launch(lambda: kernel[grid](*args, **kwargs))
        chosen[key] = _direct_launch(kernel, grid, kwargs)
        return
    if entry is _THROUGH_AUTOTUNER:
        kernel[grid](*args, **kwargs)
        return
    entry(grid, args)     # the grid is this call's: sizes within one size class differ


def wide_ids(count: int, block: int) -> bool:
    """Whether a kernel that numbers ``count`` items ``tl.program_id(0) * block + lane``
    must do so in int64: its last program's last id, ``cdiv(count, block) * block - 1``,
    passes 2^31 - 1, where Triton's int32 program id times the block wrapped to negative
    ids, which the ``< count`` mask let through (a gather of 2^31 + 1 edges read before
    its index array). Smaller launches keep int32 ids, the code their timings were taken
    with."""
    return -(-count // block) * block > 2**31


def bind(kernel: Any, grid: Callable[[dict], tuple], args: Sequence[Any], known_signature: Hashable,
         varying: Sequence[int], made: int = 0) -> BoundLaunch | None:
    """The launch `launch` made last with ``args`` under ``known_signature``, bound with
    all but the positions ``varying`` fixed (`direct_launch.BoundLaunch`; the first
    ``made`` of them the caller's own tensors), for a caller whose other arguments never
    change (a launch plan's); None where there is none yet (the autotuner's first
    launches, Triton's own first launch of this specialization) or none can be (a plain
    JIT function, a config with a pre-hook, the interpreter)."""
    entry = _CHOSEN.get(kernel, {}).get(known_signature) if isinstance(kernel, Autotuner) else None
    return entry.bind(grid, args, varying, made) if isinstance(entry, Replays) else None


def _plain_replays(kernel: Any, kwargs: dict[str, Any]) -> Replays | None:
    """The `Replays` of a plain JIT function under ``kwargs``, made on first use and kept
    on the function itself (a table keyed by the function would keep every generated
    kernel alive through its `Replays`); None where it cannot be kept (keyword values
    that do not hash, an object that takes no attributes). Why: ``kernel[grid](...)``
    binds and specializes every argument on every call, the host work `direct_launch`
    exists to skip, and the loss, dropout, row-gather and typed-matmul kernels are plain
    JIT functions launched once or more per uncaptured training step. On an H200's host
    (the two ways interleaved in one process, 88555aa) a Reddit2-sized loss and its
    gradient, two launches, took 696-715 us of host time against 851; dropout's one
    launch 26.7-29.3 against 29.5, within the host's noise."""
    try:
        per_kwargs = kernel.__dict__.setdefault(_PLAIN, {})
        key = tuple(kwargs.items())
        found = per_kwargs.get(key)
        if found is None:
            found = per_kwargs[key] = Replays(kernel, dict(kwargs))
    except (AttributeError, TypeError):
        return None
    return found


_PLAIN = "_gnnfuse_replays"     # a plain JIT function's attribute: {its keyword arguments' items: Replays}


def _direct_launch(kernel: Autotuner, grid: Callable[[dict], tuple], kwargs: dict[str, Any]) -> Any:
    """`Replays` of the autotuner's last launch's JIT function and keyword arguments,
    or a marker to keep going through the autotuner when the config has a pre-hook."""
    config = getattr(kernel, "best_config", None)
    if (config is None or getattr(config, "pre_hook", None) is not None or not hasattr(config, "all_kwargs")
            or not hasattr(kernel, "fn")):
        return _THROUGH_AUTOTUNER
    return Replays(kernel.fn, {**kwargs, **config.all_kwargs()})
