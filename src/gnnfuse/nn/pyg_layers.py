"""PyG's own convolution layers with ``propagate`` compiled: ``gnnfuse.nn.TransformerConv``
is ``torch_geometric.nn.TransformerConv`` with gnnfuse's `MessagePassing` first among its
bases.

Most PyG layers are a ``message`` and an aggregation around dense code; gnnfuse's
``MessagePassing`` traces the ``message`` into one fused program and leaves the rest to
PyG, so subclassing a PyG layer behind it compiles that layer without a line of it being
rewritten here. The class *is* the PyG class (``isinstance`` holds, constructor, ``forward``,
``state_dict`` names and printed form are PyG's); a call that cannot compile (sparse
``adj_t``, bipartite sizes, an aggregation without a fused form) runs PyG's eager
``propagate`` with a one-time warning naming why. `COMPILED_PYG_LAYERS` lists the layers
whose outputs and gradients the tests compare with PyG's; `EAGER_PYG_LAYERS` those exported
the same way whose every call runs PyG's ``propagate`` (the tests check the warning and
PyG's numbers), so a model using them switches import all the same; `compiled_class` builds
the same for any other ``MessagePassing`` subclass (one from another library, say).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..derived_class import derived_class

if TYPE_CHECKING:
    from .message_passing import MessagePassing

COMPILED_PYG_LAYERS = (
    "AGNNConv", "CGConv", "ClusterGCNConv", "FAConv", "FeaStConv", "FiLMConv", "GCN2Conv", "GENConv", "GINEConv",
    "GMMConv", "GatedGraphConv", "GeneralConv", "HANConv", "HEATConv", "LEConv", "LGConv", "MFConv", "MixHopConv",
    "NNConv", "PDNConv", "PointGNNConv", "PointNetConv", "PointTransformerConv", "ResGatedGraphConv", "SSGConv",
    "SignedConv", "SimpleConv", "TransformerConv", "WLConvContinuous")

# Why each runs eagerly (the warning says it too): ARMAConv propagates [stacks, N, F] tables
# (node_dim=-2); DNAConv's attention transposes its [E, layers, F] messages; EGConv overrides
# aggregate(); HypergraphConv's propagations are bipartite (vertices to hyperedges); MeshCNNConv's
# message slices the edge axis; PNAConv's aggregation is a DegreeScalerAggregation; PPFConv's
# point-pair features need torch.cross; SuperGATConv calls PyG's softmax from a helper method.
EAGER_PYG_LAYERS = (
    "ARMAConv", "DNAConv", "EGConv", "HypergraphConv", "MeshCNNConv", "PNAConv", "PPFConv", "SuperGATConv")


_WRAPPER = ("is PyG's wrapper around another convolution, not a MessagePassing layer of its own: use "
            "torch_geometric.nn.{name} around a gnnfuse.nn layer, e.g. {example}; that layer's propagation "
            "then compiles")
_NEEDS_PYG_LIB = ("needs pyg-lib's {ops}, without which gnnfuse's tests cannot compare it with PyG's: use "
                  "torch_geometric.nn.{name}")
_CUGRAPH = "runs cugraph-ops kernels, not a MessagePassing propagate: use torch_geometric.nn.{name}"

# PyG's other convolutions: why gnnfuse.nn does not export each, and what to use instead
# (``from gnnfuse.nn import X`` raises an ImportError saying so)
NOT_EXPORTED = {
    "AntiSymmetricConv": _WRAPPER.format(name="AntiSymmetricConv",
                                         example="AntiSymmetricConv(64, phi=gnnfuse.nn.GCNConv(64, 64, bias=False))"),
    "DirGNNConv": _WRAPPER.format(name="DirGNNConv", example="DirGNNConv(gnnfuse.nn.GCNConv(64, 64))"),
    "GPSConv": _WRAPPER.format(name="GPSConv", example="GPSConv(64, gnnfuse.nn.GCNConv(64, 64))"),
    "WLConv": "is not a MessagePassing layer (it relabels discrete colours by hashing, without gradients): "
              "use torch_geometric.nn.WLConv",
    "XConv": "is not a MessagePassing layer (and needs pyg-lib's knn): use torch_geometric.nn.XConv",
    "PANConv": "propagates over a torch_sparse SparseTensor it builds itself, which gnnfuse cannot compile (its "
               "propagate would run PyG's every call): use torch_geometric.nn.PANConv",
    "SplineConv": _NEEDS_PYG_LIB.format(ops="spline_basis and spline_weighting", name="SplineConv"),
    "DynamicEdgeConv": _NEEDS_PYG_LIB.format(ops="knn", name="DynamicEdgeConv")
                       + ", or gnnfuse.nn.EdgeConv (the same message) on a k-NN edge_index you build",
    "GravNetConv": _NEEDS_PYG_LIB.format(ops="knn", name="GravNetConv"),
    "FusedGATConv": "runs DGL's fused kernels on CSR/CSC inputs: use torch_geometric.nn.FusedGATConv, or "
                    "gnnfuse.nn.GATConv with PyG's GATConv arguments (its forward takes edge_index)",
    **{name: _CUGRAPH.format(name=name) for name in ("CuGraphGATConv", "CuGraphRGCNConv", "CuGraphSAGEConv")},
}


def compiled_class(pyg_class: type) -> type:
    """``pyg_class`` (a subclass of PyG's ``MessagePassing``) with gnnfuse's compiling
    ``propagate``; one class per ``pyg_class``, kept while ``pyg_class`` is. Its layers
    pickle (`_pickled_name`) where layers of ``pyg_class`` do."""
    import torch_geometric.nn
    from torch_geometric.nn import MessagePassing as PyGMessagePassing

    from .message_passing import MessagePassing
    if not (isinstance(pyg_class, type) and issubclass(pyg_class, PyGMessagePassing)):
        name = getattr(pyg_class, "__name__", None)
        pyg_s = name in NOT_EXPORTED and getattr(torch_geometric.nn, name, None) is pyg_class
        advice = f": torch_geometric.nn.{name} {NOT_EXPORTED[name]}" if pyg_s else ""
        raise TypeError(f"compiled_class takes a subclass of torch_geometric.nn.MessagePassing, got {pyg_class!r}"
                        + advice)
    if issubclass(pyg_class, MessagePassing):
        return pyg_class
    return derived_class(pyg_class, "_gnnfuse_compiled_class",
                         lambda: _compiling_subclass(pyg_class, MessagePassing, PyGMessagePassing))


def _compiling_subclass(pyg_class: type, compiling: type, pyg_base: type) -> type:
    """`compiled_class`'s class for ``pyg_class``: ``compiling`` (gnnfuse's
    ``MessagePassing``) before it, which PyG's ``MessagePassing`` (``pyg_base``) is a base of."""
    _refuse_own_propagate(pyg_class, pyg_base)
    namespace: dict[str, Any] = {**_pickled_name(pyg_class), "__doc__": pyg_class.__doc__,
                                 "_gnnfuse_source_class": pyg_class}
    forward = pyg_class.forward
    if "return_attention_weights" in inspect.signature(forward).parameters:
        forward = _weights_eager(forward)
        namespace.update(_gnnfuse_scratch_attributes=_WEIGHT_ATTRIBUTES.get(pyg_class.__name__, ()))
    namespace.update(forward=_graphs_as_edge_index(forward))
    if isinstance(inspect.getattr_static(pyg_class, "get_degree_histogram", None), staticmethod):
        namespace.update(get_degree_histogram=_unpadded_histogram(pyg_class.get_degree_histogram))
    return type(pyg_class.__name__, (compiling, pyg_class), namespace)


def _unpadded_histogram(histogram: Callable[[Any], Any]) -> staticmethod:
    """PyG's ``get_degree_histogram(loader)`` (PNAConv's), reading a gnnfuse
    ``DataLoader``'s batches as PyG's ``DataLoader`` collates them (its
    ``plain_batches``). Why: over ``DataLoader(..., static_shapes=True)`` it counted the
    padded vertices and their ring of padded edges too (40 molecules in batches of 8: 439
    vertices of degree 2 where PyG's loader gives 46), and the layer built with that
    ``deg`` scaled its aggregations by another average degree than PyG's, without a
    word. The loader is known by that method, not its class: ``loader/`` builds on
    ``nn/``."""

    @functools.wraps(histogram)
    def get_degree_histogram(loader: Any) -> Any:
        plain_batches = getattr(loader, "plain_batches", None)
        return histogram(plain_batches() if callable(plain_batches) else loader)
    return staticmethod(get_degree_histogram)


_COMPILED_PREFIX = "compiled:"


def _pickled_name(pyg_class: type) -> dict[str, str]:
    """The module and qualified name pickle finds the compiled class of ``pyg_class`` by.
    A class gnnfuse.nn exports is ``gnnfuse.nn.<name>``. Any other (a user's layer, or
    PyG's ``GATConv``, whose name gnnfuse.nn gives its own layer) is named after the class it
    was made from, which this module's `__getattr__` compiles again on loading: under
    ``gnnfuse.nn.<name>`` ``torch.save(model)`` failed ("Can't pickle <class
    'gnnfuse.nn.GATConv'>: it's not the same object as gnnfuse.nn.GATConv")."""
    import torch_geometric.nn
    name = pyg_class.__name__
    if name in COMPILED_PYG_LAYERS + EAGER_PYG_LAYERS and getattr(torch_geometric.nn, name, None) is pyg_class:
        return {"__module__": "gnnfuse.nn", "__qualname__": name}
    source = f"{pyg_class.__module__}:{pyg_class.__qualname__}".replace(".", "/")   # pickle splits names at dots
    return {"__module__": __name__, "__qualname__": _COMPILED_PREFIX + source}


def __getattr__(name: str) -> type:
    """The compiled class `_pickled_name` named ``name``, compiled again from its source class."""
    if not name.startswith(_COMPILED_PREFIX):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, qualname = name[len(_COMPILED_PREFIX):].replace("/", ".").partition(":")
    return compiled_class(functools.reduce(getattr, qualname.split("."), importlib.import_module(module)))


def _graphs_as_edge_index(forward: Callable[..., Any]) -> Callable[..., Any]:
    """PyG's ``forward``, given a gnnfuse `Graph` where PyG takes an ``edge_index``, as
    gnnfuse's own layers are: it reaches PyG's code as its cached ``[2, E]`` tensor (PyG's
    checks refused the Graph object with "`MessagePassing.propagate` only supports integer
    tensors"). A bipartite graph's sizes come from its ``(x_src, x_dst)`` pair, as PyG reads them,
    once the tables are checked against the Graph's counts (`_refuse_other_counts`)."""
    from ..graph import Graph

    parameters = list(inspect.signature(forward).parameters)[1:]      # after self

    def edges(value: Any) -> Any:
        return value.edge_index if isinstance(value, Graph) else value

    @functools.wraps(forward)
    def graph_taking_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(value, Graph) for value in (*args, *kwargs.values())):
            for value in (*args, *kwargs.values()):
                if isinstance(value, Graph) and value.is_block:
                    _refuse_square_reading(self, forward, value, args, kwargs)
                elif isinstance(value, Graph):
                    _refuse_other_counts(self, parameters, value, args, kwargs)
            args = tuple(edges(value) for value in args)
            kwargs = {key: edges(value) for key, value in kwargs.items()}
        return forward(self, *args, **kwargs)
    return graph_taking_forward


def _refuse_square_reading(layer: Any, forward: Callable[..., Any], block: Any, args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> None:
    """Refuse a call that would read an `in_edges_block` as PyG reads any ``edge_index``,
    destination i as vertex i: PyG's code sees only the block's ``[2, E]`` tensor, not that
    its destination i is vertex ``rows[i]``. A layer adding self loops there (FeaStConv's
    default) joined source i to destination i, and a single node tensor (``x``, ``pos``)
    was read at row i for destination i: silently other rows than the full layer's."""
    from ..graph.in_edges import refuse_square_reading

    name = type(layer).__name__
    if getattr(layer, "add_self_loops", False) is True:
        raise ValueError(f"{name}(add_self_loops=True) on a graph from in_edges_block: its destination i is "
                         "vertex rows[i], not vertex i, so PyG's loops i -> i would join the wrong vertices. "
                         "Add the loops to the whole graph first (in_edges_block(graph.add_self_loops(), rows)) "
                         "and set add_self_loops=False on the layer")
    refuse_square_reading(name, block, inspect.signature(forward).bind(layer, *args, **kwargs).arguments)


def _refuse_other_counts(layer: Any, parameters: list[str], graph: Any, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> None:
    """Refuse node tables whose rows are not ``graph``'s vertex counts. PyG's code sees the
    graph's bare ``[2, E]`` tensor and takes its sizes from the tables: a graph of 8 vertices
    beside an x of 6 rows gave 6 output rows, where gnnfuse's own layers refuse it. (Checked
    here, not by handing PyG an ``EdgeIndex`` of the sizes, which torch.compile cannot trace
    through PyG's code.) The node tables of every compiled PyG layer are the arguments before
    its edges (``x``; ``x, x_0``; ``x, pos``), each a table or an ``(x_src, x_dst)`` pair,
    and a table's rows are counted along the layer's ``node_dim``, as PyG counts them.
    ``parameters``: the names of ``forward``'s arguments after ``self``, in order."""
    for i, key in enumerate(parameters):
        value = args[i] if i < len(args) else kwargs.get(key)
        if isinstance(value, type(graph)):      # the edges: the tables come before them
            return
        pair = isinstance(value, (tuple, list)) and len(value) == 2
        for side, table, count in (((f"{key}[0]", value[0], graph.num_src_nodes),
                                    (f"{key}[1]", value[1], graph.num_nodes)) if pair
                                   else ((key, value, graph.num_src_nodes), (key, value, graph.num_nodes))):
            if not isinstance(table, torch.Tensor) or table.dim() == 0:
                continue
            rows = table.shape[layer.node_dim if table.dim() > 1 else 0]
            if rows != count:
                raise ValueError(f"{type(layer).__name__}: {side} has {rows} rows but the Graph has "
                                 f"{graph.num_src_nodes} sources and {graph.num_nodes} destinations; pass node "
                                 "tables of one row per vertex (an (x_src, x_dst) pair on a bipartite graph)")


def _refuse_own_propagate(pyg_class: type, base: type) -> None:
    """gnnfuse's ``propagate`` comes first among the compiled class's bases, so a
    ``propagate`` the class (or a class between it and PyG's base) defines would never run;
    such a class is refused. The ``propagate`` PyG generates from its template and installs
    on a class when it builds an instance is PyG's own (its module is named after the class)."""
    for klass in pyg_class.__mro__[:pyg_class.__mro__.index(base)]:
        own = klass.__dict__.get("propagate")
        if own is None or getattr(own, "__module__", "").startswith(f"{klass.__module__}_{klass.__name__}"):
            continue
        where = ""
        with contextlib.suppress(OSError, TypeError):
            where = f" (line {inspect.getsourcelines(own)[1]} of {inspect.getsourcefile(own)})"
        raise TypeError(f"{klass.__name__} overrides propagate(){where}, which compiled_class would bypass "
                        f"(gnnfuse's propagate comes first among its bases): subclass gnnfuse.nn.MessagePassing "
                        f"instead of PyG's, so that its propagate's super().propagate() compiles")


# message() of these keeps its per-edge attention weights on the layer for forward() to
# return; the compiled kernel never materialises them, so a call that asks for them runs
# eagerly and the others restore the attribute after tracing
_WEIGHT_ATTRIBUTES = {"FAConv": ("_alpha",), "TransformerConv": ("_alpha",)}


def _weights_eager(forward: Callable[..., Any]) -> Callable[..., Any]:
    """PyG's ``forward``, with ``propagate`` run eagerly when ``return_attention_weights``
    is given (PyG returns the weights for True and False alike): only that computes them."""
    from .message_passing import eagerly       # needs PyG: imported when a class is built, as in compiled_class
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def weights_eager_forward(self: MessagePassing, *args: Any, **kwargs: Any) -> Any:
        if signature.bind(self, *args, **kwargs).arguments.get("return_attention_weights") is None:
            return forward(self, *args, **kwargs)
        with eagerly(self):
            return forward(self, *args, **kwargs)
    return weights_eager_forward


def layer_class(name: str) -> type:
    """``gnnfuse.nn.<name>`` for a name in `COMPILED_PYG_LAYERS` or `EAGER_PYG_LAYERS`."""
    import torch_geometric.nn
    return compiled_class(getattr(torch_geometric.nn, name))
