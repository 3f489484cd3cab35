"""The tables a loader took from a PyG ``Data`` (or ``HeteroData``), watched for replacement.

PyG's loaders read ``data.x``, ``data.y`` and the edge tables when each batch is made,
so ``data.x = new_x`` between epochs reaches PyG's next batches. gnnfuse's loader takes
those tables when it is built (placed on the feature device, shared with worker
processes, page-locked), so a tensor assigned afterwards would silently not be used. An
in-place change is read, as in PyG, where the loader holds the same tensor; where it
holds a copy, the change is refused (`CopiedTables`), and so is a replacement, by name
when the next batch is asked for. So is a table the
``Data`` lacked then and was given since (``data.edge_weight = w``): PyG's batches carry
it, gnnfuse's said ``None`` for it, and a layer taking it as optional (GCNConv's
``edge_weight``, GATConv's ``edge_attr``) ran without it. The ``edge_index`` is watched
for both: the loader samples a CSR built from it when it was made (as PyG's sampler
does), so a new or edited one reaches no batch, while the edge tables its batches cut
by ``e_id`` are read now -- an ``edge_attr`` permuted with its edges would be cut by
the old edge ids, belonging to other edges. Weak references throughout: watching keeps
neither the ``Data`` nor its old tables alive.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

WATCHED = ("x", "y", "edge_attr", "edge_weight")
_ABSENT = object()       # a HeteroData attribute not there (`HeldHeteroData`)


class HeldTables:
    """The tensors ``data`` held under `WATCHED` names when the loader took them (None
    for a name it held no tensor under)."""

    def __init__(self, data: Any, names: tuple[str, ...]):
        self._data = weakref.ref(data)
        self._tables = {name: weakref.ref(table) if isinstance(table := getattr(data, name, None), torch.Tensor)
                        else None for name in names}
        edge_index = data.edge_index        # a tensor: the loader built its graph from it
        self._edge_index = weakref.ref(edge_index)
        self._edge_version = None if edge_index.is_inference() else edge_index._version

    def check(self, loader: str) -> None:
        """Raise if the ``Data`` (still alive) now holds another tensor under a taken name."""
        data = self._data()
        if data is None:
            return
        for name, taken in self._tables.items():
            now = getattr(data, name, None)
            if taken is None and isinstance(now, torch.Tensor):
                raise RuntimeError(
                    f"data.{name} was set after this {loader} was built: the loader took no {name} (the Data had "
                    f"none), so its batches would not carry it, where PyG's loader would read it. Build a new "
                    f"{loader} on the Data")
            if taken is not None and now is not taken():
                raise RuntimeError(
                    f"data.{name} was replaced after this {loader} was built: the loader holds the tensor it was "
                    f"given (placed for its batches), so the new one would reach no batch, where PyG's loader "
                    f"would read it. Build a new {loader} on the Data, or change the table in place "
                    f"(data.{name}.copy_(new), data.{name}[rows] = ...)")
        edge_index = self._edge_index()
        if data.edge_index is not edge_index or (self._edge_version is not None
                                                 and edge_index._version != self._edge_version):
            how = "replaced" if data.edge_index is not edge_index else "changed in place"
            raise RuntimeError(
                f"data.edge_index was {how} after this {loader} was built: the loader samples a CSR built from "
                f"the edge_index it was given, so the change would reach no batch (whose edge tables would be cut "
                f"from the new edges by the old edge ids). Build a new {loader} on the Data")


def held_tables(data: Any, given: dict[str, Any]) -> HeldTables | None:
    """What to watch on ``data``: the `WATCHED` tables a PyG ``Data`` supplied (not those
    given to the loader by keyword, in ``given``); None for anything but a PyG ``Data``."""
    if not (callable(getattr(data, "is_node_attr", None)) and hasattr(data, "edge_index")):
        return None
    return HeldTables(data, tuple(name for name in WATCHED if given.get(name) is None))


class CopiedTables:
    """The tables a loader keeps as copies of the ones it was given (moved to its
    ``device``, page-locked for zero-copy reads), with each original's version counter
    then. An in-place change to the original, which the README promises reaches later
    batches, would reach no batch through a copy: refused by name at the next batch."""

    def __init__(self) -> None:
        self._watched: dict[str, tuple[weakref.ref, int]] = {}

    def placed(self, name: str, original: torch.Tensor | None, placed: torch.Tensor | None
               ) -> torch.Tensor | None:
        """``placed`` (the loader's table for ``original``), watched if it is a copy."""
        if original is not None and placed is not None and placed.untyped_storage().data_ptr() != \
                original.untyped_storage().data_ptr() and not original.is_inference():
            self._watched[name] = (weakref.ref(original), original._version)
        return placed

    def check(self, loader: str) -> None:
        for name, (taken, version) in self._watched.items():
            original = taken()
            if original is not None and original._version != version:
                raise RuntimeError(
                    f"the {name} table was changed in place after this {loader} copied it (to "
                    f"{'page-locked memory' if original.device.type == 'cpu' else 'another device'} for its "
                    f"batches), so the change would reach no batch: build a new {loader} after changing it, or "
                    f"keep the table where the loader reads it in place (on the loader's device, or "
                    f"feature_device='pinned' with a page-locked table)")


class HeldHeteroData:
    """What a `HeteroNeighborLoader` took from a ``HeteroData``, watched the same way: each
    edge type's ``edge_index`` (the loader samples CSRs built from it when it was made,
    so a new one, or one changed in place, would reach no batch) and, with worker processes (``every_attribute``),
    every attribute of every store: the workers cut batches from the ``HeteroData`` as
    it was pickled to them, so a tensor replaced, added or removed here would not reach
    their batches, where batches made in this process (and PyG's) read it."""

    def __init__(self, data: Any, every_attribute: bool):
        self._data = weakref.ref(data)
        self._every_attribute = every_attribute
        self._held = self._attributes(data)
        # each edge_index's version counter: an in-place change (edge_index.copy_(new))
        # reaches no CSR either, and the batches cut its edges' attributes by the old ids
        self._versions = {(store._key, "edge_index"): store.edge_index._version for store in data.edge_stores
                          if isinstance(store.get("edge_index"), torch.Tensor) and not store.edge_index.is_inference()}

    def _attributes(self, data: Any) -> dict[tuple[Any, str], Any]:
        """(store key, name) -> a weak reference to each watched tensor, the value itself
        for anything else (``num_nodes``, a graph-level string)."""
        held = {}
        for store in data.stores:
            for name, value in store.items():
                if self._every_attribute or name == "edge_index":
                    held[store._key, name] = weakref.ref(value) if isinstance(value, torch.Tensor) else value
        return held

    def check(self, loader: str) -> None:
        """Raise, naming the first, if the ``HeteroData`` (still alive) changed what it holds."""
        data = self._data()
        if data is None:
            return
        now = self._attributes(data)
        for where in {**self._held, **now}:
            before, after = self._held.get(where, _ABSENT), now.get(where, _ABSENT)
            same = (before() is after() if isinstance(before, weakref.ref) and isinstance(after, weakref.ref)
                    else not isinstance(before, weakref.ref) and not isinstance(after, weakref.ref)
                    and _equal(before, after))
            if not same:
                store = "data" if where[0] is None else f"data[{where[0]!r}]"
                what = "added" if before is _ABSENT else "removed" if after is _ABSENT else "replaced"
                if where[1] == "edge_index":
                    raise RuntimeError(
                        f"{store}.edge_index was {what} after this {loader} was built: its CSRs are built from the "
                        f"edge_index it was given, so the change would reach no batch. Build a new {loader} on the "
                        f"HeteroData")
                raise RuntimeError(
                    f"{store}.{where[1]} was {what} after this {loader} was built: its num_workers processes cut "
                    f"batches from the HeteroData as it was when they were given it, so the change would reach no "
                    f"batch, where PyG's loader would read it. Build a new {loader} on the HeteroData, or change "
                    f"the tensor in place ({store}.{where[1]}.copy_(new), ...[rows] = ...)")
        for (key, name), version in self._versions.items():
            if data[key][name]._version != version:
                raise RuntimeError(
                    f"data[{key!r}].edge_index was changed in place after this {loader} was built: its CSRs are "
                    f"built from the edge_index as it was, so the change would reach no batch (whose edge "
                    f"attributes would be cut from the changed edges by the old ids). Build a new {loader} on the "
                    f"HeteroData")


def _equal(before: Any, after: Any) -> bool:
    """Whether two non-tensor attribute values are the same (an int, a string, a list)."""
    try:
        return before is after or bool(before == after)
    except Exception:      # noqa: BLE001 - a value without a plain == (a NumPy array): identity only
        return False
