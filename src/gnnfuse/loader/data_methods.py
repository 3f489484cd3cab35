"""PyG ``Data``'s read-only accessors on the loader's batches: ``keys()``, ``'x' in
batch``, ``batch['x']``, ``for key, value in batch``, ``num_edges``, ``num_node_features`` / ``num_features`` and
``num_edge_features``.

Code written for PyG's loader logs or branches on these (``if 'edge_attr' in batch``,
``batch.num_edges`` in a progress line); on a gnnfuse batch they raised a bare
AttributeError or TypeError. A batch class lists what it holds in ``_data_keys`` (names
only: listing builds no PyG view and gathers no attribute); the rest follows PyG's
definitions, reading the attributes themselves, so a padded batch refuses
``num_edges`` as it refuses ``edge_index``.
"""
from __future__ import annotations

from typing import Any, Iterator

import torch


class PygDataMethods:
    """The accessors; a subclass defines ``_data_keys``."""

    def _data_keys(self) -> list[str]:
        raise NotImplementedError

    def keys(self) -> list[str]:
        """PyG's: the names of the attributes this batch holds (None-valued ones left out)."""
        return self._data_keys()

    def __contains__(self, key: str) -> bool:
        return key in self._data_keys()

    def __getitem__(self, key: str) -> Any:
        """PyG's ``batch['x']``: the attribute ``key``; KeyError for one the batch lacks."""
        if not isinstance(key, str) or key not in self._data_keys():
            raise KeyError(f"{key!r}: this {type(self).__name__} holds {', '.join(self._data_keys())}")
        return getattr(self, key)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        """PyG's: each attribute's name and value (without it, ``__getitem__`` would make
        Python iterate by integer keys and fail with a KeyError of 0)."""
        for key in self._data_keys():
            yield key, getattr(self, key)

    @property
    def num_edges(self) -> int:
        """PyG's: the columns of ``edge_index`` (the sampled subgraph's edges)."""
        return self.edge_index.shape[1]

    @property
    def num_node_features(self) -> int:
        """PyG's: ``x``'s last dimension (1 for a vector, 0 without ``x``)."""
        return _feature_count(getattr(self, "x"))

    @property
    def num_features(self) -> int:
        """PyG's alias of `num_node_features`."""
        return self.num_node_features

    @property
    def num_edge_features(self) -> int:
        """PyG's: ``edge_attr``'s last dimension (1 for a vector, 0 without one)."""
        return _feature_count(getattr(self, "edge_attr"))


def _feature_count(table: torch.Tensor | None) -> int:
    if table is None:
        return 0
    return 1 if table.dim() == 1 else table.shape[-1]
