"""The in-edges of chosen destination rows as a graph of their own.

A node classifier's loss reads the output rows of its training vertices only, yet a
full-graph model computes its last layer for every vertex: on an ogbn-mag-sized R-GCN
that is a [1.94M, 349] output and its gradient, 2.7 GB each, for a loss over 442K rows.
The last layer needs, per chosen row, its in-edges and every source's input row, which
is this module's bipartite graph: sources keep their ids (all ``num_src_nodes`` of
them), destination ``i`` is ``rows[i]``. A bipartite layer on it (``conv((h, h[rows]),
block)``, PyG's bipartite convention) gives ``conv(h, graph)[rows]`` -- the same rows,
so the same loss and gradients -- without the rows no loss term reads
(`benchmarks/results/hetero.md`, ``gnnfuse-train-rows``: the mag-sized R-GCN step took
12.5 ms and 2.7 GB of its own against 26.4 ms and 3.9 GB for all rows). DGL's
``to_block`` does the same for a sampled layer; here the sources are not renumbered, so
the previous layer's full output is read as it is.
"""
from __future__ import annotations

import torch

from .graph import Graph, row_pointers
from .validate import check_ids


def in_edges_block(graph: Graph, rows: torch.Tensor, *, return_edge_ids: bool = False
                   ) -> Graph | tuple[Graph, torch.Tensor]:
    """The edges ending at ``rows`` (destination ids, or a boolean mask over the
    destinations) as a bipartite `Graph` from all of ``graph``'s sources to
    ``len(rows)`` destinations, destination ``i`` standing for ``rows[i]``; a row listed
    twice gets its in-edges twice. Edge types come along; the edges are grouped by
    destination, each row's in their original order. With ``return_edge_ids`` also the
    original id of each edge, to select edge features with. Built once per set of rows:
    it reads the edge count back from the device, and caches nothing on ``graph``.

    A layer on the block equals the whole graph's layer at ``rows`` where its own-vertex
    term reads the destination features it is given (RGCNConv's root, SAGEConv's
    ``lin_r``) and it normalizes by destination degrees only (mean, softmax over in-edges).
    Self loops cannot be added to a block (PyG's bipartite loops join source ``i`` to
    destination ``i``, here vertex ``rows[i]``): add them to the graph before the block is
    made and pass ``add_self_loops=False``, as the error says."""
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"rows must be a tensor of destination ids or a boolean mask, got {type(rows).__name__}")
    graph.check_unchanged()     # its edges are read below, its destination order (`_dst_grouped`) trusted
    rows = rows.to(graph.device)
    if rows.dtype == torch.bool:
        if rows.shape != (graph.num_nodes,):
            raise ValueError(f"a boolean rows mask needs one entry per destination ({graph.num_nodes}), got shape "
                             f"{tuple(rows.shape)}")
        rows = rows.nonzero().squeeze(1)
    if rows.dim() != 1 or rows.dtype.is_floating_point or rows.dtype.is_complex:
        raise ValueError(f"rows must be a 1-D tensor of integer destination ids or a boolean mask, got "
                         f"{tuple(rows.shape)} {rows.dtype}")
    rows = rows.long()
    check_ids("rows", rows, graph.num_nodes, "num_nodes")
    # the destination grouping made here and let go: `Graph.csr` would keep its edge ids
    # on ``graph`` for good (84 MB on a mag-sized graph) for a block built once
    src, dst = graph._endpoints(keep=False)
    eid = graph._grouping_order("dst").long()       # no sort where the edges come grouped
    rowptr = row_pointers(dst, graph.num_nodes)
    start = rowptr[rows]
    counts = rowptr[rows + 1] - start
    total = int(counts.sum())
    position = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), counts, output_size=total)
    first = torch.cumsum(counts, 0) - counts             # each chosen row's first slot in the block
    slot = torch.arange(total, device=rows.device) - first[position] + start[position]
    edges = eid[slot]
    edge_type = graph.edge_type
    block = Graph(src[edges], position, rows.numel(), num_src_nodes=graph.num_src_nodes,
                  edge_type=None if edge_type is None else edge_type[edges], num_edge_types=graph.num_edge_types)
    block._dst_rows = rows     # `Graph.add_self_loops` refuses it: loops i -> i would join the wrong vertices
    return (block, edges) if return_edge_ids else block


def refuse_square_reading(layer: str, block: Graph, named: dict) -> None:
    """Refuse node tables ``named`` (argument name -> value) that PyG's code would read
    on ``block``, an `in_edges_block` or its reverse, as on any ``edge_index``: the chosen
    side numbers its vertices 0..k-1, so a single table (a row per vertex) is read at row i
    for chosen vertex ``rows[i]`` (a ``MessagePassing``'s ``x_i`` was 8.8 off the full
    layer's rows, silently). Pairs (``(x, x[rows])``; ``(x[rows], x)`` on the reverse),
    tables of the chosen vertices alone and edge-level values (``edge_*``, a row per edge)
    are read correctly and pass."""
    rows, every = _chosen(block)       # a table of every vertex has the other side's row count
    for key, value in named.items():
        if (isinstance(value, torch.Tensor) and not key.startswith("edge") and value.dim() > 0
                and value.shape[0] == every and not _rows_in_order(block)):
            pair = f"({key}, {key}[rows])" if block._dst_rows is not None else f"({key}[rows], {key})"
            raise ValueError(f"{layer}: {key} has {value.shape[0]} rows, a single table on a graph from "
                             f"in_edges_block ({block.num_src_nodes} sources, {block.num_dst_nodes} "
                             f"destinations), whose chosen vertices are numbered 0..{len(rows) - 1}: PyG's code "
                             f"would read chosen vertex rows[i]'s row as {key}[i]. Pass the pair {pair}")


def _chosen(block: Graph) -> tuple[torch.Tensor, int]:
    """The block's chosen rows (destinations; sources on its reverse) and the vertex
    count of the other side, which holds every vertex."""
    if block._dst_rows is not None:
        return block._dst_rows, block.num_src_nodes
    return block._src_rows, block.num_dst_nodes


def _rows_in_order(block: Graph) -> bool:
    """Whether the chosen vertex i is vertex i for every i -- ``rows`` all the vertices in
    order, the one block a single table serves. A permutation of every vertex has as many
    chosen vertices as the other side, and its single table was read at row i for vertex
    rows[i], silently; compared once per block (one read-back, where the counts match)."""
    rows, every = _chosen(block)
    if rows.numel() != every:
        return False
    return block.cached("chosen_rows_in_order", lambda g: bool(torch.equal(
        rows, torch.arange(rows.numel(), device=rows.device))))
