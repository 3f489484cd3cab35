"""FeatGraph's generalized SpMM and SDDMM templates (FeatGraph §III) as a kernel-level API.

    gsddmm(g, lambda xs, xd: (xs * xd).sum(-1, keepdim=True), src=x, dst=x)   # [E, 1]
    gspmm(g, lambda xs, w: w * xs, "sum", src=x, edge=w)                       # [N, F]

The user function (FeatGraph's UDF) receives the rows of the tensors passed, gathered
onto the edges, positionally in the order src, dst, edge (only those given); it is
traced into the same IR as the other front ends, so the gather, the UDF and the
aggregation compile into one fused kernel, differentiable in every operand and in any
tensor the UDF captures. The function sees each operand as DGL's ``edges.src[k]`` does,
a batch of rows ``[E, ...]``: dim 0 is the edge axis (reducing over it is a CompileError
at the line; that is the template's job), the other dims are features. `gspmm`
aggregates the per-edge result over each destination's in-edges (``reduce``: sum, mean,
max or min; a vertex without in-edges gets 0); `gsddmm` returns it per edge, in edge-id
order. ``message=None`` copies the single
operand given (plain SpMM / gather).

``schedule=`` is FeatGraph's feature-dimension schedule for one call: ``"csr"``
(vertex-parallel, each destination's in-edges in sequence), ``"coo"`` (edge-parallel
with atomic adds; sum and mean only), ``"rows"`` (many destinations side by side per
program, each step a tile of their edges x features; sum and mean only) or ``"auto"``
(the cost rule), or a `Schedule` that
also fixes the feature tile. It overrides ``GNNFUSE_SCHEDULE`` and the cost rule for that
call's forward and backward kernels on the Triton backend. The CPU backend reads a
`Schedule`'s ``feature_tile``, ``partition_bytes`` and ``chunk`` (FeatGraph's CPU schedule,
over its tuned choice and cost rule) and walks every kind as CSR; the torch reference
backend has a single schedule and ignores it.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from ..backend.forced_schedule import MAX_FEATURE_TILE, SCHEDULES, ForcedSchedule, forcing, valid_feature_tile
from ..graph import Graph
from ..ir import Residency
from ..ir.ops.movement import REDUCERS
from ..runtime.compile_op import run_eagerly
from .graph_input import call_graph
from .message import _callers, _gather
from .trace_cache import TraceCache, program_feeds
from .tracer import EDGE_ROWED, SymTensor, Tracer

Schedule = ForcedSchedule
OPERANDS = ("src", "dst", "edge")   # the order the user function receives them in


def _copy(operand):
    """``message=None``: the single operand's row, unchanged."""
    return operand


def operand_graph(graph: Graph | object, src, dst) -> Graph:
    """The graph as a `Graph`; an edge_index gets its node count from the vertex operands,
    so trailing vertices without edges are not lost (`graph_input.call_graph`). Source and
    destination tables of different row counts make it bipartite (PyG's ``size=(num_src,
    num_dst)``), where the first table's rows were taken for every vertex and the other
    table was refused, or a rectangular adj_t asked for a ``num_src_nodes`` no template takes."""
    sized = [t for t in (src, dst) if isinstance(t, torch.Tensor) and t.dim()]
    if not isinstance(graph, Graph) and len(sized) == 2 and src.shape[0] != dst.shape[0]:
        return Graph.coerce(graph, dst.shape[0], src.shape[0])
    return call_graph(graph, (src, dst))


def _operands(template: str, graph: Graph, given: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """The operands passed, in the UDF's order, each checked against the graph's sizes."""
    rows = {"src": graph.num_src_nodes, "dst": graph.num_nodes, "edge": graph.num_edges}
    operands = {}
    for name in OPERANDS:
        tensor = given[name]
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{template}: {name}= must be a tensor, got {type(tensor).__name__}")
        what = ("edges" if name == "edge" else "nodes" if graph.num_src_nodes == graph.num_nodes
                else "source nodes" if name == "src" else "destination nodes")
        if tensor.dim() == 0 or tensor.shape[0] != rows[name]:
            raise ValueError(f"{template}: {name}= must have one row per graph {what[:-1]} "
                             f"({rows[name]} {what}), got shape {list(tensor.shape)}")
        operands[name] = tensor
    if not operands:
        raise ValueError(f"{template}: give at least one operand (src=, dst= or edge=)")
    return operands


def _user_function(template: str, fn: Callable | None, operands: dict[str, torch.Tensor], arg: str) -> Callable:
    if fn is None:
        if len(operands) != 1:
            raise ValueError(f"{template}: {arg}=None copies a single operand, but {', '.join(operands)} were "
                             f"given; pass a function of ({', '.join(operands)})")
        return _copy
    if not callable(fn):
        raise TypeError(f"{template}: {arg} must be a function of ({', '.join(operands)}) or None, "
                        f"got {type(fn).__name__}")
    try:
        inspect.signature(fn).bind(*operands)
    except TypeError as exc:
        raise TypeError(f"{template}: {arg} is called with the {len(operands)} operand(s) given, "
                        f"({', '.join(operands)}), in that order: {exc}") from None
    except ValueError:   # no signature to inspect (some builtins): let the call decide
        pass
    return fn


def trace_template(fn: Callable, operands: dict[str, torch.Tensor], reduce: str | None) -> Tracer:
    """Capture ``fn`` over the gathered operand rows into a program with one output,
    ``out``: the per-edge value, or its ``reduce`` over each destination's in-edges."""
    tracer = Tracer(fn, "message")
    # the edge operand is handed over whole, the caller's tensor in eager code, which an
    # in-place op would write (``e *= 2`` doubled it there, and left it as it was here)
    rows = [_callers(tracer.input("e.edge", Residency.EDGE, tensor, 1), "the edge operand") if name == "edge"
            else _gather(tracer, name, Residency.NODE, tensor, name) for name, tensor in operands.items()]
    result = tracer.call(fn, *rows)
    if not isinstance(result, SymTensor) or result.value.residency not in EDGE_ROWED:
        what = (f"{result.value.residency.name} data" if isinstance(result, SymTensor)
                else f"a {type(result).__name__}")
        raise tracer.error(f"the template function must return one per-edge tensor computed from its "
                           f"operands, got {what}")
    value = result.value
    if reduce is not None:
        value = tracer.program.add("reduce", value, op=reduce, by="dst")
    tracer.program.output("out", value)
    return tracer


def _schedule(schedule: str | ForcedSchedule | None, reduce: str) -> ForcedSchedule | None:
    if schedule is None:
        return None
    if isinstance(schedule, str):
        schedule = ForcedSchedule(schedule)
    if not isinstance(schedule, ForcedSchedule):
        raise TypeError(f"gspmm: schedule= must be one of {SCHEDULES} or a gnnfuse.ops.Schedule, "
                        f"got {type(schedule).__name__}")
    if schedule.kind not in SCHEDULES:
        raise ValueError(f"gspmm: schedule= must be one of {SCHEDULES}, got {schedule.kind!r}")
    if schedule.kind in ("coo", "rows") and reduce not in ("sum", "mean"):
        what = "edge-parallel, atomic adds" if schedule.kind == "coo" else "rows side by side"
        raise ValueError(f"gspmm: schedule={schedule.kind!r} ({what}) supports reduce 'sum' and "
                         f"'mean' only, got reduce={reduce!r}; use 'csr'")
    tile = schedule.feature_tile
    if not valid_feature_tile(tile):
        raise ValueError(f"gspmm: schedule feature_tile must be a power of two from 1 to {MAX_FEATURE_TILE}, "
                         f"got {tile!r}")
    return schedule


def _run(cache: TraceCache, graph, fn, operands, reduce, schedule) -> torch.Tensor:
    tables = ({k: t for k, t in operands.items() if k != "edge"},
              {"edge": operands["edge"]} if "edge" in operands else {})
    compiled, captured = cache.compiled((fn,), tables, lambda: trace_template(fn, operands, reduce))
    with forcing(schedule):
        return compiled(graph, program_feeds(tables, captured))["out"]


def _eagerly(name: str, template: Callable, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``template(*args, **kwargs)`` eagerly behind a graph break, with a warning: a
    template's user function is traced per call, and under ``torch.compile`` dynamo traced
    gnnfuse's tracer itself, which failed on dynamo's symbolic values ('torch.Size' object
    has no attribute 'is_floating_point', or a refusal naming torch.func) and left later
    eager calls failing too. NAPA's primitives (`gnnfuse.napa`) come here through them."""
    return run_eagerly(f"{name} (its user function is traced per call; NAPA's primitives call it)", template,
                       *args, **kwargs)


def gspmm(graph: Graph | object, message: Callable | None, reduce: str, *, src: torch.Tensor | None = None,
          dst: torch.Tensor | None = None, edge: torch.Tensor | None = None,
          schedule: str | ForcedSchedule | None = None) -> torch.Tensor:
    """Generalized SpMM: ``out[v] = reduce over edges (u, v) of message(src[u], dst[v], edge[e])``
    (only the operands given are passed); [num_nodes, ...], differentiable. See the module doc.
    Under ``torch.compile`` it runs eagerly behind a graph break, with a warning (`_eagerly`)."""
    if torch.compiler.is_compiling():
        return _eagerly("gnnfuse.ops.gspmm", gspmm, graph, message, reduce, src=src, dst=dst, edge=edge,
                        schedule=schedule)
    graph = operand_graph(graph, src, dst)
    if not isinstance(reduce, str):
        raise TypeError(f"gspmm: reduce must be one of {REDUCERS} (a string), got {type(reduce).__name__}")
    if reduce not in REDUCERS:
        raise ValueError(f"gspmm: reduce must be one of {REDUCERS}, got {reduce!r}")
    forced = _schedule(schedule, reduce)
    operands = _operands("gspmm", graph, {"src": src, "dst": dst, "edge": edge})
    fn = _user_function("gspmm", message, operands, "message")
    return _run(_SPMM_TRACES[reduce], graph, fn, operands, reduce, forced)


def gsddmm(graph: Graph | object, edge_fn: Callable | None, *, src: torch.Tensor | None = None,
           dst: torch.Tensor | None = None, edge: torch.Tensor | None = None) -> torch.Tensor:
    """Generalized SDDMM: ``out[e] = edge_fn(src[u], dst[v], edge[e])`` for every edge
    e = (u, v) (only the operands given are passed); [num_edges, ...] in edge-id order,
    differentiable. It runs as one edge-parallel kernel, so it takes no ``schedule``.
    Under ``torch.compile`` it runs eagerly behind a graph break, with a warning (`_eagerly`)."""
    if torch.compiler.is_compiling():
        return _eagerly("gnnfuse.ops.gsddmm", gsddmm, graph, edge_fn, src=src, dst=dst, edge=edge)
    graph = operand_graph(graph, src, dst)
    operands = _operands("gsddmm", graph, {"src": src, "dst": dst, "edge": edge})
    fn = _user_function("gsddmm", edge_fn, operands, "edge_fn")
    return _run(_SDDMM_TRACES, graph, fn, operands, None, None)


# One cache per reduction (the reduce name is not part of a trace cache key); the user
# function's code, guarded state and the operands' shapes are.
_SPMM_TRACES = {op: TraceCache() for op in REDUCERS}
_SDDMM_TRACES = TraceCache()
