"""Batches of whole graphs collated with one tensor operation per attribute.

PyG's ``Batch.from_data_list`` is general, and pays for it per graph: for every graph
and attribute it asks the graph for its concatenation dimension and increment, and
infers the graph's vertex count anew each time. On the 2-core CI machine collating 128
molecule-sized graphs took 1.6 ms, and an ``InMemoryDataset`` (TU data sets, OGB's
molecules) took another 0.8 ms to hand them out one ``Data`` at a time; on an H200's
host the loader was most of an epoch whose training steps are replayed from a CUDA
graph (`results/graph_batches.md`). For the common case, the same ``Batch`` comes
cheaper:

- `collate_graphs`: plain ``Data`` graphs with the same tensor attributes, each
  graph's tensors read once, one ``torch.cat`` per attribute, the edge ids offset
  per graph in one addition;
- `gather_graphs`: graphs of an ``InMemoryDataset`` without a transform, which holds
  them collated already: each attribute's rows of the batch's graphs gathered by one
  ``index_select`` from the data set's tensors, no ``Data`` made per graph.
  `selecting_view` gives a loader a view of the data set (its attributes shared) whose
  ``__getitems__`` (which torch's loader calls once per batch) returns a
  `GraphSelection` instead of a list of graphs.

Each returns None where its case does not hold (a ``Data`` subclass, which may define
its own increments; an index attribute other than ``edge_index``; an explicit
``num_nodes``; vertices PyG does not count, a 0-dim ``x`` or ``feat`` rows without
edges; attributes that are not plain tensors or differ between graphs), and the
loader then collates as PyG does. The result is PyG's batch: the same attributes,
values and dtypes, the ``batch`` and ``ptr`` vectors, and the slice and increment
tables that ``get_example`` and ``to_data_list`` read (tests/test_graph_collate.py
compares every one against ``Batch.from_data_list``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..derived_class import derived_class
from .padded_graph_batch import ROOM

# The attributes PyG infers a graph's vertex count from, first found in the graph's
# order (``NodeStorage.num_nodes``'s ``N_KEYS``), and those of them taken here: the
# others (``batch``, ``n_id``, ``node_type``, ``tf``) are rare enough to leave to PyG
_VERTEX_COUNT_KEYS = frozenset({"x", "feat", "pos", "batch", "node_type", "n_id", "tf"})
_COUNTED_BY = frozenset({"x", "feat", "pos"})


def _plain_keys(keys: Sequence[str]) -> tuple[str, list[str]] | None:
    """(the key a graph's vertex count is read from, the keys to collate) for graphs
    with these attribute keys in this order, or None where PyG's rules for plain
    ``Data`` (``__cat_dim__``, ``__inc__``) would do more than concatenate rows and
    offset ``edge_index``: an explicit ``num_nodes``, other index keys, ``batch``/``ptr``
    keys, ``adj`` keys (which may be sparse)."""
    count_key = next((k for k in keys if k in _VERTEX_COUNT_KEYS), None)
    if count_key not in _COUNTED_BY:
        return None
    # PyG adds ``batch`` and ``ptr`` only where ``can_infer_num_nodes``: ``feat`` (which
    # it counts vertices by) is not among its keys, so graphs of ``feat`` rows without
    # edges or a 'node' key get no batch vector from PyG
    if count_key == "feat" and "edge_index" not in keys and not any("node" in k for k in keys):
        return None
    for key in keys:
        if key == "edge_index":
            continue
        if key == "num_nodes" or "index" in key or key == "face" or "batch" in key or key == "ptr" or "adj" in key:
            return None
    return count_key, list(keys)


def _integral(dtype: torch.dtype) -> bool:
    """Whether an ``edge_index`` of ``dtype`` is offset here; any other (float, complex,
    bool: offsets added in place kept a bool ``edge_index`` bool, where PyG's sum
    promotes it) goes to PyG's collation, whose batch is the one to match."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _exclusive_cumsum(counts: torch.Tensor) -> torch.Tensor:
    """Each entry's offset: the sum of the counts before it (PyG's ``cumsum(x)[:-1]``)."""
    out = counts.new_zeros(counts.numel())
    torch.cumsum(counts[:-1], 0, out=out[1:])
    return out


def _with_zero(counts: torch.Tensor) -> torch.Tensor:
    """``[0, c0, c0 + c1, ...]``: PyG's slices and ``ptr``."""
    out = counts.new_zeros(counts.numel() + 1)
    torch.cumsum(counts, 0, out=out[1:])
    return out


class _Room:
    """Where a batch that will be padded (`padded_graph_batch`) is collated: each
    attribute into the first rows of a buffer as long as its padded form, guessing its
    kind from its row count (the vertices', else the edges', else the graphs', as
    `pad_graph_batch` classifies), so that padding fills the rest in place instead of
    copying the batch once more. A guess padding disagrees with costs that copy only."""

    def __init__(self, capacities: Any, nodes: int, edges: int, graphs: int) -> None:
        fits = capacities is not None and capacities.fits(nodes, edges, graphs)
        self.rows = {} if not fits else {graphs: capacities.graphs, edges: capacities.edges, nodes: capacities.nodes}
        self.buffers: dict[str, torch.Tensor] = {}

    def out(self, key: str, rows: int, like: torch.Tensor) -> torch.Tensor | None:
        """Where ``key``'s ``rows`` rows shaped as ``like``'s go: a buffer's first rows,
        or None (made as usual) for a batch that will not be padded."""
        capacity = self.rows.get(rows)
        if capacity is None:
            return None
        buffer = like.new_empty((capacity, *like.shape[1:]))
        self.buffers[key] = buffer
        return buffer[:rows]


def _batch(keys: list[str], values: dict[str, torch.Tensor], slices: dict[str, torch.Tensor],
           nodes: torch.Tensor, device: torch.device | None, room: _Room) -> Any:
    """A PyG ``Batch`` of ``len(nodes)`` graphs holding ``values`` (collated, edge ids
    offset), with the ``batch`` and ``ptr`` vectors and the slice and increment tables
    ``Batch.from_data_list`` would give it; and ``room``'s buffers, for `pad_graph_batch`."""
    from torch_geometric.data import Batch, Data
    graphs = nodes.numel()
    out = Batch(_base_cls=Data)
    store = out._store
    for key in keys:
        store[key] = values[key]
    device = device or torch.device("cpu")
    vector = _repeated(torch.arange(graphs), nodes, int(nodes.sum())).to(device)      # each vertex's graph
    into = room.out("batch", vector.numel(), vector)
    store.batch = vector if into is None else into.copy_(vector)
    store.ptr = _with_zero(nodes).to(device)
    if room.buffers:
        out.__dict__[ROOM] = room.buffers
    zeros = torch.zeros(graphs, dtype=torch.long)
    out._num_graphs = graphs
    out._slice_dict = slices
    out._inc_dict = {key: _exclusive_cumsum(nodes) if key == "edge_index" else zeros for key in keys}
    return out


def _device_of(values: dict[str, torch.Tensor]) -> torch.device | None:
    """Where PyG makes the ``batch`` and ``ptr`` vectors: on the device of the last
    attribute on a GPU, else on the CPU (``collate``'s ``device``)."""
    device = None
    for value in values.values():
        if value.is_cuda:
            device = value.device
    return device


def collate_graphs(graphs: Sequence[Any], exclude_keys: frozenset[str] = frozenset(),
                   capacities: Any = None) -> Any | None:
    """``Batch.from_data_list(graphs, exclude_keys=exclude_keys)`` for plain ``Data``
    graphs with the same tensor attributes (and dtypes) in the same order; None otherwise (the
    caller then collates as PyG does, and raises its errors). With ``capacities`` (a
    `GraphCapacities`) the batch is collated with room to be padded to them (`_Room`)."""
    from torch_geometric.data import Data
    if not graphs or any(type(g) is not Data for g in graphs):
        return None
    names = graphs[0]._store._mapping.keys()
    plan = _plain_keys(tuple(names))
    if plan is None or any(g._store._mapping.keys() != names for g in graphs):
        return None
    count_key, keys = plan
    keys = [k for k in keys if k not in exclude_keys]
    columns = {key: [g._store._mapping[key] for g in graphs] for key in set(keys) | {count_key}}
    # Index, EdgeIndex and sparse tensors have PyG's own rules; a sparse tensor after a
    # strided one fails to concatenate, and goes to PyG that way. Rows of several dtypes
    # too: torch.cat promotes them, but into a `_Room` buffer (or PyG's shared memory
    # in a worker) they take the first graph's dtype
    if any(set(map(type, column)) != {torch.Tensor} or column[0].layout != torch.strided
           or len({v.dtype for v in column}) != 1 for column in columns.values()):
        return None
    if any(v.dim() == 0 for v in columns[count_key]):     # no rows to count: PyG raises its error
        return None
    try:
        counts = {key: [1] * len(graphs) if column[0].dim() == 0 else
                  [v.shape[1 if key == "edge_index" else 0] for v in column] for key, column in columns.items()}
        nodes = torch.tensor(counts[count_key])
        room = _Room(capacities, int(nodes.sum()), sum(counts["edge_index"]) if "edge_index" in counts else -1,
                     len(graphs))
        values, slices = {}, {}
        for key in keys:
            column = columns[key]
            if key == "edge_index":
                value = torch.cat(column, 1)
                if value.dim() != 2 or value.shape[0] != 2 or not _integral(value.dtype):
                    return None
                edges = torch.tensor(counts[key])
                value += _repeated(_exclusive_cumsum(nodes), edges, value.shape[1]).to(value.device, value.dtype)
                slices[key] = _with_zero(edges)
            elif column[0].dim() == 0:
                value = torch.stack(column, out=room.out(key, len(column), column[0].unsqueeze(0)))
                slices[key] = torch.arange(len(column) + 1)
            else:
                rows = sum(counts[key])
                value = torch.cat(column, out=room.out(key, rows, column[0]))
                slices[key] = _with_zero(torch.tensor(counts[key]))
            values[key] = value
    except (RuntimeError, IndexError):      # sizes that do not line up: PyG's error, raised by PyG
        return None
    return _batch(keys, values, slices, nodes, _device_of(values), room)


def _repeated(values: torch.Tensor, counts: torch.Tensor, total: int) -> torch.Tensor:
    """``values[g]`` repeated ``counts[g]`` times (integer values; ``total`` rows in all):
    each graph's change of value marked at its first row, then a running sum. Why not
    ``repeat_interleave`` or indexing: their CPU kernels split their loops over threads
    finely, and with the cores busy (the CI machine's two, shared) ``repeat_interleave``
    waited 9-12 ms a call for the other thread and indexing 2-3 ms, where this took
    8 us; ``repeat_interleave`` given values and no output size took 0.5 ms even idle."""
    changes = values.clone()
    changes[1:] -= values[:-1]
    marks = torch.zeros(total + 1, dtype=values.dtype, device=values.device)
    marks.index_add_(0, _exclusive_cumsum(counts), changes)
    return marks[:-1].cumsum(0)


def _positions(positions: list[Any], count: int) -> list[int] | None:
    """A batch's positions as ints, where each is one PyG's ``Dataset.__getitem__``
    reads as a graph's position in ``range(count)`` (an int, or a 0-dim integer tensor
    as ``SubsetRandomSampler`` over a tensor yields); None for any other (a negative
    position, PyG's last graph; a float, or one past the end, PyG's IndexError), which
    PyG then reads its own way."""
    if not positions:
        return None
    out = []
    for p in positions:
        if isinstance(p, torch.Tensor):
            if p.dim() or p.dtype.is_floating_point or p.dtype.is_complex:
                return None
            p = int(p)
        elif type(p) is not int:
            return None
        out.append(p)
    return out if 0 <= min(out) and max(out) < count else None


@dataclass(frozen=True)
class GraphSelection:
    """The graphs of a batch as a loader's ``__getitems__`` picks them from an
    ``InMemoryDataset`` (`selecting_view`): the data set and the positions drawn."""
    dataset: Any
    positions: list[int]

    def graphs(self) -> list[Any]:
        """The graphs one by one, as PyG's loader would have fetched them."""
        return [self.dataset[i] for i in self.positions]


def _select(view: Any, positions: list[int]) -> GraphSelection:
    """A selecting view's ``__getitems__``: the batch's positions as a `GraphSelection`."""
    return GraphSelection(view, list(positions))


def _rebuild(dataset: Any) -> Any:
    """A selecting view unpickled (in a worker process started by ``spawn``): a view of
    the data set pickled in its place."""
    return selecting_view(dataset)


def _reduce(view: Any) -> tuple:
    """A selecting view pickles as a data set of the user's class over the same
    attributes, and comes back as a view of it (`_rebuild`)."""
    plain = object.__new__(type(view).__mro__[1])
    plain.__dict__ = view.__dict__
    return _rebuild, (plain,)


def _selecting_class(cls: type) -> type:
    """``cls`` with a ``__getitems__`` (`_select`): what torch's loader calls once per
    batch, where it would otherwise index the data set once per graph."""
    return derived_class(cls, "_gnnfuse_selecting_class", lambda: type(
        cls.__name__, (cls,), {"__getitems__": _select, "__reduce__": _reduce, "__module__": cls.__module__}))


def selecting_view(dataset: Any) -> Any | None:
    """A view of ``dataset`` whose ``__getitems__`` returns a `GraphSelection`, where
    ``dataset`` is an ``InMemoryDataset`` of plain ``Data`` graphs whose class keeps
    PyG's ``get`` and ``__getitem__``; None for any other data set. The view is an
    instance of a subclass of the data set's class over the very attribute dictionary
    of ``dataset``: an attribute set on either afterwards (a transform, ``_indices``) is
    set on both, as on PyG's ``loader.dataset``, which is the user's object; the user's
    object itself gets no ``__getitems__`` (another loader over it still gets graphs),
    and ``loader.dataset`` keeps its class's name, methods and attributes."""
    from torch_geometric.data import Data, Dataset, InMemoryDataset
    if not isinstance(dataset, InMemoryDataset) or type(getattr(dataset, "_data", None)) is not Data:
        return None
    # a graph is what its class's ``__getitem__`` and ``get`` make it: gathering reads
    # the collated tensors as PyG's own two would
    kind = type(dataset)
    if kind.__getitem__ is not Dataset.__getitem__ or kind.get is not InMemoryDataset.get:
        return None
    if hasattr(dataset, "__getitems__"):
        return None
    view = object.__new__(_selecting_class(kind))
    view.__dict__ = dataset.__dict__
    return view


def gather_graphs(selection: GraphSelection, exclude_keys: frozenset[str] = frozenset(),
                  capacities: Any = None) -> Any | None:
    """``Batch.from_data_list(selection.graphs(), exclude_keys=exclude_keys)`` gathered
    from the data set's collated tensors; None where the data set has a transform, a
    graph of its own class or attributes `collate_graphs` would not take, or a position
    is not one of its graphs' (`_positions`): the caller then collates
    ``selection.graphs()``. ``capacities`` as `collate_graphs` takes them."""
    from torch_geometric.data import Data
    dataset = selection.dataset
    data, table = getattr(dataset, "_data", None), getattr(dataset, "slices", None)
    if dataset.transform is not None or type(data) is not Data or not isinstance(table, dict):
        return None
    store = data._store
    order = tuple(k for k in table if k in store._mapping)      # `separate`'s order
    plan = _plain_keys(order)
    indices = dataset.indices()
    if plan is None or hasattr(store, "_num_nodes") or len(indices) != len(dataset):
        return None
    count_key, keys = plan
    keys = [k for k in keys if k not in exclude_keys]
    wanted = set(keys) | {count_key}
    # slices of another dtype than int64 (a data set collated by its own code) would
    # give ``batch``, ``ptr`` and the slice tables theirs; PyG's are int64 whatever
    if any(type(store[k]) is not torch.Tensor or store[k].layout != torch.strided
           or type(table[k]) is not torch.Tensor or table[k].dtype != torch.long for k in wanted):
        return None
    positions = _positions(selection.positions, len(indices))
    if positions is None:
        return None
    ids = torch.as_tensor(positions if isinstance(indices, range) and indices.start == 0 and indices.step == 1
                          else [indices[p] for p in positions], dtype=torch.long)
    counts = {}
    for key in wanted:
        bounds = table[key]
        counts[key] = bounds[ids + 1] - bounds[ids]
    nodes = counts[count_key]
    totals = {key: int(rows.sum()) for key, rows in counts.items()}
    room = _Room(capacities, totals[count_key], totals.get("edge_index", -1), ids.numel())
    values, slices = {}, {}
    for key in keys:
        value = store[key]
        rows = counts[key]
        total = totals[key]
        at = torch.arange(total) + _repeated(table[key][ids] - _exclusive_cumsum(rows), rows, total)
        if key == "edge_index":
            if value.dim() != 2 or value.shape[0] != 2 or not _integral(value.dtype):
                return None
            out = value.index_select(1, at.to(value.device))
            out += _repeated(_exclusive_cumsum(nodes), rows, total).to(out.device, out.dtype)
        else:
            if value.dim() == 0:
                return None
            out = torch.index_select(value, 0, at.to(value.device), out=room.out(key, total, value))
        values[key] = out
        slices[key] = _with_zero(rows)
    return _batch(keys, values, slices, nodes, _device_of(values), room)
