"""Linear maps that write their rows at the kernels' stride (nn/aligned_linear.py) and the
executor reading such views in place (backend/row_layout.py): exact values and
derivatives, no padded copy, and padding lanes that never reach a result."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gnnfuse
import gnnfuse.ops
from gnnfuse.backend.row_layout import aligned_row_width, has_row_stride
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.frontend.trace_cache import clear_trace_caches
from gnnfuse.nn import aligned_linear as aligned_module
from gnnfuse.nn.aligned_linear import (RowsRead, _AlignedLinear, _BiasAdded, aligned_linear, bias_added,
                                       paired_linear, rows_read)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_row_widths_and_layout_checks():
    assert [aligned_row_width(w) for w in (1, 3, 4, 5, 8, 47, 64)] == [1, 3, 4, 8, 8, 48, 64]
    table = torch.zeros(6, 48)
    assert has_row_stride(table[:, :47], 47, 48)
    assert has_row_stride(table[:, :47].view(6, 1, 47), 47, 48)
    assert has_row_stride(table[:1, :47], 47, 48)
    assert not has_row_stride(torch.zeros(6, 47), 47, 48)         # packed: needs the copy
    assert not has_row_stride(table[:, 1:], 47, 48)               # the last row's padding is past the end
    assert has_row_stride(torch.zeros(6 * 48 + 1)[1:].view(6, 48)[:, :47], 47, 48)
    assert not has_row_stride(torch.zeros(47, 6).t(), 47, 48)     # columns, not rows
    assert not has_row_stride(torch.zeros(6, 96)[:, ::2], 48, 48)


@pytest.mark.parametrize("with_bias,with_read", [(False, False), (True, False), (True, True)])
def test_padded_linear_has_the_layout_and_exact_derivatives(with_bias, with_read):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, generator=gen, requires_grad=True) if with_bias else None
    read = RowsRead.of(torch.tensor([True, False, True, True, False, True, True])) if with_read else None
    out = _AlignedLinear.apply(x, w, b, read, 8)
    assert out.shape == (7, 5) and out.stride() == (8, 1)
    torch.testing.assert_close(out, F.linear(x, w, b))
    if not with_read:
        inputs = (x, w) + ((b,) if with_bias else ())
        fn = (lambda x, w, *b: _AlignedLinear.apply(x, w, b[0] if b else None, None, 8))
        assert torch.autograd.gradcheck(fn, inputs)
        assert torch.autograd.gradgradcheck(fn, inputs)
    else:    # by design not x W^T's derivative: the weight's gradient sums the read rows only
        grad = torch.randn(7, 5, dtype=torch.float64, generator=gen)
        got = torch.autograd.grad(_AlignedLinear.apply(x, w, b, read, 8), w, grad)[0]
        torch.testing.assert_close(got, grad.t() @ rows_read(x.detach(), read))


def test_only_cuda_tables_are_padded():
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    assert aligned_linear(x, w).is_contiguous() == (DEVICE == "cpu" or not x.is_cuda)
    assert aligned_module.kernel_row_stride(x, 5) == 5


def _watch_layouts(monkeypatch) -> tuple[list, list]:
    """Shapes of the leaves the Triton executor padded by a copy, and of those it read in place."""
    copied, in_place = [], []
    real = triton_executor._laid_out

    def watch(tensor, width, stride):
        out = real(tensor, width, stride)
        if stride != width:
            (in_place if out is tensor else copied).append(tuple(tensor.shape))
        return out
    monkeypatch.setattr(triton_executor, "_laid_out", watch)
    return copied, in_place


def _graph() -> gnnfuse.Graph:
    gen = torch.Generator().manual_seed(5)
    src = torch.cat([torch.randint(1, 9, (120,), generator=gen), torch.tensor([3, 2])])
    dst = torch.cat([torch.zeros(120, dtype=torch.long), torch.tensor([3, 4])])
    return gnnfuse.Graph(src, dst, 10).to(DEVICE)


def _on_both_backends(layer, x: torch.Tensor, graph: gnnfuse.Graph, monkeypatch) -> list[list[torch.Tensor]]:
    """[output, input gradient, parameter gradients...] of one weighted-sum backward on the
    Triton backend, then on the reference backend."""
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        clear_trace_caches()
        layer.zero_grad()
        xs = x.clone().requires_grad_()
        out = layer(xs, graph)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum().backward()
        results.append([out.detach(), xs.grad] + [p.grad.clone() for p in layer.parameters()])
    return results


@pytest.mark.parametrize("layer_name,width", [("GCNConv", 5), ("GCNConv", 47), ("GATConv", 7), ("SAGEConv", 5)])
def test_layers_hand_padded_tables_to_the_kernels_without_a_copy(layer_name, width, monkeypatch):
    """With the kernels' stride forced (as on CUDA), GCN's, GAT's and (combine-first)
    SAGE's linear map writes a padded table whose view the Triton executor reads in
    place, forward and backward,
    and both match the reference backend in float64."""
    monkeypatch.setattr(aligned_module, "kernel_row_stride", lambda x, w: aligned_row_width(w))
    copied, in_place = _watch_layouts(monkeypatch)
    graph = _graph()
    in_width = max(6, width + 3)     # narrowing, so GCN and SAGE map first (a widening GCN aggregates first)
    x = torch.randn(graph.num_nodes, in_width, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    layer = getattr(gnnfuse.nn, layer_name)(in_width, width).double().to(DEVICE)
    results = _on_both_backends(layer, x, graph, monkeypatch)
    assert in_place, "no kernel read the layer's padded table in place"
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("heads, width, concat", [(1, 47, False), (1, 7, True), (3, 5, True)])
def test_gat_gets_its_output_gradient_padded_without_a_copy(heads, width, concat, monkeypatch):
    """With the kernels' stride forced (as on CUDA), neither GAT's linear output nor the
    gradient of its compiled output is padded by a copy in the executor (`flat_heads`
    writes the gradient padded), and the layer matches the reference backend and PyG."""
    monkeypatch.setattr(aligned_module, "kernel_row_stride", lambda x, w: aligned_row_width(w))
    copied, in_place = _watch_layouts(monkeypatch)
    graph = _graph()
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    layer = gnnfuse.nn.GATConv(6, width, heads=heads, concat=concat).double().to(DEVICE)
    results = _on_both_backends(layer, x, graph, monkeypatch)
    assert in_place and not copied, f"padded by a copy: {copied}"
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    theirs = pyg_nn.GATConv(6, width, heads=heads, concat=concat).double().to(DEVICE)
    theirs.load_state_dict(layer.state_dict())
    xs = x.clone().requires_grad_()
    expected = theirs(xs, torch.stack([graph.src, graph.dst]).long())
    (expected * torch.linspace(-1, 1, expected.numel(), dtype=expected.dtype, device=expected.device)
     .view_as(expected)).sum().backward()
    torch.testing.assert_close(results[1][0], expected.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(results[1][1], xs.grad, rtol=1e-9, atol=1e-12)


def test_garbage_in_a_views_padding_lanes_never_reaches_a_result(monkeypatch):
    """The executor reads any view with the kernels' row stride in place -- a user's
    slice of a wider table too -- so the lanes past the width may hold anything: NaN
    there must not reach the output or the gradient."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    _, in_place = _watch_layouts(monkeypatch)
    graph = _graph()
    base = torch.full((graph.num_nodes, 8), float("nan"), dtype=torch.float64, device=DEVICE)
    base[:, :5] = torch.randn(graph.num_nodes, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    view = base[:, :5].requires_grad_()
    out = gnnfuse.ops.gspmm(graph, lambda xs: xs * 2.0, "sum", src=view)
    out.sum().backward()
    packed = base[:, :5].detach().clone().requires_grad_()
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    want = gnnfuse.ops.gspmm(graph, lambda xs: xs * 2.0, "sum", src=packed)
    want.sum().backward()
    assert in_place, "the view was copied, not read in place"
    assert torch.isfinite(out).all() and torch.isfinite(view.grad).all()
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(view.grad, packed.grad, rtol=1e-12, atol=1e-12)


def test_rows_read_zeroes_the_unread_rows_by_index():
    """The same zeros as a mask over every row, NaN in an unread row kept out, a NaN in a
    read row kept; the gradient passes the read rows only; all rows read is None."""
    mask = torch.tensor([True, False, True, False, True])
    read = RowsRead.of(mask)
    assert torch.equal(read.unread, torch.tensor([1, 3]))
    x = torch.randn(5, 3, dtype=torch.float64)
    x[1, 0], x[2, 1] = float("nan"), float("inf")
    x.requires_grad_()
    got = rows_read(x, read)
    torch.testing.assert_close(got, x.masked_fill(~mask.unsqueeze(-1), 0.0), equal_nan=True)
    assert not got[1].isnan().any() and got[2, 1] == float("inf")
    got.sum().backward()
    assert torch.equal(x.grad, mask.unsqueeze(-1).expand(5, 3).double())
    assert RowsRead.of(torch.ones(4, dtype=torch.bool)) is None


@pytest.mark.parametrize("hops", [0, 1, 2])
def test_a_new_graphs_walk_starts_read_back_one_count(hops):
    """The rows a combine-first layer (SAGE's ``lin_l``, SGConv) reads, built for every new
    graph: over one hop one read-back (the unread rows' ids), where a boolean mask of the
    edges and an ``all()`` were two more; the same rows as walking the hops by masks."""
    from gnnfuse.bench.host_syncs import HostSyncCounter
    from gnnfuse.nn.conv import _walk_starts
    src, dst = torch.tensor([0, 1, 2, 2, 5, 1]), torch.tensor([1, 2, 1, 3, 2, 0])
    graph = gnnfuse.Graph(src, dst, 7)
    with HostSyncCounter() as counter:
        read = _walk_starts(graph, hops)
    assert sum(counter.syncs.values()) == hops, dict(counter.syncs)    # a later hop picks its sources by a mask
    starts = torch.ones(7, dtype=torch.bool)
    for _ in range(hops):
        reached, starts = starts, torch.zeros(7, dtype=torch.bool)
        starts[src[reached[dst]]] = True
    if bool(starts.all()):
        assert read is None
    else:
        assert torch.equal(read.mask, starts) and torch.equal(read.unread, (~starts).nonzero().squeeze(1))
    with HostSyncCounter() as counter:
        every, some = RowsRead.of(torch.ones(3, dtype=torch.bool)), RowsRead.of(torch.tensor([True, False]))
    assert sum(counter.syncs.values()) == 2, dict(counter.syncs)
    assert every is None and torch.equal(some.unread, torch.tensor([1]))


def test_padding_lanes_of_a_copied_leaf_never_reach_a_result(monkeypatch):
    """The executor's padded copy of an unaligned leaf (here GCN's plain [N, 47] output
    gradient) leaves its padding lanes unwritten: with NaN there, the layer still matches
    the reference backend."""
    monkeypatch.setattr(aligned_module, "kernel_row_stride", lambda x, w: aligned_row_width(w))
    real, poisoned = triton_executor._laid_out, []

    def poison(tensor, width, stride):
        out = real(tensor, width, stride)
        if out is not tensor and stride != width:
            out.reshape(out.shape[0], stride)[:, width:] = float("nan")
            poisoned.append(tuple(tensor.shape))
        return out
    monkeypatch.setattr(triton_executor, "_laid_out", poison)
    graph = _graph()
    x = torch.randn(graph.num_nodes, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    layer = gnnfuse.nn.GCNConv(50, 47).double().to(DEVICE)
    results = _on_both_backends(layer, x, graph, monkeypatch)
    assert poisoned, "no leaf was padded by a copy"
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_bias_added_sums_its_gradient_as_column_sums():
    """`bias_added`'s Function (used on CUDA) has torch's values and derivatives, first and
    second, in float64; elsewhere, and for a bias that broadcasts otherwise, it is ``out + bias``."""
    out = torch.randn(7, 3, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_BiasAdded.apply, (out, bias))
    assert torch.autograd.gradgradcheck(_BiasAdded.apply, (out, bias))
    torch.testing.assert_close(bias_added(out, bias), out + bias)
    column = torch.randn(4, dtype=torch.float64, requires_grad=True)     # [C] over [N, 3, 4]: plain broadcast
    torch.testing.assert_close(bias_added(out, column), out + column)
    assert bias_added(out, None) is out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Function runs on CUDA tensors")
def test_bias_added_runs_its_function_on_cuda_from_its_row_bound(monkeypatch):
    """From `GEMV_BIAS_FROM_ROWS` rows; below it (a molecule batch) autograd's own add,
    whose Python-free backward costs the host less than the sum it would save."""
    out = torch.randn(9, 5, device="cuda", requires_grad=True)
    bias = torch.randn(5, device="cuda", requires_grad=True)
    assert type(bias_added(out, bias).grad_fn).__name__ == "AddBackward0"
    monkeypatch.setattr(aligned_module, "GEMV_BIAS_FROM_ROWS", 9)
    result = bias_added(out, bias)
    assert type(result.grad_fn).__name__ == "_BiasAddedBackward"
    result.sum().backward()
    torch.testing.assert_close(bias.grad, torch.full_like(bias, 9.0))


@pytest.mark.parametrize("wanted", ["both", "first", "second"])
def test_paired_linear_has_the_two_maps_values_and_derivatives(wanted):
    """`paired_linear` gives `aligned_linear`'s two maps (the first's weight gradient over
    the rows read only) with first and second derivatives in float64, also when only one
    of its outputs reaches the loss."""
    torch.manual_seed(3)
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    wa, wb = (torch.randn(w, 4, dtype=torch.float64, requires_grad=True) for w in (3, 5))
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    read = RowsRead.of(torch.tensor([True, False, True, True, False, True]))
    a, b = paired_linear(x, wa, read, wb, bias)
    torch.testing.assert_close(a, aligned_linear(x, wa, read=read))
    torch.testing.assert_close(b, aligned_linear(x, wb, bias))
    pick = {"both": lambda a, b: (a.sum() + (b * b).sum()), "first": lambda a, b: (a * a).sum(),
            "second": lambda a, b: (b * b).sum()}[wanted]
    loss = lambda *args: pick(*paired_linear(args[0], args[1], read, args[2], args[3]))
    expected = lambda *args: pick(aligned_linear(args[0], args[1], read=read), aligned_linear(args[0], args[2], args[3]))
    got = torch.autograd.grad(loss(x, wa, wb, bias), (x, wa, wb, bias), allow_unused=True, materialize_grads=True)
    want = torch.autograd.grad(expected(x, wa, wb, bias), (x, wa, wb, bias), allow_unused=True,
                               materialize_grads=True)
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradgradcheck(lambda *args: paired_linear(args[0], args[1], read, args[2], args[3]),
                                        (x, wa, wb, bias))


def _unread_rows_case(device):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 6, dtype=torch.float64, generator=gen)
    mask = torch.tensor([True, False, True, True, False, True, True, False, True])
    x[1, 2], x[4, 0], x[7] = float("nan"), float("inf"), float("-inf")   # non-finite, in unread rows only
    grad = torch.randn(9, 5, dtype=torch.float64, generator=gen) * mask.unsqueeze(1)
    return x.to(device), grad.to(device), RowsRead.of(mask.to(device))


def test_product_with_rows_zeroed_in_place_restores_x_and_its_version():
    x, grad, read = _unread_rows_case("cpu")
    base = x.clone().requires_grad_()
    held = base * base          # saves base: autograd checks its version in the backward
    table = base.detach()       # shares base's storage and version counter
    before, version = table.clone(), table._version
    with torch.no_grad():
        got = aligned_module.product_with_rows_zeroed(grad, table, read)
    expected = grad.t() @ rows_read(before, read)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert torch.equal(table.view(torch.int64), before.view(torch.int64))    # bit for bit, NaN included
    assert table._version == version
    held.sum().backward()       # would raise had the in-place zeroing shown in the version
    torch.testing.assert_close(base.grad, 2 * before, equal_nan=True)


@pytest.mark.parametrize("made_by_autograd", [False, True], ids=["user-table", "hidden-input"])
def test_weight_gradient_on_the_device_keeps_nonfinite_unread_rows_out(made_by_autograd, monkeypatch):
    """On CUDA the unread rows of an input autograd made (a hidden layer's) are zeroed in
    the saved input itself (the product path); a user's table, a host tensor, or a backward
    that is itself differentiated get a copy. Either way the weight's gradient is finite and
    the input is as it was."""
    x, grad, read = _unread_rows_case(DEVICE)
    before = x.clone()
    in_place = []
    real = aligned_module.product_with_rows_zeroed
    monkeypatch.setattr(aligned_module, "product_with_rows_zeroed", lambda *a: in_place.append(1) or real(*a))
    for create_graph in (False, True):
        leaf = x.clone().requires_grad_(made_by_autograd)
        x_in = leaf * 1.0 if made_by_autograd else leaf
        w = torch.randn(5, 6, dtype=torch.float64, device=DEVICE, requires_grad=True)
        out = _AlignedLinear.apply(x_in, w, None, read, 5)
        got = torch.autograd.grad(out, w, grad, create_graph=create_graph)[0]
        torch.testing.assert_close(got, grad.t() @ rows_read(before, read), rtol=0, atol=0)
        assert torch.equal(x_in.detach().view(torch.int64), before.view(torch.int64))
    assert in_place == ([1] if made_by_autograd and x.is_cuda else [])
    with torch.no_grad():
        plain = aligned_module.weight_gradient(grad, x, None)
        assert torch.isnan(plain).any()        # what the read rows guard against
        assert torch.isfinite(aligned_module.weight_gradient(grad, x, read)).all()


@pytest.mark.parametrize("paired", [False, True])
def test_maps_made_under_autocast_differentiate_outside_it(paired):
    """Under torch.autocast the forward's F.linear multiplies in bfloat16 but saves the
    float32 operands; the backward, run after the block as training runs it, multiplied
    the bfloat16 gradient by the float32 weight ("expected m1 and m2 to have the same
    dtype": SAGEConv(6, 3) under autocast could not train). Gradients are eager
    autocast's, in the inputs' dtypes."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 6, generator=gen).to(DEVICE)      # a CPU generator draws on the CPU
    w, v, b = (torch.randn(*shape, generator=gen).to(DEVICE) for shape in ((3, 6), (3, 6), (3,)))
    mask = torch.tensor([True] * 5 + [False] * 2, device=DEVICE)
    read = RowsRead.of(mask)      # as a propagation reads them: no gradient reaches the unread rows

    def grads(linear):
        leaves = [t.clone().requires_grad_() for t in (x, w, v, b)]
        with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16):
            outs = linear(*leaves)
        assert all(o.dtype == torch.bfloat16 for o in outs)
        projections = [torch.linspace(-1, 1, o.numel(), device=DEVICE).view_as(o) * mask[:, None] for o in outs]
        sum((o.float() * p).sum() for o, p in zip(outs, projections)).backward()
        return [t.grad for t in leaves]

    if paired:
        ours = grads(lambda x, w, v, b: paired_linear(x, w, read, v, b))
        eager = grads(lambda x, w, v, b: (F.linear(x, w), F.linear(x, v, b)))
    else:
        ours = grads(lambda x, w, v, b: (aligned_linear(x, w, b, read=read),))
        eager = grads(lambda x, w, v, b: (F.linear(x, w, b),))
    for got, want in zip(ours, eager):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == want.dtype == torch.float32
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
