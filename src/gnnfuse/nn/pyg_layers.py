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

import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable

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


@functools.cache
def compiled_class(pyg_class: type) -> type:
    """``pyg_class`` (a subclass of PyG's ``MessagePassing``) with gnnfuse's compiling
    ``propagate``; one class per ``pyg_class``. The class is named ``gnnfuse.nn.<name>``,
    so a pickled model holding a layer of `COMPILED_PYG_LAYERS` loads again; for any
    other class save the ``state_dict``."""
    from torch_geometric.nn import MessagePassing as PyGMessagePassing

    from .message_passing import MessagePassing
    if not (isinstance(pyg_class, type) and issubclass(pyg_class, PyGMessagePassing)):
        raise TypeError(f"compiled_class takes a subclass of torch_geometric.nn.MessagePassing, got {pyg_class!r}")
    if issubclass(pyg_class, MessagePassing):
        return pyg_class
    namespace: dict[str, Any] = {"__module__": "gnnfuse.nn", "__qualname__": pyg_class.__name__,
                                 "__doc__": pyg_class.__doc__, "_gnnfuse_source_class": pyg_class}
    if "return_attention_weights" in inspect.signature(pyg_class.forward).parameters:
        namespace.update(forward=_weights_eager(pyg_class.forward),
                         _gnnfuse_scratch_attributes=_WEIGHT_ATTRIBUTES.get(pyg_class.__name__, ()))
    return type(pyg_class.__name__, (MessagePassing, pyg_class), namespace)


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
