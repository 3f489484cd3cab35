"""PyG's ``DataLoader`` for batches of whole graphs, optionally padded to fixed shapes.

``from gnnfuse.loader import DataLoader`` is ``torch_geometric.loader.DataLoader``: the
same arguments, the same collated ``Batch`` objects. With ``static_shapes=True`` every
batch is also padded to capacities probed on a few random batches when the loader is
made (`loader.padded_graph_batch`), so that `training.GraphStepCapture` can replay the
training step from a CUDA graph instead of paying its Python and launches on every
batch of small graphs (the graph-classification step is bound by the host).

Either way the common batches -- plain ``Data`` graphs, from a list or an
``InMemoryDataset`` -- are collated with one tensor operation per attribute
(`loader.graph_collate`) rather than PyG's per-graph Python, into the same ``Batch``:
with the replayed step, collation was most of an epoch's host time. A worker process
sends a batch of plain dense tensors as one buffer (`loader.packed_batch`), not a file
descriptor per tensor.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch.utils.data
from torch_geometric.data import Batch
from torch_geometric.loader import DataLoader as PyGDataLoader

from .graph_collate import GraphSelection, collate_graphs, gather_graphs, selecting_view
from .packed_batch import for_transfer
from .padded_graph_batch import GraphCapacities, pad_graph_batch, probe_capacities, unpadded


class DataLoader(PyGDataLoader):
    """``DataLoader(dataset, batch_size=1, shuffle=False, follow_batch=None,
    exclude_keys=None, *, static_shapes=False, capacities=None, label_mask=False, **kwargs)``.

    Everything but the three keywords is PyG's ``DataLoader`` (and torch's: ``num_workers``,
    ``drop_last``, ...). ``static_shapes=True`` pads each batch (`pad_graph_batch`) to
    ``capacities`` (a `GraphCapacities`; by default probed on 16 random batches: 10%
    above the largest vertex and edge counts, plus 64, rounded up to a multiple of 128,
    with ``batch_size + 1`` graphs, one of them padding; with a ``batch_sampler``, its own
    ``batch_size``, and one without needs ``capacities``); a batch that does not fit, or
    whose graph count is also its vertex or edge count (one-vertex graphs), comes
    unpadded. ``loader.capacities`` holds them (None without ``static_shapes``).
    ``label_mask=True`` (with ``static_shapes``) pads a float, bool or unsigned label
    ``y`` too, and gives every batch ``y_mask`` for the loss to multiply in (regression:
    `padded_graph_batch`'s module doc).

    Without ``follow_batch``, batches of plain ``Data`` graphs are collated by
    `graph_collate` (the same ``Batch`` as PyG's, faster); over an ``InMemoryDataset``,
    ``loader.dataset`` is then a view of it (`graph_collate.selecting_view`: a subclass
    of its class over the same attributes) whose ``__getitems__`` hands the collater
    the batch's positions rather than its graphs.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 follow_batch: Sequence[str] | None = None, exclude_keys: Sequence[str] | None = None, *,
                 static_shapes: bool = False, capacities: GraphCapacities | None = None, label_mask: bool = False,
                 **kwargs: Any) -> None:
        if capacities is not None and not static_shapes:
            raise ValueError("capacities are the padded batches' shapes: pass static_shapes=True with them")
        if label_mask and not static_shapes:
            raise ValueError("label_mask masks the labels of padded batches: pass static_shapes=True with it")
        if static_shapes and follow_batch:
            raise ValueError(f"static_shapes cannot pad follow_batch's vectors ({', '.join(follow_batch)}): they "
                             f"hold graph ids per row of their attribute; use static_shapes=False")
        selecting = None if follow_batch else selecting_view(dataset)
        super().__init__(selecting or dataset, batch_size, shuffle, follow_batch, exclude_keys, **kwargs)
        self.capacities = None
        if static_shapes:
            batch_size = _batch_graphs(batch_size, kwargs.get("batch_sampler"), capacities)
            if capacities is None:
                capacities = probe_capacities(dataset, batch_size)
            elif capacities.graphs <= batch_size:
                raise ValueError(f"capacities hold {capacities.graphs} graphs, but a batch of {batch_size} "
                                 f"needs {batch_size + 1} (one is padding)")
            self.capacities = capacities
        if not follow_batch:        # (static_shapes refuses follow_batch)
            self.collate_fn = _GraphCollater(self.collate_fn, frozenset(exclude_keys or ()), self.capacities,
                                             label_mask)

    def plain_batches(self) -> Iterator[Any]:
        """One epoch of batches as PyG's ``DataLoader`` collates them: padded ones as
        `unpadded` views. What a statistic over the data set's graphs reads (gnnfuse.nn's
        ``PNAConv.get_degree_histogram(loader)``), which padded vertices and edges would
        change."""
        return (unpadded(batch) for batch in self)


def _batch_graphs(batch_size: int, batch_sampler: Any, capacities: GraphCapacities | None) -> int:
    """The graphs a batch holds, which the padded capacities are probed for: with a
    ``batch_sampler`` (torch then takes ``batch_size`` as 1) its own ``batch_size``, as
    torch's ``BatchSampler`` has. Why: probed for ``batch_size=1`` the capacities held 2
    graphs, no batch of 4 fitted, and every batch came unpadded (and every step ran
    eagerly) without a word. A sampler without one is refused unless ``capacities`` are
    given, which hold their own graph count."""
    if batch_sampler is None:
        return batch_size
    size = getattr(batch_sampler, "batch_size", None)
    if isinstance(size, int) and size > 0:
        return size
    if capacities is not None:
        return capacities.graphs - 1
    raise ValueError(f"static_shapes probes the padded shapes on batches of the batch sampler's size, but "
                     f"{type(batch_sampler).__name__} has no batch_size: pass capacities=GraphCapacities(nodes, "
                     f"edges, graphs) with graphs one above its largest batch")


class _GraphCollater:
    """`graph_collate`'s batch where it applies, else PyG's collater's; then
    `pad_graph_batch` to ``capacities`` if any. Picklable, for worker processes."""

    def __init__(self, collate: Any, exclude_keys: frozenset[str], capacities: GraphCapacities | None,
                 label_mask: bool = False) -> None:
        self.collate, self.exclude_keys, self.capacities = collate, exclude_keys, capacities
        self.label_mask = label_mask

    def __call__(self, items: Any) -> Any:
        batch = None
        if isinstance(items, GraphSelection):
            batch = gather_graphs(items, self.exclude_keys, self.capacities)
            if batch is None:
                items = items.graphs()
        elif isinstance(items, list):
            batch = collate_graphs(items, self.exclude_keys, self.capacities)
        if batch is None:
            batch = self.collate(items)
        if self.capacities is not None:
            batch = pad_graph_batch(batch, self.capacities, self.label_mask)
        if isinstance(batch, Batch) and torch.utils.data.get_worker_info() is not None:
            batch = for_transfer(batch)         # sent as one buffer where it can be
        return batch
