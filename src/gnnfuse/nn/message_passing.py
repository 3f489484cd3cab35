"""`MessagePassing`: PyG's base class, with ``message`` compiled into the aggregation kernel.

A PyG layer switches by changing one import::

    from gnnfuse.nn import MessagePassing      # was: from torch_geometric.nn import MessagePassing

    class EdgeWeighted(MessagePassing):
        def __init__(self):
            super().__init__(aggr="add")
        def forward(self, x, edge_index, edge_weight):
            return self.propagate(edge_index, x=x, edge_weight=edge_weight)
        def message(self, x_j, edge_weight):
            return x_j * edge_weight.view(-1, 1)

The class *is* a ``torch_geometric.nn.MessagePassing`` (a subclass), so every PyG attribute,
argument and method behaves as PyG documents; only ``propagate`` differs: it traces
``message`` into gnnfuse's IR and runs gather, message and aggregation as one fused
program, for ``aggr`` 'add'/'sum', 'mean', 'max', 'min' and 'softmax' (see
`gnnfuse.frontend.pyg_message_passing` for what maps to what); ``update`` runs as written on
the aggregated rows. Where that cannot reproduce PyG exactly -- a construct ``message``
uses that the tracer rejects, an overridden ``aggregate``, a custom aggregation, sparse
adjacency, bipartite sizes, hooks, ``explain`` -- it runs PyG's own ``propagate`` and warns
once per class and cause, naming the construct and line. PyG (``torch_geometric``) is therefore
required by this class only; the rest of gnnfuse does not need it. TorchScript
(``jittable()``) is not supported: PyG's template-generated ``propagate`` is replaced.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import re
import weakref
from typing import Any, Callable, Iterator

import torch

try:
    from torch_geometric.nn import MessagePassing as PyGMessagePassing
except ImportError as exc:   # pragma: no cover - exercised only without PyG installed
    raise ImportError("gnnfuse.nn.MessagePassing extends PyG's base class and needs torch_geometric: "
                      "pip install torch_geometric (gnnfuse's other layers do not need it)") from exc

from ..frontend.pyg_message_passing import NotCompilable, compiled_propagate
from ..graph import Graph
from ..graph.in_edges import refuse_square_reading
from ..runtime.compile_op import run_eagerly
from ..runtime.compiled import ForwardADError, running_layer
from ..user_warning import warn
from .torchscript import NotScriptable

# PyG's generic propagate. PyG replaces a concrete class's ``propagate`` by one generated
# from a template (``_orig_propagate`` keeps the original); the base class's is generic.
# PyG runs the generic one only in explain mode or with ``decomposed_layers`` (see
# `_eager_propagate`).
_EAGER_PROPAGATE = PyGMessagePassing.__dict__.get("_orig_propagate", PyGMessagePassing.propagate)
# class -> the causes it has been warned about (`_warn_once`). Weak: a class defined in a
# loop (a sweep's layer) was kept for good, with whatever its methods close over.
_WARNED: "weakref.WeakKeyDictionary[type, set[str]]" = weakref.WeakKeyDictionary()
_EAGER_FLAG = "_gnnfuse_eager"      # an instance attribute: set by `eagerly`, read by `propagate`


class MessagePassing(NotScriptable, PyGMessagePassing):
    """``torch_geometric.nn.MessagePassing`` whose ``propagate`` compiles ``message`` and
    the aggregation into one program (falling back to PyG's eager ``propagate``, with a
    one-time warning per class and cause, where it cannot)."""

    def propagate(self, edge_index: Any, size: Any = None, **kwargs: Any) -> Any:
        # a gnnfuse `Graph` (a loader block's ``block.graph``, which gnnfuse's own layers
        # take) as its ``[2, E]`` edges, whose columns are the block's ``edge_attr`` rows, as
        # `pyg_layers` hands it to PyG's layers: it fell back to PyG's propagate with a
        # warning, which then failed on "only supports integer tensors of shape [2, ...]".
        # Where no size is given, the Graph's own counts are (`_graph_size`), so PyG checks
        # the node tables against them. `edge_updater` takes one so too. A single table on
        # an `in_edges_block` would be read at row i for destination i, which is vertex
        # rows[i]: refused. (The check is inline so a tensor edge_index, the usual call,
        # costs no function call here.)
        if isinstance(edge_index, Graph):
            edge_index, size = _edges(edge_index, self, kwargs), _graph_size(edge_index, size)
        if torch.compiler.is_compiling():
            # dynamo would trace into the compiled program's autograd.Function, which it
            # cannot follow (training failed naming torch.func transforms; on Triton,
            # inference too): the compiled propagate runs behind a graph break instead
            return run_eagerly(f"{type(self).__name__}.propagate runs behind a graph break",
                               type(self).propagate, self, edge_index, size, **kwargs)
        if not vars(self).get(_EAGER_FLAG):    # inside `eagerly(self)`
            try:
                with running_layer(type(self).__name__):
                    return compiled_propagate(self, edge_index, size, kwargs, _template(type(self)) is None)
            except NotCompilable as reason:
                _warn_once(type(self), str(reason))
            except ForwardADError as error:     # a program's refusal, named after the layer, as gnnfuse's own
                raise error.named(type(self).__name__) from None
        return _eager_propagate(self, edge_index, size, kwargs)

    def edge_updater(self, edge_index: Any, size: Any = None, **kwargs: Any) -> Any:
        """PyG's generic ``edge_updater`` (run where PyG builds no template for the class),
        taking a gnnfuse `Graph` as its edges, as `propagate` does."""
        return super().edge_updater(_edges(edge_index, self, kwargs), _graph_size(edge_index, size), **kwargs)

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        """PyG installs a template-generated ``propagate`` on each concrete class (and
        swaps it back in when ``explain`` or ``decomposed_layers`` is reset); point all of
        those at the compiling ``propagate`` instead, once per class. The template-generated
        ``edge_updater`` it installs too is wrapped to take a gnnfuse `Graph` as its edges,
        as `propagate` does (PyG's refused it naming ``propagate``)."""
        cls = type(self)
        if cls.__dict__.get("_gnnfuse_propagate_set"):
            return
        propagate = cls.propagate
        source_class = cls.__dict__.get("_gnnfuse_source_class")
        if source_class is not None:
            # PyG reads the propagate call from the class's source, which a class built by
            # `compiled_class` lacks (its template then failed silently); its forward is
            # the PyG class's, so that class's source stands in (the cache is by name).
            # Without that source PyG runs its generic propagate, and so does the fallback.
            with contextlib.suppress(OSError, TypeError):
                self.inspector._source_dict.setdefault(cls.__name__, inspect.getsource(source_class))
        super()._set_jittable_templates(raise_on_error)
        template = cls.__dict__.get("_jinja_propagate")
        if template is not None and template is not propagate:
            cls._gnnfuse_template_propagate = template
        # else PyG keeps the propagate a class inherits where it cannot build its own (its
        # forward passes **kwargs, say), found at each call: a base class's template once
        # that base has been instantiated, else the generic one (`_template`)
        cls.propagate = cls._orig_propagate = cls._jinja_propagate = propagate
        updater = cls.__dict__.get("edge_updater")
        if getattr(updater, "__module__", "").startswith(f"{cls.__module__}_{cls.__name__}"):   # PyG's template
            cls.edge_updater = _graph_taking(updater)
        cls._gnnfuse_propagate_set = True


@contextlib.contextmanager
def eagerly(layer: MessagePassing) -> Iterator[None]:
    """``layer``'s ``propagate`` runs PyG's eager one while inside: for a call that needs
    what only eager code computes (the attention weights ``message`` keeps on the layer)."""
    setattr(layer, _EAGER_FLAG, True)
    try:
        yield
    finally:
        delattr(layer, _EAGER_FLAG)


def _eager_propagate(layer: MessagePassing, edge_index: Any, size: Any, kwargs: dict[str, Any]) -> Any:
    """The ``propagate`` PyG itself runs for this call: the template-generated one PyG
    installed on the class, except in explain mode or with ``decomposed_layers`` (where PyG
    switches to the generic one). The two differ: with ``flow='target_to_source'`` the
    template reads ``x_j`` from ``x[0]`` of an ``(x[0], x[1])`` pair, the generic one from
    ``x[1]``, so always running the generic one gave other numbers than PyG.

    A narrower integer ``edge_index`` goes in as int64: PyG scatters the messages with the
    index broadcast over the feature axis (a stride-0 view), and torch 2.13's scatter_add
    backward gathers through such an int32 view wrongly (GENConv's powermean input gradient
    was 0.59 off), a wrong gradient PyG itself gives on int32."""
    edge_index = _int64_index(edge_index)
    template = _template(type(layer))
    if template is None or layer.explain or layer.decomposed_layers != 1:
        return _EAGER_PROPAGATE(layer, edge_index, size, **kwargs)
    return template(layer, edge_index, size=size, **kwargs)


def _edges(edge_index: Any, layer: MessagePassing, tables: dict[str, Any]) -> Any:
    """A gnnfuse `Graph` as its ``[2, E]`` edge_index; anything else unchanged. A single
    node table among ``tables`` on an `in_edges_block` is refused, as in `propagate`."""
    if not isinstance(edge_index, Graph):
        return edge_index
    if edge_index.is_block:
        refuse_square_reading(type(layer).__name__, edge_index, tables)
    return edge_index.edge_index


def _graph_size(graph: Any, size: Any) -> Any:
    """The ``size`` PyG's propagate is given for ``graph``: a gnnfuse `Graph`'s own counts
    (sources, destinations) where none was passed, so PyG checks the node tables against
    them, as it checks an ``EdgeIndex``'s sparse size. Its bare edge_index had lost them: a
    graph of 8 vertices beside an x of 6 rows gave PyG's layers 6 output rows, where gnnfuse's
    own layers refuse it. A loader block keeps ``size``: its tables are refused or read by
    `refuse_square_reading`'s rule."""
    if size is not None or not isinstance(graph, Graph) or graph.is_block:
        return size
    return graph.num_src_nodes, graph.num_nodes


def _graph_taking(edge_updater: Callable) -> Callable:
    """PyG's template-generated ``edge_updater``, given a gnnfuse `Graph` as its edges."""
    @functools.wraps(edge_updater)
    def graph_taking_edge_updater(self: MessagePassing, edge_index: Any, *args: Any, **kwargs: Any) -> Any:
        return edge_updater(self, _edges(edge_index, self, kwargs), *args, **kwargs)
    return graph_taking_edge_updater


def _template(cls: type) -> Callable | None:
    """The template-generated ``propagate`` PyG would call on ``cls`` now: its own, or
    the nearest base class's (looked up at each call, as PyG's attribute lookup does: a
    base instantiated after the subclass installs its template then), else None."""
    return getattr(cls, "_gnnfuse_template_propagate", None)


def _int64_index(edge_index: Any) -> Any:
    """A dense integer ``edge_index`` (or ``EdgeIndex``) of another integer dtype as int64;
    anything else (int64, a sparse adj_t) unchanged."""
    if (isinstance(edge_index, torch.Tensor) and edge_index.layout is torch.strided
            and not edge_index.is_floating_point() and edge_index.dtype not in (torch.int64, torch.bool)):
        return edge_index.long()
    return edge_index


def _warn_once(cls: type, reason: str) -> None:
    """Warn once per class and cause: a class warned about one construct (a hook on one
    layer) was silent about another (``decomposed_layers`` on a second layer of the
    class). The cause is the reason without its numbers, so a mini-batch loop's bipartite
    sizes or a tensor's shape changing every step warn once."""
    cause = re.sub(r"0x[0-9a-fA-F]+|\d+", "#", reason)
    causes = _WARNED.setdefault(cls, set())
    if cause in causes:
        return
    causes.add(cause)
    warn(f"{cls.__name__}.propagate runs PyG's eager message passing (not compiled): {reason}")
