"""Batches of whole graphs padded to fixed shapes, so a CUDA graph can replay their step.

Graph-level tasks (molecules, TU data sets) train on batches that PyG's ``DataLoader``
collates from many small graphs: every step a new disjoint union, of other vertex and
edge counts. Such a step is bound by the host -- on an H200, 4 layers of GIN on 128
molecule-sized graphs took 6.88 ms eagerly and 0.98 ms replayed (`results/graph_batches.md`) -- and a CUDA graph
that would replay it needs the same shapes every time. `pad_graph_batch` pads a collated
``Batch`` to capacities fixed for a loader's lifetime (`GraphCapacities`), which
``DataLoader(..., static_shapes=True)`` probes on a few batches when it is made:

- **vertices** past the real ones, their node-level tensors zero (an integer node label
  ``y`` is `IGNORE_LABEL`), all of them in one padding graph, the last;
- **edges** past the real ones, each from a padded vertex to the next one (a ring, so no
  padded row outgrows the rest, and no loops where there are two padded vertices or
  more); their edge-level tensors zero;
- **graphs** past the real ones, up to ``graphs`` (the loader's ``batch_size`` plus the
  padding graph): empty but for the last, their graph-level label ``y`` `IGNORE_LABEL`
  (cross-entropy's ``ignore_index``), so the epoch's smaller last batch has the same shapes.

No real edge touches a padded vertex, so in a model that computes each vertex's row from
its own row and its in-edges (every `gnnfuse.nn` conv) and pools per graph, a real
graph's output is the unpadded batch's, the loss (which ignores the padding graphs'
labels) is the same, and so is every gradient. A model normalising over all rows (batch
norm, or `nn.ChebConv` without normalization, whose default lambda_max is the largest
degree of all rows) would see the padded ones; the captured step runs it eagerly, on the
batch `unpadded` (`training.captured_step`). What cannot be padded safely is refused by name:
a float label ``y`` (a regression loss would count the padding rows) and a bool or
unsigned one (which cannot hold `IGNORE_LABEL`) unless the loss is masked (below), index
tensors other than ``edge_index`` and
``batch``, an ``edge_index`` dtype too narrow for the padded vertices' ids (uint8),
``follow_batch``, and a batch of ``HeteroData`` graphs. Attributes that are
not tensors (a molecule's SMILES string) are left out: a replayed step could only ever
see the first batch's. A batch over the capacities comes unpadded, and its step runs
eagerly; so does a batch whose graph count is also its vertex or edge count (one-vertex
graphs), where a graph-level tensor cannot be told from a vertex- or edge-level one.

**Masked labels** (``label_mask=True``, for regression: ZINC, QM9): a float, bool or
unsigned ``y`` is padded with 0, and every batch, padded or not, carries ``y_mask``, y's
shape, 1 on the real rows and 0 on the padded ones (a signed integer ``y`` keeps
`IGNORE_LABEL` there too), which the loss multiplies in:
``(F.l1_loss(out, batch.y, reduction="none") * batch.y_mask).sum() / batch.y_mask.sum()``
is the plain batch's ``F.l1_loss(out, y)``, and it replays: selecting the real rows by
a boolean mask would read their count back to the host. The padding is 0, not NaN, so
that the masked-out terms' gradients are 0 rather than NaN * 0.
"""
from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..graph.validate import check_ids
from .static_shapes import IGNORE_LABEL, pad_rows

# Capacities above the largest batch probed: a batch of 128 molecules varies by some 4%
# in its vertex count (ogbg-molhiv: 25.5 +- 12 vertices a graph), and a batch over the
# capacities still trains, unpadded and eagerly; every padded row costs device time.
HEADROOM = 0.10
MARGIN = 64
ROUND = 128
PROBED_BATCHES = 16
_MARK = "_gnnfuse_capacities"      # the instance attribute a padded batch carries
_REAL = "_gnnfuse_real_counts"     # and its real counts (`unpadded`)
# A collated batch's tensors made with room for padding (`graph_collate`): key -> the
# whole buffer whose first rows the batch's tensor is, which padding then fills in place
ROOM = "_gnnfuse_padding_room"


@dataclass(frozen=True)
class GraphCapacities:
    """A padded batch's vertex, edge and graph counts. A batch fits when it has fewer
    vertices and graphs (each keeps a padded one) and no more edges."""
    nodes: int
    edges: int
    graphs: int

    def __post_init__(self) -> None:
        if self.nodes < 2 or self.edges < 0 or self.graphs < 2:
            raise ValueError(f"graph capacities need at least 2 vertices and 2 graphs (one of each padded) and no "
                             f"negative edge count; got nodes={self.nodes}, edges={self.edges}, graphs={self.graphs}")

    @classmethod
    def covering(cls, sizes: Sequence[tuple[int, int]], graphs: int, headroom: float = HEADROOM,
                 margin: int = MARGIN) -> "GraphCapacities":
        """Capacities above every (vertices, edges) count in ``sizes`` (probed batches),
        with ``headroom`` and ``margin`` to spare, for batches of up to ``graphs - 1`` graphs."""
        if not sizes:
            raise ValueError("graph capacities need at least one probed batch")

        def above(counts: list[int]) -> int:
            return -(-(math.ceil(max(counts) * (1 + headroom)) + margin) // ROUND) * ROUND
        return cls(above([n for n, _ in sizes]), above([e for _, e in sizes]), graphs)

    def fits(self, num_nodes: int, num_edges: int, num_graphs: int) -> bool:
        return num_nodes < self.nodes and num_edges <= self.edges and num_graphs < self.graphs


def probe_capacities(dataset: Sequence[Any], batch_size: int, batches: int = PROBED_BATCHES,
                     seed: int = 0) -> GraphCapacities:
    """`GraphCapacities` covering ``batches`` random batches of ``batch_size`` graphs of
    ``dataset`` (each graph's ``num_nodes`` and ``num_edges``, read once per graph drawn)."""
    count = len(dataset)
    if count == 0:
        raise ValueError("static_shapes needs a non-empty data set to probe its batch sizes")
    draw = random.Random(seed)
    take = min(batch_size, count)
    sizes = []
    for _ in range(batches):
        graphs = [dataset[i] for i in draw.sample(range(count), take)]
        sizes.append((sum(int(g.num_nodes) for g in graphs), sum(int(g.num_edges) for g in graphs)))
    return GraphCapacities.covering(sizes, batch_size + 1)


def padded_capacities(batch: Any) -> GraphCapacities | None:
    """The capacities ``batch`` was padded to, None for a batch that is not padded."""
    return getattr(batch, _MARK, None) if not isinstance(batch, (torch.Tensor, dict)) else None


def pad_graph_batch(batch: Any, capacities: GraphCapacities, label_mask: bool = False) -> Any:
    """``batch`` (a PyG ``Batch`` as its ``DataLoader`` collates it) padded in place to
    ``capacities`` as the module doc says, or returned as it is where it does not fit or
    its graph count is also its vertex or edge count (`_graph_rows_ambiguous`); with
    ``label_mask``, either way with ``y_mask`` (module doc)."""
    from torch_geometric.data import HeteroData     # PyG's batches only; gnnfuse.loader keeps PyG optional
    if isinstance(batch, HeteroData):
        raise ValueError("static_shapes pads batches of homogeneous graphs (Data): a HeteroData batch has a vertex "
                         "and edge count per type, which it does not pad. Use static_shapes=False")
    room = batch.__dict__.pop(ROOM, {})
    num_nodes, num_edges, num_graphs = int(batch.num_nodes), int(batch.num_edges), int(batch.num_graphs)
    if label_mask and "y_mask" in batch:
        raise ValueError("label_mask=True adds y_mask to each batch, but the graphs already have a 'y_mask'")
    if not capacities.fits(num_nodes, num_edges, num_graphs) or _graph_rows_ambiguous(batch, num_graphs):
        if label_mask and isinstance(batch.get("y"), torch.Tensor):
            batch.y_mask = _mask(batch.y, batch.y.shape[0])
        return batch
    # every key classified (PyG's is_node_attr reads the batch's counts) before any is padded
    padded = {key: _padded(batch, key, value, num_nodes, num_edges, num_graphs, capacities, room.get(key),
                           label_mask)
              for key, value in batch.items() if isinstance(value, torch.Tensor)}
    if label_mask and "y" in padded:
        y, rows = padded["y"]
        padded["y_mask"] = _mask(y, {"nodes": num_nodes, "edges": num_edges, "graphs": num_graphs}[rows]), rows
    store = batch._store.__dict__
    real = _Real(num_nodes, num_edges, num_graphs, {key: rows for key, (_, rows) in padded.items()},
                 batch._store._mapping.get("num_nodes"),
                 {k: store[k] for k in ("_slice_dict", "_inc_dict") if k in store})
    for key in list(batch.keys()):
        if key not in padded:
            del batch[key]
    for key, (value, _) in padded.items():
        batch[key] = value
    for private in real.private:     # describe the unpadded graphs: `to_data_list` would lie
        del store[private]
    batch._num_graphs = capacities.graphs
    batch.num_nodes = capacities.nodes
    object.__setattr__(batch, _MARK, capacities)
    object.__setattr__(batch, _REAL, real)
    return batch


@dataclass(frozen=True)
class _Real:
    """What `pad_graph_batch` changed: the real counts, each padded key's real rows (a
    count of the batch's, or ``"edge_index"``/``"ptr"``), the batch's own ``num_nodes``
    entry (None where it had none) and PyG's private slice tables."""
    nodes: int
    edges: int
    graphs: int
    rows: dict[str, str]
    num_nodes: Any
    private: dict[str, Any]


def unpadded(batch: Any) -> Any:
    """A padded batch as PyG's ``DataLoader`` collated it (views of its real rows, a new
    ``Batch``: the padded one is unchanged); any other batch as it is. What a step that
    cannot be captured runs on, so that it gives PyG's numbers whatever it computes
    (batch normalisation over all rows, ``batch.num_graphs`` in a loss)."""
    real = getattr(batch, _REAL, None) if padded_capacities(batch) is not None else None
    if real is None:
        return batch
    out = copy.copy(batch)
    for mark in (_MARK, _REAL):
        del out.__dict__[mark]
    counts = {"nodes": real.nodes, "edges": real.edges, "graphs": real.graphs}
    for key, rows in real.rows.items():
        value = out[key]
        out[key] = (value[:, :real.edges] if rows == "edge_index" else value[:real.graphs + 1] if rows == "ptr"
                    else value[:counts[rows]])
    if real.num_nodes is None:
        del out["num_nodes"]
    else:
        out.num_nodes = real.num_nodes
    out._store.__dict__.update(real.private)
    out._num_graphs = real.graphs
    return out


def _mask(y: torch.Tensor, real: int) -> torch.Tensor:
    """``y_mask`` for a label ``y`` whose first ``real`` rows are real: y's shape, 1 there
    and 0 below, in y's dtype for a floating ``y`` (else the default float dtype), so the
    masked loss keeps its dtype."""
    mask = torch.zeros(y.shape, dtype=y.dtype if y.dtype.is_floating_point else torch.get_default_dtype(),
                       device=y.device)
    mask[:real] = 1
    return mask


def _graph_rows_ambiguous(batch: Any, num_graphs: int) -> bool:
    """Whether a tensor of the batch has a row per graph where that is also a row per
    vertex or per edge (a batch of one-vertex graphs): PyG classifies such rows as the
    vertices' or edges', which would pad a graph label to the vertex capacity. What they
    are is the data set's to know, not the batch's, so such a batch stays PyG's."""
    if num_graphs not in (int(batch.num_nodes), int(batch.num_edges)):
        return False
    return any(isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == num_graphs
               for key, value in batch.items() if key not in ("edge_index", "batch", "ptr"))


def _grown(value: torch.Tensor, rows: int, fill: int, room: torch.Tensor | None) -> torch.Tensor:
    """``value`` with rows of ``fill`` appended up to ``rows``: in place, in ``room``, where
    ``value`` is its first rows and ``room`` has ``rows`` (`graph_collate` collated into
    it, guessing the attribute's kind from its row count, as `_padded` classifies it);
    else a copy (`pad_rows`)."""
    if (room is not None and room.shape[0] == rows and room.shape[1:] == value.shape[1:]
            and room.dtype == value.dtype and room.data_ptr() == value.data_ptr()):
        room[value.shape[0]:] = fill
        return room
    return pad_rows(value, rows, fill)


def _padded(batch: Any, key: str, value: torch.Tensor, num_nodes: int, num_edges: int, num_graphs: int,
            caps: GraphCapacities, room: torch.Tensor | None = None,
            label_mask: bool = False) -> tuple[torch.Tensor, str]:
    spare_nodes, extra = caps.nodes - num_nodes, caps.edges - num_edges
    device = value.device
    if key == "edge_index":
        # an id past the real vertices would join a real row to the padding: what a
        # Graph refuses on the unpadded batch is refused here too
        for row, name in ((0, "sources"), (1, "targets")):
            check_ids(f"the batch's edge_index {name}", value[row], num_nodes, "num_nodes")
        _check_id_range(value.dtype, caps.nodes - 1)
        k = torch.arange(extra, device=device)          # a ring over the padded vertices: no loops where 2+
        padding = torch.stack([num_nodes + k % spare_nodes, num_nodes + (k + 1) % spare_nodes])
        return torch.cat([value, padding.to(value.dtype)], 1), "edge_index"
    if key == "batch":
        return _grown(value, caps.nodes, caps.graphs - 1, room), "nodes"
    if key == "ptr":
        return torch.cat([value, value.new_full((caps.graphs - num_graphs - 1,), num_nodes),
                          value.new_full((1,), caps.nodes)]), "ptr"
    if _is_index(batch, key, value):
        raise ValueError(f"static_shapes cannot pad the batch's {key!r}: it holds vertex or graph ids (PyG "
                         f"increments it per graph), and only edge_index and batch are padded")
    label = key == "y"
    unignorable = label and (value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool
                             or not value.dtype.is_signed)
    if unignorable and not label_mask:
        masked = ("; or pass label_mask=True and multiply the loss by batch.y_mask (0 on the padded rows): "
                  "(F.mse_loss(out, batch.y, reduction='none') * batch.y_mask).sum() / batch.y_mask.sum()")
        if value.dtype.is_floating_point or value.dtype.is_complex:
            raise ValueError(f"static_shapes cannot pad a {value.dtype} label y: the padded rows would enter a "
                             f"regression loss. Use a plain DataLoader (static_shapes=False){masked}")
        raise ValueError(f"static_shapes cannot pad a {value.dtype} label y: its padded rows would hold "
                         f"{IGNORE_LABEL} (IGNORE_LABEL, which the loss must ignore) as "
                         f"{torch.tensor(IGNORE_LABEL).to(value.dtype).item()}. Use int64 labels, or a plain "
                         f"DataLoader (static_shapes=False){masked}")
    fill = 0 if unignorable or not label else IGNORE_LABEL
    if batch.is_node_attr(key) and value.shape[:1] == (num_nodes,):
        return _grown(value, caps.nodes, fill, room), "nodes"
    if batch.is_edge_attr(key) and value.shape[:1] == (num_edges,):
        return _grown(value, caps.edges, fill, room), "edges"
    if value.dim() and value.shape[0] == num_graphs:
        return _grown(value, caps.graphs, fill, room), "graphs"
    raise ValueError(f"static_shapes cannot tell whether the batch's {key!r} (shape {list(value.shape)}) is per "
                     f"vertex, edge or graph ({num_nodes} vertices, {num_edges} edges, {num_graphs} graphs)")


def _check_id_range(dtype: torch.dtype, largest: int) -> None:
    """Refuse an ``edge_index`` dtype that cannot hold the padded vertices' ids (up to
    ``largest``): cast into it, a uint8 batch of 200 vertices padded to 384 wrapped ids
    256..383 round to 0..127, and padded edges joined real vertices, changing the loss
    without a word. The real ids fit (PyG collated them); the capacities may not. (A
    float or bool ``edge_index`` is no id table, and is left to the layers' own checks.)"""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return
    top = torch.iinfo(dtype).max
    if largest > top:
        raise ValueError(f"static_shapes cannot pad the batch's {dtype} edge_index: its padded vertices' ids reach "
                         f"{largest} (the capacities' {largest + 1} vertices), past {dtype}'s largest {top}, and "
                         f"would wrap round onto real vertices. Store edge_index as int64 (or int32)")


def _is_index(batch: Any, key: str, value: torch.Tensor) -> bool:
    """Whether PyG increments ``key`` per graph when it collates (ids of vertices, as
    ``face``, or of graphs, as ``follow_batch``'s ``x_batch``), by the batch's own
    ``__inc__`` (a ``Data`` subclass's rule included)."""
    increment = batch.__inc__(key, value)
    return bool(increment.any()) if isinstance(increment, torch.Tensor) else bool(increment)
