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

Shapes follow torch's broadcasting as in DGL: ``nodes.data['h'].unsqueeze(1)`` is
[N, 1, F] (summing it over dim 1 gives ``h``; next to a mailbox value it is read onto each
in-edge), while ``nodes.data['h']`` ([N, F]) next to a [N, D, F] mailbox value is an error.
``nodes.mailbox['m'][:, i]`` is each vertex's ``i``-th message, in-edges in edge-id order.

A UDF may be a function, a bound method, a ``functools.partial``, an ``nn.Module`` (called
as a module: its forward hooks run on the traced values) or an object with a ``__call__``
method.

On a typed graph, per-type data is passed as ``etype_data={key: [num_edge_types, ...]}``
and ``ntype_data={key: [num_node_types, ...]}``. In ``message_fn``, ``edges.type[key]``
is each edge's relation's row, ``edges.srctype[key]`` / ``edges.dsttype[key]`` its
source's / destination's node type's row; in ``reduce_fn``/``update_fn``,
``nodes.type[key]`` is each vertex's node type's row. ``x @ edges.type["W"]`` with W of
shape [R, in, out] multiplies every edge by its own relation's matrix (R-GCN, HGT):

    def message(edges):
        return {"m": (edges.src["h"] @ edges.type["W"]) * edges.data["norm"]}

Edge data: ``message_fn`` may write ``edges.data[key] = value`` (a per-edge value), as
GatedGCN updates its edge features; later reads of ``edges.data[key]`` in the UDF see the
written value. ``message_passing(..., return_edata=True)`` returns ``(node_data,
edge_data)``, ``edge_data`` holding every key written, as [E, ...] tensors in edge-id order
(DGL would leave them in ``g.edata``; here nothing is stored on the graph, so the caller
asks for them). ``apply_edges(graph, edge_fn, ndata=..., edata=...)`` is DGL's
``apply_edges``: ``edge_fn(edges)`` returns a dict of per-edge values, and the result maps
those keys and any written to ``edges.data`` to [E, ...] tensors. Both are differentiable
and compile to the same fused edge kernels as messages:

    def message(edges):
        edges.data["e"] = edges.dst["h"] @ A + edges.src["h"] @ B + edges.data["e"] @ C
        sigma = torch.sigmoid(edges.data["e"])
        return {"m": sigma * (edges.src["h"] @ V), "sigma": sigma}

    nodes, edges = gnnfuse.message_passing(graph, message, reduce, ndata={"h": h},
                                           edata={"e": e}, return_edata=True)   # edges["e"]: [E, F]
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..graph import Graph
from ..ir import Movement, Residency
from ..passes.reorder import read_rows_only, unbounded_derivative
from ..runtime import CompiledProgram
from ..runtime.compile_op import run_eagerly
from . import pairwise
from .compiled_call import call_compiled, register_udf
from .graph_input import call_graph
from .repeat_call import RepeatCall, RepeatCalls
from .trace_cache import GuardMemo, TraceCache, check_tables, plain_table, program_feeds
from .tracer import EDGE_ROWED, SymTensor, Tracer, counts_in_edges



class _MessageTracer(Tracer):
    """A tracer whose mailbox reductions turn into graph Reduce/Norm ops."""

    def reduce(self, x: SymTensor, op: str, dim=1, keepdim: bool = False) -> SymTensor:
        if pairwise.is_pairwise(x):
            return pairwise.reduce_pairs(self, x, op, dim, keepdim)
        self._check_mailbox(x)
        result = SymTensor(self, self.program.add("reduce", x.value, op=op, by="dst", source=self.source()), 1)
        if keepdim:   # [N, 1, F]: the neighbour axis kept as a per-vertex dim of size 1
            result = self.apply("reshape", result, shape=(1,) + result.value.shape)
        return result

    def pick(self, x: SymTensor, position: int) -> SymTensor:
        """``nodes.mailbox[k][:, position]``: each vertex's message at that position of its
        in-edges in edge-id order, DGL's mailbox order (ir/ops/positional.py)."""
        self._check_mailbox(x)
        return SymTensor(self, self.program.add("pick_in_edge", x.value, position=position, source=self.source()), 1)

    def softmax(self, x: SymTensor) -> SymTensor:
        if pairwise.is_pairwise(x):
            raise self.error("softmax over an axis of a pairwise [N, D, D, ...] term cannot be compiled")
        self._check_mailbox(x)
        return SymTensor(self, self.program.add("edge_softmax", x.value, by="dst", source=self.source()), 2)

    def apply(self, op: str, *operands, **attrs) -> SymTensor:
        syms = [self.lift(o) for o in operands]
        if any(pairwise.is_pairwise(s) for s in syms):
            syms = pairwise.line_up(self, syms)
        elif any(s.prefix == 2 for s in syms):
            rank = max(s.dim() for s in syms if s.prefix == 2)
            syms = [self._onto_mailbox(s, rank) for s in syms]
        return super().apply(op, *syms, **attrs)

    def _onto_mailbox(self, x: SymTensor, rank: int) -> SymTensor:
        """A per-vertex value meeting a mailbox value ([N, D, ...], ``rank`` dims), with
        torch's right-aligned broadcasting: [N, 1, ...] (``nodes.data[k].unsqueeze(1)``,
        a keepdim reduction) is read onto each in-edge of its vertex; a per-vertex scalar
        of the in-degree (``mailbox.shape[1]``) scales every entry, as DGL's Python int
        does; anything else would broadcast the vertex axis against the neighbour axis."""
        if x.value.residency is not Residency.NODE or x.prefix != 1 or counts_in_edges(x.value):
            return x
        if x.dim() != rank or x.value.shape[:1] != (1,):
            raise self.error(f"a per-vertex {list(x.shape)} value next to a {rank}-dim mailbox value "
                             "([N, D, ...]) would broadcast its vertex axis against the neighbour axis; "
                             "give it a size-1 neighbour axis (nodes.data[k].unsqueeze(1), or keepdim=True)")
        row = self.apply("reshape", x, shape=x.value.shape[1:])
        return row.broadcast_dst()

    def pair_view(self, x: SymTensor) -> SymTensor:
        """``x.unsqueeze(1)`` of a mailbox value (see frontend/pairwise.py)."""
        return pairwise.pair_view(self, x)

    def _check_mailbox(self, x: SymTensor) -> None:
        if self.mode != "reduce" or x.value.residency not in EDGE_ROWED:
            raise self.error("reductions over dim=1 apply to nodes.mailbox inside reduce_fn")


class _Lookup:
    """``edges.src``, ``nodes.mailbox``, ...: each key reads one `SymTensor`, the same on
    every access, as DGL's frames hand a UDF the same tensor each time (a column gathers
    its rows once and keeps them; the mailbox is a dict). An in-place op on one read
    (``m = nodes.mailbox["m"]; m *= 3``) is then seen by the next; a fresh read per access
    gave the unwritten value, silently."""

    def __init__(self, tracer: Tracer, what: str, get: Callable[[str], SymTensor], keys):
        self._tracer, self._what, self._get, self._keys = tracer, what, get, keys
        self._read: dict[str, SymTensor] = {}

    def __getitem__(self, key: str) -> SymTensor:
        if key not in self._keys:
            raise self._tracer.error(f"{self._what}[{key!r}] does not exist; available: {sorted(self._keys)}")
        if key not in self._read:
            self._read[key] = self._get(key)
        return self._read[key]

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def get(self, key: str, default=None):
        """``edges.data.get("w", 1.0)``: as on DGL's frames (a dict's ``get``)."""
        return self[key] if key in self else default

    # DGL's frames are dicts to a UDF: without these, ``edges.src.items()`` and
    # ``len(edges.src)`` raised a bare AttributeError or TypeError, and ``for k in
    # edges.src`` (``dict(edges.src)``) probed ``edges.src[0]``, "does not exist"
    def keys(self) -> list[str]:
        return sorted(self._keys) if isinstance(self._keys, (set, frozenset)) else list(self._keys)

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def values(self) -> list[SymTensor]:
        return [self[key] for key in self.keys()]

    def items(self) -> list[tuple[str, SymTensor]]:
        return [(key, self[key]) for key in self.keys()]

    def __setitem__(self, key: str, value) -> None:
        raise self._tracer.error(f"{self._what} is read-only: only edges.data can be written in a UDF; "
                                 f"return {key!r} in the UDF's result dict instead")


class _EdgeData(_Lookup):
    """``edges.data``: the edge features passed in, plus those the UDF writes
    (``edges.data["e"] = ...``, GatedGCN's edge update). A written key shadows the input
    of that name for the rest of the trace, as the assignment does in DGL; the written
    values are what `message_passing(..., return_edata=True)` and `apply_edges` return."""

    def __init__(self, tracer: Tracer, edata: Mapping[str, torch.Tensor]):
        super().__init__(tracer, "edges.data",
                         lambda k: _callers(tracer.input(f"e.{k}", Residency.EDGE, edata[k], 1),
                                            f"edges.data[{k!r}]"), edata)
        self.written: dict[str, SymTensor] = {}

    def __getitem__(self, key: str) -> SymTensor:
        return self.written[key] if key in self.written else super().__getitem__(key)

    def __contains__(self, key: str) -> bool:
        return key in self.written or super().__contains__(key)

    def keys(self) -> list[str]:
        return [*self._keys, *(key for key in self.written if key not in self._keys)]

    def __setitem__(self, key: str, value: SymTensor) -> None:
        if not isinstance(key, str):
            raise self._tracer.error(f"edges.data keys are strings, got {type(key).__name__}")
        if not isinstance(value, SymTensor) or value.value.residency not in EDGE_ROWED:
            what = value.value.residency.name if isinstance(value, SymTensor) else type(value).__name__
            raise self._tracer.error(f"edges.data[{key!r}] must be assigned a per-edge value computed from "
                                     f"edges.src/dst/data, got {what}")
        self.written[key] = value


def _gather(tracer: Tracer, key: str, residency: Residency, tensor: torch.Tensor, by: str) -> SymTensor:
    """Program input ``key`` read onto rows through index ``by`` (a broadcast)."""
    x = tracer.input(key, residency, tensor, 1)
    return SymTensor(tracer, tracer.program.add("broadcast", x.value, by=by, source=tracer.source()), 1)


# DGL's EdgeBatch / NodeBatch members a compiled UDF does not have, and what to use instead
_BATCH_MEMBERS = {
    "edges": ("edges.edges() (each edge's source, destination and id)", "pass the ids as data: "
              "ndata={'id': torch.arange(N)}, edata={'eid': torch.arange(E)}, read as edges.src['id'], "
              "edges.dst['id'] and edges.data['eid']"),
    "nodes": ("nodes.nodes() (each vertex's id)", "pass the ids as node data: ndata={'id': torch.arange(N)}, "
              "read as nodes.data['id']"),
    "batch_size": ("<what>.batch_size() (the number of <rows> DGL hands this call)", "a compiled UDF runs on all "
                   "<rows> at once: use the tensors' own shapes (x.shape[0] only as a reshape's first size)"),
    "__len__": ("len(<what>) (the number of <rows> DGL hands this call)", "a compiled UDF runs on all "
                "<rows> at once: use the tensors' own shapes (x.shape[0] only as a reshape's first size)"),
    "canonical_etype": ("edges.canonical_etype", "on a typed graph, per-relation data comes as etype_data and is "
                        "read as edges.type[key]"),
    "etype": ("edges.etype", "on a typed graph, per-relation data comes as etype_data and is read as "
              "edges.type[key]"),
    "ntype": ("nodes.ntype", "on a typed graph, per-node-type data comes as ntype_data and is read as "
              "nodes.type[key]"),
}


def _missing_member(tracer: Tracer, what: str, name: str) -> Exception:
    """The error for ``edges.<name>`` / ``nodes.<name>`` that the UDF's argument lacks. A
    member of DGL's EdgeBatch / NodeBatch is a CompileError at the user's line naming what
    to use instead (a bare AttributeError named no line, and ``hasattr`` took it for
    False where DGL has the member); any other name is an AttributeError, as in DGL."""
    known = _BATCH_MEMBERS.get(name)
    if known is None:
        members = "src, dst, data, type, srctype, dsttype" if what == "edges" else "data, mailbox, type"
        return AttributeError(f"{what}.{name} does not exist (a compiled UDF's {what} argument has {members})")
    rows = "edges" if what == "edges" else "vertices"
    construct, instead = (part.replace("<what>", what).replace("<rows>", rows) for part in known)
    return tracer.error(f"{construct} is not available in a compiled UDF; {instead}")


class _Edges:
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise _missing_member(self.__dict__["_tracer"], "edges", name)

    def __len__(self) -> int:
        """DGL's batches have a length (``len(edges)`` is their ``batch_size()``); without
        this method ``len(edges)`` was a bare TypeError naming no line."""
        raise _missing_member(self._tracer, "edges", "__len__")

    def __init__(self, tracer: Tracer, ndata, edata, etype_data, ntype_data):
        self._tracer = tracer
        def node(by):
            return lambda key: _gather(tracer, key, Residency.NODE, ndata[key], by)

        def ntype(by):
            return lambda key: _gather(tracer, f"ntype.{key}", Residency.NODE_TYPE, ntype_data[key], by)
        self.src = _Lookup(tracer, "edges.src", node("src"), ndata)
        self.dst = _Lookup(tracer, "edges.dst", node("dst"), ndata)
        self.data = _EdgeData(tracer, edata)
        self.type = _Lookup(tracer, "edges.type (etype_data)", lambda k: _gather(
            tracer, f"etype.{k}", Residency.EDGE_TYPE, etype_data[k], "etype"), etype_data)
        self.srctype = _Lookup(tracer, "edges.srctype (ntype_data)", ntype("srctype"), ntype_data)
        self.dsttype = _Lookup(tracer, "edges.dsttype (ntype_data)", ntype("dsttype"), ntype_data)


def _callers(x: SymTensor, name: str) -> SymTensor:
    """``x``, read from a table DGL hands the UDF whole -- ``g.edata`` in a message or edge
    UDF, ``g.ndata`` in the apply UDF -- marked so that an in-place op on it is refused:
    in DGL it writes the caller's tensor, which a compiled call cannot (the other reads,
    gathers or reduce-stage node data, are copies in DGL too)."""
    x.caller_table = name
    return x


class _Nodes:
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise _missing_member(self.__dict__["_tracer"], "nodes", name)

    def __len__(self) -> int:
        """DGL's batches have a length (``len(nodes)`` is their ``batch_size()``); without
        this method ``len(nodes)`` was a bare TypeError naming no line."""
        raise _missing_member(self._tracer, "nodes", "__len__")

    def __init__(self, tracer: Tracer, ndata, ntype_data, mailbox: Mapping[str, SymTensor], computed):
        self._tracer = tracer
        def data(key):
            if key in computed:
                return computed[key]
            read = tracer.input(key, Residency.NODE, ndata[key], 1)
            return _callers(read, f"nodes.data[{key!r}]") if tracer.mode == "update" else read
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
    those vertices. A bare mailbox reduction is already 0 on an empty mailbox. The zero
    takes the output's kind: a float 0.0 would promote an integer output (``m[:, 0]``,
    ``m.max(1)[0] + 1``) to a float, rounding integers above 2**24 or 2**53, and an int 0
    a bool one (``m[:, -1]`` of a bool mailbox came back int64)."""
    if out.value.op == "reduce":
        return out
    _finite_without_in_edges(tracer, out)
    if out.dtype == torch.bool:
        zero = SymTensor(tracer, tracer.program.add("const", value=False, dtype=torch.bool, source=tracer.source()), 0)
    else:
        zero = 0.0 if out.dtype.is_floating_point else 0
    return tracer.apply("select", tracer.in_degree(prefix=1), out, zero)


def _finite_without_in_edges(tracer: Tracer, out: SymTensor) -> None:
    """On vertices without in-edges, feed each op of ``out``'s node-wise computation whose
    derivative can be infinite (`passes.reorder.unbounded_derivative`: div, exp, log,
    sqrt, pow) 1 for its node-wise operands, as `passes.reorder` does for the ops it
    moves (``exp`` past overflow: exp(d) * sum(m) * c with d = 1000). Selecting the result
    away there (`_zero_without_in_edges`) leaves the forward right but not the backward: a
    weighted mean ``sum(m * s) / sum(s)`` is 0 / 0 = NaN on such a vertex, and so is
    ``sum(m) / nodes.data['deg']`` with the in-degree passed as node data (0 exactly there)
    or a node type's row that is 0; the zero gradient times that NaN made the gradient of
    every parameter the reduce_fn multiplies it by NaN (and those rows of node data), where
    DGL, which never runs reduce_fn there, gives finite ones. The vertex's own value is
    discarded either way; only its derivative changes, to the 0 DGL's is. The walk stops at
    the mailbox reductions, so the message_fn's own node-wise work keeps its rows there."""
    node_wise, stack = {}, [out.value]
    while stack:
        value = stack.pop()
        if value.id in node_wise or value.residency is not Residency.NODE:
            continue
        node_wise[value.id] = value
        if not any(i.residency in EDGE_ROWED for i in value.inputs):
            stack.extend(value.inputs)
    # each singular op reads 1 for each of its node-wise operands there: a read replaced
    # further up (the mailbox reduction in ``log(1 - max(s))``, or ``nodes.data['p']`` in
    # ``log(1 - p)``) could make a singularity the row's own values never had
    program = tracer.program
    for user in node_wise.values():
        if user.op != "input" and user.movement is Movement.DENSE and unbounded_derivative(user.op):
            user.inputs = tuple(read_rows_only(program, read, "dst", user.source)
                                if read.residency is Residency.NODE else read for read in user.inputs)
    program.toposort()


def trace_message_passing(message_fn: Callable, reduce_fn: Callable, update_fn: Callable | None,
                          ndata: Mapping[str, torch.Tensor], edata: Mapping[str, torch.Tensor],
                          etype_data: Mapping[str, torch.Tensor] | None = None,
                          ntype_data: Mapping[str, torch.Tensor] | None = None,
                          return_edata: bool = False) -> _MessageTracer:
    """Capture the three UDFs into one program whose outputs are the final node data, and
    with ``return_edata`` the edge data ``message_fn`` wrote (keys ``EDGE_OUTPUT + key``)."""
    etype_data, ntype_data = dict(etype_data or {}), dict(ntype_data or {})
    tracer = _MessageTracer(message_fn, "message")
    edges = _Edges(tracer, ndata, edata, etype_data, ntype_data)
    messages = _per_edge(tracer, _returned(tracer, tracer.call(message_fn, edges), "message_fn"), "message")
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
    if not outputs and not (return_edata and edges.data.written):
        # DGL then writes nothing; a program without outputs failed verification, naming no UDF
        raise tracer.error(f"{name} returned an empty dict: the call computes nothing")
    for key, out in outputs.items():
        tracer.program.output(key, out.value)
    if return_edata:
        _output_edge_data(tracer, edges.data.written)
    return tracer


def message_passing(graph: Graph | object, message_fn: Callable, reduce_fn: Callable,
                    update_fn: Callable | None = None, *, ndata: Mapping[str, torch.Tensor],
                    edata: Mapping[str, torch.Tensor] | None = None,
                    etype_data: Mapping[str, torch.Tensor] | None = None,
                    ntype_data: Mapping[str, torch.Tensor] | None = None,
                    return_edata: bool = False
                    ) -> dict[str, torch.Tensor] | tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Run DGL-style ``update_all(message_fn, reduce_fn, update_fn)`` compiled through the IR;
    returns the node data that ``update_fn`` (or ``reduce_fn``) produces. ``etype_data`` /
    ``ntype_data`` hold per-edge-type / per-node-type tensors (see the module docstring).
    With ``return_edata=True`` it returns ``(node data, edge data)``, the edge data being
    what ``message_fn`` wrote to ``edges.data`` ([E, ...] in edge-id order).

    Under ``torch.compile`` it runs eagerly behind a graph break, with a warning: its
    functions are often closures made per call, which dynamo would trace into gnnfuse's
    tracer (failing on its symbolic values); a `UpdateAll` built once runs as one operator."""
    if torch.compiler.is_compiling():
        return run_eagerly(
            "gnnfuse.message_passing (functions passed per call; build gnnfuse.frontend.UpdateAll(message_fn, "
            "reduce_fn) once, outside the compiled code, to compile it as one operator)",
            _message_passing, graph, message_fn, reduce_fn, update_fn, ndata, edata, etype_data, ntype_data,
            return_edata)
    return _message_passing(graph, message_fn, reduce_fn, update_fn, ndata, edata, etype_data, ntype_data,
                            return_edata)


def _message_passing(graph: Graph | object, message_fn: Callable, reduce_fn: Callable,
                     update_fn: Callable | None, ndata: Mapping[str, torch.Tensor],
                     edata: Mapping[str, torch.Tensor] | None, etype_data: Mapping[str, torch.Tensor] | None,
                     ntype_data: Mapping[str, torch.Tensor] | None, return_edata: bool
                     ) -> dict[str, torch.Tensor] | tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`message_passing`'s eager run."""
    outputs, compiled, _ = _run(graph, (message_fn, reduce_fn, update_fn), ndata, edata, etype_data, ntype_data,
                                return_edata)
    if not return_edata:
        return outputs
    return _split_edge_outputs(compiled, outputs)


def _run(graph: Graph | object, functions: tuple[Callable, Callable, Callable | None],
         ndata: Mapping[str, torch.Tensor], edata: Mapping[str, torch.Tensor] | None,
         etype_data: Mapping[str, torch.Tensor] | None, ntype_data: Mapping[str, torch.Tensor] | None,
         return_edata: bool, guards: GuardMemo | None = None
         ) -> tuple[dict[str, torch.Tensor], CompiledProgram, dict[str, torch.Tensor]]:
    """`message_passing`'s run: its raw outputs, the compiled program and what its trace
    captured. ``guards``: a bound `UpdateAll`'s memo of its functions' guard walk."""
    # the usual call, a dict of tensors by str alone, passes `check_tables`' checks here;
    # anything else goes to `check_tables`, which names what is wrong
    if edata is not None or etype_data is not None or ntype_data is not None or not plain_table(ndata):
        check_tables(ndata=ndata, edata=edata, etype_data=etype_data, ntype_data=ntype_data)
    graph = call_graph(graph, (ndata or {}).values())
    edata, etype_data, ntype_data = dict(edata or {}), dict(etype_data or {}), dict(ntype_data or {})
    tables = (ndata, edata, etype_data, ntype_data)
    traces = _TRACES_WITH_EDATA if return_edata else _TRACES
    compiled, captured = traces.compiled(functions, tables, lambda: trace_message_passing(
        *functions, *tables, return_edata=return_edata), guards)
    return compiled(graph, program_feeds(tables, captured)), compiled, captured


class UpdateAll:
    """``message_passing`` with its UDFs bound: ``UpdateAll(message_fn, reduce_fn)(graph,
    ndata=...)`` is ``message_passing(graph, message_fn, reduce_fn, ndata=...)``. Built
    once (at module level, or by a `compiled_call.udf_factory` factory) it also runs under
    ``torch.compile`` as one operator, which a call with fresh closures cannot."""

    def __init__(self, message_fn: Callable, reduce_fn: Callable, update_fn: Callable | None = None):
        self.functions = (message_fn, reduce_fn, update_fn)
        self.traces = _TRACES       # the cache `compiled` asks
        self.udf_key = register_udf(self)
        self._repeats = RepeatCalls()     # the last prepared calls, for the next (repeat_call.py)
        self._guards = GuardMemo()        # the trace cache's guard walk of `functions`, reused while valid

    def __reduce__(self) -> tuple:
        """Pickled (sent to a spawned worker) as its functions, rebuilt there: with its
        ``__dict__``, after a call the caches' programs held code objects, which pickle
        refused ("cannot pickle code objects")."""
        return UpdateAll, self.functions

    def compiled(self, tables: tuple[Mapping[str, torch.Tensor], ...]
                 ) -> tuple[CompiledProgram, dict[str, torch.Tensor]]:
        """The compiled program for a call on ``tables`` and the tensors its trace captured."""
        return self.traces.compiled(self.functions, tables, lambda: trace_message_passing(*self.functions, *tables),
                                    self._guards)

    def __call__(self, graph: Graph | object, *, ndata: Mapping[str, torch.Tensor],
                 edata: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        def run() -> dict[str, torch.Tensor]:
            return message_passing(graph, *self.functions, ndata=ndata, edata=edata)
        if torch.compiler.is_compiling():
            return call_compiled(self.udf_key, graph, (ndata, edata or {}, {}, {}), run)
        if edata is None:
            outputs = self._repeats(graph, ndata)
            if outputs is not None:
                return outputs
        outputs, compiled, captured = _run(graph, self.functions, ndata, edata, None, None, False, self._guards)
        if compiled.prepared is not None and not edata:     # else there is nothing to repeat
            repeat = RepeatCall.after(_TRACES, self.functions, graph, ndata, compiled, captured)
            if repeat is not None:
                self._repeats.keep(repeat)
        return outputs


# UDFs are often closures defined anew on every call (a layer's forward defines them),
# so the cache is keyed by their code and guarded state, not by the function objects.
# Returning edge data changes the program's outputs, so those traces have their own cache.
_TRACES = TraceCache()
_TRACES_WITH_EDATA = TraceCache()
_EDGE_TRACES = TraceCache()


def trace_apply_edges(edge_fn: Callable, ndata: Mapping[str, torch.Tensor], edata: Mapping[str, torch.Tensor],
                      etype_data: Mapping[str, torch.Tensor], ntype_data: Mapping[str, torch.Tensor]
                      ) -> _MessageTracer:
    """Capture ``edge_fn`` into a program whose outputs are the per-edge values it returns
    and the ``edges.data`` it writes (a returned key wins over a written one)."""
    tracer = _MessageTracer(edge_fn, "message")
    edges = _Edges(tracer, ndata, edata, etype_data, ntype_data)
    returned = _per_edge(tracer, _returned(tracer, tracer.call(edge_fn, edges), "edge_fn"), "edge_fn output")
    outputs = {**edges.data.written, **returned}
    if not outputs:
        raise tracer.error("edge_fn returned an empty dict and wrote no edges.data: nothing to compute")
    for key, out in outputs.items():
        tracer.program.output(key, out.value)
    return tracer


def apply_edges(graph: Graph | object, edge_fn: Callable, *, ndata: Mapping[str, torch.Tensor] | None = None,
                edata: Mapping[str, torch.Tensor] | None = None,
                etype_data: Mapping[str, torch.Tensor] | None = None,
                ntype_data: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """DGL's ``apply_edges(edge_fn)``, compiled: ``edge_fn(edges)`` returns a dict of
    per-edge values; the result maps each returned key, and each key ``edge_fn`` wrote to
    ``edges.data``, to an [E, ...] tensor in edge-id order, differentiable. Under
    ``torch.compile`` it runs eagerly behind a graph break, with a warning (as
    `message_passing` does)."""
    if torch.compiler.is_compiling():
        return run_eagerly("gnnfuse.apply_edges", _apply_edges, graph, edge_fn, ndata, edata, etype_data, ntype_data)
    return _apply_edges(graph, edge_fn, ndata, edata, etype_data, ntype_data)


def _apply_edges(graph: Graph | object, edge_fn: Callable, ndata: Mapping[str, torch.Tensor] | None,
                 edata: Mapping[str, torch.Tensor] | None, etype_data: Mapping[str, torch.Tensor] | None,
                 ntype_data: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """`apply_edges`' eager run."""
    check_tables(ndata=ndata, edata=edata, etype_data=etype_data, ntype_data=ntype_data)
    graph = call_graph(graph, (ndata or {}).values())
    tables = tuple(dict(table or {}) for table in (ndata, edata, etype_data, ntype_data))
    compiled, captured = _EDGE_TRACES.compiled((edge_fn,), tables, lambda: trace_apply_edges(edge_fn, *tables))
    return compiled(graph, program_feeds(tables, captured))


EDGE_OUTPUT = "e."   # program output key prefix of edge data returned beside node data


def _output_edge_data(tracer: Tracer, written: Mapping[str, SymTensor]) -> None:
    for key, value in written.items():
        name = EDGE_OUTPUT + key
        if name in tracer.program.outputs:
            raise tracer.error(f"node output {name!r} clashes with edge data {key!r} returned beside it; "
                               "rename one of them")
        tracer.program.output(name, value.value)


def _split_edge_outputs(compiled: CompiledProgram, outputs: dict[str, torch.Tensor]
                        ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(node data, edge data) from a program traced with ``return_edata``: edge data are
    the edge-rowed outputs, under their ``edges.data`` keys."""
    rowed = {key: value.residency.is_edge_rowed for key, value in compiled.program.outputs.items()}
    return ({k: t for k, t in outputs.items() if not rowed[k]},
            {k.removeprefix(EDGE_OUTPUT): t for k, t in outputs.items() if rowed[k]})


def _per_edge(tracer: Tracer, values: dict[str, SymTensor], what: str) -> dict[str, SymTensor]:
    for key, value in values.items():
        if value.value.residency not in EDGE_ROWED:
            raise tracer.error(f"{what} {key!r} is {value.value.residency.name} data; it must be per edge "
                               "(built from edges.src/dst/data)")
    return values
