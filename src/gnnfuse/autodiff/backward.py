"""Build the backward program of a forward program, in the same IR.

Each op's derivative rule lives in its registry entry and emits backward ops through a
`_Builder`; forward values it reads become ``saved:<id>`` inputs of the backward program,
so the runtime knows exactly which forward intermediates to keep and the code generator
can fuse the backward like any program (Seastar §5.2). The gradient of a broadcast is a
reduce along the same index, so a source-side broadcast turns into a reduction over
out-edges, which the Triton backend runs over the reverse CSR.

Per-edge values that are cheap functions of gathered vertex rows (broadcasts, elementwise
arithmetic, reshapes, gathered compact pair products) are recomputed in the backward program instead of saved, as flash
attention recomputes its scores: saving them would keep |E|-sized tensors alive between
forward and backward, while recomputing them costs a few gathers and flops inside the
fused kernels that need them. Only vertex-sized values, parameters and per-edge values
that cannot be recomputed (matmuls on edges, random masks) are saved -- and the per-edge
values a max's or min's backward compares with the saved extreme, where recomputing them
would redo more than elementwise work (`_Builder.fwd_exact`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import CompileError, Program, Residency, Value, get_op
from ..passes.fusion import MAX_UNROLLED_FEATURE_SUM, edge_feature_matmul, feature_sum_terms
from .softmax_sum import find_softmax_weighted_sums


@dataclass
class BackwardProgram:
    program: Program
    saved: list[Value] = field(default_factory=list)   # forward values, in saved-input order
    wrt: tuple[str, ...] = ()                           # forward input keys with a gradient output


class _Builder:
    def __init__(self, program: Program, source: str | None):
        self.program = program
        self.saved: dict[int, tuple[Value, Value]] = {}
        self.recomputed: dict[int, Value] = {}
        self.source = source

    def fwd(self, value: Value) -> Value:
        """The backward program's handle on a forward value: recomputed from its inputs
        if it is a cheap per-edge value (see the module docstring), else saved.

        A ``stop_gradient`` is the identity in the forward, so its input is what gets
        saved: kept itself, it stayed a plan step of its own while the evaluation
        forward fused it into its readers, so the training and evaluation forwards
        generated different kernels for the same work: a cora GATConv without attention
        dropout compiled 9 CPU kernels for a training step and an evaluation forward, 7
        now (29.9 -> 22.9 s cold on a 2-core CI machine)."""
        while value.op == "stop_gradient":
            value = value.inputs[0]
        if _recomputable(value):
            if value.id not in self.recomputed:
                self.recomputed[value.id] = self.program.add(
                    value.op, *(self.fwd(i) for i in value.inputs), source=value.source, **value.attrs)
            return self.recomputed[value.id]
        return self._save(value)

    def fwd_exact(self, value: Value) -> Value:
        """`fwd`, for a value the backward compares for equality with a result the forward
        computed from it (the arg-extreme edges of a max or min): recomputed only where
        that gives the forward's very bits (`recomputed_exactly`), saved otherwise. Why:
        attention-like scores recomputed in two backward kernels, summed over features in
        the orders of their two autotuned tile shapes, came out a bit off their row's
        maximum in one and equal to it in the other: no edge counted as a tie, one got
        the gradient, and its vertex's gradient was infinite (an H200, float64; the
        interpreter, one tile shape for all, never showed it). Saved, the forward's
        maximum is taken over the very values the backward compares (a kept value is
        never recomputed in a unit body: passes.fusion.partition)."""
        while value.op == "stop_gradient":
            value = value.inputs[0]
        if recomputed_exactly(value):
            return self.fwd(value)
        return self._save(value)

    def _save(self, value: Value) -> Value:
        if value.id not in self.saved:
            placeholder = self.program.input(f"saved:{value.id}", value.residency, value.shape, value.dtype)
            self.saved[value.id] = (value, placeholder)
        return self.saved[value.id][1]

    def add(self, op: str, /, *inputs: Value, **attrs) -> Value:
        return self.program.add(op, *inputs, source=self.source, **attrs)

    def const(self, value: float, like: Value) -> Value:
        return self.program.add("const", value=float(value), dtype=like.dtype)


# Ops that move data and do no arithmetic: recomputed, they give the forward's very bits.
MOVEMENT = ("broadcast", "reshape", "expand")
# Gathers onto the edges: of vertex rows, and of the compact (vertex, relation) pair
# products (ir/ops/compact.py: redone as P matmuls, P <= E, from the saved vertex table
# instead of keeping the [E, F] gathered rows -- HGT's transformed keys and values).
RECOMPUTED_GATHERS = MOVEMENT + ("compact_typed_matmul", "compact_indexed_matmul")

# Elementwise arithmetic a compiler may regroup with an adjacent op of the same kind:
# reassociated under fast-math (the CPU backend's register-row kernels: ``reassoc``), or
# a multiply and an add fused into one instruction (Triton's default).
REGROUPED = ("add", "sub", "mul", "div")


def recomputed_exactly(value: Value) -> bool:
    """Whether the backward has ``value`` bit for bit as the forward computed it: it is
    not recomputed (an input, or saved: anything not per-edge), or it is recomputed by
    gathers, reshapes, expands and elementwise ops from such values, where no add, sub,
    mul or div reads another (through movement alone). Each kernel compiles the work that
    recomputes a value on its own: a sum over feature dims is added in the order of that
    kernel's tile shape, and a chain of arithmetic may be regrouped where a kernel hoists
    a loop's invariant part -- ``max(u.a + v.b + v.c)`` on the CPU backend, whose
    forward kernel added ``v.b + v.c`` once per vertex, sent 207 of 1200 source entries
    a wrong gradient (tests/test_cpu_backend.py). One op on the values it reads rounds
    the same everywhere."""
    if value.op == "input" or not _recomputable(value):
        return True
    if value.op not in MOVEMENT:
        if not get_op(value.op).elementwise:
            return False
        if value.op in REGROUPED and any(_recomputed_arithmetic(i) for i in value.inputs):
            return False
    return all(recomputed_exactly(i) for i in value.inputs)


def _recomputed_arithmetic(value: Value) -> bool:
    """Whether ``value``, seen through movement ops, is recomputed `REGROUPED` arithmetic."""
    while value.op in MOVEMENT and _recomputable(value):
        value = value.inputs[0]
    return value.op in REGROUPED and _recomputable(value)


def _recomputable(value: Value) -> bool:
    """Per-edge, deterministic and elementwise, or a gather, reshape, expand or a matmul
    of edge features (passes.fusion.edge_feature_matmul): cheaper to redo in a fused
    kernel than to keep in memory. (Not a feature slice: redoing it
    would save its wider input instead, where that input is not recomputable.)"""
    if value.op == "input" or not value.residency.is_edge_rowed:
        return False
    opdef = get_op(value.op)
    if not opdef.pure:
        return False
    return (opdef.elementwise or value.op in RECOMPUTED_GATHERS or edge_feature_matmul(value)
            or _recomputable_sum(value, {}))


def _recomputable_sum(value: Value, memo: dict[int, bool]) -> bool:
    """A per-edge sum over feature dims (attention scores, ``(leaky_relu(x_i + x_j) *
    att).sum(-1)``) of work that is itself recomputed: redone in the backward by one edge
    kernel (an edge unit of at most ``MAX_UNROLLED_FEATURE_SUM`` terms per output), so
    the forward keeps only per-vertex softmax statistics (max and sum), never the [E, H]
    scores, alive until the backward. Not when the sum reads, at any depth, a per-edge
    value that would be saved instead (a matmul on edges, a random mask): saving that
    wider value would cost more than saving the sum."""
    terms = feature_sum_terms(value)
    return terms is not None and terms <= MAX_UNROLLED_FEATURE_SUM and all(
        _rebuilt_from_rows(i, memo) for i in value.inputs)


def _rebuilt_from_rows(value: Value, memo: dict[int, bool]) -> bool:
    """Whether the backward can rebuild ``value`` without saving any per-edge value:
    it is not per-edge, or a program input, or recomputable from such values."""
    if value.id not in memo:
        memo[value.id] = (not value.residency.is_edge_rowed or value.op == "input" or (
            _recomputable(value) and all(_rebuilt_from_rows(i, memo) for i in value.inputs)))
    return memo[value.id]


def build_backward(forward: Program, wrt: list[str] | tuple[str, ...]) -> BackwardProgram:
    """Gradients of every forward output with respect to the inputs named in ``wrt``.

    The backward program's inputs are ``grad:<output key>`` and ``saved:<value id>``; its
    outputs are ``grad:<input key>`` for each input in ``wrt`` that the outputs depend on.
    """
    for key in wrt:
        if key not in forward.inputs:
            raise KeyError(f"{key!r} is not an input of the program")
    needs = {forward.inputs[k].id for k in wrt}
    for v in forward.values:
        if any(i.id in needs for i in v.inputs):
            needs.add(v.id)

    program = Program()
    grads: dict[int, Value] = {}
    for key, out in forward.outputs.items():
        if out.id in needs:
            g = program.input(f"grad:{key}", out.residency, out.shape, out.dtype)
            grads[out.id] = _accumulate(program, grads.get(out.id), g)
    builder = _Builder(program, None)
    softmax_sums = find_softmax_weighted_sums(forward)      # by the id of their weights
    sum_grads = {s.total.id: None for s in softmax_sums.values()}   # each one's output gradient

    for v in reversed(forward.values):
        if v.op == "input" or v.id not in grads:
            continue
        opdef = get_op(v.op)
        if not any(i.id in needs for i in v.inputs):
            continue
        if opdef.derivative is None:
            raise CompileError(f"op {v.op!r} has no derivative rule", v.source)
        builder.source = v.source
        g = grads.pop(v.id)
        if v.id in sum_grads:
            sum_grads[v.id] = g
        softmax_sum = softmax_sums.get(v.id)
        try:
            if softmax_sum is not None and sum_grads[softmax_sum.total.id] is not None:
                input_grads = softmax_sum.gradient(builder, g, sum_grads[softmax_sum.total.id])
            else:
                input_grads = opdef.derivative(builder, v, g)
        except NotImplementedError as exc:
            raise CompileError(f"cannot differentiate {v.op!r}: {exc}", v.source) from exc
        for x, gx in zip(v.inputs, input_grads):
            if gx is None or x.id not in needs:
                continue
            grads[x.id] = _accumulate(program, grads.get(x.id), _fit(program, gx, x))

    result = BackwardProgram(program, wrt=tuple(k for k in wrt if forward.inputs[k].id in grads))
    for key in result.wrt:
        program.output(f"grad:{key}", grads[forward.inputs[key].id])
    result.saved = [fwd for fwd, _ in builder.saved.values()]
    return result


def _fit(program: Program, g: Value, x: Value) -> Value:
    """Sum a gradient over the dims (and rows) that broadcasting spread ``x`` across, and
    give it ``x``'s dtype, as torch's autograd does for every input: a float32 product
    plus a float64 bias has a float64 gradient, which the product's own derivative
    (``g @ W^T`` with W float32) cannot take."""
    to_shared = x.residency is Residency.SHARED and g.residency is not Residency.SHARED
    if to_shared or g.shape != x.shape:
        target = Residency.SHARED if x.residency is Residency.SHARED else g.residency
        g = program.add("sum_to", g, shape=x.shape, residency=target)
    if g.dtype != x.dtype and x.dtype.is_floating_point:
        g = program.add("cast", g, dtype=x.dtype)
    return g


def _accumulate(program: Program, total: Value | None, g: Value) -> Value:
    return g if total is None else program.add("add", total, g)
