"""Timing with CUDA events (or the host clock on CPU) and memory accounting, shared by every benchmark."""
from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], Any], repeats: int, device: torch.device) -> list[float]:
    """Milliseconds of each of `repeats` calls of `fn`, measured one call at a time.

    On CUDA each call is bracketed by events and synchronised before the next starts,
    so a time covers exactly one call from an idle GPU, host-side launch overhead
    included (the events wait on the stream while Python launches kernels). On CPU,
    where there are no events, wall time with `time.perf_counter`.
    """
    synchronize(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return times


def summarize(times_ms: list[float]) -> dict[str, float]:
    """Median (the headline: robust to one-off stalls), plus min and mean for spread."""
    return {"median_ms": statistics.median(times_ms), "min_ms": min(times_ms),
            "mean_ms": statistics.fmean(times_ms)}


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gb(device: torch.device) -> float | None:
    """Peak bytes allocated by torch's CUDA allocator since the last reset, in GB (1e9);
    None on CPU, where no allocator statistic covers just the measured calls."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 1e9


def reserved_peak_gb(device: torch.device) -> float | None:
    """Peak bytes torch's CUDA allocator held from the device since the last reset, in
    GB: live tensors plus cached and fragmented blocks (a CUDA graph's pool included);
    None on CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_reserved(device) / 1e9


def allocated_gb(device: torch.device) -> float | None:
    """Bytes currently allocated, in GB: what is resident before a measurement starts."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device) / 1e9


def extra_peak_gb(call: Callable[[], Any], device: torch.device) -> tuple[Any, float | None, float | None]:
    """``call()`` once: (its result, GB allocated at its peak above what was allocated
    before it, that baseline in GB). Both None off CUDA. What a call needs beyond what is
    resident, its result included (a gradient it returns counts)."""
    synchronize(device)
    before = allocated_gb(device)
    reset_peak_memory(device)
    result = call()
    synchronize(device)
    peak = peak_memory_gb(device)
    return result, None if peak is None else peak - before, before


def free_memory(device: torch.device) -> None:
    """Return cached blocks to the driver after the caller dropped its references, so
    the next measurement starts from the same baseline and a failure does not cascade."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def failure_status(exc: BaseException) -> str:
    """``"oom"`` for out-of-memory however it surfaces (torch, Triton, or wrapped by
    torch.compile), else ``"error: <type>: <first line>"`` short enough for a table."""
    text = str(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower():
        return "oom"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"error: {type(exc).__name__}: {first[:160]}"
