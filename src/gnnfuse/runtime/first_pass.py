"""Which executor runs a program on a small graph's first pass on a GPU.

A PyG training loop over many small graphs (graph classification: a ``DataLoader``
collating molecules) hands every step a new ``edge_index``. The Triton backend then
builds, per step, what its kernels read of the graph -- the CSR sort, degrees, row
segments, launch plans -- and compiles kernel variants for shapes it has not seen; on a
few thousand edges that host work is the step's cost, and the kernels it enables save
microseconds. The reference executor's torch gathers and scatters need none of it. On
an H200 (128 molecule-sized graphs a batch, 4 layers x 128, a new graph every step,
steps interleaved) the reference executor took GIN from 7.93 to 5.70 ms a step, GCN
from 7.10 to 4.50, GraphSAGE from 7.93 to 6.02 and GAT from 14.28 to 12.37, and at
1,024 graphs a batch (55K edges) from 6.73-13.37 to 4.60-11.61 ms. On a graph used
again, the Triton backend's cached layouts and plans win (the same batch every step:
GIN 5.02 against 5.60, GCN 3.70 against 4.70, GAT 7.87 against 10.32).

So a graph made by a layer call from a raw index tensor (`Graph.coerce`; graphs
derived from it inherit the mark) is on its *first pass* until a backward pass has run
on it: until then its programs run on the reference executor when it has at most
`FIRST_PASS_EDGES` edges, forward and backward alike (the backward runs on the
forward's executor). From the next step on, a graph kept by the index cache (the same
``edge_index`` again: full-graph training) runs on Triton. Graphs built explicitly
(`Graph(...)`, a loader's blocks with their layouts built ahead, a captured step's
padded graph) never are on a first pass, nor is anything while a CUDA graph is being
captured, under a forced schedule, inside a captured step's warm-up calls
(`steady_executor`: the capture records the kernels its last warm-up call ran, and a
Triton kernel must not compile while a capture records) or with ``GNNFUSE_BACKEND``
set. A small graph used only for inference (no backward ever) stays on the reference
executor.

Where every op of a program has a reference that torch's autograd differentiates as its
derivative rule does (`OpDef.autograd_reference`), a first pass that needs gradients runs
the forward program's torch ops under autograd and leaves the backward to torch, as PyG's
step does: no autograd Function, no backward program walked op by op in Python. On an
H200 (the step above, 128 graphs a batch) that took GIN from 6.11 to 5.49 ms a step,
GCN from 5.83 to 5.44, GraphSAGE from 6.19 to 5.57 and GAT from 10.07 to 9.53. A hook
on the outputs ends the graph's first pass once the backward pass their gradient arrives
in has finished (`end_after_backward`).

The reference executor writes each gathered edge table (|E| x width) where the fused
kernels would not; at `FIRST_PASS_EDGES` edges that is at most 32 MB per table at 128
float32 lanes, and larger graphs keep the Triton backend's IO-aware kernels.
"""
from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterable, Iterator

import torch

from ..backend.forced_schedule import forced_schedule
from ..environ import getenv

# At 55K edges (1,024 molecule-sized graphs a batch) the first pass was still 1.8-2.1 ms
# a step faster on the reference executor (H200), so the bound is set by the edge tables
# it writes, not by speed.
FIRST_PASS_EDGES = 65_536

_STEADY: ContextVar[bool] = ContextVar("gnnfuse_steady_executor", default=False)

# ``torch.cuda.is_current_stream_capturing`` without its Python wrapper (a call per
# program run on a GPU); asked only of a graph on a CUDA device, so CUDA is set up
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


@contextmanager
def steady_executor() -> Iterator[None]:
    """Run the block on each device's backend, first passes included (a captured
    step's warm-up: `cuda_graph.StepCapture`)."""
    token = _STEADY.set(True)
    try:
        yield
    finally:
        _STEADY.reset(token)


def first_pass_executor(graph: Any, name: str) -> str:
    """``name`` (the backend `compiled.backend_name` chose), or "reference" where it is the
    Triton backend by default and ``graph`` is a small graph on its first pass (module doc)."""
    if (name != "triton" or not getattr(graph, "first_pass", False) or graph.num_edges > FIRST_PASS_EDGES
            or getenv("GNNFUSE_BACKEND") or forced_schedule() is not None or _STEADY.get()
            or (graph.device.type == "cuda" and _capturing())):
        return name
    return "reference"


def end_after_backward(graph: Any) -> None:
    """Mark ``graph`` as past its first pass once the backward pass now running finishes
    (called from within it), unless a checkpointed run on it still waits for its own
    backward then (`Waiting`). Not at once: a checkpointed layer recomputed later in the
    same backward must run as its forward did -- torch's checkpoint refuses recomputed
    values of other shapes (GAT's unfolded logits, `nn.conv._folds`), and a program run
    under autograd saves other values than its autograd Function does."""
    _end_after_backward(weakref.ref(graph))


def _end_after_backward(ref: weakref.ref) -> None:
    """`end_after_backward` of the graph ``ref`` refers to, if it still lives then."""
    def ended() -> None:
        graph = ref()
        if graph is not None:
            graph.first_pass_backward = True
            _end_unless_waiting(graph)
    torch.autograd.Variable._execution_engine.queue_callback(ended)


def _end_unless_waiting(graph: Any) -> None:
    """End ``graph``'s first pass if a backward pass has run on it and no checkpointed
    run waits for its own (`Waiting`)."""
    if getattr(graph, "first_pass_backward", False) and not getattr(graph, "first_pass_waiting", 0):
        graph.first_pass = False


# torch's innermost saved-tensor hooks, as its checkpoint reads them (None where this
# torch has no such call: no run then counts as checkpointed)
_top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def checkpointed() -> bool:
    """Whether the forward running now is inside torch's non-reentrant checkpoint (its
    saved-tensor hooks are the innermost), whose backward will recompute it."""
    hooks = _top_hooks(False) if _top_hooks is not None else None
    return hooks is not None and "_checkpoint_hook" in getattr(hooks[0], "__qualname__", "")


class Waiting:
    """A checkpointed program run of ``graph``'s first pass (``use_reentrant=False``),
    whose backward will recompute its forward.

    The recompute must run as that forward did -- on the reference executor, saving the
    same values -- so the graph's first pass does not end while such a run waits: a
    backward of another output on the same graph (a second view of it, a second loss)
    ended the first pass before the waiting output's recompute, which then ran on Triton
    and failed with torch's CheckpointError. Only checkpointed runs wait: an output kept
    without a backward (an evaluation run with grad enabled, kept until the next one)
    would otherwise keep every later step on the first pass. A run stops waiting when its
    backward arrives (`arrived`) or when the autograd graph holding it (the autograd
    Function's context, or the hooks on its outputs, which their grad_fn keeps) is freed
    without one -- not its output tensors, which a layer often lets go at once (a
    reshape, a bias added) while their backward is still to come."""
    __slots__ = ("ref", "open")

    def __init__(self, graph: Any) -> None:
        self.ref, self.open = weakref.ref(graph), True   # (not the graph: the autograd graph lives longer)
        graph.first_pass_waiting = getattr(graph, "first_pass_waiting", 0) + 1

    def __del__(self) -> None:
        self._let_go()

    def arrived(self) -> None:
        """This run's backward arrived (called from within the backward pass)."""
        self._close()
        _end_after_backward(self.ref)

    def _let_go(self) -> None:
        """Freed: this run waits no more, and the graph's first pass ends here if a
        backward pass ran on it and nothing else waits."""
        if self.open:
            self._close()
            graph = self.ref()
            if graph is not None:
                _end_unless_waiting(graph)

    def _close(self) -> None:
        if self.open:
            self.open = False
            graph = self.ref()
            if graph is not None:
                graph.first_pass_waiting -= 1


def end_on_backward(graph: Any, outputs: Iterable[torch.Tensor]) -> None:
    """`end_after_backward` once the gradient of any of ``outputs`` (a program's outputs
    computed under autograd) arrives -- through a `Waiting` run inside a checkpoint --,
    as `_ProgramFunction.backward` does for a program run through it. Outputs without a
    ``grad_fn`` (an input handed back as it was) get no hook: it would stay on the
    caller's tensor."""
    graded = [out for out in outputs if out.grad_fn is not None]
    if not graded:
        return
    # (a hook holding the graph would keep it while the output lives: a weak reference)
    arrived = Waiting(graph).arrived if checkpointed() else functools.partial(_end_after_backward, weakref.ref(graph))
    for out in graded:
        out.register_hook(lambda grad: arrived())
