"""Inputs on another device than the graph's are named in a ValueError before anything
runs (issue #11 §3). The check comes first, so meta tensors (no data) reach it."""
from __future__ import annotations

import pytest
import torch

import gnnfuse


def test_inputs_on_another_device_than_the_graph_are_named():
    @gnnfuse.vertex
    def weighted_sum(v):
        return sum([u.h @ weight for u in v.innbs])

    weight = torch.randn(2, 2)
    graph = gnnfuse.Graph([0, 1], [1, 0], 2)
    with pytest.raises(ValueError, match=r"input 'h' \(shape \[2, 2\]\) is on meta but the graph is on cpu"):
        weighted_sum(graph, {"h": torch.zeros(2, 2, device="meta")})
    with pytest.raises(ValueError, match=r"input 'h' \(shape \[2, 2\]\) is on cpu but the graph is on meta"):
        weighted_sum(graph.to("meta"), {"h": torch.zeros(2, 2)})
    weight = torch.randn(2, 2, device="meta")   # a captured parameter, named as the program names it
    with pytest.raises(ValueError, match=r"input 'param0' \(shape \[2, 2\]\) is on meta but the graph is on cpu"):
        weighted_sum(graph, {"h": torch.zeros(2, 2)})
