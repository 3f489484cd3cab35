"""PyG's names that involve no message passing, handed back by ``gnnfuse.nn`` as PyG's own
objects: ``gnnfuse.nn.global_mean_pool is torch_geometric.nn.global_mean_pool``.

A PyG user switches by changing an import line, and that line rarely holds convolutions
alone: ``from torch_geometric.nn import GCNConv, global_mean_pool, BatchNorm, MLP``. Pooling,
normalisation, ``Linear``, ``MLP``, ``JumpingKnowledge``, aggregations, ``Sequential`` and the
like have nothing for gnnfuse to compile, so the import line works when gnnfuse.nn hands back
PyG's object itself. What qualifies: every public name of PyG's subpackages that hold no
message passing (`PROPAGATION_FREE`), ``torch_geometric.nn``'s own ``__all__``, and the
models of ``torch_geometric.nn.models`` that take the user's layers or none (`MODELS`).
`NOT_REEXPORTED` lists the names among these that would build or run message passing gnnfuse
does not compile, or would mistreat gnnfuse's layers; importing one raises an ImportError
saying why and what to use. PyG's convolutions are never re-exported (``pyg_layers`` says
which compile and why the others do not), nor are PyG's ``BasicGNN`` models (``pyg_models``
builds them from gnnfuse's layers). gnnfuse.nn's own names, defined first, win.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any

# subpackages of torch_geometric.nn whose every name (their __all__) computes without
# message passing, except the few in NOT_REEXPORTED
PROPAGATION_FREE = ("aggr", "attention", "dense", "functional", "kge", "norm", "pool", "unpool")

# torch_geometric.nn.models that propagate nothing themselves: wrappers around the user's
# layers (so gnnfuse.nn layers inside them compile), and models without graph propagation
MODELS = ("MLP", "JumpingKnowledge", "HeteroJumpingKnowledge", "MetaLayer", "DeepGCNLayer", "GroupAddRev",
          "DeepGraphInfomax", "InnerProductDecoder", "GAE", "VGAE", "ARGA", "ARGVA", "Node2Vec", "MetaPath2Vec",
          "MaskLabel", "TGNMemory", "GPSENodeEncoder", "ARLinkPredictor", "to_captum_input",
          "captum_output_to_dicts")

# torch_geometric.nn's deprecated names from its glob module (which has no __all__)
_DEPRECATED = ("GlobalAttention", "global_sort_pool")

_BUILDS = ("builds PyG's {what} inside, which gnnfuse does not compile: use torch_geometric.nn.{name} "
           "(PyG's propagation), or the same model built from gnnfuse.nn layers")
_SCATTER = ("propagates over edges with its own scatter code, which gnnfuse does not compile: use "
            "torch_geometric.nn.{name}")

# names of PyG's propagation-free subpackages and models that gnnfuse.nn does not hand back
NOT_REEXPORTED = {
    "SAGPooling": "scores vertices with PyG's GraphConv, built inside, which gnnfuse does not compile: use "
                  "torch_geometric.nn.SAGPooling(..., GNN=gnnfuse.nn.GraphConv) to compile its scoring layer",
    "ASAPooling": _BUILDS.format(what="LEConv", name="ASAPooling"),
    "to_hetero_with_bases": "recognises a message-passing layer only as a torch_geometric.nn.MessagePassing, which "
                            "gnnfuse.nn's GCNConv, SAGEConv, GATConv, ... are not, so it would treat them as plain "
                            "functions: use gnnfuse.nn.to_hetero, or torch_geometric.nn.to_hetero_with_bases with "
                            "PyG's layers",
    "to_captum_model": "sets its edge masks on torch_geometric.nn.MessagePassing layers only, which gnnfuse.nn's "
                       "GCNConv, SAGEConv, GATConv, ... are not, so their edges would get no attribution: use "
                       "torch_geometric.nn.to_captum_model with PyG's layers",
    **{name: _BUILDS.format(what=what, name=name) for name, what in {
        "AttentiveFP": "GATConv and its GATEConv", "CorrectAndSmooth": "LabelPropagation",
        "GPSE": "ResGatedGraphConv", "GraphUNet": "GCNConv", "LINKX": "SparseLinear (a MessagePassing layer)",
        "LabelPropagation": "propagate (it is a MessagePassing layer)", "LightGCN": "LGConv",
        "LPFormer": "LPAttLayer (a MessagePassing layer)", "NeuralFingerprint": "MFConv", "PMLP": "SimpleConv",
        "Polynormer": "GATConv and GCNConv", "RECT_L": "GCNConv", "SchNet": "CFConv (a MessagePassing layer)",
        "SGFormer": "GCNConv", "SignedGCN": "SignedConv", "ViSNet": "ViS_MP (a MessagePassing layer)"}.items()},
    **{name: _SCATTER.format(name=name) for name in ("DimeNet", "DimeNetPlusPlus", "GNNFF", "RENet")},
}


@functools.cache
def reexported_names() -> frozenset[str]:
    """The names `reexport` hands back (PyG must be installed)."""
    import torch_geometric.nn
    names = {*torch_geometric.nn.__all__, *MODELS, *_DEPRECATED}
    for package in PROPAGATION_FREE:
        names.update(importlib.import_module(f"torch_geometric.nn.{package}").__all__)
    return frozenset(names - NOT_REEXPORTED.keys())


def reexport(name: str) -> Any:
    """PyG's object ``torch_geometric.nn.<name>`` for a name in `reexported_names`."""
    import torch_geometric.nn
    return getattr(torch_geometric.nn, name)
