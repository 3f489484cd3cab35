"""`LinkMiniBatch`: what `LinkNeighborLoader` yields, a node batch of the label edges'
endpoints plus PyG's link attributes.

The sampled part is a `MiniBatch` whose seeds are the endpoints (``nodes``); the link
part says which pairs of those seeds to score. The batch forwards the node batch's
attributes by name rather than subclassing it: an operation on the node batch that
rebuilds it (a copy to another device, say) would hand back a plain `MiniBatch` without
the label edges, and a forwarded list makes each shared attribute a decision.

The `Data`'s other attributes (``batch.train_mask``: `loader.data_attributes`) are the
node batch's, forwarded; ``batch.to(device)`` moves the node batch (`loader.batch_move`)
and the label edges in place, as PyG's ``Data.to`` does.

Two attributes of the node batch change meaning here, so they are not forwarded as
they are: ``input_id`` is PyG's link ``input_id`` (each label edge's position in the
loader's ``edge_label_index``), and ``batch_size`` is refused (PyG's link batch has none;
the seeds are not a count of label edges).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from .batch_maker import MiniBatch, read_only_batch
from .data_methods import PygDataMethods
from .block import Block


@read_only_batch
@dataclass(frozen=True)
class LinkMiniBatch(PygDataMethods):
    """One link batch (`LinkNeighborLoader`).

    ``nodes`` is the sampled node batch of the seeds, which are the distinct endpoints of
    the batch's label edges and negatives, in increasing vertex id (PyG's ``unique``):
    ``n_id[:num_sampled_nodes[0]]``. ``input_id`` holds each positive label edge's
    position in the loader's ``edge_label_index``. Binary mode (or no negatives) fills
    ``edge_label_index`` (``[2, P + N]``, ids into ``n_id``: the positives in
    ``input_id``'s order, then the negatives) and ``edge_label`` (None without negatives
    and without given labels, as PyG's); triplet mode fills ``src_index``,
    ``dst_pos_index`` and ``dst_neg_index`` (ids into ``n_id``) instead. What a mode
    does not fill is None.

    ``y`` is the seeds' rows of the label table (the node batch's meaning: its seeds are
    here the endpoints), so ``y[edge_label_index]`` is PyG's; PyG's ``y`` holds every
    sampled vertex's row, and a loss over the whole batch against ``y`` fails on the row
    counts rather than reading other vertices' labels.
    """
    nodes: MiniBatch
    input_id: torch.Tensor
    edge_label_index: torch.Tensor | None = None
    edge_label: torch.Tensor | None = None
    src_index: torch.Tensor | None = None
    dst_pos_index: torch.Tensor | None = None
    dst_neg_index: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        raise AttributeError(
            "a link batch has no batch_size (nor has PyG's): its seeds are the label edges' endpoints, "
            "batch.n_id[:batch.num_sampled_nodes[0]] (each once), and its label edges number "
            "batch.input_id.numel(); score the pairs of batch.edge_label_index")

    @property
    def blocks(self) -> list[Block]:
        return self.nodes.blocks

    @property
    def x(self) -> torch.Tensor | None:
        return self.nodes.x

    @property
    def y(self) -> torch.Tensor | None:
        return self.nodes.y

    @property
    def n_id(self) -> torch.Tensor:
        return self.nodes.n_id

    @property
    def num_nodes(self) -> int:
        return self.nodes.num_nodes

    @property
    def num_sampled_nodes(self) -> list[int]:
        return self.nodes.num_sampled_nodes

    @property
    def num_sampled_edges(self) -> list[int]:
        return self.nodes.num_sampled_edges

    @property
    def edge_index(self) -> torch.Tensor:
        return self.nodes.edge_index

    @property
    def e_id(self) -> torch.Tensor:
        return self.nodes.e_id

    @property
    def edge_attr(self) -> torch.Tensor | None:
        return self.nodes.edge_attr

    @property
    def edge_weight(self) -> torch.Tensor | None:
        return self.nodes.edge_weight

    def __getattr__(self, name: str) -> Any:
        """The `Data`'s other attributes, the node batch's (`MiniBatch.__getattr__`);
        any other name is missing."""
        if name.startswith("__") or name == "nodes":       # copy/pickle probes, and before ``nodes`` is set
            raise AttributeError(name)
        if hasattr(type(self), name):
            # a property that raised AttributeError (``batch_size``), which Python then
            # looks up here: raise its own error, not a bare "no attribute"
            return object.__getattribute__(self, name)
        attributes = self.nodes.__dict__.get("attributes")
        if attributes is None or name not in attributes:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.nodes, name)

    def to(self, device: torch.device | str | int, *attrs: str, non_blocking: bool = False) -> LinkMiniBatch:
        """PyG's ``Data.to``: the node batch moved (`MiniBatch.to`) and the label edges
        with it, in place; the batch is returned."""
        self.nodes.to(device, *attrs, non_blocking=non_blocking)
        device = self.nodes.n_id.device
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, torch.Tensor) and value.device != device:
                object.__setattr__(self, field.name, value.to(device, non_blocking=non_blocking))
        return self

    def cpu(self) -> LinkMiniBatch:
        """PyG's ``Data.cpu``: `to` the host."""
        return self.to("cpu")

    def cuda(self, device: torch.device | str | int | None = None, non_blocking: bool = False) -> LinkMiniBatch:
        """PyG's ``Data.cuda``: `to` a CUDA device (the current one by default)."""
        return self.to("cuda" if device is None else device, non_blocking=non_blocking)

    def _data_keys(self) -> list[str]:
        """The node batch's names (`MiniBatch._data_keys`) but ``batch_size``, and the
        link attributes this batch's mode filled. A ``Data``'s own attribute under a link
        attribute's name (``edge_label``, ``edge_label_index``: a link split's ``Data`` holds
        both) is not listed from the node batch: the link field is what the batch gives
        under that name, as PyG's loader sets it over the ``Data``'s (removing it when None),
        so listing both named it twice, and listed it where the field is None."""
        link = [field.name for field in fields(self) if field.name != "nodes"]
        filled = [name for name in link if getattr(self, name) is not None]
        return [name for name in self.nodes._data_keys() if name not in ("batch_size", *link)] + filled

    def tensors(self) -> list[torch.Tensor]:
        link = (self.input_id, self.edge_label_index, self.edge_label, self.src_index, self.dst_pos_index,
                self.dst_neg_index)
        return self.nodes.tensors() + [t for t in link if t is not None]
