"""Tables a layer remakes in its backward instead of keeping (`gnnfuse.nn.recompute`):
GAT's ``h = lin(x)`` and folded logits are freed after the forward, remade once in the
backward with the same values and gradients as PyG's layer, and a recipe whose input
changed in place refuses instead of remaking a different table."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import gnnfuse
from gnnfuse.nn import conv as conv_module
from gnnfuse.nn import recompute
from gnnfuse.nn.recompute import Remake, remade_when_saved

pyg_nn = pytest.importorskip("torch_geometric.nn")


def _graph(device: str) -> gnnfuse.Graph:
    gen = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, 12, (40,), generator=gen), torch.randint(0, 12, (40,), generator=gen)
    return gnnfuse.Graph(src, dst, 12).to(device)


def _watch_linear_outputs(monkeypatch) -> list:
    """Weak references to every table GAT's `aligned_linear` returns (their count counts
    the calls); tables of any size are remade."""
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    made = []
    real = conv_module.aligned_linear

    def watched(*args, **kwargs):
        out = real(*args, **kwargs)
        made.append(weakref.ref(out))
        return out
    monkeypatch.setattr(conv_module, "aligned_linear", watched)
    return made


@pytest.mark.parametrize("heads, out_channels, concat", [(3, 4, True), (1, 5, False)])
@pytest.mark.parametrize("input_grad", [False, True])
def test_gat_keeps_no_linear_output_and_matches_pyg(heads, out_channels, concat, input_grad, backend, device,
                                                    monkeypatch):
    """The table is freed after the forward and remade once in the backward, whether or
    not the input needs a gradient; values and every gradient equal PyG's."""
    made = _watch_linear_outputs(monkeypatch)
    graph = _graph(device)
    torch.manual_seed(0)
    ours = gnnfuse.nn.GATConv(6, out_channels, heads=heads, concat=concat).double().to(device)
    theirs = pyg_nn.GATConv(6, out_channels, heads=heads, concat=concat).double().to(device)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(12, 6, dtype=torch.float64, device=device)
    x_ours, x_theirs = x.clone().requires_grad_(input_grad), x.clone().requires_grad_(input_grad)

    out = ours(x_ours, graph)
    gc.collect()
    assert len(made) == 1 and made[0]() is None, "the linear map's output outlived the forward"
    weights = torch.randn(out.shape, dtype=torch.float64, device=device)
    (out * weights).sum().backward()
    assert len(made) == 2, "the backward did not remake the table exactly once"

    expected = theirs(x_theirs, torch.stack([graph.src, graph.dst]).long())
    (expected * weights).sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    if input_grad:
        torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-10, atol=1e-12)
    for name, param in theirs.named_parameters():
        torch.testing.assert_close(dict(ours.named_parameters())[name].grad, param.grad, rtol=1e-10, atol=1e-12,
                                   msg=name)


def test_results_made_together_are_made_once():
    calls = []
    first, second = recompute.made_together(lambda: calls.append(1) or (torch.ones(2), torch.zeros(2)), 2)
    assert torch.equal(second(), torch.zeros(2)) and torch.equal(first(), torch.ones(2)) and len(calls) == 1
    assert torch.equal(first(), torch.ones(2)) and len(calls) == 2      # taken already: made again


def test_gat_keeps_its_table_when_lin_needs_no_gradient(monkeypatch):
    """A frozen ``lin`` keeps no ``x`` of its own, so the table is kept as before."""
    made = _watch_linear_outputs(monkeypatch)
    layer = gnnfuse.nn.GATConv(6, 4, heads=2).double()
    layer.lin.weight.requires_grad_(False)
    out = layer(torch.randn(12, 6, dtype=torch.float64), _graph("cpu"))   # no input gradient: a first layer
    gc.collect()
    assert made[0]() is not None
    out.sum().backward()
    assert len(made) == 1


def test_small_tables_are_kept(monkeypatch):
    """Under `MIN_BYTES` the table is kept (no hooks on the host path of small graphs)."""
    made = _watch_linear_outputs(monkeypatch)
    monkeypatch.setattr(recompute, "MIN_BYTES", 12 * 2 * 4 * 8 + 1)    # one byte more than h's
    layer = gnnfuse.nn.GATConv(6, 4, heads=2).double()
    out = layer(torch.randn(12, 6, dtype=torch.float64), _graph("cpu"))
    gc.collect()
    assert made[0]() is not None
    out.sum().backward()
    assert len(made) == 1


def test_an_input_changed_in_place_refuses_the_remake():
    x = torch.randn(5, 3, dtype=torch.float64)
    table = (x * 2.0).requires_grad_()
    with remade_when_saved([Remake(table, lambda: x * 2.0, (x,))]):
        out = table.exp()          # exp saves its output, another storage: kept as it is
        product = table * table.detach()   # mul saves the detached view of `table`: packed as its recipe
    x.add_(1.0)
    out.sum().backward()           # nothing remade
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        product.sum().backward()


def test_a_remade_view_is_the_saved_view():
    """A saved view into a wider storage (the padded layout on CUDA) comes back as the
    same view of the remade storage."""
    base = torch.randn(6, 8, dtype=torch.float64)
    weight = torch.randn(3, dtype=torch.float64, requires_grad=True)
    view = base[:, :7].reshape(6, 1, 7)
    with remade_when_saved([Remake(view, lambda: base.clone(), (base,))]):
        out = (view[:, :, :3] * weight).sum()
    out.backward()
    torch.testing.assert_close(weight.grad, base[:, :3].sum(0))


def _autocast_gat_gradients(monkeypatch, min_bytes: int) -> list[torch.Tensor]:
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    monkeypatch.setattr(recompute, "MIN_BYTES", min_bytes)
    torch.manual_seed(0)
    layer = gnnfuse.nn.GATConv(6, 4, heads=2)
    x = torch.randn(12, 6, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x, _graph("cpu"))
    out.float().pow(2).sum().backward()     # outside the autocast block, as a training step's backward runs
    return [x.grad, *(p.grad for p in layer.parameters())]


def test_a_table_made_under_autocast_is_remade_under_it(monkeypatch):
    """The forward's table is bfloat16; remade outside the autocast block it came back
    float32, and the input's gradient was 20.289 where the kept table gives 20.338."""
    kept = _autocast_gat_gradients(monkeypatch, 1 << 40)
    remade = _autocast_gat_gradients(monkeypatch, 0)
    for a, b in zip(remade, kept):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_remade_table_of_another_dtype_is_refused():
    x = torch.randn(5, 3)
    table = x.double().requires_grad_()
    with remade_when_saved([Remake(table, lambda: x.clone(), (x,))]):
        product = table * table.detach()
    with pytest.raises(RuntimeError, match="torch.float32 where the forward's was torch.float64"):
        product.sum().backward()


def test_remade_logits_use_the_weights_of_the_forward(monkeypatch):
    """``torch.func.functional_call`` runs the forward on the parameters it is given and
    puts the module's own back before the backward. The folded logits were remade from
    ``lin.weight`` read in the backward, the module's own weight: the input's gradient was
    2500 off PyG's and the given weight's 4888 off, silently."""
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    graph = _graph("cpu")
    torch.manual_seed(0)
    ours = gnnfuse.nn.GATConv(6, 4, heads=2).double()
    theirs = pyg_nn.GATConv(6, 4, heads=2).double()
    given = {name: torch.randn_like(p).requires_grad_() for name, p in ours.named_parameters()}
    given_theirs = {name: p.detach().clone().requires_grad_() for name, p in given.items()}
    x = torch.randn(12, 6, dtype=torch.float64)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = torch.func.functional_call(ours, given, (x_ours, graph))
    expected = torch.func.functional_call(theirs, given_theirs, (x_theirs, torch.stack([graph.src, graph.dst])))
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    weights = torch.randn(out.shape, dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), [x_ours, *given.values()])
    expected_grads = torch.autograd.grad((expected * weights).sum(), [x_theirs, *given_theirs.values()])
    for name, a, b in zip(["x", *given], grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_logits_kept_unfolded_are_remade_unfolded(monkeypatch):
    """On a small graph's first pass GAT computes its logits as ``(lin(x) * att).sum(-1)``
    (`_folds` is False there), but the remake asked `_folds` without the graph and remade
    them by the folded GEMM: the same sums reassociated, so the backward read logits
    other than the forward's (float32 gradients up to 4.3e-6 off those of the kept
    tables). A remade table must be the forward's own, bit for bit."""
    monkeypatch.setattr(conv_module, "on_first_pass", lambda graph: graph is not None)

    def gradients(min_bytes: int) -> list[torch.Tensor]:
        monkeypatch.setattr(recompute, "MIN_BYTES", min_bytes)
        torch.manual_seed(0)
        layer = gnnfuse.nn.GATConv(6, 4, heads=2)
        gen = torch.Generator().manual_seed(3)
        src, dst = torch.randint(0, 40, (2, 200), generator=gen)
        graph = gnnfuse.Graph(src, dst, 40)
        x = torch.randn(40, 6, generator=gen).requires_grad_()
        out = layer(x, graph)
        (out * torch.randn(out.shape, generator=gen)).sum().backward()
        return [x.grad, *(p.grad for p in layer.parameters())]

    for kept, remade in zip(gradients(1 << 40), gradients(0)):
        torch.testing.assert_close(remade, kept, rtol=0, atol=0)
