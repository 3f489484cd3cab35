"""The IO rule: which per-edge tensors a plan materializes, and which of them the rule
budgets.

A compiled layer's memory should grow with |E| x H (one value per edge and head, such as
attention scores), never with |E| x H x D: per-edge work on gathered vertex rows is
evaluated in registers inside fused units (passes.fusion) and recomputed in the backward
(autodiff) instead of being written. `edge_tensors` lists what a plan still writes per
edge, so `gnnfuse.explain` can report it and tests/test_io_rule.py can assert the rule
for every layer.

Exemption, exactly: a per-edge value is exempt when none of the values it is computed
from is a vertex row gathered onto edges (a ``broadcast`` by ``src`` or ``dst``), in the
program itself or, in a backward program, in the forward value a ``saved:`` input holds.
Such a value is a function of the per-edge inputs the user passed (``edge_attr`` of
shape [E, edge_dim]), parameters and constants alone -- GAT's ``lin_edge(edge_attr)``,
an [E, heads * out_channels] matmul of the user's edge features -- so its size follows
from the input the user chose to pass, not from the layer. Likewise the gradient a
backward program returns for a per-edge input of its forward (``grad:<key>``): it has
that input's shape and goes back to torch's autograd, which holds the input's producer
(GATv2's ``lin_edge``). Everything else per edge is budgeted: at most H elements per edge
(H = heads for attention layers, 1 otherwise).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from ..ir import Program, Value

GATHERS = ("src", "dst")   # broadcasts that read vertex rows onto edges


@dataclass(frozen=True)
class EdgeTensor:
    """One per-edge value a plan writes to memory."""
    value: Value
    saved: bool      # kept from the forward for the backward program
    exempt: bool     # not a function of gathered vertex rows (see the module docstring)

    @property
    def width(self) -> int:
        """Elements per edge (the tensor's columns once flattened)."""
        return math.prod(self.value.shape)


def reads_gathered_rows(program: Program, tainted_inputs: Iterable[int] = ()) -> set[int]:
    """Ids of the values of ``program`` computed, directly or not, from a vertex row
    gathered onto edges; ``tainted_inputs`` are input ids that count as such (a backward
    program's ``saved:`` inputs whose forward value was)."""
    tainted = set(tainted_inputs)
    for v in program.values:
        if (v.op == "broadcast" and v.attrs["by"] in GATHERS) or any(i.id in tainted for i in v.inputs):
            tainted.add(v.id)
    return tainted


def backward_reads_gathered_rows(backward: Program, forward: Program, forward_tainted: set[int]) -> set[int]:
    """`reads_gathered_rows` for the backward program of ``forward``: a ``saved:<id>``
    input counts as forward value ``id`` does (``forward_tainted``), and the gradients it
    returns for per-edge forward inputs are exempt (see the module docstring)."""
    saved = [v.id for key, v in backward.inputs.items()
             if key.startswith("saved:") and int(key.removeprefix("saved:")) in forward_tainted]
    tainted = reads_gathered_rows(backward, saved)
    for key, out in backward.outputs.items():
        given = forward.inputs.get(key.removeprefix("grad:"))
        if given is not None and given.residency.is_edge_rowed:
            tainted.discard(out.id)
    return tainted


def edge_tensors(written: Iterable[Value], saved: Iterable[int], tainted: set[int]) -> list[EdgeTensor]:
    """The edge-rowed values among ``written`` (what a plan's steps write), each marked
    saved (its id in ``saved``) and exempt (not in ``tainted``, see
    `reads_gathered_rows`)."""
    saved = set(saved)
    return [EdgeTensor(v, v.id in saved, v.id not in tainted) for v in written if v.residency.is_edge_rowed]
