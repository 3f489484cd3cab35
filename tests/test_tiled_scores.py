"""Per-edge feature sums evaluated inside the units that read them (passes.fusion's
``tile_feature_sums``, the Triton backend's plan): attention scores are recomputed as a
[edges, heads, channels] row tile reduced in registers in every unit, never written.
Checked against PyG and a plain-torch oracle in float64, outputs and every gradient, on
both backends, over tile shapes: padded channel lanes (3 -> 4), one head (no gather),
more heads than channels, and a kept size-1 dim (keepdim)."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.runtime.explain import ExplainReport
from layer_check import assert_gatv2_matches_pyg
from oracle_check import assert_matches_oracle

N, F_IN = 7, 5
SRC = torch.tensor([0, 1, 2, 3, 4, 5, 0, 2, 4, 1, 6, 3, 5])   # vertex 1 a small hub, vertex 6 no in-edge
DST = torch.tensor([1, 2, 3, 4, 5, 1, 3, 5, 1, 1, 1, 0, 0])


@pytest.fixture(autouse=True)
def tiled_scores(monkeypatch):
    """The tiled plan is opt-in (GNNFUSE_TILED_SCORES=1; see backend/forced_schedule.py)."""
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", "1")


def _sums_in_unit_bodies(report: ExplainReport) -> list[str]:
    return [v.op for program in report.programs for plan in (program.forward, program.backward)
            for step in plan.steps if step.fused for v in step.body if v.op in ("sum_dim", "sum_to")]


@pytest.mark.parametrize("heads,channels,edge_dim", [(2, 3, None), (1, 5, 2), (4, 2, None)])
def test_gatv2_with_scores_recomputed_in_units_matches_pyg(heads, channels, edge_dim, backend, device):
    torch.manual_seed(0)
    call, x = assert_gatv2_matches_pyg(device, F_IN, channels, heads, edge_dim, SRC, DST, N)
    report = gnnfuse.explain(call, x.clone().requires_grad_())
    assert "sum_dim" in _sums_in_unit_bodies(report)   # the scores: in registers, not an edge unit's output


@gnnfuse.vertex
def _gated(v):
    """A score with a kept size-1 dim (keepdim), read by a max and by the aggregation."""
    scores = [(u.h * v.q).sum(-1, keepdim=True) for u in v.innbs]
    return sum([torch.tanh(s) * u.h for s, u in zip(scores, v.innbs)]) + max(scores)


def _gated_oracle(h, q):
    src, dst = SRC.to(h.device), DST.to(h.device)
    scores = (h[src] * q[dst]).sum(-1, keepdim=True)
    out = torch.zeros_like(h).index_add(0, dst, torch.tanh(scores) * h[src])
    index = dst.view(-1, 1, 1).expand_as(scores)
    peak = torch.zeros_like(scores[:N]).scatter_reduce(0, index, scores, "amax", include_self=False)
    return out + peak


def test_kept_size_one_dim_matches_torch(backend, device):
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    gen = torch.Generator().manual_seed(2)
    inputs = {k: torch.randn(N, 2, 3, generator=gen, dtype=torch.float64).to(device) for k in ("h", "q")}
    assert_matches_oracle(lambda h, q: {"out": _gated(graph, {"h": h, "q": q})},
                          lambda h, q: {"out": _gated_oracle(h, q)}, inputs)
    report = gnnfuse.explain(_gated, graph, {k: t.clone().requires_grad_() for k, t in inputs.items()})
    assert "sum_dim" in _sums_in_unit_bodies(report)
