"""What turns a batch of seed vertices into a `MiniBatch`: the stages S, R, K, T of
GraphTensor §V-B, for one batch at a time.

It holds only tensors and settings, so it pickles: the loader's worker processes
(`loader.workers`) each get one, with the CSR and the feature tables shared rather than
copied (CUDA tensors through CUDA IPC, host tensors through shared memory).

Randomness: batch ``i`` of an epoch samples from its own generator, seeded from the
epoch's seed and ``i`` (`batch_generator`), so a batch's draws do not depend on which
thread or process prepares it, nor on the batches prepared before it. A hop that runs
as fused kernels (`hop_kernels`: with a fanout, without replacement, on a GPU or with
Numba on a CPU) draws from a counter-based stream keyed by that generator's seed and the
hop instead.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any, Sequence

import torch

from ..graph.fixed_shape import mark_padded
from ..nn.conv import known_transform_first_rows, looped_positions, transform_first_rows, want_looped
from . import batch_move, pyg_batch
from .block import Block, block_graph
from .data_attributes import DataAttributes
from .data_methods import PygDataMethods
from .hop_kernels import fused_hops, hop_seed, reindex_slots_fused, sample_slots_fused
from .layouts import SourceSideDemand, prepare_layouts, tensors_in
from .sampler import SampledBlock, reindex_slots, sample_slots
from .stages import StageTimes, device_stream
from .static_shapes import IGNORE_LABEL, Capacities, batch_sizes, pad_block, pad_rows
from .zero_copy import register_host_memory, zero_copy_rows

_GOLDEN = 0x9E3779B97F4A7C15      # Weyl increment: far-apart seeds for consecutive batches


def batch_generator(device: torch.device, epoch_seed: int, index: int) -> torch.Generator:
    """The generator batch ``index`` of the epoch seeded ``epoch_seed`` samples from."""
    return torch.Generator(device).manual_seed((epoch_seed + (index + 1) * _GOLDEN) % 2**63)


def read_only_batch(cls: type) -> type:
    """``cls`` (a frozen dataclass of batches) with assignment refused by a message that
    says why and what to do: PyG's batch is a ``Data`` a loop may write to (``batch.x =
    emb(batch.n_id)``), and the dataclass's own "cannot assign to field 'x'" named
    neither gnnfuse nor the way out. A batch's blocks, PyG view and kernel layouts are
    built from its tensors, so a tensor replaced afterwards would be read beside stale
    ones; the loader's own code writes through ``object.__setattr__``."""
    def refuse(self: Any, name: str, value: Any = None) -> None:
        raise FrozenInstanceError(
            f"cannot set batch.{name}: a gnnfuse {type(self).__name__} is read-only, as its blocks, PyG view "
            "(edge_index) and kernel layouts are built from its tensors; keep the new value in a name of your "
            "own (x = emb(batch.n_id); model(x, batch.edge_index)), or give the loader the table it should "
            "gather (NeighborLoader(data, ...) with the new column in data)")
    cls.__setattr__ = refuse
    cls.__delattr__ = refuse
    return cls


@read_only_batch
@dataclass(frozen=True)
class MiniBatch(PygDataMethods):
    """One batch: the blocks (input layer first), the input features of
    ``blocks[0]``'s sources, the seeds' labels, and ids.

    ``n_id`` are the global ids of the input vertices (PyG's name; the first
    ``batch_size`` are the seeds). ``input_id`` is PyG's too: each seed's position in the
    loader's ``input_nodes`` when those were ids, its vertex id when they were a mask or
    all vertices (as PyG's loader gives it). A ``padded`` batch (a loader with
    ``static_shapes``) has its blocks, ``x``, ``y`` and ``n_id`` padded to the loader's
    capacities (`loader.static_shapes`): ``n_id`` holds the first seed's id for padded
    rows and the blocks' ``src_nodes`` hold id 0, ``x`` holds zeros there -- not a
    vertex's features, whose inf or NaN would reach the weights' gradients through the
    padded rows' zero gradients (a deferred batch's step gathers the first seed's row,
    which the loss reads anyway) --, ``y`` holds ``IGNORE_LABEL`` past
    the seeds, and the model's rows past ``batch_size`` are padding; ``input_id`` and
    ``batch_size`` stay the real seeds. A ``deferred`` one (``deferred=True`` too) has
    no ``x`` and its blocks no kernel layouts yet: `static_shapes.complete` builds them
    (inside a captured step, `BlockStepCapture`).

    PyG's batch attributes come too, built from the blocks on first use
    (`loader.pyg_batch`, which says how PyG's subgraph sits in them): ``edge_index``,
    ``num_sampled_nodes``, ``num_sampled_edges``, ``num_nodes``, and ``e_id``,
    ``edge_attr``, ``edge_weight`` in ``edge_index``'s order; so does PyG's
    ``model(batch.x, batch.edge_index)[:batch.batch_size]``. ``hop_edges`` holds what
    they need of the sampler's counts (PyG's ``num_sampled_edges``; None when padded,
    whose batches refuse them). ``y`` stays the seeds' labels: PyG's holds every
    vertex's, and ``y[:batch_size]`` is the same in both (a 0-dim, graph-level ``y`` comes
    whole, as in PyG). A PyG ``Data``'s other
    attributes (``batch.train_mask``, cut by ``n_id``; edge-level ones by ``e_id``) are
    read through ``attributes``, which the loader attaches in the training process
    (`loader.data_attributes`), each gathered on first read; `to` moves the batch as PyG's ``Data.to`` (`loader.batch_move`).
    ``keys()``, ``'x' in batch``, ``batch['x']``, ``num_edges`` and the feature counts are
    ``Data``'s (`loader.data_methods`)."""
    blocks: list[Block]
    x: torch.Tensor | None
    y: torch.Tensor | None
    n_id: torch.Tensor
    input_id: torch.Tensor
    padded: bool = False
    deferred: bool = False
    hop_edges: tuple[int, ...] | None = None
    attributes: DataAttributes | None = field(default=None, repr=False, compare=False)
    # ``edge_index`` and its graph, built ahead once the loader has seen a step read it
    # (`pyg_batch.PygViewDemand`, which ``pyg_demand`` tells of a read); None otherwise,
    # and both None on a padded batch, which has no PyG view
    pyg_view: pyg_batch.PygView | None = field(default=None, repr=False, compare=False)
    pyg_demand: pyg_batch.PygViewDemand | None = field(default=None, repr=False, compare=False)

    @property
    def batch_size(self) -> int:
        return self.input_id.numel()

    @property
    def num_nodes(self) -> int:
        """PyG's: the vertices of the sampled subgraph (``n_id``'s, ``x``'s rows)."""
        self._pyg_counts("num_nodes")
        return self.n_id.numel()

    @property
    def num_sampled_nodes(self) -> list[int]:
        """PyG's: the seeds, then how many vertices each hop added."""
        self._pyg_counts("num_sampled_nodes")
        return pyg_batch.num_sampled_nodes(self.blocks)

    @property
    def num_sampled_edges(self) -> list[int]:
        """PyG's: each hop's edges in ``edge_index`` (the in-edges of the vertices it expanded)."""
        return list(self._pyg_counts("num_sampled_edges"))

    @functools.cached_property
    def edge_index(self) -> torch.Tensor:
        """PyG's ``[2, E]`` subgraph over ``n_id`` (row 0 the sampled neighbour, row 1
        the vertex it was sampled for), hop by hop, seeds' in-edges first.

        Its `Graph` comes with it, remembered for it (`graph.index_cache`) under the
        vertex count a layer given ``x`` asks for: a gnnfuse layer called on it finds
        the graph instead of making one, which read its ids' range back to the host (a
        sync on a GPU) and sorted its edges in the step (`pyg_batch.subgraph_graph`). Built
        in the loader's thread, with its layouts, once a step has read an ``edge_index``.
        So are the graphs of the prefixes PyG's ``trim_to_layer`` cuts from it
        (``num_sampled_nodes_per_hop=``), once a step has run a layer on one."""
        view = self.pyg_view
        if view is None:
            if self.pyg_demand is not None:
                self.pyg_demand.mark()
            view = pyg_batch.view_in_step(self.blocks, self._pyg_counts("edge_index"))
        pyg_batch.remember_view(view, self.blocks, self.hop_edges, self.pyg_demand)
        return view.edge_index

    @functools.cached_property
    def e_id(self) -> torch.Tensor:
        """PyG's: each ``edge_index`` column's id in the full graph's ``edge_index``."""
        rows = pyg_batch.subgraph_edge_rows(self.blocks, self._pyg_counts("e_id"), "e_id")
        if rows is None:
            raise AttributeError("batch.e_id: this loader keeps edge ids only with edge tables (a PyG Data's "
                                 "edge_attr or edge_weight, or the loader's edge_attr=... argument), whose rows "
                                 "come as batch.edge_attr / batch.edge_weight")
        return rows

    @functools.cached_property
    def edge_attr(self) -> torch.Tensor | None:
        """PyG's: the edge table's rows in ``edge_index``'s order; None without one (as PyG's ``Data``)."""
        return pyg_batch.subgraph_edge_rows(self.blocks, self._pyg_counts("edge_attr"), "edge_attr")

    @functools.cached_property
    def edge_weight(self) -> torch.Tensor | None:
        """As `edge_attr`, for an ``edge_weight`` table."""
        return pyg_batch.subgraph_edge_rows(self.blocks, self._pyg_counts("edge_weight"), "edge_weight")

    def __getattr__(self, name: str) -> Any:
        """PyG's batch attributes cut from the loader's ``Data`` (``batch.train_mask``:
        `loader.data_attributes`), gathered on first read; any other name is missing."""
        if hasattr(type(self), name):
            # a property that raised AttributeError (``e_id`` without edge ids), which
            # Python then looks up here: raise its own error, not a bare "no attribute"
            return object.__getattribute__(self, name)
        attributes = self.__dict__.get("attributes")      # not self.attributes: unpickling asks before it is set
        if attributes is None or name not in attributes:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._pyg_counts(name)
        rows = self.__dict__[name] = attributes.rows(name, self.n_id, lambda: self.e_id)
        return rows

    def to(self, device: torch.device | str | int, *attrs: str, non_blocking: bool = False) -> MiniBatch:
        """PyG's ``Data.to``: this batch on ``device``, moved in place and returned
        (`loader.batch_move`); itself, untouched, when everything is there already (a
        loader's batches arrive on its ``device``). PyG's form moving only the attributes
        named is refused: a batch's blocks and ids share one device."""
        if attrs:
            raise TypeError(f"batch.to(device, {', '.join(map(repr, attrs))}): moving only some attributes is "
                            f"not supported (a batch's blocks, ids and features share one device); move the whole "
                            f"batch with batch.to(device)")
        if batch_move.on_device(self, batch_move.target_device(device)):
            return self
        return batch_move.move_batch(self, device, non_blocking)

    def cpu(self) -> MiniBatch:
        """PyG's ``Data.cpu``: `to` the host."""
        return self.to("cpu")

    def cuda(self, device: torch.device | str | int | None = None, non_blocking: bool = False) -> MiniBatch:
        """PyG's ``Data.cuda``: `to` a CUDA device (the current one by default)."""
        return self.to("cuda" if device is None else device, non_blocking=non_blocking)

    def _data_keys(self) -> list[str]:
        """The names PyG's batch would hold: the PyG view's only where this batch has one
        (not padded), the edge tables' where the loader was given them."""
        keys = [name for name in ("x", "y") if getattr(self, name) is not None] + ["n_id", "input_id", "batch_size"]
        if self.hop_edges is not None:
            keys += ["num_nodes", "edge_index", "num_sampled_nodes", "num_sampled_edges"]
            first = self.blocks[0] if self.blocks else None
            keys += [name for name in ("e_id", "edge_attr", "edge_weight")
                     if first is not None and getattr(first, name) is not None]
        if self.attributes is not None:
            keys += [*self.attributes.node, *self.attributes.edge, *self.attributes.whole]
        return list(dict.fromkeys(keys))

    def _pyg_counts(self, name: str) -> tuple[int, ...]:
        """``hop_edges``, or PyG's attribute ``name`` refused on a padded batch."""
        if self.hop_edges is None:
            pyg_batch.refuse_padded(name)
        return self.hop_edges

    def tensors(self) -> list[torch.Tensor]:
        out = [self.n_id, self.input_id] + [t for block in self.blocks for t in block.tensors()]
        if self.pyg_view is not None:
            out += self.pyg_view.tensors()
        return out + [t for t in (self.x, self.y) if t is not None]


@dataclass
class BatchMaker:
    """The sampling graph (``rowptr``/``col`` on ``sample_device``), the feature and
    label tables where their lookups run, and the loader's settings."""
    rowptr: torch.Tensor
    col: torch.Tensor
    x: torch.Tensor | None
    y: torch.Tensor | None
    num_neighbors: Sequence[int]
    replace: bool
    device: torch.device
    sample_device: torch.device
    feature_device: str
    zero_copy: bool
    capacities: Capacities | None = None     # pad batches that fit to these (`static_shapes`)
    deferred: bool = False                   # padded batches leave x and the layouts to the step
    source_side: SourceSideDemand = field(default_factory=SourceSideDemand)   # what steps walk by source
    pyg_view: pyg_batch.PygViewDemand = field(default_factory=pyg_batch.PygViewDemand)   # steps read edge_index
    # edge tables where their lookups run, a row per edge of ``edge_index`` in its order
    # (the caller's tensors when already there, so an in-place change reaches the next
    # batch, as for ``x`` and in PyG); ``edge_ids`` (on ``sample_device``) maps a CSR
    # position to its edge's id, which indexes them. All None when the loader was given
    # no edge table (`Block`).
    edge_attr: torch.Tensor | None = None
    edge_weight: torch.Tensor | None = None
    edge_ids: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.rowptr.numel() - 1

    def learnt(self) -> tuple[bool, bool, frozenset[int]]:
        """What this maker has learnt of the training steps that worker processes' copies
        of it cannot see (`loader.workers`): whether steps read PyG's view, and trimmed it,
        and at which positions layers asked for a block's self-looped graph
        (`nn.conv.looped_positions`: a worker's blocks came without it, and each GAT step
        built it, reading counts back from the device)."""
        return self.pyg_view.wanted, self.pyg_view.trimmed, looped_positions()

    def learn(self, learnt: tuple[bool, bool, frozenset[int]]) -> None:
        """Take what the training process's maker has `learnt` (in a worker process)."""
        self.pyg_view.wanted, self.pyg_view.trimmed, looped = learnt
        want_looped(looped)

    def pin_shared_tables(self) -> None:
        """In a worker process: page-lock the host tables shared with it (`zero_copy`
        reads need pinned pages); where the driver refuses, rows are gathered on the host."""
        for name in ("x", "y", "edge_attr", "edge_weight"):
            table = getattr(self, name)
            if self.zero_copy and table is not None and not register_host_memory(table):
                warnings.warn(f"gnnfuse loader worker: could not page-lock the shared {name} table "
                              f"{list(table.shape)}; its rows are gathered on the host", RuntimeWarning, stacklevel=2)

    def prepare(self, seeds: torch.Tensor, generator: torch.Generator, times: StageTimes,
                input_id: torch.Tensor | None = None) -> MiniBatch:
        """The batch of ``seeds`` (vertex ids); ``input_id`` is the batch's `MiniBatch.input_id`
        (default the seeds themselves)."""
        hops = self._sample(seeds, generator, times)
        nodes = hops[-1].nodes
        caps = self.capacities if self.capacities is not None and self.capacities.fits(seeds.numel(), hops) else None
        hop_edges = None if caps is not None else pyg_batch.pyg_hop_edges(
            [hop.local_src.numel() - hop.earlier_edges for hop in hops], self.num_neighbors)
        deferred = caps is not None and self.deferred
        on_device = device_stream(self.device)
        in_place = self.feature_device == "device" or (self.zero_copy and nodes.device.type == "cuda")
        with times.timing("lookup", stream=on_device if in_place else None):
            # padded rows read the first seed's id: a deferred batch's step gathers them
            # (`static_shapes.complete`); a whole batch's padded features are zeros
            read = nodes if caps is None else torch.cat([nodes, nodes[:1].expand(caps.nodes[-1] - nodes.numel())])
            x = None if deferred else self._lookup(self.x, read)
            if caps is not None and x is not None:
                x[nodes.numel():] = 0
            y = self._lookup(self.y, nodes[:seeds.numel()])
            if caps is not None:
                y = pad_rows(y, caps.nodes[0], IGNORE_LABEL)
            edges = [self._edge_rows(hop.eid) for hop in reversed(hops)]     # per block, input layer first
        with times.timing("transfer", stream=on_device):
            x, y, n_id, input_id = (self._to_device(t) for t in (x, y, read, seeds if input_id is None else input_id))
            edges = [tuple(self._to_device(t) for t in tables) for tables in edges]
            moved = ("rowptr", "local_src", "dst", "nodes", "out_degrees", "unread_dst")    # eid: read above
            hops = [hop._replace(**{name: self._to_device(getattr(hop, name)) for name in moved})
                    for hop in reversed(hops)]
        with times.timing("reindex", stream=on_device):       # the blocks' graphs, on the device
            if caps is not None:      # hops[i] is hop len - 1 - i: sources at level len - i
                last = len(hops)
                hops = [pad_block(hop, caps.nodes[last - i], caps.nodes[last - 1 - i], caps.edges[last - 1 - i])
                        for i, hop in enumerate(hops)]
                edges = [tuple(pad_rows(t, caps.edges[last - 1 - i]) for t in tables) for i, tables in enumerate(edges)]
            bounds = [k if k >= 0 else None for k in reversed(self.num_neighbors)]
            blocks = []
            for position, (hop, bound, tables) in enumerate(zip(hops, bounds, edges)):
                graph = block_graph(hop.rowptr, hop.local_src, hop.dst, hop.nodes.numel(), sampled=True,
                                    out_degrees=hop.out_degrees, position=position)
                if caps is not None:
                    mark_padded(graph)       # layers derive fixed-shape graphs from it (graph.fixed_shape)
                if deferred:       # the rows a combine-first layer reads: what only the sampler knows
                    known_transform_first_rows(graph, hop.unread_dst)
                    layouts = tuple(tensors_in(transform_first_rows(graph, 1)))   # tied to the consumer's stream
                else:
                    layouts = prepare_layouts(graph, bound, hop.unread_dst, hop.max_out_degree,
                                              whole_rows=caps is not None,
                                              source_side_read=self.source_side.recipe_callback(position))
                blocks.append(Block(graph, hop.nodes, layouts, *tables))
            view = None
            if hop_edges is not None and self.pyg_view.wanted:
                # a vertex's in-edges are one hop's sample; its out-edges, at most each block's most
                view = pyg_batch.view_ahead(blocks, hop_edges, None if None in bounds else max(bounds, default=0),
                                            sum(hop.max_out_degree for hop in hops),
                                            self.source_side.recipe_callback(pyg_batch.PYG_VIEW_POSITION),
                                            self.pyg_view.trimmed)
        return MiniBatch(blocks, x, y, n_id, input_id, padded=caps is not None, deferred=deferred, hop_edges=hop_edges,
                         pyg_view=view, pyg_demand=None if hop_edges is None else self.pyg_view)

    def sizes(self, seeds: torch.Tensor, generator: torch.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(rows per vertex level, edges per hop) of the batch ``seeds`` would give, sampled
        and reindexed only (`Capacities.covering` takes these)."""
        return batch_sizes(seeds.numel(), self._sample(seeds, generator, StageTimes()))

    def _sample(self, seeds: torch.Tensor, generator: torch.Generator, times: StageTimes) -> list[SampledBlock]:
        """The batch's hops, seeds outward, each sampled and reindexed where the CSR is."""
        on_sampler = device_stream(self.sample_device)
        nodes, hops = seeds.to(self.sample_device), []
        for index, fanout in enumerate(self.num_neighbors):
            fused = fused_hops(self.sample_device, fanout, self.replace, nodes.numel())
            with times.timing("sample", stream=on_sampler):
                slots = (sample_slots_fused(self.rowptr, self.col, nodes, fanout, hop_seed(generator, index))
                         if fused else sample_slots(self.rowptr, self.col, nodes, fanout, self.replace, generator))
            with times.timing("reindex", stream=on_sampler):      # hop i's first seeds are hop i - 1's
                reached_before = hops[-1].rowptr.numel() - 1 if hops else 0
                hops.append((reindex_slots_fused if fused else reindex_slots)(nodes, slots, self.num_nodes,
                                                                              reached_before=reached_before))
            nodes = hops[-1].nodes
        return hops

    def _edge_rows(self, eid: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """A hop's (``e_id``, ``edge_attr``, ``edge_weight``) for its sampled edges at CSR
        positions ``eid`` (`Block`); all None when the loader carries no edge table."""
        if self.edge_ids is None:
            return (None, None, None)
        e_id = rows_of(self.edge_ids, eid)
        return (e_id, self._lookup(self.edge_attr, e_id), self._lookup(self.edge_weight, e_id))

    def _lookup(self, table: torch.Tensor | None, nodes: torch.Tensor) -> torch.Tensor | None:
        """Rows ``nodes`` of a feature or label table: gathered where the table is, or,
        from a pinned host table with ``nodes`` on the GPU, read in place by a kernel
        (`zero_copy_rows`), falling back to a host gather where that cannot run."""
        if table is None:
            return None
        if self.zero_copy and (rows := zero_copy_rows(table, nodes)) is not None:
            return rows
        return self._gather(table, nodes.to(table.device))

    def _gather(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of a table on ``ids``'s device; into page-locked memory when they
        are headed for the device from the host."""
        if table.device.type == "cpu" and self.device.type == "cuda":
            out = torch.empty((ids.numel(),) + table.shape[1:], dtype=table.dtype, pin_memory=True)
            return torch.index_select(table, 0, ids, out=out)
        return rows_of(table, ids)

    def _to_device(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None or tensor.device == self.device:
            return tensor
        if tensor.device.type == "cpu" and self.device.type == "cuda" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)


def rows_of(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``table.index_select(0, ids)``; for a label table (one value per vertex, int64 ids)
    ``torch.take``, the same values. Why: on an H200's host, a loader thread's 1024-label
    ``index_select`` from a 2.45M-vertex table took 30-56 us in the median but 126-337 us
    on average (calls of several ms among them), ``torch.take`` at the same place 17-24
    and 20-26 (two invocations each, products-like batches). On two ranks the lookup
    stage, that gather and a padding, had grown from 0.1 to 0.6-0.9 ms a batch; with
    ``take`` it stays at 0.1, and two replayed H200s trained 493-496K seeds/s against
    352-409K in the same call (benchmarks/results/scaling_cuda.md).
    ``take`` would wrap a negative id where ``index_select`` refuses it; the loader's ids
    are vertex ids (and padding zeros), never negative."""
    if table.dim() == 1 and ids.dtype == torch.int64 and table.is_contiguous():
        return torch.take(table, ids)
    return table.index_select(0, ids)
