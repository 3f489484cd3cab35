"""Each CSR row's other endpoints in ascending order, for sums over high-degree rows.

The graph's CSR keeps a row's edges in edge-id order: DGL-style positional mailbox reads
(`ir/ops/positional.py`), the loader's sampled blocks and the padded fixed-shape blocks
depend on it. A sum does not care about order, and on rows of many edges the order
decides how the gathers of neighbour rows meet the cache: listed in ascending order,
neighbouring lanes of one step read nearby rows, as cuSPARSE's coalesced matrix does.
On an H200 (Reddit2-sized graph, average degree 100, one lane, replayed from a CUDA
graph) a graph built from edges sorted by (destination, source) took 0.151 ms for the
neighbour sum against 0.165-0.166 in the presets' shuffled order and cuSPARSE's
0.166-0.167 (an exploration at 3850b20).

So the rows and scan kernels of a unit that reads no edge data -- its CSR index is all
it follows -- take a second copy of the CSR's column array, sorted within rows, where
rows are long on average. Rows stay where they are, so the row pointer, the segments
and the row of each position (`rows_in_csr_order`) serve both copies. It costs four
bytes an edge, built once per graph; short rows (arxiv-sized, degree 6.9) gain little
locality from it and keep the one copy.
"""
from __future__ import annotations

import torch

from ..reference import GraphContext

# Average row length from which the sorted copy is used (`sorts_sources`). On an H200,
# replayed, copy off against on in one process (39b343f): Reddit2-sized (degree 99.6)
# F = 1 0.164 -> 0.151 ms, F = 2 0.170 -> 0.162-0.165, F = 4 0.179 -> 0.172;
# products-sized (25.3) F = 1-4 1-2% faster, for 0.25 GB; arxiv-sized (6.9) within 1%.
SORTED_SOURCES_MIN_DEGREE = 32.0


def sorts_sources(ctx: GraphContext, by: str) -> bool:
    """Whether a sum by ``by`` (``dst`` or ``src``) on ``ctx``'s graph reads its
    neighbours through `sorted_sources`: rows long enough on average that their order
    moves the gathers' cache hits."""
    if by not in ("dst", "src"):
        return False
    rows = ctx.num_rows(by)
    return rows > 0 and ctx.num_edges / rows >= SORTED_SOURCES_MIN_DEGREE


# Edges sorted at once while the copy is built: the sort's int64 keys, values and indices
# take 24 bytes an edge, 0.4 GB at this size, however large the graph.
SORT_CHUNK_EDGES = 1 << 24


def sorted_sources(ctx: GraphContext, by: str) -> torch.Tensor:
    """The CSR-by-``by`` column array (each edge's other endpoint), sorted ascending
    within each row, in the column array's dtype; built once per graph, in chunks of
    whole rows of about `SORT_CHUNK_EDGES` edges (a row longer than that is a chunk of
    its own)."""
    def build(graph) -> torch.Tensor:
        rowptr, col = ctx.grouped(by)
        others = max(ctx.num_rows("src" if by == "dst" else "dst"), 1)
        out = torch.empty_like(col)
        rows = rowptr.numel() - 1
        bounds, starts = [0, rows], [0, ctx.num_edges]     # rows and their first edges (CSR: 0 and E)
        if ctx.num_edges > SORT_CHUNK_EDGES:    # chunks of whole rows: two host reads, once per graph
            targets = torch.arange(SORT_CHUNK_EDGES, ctx.num_edges, SORT_CHUNK_EDGES, device=rowptr.device)
            firsts = torch.searchsorted(rowptr.long(), targets, right=True) - 1
            bounds = sorted({0, rows, *firsts.tolist()})
            starts = rowptr[bounds].tolist()
        for first, last, begin, end in zip(bounds, bounds[1:], starts, starts[1:]):
            if begin == end:
                continue
            key = torch.repeat_interleave(torch.arange(last - first, device=col.device),
                                          rowptr[first:last + 1].diff().long(), output_size=end - begin)
            key = key * others + col[begin:end].long()    # row-major (col < others): rows stay in place
            out[begin:end] = torch.sort(key).values.remainder_(others)
        return out
    return ctx.graph.cached(f"sources_sorted_in_{by}_csr", build)
