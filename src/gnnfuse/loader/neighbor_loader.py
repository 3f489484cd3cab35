"""`NeighborLoader`: PyG's mini-batch loader, yielding per-layer blocks for gnnfuse layers.

Each batch takes ``batch_size`` seed vertices, samples ``num_neighbors[0]`` in-edges of
each, then ``num_neighbors[1]`` of each vertex reached, and so on (PyG's order: entry i
is hop i from the seeds), and hands back one `Block` per layer, input layer first:
``blocks[-1]``'s destinations are the seeds, ``blocks[0]``'s sources every vertex the
batch reads features of. A model runs ``x = layer((x, x[:block.num_dst]), block.graph)``
down the list (`gnnfuse.nn.block_models.BlockGNN`). A batch also gives PyG's sampled
subgraph, cut from the blocks on first use (``batch.edge_index``, ``num_sampled_nodes``,
...: `loader.pyg_batch`), so PyG's ``model(batch.x, batch.edge_index)`` runs on it too,
with a PyG ``Data``'s other attributes (``batch.train_mask``: `loader.data_attributes`)
and PyG's ``batch.to(device)`` (`loader.batch_move`).

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
ahead of the training loop (`Prefetcher`), on a side CUDA stream on a GPU. With
``num_workers >= 1`` worker processes do (`loader.workers`), up to ``prefetch`` batches
ahead each, so the loader's Python no longer shares the training loop's interpreter
lock. The batches are the same either way (each samples from its own generator).
Per-stage seconds accumulate in ``loader.stage_times``.

Each block comes with what its layers' kernels derive from it (reverse CSR, degrees,
the Triton backend's edge segments: `loader.layouts`), built in that thread, so a
training step on the blocks reads nothing back from the device.
"""
from __future__ import annotations

import contextlib
import numbers
import operator
import sys
import warnings
from typing import Any, Iterator, Sequence, Sized

import torch

from ..graph import Graph
from .batch_maker import BatchMaker, MiniBatch, batch_generator
from .batch_move import target_device
from .data_attributes import data_attributes
from .held_tables import CopiedTables, held_tables
from .preparation import STAGE_TIMES, BatchPreparation, check_settings, epoch_batches, epoch_order
from .static_shapes import IGNORE_LABEL, Capacities
from .workers import Batch, Maker

FEATURE_DEVICES = ("device", "pinned")
PROBED_BATCHES = 8       # batches sampled to set the capacities of ``static_shapes=True``


EDGE_TABLES = ("edge_attr", "edge_weight")     # a PyG Data's edge-level tensors a block carries


def _graph_and_tables(data: Any, x: torch.Tensor | None, y: torch.Tensor | None, loader: str = "NeighborLoader"
                      ) -> tuple[Graph, torch.Tensor | None, torch.Tensor | None, dict[str, torch.Tensor]]:
    """(graph, features, labels, edge tables) of a gnnfuse `Graph` (tables by keyword), a
    gnnfuse `NodeDataset`, or a PyG ``Data`` (read by attribute name, torch_geometric not
    imported; its ``edge_attr`` and ``edge_weight`` are the edge tables). Anything else is
    refused naming ``loader``, the loader the user made."""
    edge_tables: dict[str, torch.Tensor] = {}
    if isinstance(data, Graph):
        return data, x, y, edge_tables
    if isinstance(getattr(data, "graph", None), Graph):       # gnnfuse NodeDataset
        graph = data.graph
    elif getattr(data, "edge_index", None) is not None:       # PyG Data
        # its edge_type / node_type are attributes the batches cut by e_id / n_id, as PyG's
        # loader cuts them (`loader.data_attributes`; an R-GCN reads batch.edge_type)
        graph = Graph.from_edge_index(data.edge_index, getattr(data, "num_nodes", None))
        edge_tables = {name: getattr(data, name) for name in EDGE_TABLES if getattr(data, name, None) is not None}
    else:
        raise TypeError(f"{loader} takes a gnnfuse Graph, a gnnfuse NodeDataset or a PyG Data with an "
                        f"edge_index, got {type(data).__name__}")
    return graph, getattr(data, "x", None) if x is None else x, getattr(data, "y", None) if y is None else y, edge_tables


def pyg_num_neighbors(num_neighbors: Any) -> tuple[Any, Any]:
    """(values, default) of PyG's ``NumNeighbors`` (which PyG's loaders take in place of a
    list or a dict; it was refused as "not a list of fanouts"), else (``num_neighbors``,
    None). torch_geometric is not imported for it: a ``NumNeighbors`` exists only once it is."""
    module = sys.modules.get("torch_geometric.sampler.base")
    if module is not None and isinstance(num_neighbors, module.NumNeighbors):
        return num_neighbors.values, num_neighbors.default
    return num_neighbors, None


def _fanouts(num_neighbors: Any) -> list[int]:
    """``num_neighbors`` as a list of whole fanouts: ``int()`` had turned a fanout of 2.5
    into 2 without a word, a PyG per-edge-type dict failed on ``int('author')``, and a
    bare int on "'int' object is not iterable". A fanout of 0 is PyG's too: that hop's
    block has no edges (its layer's destinations keep their own terms: a root weight, a
    self loop), and PyG's subgraph (`MiniBatch.edge_index`) adds nothing from it on."""
    if isinstance(num_neighbors, dict):
        raise TypeError("num_neighbors as a dict (a fanout list per edge type) is for PyG's heterogeneous "
                        "graphs (a HeteroData); this graph is homogeneous: give one list of fanouts")
    if isinstance(num_neighbors, (str, bytes)) or not hasattr(num_neighbors, "__iter__"):
        raise TypeError(f"num_neighbors must be a list of fanouts, one per hop, got {num_neighbors!r}")
    try:
        fanouts = [operator.index(k) for k in num_neighbors]
    except TypeError:
        raise TypeError(f"num_neighbors must hold whole numbers (a fanout per hop, -1 for all), got "
                        f"{list(num_neighbors)}") from None
    if not fanouts or any(k < -1 for k in fanouts):
        raise ValueError(f"num_neighbors must be a non-empty list of fanouts >= 0 (or -1 for all), got {fanouts}")
    return fanouts


def _sampled_fanouts(fanouts: list[int], rowptr: torch.Tensor, replace: bool) -> tuple[int, ...]:
    """The fanouts the sampler is given. Without replacement a fanout above every vertex's
    in-degree takes each vertex's every in-edge, as the largest in-degree does; but a hop
    lays its sample out in ``fanout`` slots per destination, so ``[10**12]`` (which PyG
    takes) asked for terabytes and ``[10**6]`` took 5 GB for 87 seeds. So each is bounded
    by the largest in-degree, read once here."""
    if replace or all(k < 0 for k in fanouts):
        return tuple(fanouts)
    most = int((rowptr[1:] - rowptr[:-1]).max()) if rowptr.numel() > 1 else 0
    return tuple(k if k < 0 else min(k, most) for k in fanouts)


def _check_batch_size(batch_size: Any) -> None:
    """Refuse a batch size that is not a whole number >= 1: 2.5 failed only at the first
    batch, inside ``split``; and PyG's third positional argument is ``input_nodes``, so
    ``NeighborLoader(data, [10], torch.tensor([7]))`` ported from PyG (seed 7 there) took
    7 as the batch size and every vertex as a seed."""
    if isinstance(batch_size, numbers.Integral) and batch_size >= 1:
        return
    hint = (" (PyG's third positional argument is input_nodes; here it is batch_size: pass input_nodes=...)"
            if isinstance(batch_size, torch.Tensor) or hasattr(batch_size, "__len__") else "")
    raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}{hint}")


def _seed_ids(input_nodes: Any, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed vertices as int64 ids on the host (all vertices, a boolean mask, or ids),
    and PyG's ``input_id`` of each: its vertex id for all vertices or a mask, its position
    in ``input_nodes`` for ids (PyG's ``get_input_nodes`` and ``NodeSamplerInput``)."""
    if input_nodes is None:
        return torch.arange(num_nodes), torch.arange(num_nodes)
    try:
        ids = torch.as_tensor(input_nodes).cpu()
    except (TypeError, ValueError, RuntimeError):
        hetero = isinstance(input_nodes, str) or (isinstance(input_nodes, tuple) and len(input_nodes) > 0
                                                  and isinstance(input_nodes[0], str))
        why = (" (a node type, or a node type with its ids, is PyG's form for heterogeneous graphs, a "
               "HeteroData; this graph is homogeneous)" if hetero else "")
        raise TypeError(f"input_nodes must be node ids or a boolean mask, got {type(input_nodes).__name__} "
                        f"{input_nodes!r:.80}{why}") from None
    if ids.dim() == 1 and ids.numel() == 0:       # an empty list is a float tensor: no seeds, not a bad type
        return ids.long(), ids.long()
    if ids.dtype == torch.bool:
        # a [N, 1] mask has N entries, but its nonzero() rows are (row, column) pairs,
        # which flattened had made seeds of every column id (0) and shifted the batches
        if ids.dim() != 1:
            raise ValueError(f"input_nodes mask must be 1-D (one entry per node), got shape {list(ids.shape)}: "
                             f"give mask.view(-1)")
        if ids.numel() != num_nodes:
            raise ValueError(f"input_nodes mask has {ids.numel()} entries but the graph has {num_nodes} nodes")
        seeds = ids.nonzero().flatten()
        return seeds, seeds
    if ids.dtype.is_floating_point or ids.dim() != 1:
        raise ValueError(f"input_nodes must be a 1-D tensor of node ids or a boolean mask, got {ids.dtype} "
                         f"of shape {list(ids.shape)}")
    ids = ids.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
        raise ValueError(f"input_nodes holds ids outside 0..{num_nodes - 1}")
    if torch.unique(ids).numel() != ids.numel():
        raise ValueError("input_nodes holds repeated ids; a seed must appear once per epoch")
    return ids, torch.arange(ids.numel())


def _check_tensor_tables(features: Any, labels: Any) -> None:
    """Refuse an ``x`` or ``y`` that is not a tensor (a NumPy array, a list: PyG's ``Data``
    holds either), which failed on "'numpy.ndarray' object has no attribute 'dim'"; the
    batches gather tensor rows (PyG's would be the array's, not a tensor)."""
    for name, table in (("x", features), ("y", labels)):
        if table is not None and not isinstance(table, torch.Tensor):
            raise TypeError(f"{name} must be a tensor with a row per node, got {type(table).__name__}: give "
                            f"torch.as_tensor({name}) (data.{name} = torch.as_tensor(data.{name}))")


def _check_paddable_labels(labels: torch.Tensor | None) -> None:
    """Refuse labels whose dtype cannot hold `IGNORE_LABEL`, which ``static_shapes`` writes
    past a padded batch's seeds (the rows a short batch's replayed step reads as ignored,
    `BlockStepCapture(short_batches="replay")`): a bool ``y`` was padded with True and a
    uint8 one with 156, real labels no loss can tell from the seeds' (the graph
    `DataLoader`'s ``static_shapes`` refuses them too)."""
    if labels is None or labels.dtype.is_floating_point or labels.dtype.is_complex:
        return
    if labels.dtype == torch.bool or not labels.dtype.is_signed:
        raise ValueError(f"static_shapes cannot pad a {labels.dtype} y: its padded rows would hold {IGNORE_LABEL} "
                         f"(IGNORE_LABEL, which the loss must ignore) as "
                         f"{torch.tensor(IGNORE_LABEL).to(labels.dtype).item()}, a real label; give int64 labels "
                         f"(y.long()), or leave static_shapes out")


def _check_learnable(name: str, table: torch.Tensor, placed: torch.Tensor, prefetch: int, num_workers: int) -> None:
    """Refuse a table that requires grad (a learnable embedding as ``x``) where its batches
    would not read it as the optimizer left it: a batch prepared ahead (``prefetch``) reads
    rows the optimizer has not updated yet (how many steps stale depends on the thread's
    timing), a worker process sends rows without their gradient, and a copy made here
    (another device, pinned memory) never sees an update. Read on demand from the table
    itself, its rows are PyG's (``data.x[n_id]``) with their gradient."""
    if placed is not table:
        why = f"the loader would copy it to {'pinned memory' if placed.is_pinned() else placed.device} once"
    elif num_workers:
        why = f"num_workers={num_workers} processes would send its rows without their gradient"
    elif prefetch:
        why = f"prefetch={prefetch} would read its rows for batches ahead, before the optimizer updates them"
    else:
        return
    raise ValueError(f"{name} requires grad (a learnable table) and {why}: pass prefetch=0 and num_workers=0, "
                     f"with the table where the batches go")


def _sampled_positions(sampler: Sized, num_seeds: int) -> torch.Tensor:
    """An epoch's positions in ``input_nodes`` from ``sampler``, each once: a seed
    repeated in a batch (a ``WeightedRandomSampler`` drawing with replacement, say) got
    one destination row for both, so the batch's rows past it were other vertices' (seeds
    0, 1, 0 gave ``blocks[-1].src_nodes[:3]`` = 0, 1, 3: the third row had vertex 3's
    features and vertex 0's in-edges), and a negative position wrapped around."""
    drawn = list(sampler)
    positions = torch.as_tensor(drawn) if drawn else torch.empty(0, dtype=torch.int64)
    if positions.dim() != 1 or positions.dtype.is_floating_point or positions.dtype.is_complex \
            or positions.dtype == torch.bool:
        # as_tensor(..., dtype=int64) had truncated 0.5 to 0; a BatchSampler gives lists
        raise ValueError(f"sampler must give one whole-number position at a time (it indexes input_nodes), got "
                         f"{positions.dtype} of shape {list(positions.shape)}: pass a BatchSampler's own sampler, "
                         f"with batch_size")
    positions = positions.long()
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= num_seeds):
        raise ValueError(f"sampler gave positions outside 0..{num_seeds - 1} (it indexes input_nodes)")
    if torch.unique(positions).numel() != positions.numel():
        raise ValueError("sampler gave a position twice in one epoch; a seed must appear once per epoch (a "
                         "sampler drawing with replacement is not supported)")
    return positions


# PyG's NeighborLoader (and DataLoader) arguments gnnfuse's loader has no parameter for,
# each with the values under which PyG samples as gnnfuse does; `...` accepts any value
# (a hint or a performance setting that changes no batch: PyG's ``is_sorted``, and
# ``persistent_workers``, gnnfuse's workers being kept anyway).
_PYG_OPTIONS: dict[str, Any] = {
    "input_time": None, "time_attr": None, "temporal_strategy": "uniform", "subgraph_type": "directional",
    "directed": True, "disjoint": False, "weight_attr": None, "transform": None,
    "transform_sampler_output": None, "neighbor_sampler": None, "collate_fn": None,
    "is_sorted": ..., "filter_per_worker": ..., "persistent_workers": ..., "pin_memory": ...,
}


# torch DataLoader's arguments, which PyG's loaders pass on to it, for the processes and
# batches of a DataLoader that gnnfuse's loaders do not run (`generator` they take)
_DATALOADER_ONLY = frozenset({"worker_init_fn", "timeout", "prefetch_factor", "multiprocessing_context",
                              "pin_memory_device", "in_order", "batch_sampler"})


def _check_pyg_options(options: dict[str, Any], known: dict[str, Any] = _PYG_OPTIONS,
                       loader: str = "NeighborLoader") -> None:
    """Accept PyG's arguments where their value asks for what gnnfuse does; refuse the
    rest by name. Before, each failed as Python's bare "unexpected keyword argument".
    ``known`` maps the loader's PyG options to their accepted values (`_PYG_OPTIONS`'s form)."""
    for name, value in options.items():
        if name in _DATALOADER_ONLY:
            raise TypeError(f"{loader}: torch DataLoader's {name}= has no counterpart here: gnnfuse's loader runs "
                            "no DataLoader (it prepares batches in its own threads, prefetch_threads, or worker "
                            "processes, num_workers); leave it out")
        if name not in known:
            raise TypeError(f"{loader} got an unexpected keyword argument {name!r}")
        accepted = known[name]
        if accepted is ... or value is accepted or (accepted is not None and getattr(value, "value", value) == accepted):
            continue
        raise NotImplementedError(
            f"{loader}: PyG's {name}={value!r} is not supported by gnnfuse's loader, which samples "
            f"without time, per-edge weights, transforms or disjoint subgraphs (its blocks are PyG's "
            f"{name}={accepted!r}); leave it out")


def take_generator(options: dict[str, Any], loader: str) -> torch.Generator | None:
    """PyG's (torch DataLoader's) ``generator=`` taken out of ``options``: the epochs'
    seeds (`epoch_seed`) come from it. It had been refused as an unexpected argument."""
    generator = options.pop("generator", None)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{loader}: generator must be a torch.Generator, got {type(generator).__name__}")
    return generator


def epoch_seed(generator: torch.Generator | None) -> int:
    """The one seed an epoch's order and samples come from: drawn from ``generator``
    where the loader was given one (PyG's argument for a reproducible shuffle; here it
    fixes the samples too), else from torch's global generator (``torch.manual_seed``)."""
    if generator is None:
        return int(torch.randint(0, 2**62, (1,)))
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))


class NeighborLoader:
    """Mini-batches of sampled neighbourhoods (see the module docstring). A PyG
    ``HeteroData`` gets PyG's heterogeneous batches instead (`HeteroNeighborLoader`).

    PyG's arguments: ``num_neighbors`` (a fanout per hop, ``-1`` for all in-edges, 0 for none),
    ``batch_size``, ``input_nodes`` (ids or a mask; default all vertices), ``shuffle``,
    ``replace``, ``drop_last``, and torch ``DataLoader``'s ``sampler`` (an iterable of
    positions in ``input_nodes`` giving each epoch's seed order, each once, with ``len``; call its
    ``set_epoch`` per epoch, as for ``torch.utils.data.DistributedSampler``, which is how
    data-parallel ranks each take their share; exclusive with ``shuffle``). gnnfuse's: ``x``/``y`` (and ``edge_attr``/``edge_weight``, a row
    per edge of ``edge_index``, which a PyG ``Data`` brings as attributes) for a bare
    `Graph`, each block then carrying its edges' ids and rows (`Block`); ``device``
    (where batches go; default ``sample_device``), ``sample_device`` (where the CSR is
    sampled; default the graph's device), ``feature_device`` (``"device"`` or
    ``"pinned"``; default ``"device"`` when the features are already on ``device`` or
    ``device`` is the CPU, else ``"pinned"``), ``prefetch`` (batches prepared ahead;
    0 prepares each batch when asked), ``prefetch_threads`` (threads preparing batches
    ahead without ``num_workers``, default 1: on a GPU a second one runs its batch's
    Python while the first waits for a hop's count), ``num_workers`` (PyG's name: processes that
    prepare the batches, started on the first epoch and kept; 0 prepares them in this
    process; host tables are then kept in shared memory, which each worker page-locks
    for its zero-copy reads) and ``static_shapes`` (True: pad every batch that fits to
    capacities probed on a few batches now, `capacities`; or given `Capacities`), which
    lets a CUDA graph replay the training step (`gnnfuse.training.BlockStepCapture`;
    `loader.static_shapes` says why the padding changes no number), and ``deferred``
    (with ``static_shapes``: padded batches come without their feature rows and kernel
    layouts, which `BlockStepCapture` builds inside the replayed step from `features`).
    `close` stops the workers. PyG's arguments with no counterpart here (``disjoint``,
    ``time_attr``, ``subgraph_type``, ``transform``, ...: `_PYG_OPTIONS`) are accepted at
    the value under which PyG samples as this loader does, and refused by name otherwise.

    Randomness: each epoch's shuffle and samples come from one seed drawn when iteration
    starts, from ``generator`` (PyG's argument) where given, else from torch's global
    generator, so ``torch.manual_seed`` fixes them; batch i
    samples from a generator seeded by that seed and i (`batch_generator`).
    """

    _name = "NeighborLoader"       # in its errors and warnings: a `LinkNeighborLoader`'s node loader says its own

    def __new__(cls, data: Any = None, *args: Any, **kwargs: Any) -> Any:
        """A PyG ``HeteroData`` gets the heterogeneous loader (`loader.hetero_loader`,
        imported here: it reads this module's argument checks), so PyG's heterogeneous
        idiom runs after the one import; any other graph this class."""
        from .hetero_loader import HeteroNeighborLoader, is_hetero_data
        if is_hetero_data(data):
            return HeteroNeighborLoader(data, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, data: Any, num_neighbors: Sequence[int], batch_size: int = 1, input_nodes: Any = None,
                 shuffle: bool = False, replace: bool = False, drop_last: bool = False, *,
                 x: torch.Tensor | None = None, y: torch.Tensor | None = None,
                 device: torch.device | str | None = None, sample_device: torch.device | str | None = None,
                 feature_device: str | None = None, prefetch: int = 2, sampler: Sized | None = None,
                 num_workers: int = 0, static_shapes: bool | Capacities = False, deferred: bool = False,
                 prefetch_threads: int = 1, edge_attr: torch.Tensor | None = None,
                 edge_weight: torch.Tensor | None = None, **pyg_options: Any) -> None:
        self.generator = take_generator(pyg_options, self._name)
        _check_pyg_options(pyg_options, loader=self._name)
        graph, features, labels, edge_tables = _graph_and_tables(data, x, y, self._name)
        _check_tensor_tables(features, labels)
        for name, table in (("edge_attr", edge_attr), ("edge_weight", edge_weight)):
            if table is not None:
                edge_tables[name] = table
        if graph.is_bipartite or graph.edge_type is not None:
            raise ValueError(f"{self._name} samples a homogeneous graph with one vertex set; this graph is "
                             f"{'bipartite' if graph.is_bipartite else 'typed'}")
        self.num_neighbors = _fanouts(pyg_num_neighbors(num_neighbors)[0])
        _check_batch_size(batch_size)
        batch_size = int(batch_size)
        if sampler is not None and shuffle:
            raise ValueError("sampler is mutually exclusive with shuffle (the sampler orders the seeds)")
        check_settings(prefetch, prefetch_threads, num_workers)
        # a 0-dim y is PyG's graph-level label, no node attribute (`Data.is_node_attr`): PyG's
        # batches carry it whole, and so do these (set on each, `_with_attributes`)
        graph_y, labels = (labels, None) if labels is not None and labels.dim() == 0 else (None, labels)
        if graph_y is not None and static_shapes is not False:
            raise ValueError("y is a 0-dim tensor (one value for the whole graph), which batches carry whole; "
                             "static_shapes pads y per seed: give a y per node, or leave static_shapes out")
        if static_shapes is not False:
            _check_paddable_labels(labels)
        for name, table in (("x", features), ("y", labels)):
            if table is not None and table.dim() == 0:      # a graph-level value: no row to cut per vertex
                raise ValueError(f"{name} is a 0-dim tensor (one value for the whole graph); the loader cuts {name} "
                                 f"by vertex and needs a row per node ({graph.num_nodes})")
            if table is not None and table.shape[0] != graph.num_nodes:
                raise ValueError(f"{name} has {table.shape[0]} rows but the graph has {graph.num_nodes} nodes")
        for name, table in edge_tables.items():
            if not isinstance(table, torch.Tensor) or table.dim() == 0 or table.shape[0] != graph.num_edges:
                shape = list(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
                raise ValueError(f"{name} must have a row per edge ({graph.num_edges}), got {shape}")
        if deferred and edge_tables:
            raise ValueError(f"deferred=True leaves a padded batch's lookups to the step, which gathers feature "
                             f"rows only; the {' and '.join(edge_tables)} would not reach the blocks")
        self.sample_device = target_device(sample_device if sample_device is not None else graph.device)
        self.device = target_device(device) if device is not None else self.sample_device
        csr = graph.to(self.sample_device).csr()
        self.num_nodes = graph.num_nodes
        self.feature_device = self._feature_device(feature_device, features)
        self.num_workers = num_workers
        # pinned tables are read in place by a kernel when batches are sampled on the GPU
        self._zero_copy = self.feature_device == "pinned" and self.sample_device.type == "cuda"
        self._copies = CopiedTables()      # tables kept as copies, whose in-place changes would reach no batch
        x_table = self._copies.placed("x", features, self._place(features))
        y_table = self._copies.placed("y", labels, self._place(labels))
        self._graph_y = None if graph_y is None else self._copies.placed("y", graph_y, graph_y.to(self.device))
        self._maker = BatchMaker(csr.rowptr.long(), csr.col.long(), x_table, y_table,
                                 _sampled_fanouts(self.num_neighbors, csr.rowptr, replace), replace, self.device,
                                 self.sample_device, self.feature_device, self._zero_copy)
        # the Data's other node- and edge-level attributes, attached to each batch here
        # (never sent to worker processes) and read by id when a loop reads them
        self._attributes = data_attributes(data, self._name)
        self._held = held_tables(data, {"x": x, "y": y, "edge_attr": edge_attr, "edge_weight": edge_weight})
        if edge_tables or (self._attributes is not None and self._attributes.edge):
            # read by edge id per batch, as PyG does: not a reordered copy made now
            self._maker.edge_ids = csr.eid.long()
            for name, table in edge_tables.items():
                setattr(self._maker, name, self._copies.placed(name, table, self._place(table)))
        for name, table in (("x", features), ("y", labels), *edge_tables.items()):
            if table is not None and table.requires_grad:
                _check_learnable(name, table, getattr(self._maker, name), prefetch, num_workers)
        self.seeds, self._input_ids = _seed_ids(input_nodes, graph.num_nodes)
        self.batch_size, self.shuffle, self.replace, self.drop_last = batch_size, shuffle, replace, drop_last
        self.prefetch, self.prefetch_threads, self.sampler = prefetch, prefetch_threads, sampler
        self._preparation = BatchPreparation(self.device, self.sample_device, prefetch, prefetch_threads,
                                             num_workers, self._name)
        if deferred and (static_shapes is False or self.feature_device != "device"):
            raise ValueError("deferred=True leaves padded batches' feature rows to the step, which gathers them "
                             "from a table on the device: it needs static_shapes and feature_device='device'")
        if isinstance(static_shapes, Capacities) and len(static_shapes.edges) != len(self.num_neighbors):
            raise ValueError(f"static_shapes has capacities for {len(static_shapes.edges)} hops but num_neighbors "
                             f"samples {len(self.num_neighbors)}")
        if static_shapes is not False:
            self._maker.capacities = (static_shapes if isinstance(static_shapes, Capacities)
                                      else self._probe_capacities())
            self._maker.deferred = deferred

    @property
    def features(self) -> torch.Tensor | None:
        """The feature table the batches' rows come from, where the lookups read it."""
        return self._maker.x

    @property
    def capacities(self) -> Capacities | None:
        """What batches are padded to (``static_shapes``), or None."""
        return self._maker.capacities

    def _probe_capacities(self, batches: int = PROBED_BATCHES) -> Capacities:
        """Capacities covering ``batches`` full batches of seeds drawn apart from the
        epochs' randomness (a fixed generator: torch's global one is left as it was)."""
        generator = torch.Generator().manual_seed(0)
        order = self.seeds[torch.randperm(self.seeds.numel(), generator=generator)]
        seeds = list(order.split(self.batch_size))[:batches]
        return Capacities.covering([self._maker.sizes(s, batch_generator(self.sample_device, 0, i))
                                    for i, s in enumerate(seeds)])

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
        if self.num_workers:     # shared with the workers, each of which page-locks it in place
            return (table.clone() if table.is_pinned() else table).share_memory_()
        if self._zero_copy and not table.is_pinned():
            try:    # page-locked once, so kernels read its rows in place (loader.zero_copy)
                table = table.pin_memory()
            except RuntimeError as exc:
                warnings.warn(f"gnnfuse {self._name}: could not page-lock the {list(table.shape)} feature "
                              f"table ({exc}); its rows are gathered on the host", RuntimeWarning, stacklevel=3)
        return table

    stage_times = STAGE_TIMES

    def __len__(self) -> int:
        full, rest = divmod(self.seeds.numel() if self.sampler is None else len(self.sampler), self.batch_size)
        return full + (rest > 0 and not self.drop_last)

    def _seed_batches(self, generator: torch.Generator, device: torch.device
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's (seeds, ``input_id``) per batch, on ``device``."""
        positions = (_sampled_positions(self.sampler, self.seeds.numel()) if self.sampler is not None
                     else epoch_order(self.seeds.numel(), self.shuffle, generator))
        return epoch_batches((self.seeds, self._input_ids), positions, self.batch_size, self.drop_last, device)

    def __iter__(self) -> Iterator[MiniBatch]:
        seed = epoch_seed(self.generator)
        batches = self._seed_batches(torch.Generator().manual_seed(seed), self._ids_device)
        # closed explicitly: an abandoned epoch (this generator closed) must stop the thread now,
        # not when the collector reaches the inner generator (Python 3.12 keeps it alive longer)
        with contextlib.closing(self._prepared(self._maker, batches, seed)) as prepared:
            for batch in prepared:
                yield self._with_attributes(batch)

    @property
    def _ids_device(self) -> torch.device:
        """Where an epoch's per-batch ids are listed: the host for worker processes, else
        where the batches are sampled."""
        return torch.device("cpu") if self.num_workers else self.sample_device

    def _prepared(self, maker: Maker, batches: list[tuple[torch.Tensor, ...]], seed: int) -> Iterator[Batch]:
        """``maker``'s batches of the epoch seeded ``seed``, in order: batch i is
        ``maker.prepare(batches[i][0], batch_generator(sample_device, seed, i), stage_times,
        *batches[i][1:])``, prepared as this loader's settings say (`BatchPreparation`: by
        its worker processes, by ``prefetch_threads`` threads ``prefetch`` batches ahead, or
        when asked). The worker pool keeps the first epoch's maker: a loader passes the same
        maker every epoch (`LinkNeighborLoader`, whose node loader this is, its
        `LinkBatchMaker`). A table of the ``Data`` replaced since the loader was built, or
        one changed in place that the loader holds a copy of, is refused (`held_tables`)."""
        for batch in self._preparation.epoch(maker, batches, seed, operator.methodcaller("tensors")):
            if self._held is not None:
                self._held.check(self._name)
            self._copies.check(self._name)
            yield batch

    def _with_attributes(self, batch: MiniBatch) -> MiniBatch:
        """``batch`` with the ``Data``'s other attributes to read (`loader.data_attributes`),
        its graph-level (0-dim) ``y`` and this loader's `PygViewDemand`, set on the batch,
        which is new and this loader's: a ``dataclasses.replace`` cost 2 µs a batch, and
        every PyG ``Data``'s loader attaches its attributes (the ``Data`` may be given more
        later)."""
        if self._attributes is not None:
            object.__setattr__(batch, "attributes", self._attributes)
        if batch.pyg_demand is not None:       # a worker's batch carries its copy: a read must reach this maker
            object.__setattr__(batch, "pyg_demand", self._maker.pyg_view)
        if self._graph_y is not None:      # PyG's graph-level y, whole (the maker cut none)
            object.__setattr__(batch, "y", self._graph_y)
        return batch

    def close(self) -> None:
        """Stop the worker processes, if any (they also stop when the loader is freed)."""
        self._preparation.close()

    def __repr__(self) -> str:
        workers = f", num_workers={self.num_workers}" if self.num_workers else ""
        static = f", capacities={self.capacities}" if self.capacities is not None else ""
        return (f"NeighborLoader(num_neighbors={self.num_neighbors}, batch_size={self.batch_size}, "
                f"seeds={self.seeds.numel()}, device={self.device}, feature_device={self.feature_device!r}"
                f"{workers}{static})")
