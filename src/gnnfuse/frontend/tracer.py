"""Operator-overloading tracer shared by both front ends.

A `SymTensor` stands for one row of a graph tensor. Python operators, tensor methods and
torch functions (through ``__torch_function__``) on it append ops to a `Program`; shapes
come from the registry's meta-tensor inference. Real tensors that meet a symbolic one
(parameters captured by closure) become SHARED program inputs. Errors name the construct
and the line of the user's function that used it.
"""
from __future__ import annotations

import linecache
import math
import operator
import sys
import types
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..ir import CompileError, Program, Residency, Value
from ..ir.ops.movement import TYPE_INDICES
from ..user_warning import is_library  # an op refused inside PyG's code is reported at the user's line
from .autocast import applies, autocast_handler, autocast_state, live_states
from .call_arguments import misused, positional
from .module_hooks import registered_hooks
from .numbers import as_eager, is_number, stand_in
from .udf import unwrap

EDGE_ROWED = (Residency.SRC, Residency.DST, Residency.EDGE)


def definition_site(code: types.CodeType) -> str:
    """Where ``code`` is defined, as a `CompileError` names a place: file, first line and its text."""
    line = code.co_firstlineno
    return f"{code.co_filename}:{line}: {linecache.getline(code.co_filename, line).strip()}"


# the frame of a module's call (``module(x)``), whose ``self`` is the module called, and
# the backward hooks torch attaches to such a call's tensors
_MODULE_CALL = torch.nn.Module._call_impl.__code__
_BACKWARD_HOOKS = {"backward_hooks": "register_full_backward_hook",
                   "backward_pre_hooks": "register_full_backward_pre_hook"}


class Tracer:
    """Holds the program being built and knows where the user's code is."""

    def __init__(self, fn: Callable, mode: str):
        self.program = Program()
        self.captured: dict[int, tuple[str, torch.Tensor]] = {}
        self._calls: list[types.FrameType] = []
        # the gradient mode the UDF is called in: an op traced in another (torch.no_grad()
        # inside the UDF) would be differentiated anyway, the program having one backward
        self._grad_enabled = torch.is_grad_enabled()
        # every error raised at the user's code: one its own try/except caught would leave a
        # program of the other branch, silently unlike the eager run (`call` re-raises it)
        self._raised: list[CompileError] = []
        # set by the vertex front end: a per-vertex value a dropout draws for inside a loop
        # over v.innbs, spread onto the in-edges, as eager code draws it anew per neighbour
        self.per_pass_rows: Callable[["SymTensor"], "SymTensor"] | None = None
        # (device type, dtype) of the torch.autocast in force for the tables' device, set at
        # the first input read: the casts autocast makes are traced as ops (`autocast`); that
        # device type, and every device's state at the trace's start, which an op's casts
        # follow (`frontend.autocast.in_force`: a UDF's own ``torch.autocast`` block)
        self.autocast: tuple[str, torch.dtype] | None = None
        self.autocast_device: str | None = None
        self.autocast_live = live_states()
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
        raised = len(self._raised)
        try:
            result = fn(*args)
        except CompileError:
            raise
        except Exception as error:
            # torch's argument parser swallows our error and raises its own, which names no
            # cause: torch.ones(x.shape[0]) says "ones() takes 1 positional argument"
            if len(self._raised) > raised:
                raise self._raised[raised] from error
            raise
        finally:
            self._calls.pop()
        if len(self._raised) > raised:     # caught by the user's code (try/except): not compiled as written
            first = self._raised[raised]
            raise CompileError(f"{first.message} (the traced function caught this error and went on: a "
                               "compiled function cannot take an except branch eager PyTorch would not "
                               "take)", first.source)
        return result

    # -- locations ------------------------------------------------------------------
    def source(self) -> str | None:
        """``file:line: text`` of the innermost frame of user code: the traced UDF's own
        code, or any code outside gnnfuse and torch (a helper the UDF calls), found
        between here and the `call` that runs the UDF. Every value traced asks for it, so
        it also refuses a value traced in another gradient mode than the call's
        (``torch.no_grad()`` inside the function: its program has one backward, which
        would differentiate that value anyway)."""
        if self._calls and torch.is_grad_enabled() is not self._grad_enabled:
            raise self.error("torch.no_grad() / torch.enable_grad() inside a traced function: its program has "
                             "one backward, which would differentiate these ops anyway; compute the value "
                             "outside the function and pass it in (a feature or a captured tensor)")
        return self._location(module_calls=True)

    def _refuse_backward_hooks(self, module: torch.nn.Module) -> None:
        """Refuse an op traced inside a call of ``module`` (``self.lin(x_j)``) when it has a
        backward hook (``register_full_backward_hook`` or its pre-hook, its own or one on
        every module): torch attaches it to the call's tensors, which a traced call does not
        have, so it never ran on the compiled call's gradients (a hook scaling its input's
        gradient by 5 was silently skipped). Forward hooks run while tracing, and a module
        with hooks is traced on every call (`trace_cache`)."""
        own, every = registered_hooks(module, ("_backward_hooks", "_backward_pre_hooks"))
        hooked = [what for name, what in _BACKWARD_HOOKS.items() if name in own or name in every]
        if hooked:
            raise self.error(f"{type(module).__name__} has a backward hook ({' and '.join(hooked)}, on it or "
                             "on every module), which torch attaches to the call's tensors: a traced call "
                             "has none, so it would never run on the compiled gradients; remove it, or call "
                             "this module outside the traced function")

    def _location(self, module_calls: bool = False) -> str | None:
        """The user's innermost line between the caller's caller and the running call;
        with ``module_calls``, in the same walk, `_refuse_backward_hooks` of each module
        call an op is traced inside, which may lie further out than that line."""
        frame, entry = sys._getframe(2), self._calls[-1] if self._calls else None
        location = None
        while frame is not None and frame is not entry:
            code = frame.f_code
            if location is None and (code is self._code or (entry is not None and not is_library(code.co_filename))):
                text = linecache.getline(code.co_filename, frame.f_lineno).strip()
                location = f"{code.co_filename}:{frame.f_lineno}: {text}"
                if not module_calls:
                    break
            if module_calls and code is _MODULE_CALL:
                self._refuse_backward_hooks(frame.f_locals.get("self"))
            frame = frame.f_back
        return location

    def error(self, message: str, *, probe: bool = False) -> CompileError:
        """An error at the user's line; outside a running UDF (checking what it returned),
        at the first line of the UDF's definition. ``probe``: raised by a protocol method
        that torch and Python call to probe an object (``len``, ``iter``), whose callers
        catch the error and go on by design; `call` re-raises every other one the user's
        code caught."""
        error = CompileError(message, self._location() or self._definition())
        if not probe:
            self._raised.append(error)
        return error

    def _definition(self) -> str:
        return definition_site(self._code)

    # -- values ---------------------------------------------------------------------
    def input(self, key: str, residency: Residency, tensor: torch.Tensor, prefix: int) -> "SymTensor":
        if key in self.program.inputs:
            return SymTensor(self, self.program.inputs[key], prefix)
        if tensor.dtype.is_complex:
            # The derivative rules are written for real values: a complex input's forward
            # was right, but its gradients lacked the conjugates torch's complex autograd
            # takes (gspmm of a * b: 5.6 off torch's, with no error)
            what = (f"a captured {list(tensor.shape)} tensor" if residency is Residency.SHARED
                    else f"input {key!r} ({list(tensor.shape)})")
            raise self.error(f"{what} is {tensor.dtype}: complex values are not compiled (gnnfuse's derivative "
                             "rules are for real values); pass the real and imaginary parts as two real tensors")
        if not self.program.inputs:
            self.autocast, self.autocast_device = autocast_state(tensor.device.type), tensor.device.type
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
        if isinstance(obj, (np.integer, np.floating)):
            # torch takes a numpy scalar as the Python number it holds (``x * np.float32(0.5)``
            # of float16 data is float16); it was refused as "a float32 as a tensor operand"
            obj = obj.item()
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            # The dtype torch gives a Python number on its own (an int stays an int:
            # ``edges.data['type'] * 4`` is an index); `numbers.as_eager` retypes it where it
            # meets a tensor.
            # An int is kept exact: as a float, 2**53 + 1 became 2**53 (``ids + c`` was off by 1).
            dtype = torch.int64 if isinstance(obj, int) else torch.get_default_dtype()
            return SymTensor(self, self.program.add("const", value=obj if isinstance(obj, int) else float(obj),
                                                    dtype=dtype, source=self.source()), 0)
        if isinstance(obj, RowCount):
            raise obj.error()
        if isinstance(obj, _Indices):
            obj._refuse()
        raise self.error(f"cannot use a {type(obj).__name__} as a tensor operand in a traced function")

    def in_degree(self, kind: type["Degree"] | None = None, prefix: int = 0) -> "Degree":
        """Each vertex's in-degree as a traced value (``len(v.innbs)``, ``mailbox.shape[1]``):
        an integer, as eager code's Python int (see `numbers`)."""
        value = self.program.add("degree", by="dst", dtype=torch.int64, source=self.source())
        return (kind or Degree)(self, value, prefix)

    def neighbour_count(self) -> "NeighbourCount":
        return self.in_degree(NeighbourCount, 1)

    def apply(self, op: str, *operands: Any, **attrs: Any) -> "SymTensor":
        syms = [self.lift(o) for o in operands]
        residencies = {s.value.residency for s in syms}
        if Residency.NODE in residencies and residencies & set(EDGE_ROWED):
            # Vertex data next to edge data is the destination's (v in v.innbs, nodes.data).
            syms = [s.broadcast_dst() if s.value.residency is Residency.NODE else s for s in syms]
        try:
            value = self.program.add(op, *(s.value for s in syms), source=self.source(), **attrs)
        except CompileError as error:      # a shape or operand rule's: seen by `call` if the UDF catches it
            self._raised.append(error)
            raise
        return SymTensor(self, value, max(s.prefix for s in syms))


class SymTensor:
    """One row of a graph tensor while tracing. ``prefix`` counts the leading graph dims
    the user's code sees (0 in vertex-centric code, 1 for edges/nodes, 2 for a mailbox)."""

    # set by `_viewing`: this value is a view of another, or another is a view of it (an
    # in-place write to either would write both in torch: `_in_place` refuses it)
    _view = _viewed = False
    # set by a front end on a value that is the caller's own tensor in eager code (DGL's
    # ``edges.data``, a PyG message's ``edge_attr``): an in-place write would write it
    caller_table: str | None = None

    def __init__(self, tracer: Tracer, value, prefix: int):
        self.tracer = tracer
        self.value = value
        self.prefix = prefix

    # -- tensor-like surface --------------------------------------------------------
    @property
    def shape(self) -> tuple:
        """Feature dims are numbers; graph dims are not known at trace time. The row axis
        (dim 0: edges or vertices) is a `RowCount`, which only a reshape takes back in its
        own position; a mailbox's neighbour axis is the in-degree, a symbolic value
        (``nodes.mailbox['m'].shape[1]`` in arithmetic is the degree), and so is each
        neighbour axis of a pairwise value: [N, 1, D, ...] for ``m.unsqueeze(1)``, [N, D,
        D, ...] for a pair term (`neighbour_axes`; reading them all as 1 made
        ``x.shape[2]`` of a pair term 1, a silently wrong divisor)."""
        if not self.prefix:
            return torch.Size(self.value.shape)
        rows = RowCount(self.tracer, self._row_name())
        axes = self.neighbour_axes()
        return (rows,) + tuple(self.tracer.neighbour_count() if n else 1 for n in axes) + self.value.shape

    def neighbour_axes(self) -> tuple[bool, ...]:
        """For each graph dim after the row axis, whether it is a neighbour axis (the
        in-degree long) rather than a size-1 axis: a mailbox [N, D], a pairwise view
        [N, 1, D], a pair term [N, D, D] (frontend/pairwise.py)."""
        if self.prefix < 2:
            return ()
        if self.prefix == 2:
            return (True,)
        return (self.value.residency is Residency.PAIR, True)

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
        return "vertex" if self.value.residency is Residency.NODE or self.prefix >= 2 else "edge"

    def __bool__(self):
        raise self.tracer.error("Python control flow (if/while/and/or/not) on a symbolic graph value "
                                "cannot be compiled; use torch.where-free arithmetic or move the "
                                "decision outside the traced function")

    def _compare(self, other):
        raise self.tracer.error("comparing graph values (<, >, ==, ...) cannot be compiled: neither Python "
                                "control flow on the result nor a mask from it (torch.where, x[x > 0], "
                                "(x > 0) * x); express the choice arithmetically (relu, clamp, maximum, ...)")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _compare
    __hash__ = object.__hash__

    def __iter__(self):
        raise self.tracer.error("iterating over a symbolic graph value cannot be compiled", probe=True)

    def __len__(self):
        raise self.tracer.error("len() of a symbolic feature value cannot be compiled (nor torch.tensor() or "
                                "list() of one, which take its length: a traced value, mailbox.shape[1] "
                                "included, is a tensor already; use it as it is)", probe=True)

    def __repr__(self) -> str:
        return (f"SymTensor({self.value.residency.name}, {self.prefix} graph dims, "
                f"feature shape={list(self.value.shape)})")   # self.shape would trace a degree

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = TORCH_HANDLERS.get(func)
        tracer = next(a.tracer for a in _flatten(args, kwargs) if isinstance(a, SymTensor))
        name = getattr(func, "__name__", None) or repr(func)
        if handler is None:
            raise tracer.error(f"torch function {name} has no gnnfuse op (no registry entry)")
        out = kwargs.pop("out", None)
        result = _call(tracer, f"torch function {name}", handler, *positional(func, args, kwargs))
        return result if out is None else _written_out(tracer, name, out, result)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        method = getattr(torch.Tensor, name, None)
        if method is None:
            raise self.tracer.error(f"a tensor has no attribute .{name}")
        if method not in TORCH_HANDLERS:    # a property (.ndim, .requires_grad) is no method to call
            construct = f"tensor method .{name}()" if callable(method) else f"tensor attribute .{name}"
            raise self.tracer.error(f"{construct} has no gnnfuse op (no registry entry)")
        return lambda *args, **kwargs: _call(self.tracer, f"tensor method .{name}()", TORCH_HANDLERS[method],
                                             *positional(method, (self, *args), kwargs))


def _call(tracer: Tracer, construct: str, handler: Callable, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``handler(tracer, *args, **kwargs)``; arguments it has no parameter for (a setting
    torch takes that gnnfuse's op does not) are refused at the user's line, not left to a
    bare TypeError naming the handler."""
    try:
        return handler(tracer, *args, **kwargs)
    except TypeError as exc:
        if not misused(exc):
            raise
        detail = str(exc).split("() ", 1)[-1]
        raise tracer.error(f"{construct} cannot be compiled with these arguments: gnnfuse's op {detail}") from None


def _flatten(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


# --- handlers: torch callables -> ops ---------------------------------------------------
def counts_in_edges(value: Value) -> bool:
    """Whether ``value`` is a per-vertex scalar computed from the in-degree and constants
    alone (``1 / nodes.mailbox['m'].shape[1]``): no per-vertex data, so no vertex axis --
    it acts as DGL's Python int does."""
    if value.op in ("degree", "const"):
        return True
    if value.op == "input" or value.shape != () or not value.inputs:
        return False
    return all(i.residency is Residency.SHARED or counts_in_edges(i) for i in value.inputs)


def torch_broadcast(tracer: Tracer, a, b) -> tuple[SymTensor, SymTensor]:
    """``a`` and ``b`` lined up as torch broadcasts them where the UDF sees graph axes
    ([E, ...], [N, ...], a mailbox's [N, D, ...]), as DGL and PyG run these UDFs.

    The IR broadcasts per row, right-aligned within the feature dims. That is torch's
    rule only when both graph values show the same number of dims: torch would pair
    the row axis of a [N] value with the last axis of a [N, 1] one (giving [N, N]), and
    a captured [N, F] or [1, F] tensor's first axis with the rows. So graph values of
    different ranks are refused (torch gives another shape, or raises), and a captured
    tensor reaching into the graph axes has those size-1 axes dropped, or is refused.
    Vertex-centric code (no graph axes) broadcasts per vertex, as written."""
    a, b = tracer.lift(a), tracer.lift(b)
    graph = [x for x in (a, b) if x.prefix and not counts_in_edges(x.value)]
    if not graph or any(x.prefix > 2 for x in graph):    # pairwise terms: pairwise.line_up's rules
        return a, b
    if len(graph) == 2 and a.dim() != b.dim():
        raise tracer.error(
            f"a {shown(a)} and a {shown(b)} graph value: torch (as DGL and PyG run this function) aligns "
            "their last axes, pairing a graph axis of one with a feature axis of the other (a [N, 1] and a [N] make "
            "[N, N]); give both the same number of dims (unsqueeze(-1) or squeeze(-1) one of them)")
    axes = max(x.prefix for x in graph)
    return tuple(_captured_in_feature_dims(tracer, x, graph[0], axes) for x in (a, b))


def _captured_in_feature_dims(tracer: Tracer, x: SymTensor, beside: SymTensor, axes: int) -> SymTensor:
    """A captured tensor next to the graph value ``beside``, ``axes`` of whose dims are
    graph axes: its dims that torch aligns with graph axes must be 1 (dropped here). One
    left with no dims must not change the result's dtype: as a 0-dim tensor it would not
    widen the graph value (a [1] float64 weight times float32 edge data is float64 in
    torch), so that case is refused."""
    rank = beside.dim()
    if x.prefix or len(x.value.shape) <= rank - axes:
        return x
    reach = len(x.value.shape) - (rank - axes)
    # more dims than the graph value: torch's result gets them before the row axis ([1, E, F]
    # for a [1, 1, F] tensor), a shape a compiled function's rows cannot give, even of size 1
    if any(n != 1 for n in x.value.shape[:reach]) or len(x.value.shape) > rank:
        raise tracer.error(
            f"a captured {list(x.value.shape)} tensor next to a {rank}-dim graph value: torch lines its "
            f"leading dim(s) {list(x.value.shape[:reach])} up with the graph's row axes (or puts them before "
            "them), which a captured tensor cannot hold: pass per-row data in as node or edge data (in a "
            "MessagePassing class, to propagate() as a keyword argument), or keep the captured tensor to the "
            "feature dims")
    eager, held = torch.promote_types(x.dtype, beside.dtype), _scalar_dtype(x.dtype, beside.dtype)
    if reach == len(x.value.shape) and held != eager:
        raise tracer.error(
            f"a captured {list(x.value.shape)} {x.dtype} tensor next to a {shown(beside)} {beside.dtype} graph "
            f"value: torch gives {eager}, which a compiled function cannot (it holds the tensor as a 0-dim one, "
            f"which gives {held}); pass the graph data as {eager}, or the tensor as a 0-dim one (t.reshape(())) "
            f"for {held}")
    return tracer.apply("reshape", x, shape=tuple(x.value.shape[reach:]))


def _scalar_dtype(scalar: torch.dtype, tensor: torch.dtype) -> torch.dtype:
    """torch's result dtype for a 0-dim tensor of dtype ``scalar`` and a tensor with dims."""
    return torch.result_type(torch.empty((1,), dtype=tensor, device="meta"),
                             torch.empty((), dtype=scalar, device="meta"))


def shown(x: SymTensor) -> str:
    """The shape the UDF sees: [E, ...] per edge, [N, ...] per vertex, [N, D, ...] a
    mailbox, [N, 1, D, ...] a mailbox's ``unsqueeze(1)`` and [N, D, D, ...] a pairwise
    term (frontend/pairwise.py). Not ``x.shape``, whose graph dims are trace objects
    (an error message showed a mailbox's neighbour axis as a SymTensor repr)."""
    if not x.prefix:            # a captured tensor: no graph dims
        return str(list(x.value.shape))
    row = "E" if x.prefix == 1 and x.value.residency in EDGE_ROWED else "N"
    names = [row] + ["D" if neighbours else "1" for neighbours in x.neighbour_axes()]
    return "[" + ", ".join(names + [str(n) for n in x.value.shape]) + "]"


def _binary(op: str, reverse: bool = False):
    def handler(tracer: Tracer, a, b, *, alpha=None, rounding_mode=None):
        if rounding_mode is not None:   # it reached Python as a bare TypeError about the handler
            raise tracer.error(f"torch.div with rounding_mode={rounding_mode!r} (floor or truncating division) "
                               "has no gnnfuse op; compute it outside the compiled function")
        if alpha is not None and alpha != 1:
            b = _scaled_by_alpha(tracer, a, b, alpha)
        a, b = (b, a) if reverse else (a, b)
        if op == "div" and isinstance(b, Degree):
            return _elementwise(tracer, "div", tracer.lift(a), b.clamped())
        return _elementwise(tracer, op, *torch_broadcast(tracer, a, b))
    return handler


def _scaled_by_alpha(tracer: Tracer, a: Any, b: Any, alpha: Any) -> Any:
    """``alpha * b`` of ``torch.add(a, b, alpha=...)`` / ``sub``, computed in the dtype
    torch computes the whole op in (``a``'s and ``b``'s promoted one), as torch does.
    Multiplied first in ``b``'s own dtype, ``torch.add(x, y, alpha=0.1)`` of float64 ``x``
    and float32 ``y = 1`` gave 0.10000000149 where torch gives 0.1, and an int64 ``y`` of
    2**25 + 1 was rounded to float32; and integer operands with a float ``alpha``, which
    torch refuses, gave a float result."""
    a, b = tracer.lift(a), tracer.lift(b)
    if is_number(b.value):
        return _binary("mul")(tracer, b, alpha)
    if is_number(a.value):
        common = b.dtype
    else:
        rows = tracer.mode != "vertex"
        common = torch.result_type(stand_in(a.value, rows), stand_in(b.value, rows))
    if isinstance(alpha, float) and not (common.is_floating_point or common.is_complex):
        raise tracer.error(f"torch.add / torch.sub of {common} operands with a floating-point alpha={alpha}: "
                           "torch refuses it (for integral input tensors, alpha must not be a floating point "
                           "number)")
    return _binary("mul")(tracer, _cast(tracer, b, common), alpha)


def _elementwise(tracer: Tracer, op: str, a: SymTensor, b: SymTensor) -> SymTensor:
    """``op(a, b)`` in the dtype eager torch gives it, a Python number among the operands
    (a constant, the in-degree) promoted as torch promotes one (`numbers.as_eager`)."""
    a_value, b_value = as_eager(tracer.program, a.value, b.value)
    a, b = SymTensor(tracer, a_value, a.prefix), SymTensor(tracer, b_value, b.prefix)
    if tracer.mode == "vertex" and not (is_number(a_value) or is_number(b_value)):
        a, b = _per_vertex_promoted(tracer, a, b)
    return tracer.apply(op, a, b)


def _per_vertex_promoted(tracer: Tracer, a: SymTensor, b: SymTensor) -> tuple[SymTensor, SymTensor]:
    """``a`` and ``b`` of a vertex function, cast to the dtype eager code run for one
    vertex computes their op in. There a per-row scalar (``u.s`` of an [N] table,
    ``u.h.sum(-1)``, ``u.h[0]``) is a 0-dim tensor, which does not widen a tensor with dims
    of its kind (and a per-row value beside a captured 0-dim tensor is promoted as two
    0-dim tensors are); the IR ranks values with their row axis, so ``u.h * u.s`` of float32
    ``h`` and float64 ``s`` came out float64 where eager code gives float32 (and ``u.s *
    S`` of float32 ``s`` and a captured 0-dim float64 ``S`` float32 where it gives
    float64). Casting both operands first is what torch does: it computes in that dtype."""
    eager = torch.result_type(stand_in(a.value, rows=False), stand_in(b.value, rows=False))
    if eager == torch.result_type(stand_in(a.value), stand_in(b.value)):
        return a, b
    return _cast(tracer, a, eager), _cast(tracer, b, eager)


def _in_place(x: Any, result: "SymTensor") -> "SymTensor":
    """``result`` written into ``x``, as an in-place torch op writes its input: every name
    bound to ``x`` sees it (``F.relu(h, inplace=True); h + ...``, ``b = a; a += c``).
    A `SymTensor` holds its traced value, not data, so this rebinds that value. Without
    it the in-place op acted as an out-of-place one and the other names kept the old
    value, silently (PyG's ``h + self.act(h)`` with ``ReLU(inplace=True)``).

    A value eager code holds as a Python number (``s = len(v.innbs) * 1.0``, `is_number`)
    is immutable there: ``t = s; s += 1`` rebinds ``s`` and leaves ``t`` the degree. Such
    a value is rebound by Python here too; written in place, ``t`` read the degree plus
    one (3.0 where eager code gives 2.0), silently."""
    if type(x) is not SymTensor or is_number(x.value):     # a number, a degree: rebound by Python
        return result
    if x.caller_table is not None:
        raise x.tracer.error(f"an in-place op on {x.caller_table} would write the caller's tensor, which eager "
                             "code hands the function as it is; a compiled call cannot, so write it out of place "
                             "(h = h + ..., or edges.data[key] = ... for a new edge value)")
    if x._view or x._viewed:
        raise x.tracer.error("an in-place op on a view of a graph value, or on a value a view was taken of "
                             "(x.view(...), x[:, :2], x.unsqueeze(...)), would write both in torch; it "
                             "cannot be compiled, so write it out of place (h = h + ...)")
    if result.value.shape != x.value.shape or not torch.can_cast(result.value.dtype, x.value.dtype):
        raise x.tracer.error(f"an in-place op cannot change a value's feature shape or dtype ({list(x.value.shape)} "
                             f"{x.value.dtype} -> {list(result.value.shape)} {result.value.dtype}), as in torch")
    if result.value.dtype != x.value.dtype:
        # ``h += w`` of float32 h and float64 w: torch computes in float64 and writes the
        # result into h as float32 (a cast torch allows); it was refused as a dtype change
        result = x.tracer.apply("cast", result, dtype=x.value.dtype)
    x.value, x.prefix = result.value, result.prefix
    return x


def _written_out(tracer: Tracer, name: str, out: Any, result: Any) -> "SymTensor":
    """``torch.<name>(..., out=out)``: ``result`` written into ``out``, which torch returns.
    Handlers took ``out=`` and ignored it, so ``torch.mul(h, 3.0, out=h)`` left ``h`` as it
    was (2.0 where eager code gives 6.0), silently. A traced ``out`` is written as an
    in-place op writes (`_in_place`: every name bound to it sees the value, and the
    caller's tables and views are refused); any other ``out`` (a real tensor, a tuple) is
    memory outside the trace, refused, and so is a result without ``out``'s rows (a
    captured tensor's, a vertex's written into an edge's), which torch would resize."""
    if type(out) is not SymTensor or is_number(out.value) or not isinstance(result, SymTensor):
        raise tracer.error(f"torch.{name}(..., out=) writes into a tensor the traced function does not compute "
                           "(a captured tensor, or several outputs), which cannot be compiled; use the result")
    rows = {out.value.residency, result.value.residency}
    if out.prefix != result.prefix or not (len(rows) == 1 or rows <= set(EDGE_ROWED)):
        raise tracer.error(f"torch.{name}(..., out=) writes a {result.value.residency.name} value into a "
                           f"{out.value.residency.name} one, which cannot be compiled; use the result")
    return _in_place(out, result)


def _in_place_variant(handler: Callable) -> Callable:
    """``x.add_(y)``, ``x.clamp_(min=0)``, ``torch.relu_(x)``: ``handler``'s op, its result
    written into ``x`` as ``x += y`` writes it (`_in_place`). They had no handler, so code
    writing a fresh value in place (``h = v.h * 2; h.add_(1)``) was refused. An ``x`` the
    trace does not compute (a captured tensor written with a graph value) is refused."""
    def handle(tracer: Tracer, x, *args, **kwargs):
        if type(x) is not SymTensor or is_number(x.value):
            raise tracer.error("an in-place op on a tensor the traced function does not compute (a captured "
                               "tensor) or on a number (len(v.innbs), mailbox.shape[1] and values computed "
                               "from them alone, Python numbers in eager code) cannot be compiled; use the "
                               "op's result")
        return _in_place(x, handler(tracer, x, *args, **kwargs))
    return handle


def _clone(tracer: Tracer, x, *, memory_format=None):
    """``x.clone()``: a copy, so an in-place op on it writes neither ``x`` nor the caller's
    table ``x`` may be a read of (``h = v.h.clone(); h += 1`` is the function's own value)."""
    x = tracer.lift(x)
    return SymTensor(tracer, x.value, x.prefix)


def _detach(tracer: Tracer, x):
    """``x.detach()``: the same values, through which no gradient flows (``stop_gradient``).
    It was refused ("no gnnfuse op"). torch's result shares ``x``'s storage, so the
    handler is registered as a view (`_viewing`): an in-place write to either is refused."""
    return tracer.apply("stop_gradient", x)


def _unary(op: str, **defaults):
    def handler(tracer: Tracer, x, *args, inplace=False, **kwargs):
        attrs = dict(defaults)
        for (name, _), val in zip(defaults.items(), args):
            attrs[name] = val
        if len(args) > len(defaults):       # F.relu(x, True), F.leaky_relu(x, 0.2, True): inplace, positionally
            inplace = args[len(defaults)]
        attrs.update({k: v for k, v in kwargs.items() if k in defaults})
        result = tracer.apply(op, x, **{k: float(v) for k, v in attrs.items()})
        return _in_place(x, result) if inplace else result
    return handler


def _no_dims(dim) -> bool:
    """``dim=()`` / ``dim=[]``: torch's sum, mean, amax, amin and norms then reduce over
    every dim, as with ``dim=None``. Taken as a reduction over no dims, ``x.sum(dim=())``
    of an [E, F] message summed rows of other edges on the reference backend and read
    memory it never wrote in the Triton kernels (values like 1e-40), with no error."""
    return isinstance(dim, (tuple, list, torch.Size)) and len(dim) == 0


def _dims(x: SymTensor, dim) -> tuple[list[int], bool]:
    dims = [dim] if isinstance(dim, int) else list(dim)
    mapped = [x.feature_dim(d) for d in dims]
    graph_axes = [m for m in mapped if m is None]
    if graph_axes and len(mapped) > 1:
        raise x.tracer.error("reduce over the neighbour axis and feature axes in separate calls")
    return mapped, bool(graph_axes)


class _Indices:
    """The indices half of ``torch.max(x, dim)`` on a graph value (``vals, idx =
    torch.max(m, 1)`` unpacks it): any use of it is refused at its line."""

    def __init__(self, tracer: Tracer):
        self._tracer = tracer

    def _refuse(self, *args, **kwargs):
        raise self._tracer.error("the indices of torch.max/min over a graph value (argmax/argmin) cannot be "
                                 "compiled; use the values (torch.max(x, dim)[0] or .values)")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        next(a for a in _flatten(args, kwargs or {}) if isinstance(a, _Indices))._refuse()


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv", "mod",
              "rmod", "pow", "rpow", "matmul", "rmatmul", "neg", "abs", "getitem", "index", "int", "float", "bool",
              "lt", "le", "gt", "ge", "eq", "ne", "len", "iter"):
    setattr(_Indices, f"__{_name}__", _Indices._refuse)
_Indices.__hash__ = object.__hash__


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


def _summed_as_int64(dtype: torch.dtype) -> bool:
    """torch.sum of bool or of integers narrower than int64 returns int64 (without
    ``dtype=``, and with ``dtype=torch.int64``, which was refused as a conversion); a
    dtype-keeping sum wrapped around: three int32 2**30 in a mailbox summed to -2**30
    where DGL's torch.sum gives 3 * 2**30."""
    return dtype == torch.bool or (not dtype.is_floating_point and not dtype.is_complex and dtype != torch.int64)


def _reduction(feature_op: str | None, graph_op: str, name: str | None = None, pair: bool = False):
    """torch.``name`` (default ``graph_op``): ``graph_op`` over the neighbour axis,
    ``feature_op`` over feature dims; with ``pair`` it returns (values, indices) as
    torch.max / torch.min do (torch.amax / amin return the values alone). ``keepdims``
    is the numpy spelling of ``keepdim`` that torch accepts too."""
    name = name or graph_op

    def handler(tracer: Tracer, x, dim=None, keepdim=False, *, dtype=None, keepdims=None):
        x = tracer.lift(x)
        keepdim = keepdim if keepdims is None else keepdims
        if dim is None or _no_dims(dim):
            raise tracer.error(f"torch.{name} over all dims of a graph value cannot be compiled; pass dim=")
        if graph_op == "sum" and dtype in (None, torch.int64) and _summed_as_int64(x.dtype):
            x = tracer.apply("cast", x, dtype=torch.int64)
        _check_dtype(tracer, x, dtype, name)
        dims, graph_axis = _dims(x, dim)
        if graph_axis:
            result = tracer.reduce(x, graph_op, dim, keepdim) if hasattr(tracer, "reduce") else None
            if result is None:
                raise tracer.error(f"reducing over dim={dim} (the neighbour axis) is only possible on "
                                   "nodes.mailbox inside reduce_fn")
        elif feature_op is None:
            raise tracer.error(f"torch.{name} over feature dims has no gnnfuse op")
        else:
            result = tracer.apply(feature_op, x, dim=tuple(dims), keepdim=bool(keepdim))
            if dtype is not None and result.dtype != dtype:
                # ``x.sum(-1, dtype=torch.int32)`` of int32 data: torch sums in int32 (wrapping),
                # the op in int64, so the result came back int64 (2**32 where torch gives 0);
                # the int64 sum cast back wraps as torch's int32 sum does
                result = tracer.apply("cast", result, dtype=dtype)
        if not pair:
            return result
        values_and_indices = _ReduceResult((result, _Indices(tracer)))
        values_and_indices.tracer = tracer
        return values_and_indices
    return handler


def _matmul(tracer: Tracer, a, b):
    b = tracer.lift(b)
    if b.value.op == "broadcast" and b.value.attrs["by"] in TYPE_INDICES:
        return _typed_matmul(tracer, tracer.lift(a), b)
    if b.value.residency is not Residency.SHARED:
        return _row_matmul(tracer, tracer.lift(a), b)
    a = tracer.lift(a)
    if len(b.value.shape) > 2:      # torch would batch a's feature dims against W's leading ones
        raise tracer.error(f"x @ W with a {len(b.value.shape)}-D parameter W {list(b.value.shape)} (a batched "
                           "matmul per head) cannot be compiled; reshape to one 2-D W, or use torch.bmm with "
                           "W looked up per row")
    if len(b.value.shape) == 1:     # x @ v: torch's matrix-vector product, a [F] -> [F, 1] matmul and back
        if not a.value.shape:
            raise tracer.error("x @ v needs x to have a feature dim, as in torch")
        column = tracer.apply("reshape", b, shape=b.value.shape + (1,))
        product = tracer.apply("matmul", a, column)
        return tracer.apply("reshape", product, shape=product.value.shape[:-1])
    return tracer.apply("matmul", a, b)


def _row_matmul(tracer: Tracer, x: SymTensor, w: SymTensor) -> SymTensor:
    """``x @ W`` with one matrix W per row (ir/ops/row_matmul.py). Vertex code is written
    per row, so its shapes are the row's own; in message code torch's batching must line
    the graph axis of both operands up (equal ranks, as torch.bmm has), or torch would
    multiply each row against every other row's matrix."""
    prefix = max(x.prefix, w.prefix)
    shared_left = x.value.residency is Residency.SHARED and len(x.value.shape) == 2
    if prefix and not (w.dim() >= 3 and (shared_left or (x.prefix == w.prefix and x.dim() == w.dim()))):
        raise tracer.error(f"x @ W with W one matrix per row needs both as batches over the graph axis, got "
                           f"{list(x.shape)} @ {list(w.shape)}; write torch.bmm(x.unsqueeze(1), W)")
    if w.value.op == "index_rows" and x.value.residency is not Residency.SHARED:
        table, idx = w.value.inputs
        if idx.shape == () and len(table.shape) == 3:   # x @ W[idx]: grouped, never gathered
            return tracer.apply("indexed_matmul", x, SymTensor(tracer, table, 0), SymTensor(tracer, idx, w.prefix))
    vector_x, vector_w = len(x.value.shape) == 1, len(w.value.shape) == 1
    if vector_x:
        x = tracer.apply("reshape", x, shape=(1,) + x.value.shape)
    if vector_w:
        w = tracer.apply("reshape", w, shape=w.value.shape + (1,))
    y = tracer.apply("row_matmul", x, w)
    if vector_x or vector_w:
        y = tracer.apply("reshape", y, shape=y.value.shape[:-2] + y.value.shape[-2:][vector_x:2 - vector_w])
    return y


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


def _cat(tracer: Tracer, tensors, dim=0):
    """``torch.cat``, which never broadcasts: its operands have one number of dims and the
    same sizes but along ``dim``. The IR's concat pads ranks and reads a vertex's value
    onto its in-edges, as its elementwise ops do, so an [E, F] and an [E] value made an
    [E, F + 1] message, and a [N, 1, F] node value beside a [N, D, F] mailbox one a [N, D,
    2F] one, where torch raises; so does a captured tensor beside graph values (its leading
    dims would have to be the row count: graph data, passed in as node or edge data)."""
    syms = [tracer.lift(t) for t in tensors]
    graph = [s for s in syms if s.prefix]
    # a 1-D empty tensor, which torch skips (its legacy rule), takes part in the dtype alone
    lined = [s for s in syms if s.prefix or s.value.shape != (0,)]
    if graph and (len({s.dim() for s in lined}) > 1 or len({(s.prefix, s.neighbour_axes()) for s in graph}) > 1
                  or len(graph) < len(lined)):
        raise tracer.error(f"torch.cat of {', '.join(shown(s) for s in syms)} values: torch concatenates tensors "
                           "of one number of dims whose other sizes match, without broadcasting (and a captured "
                           "tensor has no rows of the graph's); give the operands the same graph axes and number "
                           "of dims (unsqueeze, or arithmetic that broadcasts: m * 0 + h.unsqueeze(1))")
    d = syms[0].feature_dim(dim)
    if d is None:
        raise tracer.error("concatenating along a graph axis cannot be compiled")
    return tracer.apply("concat", *syms, dim=d)


def _reshape(tracer: Tracer, x, *shape):
    x = tracer.lift(x)
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
    if any(isinstance(s, torch.dtype) for s in shape):
        # ``x.view(dtype)`` is torch's other view: the same bytes read as another dtype. Taken
        # for a size, it was refused as "reshape [torch.int64] must keep the leading graph
        # dims as -1", naming a reshape the line never wrote
        if shape == (x.dtype,):
            return x
        raise tracer.error(f"x.view({', '.join(map(str, shape))}) of a {x.dtype} graph value reinterprets its bytes "
                           "as another dtype, which has no gnnfuse op; convert the value (x.to(dtype)) or pass "
                           "the data in as the dtype you want")
    lead, elem = shape[: x.prefix], shape[x.prefix:]
    if any(isinstance(s, RowCount) for s in shape[1:]):
        raise next(s for s in shape[1:] if isinstance(s, RowCount)).error()
    # the row axis takes back its RowCount, a neighbour axis its in-degree, a pairwise
    # view's size-1 axis 1 (below); -1 keeps any of them
    axes = x.neighbour_axes()
    kept = [isinstance(s, RowCount) if i == 0 else isinstance(s, NeighbourCount) and axes[i - 1]
            for i, s in enumerate(lead)]
    if any(isinstance(s, SymTensor) for s in elem) or any(
            isinstance(s, SymTensor) and not keep for s, keep in zip(lead, kept)):
        raise tracer.error("a reshape size cannot depend on the in-degree (mailbox.shape[1]): it differs "
                           "per vertex; keep the neighbour axis as its own dim")
    if sum(1 for s in shape if isinstance(s, int) and s == -1) > 1:
        raise tracer.error(f"reshape {list(shape)}: only one dimension can be inferred (-1), as in torch")
    # a 1 is torch's size only for a size-1 axis (a pairwise view's axis 1): at the row axis
    # ``x.reshape(1, -1)`` puts every row's elements into one row, and at a neighbour axis
    # (``m.reshape(-1, 1, F)``) the messages of all in-edges into rows of their own; kept
    # as they were, ``x.reshape(1, -1).sum(-1)`` summed each row where torch sums them all
    if any(isinstance(s, int) and s == 1 and (i == 0 or axes[i - 1]) for i, s in enumerate(lead)):
        axis = "the row axis (dim 0, one row per edge or vertex)" if isinstance(lead[0], int) and lead[0] == 1 \
            else "a neighbour axis (the in-degree long)"
        raise tracer.error(f"reshape {list(shape)} of a {shown(x)} graph value sets {axis} to 1, which moves "
                           "elements across rows in torch; keep it as x.shape[...] or -1")
    if any(not keep and not (isinstance(s, int) and s in (-1, 1)) for s, keep in zip(lead, kept)):
        raise tracer.error(f"reshape {list(shape)} must keep the leading graph dims as -1")
    if -1 in elem:
        known = 1
        for s in elem:
            known *= s if s != -1 else 1
        total = 1
        for s in x.value.shape:
            total *= s
        elem = tuple(total // known if s == -1 else s for s in elem)
    if x.prefix == 2 and math.prod(elem) != math.prod(x.value.shape):
        # mailbox.reshape(mailbox.shape[0], -1): the -1 would merge the neighbour axis into the features
        raise tracer.error(f"reshape {list(shape)} of a mailbox merges its neighbour axis (the in-degree, which "
                           "differs per vertex) into the features; keep the neighbour axis as its own dim "
                           "(mailbox.reshape(mailbox.shape[0], mailbox.shape[1], -1)) or reduce over dim=1 first")
    if math.prod(elem) != math.prod(x.value.shape):
        # x.view(-1) or x.reshape(-1, 2) of a [rows, 4] value: its -1 is the graph axis, so
        # the rest must hold each row's 4 elements; anything else moves rows into features
        raise tracer.error(f"reshape {list(shape)} of a value of {list(x.value.shape)} per row moves elements "
                           f"across dim 0, the graph axis (one row per vertex or edge); keep dim 0 as the first "
                           f"size and reshape each row's {math.prod(x.value.shape)} elements, e.g. "
                           f"x.reshape(-1, {', '.join(map(str, x.value.shape)) or 1})")
    return tracer.apply("reshape", x, shape=tuple(elem))


def _unsqueeze(tracer: Tracer, x, dim):
    x = tracer.lift(x)
    at = dim if dim >= 0 else x.dim() + 1 + dim     # torch's position of the new axis
    if tracer.mode == "reduce" and x.prefix == 2 and at == 1:
        return tracer.pair_view(x)  # mailbox.unsqueeze(1): a pairwise term (frontend/pairwise.py)
    rank = len(x.value.shape)
    pos = dim - x.prefix if dim >= 0 else rank + 1 + dim
    # a valid dim in torch, also negative (unsqueeze(-3) of an [E, F] value is [1, E, F]),
    # which the old message called out of range
    if 0 <= at < x.prefix:
        graph = "dim 0" if x.prefix == 1 else f"dims 0-{x.prefix - 1}"
        raise tracer.error(f"unsqueeze({dim}) adds an axis among the graph dims ({graph}: one row per vertex or "
                           f"edge, and a mailbox's neighbour axis), which a compiled function keeps in place; "
                           f"unsqueeze a feature dim ({x.prefix} to {x.dim()}, or -1 to -{rank + 1})")
    if not 0 <= pos <= rank:
        raise tracer.error(f"unsqueeze dim {dim} is out of range")
    shape = x.value.shape[:pos] + (1,) + x.value.shape[pos:]
    return tracer.apply("reshape", x, shape=shape)


def _dropout(tracer: Tracer, x, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return tracer.lift(x)
    if not 0 <= p <= 1:
        raise tracer.error(f"dropout probability has to be between 0 and 1, but got {p}")
    lifted = tracer.lift(x)
    if tracer.per_pass_rows is not None:
        spread = tracer.per_pass_rows(lifted)
        if spread is not lifted and inplace:
            raise tracer.error("an in-place dropout of a per-vertex value inside the loop over v.innbs / "
                               "v.inedges: eager code drops it again in every neighbour's pass; drop a copy "
                               "(F.dropout(x, p) without inplace=True)")
        lifted = spread
    if p == 1:      # torch's ``input * 0``: every element dropped (NaN where the input is infinite)
        result = tracer.apply("mul", lifted, 0.0)
    else:
        result = tracer.apply("mul", lifted, tracer.apply("dropout_mask", lifted, p=float(p)))
    return _in_place(x, result) if inplace else result


def _softmax(tracer: Tracer, x, dim=None, *args, **kwargs):
    x = tracer.lift(x)
    _check_dtype(tracer, x, kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None)), "softmax")
    if dim is None or x.feature_dim(dim) is not None or not hasattr(tracer, "softmax"):
        raise tracer.error("softmax is supported over the neighbour axis (dim=1 of nodes.mailbox)")
    return tracer.softmax(x)


def _clamp(tracer: Tracer, x, min=None, max=None):
    """``x.clamp(min=a, max=b)`` with constant bounds: ``clamp_min``, and for ``max``
    the same on ``-x`` (``min(x, b) = -max(-x, -b)``)."""
    if any(bound is not None and not isinstance(bound, (int, float)) for bound in (min, max)):
        raise tracer.error("only constant bounds can be compiled in clamp(min=..., max=...)")
    if min is None and max is None:
        raise tracer.error("clamp needs a min or a max bound")
    if any(bound is not None and bound != bound for bound in (min, max)):   # the kernels' compare skips NaN
        raise tracer.error("clamp with a NaN bound (torch makes every element NaN) cannot be compiled")
    x = tracer.lift(x)
    if not x.dtype.is_floating_point:    # the bounds are traced as floats: 2**24 + 1 would round
        raise tracer.error(f"clamp of an integer graph value ({x.dtype}) cannot be compiled; "
                           "clamp it before passing it in")
    if min is not None:
        x = tracer.apply("clamp_min", x, min=float(min))
    if max is not None:
        x = tracer.apply("neg", tracer.apply("clamp_min", tracer.apply("neg", x), min=-float(max)))
    return x


def _pow(tracer: Tracer, x, exponent):
    if not isinstance(exponent, (int, float)):
        raise tracer.error("only a constant exponent can be compiled in x ** c")
    x = tracer.lift(x)
    if isinstance(exponent, int) and not isinstance(exponent, bool) and not x.dtype.is_floating_point and (
            exponent >= 0 or not is_number(x.value)):   # a Python int to a negative power is a float
        return _integer_power(tracer, x, exponent)
    return tracer.apply("pow", x, exponent=float(exponent))


def _integer_power(tracer: Tracer, x: SymTensor, exponent: int) -> SymTensor:
    """``x ** n`` of integer data, an integer as in torch, by repeated squaring: the
    ``pow`` op takes a float exponent, which made ``4097 ** 2`` a float32 16785408.
    Booleans are counted as int64 first, as torch promotes them beside a Python int: their
    products stayed bool, so ``flag ** 2`` was bool where torch gives int64."""
    if exponent < 0:
        raise tracer.error("an integer graph value to a negative integer power: torch does not allow it; "
                           "pass it in as floats, or write (x * 1.0) ** -1")
    if x.dtype == torch.bool:
        x = tracer.apply("cast", x, dtype=torch.int64)
    result, square = None, x
    while exponent:
        if exponent & 1:
            result = square if result is None else tracer.apply("mul", result, square)
        exponent >>= 1
        if exponent:
            square = tracer.apply("mul", square, square)
    return tracer.apply("add", tracer.apply("mul", x, 0), 1) if result is None else result


# --- handlers for the tensor ops real UDFs use (issue #11 §2) ---------------------------
def _binary_or(reduction: Callable, op: str):
    """``torch.max(a, b)`` is elementwise, ``torch.max(x, dim)`` a reduction: one torch
    name, two ops, told apart by whether the second operand is a tensor."""
    def handler(tracer: Tracer, x, *args, **kwargs):
        other = args[0] if args else kwargs.get("other")
        if isinstance(other, (SymTensor, torch.Tensor)):
            return _elementwise(tracer, op, *torch_broadcast(tracer, x, other))
        return reduction(tracer, x, *args, **kwargs)
    return handler


def _no_dtype_change(tracer: Tracer, x: SymTensor, dtype, what: str) -> None:
    if dtype is not None and dtype != x.dtype:
        raise tracer.error(f"{what} with dtype={dtype} on a {x.dtype} value cannot be compiled; "
                           "convert the inputs instead")


def _feature_dim(tracer: Tracer, x: SymTensor, dim, what: str) -> int:
    if not isinstance(dim, int):
        raise tracer.error(f"{what} needs one integer dim, got dim={dim!r}")
    d = x.feature_dim(dim)
    if d is None:
        raise tracer.error(f"{what} over dim={dim}, a graph axis, cannot be compiled; use a feature dim "
                           "(dim=-1)")
    return d


def _feature_softmax(tracer: Tracer, x: SymTensor, dim: int, log: bool) -> SymTensor:
    """softmax / log_softmax over a feature dim, from exp, sum and div (each exact and
    differentiable), shifted by the max for stability as torch does."""
    what = "log_softmax" if log else "softmax"
    d = _feature_dim(tracer, x, dim, what)
    if not x.dtype.is_floating_point:   # its exp and division made floats of them, where torch raises
        raise tracer.error(f"a {what} of {x.dtype} values is not compiled ({what} rejects them); multiply "
                           "by 1.0 or pass floats in")
    shift = tracer.apply("stop_gradient", tracer.apply("amax_dim", x, dim=(d,), keepdim=True))
    z = tracer.apply("sub", x, shift)
    e = tracer.apply("exp", z)
    total = tracer.apply("sum_dim", e, dim=(d,), keepdim=True)
    return tracer.apply("sub", z, tracer.apply("log", total)) if log else tracer.apply("div", e, total)


def _softmax_dtype(args, kwargs) -> torch.dtype | None:
    """The dtype given to torch.softmax(x, dim, dtype) / F.softmax(x, dim, _stacklevel, dtype)."""
    return kwargs.get("dtype") or next((a for a in args if isinstance(a, torch.dtype)), None)


def _softmax_or_feature(tracer: Tracer, x, dim=None, *args, **kwargs):
    """Over a feature dim here; over the neighbour axis (the mailbox's dim 1) by `_softmax`."""
    x = tracer.lift(x)
    if isinstance(dim, int) and x.feature_dim(dim) is not None:
        _no_dtype_change(tracer, x, _softmax_dtype(args, kwargs), "softmax")
        return _feature_softmax(tracer, x, dim, log=False)
    return _softmax(tracer, x, dim, *args, **kwargs)


def _log_softmax(tracer: Tracer, x, dim=None, *args, **kwargs):
    x = tracer.lift(x)
    _no_dtype_change(tracer, x, _softmax_dtype(args, kwargs), "log_softmax")
    return _feature_softmax(tracer, x, dim, log=True)


def _vector_norm(tracer: Tracer, x: SymTensor, p, dim, keepdim: bool, what: str) -> SymTensor:
    if dim is None or _no_dims(dim):
        raise tracer.error(f"{what} over all dims would include the graph axis; pass dim=-1")
    dims = tuple(_feature_dim(tracer, x, d, what) for d in ([dim] if isinstance(dim, int) else dim))
    if p in (2, "fro"):
        return tracer.apply("norm_dim", x, dim=dims, keepdim=bool(keepdim))
    if p == 1:
        return tracer.apply("sum_dim", tracer.apply("abs", x), dim=dims, keepdim=bool(keepdim))
    raise tracer.error(f"{what} with p={p!r} has no gnnfuse op; p=1 and p=2 are supported")


def _norm(tracer: Tracer, x, p="fro", dim=None, keepdim=False, dtype=None):
    x = tracer.lift(x)
    _no_dtype_change(tracer, x, dtype, "norm")
    return _vector_norm(tracer, x, p, dim, keepdim, "norm")


def _linalg_vector_norm(tracer: Tracer, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _norm(tracer, x, ord, dim, keepdim, dtype=dtype)


def _normalize(tracer: Tracer, x, p=2.0, dim=1, eps=1e-12):
    """F.normalize: x / max(||x||_p, eps) over a feature dim, as torch composes it."""
    x = tracer.lift(x)
    norm = _vector_norm(tracer, x, p, dim, True, "F.normalize")
    return tracer.apply("div", x, tracer.apply("clamp_min", norm, min=float(eps)))


def _squeeze(tracer: Tracer, x, dim=None):
    """Drops size-1 feature dims (all of them, or those named), never a graph axis: the
    row count is the graph's, and a one-edge graph must not lose its edge axis. The one
    exception is axis 1 of an [N, 1, D, ...] pairwise view (``m.unsqueeze(1)``, or a
    keepdim reduction over a pair term's axis 1): size 1 for every vertex, so torch's
    ``squeeze()`` / ``squeeze(1)`` always drops it, giving the [N, D, ...] mailbox value
    (kept, the view's later reductions went over the wrong axes)."""
    x = tracer.lift(x)
    if x.prefix == 3 and x.value.residency is not Residency.PAIR:
        rank, named = x.dim(), None if dim is None else [dim] if isinstance(dim, int) else list(dim)
        if named is None or any(isinstance(d, int) and -rank <= d < rank and d % rank == 1 for d in named):
            x = SymTensor(tracer, x.value, 2)
            if named is not None:
                dim = [d % rank - (d % rank > 1) for d in named if d % rank != 1]
                if not dim:
                    return x
    shape = x.value.shape
    if dim is None:
        drop = {d for d, n in enumerate(shape) if n == 1}
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        mapped = [x.feature_dim(d) for d in dims]
        if any(m is None for m in mapped):
            raise tracer.error(f"squeeze({dim}) names a graph axis, which cannot be dropped")
        drop = {m % len(shape) for m in mapped if shape[m] == 1}
    if not drop:
        return x
    return tracer.apply("reshape", x, shape=tuple(n for d, n in enumerate(shape) if d not in drop))


def _bmm(tracer: Tracer, a, b):
    """``torch.bmm``: in message code the batch dim is the edge (or node) axis, so
    ``bmm(edges.src['h'].unsqueeze(1), W_e)`` multiplies each row by its own matrix."""
    a, b = tracer.lift(a), tracer.lift(b)
    if a.dim() != 3 or b.dim() != 3:
        raise tracer.error(f"torch.bmm takes two 3-D tensors, got {list(a.shape)} and {list(b.shape)}")
    prefix = max(a.prefix, b.prefix)
    if prefix > 1:
        raise tracer.error("torch.bmm over a mailbox would contract the neighbour axis, which cannot be "
                           "compiled; reduce the mailbox with sum/mean/max/min over dim=1")
    if prefix == 1 and Residency.SHARED in (a.value.residency, b.value.residency):
        raise tracer.error("torch.bmm here batches over the graph axis, and a captured tensor has no rows "
                           "of that axis; index it per row (W[edges.data['type']]) or pass it as edge data")
    return _matmul(tracer, a, b)


def _index_table(tracer: Tracer, table, index):
    """``table[idx]`` with ``table`` a captured tensor and ``idx`` integer graph data:
    a per-row lookup (R-GCN's ``weight[edges.data['rel_type']]``, ``embed[index]``).
    ``table[idx, ...rest]`` is the lookup, then ``rest`` on the table's remaining dims."""
    table = tracer.lift(table)
    if table.value.residency is not Residency.SHARED:
        raise tracer.error("indexing a graph value with another graph value cannot be compiled; only a "
                           "captured table (a parameter) can be indexed per row")
    idx, rest = (index[0], index[1:]) if isinstance(index, tuple) and index else (index, ())
    if not isinstance(idx, SymTensor) or any(isinstance(i, (SymTensor, torch.Tensor, list)) for i in rest):
        raise tracer.error("a captured tensor can be indexed by one integer graph value in its first dim "
                           "(table[idx] or table[idx, <slices>]), not by several tensors")
    if idx.value.dtype.is_floating_point or idx.value.dtype == torch.bool:
        raise tracer.error(f"a table is indexed by integer data, got a {idx.value.dtype} graph value")
    rows = tracer.apply("index_rows", table, idx)
    if not rest:
        return rows
    return _getitem(tracer, rows, (slice(None),) * (rows.dim() - len(table.value.shape) + 1) + tuple(rest))


def _embedding(tracer: Tracer, input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
               scale_grad_by_freq=False, sparse=False):
    """``F.embedding`` / ``nn.Embedding`` on integer graph data: ``weight[input]``. The
    options that change the gradient or renormalize the weight in place are refused."""
    if padding_idx is not None or max_norm is not None or scale_grad_by_freq or sparse:
        raise tracer.error("embedding with padding_idx, max_norm, scale_grad_by_freq or sparse cannot be "
                           "compiled; index the weight directly (weight[idx])")
    return _index_table(tracer, weight, input)


def _getitem(tracer: Tracer, x, index):
    """``x[...]``: slices and integer indices on feature dims become one `slice_features`
    (then a reshape for dropped or added dims); a graph axis may only be taken whole."""
    lookup = index[0] if isinstance(index, tuple) and index else index
    if isinstance(lookup, SymTensor) or not isinstance(x, SymTensor):
        return _index_table(tracer, x, index)
    x = tracer.lift(x)
    items = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(i, (SymTensor, torch.Tensor, list, bool)) for i in items):
        raise tracer.error("indexing a graph value with a tensor, list or bool cannot be compiled; use "
                           "slices and integers on feature dims")
    shape = x.shape
    if items.count(Ellipsis) > 1:
        raise tracer.error("an index can have only one ellipsis (...)")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        fill = len(shape) - sum(1 for i in items if i is not None and i is not Ellipsis)
        items[at:at + 1] = [slice(None)] * fill
    if sum(1 for i in items if i is not None) > len(shape):
        raise tracer.error(f"too many indices for a value of shape {list(shape)}")
    if x.prefix == 2 and len(items) > 1 and items[0] == slice(None) and not isinstance(items[1], slice) \
            and items[1] is not None:
        return _mailbox_position(tracer, x, items)
    window, out_shape, d = [], [], 0
    for item in items:
        if item is None:
            if d < x.prefix:
                raise tracer.error("adding a dim (None) before a graph axis cannot be compiled")
            out_shape.append(1)
            continue
        if d < x.prefix:
            if item != slice(None) and item != slice(None, None, 1) and x.prefix == 2 and d == 1:
                raise tracer.error("slicing dim 1 of a mailbox value, the neighbour axis, cannot be compiled "
                                   "(vertices have different numbers of messages); take one message by a "
                                   "constant position (m[:, 0], m[:, -1]) or reduce over dim=1")
            if item != slice(None) and item != slice(None, None, 1):
                raise tracer.error(f"indexing dim {d}, a graph axis (one row per edge, vertex or mailbox "
                                   "entry), cannot be compiled; take it whole (:) and index feature dims")
        else:
            n = shape[d]
            if isinstance(item, slice):
                picked = range(n)[item]
                if picked.step < 1:
                    raise tracer.error("a slice step must be positive, as in torch")
                window.append((picked.start if len(picked) else 0, picked.step, len(picked)))
                out_shape.append(len(picked))
            else:
                try:
                    i = operator.index(item)
                except TypeError:
                    raise tracer.error(f"cannot index a graph value with {item!r}") from None
                if not -n <= i < n:
                    raise tracer.error(f"index {i} is out of range for dim {d} of size {n}")
                window.append((i % n, 1, 1))
        d += 1
    # the dims no item named: feature dims only (``m[:]`` or ``x[()]`` leaves graph axes
    # unnamed, whose symbolic sizes were compared as feature sizes: a CompileError about
    # "comparing graph values" or ``x.shape[0]``, neither of which the line wrote)
    rest = shape[max(d, x.prefix):]
    window += [(0, 1, n) for n in rest]
    out_shape += list(rest)
    value = x
    if any(w != (0, 1, n) for w, n in zip(window, x.value.shape)):
        value = tracer.apply("slice_features", x, window=tuple(window))
    if tuple(out_shape) != value.value.shape:
        value = tracer.apply("reshape", value, shape=tuple(out_shape))
    return value


def _mailbox_position(tracer: Tracer, x: SymTensor, items: list) -> SymTensor:
    """``nodes.mailbox[k][:, i, ...]``: each vertex's ``i``-th message (ir/ops/positional.py),
    then the remaining indices on its feature dims."""
    try:
        position = operator.index(items[1])
    except TypeError:
        raise tracer.error(f"cannot index a mailbox's neighbour axis with {items[1]!r}; use a constant "
                           "integer position (m[:, 0]) or reduce over dim=1") from None
    if not hasattr(tracer, "pick"):
        raise tracer.error("a message by its position (m[:, i]) exists only on nodes.mailbox in reduce_fn")
    picked = tracer.pick(x, position)
    return _getitem(tracer, picked, (slice(None), *items[2:])) if items[2:] else picked


def _index_select(tracer: Tracer, table, dim, index):
    """``weight.index_select(0, edges.data['type'])``: the same per-row lookup as table[idx]."""
    if dim != 0 or isinstance(table, SymTensor):
        raise tracer.error("index_select can only read rows (dim=0) of a captured table with an integer "
                           "graph value")
    return _index_table(tracer, table, index)


def _cast(tracer: Tracer, x, dtype: torch.dtype) -> SymTensor:
    """``x`` in ``dtype``: ``x`` itself where it already has it, as torch returns ``self``
    (an in-place op then writes both names), else a cast, whose gradient comes back in
    ``x``'s dtype (none to or from integers: `_cast_derivative`)."""
    x = tracer.lift(x)
    return x if x.dtype == dtype else tracer.apply("cast", x, dtype=dtype)


def _conversion(dtype: torch.dtype):
    """``idx.long()`` / ``.int()`` (integer data feeding a table lookup; no gradient
    flows), ``mask.float()``, ``x.double()``, ``.half()``, ``.bfloat16()``."""
    def handler(tracer: Tracer, x, memory_format=None):
        return _cast(tracer, x, dtype)
    return handler


def _to(tracer: Tracer, x, *args, dtype=None, non_blocking=False, copy=False, memory_format=None, device=None):
    """``x.to(dtype)`` (also ``x.to(dtype=...)``, ``x.to(y)`` with ``y`` a graph value);
    ``copy=True`` gives a value of its own. A device, or a captured tensor's, is refused:
    the trace runs on stand-ins whose device it cannot compare with the one asked for."""
    for arg in args:
        if isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, SymTensor):    # another graph value: on the graph's device too
            dtype = arg.dtype
        else:
            device = arg
    if device is not None:
        raise tracer.error(f"x.to({device!r}) names a device (or a tensor on one), which a compiled function "
                           "cannot move graph values to; pass the data in on the graph's device and give .to() "
                           "a dtype only")
    if dtype is None:
        raise tracer.error("x.to() without a dtype has no gnnfuse op; give it one (x.to(torch.float32))")
    x = tracer.lift(x)
    return _clone(tracer, x) if copy and x.dtype == dtype else _cast(tracer, x, dtype)


def _type(tracer: Tracer, x, dtype=None, non_blocking=False):
    """``x.type(torch.float64)``; ``x.type()`` (a type's name) and type strings are refused."""
    if not isinstance(dtype, torch.dtype):
        raise tracer.error("x.type() of a graph value takes a torch.dtype (x.type(torch.float64)); its type "
                           "name, or a type given by name, has no gnnfuse op")
    return _cast(tracer, x, dtype)


def _type_as(tracer: Tracer, x, other):
    """``x.type_as(y)``: ``x`` in ``y``'s dtype (a graph value's or a captured tensor's)."""
    return _cast(tracer, x, other.dtype)


def _scalar_conversion(self: SymTensor, *args):
    raise self.tracer.error("a graph value cannot become a Python number (math.exp, float(), int(), ...); "
                            "use the torch function (torch.exp, ...) on it instead")


def _refused_operator(symbol: str) -> Callable:
    def refuse(self: SymTensor, *other: Any) -> None:
        raise self.tracer.error(f"the operator {symbol} on a graph value has no gnnfuse op")
    return refuse


def _viewing(handler: Callable) -> Callable:
    """A handler of an op whose torch result is a view of its input: both are marked,
    so an in-place write to either is refused (`_in_place`), as it would write both. Only
    a graph value's view is one: ``W[e.data["type"]]`` of a captured ``W`` is a row lookup,
    a copy in torch too, and ``w = W[idx]; w *= 2`` was refused as a write to a view."""
    def handle(tracer: Tracer, x, *args, **kwargs):
        result = handler(tracer, x, *args, **kwargs)
        if isinstance(x, SymTensor):
            x._viewed = True
            if isinstance(result, SymTensor) and result is not x:
                result._view = True
        return result
    return handle


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
    ((F.softplus,), _unary("softplus", beta=1.0, threshold=20.0)),
    ((F.silu,), _unary("silu")),
    ((torch.mm, torch.matmul, T.mm, T.matmul, T.__matmul__), _matmul),
    ((F.linear,), _linear),
    ((torch.sum, T.sum), _reduction("sum_dim", "sum")),
    ((torch.mean, T.mean), _reduction("mean_dim", "mean")),
    ((torch.max, T.max), _reduction(None, "max", pair=True)),
    ((torch.min, T.min), _reduction(None, "min", pair=True)),
    ((torch.amax, T.amax), _reduction(None, "max", "amax")), ((torch.amin, T.amin), _reduction(None, "min", "amin")),
    ((torch.cat, torch.concat), _cat),
    ((torch.reshape, T.reshape, T.view), _viewing(_reshape)),
    ((torch.unsqueeze, T.unsqueeze), _viewing(_unsqueeze)),
    ((F.dropout,), _dropout),
    ((torch.softmax, F.softmax, T.softmax), _softmax),
    ((torch.pow, T.pow, T.__pow__), _pow),
    ((torch.clamp, torch.clip, T.clamp, T.clip), _clamp),
    ((torch.abs, T.abs, T.__abs__), _unary("abs")),
    ((torch.maximum, T.maximum), _binary("maximum")), ((torch.minimum, T.minimum), _binary("minimum")),
    ((torch.softmax, F.softmax, T.softmax), _softmax_or_feature),   # feature dims, else _softmax above
    ((torch.log_softmax, F.log_softmax, T.log_softmax), _log_softmax),
    ((F.normalize,), _normalize),
    ((torch.norm, T.norm), _norm), ((torch.linalg.vector_norm,), _linalg_vector_norm),
    ((torch.squeeze, T.squeeze), _viewing(_squeeze)),
    ((torch.bmm, T.bmm), _bmm),
    ((T.__getitem__,), _viewing(_getitem)), ((torch.index_select, T.index_select), _index_select),
    ((F.embedding,), _embedding),
    ((T.long,), _conversion(torch.int64)), ((T.int,), _conversion(torch.int32)),
    ((T.float,), _conversion(torch.float32)), ((T.double,), _conversion(torch.float64)),
    ((T.half,), _conversion(torch.float16)), ((T.bfloat16,), _conversion(torch.bfloat16)),
    ((T.to,), _to), ((T.type,), _type), ((T.type_as,), _type_as),
]:
    for _f in _fns:
        TORCH_HANDLERS[_f] = _h

TORCH_HANDLERS[T.__rmatmul__] = lambda tracer, x, other: _matmul(tracer, other, x)
TORCH_HANDLERS[torch.clone] = TORCH_HANDLERS[T.clone] = _clone
TORCH_HANDLERS[torch.detach] = TORCH_HANDLERS[T.detach] = _viewing(_detach)
# in-place variants of elementwise handlers, as methods (x.mul_(2)) and torch functions (torch.relu_)
for _name in ("add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "relu", "sigmoid", "tanh", "clamp", "clip",
              "abs", "pow"):
    for _owner in (T, torch):
        if hasattr(_owner, _name + "_"):
            TORCH_HANDLERS[getattr(_owner, _name + "_")] = _in_place_variant(TORCH_HANDLERS[getattr(_owner, _name)])
TORCH_HANDLERS[F.leaky_relu_] = _in_place_variant(TORCH_HANDLERS[F.leaky_relu])
TORCH_HANDLERS[F.elu_] = _in_place_variant(TORCH_HANDLERS[F.elu])

# torch.max / torch.min with a tensor as second operand are elementwise (see _binary_or).
for _fns, _op in (((torch.max, T.max), "maximum"), ((torch.min, T.min), "minimum")):
    for _f in _fns:
        TORCH_HANDLERS[_f] = _binary_or(TORCH_HANDLERS[_f], _op)
# the casts torch.autocast makes before these ops (frontend/autocast.py); in-place ops,
# which autocast leaves alone (the variants made above, ``a **= b``), keep the plain handlers
_PLAIN_HANDLERS = dict(TORCH_HANDLERS)
for _f in [f for f in TORCH_HANDLERS if applies(f)]:
    TORCH_HANDLERS[_f] = autocast_handler(_f, TORCH_HANDLERS[_f])
SymTensor.__abs__ = lambda self: TORCH_HANDLERS[T.__abs__](self.tracer, self)
SymTensor.__getitem__ = lambda self, index: TORCH_HANDLERS[T.__getitem__](self.tracer, self, index)
SymTensor.__float__ = SymTensor.__int__ = SymTensor.__complex__ = _scalar_conversion
# round() and math.trunc() have no __float__ fallback: without these they raised a bare TypeError
SymTensor.__round__ = SymTensor.__trunc__ = _scalar_conversion


class _NotAnInt(CompileError, TypeError):
    """A graph value asked for as a Python int: a `CompileError` at the user's line, and a
    TypeError for the callers that try ``operator.index`` to tell ints from other values."""


def _as_an_int(self: SymTensor) -> int:
    """``range(len(v.innbs) - 1)``, ``[0] * n``, ``x[:n]`` with ``n`` a graph value:
    eager code has a Python int per vertex; Python raised a bare TypeError ("'SymTensor'
    object cannot be interpreted as an integer") naming neither the construct nor the line."""
    error = self.tracer.error("a graph value (the in-degree in arithmetic, len(v.innbs) - 1, ...) cannot be "
                              "taken as a Python int (range(), a repeat count, an index or size): it differs "
                              "per vertex; use it in tensor arithmetic")
    raise _NotAnInt(error.message, error.source)


SymTensor.__index__ = _as_an_int


def _item_assignment(self: SymTensor, index: Any, value: Any) -> None:
    raise self.tracer.error("x[...] = value writes part of a graph value in place, which cannot be compiled; "
                            "build the value out of place (torch.cat of its pieces, or arithmetic)")


SymTensor.__setitem__ = _item_assignment

# Python operators on SymTensor route through the same handlers.
for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "matmul", "neg", "pow"):
    _method = getattr(T, f"__{_name}__")
    setattr(SymTensor, f"__{_name}__",
            (lambda m: lambda self, *a: TORCH_HANDLERS[m](self.tracer, self, *a))(_method))
SymTensor.__rmatmul__ = lambda self, other: TORCH_HANDLERS[T.__rmatmul__](self.tracer, self, other)


def _positive(self: SymTensor) -> SymTensor:
    """``+x``: torch's ``positive``, the tensor itself (it raises on bool tensors). Without
    it Python raised a bare TypeError naming neither the construct nor the line."""
    if self.value.dtype == torch.bool:
        raise self.tracer.error("unary + of a bool graph value is an error in torch (torch.positive)")
    return self


SymTensor.__pos__ = _positive
# Python operators with no gnnfuse op: refused by name at their line (Python raised a bare TypeError)
for _name, _symbol in (("mod", "%"), ("rmod", "%"), ("floordiv", "//"), ("rfloordiv", "//"), ("rpow", "**"),
                       ("and", "&"), ("rand", "&"), ("or", "|"), ("ror", "|"), ("xor", "^"), ("rxor", "^"),
                       ("invert", "~"), ("lshift", "<<"), ("rlshift", "<<"), ("rshift", ">>"), ("rrshift", ">>")):
    setattr(SymTensor, f"__{_name}__", _refused_operator(_symbol))
# ``a += b`` writes ``a`` as torch does, so a second name bound to it sees the sum (`_in_place`)
for _name in ("add", "sub", "mul", "truediv", "pow"):
    _method = getattr(T, f"__{_name}__")
    setattr(SymTensor, f"__i{_name}__",
            (lambda m: lambda self, other: _in_place(self, _PLAIN_HANDLERS[m](self.tracer, self, other)))(_method))


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

    def __repr__(self) -> str:
        return "D"      # as errors show a mailbox's shape: [N, D, ...]


class RowCount:
    """``x.shape[0]`` / ``x.size(0)`` of edge, node or mailbox data: the number of edges
    or vertices. The trace sees one row, so as a number it would be 1; a reshape takes
    it back as the row axis (``x.view(x.shape[0], -1)``), and any other use (arithmetic,
    ``int()``, ``range``, a comparison) is an error at the user's line."""

    def __init__(self, tracer: Tracer, rows: str):
        self.tracer, self.rows = tracer, rows

    def error(self, *args) -> CompileError:
        plural = "vertices" if self.rows == "vertex" else f"{self.rows}s"
        return self.tracer.error(f"x.shape[0] / x.size(0), the number of {plural}, is not known when the "
                                 "function is traced; it can only be the first size of a reshape or view "
                                 "(x.view(x.shape[0], -1)); use -1 there, or per-row arithmetic")

    def _reject(self, *args):
        raise self.error()

    def __repr__(self) -> str:
        return "E" if self.rows == "edge" else "N"

    __hash__ = object.__hash__


for _name in ("index", "int", "float", "bool", "eq", "ne", "lt", "le", "gt", "ge", "neg", "pos", "abs",
              *(f"{r}{op}" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow") for r in ("", "r"))):
    setattr(RowCount, f"__{_name}__", RowCount._reject)
