"""PyG's explainers (``torch_geometric.explain``) refused where their edge masks would
miss gnnfuse's layers.

An explainer with ``edge_mask_type`` set (GNNExplainer, PGExplainer, GraphMaskExplainer,
AttentionExplainer, CaptumExplainer) puts its masks on -- or collects attention from --
the ``torch_geometric.nn.MessagePassing`` modules of the model only. gnnfuse's own
layers (`GCNConv`, `SAGEConv`, `GATConv`, ...) are not such modules: in a model of those
alone PyG failed with messages blaming the model ("make sure that edges are used via
message passing"), and in a model mixing them with PyG-class layers the explanation came
back silently wrong (GNNExplainer's edge mask off by 0.75 against the same model built
from PyG's layers). So the explainer's call is refused, naming the layers.
GraphMaskExplainer is refused for node masks too: it learns them through gates on the
MessagePassing layers' messages, and on gnnfuse's layers crashed with a bare IndexError.

PyG stays optional and its ``explain`` package costs seconds to import, so nothing is
imported here: the guard is put on PyG's classes when that package is imported (an
import hook), or at once when it already was."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

import torch

from .hetero_conv import HeteroConv
from .torchscript import NotScriptable

_PACKAGE = "torch_geometric.explain"


def unmasked_layers(model: torch.nn.Module) -> list[str]:
    """gnnfuse layers of ``model`` that PyG's edge masks do not reach, as ``Class at
    name``. `HeteroConv` only holds layers, which are listed themselves."""
    from torch_geometric.nn import MessagePassing
    return [f"{type(module).__name__} at {name or 'the model itself'}" for name, module in model.named_modules()
            if isinstance(module, NotScriptable) and not isinstance(module, (MessagePassing, HeteroConv))]


# PyG's explainers that work through the model's MessagePassing layers whatever masks they
# are asked for: GraphMaskExplainer gates those layers' messages (``explain_message``) and
# learns its node mask through the gates, so node masks alone do not make it safe.
_LAYER_GATING = ("GraphMaskExplainer",)


def refuse_edge_masks(model: Any, who: str) -> None:
    """Raise if PyG's ``who`` would explain ``model``'s edges without seeing some of its layers."""
    _refuse(model, f"{who} puts its edge masks on (or reads attention from) torch_geometric.nn.MessagePassing "
                   "layers only", "those edges would get no mask and the explanation would be wrong",
            "or ask for node masks only (edge_mask_type=None)")


def _refuse(model: Any, what: str, consequence: str, alternative: str) -> None:
    """Raise, naming ``model``'s gnnfuse layers, if it has any that PyG's explain code misses."""
    layers = unmasked_layers(model) if isinstance(model, torch.nn.Module) else []
    if layers:
        raise NotImplementedError(
            f"{what}, and gnnfuse's {', '.join(layers)} {'is' if len(layers) == 1 else 'are'} not one: "
            f"{consequence}. Explain a copy built from torch_geometric.nn's layers (gnnfuse's have PyG's parameter "
            f"names: pyg_model.load_state_dict(model.state_dict())), {alternative}")


def _gates_layers(algorithm: Any) -> bool:
    """Whether ``algorithm`` is one of PyG's `_LAYER_GATING` explainers (or a subclass)."""
    return any(cls.__name__ in _LAYER_GATING and cls.__module__.startswith(_PACKAGE)
               for cls in type(algorithm).__mro__)


def guard(explain: Any) -> None:
    """Put the refusal on the imported ``torch_geometric.explain`` package's classes
    (once): every algorithm's call, `Explainer.get_masked_prediction` (the fidelity
    metrics' masked forward) and ``set_masks``."""
    algorithm = getattr(sys.modules.get(f"{_PACKAGE}.algorithm.base"), "ExplainerAlgorithm", None)
    if (algorithm is None or not hasattr(explain, "Explainer")     # another PyG layout: its import must still work
            or getattr(algorithm, "_gnnfuse_guarded", False)):
        return
    call, masked = algorithm.__call__, explain.Explainer.get_masked_prediction

    def guarded_call(self, *args, **kwargs):
        config = getattr(self, "_explainer_config", None)
        if _gates_layers(self):     # before its training: PyG's bare IndexError on gnnfuse's layers
            _refuse(args[0] if args else kwargs.get("model"), f"torch_geometric.explain's {type(self).__name__} "
                    "gates the messages of torch_geometric.nn.MessagePassing layers only, node masks included",
                    "their messages would be ungated and the explanation wrong",
                    "or use GNNExplainer for node masks (node_mask_type set, edge_mask_type=None)")
        if config is not None and config.edge_mask_type is not None:
            refuse_edge_masks(args[0] if args else kwargs.get("model"), f"torch_geometric.explain's "
                              f"{type(self).__name__} (edge_mask_type={config.edge_mask_type.value!r})")
        return call(self, *args, **kwargs)

    def guarded_masked_prediction(self, *args, **kwargs):
        edge_mask = args[3] if len(args) > 3 else kwargs.get("edge_mask")
        if edge_mask is not None:
            refuse_edge_masks(self.model, "torch_geometric.explain's Explainer.get_masked_prediction (fidelity)")
        return masked(self, *args, **kwargs)

    algorithm.__call__ = guarded_call
    explain.Explainer.get_masked_prediction = guarded_masked_prediction
    pg_explainer = getattr(sys.modules.get(f"{_PACKAGE}.algorithm.pg_explainer"), "PGExplainer", None)
    if pg_explainer is not None:        # trained on its own before its call (PyG's IndexError on gnnfuse layers)
        train = pg_explainer.train

        def guarded_train(self, *args, **kwargs):
            # train(epoch, model, ...) with its arguments by position or keyword, not Module.train(mode)
            if not (args and isinstance(args[0], bool)):
                refuse_edge_masks(args[1] if len(args) > 1 else kwargs.get("model"),
                                  "torch_geometric.explain's PGExplainer.train")
            return train(self, *args, **kwargs)

        pg_explainer.train = guarded_train
    _guard_set_masks()
    algorithm._gnnfuse_guarded = True


def _guard_set_masks() -> None:
    """The refusal on PyG's ``set_masks``, wherever the loaded explain modules bound it:
    a custom explainer calls it directly and ``to_captum_model``'s ``CaptumModel`` on
    every forward, and both skipped gnnfuse's layers silently (an edge mask's gradient
    0.23 off the same model of PyG's layers)."""
    utils = sys.modules.get(f"{_PACKAGE}.algorithm.utils")
    original = getattr(utils, "set_masks", None)
    if original is None:
        return

    def guarded_set_masks(model, *args, **kwargs):
        refuse_edge_masks(model, "torch_geometric.explain's set_masks (called by custom explainers and by "
                                 "to_captum_model's CaptumModel)")
        return original(model, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith(_PACKAGE) and getattr(module, "set_masks", None) is original:
            module.set_masks = guarded_set_masks


class _GuardOnImport(importlib.abc.MetaPathFinder):
    """Finds ``torch_geometric.explain`` through the other finders and has its loader
    call `guard` once the package has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _PACKAGE:
            return None
        spec = next((found for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")
                     for found in [finder.find_spec(fullname, path, target)] if found is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            guard(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Guard PyG's explainers now if imported, else when they are."""
    if _PACKAGE in sys.modules:
        guard(sys.modules[_PACKAGE])
    elif not any(isinstance(finder, _GuardOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _GuardOnImport())
