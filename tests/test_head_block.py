"""Multi-head units launched one head's block at a time (`codegen.head_block`): per-head
values (attention scores, weights) are loaded and computed once per edge instead of once
per feature lane. Checked against PyG with copied float64 weights on outputs and all
gradients, on the Triton kernels (interpreter here, CUDA on a GPU machine), in both
aggregation schedules, with a hub row long enough to be split into atomic segments."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.backend.triton.codegen import head_block
from gnnfuse.backend.triton.executor import feature_block, kernel_source, schedule_for
from gnnfuse.passes.fusion import AggregateUnit, SharedReduceUnit, partition
from gnnfuse.runtime.compiled import record_calls
from layer_check import assert_gatv2_matches_pyg, assert_same_outputs_and_grads
from oracle_check import device_for

NUM_NODES = 12


def hub_graph() -> tuple[torch.Tensor, torch.Tensor]:
    """Vertex 0 takes 140 in-edges (over a segment's length, so its row is split), the
    others a few each; vertex 11 is isolated."""
    gen = torch.Generator().manual_seed(7)
    hub_src = torch.randint(0, NUM_NODES - 1, (140,), generator=gen)
    src = torch.cat([hub_src, torch.randint(0, NUM_NODES - 1, (30,), generator=gen)])
    dst = torch.cat([torch.zeros(140, dtype=torch.long), torch.randint(1, NUM_NODES - 1, (30,), generator=gen)])
    return src, dst


def on_triton(monkeypatch, schedule: str) -> str:
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    return device_for("triton")


@pytest.mark.parametrize("schedule, heads, channels, edge_dim",
                         [("csr", 2, 16, None), ("coo", 3, 16, 2), ("csr", 4, 32, None)])
def test_gatv2_heads_match_pyg(monkeypatch, schedule, heads, channels, edge_dim):
    src, dst = hub_graph()
    assert_gatv2_matches_pyg(on_triton(monkeypatch, schedule), 5, channels, heads, edge_dim, src, dst, NUM_NODES)


@pytest.mark.parametrize("schedule, heads, channels", [("coo", 2, 16), ("csr", 3, 32)])
def test_gat_heads_match_pyg(monkeypatch, schedule, heads, channels):
    import torch_geometric.nn as pyg
    from gnnfuse import nn as gnn
    device = on_triton(monkeypatch, schedule)
    src, dst = hub_graph()
    edge_index = torch.stack([src, dst]).to(device)
    ours = gnn.GATConv(5, channels, heads=heads).double().to(device)
    ref = pyg.GATConv(5, channels, heads=heads).double().to(device)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(NUM_NODES, 5, dtype=torch.float64, device=device)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index), lambda xs: ref(xs, edge_index), x)


def gatv2_units(heads: int, channels: int) -> list:
    """Every aggregate and shared-reduce unit of GATv2Conv's forward and backward plans."""
    from gnnfuse import nn as gnn
    src, dst = hub_graph()
    layer = gnn.GATv2Conv(5, channels, heads=heads).double()
    with record_calls() as calls:
        layer(torch.randn(NUM_NODES, 5, dtype=torch.float64, requires_grad=True), torch.stack([src, dst]))
    units = []
    for call in calls:
        backward = call.compiled.backward_for(call.wrt)
        for program in (call.compiled.program, backward.program):
            units += [u for u in partition(program) if isinstance(u, (AggregateUnit, SharedReduceUnit))]
    return units


def test_per_head_units_run_one_head_per_feature_block():
    """At 4 heads x 32 the units that read per-head scores get a 32-lane block and load
    those scores once per edge; a plain width-D message (1 head) keeps whole rows."""
    units = gatv2_units(4, 32)
    blocked = [u for u in units if head_block(u) is not None]
    assert blocked and all(head_block(u) == 32 for u in blocked)
    for unit in blocked:
        schedule = "shared" if isinstance(unit, SharedReduceUnit) else schedule_for(unit, NUM_NODES, 170)
        _, source, _ = kernel_source(unit, "tl.float64", schedule)
        assert "tl.static_assert(32 % BLOCK_F == 0)" in source
        assert ").to(ACC)[:, None]" in source       # a per-head value read once per edge
        assert feature_block(unit, 128) == 32
    assert all(head_block(u) is None for u in gatv2_units(1, 64))


def test_a_forced_wider_feature_tile_is_capped_to_one_head():
    """A tuned or forced BLOCK_F wider than a head would break the kernel's assumption
    (every lane in one head); the launch caps it instead."""
    from gnnfuse.backend.forced_schedule import ForcedSchedule, forcing
    unit = next(u for u in gatv2_units(4, 32) if head_block(u) is not None)
    with forcing(ForcedSchedule(kind="auto", feature_tile=128)):
        assert feature_block(unit, 128) == 32
