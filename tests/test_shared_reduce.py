"""Shared-reduce units and fused expands (issue #13's IO rule) against plain-PyTorch
oracles and PyG, float64, outputs and every gradient, on every backend: the reference
executor, generated Triton kernels (the interpreter without a GPU) and the Numba CPU
backend (which runs a shared-reduce unit as its edge kernel and a torch sum)."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.passes.fusion import SharedReduceUnit, partition
from layer_check import assert_gatv2_matches_pyg
from oracle_check import assert_matches_oracle, device_for

N, F_IN, HEADS, CHANNELS, EDGE_DIM = 7, 5, 2, 4, 3
SRC = torch.tensor([0, 1, 2, 3, 4, 5, 6, 0, 2, 4, 1, 6])
DST = torch.tensor([1, 2, 3, 4, 5, 6, 0, 3, 5, 1, 1, 1])


@pytest.fixture(params=["reference", "triton", "cpu"])
def any_backend(request, monkeypatch) -> str:
    monkeypatch.setenv("GNNFUSE_BACKEND", request.param)
    return request.param


def _graph(device: str, src=SRC, dst=DST) -> gnnfuse.Graph:
    return gnnfuse.Graph(src, dst, N).to(device)


def _shared_units(compiled_program, wrt) -> list[SharedReduceUnit]:
    backward = compiled_program.backward_for(wrt)
    return [u for u in partition(backward.program) if isinstance(u, SharedReduceUnit)]


def _edge_weighted(w: torch.Tensor, b: torch.Tensor):
    """A weight ``w`` applied to edge features, times both endpoints' rows and a
    per-channel scale ``b`` shared by the heads: the backward sums over edges into ``w``
    (matmul_tn) and into ``b`` (sum_to over edges and heads)."""
    @gnnfuse.vertex
    def layer(v):
        return sum([(e.a @ w).view(HEADS, CHANNELS) * (e.src.h + e.dst.h) * b for e in v.inedges])
    return layer


def _edge_weighted_oracle(h, a, w, b, src, dst):
    msg = (a @ w).view(-1, HEADS, CHANNELS) * (h[src] + h[dst]) * b
    return torch.zeros(N, HEADS, CHANNELS, dtype=h.dtype, device=h.device).index_add(0, dst, msg)


def test_edge_weight_and_bias_gradients_match_torch(any_backend):
    device = device_for(any_backend)
    graph = _graph(device)
    gen = torch.Generator().manual_seed(0)
    inputs = {"h": torch.randn(N, HEADS, CHANNELS, generator=gen, dtype=torch.float64),
              "a": torch.randn(graph.num_edges, EDGE_DIM, generator=gen, dtype=torch.float64),
              "w": torch.randn(EDGE_DIM, HEADS * CHANNELS, generator=gen, dtype=torch.float64),
              "b": torch.randn(CHANNELS, generator=gen, dtype=torch.float64)}
    inputs = {k: t.to(device) for k, t in inputs.items()}

    def ours(h, a, w, b):
        return {"out": _edge_weighted(w, b)(graph, {"h": h}, {"a": a})}

    def oracle(h, a, w, b):
        return {"out": _edge_weighted_oracle(h, a, w, b, graph.src.long(), graph.dst.long())}

    assert_matches_oracle(ours, oracle, inputs)


def test_edge_feature_matmul_and_gradients_stay_in_registers():
    graph = _graph("cpu")
    w = torch.randn(EDGE_DIM, HEADS * CHANNELS, requires_grad=True)
    b = torch.randn(CHANNELS, requires_grad=True)
    h = torch.randn(N, HEADS, CHANNELS, requires_grad=True)
    report = gnnfuse.explain(_edge_weighted(w, b), graph, {"h": h}, {"a": torch.randn(graph.num_edges, EDGE_DIM)})
    [program] = report.programs
    units = _shared_units(program.call.compiled, program.call.wrt)
    assert sorted(u.root.op for u in units) == ["matmul_tn", "sum_to"]
    # nothing per edge reaches memory: the edge-feature matmul is unrolled in every kernel
    assert program.forward.edge_tensors == [] and program.backward.edge_tensors == []


@pytest.mark.parametrize("edge_dim", [None, EDGE_DIM])
def test_gatv2_attention_gradient_runs_fused_and_matches_pyg(any_backend, edge_dim):
    """GATv2's attention vector gradient is a shared-reduce unit reading the fused
    expand of the score gradient; on every backend the layer matches PyG."""
    torch.manual_seed(3)
    assert_gatv2_matches_pyg(device_for(any_backend), F_IN, CHANNELS, HEADS, edge_dim, SRC, DST, N)


def test_gatv2_backward_plan_fuses_expand_into_a_shared_reduce():
    x = torch.randn(N, F_IN, requires_grad=True)
    report = gnnfuse.explain(gnn.GATv2Conv(F_IN, CHANNELS, heads=HEADS, add_self_loops=False), x, _graph("cpu"))
    [program] = report.programs
    [unit] = _shared_units(program.call.compiled, program.call.wrt)
    assert unit.root.shape == (HEADS, CHANNELS) and "expand" in [v.op for v in unit.body]
    assert not any(step.writes[0].op == "expand" for step in program.backward.steps)


def test_shared_reduce_on_a_graph_without_edges_is_zero(any_backend):
    device = device_for(any_backend)
    empty = torch.tensor([], dtype=torch.long)
    graph = _graph(device, empty, empty)
    w = torch.randn(EDGE_DIM, HEADS * CHANNELS, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(CHANNELS, dtype=torch.float64, device=device, requires_grad=True)
    h = torch.randn(N, HEADS, CHANNELS, dtype=torch.float64, device=device, requires_grad=True)
    out = _edge_weighted(w, b)(graph, {"h": h}, {"a": torch.zeros(0, EDGE_DIM, dtype=torch.float64, device=device)})
    out.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("edge_dim", [3, 20, 150])
def test_float32_edge_weight_gradient_runs_as_a_tile_product(edge_dim, monkeypatch):
    """In float32 the weight gradient ``matmul_tn(edge_attr, g)`` runs as one ``tl.dot``
    per block of edges (`codegen.shared_dot_rows`); its rows are padded to 16, 32 or cut
    into two tiles of 128 (`shared_dot_tiles`), its 8 lanes padded to 16, and edges span
    several blocks and programs: all of that must add nothing. Compared with torch's
    float32 gradients."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    from gnnfuse.backend.triton.codegen import shared_dot_rows, shared_dot_tiles
    device = device_for("triton")
    gen = torch.Generator().manual_seed(4)
    src, dst = torch.randint(0, N, (2, 300), generator=gen)
    graph = _graph(device, src, dst)
    h = torch.randn(N, HEADS, CHANNELS, generator=gen).to(device).requires_grad_()
    a = torch.randn(graph.num_edges, edge_dim, generator=gen).to(device)
    w = torch.randn(edge_dim, HEADS * CHANNELS, generator=gen).to(device).requires_grad_()
    b = torch.randn(CHANNELS, generator=gen).to(device).requires_grad_()
    layer = _edge_weighted(w, b)
    report = gnnfuse.explain(layer, graph, {"h": h}, {"a": a})
    [program] = report.programs
    [unit] = [u for u in _shared_units(program.call.compiled, program.call.wrt) if u.root.op == "matmul_tn"]
    assert shared_dot_rows(unit, "tl.float32") == min(128, max(16, 1 << (edge_dim - 1).bit_length()))
    assert shared_dot_tiles(unit, "tl.float32") == (2 if edge_dim > 128 else 1)
    assert shared_dot_rows(unit, "tl.float64") is None
    out = layer(graph, {"h": h}, {"a": a})
    expected = _edge_weighted_oracle(h, a, w, b, graph.src.long(), graph.dst.long())
    proj = torch.randn(out.shape, generator=gen).to(device)
    ours = torch.autograd.grad((out * proj).sum(), (h, w, b))
    theirs = torch.autograd.grad((expected * proj).sum(), (h, w, b))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)


def _wide_edge_weight_unit(edge_dim: int, width: int) -> SharedReduceUnit:
    """The weight-gradient unit of ``sum over in-edges of (a_e @ w) * h_src`` with a
    [edge_dim, width] weight: ``matmul_tn`` over the edges into one partial per program."""
    w = torch.randn(edge_dim, width, requires_grad=True)
    h = torch.randn(N, width, requires_grad=True)

    @gnnfuse.vertex
    def layer(v):
        return sum([(e.a @ w) * e.src.h for e in v.inedges])
    report = gnnfuse.explain(layer, _graph("cpu"), {"h": h}, {"a": torch.randn(len(SRC), edge_dim)})
    [program] = report.programs
    [unit] = [u for u in _shared_units(program.call.compiled, program.call.wrt) if u.root.op == "matmul_tn"]
    return unit


@pytest.mark.parametrize("acc", ["tl.float32", "tl.float64"])
def test_partials_past_2_to_the_31_elements_are_addressed_in_64_bits(acc):
    """Each of up to `SHARED_REDUCE_PROGRAMS` (1024) programs stores its partial at
    ``program * (rows x width)``: a [2048, 1100] edge weight's gradient puts the last
    programs past 2^31 elements (9.2 GB of float32 partials), where a 32-bit product
    wrapped to a negative offset. Compiled for an sm_90 GPU (no GPU needed), the kernel
    -- the tile product (float32) and the element form (float64) -- multiplies no
    program id in 32 bits where that can wrap."""
    from offset_widths import kernel_signature, narrow_program_products, triton_ir

    from gnnfuse.backend.kernel_cache import load_kernel
    from gnnfuse.backend.triton.codegen import SHARED_REDUCE_PROGRAMS, generate_shared_reduce
    unit = _wide_edge_weight_unit(2048, 1100)     # the unit, whichever backend would run it
    source, leaves = generate_shared_reduce(unit, "wide_partials", acc)
    kernel = load_kernel(source, "wide_partials")
    data = "*fp64" if acc == "tl.float64" else "*fp32"
    pointers = {"src": "*i32", "dst": "*i32", "partials": data, **{f"L{n}": data for n in range(len(leaves))}}
    ir = triton_ir(kernel, kernel_signature(kernel, pointers, ("num_edges", "size_class")),
                   {"BLOCK_E": 32, "BLOCK_F": 64})
    assert narrow_program_products(ir, SHARED_REDUCE_PROGRAMS) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="9.2 GB of partials: GPU only")
def test_a_weight_gradient_with_partials_past_2_to_the_31_elements_matches_torch_on_a_gpu(monkeypatch):
    """`test_partials_past_2_to_the_31_elements_are_addressed_in_64_bits` run: 40,000
    edges of 2048 features into a [2048, 1100] weight on a GPU (1024 programs), gradients
    against torch's in float32 (the wrapped offsets faulted before)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    gen = torch.Generator().manual_seed(5)
    edges, edge_dim, width, nodes = 40_000, 2048, 1100, 500
    src, dst = torch.randint(0, nodes, (2, edges), generator=gen)
    graph = gnnfuse.Graph(src, dst, nodes).to(device)
    a = torch.randn(edges, edge_dim, generator=gen).to(device)
    w = (torch.randn(edge_dim, width, generator=gen) / edge_dim ** 0.5).to(device).requires_grad_()
    h = torch.randn(nodes, width, generator=gen).to(device).requires_grad_()

    @gnnfuse.vertex
    def layer(v):
        return sum([(e.a @ w) * e.src.h for e in v.inedges])
    out = layer(graph, {"h": h}, {"a": a})
    expected = torch.zeros(nodes, width, device=device).index_add(0, graph.dst.long(),
                                                                    (a @ w) * h[graph.src.long()])
    proj = torch.randn(out.shape, generator=gen).to(device)
    ours = torch.autograd.grad((out * proj).sum(), (h, w))
    theirs = torch.autograd.grad((expected * proj).sum(), (h, w))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-3)
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-2)
