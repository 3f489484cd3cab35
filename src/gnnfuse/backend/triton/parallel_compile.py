"""An autotuner's configs compiled side by side before it times them.

Triton's autotuner benchmarks its configs one after the other, and each config's first
run compiles it, so a kernel's first tuning round costs the sum of its configs' compile
times: 16 configs per CSR kernel, a fraction of a second each, but up to 16 s for a
config whose tiles spill registers. On an H200, the first training step of a products-like
GAT mini-batch (eleven kernels, PyG's GAT over ``batch.edge_index``) compiled for more
than 160 s and had not finished after 200; a compile is mostly native code (MLIR passes,
LLVM, the ``ptxas`` process) and runs in parallel across threads (the project's 2-core
machine compiled that step's 92 configs in 70 s on two threads against 146 s on one).

`install` wraps one autotuner's per-config benchmark (``Autotuner._bench``): the round's
first benchmark (of its first config) first compiles every config the round times,
concurrently, through Triton's own asynchronous compile mode
(``triton.runtime._async_compile``), which puts each result in the JIT function's cache
where the timed runs then find it (`config_check` compiles its candidates so too). Nothing
else changes: the same configs, compiled with the same options, timed the same way, and
a round that Triton's disk cache answers (``cache_results``) benchmarks nothing and so
compiles nothing extra. A config that fails to compile (out of resources, a ptxas error)
is left for the timed run, which fails it as the autotuner always has.
``GNNFUSE_COMPILE_THREADS`` caps the threads (default: the CPUs this process may use; 1
compiles serially, as Triton does). Where Triton lacks the asynchronous mode or the
benchmark method (older releases), configs compile serially as before.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...environ import count

try:
    from triton.runtime._async_compile import AsyncCompileMode
except ImportError:     # a Triton without asynchronous compilation: serial, as its autotuner does
    AsyncCompileMode = None

VARIABLE = "GNNFUSE_COMPILE_THREADS"
_INSTALLED = "_gnnfuse_parallel_compile"    # an autotuner's attribute: its benchmark is wrapped
_COUNTS = {"rounds": 0, "configs": 0}


def threads() -> int:
    """Compile threads: ``GNNFUSE_COMPILE_THREADS`` if set, else the CPUs this process may use."""
    count_set = count(VARIABLE, "threads (1 compiles serially)")
    if count_set is not None:
        return count_set
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not on Linux
        return os.cpu_count() or 1


def install(tuner: Any) -> None:
    """Make ``tuner``'s tuning rounds compile their configs concurrently (once per
    autotuner; a no-op where this Triton cannot)."""
    if AsyncCompileMode is None or getattr(tuner, _INSTALLED, False) or not hasattr(tuner, "_bench"):
        return
    bench = tuner._bench

    def compiling_bench(*args: Any, config: Any, **meta: Any) -> Any:
        configs = tuner.prune_configs(meta)    # what this round times, in the order it times them
        if configs and config is configs[0]:
            compile_configs(tuner, configs, args, meta)
        return bench(*args, config=config, **meta)

    tuner._bench = compiling_bench
    setattr(tuner, _INSTALLED, True)


def compile_configs(tuner: Any, configs: list, args: tuple, meta: dict[str, Any]) -> None:
    """Compile ``tuner``'s JIT function under each of ``configs`` for ``args`` and the
    call's keyword arguments ``meta`` (its grid among them), side by side."""
    workers = min(threads(), len(configs))
    if AsyncCompileMode is None or workers < 2:
        return
    meta = {**meta, "warmup": True}
    with ThreadPoolExecutor(workers, thread_name_prefix="gnnfuse-compile") as pool, \
            AsyncCompileMode(pool, ignore_errors=True):
        for config in configs:
            tuner.fn.run(*args, **meta, **config.all_kwargs())
    _COUNTS["rounds"] += 1
    _COUNTS["configs"] += len(configs)


def compiled() -> dict[str, int]:
    """Tuning rounds compiled concurrently in this process, and their configs (tests read it)."""
    return dict(_COUNTS)
