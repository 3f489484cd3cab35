"""A PyG ``Data``'s other attributes on the loader's batches.

PyG's ``NeighborLoader`` hands out every node-level attribute of the ``Data`` cut to the
sample by ``n_id`` (``batch.train_mask``, ``batch.node_year``, ...), every edge-level
one by ``e_id``, and the graph-level rest as it is (a copy of the ``Data`` with those
replaced); PyG code reads them (a loss masked by ``batch.train_mask``). The loader
itself handles ``x``, ``y`` and the edge tables (`loader.batch_maker`); the rest are
listed here once, by PyG's own rule (``Data.is_node_attr``/``is_edge_attr``, which tell
node from edge attributes by their size along ``Data.__cat_dim__``, the name deciding
when the graph has as many edges as vertices), and gathered on a batch only when read:
a loop that never reads them pays nothing, and worker processes never see them (the
loader attaches them to each batch in the training process).

Each read takes the ``Data``'s attribute as it is then, as PyG's loader, which reads the
``Data`` at every batch: ``data.train_mask = new_mask`` between epochs reaches later
batches (the table seen at construction had been kept, so they read the old mask). The
``Data`` is held by a weak reference, which a pickled batch drops: it keeps the tables it
was made with. A name's level is decided again once the ``Data`` holds another object under
it, as PyG's loader decides it on its copy of the ``Data`` at every batch (``Data``'s cache
of levels is dropped by the copy and, for a name, by assigning it): a node-level table
replaced by an edge-level one is cut by ``e_id``. A name deleted from the ``Data`` since is
missing on the batch, as on PyG's (not its old table).
A name the ``Data`` was given since (``data.train_mask = ...`` after the loader was built)
comes too, as on PyG's: looked up on the ``Data`` when a batch is asked for a name it does
not know, its level decided then, so a loop that adds nothing pays nothing. An edge-level
one needs the edge ids the loader keeps only when it was built with edge tables or
edge-level attributes: without, it is refused by name (the loader is to be built again).

A table is gathered where the batch is. A table elsewhere is copied there once, on its
first read, and that copy is kept while the table is the same tensor, unchanged (its
version counter), so an in-place change to the ``Data``'s table reaches later batches, as
in PyG, without a copy or a host sync per batch.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..graph import Graph

# what the loader or the batch handles itself (`NeighborLoader`, `MiniBatch`)
HANDLED = frozenset({"x", "y", "edge_index", "edge_attr", "edge_weight", "num_nodes"})
DATASET_MASKS = ("train_mask", "val_mask", "test_mask")      # a gnnfuse NodeDataset's node-level tensors
# a Data's own ids, which PyG's batch keeps (cut to the sample) where gnnfuse's batch has the sampled positions
OWN_IDS = ("n_id", "e_id")


def _check_own_ids(name: str, ids: Any, count: int) -> None:
    """Refuse a ``Data``'s own ``n_id`` / ``e_id`` unless it holds the positions
    ``0..count-1`` (PyG's ``data.n_id = torch.arange(num_nodes)`` idiom): PyG's batch
    gives the ``Data``'s ids cut to the sample, gnnfuse's ``batch.n_id`` / ``batch.e_id``
    the sampled positions, which would hide other ids without a word."""
    if isinstance(ids, torch.Tensor) and ids.dim() == 1 and ids.numel() == count and bool(
            (ids == torch.arange(count, device=ids.device)).all()):
        return
    raise ValueError(f"the Data's own {name} is not 0..{count - 1}: PyG's loader gives batch.{name} as the Data's "
                     f"{name} cut to the sample, gnnfuse's batch.{name} are the sampled positions; store other ids "
                     f"under another name (data.orig_{name} = ...), which batches cut as PyG's, and del data.{name}")


@dataclass(eq=False)
class DataAttributes:
    """The tables (name -> (table, dimension its rows run along)) of the node-level
    attributes, read by ``n_id``, and of the edge-level ones, read by ``e_id``; the
    graph-level ones (``whole``: neither, a title or a class count), which PyG's batch
    keeps as they are; ``refused`` names node- or edge-level ones that are not tensors
    (a list per vertex), with why. ``source`` (a weak reference to the PyG ``Data``)
    gives each attribute's current value, and those it was given since; the tables above
    serve without it. ``loader`` names the loader in errors; ``listed`` holds the object
    each name's level was decided from (a ``Data``'s only)."""
    node: dict[str, tuple[torch.Tensor, int]]
    edge: dict[str, tuple[torch.Tensor, int]]
    whole: dict[str, Any] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    source: Callable[[], Any] | None = None
    loader: str = "NeighborLoader"
    listed: dict[str, Any] = field(default_factory=dict)
    _copies: dict[tuple[str, torch.device], tuple[torch.Tensor, int | None, torch.Tensor]] = field(
        default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the weak reference (nor the device copies): the tables as they
        are now, each at its level now."""
        data = None if self.source is None else self.source()
        for name in list(self.listed) if data is not None else ():
            if name in data:
                self._relist(data, name)        # each table now the Data's (a deleted one: as last seen)
        return {**self.__dict__, "source": None, "_copies": {}}

    def __contains__(self, name: str) -> bool:
        return any(name in names for names in (self.node, self.edge, self.whole, self.refused)) or self._added(name)

    def _added(self, name: str) -> bool:
        """Whether the ``Data`` was given ``name`` since construction (PyG's batch, a copy
        of the ``Data`` as it is, carries it); if so it is listed now, by the same rule."""
        data = None if self.source is None else self.source()
        if data is None or name in HANDLED or name in OWN_IDS or name not in data:
            return False
        self._list(data, name)
        return True

    def _relist(self, data: Any, name: str) -> None:
        """List ``name`` again where the ``Data`` holds another object under it than the one
        its level was decided from (PyG's loader decides levels afresh at every batch)."""
        if data[name] is not self.listed.get(name, self.listed):
            for names in (self.node, self.edge, self.whole, self.refused):
                names.pop(name, None)
            self._list(data, name)

    def _list(self, data: Any, name: str) -> None:
        """Put the PyG ``Data``'s attribute ``name`` where it belongs: node- or edge-level by
        PyG's rule (a tensor, or refused with why), graph-level otherwise; ``listed``
        records the object decided on."""
        level = self.node if data.is_node_attr(name) else self.edge if data.is_edge_attr(name) else None
        value = self.listed[name] = data[name]
        if level is None:
            self.whole[name] = value
        elif isinstance(value, torch.Tensor):
            level[name] = (value, data.__cat_dim__(name, value))
        else:
            self.refused[name] = (f"the Data's {name} is a {type(value).__name__} with an entry per "
                                  f"{'vertex' if level is self.node else 'edge'}; the loader's batches cut tensors "
                                  f"only")

    def rows(self, name: str, n_id: torch.Tensor, e_id: Callable[[], torch.Tensor]) -> Any:
        """Attribute ``name`` of the batch whose vertices are ``n_id`` (its edges ``e_id()``,
        asked for only for an edge-level attribute), on ``n_id``'s device (a graph-level
        tensor too, as PyG's ``batch.to`` would move it; other values as they are)."""
        data = None if self.source is None else self.source()
        if data is not None:
            if name not in data:       # PyG's batch, a copy of the Data now, lacks it too
                raise AttributeError(f"batch.{name}: data.{name} was deleted after the loader was built, so the "
                                     f"batch has none, as PyG's would not")
            self._relist(data, name)        # the tables below now hold the Data's current values
        if name in self.refused:
            raise TypeError(f"batch.{name}: {self.refused[name]}")
        if name in self.whole:
            value = self.whole[name]
            return self._on(name, value, n_id.device) if isinstance(value, torch.Tensor) else value
        table, dim = self.node[name] if name in self.node else self.edge[name]
        try:
            ids = n_id if name in self.node else e_id()
        except AttributeError:      # edge-level, given since: the loader keeps no edge ids
            raise RuntimeError(f"batch.{name}: data.{name} (an edge-level attribute) was set after this {self.loader} "
                               f"was built, which then had no edge table nor edge-level attribute and so keeps no "
                               f"edge ids to cut it by. Build a new {self.loader} on the Data") from None
        return self._on(name, table, ids.device).index_select(dim, ids)

    def _on(self, name: str, table: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``table`` on ``device``: itself, or its copy there (made anew once it has changed
        or is another tensor)."""
        if table.device == device:
            return table
        version = None if table.is_inference() else table._version
        kept = self._copies.get((name, device))
        if kept is None or kept[0] is not table or kept[1] is None or kept[1] != version:
            kept = self._copies[(name, device)] = (table, version, table.to(device))
        return kept[2]


def data_attributes(data: Any, loader: str = "NeighborLoader") -> DataAttributes | None:
    """The attributes of ``data`` beyond those the loader (named ``loader`` in errors)
    handles: a PyG ``Data``'s (node- and edge-level ones by PyG's rule, the rest
    graph-level, and any it is given later), a gnnfuse ``NodeDataset``'s split masks;
    None for anything else (a bare `Graph`) or for a ``NodeDataset`` without masks."""
    if callable(getattr(data, "is_node_attr", None)) and callable(getattr(data, "is_edge_attr", None)):    # PyG Data
        attributes = DataAttributes({}, {}, source=weakref.ref(data), loader=loader)
        for name in data.keys():
            if name in HANDLED:
                continue
            if name in OWN_IDS:
                _check_own_ids(name, data[name], data.num_nodes if name == "n_id" else data.num_edges)
            attributes._list(data, name)
        return attributes
    if isinstance(getattr(data, "graph", None), Graph):      # gnnfuse NodeDataset
        node = {name: (mask, 0) for name in DATASET_MASKS
                if isinstance(mask := getattr(data, name, None), torch.Tensor)}
        return DataAttributes(node, {}, loader=loader) if node else None
    return None
