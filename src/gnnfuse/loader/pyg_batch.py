"""PyG's view of a loader batch: the sampled subgraph as PyG's ``NeighborLoader`` hands
it (``edge_index`` over ``n_id``, ``num_sampled_nodes``/``num_sampled_edges``, and
``e_id``/``edge_attr``/``edge_weight`` in its edge order), cut from the blocks on first
use, so PyG code runs unchanged on a gnnfuse batch and the block path pays nothing.

How the two layouts relate. PyG's sampler expands each vertex once: hop k samples the
in-edges of the vertices hop k - 1 added (of the seeds for hop 0), numbers the new
sources by first appearance after every vertex before them, and lists hop k's edges
after hop k - 1's, grouped by destination in the destinations' order. The blocks
number their vertices the same way (destinations first, then new sources by first
appearance), so one numbering, ``n_id``'s, holds for all of them; but hop k's block (a
layer's, DGL's layout) samples *every* vertex reached so far again. Its first
``earlier_edges`` edges (CSR order) go into vertices an earlier hop expanded, the rest
into those hop k expands first: PyG's hop k is that tail of the block's edges, and
slicing it needs only host counts the sampler read back with the hop's others (no sync).

With full neighbourhoods (``-1``) a re-sample is the earlier hop's own edges and adds no
vertex: ``n_id``, ``edge_index``, ``e_id`` and the counts are PyG's, edge for edge. With
a fanout, a vertex the re-sample alone reached is in ``n_id`` (and ``x``) too, with its
own sampled in-edges, but no edge of ``edge_index`` leads from it toward the seeds, so
no seed's output depends on it.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .block import Block


def refuse_padded(name: str) -> None:
    """Refuse PyG's view of a padded batch (``static_shapes``), naming the attribute."""
    raise ValueError(
        f"batch.{name}: this batch is padded to the loader's static shapes (NeighborLoader(static_shapes=...)): "
        f"its x and n_id end in padding rows that a PyG model run on the whole batch would take for vertices (a "
        f"batch norm's statistics would include them). PyG's view (edge_index, num_sampled_nodes, "
        f"num_sampled_edges, e_id, ...) comes with a loader without static_shapes; padded batches are for "
        f"block models (batch.blocks)")


def num_sampled_nodes(blocks: Sequence[Block]) -> list[int]:
    """PyG's ``num_sampled_nodes``: the seeds, then the vertices each hop added."""
    return [blocks[-1].num_dst] + [block.num_src - block.num_dst for block in reversed(blocks)]


def hop_tails(tables: Sequence[torch.Tensor], hop_edges: Sequence[int]) -> torch.Tensor:
    """Rows of PyG's hops from per-edge tables, one per hop seeds outward: each table's
    last ``hop_edges[k]`` rows (its block's edges into the vertices hop k expands first),
    hop 0's first."""
    return torch.cat([table[table.shape[0] - count:] for table, count in zip(tables, hop_edges)])


def subgraph_edge_index(blocks: Sequence[Block], hop_edges: Sequence[int]) -> torch.Tensor:
    """PyG's ``edge_index`` ``[2, E]`` (int64 ids into ``n_id``; row 0 the sampled
    neighbour, row 1 the vertex it was sampled for) from the blocks (input layer first)."""
    seeds_out = list(reversed(blocks))
    return torch.stack([hop_tails([block.graph.src for block in seeds_out], hop_edges),
                        hop_tails([block.graph.dst for block in seeds_out], hop_edges)]).long()


def subgraph_edge_rows(blocks: Sequence[Block], hop_edges: Sequence[int], name: str) -> torch.Tensor | None:
    """The blocks' per-edge table ``name`` (``e_id``, ``edge_attr``, ``edge_weight``) in
    ``edge_index``'s order; None where the blocks hold none."""
    tables = [getattr(block, name) for block in reversed(blocks)]
    return None if any(table is None for table in tables) else hop_tails(tables, hop_edges)
