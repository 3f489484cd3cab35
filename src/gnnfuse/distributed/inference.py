"""Full-neighbourhood inference split across ranks, layer by layer, for held-out accuracy.

A mini-batch run measures accuracy by running every layer on the whole graph
(`training.minibatch`). Across ranks the same answer comes cheaper and without any rank
holding every activation: rank r computes each layer's output rows for its own
contiguous vertex range (`row_ranges`) from one block -- the range's in-edges, all of
them -- and reads the previous layer's rows of the range's in-neighbours from their
owners (`PartitionedFeatures.gather`). Counts of correct predictions and loss sums are
then summed over ranks, so every rank gets the same accuracies (and early stopping
stops all ranks at the same epoch, as DDP needs).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..graph import Graph
from ..loader import Block, block_graph, reindex, sample_hop
from ..nn.block_models import BlockGNN
from .features import PartitionedFeatures


def range_block(graph: Graph, start: int, end: int) -> Block:
    """The block of every in-edge of vertices ``start..end-1`` (destinations first)."""
    csr = graph.csr()
    nodes = torch.arange(start, end, device=graph.device)
    hop = sample_hop(csr.rowptr.long(), csr.col.long(), nodes, -1)
    frontier = reindex(nodes, hop.src)
    return Block(block_graph(hop.rowptr, frontier.local_src, hop.dst, frontier.nodes.numel()), frontier.nodes)


@torch.no_grad()
def layerwise_logits(model: BlockGNN, block: Block, read_input: Callable[[torch.Tensor], torch.Tensor],
                     bounds: list[int], rank: int) -> torch.Tensor:
    """The model's eval-mode output rows of this rank's range (``block`` from
    `range_block`); ``read_input(ids)`` returns input feature rows of global ids. A
    collective: every rank calls it with its own range's block."""
    h = read_input(block.src_nodes)
    last = len(model.convs) - 1
    for i, conv in enumerate(model.convs):
        out = conv((h, h[:block.num_dst]), block.graph)
        if i == last:
            return out
        out = model.activation(out)
        h = PartitionedFeatures(out, bounds, rank).gather(block.src_nodes)
    raise ValueError("the model has no layers")


def correct_predictions(rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many of ``rows``' argmaxes are their ``labels``, as a float64 scalar to be summed
    over ranks; NaN when a row holds a NaN, so the summed accuracy is NaN, as one
    process's (`training.loop.accuracy`): the argmax over a diverged model's NaN logits
    counted as predictions, and the ranks' epoch lines and curves showed accuracies for it."""
    correct = (rows.argmax(dim=1) == labels).sum().double()
    return torch.where(rows.isnan().any(), torch.full_like(correct, float("nan")), correct)


def summed_accuracies(logits: torch.Tensor, y: torch.Tensor, masks: tuple[torch.Tensor, ...],
                      loss_mask: torch.Tensor, stop: bool = False) -> tuple[list[float], float, bool]:
    """(accuracy per mask, mean cross-entropy over ``loss_mask``, whether any rank asked
    to ``stop``) over every rank's rows: each rank passes the logits, labels and masks of
    its own rows; NaN for an empty mask. The stop flag (`stopping`) rides in the same
    all-reduce, the last of a training epoch."""
    stats = []
    for mask in masks:
        stats += [correct_predictions(logits[mask], y[mask]), mask.sum()]
    stats += [F.cross_entropy(logits[loss_mask], y[loss_mask], reduction="sum"), loss_mask.sum()]
    totals = torch.stack([s.double() for s in stats] + [torch.tensor(float(stop), dtype=torch.float64,
                                                                     device=logits.device)])
    dist.all_reduce(totals)
    values = totals.tolist()
    ratio = [a / b if b else float("nan") for a, b in zip(values[:-1:2], values[1:-1:2])]
    return ratio[:-1], ratio[-1], values[-1] > 0
