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
once per class, naming the construct and line. PyG (``torch_geometric``) is therefore
required by this class only; the rest of gnnfuse does not need it. TorchScript
(``jittable()``) is not supported: PyG's template-generated ``propagate`` is replaced.
"""
from __future__ import annotations

import warnings
from typing import Any

try:
    from torch_geometric.nn import MessagePassing as PyGMessagePassing
except ImportError as exc:   # pragma: no cover - exercised only without PyG installed
    raise ImportError("gnnfuse.nn.MessagePassing extends PyG's base class and needs torch_geometric: "
                      "pip install torch_geometric (gnnfuse's other layers do not need it)") from exc

from ..frontend.pyg_message_passing import NotCompilable, compiled_propagate

# PyG's generic propagate. PyG replaces a concrete class's ``propagate`` by one generated
# from a template (``_orig_propagate`` keeps the original); the base class's is generic.
_EAGER_PROPAGATE = PyGMessagePassing.__dict__.get("_orig_propagate", PyGMessagePassing.propagate)
_WARNED: set[type] = set()


class MessagePassing(PyGMessagePassing):
    """``torch_geometric.nn.MessagePassing`` whose ``propagate`` compiles ``message`` and
    the aggregation into one program (falling back to PyG's eager ``propagate``, with a
    one-time warning per class, where it cannot)."""

    def propagate(self, edge_index: Any, size: Any = None, **kwargs: Any) -> Any:
        if not vars(self).get("_gnnfuse_eager"):    # set by a call that must run eagerly
            try:
                return compiled_propagate(self, edge_index, size, kwargs)
            except NotCompilable as reason:
                _warn_once(type(self), str(reason))
        return _EAGER_PROPAGATE(self, edge_index, size, **kwargs)

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        """PyG installs a template-generated ``propagate`` on each concrete class (and
        swaps it back in when ``explain`` or ``decomposed_layers`` is reset); point all of
        those at the compiling ``propagate`` instead, once per class."""
        cls = type(self)
        if cls.__dict__.get("_gnnfuse_propagate_set"):
            return
        propagate = cls.propagate
        super()._set_jittable_templates(raise_on_error)
        cls.propagate = cls._orig_propagate = cls._jinja_propagate = propagate
        cls._gnnfuse_propagate_set = True


def _warn_once(cls: type, reason: str) -> None:
    if cls in _WARNED:
        return
    _WARNED.add(cls)
    warnings.warn(f"{cls.__name__}.propagate runs PyG's eager message passing (not compiled): {reason}",
                  stacklevel=3)
