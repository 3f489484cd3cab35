"""Neural-network layers with PyG's names and parameter layout (`conv`: GCN, GraphSAGE,
GAT; `propagation`: GIN, GraphConv, APPNP, SGC, TAG, Chebyshev; `attention`: GATv2,
constrained GAT, dot-product GAT, EdgeConv, MLP aggregation, NGCF; `relational`:
R-GCN; `hetero_relational`: RGAT, FastRGCN; `hetero_transformer`: HGT; `hetero_conv`: PyG's
HeteroConv wrapper; `hetero_transform`: PyG's ``to_hetero`` for gnnfuse layers; `edge_features` and `attention_weights`: GAT/GATv2's PyG ``edge_attr`` and
``return_attention_weights``; `pyg_repr`: PyG's printed form; `pyg_explain`: PyG's explainers refused
where their edge masks would miss gnnfuse's layers; `pyg_layers`: PyG's own
TransformerConv, GINEConv, GENConv, CGConv and more with ``propagate`` compiled), plain-PyTorch
baselines (`reference`) that the compiled layers are measured against, and a registry of
standard node-classification models built from them (`models`).

What a PyG import line names beyond convolutions also comes from here, loaded on first
access (PyG is optional): PyG's models ``GCN``, ``GraphSAGE``, ``GIN``, ``GAT``, ``PNA``,
``EdgeCNN`` built from gnnfuse's layers (`pyg_models`), and PyG's own objects for its names
without message passing -- pooling, norms, ``Linear``, ``MLP``, ``Sequential``, ... --
(`pyg_reexports`). A PyG name that would run other code, or propagation gnnfuse does not
compile, is refused saying why and what to use: an ImportError on an import line, an
AttributeError elsewhere, so ``hasattr`` finds it absent (`refused_names`)."""
from .attention import CGATConv, DotGATConv, EdgeConv, GATv2Conv, MLPAggConv, NGCFConv
from .conv import GATConv, GCNConv, SAGEConv
from .propagation import APPNP, ChebConv, GINConv, GraphConv, SGConv, TAGConv
from .relational import RGCNConv
from .hetero_conv import HeteroConv
from .hetero_relational import FastRGCNConv, RGATConv
from .hetero_transformer import HGTConv
from .hetero_transform import to_hetero
from .models import Hyperparameters, ModelSpec, build_model, get_model, model_names
from .refused_names import refusal
from . import pyg_explain

__all__ = ["APPNP", "CGATConv", "ChebConv", "DotGATConv", "EdgeConv", "FastRGCNConv", "GATConv", "GATv2Conv", "GCNConv",
           "GINConv", "GraphConv", "HGTConv", "HeteroConv", "Hyperparameters", "MLPAggConv", "ModelSpec", "NGCFConv", "RGATConv", "RGCNConv", "SAGEConv", "SGConv",
           "TAGConv", "build_model", "get_model", "model_names", "to_hetero"]

pyg_explain.install()      # PyG's explainers refuse models whose gnnfuse layers their edge masks miss

# A PyG name whose gnnfuse namesake takes other arguments: exported here, it would run
# different code without an error. It stays in `reference`.
_NOT_PYG = {
    "gcn_norm": "torch_geometric's gcn_norm(edge_index, edge_weight, num_nodes, ...) has no gnnfuse "
                "counterpart (gnnfuse.nn.GCNConv normalises inside its kernel); "
                "gnnfuse.nn.reference.gcn_norm(graph) is the plain-PyTorch baseline's helper, "
                "taking a gnnfuse.Graph",
}


def __getattr__(name: str):
    # PyG's base class is needed only by MessagePassing and the PyG layers compiled through
    # it, so PyG stays optional: importing it is deferred to first use (an ImportError then
    # says what to install).
    if name in _NOT_PYG:
        raise refusal(__name__, name, f"gnnfuse.nn has no {name!r}: {_NOT_PYG[name]}")
    if name == "MessagePassing":
        from .message_passing import MessagePassing
        return MessagePassing
    if name.startswith("_"):      # no PyG name: a probe (copy, pickle, inspect) must not import PyG
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .pyg_layers import COMPILED_PYG_LAYERS, EAGER_PYG_LAYERS, NOT_EXPORTED, compiled_class, layer_class
    if name == "compiled_class":
        return compiled_class
    if name in COMPILED_PYG_LAYERS or name in EAGER_PYG_LAYERS:
        return layer_class(name)
    from .pyg_models import PYG_MODELS, model_class
    if name in PYG_MODELS:
        return model_class(name)
    from .pyg_reexports import NOT_REEXPORTED, reexport, reexported_names
    for refused in (NOT_EXPORTED, NOT_REEXPORTED):
        if name in refused:
            raise refusal(__name__, name, f"gnnfuse.nn has no {name!r}: torch_geometric.nn.{name} {refused[name]}")
    try:
        pyg_name = name in reexported_names()
    except ImportError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (nor can it hand back "
                             f"torch_geometric.nn's: torch_geometric is not installed)") from None
    if pyg_name:
        return reexport(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}: it is neither a gnnfuse.nn name "
                         f"nor one of torch_geometric.nn's that gnnfuse.nn hands back")
