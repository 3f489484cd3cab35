"""`LinkNeighborLoader`: PyG's link-prediction loader over gnnfuse's neighbour sampler.

Each batch takes ``batch_size`` label edges (columns of ``edge_label_index``, default
every edge of the graph), adds negatives, and samples the neighbourhoods of the distinct
endpoints as one node batch (`NeighborLoader`'s sampler, blocks and PyG view), whose
seeds they are. PyG's binary mode (``neg_sampling_ratio``, or
``NegativeSampling('binary', amount)``): ``ceil(amount * P)`` negatives for P positives,
each a (source, destination) pair drawn uniformly (or by ``src_weight``/``dst_weight``)
and, as in PyG, not checked against the graph's edges, so a negative can be an existing
edge; ``edge_label`` is the given labels (plus one when their minimum is 0, PyG's rule,
so that 0 means "negative"; default ones, float) then zeros. Triplet mode draws
``amount`` negative destinations per positive (``src_index``, ``dst_pos_index``,
``dst_neg_index``). The seeds are the endpoints in increasing vertex id, each once (PyG's
``unique``), so with full neighbourhoods the batch is PyG's edge for edge.

Randomness: each epoch's order and each batch's negatives and samples come from one seed
drawn from torch's global generator when iteration starts; batch i draws its negatives,
then samples, from the generator `batch_generator` gives for that seed and i.

Batches are prepared as `NeighborLoader`'s are, by the same machinery (its ``prefetch``
thread, default 2 batches ahead, or ``num_workers`` processes), running a
`LinkBatchMaker`; being drawn from their own generators, they are the same either way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ..graph import Graph
from .hetero_loader import is_hetero_data
from .link_batch import LinkMiniBatch
from .link_batch_maker import LinkBatchMaker
from .neighbor_loader import (_PYG_OPTIONS, NeighborLoader, _check_pyg_options, _graph_and_tables, epoch_seed,
                              take_generator)
from .preparation import STAGE_TIMES, BatchPreparation, epoch_batches, epoch_order

NEGATIVE_MODES = ("binary", "triplet")

# PyG's LinkNeighborLoader options without a gnnfuse counterpart, at the values under
# which PyG samples as this loader does (`neighbor_loader._PYG_OPTIONS`'s form)
_LINK_PYG_OPTIONS: dict[str, Any] = {**{k: v for k, v in _PYG_OPTIONS.items() if k != "input_time"},
                                     "edge_label_time": None}

# NeighborLoader's options link batches lack (padding, a seed order, seed vertices):
# each is accepted at the value that asks for none of it
_NODE_LOADER_ONLY: dict[str, Any] = {"static_shapes": False, "deferred": False, "sampler": None,
                                     "input_nodes": None}


@dataclass(frozen=True)
class NegativeSampling:
    """PyG's negative-sampling configuration, read from what PyG's ``NegativeSampling.cast``
    takes (a ``NegativeSampling``, a mode string, a tuple or a dict), without importing
    torch_geometric: ``mode`` ``'binary'`` or ``'triplet'``, ``amount`` negatives per
    positive, optional per-vertex ``src_weight``/``dst_weight`` (unnormalised)."""
    mode: str
    amount: float = 1
    src_weight: torch.Tensor | None = None
    dst_weight: torch.Tensor | None = None

    def count(self, positives: int) -> int:
        """Negatives for ``positives`` label edges: PyG's ``ceil(positives * amount)``."""
        return math.ceil(positives * self.amount)

    def draw(self, count: int, endpoint: str, num_nodes: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` vertex ids for negatives' ``endpoint`` (``'src'``/``'dst'``): uniform,
        or with replacement by that endpoint's weights, on the generator's device."""
        weight = self.src_weight if endpoint == "src" else self.dst_weight
        if weight is None:
            return torch.randint(num_nodes, (count,), generator=generator, device=generator.device)
        return torch.multinomial(weight, count, replacement=True, generator=generator)


def negative_sampling(neg_sampling: Any, neg_sampling_ratio: float | None, num_nodes: int
                      ) -> NegativeSampling | None:
    """The loader's `NegativeSampling` (None for none). ``neg_sampling_ratio`` (PyG's
    deprecated form, 0 for none) means binary mode; given with ``neg_sampling`` it is
    refused (PyG lets the ratio silently replace it)."""
    if neg_sampling_ratio is not None and neg_sampling_ratio != 0.0:
        if neg_sampling is not None:
            raise ValueError(f"give neg_sampling or neg_sampling_ratio, not both (got {neg_sampling!r} and "
                             f"neg_sampling_ratio={neg_sampling_ratio!r}; PyG lets the ratio replace neg_sampling)")
        neg_sampling = ("binary", neg_sampling_ratio)
    if neg_sampling is None:
        return None
    if isinstance(neg_sampling, str):
        fields: dict[str, Any] = {"mode": neg_sampling}
    elif isinstance(neg_sampling, tuple):
        fields = dict(zip(("mode", "amount", "src_weight", "dst_weight"), neg_sampling))
    elif isinstance(neg_sampling, dict):
        fields = dict(neg_sampling)
    elif hasattr(neg_sampling, "mode"):     # PyG's NegativeSampling
        fields = {name: getattr(neg_sampling, name, None) for name in ("mode", "amount", "src_weight", "dst_weight")}
    else:
        raise TypeError(f"neg_sampling must be a NegativeSampling, a mode ('binary' or 'triplet'), a tuple or a "
                        f"dict, got {type(neg_sampling).__name__}")
    unknown = set(fields) - {"mode", "amount", "src_weight", "dst_weight"}
    if unknown:
        raise TypeError(f"neg_sampling has unknown fields {sorted(unknown)}")
    mode = getattr(fields["mode"], "value", fields["mode"])      # PyG's NegativeSamplingMode is an Enum
    if mode not in NEGATIVE_MODES:
        raise ValueError(f"neg_sampling mode must be one of {NEGATIVE_MODES}, got {mode!r}")
    amount = 1 if fields.get("amount") is None else fields["amount"]
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real) or not amount > 0 or math.isinf(amount):
        raise ValueError(f"neg_sampling amount (negatives per positive) must be a finite number > 0, got {amount!r}")
    if mode == "triplet" and amount != math.ceil(amount):
        raise ValueError(f"neg_sampling amount must be a whole number in 'triplet' mode (negative destinations "
                         f"per positive), got {amount!r}")
    for name in ("src_weight", "dst_weight"):
        weight = fields.get(name)
        if weight is None:
            continue
        if not isinstance(weight, torch.Tensor) or weight.shape != (num_nodes,) or not weight.dtype.is_floating_point:
            got = (f"a {weight.dtype} tensor of shape {list(weight.shape)}" if isinstance(weight, torch.Tensor)
                   else type(weight).__name__)
            raise ValueError(f"neg_sampling {name} must be a float tensor of one weight per vertex ({num_nodes}), "
                             f"got {got}")
        wrong = ("a negative weight" if bool((weight < 0).any()) else "a NaN or infinite weight"
                 if not bool(weight.isfinite().all()) else "only zeros" if not bool(weight.sum() > 0) else None)
        if wrong is not None:
            raise ValueError(f"neg_sampling {name} must hold finite, non-negative weights, not all zero (they are "
                             f"drawn from in proportion); it holds {wrong}")
    return NegativeSampling(mode, math.ceil(amount) if mode == "triplet" else amount,
                            fields.get("src_weight"), fields.get("dst_weight"))


def _is_edge_type(value: Any) -> bool:
    """Whether ``value`` is a PyG edge type: a node type or a (source, relation, target) tuple of names."""
    return isinstance(value, str) or (isinstance(value, tuple) and len(value) > 0
                                      and all(isinstance(part, str) for part in value))


def label_edges(edge_label_index: Any, edge_label: Any, graph: Graph) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The label edges as a ``[2, E]`` int64 tensor on the host (default every edge of
    ``graph``, in edge-id order: PyG's ``data.edge_index``), and their labels, checked."""
    if edge_label_index is None:
        index = graph.edge_index.cpu()
    else:
        if _is_edge_type(edge_label_index) or (isinstance(edge_label_index, (tuple, list))
                                               and len(edge_label_index) == 2 and _is_edge_type(edge_label_index[0])):
            raise TypeError("edge_label_index as an edge type (or an edge type with its edges) is PyG's form for "
                            "heterogeneous graphs; this graph is homogeneous: give a [2, E] tensor of vertex ids")
        try:
            index = torch.as_tensor(edge_label_index).cpu()
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"edge_label_index must be a [2, E] tensor of vertex ids, got "
                            f"{type(edge_label_index).__name__}") from None
        if index.dim() != 2 or index.shape[0] != 2:
            raise ValueError(f"edge_label_index must have shape [2, E] (row 0 the sources, row 1 the "
                             f"destinations), got {list(index.shape)}")
        if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
            raise ValueError(f"edge_label_index must hold integer vertex ids, got {index.dtype}")
        index = index.long()
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= graph.num_nodes):
            raise ValueError(f"edge_label_index holds vertex ids outside 0..{graph.num_nodes - 1} (the graph has "
                             f"{graph.num_nodes} nodes)")
    if edge_label is None:
        return index, None
    if not isinstance(edge_label, torch.Tensor) or edge_label.dim() == 0 or edge_label.shape[0] != index.shape[1]:
        shape = list(edge_label.shape) if isinstance(edge_label, torch.Tensor) else type(edge_label).__name__
        raise ValueError(f"edge_label must have a row per label edge ({index.shape[1]} columns of "
                         f"edge_label_index), got {shape}")
    return index, edge_label


class _EndpointLoader(NeighborLoader):
    """A `LinkNeighborLoader`'s node loader, whose errors and warnings (its checks while
    built, its workers', the Data's tables replaced) name the loader the user made."""
    _name = "LinkNeighborLoader"


class LinkNeighborLoader:
    """Link-prediction mini-batches (see the module docstring), yielding `LinkMiniBatch`.

    PyG's arguments: ``num_neighbors``, ``edge_label_index`` (``[2, E]`` vertex ids; default
    every edge), ``edge_label`` (a row per label edge), ``replace``, ``neg_sampling``
    (`NegativeSampling` or PyG's), ``neg_sampling_ratio``, ``batch_size`` (label edges per
    batch), ``shuffle``, ``drop_last``. gnnfuse's, as `NeighborLoader`'s: ``x``, ``y``,
    ``edge_attr``, ``edge_weight`` (for a bare `Graph`), ``device``, ``sample_device``,
    ``feature_device``. PyG's options without a counterpart (``edge_label_time``,
    ``time_attr``, ``disjoint``, ``transform``, ...) are accepted at PyG's defaults and
    refused by name otherwise; so are `NeighborLoader`'s ``sampler``, ``input_nodes`` and
    static shapes, which link batches do not have. ``prefetch`` (default 2),
    ``prefetch_threads`` and ``num_workers`` prepare batches ahead as `NeighborLoader`'s
    do, the same batches; `close` stops the workers.
    """

    def __init__(self, data: Any, num_neighbors: Sequence[int], edge_label_index: Any = None,
                 edge_label: torch.Tensor | None = None, *, replace: bool = False, neg_sampling: Any = None,
                 neg_sampling_ratio: float | None = None, batch_size: int = 1, shuffle: bool = False,
                 drop_last: bool = False, x: torch.Tensor | None = None, y: torch.Tensor | None = None,
                 device: torch.device | str | None = None, sample_device: torch.device | str | None = None,
                 feature_device: str | None = None, edge_attr: torch.Tensor | None = None,
                 edge_weight: torch.Tensor | None = None, prefetch: int = 2, prefetch_threads: int = 1,
                 num_workers: int = 0, **options: Any) -> None:
        for name in [name for name in options if name in _NODE_LOADER_ONLY]:
            value = options.pop(name)
            if not (value is _NODE_LOADER_ONLY[name] or (isinstance(value, int) and value == _NODE_LOADER_ONLY[name])):
                raise NotImplementedError(
                    f"LinkNeighborLoader: {name}={value!r} is NeighborLoader's; link batches are unpadded, "
                    f"in edge_label_index's order or shuffled, from edge_label_index (leave {name} out)")
        self.generator = take_generator(options, "LinkNeighborLoader")
        _check_pyg_options(options, _LINK_PYG_OPTIONS, "LinkNeighborLoader")
        if is_hetero_data(data):
            raise NotImplementedError("LinkNeighborLoader samples homogeneous graphs; a HeteroData's link "
                                      "batches are not supported")
        if not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size (label edges per batch) must be a whole number >= 1, got {batch_size!r}")
        graph = _graph_and_tables(data, x, y, "LinkNeighborLoader")[0]
        # the node loader's checks, placement and sampler, for the endpoints' batches; it
        # takes ``data`` itself and the tables as given, for the Data's other attributes
        # (`loader.data_attributes`) and its replaced tables (`loader.held_tables`)
        self._nodes = _EndpointLoader(data, num_neighbors, 1, None, False, replace, x=x, y=y,
                                      device=device, sample_device=sample_device, feature_device=feature_device,
                                      prefetch=prefetch, prefetch_threads=prefetch_threads, num_workers=num_workers,
                                      edge_attr=edge_attr, edge_weight=edge_weight)
        self.num_neighbors, self.num_nodes = self._nodes.num_neighbors, graph.num_nodes
        self.device, self.sample_device = self._nodes.device, self._nodes.sample_device
        self.neg_sampling = negative_sampling(neg_sampling, neg_sampling_ratio, graph.num_nodes)
        if self.neg_sampling is not None:     # weights where the draws run, moved once
            self.neg_sampling = dataclasses.replace(self.neg_sampling, **{
                name: getattr(self.neg_sampling, name).to(self.sample_device)
                for name in ("src_weight", "dst_weight") if getattr(self.neg_sampling, name) is not None})
        index, edge_label = label_edges(edge_label_index, edge_label, graph)
        if self.neg_sampling is not None and self.neg_sampling.mode == "triplet" and edge_label is not None:
            raise ValueError("edge_label must be None with 'triplet' negative sampling (PyG's rule): the batch's "
                             "src_index, dst_pos_index and dst_neg_index say which pairs are positive")
        if (self.neg_sampling is not None and self.neg_sampling.mode == "binary" and edge_label is not None
                and edge_label.numel() and edge_label.min() == 0):
            edge_label = edge_label + 1     # PyG's: label 0 now means a negative
        self.edge_label_index = index.to(self.sample_device)
        self.edge_label = None if edge_label is None else edge_label.to(self.sample_device)
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), shuffle, drop_last
        self._maker = LinkBatchMaker(self._nodes._maker, self.edge_label_index, self.edge_label, self.neg_sampling)

    stage_times = STAGE_TIMES

    @property
    def _preparation(self) -> BatchPreparation:
        """The node loader's, which prepares this loader's batches."""
        return self._nodes._preparation

    def __len__(self) -> int:
        full, rest = divmod(self.edge_label_index.shape[1], self.batch_size)
        return full + (rest > 0 and not self.drop_last)

    def __iter__(self) -> Iterator[LinkMiniBatch]:
        seed = epoch_seed(self.generator)
        count = self.edge_label_index.shape[1]       # a batch: columns of edge_label_index, in the epoch's order
        order = epoch_order(count, self.shuffle, torch.Generator().manual_seed(seed))
        batches = epoch_batches((torch.arange(count),), order, self.batch_size, self.drop_last,
                                self._nodes._ids_device)
        # closed explicitly, as NeighborLoader's: an abandoned epoch stops its thread now
        with contextlib.closing(self._nodes._prepared(self._maker, batches, seed)) as prepared:
            for batch in prepared:
                yield self._with_attributes(batch)

    def _with_attributes(self, batch: LinkMiniBatch) -> LinkMiniBatch:
        """``batch`` with the ``Data``'s other attributes attached to its node batch, here in
        the training process (`NeighborLoader._with_attributes`)."""
        self._nodes._with_attributes(batch.nodes)
        return batch

    def close(self) -> None:
        """Stop the worker processes, if any (they also stop when the loader is freed)."""
        self._nodes.close()

    def __repr__(self) -> str:
        workers = f", num_workers={self._nodes.num_workers}" if self._nodes.num_workers else ""
        negatives = "" if self.neg_sampling is None else (f", neg_sampling=({self.neg_sampling.mode!r}, "
                                                          f"{self.neg_sampling.amount})")
        return (f"LinkNeighborLoader(num_neighbors={self.num_neighbors}, batch_size={self.batch_size}, "
                f"label_edges={self.edge_label_index.shape[1]}{negatives}, device={self.device}{workers})")
