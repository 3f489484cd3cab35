"""Operator-overloading tracer shared by both front ends.

A `SymTensor` stands for one row of a graph tensor. Python operators, tensor methods and
torch functions (through ``__torch_function__``) on it append ops to a `Program`; shapes
come from the registry's meta-tensor inference. Real tensors that meet a symbolic one
(parameters captured by closure) become SHARED program inputs. Errors name the construct
and the line of the user's function that used it.
"""
from __future__ import annotations

import linecache
import os
import sys
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..ir import CompileError, Program, Residency
from ..ir.ops.movement import TYPE_INDICES
from .udf import unwrap

EDGE_ROWED = (Residency.SRC, Residency.DST, Residency.EDGE)
_LIBRARY_DIRS = tuple(os.path.dirname(path) + os.sep for path in (os.path.dirname(__file__), torch.__file__))


def _is_library(filename: str) -> bool:
    """Whether code in ``filename`` is gnnfuse's or torch's, never the user's."""
    return filename.startswith(_LIBRARY_DIRS)


class Tracer:
    """Holds the program being built and knows where the user's code is."""

    def __init__(self, fn: Callable, mode: str, dtype: torch.dtype):
        self.program = Program()
        self.dtype = dtype
        self.captured: dict[int, tuple[str, torch.Tensor]] = {}
        self._calls: list[types.FrameType] = []
        self.rebind(fn, mode)

    def rebind(self, fn: Callable, mode: str) -> None:
        """Point at the user function being traced; ``mode`` is "vertex", "message",
        "reduce" or "update" (the message/reduce front end traces three UDFs into one
        program). ``fn`` may be any UDF `udf.unwrap` accepts."""
        self.fn, self.mode = fn, mode
        self._code = unwrap(fn)[0].__code__

    def call(self, fn: Callable, *args: Any) -> Any:
        """Run user code: errors raised while it runs name the innermost line of user code
        below this call, in the UDF or in a helper it calls."""
        self._calls.append(sys._getframe())
        try:
            return fn(*args)
        finally:
            self._calls.pop()

    # -- locations ------------------------------------------------------------------
    def source(self) -> str | None:
        """``file:line: text`` of the innermost frame of user code: the traced UDF's own
        code, or any code outside gnnfuse and torch (a helper the UDF calls), found
        between here and the `call` that runs the UDF."""
        frame, entry = sys._getframe(1), self._calls[-1] if self._calls else None
        while frame is not None and frame is not entry:
            code = frame.f_code
            if code is self._code or (entry is not None and not _is_library(code.co_filename)):
                text = linecache.getline(code.co_filename, frame.f_lineno).strip()
                return f"{code.co_filename}:{frame.f_lineno}: {text}"
            frame = frame.f_back
        return None

    def error(self, message: str) -> CompileError:
        """An error at the user's line; outside a running UDF (checking what it returned),
        at the first line of the UDF's definition."""
        return CompileError(message, self.source() or self._definition())

    def _definition(self) -> str:
        line = self._code.co_firstlineno
        return f"{self._code.co_filename}:{line}: {linecache.getline(self._code.co_filename, line).strip()}"

    # -- values ---------------------------------------------------------------------
    def input(self, key: str, residency: Residency, tensor: torch.Tensor, prefix: int) -> "SymTensor":
        if key in self.program.inputs:
            return SymTensor(self, self.program.inputs[key], prefix)
        rows = 0 if residency is Residency.SHARED else 1
        value = self.program.input(key, residency, tuple(tensor.shape[rows:]), tensor.dtype, self.source())
        return SymTensor(self, value, prefix)

    def lift(self, obj: Any) -> "SymTensor":
        if isinstance(obj, SymTensor):
            return obj
        if isinstance(obj, torch.Tensor):
            entry = self.captured.get(id(obj))
            if entry is None:
                entry = (f"param{len(self.captured)}", obj)
                self.captured[id(obj)] = entry
            return self.input(entry[0], Residency.SHARED, obj, 0)
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            return SymTensor(self, self.program.add("const", value=float(obj), dtype=self.dtype,
                                                    source=self.source()), 0)
        raise self.error(f"cannot use a {type(obj).__name__} as a tensor operand in a traced function")

    def in_degree(self, kind: type["Degree"] | None = None, prefix: int = 0) -> "Degree":
        """Each vertex's in-degree as a traced value (``len(v.innbs)``, ``mailbox.shape[1]``)."""
        value = self.program.add("degree", by="dst", dtype=self.dtype, source=self.source())
        return (kind or Degree)(self, value, prefix)

    def neighbour_count(self) -> "NeighbourCount":
        return self.in_degree(NeighbourCount, 1)

    def apply(self, op: str, *operands: Any, **attrs: Any) -> "SymTensor":
        syms = [self.lift(o) for o in operands]
        residencies = {s.value.residency for s in syms}
        if Residency.NODE in residencies and residencies & set(EDGE_ROWED):
            # Vertex data next to edge data is the destination's (v in v.innbs, nodes.data).
            syms = [s.broadcast_dst() if s.value.residency is Residency.NODE else s for s in syms]
        value = self.program.add(op, *(s.value for s in syms), source=self.source(), **attrs)
        return SymTensor(self, value, max(s.prefix for s in syms))


class SymTensor:
    """One row of a graph tensor while tracing. ``prefix`` counts the leading graph dims
    the user's code sees (0 in vertex-centric code, 1 for edges/nodes, 2 for a mailbox)."""

    def __init__(self, tracer: Tracer, value, prefix: int):
        self.tracer = tracer
        self.value = value
        self.prefix = prefix

    # -- tensor-like surface --------------------------------------------------------
    @property
    def shape(self) -> tuple:
        """Graph dims read as 1 (reshape takes them back as -1 or 1), except a mailbox's
        neighbour axis: its length differs per vertex, so it is the in-degree, a
        symbolic value (``nodes.mailbox['m'].shape[1]`` in arithmetic is the degree)."""
        if self.prefix == 2:
            return (1, self.tracer.neighbour_count()) + self.value.shape
        return torch.Size((1,) * self.prefix + self.value.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.prefix + len(self.value.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.value.dtype

    def broadcast_dst(self) -> "SymTensor":
        v = self.tracer.program.add("broadcast", self.value, source=self.tracer.source(), by="dst")
        return SymTensor(self.tracer, v, 2 if self.tracer.mode == "reduce" else self.prefix)

    def feature_dim(self, d: int) -> int | None:
        """A user dim as a negative per-element dim, or None for a mailbox's neighbour axis
        (dim 1 of ``nodes.mailbox[...]``). The row axis (dim 0 of node, edge and mailbox
        data: one row per vertex or edge) cannot be named: every op works within a row."""
        rank = len(self.value.shape)
        if not -(self.prefix + rank) <= d < self.prefix + rank:
            raise self.tracer.error(f"dim {d} is out of range for a value with {self.prefix} graph dims "
                                    f"and feature shape {list(self.value.shape)}")
        d = d % (self.prefix + rank)
        if d >= self.prefix:
            return d - self.prefix - rank
        if self.prefix >= 2 and d >= 1:   # a mailbox's neighbour axis, or a pairwise term's two
            return None
        raise self.tracer.error(f"dim {d} is the row axis (one row per {self._row_name()}); a compiled "
                                "function computes within each row and cannot combine rows")

    def _row_name(self) -> str:
        return "vertex" if self.value.residency is Residency.NODE or self.prefix == 2 else "edge"

    def __bool__(self):
        raise self.tracer.error("Python control flow (if/while/and/or/not) on a symbolic graph value "
                                "cannot be compiled; use torch.where-free arithmetic or move the "
                                "decision outside the traced function")

    def _compare(self, other):
        raise self.tracer.error("comparing symbolic graph values feeds Python control flow, which cannot "
                                "be compiled; express the choice arithmetically (relu, max, ...)")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _compare
    __hash__ = object.__hash__

    def __iter__(self):
        raise self.tracer.error("iterating over a symbolic graph value cannot be compiled")

    def __len__(self):
        raise self.tracer.error("len() of a symbolic feature value cannot be compiled")

    def __repr__(self) -> str:
        return (f"SymTensor({self.value.residency.name}, {self.prefix} graph dims, "
                f"feature shape={list(self.value.shape)})")   # self.shape would trace a degree

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = TORCH_HANDLERS.get(func)
        tracer = next(a.tracer for a in _flatten(args, kwargs) if isinstance(a, SymTensor))
        if handler is None:
            name = getattr(func, "__name__", None) or repr(func)
            raise tracer.error(f"torch function {name} has no gnnfuse op (no registry entry)")
        return handler(tracer, *args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        method = getattr(torch.Tensor, name, None)
        if method is None or method not in TORCH_HANDLERS:
            raise self.tracer.error(f"tensor method .{name}() has no gnnfuse op (no registry entry)")
        return lambda *args, **kwargs: TORCH_HANDLERS[method](self.tracer, self, *args, **kwargs)


def _flatten(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


# --- handlers: torch callables -> ops ---------------------------------------------------
def _binary(op: str, reverse: bool = False):
    def handler(tracer: Tracer, a, b, *, alpha=None, out=None):
        if alpha is not None and alpha != 1:
            b = _binary("mul")(tracer, b, alpha)
        a, b = (b, a) if reverse else (a, b)
        if op == "div" and isinstance(b, Degree):
            return tracer.apply("div", a, b.clamped())
        return tracer.apply(op, a, b)
    return handler


def _unary(op: str, **defaults):
    def handler(tracer: Tracer, x, *args, inplace=False, **kwargs):
        attrs = dict(defaults)
        for (name, _), val in zip(defaults.items(), args):
            attrs[name] = val
        attrs.update({k: v for k, v in kwargs.items() if k in defaults})
        return tracer.apply(op, x, **{k: float(v) for k, v in attrs.items()})
    return handler


def _dims(x: SymTensor, dim) -> tuple[list[int], bool]:
    dims = [dim] if isinstance(dim, int) else list(dim)
    mapped = [x.feature_dim(d) for d in dims]
    graph_axes = [m for m in mapped if m is None]
    if graph_axes and len(mapped) > 1:
        raise x.tracer.error("reduce over the neighbour axis and feature axes in separate calls")
    return mapped, bool(graph_axes)


class _ReduceResult(tuple):
    """What torch.max(x, dim) returns: (values, indices); only values can be traced."""

    tracer: Tracer

    @property
    def values(self):
        return self[0]

    @property
    def indices(self):
        raise self.tracer.error("the indices of torch.max/min over a graph value (argmax/argmin) cannot "
                                "be compiled; use the values (torch.max(x, dim)[0] or .values)")

    def __getitem__(self, index):
        if not isinstance(index, slice) and index in (1, -1):
            return self.indices
        return super().__getitem__(index)


def _check_dtype(tracer: Tracer, x: SymTensor, dtype: torch.dtype | None, name: str) -> None:
    """A ``dtype=`` argument asks for a conversion; gnnfuse has no conversion op."""
    if dtype is not None and dtype != x.dtype:
        raise tracer.error(f"torch.{name}(..., dtype={dtype}) on {x.dtype} data: gnnfuse has no dtype "
                           "conversion op; pass features of the dtype you want to compute in")


def _reduction(feature_op: str, graph_op: str):
    def handler(tracer: Tracer, x, dim=None, keepdim=False, *, dtype=None, out=None):
        x = tracer.lift(x)
        if dim is None:
            raise tracer.error(f"torch.{graph_op} over all dims of a graph value cannot be compiled; pass dim=")
        if out is not None:
            raise tracer.error(f"torch.{graph_op}(..., out=) writes into an existing tensor, which cannot be compiled")
        _check_dtype(tracer, x, dtype, graph_op)
        dims, graph_axis = _dims(x, dim)
        if graph_axis:
            result = tracer.reduce(x, graph_op, dim, keepdim) if hasattr(tracer, "reduce") else None
            if result is None:
                raise tracer.error(f"reducing over dim={dim} (the neighbour axis) is only possible on "
                                   "nodes.mailbox inside reduce_fn")
        elif feature_op is None:
            raise tracer.error(f"torch.{graph_op} over feature dims has no gnnfuse op")
        else:
            result = tracer.apply(feature_op, x, dim=tuple(dims), keepdim=bool(keepdim))
        if graph_op not in ("max", "min"):
            return result
        pair = _ReduceResult((result, None))
        pair.tracer = tracer
        return pair
    return handler


def _matmul(tracer: Tracer, a, b, *, out=None):
    b = tracer.lift(b)
    if b.value.op == "broadcast" and b.value.attrs["by"] in TYPE_INDICES:
        return _typed_matmul(tracer, tracer.lift(a), b)
    return tracer.apply("matmul", a, b)


def _typed_matmul(tracer: Tracer, x: SymTensor, lookup: SymTensor) -> SymTensor:
    """``x @ e.type.W`` (or ``edges.type['W']``, ``u.type.W``, ...): multiply by the row's
    type's matrix without copying it onto every row (see ir/ops/typed.py). Vertex data
    meeting an edge-level lookup is the destination's, as everywhere in the tracer, and
    an edge row reading a vertex's type (``v.type`` next to ``u.h``) reads its destination's."""
    table = SymTensor(tracer, lookup.value.inputs[0], 0)
    by = lookup.value.attrs["by"]
    if by == "ntype" and x.value.residency in EDGE_ROWED:
        by = "dsttype"
    elif by != "ntype" and x.value.residency is Residency.NODE:
        x = x.broadcast_dst()
    result = tracer.apply("typed_matmul", x, table, by=by)
    return SymTensor(tracer, result.value, max(x.prefix, lookup.prefix))


def _linear(tracer: Tracer, x, weight, bias=None):
    y = tracer.apply("matmul", x, tracer.apply("transpose", weight))
    return y if bias is None else tracer.apply("add", y, bias)


def _cat(tracer: Tracer, tensors, dim=0, *, out=None):
    syms = [tracer.lift(t) for t in tensors]
    d = syms[0].feature_dim(dim)
    if d is None:
        raise tracer.error("concatenating along a graph axis cannot be compiled")
    return tracer.apply("concat", *syms, dim=d)


def _reshape(tracer: Tracer, x, *shape):
    x = tracer.lift(x)
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
    lead, elem = shape[: x.prefix], shape[x.prefix:]
    kept = [i == 1 and isinstance(s, NeighbourCount) for i, s in enumerate(lead)]
    if any(isinstance(s, SymTensor) for s in elem) or any(
            isinstance(s, SymTensor) and not keep for s, keep in zip(lead, kept)):
        raise tracer.error("a reshape size cannot depend on the in-degree (mailbox.shape[1]): it differs "
                           "per vertex; keep the neighbour axis as its own dim")
    if any(not keep and s not in (-1, 1) for s, keep in zip(lead, kept)):
        raise tracer.error(f"reshape {list(shape)} must keep the leading graph dims as -1")
    if -1 in elem:
        known = 1
        for s in elem:
            known *= s if s != -1 else 1
        total = 1
        for s in x.value.shape:
            total *= s
        elem = tuple(total // known if s == -1 else s for s in elem)
    return tracer.apply("reshape", x, shape=tuple(elem))


def _unsqueeze(tracer: Tracer, x, dim):
    x = tracer.lift(x)
    if tracer.mode == "reduce" and x.value.residency is Residency.NODE and dim == 1:
        return x.broadcast_dst()   # nodes.data[k].unsqueeze(1): line up with the mailbox
    if tracer.mode == "reduce" and x.prefix == 2 and (dim if dim >= 0 else x.dim() + 1 + dim) == 1:
        return tracer.pair_view(x)  # mailbox.unsqueeze(1): a pairwise term (frontend/pairwise.py)
    rank = len(x.value.shape)
    pos = dim - x.prefix if dim >= 0 else rank + 1 + dim
    if not 0 <= pos <= rank:
        raise tracer.error(f"unsqueeze dim {dim} is out of range")
    shape = x.value.shape[:pos] + (1,) + x.value.shape[pos:]
    return tracer.apply("reshape", x, shape=shape)


def _dropout(tracer: Tracer, x, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return tracer.lift(x)
    if p >= 1:
        raise tracer.error("dropout with p >= 1 zeroes everything; use p < 1")
    x = tracer.lift(x)
    return tracer.apply("mul", x, tracer.apply("dropout_mask", x, p=float(p)))


def _softmax(tracer: Tracer, x, dim=None, *args, **kwargs):
    x = tracer.lift(x)
    _check_dtype(tracer, x, kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None)), "softmax")
    if dim is None or x.feature_dim(dim) is not None or not hasattr(tracer, "softmax"):
        raise tracer.error("softmax is supported over the neighbour axis (dim=1 of nodes.mailbox)")
    return tracer.softmax(x)


def _clamp(tracer: Tracer, x, min=None, max=None, *, out=None):
    """``x.clamp(min=a, max=b)`` with constant bounds: ``clamp_min``, and for ``max``
    the same on ``-x`` (``min(x, b) = -max(-x, -b)``)."""
    if any(bound is not None and not isinstance(bound, (int, float)) for bound in (min, max)):
        raise tracer.error("only constant bounds can be compiled in clamp(min=..., max=...)")
    if min is None and max is None:
        raise tracer.error("clamp needs a min or a max bound")
    if min is not None:
        x = tracer.apply("clamp_min", x, min=float(min))
    if max is not None:
        x = tracer.apply("neg", tracer.apply("clamp_min", tracer.apply("neg", x), min=-float(max)))
    return x


def _pow(tracer: Tracer, x, exponent):
    if not isinstance(exponent, (int, float)):
        raise tracer.error("only a constant exponent can be compiled in x ** c")
    return tracer.apply("pow", x, exponent=float(exponent))


T = torch.Tensor
TORCH_HANDLERS: dict[Any, Callable] = {}
for _fns, _h in [
    ((torch.add, T.add, T.__add__), _binary("add")), ((T.__radd__,), _binary("add", True)),
    ((torch.sub, T.sub, T.__sub__), _binary("sub")), ((T.__rsub__,), _binary("sub", True)),
    ((torch.mul, T.mul, T.__mul__), _binary("mul")), ((T.__rmul__,), _binary("mul", True)),
    ((torch.div, torch.true_divide, T.div, T.__truediv__), _binary("div")),
    ((T.__rtruediv__,), _binary("div", True)),
    ((torch.neg, T.neg, T.__neg__), _unary("neg")),
    ((torch.exp, T.exp), _unary("exp")), ((torch.log, T.log), _unary("log")),
    ((torch.sqrt, T.sqrt), _unary("sqrt")),
    ((torch.relu, F.relu, T.relu), _unary("relu")),
    ((torch.sigmoid, F.sigmoid, T.sigmoid), _unary("sigmoid")),
    ((torch.tanh, F.tanh, T.tanh), _unary("tanh")),
    ((F.leaky_relu,), _unary("leaky_relu", negative_slope=0.01)),
    ((F.elu,), _unary("elu", alpha=1.0)),
    ((torch.mm, torch.matmul, T.mm, T.matmul, T.__matmul__), _matmul),
    ((F.linear,), _linear),
    ((torch.sum, T.sum), _reduction("sum_dim", "sum")),
    ((torch.mean, T.mean), _reduction("mean_dim", "mean")),
    ((torch.max, T.max, torch.amax, T.amax), _reduction(None, "max")),
    ((torch.min, T.min, torch.amin, T.amin), _reduction(None, "min")),
    ((torch.cat, torch.concat), _cat),
    ((torch.reshape, T.reshape, T.view), _reshape),
    ((torch.unsqueeze, T.unsqueeze), _unsqueeze),
    ((F.dropout,), _dropout),
    ((torch.softmax, F.softmax, T.softmax), _softmax),
    ((torch.pow, T.pow, T.__pow__), _pow),
    ((torch.clamp, torch.clip, T.clamp, T.clip), _clamp),
]:
    for _f in _fns:
        TORCH_HANDLERS[_f] = _h

# Python operators on SymTensor route through the same handlers.
for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "matmul", "neg", "pow"):
    _method = getattr(T, f"__{_name}__")
    setattr(SymTensor, f"__{_name}__",
            (lambda m: lambda self, *a: TORCH_HANDLERS[m](self.tracer, self, *a))(_method))
SymTensor.__rmatmul__ = lambda self, other: _matmul(self.tracer, other, self)


class Degree(SymTensor):
    """``len(v.innbs)``: the in-degree. Counts as 1 for ``range(len(v.innbs))`` (the
    traced neighbour list holds one symbolic neighbour) and as the degree in arithmetic.
    Dividing by it treats an isolated vertex's empty aggregate as 0, like PyG's mean."""

    def __index__(self) -> int:
        return 1

    def __int__(self):
        raise self.tracer.error("the in-degree is a per-vertex graph value, not a Python number; "
                                "use it in tensor arithmetic")

    __float__ = __int__

    def clamped(self) -> SymTensor:
        return self.tracer.apply("clamp_min", self, min=1.0)


class NeighbourCount(Degree):
    """``nodes.mailbox[k].shape[1]`` / ``.size(1)``: the in-degree, as a tensor value. A
    Python int would be 1 at trace time (the traced mailbox has one symbolic entry), so
    using it as one (``range``, a reshape size) is an error rather than a wrong count."""

    def __index__(self) -> int:
        raise self.tracer.error("mailbox.shape[1] (the in-degree) differs per vertex and cannot be used "
                                "as a Python int; use it in tensor arithmetic, or reduce over dim=1")
