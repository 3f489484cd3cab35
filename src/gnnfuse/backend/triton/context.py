"""The graph context of Triton-backend runs: the ops that run as torch code call back into
it (ir/registry.py's ``ExecContext``) for per-type matmuls, the typed aggregation's row
scatters, row gathers, per-row dot and matrix products and sums of many rows into a few, which here
are kernels (segment_matmul.py, scatter_rows.py, gather_rows.py, row_dot.py,
few_rows_sum.py, row_matmul.py) instead of the reference backend's torch forms."""
from __future__ import annotations

from ..reference import GraphContext
from .few_rows_sum import few_rows_sum
from .gather_rows import gather_rows
from .row_dot import row_dot
from .row_matmul import row_matmul
from .scatter_rows import scatter_scaled_rows
from .segment_matmul import segment_matmul, segment_matmul_tn


class TritonGraphContext(GraphContext):
    grouped_matmul = staticmethod(segment_matmul)
    grouped_matmul_tn = staticmethod(segment_matmul_tn)
    scatter_rows = staticmethod(scatter_scaled_rows)
    gather_rows = staticmethod(gather_rows)
    row_dot = staticmethod(row_dot)
    row_matmul = staticmethod(row_matmul)
    contended_sum = staticmethod(few_rows_sum)
