"""The op registry: one entry per op holds every rule about it.

An `OpDef` carries the op's movement class, its residency rule, its shape rule, its torch
reference implementation, its derivative (a rule that builds backward IR), and, once a
code generator knows it, its Triton emitter. Adding an op means adding one entry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import torch

from .errors import CompileError
from .residency import Movement, Residency, join

if TYPE_CHECKING:
    from .program import Value


class ExecContext(Protocol):
    """What movement ops need from the graph when they run (see backend.reference)."""

    num_nodes: int
    num_edges: int
    device: torch.device
    src: torch.Tensor
    dst: torch.Tensor
    run_memo: dict      # values the ops of one program run may share

    def rows(self, residency: Residency) -> int: ...

    def grouped_matmul(self, x: torch.Tensor, w: torch.Tensor, groups: list[torch.Tensor],
                       gather: torch.Tensor | None = None) -> torch.Tensor: ...

    def grouped_matmul_tn(self, x: torch.Tensor, g: torch.Tensor, groups: list[torch.Tensor],
                          gather: torch.Tensor | None = None) -> torch.Tensor: ...

    def scatter_rows(self, table: torch.Tensor, gather: torch.Tensor, scatter: torch.Tensor,
                     scale: torch.Tensor | None, rows: int) -> torch.Tensor: ...

    def gather_rows(self, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor: ...

    def row_dot(self, x: torch.Tensor, y: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor: ...

    def row_matmul(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor: ...

    def contended_sum(self, x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor: ...


class GradBuilder(Protocol):
    """What a derivative rule may do: read forward values and add backward ops."""

    def fwd(self, value: "Value") -> "Value": ...

    def add(self, op: str, /, *inputs: "Value", **attrs: Any) -> "Value": ...

    def const(self, value: float, like: "Value") -> "Value": ...


Reference = Callable[..., torch.Tensor]
Derivative = Callable[[GradBuilder, "Value", "Value"], Sequence["Value | None"]]


def dense_residency(inputs: list[Residency], attrs: dict) -> Residency:
    return join(inputs)


@dataclass
class OpDef:
    name: str
    movement: Movement
    reference: Reference
    residency: Callable[[list[Residency], dict], Residency] = dense_residency
    shape: Callable[[Sequence["Value"], dict, Residency], tuple[tuple[int, ...], torch.dtype]] | None = None
    derivative: Derivative | None = None
    elementwise: bool = False
    pure: bool = True            # False: must never be merged or folded (random masks)
    # True: the derivative is finite wherever the operands are finite, so an exact zero
    # gradient row gives exact zeros. Broadcast reordering (passes/reorder.py) runs an op
    # on vertex rows no edge reads too; an op left False (sqrt, log, pow, div, exp) reads
    # those rows as 1s there, or sqrt'(0) * 0 = NaN would reach a vertex eager code skips.
    bounded_derivative: bool = False
    row_aware: bool = False      # reference takes rows=(operand has a row dim, ...) as a keyword
    # True: ``reference`` returns a view of its operand, as torch's op does in eager code (an
    # output that is such a view of another output shares its memory: runtime/output_views.py)
    view: bool = False
    # True, or true of an application's attrs: torch's autograd through ``reference`` gives
    # the gradients ``derivative`` gives (ties, zeros and all; tests/test_autograd_reference.py
    # compares each such op), so a program of such ops may run its forward under autograd
    # and leave the backward to torch: a small graph's first pass on a GPU (runtime/first_pass.py)
    autograd_reference: bool | Callable[[dict], bool] = False
    arity: int | None = None     # None: variadic
    emit: Any = None             # kernel expression (`emit_steps`), a rule giving one per value, or None
    doc: str = ""

    def emit_steps(self, value: "Value") -> tuple[str, ...] | None:
        """The op's kernel expression for ``value`` (an application of it), written against
        Triton's ``tl`` (the CPU backend evaluates the same text): ``{0}``, ``{1}`` are the
        operands, ``{attr}`` the attrs. ``emit`` is one expression, or a tuple of steps
        where a step names the values of the steps before it as ``{s0}``, ``{s1}``, ...;
        the op's value is the last step's. Each step becomes one temporary in every
        backend, so an op that needs a subresult several times (tanh's ``exp(2|x|)`` and
        its correction) computes it once and reads as a short recipe rather than one
        expression copied into itself. ``emit`` may instead be a function of the value
        giving either: an op whose formula depends on its attrs and dtypes (a cast's
        rounding, a float32 division's), which returns None for a value no kernel can
        compute as torch does -- that value then runs as a torch op. None here: the op
        runs as a torch op."""
        emit = self.emit(value) if callable(self.emit) else self.emit
        if emit is None:
            return None
        return (emit,) if isinstance(emit, str) else tuple(emit)

    def differentiates_under_autograd(self, attrs: dict) -> bool:
        """Whether torch's autograd through this application's reference gives its
        derivative rule's gradients (``autograd_reference``)."""
        rule = self.autograd_reference
        return rule(attrs) if callable(rule) else rule

    def infer_residency(self, inputs: list[Residency], attrs: dict) -> Residency:
        if self.arity is not None and len(inputs) != self.arity:
            raise ValueError(f"{self.name} takes {self.arity} operands, got {len(inputs)}")
        return self.residency(inputs, attrs)

    def infer_shape(self, inputs: Sequence["Value"], attrs: dict,
                    residency: Residency) -> tuple[tuple[int, ...], torch.dtype]:
        if self.shape is not None:
            return self.shape(inputs, attrs, residency)
        # Shape inference by running the reference on meta tensors with two rows, the way
        # Seastar's tracer reuses the DL framework's own type inference. Meta kernels cost
        # tens of microseconds each and layers are traced on every call, so results are
        # memoized by everything they depend on -- the default dtype too: integer data made
        # float (``t / 3``, ``exp(t)``) takes it, and a result memoized under float32 gave
        # a later float64 trace float32 kernels.
        signature = tuple((i.residency is Residency.SHARED, i.shape, i.dtype) for i in inputs)
        try:
            key = (self.name, signature, residency is Residency.SHARED, torch.get_default_dtype(),
                   tuple(sorted((k, a) for k, a in attrs.items() if k != "source")))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in _SHAPE_MEMO:
            return _SHAPE_MEMO[key]
        metas = [torch.empty(((2,) if i.residency is not Residency.SHARED else ()) + i.shape,
                             dtype=i.dtype, device="meta") for i in inputs]
        out = self.run(None, metas, [i.residency for i in inputs], attrs)
        shape = tuple(out.shape)
        result = (shape[1:] if residency is not Residency.SHARED else shape), out.dtype
        # not while dynamo traces this code: what its fake tensors answer (a torch.Size for a
        # dtype) was kept and failed every later eager trace of the op on those shapes
        if key is not None and not torch.compiler.is_compiling():
            _SHAPE_MEMO[key] = result
        return result

    def run(self, ctx: ExecContext | None, tensors: Sequence[torch.Tensor],
            residencies: Sequence[Residency], attrs: dict) -> torch.Tensor:
        """Run the torch reference, aligning per-element dims of row operands first."""
        if self.elementwise:
            tensors = align_rows(tensors, residencies)
        if self.row_aware:
            rows = ()
            for r in residencies:       # a loop, not a generator: each of its steps was a Python call
                rows += (r is not Residency.SHARED,)
            attrs = {**attrs, "rows": rows}
        return self.reference(ctx, *tensors, **attrs)


_SHAPE_MEMO: dict[tuple, tuple[tuple[int, ...], torch.dtype]] = {}


def align_rows(tensors: Sequence[torch.Tensor], residencies: Sequence[Residency]) -> Sequence[torch.Tensor]:
    """Broadcast per-element shapes right-aligned while keeping the row dim leading.

    Plain torch broadcasting would align a [rows] scalar-per-row with the *last* feature
    dim of a [rows, F] tensor; values here are per-element, so [rows] becomes [rows, 1].

    One operand, or two of one per-element rank (most of a program's elementwise steps),
    need nothing: they are returned as given (``tensors`` itself, which callers only read),
    without the general pass, whose comprehension was a Python call per step in 3.11.
    """
    count = len(tensors)      # (read once; ``ndim`` is an attribute, where ``dim()`` was a call per operand)
    if count == 1:
        return tensors
    if count == 2:
        (a, b), (ra, rb) = tensors, residencies
        if a.ndim - (ra is not Residency.SHARED) == b.ndim - (rb is not Residency.SHARED):
            return tensors
    # loops into tuples, not a comprehension and appends (a Python or C call each)
    ranks: tuple = ()
    for t, r in zip(tensors, residencies):
        ranks += (t.ndim - (r is not Residency.SHARED),)
    k = max(ranks, default=0)
    out: tuple = ()
    for t, r, rank in zip(tensors, residencies, ranks):
        if r is not Residency.SHARED and rank < k:
            t = t.reshape((t.shape[0],) + (1,) * (k - rank) + tuple(t.shape[1:]))
        out += (t,)
    return out


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise ValueError(f"op {opdef.name!r} is registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str, source: str | None = None) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise CompileError(f"no registry entry for op {name!r}", source) from None


def registered_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)
