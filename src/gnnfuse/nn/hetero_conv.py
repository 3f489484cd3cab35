"""PyG's ``HeteroConv``: one homogeneous (bipartite) layer per edge type, each relation's
outputs grouped per destination node type.

Each wrapped layer is a gnnfuse layer (or any module with PyG's call signature), so every
relation's graph work is compiled; this module only routes the per-type inputs the way
PyG's does and combines the results. The wrapped layers are stored under PyG's keys
(``convs.<src___rel___dst>``), so ``load_state_dict(pyg_hetero_conv.state_dict())``
copies a PyG model whose layers have gnnfuse counterparts.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn

from ..graph.hetero import EdgeType
from .torchscript import NotScriptable

_GROUPINGS = ("sum", "mean", "min", "max", "cat", None)


def module_key(key: str | EdgeType, container: type = nn.ModuleDict) -> str:
    """PyG's ``ModuleDict`` (or, with ``container=nn.ParameterDict``, ``ParameterDict``)
    key of a node or edge type: an edge type as ``<src___rel___dst>``, a name the torch
    container reserves wrapped in ``<>``, and dots as ``#`` (torch refuses them)."""
    if isinstance(key, tuple):
        key = f"<{'___'.join(key)}>"
    if key in _reserved_names(container):
        key = f"<{key}>"
    return key.replace(".", "#")


def refuse_shared_keys(types: Iterable[str | EdgeType], key: Callable[[Any], str], layer: str) -> None:
    """Refuse two node or edge types that ``key`` stores under one container key (``('a',
    'r_', 'b')`` and ``('a', 'r', '_b')`` are both ``<a___r____b>``; ``'a.b'`` and ``'a#b'``
    both ``a#b``): the container would keep one entry for both, so HeteroConv ran the
    second relation's layer for the first one too and HGTConv shared one ``p_rel``
    between them, silently (PyG's HeteroConv dropped the first relation; its HGTConv
    shares too)."""
    seen: dict[str, Any] = {}
    for t in types:
        other = seen.setdefault(key(t), t)
        if other != t:
            raise ValueError(f"{layer}: the types {other!r} and {t!r} are both stored under the key {key(t)!r} "
                             "(PyG's naming joins a type's names with underscores and turns '.' into '#'), so "
                             "their parameters would be one; rename one of them")


@functools.cache
def _reserved_names(container: type) -> frozenset[str]:
    """The attribute names of a torch container, its instances' own included: PyG reserves
    the class's only, so a node type named after an instance attribute (``training``)
    failed HGTConv's construction with torch's "attribute 'training' already exists"
    (PyG's HGTConv fails so too). Such a name gets ``<>`` as the class's names do."""
    return frozenset(dir(container()))


def group(outputs: list[torch.Tensor], aggr: str | None) -> torch.Tensor:
    """PyG's grouping of the outputs several relations give one node type: stacked on a
    new dim 1 (``aggr=None``), concatenated (``"cat"``) or reduced element-wise."""
    if aggr is None:
        return torch.stack(outputs, dim=1)
    if len(outputs) == 1:
        return outputs[0]
    if aggr == "cat":
        return torch.cat(outputs, dim=-1)
    out = getattr(torch, aggr)(torch.stack(outputs, dim=0), dim=0)
    return out[0] if isinstance(out, tuple) else out


class EdgeTypeModuleDict(nn.ModuleDict):
    """A torch ``ModuleDict`` under PyG's keys (`module_key`) that also answers an edge type
    tuple, as PyG's ``ModuleDict`` does. PyG's ``set_hetero_masks`` (``to_captum_model``'s
    CaptumHeteroModel, custom explainers) finds a relation's layer by ``edge_type in convs``
    and ``convs[edge_type]``; a plain ``ModuleDict`` answered no, so the layers got no edge
    mask -- and gnnfuse's layers no refusal -- without an error. An entry may be set or
    deleted by its edge type too (``convs[("a", "r", "b")] = layer``), as in PyG, where
    torch refused the tuple; `edge_type` gives each key's edge type back."""

    def __init__(self, modules: Mapping[str | EdgeType, nn.Module] | None = None):
        super().__init__()
        self._edge_types: dict[str, EdgeType] = {}     # a key set from a tuple -> that tuple
        for key, module in (modules or {}).items():
            self[key] = module

    def __getitem__(self, key: str | EdgeType) -> nn.Module:
        return super().__getitem__(module_key(key) if isinstance(key, tuple) else key)

    def __setitem__(self, key: str | EdgeType, module: nn.Module) -> None:
        if isinstance(key, tuple):
            stored, key = module_key(key), tuple(key)
            refuse_shared_keys([self._edge_types.get(stored, key), key], module_key, "HeteroConv")
            self._edge_types[stored] = key
            key = stored
        super().__setitem__(key, module)

    def __delitem__(self, key: str | EdgeType) -> None:
        key = module_key(key) if isinstance(key, tuple) else key
        super().__delitem__(key)
        self._edge_types.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(module_key(key) if isinstance(key, tuple) else key)

    def edge_type(self, key: str) -> EdgeType:
        """The edge type stored under ``key``: the tuple it was set by, else read back from
        the key as PyG's ``ModuleDict.to_external_key`` reads it (a key set as a string)."""
        known = self._edge_types.get(key)
        if known is not None:
            return known
        name = key.replace("#", ".")
        if name[:1] == "<" and name[-1:] == ">" and name[1:-1] in _reserved_names(nn.ModuleDict):
            name = name[1:-1]
        parts = tuple(name[1:-1].split("___")) if name[:1] == "<" and name[-1:] == ">" else ()
        if len(parts) != 3:
            raise ValueError(f"HeteroConv: the layer stored under the key {key!r} names no edge type (PyG's "
                             "form is '<src___rel___dst>'); set it as convs[(src, rel, dst)] = layer")
        return parts


class HeteroConv(NotScriptable, nn.Module):
    """``HeteroConv({(src, rel, dst): layer}, aggr="sum")`` with PyG's semantics.

    ``forward(x_dict, edge_index_dict, *more_dicts, **name_dicts)``: for every edge type
    with a layer and an entry in some positional or keyword dict, the layer is called with
    its edge type's entries -- a node-type dict entry as ``x`` when source and
    destination types agree, else as the pair ``(x_src, x_dst)`` -- and keyword dicts
    ``<name>_dict`` passed as ``<name>=``. Outputs for one destination type are grouped
    with ``aggr`` (``"sum"``, ``"mean"``, ``"min"``, ``"max"``, ``"cat"`` or None: stacked).
    """

    def __init__(self, convs: Mapping[EdgeType, nn.Module], aggr: str | None = "sum"):
        super().__init__()
        if aggr not in _GROUPINGS:
            raise ValueError(f"HeteroConv: aggr must be one of {list(_GROUPINGS)}, got {aggr!r}")
        for edge_type, conv in convs.items():
            src, _, dst = edge_type
            if src != dst and getattr(conv, "add_self_loops", False):
                raise ValueError(f"'add_self_loops' attribute set to 'True' on module '{conv}' for use with edge "
                                 f"type(s) '{edge_type}'. This will lead to incorrect message passing results.")
        unchanged = {t[0] for t in convs} - {t[-1] for t in convs}
        if unchanged:
            warnings.warn(f"There exist node types ({unchanged}) whose representations do not get updated during "
                          "message passing as they do not occur as destination type in any edge type. This may "
                          "lead to unexpected behavior.", stacklevel=2)
        refuse_shared_keys([tuple(t) for t in convs], module_key, "HeteroConv")
        self.convs = EdgeTypeModuleDict({tuple(t): conv for t, conv in convs.items()})
        self.aggr = aggr

    @property
    def edge_types(self) -> list[EdgeType]:
        """The edge types of the layers held now: as PyG's, a call runs the layers in
        ``convs`` when it is made, so one set or deleted after construction is run or
        left out (a relation added afterwards was ignored, silently: 2.0 off PyG)."""
        return [self.convs.edge_type(key) for key in self.convs.keys()]

    def reset_parameters(self) -> None:
        for conv in self.convs.values():
            conv.reset_parameters()

    def forward(self, *args_dict: Mapping, **kwargs_dict: Mapping) -> dict[str, torch.Tensor]:
        for name in kwargs_dict:
            if not name.endswith("_dict"):
                raise ValueError(f"Keyword arguments in 'HeteroConv' need to end with '_dict' (got '{name}')")
        outputs: dict[str, list[torch.Tensor]] = {}
        convs = self.convs
        for key, conv in convs.items():
            edge_type = convs.edge_type(key)
            src, _, dst = edge_type
            args, used = [], False
            for values in args_dict:
                value, edge_level = _entry(values, edge_type)
                used |= edge_level
                if value is not _MISSING:
                    args.append(value)
            kwargs = {}
            for name, values in kwargs_dict.items():
                value, edge_level = _entry(values, edge_type)
                used |= edge_level
                if value is not _MISSING:
                    kwargs[name[:-len("_dict")]] = value
            if not used:     # PyG skips an edge type no dict has an entry for
                continue
            try:
                out = conv(*args, **kwargs)
            except Exception as exc:
                _name_relation(exc, edge_type, conv, args_dict, kwargs_dict)
                raise
            outputs.setdefault(dst, []).append(out)
        return {t: group(outs, self.aggr) for t, outs in outputs.items()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_relations={len(self.convs)})"


_MISSING = object()


def _name_relation(exc: Exception, edge_type: EdgeType, conv: nn.Module, args_dict: tuple[Mapping, ...],
                   kwargs_dict: Mapping[str, Mapping]) -> None:
    """Add to an error a relation's layer raised which edge type's layer it was, and which
    node-level dict (keyed by node type) lacks one of its ends: the layer's own message
    names neither (a ``(None, x_dst)`` pair it was handed, a matmul's shapes). A note
    (Python 3.11+), so the error keeps its type and message."""
    if not hasattr(exc, "add_note"):
        return
    exc.add_note(f"HeteroConv: raised by the {type(conv).__name__} of edge type {edge_type}")
    named = [("x_dict" if i == 0 else f"dict argument {i}", d) for i, d in enumerate(args_dict)]
    for name, values in named + list(kwargs_dict.items()):
        if values and all(isinstance(key, str) for key in values):
            for t in dict.fromkeys((edge_type[0], edge_type[-1])):
                if t not in values:
                    exc.add_note(f"HeteroConv: {name} has no entry for node type {t!r} (it holds {list(values)})")


def _entry(values: Mapping, edge_type: EdgeType) -> tuple[Any, bool]:
    """What one dict argument gives a relation's layer, and whether it was an edge-level
    entry (only those make a relation run): the edge type's own entry, else the node
    type's entry when both ends share it, else the (source, destination) pair."""
    src, _, dst = edge_type
    if edge_type in values:
        return values[edge_type], True
    if src == dst and src in values:
        return values[src], False
    if src in values or dst in values:
        return (values.get(src), values.get(dst)), False
    return _MISSING, False
