"""`LinkBatchMaker`: what turns a batch of label edges into a `LinkMiniBatch`.

It is to `LinkNeighborLoader` what `BatchMaker` is to `NeighborLoader`, and runs in the
same machinery: called when a batch is asked for, in a prefetch thread
(`loader.prefetch`), or pickled into worker processes (`loader.workers`: the label
edges, their labels and the negative-sampling weights cross as shared memory with the
node maker's tables), whose batches come back through `loader.packing`, the link
tensors packed with the node batch's. It holds only tensors and settings, so it pickles.

Randomness: a batch draws its negatives, then samples its endpoints' neighbourhoods,
from the one generator it is given (`batch_generator`: the epoch's seed and the batch's
index), so a batch is the same whichever thread or process prepares it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .batch_maker import BatchMaker
from .link_batch import LinkMiniBatch
from .stages import StageTimes, device_stream

if TYPE_CHECKING:
    from .link_loader import NegativeSampling


@dataclass
class LinkBatchMaker:
    """The endpoints' node maker (``nodes``), the label edges (``edge_label_index``,
    ``[2, E]``, and ``edge_label``, a row per edge or None, both on the node maker's
    ``sample_device``) and the negative sampling (None for none)."""
    nodes: BatchMaker
    edge_label_index: torch.Tensor
    edge_label: torch.Tensor | None
    neg_sampling: NegativeSampling | None

    # what `loader.workers` reads of a maker, the node maker's
    @property
    def device(self) -> torch.device:
        return self.nodes.device

    @property
    def sample_device(self) -> torch.device:
        return self.nodes.sample_device

    def pin_shared_tables(self) -> None:
        """In a worker process: the node maker's (`BatchMaker.pin_shared_tables`)."""
        self.nodes.pin_shared_tables()

    def learnt(self) -> tuple[bool, bool, frozenset[int]]:
        """The node maker's (`BatchMaker.learnt`): what worker processes are told of the
        training steps (without it, their blocks never came with GAT's self loops)."""
        return self.nodes.learnt()

    def learn(self, learnt: tuple[bool, bool, frozenset[int]]) -> None:
        """In a worker process: the node maker's (`BatchMaker.learn`)."""
        self.nodes.learn(learnt)

    def prepare(self, input_id: torch.Tensor, generator: torch.Generator, times: StageTimes) -> LinkMiniBatch:
        """The batch of the label edges at positions ``input_id``: negatives drawn (timed
        as ``sample``), then the endpoints' neighbourhoods sampled, from ``generator``."""
        input_id = input_id.to(self.sample_device)
        src, dst = self.edge_label_index[:, input_id]
        positives, negatives, num_nodes = input_id.numel(), self.neg_sampling, self.nodes.num_nodes
        label = None if self.edge_label is None else self.edge_label[input_id]
        with times.timing("sample", stream=device_stream(self.sample_device)):
            if negatives is not None and negatives.mode == "triplet":
                dst = torch.cat([dst, negatives.draw(negatives.count(positives), "dst", num_nodes, generator)])
            elif negatives is not None:
                count = negatives.count(positives)
                src = torch.cat([src, negatives.draw(count, "src", num_nodes, generator)])
                dst = torch.cat([dst, negatives.draw(count, "dst", num_nodes, generator)])
                label = torch.ones(positives, device=src.device) if label is None else label
                label = torch.cat([label, label.new_zeros((count,) + label.shape[1:])])
        seeds, local = torch.unique(torch.cat([src, dst]), return_inverse=True)
        nodes = self.nodes.prepare(seeds, generator, times)
        on = self.device
        if negatives is not None and negatives.mode == "triplet":
            return LinkMiniBatch(nodes, input_id.to(on), src_index=local[:positives].to(on),
                                 dst_pos_index=local[positives:2 * positives].to(on),
                                 dst_neg_index=local[2 * positives:].view(positives, -1).squeeze(-1).to(on))
        return LinkMiniBatch(nodes, input_id.to(on), local.view(2, -1).to(on),
                             None if label is None else label.to(on))
