"""`NeighborLoader` on a PyG ``HeteroData``: PyG's heterogeneous mini-batches.

``NeighborLoader(data, num_neighbors=[10, 10], batch_size=128, input_nodes=("paper",
mask))`` on a ``HeteroData`` builds this loader (`NeighborLoader` hands the call on), so
PyG's idiom ``model(batch.x_dict, batch.edge_index_dict)["paper"][:batch["paper"].batch_size]``
runs unchanged. Sampling is PyG's rule (`loader.hetero_sampler`), each batch is a
``HeteroData`` with PyG's attributes (`loader.hetero_batch`).

Batches are sampled on the device the graph's ``edge_index`` tensors are on and cut from
the ``HeteroData``'s own tensors where they are; they are prepared as the homogeneous
loader's are, by the same machinery (`loader.preparation`: ``prefetch`` batches ahead,
default 2, in ``prefetch_threads`` threads, or ``num_workers`` processes), running a
`HeteroBatchMaker`. This loader hands PyG's view only (no per-layer blocks): the
homogeneous loader's static shapes, pinned feature staging, ``sampler`` and separate
feature tables are refused by name rather than ignored. Each ``edge_index`` is read when
the loader is made (its CSRs), so one replaced or changed in place afterwards is refused
by name at the next batch; with worker processes, which hold the ``HeteroData`` as it was given them, so is
any attribute replaced, added or removed (`held_tables.HeldHeteroData`). A table that
requires grad is refused unless batches are made when asked (`_check_learnable`).

Randomness: as the homogeneous loader's, an epoch's shuffle and samples come from one
seed drawn when iteration starts, from ``generator=`` where given, else from torch's
global generator (so ``torch.manual_seed`` fixes them), batch i sampling from its own
generator (`batch_generator`).
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..graph.graph import CSR
from .held_tables import HeldHeteroData
from .hetero_batch_maker import HeteroBatchMaker, hetero_batch_tensors
from .hetero_sampler import EdgeType, typed_csr
from .neighbor_loader import (_check_batch_size, _check_learnable, _check_pyg_options, _fanouts, _sampled_fanouts,
                              _seed_ids, epoch_seed, pyg_num_neighbors, take_generator)
from .preparation import STAGE_TIMES, BatchPreparation, epoch_batches, epoch_order

# gnnfuse's own NeighborLoader arguments, each with the value that asks for nothing this
# loader lacks; another value is refused by name.
_NOT_OFFERED: dict[str, Any] = {
    "static_shapes": False, "deferred": False,
    "feature_device": None, "sampler": None, "x": None, "y": None, "edge_attr": None, "edge_weight": None,
    "device": None, "sample_device": None,
}


def is_hetero_data(data: Any) -> bool:
    """Whether ``data`` is a PyG ``HeteroData`` (torch_geometric is not imported for it:
    a ``HeteroData`` exists only once it is)."""
    module = sys.modules.get("torch_geometric.data")
    return module is not None and isinstance(data, module.HeteroData)


def _check_options(options: dict[str, Any]) -> None:
    """gnnfuse's loader options this loader lacks, refused by name at any value but
    "off"; PyG's options as the homogeneous loader takes them."""
    for name in [name for name in options if name in _NOT_OFFERED]:
        value = options.pop(name)
        if value is not _NOT_OFFERED[name] and not (isinstance(value, (bool, int)) and value == _NOT_OFFERED[name]):
            shown = f"<a {list(value.shape)} tensor>" if isinstance(value, torch.Tensor) else f"{value!r:.60}"
            raise NotImplementedError(
                f"NeighborLoader on a HeteroData: {name}={shown} is not offered yet (it cuts each batch from "
                f"the HeteroData's own tensors, where they are, with PyG's attributes); leave {name} out")
    _check_pyg_options(options)


def _store_name(store: Any) -> str:
    """How PyG code names a store: ``data['paper']``, ``data[('paper', 'cites', 'paper')]``."""
    return f"data[{store._key!r}]" if store._key is not None else "data"


def _node_counts(data: Any) -> dict[str, int]:
    counts = {}
    for node_type in data.node_types:
        count = data[node_type].num_nodes
        if count is None:
            raise ValueError(f"NeighborLoader: node type {node_type!r} has no num_nodes (no node-level tensor "
                             f"such as x to count its rows): set data[{node_type!r}].num_nodes")
        counts[node_type] = int(count)
    return counts


def _edge_index(data: Any, edge_type: EdgeType, num_nodes: dict[str, int]) -> torch.Tensor:
    """Edge type ``edge_type``'s ``edge_index``, checked: ``[2, E]`` integer ids within
    its source and destination types' counts."""
    for node_type in (edge_type[0], edge_type[2]):
        if node_type not in num_nodes:
            raise ValueError(f"NeighborLoader: edge type {edge_type} joins node type {node_type!r}, which the "
                             f"HeteroData has no node store for (no x, no num_nodes): set "
                             f"data[{node_type!r}].num_nodes")
    store = data[edge_type]
    edge_index = store.get("edge_index")
    if edge_index is None:
        held = "a SparseTensor adj_t" if "adj_t" in store else "no edge_index"
        raise ValueError(f"NeighborLoader: edge type {edge_type} has {held}; this loader samples an edge_index "
                         f"[2, num_edges]")
    if (not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2
            or edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool):
        shape = list(edge_index.shape) if isinstance(edge_index, torch.Tensor) else type(edge_index).__name__
        raise ValueError(f"NeighborLoader: edge type {edge_type}'s edge_index must be an integer tensor of shape "
                         f"[2, num_edges], got {getattr(edge_index, 'dtype', '')} {shape}")
    edge_index = edge_index.long()
    for row, node_type in ((0, edge_type[0]), (1, edge_type[2])):
        ids = edge_index[row]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes[node_type]):
            raise ValueError(f"NeighborLoader: edge type {edge_type}'s edge_index[{row}] holds ids outside "
                             f"0..{num_nodes[node_type] - 1} (node type {node_type!r} has "
                             f"{num_nodes[node_type]} nodes)")
    return edge_index


def _typed_fanouts(num_neighbors: Any, edge_types: Sequence[EdgeType]) -> tuple[dict[EdgeType, list[int]], int]:
    """(fanouts per edge type, hops) from PyG's forms: one list for every edge type, or a
    dict edge type (a tuple, or PyG's ``'src__rel__dst'``) -> list covering every edge
    type with lists of one length (PyG refuses a missing edge type or unequal hops too),
    or PyG's ``NumNeighbors`` of either, whose ``default`` covers the edge types its dict
    leaves out. A graph without edge types has no hops (pyg-lib's count: the longest list)."""
    num_neighbors, default = pyg_num_neighbors(num_neighbors)
    if not isinstance(num_neighbors, dict):
        fanouts = _fanouts(num_neighbors)
        return {edge_type: fanouts for edge_type in edge_types}, len(fanouts) if edge_types else 0
    given = {}
    for key, value in num_neighbors.items():
        edge_type = tuple(key.split("__")) if isinstance(key, str) else tuple(key) if isinstance(key, tuple) else key
        if edge_type not in edge_types:
            raise ValueError(f"num_neighbors names edge type {key!r}, which the HeteroData does not have "
                             f"(its edge types: {list(edge_types)})")
        given[edge_type] = _fanouts(value)
    missing = [edge_type for edge_type in edge_types if edge_type not in given]
    if missing and default is not None:     # a NumNeighbors' default, for the edge types it does not name
        given.update({edge_type: _fanouts(default) for edge_type in missing})
    elif missing:
        raise ValueError(f"num_neighbors has no fanouts for edge type(s) {missing}: a dict needs a list for every "
                         f"edge type (as PyG's)")
    hops = {len(fanouts) for fanouts in given.values()}
    if len(hops) > 1:
        raise ValueError(f"num_neighbors gives edge types different numbers of hops ({sorted(hops)}); every "
                         f"edge type samples in every hop (0 for none)")
    return {edge_type: given[edge_type] for edge_type in edge_types}, hops.pop() if hops else 0


def _input_seeds(input_nodes: Any, num_nodes: dict[str, int]) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(input node type, seed ids, PyG's ``input_id``) from a node type or (node type, ids
    or mask or None)."""
    if input_nodes is None:
        raise ValueError("NeighborLoader on a HeteroData needs input_nodes: the seeds' node type, or (node type, "
                         "ids or boolean mask), as PyG's")
    if isinstance(input_nodes, str):
        node_type, ids = input_nodes, None
    elif isinstance(input_nodes, (tuple, list)) and len(input_nodes) == 2 and isinstance(input_nodes[0], str):
        node_type, ids = input_nodes
    else:
        raise TypeError(f"input_nodes on a HeteroData must be a node type or (node type, ids or boolean mask), got "
                        f"{input_nodes!r:.80}")
    if node_type not in num_nodes:
        raise ValueError(f"input_nodes names node type {node_type!r}, which the HeteroData does not have (its node "
                         f"types: {list(num_nodes)})")
    try:
        seeds, input_id = _seed_ids(ids, num_nodes[node_type])
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (input_nodes of node type {node_type!r})") from None
    return node_type, seeds, input_id


class HeteroNeighborLoader:
    """Mini-batches of a PyG ``HeteroData`` (see the module docstring). Arguments are
    PyG's: ``num_neighbors`` (a list for every edge type, or a dict edge type -> list;
    -1 all in-edges, 0 none), ``batch_size``, ``input_nodes`` (a node type, or (node type,
    ids or boolean mask)), ``shuffle``, ``replace``, ``drop_last``; gnnfuse's, as
    `NeighborLoader`'s: ``prefetch`` (batches prepared ahead, default 2; 0 prepares each
    when asked), ``prefetch_threads`` and ``num_workers`` (processes, started on the first
    epoch and kept until `close`). The batches are the same whichever prepares them."""

    def __init__(self, data: Any, num_neighbors: Any, batch_size: int = 1, input_nodes: Any = None,
                 shuffle: bool = False, replace: bool = False, drop_last: bool = False, *, prefetch: int = 2,
                 prefetch_threads: int = 1, num_workers: int = 0, **options: Any) -> None:
        self.generator = take_generator(options, "NeighborLoader")
        _check_options(options)
        _check_batch_size(batch_size)
        edge_types = data.metadata()[1]
        self.num_nodes = _node_counts(data)
        self.num_neighbors, self.num_hops = _typed_fanouts(num_neighbors, edge_types)
        self.input_type, self.seeds, self._input_ids = _input_seeds(input_nodes, self.num_nodes)
        edge_indices = {edge_type: _edge_index(data, edge_type, self.num_nodes) for edge_type in edge_types}
        self.sample_device = next(iter(edge_indices.values())).device if edge_indices else torch.device("cpu")
        self._csrs: dict[EdgeType, CSR] = {
            edge_type: typed_csr(edge_index.to(self.sample_device), self.num_nodes[edge_type[2]])
            for edge_type, edge_index in edge_indices.items()}
        self.data = data
        self.batch_size, self.shuffle, self.replace, self.drop_last = int(batch_size), shuffle, replace, drop_last
        self._preparation = BatchPreparation(self.sample_device, self.sample_device, prefetch, prefetch_threads,
                                             num_workers, "HeteroNeighborLoader")
        for store in data.stores:
            for key, value in store.items():
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    _check_learnable(f"{_store_name(store)}.{key}", value, value, prefetch, num_workers)
        self._held = HeldHeteroData(data, every_attribute=bool(num_workers))
        # each bounded by its edge type's largest in-degree, as the homogeneous loader's
        # (`_sampled_fanouts`): a hop lays out ``fanout`` slots per destination, so [10**5]
        # (PyG's "every in-edge" too) took 1.7 GB for 100 seeds, and [10**7] was killed
        sampled = {edge_type: list(_sampled_fanouts(self.num_neighbors[edge_type], csr.rowptr, replace))
                   for edge_type, csr in self._csrs.items()}
        self._maker = HeteroBatchMaker(data, self._csrs, self.num_nodes, self.input_type, sampled,
                                       self.num_hops, replace, self.sample_device)

    stage_times = STAGE_TIMES

    def __len__(self) -> int:
        full, rest = divmod(self.seeds.numel(), self.batch_size)
        return full + (rest > 0 and not self.drop_last)

    def __iter__(self) -> Iterator[Any]:
        seed = epoch_seed(self.generator)
        positions = epoch_order(self.seeds.numel(), self.shuffle, torch.Generator().manual_seed(seed))
        batches = epoch_batches((self.seeds, self._input_ids), positions, self.batch_size, self.drop_last)
        # closed explicitly, as NeighborLoader's: an abandoned epoch stops its thread now
        with contextlib.closing(self._preparation.epoch(self._maker, batches, seed, hetero_batch_tensors)) as prepared:
            while True:
                try:
                    batch = next(prepared)
                except StopIteration:
                    return
                except Exception:
                    # a batch cut from a HeteroData whose edge type was replaced (fewer
                    # edges) fails on the sampled ids: name the replacement, not the IndexError
                    self._held.check("NeighborLoader")
                    raise
                self._held.check("NeighborLoader")
                yield batch

    def close(self) -> None:
        """Stop the worker processes, if any (they also stop when the loader is freed)."""
        self._preparation.close()

    def __repr__(self) -> str:
        workers = f", num_workers={self._preparation.num_workers}" if self._preparation.num_workers else ""
        return (f"NeighborLoader(HeteroData, num_neighbors={self.num_neighbors}, batch_size={self.batch_size}, "
                f"input_nodes=({self.input_type!r}, {self.seeds.numel()} seeds){workers})")
