"""Inference calls of a compiled program on one graph, checked in one pass.

A call of `CompiledProgram` checks its inputs against the graph (present, on its device,
dense, the right shape), decides whether autograd records it, picks the backend from
the environment, and hands over to the backend, which picks its plans. On a small graph
a neighbour sum's kernel takes about 10 us and that Python took several times as long.

When a program is called twice in a row without gradients on one graph with inputs of
the same shapes, dtypes and devices, it keeps a `PreparedCall`: those inputs' metadata
and the backend's `PreparedRun` (only the Triton backend has one). A later call is run
by it only when every one of those compares equal -- the same graph object (graphs are
immutable; one written in place is refused, `Graph.check_unchanged`), each input a tensor of the dtype, device and layout it ran with (a front
end's repeat call, frontend/repeat_call.py, hands over tables it has not type-checked),
no input needing a gradient while gradients are enabled, no `record_calls` block open,
and then the backend's own checks (`PreparedRun.run`: the inputs' shapes and its
settings, which include the variables that chose the backend: `preparer`) -- so it
computes what the full path would; otherwise the call takes the full path, which
reports any error. A program of one input goes to the backend's `run_one` first, which
launches the plan it holds without `run`'s dicts, and to `run` where that declines.

Launched first. That one-input call (a repeated neighbour sum's, a GCN aggregation's)
makes its checks after the launch, not before. The backend's `run_one` checks what makes
its launch safe -- the plan was made for this graph, the input is a dense tensor of the
plan's device, dtype and shape (so of the inputs this call ran with) -- launches, and
only then compares its settings; this call's checks (no `record_calls` block, no
gradient wanted) and the front end's (frontend/repeat_call.py: the same program, by the
trace cache and the guard) follow while the kernel runs. Where one fails the call
returns None and the caller runs the full path: the kernel launched wrote only into the
outputs the backend made for it (and a scan's next output, which it zeroes as every run
does), which nobody sees. Why: a launched call's latency is the host's work before its
launch plus the kernel, where the kernel outlasts the work after it (the checks, the
result); on the 2-core CI machine the Python before a repeated neighbour sum's launch
went from 7.4-8.5 us to 2.4 us. A kernel shorter than the checks after it (an
arxiv-sized F = 1 sum, 10 us) still waits for all of them.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Mapping

import torch

from ..graph import Graph
from ..graph.index_cache import functorch_interpreter
from .autocast import autocast_dtype

# The variables `compiled.select_backend` reads: a prepared run declines once they change
# (`preparer`), which spares a prepared call reading them itself.
BACKEND_VARIABLES = ("GNNFUSE_BACKEND", "TRITON_INTERPRET")


class PreparedCall:
    """An inference run of one program on one graph (see the module docstring)."""

    def __init__(self, graph: Graph, keys: tuple[str, ...], tensors: list[torch.Tensor],
                 run: Any, recorders: list) -> None:
        """``run``: the backend's prepared run for ``graph`` (`preparer`'s), with ``run(graph,
        feeds)`` and, for a program of one input, ``run_one(graph, tensor)``."""
        self._graph = weakref.ref(graph)
        self._keys = keys
        self._metas = tuple([(t.dtype, t.device) for t in tensors])     # shapes: the backend's run checks them
        self._run = run.run
        self._run_one = run.run_one if len(keys) == 1 else None
        self._recorders = recorders

    @property
    def graph(self) -> Graph | None:
        """The graph it runs on (None once that graph is gone)."""
        return self._graph()

    def __call__(self, graph: Graph, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """The program's outputs on ``graph`` and ``feeds``, or None where any check differs
        (or inside a ``torch.func`` transform, which the full path checks)."""
        if (self._graph() is not graph or self._recorders or functorch_interpreter() is not None
                or autocast_dtype(graph.device.type) is not None     # the full path turns autocast off
                or torch._C._get_tracing_state() is not None):       # the full path refuses torch.jit.trace
            return None
        graph.check_unchanged()     # the run's plans hold the layouts of the edges it was built with
        grad = torch.is_grad_enabled()
        for key, (dtype, device) in zip(self._keys, self._metas):
            t = feeds.get(key)
            if not _fits(t, dtype, device, grad):
                return None
        if self._run_one is not None:       # one input: ``t``, checked
            outputs = self._run_one(graph, t)
            if outputs is not None:
                return outputs
        result = self._run(graph, feeds)
        return None if result is None else result[0]

    def call_one(self, graph: Graph, tensor: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """``self(graph, {key: tensor})`` for a program of one input, launched first (see
        the module docstring): the backend's ``run_one`` checks what makes its launch
        safe and launches, and this call's checks follow while the kernel runs."""
        if (self._graph() is not graph or self._run_one is None or functorch_interpreter() is not None
                or autocast_dtype(graph.device.type) is not None or torch._C._get_tracing_state() is not None):
            return None
        graph.check_unchanged()     # before the launch: ids written in place since were never range-checked
        outputs = self._run_one(graph, tensor)
        if outputs is not None:     # ``tensor`` is of the plan's device and dtype: those of the inputs it ran with
            return None if self._recorders or (tensor.requires_grad and torch.is_grad_enabled()) else outputs
        if not self._takes(tensor):     # nothing launched, or dropped: the checks first, then ``run``
            return None
        result = self._run(graph, {self._keys[0]: tensor})
        return None if result is None else result[0]

    def _takes(self, tensor: object) -> bool:
        """`__call__`'s checks but the graph's, for a program of one input fed ``tensor``."""
        return not self._recorders and _fits(tensor, *self._metas[0], torch.is_grad_enabled())


def _fits(t: object, dtype: torch.dtype, device: torch.device, grad: bool) -> bool:
    """Whether ``t`` is an input a prepared call takes where the inputs it ran with were of
    ``dtype`` on ``device``: a dense tensor of them, not needing a gradient while gradients
    are on (``grad``)."""
    return (isinstance(t, torch.Tensor) and t.dtype == dtype and t.device == device
            and t.layout is torch.strided and not (grad and t.requires_grad))


def preparer(backend: str) -> Callable[..., Any] | None:
    """The backend's ``(program, graph) -> PreparedRun`` (the one its `execute` keeps), if
    it has prepared runs. Its ``run`` and ``run_one`` return None once any of
    `BACKEND_VARIABLES` differs from when it was made (the Triton backend's settings
    hold their values: `executor.SELECTION_VARIABLES`): it was made while they chose
    this backend, so while they are unchanged they choose it still."""
    if backend != "triton":
        return None
    from ..backend.triton import held_run
    return held_run
