"""FeatGraph's 1D graph partitioning for the CPU aggregate kernels (§III-C, Figure 6).

An aggregation gathers neighbour rows in CSR order, which is random order: once the
neighbours' N x F feature matrix outgrows the cache, nearly every gathered row misses.
Cutting the neighbour (source) vertices into ranges whose rows fit in L2 and walking the
graph once per range makes each pass's gathers hit: every row of the range is loaded
once and then reused by all the edges that read it. The price is a partial result per
range, accumulated into the output (FeatGraph's merge cost), and a CSR walk per range.

`source_partitions` builds, once per graph, grouping index and range size, a CSR per
range holding only the rows that have edges into it (a doubly compressed layout: a
range of a power-law graph touches few rows, and a full row pointer per range would
cost ranges x N entries).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..reference import GraphContext


@dataclass(frozen=True)
class Partitions:
    part_ptr: np.ndarray   # [P + 1]: range p's rows are rows[part_ptr[p]:part_ptr[p + 1]]
    rows: np.ndarray       # the grouping row of each (range, row) pair
    ptr: np.ndarray        # [len(rows) + 1]: that pair's edges are col/eid[ptr[i]:ptr[i + 1]]
    col: np.ndarray        # the neighbour of each edge, ranges in order, CSR order within
    eid: np.ndarray        # its edge id


def source_partitions(ctx: GraphContext, by: str, range_rows: int) -> Partitions:
    """The CSR grouped by ``by`` cut into neighbour ranges of ``range_rows`` vertices;
    cached on the graph."""
    return ctx.graph.cached(f"cpu_partitions_{by}_{range_rows}", lambda _: _build(*ctx.csr(by), range_rows))


def _build(rowptr: torch.Tensor, col: torch.Tensor, eid: torch.Tensor, range_rows: int) -> Partitions:
    rowptr = rowptr.to(torch.int64)
    num_rows = rowptr.numel() - 1
    row = torch.repeat_interleave(torch.arange(num_rows), rowptr[1:] - rowptr[:-1])
    part = col.to(torch.int64) // range_rows
    # Stable: a (range, row) pair keeps its edges in CSR order, as the unpartitioned walk.
    order = torch.sort(part * num_rows + row, stable=True).indices
    pair, counts = torch.unique_consecutive((part * num_rows + row)[order], return_counts=True)
    num_parts = int(part.max()) + 1 if part.numel() else 0
    part_ptr = torch.searchsorted(pair // num_rows, torch.arange(num_parts + 1)) if num_rows else \
        torch.zeros(1, dtype=torch.int64)
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    return Partitions(part_ptr.numpy(), (pair % max(num_rows, 1)).numpy(), ptr.numpy(),
                      col[order].numpy(), eid[order].numpy())
