"""The graph a front-end call runs on, from what the user passed as its graph."""
from __future__ import annotations

from typing import Any, Iterable

import torch

from ..graph import Graph


def call_graph(graph: Graph | Any, vertex_tensors: Iterable[Any]) -> Graph:
    """``graph`` as a `Graph`. A raw one (an edge_index, an adj_t) takes its vertex count
    from the first of ``vertex_tensors`` that is a tensor with rows, as PyG's layers take
    ``x.size(0)`` and as a call under ``torch.compile`` must (`compiled_call.call_compiled`):
    inferred from the largest id, the count lost trailing vertices without edges (an
    isolated last vertex), and the call refused node features with a row per vertex."""
    if isinstance(graph, Graph):
        return graph
    rows = next((t.shape[0] for t in vertex_tensors if isinstance(t, torch.Tensor) and t.dim()), None)
    return Graph.coerce(graph, rows)
