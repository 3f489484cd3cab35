"""Models that run their layers over a mini-batch's blocks, or over a whole graph.

A sampled mini-batch gives one bipartite block per layer (`gnnfuse.loader`): layer i
reads the features of block i's sources and writes its destinations, which are the
first ``num_dst`` sources (``x_dst = x[:num_dst]``, PyG's and DGL's convention). The
same weights run on a whole graph for full-neighbourhood inference, which is how the
held-out accuracy of a mini-batch run is measured. Each layer's compiled program is
the one a full-graph call uses: programs hold no vertex or edge counts, and the trace
cache keys on feature shapes only, so batches of any size reuse one trace.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .conv import GATConv, SAGEConv
from .functional import dropout as sparse_dropout


class BlockGNN(nn.Module):
    """``dropout -> conv -> activation`` per layer, the last without activation, as the
    two-layer models of `gnnfuse.nn.models` but for any depth.

    ``forward(x, blocks)`` with a list of blocks (input layer first; ``x`` has a row per
    source of ``blocks[0]``) returns a row per destination of ``blocks[-1]``;
    ``forward(x, graph)`` with a graph (anything a layer takes) runs every layer on it.
    """

    def __init__(self, convs: Sequence[nn.Module], activation: Callable[[torch.Tensor], torch.Tensor],
                 dropout: float):
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.activation, self.dropout = activation, dropout

    def forward(self, x: torch.Tensor, graph: Any) -> torch.Tensor:
        blocks = graph if isinstance(graph, (list, tuple)) else None
        if blocks is not None and len(blocks) != len(self.convs):
            raise ValueError(f"the model has {len(self.convs)} layers but the batch has {len(blocks)} blocks; "
                             "sample one hop per layer (len(num_neighbors) == number of layers)")
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            x = sparse_dropout(x, self.dropout, self.training)
            if blocks is None:
                x = conv(x, graph)
            else:
                block = blocks[i]
                if x.shape[0] != block.num_src:
                    raise ValueError(f"layer {i} got {x.shape[0]} rows but its block has {block.num_src} sources")
                x = conv((x, x[:block.num_dst]), block.graph)
            if i < last:
                x = self.activation(x)
        return x


def _sage(in_channels: int, out_channels: int, hidden: int, p: float, layers: int) -> BlockGNN:
    widths = [in_channels] + [hidden] * (layers - 1) + [out_channels]
    return BlockGNN([SAGEConv(a, b, aggr="mean") for a, b in zip(widths, widths[1:])], F.relu, p)


def _gat(in_channels: int, out_channels: int, hidden: int, p: float, layers: int) -> BlockGNN:
    """8 heads of ``hidden`` channels per hidden layer, then one averaged output head
    (the GAT paper's network, `gnnfuse.nn.models`' ``gat``, at any depth)."""
    heads = 8
    convs = [GATConv(in_channels if i == 0 else heads * hidden, hidden, heads=heads, dropout=p)
             for i in range(layers - 1)]
    convs.append(GATConv(in_channels if layers == 1 else heads * hidden, out_channels, heads=1, concat=False,
                         dropout=p))
    return BlockGNN(convs, F.elu, p)


_BUILDERS: dict[str, Callable[[int, int, int, float, int], BlockGNN]] = {"sage": _sage, "gat": _gat}
BLOCK_MODELS = tuple(_BUILDERS)


def build_block_model(name: str, in_channels: int, out_channels: int, hidden: int, dropout: float,
                      num_layers: int) -> BlockGNN:
    """Model ``name`` (one of `BLOCK_MODELS`) with ``num_layers`` layers, for blocks."""
    if name not in _BUILDERS:
        raise ValueError(f"model {name!r} has no mini-batch version; mini-batch models: {', '.join(BLOCK_MODELS)}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    return _BUILDERS[name](in_channels, out_channels, hidden, dropout, num_layers)
