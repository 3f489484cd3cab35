"""The Triton segment matmul (backend/triton/segment_matmul.py): rows grouped by type times
their type's weight, and the per-type weight gradient, checked against plain torch in
float32 under Triton's interpreter (or on the GPU); float64 keeps the exact torch loop;
and the Triton backend's per-type transforms (R-GCN through compact materialization,
Graphiler's indexed bmm) really run the kernels, with outputs and gradients matching."""
from __future__ import annotations

import pytest
import torch
from oracle_check import device_for

import gnnfuse
from gnnfuse.backend.triton import segment_matmul as sm
from gnnfuse.ir.ops.typed import RowGroups, typed_matmul
from gnnfuse.nn import RGCNConv

DEVICE = device_for("triton")
TYPES, K, N = 4, 20, 5          # K > one 16-wide block, N < one: both masks and the K loop run


def grouped_rows(rows: int, types: int, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Each row's type and the ascending row ids per type (as ctx.groups builds them);
    type 1 has no rows, type 0 more than one forward tile."""
    g = torch.Generator().manual_seed(seed)
    kind = torch.randint(0, types, (rows,), generator=g)
    kind[kind == 1] = 2
    kind[: sm.BLOCK_M + 3] = 0
    kind = kind[torch.randperm(rows, generator=g)].to(DEVICE)
    ids = [torch.nonzero(kind == t).flatten() for t in range(types)]
    return kind, RowGroups(ids, [len(i) for i in ids])


def kernels_only(monkeypatch) -> list[str]:
    """Make the torch loop fail inside the kernel module, and record the kernels launched
    (by name), so a test can tell that its per-type matmuls ran in Triton."""
    def refuse(*args):
        raise AssertionError("the segment matmul fell back to the torch loop")
    launched: list[str] = []
    launch = sm.launch

    def record(kernel, *args):
        launched.append(getattr(kernel, "fn", kernel).__name__)
        launch(kernel, *args)
    monkeypatch.setattr(sm, "typed_matmul", refuse)
    monkeypatch.setattr(sm, "typed_matmul_tn", refuse)
    monkeypatch.setattr(sm, "launch", record)
    return launched


@pytest.mark.parametrize("middle", [(), (2,)])
def test_kernels_match_torch_in_float32(monkeypatch, middle):
    kernels_only(monkeypatch)
    kind, groups = grouped_rows(90, TYPES)
    g = torch.Generator().manual_seed(1)
    x = torch.randn((90, *middle, K), generator=g).to(DEVICE)
    w = torch.randn(TYPES, K, N, generator=g).to(DEVICE)
    grad = torch.randn((90, *middle, N), generator=g).to(DEVICE)
    expected = torch.einsum("r...k,rkn->r...n", x.double(), w.double()[kind])
    torch.testing.assert_close(sm.segment_matmul(x, w, groups).double(), expected, rtol=1e-5, atol=1e-5)
    # the input gradient is the forward kernel with the transposed weights (a strided view)
    torch.testing.assert_close(sm.segment_matmul(grad, w.transpose(1, 2), groups).double(),
                               torch.einsum("r...n,rkn->r...k", grad.double(), w.double()[kind]),
                               rtol=1e-5, atol=1e-5)
    weight_grad = torch.zeros(TYPES, K, N, dtype=torch.float64, device=DEVICE).index_add_(
        0, kind, torch.einsum("r...k,r...n->rkn", x.double(), grad.double()))
    got = sm.segment_matmul_tn(x, grad, groups)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), weight_grad, rtol=1e-5, atol=1e-4)
    assert torch.equal(got[1], torch.zeros(K, N, device=DEVICE))      # a type without rows


def _assert_gathered_products(x, w, grad, kind, groups, gather):
    """The forward and the weight gradient of gathered rows (``x[gather]``, any middle
    dims) against einsum in float64."""
    rows = x.double()[gather]
    torch.testing.assert_close(sm.segment_matmul(x, w, groups, gather).double(),
                               torch.einsum("r...k,rkn->r...n", rows, w.double()[kind]), rtol=1e-5, atol=1e-5)
    expected = torch.zeros(TYPES, K, N, dtype=torch.float64, device=DEVICE).index_add_(
        0, kind, torch.einsum("r...k,r...n->rkn", rows, grad.double()))
    torch.testing.assert_close(sm.segment_matmul_tn(x, grad, groups, gather).double(), expected,
                               rtol=1e-5, atol=1e-4)


def test_kernels_follow_a_row_gather_without_copying(monkeypatch):
    """``gather``: problem row i reads ``x[gather[i]]`` (the compact pairs' vertices), in
    the kernels themselves -- no gathered copy of x is made."""
    kernels_only(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "index_select", lambda *a: pytest.fail("x was gathered in torch"))
    kind, groups = grouped_rows(90, TYPES)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(13, K, generator=g).to(DEVICE)
    gather = torch.randint(0, 13, (90,), generator=g).to(DEVICE)
    w = torch.randn(TYPES, K, N, generator=g).to(DEVICE)
    grad = torch.randn(90, N, generator=g).to(DEVICE)
    _assert_gathered_products(x, w, grad, kind, groups, gather)


def test_a_gather_of_rows_with_middle_dims_reads_whole_rows(monkeypatch):
    """x [13, 2, K] through ``gather``: each gathered row is two kernel rows, which the
    kernels cannot follow a row id to, so the rows are gathered first."""
    kernels_only(monkeypatch)
    kind, groups = grouped_rows(90, TYPES)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(13, 2, K, generator=g).to(DEVICE)
    gather = torch.randint(0, 13, (90,), generator=g).to(DEVICE)
    w = torch.randn(TYPES, K, N, generator=g).to(DEVICE)
    grad = torch.randn(90, 2, N, generator=g).to(DEVICE)
    _assert_gathered_products(x, w, grad, kind, groups, gather)


def test_a_type_of_whole_tiles_is_covered_once(monkeypatch):
    """Type 0 holds exactly two gradient chunks (8 forward tiles): every tile starts one
    tile after the last, so its last row is computed and no row counted twice."""
    kernels_only(monkeypatch)
    g = torch.Generator().manual_seed(7)
    rows = 2 * sm.TN_CHUNK + 40
    kind = torch.randint(1, TYPES, (rows,), generator=g)
    kind[: 2 * sm.TN_CHUNK] = 0
    kind = kind[torch.randperm(rows, generator=g)].to(DEVICE)
    ids = [torch.nonzero(kind == t).flatten() for t in range(TYPES)]
    groups = RowGroups(ids, [len(i) for i in ids])
    x = torch.randn(rows, K, generator=g).to(DEVICE)
    w = torch.randn(TYPES, K, N, generator=g).to(DEVICE)
    grad = torch.randn(rows, N, generator=g).to(DEVICE)
    torch.testing.assert_close(sm.segment_matmul(x, w, groups).double(),
                               torch.einsum("rk,rkn->rn", x.double(), w.double()[kind]), rtol=1e-5, atol=1e-5)
    expected = torch.zeros(TYPES, K, N, dtype=torch.float64, device=DEVICE).index_add_(
        0, kind, torch.einsum("rk,rn->rkn", x.double(), grad.double()))
    torch.testing.assert_close(sm.segment_matmul_tn(x, grad, groups).double(), expected, rtol=1e-5, atol=1e-4)


def test_float64_keeps_the_exact_torch_loop():
    kind, groups = grouped_rows(100, TYPES)
    x = torch.randn(100, K, dtype=torch.float64, device=DEVICE)
    w = torch.randn(TYPES, K, N, dtype=torch.float64, device=DEVICE)
    assert not sm.kernel_applies(x, w)
    got = sm.segment_matmul(x, w, groups)
    assert torch.equal(got, typed_matmul(x, w, groups))
    torch.testing.assert_close(got, torch.einsum("rk,rkn->rn", x, w[kind]), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors under Triton's interpreter (CI's case)")
def test_bfloat16_off_the_gpu_keeps_the_torch_loop():
    """Triton's interpreter has no bfloat16 (numpy): its tl.dot read the bits as another
    type, and an R-GCN step gave values near 5e9 for -0.8, silently. Off a GPU bf16 runs
    the torch loop, which agrees with a float32 run to bf16's precision."""
    kind, groups = grouped_rows(100, TYPES)
    x = torch.randn(100, K).bfloat16()
    w = torch.randn(TYPES, K, N).bfloat16()
    assert not sm.dot_applies(x, w)
    expected = torch.einsum("rk,rkn->rn", x.float(), w.float()[kind])
    torch.testing.assert_close(sm.segment_matmul(x, w, groups).float(), expected, rtol=2e-2, atol=5e-2)


def test_the_layout_of_cached_groups_is_built_once():
    _, groups = grouped_rows(70, TYPES)
    first = sm._layout(groups, 1, sm.BLOCK_M)
    assert sm._layout(groups, 1, sm.BLOCK_M) is first
    assert sm._layout(list(groups), 1, sm.BLOCK_M) is not first     # a plain list: laid out per call
    # tiles never straddle two types: each tile's end is its own type's end
    tile_type, start, end = first.tiles.cpu()
    counts = torch.tensor([len(g) for g in groups])
    assert torch.equal(end, counts.cumsum(0)[tile_type])
    assert bool(((end - start) > 0).all()) and bool(((end - start) <= sm.BLOCK_M).all() | (tile_type == 0).all())


def rgcn_oracle(x, w, root, bias, src, dst, rel, n):
    """R-GCN with mean per relation, written out edge by edge in plain torch."""
    key = dst * w.shape[0] + rel
    norm = 1.0 / torch.bincount(key, minlength=n * w.shape[0])[key].to(x.dtype)
    message = torch.einsum("ei,eio->eo", x[src], w[rel]) * norm[:, None]
    return torch.zeros(n, w.shape[2], dtype=x.dtype, device=x.device).index_add(0, dst, message) + x @ root + bias


def test_rgcn_on_the_triton_backend_runs_the_kernels_forward_and_backward(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    launched = kernels_only(monkeypatch)
    g = torch.Generator().manual_seed(2)
    n, e = 12, 60
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    rel = torch.randint(0, TYPES, (e,), generator=g)
    conv = RGCNConv(K, N, TYPES).to(DEVICE)
    x = torch.randn(n, K, generator=g).to(DEVICE).requires_grad_()
    graph = gnnfuse.Graph(src.to(DEVICE), dst.to(DEVICE), n, edge_type=rel.to(DEVICE), num_edge_types=TYPES)
    out = conv(x, graph)
    seed = torch.randn(out.shape, generator=g).to(DEVICE)
    (out * seed).sum().backward()
    params = [conv.weight, conv.root, conv.bias]
    leaves = [t.detach().double().requires_grad_() for t in (x, *params)]
    expected = rgcn_oracle(*leaves, src.to(DEVICE), dst.to(DEVICE), rel.to(DEVICE), n)
    (expected * seed.double()).sum().backward()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    for ours, theirs in zip((x, *params), leaves):
        torch.testing.assert_close(ours.grad.double(), theirs.grad, rtol=1e-5, atol=1e-4)
    assert set(launched) == {"_segment_matmul", "_segment_matmul_tn"}


def test_graphiler_indexed_bmm_on_the_triton_backend_runs_the_kernels(monkeypatch):
    """``bmm(edges.src['h'].unsqueeze(1), W[edges.data['type']])`` -- compact_indexed_matmul."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    launched = kernels_only(monkeypatch)
    g = torch.Generator().manual_seed(3)
    n, e = 10, 40
    src, dst = torch.randint(0, n, (e,), generator=g).to(DEVICE), torch.randint(0, n, (e,), generator=g).to(DEVICE)
    rel = torch.randint(0, TYPES, (e,), generator=g).to(DEVICE)
    graph = gnnfuse.Graph(src, dst, n)

    def message(edges):
        return {"m": torch.bmm(edges.src["h"].unsqueeze(1), W[edges.data["type"]]).squeeze(1)}

    def reduce(nodes):
        return {"h": torch.sum(nodes.mailbox["m"], dim=1)}

    h = torch.randn(n, K, generator=g).to(DEVICE).requires_grad_()
    W = torch.randn(TYPES, K, N, generator=g).to(DEVICE).requires_grad_()
    out = gnnfuse.message_passing(graph, message, reduce, ndata={"h": h}, edata={"type": rel})["h"]
    out.sum().backward()
    h64, w64 = (t.detach().double().requires_grad_() for t in (h, W))
    expected = torch.zeros(n, N, dtype=torch.float64, device=DEVICE).index_add(
        0, dst, torch.einsum("ei,eio->eo", h64[src], w64[rel]))
    expected.sum().backward()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.grad.double(), h64.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(W.grad.double(), w64.grad, rtol=1e-5, atol=1e-4)
    assert set(launched) == {"_segment_matmul", "_segment_matmul_tn"}


@pytest.mark.parametrize("tn", [False, True])
def test_autotuned_configs_fit_narrow_widths(tn):
    """R-GCN's hidden 16: the autotuner is offered 16-wide blocks, and no block wider than
    the dimension it tiles needs (a 32-wide block there took 3.3x as long on an H100)."""
    configs = sm._configs(tn)
    for k, n in ((128, 16), (349, 16), (16, 349), (1, 1), (20, 5)):
        kept = sm.fitting_configs(configs, {"K": k, "N": n})
        assert kept and all(c.kwargs["BLOCK_N"] <= max(16, 1 << (n - 1).bit_length()) for c in kept)
        assert all(c.kwargs["BLOCK_K"] <= max(16, 1 << (k - 1).bit_length()) for c in kept)
    assert any(c.kwargs["BLOCK_N"] == 16 for c in sm.fitting_configs(configs, {"K": 128, "N": 16}))
    assert sm.fitting_configs(configs, {"K": 4096, "N": 4096}) == configs


@pytest.mark.parametrize("tn", [False, True])
def test_every_config_block_shape_computes_the_product(monkeypatch, tn):
    """Each block shape the autotuner may pick gives the product (launched directly with
    that shape: the interpreter does not autotune)."""
    kind, groups = grouped_rows(90, TYPES)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(90, 40, generator=g).to(DEVICE)
    w = torch.randn(TYPES, 40, 24, generator=g).to(DEVICE)
    grad = torch.randn(90, 24, generator=g).to(DEVICE)
    monkeypatch.setattr(sm, "_autotuning", lambda: False)
    for blocks in {(c.kwargs.get("BLOCK_M"), c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in sm._configs(tn)}:
        m, n, k = blocks
        if tn:
            monkeypatch.setattr(sm, "_FIXED_TN", {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k})
            expected = torch.zeros(TYPES, 40, 24, dtype=torch.float64, device=DEVICE).index_add_(
                0, kind, torch.einsum("rk,rn->rkn", x.double(), grad.double()))
            got = sm.segment_matmul_tn(x, grad, groups)
        else:
            monkeypatch.setattr(sm, "_FIXED", {"BLOCK_N": n, "BLOCK_K": k})
            expected = torch.einsum("rk,rkn->rn", x.double(), w.double()[kind])
            got = sm.segment_matmul(x, w, groups)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4, msg=f"blocks {blocks}")
