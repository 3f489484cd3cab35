"""Whole training steps captured once into a CUDA graph and replayed (opt-in).

On small graphs a training step is bound by the host: tracing-cache lookups, plan
walks and a few dozen kernel launches cost milliseconds while the GPU works for a
fraction of that. A CUDA graph records every kernel of one step -- forward, loss,
backward, optimizer update -- and replays them with one launch, so the host cost of
a step is a few microseconds whatever the model does in Python.

Replay is only correct if the step does exactly the same device work every time, on
the same memory. `StepCapture` makes that safe rather than assumed:

- **Warm-up before capture.** The first calls run eagerly, so Triton autotuning,
  trace and layout caches, lazily built optimizer state and lazily initialised
  parameters all exist before anything is recorded.
- **An audited step.** The last warm-up call runs under `audit_step`, which sees every
  torch call the step makes from Python: a host synchronisation (``.item()``,
  ``nonzero``, boolean-mask indexing, ``if tensor:``) or a tensor on another device (a
  CPU tensor would be read once at capture and then frozen) means the step cannot be
  replayed, and it runs eagerly from then on with one warning saying which call did it
  and on which line.
  On CUDA, torch's sync debug mode also reports any synchronisation, the backward's
  included. An optimizer that keeps its step count on the host (``torch.optim.Adam``
  without ``capturable=True``) is refused too.
- **Guarded replays.** Tensor arguments are copied into static buffers when they are
  not those buffers; a different shape, dtype or stride, a parameter replaced
  (``param.data = ...``) or a module switched between ``train()`` and ``eval()`` since
  capture is refused with an error, never replayed on stale memory.
- **Fresh randomness.** Dropout draws from torch's CUDA generator (gnnfuse's attention
  dropout masks too: the ``dropout_mask`` op is ``torch.bernoulli``), which a capture
  registers, so each replay advances the philox offset and draws new masks.

A failed capture also falls back to eager, after dropping the gradients it may have
left pointing at unwritten memory and with the CUDA generator taken out of capture
mode (`_CudaGraph._release_generator`). Everything else (the CPU, ``mode="off"``) runs the
step as it is, with the same numbers.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_map
from torch.overrides import TorchFunctionMode

from .first_pass import steady_executor

MODES = ("auto", "on", "off")
DEFAULT_WARMUP = 3   # eager calls before capture; the last one is audited

# Torch calls whose result the host reads (a device-to-host synchronisation): a capture
# cannot record them and the host value would be frozen at capture time.
_SYNCING_CALLS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "__complex__",
                            "nonzero", "argwhere", "is_nonzero", "equal", "allclose", "masked_select", "unique",
                            "unique_consecutive"})
_MASK_INDEXING_CALLS = frozenset({"__getitem__", "__setitem__", "index_put", "index_put_"})


# Every StepCapture holding a captured graph, so a process group can have them released
# before it goes (`release_captures`), whatever still references them.
_HOLDING: "weakref.WeakSet[StepCapture]" = weakref.WeakSet()


def release_captures() -> int:
    """Release every captured graph still alive in this process (`StepCapture.release`)
    and return how many: what `gnnfuse.distributed.leave_process_group` does before
    destroying the group, so a step left referenced (by an exception's traceback, a
    user's variable) cannot hold NCCL work past it."""
    held = list(_HOLDING)
    for capture in held:
        capture.release()
    return len(held)


class CaptureFallbackWarning(UserWarning):
    """A step asked to be captured runs eagerly instead (the message says why)."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"cuda graph mode must be one of {MODES}, got {mode!r}")
    return mode


def check_warmup(warmup: int) -> int:
    """Checked where a capture is built, not at its first padded batch (a block or graph
    capture makes its `StepCapture` there)."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup must be a whole number of at least 1 (the audited call), got {warmup!r}")
    return warmup


class _Audit(TorchFunctionMode):
    """Records the first torch call that a CUDA graph could not replay faithfully.

    A torch *function* mode, not a dispatch mode: while any Python dispatch mode is
    active, torch's backward formulas take their out-of-place variants (`index`'s
    backward makes a zeroed [N, C] gradient and then a second one by ``index_put``
    where it would add in place), so an audited step under a dispatch mode needed more
    memory than the step itself -- on an ogbn-mag-sized R-GCN 2.7 GB more, the peak of
    the whole run. A function mode leaves every op as it is. It sees the torch calls
    made from Python (the forward, the loss, the optimizer); the backward runs inside
    ``Tensor.backward``'s own call, unseen, and on CUDA torch's sync debug mode reports
    its synchronisations (`audit_step`)."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.reason: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.reason is None:
            reason = _unreplayable(func, args, kwargs, out, self.device)
            self.reason = reason and reason + _where_called(reads=func.__name__ in _SYNCING_CALLS)
        return out


_GNNFUSE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_ROOT = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_STDLIB_ROOT = os.path.dirname(os.path.abspath(os.__file__)) + os.sep     # contextlib, functools, ...


def _skipped(path: str) -> bool:
    """A frame of torch, of the standard library (not of the packages installed under it)
    or of this module."""
    if path.startswith(_TORCH_ROOT) or path == os.path.abspath(__file__):
        return True
    return path.startswith(_STDLIB_ROOT) and not any(d in path for d in ("site-packages", "dist-packages"))


def _where_called(reads: bool) -> str:
    """Where the step made the call an audit refuses: the innermost line outside torch, the
    standard library and this module, and, when that line is gnnfuse's, the step's own
    line that led there. A
    reason naming only ``Tensor.tolist`` sent users hunting through their code for a read
    that gnnfuse made (a new graph's ids are checked, and its Triton layouts built, on the
    first calls on it: those reads are why a warm-up of one call cannot capture a step on
    a new graph)."""
    ours = theirs = None
    frame = sys._getframe(1)
    while frame is not None and theirs is None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not _skipped(path):
            place = f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"
            if not path.startswith(_GNNFUSE_ROOT):
                theirs = place
            elif ours is None:
                ours = "gnnfuse/" + path[len(_GNNFUSE_ROOT):] + place[len(path):]
        frame = frame.f_back
    if ours is None:
        return f", at {theirs}" if theirs else ""
    where = f", in {ours}" + (f", called from {theirs}" if theirs else "")
    advice = "; if the step's graph is new, a longer warm-up (warmup=2 or more) lets the audited call find it read"
    return where + advice if reads else where


def _call_name(func) -> str:
    """``Tensor.item``, ``torch.nonzero``, ``torch.nn.functional.cross_entropy``: how a
    user would write the call an audit names."""
    name = getattr(func, "__name__", repr(func))
    owner = getattr(func, "__qualname__", name).rpartition(".")[0]
    if owner in ("TensorBase", "Tensor"):
        return f"Tensor.{name}"
    if owner == "_VariableFunctionsClass" or not owner and getattr(func, "__module__", None) in (None, "torch"):
        return f"torch.{name}"
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else name


def _unreplayable(func, args, kwargs, out, device: torch.device) -> str | None:
    name = getattr(func, "__name__", "")
    if name in _SYNCING_CALLS:
        return f"{_call_name(func)} reads a device value on the host (.item(), nonzero, `if tensor:`, ...)"
    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if name in _MASK_INDEXING_CALLS and any(t.dtype in (torch.bool, torch.uint8) for t in inputs[1:]):
        return f"{_call_name(func)} with a boolean mask counts the mask's entries on the host (index with an int index)"
    made = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    if not made:        # reads metadata only (.shape, .numel(), .device): nothing of the value is frozen
        return None
    for tensor in inputs + made:
        if tensor.device.type != device.type:
            return (f"{_call_name(func)} works on a {tensor.device.type} tensor {list(tensor.shape)}: a capture "
                    f"records only {device.type} work and would freeze that value")
    return None


def audit_step(fn: Callable[[], Any], device: torch.device) -> tuple[Any, str | None]:
    """Run ``fn`` once, for real, and say why a CUDA graph could not replay it (None when
    it can): the first op that synchronises with the host or touches a tensor off
    ``device``, or (on CUDA) any synchronisation torch's sync debug mode reports."""
    audit = _Audit(device)
    syncing = device.type == "cuda"
    previous = torch.cuda.get_sync_debug_mode() if syncing else 0
    caught: list[warnings.WarningMessage] = []
    auditing = threading.get_ident()

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        # The sync debug mode and the warning filters are process-wide, but another
        # thread's sync (a loader's prefetch thread reading a count back) is not the
        # step's: only warnings raised in this thread count; the others are passed on.
        warning = warnings.WarningMessage(message, category, filename, lineno, file, line)
        if threading.get_ident() == auditing:
            caught.append(warning)
        elif "called a synchronizing" not in str(message):
            shown(message, category, filename, lineno, file, line)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown, warnings.showwarning = warnings.showwarning, record
        if syncing:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with audit:
                result = fn()
        finally:
            if syncing:
                torch.cuda.set_sync_debug_mode(previous)
    # torch's report reads "called a synchronizing CUDA operation"; turning the mode on
    # also warns that it "is a prototype feature", which is no synchronisation
    synced = [w for w in caught if "called a synchronizing" in str(w.message)]
    for w in caught:
        if w not in synced and not _about_the_debug_mode(w):     # pass on the step's own warnings
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if audit.reason is None and synced:
        audit.reason = f"the step synchronises with the host ({str(synced[0].message).splitlines()[0]})"
    return result, audit.reason


def _about_the_debug_mode(warning: warnings.WarningMessage) -> bool:
    """torch's notice that the sync debug mode the audit turns on is a prototype: the
    audit's own doing, not the step's (users saw it on every captured run)."""
    text = str(warning.message).lower()
    return "debug mode" in text and "prototype" in text


LEGACY_STREAM_HINT = (". An output of an earlier forward pass that ran outside this step (on the default "
                      "stream) probably still holds its autograd graph, whose AccumulateGrad nodes make the "
                      "captured backward reach the default stream: delete such outputs, or compute them "
                      "under torch.no_grad(), before the step's first call")


def _detached(value: Any) -> Any:
    """``value`` with every tensor in it (nested in tuples, lists and dicts) detached."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple) and hasattr(value, "_fields"):     # a namedtuple
        return type(value)(*(_detached(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _argument_problem(inputs: tuple) -> str | None:
    """Tensors inside a container argument would be read at capture and never again: the
    replay could not see that the container now holds other tensors."""
    for position, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor) and any(isinstance(t, torch.Tensor) for t in tree_flatten(value)[0]):
            return (f"argument {position} is a {type(value).__name__} holding tensors; pass the tensors themselves "
                    "as arguments (they are copied into static buffers) or close over them")
    return None


def _same_value(given: Any, static: Any) -> bool:
    """Whether a non-tensor argument equals the one captured; a container of tensors
    (whose ``==`` is element-wise) counts as changed unless it is the same object."""
    try:
        return bool(given == static)
    except (RuntimeError, TypeError, ValueError):
        return False


class GeneratorStuckError(RuntimeError):
    """A failed capture left the CUDA generator unusable; not something to fall back from."""


def _optimizer_settings(opt: torch.optim.Optimizer) -> list[tuple[list[int], dict[str, Any]]]:
    """Each parameter group's parameters (by id) and settings, as a capture records them:
    a float ``lr`` is a constant of the recorded kernels, a tensor one is read on replay
    (``initial_lr``, which an LR scheduler adds and no step reads, is not a setting)."""
    return [([id(p) for p in group["params"]], {k: v for k, v in group.items() if k not in ("params", "initial_lr")})
            for group in opt.param_groups]


def _check_settings(opt: torch.optim.Optimizer, settings: list, step: str) -> None:
    """Refuse a replay whose optimizer changed since capture: its graph would keep the old
    learning rate (an LR scheduler sets a float ``lr`` the kernels do not read) or update
    the parameters it had (``add_param_group``)."""
    name = type(opt).__name__
    now = _optimizer_settings(opt)
    if [ids for ids, _ in now] != [ids for ids, _ in settings]:
        raise RuntimeError(f"{name}'s parameter groups changed since the {step} was captured (add_param_group?); "
                           "the graph replays the updates of the parameters it was captured with: build a new "
                           "StepCapture")
    for index, ((_, was), (_, given)) in enumerate(zip(settings, now)):
        for key in sorted(was.keys() | given.keys()):
            before, after = was.get(key), given.get(key)
            same = before is after if isinstance(before, torch.Tensor) else _same_value(before, after)
            if not same:
                hint = (" (an LR scheduler?): give the optimizer a tensor learning rate, "
                        "lr=torch.tensor(0.01, device='cuda') (Adam or AdamW with capturable=True), which "
                        "schedulers update in place and the graph reads on each replay, or build a new "
                        "StepCapture" if key == "lr" and
                        not isinstance(before, torch.Tensor) else ": build a new StepCapture")
                raise RuntimeError(f"{name}'s param group {index} {key!r} changed from {before!r} to {after!r} "
                                   f"since the {step} was captured; the graph replays the value it was captured "
                                   f"with{hint}")


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


_CAPTURE_STREAMS: dict[int, Any] = {}
_CAPTURE_STREAMS_LOCK = threading.Lock()


def capture_stream(device: torch.device | int) -> torch.cuda.Stream:
    """The side stream every `StepCapture` on ``device`` warms up and records on.

    What a step creates lazily per stream is then created once per process: above all
    the cuBLAS workspaces (32 MiB per handle and stream on Hopper: the forward's thread
    and autograd's backward thread each have a handle), which a stream of its own per
    capture held anew for every captured step -- as much as a small graph's whole
    training step. ``torch.cuda.graph`` shares one default capture stream the
    same way. Graphs recorded on it share those workspaces, so their replays must not
    overlap on different streams (replays on the current stream, one after another,
    as training runs them, do not)."""
    index = device if isinstance(device, int) else (device.index if device.index is not None
                                                      else torch.cuda.current_device())
    with _CAPTURE_STREAMS_LOCK:
        stream = _CAPTURE_STREAMS.get(index)
        if stream is None:
            stream = _CAPTURE_STREAMS[index] = torch.cuda.Stream(index)
        return stream


class _CudaGraph:
    """torch.cuda.graph behind the two calls `StepCapture` makes, so its bookkeeping can
    be exercised without a GPU by a stand-in with the same interface."""

    def __init__(self, cuda: Any = torch.cuda, stream: Any = None) -> None:
        self.cuda = cuda          # torch.cuda, or a stand-in for its graph and generator calls
        self.graph = cuda.CUDAGraph()
        self.stream = stream      # the stream to record on (None: torch's own capture stream)

    def capture(self, fn: Callable[[], Any]) -> Any:
        self.cuda.synchronize()
        on = {} if self.stream is None else {"stream": self.stream}
        try:
            # thread_local: another thread's CUDA calls (a loader's prefetch thread
            # allocating or reading a count back on its own stream) are no error of the
            # capture; the default, global, failed them with "operation not permitted
            # when stream is capturing"
            with self.cuda.graph(self.graph, capture_error_mode="thread_local", **on):
                return fn()
        except BaseException:
            self._release_generator()
            raise

    def _release_generator(self) -> None:
        """Take the default CUDA generator's state out of capture mode after a failed
        capture, by capturing an empty graph on it.

        ``torch.cuda.graph`` registers the default generator's state with the graph and
        puts it in capture mode (``capture_prologue``); only a successful ``capture_end``
        takes it out (``capture_epilogue`` runs after ``cudaStreamEndCapture`` succeeds,
        aten/src/ATen/cuda/CUDAGraph.cpp, torch 2.11). A failed capture left it in
        capture mode for good: the next eager dropout raised "Offset increment outside
        graph capture encountered unexpectedly", and so would every replay of a graph
        captured earlier. An empty capture runs the prologue and the epilogue on that
        same state, which leaves its seed and offset as they were. Swapping in a copy
        of the state for the capture instead would spare the original, but a graph
        captured on the copy and graphs captured before would then draw the same
        offsets from two states and repeat each other's dropout masks."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")      # torch warns that the graph is empty
                with self.cuda.graph(self.cuda.CUDAGraph()):
                    pass
        except Exception as exc:  # noqa: BLE001 - re-raised as the reason nothing random works
            raise GeneratorStuckError(
                "a failed CUDA graph capture left torch's CUDA generator in capture mode and an empty capture "
                f"could not reset it ({_first_line(exc)}); random ops on this device will fail") from exc

    def replay(self) -> None:
        self.graph.replay()

    def pool_bytes(self) -> int:
        """Bytes of the segments in the graph's private memory pool: what the captured
        step holds from the device between replays, fragmentation included."""
        pool = self.graph.pool()
        return sum(seg["total_size"] for seg in self.cuda.memory_snapshot()
                   if tuple(seg.get("segment_pool_id", ())) == tuple(pool))


def _gradient_hook_problem(modules: Sequence[torch.nn.Module]) -> str | None:
    """DistributedDataParallel averages gradients from backward hooks whose Python-side
    bookkeeping a replay skips (`gnnfuse.distributed.gradients` says why): such a step
    would replay whatever the hooks did at capture, so it is not captured."""
    for top in modules:
        for name, module in top.named_modules():
            if isinstance(module, torch.nn.parallel.DistributedDataParallel):
                where = f" ({name})" if name else ""
                return (f"DistributedDataParallel{where} averages gradients in backward hooks a CUDA graph does not "
                        "replay; pass the bare module and call gnnfuse.distributed.average_gradients("
                        "model.parameters()) between backward() and optimizer.step()")
    return None


def step_device(optimizers: Iterable[torch.optim.Optimizer], modules: Iterable[torch.nn.Module],
                inputs: Iterable[Any]) -> torch.device:
    """The device a training step runs on: its parameters', else its first tensor
    input's (``inputs`` is read only that far: it may be a generator), else CUDA where
    there is one."""
    params = (p for opt in optimizers for g in opt.param_groups for p in g["params"])
    owned = (p for m in modules for p in m.parameters())
    for t in itertools.chain(params, owned, inputs):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class StepCapture:
    """``step = StepCapture(step_fn, optimizers=[opt], modules=[model]); loss = step()``.

    ``step_fn(*inputs)`` is one whole training step (zero the gradients, forward, loss,
    backward, ``optimizer.step()``) returning tensors (e.g. the loss). The first
    ``warmup`` calls run eagerly; the last of them is audited and, when replayable,
    captured; every later call replays the graph. Each call is one real step either way.

    - ``mode``: ``"auto"`` captures on CUDA when the step is replayable and runs eagerly
      elsewhere (silently on the CPU); ``"on"`` warns whenever it cannot capture; ``"off"``
      never captures. `reason` says why a step runs eagerly.
    - ``inputs``: tensor arguments are copied into static buffers made at capture
      (`static_inputs`; write into them to skip the copy; no gradient flows back to
      them). Other arguments (a `Graph`, numbers) must be the same object or equal on
      every call; a container holding tensors is not captured. Tensors the step closes
      over are used in place: they must keep their storage, as parameters must.
    - ``optimizers`` / ``modules``: their parameters are checked not to have been
      replaced, and the modules' train/eval flags not to have changed, before each replay.
      Adam-style optimizers must be built with ``capturable=True``.
    - Outputs are copied out of the graph's static outputs (``copy_outputs=False`` returns
      the static tensors themselves, overwritten by the next replay).
    """

    def __init__(self, step_fn: Callable[..., Any], *, optimizers: Sequence[torch.optim.Optimizer] = (),
                 modules: Sequence[torch.nn.Module] = (), mode: str = "auto", warmup: int = DEFAULT_WARMUP,
                 copy_outputs: bool = True, name: str = "training step",
                 _graph_factory: Callable[[], Any] | None = None):
        check_warmup(warmup)
        self.step_fn, self.optimizers, self.modules = step_fn, list(optimizers), list(modules)
        self.mode, self.warmup, self.copy_outputs, self.name = check_mode(mode), warmup, copy_outputs, name
        self._graph_factory = _graph_factory or _CudaGraph
        self._graph: Any = None
        self._calls = 0
        self.reason: str | None = "disabled (mode 'off')" if mode == "off" else None
        self.static_inputs: list[Any] = []
        self._static_outputs: Any = None
        self._watched: list[tuple[str, torch.Tensor, int]] = []
        self._training: list[bool] = []
        # every module under ``modules`` at capture, walked once, and each one's children:
        # the replay checks their modes and that no child was added, removed or replaced
        # without walking the tree (0.2 ms of a GIN step's 0.8 on an H200's host)
        self._submodules: list[torch.nn.Module] = []
        self._children: list[tuple] = []
        self._stream: torch.cuda.Stream | None = None   # warm-up and capture run on it (`_side_stream`)

    @property
    def captured(self) -> bool:
        return self._graph is not None

    @property
    def status(self) -> str:
        """``"captured"``, ``"warming up"`` or ``"eager: <reason>"``, for logs and reports."""
        if self.captured:
            return "captured"
        return f"eager: {self.reason}" if self.reason else "warming up"

    def pool_bytes(self) -> int:
        """Memory of the captured graph's private pool (0 when not captured)."""
        return self._graph.pool_bytes() if self._graph is not None else 0

    def release(self) -> None:
        """Drop the captured graph, its static buffers and its memory pool; later calls
        run the step eagerly. A graph that recorded NCCL collectives (a data-parallel
        step, `gnnfuse.distributed.average_gradients`) must go before its process group
        is destroyed: with the graphs alive, two H200 ranks that had finished their epochs
        hung leaving the process group and never exited; released first, they exit."""
        if self._graph is not None and self._graph_factory is _CudaGraph:
            torch.cuda.synchronize()         # no replay still running on the graph's memory
        self._graph, self._static_outputs, self.static_inputs = None, None, []
        _HOLDING.discard(self)
        if self.reason is None:
            self.reason = "released (StepCapture.release)"

    def __call__(self, *inputs: Any) -> Any:
        if self._graph is not None:
            return self._replay(inputs)
        if self.reason is not None:
            return self.step_fn(*inputs)
        self._calls += 1
        device = self._device(inputs)
        if self._graph_factory is _CudaGraph and device.type != "cuda":
            self._fall_back(f"CUDA graphs need a CUDA device; the step runs on {device}", warn=self.mode == "on")
            return self.step_fn(*inputs)
        if self._calls < self.warmup:
            return self._eager_on_side_stream(inputs, device)
        reason = self._optimizer_problem(device) or _gradient_hook_problem(self.modules) or _argument_problem(inputs)
        if reason:
            self._fall_back(reason)
            return self.step_fn(*inputs)
        result, reason = audit_step(lambda: self._eager_on_side_stream(inputs, device), device)
        if reason:
            self._fall_back(reason)
            return result
        # The audited call's outputs (a loss) still hold its autograd graph, and with it
        # the parameters' AccumulateGrad nodes; torch accumulates gradients on the stream
        # such a node was made on, so while one made outside the capture stream lives, the
        # captured backward reaches back to that stream and the capture fails. Handing
        # back detached outputs frees the graph before the capture starts.
        result = _detached(result)
        self._capture(inputs)
        return result

    # --- capture ---------------------------------------------------------------------
    def _device(self, inputs: Iterable[Any]) -> torch.device:
        return step_device(self.optimizers, self.modules, inputs)

    def _eager_on_side_stream(self, inputs: tuple, device: torch.device) -> Any:
        """Warm-up as PyTorch's CUDA-graph recipe does it: on a side stream, so lazily
        created per-stream state is not tied to the stream the capture records on."""
        if device.type != "cuda" or self._graph_factory is not _CudaGraph:
            return self.step_fn(*inputs)
        side = self._side_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), steady_executor():     # the kernels the capture will record
            result = self.step_fn(*inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        return result

    def _optimizer_problem(self, device: torch.device) -> str | None:
        for opt in self.optimizers:
            for group in opt.param_groups:
                if group.get("capturable") is False:
                    return (f"{type(opt).__name__} keeps its step count on the host; build it with "
                            "capturable=True")
                for p in group["params"]:
                    if p.device.type != device.type:
                        return f"a parameter of {type(opt).__name__} is on {p.device}, the step on {device}"
        return None

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """One stream for the warm-up steps, the audited step and the capture, so that
        what a step makes lazily per stream (a cuBLAS workspace, the AccumulateGrad nodes
        of the parameters) is made on the stream the capture records on: the device's
        `capture_stream`, shared by every `StepCapture` of the process."""
        if self._stream is None:
            self._stream = capture_stream(device)
        return self._stream

    def _capture(self, inputs: tuple) -> None:
        self.static_inputs = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in inputs]
        graph = _CudaGraph(stream=self._stream) if self._graph_factory is _CudaGraph else self._graph_factory()
        try:
            self._static_outputs = graph.capture(lambda: self.step_fn(*self.static_inputs))
        except GeneratorStuckError:
            raise
        except Exception as exc:  # noqa: BLE001 - any other capture failure means: run eagerly
            self._drop_gradients()
            self.static_inputs = []
            first = f"; raised first in the step: {_first_line(exc.__context__)}" if exc.__context__ else ""
            hint = (LEGACY_STREAM_HINT if "legacy stream" in f"{exc} {exc.__context__}" else "")
            self._fall_back(f"capture failed ({_first_line(exc)}{first}){hint}")
            return
        self._graph = graph
        _HOLDING.add(self)
        self._watched = [(name, p, p.data_ptr(), p.requires_grad) for name, p in self._parameters()]
        self._settings = [_optimizer_settings(opt) for opt in self.optimizers]
        self._submodules = [m for top in self.modules for m in top.modules()]
        self._training = [m.training for m in self._submodules]
        self._children = [tuple(m._modules.values()) for m in self._submodules]

    def _parameters(self) -> list[tuple[str, torch.Tensor]]:
        named = [(f"{type(m).__name__}.{n}", p) for m in self.modules for n, p in m.named_parameters()]
        named += [(f"{type(opt).__name__} parameter {i}", p) for opt in self.optimizers
                  for i, p in enumerate(p for g in opt.param_groups for p in g["params"])]
        return named

    def _drop_gradients(self) -> None:
        """A failed capture may have left ``.grad`` tensors that no kernel ever wrote."""
        for _, p in self._parameters():
            p.grad = None

    def _fall_back(self, reason: str, warn: bool = True) -> None:
        self.reason = reason
        if warn:
            warnings.warn(f"gnnfuse: the {self.name} is not captured in a CUDA graph and runs eagerly: {reason}",
                          CaptureFallbackWarning, stacklevel=3)

    # --- replay ----------------------------------------------------------------------
    def _replay(self, inputs: tuple) -> Any:
        self._check_unchanged(inputs)
        for given, static in zip(inputs, self.static_inputs):
            if isinstance(static, torch.Tensor) and given is not static:
                static.copy_(given)
        self._graph.replay()
        if not self.copy_outputs:
            return self._static_outputs
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self._static_outputs)

    def _check_unchanged(self, inputs: tuple) -> None:
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"the captured {self.name} took {len(self.static_inputs)} argument(s), got {len(inputs)}")
        for position, (given, static) in enumerate(zip(inputs, self.static_inputs)):
            if isinstance(static, torch.Tensor):
                if not isinstance(given, torch.Tensor):
                    raise TypeError(f"argument {position} of the captured {self.name} was a tensor, "
                                    f"got {type(given).__name__}")
                meta = (tuple(given.shape), given.dtype, given.device, given.stride())
                expected = (tuple(static.shape), static.dtype, static.device, static.stride())
                if meta != expected:
                    raise ValueError(f"argument {position} of the captured {self.name} changed from (shape, dtype, "
                                     f"device, stride) {expected} to {meta}; a CUDA graph replays fixed shapes: "
                                     "build a new StepCapture for the new shape")
            elif given is not static and not _same_value(given, static):
                raise ValueError(f"argument {position} of the captured {self.name} changed from {static!r} to "
                                 f"{given!r}; the graph replays the value it was captured with")
        for name, p, pointer, requires_grad in self._watched:
            if p.data_ptr() != pointer:
                raise RuntimeError(f"{name} was given new storage since the {self.name} was captured (e.g. "
                                   "param.data = ...); the graph would update the old memory: load new values "
                                   "in place (load_state_dict, param.copy_) or build a new StepCapture")
            if p.requires_grad != requires_grad:
                raise RuntimeError(f"{name}'s requires_grad changed to {p.requires_grad} since the {self.name} was "
                                   f"captured; the graph replays the gradients and updates it was captured with: "
                                   f"build a new StepCapture")
        for opt, settings in zip(self.optimizers, self._settings):
            _check_settings(opt, settings, self.name)
        if [tuple(m._modules.values()) for m in self._submodules] != self._children:
            raise RuntimeError(f"a submodule was added, removed or replaced since the {self.name} was captured; "
                               "the graph replays the modules it was captured with: build a new StepCapture")
        if [m.training for m in self._submodules] != self._training:
            raise RuntimeError(f"a module switched between train() and eval() since the {self.name} was "
                               "captured; the graph replays the mode it was captured in")
