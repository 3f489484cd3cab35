"""Every autotuning config of a kernel run on the same inputs and compared
(``GNNFUSE_CHECK_CONFIGS=1``).

Why: the autotuner picks a kernel's config by timing, so which config runs differs from
machine to machine and from one lease of a GPU to the next. A compiler bug that only one
config triggers shows only where that config happens to win: Triton 3.6's edge kernels
at 256 edges a program lost the sign handling of a product under ptxas (NaN on 1,007 of
4,096 edges, no error; 722b6f3), and the test that found it passed or failed by which
config the timing chose on that lease. With the variable set, the first launch of a tuned
kernel under each call signature (`launch.launch`) first runs every config on copies of
the same arguments and compares what each wrote with what the first config wrote; a
disagreement raises `ConfigMismatch`, naming the kernel, both configs, the argument and
the first differing element. The GPU suite runs with it (``benchmarks/gpu_suite.sh``), so
every config of every tuned kernel the tests launch is checked, not only the fastest.

The comparison allows what a different order of float additions gives (atomics, another
block size): a relative tolerance per dtype against the largest magnitude in that output
or in the kernel's inputs (the arguments a run leaves as they were), with NaN and
infinity positions required to match exactly and integers exactly. It copies every
tensor argument once per launch checked, so it is a diagnostic mode for tests and bug
reports, not for training runs.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from triton.compiler.errors import CompileTimeAssertionFailure
from triton.runtime.errors import OutOfResources, PTXASError

from ...environ import flag
from . import parallel_compile

VARIABLE = "GNNFUSE_CHECK_CONFIGS"

# Arguments a kernel uses as its own scratch (split rows' partial sums and arrival
# counters): what is left in them may differ by config without any output differing.
SCRATCH = frozenset({"work", "arrived"})

# Arguments holding one partial result per program, whose sum over programs (the first
# dimension) is the result: which items a program takes depends on the block size
# (`codegen.generate_shared_reduce`'s edges per program, BLOCK_E; a sibling kernel's
# rider tiles, `codegen.generate_siblings`, one per program of ROWS segments), so only
# the sum is compared. A name followed by a number counts too (``partials2``: a kernel
# with one such output per rider).
SUMMED = frozenset({"partials"})

# Relative tolerance per dtype, against the largest magnitude in the compared output or the inputs.
RTOL = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2}

# The failures the autotuner itself takes as "this config does not fit" (it times them as
# infinitely slow); a config that fails so is skipped here too.
_UNFIT = (OutOfResources, CompileTimeAssertionFailure, PTXASError)

_COUNTS = {"launches": 0, "configs": 0}


class ConfigMismatch(RuntimeError):
    """Two autotuning configs of one kernel wrote different results from the same
    arguments: one of them is miscompiled (or the kernel depends on its block size)."""


def enabled() -> bool:
    """Whether ``GNNFUSE_CHECK_CONFIGS`` asks for the check (read per first launch, so a
    test's ``monkeypatch.setenv`` takes effect)."""
    return flag(VARIABLE, False)


def checked() -> dict[str, int]:
    """Launches checked in this process and config runs compared in them (a test reads
    them to see that the check ran)."""
    return dict(_COUNTS)


def check_configs(kernel: Any, grid: Callable[[dict], tuple], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Run every config of autotuned ``kernel`` on ``args`` (restored after each run) and
    raise `ConfigMismatch` where one wrote other values than the first config that ran.
    Skipped while a CUDA graph is being captured (the copies would be captured too)."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    if any(args[i].is_cuda for i in positions) and torch.cuda.is_current_stream_capturing():
        return
    names = list(getattr(kernel, "arg_names", ()))
    compared = [i for i in positions if i >= len(names) or names[i] not in SCRATCH]
    saved = [args[i].clone() for i in positions]
    rtol = max((RTOL.get(args[i].dtype, 1e-3) for i in positions if args[i].dtype.is_floating_point), default=0.0)
    first: tuple[Any, list[torch.Tensor]] | None = None
    inputs_scale = 0.0
    configs = _candidates(kernel, dict(zip(names, args)), kwargs)
    parallel_compile.compile_configs(kernel, configs, tuple(args), {**kwargs, "grid": grid})
    for config in configs:
        changed: set[int] = set()
        try:
            if config.pre_hook is not None:
                config.pre_hook({**dict(zip(names, args)), **kwargs, **config.all_kwargs()})
            kernel.fn.run(*args, grid=grid, warmup=False, **kwargs, **config.all_kwargs())
            written = [_result(args[i], names[i] if i < len(names) else "") for i in compared]
        except _UNFIT:
            continue
        finally:
            changed = _restore(args, positions, saved)
        _COUNTS["configs"] += 1
        inputs_scale = max([inputs_scale, *(float(_finite_max(copy)) for i, copy in zip(positions, saved)
                                            if i not in changed and copy.dtype.is_floating_point)])
        if first is None:
            first = (config, written)
            continue
        for i, expected, got in zip(compared, first[1], written):
            problem = _difference(expected, got, rtol, inputs_scale)
            if problem:
                name = names[i] if i < len(names) else f"argument {i}"
                raise ConfigMismatch(
                    f"{_kernel_name(kernel)}: config ({_describe(config)}) wrote `{name}` differently from "
                    f"config ({_describe(first[0])}) on the same arguments: {problem}. One of the two configs "
                    f"is miscompiled or the kernel depends on its block size; GNNFUSE_AUTOTUNE=0 launches "
                    f"fixed configs instead.")
    _COUNTS["launches"] += 1


def _candidates(kernel: Any, named: dict[str, Any], kwargs: dict[str, Any]) -> list[Any]:
    """The configs the autotuner would time for this call: what its ``early_config_prune``
    hook keeps (segment matmul's `fitting_configs` drops blocks wider than the matrices),
    as Triton's `Autotuner.prune_configs` does; a config it never runs cannot be picked."""
    prune = getattr(kernel, "early_config_prune", None)
    return prune(kernel.configs, named, **kwargs) if prune else kernel.configs


def _result(arg: torch.Tensor, name: str) -> torch.Tensor:
    """What ``arg`` holds after a run, as compared: a copy, or the sum of `SUMMED` partials."""
    if name.rstrip("0123456789") in SUMMED:
        return arg.sum(0, dtype=torch.float64 if arg.dtype.is_floating_point else None)
    return arg.clone()


def _restore(args: Sequence[Any], positions: list[int], saved: list[torch.Tensor]) -> set[int]:
    """Put back the tensor arguments a config's run changed, keeping their version
    counters: a kernel's own writes do not count as in-place edits (Triton writes through
    pointers), and a bumped counter on a graph's index or layout tensor reads as a graph
    edited after it was built (`GraphModifiedError`). Returns the positions it put back:
    the ones the run wrote."""
    changed = set()
    for i, copy in zip(positions, saved):
        if not torch.equal(args[i], copy):
            changed.add(i)
            with torch.autograd._unsafe_preserve_version_counter(args[i]):
                args[i].copy_(copy)
    return changed


def _difference(expected: torch.Tensor, got: torch.Tensor, rtol: float, inputs_scale: float = 0.0) -> str:
    """Empty if ``got`` matches ``expected`` (float within ``rtol`` of the larger
    magnitude in either or in the kernel's inputs, ``inputs_scale``; NaN and infinities
    in the same places with the same signs; integers exactly), else how they differ.
    ``rtol`` is the loosest `RTOL` of the kernel's float arguments: a float64 output of
    float32 inputs carries float32's rounding, which the order of additions changes.
    The inputs' magnitude counts because a sum that cancels (a softmax's gradient over a
    row) leaves a residue of its terms' rounding, not of its own size, and which residue
    depends on the order: 0.1 + 0.2 - 0.3 is 5.6e-17 one way and 2.8e-17 the other."""
    if expected.dtype.is_floating_point:
        scale = max(float(torch.stack([_finite_max(expected), _finite_max(got)]).max()), inputs_scale)
        close = torch.isclose(got, expected, rtol=rtol, atol=scale * rtol, equal_nan=True)
    else:
        close = got == expected
    if bool(close.all()):
        return ""
    wrong = (~close).reshape(-1).nonzero()
    at = int(wrong[0])
    index = tuple(int(k) for k in torch.unravel_index(torch.tensor(at), expected.shape)) if expected.dim() else ()
    return (f"{len(wrong)} of {expected.numel()} elements differ, the first at index {index}: "
            f"{expected.reshape(-1)[at].item()} against {got.reshape(-1)[at].item()}")


def _finite_max(t: torch.Tensor) -> torch.Tensor:
    values = t.detach().abs().to(torch.float64)
    values = values[torch.isfinite(values)]
    return values.max() if values.numel() else torch.zeros((), dtype=torch.float64, device=t.device)


def _kernel_name(kernel: Any) -> str:
    fn = getattr(kernel, "base_fn", None) or getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", type(kernel).__name__)


def _describe(config: Any) -> str:
    return ", ".join([*(f"{k}={v}" for k, v in config.kwargs.items()), f"num_warps={config.num_warps}"])
