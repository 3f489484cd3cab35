"""A loader batch moved to another device: PyG's ``batch = batch.to(device)``.

Batches arrive on the loader's ``device``, so in the common loop the call finds
everything there already and returns the batch itself (`on_device`: a device
comparison per tensor, no copy, no host sync). Otherwise every tensor goes: the ids,
``x``, ``y``, and each block's graph, source ids and edge tables. A block's graph is a new
`Graph` on the target (`Graph.to`), with what `block.block_graph` gave it carried over --
the CSR, both degree vectors, its loader marks (`graph.fixed_shape`) -- so that the
layers find them there without a sort or a ``bincount``'s sync; every other layout the
loader or a layer had cached (Triton segments, reverse CSR, the rows a combine-first
layer reads, a self-looped graph) describes tensors on the old device and is left
behind, to be rebuilt on the target the first time a layer asks. A padded batch (fixed
shapes, `loader.static_shapes`) has all of its layouts rebuilt now, one segment per row
as the loader builds them, so a captured step finds the shapes it replays. A deferred
batch is refused: its feature rows and layouts are made in the step from the loader's
table, on the loader's device.

PyG's ``Data.to`` moves the data in place and returns it, so PyG code may call it
without assigning the result; `move_batch` does the same (the PyG attributes a batch had
built, ``edge_index`` and the `loader.data_attributes`, are dropped and rebuilt from the
moved blocks when read).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..graph import CSR, Graph
from ..graph.fixed_shape import is_loader_block, is_padded, loader_position, mark_loader_block, mark_padded, prefill
from .block import Block
from .layouts import prepare_layouts

if TYPE_CHECKING:
    from .batch_maker import MiniBatch

BATCH_TENSORS = ("x", "y", "n_id", "input_id")     # a `MiniBatch`'s own tensor fields (blocks aside)


def target_device(device: torch.device | str | int) -> torch.device:
    """``device`` as tensors report it: ``cuda`` indexed (``cuda:0``, the current one),
    ``cpu`` without an index; an int is a CUDA device, as in PyG and torch."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu":
        return torch.device("cpu")
    return device


def on_device(batch: MiniBatch, device: torch.device) -> bool:
    """Whether every tensor of ``batch`` is on ``device`` already (no tensor is read)."""
    own = [getattr(batch, name) for name in BATCH_TENSORS]
    blocks = [t for block in batch.blocks for t in (block.src_nodes, block.e_id, block.edge_attr, block.edge_weight)]
    return (all(block.graph.device == device for block in batch.blocks)
            and all(t.device == device for t in own + blocks if t is not None))


def move_batch(batch: MiniBatch, device: torch.device | str | int, non_blocking: bool = False,
               copy: bool = False) -> MiniBatch:
    """``batch`` moved to ``device`` in place (see the module doc), and returned; with
    ``copy`` its tensors are copied even where they are on ``device`` already."""
    device = target_device(device)
    if batch.deferred:
        raise ValueError(f"batch.to({device}): this batch is deferred (NeighborLoader(deferred=True)): its feature "
                         f"rows and kernel layouts are built in the training step from the loader's feature table on "
                         f"{batch.n_id.device}, so it stays there; make the loader's batches on {device} instead "
                         f"(NeighborLoader(..., device=...))")

    def moved(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device, non_blocking=non_blocking, copy=copy)
    blocks = []
    for block in batch.blocks:
        graph, layouts = _moved_graph(block.graph, device, non_blocking, copy, batch.padded)
        blocks.append(Block(graph, moved(block.src_nodes), layouts, moved(block.e_id), moved(block.edge_attr),
                            moved(block.edge_weight)))
    fields = {name: moved(getattr(batch, name)) for name in BATCH_TENSORS}
    built = [name for name in vars(batch) if name not in batch.__dataclass_fields__]     # cached PyG attributes
    for name in built:
        del batch.__dict__[name]
    # the PyG view built ahead is the old device's: ``edge_index`` is cut again from the moved blocks
    for name, value in (*fields.items(), ("blocks", blocks), ("pyg_view", None)):
        object.__setattr__(batch, name, value)          # frozen for the loader's code; moved as PyG's Data.to
    return batch


def _moved_graph(graph: Graph, device: torch.device, non_blocking: bool, copy: bool, padded: bool
                 ) -> tuple[Graph, tuple[torch.Tensor, ...]]:
    """A block's graph on ``device``, with its CSR, degrees and marks carried (module
    doc), and the layouts built ahead for it there (a padded block's; none otherwise)."""
    def moved(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, non_blocking=non_blocking, copy=copy)
    out = graph.to(device, non_blocking=non_blocking, copy=copy)
    prefill(out, csr=CSR(*(moved(t) for t in graph.csr())), in_degrees=moved(graph.in_degrees()),
            out_degrees=moved(graph.out_degrees()))
    if is_loader_block(graph):
        mark_loader_block(out, loader_position(graph))
    if is_padded(graph):
        mark_padded(out)
    return out, prepare_layouts(out, whole_rows=True) if padded else ()
