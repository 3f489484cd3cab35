"""The autograd glue: what a compiled program keeps alive between and across steps."""
from __future__ import annotations

import gc

import torch
import torch.nn.functional as F

from gnnfuse import nn as gnn
from gnnfuse.data import power_law_graph
from gnnfuse.frontend.trace_cache import clear_trace_caches


def _live_tensors() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def test_training_steps_do_not_accumulate_tensors():
    """Values saved for backward that are also outputs once sat on the autograd ctx as
    plain attributes: a tensor -> grad_fn -> ctx -> tensor cycle that only Python's
    cycle collector frees, so every step's tensors piled up on the GPU in between. With
    the collector off, the count must stay flat from the second step on."""
    data = power_law_graph(300, 2000, 8, 3)
    model = torch.nn.ModuleList([gnn.GCNConv(8, 8), gnn.GATConv(8, 4, heads=2), gnn.SAGEConv(8, 3, aggr="max")])
    optimizer = torch.optim.Adam(model.parameters())

    def step() -> None:
        optimizer.zero_grad()
        h = F.relu(model[0](data.x, data.graph))
        h = F.elu(model[1](h, data.graph))
        F.cross_entropy(model[2](h, data.graph), data.y).backward()
        optimizer.step()

    gc.collect()
    gc.disable()
    try:
        counts = []
        for _ in range(4):
            step()
            counts.append(_live_tensors())
    finally:
        gc.enable()
    assert counts[1] == counts[2] == counts[3], counts


def test_inference_builds_no_backward_program():
    data = power_law_graph(100, 400, 8, 3)
    layer = gnn.GATConv(8, 4, heads=2)
    from gnnfuse.runtime import compiled as compiled_module
    compiled_module._BY_STRUCTURE.clear()
    clear_trace_caches()       # a trace from another graph size would be reused
    with torch.no_grad():
        layer(data.x, data.graph)
    (compiled,) = compiled_module._BY_STRUCTURE.values()
    assert compiled._backward == {}
