"""Launching a compiled kernel again without going through ``JITFunction.run``.

Every ``fn[grid](*args)`` call makes Triton bind the arguments to the parameters,
compute each one's specialization (dtype and 16-byte alignment of a tensor, the range,
divisibility by 16 and equality to 1 of an integer), hash that into a cache key, look
the compiled kernel up, and only then call its launcher. On the H200's host that was
about 40 us of a launched neighbour sum's 150 (cProfile, this module's first
measurement), for a choice that does not change between calls of the same launch plan.

`Replays` remembers, per specialization of the arguments (`fingerprint`, computed by the
same rules), the compiled kernel a first launch through Triton returned; later calls with
that fingerprint call the kernel's launcher directly, with the current device's current
stream (a CUDA graph capture's, under `StepCapture`) and Triton's launch hooks, as
``JITFunction.run`` does. Whatever this cannot vouch for goes through Triton: a kernel
whose launch returned no compiled kernel (the interpreter), a Triton without the
``knobs`` module (before 3.4) or without the launcher protocol, and any call while the
JIT function has pre-run hooks or Triton is asked to inspect compilation stages (both
change what ``run`` does before the launch).

A caller whose other arguments never change between calls -- an executor's launch plan,
holding a graph's index arrays and counts -- takes one step more with `BoundLaunch`
(`Replays.bind`): the grid and those arguments fixed, only the call's own tensors'
specialization checked. On the H200's host that took a launched neighbour sum's host
time from 68-120 to 59-84 us per call (39b343f; 59-65 in five of six measurements).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Hashable, Sequence

import torch

try:
    from triton import knobs
except ImportError:   # a Triton before 3.4: every launch goes through JITFunction.run
    knobs = None
try:
    from triton import __version__ as _TRITON_VERSION
except ImportError:
    _TRITON_VERSION = ""

# Fingerprints kept per launch plan: mini-batch blocks vary only in integers' divisibility
_MOST_FINGERPRINTS = 8
_I32 = (-2**31, 2**31 - 1)


# What ``torch.cuda.current_device`` (Triton's driver's ``get_current_device``) and
# ``torch.cuda.is_current_stream_capturing`` return, without their Python wrappers'
# lazy-initialisation checks, which took 0.85 and 0.83 us on the H200's host (one call
# after a synchronize). Used only where a CUDA launch has been made (so CUDA is set up).
# The raw stream of a device index is what Triton's driver's ``get_current_stream`` is
# (what its launches use), less its lookup; torch's stream object where torch lacks it.
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
    (lambda index: torch.cuda.current_stream(index).cuda_stream)


def uncaptured_stream() -> tuple[int, int] | None:
    """(the current device, the handle of its current stream) -- where a launch now
    runs -- or None while that stream is being captured into a CUDA graph."""
    if _capturing():
        return None
    device = _current_device()
    return device, _raw_stream(device)


def current_stream(device: torch.device) -> int:
    """The handle of the current stream on the CUDA ``device``."""
    return _raw_stream(_current_device() if device.index is None else device.index)


def fingerprint(args: Sequence[Any], specialized: Sequence[bool]) -> Hashable:
    """What Triton's specialization of ``args`` depends on: a tensor's dtype and whether
    its address is a multiple of 16, an integer's width and (unless its parameter is in
    ``do_not_specialize``) whether it is 1 or a multiple of 16, any other value itself."""
    out = []
    for value, special in zip(args, specialized):
        if isinstance(value, torch.Tensor):
            out.append((value.dtype, value.data_ptr() % 16 == 0))
        elif isinstance(value, bool) or not isinstance(value, int):
            out.append((type(value), value if value is None or isinstance(value, bool) else None))
        else:
            wide = not _I32[0] <= value <= _I32[1]
            out.append((wide, value == 1, value % 16 == 0) if special else wide)
    return tuple(out)


class DirectLaunch:
    """One compiled kernel and the constant tail of its arguments (the parameters after
    the positional ones: block sizes and other constexprs, in parameter order). It keeps
    nothing of the recording call: its tensors would live as long as the kernel (2 GB of
    a mag-sized step's outputs and inputs, counted in the next benchmark cell's memory,
    when the first version kept them for the grid function)."""

    def __init__(self, compiled: Any, names: list[str], tail: tuple, device: int) -> None:
        self.compiled, self.tail, self.device = compiled, tail, device
        self.positions = {name: n for n, name in enumerate(names)}
        self.bare = bare_launcher(getattr(compiled, "run", None))

    def __call__(self, grid: Callable[[dict], tuple] | tuple, args: Sequence[Any]) -> None:
        self.launch(self.shape(grid, args), (*args, *self.tail))

    def shape(self, grid: Callable[[dict], tuple] | tuple, args: Sequence[Any]) -> tuple[int, int, int]:
        """The launch grid for ``args`` (the positional arguments), as three sizes."""
        shape = grid(_Arguments(self.positions, (*args, *self.tail))) if callable(grid) else grid
        return shape[0], shape[1] if len(shape) > 1 else 1, shape[2] if len(shape) > 2 else 1

    def launch(self, shape: tuple[int, int, int], values: Sequence[Any]) -> None:
        """The compiled kernel on ``values`` (positional arguments and the tail) over
        ``shape``, on the current stream, with Triton's launch hooks. An empty hook
        chain goes to the launcher as None: Triton 3.6 keeps each launch hook as a
        ``HookChain``, never None (a profiler adds its hooks to the chain), so a launch
        handed an empty chain built the hooks' metadata and its launcher called both
        empty chains (3000 launched neighbour sums on the H200's host called
        ``launch_metadata`` 3000 times and a chain 6000), and a launcher given None calls
        no hook, which is what an empty chain does. The hooks' metadata is built only
        where an enter hook will read it: Triton's own ``launch_metadata`` returns None
        without one, after 1.4 us of Python on the H200's host."""
        compiled = self.compiled
        stream = _raw_stream(self.device)
        runtime = knobs.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        if enter is not None and type(enter) is _HOOK_CHAIN and not enter.calls:
            enter = None
        if leave is not None and type(leave) is _HOOK_CHAIN and not leave.calls:
            leave = None
        metadata = None if enter is None else compiled.launch_metadata(shape, stream, *values)
        bare = self.bare
        if bare is not None:
            bare[0](*shape, stream, compiled.function, bare[1], bare[2], None, None, compiled.packed_metadata,
                    metadata, enter, leave, *values)
        else:
            compiled.run(*shape, stream, compiled.function, compiled.packed_metadata, metadata, enter, leave, *values)


def bare_launcher(run: Any) -> tuple[Callable, bool, bool] | None:
    """(the C launch function, the cooperative-grid and PDL flags) beneath Triton 3.6's
    launcher object ``run``, where calling it is what the launcher's ``__call__`` does:
    a kernel without global or profile scratch, for which that ``__call__`` passes
    ``(grid, stream, function, cooperative, pdl, None, None, *args)`` to it. None for
    any other Triton (the launcher's arguments have changed since: 3.9's takes the
    kernel's argument annotations), another launcher or a kernel with scratch.
    Why: the ``__call__`` builds a closure and calls it twice per launch, about 1 us of
    Python on the H200's host in a launched neighbour sum whose whole call took 38 us."""
    if not _TRITON_VERSION.startswith("3.6.") or run is None:
        return None
    code = getattr(getattr(type(run), "__call__", None), "__code__", None)
    if (code is None or code.co_argcount != 6 or not code.co_flags & inspect.CO_VARARGS
            or code.co_varnames[:6] != ("self", "gridX", "gridY", "gridZ", "stream", "function")):
        return None
    launch = getattr(run, "launch", None)
    if (not callable(launch) or getattr(run, "global_scratch_size", None) != 0
            or getattr(run, "profile_scratch_size", None) != 0):
        return None
    return launch, bool(run.launch_cooperative_grid), bool(run.launch_pdl)


_HOOK_CHAIN = getattr(knobs, "HookChain", None)


class Replays:
    """A JIT function's launches under one set of keyword arguments (the autotuner's
    chosen config), launched directly once Triton has launched the same specialization."""

    def __init__(self, fn: Any, kwargs: dict[str, Any]) -> None:
        self.fn, self.kwargs = fn, kwargs
        params = getattr(fn, "params", None)
        self.usable = knobs is not None and params is not None and hasattr(fn, "run")
        self.params = params or []
        self.specialized = [not getattr(p, "do_not_specialize", False) for p in self.params]
        # a compile-time constant passed by position makes a kernel per value, which the
        # fingerprint's integer rules would not tell apart (16 and 32 alike)
        self.constants = tuple([n for n, p in enumerate(self.params) if getattr(p, "is_constexpr", False)])
        self.launches: dict[Hashable, DirectLaunch | None] = {}

    def key(self, args: Sequence[Any]) -> Hashable:
        """What a launch of ``args`` is compiled for: the current device, the arguments'
        `fingerprint` and the values of the compile-time constants among them."""
        constants = tuple([args[n] for n in self.constants if n < len(args)])
        return _current_device(), fingerprint(args, self.specialized), constants

    def replayable(self) -> bool:
        """Whether Triton's state lets a call skip ``JITFunction.run``: the launcher
        protocol is there, and no pre-run hook or stages-inspection hook asks for it."""
        return self.usable and not getattr(self.fn, "pre_run_hooks", None) and \
            getattr(knobs.runtime, "add_stages_inspection_hook", None) is None

    def __call__(self, grid: Callable[[dict], tuple], args: Sequence[Any]) -> None:
        if not self.replayable():
            self.fn[grid](*args, **self.kwargs)
            return
        key = self.key(args)
        direct = self.launches.get(key)
        if direct is not None:
            direct(grid, args)
            return
        compiled = self.fn[grid](*args, **self.kwargs)
        if key not in self.launches and len(self.launches) < _MOST_FINGERPRINTS:
            self.launches[key] = self._record(compiled, args, key[0])

    def _record(self, compiled: Any, args: Sequence[Any], device: int) -> DirectLaunch | None:
        """The direct launch of ``compiled``, or None where it cannot be replayed (no
        compiled kernel came back, or it lacks the launcher protocol)."""
        if compiled is None or not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata",
                                                                       "launch_metadata")):
            return None
        tail = []
        for param in self.params[len(args):]:
            if param.name in self.kwargs:
                tail.append(self.kwargs[param.name])
            elif getattr(param, "has_default", False):
                tail.append(param.default)
            else:
                return None
        return DirectLaunch(compiled, [p.name for p in self.params], tuple(tail), device)

    def bind(self, grid: Callable[[dict], tuple], args: Sequence[Any], varying: Sequence[int],
             made: int = 0) -> BoundLaunch | None:
        """``args``' launch with everything but the positions ``varying`` fixed (see
        `BoundLaunch`; the first ``made`` of those the caller's own), once a launch of
        their specialization has been recorded; None before that, or where Triton's
        state sends calls through ``run``."""
        if not self.replayable():
            return None
        key = self.key(args)
        direct = self.launches.get(key)
        if direct is None:
            return None
        return BoundLaunch(self, direct, key[0], direct.shape(grid, args), args, varying, made)


class BoundLaunch:
    """One launch plan's direct launch: the kernel, the grid and every argument that does
    not change between the plan's calls (index arrays, counts, block sizes) in place,
    and for the tensors that do (the output and the inputs) the dtype and 16-byte
    alignment they were specialized on. A call checks only those tensors -- the rest of
    `Replays`' fingerprint, and the grid, are the plan's own constants -- so it costs a
    few attribute reads before the launcher instead of a walk over every argument. A
    call it cannot vouch for (another specialization of a varying tensor, another
    device, a hook Triton must run) launches nothing and returns False, and the caller
    goes the general way. It keeps no varying tensor: they belong to the call.

    The fixed tensors go to the launcher as their addresses, and the bound launch holds
    the tensors themselves (``held``) so those addresses stay theirs. Triton's launcher
    takes an integer pointer as it is, while for a tensor it calls ``data_ptr()`` and
    asks the driver whether the address is a device pointer (``cuPointerGetAttribute``):
    about 0.5 us an argument on the H200's host, for arrays that Triton's own launches
    of this plan have already checked. A varying tensor goes as its address too where it
    is a CUDA tensor on the device the plan's first one was on, which spares the
    launcher the same query for it; one anywhere else goes as the tensor, to meet
    Triton's check as before.

    The first ``made`` varying tensors may be the caller's own, made for every call with
    the plan's dtypes on its device (an executor's outputs and workspace): where, as
    bound, each was a 16-byte aligned CUDA tensor on the launch's device, a call passes
    their addresses unchecked (the caching allocator aligns every block, and a call on
    another device launches nothing). That skipped about 0.45 us of checks per tensor on
    the 2-core CI machine, two or three tensors per launched neighbour sum."""
    __slots__ = ("replays", "direct", "device", "shape", "fixed", "held", "made", "checked", "expected")

    def __init__(self, replays: Replays, direct: DirectLaunch, device: int, shape: tuple[int, int, int],
                 args: Sequence[Any], varying: Sequence[int], made: int = 0) -> None:
        self.replays, self.direct, self.device, self.shape = replays, direct, device, shape
        varying = tuple(varying)
        self.held = tuple([a for n, a in enumerate(args) if n not in varying and isinstance(a, torch.Tensor)])
        self.fixed = [None if n in varying else a.data_ptr() if isinstance(a, torch.Tensor) else a
                      for n, a in enumerate(args)] + list(direct.tail)
        # per varying tensor: its dtype, its alignment, and its CUDA device (None for another kind)
        expected = tuple((args[n].dtype, args[n].data_ptr() % 16 == 0,
                          args[n].get_device() if args[n].is_cuda else None) for n in varying)
        if not all(aligned and on == device for _, aligned, on in expected[:made]):
            made = 0
        self.made, self.checked, self.expected = varying[:made], varying[made:], expected[made:]

    def __call__(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Launch with ``tensors`` in the varying positions, in order; False (nothing
        launched) where the call needs Triton's general path."""
        device = self.device
        if not self.replays.replayable() or _current_device() != device:
            return False
        values = self.fixed.copy()
        made = self.made
        for position, tensor in zip(made, tensors):
            values[position] = tensor.data_ptr()
        for position, tensor, (dtype, aligned, on) in zip(self.checked, tensors[len(made):] if made else tensors,
                                                          self.expected):
            address = tensor.data_ptr()
            if tensor.dtype != dtype or (address % 16 == 0) != aligned:
                return False
            values[position] = address if on is not None and tensor.is_cuda and tensor.get_device() == on else tensor
        self.direct.launch(self.shape, values)
        return True


class _Arguments:
    """This call's arguments by parameter name, as a grid function reads them (Triton
    passes it the bound arguments)."""
    __slots__ = ("positions", "values")

    def __init__(self, positions: dict[str, int], values: tuple) -> None:
        self.positions, self.values = positions, values

    def __getitem__(self, name: str) -> Any:
        return self.values[self.positions[name]]
