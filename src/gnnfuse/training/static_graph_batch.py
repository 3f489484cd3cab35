"""The captured step's own copy of a padded batch of whole graphs, rewritten per batch.

`GraphStepCapture` replays a graph-classification step from a CUDA graph, which reads
and writes fixed memory. A `StaticGraphBatch` is that memory: a copy of the first padded
batch (`loader.padded_graph_batch`), into whose tensors every later batch of the same
shapes is copied (`load`), and one `Graph` over its ``edge_index``, marked padded
(`graph.fixed_shape`), whose layouts -- the CSR, the degrees, the reverse CSR, the
Triton kernels' whole-row segments -- are rebuilt inside the step (`complete`), without
a host sync, into the tensors of their first build: the captured sorts then regroup each
new batch's edges, and the captured kernels read the result where they were recorded
reading.

The layers find that graph the way they find any ``edge_index``'s, through the index
cache (`graph.index_cache.remember`): the step passes ``batch.edge_index``, a plain
tensor, as with PyG's ``DataLoader``. A layer that would derive a graph of data-dependent
size from it builds a fixed-shape one instead (attention and GCN self loops,
`nn.padded_loops`), once per step (`fixed_shape.per_step`), so the graph replays that
too; anything else a step caches
on the graph is reported (`added_cache_keys`) and keeps the step eager, as a replay
would reuse it from the first batch.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from ..graph import Graph
from ..graph.fixed_shape import STEP_KEYS, begin_step, mark_padded
from ..graph.index_cache import remember
from ..loader.padded_graph_batch import padded_capacities
from ..loader.static_shapes import DERIVED_KEYS, build_layouts, copy_into


def _structure(batch: Any) -> tuple[list[torch.Tensor], list]:
    """The batch's tensors in key order, and each one's (key, shape, dtype, stride,
    device) -- any other value (its vertex count) as it is -- with the padded capacities:
    what another batch must share to be copied in."""
    tensors, layout = [], []
    for key in sorted(batch.keys()):
        value = batch[key]
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            layout.append((key, tuple(value.shape), value.dtype, value.stride(), value.device))
        else:
            layout.append((key, value))
    return tensors, [*layout, ("capacities", padded_capacities(batch))]


class StaticGraphBatch:
    """A padded graph batch's copy and its graph (see the module doc)."""

    def __init__(self, batch: Any) -> None:
        capacities = padded_capacities(batch)
        if capacities is None:
            raise ValueError("a static graph batch is made from a padded batch (DataLoader(static_shapes=True))")
        self.batch = copy.deepcopy(batch)
        self._tensors, self._layout = _structure(self.batch)
        edge_index = self.batch.edge_index
        if edge_index.dtype != torch.int64:
            raise ValueError(f"a captured step's edge_index must be int64 (PyG's), got {edge_index.dtype}")
        # endpoints over the tensor's memory, not views of the tensor object: the index
        # cache keeps the graph while that object lives, which a view would keep alive
        ends = edge_index.detach()
        self.graph = mark_padded(Graph._of_valid_ids(ends[0], ends[1], capacities.nodes))
        self._base_keys = tuple(self.graph._cache)
        remember(edge_index, self.graph.num_nodes, self.graph)

    def complete(self) -> Any:
        """The static batch, its graph's layouts (re)built in place: what the step runs
        on. A shallow copy, its tensors the static ones: a step that assigns an attribute
        (``batch.x = batch.x.float()``) rebinds the copy's, not the static batch's, whose
        tensor would otherwise be the one the next step reads instead of its batch's.
        What layers derive from the graph per step (the self-looped graph of GCN's and
        GAT's layers) is built once in the step, by its first layer (`fixed_shape.per_step`)."""
        begin_step(self.graph)
        build_layouts(self.graph, grouping=True)
        return copy.copy(self.batch)

    def load(self, batch: Any, short: bool = False) -> str | None:
        """Copy ``batch`` into the static one; or say why it cannot (then nothing is
        copied). A batch of fewer graphs (the epoch's last) has the same padded shapes,
        so ``short`` changes nothing here."""
        if padded_capacities(batch) is None:
            return ("the batch is not padded (over the loader's capacities, or its graph count is its vertex or edge "
                    "count: loader.padded_graph_batch)")
        sources, layout = _structure(batch)
        if layout != self._layout:
            differs = next((a[0] for a, b in zip(layout, self._layout) if a != b), "its keys")
            return f"it differs from the captured batch at {differs}"
        copy_into(self._tensors, sources)
        self.graph._reseal()          # its layouts are rebuilt from the new edges by `complete`, in the step
        remember(self.batch.edge_index, self.graph.num_nodes, self.graph)
        return None

    def added_cache_keys(self) -> list[str]:
        """Keys a step cached on the static graph beyond the layouts `complete` rebuilds."""
        cache = self.graph._cache
        ours = {DERIVED_KEYS, STEP_KEYS, *cache.get(DERIVED_KEYS, ()), *cache.get(STEP_KEYS, ())}
        return [f"edge_index's graph: {key!r}" for key in cache if key not in self._base_keys and key not in ours]
