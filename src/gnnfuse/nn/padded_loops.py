"""Self loops on a padded block in fixed shapes, so a captured step can rebuild them.

PyG's attention layers run on the graph with exactly one self loop per destination:
the loops a graph has are dropped, then one per destination is appended
(``remove_self_loops`` + ``add_self_loops``). How many edges that leaves depends on how
many loops the sampler drew, which only the device knows; built eagerly and cached on a
block's graph, the first batch's looped graph would be replayed for every later batch.

On a padded block (`graph.fixed_shape.is_padded`) `padded_looped` keeps the edge count
fixed instead: a drawn loop is *redirected* to run from the last (padded) source to the
last (padded) destination rather than dropped, and one loop per destination is appended.
A real destination's in-edges are then exactly the eager ones, in the same order (its
other edges as sampled, then its loop), so its values and gradients are the eager ones;
padded rows only ever feed padded rows, whatever edges they hold. The graph and the
layouts its kernels read are built with sorts and binary searches (no host sync), and
the layers build it on every call (once per step where the graph's owner marks its
steps, `graph.fixed_shape.per_step`) rather than caching it across steps, so inside a
CUDA graph it is rebuilt on every replay.
"""
from __future__ import annotations

import torch

from ..graph import Graph
from ..graph.fixed_shape import build_reverse_csr, mark_padded, prefill_grouping
from ..runtime.compiled import backend_name


def padded_looped(graph: Graph) -> Graph:
    """``graph`` (padded, bipartite or not) with one self loop per destination appended
    and its own loops redirected to its last source and destination (see module doc)."""
    num_dst, num_src = graph.num_dst_nodes, graph.num_src_nodes
    src, dst = graph.src.long(), graph.dst.long()
    loop = src == dst
    loops = torch.arange(min(num_dst, num_src), device=src.device)
    src = torch.cat([torch.where(loop, num_src - 1, src), loops])
    dst = torch.cat([torch.where(loop, num_dst - 1, dst), loops])
    looped = Graph._of_valid_ids(src, dst, num_dst, num_src if graph.is_bipartite else None)
    prefill_grouping(looped)
    backend = backend_name(src.is_cuda)
    if backend != "reference":     # the compiled backends' backward reads it
        build_reverse_csr(looped)
    if backend == "triton":
        from ..backend.triton.schedule import whole_row_segments
        whole_row_segments(looped)
    return mark_padded(looped)
