"""One measured training step per framework, with its failure (OOM, time-out, compile error) kept as a status."""
from __future__ import annotations

import contextlib
import signal
import time
import traceback
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from ..nn.functional import cross_entropy
from ..runtime.cuda_graph import DEFAULT_WARMUP as CAPTURE_WARMUP, StepCapture, capture_stream
from .models import COMPILED, LR, WEIGHT_DECAY, DeviceData, graph_input, instantiate
from .timing import (allocated_gb, failure_status, free_memory, peak_memory_gb, reserved_peak_gb, reset_peak_memory,
                     summarize,
                     synchronize, time_calls)

COMPILE_EXTRA_WARMUP = 5     # torch.compile compiles (and may recompile once) in its first steps
REL_ERR_LIMIT = 1e-3         # float32 forward disagreement beyond this is a bug, not rounding


def max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|a - b| / max|b|: the worst element's error on the output's own scale.

    Element-wise relative error would blow up on logits that happen to be near zero.
    """
    scale = expected.abs().max().clamp_min(torch.finfo(expected.dtype).tiny)
    return ((actual - expected).abs().max() / scale).item()


def check_forward(model: str, data: DeviceData, state: dict[str, torch.Tensor], device: torch.device) -> float:
    """gnnfuse's eval-mode forward against PyG eager's, from the same weights."""
    outputs = []
    for framework in ("gnnfuse", "pyg"):
        module = instantiate(framework, model, data, state, device).eval()
        with torch.no_grad():
            outputs.append(module(data.x, graph_input(framework, data)))
        del module
    return max_rel_err(*outputs)


def measure(framework: str, model: str, data: DeviceData, state: dict[str, torch.Tensor],
            steps: int, warmup: int, device: torch.device, graph: Any = None,
            cuda_graph: str = "auto") -> dict[str, Any]:
    """Warm up, then time `steps` training steps one by one; peak memory covers the
    timed steps only (compilation, autotuning and layout building happen in warm-up).
    `graph` overrides the framework's usual graph input (`graph_input`).

    gnnfuse's whole step goes through `StepCapture` (mode ``cuda_graph``): on CUDA it is
    captured in a CUDA graph after warm-up when replayable, so the timed steps are
    replays; ``cuda_graph`` in the result says which ran. Its loss is
    `gnnfuse.nn.functional.cross_entropy` over the training rows (the library's, which
    `gnnfuse train` uses); the other frameworks' is torch's ``F.cross_entropy`` on the
    gathered rows, the loss their users write.

    Memory is counted as every framework's is: ``peak_gb`` is the allocator's peak of
    live tensors (``max_memory_allocated``). A replay allocates nothing, so a captured
    step's peak is taken while it is recorded (its allocations are those of one step)
    and over the replays (what stays allocated between them). ``reserved_gb`` is the
    peak the allocator held from the device over the timed steps (``max_memory_reserved``:
    fragmentation included, and for a captured step the graph's whole private pool)."""
    module = instantiate(framework, model, data, state, device)
    graph = graph_input(framework, data) if graph is None else graph
    ours = framework == "gnnfuse"
    train_y = data.y[data.train_idx]

    def loss() -> torch.Tensor:
        if framework == "pyg-compile-ro":       # each step is a new generation of its graphs
            torch.compiler.cudagraph_mark_step_begin()
        if ours:        # gnnfuse's loss over the training rows, as `gnnfuse train` computes it
            return cross_entropy(module(data.x, graph), train_y, rows=data.train_idx)
        return F.cross_entropy(module(data.x, graph)[data.train_idx], train_y)
    step = training_step(module, loss, device, cuda_graph if ours else "off", framework,
                         lr=LR, weight_decay=WEIGHT_DECAY)

    torch.manual_seed(1)                      # each framework's masks repeat from run to run (gnnfuse
                                              # draws its own from a counter: `TwoLayer`)
    begin = time.perf_counter()
    first_loss = step().item()
    first_step_ms = (time.perf_counter() - begin) * 1e3
    warmup = max(warmup, 1) + (COMPILE_EXTRA_WARMUP if framework in COMPILED else 0)
    if ours:
        warmup = max(warmup, CAPTURE_WARMUP)  # the timed steps are replays when it captures
    recorded_peak = warm_up(step, warmup - 1, device)
    synchronize(device)
    resident = allocated_gb(device)
    reset_peak_memory(device)
    times = time_calls(step, steps, device)
    peak, reserved = peak_memory_gb(device), reserved_peak_gb(device)
    if peak is not None and recorded_peak is not None:
        peak = max(peak, recorded_peak)
    return {"status": "ok", **summarize(times), "steps": steps, "warmup": warmup,
            "host_ms": issue_ms(step, min(steps, ISSUE_STEPS), device),
            "first_step_ms": first_step_ms, "first_loss": first_loss,
            "resident_gb": resident, "peak_gb": peak, "reserved_gb": reserved,
            **({"cuda_graph": step.status, "graph_pool_gb": _pool_gb(step)} if ours else {})}


def prime_capture_stream(device: torch.device) -> None:
    """Make the cuBLAS workspaces of the stream `StepCapture` records on before any cell
    is measured, as the default stream's are by the first framework's first product: a
    fixed cost of the process, not of the cell whose capture happened to come first.

    torch keeps one workspace (32 MiB on Hopper) per cuBLAS handle and stream, and a
    handle per thread, so there are two: the forward's, and the one autograd's device
    thread uses for the backward's products (an H200 showed +32 MiB for the first
    product on a new stream and +32 MiB for the first backward through one). A no-op
    off CUDA."""
    if device.type != "cuda":
        return
    stream = capture_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        a = torch.ones(64, 64, device=device, requires_grad=True)
        (a @ a).sum().backward()
    torch.cuda.current_stream(device).wait_stream(stream)
    synchronize(device)


def warm_up(step: Callable[[], Any], calls: int, device: torch.device) -> float | None:
    """Run ``calls`` untimed steps and return the peak memory (GB) of the one that
    recorded ``step``'s CUDA graph, if one did (a `StepCapture`): its allocations are
    one step's, while the replays timed afterwards allocate nothing, so a peak taken
    over them alone would miss the step's own tensors. Shared by every benchmark, so
    their peaks are counted alike."""
    recorded_peak = None
    for _ in range(calls):
        capturing = isinstance(step, StepCapture) and not step.captured
        if capturing:
            synchronize(device)
            reset_peak_memory(device)
        step()
        if capturing and step.captured:            # this call recorded the graph: one step's allocations
            synchronize(device)
            recorded_peak = peak_memory_gb(device)
    return recorded_peak


def training_step(module: torch.nn.Module, loss: Callable[[], torch.Tensor], device: torch.device,
                  cuda_graph: str, name: str, **adam: Any) -> StepCapture:
    """One Adam training step of ``module`` on ``loss()`` (zero the gradients, forward,
    backward, update; returns the loss) behind `StepCapture` in mode ``cuda_graph``
    (``"off"`` for the frameworks that run eagerly). Adam keeps its step count on the
    device when the step may be captured, which a captured step needs."""
    capturable = device.type == "cuda" and cuda_graph != "off"
    optimizer = torch.optim.Adam(module.parameters(), capturable=capturable, **adam)

    def train_step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        value = loss()
        value.backward()
        optimizer.step()
        return value
    return StepCapture(train_step, optimizers=[optimizer], modules=[module], mode=cuda_graph,
                       name=f"{name} training step")


ISSUE_STEPS = 10     # few enough that their launches fit CUDA's queue without blocking


def issue_ms(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """Host milliseconds per call to issue ``repeats`` calls back to back, before waiting
    for the device: about the step time when a step is host-bound, far below it when the
    GPU is the bottleneck (equal to the step time on the CPU)."""
    synchronize(device)
    begin = time.perf_counter()
    for _ in range(repeats):
        fn()
    issued = (time.perf_counter() - begin) * 1e3 / repeats
    synchronize(device)
    return issued


def _pool_gb(step: StepCapture) -> float | None:
    """The captured graph's private pool in GB (`StepCapture.pool_bytes`); None when not
    captured or not readable."""
    try:
        return step.pool_bytes() / 1e9 if step.captured else None
    except Exception:  # noqa: BLE001 - a memory snapshot must never fail a measurement
        return None


class CellTimeout(Exception):
    """A measurement ran past its time limit (see `guarded`)."""


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise `CellTimeout` in the main thread after ``seconds`` (POSIX timers; no limit
    when None). It lands at the next Python bytecode, so a long C++ call finishes first."""
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise CellTimeout(f"no result within {seconds:g} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _caused_by_timeout(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a `CellTimeout` or wraps one: torch.compile re-raises errors
    from inside its compiler as its own (``InductorError``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, CellTimeout):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__ or getattr(exc, "inner_exception", None)
    return False


def guarded(fn: Callable[[], dict[str, Any]], device: torch.device,
            time_limit_s: float | None = None) -> dict[str, Any]:
    """Run one measurement; an OOM, a time-out or any failure (e.g. torch.compile's)
    becomes its status, so one stuck or failing framework leaves the rest of a run intact.

    Memory is released only after the except block has dropped the traceback, which
    would otherwise keep the failed measurement's tensors alive. Errors other than OOM
    and time-outs print their traceback to stderr, since a one-line status rarely says
    how to fix them. An OOM records the GB already allocated when the cell began
    (``held_gb``): a compiled-PyG cell that timed out once kept ~70 GB alive, and the
    next cell's OOM was its, not the next framework's.
    """
    held = allocated_gb(device)
    try:
        with _time_limit(time_limit_s):
            result = fn()
    except Exception as exc:  # noqa: BLE001 - one failing framework must not end the run
        if _caused_by_timeout(exc):
            result = {"status": f"timeout ({time_limit_s:g} s)"}
        else:
            result = {"status": failure_status(exc)}
            if result["status"] != "oom":
                traceback.print_exc()
            elif held is not None:
                result["held_gb"] = held
    torch._dynamo.reset()
    free_memory(device)
    return result
