"""Graphiler's message/reduce front end, in DGL's UDF style (Graphiler §4.1-4.2).

    def message(edges):  return {"m": edges.src["h"] * edges.data["w"]}
    def reduce(nodes):   return {"h": torch.sum(nodes.mailbox["m"], dim=1)}
    out = gnnfuse.message_passing(graph, message, reduce, ndata={"h": h}, edata={"w": w})

The UDFs are traced once per call into the same IR as vertex-centric code; a reduction or
softmax over ``dim=1`` of the mailbox becomes a Reduce or Norm op, so no per-degree
bucketing ever runs (Graphiler §3.2's problem).

Vertices without in-edges follow DGL's ``update_all``: reduce_fn does not apply to them,
so every reduce_fn output is 0 there (also a reduce_fn that adds node data or a constant,
as GatedGCN's ``h + sum(...) / (sum(...) + eps)`` does), and update_fn runs on all
vertices, seeing those zeros. ``nodes.mailbox['m'].shape[1]`` is each vertex's in-degree.

A UDF may be a function, a bound method, a ``functools.partial``, an ``nn.Module`` (its
``forward`` is traced; hooks do not run) or an object with a ``__call__`` method.

On a typed graph, per-type data is passed as ``etype_data={key: [num_edge_types, ...]}``
and ``ntype_data={key: [num_node_types, ...]}``. In ``message_fn``, ``edges.type[key]``
is each edge's relation's row, ``edges.srctype[key]`` / ``edges.dsttype[key]`` its
source's / destination's node type's row; in ``reduce_fn``/``update_fn``,
``nodes.type[key]`` is each vertex's node type's row. ``x @ edges.type["W"]`` with W of
shape [R, in, out] multiplies every edge by its own relation's matrix (R-GCN, HGT):

    def message(edges):
        return {"m": (edges.src["h"] @ edges.type["W"]) * edges.data["norm"]}
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..graph import Graph
from ..ir import Residency
from .trace_cache import TraceCache, check_tables, program_feeds
from .tracer import EDGE_ROWED, SymTensor, Tracer



class _MessageTracer(Tracer):
    """A tracer whose mailbox reductions turn into graph Reduce/Norm ops."""

    def reduce(self, x: SymTensor, op: str) -> SymTensor:
        self._check_mailbox(x)
        value = self.program.add("reduce", x.value, op=op, by="dst", source=self.source())
        return SymTensor(self, value, 1)

    def softmax(self, x: SymTensor) -> SymTensor:
        self._check_mailbox(x)
        return SymTensor(self, self.program.add("edge_softmax", x.value, by="dst", source=self.source()), 2)

    def _check_mailbox(self, x: SymTensor) -> None:
        if self.mode != "reduce" or x.value.residency not in EDGE_ROWED:
            raise self.error("reductions over dim=1 apply to nodes.mailbox inside reduce_fn")


class _Lookup:
    def __init__(self, tracer: Tracer, what: str, get: Callable[[str], SymTensor], keys):
        self._tracer, self._what, self._get, self._keys = tracer, what, get, keys

    def __getitem__(self, key: str) -> SymTensor:
        if key not in self._keys:
            raise self._tracer.error(f"{self._what}[{key!r}] does not exist; available: {sorted(self._keys)}")
        return self._get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._keys


def _gather(tracer: Tracer, key: str, residency: Residency, tensor: torch.Tensor, by: str) -> SymTensor:
    """Program input ``key`` read onto rows through index ``by`` (a broadcast)."""
    x = tracer.input(key, residency, tensor, 1)
    return SymTensor(tracer, tracer.program.add("broadcast", x.value, by=by, source=tracer.source()), 1)


class _Edges:
    def __init__(self, tracer: Tracer, ndata, edata, etype_data, ntype_data):
        def node(by):
            return lambda key: _gather(tracer, key, Residency.NODE, ndata[key], by)

        def ntype(by):
            return lambda key: _gather(tracer, f"ntype.{key}", Residency.NODE_TYPE, ntype_data[key], by)
        self.src = _Lookup(tracer, "edges.src", node("src"), ndata)
        self.dst = _Lookup(tracer, "edges.dst", node("dst"), ndata)
        self.data = _Lookup(tracer, "edges.data",
                            lambda k: tracer.input(f"e.{k}", Residency.EDGE, edata[k], 1), edata)
        self.type = _Lookup(tracer, "edges.type (etype_data)", lambda k: _gather(
            tracer, f"etype.{k}", Residency.EDGE_TYPE, etype_data[k], "etype"), etype_data)
        self.srctype = _Lookup(tracer, "edges.srctype (ntype_data)", ntype("srctype"), ntype_data)
        self.dsttype = _Lookup(tracer, "edges.dsttype (ntype_data)", ntype("dsttype"), ntype_data)


class _Nodes:
    def __init__(self, tracer: Tracer, ndata, ntype_data, mailbox: Mapping[str, SymTensor], computed):
        def data(key):
            if key in computed:
                return computed[key]
            return tracer.input(key, Residency.NODE, ndata[key], 1)
        self.data = _Lookup(tracer, "nodes.data", data, {*ndata, *computed})
        self.type = _Lookup(tracer, "nodes.type (ntype_data)", lambda k: _gather(
            tracer, f"ntype.{k}", Residency.NODE_TYPE, ntype_data[k], "ntype"), ntype_data)
        self.mailbox = _Lookup(tracer, "nodes.mailbox",
                               lambda k: SymTensor(tracer, mailbox[k].value, 2), mailbox)


def _returned(tracer: Tracer, result, stage: str) -> dict[str, SymTensor]:
    if not isinstance(result, dict):
        raise tracer.error(f"{stage} must return a dict of feature name -> tensor, got {type(result).__name__}")
    for key, value in result.items():
        if not isinstance(value, SymTensor):
            what = ("a tensor not computed from its edges/nodes argument (created or captured, so not "
                    "per-edge or per-node data)" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}")
            raise tracer.error(f"{stage} output {key!r} is {what}; each output must be computed from the "
                               "UDF's edges/nodes data")
    return result


def _zero_without_in_edges(tracer: Tracer, out: SymTensor) -> SymTensor:
    """DGL does not run reduce_fn on a vertex with no in-edges and zero-fills its outputs
    there; a traced reduce_fn runs on every vertex, so its result is selected away on
    those vertices. A bare mailbox reduction is already 0 on an empty mailbox."""
    if out.value.op == "reduce":
        return out
    return tracer.apply("select", tracer.in_degree(prefix=1), out, 0.0)


def trace_message_passing(message_fn: Callable, reduce_fn: Callable, update_fn: Callable | None,
                          ndata: Mapping[str, torch.Tensor], edata: Mapping[str, torch.Tensor],
                          etype_data: Mapping[str, torch.Tensor] | None = None,
                          ntype_data: Mapping[str, torch.Tensor] | None = None) -> _MessageTracer:
    """Capture the three UDFs into one program whose outputs are the final node data."""
    etype_data, ntype_data = dict(etype_data or {}), dict(ntype_data or {})
    dtype = next((t.dtype for table in (ndata, edata, etype_data, ntype_data) for t in table.values()
                  if t.is_floating_point()), torch.get_default_dtype())
    tracer = _MessageTracer(message_fn, "message", dtype)
    messages = _returned(tracer, tracer.call(message_fn, _Edges(tracer, ndata, edata, etype_data, ntype_data)),
                         "message_fn")
    for key, m in messages.items():
        if m.value.residency not in EDGE_ROWED:
            raise tracer.error(f"message {key!r} is {m.value.residency.name} data; a message must be "
                               "per edge (built from edges.src/dst/data)")
    stages = [(reduce_fn, "reduce", "reduce_fn")] + ([(update_fn, "update", "update_fn")] if update_fn else [])
    computed: dict[str, SymTensor] = {}
    for fn, mode, name in stages:
        tracer.rebind(fn, mode)
        nodes = _Nodes(tracer, ndata, ntype_data, messages if mode == "reduce" else {}, computed)
        result = _returned(tracer, tracer.call(fn, nodes), name)
        for key, out in result.items():
            if out.value.residency is not Residency.NODE:
                raise tracer.error(f"{name} output {key!r} is {out.value.residency.name} data; reduce the "
                                   "mailbox over dim=1 (sum/mean/max/min) to get per-node values")
        if mode == "reduce":
            result = {key: _zero_without_in_edges(tracer, out) for key, out in result.items()}
        computed = {**computed, **result} if mode == "update" else dict(result)
        outputs = result
    for key, out in outputs.items():
        tracer.program.output(key, out.value)
    return tracer


def message_passing(graph: Graph | object, message_fn: Callable, reduce_fn: Callable,
                    update_fn: Callable | None = None, *, ndata: Mapping[str, torch.Tensor],
                    edata: Mapping[str, torch.Tensor] | None = None,
                    etype_data: Mapping[str, torch.Tensor] | None = None,
                    ntype_data: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Run DGL-style ``update_all(message_fn, reduce_fn, update_fn)`` compiled through the IR;
    returns the node data that ``update_fn`` (or ``reduce_fn``) produces. ``etype_data`` /
    ``ntype_data`` hold per-edge-type / per-node-type tensors (see the module docstring)."""
    graph = Graph.coerce(graph)
    check_tables(ndata=ndata, edata=edata, etype_data=etype_data, ntype_data=ntype_data)
    edata, etype_data, ntype_data = dict(edata or {}), dict(etype_data or {}), dict(ntype_data or {})
    tables = (ndata, edata, etype_data, ntype_data)
    compiled, captured = _TRACES.compiled((message_fn, reduce_fn, update_fn), tables,
                                          lambda: trace_message_passing(message_fn, reduce_fn, update_fn, *tables))
    return compiled(graph, program_feeds(tables, captured))


# UDFs are often closures defined anew on every call (a layer's forward defines them),
# so the cache is keyed by their code and guarded state, not by the function objects.
_TRACES = TraceCache()
