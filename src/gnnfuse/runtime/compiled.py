"""Wraps a forward program and its generated backward in a `torch.autograd.Function`.

The backward program is built once per set of inputs that need gradients and cached;
the forward run keeps only the values that backward program reads (its ``saved:``
inputs), so every other intermediate is freed as soon as the forward is done with it.
"""
from __future__ import annotations

import operator
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

import torch
from torch.autograd import forward_ad

from ..autodiff import BackwardProgram, build_backward
from ..backend.forced_schedule import ForcedSchedule, forced_schedule, forcing
from ..backend.reference import GraphContext
from ..graph import Graph, GraphModifiedError
from ..graph.index_cache import functorch_interpreter
from ..graph.capture_refusals import refuse_jit_trace
from ..ir import CompileError, Movement, Program, Residency, Value, get_op, verify
from ..ir.ops.movement import BROADCAST_FROM, TYPE_INDICES
from ..ir.sides import declare_sides, sides_of
from ..passes import optimize
from ..passes.pair_sources import SourcePairRewrite, rewrite_for_source_pairs
from ..environ import flag, getenv
from .autocast import AUTOCAST_DEVICE_TYPES
from .first_pass import Waiting, checkpointed, end_after_backward, end_on_backward, first_pass_executor
from .interpreter import interpreter_lacks_bfloat16
from .output_views import rebuild_views, views_of_outputs
from .pair_graph import pair_graph, pair_matmul, pair_rows, reads_edge_types
from .prepared_call import PreparedCall, preparer
from .settings_check import check_settings

PAIR_SOURCES_ENV = "GNNFUSE_PAIR_SOURCES"     # "0": programs keep their compact products per edge
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


class CompiledProgram:
    """An optimized program plus lazily built backward programs, runnable on any graph."""

    def __init__(self, program: Program, optimize_program: bool = True):
        verify(program)
        # The passes rewrite in place: keep the listing as traced for `gnnfuse.explain`.
        self.traced = program.pretty()
        self.program = optimize(program) if optimize_program else program
        self._backward: dict[tuple[str, ...], BackwardProgram] = {}
        self._backward_inputs: dict[tuple[str, ...], BackwardInputs] = {}
        # a call's ``needs_input_grad`` -> (its backward program or None,): `_ProgramFunction.forward`
        self._backward_by_needs: dict[tuple[bool, ...], tuple[BackwardProgram | None]] = {}
        self._types_read = _types_read(self.program)
        self._bfloat16 = any(v.dtype == torch.bfloat16 for v in self.program.values)   # `program_backend`
        self._input_keys = tuple(self.program.inputs)
        # every op's torch reference differentiates as its derivative rule (public: `explain`
        # says so): a small graph's first pass runs the forward under autograd (`_run_under_autograd`)
        self.runs_under_autograd = runs_under_autograd(self.program)
        # a program whose every output is integer or boolean has no gradient to give: its
        # backward would be a program without outputs (and torch never calls it)
        self.differentiable = any(v.dtype.is_floating_point or v.dtype.is_complex
                                  for v in self.program.outputs.values())
        self._gradient_keys = tuple(f"grad:{key}" for key in self._input_keys)
        # the program on the graph of (source, relation) pairs (passes/pair_sources.py),
        # compiled on its first run
        self._pair_rewrite: SourcePairRewrite | None = rewrite_for_source_pairs(self.program)
        self._on_pairs: CompiledProgram | None = None
        # inference on one graph (runtime/prepared_call.py): the call kept (public: a front
        # end's repeat call, frontend/repeat_call.py, runs it), and the last full-path
        # inference call's (graph, input metadata) that decides when to keep one
        self.prepared: PreparedCall | None = None
        self._last_inference: tuple | None = None
        self._may_alias = _may_alias_inputs(self.program)
        self._output_views = views_of_outputs(self.program)

    def backward_for(self, wrt: tuple[str, ...]) -> BackwardProgram:
        """The backward program giving the gradients of the inputs ``wrt``. Its ``wrt`` is
        empty where no such input reaches an output through a differentiable op (``x **
        0``, whose derivative is zero, as torch's): then it has no outputs and is not
        optimized (the verifier refuses an output-less program), and callers give the
        inputs zero gradients without running it."""
        if wrt not in self._backward:
            backward = build_backward(self.program, wrt)
            if backward.wrt:
                backward.program = optimize(backward.program, keep_inputs=True)
                _drop_unread_saved(backward)
                _declare_backward_sides(self.program, backward)
            self._backward[wrt] = backward
        return self._backward[wrt]

    def backward_inputs(self, backward: BackwardProgram) -> BackwardInputs:
        """How ``backward`` (one of `backward_for`'s) is fed, worked out once per program."""
        found = self._backward_inputs.get(backward.wrt)
        if found is None or found.backward is not backward:
            outputs = list(self.program.outputs)
            found = self._backward_inputs[backward.wrt] = BackwardInputs(
                backward, tuple(v.id for v in backward.saved), tuple(f"saved:{v.id}" for v in backward.saved),
                tuple((f"grad:{key}", n) for n, key in enumerate(outputs)
                      if f"grad:{key}" in backward.program.inputs))
        return found

    def checked_inputs(self, graph: Graph, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """The program's inputs from ``feeds``, in program order, after checking each fits
        ``graph`` (types, device, layout)."""
        keys = self._input_keys
        try:
            tensors = list(map(feeds.__getitem__, keys))    # (no comprehension: a Python call in 3.11)
        except KeyError:
            missing = [k for k in keys if k not in feeds]
            raise KeyError(f"missing inputs {missing}; the program reads {list(keys)}") from None
        if self._types_read:
            _check_types(self.program, self._types_read, graph, feeds)
        device = graph.device
        for n, (key, tensor) in enumerate(zip(keys, tensors)):
            if tensor.device != device:
                if tensor.dim() == 0 and tensor.device.type == "cpu":
                    # torch lets a 0-dim CPU tensor meet any device's, as a number: a UDF
                    # capturing ``torch.tensor(1e8)`` runs eagerly on CUDA data
                    tensors[n] = tensor.to(device)
                else:
                    _device_error(key, tensor, device)
            if tensor.layout is not torch.strided:
                raise ValueError(f"input {key!r} is a {tensor.layout} tensor; compiled programs take dense "
                                 "tensors (convert with .to_dense(), or apply the dense transform first)")
        return tensors

    @property
    def input_keys(self) -> tuple[str, ...]:
        """The names of the program's inputs, in program order."""
        return self._input_keys

    def __call__(self, graph: Graph, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        prepared = self.prepared
        if forward_ad._current_level >= 0 and _tangents(feeds.values()):     # one attribute read otherwise
            _check_forward_ad(graph, feeds)
            prepared = None       # the full path, whose torch ops carry the tangents
        if prepared is not None:
            outputs = prepared(graph, feeds)
            if outputs is not None:
                return outputs
        check_settings()
        if isinstance(graph, Graph):
            graph.check_unchanged()     # its layouts (and the backends' plans) describe the edges it was built with
        if torch._C._get_tracing_state() is not None:
            refuse_jit_trace("a compiled gnnfuse program called")
        keys = self._input_keys
        tensors = self.checked_inputs(graph, feeds)
        if functorch_interpreter() is not None:     # inside torch.func.grad/vmap/...: one C call otherwise
            _check_functorch_transform(graph, keys, tensors)
        if (self._pair_rewrite is not None and isinstance(graph, Graph) and graph.edge_type is not None
                and flag(PAIR_SOURCES_ENV, True)):
            by_key = dict(zip(keys, tensors))
            if (all(p.index is None or reads_edge_types(graph, by_key[p.index], by_key[p.w].shape[0])
                    for p in self._pair_rewrite.products)
                    and all(reads_edge_types(graph, by_key[t.index], by_key[t.table].shape[0])
                            for t in self._pair_rewrite.lookups)):
                return self._run_on_pairs(graph, by_key)
        if torch.is_grad_enabled() and any(map(_REQUIRES_GRAD, tensors)):
            if self.runs_under_autograd and on_first_pass(graph):
                return self._run_under_autograd(graph, keys, tensors)
            # the program, graph and keys as one argument: torch's apply walks every argument
            # in Python before its C part (`unwrap_dead_wrappers`), a generator step and an
            # isinstance call each
            outputs = _ProgramFunction.apply((self, GraphContext(graph), keys), *tensors)
        else:   # inference: no backward program is built and nothing is saved for one
            outputs, _, _ = _run_forward(self, GraphContext(graph), keys, tensors, None)
            self._note_inference(graph, tensors)
        return dict(zip(self.program.outputs, outputs))

    def _run_under_autograd(self, graph: Graph, keys: tuple[str, ...], tensors: list[torch.Tensor]
                            ) -> dict[str, torch.Tensor]:
        """A small graph's first pass (runtime/first_pass.py) of a program whose ops all
        differentiate under torch's autograd as their rules say: the forward's torch ops
        run under autograd, which then gives the backward itself, as for eager code."""
        wrt = tuple([k for k, t in zip(keys, tensors) if t.requires_grad]) if _RECORDERS else ()
        outputs, _, _ = _run_forward(self, GraphContext(graph), keys, tensors, None, wrt)
        end_on_backward(graph, outputs)
        return dict(zip(self.program.outputs, outputs))

    def _note_inference(self, graph: Graph, tensors: list[torch.Tensor]) -> None:
        """After a full-path inference call: keep a `PreparedCall` when the one before was
        on the same graph with inputs of the same metadata (so a mini-batch loop, a new
        graph per call, never pays to prepare one), where the backend has a prepared run.
        Never for a program whose outputs may share an input's memory (`_own_storage`) or
        view one another (`rebuild_views`)."""
        if self._may_alias or self._output_views:
            return
        seen = (weakref.ref(graph), tuple([(t.shape, t.dtype, t.device) for t in tensors]))
        last, self._last_inference = self._last_inference, seen
        if last is None or last[0]() is not graph or last[1] != seen[1] or _RECORDERS:
            return
        if graph.device.type in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(graph.device.type):
            return      # a prepared call declines every call under autocast (`PreparedCall.__call__`)
        if self._pair_rewrite is not None and graph.edge_type is not None:
            return      # whether it runs on the pair graph depends on more than the prepared call checks
        backend = program_backend(graph.device, self._bfloat16)
        if first_pass_executor(graph, backend) != backend:
            return      # the same graph again within one forward (layers sharing a program): no reuse yet
        run = preparer(backend)
        if run is not None:
            self.prepared = PreparedCall(graph, self._input_keys, tensors, run(self.program, graph), _RECORDERS)

    def _run_on_pairs(self, graph: Graph, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the pair-graph form of the program (passes/pair_sources.py): its pair
        products and lifted source tables computed here, differentiably, then the
        rewritten program on the pair graph."""
        rewrite = self._pair_rewrite
        if self._on_pairs is None:
            self._on_pairs = CompiledProgram(rewrite.program)
        pair_feeds = dict(feeds)
        for product in rewrite.products:
            pair_feeds[product.key] = pair_matmul(graph, feeds[product.x], feeds[product.w]).view(-1, *product.shape)
        for key in rewrite.lifted:
            pair_feeds[key] = pair_rows(graph, feeds[key])
        for lookup in rewrite.lookups:     # a table read by the graph's edge types is per-type data
            pair_feeds[lookup.key] = feeds[lookup.table]
        return self._on_pairs(pair_graph(graph).graph, pair_feeds)


def runs_under_autograd(program: Program) -> bool:
    """Whether torch's autograd through ``program``'s references gives the gradients its
    backward program would: every op is marked ``autograd_reference``, and the mark holds
    for the op's attrs wherever a gradient reaches it. A value read only through
    ``stop_gradient`` (a softmax's maximum, which torch would count ties of differently:
    ir/ops/movement.py) gets none."""
    reached, stack = set(), list(program.outputs.values())
    while stack:
        v = stack.pop()
        if v.id not in reached:
            reached.add(v.id)
            if v.op != "stop_gradient":
                stack.extend(v.inputs)
    for v in program.values:
        if v.op != "input":
            op = get_op(v.op)
            if not op.autograd_reference or (v.id in reached and not op.differentiates_under_autograd(v.attrs)):
                return False
    return True


def _drop_unread_saved(backward: BackwardProgram) -> None:
    """Stop saving the forward values the optimized backward program no longer reads.
    Derivative rules ask for every operand they might need (``mul``'s for both factors)
    before dead-code elimination knows which gradients are wanted; each unread one kept
    a forward value alive until the backward (GCN kept its [N, F] sum) and forced the
    forward to write it, which stopped the sum's unit from fusing the ``* norm`` after it."""
    program = backward.program
    read = {i.id for v in program.values for i in v.inputs} | {v.id for v in program.outputs.values()}
    unread = {k for k, v in program.inputs.items() if k.startswith("saved:") and v.id not in read}
    if not unread:
        return
    dropped = {program.inputs[k].id for k in unread}
    program.inputs = {k: v for k, v in program.inputs.items() if k not in unread}
    program.values = [v for v in program.values if v.id not in dropped]
    backward.saved = [v for v in backward.saved if f"saved:{v.id}" not in unread]


class BackwardInputs(NamedTuple):
    """A backward program's inputs: the ids of the forward values it reads (saved by the
    forward run, in ``backward.saved`` order) and their input names, and the input name
    of each forward output's gradient it reads with that output's position."""
    backward: BackwardProgram
    saved_ids: tuple[int, ...]
    saved_keys: tuple[str, ...]
    gradients: tuple[tuple[str, int], ...]


def _declare_backward_sides(forward: Program, backward: BackwardProgram) -> None:
    """A backward program's inputs are forward values (``saved:<id>``) and gradients of
    forward outputs (``grad:<key>``): each is a table of the vertex set its forward value
    is (ir/sides.py), whatever the backward program does with it."""
    sides = sides_of(forward)
    seeds = {}
    for key, value in backward.program.inputs.items():
        kind, _, name = key.partition(":")
        origin = int(name) if kind == "saved" else forward.outputs[name].id if kind == "grad" else None
        if origin in sides:
            seeds[value.id] = sides[origin]
    declare_sides(backward.program, seeds)


def _device_error(key: str, tensor: torch.Tensor, device: torch.device) -> None:
    """Fail before running when an input is not on the graph's device: the reference
    backend would stop inside a gather with torch's device message, and a Triton kernel
    given a host index array reads memory it does not own."""
    raise ValueError(f"input {key!r} (shape {list(tensor.shape)}) is on {tensor.device} but the graph "
                     f"is on {device}; move one of them (tensor.to(device) or graph.to(device))")


_TYPE_KINDS = {  # residency -> (what it is per, Graph attribute holding the count)
    Residency.EDGE_TYPE: ("edge", "num_edge_types"),
    Residency.NODE_TYPE: ("node", "num_node_types"),
}
_INDEX_KIND = {by: BROADCAST_FROM[by] for by in TYPE_INDICES}   # type index -> the types it reads


def _types_read(program: Program) -> set[Residency]:
    """Which kinds of type (EDGE_TYPE, NODE_TYPE) the program indexes by or holds data of."""
    kinds = {v.residency for v in program.values if v.residency in _TYPE_KINDS}
    kinds |= {_INDEX_KIND[v.attrs["by"]] for v in program.values if v.attrs.get("by") in _INDEX_KIND}
    return kinds


def _check_types(program: Program, kinds: set[Residency], graph: Graph,
                 feeds: Mapping[str, torch.Tensor]) -> None:
    """Fail before running when a typed program meets a graph without those types, or a
    per-type input whose row count is not the graph's number of types: both would
    otherwise surface as an index error deep inside a gather."""
    for kind in kinds:
        what, count_attr = _TYPE_KINDS[kind]
        count = getattr(graph, count_attr)
        if count is None:
            raise CompileError(f"the program reads {what} types (per-{what}-type data or an index by "
                               f"{what} type) but the graph has none; build it with "
                               f"Graph(..., {what}_type=..., {count_attr}=...)")
        for key, value in program.inputs.items():
            rows = feeds[key].shape[0] if feeds[key].dim() else None
            if value.residency is kind and rows != count:
                raise CompileError(f"per-{what}-type input {key!r} has {rows} rows but the graph has "
                                   f"{count} {what} types ({count_attr}); give one row per type")


BACKENDS = ("reference", "triton", "cpu")


def _check_functorch_transform(graph: Graph, keys: tuple[str, ...], tensors: list[torch.Tensor]) -> None:
    """Refuse a program call inside a ``torch.func`` transform (grad, vmap, jacrev, ...)
    that would not compute what the transform asks for. A compiled program is a
    ``torch.autograd.Function`` without functorch's ``setup_context`` and a backend
    reading raw memory: an input of the transform (a wrapped or batched tensor) failed
    with torch's "must override the setup_context staticmethod", and the Triton and CPU
    kernels with "Cannot access storage of TensorWrapper" (they cannot read the
    transform's tensors, the graph's layouts built inside it among them). What remains is
    a constant of the transform: plain inputs needing no gradient, on the reference
    backend, whose torch ops a transform follows (grad of a SAGE layer's weights, say)."""
    wrapped = [key for key, t in zip(keys, tensors) if torch._C._functorch.is_functorch_wrapped_tensor(t)]
    if wrapped:
        reason = f"input(s) {wrapped} of the compiled program are tensors of the transform"
    elif torch.is_grad_enabled() and any([t.requires_grad for t in tensors]):
        reason = ("an input of the compiled program needs a gradient, which its autograd.Function gives "
                  "torch.autograd only")
    else:
        backend = backend_name(graph.device.type == "cuda")
        if backend == "reference":
            return
        reason = functorch_backend_reason(backend)
    # named after the typed-graph layer running it (R-GCN, RGAT, HGT: `running_layer`), whose
    # forward no transform-aware wrapper names (nn.compiling); None elsewhere: that wrapper does
    names = RUNNING_LAYERS.names
    raise FunctorchTransformError(reason, names[-1] if names else None)


def _tangents(values: Iterable[Any]) -> bool:
    """Whether any tensor among ``values`` carries a forward-mode AD tangent (asked only
    inside a ``forward_ad.dual_level``)."""
    return any(isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None for t in values)


def _check_forward_ad(graph: Graph, feeds: Mapping[str, torch.Tensor]) -> None:
    """Refuse forward-mode AD where the program would drop its tangents: the Triton and
    CPU kernels read raw memory (their outputs came back without a tangent, or with only
    the part of it from torch ops around the program: a GIN layer's sum lost), the
    reference backend writes into its outputs in place under no_grad (out= ops, which
    forward AD refuses), and the autograd.Function that runs a program needing gradients
    has no jvp. The reference backend's torch ops, with grad enabled and no input needing
    a gradient, carry the tangents."""
    backend = backend_name(graph.device.type == "cuda")
    if backend != "reference":
        reason = f"the {backend} backend's kernels read raw memory and carry no tangent"
    elif not torch.is_grad_enabled():
        reason = "under torch.no_grad the reference backend writes its outputs in place (out= ops)"
    elif any(isinstance(t, torch.Tensor) and t.requires_grad for t in feeds.values()):
        reason = "an input of the compiled program needs a gradient, and the autograd.Function running it has no jvp"
    else:
        return
    raise ForwardADError(reason)


class ForwardADError(NotImplementedError):
    """Forward-mode AD (dual tensors) refused where gnnfuse would lose the tangents;
    ``layer`` names the layer where one is known."""

    def __init__(self, reason: str, layer: str | None = None) -> None:
        self.reason, self.layer = reason, layer
        where = f"{layer}: " if layer else ""
        super().__init__(f"{where}gnnfuse cannot carry forward-mode AD tangents here (torch.autograd.forward_ad, "
                         f"jacobian(strategy='forward-mode')): {reason}. Use reverse mode (loss.backward(), "
                         "torch.autograd.grad, jacobian's default strategy), or GNNFUSE_BACKEND=reference with "
                         "grad enabled and no input needing a gradient")

    def named(self, layer: str) -> ForwardADError:
        """This refusal, named after ``layer`` (the layer running the program) unless it
        names one already."""
        return self if self.layer is not None else ForwardADError(self.reason, layer)


def functorch_backend_reason(backend: str) -> str:
    """Why a ``torch.func`` transform cannot run the ``backend`` backend's kernels."""
    return (f"the {backend} backend's kernels cannot read the transform's tensors "
            "(GNNFUSE_BACKEND=reference runs a layer whose graph kernels the transform does not reach)")


class FunctorchTransformError(NotImplementedError):
    """A call refused inside a ``torch.func`` transform: ``reason`` says why, ``layer``
    names the layer (None where a program call is refused; the layer around it, if any,
    names itself: nn.compiling)."""

    def __init__(self, reason: str, layer: str | None = None) -> None:
        self.reason, self.layer = reason, layer
        where = f"{layer}: " if layer else ""
        super().__init__(f"{where}gnnfuse layers do not support torch.func transforms (grad/vmap/jacrev/...): "
                         f"{reason}. Use torch.autograd instead (loss.backward(), torch.autograd.grad, or one "
                         "call per batch element in place of vmap)")


def _check_triton_can_read(device: torch.device) -> None:
    """Compiled Triton kernels read CUDA memory only; only Triton's CPU interpreter runs
    them on host tensors. Without this check a forced ``GNNFUSE_BACKEND=triton`` on CPU
    tensors stops inside Triton's launcher with a raw pointer error. Read at call time:
    the interpreter is whatever ``TRITON_INTERPRET`` says now."""
    if getenv("TRITON_INTERPRET") == "1":
        return
    if device.type != "cuda":     # the inputs are on the graph's device (checked_inputs)
        raise ValueError(f"the triton backend runs CUDA tensors, but the graph and inputs are on {device}: "
                         "move the tensors and the graph to cuda (tensor.to('cuda'), graph.to('cuda')), "
                         "or unset GNNFUSE_BACKEND, or set TRITON_INTERPRET=1 before triton is first "
                         "imported to run Triton's CPU interpreter")


def backend_name(on_cuda: bool) -> str:
    """Which backend runs a call whose tensors are (or are not) on a GPU:
    ``GNNFUSE_BACKEND`` if set, else Triton on CUDA and the torch reference elsewhere."""
    name = getenv("GNNFUSE_BACKEND") or ("triton" if on_cuda else "reference")
    if name not in BACKENDS:
        raise ValueError(f"GNNFUSE_BACKEND must be one of {BACKENDS}, got {name!r}")
    return name


def on_first_pass(graph: Graph | None) -> bool:
    """Whether a program called on ``graph`` now runs as a small graph's first pass on
    the reference executor, in place of its device's default Triton backend
    (runtime/first_pass.py): the host-bound regime of a new small graph every step, where
    a layer may prefer fewer ops to fewer bytes."""
    return (getattr(graph, "first_pass", False) and backend_name(graph.device.type == "cuda") == "triton"
            and first_pass_executor(graph, "triton") == "reference")


def program_backend(device: torch.device, bfloat16: bool) -> str:
    """The backend that runs a program on a graph on ``device``: `backend_name`'s, except
    that a program with ``bfloat16`` values runs on the torch reference where Triton's CPU
    interpreter would run it (`interpreter_lacks_bfloat16`)."""
    name = backend_name(device.type == "cuda")
    if name == "triton" and bfloat16 and interpreter_lacks_bfloat16():
        return "reference"
    return name


def select_backend(device: torch.device, bfloat16: bool = False, graph: Graph | None = None) -> Callable:
    """The executor for a call on a graph on ``device`` (its inputs are there too:
    `CompiledProgram.checked_inputs`) of a program with (``bfloat16``) or without
    bfloat16 values: ``GNNFUSE_BACKEND`` if set, else Triton for CUDA and the torch
    reference for everything else (`program_backend`), except the reference for a small
    ``graph`` on its first pass (`first_pass`). The Numba CPU backend is opt-in
    (``cpu``): its first call per kernel compiles for a second or two, which the
    reference, the oracle, never pays."""
    name = backend_name(device.type == "cuda")
    if name == "triton" and getattr(graph, "first_pass", False):     # (inline: test_host_path counts calls)
        name = first_pass_executor(graph, name)
    if name == "triton":
        _check_triton_can_read(device)
        if bfloat16:        # (asked only then: this runs on every call, test_host_path counts it)
            name = program_backend(device, bfloat16)
    execute = _EXECUTORS.get(name)
    if execute is None:      # imported once, not on every call
        execute = _EXECUTORS[name] = _import_executor(name)
    return execute


_EXECUTORS: dict[str, Callable] = {}


def _executor_name(execute: Callable) -> str:
    """The backend name of an executor `select_backend` returned."""
    return next(name for name, known in _EXECUTORS.items() if known is execute)


def _import_executor(name: str) -> Callable:
    if name == "triton":
        try:
            from ..backend.triton import execute
        except ImportError as exc:
            raise RuntimeError("the triton backend needs the 'triton' package: pip install 'gnnfuse[gpu]'") from exc
        return execute
    if name == "cpu":
        from ..backend.cpu import execute
        return execute
    from ..backend.reference import execute
    return execute


@dataclass(frozen=True)
class ProgramCall:
    """One run of a compiled program, as seen by `record_calls`: the program, the graph it
    ran on, the inputs that needed gradients (which decide the backward program and
    which forward values are saved for it) and the schedule the call forced, if any."""
    compiled: CompiledProgram
    graph: Graph
    wrt: tuple[str, ...]
    schedule: ForcedSchedule | None = None
    # the backend that ran it: "triton", "cpu", "reference", or "reference (first pass)" for a
    # small graph's first pass on a GPU (`first_pass`)
    executor: str = ""


_RECORDERS: list[list[ProgramCall]] = []


@contextmanager
def record_calls() -> Iterator[list[ProgramCall]]:
    """Collect every compiled-program run inside the block, in order. Only `explain`
    uses this; outside a block the cost is one empty-list check per run."""
    calls: list[ProgramCall] = []
    _RECORDERS.append(calls)
    try:
        yield calls
    finally:
        _RECORDERS.remove(calls)


def _run_forward(compiled: CompiledProgram, graph_ctx: GraphContext, keys: tuple[str, ...],
                 tensors, backward: BackwardProgram | None, wrt: tuple[str, ...] = ()):
    """Run the forward program, keeping what ``backward`` will read; returns the outputs
    (in output order), the kept values and the executor used. ``wrt``: the inputs needing
    gradients that torch's autograd differentiates for, where there is no ``backward``
    (`CompiledProgram._run_under_autograd`), for `record_calls`."""
    device = graph_ctx.device
    execute = select_backend(device, compiled._bfloat16, graph_ctx.graph)
    if _RECORDERS:
        first = on_first_pass(graph_ctx.graph)
        call = ProgramCall(compiled, graph_ctx.graph, backward.wrt if backward else wrt, forced_schedule(),
                           _executor_name(execute) + (" (first pass)" if first else ""))
        for calls in _RECORDERS:
            calls.append(call)
    keep = compiled.backward_inputs(backward).saved_ids if backward else ()
    if device.type in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device.type):
        with torch.autocast(device.type, enabled=False):      # the program states its dtypes (runtime/autocast.py)
            outputs, kept = execute(compiled.program, graph_ctx, dict(zip(keys, tensors)), keep)
    else:
        outputs, kept = execute(compiled.program, graph_ctx, dict(zip(keys, tensors)), keep)
    outs = tuple(outputs.values())
    if compiled._output_views:
        outs = rebuild_views(outs, compiled._output_views, graph_ctx)
    if compiled._may_alias:     # the graph's memoised layouts count as inputs: a degree output may be one
        return _own_storage(outs, [*tensors, *graph_ctx.graph.cached_tensors()]), kept, execute
    return outs, kept, execute


def _may_alias_inputs(program: Program) -> bool:
    """Whether an output of ``program`` may share memory with an input, another output
    or what the graph keeps: two outputs of one value, or an output computed from inputs
    or degrees by vertex- or edge-local ops alone (no gather, scatter or aggregation), of
    which a backend may return the input itself or a view of it (``return v.h``, a
    reshape, ``gsddmm(None, edge=e)``, a cast to the same dtype) or the graph's cached
    degree count (``return len(v.innbs)``: written in place by the caller, every layer on
    the graph would read the written counts). Such programs have their outputs checked
    (`_own_storage`)."""
    outputs = list(program.outputs.values())
    if len({id(v) for v in outputs}) < len(outputs):
        return True
    local: dict[int, bool] = {}
    for value in program.values:       # in topological order
        local[value.id] = value.op in ("input", "degree") or (
            value.movement is Movement.DENSE and all(local.get(i.id, False) for i in value.inputs))
    return any(local.get(v.id, False) for v in outputs)


def _own_storage(outputs: tuple[torch.Tensor, ...], inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``outputs`` with a copy of each one sharing memory with an input or an earlier
    output. Why: eager per-vertex code stacks fresh rows, and the README says a
    template's ``None`` copies its operand; handing the input back made ``out += 5``
    write the caller's features, and autograd refused an in-place edit of such an output
    naming ``_ProgramFunction``."""
    taken = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    owned = []
    for out in outputs:
        if out.numel():
            where = out.untyped_storage().data_ptr()
            if where in taken:
                out = out.clone(memory_format=torch.contiguous_format)
            else:
                taken.add(where)
        owned.append(out)
    return tuple(owned)


class _RunningLayers(threading.local):
    """The names of the gnnfuse layers whose forwards run now in this thread, innermost
    last (`running_layer`): a program's backward refuses after its layer's forward has
    returned, and names that layer from what was running when the forward ran."""
    names: list[str]

    def __init__(self) -> None:
        self.names = []


RUNNING_LAYERS = _RunningLayers()


@contextmanager
def running_layer(name: str) -> Iterator[None]:
    """Within this block programs run for layer ``name`` (its refusals name it)."""
    names = RUNNING_LAYERS.names
    names.append(name)
    try:
        yield
    finally:
        names.pop()


class _ProgramFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: tuple[CompiledProgram, GraphContext, tuple[str, ...]], *tensors: torch.Tensor):
        compiled, graph_ctx, keys = call
        names = RUNNING_LAYERS.names
        ctx.layer = names[-1] if names else None
        needs_grad = ctx.needs_input_grad
        found = compiled._backward_by_needs.get(needs_grad)
        if found is None:       # the inputs needing gradients decide the backward program: once per pattern
            wrt = tuple([k for k, needs in zip(keys, needs_grad[1:]) if needs])
            found = compiled._backward_by_needs[needs_grad] = (
                compiled.backward_for(wrt) if wrt and compiled.differentiable else None,)
        backward, = found
        ctx.input_meta = None
        if backward is not None and not backward.wrt:    # no gradient reaches an input (x ** 0)
            backward, ctx.input_meta = None, [(t.shape, t.dtype, t.device) for t in tensors]
        outputs, kept, execute = _run_forward(compiled, graph_ctx, keys, tensors, backward)
        for out in outputs:     # inline: the usual output is no view, and this path is counted
            if out._base is not None:
                outputs = _unviewed(outputs, tensors)
                break
        ctx.compiled, ctx.graph_ctx, ctx.backward = compiled, graph_ctx, backward
        ctx.execute, ctx.schedule = execute, forced_schedule()   # backward runs as forward was told to
        # Through save_for_backward, never as plain ctx attributes: a saved value may be an
        # output, and an output held by its own grad_fn's ctx is a cycle through C++ that
        # Python's collector cannot free -- every step's tensors would leak.
        ctx.save_for_backward(*map(kept.__getitem__, compiled.backward_inputs(backward).saved_ids) if backward else ())
        ctx.output_meta = [(o.shape, o.dtype, o.device) for o in outputs]
        # a checkpointed first-pass run waits for its backward (runtime/first_pass.py)
        ctx.waiting = (Waiting(graph_ctx.graph) if getattr(graph_ctx.graph, "first_pass", False) and checkpointed()
                       else None)
        return outputs

    @staticmethod
    def backward(ctx, *output_grads: torch.Tensor):
        try:
            return _ProgramFunction._backward(ctx, output_grads)
        except RuntimeError as exc:     # asked on the error path only: the usual one stays as it was
            if any(_batched(g) for g in output_grads if g is not None):
                raise _batched_backward_error(ctx.compiled, exc) from exc
            converted = _converted_saved_error(ctx)
            if converted is not None:
                raise converted from exc
            raise

    @staticmethod
    def _backward(ctx, output_grads: tuple[torch.Tensor, ...]):
        if ctx.input_meta is not None:     # zeros, as torch's backward of ``x ** 0`` gives
            return (None, *[torch.zeros(shape, dtype=dtype, device=device) if needs else None
                            for (shape, dtype, device), needs in zip(ctx.input_meta, ctx.needs_input_grad[1:])])
        graph = ctx.graph_ctx.graph
        if isinstance(graph, Graph):    # unchanged at the forward's call (`__call__`), so since it
            try:
                graph.check_unchanged()
            except GraphModifiedError as edit:
                raise _graph_changed(ctx.compiled, edit) from edit
        if torch.is_grad_enabled():     # create_graph=True: this backward is differentiated in turn
            backend = _executor_name(ctx.execute)
            _check_second_derivative(ctx.compiled, ctx.backward, backend, ctx.layer)
        for g in output_grads:      # a loop, not a rebuilt list: every output usually has its gradient
            if g is None:
                output_grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                                for g, (shape, dtype, device) in zip(output_grads, ctx.output_meta)]
                break
        try:
            saved = ctx.saved_tensors
        except RuntimeError as exc:
            explained = _explained_inplace_error(ctx, exc)
            if explained is None:
                raise
            raise explained from exc
        feeds = backward_feeds(ctx.compiled, ctx.backward, saved, output_grads)
        kind = ctx.graph_ctx.device.type
        if kind in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(kind):   # inside an autocast block
            with torch.autocast(kind, enabled=False), forcing(ctx.schedule):
                grads, _ = ctx.execute(ctx.backward.program, ctx.graph_ctx, feeds)
        elif ctx.schedule is forced_schedule():   # nothing to force (the usual case): no context manager
            grads, _ = ctx.execute(ctx.backward.program, ctx.graph_ctx, feeds)
        else:
            with forcing(ctx.schedule):
                grads, _ = ctx.execute(ctx.backward.program, ctx.graph_ctx, feeds)
        if ctx.waiting is not None:      # a backward pass runs on a first pass (runtime/first_pass.py)
            ctx.waiting.arrived()
        elif getattr(graph, "first_pass", False):
            end_after_backward(graph)
        return (None, *map(grads.get, ctx.compiled._gradient_keys))


def _batched(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a vmap-batched tensor: ``is_grads_batched`` hands a backward
    legacy ``Batched`` ones, ``torch.func.vmap`` functorch's ``FuncTorchBatched`` ones
    (torch's Python ``DispatchKey`` enum names neither, so the key set's text is read)."""
    return "Batched" in repr(torch._C._dispatch_keys(tensor))


def _batched_backward_error(compiled: CompiledProgram, exc: RuntimeError) -> NotImplementedError:
    """A backward run under vmap (``torch.autograd.grad(..., is_grads_batched=True)``,
    ``jacobian``/``hessian`` with ``vectorize=True``) explained: its gradients came as
    batched tensors, which the backends' kernels and out= ops have no batching rule for, and
    torch's message ("Batching rule not implemented for aten::mul.out") named neither the
    layer's program nor the option that set vmap going. Where the backward's ops do batch
    (torch ops of the reference backend), it runs and nothing is raised."""
    inputs = ", ".join(sorted(compiled.program.inputs))
    return NotImplementedError(
        f"a batched backward (torch.autograd.grad(..., is_grads_batched=True), or jacobian/hessian with "
        f"vectorize=True) through the compiled gnnfuse program on ({inputs}) is not supported: its backward "
        f"runs kernels or out= ops that have no vmap batching rule ({exc}). Compute one gradient row at a time "
        "(is_grads_batched=False, vectorize=False)")


def _unviewed(outputs: tuple[torch.Tensor, ...], inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``outputs`` with each view of a tensor that nothing else here shares (an op's own
    result that an op reshaped: ``addmm``'s ``reshape`` of the GEMM's rows, a returned
    ``reshape`` on the reference backend) detached from that base. Autograd refuses an
    in-place edit of a view a custom Function returns ("Output 0 of _ProgramFunction is
    a view and is being modified inplace"), so ``s += 1`` on ``apply_edges``'s ``x @ W +
    b`` raised where eager code, and the same layer without the bias, run. ``detach``
    keeps the storage and its version counter, so a saved value edited this way still
    fails the backward's check. A view sharing its base with an input or another output
    stays one: detached, an edit through it would change that tensor behind autograd."""
    roots = [id(t if t._base is None else t._base) for t in (*outputs, *inputs) if isinstance(t, torch.Tensor)]
    return tuple(out.detach() if out._base is not None and roots.count(id(out._base)) == 1 else out
                 for out in outputs)


def _explained_inplace_error(ctx, exc: RuntimeError) -> RuntimeError | None:
    """Torch's error reading ``ctx.saved_tensors``, explained. A saved value may be one of
    the program's own outputs (a softmax-weighted sum keeps its result for the backward,
    autodiff/softmax_sum.py; a max or min does too): written in place after the call
    (``out += x``), it no longer holds what the backward needs, and torch's message names
    only "output 0 of _ProgramFunction". Or it is an input, or a view of one or of an
    output that the forward kept (a reshape): the backward recomputes per-edge values
    from the inputs where eager code may have kept the values, so an input edited before
    ``backward()`` (an optimizer step, ``x += 1``) fails here where eager code may not;
    saying "an output" then sent the user to look for an edit they never made. (Called on
    the error path only: the backward's usual path stays one attribute read,
    test_host_path counts its calls.)"""
    message = str(exc)
    # the layer that ran the program where one did (`running_layer`), else the program's inputs
    program = (f"{ctx.layer}'s gnnfuse program" if ctx.layer is not None
               else f"the gnnfuse program on ({', '.join(sorted(ctx.compiled.program.inputs))})")
    if "modified by an inplace operation" in message and "of _ProgramFunction" in message:
        return RuntimeError(
            f"an output of {program} was modified in place after the call (e.g. "
            "`out += x`, `out.add_(...)`), but its backward reads that output back (a softmax-weighted sum or "
            "a max/min aggregation keeps its result). Write it out of place instead (`out = out + x`)")
    if "modified by an inplace operation" in message or "A view was created in no_grad mode" in message:
        return RuntimeError(
            f"a tensor that the backward of {program} reads was modified in place after "
            "the call: one of its inputs (e.g. `x += 1` or an optimizer step before `backward()`; the compiled "
            "backward recomputes per-edge values from the inputs, where eager code may keep those values), or an "
            "output the forward kept a reshape of. Modify a copy instead (`x = x + 1`), or call backward() first")
    return None


def _converted_saved_error(ctx) -> RuntimeError | None:
    """A backward that failed because a tensor it reads changed dtype after the forward,
    explained. Autograd saves a parameter by reference, so ``layer.double()`` (or
    ``.half()``, ``.to(dtype)``) between the call and ``backward()`` hands the backward,
    compiled for the forward's dtypes, the converted parameter (GINEConv's backward reads
    its edge linear's bias), and torch's message ("expected m1 and m2 to have the same
    dtype, but got: float != double") named neither the layer nor the conversion. The
    backward program's saved values carry the dtypes the forward ran with. (Called on the
    error path only.)"""
    try:
        saved = ctx.saved_tensors
    except RuntimeError:        # an in-place edit: `_explained_inplace_error` has said so
        return None
    for tensor, value in zip(saved, ctx.backward.saved if ctx.backward is not None else ()):
        if tensor.dtype != value.dtype:
            program = (f"{ctx.layer}'s gnnfuse program" if ctx.layer is not None
                       else f"the gnnfuse program on ({', '.join(sorted(ctx.compiled.program.inputs))})")
            return RuntimeError(
                f"a tensor that the backward of {program} reads (of shape {tuple(tensor.shape)}, a parameter or "
                f"input) was {value.dtype} in the forward but is {tensor.dtype} now: the module was converted "
                "(.double(), .half(), .to(dtype)) between the call and backward(). Call backward() before "
                "converting the module, or run the forward again after converting it")
    return None


def read_back_by_backward(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``, an output of a compiled program, is saved for that program's
    backward (`_explained_inplace_error`): an in-place write to it would make the backward fail,
    where eager code's does not read its aggregate back."""
    node = tensor.grad_fn
    if not isinstance(node, _ProgramFunction._backward_cls):
        return False
    storage = tensor.untyped_storage().data_ptr()
    return any(saved.untyped_storage().data_ptr() == storage for saved in node.saved_tensors)


def _graph_changed(compiled: CompiledProgram, edit: GraphModifiedError) -> RuntimeError:
    """The refusal of a backward whose graph was written in place after its forward ran
    (an ``edge_index`` buffer refilled for the next batch before ``loss.backward()``):
    the layouts the backward builds then would describe another graph, and its gradients
    would silently mix the two. torch refuses the same for a tensor saved for backward."""
    return RuntimeError(
        f"the graph of a gnnfuse program (inputs {sorted(compiled.program.inputs)}) was modified by an "
        f"in-place operation after its forward ran: {edit.what}. The backward would run on another graph. "
        "Write a new edge_index (or clone it) instead of modifying the one the forward used before calling "
        "backward().")


def _check_second_derivative(compiled: CompiledProgram, backward: BackwardProgram, backend: str,
                             layer: str | None = None) -> None:
    """Refuse a backward that autograd would differentiate wrongly. Its result is exact
    only where autograd sees every step of it: torch ops (the reference backend, not
    generated kernels) reading no forward value but the inputs themselves (an
    intermediate such as a softmax's maximum, sum or output was computed without autograd,
    so its dependence on the inputs would drop out of the second derivative unnoticed).
    The refusal names ``layer`` (the layer that ran the program), else the program's
    inputs and where the user's code made the values at fault."""
    if backend != "reference":
        reason = (f"its backward runs the {backend} backend's generated kernels, whose work autograd "
                  "cannot see")
        if backend == "triton" and not getenv("GNNFUSE_BACKEND"):
            # a first pass ran the reference executor (runtime/first_pass.py): the same double
            # backward worked on a graph's first step and stops on its second
            reason += (" (a small graph's first pass, until its first backward, runs on the reference "
                       "executor, where this may have worked: runtime/first_pass.py)")
        remedy = "it works on GNNFUSE_BACKEND=reference for programs linear in their inputs (GCN's, SAGE's sums)"
    else:
        made = {v.op + (f"[{v.attrs['op']}]" if "op" in v.attrs else ""): v.source
                for v in backward.saved if v.op != "input" and _reads_an_input(v)}
        # a max's or min's extreme, taken again in the backward to find its arg-extreme
        # edges (ir/ops/movement.py): its ties' count divides by 0 on rows without edges
        made.update({f"reduce[{v.attrs['op']}]": v.source for v in backward.program.values
                     if v.op == "reduce" and v.attrs["op"] in ("max", "min")})
        if not made:
            return
        shown = sorted(op if layer is not None or not where else f"{op} at {where}" for op, where in made.items())
        reason = (f"its backward reads values the forward computed without autograd ({', '.join(shown)}), "
                  "whose dependence on the inputs would be missing")
        remedy = "it works only for programs linear in their inputs (GCN's, SAGE's sums)"
    where = (f"{layer}: a second derivative (backward with create_graph=True) through its compiled program"
             if layer is not None else "a second derivative (backward with create_graph=True) through the "
             f"compiled program on ({', '.join(sorted(compiled.program.inputs))})")
    instead = ("compute that term with the layer's eager PyG counterpart" if layer is not None
               else "compute that term in plain torch")
    raise NotImplementedError(f"{where} is not supported: {reason}. Double backward: {remedy}; otherwise {instead}")


def _reads_an_input(value: Value) -> bool:
    """Whether ``value`` depends on a program input (a graph-only value -- degrees, their
    clamp -- does not, and is a constant to every derivative)."""
    seen, stack = set(), [value]
    while stack:
        v = stack.pop()
        if v.op == "input":
            return True
        if v.id not in seen:
            seen.add(v.id)
            stack.extend(v.inputs)
    return False


def backward_feeds(compiled: CompiledProgram, backward: BackwardProgram, saved: Sequence[torch.Tensor],
                   output_grads: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backward program's inputs: the forward values it saved (``saved``, in
    ``backward.saved`` order) and the gradients of the forward outputs it reads (given
    in output order)."""
    layout = compiled.backward_inputs(backward)
    feeds = dict(zip(layout.saved_keys, saved))
    for key, position in layout.gradients:
        feeds[key] = output_grads[position]
    return feeds


_BY_STRUCTURE: dict[tuple, CompiledProgram] = {}
# Structures kept; beyond that the oldest is dropped (its callers keep their own reference).
# A constant is part of a structure, so a UDF whose closure constant changes every step
# (an annealed temperature) added a program per step, for good.
_STRUCTURE_LIMIT = 1024


def compiled_for(program: Program) -> CompiledProgram:
    """The compiled program for ``program``'s structure, built on first sight.

    Front ends trace on every call (Python only, and the only way to see which tensors a
    function reads), but optimizing, differentiating and generating kernels happen once
    per structure, shared by every function, decoration and layer that traces to it."""
    key = program.fingerprint()
    if key not in _BY_STRUCTURE:
        while len(_BY_STRUCTURE) >= _STRUCTURE_LIMIT:
            del _BY_STRUCTURE[next(iter(_BY_STRUCTURE))]
        _BY_STRUCTURE[key] = CompiledProgram(program)
    return _BY_STRUCTURE[key]


def compile_program(program: Program, optimize_program: bool = True) -> CompiledProgram:
    return CompiledProgram(program, optimize_program)
