"""Per-edge feature sums evaluated inside the units that read them (passes.fusion's
``tile_feature_sums``, the Triton backend's plan): attention scores are recomputed as a
[edges, heads, channels] row tile reduced in registers in every unit, never written.
Checked against PyG and a plain-torch oracle in float64, outputs and every gradient, on
both backends, over tile shapes: padded channel lanes (3 -> 4), one head (no head
lookup), more heads than channels, and a kept size-1 dim (keepdim); and GATConv and
GATv2Conv against PyG with the gradients of x, edge_attr and every parameter, over the
shapes the H100 run failed to compile or that need padding (`TILE_SHAPES`)."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.runtime.explain import ExplainReport
from layer_check import assert_gatv2_matches_pyg
from oracle_check import assert_matches_oracle, device_for

N, F_IN = 7, 5
SRC = torch.tensor([0, 1, 2, 3, 4, 5, 0, 2, 4, 1, 6, 3, 5])   # vertex 1 a small hub, vertex 6 no in-edge
DST = torch.tensor([1, 2, 3, 4, 5, 1, 3, 5, 1, 1, 1, 0, 0])


@pytest.fixture(autouse=True)
def tiled_scores(monkeypatch):
    """The tiled plan, forced: by default (GNNFUSE_TILED_SCORES=auto, see
    backend/forced_schedule.py) only graphs of millions of edges get it, and these
    tests' graphs are small."""
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


# heads x channels: one head (no head lookup), few channels padded (3 -> 4), a whole
# 128-lane tile (4 x 32, 1 x 64), eight heads (8 x 8), and a head count that is not a
# power of two (3 x 5, padded to 4 x 8). Each shape runs on both layers, once with
# edge features and once without (the full product took twice the interpreter time).
TILE_SHAPES = [(1, 64), (2, 3), (4, 32), (8, 8), (3, 5)]
TILE_CASES = [(layer, heads, channels, edge_dim) for n, (heads, channels) in enumerate(TILE_SHAPES)
              for layer, edge_dim in (("GATConv", (None, 3)[n % 2]), ("GATv2Conv", (3, None)[n % 2]))]


@pytest.mark.parametrize("layer,heads,channels,edge_dim", TILE_CASES)
def test_tiled_attention_matches_pyg_with_every_gradient(layer, heads, channels, edge_dim, monkeypatch):
    """Outputs and the gradients of x, edge_attr and every parameter against PyG's layer
    in float64, on the Triton backend (the reference backend has no tiled plan), and the
    plan writes nothing per edge in either program."""
    import torch_geometric.nn as pyg
    from gnnfuse import nn as gnn
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    torch.manual_seed(0)
    ours = getattr(gnn, layer)(F_IN, channels, heads=heads, edge_dim=edge_dim).double().to(device)
    ref = getattr(pyg, layer)(F_IN, channels, heads=heads, edge_dim=edge_dim).double().to(device)
    ref.load_state_dict(ours.state_dict())
    edge_index = torch.stack([SRC, DST]).to(device)
    x = torch.randn(N, F_IN, dtype=torch.float64, device=device)
    attr = None if edge_dim is None else torch.randn(len(SRC), edge_dim, dtype=torch.float64, device=device)
    results = []
    for module in (ours, ref):
        xs = x.clone().requires_grad_()
        attrs = None if attr is None else attr.clone().requires_grad_()
        out = module(xs, edge_index, attrs)
        cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1)).to(device)
        (out * cotangent).sum().backward()
        grads = {"x": xs.grad, **({} if attrs is None else {"edge_attr": attrs.grad}),
                 **{name: p.grad for name, p in module.named_parameters()}}
        results.append((out.detach(), grads))
    (out, grads), (expected, expected_grads) = results
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert grad is not None, name
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-9, atol=1e-12, msg=name)
    [program] = gnnfuse.explain(lambda xs: ours(xs, edge_index, attr), x.clone().requires_grad_()).programs
    written = [f"{plan.phase}: {t.value.op}{list(t.value.shape)}" for plan in (program.forward, program.backward)
               for t in plan.edge_tensors if not t.exempt]
    assert written == []


def test_autotuned_blocks_keep_score_tiles_within_registers():
    """On a GPU the autotuner's edge blocks for a kernel that recomputes every head's
    score (GATv2 4 heads x 32: the max and sum passes, whose lanes are the heads; 128
    tile values per edge) are cut so [BLOCK_E, 128] stays within TILE_VALUES_PER_THREAD
    values per thread; a [256, 128] tile spilled and took 20 s to compile in Triton 3.6.
    Checked on the sources the GPU gets (tuned=True)."""
    import re
    from gnnfuse.backend.triton.codegen import TILE_VALUES_PER_THREAD, head_block
    checked = 0
    for unit, schedule, source in _gatv2_tuned_sources(heads=4, channels=32):
        if head_block(unit) is not None or "tl.arange(0, 32)" not in source:
            continue
        checked += 1
        for block_e, warps in re.findall(r"'BLOCK_E': (\d+).*?num_warps=(\d+)", source):
            assert int(block_e) * 128 <= TILE_VALUES_PER_THREAD * 32 * int(warps), (schedule, block_e, warps)
    assert checked >= 2     # the max and sum passes at least


def test_programs_of_one_head_evaluate_only_their_heads_scores():
    """A kernel whose feature programs each lie in one head (`head_block`: GATv2 4 x 32's
    weighted sum and its backward units) evaluates only that head's [BLOCK_E, 32] score
    tile: no 128-lane tile of all four heads, no per-lane head selection. The whole tile
    cost each of a row's four programs four heads' gathers and arithmetic."""
    from gnnfuse.backend.triton.codegen import head_block
    one_head = [(schedule, source) for unit, schedule, source in _gatv2_tuned_sources(heads=4, channels=32)
                if head_block(unit) is not None and "tl.sum(" in source]
    assert len(one_head) >= 4       # forward weighted sum (csr, coo), backward units
    for schedule, source in one_head:
        assert "tl.arange(0, 32)" in source and "tl.arange(0, 128)" not in source, schedule
        assert "tl.arange(0, 4)" not in source, schedule           # the head-column lookup


def test_float64_score_tiles_count_two_registers_per_value():
    """A float64 value takes two 32-bit registers, so the edge blocks of a kernel that
    recomputes its head's [BLOCK_E, 32] score tile in float64 are cut to half the values
    of float32's: [64, 32] tiles over one warp were GATv2 4 x 32's slowest float64
    configs to compile (3.5 s each on Triton 3.6, sm_90)."""
    import re
    from gnnfuse.backend.triton.codegen import TILE_VALUES_PER_THREAD, head_block
    checked = 0
    for unit, schedule, source in _gatv2_tuned_sources(heads=4, channels=32, acc="tl.float64"):
        if head_block(unit) is None or "tl.arange(0, 32)" not in source:
            continue
        checked += 1
        for block_e, warps in re.findall(r"'BLOCK_E': (\d+).*?num_warps=(\d+)", source):
            assert int(block_e) * 32 * 2 <= TILE_VALUES_PER_THREAD * 32 * int(warps), (schedule, block_e, warps)
    assert checked >= 4


def _gatv2_tuned_sources(heads: int, channels: int, acc: str = "tl.float32"):
    """(unit, schedule, kernel source as the GPU gets it) for every aggregate and
    shared-reduce unit of GATv2Conv's tiled forward and backward plans."""
    from gnnfuse import nn as gnn
    from gnnfuse.backend.triton.executor import _GENERATORS
    from gnnfuse.passes.fusion import AggregateUnit, SharedReduceUnit, partition
    layer = gnn.GATv2Conv(F_IN, channels, heads=heads)
    x = torch.randn(N, F_IN, requires_grad=True)
    [program] = gnnfuse.explain(lambda xs: layer(xs, torch.stack([SRC, DST])), x).programs
    compiled = program.call.compiled
    for plan in (compiled.program, compiled.backward_for(program.call.wrt).program):
        for unit in partition(plan, tile_feature_sums=True):
            if isinstance(unit, SharedReduceUnit):
                schedules = ["shared"]
            elif isinstance(unit, AggregateUnit):
                schedules = ["csr", "coo"] if unit.reduce.attrs["op"] in ("sum", "mean") else ["csr"]
            else:
                continue
            for schedule in schedules:
                name, generator = _GENERATORS[schedule]
                yield unit, schedule, generator(unit, name, acc, tuned=True)[0]


def test_switch_off_writes_the_scores_and_still_matches_pyg(monkeypatch):
    """``GNNFUSE_TILED_SCORES=0`` brings back the untiled plan: GATv2's [E, H] scores are
    written once by an edge unit, the layer's output and gradients unchanged (float64,
    against PyG); any other value is refused rather than read as either."""
    import torch_geometric.nn as pyg
    from gnnfuse import nn as gnn
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", "0")
    device = device_for("triton")
    torch.manual_seed(0)
    ours = gnn.GATv2Conv(F_IN, 4, heads=2).double().to(device)
    ref = pyg.GATv2Conv(F_IN, 4, heads=2).double().to(device)
    ref.load_state_dict(ours.state_dict())
    edge_index = torch.stack([SRC, DST]).to(device)
    x = torch.randn(N, F_IN, dtype=torch.float64, device=device)
    grads = []
    for module in (ours, ref):
        xs = x.clone().requires_grad_()
        module(xs, edge_index).pow(2).sum().backward()
        grads.append((xs.grad, module.att.grad))
    for mine, theirs in zip(*grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-9, atol=1e-12)
    [program] = gnnfuse.explain(lambda xs: ours(xs, edge_index), x.clone().requires_grad_()).programs
    assert [list(t.value.shape) for t in program.forward.edge_tensors] == [[2]]     # the scores, [E, H]
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", "yes")
    with pytest.raises(ValueError, match="GNNFUSE_TILED_SCORES"):
        ours(x, edge_index)


@pytest.mark.parametrize("heads,written", [(16, []), (32, [[32]])])
def test_scores_of_many_heads_are_written_once(heads, written):
    """Each kept head's score is a tile of its own in the kernel (unrolled), so compile
    time grows with the head count: up to MAX_TILED_HEADS (16) heads the scores are
    recomputed in every unit; past it, as with 32 heads x 2 channels, they are written
    once as an [E, H] tensor (the IO rule allows H per edge)."""
    from gnnfuse import nn as gnn
    layer = gnn.GATv2Conv(F_IN, 2, heads=heads)
    x = torch.randn(N, F_IN, requires_grad=True)
    [program] = gnnfuse.explain(lambda xs: layer(xs, torch.stack([SRC, DST])), x).programs
    assert [list(t.value.shape) for t in program.forward.edge_tensors] == written


def test_default_tiles_the_scores_only_on_large_graphs(monkeypatch):
    """``GNNFUSE_TILED_SCORES=auto`` (the default) writes GATv2's [E, H] scores once on a
    graph below `TILED_SCORES_FROM_EDGES` edges, where recomputing them in four kernels
    cost more than the E x H floats, and tiles them from that many edges on; `explain`
    says which and why."""
    from gnnfuse import nn as gnn
    from gnnfuse.backend import forced_schedule
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", "auto")
    torch.manual_seed(0)
    layer = gnn.GATv2Conv(F_IN, 4, heads=2)
    edge_index = torch.stack([SRC, DST])
    x = torch.randn(N, F_IN, requires_grad=True)
    edges_with_loops = int((SRC != DST).sum()) + N      # GATv2 swaps the given loops for one per vertex

    def written() -> tuple[list[list[int]], str]:
        report = gnnfuse.explain(lambda xs: layer(xs, edge_index), x)
        return [list(t.value.shape) for t in report.programs[0].forward.edge_tensors], str(report)
    shapes, listing = written()
    assert shapes == [[2]] and "written once, as the graph has under 4,000,000 edges" in listing
    monkeypatch.setattr(forced_schedule, "TILED_SCORES_FROM_EDGES", edges_with_loops + 1)
    assert written()[0] == [[2]]
    monkeypatch.setattr(forced_schedule, "TILED_SCORES_FROM_EDGES", edges_with_loops)
    shapes, listing = written()
    assert shapes == [] and "written once" not in listing
