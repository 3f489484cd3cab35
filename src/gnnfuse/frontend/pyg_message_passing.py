"""PyG's ``MessagePassing.propagate``, with ``message`` traced into the IR and fused into
the aggregation (the engine behind `gnnfuse.nn.MessagePassing`).

PyG runs ``propagate`` as: gather every ``*_i`` / ``*_j`` tensor onto the edges
(``index_select``), call ``message`` on those [E, ...] tensors, scatter the result into the
target vertices with ``aggr``, then call ``update``. Here ``message`` is called once on
`SymTensor` rows instead: ``x_j`` is the program input ``x`` broadcast by the edge's
source, ``x_i`` by its target, a tensor keyword argument with one row per edge (``edge_attr``,
``edge_weight``) is an EDGE input, and anything else is passed as PyG passes it. ``index``
(and ``edge_index_i``) is a marker that ``torch_geometric.utils.softmax(alpha, index, ptr,
size_i)`` inside ``message`` recognises: it becomes an edge softmax over each target's
in-edges. ``aggr`` becomes a graph Reduce ('softmax': edge-softmax weights, then a sum), so
the program is the fused gather -> message -> aggregate kernel, never materialising the
gathered [E, F] inputs. ``update`` runs eagerly
on the aggregated rows with the arguments PyG would give it.

`compiled_propagate` raises `NotCompilable` for anything it cannot reproduce exactly (the
caller then runs PyG's own ``propagate``): sparse adjacency inputs, bipartite sizes,
``torch.autocast``, ``node_dim`` other than the row axis, a custom ``aggregate`` or
aggregation module, hooks (PyG's propagate/message/aggregate hooks, torch's on the aggregation module or
on every module, a backward hook on a module ``message`` calls), ``explain`` and ``decomposed_layers``, a
``torch.func`` transform, a ``message``
that writes into the layer or into a container it reaches or rebinds a global or closure variable,
a tensor with one row per edge or node that
``message`` reads from outside its arguments (graph data the tracer would take for one
shared value), and any failure while tracing ``message`` (a `CompileError` names the
construct and the line).

Traces are reused through `TraceCache` keyed by ``message``'s code and guarded globals,
the argument shapes, the non-tensor arguments and the values of the ``self.<attr>``
scalars, tensors and torch or PyG modules ``message`` reads (``self.training``,
``self.negative_slope``, ``self.lin``; see `trace_cache` for how a module is guarded),
whether it has an attribute it asks ``hasattr``/``getattr`` about, and the same of a
method of the layer it calls (``self.message_basic(...)``); a ``message`` that uses
``self`` any other way or captures tensors it makes itself is traced on every call,
which costs Python time but can never serve a stale program (so is one that writes a
tensor it reaches in place, `_in_place_writes_checked`). The vertex count is not
part of the key unless ``message`` reads it as a number (see `compiled_propagate`), so the
batches of a sampled mini-batch run reuse one trace.
"""
from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import linecache
import traceback
import types
from typing import Any, Callable, Hashable, Iterator, Mapping

import torch
import torch_geometric.utils
from torch_geometric import EdgeIndex
from torch_geometric.nn import MessagePassing as PyGMessagePassing
from torch_geometric.nn.aggr import (MaxAggregation, MeanAggregation, MinAggregation, SoftmaxAggregation,
                                    SumAggregation)

from ..graph import Graph
from ..graph.index_cache import functorch_interpreter
from ..ir import CompileError, Residency
from ..passes.reorder import mask_unread_rows_of_gathered_products
from ..runtime.compiled import read_back_by_backward
from .kept_traced import KeptTraced, containers_within, contents, from_library, holds_traced, restore, same_contents
from .module_hooks import registered_hooks
from .trace_cache import _SCALARS, TraceCache, _global_names, changed_values, outside_writes, program_feeds
from .tracer import EDGE_ROWED, RowCount, SymTensor, Tracer

# The aggregation modules PyG's ``aggr`` strings resolve to that the IR computes exactly
# (empty neighbourhoods give 0 in both): a graph Reduce, or for 'softmax' the sum of the
# messages weighted by their edge softmax (see `_softmax_aggregate`).
AGGREGATIONS = {SumAggregation: "sum", MeanAggregation: "mean", MaxAggregation: "max", MinAggregation: "min",
                SoftmaxAggregation: "softmax"}
_PYG_SOFTMAX = torch_geometric.utils.softmax


class NotCompilable(Exception):
    """This ``propagate`` call must run eagerly; the message says why (and where)."""


class _Marker:
    """Stands for one of PyG's index arguments inside a traced ``message``. Only
    ``torch_geometric.utils.softmax`` accepts it; any other use fails the trace, so the
    call runs eagerly rather than computing with a wrong value."""

    def __init__(self, name: str, target: bool = False):
        self.name, self.target = name, target     # target: each edge's target vertex (softmax's index)

    def __repr__(self) -> str:
        return f"<traced {self.name}>"

    def __getattr__(self, attribute: str):
        """A tensor attribute (``index.view``, ``edge_index_j.device``) is a TypeError
        naming the argument, which the fallback warning quotes with the line: a bare
        AttributeError on '_Marker' said neither what the value was nor what compiles. Any
        other name is an AttributeError, as on a tensor."""
        if attribute.startswith("__") or not hasattr(torch.Tensor, attribute):
            raise AttributeError(attribute)
        takes = ("it only as the index of torch_geometric.utils.softmax(src, index, ptr, size_i)" if self.target
                 else "no edge indices but its target's (index, as softmax's index)")
        raise TypeError(f"message()'s `{self.name}` argument (edge indices) is used as a tensor (.{attribute}); "
                        f"a compiled message takes {takes}")


TARGET_INDEX = _Marker("index", target=True)


def _softmax(tracer: Tracer) -> Callable:
    """``torch_geometric.utils.softmax`` as ``message`` sees it while traced."""

    def softmax(src, index=None, ptr=None, num_nodes=None, dim=0):
        if not isinstance(src, SymTensor):
            return _PYG_SOFTMAX(src, index, ptr, num_nodes, dim)
        if not (isinstance(index, _Marker) and index.target) or ptr is not None or dim not in (0, -src.dim()):
            raise tracer.error("torch_geometric.utils.softmax compiles only as softmax(alpha, index, ptr, "
                               "size_i) over message's `index` argument (each edge's target), dim=0")
        if src.value.residency not in EDGE_ROWED:
            raise tracer.error("softmax over a target's in-edges takes per-edge values")
        return SymTensor(tracer, tracer.program.add("edge_softmax", src.value, by="dst", source=tracer.source()), 1)

    return softmax


class _ModuleView(types.SimpleNamespace):
    """A module with some attributes replaced: ``torch_geometric.utils`` with the traced
    ``softmax`` (for ``utils.softmax(...)``), ``torch_geometric`` with that view as
    ``utils`` (for ``torch_geometric.utils.softmax(...)``); every other name is the module's."""

    def __init__(self, module: types.ModuleType, **replaced: Any):
        super().__init__(_module=module, **replaced)

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def _rebuilt(fn: types.FunctionType, swap: Callable[[Any], Any], env: dict[str, Any]) -> types.FunctionType:
    """``fn`` whose globals (looked up in ``env``, a copy) and closure cells hold
    ``swap(value)`` in place of each value it reads."""
    for name in _global_names(fn.__code__):
        if name in fn.__globals__:
            env[name] = swap(fn.__globals__[name])
    cells = tuple(cell if cell.cell_contents is _EMPTY else types.CellType(swap(cell.cell_contents))
                  for cell in map(_filled, fn.__closure__ or ()))
    rebuilt = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, cells or None)
    rebuilt.__kwdefaults__ = fn.__kwdefaults__
    return rebuilt


_EMPTY = object()


def _filled(cell: types.CellType) -> types.CellType:
    try:
        cell.cell_contents
        return cell
    except ValueError:       # a closure variable not yet assigned
        return types.CellType(_EMPTY)


def _with_softmax(fn: types.FunctionType, tracer: Tracer) -> types.FunctionType:
    """``fn`` reading the traced softmax wherever its globals or closure hold PyG's
    ``softmax``, the ``torch_geometric.utils`` module or ``torch_geometric`` itself (the
    full path: PyG's own softmax ran on the traced values, and the layer fell back to
    eager with a warning about a ``.detach()`` the user never wrote)."""
    softmax = _softmax(tracer)
    utils = _ModuleView(torch_geometric.utils, softmax=softmax)
    swaps = {id(_PYG_SOFTMAX): softmax, id(torch_geometric.utils): utils,
             id(torch_geometric): _ModuleView(torch_geometric, utils=utils)}
    return _rebuilt(fn, lambda value: swaps.get(id(value), value), dict(fn.__globals__))


# --- the cache key ---------------------------------------------------------------------
class _Unguardable:
    """Put in a cache key to make it uncacheable (`TraceCache` cannot freeze it)."""


def _library_view(fn: types.FunctionType) -> types.FunctionType:
    """``fn`` with every PyG object among its globals and closure replaced by its name,
    so the trace cache guards it like torch's own functions (PyG is a library: its
    functions do not change while their identity holds)."""
    def name_of_pyg(value: Any) -> Any:
        owner = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(owner, str) and owner.split(".")[0] == "torch_geometric":
            return "torch_geometric", owner, getattr(value, "__qualname__", None)
        return value
    return _rebuilt(fn, name_of_pyg, {"__name__": fn.__globals__.get("__name__")})


_PROBES = ("hasattr", "getattr")     # the builtins whose (self, "name") `_self_attributes` lists


@functools.lru_cache(maxsize=256)
def _self_attributes(code: types.CodeType) -> tuple[str, ...] | None:
    """The attribute names a method reads off ``self`` -- ``self.name``, or a constant name
    asked with ``hasattr(self, "name")`` / ``getattr(self, "name", ...)`` (GENConv's
    message asks ``hasattr(self, 'lin_edge')``) -- or None when ``self`` is used any other
    way (passed on, captured by a nested function, or implicitly by a zero-argument
    ``super()``): then what it reads cannot be listed and the trace is not cached. A store
    (``self._alpha = alpha``, TransformerConv's) reads nothing: `_attribute_writes_checked`
    refuses it, or restores an attribute the class names as scratch, when tracing."""
    if not code.co_argcount or code.co_varnames[0] in code.co_cellvars or "__class__" in code.co_freevars:
        return None
    me = code.co_varnames[0]
    instructions = list(dis.get_instructions(code))
    names = []
    for k, ins in enumerate(instructions):
        if "FAST" not in ins.opname or me not in (ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)):
            continue
        # one load of self (3.13's LOAD_FAST_LOAD_FAST of two names, or any store, is another use)
        if ins.opname not in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW") or k + 1 == len(instructions):
            return None
        after = instructions[k + 1]
        if after.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            names.append(after.argval)
        elif after.opname == "STORE_ATTR":
            continue
        elif (k and instructions[k - 1].opname == "LOAD_GLOBAL" and instructions[k - 1].argval in _PROBES
              and after.opname == "LOAD_CONST" and isinstance(after.argval, str)):
            names.append(after.argval)      # the builtin itself is guarded among message's globals
        else:
            return None
    return tuple(dict.fromkeys(names))


def _frozen(value: Any) -> Hashable:
    """A key part for a value ``message`` reads. A tensor (a parameter read as
    ``self.scale``) stays itself: the trace cache guards it by metadata and feeds the one
    found at the same place of the next call's key, so the trace is reused and reads the
    current parameter. So does a module (``self.lin(edge_attr)``): the trace cache
    snapshots a torch or PyG module's settings and submodules and feeds its parameters
    the same way (a module class of the user's own is not cached)."""
    if isinstance(value, _SCALARS):
        return type(value), value
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return value        # a library module (``self.lin``) the trace cache snapshots, else refuses
    if isinstance(value, (tuple, list)):
        return type(value), tuple(_frozen(v) for v in value)
    return _Unguardable()


def _layer_state(bound: tuple[Any, ...], message: types.FunctionType, depth: int = 0) -> Hashable:
    """The values of the ``self.<attr>`` (``cls.<attr>`` for a classmethod) ``message``
    reads (part of the key); nothing for a staticmethod. A method of the same object it
    calls (GeneralConv's ``self.message_basic(...)``) counts by its code, guarded globals
    and the attributes it reads in turn."""
    if not bound:
        return ()
    names = _self_attributes(message.__code__)
    if names is None or depth > 8 or any(name in message.__globals__ for name in _PROBES
                                         if name in _global_names(message.__code__)):
        return _Unguardable()       # a hasattr of the module's own could read anything of self
    state = []
    for name in names:
        value = getattr(bound[0], name, _ABSENT)
        if value is _ABSENT:
            state.append((name, "absent"))      # ``hasattr`` False: not the same as an attribute set to None
        elif isinstance(value, types.MethodType) and value.__self__ is bound[0] and \
                type(value.__func__) is types.FunctionType:
            state.append((name, _library_view(value.__func__), _layer_state(bound, value.__func__, depth + 1)))
        else:
            state.append((name, _frozen(value)))
    return tuple(state)


_ABSENT = object()


# --- argument collection (PyG's ``_collect``, symbolically) ------------------------------
class _Arguments:
    """The tensors a traced ``message`` reads, as program input tables, and what it is
    called with."""

    def __init__(self) -> None:
        self.nodes: dict[str, torch.Tensor] = {}     # program input name -> [N, ...] tensor
        self.edges: dict[str, torch.Tensor] = {}     # edge input name -> [E, ...] tensor
        self.gathers: dict[str, tuple[str, str]] = {}  # message param -> (node input, by)
        self.edge_params: dict[str, str] = {}        # message param -> edge input
        self.other: dict[str, Any] = {}              # message param -> value as PyG passes it


def _node_rows(layer: PyGMessagePassing, name: str, tensor: torch.Tensor) -> int:
    """Rows of a ``*_i``/``*_j`` tensor, when ``node_dim`` is its leading axis."""
    dim = layer.node_dim + tensor.dim() if layer.node_dim < 0 else layer.node_dim
    if tensor.dim() == 0 or dim != 0:
        raise NotCompilable(f"`{name}` has shape {list(tensor.shape)} and node_dim={layer.node_dim} selects "
                            "a non-leading axis (batched node features)")
    return tensor.shape[0]


def _set_size(layer: PyGMessagePassing, size: list[int | None], side: int, name: str,
              tensor: torch.Tensor) -> None:
    rows = _node_rows(layer, name, tensor)
    if size[side] is None:
        size[side] = rows
    elif size[side] != rows:
        raise ValueError(f"Encountered tensor with size {rows} in dimension {layer.node_dim}, "
                         f"but expected size {size[side]}.")


def _collect(layer: PyGMessagePassing, params: list[str], kwargs: Mapping[str, Any],
             size: list[int | None], num_edges: int, pairs_by_flow: bool) -> _Arguments:
    """Which program input each ``message`` parameter reads, filling ``size`` from the
    ``*_i``/``*_j`` tensors the way the ``propagate`` PyG runs collects them. The two
    read a pair differently: PyG's template-generated one (what it installs on a class
    whose ``propagate`` call it can parse from the source) as (source rows, target rows)
    whatever the flow; its generic one (``pairs_by_flow``: where PyG could not build the
    template -- a call passing ``**kwargs`` or a positional ``size``, an unannotated
    ``ptr``, a class without readable source) ``x_j`` from ``x[j]``, which is ``x[1]``
    under ``flow='target_to_source'``."""
    i, j = (1, 0) if layer.flow == "source_to_target" else (0, 1)
    args = _Arguments()
    for param in params:
        if param in PyGMessagePassing.special_args:
            continue
        if param[-2:] not in ("_i", "_j"):
            if param not in kwargs:
                continue    # message's default applies (or PyG's "required" error, eagerly)
            value = kwargs[param]
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == num_edges:
                args.edges[param] = value
                args.edge_params[param] = param
            else:
                args.other[param] = value
            continue
        base, side = param[:-2], (j if param[-2:] == "_j" else i)
        if base not in kwargs:
            continue
        data, key, slot = kwargs[base], base, side
        if isinstance(data, (tuple, list)):
            if len(data) != 2:
                raise NotCompilable(f"`{base}` is a sequence of {len(data)}; PyG takes a (source, target) pair")
            slot = side if pairs_by_flow else 0 if param[-2:] == "_j" else 1
            if isinstance(data[1 - slot], torch.Tensor):
                _set_size(layer, size, 1 - slot, base, data[1 - slot])
            key, data = f"{base}/{slot}", data[slot]
        if isinstance(data, torch.Tensor):
            _set_size(layer, size, slot, base, data)
            args.nodes[key] = data
            args.gathers[param] = (key, "src" if side == j else "dst")
        else:
            args.other[param] = data
    return args


def _aggregation(layer: PyGMessagePassing) -> str:
    if "aggregate" in vars(layer):     # PyG's propagate calls self.aggregate: the instance's
        raise NotCompilable(f"aggregate() is set on the instance ({vars(layer)['aggregate']!r})")
    own = type(layer).aggregate
    if own is not PyGMessagePassing.aggregate:
        # named by its code object: inspect's source lookup raised OSError for a class
        # exec'd from a string (PyG runs such a layer), which crashed the call
        code = getattr(own, "__code__", None)
        where = f" (line {code.co_firstlineno} of {code.co_filename})" if code is not None else ""
        raise NotCompilable(f"{type(layer).__name__} overrides aggregate(){where}")
    op = AGGREGATIONS.get(type(layer.aggr_module))
    if op is None:
        raise NotCompilable(f"aggr={layer.aggr!r} (only 'add'/'sum', 'mean', 'max', 'min' and 'softmax' compile)")
    _check_aggregation_call(layer.aggr_module)
    return op


def _check_aggregation_call(aggr: torch.nn.Module) -> None:
    """Refuse what PyG's ``self.aggr_module(inputs, index, ...)`` call would run beside
    the aggregation the program computes: a hook registered on the module (or on every
    module, ``torch.nn.modules.module.register_module_forward_hook``) or a method set on
    the instance (``forward``, ``reduce``). The compiled call never calls the module, so
    a hook that scales or records its output ran in PyG alone (3x off, with no warning)."""
    own, every = registered_hooks(aggr)
    if own:
        raise NotCompilable(f"{type(aggr).__name__} (the layer's aggr_module) has {', '.join(own)} registered, "
                            "which PyG's call of it runs and the compiled aggregation would not")
    if every:
        raise NotCompilable(f"global module {', '.join(every)} are registered (torch.nn.modules.module."
                            "register_module_*_hook), which PyG's call of the aggregation module runs and the "
                            "compiled aggregation would not")
    # a method set on the instance replaces its class's for PyG's call (forward, or the
    # reduce that Sum/Mean/Max/Min/SoftmaxAggregation.forward calls: one tripling its
    # result left the output 18.8 off PyG's, with no warning)
    shadowing = [name for name, value in vars(aggr).items() if callable(value) and hasattr(type(aggr), name)]
    if shadowing:
        raise NotCompilable(f"{type(aggr).__name__} (the layer's aggr_module) has {', '.join(shadowing)} set on "
                            "the instance")


def _check_layer(layer: PyGMessagePassing, edge_index: Any) -> None:
    if layer.explain:
        raise NotCompilable("explain mode")
    if layer.decomposed_layers != 1:
        raise NotCompilable(f"decomposed_layers={layer.decomposed_layers}")
    hooks = [name for name, table in vars(layer).items()
             if name.endswith("_hooks") and name.startswith(("_propagate", "_message", "_aggregate")) and table]
    if hooks:
        raise NotCompilable(f"registered hooks ({', '.join(sorted(hooks))})")
    if not isinstance(edge_index, torch.Tensor) or edge_index.layout is not torch.strided:
        raise NotCompilable(f"edge_index given as {type(edge_index).__name__} "
                            f"({getattr(edge_index, 'layout', 'sparse')}); pass a [2, E] tensor to compile")
    if isinstance(edge_index, EdgeIndex):
        _check_sorted_edge_index(layer, edge_index)
    if torch.is_autocast_enabled(edge_index.device.type):
        # message's matmuls would be traced in the inputs' dtype: PyG's autocast run gives
        # other numbers, in another dtype (a Linear in message: float32 where PyG has bfloat16)
        raise NotCompilable(f"torch.autocast is enabled on {edge_index.device.type}")


def _check_sorted_edge_index(layer: PyGMessagePassing, edge_index: EdgeIndex) -> None:
    """Refuse what PyG does differently for an ``EdgeIndex`` sorted by its target side:
    with ``SUPPORTS_FUSED_EDGE_INDEX`` it calls the layer's ``message_and_aggregate``
    instead of ``message`` (sorted by column), and it passes ``message`` the sorted
    side's pointer as ``ptr`` where the trace passes None -- either silently took the
    other path (2x off for a layer whose two paths differ)."""
    if layer.fuse and layer.SUPPORTS_FUSED_EDGE_INDEX and edge_index.is_sorted_by_col:
        raise NotCompilable("an EdgeIndex sorted by column, which PyG hands to message_and_aggregate "
                            "(SUPPORTS_FUSED_EDGE_INDEX)")
    by_target = edge_index.is_sorted_by_col if layer.flow == "source_to_target" else edge_index.is_sorted_by_row
    if by_target and _takes_ptr(_message(layer)[0]):
        raise NotCompilable("message() takes ptr, which PyG sets from an EdgeIndex sorted by target")


@functools.lru_cache(maxsize=256)
def _takes_ptr(message: types.FunctionType) -> bool:
    return "ptr" in inspect.signature(message).parameters


def _graph(layer: PyGMessagePassing, edge_index: torch.Tensor, num_nodes: int) -> Graph:
    if isinstance(edge_index, EdgeIndex):
        edge_index = edge_index.as_tensor()
    if layer.flow == "source_to_target":
        return Graph.coerce(edge_index, num_nodes)
    return Graph.coerce(edge_index, num_nodes).cached("reversed", Graph.reverse)   # edge ids kept


# --- tracing -------------------------------------------------------------------------
def trace_message(layer: PyGMessagePassing, args: _Arguments, op: str, size: list[int | None],
                  symbolic: bool) -> Tracer:
    """Trace ``layer.message`` on symbolic rows into a program whose output ``out`` is the
    messages reduced with ``op`` into each target vertex. ``symbolic``: the known counts
    of ``size`` reach ``message`` (``size_i``, ``size_j``, ``dim_size``) as symbolic
    vertex counts (`RowCount`), which the traced ``softmax`` ignores and any use as a
    number refuses, so the trace serves graphs of every size."""
    message, bound = _message(layer)
    tracer = Tracer(message, "message")
    values: dict[str, Any] = dict(args.other)
    for param, (key, by) in args.gathers.items():
        x = tracer.input(key, Residency.NODE, args.nodes[key], 1)
        values[param] = SymTensor(tracer, tracer.program.add("broadcast", x.value, by=by), 1)
    for param, key in args.edge_params.items():
        values[param] = tracer.input(f"e.{key}", Residency.EDGE, args.edges[key], 1)
        # PyG passes message() the tensor given to propagate(), which an in-place op
        # writes (the x_i/x_j gathers are copies): refused, so PyG's eager run does it
        values[param].caller_table = f"message()'s argument {param!r}"
    i = 1 if layer.flow == "source_to_target" else 0
    if symbolic:        # None stays None: PyG passes size_i=None where no count is known
        size = [None if s is None else RowCount(tracer, "vertex") for s in size]
    size_i = size[i] if size[i] is not None else size[1 - i]
    values.update(index=TARGET_INDEX, edge_index_i=_Marker("edge_index_i", target=True),
                  edge_index_j=_Marker("edge_index_j"),
                  edge_index=_Marker("edge_index"), adj_t=None, ptr=None, size=list(size), size_i=size_i,
                  size_j=size[1 - i] if size[1 - i] is not None else size[i], dim_size=size_i)
    call = layer.inspector.collect_param_data("message", values)
    traced = _with_softmax(message, tracer)
    # through Tracer.call, as the other front ends run user code: an error message() itself
    # catches, and a value traced under torch.no_grad() inside it, are refused (then PyG's
    # eager run takes over, with a warning) rather than compiled as the trace saw them
    with _attribute_writes_checked(layer, message), _in_place_writes_checked(layer, message), \
            _hook_writes_checked(layer):
        out = tracer.call(lambda: traced(*bound, **call))
    if not isinstance(out, SymTensor) or out.value.residency not in EDGE_ROWED:
        what = out.value.residency.name if isinstance(out, SymTensor) else type(out).__name__
        raise tracer.error(f"message() must return one tensor with a row per edge, got {what}")
    if op == "mean" and not out.value.dtype.is_floating_point:
        # PyG divides the integer sum by the count (true division: a float mean); the
        # graph Reduce keeps the messages' dtype and would round every mean down
        raise NotCompilable(f"aggr='mean' over {out.value.dtype} messages (PyG's mean of integers is a float)")
    if op == "softmax":
        out = _softmax_aggregate(tracer, layer.aggr_module, out)
    rank = len(out.value.shape) + 1
    if (layer.node_dim + rank if layer.node_dim < 0 else layer.node_dim) != 0:
        raise NotCompilable(f"node_dim={layer.node_dim} does not aggregate message's leading (edge) axis")
    reduce = "sum" if op == "softmax" else op
    tracer.program.output("out", tracer.program.add("reduce", out.value, op=reduce, by="dst"))
    # PyG applies lin(x_j) per edge: a moved product's unread NaN rows must not reach lin's gradient
    mask_unread_rows_of_gathered_products(tracer.program)
    return tracer


def _check_captured(captured: Mapping[str, torch.Tensor], num_edges: int, num_nodes: int) -> None:
    """Refuse a tensor ``message`` read from outside its arguments that may be graph data
    (the tracer would take it for one value shared by every row). Checked on every call,
    the trace serving graphs of every size: a tensor that was no graph's size when traced
    may be this graph's."""
    for tensor in captured.values():
        # a parameter is a weight, whatever its row count: TransformerConv's lin_edge weight
        # [heads * out, edge_dim] on a graph of heads * out edges ran PyG's propagate
        if tensor.dim() and tensor.shape[0] in (num_edges, num_nodes) and not isinstance(tensor, torch.nn.Parameter):
            raise NotCompilable(f"message() reads a tensor of shape {list(tensor.shape)} that was not passed "
                                "to propagate(); with one row per edge or node it may be graph data, which "
                                "compiles only when passed to propagate() as a keyword argument")


def _refuse_rebinding(message: types.FunctionType) -> None:
    """Refuse a ``message`` that rebinds a global (``global step; step += 1``) or a
    variable of an enclosing function (``nonlocal``), naming the line: it is traced with
    copies of its globals and closure cells (`_with_softmax`), so the write never reached
    the variable, and every call computed with its first value (a counter's 1x, 1x, 1x of
    the messages where PyG gave 1x, 2x, 3x)."""
    written = outside_writes(message.__code__)
    if written:
        kind, name, line = written[0]
        text = linecache.getline(message.__code__.co_filename, line).strip()
        raise NotCompilable(f"message() rebinds {kind} {name!r}, which a compiled call would not update (its "
                            f"trace runs with a copy)\n  at {message.__code__.co_filename}:{line}: {text}")


@contextlib.contextmanager
def _attribute_writes_checked(layer: PyGMessagePassing, message: types.FunctionType) -> Iterator[None]:
    """Refuse a ``message`` that stores anything on the layer (PyG's TransformerConv keeps
    its attention weights in ``self._alpha`` for ``forward`` to return), also into a list,
    dict, set or plain object the layer holds (``self.kept.append(alpha)``; also one nested
    in another, `kept_traced.containers_within`) or that
    ``message`` reads as a global or closure variable (``KEPT.append(alpha)``): a compiled
    call runs ``message`` once, symbolically, when it traces, so the layer would hold a
    traced value and never follow later calls. The layer's attributes, and the contents
    of those it holds, are restored either way. A class may name attributes its
    ``message`` writes as scratch that ``forward`` does not read on a compiled call
    (``_gnnfuse_scratch_attributes``); they are restored silently. Of a submodule, the
    containers it holds are checked so too, and its attributes for a traced value, as are
    the globals ``message``'s helpers may rebind (`_traced_write_tables`): there the
    tracer's symbolic value was left, with no warning."""
    tables = (vars(layer), layer._parameters, layer._buffers, layer._modules)
    before = [dict(table) for table in tables]
    reachable = {f"self.{name}": value for name, value in before[0].items()}
    watched = _traced_write_tables(layer, message)
    reachable.update((f"{prefix}{name}", value) for prefix, table, _ in watched if prefix.startswith("self.")
                     for name, value in table.items() if name not in _MODULE_TABLES)
    reachable.update(_outside_values(message))
    held = containers_within(list(reachable.items()))
    try:
        yield
    finally:
        written = []
        for table, old in zip(tables, before):
            written += [name for name in table if name not in old or table[name] is not old[name]]
            written += [name for name in old if name not in table]
            table.clear()
            table.update(old)
        filled = []
        for name, value, kept, nested in held:
            if not same_contents(contents(value), kept):
                filled.append(f"a container in {name}" if nested else name)
                restore(value, kept)
        leaked = _traced_writes_restored(watched)
    scratch = set(getattr(type(layer), "_gnnfuse_scratch_attributes", ()))
    unexpected = [f"self.{name}" for name in sorted(set(written) - scratch)] + leaked
    if unexpected or filled:
        what = [f"sets {', '.join(unexpected)}"] if unexpected else []
        what += [f"writes into {', '.join(filled)}"] if filled else []
        raise NotCompilable(f"message() {' and '.join(what)}; a compiled call runs message() once, when it "
                            "traces, so what it stores would not follow later calls")


@contextlib.contextmanager
def _in_place_writes_checked(layer: PyGMessagePassing, message: types.FunctionType) -> Iterator[None]:
    """Keep the trace of a ``message`` that writes a tensor it reaches in place -- a
    buffer of the layer (``self.count.add_(1)``), a parameter under ``torch.no_grad()``, a
    tensor in a list the layer holds (``self.stats[0].add_(1)``), a global or closure
    tensor, a spectral-normed Linear's power-iteration vectors -- from serving later
    calls (`TraceCache.side_effects`): a kept trace ran ``message`` once, so the write
    happened once and never again (a counter's messages 1x, 1x, 1x where PyG's were 1x,
    2x, 3x). Traced on every call, the write happens once per call, as in PyG, and the
    program reads the tensor as written. Where the trace fails, every tensor written is
    put back, or PyG's eager run would write it a second time on the same call (a
    BatchNorm in ``message``: ``num_batches_tracked`` counts before its batch_norm fails
    the trace). Found by torch's version counter, which every in-place op bumps (a write
    through ``.data`` is not seen), or for an inference tensor (made under
    ``torch.inference_mode``), which has none, by its values. Tensors are copied only
    here, at trace time."""
    held: dict[int, tuple[torch.Tensor, int | None, torch.Tensor]] = {}
    with torch.no_grad():
        for tensor in _tensors_reached(layer, message):
            if id(tensor) not in held and not isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin):
                held[id(tensor)] = (tensor, None if tensor.is_inference() else tensor._version, tensor.clone())
    traced = False
    try:
        yield
        traced = True
    finally:
        written = [(tensor, copy) for tensor, version, copy in held.values()
                   if (tensor._version != version if version is not None else changed_values(tensor, copy))]
        if written and not traced:
            with torch.no_grad():
                for tensor, copy in written:
                    tensor.copy_(copy)
    if written:
        _TRACES.side_effects = True


@contextlib.contextmanager
def _hook_writes_checked(layer: PyGMessagePassing) -> Iterator[None]:
    """Refuse a trace in which a forward hook (or pre-hook) of a module ``message`` calls
    stored what it was given where it outlives the trace (``rec.append(out)`` into a list
    it closes over, a global): the hook runs while tracing, on the tracer's symbolic
    values, so the compiled call left gnnfuse's SymTensor there, not PyG's tensor, with no
    warning. Hooks that only compute (scaling the output) trace as they run. Those of the
    layer's submodules are watched (one registered for every module is refused earlier,
    `_check_aggregation_call`); what they wrote is put back either way (`KeptTraced`)."""
    hooks = [hook for path, module in layer.named_modules() if path
             for table in (module._forward_pre_hooks, module._forward_hooks) for hook in table.values()]
    kept = KeptTraced(tuple(hooks)) if hooks else None
    stored = None
    try:
        yield
    finally:
        if kept is not None:
            try:
                kept.check()
            except CompileError as error:
                stored = error
    if stored is not None:
        raise NotCompilable(f"a forward hook of a module message() calls: {stored}")


def _tensors_reached(layer: PyGMessagePassing, message: types.FunctionType) -> Iterator[torch.Tensor]:
    """The tensors ``message`` may write in place: the parameters, buffers and tensor
    attributes of the layer and its submodules, the globals and closure variables
    ``message`` reads, and the tensors directly inside a list, tuple, dict or plain
    object held in any of those places."""
    for _, module in layer.named_modules():
        for name, value in (*module._parameters.items(), *module._buffers.items(), *vars(module).items()):
            if name not in _MODULE_TABLES:      # torch's own tables (their tensors are listed first)
                yield from _tensors_in(value)
    for _, value in _outside_values(message):
        yield from _tensors_in(value)


def _outside_values(message: types.FunctionType) -> list[tuple[str, Any]]:
    """(name, value) of each global ``message`` reads and each of its closure variables."""
    code, names = message.__code__, message.__globals__
    cells = map(_filled, message.__closure__ or ())
    return [*((name, names[name]) for name in _global_names(code) if name in names),
            *((name, cell.cell_contents) for name, cell in zip(code.co_freevars, cells))]


def _tensors_in(value: Any) -> list[torch.Tensor]:
    """``value`` if it is a tensor, else the tensors directly inside it (`contents`, or a tuple's items)."""
    if isinstance(value, torch.Tensor):
        return [value]
    items = list(value) if isinstance(value, tuple) else contents(value) or ()
    return [item for item in items if isinstance(item, torch.Tensor)]


# torch's own tables of a module (parameters, buffers, submodules, hooks): a lazy module's
# first call writes them (LazyLinear drops its initialising hook), and restoring them broke it
_MODULE_TABLES = frozenset(vars(torch.nn.Module()))


def _traced_write_tables(layer: PyGMessagePassing, message: types.FunctionType
                         ) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Where ``message`` may store a traced value that the layer check of
    `_attribute_writes_checked` does not see, each as (the prefix naming its entries, the
    table, a copy of it now): a submodule's attributes (``self.store.alpha = alpha``) and
    the globals of ``message``'s module and of the user's functions and modules it reads
    by a global name (a helper's ``global last; last = alpha``, called as ``keep(alpha)``
    or ``helpers.keep(alpha)``; not torch's or PyG's, whose namespaces are large)."""
    tables = [(f"self.{path}.", vars(module)) for path, module in layer.named_modules() if path]
    values = [message.__globals__.get(name) for name in _global_names(message.__code__)]
    namespaces = {id(namespace): namespace for namespace in [message.__globals__] + [
        namespace for value in values for namespace in [_user_namespace(value)] if namespace is not None]}
    tables += [(f"global {namespace.get('__name__')}.", namespace) for namespace in namespaces.values()]
    return [(prefix, table, dict(table)) for prefix, table in tables]


def _user_namespace(value: Any) -> dict[str, Any] | None:
    """The globals a user's function or module writes to; None for anything else, and
    for torch's, PyG's and the other libraries' (large, and no user state)."""
    if isinstance(value, types.FunctionType):
        owner, namespace = value.__module__, value.__globals__
    elif isinstance(value, types.ModuleType):
        owner, namespace = value.__name__, vars(value)
    else:
        return None
    return None if from_library(owner) else namespace


def _traced_writes_restored(tables: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[str]:
    """The entries of each table (`_traced_write_tables`) rebound to a traced value or a
    container holding one, each put back as it was (or removed). A rebinding to anything
    else is left: a torch hook's (the deprecated ``weight_norm`` sets its module's
    ``weight`` tensor), a helper's counter (called on every call, as the trace of such a
    ``message`` is not kept)."""
    leaked = []
    for prefix, table, old in tables:
        for name in [name for name, value in table.items() if old.get(name, _ABSENT) is not value
                     and holds_traced(value)]:
            leaked.append(prefix + name)
            if name in old:
                table[name] = old[name]
            else:
                del table[name]
    return leaked


def _softmax_aggregate(tracer: Tracer, aggr: SoftmaxAggregation, x: SymTensor) -> SymTensor:
    """PyG's SoftmaxAggregation before its final sum: ``x * softmax(x * t)`` over each
    target's in-edges (the softmax held constant for gradients with ``semi_grad``)."""
    if aggr.channels != 1 and len(x.value.shape) != 1:
        raise NotCompilable(f"SoftmaxAggregation(channels={aggr.channels}) takes [E, channels] messages")
    # ``x * t`` as torch computes it: a Python float ``t`` takes the messages' dtype (applied
    # to a bare constant it was a float32 one, 1.4e-8 off PyG's float64 output at t=0.3)
    alpha = x if isinstance(aggr.t, (int, float)) and aggr.t == 1 else x * aggr.t
    alpha = tracer.program.add("edge_softmax", alpha.value, by="dst")
    if not aggr.learn and aggr.semi_grad:
        alpha = tracer.program.add("stop_gradient", alpha)
    return x * SymTensor(tracer, alpha, 1)


def _aggregation_state(layer: PyGMessagePassing) -> Hashable:
    """The aggregation module's settings a trace bakes in. A learnt temperature is a
    captured parameter instead: it stays a tensor here, which the trace cache guards by
    its metadata and feeds from this place of the next call's key (without it here the
    cache could not find it, and every call traced afresh)."""
    aggr = layer.aggr_module
    if isinstance(aggr, SoftmaxAggregation):
        return aggr.learn, aggr.semi_grad, aggr.channels, aggr.t
    return ()


def _function(method: Any) -> types.FunctionType:
    fn = getattr(method, "__func__", method)
    if not isinstance(fn, types.FunctionType):
        raise NotCompilable(f"message is a {type(fn).__name__}, not a Python function")
    return fn


def _message(layer: PyGMessagePassing) -> tuple[types.FunctionType, tuple[Any, ...]]:
    """``message``'s function and what ``layer.message(...)`` (PyG's call) binds before
    the arguments: the layer, its class for a classmethod (``cls.scale`` is the class's
    attribute, not an instance's of the same name), nothing for a staticmethod. A
    ``message`` set on the instance is the one PyG calls: a bound method binds its own
    object, a plain function nothing."""
    own = vars(layer).get("message")
    if isinstance(own, types.MethodType):
        return _function(own.__func__), (own.__self__,)
    if own is not None:
        return _function(own), ()
    raw = inspect.getattr_static(type(layer), "message")
    if isinstance(raw, staticmethod):
        return _function(raw.__func__), ()
    if isinstance(raw, classmethod):
        return _function(raw.__func__), (type(layer),)
    return _function(type(layer).message), (layer,)


def _trace_failure(layer: PyGMessagePassing, exc: Exception) -> NotCompilable:
    """Why tracing failed, naming the line of ``message`` where it did."""
    if isinstance(exc, CompileError):
        return NotCompilable(str(exc))
    code = _message(layer)[0].__code__
    lines = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == code.co_filename]
    where = f" at {lines[-1].filename}:{lines[-1].lineno}: {lines[-1].line}" if lines else ""
    return NotCompilable(f"tracing message() raised {type(exc).__name__}: {exc}{where}")


_TRACES = TraceCache()


_SIZES = frozenset({"size", "size_i", "size_j", "dim_size"})
# code of the messages whose trace needed the vertex counts as numbers (`compiled_propagate`)
_NUMERIC_SIZES: set[types.CodeType] = set()


def _trace(layer: PyGMessagePassing, args: _Arguments, op: str, guards: tuple, size: list[int | None],
           symbolic: bool) -> tuple[Any, dict[str, torch.Tensor]]:
    """The compiled program and captured tensors for ``message`` (`trace_message`), from
    the trace cache where it holds them; any failure raised as `NotCompilable`."""
    try:
        return _TRACES.compiled(guards, (args.nodes, args.edges), lambda: trace_message(
            layer, args, op, size, symbolic))
    except NotCompilable:
        raise
    except Exception as exc:     # the eager run will raise the user's own error, if it is one
        raise _trace_failure(layer, exc) from exc


def compiled_propagate(layer: PyGMessagePassing, edge_index: Any, size: Any, kwargs: Mapping[str, Any],
                       pairs_by_flow: bool) -> Any:
    """``layer.propagate(edge_index, size, **kwargs)`` with ``message`` and the aggregation
    compiled; raises `NotCompilable` when it must run eagerly instead. ``pairs_by_flow``:
    PyG would run its generic ``propagate`` for this class, not a template-generated one
    (they read an ``(x_src, x_dst)`` pair differently under target_to_source, `_collect`)."""
    if torch._C._get_tracing_state() is not None:
        raise NotCompilable("called under torch.jit.trace, which records only torch ops (gnnfuse's kernels run "
                            "outside it); PyG's eager propagate is what a traced replay can run")
    if functorch_interpreter() is not None:
        # the program's kernels read raw memory and its backward is an autograd.Function,
        # neither of which a transform's wrapped or batched tensors allow (it raised
        # FunctorchTransformError); PyG's torch ops are what the transform can follow
        raise NotCompilable("called inside a torch.func transform (grad, vmap, jacrev, ...), which gnnfuse's "
                            "kernels cannot follow")
    _check_layer(layer, edge_index)
    op = _aggregation(layer)
    mutable_size = layer._check_input(edge_index, size)
    num_edges = edge_index.shape[1]
    message, bound = _message(layer)
    _refuse_rebinding(message)
    params = layer.inspector.get_param_names("message")
    args = _collect(layer, params, kwargs, mutable_size, num_edges, pairs_by_flow)
    known = [int(s) for s in mutable_size if s is not None]     # 0-dim tensors (size=torch.tensor([4, 4])) too
    if len(set(known)) > 1:
        raise NotCompilable(f"bipartite message passing (size {mutable_size})")
    i = 1 if layer.flow == "source_to_target" else 0
    # Without node tensors PyG sizes the output by the largest target; the graph must
    # still hold every source.
    num_nodes = known[0] if known else (int(edge_index.max()) + 1 if num_edges else 0)
    rows = known[0] if known else (int(edge_index[i].max()) + 1 if num_edges else 0)
    other = tuple((k, _frozen(v) if not isinstance(v, torch.Tensor) else _Unguardable())
                  for k, v in args.other.items())
    guards = (_library_view(message), _layer_state(bound, message), other, op, _aggregation_state(layer),
              layer.flow, layer.node_dim, tuple(args.gathers.items()))
    # The vertex count is part of the key only where message reads it as a number: a
    # sampled mini-batch has another count every batch, and each traced afresh.
    sized = not _SIZES.isdisjoint(params)
    numeric = sized and ("size" in params or message.__code__ in _NUMERIC_SIZES)
    guards += (tuple(s is not None for s in mutable_size),)      # which counts message gets as None
    try:
        compiled, captured = _trace(layer, args, op, guards + (num_nodes if numeric else None,),
                                    mutable_size, not numeric)
    except NotCompilable:
        if not sized or numeric:
            raise
        # size_i / size_j / dim_size used as a number (or the trace failed anyway): traced
        # with the counts from now on, one trace per vertex count
        _NUMERIC_SIZES.add(message.__code__)
        compiled, captured = _trace(layer, args, op, guards + (num_nodes,), mutable_size, False)
    _check_captured(captured, num_edges, num_nodes)
    try:
        graph = _graph(layer, edge_index, num_nodes)
    except ValueError as error:
        if None not in mutable_size or not known:
            raise
        # the node tensors gave one side's count only (x_i alone: the targets); PyG never
        # bounds the other side's ids by it, so a bipartite edge_index runs there (the
        # graph is checked once per edge_index and count, so this costs a cached call nothing)
        raise NotCompilable(f"bipartite message passing: the node tensors give one side {num_nodes} vertices "
                            f"(size {mutable_size}) and edge_index has ids beyond them ({error})") from None
    out = compiled(graph, program_feeds((args.nodes, args.edges), captured))["out"]
    own_update = type(layer).update is not PyGMessagePassing.update or "update" in vars(layer)
    if own_update and read_back_by_backward(out):
        # the backward reads the aggregate back (a softmax aggregation's does), and an
        # update() (the class's, or one set on the instance, which PyG calls) may write it
        # in place (``aggr_out += x``), which PyG's backward survives
        out = out.clone()
    out = out[:rows]
    update_args = set(layer.inspector.get_param_names("update"))
    collected = layer._collect(update_args - PyGMessagePassing.special_args, edge_index, mutable_size, kwargs)
    # PyG's `_collect` holds inspect.Parameter.empty for a parameter propagate() was not
    # given; PyG's template-generated propagate passes its default instead (a missing one
    # without a default is the inspector's "Parameter 'h' is required"). Passed on, the
    # placeholder (a class, so truthy) read as a set flag: ``normalize: bool = False`` normalised
    collected = {name: value for name, value in collected.items() if value is not inspect.Parameter.empty}
    return layer.update(out, **layer.inspector.collect_param_data("update", collected))
