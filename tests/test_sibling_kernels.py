"""Sibling groups (passes/siblings.py): independent aggregate units over the same CSR run
as one Triton kernel. The grouping's placement rules on hand-made plans; the generated
kernel against the members run one by one and against the reference backend, in
float64 under the interpreter, on a graph with a split hub row (atomic stores); and the
fall-back to separate kernels wherever one kernel does not apply."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.frontend.trace_cache import clear_trace_caches
from gnnfuse.ir import Program, Residency
from gnnfuse.passes.fusion import AggregateUnit, partition
from gnnfuse.passes.siblings import MAX_SIBLINGS, SiblingGroup, group_siblings
from gnnfuse.runtime import compiled as compiled_module
from test_triton_backend import DEVICE, hub_graph


def _sums(n_units: int, chained: bool = False, read_between: bool = False, reshape_between: bool = False):
    """A program of ``n_units`` sums by dst of ``x_u * x_v`` (with ``chained``, the
    second reading the first's output instead of ``x_u``), optionally with a torch op
    (``read_between``: a tanh; ``reshape_between``: a reshape, then a tanh of it at the
    end) reading the first sum before the second runs; and its partition."""
    p = Program()
    x = p.input("x", Residency.NODE, (4,), torch.float64)
    outs = []
    for k in range(n_units):
        source = outs[0] if chained and outs else x
        edge = p.add("mul", p.add("broadcast", source, by="src"), p.add("broadcast", x, by="dst"))
        outs.append(p.add("reduce", edge, op="sum", by="dst"))
        if read_between and k == 0:
            outs[0] = p.add("tanh", outs[0])
        if reshape_between and k == 0:
            outs[0] = p.add("reshape", outs[0], shape=(2, 2))
    if reshape_between:
        outs[0] = p.add("tanh", outs[0])
    for k, v in enumerate(outs):
        p.output(f"y{k}", v)
    return p, partition(p)


def test_independent_sums_over_one_csr_form_a_group_at_the_last_member():
    _, plan = _sums(3)
    grouped = group_siblings(plan)
    (group,) = [item for item in grouped if isinstance(item, SiblingGroup)]
    units = [item for item in plan if isinstance(item, AggregateUnit)]
    assert group.members == units and grouped.index(group) == len(grouped) - 1
    assert {leaf.id for leaf in group.leaves} == {leaf.id for u in units for leaf in u.leaves}


def test_a_member_read_before_the_group_would_run_closes_the_group():
    for kwargs in ({"chained": True}, {"read_between": True}):
        _, plan = _sums(2, **kwargs)
        assert not any(isinstance(item, SiblingGroup) for item in group_siblings(plan)), kwargs


def test_a_reshape_of_a_member_moves_after_the_group():
    """A view of a member's output (a layer reshaping a gradient for its output) does not
    split the group: it runs right after it, and what reads the view runs later still."""
    _, plan = _sums(2, reshape_between=True)
    grouped = group_siblings(plan)
    kinds = [type(item).__name__ if not hasattr(item, "op") else item.op for item in grouped]
    assert kinds == ["SiblingGroup", "reshape", "tanh"], kinds
    (group,) = [item for item in grouped if isinstance(item, SiblingGroup)]
    assert grouped[1].inputs[0] is group.members[0].root


def test_groups_hold_at_most_max_siblings():
    _, plan = _sums(MAX_SIBLINGS + 2)
    sizes = [len(item.members) for item in group_siblings(plan) if isinstance(item, SiblingGroup)]
    assert sizes == [MAX_SIBLINGS, 2]


@gnnfuse.vertex
def _mean_and_scaled(v):
    """Two sums by dst that do not read each other: a mean (a row scaled by 1 / degree)
    and a normalized sum (scaled by a per-row norm), added."""
    return sum([u.h for u in v.innbs]) / len(v.innbs) + sum([u.h * u.norm for u in v.innbs]) * v.norm


@gnnfuse.vertex
def _max_and_scaled(v):
    """A max and a scaled sum by dst in one group; the graph's isolated vertices are
    empty rows, whose max is 0 (as torch's scatter and the reference give), not -inf."""
    return max([u.h for u in v.innbs]) + sum([u.h * u.norm for u in v.innbs]) * v.norm


def _gat(graph, x):
    torch.manual_seed(3)
    layer = gnn.GATConv(x.shape[1], 8, heads=2).double().to(x.device)
    return layer(x, graph), list(layer.parameters())


def planned_groups(monkeypatch) -> list[tuple[SiblingGroup, object]]:
    """(group, launch plan) of each sibling group the Triton backend plans as one kernel
    from here on (a group it runs member by member is not listed)."""
    planned: list[tuple[SiblingGroup, object]] = []
    plan_siblings = triton_executor._plan_siblings

    def spy(group, ctx, leaves):
        plan = plan_siblings(group, ctx, leaves)
        if plan is not None:
            planned.append((group, plan))
        return plan
    monkeypatch.setattr(triton_executor, "_plan_siblings", spy)
    return planned


def _outputs_and_grads(fn, graph, x, extra):
    xs = x.clone().requires_grad_()
    out, params = fn(graph, xs, extra)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), [xs, *params])
    return [out.detach(), *grads]


def _cases():
    def mean_and_scaled(graph, xs, norm):
        return _mean_and_scaled(graph, {"h": xs, "norm": norm}), []

    def max_and_scaled(graph, xs, norm):
        return _max_and_scaled(graph, {"h": xs, "norm": norm}), []

    def gat(graph, xs, _):
        return _gat(graph, xs)
    return {"mean-and-scaled": mean_and_scaled, "max-and-scaled": max_and_scaled, "gat-backward": gat}


def two_hubs_graph() -> gnnfuse.Graph:
    """`hub_graph` with 150 more in-edges on vertex 1: under 64-edge segments two split
    rows, whose full segments come first in the longest-first order, the rows' segments
    interleaved there (the merge's slots must still take them row by row)."""
    hub = hub_graph()
    src = torch.cat([hub.src, torch.randint(2, 10, (150,), generator=torch.Generator().manual_seed(8))])
    return gnnfuse.Graph(src, torch.cat([hub.dst, torch.ones(150, dtype=torch.long)]), 12)


@pytest.mark.parametrize("graph_of", [hub_graph, two_hubs_graph], ids=["one-hub", "two-hubs"])
@pytest.mark.parametrize("case", ["mean-and-scaled", "max-and-scaled", "gat-backward"])
def test_one_kernel_equals_the_members_run_apart_and_the_reference(case, graph_of, monkeypatch):
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 64)    # the hub row splits: atomic stores too
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    graph = graph_of().to(DEVICE)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64, generator=gen).to(DEVICE)
    norm = (torch.rand(graph.num_nodes, 1, dtype=torch.float64, generator=gen) + 0.5).to(DEVICE)
    fn = _cases()[case]
    planned = planned_groups(monkeypatch)
    results = {}
    for backend, siblings in (("triton", "1"), ("triton", "0"), ("reference", "1")):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        monkeypatch.setenv("GNNFUSE_SIBLING_KERNELS", siblings)
        compiled_module._BY_STRUCTURE.clear()
        clear_trace_caches()
        results[backend, siblings] = _outputs_and_grads(fn, graph, x, norm)
        if (backend, siblings) == ("triton", "1"):
            assert planned, "no sibling group ran as one kernel"
            assert all(len(g.members) >= 2 for g, _ in planned)
    for got, apart, want in zip(results["triton", "1"], results["triton", "0"], results["reference", "1"]):
        torch.testing.assert_close(got, apart, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_members_run_apart_where_one_kernel_does_not_apply(monkeypatch):
    """The edge-parallel schedule (here forced) has no group kernel: the members run
    one by one, and the results still match the reference."""
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    graph = hub_graph().to(DEVICE)
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64).to(DEVICE)
    norm = torch.rand(graph.num_nodes, 1, dtype=torch.float64).to(DEVICE) + 0.5
    monkeypatch.setattr(triton_executor, "_plan_siblings",
                        lambda *a, plan=triton_executor._plan_siblings: pytest.fail("planned")
                        if plan(*a) is not None else None)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        compiled_module._BY_STRUCTURE.clear()
        clear_trace_caches()
        results.append(_outputs_and_grads(_cases()["mean-and-scaled"], graph, x, norm))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_explain_names_the_shared_kernel_and_prints_its_source(monkeypatch):
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    graph = hub_graph()
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64)
    norm = torch.rand(graph.num_nodes, 1, dtype=torch.float64) + 0.5
    report = gnnfuse.explain(_mean_and_scaled, graph, {"h": x, "norm": norm}, source=True)
    [program] = report.programs
    members = [s for s in program.forward.steps if s.fused]
    assert len(members) == 2 and all("shares one kernel with the 1 other unit" in s.label for s in members)
    assert "def fused_siblings(" in members[0].source and "out1" in members[0].source
    assert members[1].source == "(the kernel above)"
    assert "shares one kernel" in str(report)


def test_explain_says_when_a_group_runs_member_by_member(monkeypatch):
    """Off the CSR schedule (forced COO here) a group's members run one by one, and
    explain says so instead of naming a shared kernel."""
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    graph = hub_graph()
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64)
    norm = torch.rand(graph.num_nodes, 1, dtype=torch.float64) + 0.5
    [program] = gnnfuse.explain(_mean_and_scaled, graph, {"h": x, "norm": norm}).programs
    members = [s for s in program.forward.steps if s.fused]
    assert len(members) == 2 and all("runs on its own here" in s.label for s in members)
    assert "shares one kernel" not in "".join(s.label for s in members)


def test_hgt_walks_the_source_csr_once_backward_and_the_destination_csr_once_forward(monkeypatch):
    """HGTConv's key and value gradients are two sums by source of the pair graph with a
    reshape of the first between them: with the CSR schedule they run as one kernel. Its
    attention (max, normalizer and weighted sum by destination) is one kernel too, the
    sums taking the max online (passes/online_softmax.py). Outputs and gradients match
    PyG's HGTConv."""
    import torch_geometric.nn as pyg_nn
    from test_nn_hetero import IN_CHANNELS, METADATA, assert_same, hetero_inputs, randomized
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    planned = planned_groups(monkeypatch)
    torch.manual_seed(0)
    pyg = randomized(pyg_nn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double().to(DEVICE), 2)
    ours = gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double().to(DEVICE)
    ours.load_state_dict(pyg.state_dict())
    x, edges = hetero_inputs(2, DEVICE)
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges))
    backward = [g for g, _ in planned if g.by == "src"]
    forward = [g for g, _ in planned if g.by == "dst"]
    assert backward and all(len(g.members) == 2 for g in backward)
    assert forward and all(g.shifts == {1: 0, 2: 0} and g.normalizers == {2: 1} for g in forward)


def test_members_of_float32_and_float64_leaves_run_apart(monkeypatch):
    """One member sums float32 products, the other float64 ones: one kernel computes in
    one accumulator dtype, and the group's was float64 whenever a leaf was, so the float32
    member's products were never rounded to float32 -- 63 of its 200 sums differed from
    torch's (by 1 ulp), silently, while the same unit alone runs in float32. Such a
    group runs member by member, each in its own dtype (`unit_ops.mixed_floats`)."""
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    gen = torch.Generator().manual_seed(0)
    n = e = 50     # one in-edge per vertex: each sum is one product, whatever the order of additions
    graph = gnnfuse.Graph(torch.arange(n), torch.randperm(n, generator=gen), n).to(DEVICE)
    p = Program()
    a = p.input("a", Residency.NODE, (4,), torch.float32)
    w = p.input("w", Residency.EDGE, (4,), torch.float32)
    b = p.input("b", Residency.NODE, (4,), torch.float64)
    p.output("y1", p.add("reduce", p.add("mul", p.add("mul", p.add("broadcast", a, by="src"), w), w), op="sum", by="dst"))
    p.output("y2", p.add("reduce", p.add("mul", p.add("broadcast", b, by="src"), p.add("broadcast", b, by="dst")),
                         op="sum", by="dst"))
    compiled = compiled_module.CompiledProgram(p)
    assert any(isinstance(item, SiblingGroup) for item in group_siblings(partition(compiled.program)))
    A, W = torch.randn(n, 4, generator=gen).to(DEVICE), torch.randn(e, 4, generator=gen).to(DEVICE)
    B = torch.randn(n, 4, dtype=torch.float64, generator=gen).to(DEVICE)
    out = compiled(graph, {"a": A, "w": W, "b": B})
    s, d = graph.src.long(), graph.dst.long()
    torch.testing.assert_close(out["y1"], torch.zeros_like(A).index_add(0, d, A[s] * W * W), rtol=0, atol=0)
    torch.testing.assert_close(out["y2"], torch.zeros_like(B).index_add(0, d, B[s] * B[d]), rtol=1e-12, atol=1e-12)


def test_segments_past_2_to_the_31_are_numbered_in_64_bits():
    """A CSR walk's program takes segments ``tl.program_id(0) * ROWS + r``: with 2^31
    segments or more (a graph of 2^31 vertices, one segment each) that int32 product
    wrapped to negative segment ids, which passed the ``< num_segments`` test and read
    before the segment arrays. Compiled for an sm_90 GPU (no GPU needed), neither the
    walk of one unit nor a sibling group's multiplies the program id in 32 bits where a
    launch of 2^31 + 1 segments wraps."""
    from offset_widths import generated_signature, narrow_program_products, triton_ir

    from gnnfuse.backend.kernel_cache import load_kernel
    from gnnfuse.backend.triton.codegen import generate, generate_siblings
    _, plan = _sums(2)
    [group] = [item for item in group_siblings(plan) if isinstance(item, SiblingGroup)]
    rows = 2
    for generator, item in ((generate, group.members[0]), (generate_siblings, group)):
        source, _ = generator(item, "segments_past_int32", "tl.float32")
        kernel = load_kernel(source, "segments_past_int32")
        constants = {"BLOCK_E": 16, "BLOCK_F": 16, "ROWS": rows}
        signature = generated_signature(kernel)
        ir = triton_ir(kernel, signature, {k: v for k, v in constants.items() if k in signature})
        assert narrow_program_products(ir, -(-(2**31 + 1) // rows)) == [], generator.__name__
