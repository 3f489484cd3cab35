"""The dataflow program: a DAG of `Value`s, each produced by one registered op.

Laid out like torch.fx's Graph/Node: a `Program` owns an ordered list of values
(always topologically sorted), named inputs and named outputs. Every value carries its
residency, per-element shape (the row dimension stripped) and dtype, inferred when the
value is created from its op's registry entry, so a malformed program fails where it is
built rather than when it runs.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from .errors import CompileError
from .registry import get_op
from .residency import Residency, ResidencyError


@dataclass(eq=False)
class Value:
    """One op application; identity-compared so equal-looking values stay distinct."""

    op: str
    inputs: tuple["Value", ...]
    attrs: dict[str, Any]
    residency: Residency
    shape: tuple[int, ...]
    dtype: torch.dtype
    source: str | None = None
    id: int = field(default_factory=itertools.count().__next__)

    @property
    def name(self) -> str:
        return f"%{self.attrs['key']}" if self.op == "input" else f"%{self.id}"

    @property
    def movement(self):
        return get_op(self.op).movement

    def signature(self) -> tuple:
        """Structural identity used by CSE and by compiled-kernel caches."""
        return (self.op, tuple(i.id for i in self.inputs), _freeze(self.attrs))

    def __repr__(self) -> str:
        return f"Value({self.name} = {self.op}, {self.residency.name}{list(self.shape)})"


def _freeze(obj: Any) -> Any:
    if isinstance(obj, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return tuple(_freeze(v) for v in obj)
    if isinstance(obj, float) and obj == 0.0:     # numpy's float64 too
        # -0.0 == 0.0 and hashes alike, yet x / -0.0 is -inf: one program must not get the other's kernels
        return float, math.copysign(1.0, obj)
    return obj


class Program:
    """A topologically ordered DAG of values with named inputs and outputs."""

    def __init__(self) -> None:
        self.values: list[Value] = []
        self.inputs: dict[str, Value] = {}
        self.outputs: dict[str, Value] = {}

    # -- building -------------------------------------------------------------------
    def input(self, key: str, residency: Residency, shape: Iterable[int], dtype: torch.dtype,
              source: str | None = None) -> Value:
        if key in self.inputs:
            raise CompileError(f"program input {key!r} declared twice", source)
        value = Value("input", (), {"key": key}, residency, tuple(shape), dtype, source)
        self.inputs[key] = value
        self.values.append(value)
        return value

    def add(self, op: str, /, *inputs: Value, source: str | None = None, **attrs: Any) -> Value:
        """Append ``op(*inputs, **attrs)``, inferring residency, shape and dtype."""
        opdef = get_op(op, source)
        try:
            residency = opdef.infer_residency([i.residency for i in inputs], attrs)
            shape, dtype = opdef.infer_shape(inputs, attrs, residency)
        except (ResidencyError, RuntimeError, ValueError, IndexError, TypeError) as exc:
            operands = ", ".join(f"{i.residency.name}{list(i.shape)}:{_dtype_name(i.dtype)}"
                                 for i in inputs)
            raise CompileError(f"op {op!r} cannot take operands ({operands}): {exc}", source) from exc
        value = Value(op, tuple(inputs), dict(attrs), residency, tuple(shape), dtype, source)
        self.values.append(value)
        return value

    def output(self, key: str, value: Value) -> None:
        self.outputs[key] = value

    # -- queries --------------------------------------------------------------------
    def __iter__(self) -> Iterator[Value]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def users(self) -> dict[int, list[Value]]:
        users: dict[int, list[Value]] = {v.id: [] for v in self.values}
        for v in self.values:
            for i in v.inputs:
                users[i.id].append(v)
        return users

    def live_users(self) -> dict[int, list[Value]]:
        """`users` of the values an output depends on, counting only such users: a pass
        that runs before dead-code elimination sees a value whose other uses it already
        rewrote (left dead) as used once."""
        live = {v.id for v in self.outputs.values()}
        for v in reversed(self.values):
            if v.id in live:
                live.update(i.id for i in v.inputs)
        users: dict[int, list[Value]] = {i: [] for i in live}
        for v in self.values:
            if v.id in live:
                for i in v.inputs:
                    users[i.id].append(v)
        return users

    def op_count(self, op: str | None = None) -> int:
        """Number of computing values (inputs excluded), or of one op."""
        return sum(1 for v in self.values if v.op != "input" and (op is None or v.op == op))

    # -- rewriting ------------------------------------------------------------------
    def replace_uses(self, old: Value, new: Value) -> None:
        """Point every use of ``old`` (including outputs) at ``new``, drop ``old`` and
        restore topological order."""
        self.values = [v for v in self.values if v is not old]
        for v in self.values:
            if any(i is old for i in v.inputs):
                v.inputs = tuple(new if i is old else i for i in v.inputs)
        for k, v in self.outputs.items():
            if v is old:
                self.outputs[k] = new
        self.toposort()

    def toposort(self) -> None:
        """Re-establish topological order after a rewrite (stable for untouched values)."""
        position = {v.id: n for n, v in enumerate(self.values)}
        ordered: list[Value] = []
        placed: set[int] = set()

        def place(v: Value) -> None:
            if v.id in placed:
                return
            for i in v.inputs:
                place(i)
            placed.add(v.id)
            ordered.append(v)

        for v in sorted(self.values, key=lambda v: position[v.id]):
            place(v)
        self.values = ordered

    def fingerprint(self) -> tuple:
        """A canonical structural key of the program, independent of value ids; layers
        look their compiled program up by it on every call, so it is built from tuples
        rather than by printing the listing."""
        position = {v.id: n for n, v in enumerate(self.values)}
        values = tuple((v.op, tuple(position[i.id] for i in v.inputs), _freeze(v.attrs), v.residency,
                        v.shape, v.dtype) for v in self.values)
        return values, tuple((k, position[v.id]) for k, v in self.outputs.items())

    # -- printing -------------------------------------------------------------------
    def pretty(self, show_source: bool = True) -> str:
        """A readable listing: one line per value with residency, shape and dtype."""
        names: dict[int, str] = {}
        lines = []
        for n, v in enumerate(self.values):
            names[v.id] = f"%{v.attrs['key']}" if v.op == "input" else f"%{n}"
            args = ", ".join(names[i.id] for i in v.inputs)
            attrs = ", ".join(f"{k}={_fmt(val)}" for k, val in v.attrs.items()
                              if not (v.op == "input" and k == "key"))
            call = v.op if v.op == "input" else f"{v.op}({', '.join(x for x in (args, attrs) if x)})"
            if v.op == "input":
                call = "input"
            kind = f"{v.residency.name}{list(v.shape)} {_dtype_name(v.dtype)}"
            mv = "" if v.op == "input" else f"  [{v.movement.name.lower()}]"
            src = f"  # {v.source}" if show_source and v.source else ""
            lines.append(f"{names[v.id]:>8} : {kind:<28} = {call}{mv}{src}")
        outs = ", ".join(f"{k}={names[v.id]}" for k, v in self.outputs.items())
        lines.append(f"  return {outs}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.pretty()


def _fmt(val: Any) -> str:
    if isinstance(val, float):
        return f"{val:g}"
    if isinstance(val, torch.dtype):
        return _dtype_name(val)
    return repr(val)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
