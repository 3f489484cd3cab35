"""PyG's ready-made models (``torch_geometric.nn.GCN``, ``GraphSAGE``, ``GIN``, ``GAT``,
``PNA``, ``EdgeCNN``: subclasses of PyG's ``BasicGNN``) built from gnnfuse's layers.

``from torch_geometric.nn import GraphSAGE`` is how many PyG users build a model, so the
switch has to be the import alone. ``gnnfuse.nn.GraphSAGE`` *is* PyG's class, subclassed:
constructor, ``forward`` (``jk``, ``norm``, ``num_sampled_nodes_per_hop``'s trimming),
``state_dict`` names, printed form and ``isinstance`` are PyG's. Only ``init_conv`` differs:
it is PyG's own ``init_conv`` code, run with the convolution classes it names
(``GCNConv``, ``SAGEConv``, ``GATConv``/``GATv2Conv``, ...) bound to gnnfuse's namesakes.
Running PyG's code rather than a copy keeps every argument it passes -- GAT's heads and
``concat`` of the last layer, its dropout, GIN's and EdgeCNN's ``MLP``, the ``**kwargs`` --
PyG's by construction; a ``kwarg`` a gnnfuse layer refuses raises its own error naming it.
``inference`` (PyG's layer-wise inference) also takes gnnfuse's ``NeighborLoader``
(`basic_gnn_inference`).
gnnfuse's layers draw PyG's initial weights, so under one ``torch.manual_seed`` both models
start equal. ``PNAConv`` is PyG's own layer with gnnfuse's ``propagate``, which runs PyG's
(``pyg_layers.EAGER_PYG_LAYERS`` says why).
"""
from __future__ import annotations

import types

from ..derived_class import derived_class
from .attention import EdgeConv, GATv2Conv
from .basic_gnn_inference import inference_method
from .conv import GATConv, GCNConv, SAGEConv
from .propagation import GINConv
from .pyg_layers import layer_class

PYG_MODELS = ("GCN", "GraphSAGE", "GIN", "GAT", "PNA", "EdgeCNN")


def _gnnfuse_convs() -> dict[str, type]:
    """The layers PyG's ``init_conv`` methods build, by the name they read them under."""
    return {"GCNConv": GCNConv, "SAGEConv": SAGEConv, "GINConv": GINConv, "GATConv": GATConv,
            "GATv2Conv": GATv2Conv, "EdgeConv": EdgeConv, "PNAConv": layer_class("PNAConv")}


def model_class(name: str) -> type:
    """``gnnfuse.nn.<name>`` for a name in `PYG_MODELS`: PyG's model class with its
    convolutions gnnfuse's. One class per name, named ``gnnfuse.nn.<name>``, so a pickled
    model loads again; kept on PyG's class (`derived_class`), whose lock makes it one class
    where threads first ask for it at once (``functools.cache`` let each build its own:
    eight threads got eight ``gnnfuse.nn.GCN`` classes, and pickling a model of all but
    one failed with "it's not the same object as gnnfuse.nn.GCN")."""
    from torch_geometric.nn.models import basic_gnn

    pyg_class = getattr(basic_gnn, name)
    return derived_class(pyg_class, "_gnnfuse_model_class", lambda: _model_class(name, pyg_class))


def _model_class(name: str, pyg_class: type) -> type:
    """`model_class`'s class for ``pyg_class``, PyG's ``torch_geometric.nn.<name>``."""
    from torch_geometric.nn import MessagePassing
    from torch_geometric.nn.models import basic_gnn

    pyg_init_conv = pyg_class.init_conv
    code = pyg_init_conv.__code__
    convs = _gnnfuse_convs()
    namespace = dict(vars(basic_gnn))
    for global_name in code.co_names:
        value = namespace.get(global_name)
        if isinstance(value, type) and issubclass(value, MessagePassing) and value is not MessagePassing:
            if global_name not in convs:     # a PyG version whose init_conv builds another layer
                raise TypeError(f"torch_geometric.nn.{name}.init_conv builds {global_name}, which gnnfuse.nn has "
                                f"no layer for: use torch_geometric.nn.{name}")
            namespace[global_name] = convs[global_name]
    init_conv = types.FunctionType(code, namespace, pyg_init_conv.__name__, pyg_init_conv.__defaults__,
                                   pyg_init_conv.__closure__)
    init_conv.__kwdefaults__ = pyg_init_conv.__kwdefaults__
    init_conv.__qualname__ = f"{name}.init_conv"
    inference = inference_method(pyg_class.inference)
    inference.__qualname__ = f"{name}.inference"
    return type(name, (pyg_class,), {"__module__": "gnnfuse.nn", "__qualname__": name,
                                     "__doc__": pyg_class.__doc__, "init_conv": init_conv,
                                     "inference": inference})
