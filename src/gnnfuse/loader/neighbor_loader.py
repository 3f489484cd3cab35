"""`NeighborLoader`: PyG's mini-batch loader, yielding per-layer blocks for gnnfuse layers.

Each batch takes ``batch_size`` seed vertices, samples ``num_neighbors[0]`` in-edges of
each, then ``num_neighbors[1]`` of each vertex reached, and so on (PyG's order: entry i
is hop i from the seeds), and hands back one `Block` per layer, input layer first:
``blocks[-1]``'s destinations are the seeds, ``blocks[0]``'s sources every vertex the
batch reads features of. A model runs ``x = layer((x, x[:block.num_dst]), block.graph)``
down the list (`gnnfuse.nn.block_models.BlockGNN`).

Where each stage runs (GraphTensor §V-B's S, R, K, T):

- sampling and reindexing run where the graph's CSR is (``sample_device``, default the
  graph's device): on a GPU when it fits there, else on the host with torch's
  intra-op threads;
- feature lookup runs where the features are (``feature_device``): ``"device"`` keeps
  the feature table on ``device`` and gathers there; ``"pinned"`` keeps it in page-locked
  host memory, which a kernel reads in place through unified virtual addressing when the
  batch's ids are on the GPU (`zero_copy.zero_copy_rows`: only the rows the batch needs
  cross the bus, and no host thread gathers them); with ids on the host, the rows are
  gathered there into a page-locked buffer that is copied to the device asynchronously;
- blocks sampled on the host are copied to the device the same way.

With ``prefetch >= 1`` (default 2) a background thread prepares up to that many batches
ahead of the training loop (`Prefetcher`), on a side CUDA stream on a GPU; the batches
are the same as without prefetch. Per-stage seconds accumulate in ``loader.stage_times``.

Each block comes with what its layers' kernels derive from it (reverse CSR, degrees,
the Triton backend's edge segments: `loader.layouts`), built in that thread, so a
training step on the blocks reads nothing back from the device.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, Sized

import torch

from ..graph import Graph
from .block import Block, block_graph
from .layouts import prepare_layouts
from .prefetch import Prefetcher
from .sampler import reindex_slots, sample_slots
from .stages import StageTimes, device_stream
from .zero_copy import zero_copy_rows

FEATURE_DEVICES = ("device", "pinned")


@dataclass(frozen=True)
class MiniBatch:
    """One batch: the blocks (input layer first), the input features of
    ``blocks[0]``'s sources, the seeds' labels, and ids.

    ``n_id`` are the global ids of the input vertices (PyG's name; the first
    ``batch_size`` are the seeds, ``input_id``)."""
    blocks: list[Block]
    x: torch.Tensor | None
    y: torch.Tensor | None
    n_id: torch.Tensor
    input_id: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.input_id.numel()

    def tensors(self) -> list[torch.Tensor]:
        out = [self.n_id, self.input_id] + [t for block in self.blocks for t in block.tensors()]
        return out + [t for t in (self.x, self.y) if t is not None]


def _graph_and_tables(data: Any, x: torch.Tensor | None, y: torch.Tensor | None
                      ) -> tuple[Graph, torch.Tensor | None, torch.Tensor | None]:
    """(graph, features, labels) of a gnnfuse `Graph` (features by keyword), a gnnfuse
    `NodeDataset`, or a PyG ``Data`` (read by attribute name, torch_geometric not imported)."""
    if isinstance(data, Graph):
        return data, x, y
    if isinstance(getattr(data, "graph", None), Graph):       # gnnfuse NodeDataset
        graph = data.graph
    elif getattr(data, "edge_index", None) is not None:       # PyG Data
        graph = Graph.from_data(data)
    else:
        raise TypeError(f"NeighborLoader takes a gnnfuse Graph, a gnnfuse NodeDataset or a PyG Data with an "
                        f"edge_index, got {type(data).__name__}")
    return graph, getattr(data, "x", None) if x is None else x, getattr(data, "y", None) if y is None else y


def _indexed(device: torch.device | str) -> torch.device:
    """``cuda`` as the device it means now (``cuda:0``): tensors report an indexed device,
    and ``torch.device('cuda') != torch.device('cuda:0')``."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _seed_ids(input_nodes: Any, num_nodes: int) -> torch.Tensor:
    """The seed vertices as int64 ids on the host: all vertices, a boolean mask, or ids."""
    if input_nodes is None:
        return torch.arange(num_nodes)
    ids = torch.as_tensor(input_nodes).cpu()
    if ids.dtype == torch.bool:
        if ids.numel() != num_nodes:
            raise ValueError(f"input_nodes mask has {ids.numel()} entries but the graph has {num_nodes} nodes")
        return ids.nonzero().flatten()
    if ids.dtype.is_floating_point or ids.dim() != 1:
        raise ValueError(f"input_nodes must be a 1-D tensor of node ids or a boolean mask, got {ids.dtype} "
                         f"of shape {list(ids.shape)}")
    ids = ids.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
        raise ValueError(f"input_nodes holds ids outside 0..{num_nodes - 1}")
    if torch.unique(ids).numel() != ids.numel():
        raise ValueError("input_nodes holds repeated ids; a seed must appear once per epoch")
    return ids


class NeighborLoader:
    """Mini-batches of sampled neighbourhoods (see the module docstring).

    PyG's arguments: ``num_neighbors`` (a fanout per hop, ``-1`` for all in-edges),
    ``batch_size``, ``input_nodes`` (ids or a mask; default all vertices), ``shuffle``,
    ``replace``, ``drop_last``, and torch ``DataLoader``'s ``sampler`` (an iterable of
    positions in ``input_nodes`` giving each epoch's seed order, with ``len``; call its
    ``set_epoch`` per epoch, as for ``torch.utils.data.DistributedSampler``, which is how
    data-parallel ranks each take their share; exclusive with ``shuffle``). gnnfuse's: ``x``/``y`` for a bare `Graph`; ``device``
    (where batches go; default ``sample_device``), ``sample_device`` (where the CSR is
    sampled; default the graph's device), ``feature_device`` (``"device"`` or
    ``"pinned"``; default ``"device"`` when the features are already on ``device`` or
    ``device`` is the CPU, else ``"pinned"``) and ``prefetch`` (batches prepared ahead;
    0 prepares each batch when asked).

    Randomness: each epoch's shuffle and samples come from one seed drawn from torch's
    global generator when iteration starts, so ``torch.manual_seed`` fixes them.
    """

    def __init__(self, data: Any, num_neighbors: Sequence[int], batch_size: int = 1, input_nodes: Any = None,
                 shuffle: bool = False, replace: bool = False, drop_last: bool = False, *,
                 x: torch.Tensor | None = None, y: torch.Tensor | None = None,
                 device: torch.device | str | None = None, sample_device: torch.device | str | None = None,
                 feature_device: str | None = None, prefetch: int = 2, sampler: Sized | None = None) -> None:
        graph, features, labels = _graph_and_tables(data, x, y)
        if graph.is_bipartite or graph.edge_type is not None:
            raise ValueError("NeighborLoader samples a homogeneous graph with one vertex set; this graph is "
                             f"{'bipartite' if graph.is_bipartite else 'typed'}")
        self.num_neighbors = [int(k) for k in num_neighbors]
        if not self.num_neighbors or any(k < -1 or k == 0 for k in self.num_neighbors):
            raise ValueError(f"num_neighbors must be a non-empty list of fanouts >= 1 (or -1 for all), got "
                             f"{list(num_neighbors)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if sampler is not None and shuffle:
            raise ValueError("sampler is mutually exclusive with shuffle (the sampler orders the seeds)")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        for name, table in (("x", features), ("y", labels)):
            if table is not None and table.shape[0] != graph.num_nodes:
                raise ValueError(f"{name} has {table.shape[0]} rows but the graph has {graph.num_nodes} nodes")
        self.sample_device = _indexed(sample_device if sample_device is not None else graph.device)
        self.device = _indexed(device) if device is not None else self.sample_device
        csr = graph.to(self.sample_device).csr()
        self._rowptr, self._col = csr.rowptr.long(), csr.col.long()
        self.num_nodes = graph.num_nodes
        self.feature_device = self._feature_device(feature_device, features)
        # pinned tables are read in place by a kernel when batches are sampled on the GPU
        self._zero_copy = self.feature_device == "pinned" and self.sample_device.type == "cuda"
        self._x = self._place(features)
        self._y = self._place(labels)
        self.seeds = _seed_ids(input_nodes, graph.num_nodes)
        self.batch_size, self.shuffle, self.replace, self.drop_last = batch_size, shuffle, replace, drop_last
        self.prefetch, self.sampler = prefetch, sampler
        self.stage_times = StageTimes()

    def _feature_device(self, requested: str | None, features: torch.Tensor | None) -> str:
        if requested is None:
            on_device = features is None or features.device == self.device or self.device.type == "cpu"
            return "device" if on_device else "pinned"
        if requested not in FEATURE_DEVICES:
            raise ValueError(f"feature_device must be one of {FEATURE_DEVICES}, got {requested!r}")
        if requested == "pinned" and self.device.type != "cuda":
            raise ValueError("feature_device='pinned' stages features for a CUDA device; device is "
                             f"{self.device}")
        return requested

    def _place(self, table: torch.Tensor | None) -> torch.Tensor | None:
        """A feature or label table where its lookups run: on ``device``, or in host memory."""
        if table is None:
            return None
        if self.feature_device == "device":
            return table.to(self.device)
        table = table.cpu().contiguous()
        if self._zero_copy and not table.is_pinned():
            try:    # page-locked once, so kernels read its rows in place (loader.zero_copy)
                table = table.pin_memory()
            except RuntimeError as exc:
                warnings.warn(f"gnnfuse NeighborLoader: could not page-lock the {list(table.shape)} feature "
                              f"table ({exc}); its rows are gathered on the host", RuntimeWarning, stacklevel=3)
        return table

    def __len__(self) -> int:
        full, rest = divmod(self.seeds.numel() if self.sampler is None else len(self.sampler), self.batch_size)
        return full + (rest > 0 and not self.drop_last)

    def _seed_batches(self, generator: torch.Generator) -> list[torch.Tensor]:
        if self.sampler is not None:
            seeds = self.seeds[torch.as_tensor(list(self.sampler), dtype=torch.int64)]
        else:
            seeds = self.seeds[torch.randperm(self.seeds.numel(), generator=generator)] if self.shuffle else self.seeds
        # on the sampler's device once per epoch, not copied there batch by batch
        batches = list(seeds.to(self.sample_device).split(self.batch_size))
        if self.drop_last and batches and batches[-1].numel() < self.batch_size:
            batches.pop()
        return batches

    def __iter__(self) -> Iterator[MiniBatch]:
        seed = int(torch.randint(0, 2**62, (1,)))
        host = torch.Generator().manual_seed(seed)
        sampling = torch.Generator(self.sample_device).manual_seed(seed)
        batches = self._seed_batches(host)
        prepare = lambda seeds: self._prepare(seeds, sampling)   # noqa: E731
        if self.prefetch == 0:
            for seeds in batches:
                yield prepare(seeds)
                self.stage_times.count_batch()
            return
        for batch in Prefetcher(batches, prepare, self.prefetch, self.device, MiniBatch.tensors, self.stage_times):
            yield batch
            self.stage_times.count_batch()

    # -- the stages of one batch ------------------------------------------------------
    def _prepare(self, seeds: torch.Tensor, generator: torch.Generator) -> MiniBatch:
        times, on_sampler = self.stage_times, device_stream(self.sample_device)
        nodes = seeds.to(self.sample_device)
        hops = []
        for fanout in self.num_neighbors:
            with times.timing("sample", stream=on_sampler):
                slots = sample_slots(self._rowptr, self._col, nodes, fanout, self.replace, generator)
            with times.timing("reindex", stream=on_sampler):
                hop = reindex_slots(nodes, slots, self.num_nodes)
            hops.append(hop)
            nodes = hop.nodes
        on_device = device_stream(self.device)
        in_place = self.feature_device == "device" or (self._zero_copy and nodes.device.type == "cuda")
        with times.timing("lookup", stream=on_device if in_place else None):
            x = self._lookup(self._x, nodes)
            y = self._lookup(self._y, nodes[:seeds.numel()])
        with times.timing("transfer", stream=on_device):
            x, y, n_id, input_id = (self._to_device(t) for t in (x, y, nodes, seeds))
            moved = ("rowptr", "local_src", "dst", "nodes", "out_degrees", "unread_dst")    # not eid: unread
            hops = [hop._replace(**{name: self._to_device(getattr(hop, name)) for name in moved})
                    for hop in reversed(hops)]
        with times.timing("reindex", stream=on_device):       # the blocks' graphs, on the device
            bounds = [k if k >= 0 else None for k in reversed(self.num_neighbors)]
            blocks = []
            for hop, bound in zip(hops, bounds):
                graph = block_graph(hop.rowptr, hop.local_src, hop.dst, hop.nodes.numel(), sampled=True,
                                    out_degrees=hop.out_degrees)
                blocks.append(Block(graph, hop.nodes,
                                    prepare_layouts(graph, bound, hop.unread_dst, hop.max_out_degree)))
        return MiniBatch(blocks, x, y, n_id, input_id)

    def _lookup(self, table: torch.Tensor | None, nodes: torch.Tensor) -> torch.Tensor | None:
        """Rows ``nodes`` of a feature or label table: gathered where the table is, or,
        from a pinned host table with ``nodes`` on the GPU, read in place by a kernel
        (`zero_copy_rows`), falling back to a host gather where that cannot run."""
        if table is None:
            return None
        if self._zero_copy and (rows := zero_copy_rows(table, nodes)) is not None:
            return rows
        return self._gather(table, nodes.to(table.device))

    def _gather(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of a table on ``ids``'s device; into page-locked memory when they
        are headed for the device from the host."""
        if table.device.type == "cpu" and self.device.type == "cuda":
            out = torch.empty((ids.numel(),) + table.shape[1:], dtype=table.dtype, pin_memory=True)
            return torch.index_select(table, 0, ids, out=out)
        return table.index_select(0, ids)

    def _to_device(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None or tensor.device == self.device:
            return tensor
        if tensor.device.type == "cpu" and self.device.type == "cuda" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def __repr__(self) -> str:
        return (f"NeighborLoader(num_neighbors={self.num_neighbors}, batch_size={self.batch_size}, "
                f"seeds={self.seeds.numel()}, device={self.device}, feature_device={self.feature_device!r})")
