"""`to_hetero`: PyG's ``to_hetero`` for models built from gnnfuse layers.

PyG's ``torch_geometric.nn.to_hetero`` copies each message-passing layer once per edge type
and sums the copies' outputs per destination type, but it recognises a layer as message
passing only when it is a ``torch_geometric.nn.MessagePassing``. gnnfuse's layers are not
(PyG stays optional), so PyG's transformer treats them as plain per-edge-type functions:
the outputs stay keyed by edge type and the next layer reads the wrong node type's rows.
This function is PyG's, called with each gnnfuse layer standing in a thin PyG
``MessagePassing`` shell while PyG rewrites the model; the shells are removed afterwards,
so the result holds the gnnfuse layers themselves, under the same names and parameter
layout as PyG's result (``conv1.author__writes__paper.lin_l.weight``), and a PyG
state dict loads into it. Switching is changing one import::

    from gnnfuse.nn import SAGEConv, to_hetero   # was: from torch_geometric.nn import ...
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn

from ..graph.hetero import check_metadata
from .hetero_conv import refuse_shared_keys


def to_hetero(module: nn.Module, metadata: tuple[list[str], list[tuple[str, str, str]]],
              aggr: str = "sum", input_map: dict[str, str] | None = None,
              debug: bool = False) -> torch.fx.GraphModule:
    """Convert a homogeneous model into its heterogeneous equivalent, as
    ``torch_geometric.nn.to_hetero`` does, with gnnfuse's layers treated as the message-passing
    layers they are. Arguments and result are PyG's; PyG must be installed."""
    try:
        from torch_geometric.nn import to_hetero as pyg_to_hetero
    except ImportError as exc:    # pragma: no cover - exercised only without PyG installed
        raise ImportError("gnnfuse.nn.to_hetero rewrites the model with PyG's to_hetero and needs "
                          "torch_geometric: pip install torch_geometric") from exc
    check_metadata(metadata, "to_hetero")
    refuse_shared_keys([tuple(t) for t in metadata[1]], "__".join, "to_hetero")   # PyG's per-relation key
    shells = _shell_layers(module)
    try:
        converted = pyg_to_hetero(module, metadata, aggr=aggr, input_map=input_map, debug=debug)
    finally:
        for parent, name, layer in shells:
            setattr(parent, name, layer)
    layer_names = _unshell(converted)
    _check_inputs(converted, layer_names, metadata[1])
    _combine_early(converted, layer_names)
    return converted


def _layer_classes() -> tuple[type, ...]:
    """gnnfuse.nn's message-passing layers: those whose ``forward`` takes ``edge_index``
    (the layers PyG's ``to_hetero`` copies per edge type; the dict-taking HGTConv and
    HeteroConv are heterogeneous already)."""
    from .. import nn as gnnfuse_nn
    classes = []
    for name in gnnfuse_nn.__all__:
        layer = getattr(gnnfuse_nn, name)
        if (isinstance(layer, type) and issubclass(layer, nn.Module)
                and "edge_index" in inspect.signature(layer.forward).parameters):
            classes.append(layer)
    return tuple(classes)


# The containers through which PyG's tracer reaches a layer as a call of its own: it traces
# into ``Sequential``, and a layer taken from a ``ModuleList`` or ``ModuleDict`` is called
# directly. (A layer inside any other submodule is part of that submodule's call.)
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _shell_layers(module: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """Put every gnnfuse layer that PyG's tracer will see as one call (a child of the model,
    or held in nested containers, `_CONTAINERS`) into a shell; return where each was, to
    put it back. A layer left unshelled is a plain function to PyG: its outputs stay keyed
    by edge type, and the next layer reads another type's rows. Every name a layer is held
    under gets the layer's one shell (``named_children`` lists a module once, so a layer
    held twice, its weights shared by two calls, kept its second name unshelled)."""
    classes, shell = _layer_classes(), _shell_class()
    placed: list[tuple[nn.Module, str, nn.Module]] = []
    shells: dict[int, nn.Module] = {}

    def visit(parent: nn.Module) -> None:
        for name, child in list(parent._modules.items()):
            if isinstance(child, classes):
                setattr(parent, name, shells.setdefault(id(child), shell(child)))
                placed.append((parent, name, child))
            elif isinstance(child, _CONTAINERS):
                visit(child)
    visit(module)
    return placed


def _unshell(converted: nn.Module) -> set[str]:
    """Replace each shell in the converted model (PyG put one copy per edge type in a
    ``ModuleDict``) by the layer it holds; return the layers' qualified names."""
    shell, names = _shell_class(), set()
    for prefix, parent in list(converted.named_modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, shell):
                setattr(parent, name, child.layer)
                names.add(f"{prefix}.{name}" if prefix else name)
    return names


def _check_inputs(converted: torch.fx.GraphModule, layer_names: set[str],
                  edge_types: list[tuple[str, str, str]]) -> None:
    """Route each relation layer's edge_index through `_given_edge_index` and its source
    rows through `_given_source_rows`, which name the edge type when the call's
    edge_index_dict or x_dict has no entry for it. PyG's forward reads the dicts with
    ``.get(key, None)``, so a missing entry reached the layer as None ("cannot make a Graph
    from NoneType", "(x_src, x_dst) must be tensors"), naming neither the type nor the dict.
    A graph edit, not a hook on the layer: the layers stay as PyG's transformer left them
    (hooks change how some are run)."""
    by_key = {"__".join(t): tuple(t) for t in edge_types}
    destinations = {t[-1] for t in edge_types}
    graph = converted.graph
    for node in list(graph.nodes):
        if node.op != "call_module" or node.target not in layer_names:
            continue
        owner, _, key = node.target.rpartition(".")
        edge_type = by_key.get(key)
        if edge_type is None:
            continue
        args, kwargs = list(node.args), dict(node.kwargs)
        edge_index = args[1] if len(args) > 1 else kwargs.get("edge_index")
        if isinstance(edge_index, torch.fx.Node):
            with graph.inserting_before(node):
                checked = graph.call_function(_given_edge_index, (edge_index, edge_type, owner))
            if len(args) > 1:
                args[1] = checked
            else:
                kwargs["edge_index"] = checked
        x = args[0] if args else kwargs.get("x")
        if isinstance(x, tuple) and len(x) == 2 and x[0] is None and edge_type[0] not in destinations:
            _refuse_unrepresented_source(edge_type, owner)
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], torch.fx.Node):
            with graph.inserting_before(node):
                rows = graph.call_function(_given_source_rows, (x[0], edge_type, owner))
            if args:
                args[0] = (rows, x[1])
            else:
                kwargs["x"] = (rows, x[1])
        node.args, node.kwargs = tuple(args), kwargs
    graph.lint()
    converted.recompile()


def _refuse_unrepresented_source(edge_type: tuple[str, str, str], layer: str) -> None:
    """Refuse a relation layer whose source rows PyG's transformer wrote as a literal None:
    its source node type has no representation there, because no edge type ends at it and
    an earlier layer dropped it from its output (PyG's transformer only warns that it is
    "not updated"). Every call then failed inside the layer, naming neither the edge type
    nor the node type ("(x_src, x_dst) must be tensors ..., got (NoneType, Tensor)"), or,
    in RGCNConv, which reads a None source as featureless input, ran on one-hot rows in
    place of the features the x_dict gave that type (PyG's RGCNConv fails there). Called
    only for a source type no edge type ends at: a None source of any other type can only
    be the model's own ``(None, x)``, which RGCNConv reads as featureless input."""
    src = edge_type[0]
    raise ValueError(f"to_hetero: the model's {layer} reads node type {src!r}, the source of edge type "
                     f"{edge_type}, but no earlier layer gives {src!r} a representation: no edge type of "
                     f"metadata[1] ends at it, so the layer before leaves it out of its output. Add an edge type "
                     f"ending at {src!r} (a reverse edge type, as torch_geometric.transforms.ToUndirected adds), "
                     f"or leave {edge_type} out of the metadata")


def _given_edge_index(edge_index: Any, edge_type: tuple[str, str, str], layer: str) -> Any:
    """``edge_index``, or the error naming the edge type it is missing for. Traced (a
    Proxy), it records its own call: a pickled or ``torch.save``d model (a GraphModule)
    is rebuilt by tracing the code generated from its graph, with globals of its own,
    which ``torch.fx.wrap``'s patch of this module's does not reach -- the call then ran
    on the Proxy and left the graph, and a missing edge type failed as "cannot make a
    Graph from NoneType" again."""
    if isinstance(edge_index, torch.fx.Proxy):
        return edge_index.tracer.create_proxy("call_function", _given_edge_index, (edge_index, edge_type, layer), {})
    if edge_index is None:
        raise ValueError(f"to_hetero: the model's {layer} got no edge_index for edge type {edge_type}, which "
                         "metadata[1] lists: the edge_index_dict has no entry for it (an edge type without "
                         "edges is a [2, 0] tensor)")
    return edge_index


torch.fx.wrap("_given_edge_index")


# The functions PyG's to_hetero combines one destination type's per-relation outputs with
# (``ToHeteroTransformer.aggrs``; 'mean' is add then div).
_COMBINERS = (torch.add, torch.max, torch.min, torch.mul, torch.div)


def _combine_early(converted: torch.fx.GraphModule, layer_names: set[str]) -> None:
    """Move each combination of per-relation outputs to just after its last operand.

    PyG's transformer emits a layer's call for every relation first and the per-type sums
    after all of them, so every relation's output is alive at once: on the ogbn-mag-sized
    graph (eight relations with reverses, 349 classes) some 7.4 GB of [N, 349] rows at the
    forward's peak. Summed as soon as both operands exist, only a type's running sum and
    the newest output are: PyG's tutorial model (bench_hetero's ``sage``) trained there in
    10.55 GB of its own instead of 13.17 (H200; PyG's to_hetero 14.05). The moved nodes
    are the pure combining functions applied to layer outputs and earlier combinations
    only, so the result is the same; nothing else moves (a random op moved would draw in
    another order). A combination does not move past another use of its operands (a
    user's ``h.relu_()`` between the layer and ``torch.div(h, 2)``: moved above it, the
    division read the values before the in-place ReLU, silently)."""
    graph = converted.graph
    combined: set[torch.fx.Node] = set()
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target in layer_names:
            combined.add(node)
        elif node.op == "call_function" and node.target in _COMBINERS:
            operands = [a for a in node.args if isinstance(a, torch.fx.Node)]
            if operands and all(a in combined for a in operands) and not node.kwargs:
                combined.add(node)
                order = {n: i for i, n in enumerate(graph.nodes)}
                last = max(operands, key=order.__getitem__)
                between = list(graph.nodes)[order[last] + 1:order[node]]
                if not any(a in n.all_input_nodes for n in between if n not in combined for a in operands):
                    last.append(node)
    graph.lint()
    converted.recompile()


@functools.cache
def _shell_class() -> type:
    """The shell: a PyG ``MessagePassing`` (so PyG's transformer copies it per edge type)
    whose call and ``reset_parameters`` are the gnnfuse layer's, and which reports the
    layer's ``add_self_loops`` (PyG refuses self-loops on bipartite edge types). Made on
    first use, PyG being optional."""
    from torch_geometric.nn import MessagePassing

    class GnnfuseLayerShell(MessagePassing):
        def __init__(self, layer: nn.Module) -> None:
            super().__init__()
            self.layer = layer
            self.add_self_loops = bool(getattr(layer, "add_self_loops", False))

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.layer(*args, **kwargs)

        def reset_parameters(self) -> None:
            self.layer.reset_parameters()

        def __repr__(self) -> str:
            return repr(self.layer)

    return GnnfuseLayerShell


def _given_source_rows(x_src: Any, edge_type: tuple[str, str, str], layer: str) -> Any:
    """``x_src``, or the error naming the node type it is missing for; traced, it records
    its own call, as `_given_edge_index` does."""
    if isinstance(x_src, torch.fx.Proxy):
        return x_src.tracer.create_proxy("call_function", _given_source_rows, (x_src, edge_type, layer), {})
    if x_src is None:
        raise ValueError(f"to_hetero: the model's {layer} got no features for node type {edge_type[0]!r}, the "
                         f"source of edge type {edge_type}, which metadata[1] lists: the x_dict has no entry "
                         "for it")
    return x_src
