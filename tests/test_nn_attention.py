"""Attention and edge-MLP layers against outside oracles: PyG where it has the layer
(same state dict), otherwise plain PyTorch written independently with gathers,
index_add and dense pair tables. float64 outputs and gradients (input and every
parameter), with a gnnfuse Graph and with a PyG edge_index, on the reference backend and
on generated kernels (Triton's interpreter without a GPU)."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg
from torch import nn
from torch_geometric.utils import add_self_loops, remove_self_loops
from torch_geometric.utils import softmax as pyg_softmax

import gnnfuse
from gnnfuse import nn as gnn
from first_pass_check import DEVICE as FIRST_PASS_DEVICE, triton_by_default
from layer_check import assert_same_outputs_and_grads, rel_err
from oracle_check import device_for

N, F_IN = 20, 6


# --- plain-PyTorch oracles (no gnnfuse, no PyG message passing) --------------------------
def _loops(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    return add_self_loops(remove_self_loops(edge_index)[0], num_nodes=n)[0]


def _heads_out(out, concat, bias):
    out = out.reshape(out.shape[0], -1) if concat else out.mean(1)
    return out if bias is None else out + bias


class Oracle(nn.Module):
    """A plain-PyTorch forward of ``layer`` (its own copy: see `_oracle_pair`)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def projected(self, x, edge_index):
        """(src, dst, z) of a multi-head attention layer: the edges, with its self loops
        if it adds them, and ``x`` through its linear map as [N, heads, channels]."""
        m, n = self.layer, x.shape[0]
        src, dst = _loops(edge_index, n) if m.add_self_loops else edge_index
        return src, dst, (x @ m.lin.weight.t()).view(n, m.heads, m.out_channels)


class CGATOracle(Oracle):
    """Graphiler's C-GAT reduce, literally: every pair of a vertex's in-edges."""

    def forward(self, x, edge_index):
        m, n = self.layer, x.shape[0]
        src, dst, z = self.projected(x, edge_index)
        # per-vertex logits, then per edge, as PyG's GATConv (whose layout C-GAT takes) does
        e = F.leaky_relu((z * m.att_src).sum(-1)[src] + (z * m.att_dst).sum(-1)[dst], m.negative_slope)
        j, i = (dst.unsqueeze(1) == dst.unsqueeze(0)).nonzero(as_tuple=True)   # all pairs at one vertex
        w = torch.zeros_like(e).index_add(0, j, torch.relu(e[j] - e[i]))
        out = torch.zeros(n, m.heads, m.out_channels, dtype=x.dtype, device=x.device).index_add(
            0, dst, w.unsqueeze(-1) * z[src])
        return _heads_out(out, m.concat, m.bias)


class DotGATOracle(Oracle):
    """Dot-product attention per edge, softmax over each vertex's in-edges."""

    def forward(self, x, edge_index):
        m, n = self.layer, x.shape[0]
        src, dst, z = self.projected(x, edge_index)
        alpha = pyg_softmax((z[src] * z[dst]).sum(-1) / math.sqrt(m.out_channels), dst, num_nodes=n)
        out = torch.zeros_like(z).index_add(0, dst, alpha.unsqueeze(-1) * z[src])
        return _heads_out(out, m.concat, m.bias)


class MLPAggOracle(Oracle):
    """FeatGraph's MLP aggregation: max over in-edges of relu(lin(x_u + x_v))."""

    def forward(self, x, edge_index):
        src, dst = edge_index
        msg = self.layer.lin(x[src] + x[dst]).relu()
        return torch.zeros(x.shape[0], msg.shape[1], dtype=x.dtype, device=x.device).index_reduce(
            0, dst, msg, "amax", include_self=False)


class NGCFOracle(Oracle):
    """NGCF eq. 3-7 per edge, messages materialized: m = p (W1 x_u + W2 (x_u * x_v))."""

    def forward(self, x, edge_index):
        m = self.layer
        src, dst = edge_index
        deg = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device).index_add(
            0, dst, torch.ones(len(dst), dtype=x.dtype, device=x.device))
        inv_sqrt = deg.rsqrt().masked_fill(deg == 0, 0.0)        # gcn_norm's 0 for in-degree 0
        p = (inv_sqrt[src] * inv_sqrt[dst]).unsqueeze(-1)
        msg = p * (m.lin1(x[src]) + m.lin2(x[src] * x[dst]))
        out = m.lin1(x) + torch.zeros(x.shape[0], m.out_channels, dtype=x.dtype, device=x.device).index_add(
            0, dst, msg)
        return F.leaky_relu(out + m.bias, m.negative_slope)


def _mlp(in_channels: int) -> nn.Module:
    return nn.Sequential(nn.Linear(2 * in_channels, 5), nn.ReLU(), nn.Linear(5, 4))


def _oracle_pair(ours: nn.Module, make_oracle):
    """Oracle holding its own deep copy of the layer, so parameter gradients are separate."""
    return ours, make_oracle(copy.deepcopy(ours))


LAYERS = {
    "gatv2": lambda: (gnn.GATv2Conv(F_IN, 4, heads=3), pyg.GATv2Conv(F_IN, 4, heads=3)),
    "gatv2-mean-heads-shared": lambda: (
        gnn.GATv2Conv(F_IN, 4, heads=2, concat=False, share_weights=True, negative_slope=0.1),
        pyg.GATv2Conv(F_IN, 4, heads=2, concat=False, share_weights=True, negative_slope=0.1)),
    "gatv2-no-loops-no-bias": lambda: (gnn.GATv2Conv(F_IN, 4, add_self_loops=False, bias=False),
                                       pyg.GATv2Conv(F_IN, 4, add_self_loops=False, bias=False)),
    "edgeconv-max": lambda: (lambda net: (gnn.EdgeConv(net), pyg.EdgeConv(net)))(_mlp(F_IN)),
    "edgeconv-mean": lambda: (lambda net: (gnn.EdgeConv(net, aggr="mean"), pyg.EdgeConv(net, aggr="mean")))(
        _mlp(F_IN)),
    "edgeconv-add": lambda: (lambda net: (gnn.EdgeConv(net, aggr="add"), pyg.EdgeConv(net, aggr="add")))(
        _mlp(F_IN)),
    "cgat": lambda: _oracle_pair(gnn.CGATConv(F_IN, 4, heads=2), CGATOracle),
    "cgat-mean-heads-no-loops": lambda: _oracle_pair(
        gnn.CGATConv(F_IN, 4, heads=2, concat=False, add_self_loops=False), CGATOracle),
    "dotgat": lambda: _oracle_pair(gnn.DotGATConv(F_IN, 4, heads=2), DotGATOracle),
    "dotgat-no-loops": lambda: _oracle_pair(gnn.DotGATConv(F_IN, 4, add_self_loops=False, concat=False),
                                            DotGATOracle),
    "mlp-agg": lambda: _oracle_pair(gnn.MLPAggConv(F_IN, 5), MLPAggOracle),
    "ngcf": lambda: _oracle_pair(gnn.NGCFConv(F_IN, 5), NGCFOracle),
    "gat-dropout-eval": lambda: (gnn.GATConv(F_IN, 4, heads=2, dropout=0.5), pyg.GATConv(F_IN, 4, heads=2,
                                                                                        dropout=0.5)),
    # in_features > 4 x heads x channels: the logits as (lin(x) * att).sum(-1), not folded into one GEMM
    "gat-logits-unfolded": lambda: (gnn.GATConv(F_IN, 1), pyg.GATConv(F_IN, 1)),
}


def _graph_edges(seed: int = 0) -> torch.Tensor:
    """A random multigraph (duplicate edges, self loops) whose last three vertices are isolated."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, N - 3, (2, 70), generator=gen)


# Every variant on the reference backend with both graph inputs; on generated kernels
# (slow under Triton's interpreter) one variant per layer covering its kernel -- empty
# rows included -- with a Graph, and two with an edge_index (the conversion is shared).
CASES = ([("reference", True, name) for name in LAYERS] + [("reference", False, name) for name in LAYERS]
         + [("triton", True, name) for name in ("gatv2", "gatv2-no-loops-no-bias", "cgat", "dotgat-no-loops",
                                                "edgeconv-max", "edgeconv-mean", "mlp-agg", "ngcf",
                                                "gat-dropout-eval")]
         + [("triton", False, name) for name in ("gatv2", "cgat")])


@pytest.mark.parametrize("backend, as_graph, name", CASES,
                         ids=[f"{b}-{'Graph' if g else 'edge_index'}-{n}" for b, g, n in CASES])
def test_layer_matches_oracle(backend, as_graph, name, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    torch.manual_seed(0)
    device = device_for(backend)
    ours, ref = (m.double().to(device) for m in LAYERS[name]())
    if isinstance(ref, (pyg.GATv2Conv, pyg.GATConv)):
        ours.load_state_dict(ref.state_dict())
        for p in ref.parameters():                 # PyG zero-initializes the bias: exercise it
            if p.dim() == 1:
                nn.init.normal_(p)
        ours.load_state_dict(ref.state_dict())
    elif isinstance(ref, pyg.EdgeConv):            # one nn shared by both: give ours a copy
        ours.nn = copy.deepcopy(ref.nn)
    else:
        for p in ours.parameters():
            if p.dim() == 1:
                nn.init.normal_(p)
        ref.layer.load_state_dict(ours.state_dict())
    ours.eval(), ref.eval()
    edge_index = _graph_edges().to(device)
    x = torch.randn(N, F_IN, dtype=torch.float64).to(device)
    graph = gnnfuse.Graph.from_edge_index(edge_index, num_nodes=N) if as_graph else edge_index
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, graph), lambda xs: ref(xs, edge_index), x,
                                  ref_prefix="layer." if isinstance(ref, Oracle) else "")


def test_isolated_vertices_get_bias_only():
    """Isolated vertices (no loops added) see no messages: output is exactly the bias."""
    torch.manual_seed(1)
    edge_index = _graph_edges()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    for layer in (gnn.GATv2Conv(F_IN, 4, add_self_loops=False), gnn.DotGATConv(F_IN, 4, add_self_loops=False),
                  gnn.CGATConv(F_IN, 4, add_self_loops=False)):
        layer = layer.double()
        nn.init.normal_(layer.bias)
        out = layer(x, edge_index)
        assert torch.equal(out[-3:], layer.bias.expand(3, -1)), type(layer).__name__
        assert torch.isfinite(out).all()


def test_softmax_is_stable_for_large_scores():
    """Scores in the thousands would overflow a bare exp; the max shift keeps them finite."""
    edge_index = _graph_edges()
    x = 1e3 * torch.randn(N, F_IN, dtype=torch.float64)
    ours, ref = _oracle_pair(gnn.DotGATConv(F_IN, 4).double(), DotGATOracle)
    out = ours(x, edge_index)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref(x, edge_index)) < 1e-9


def test_gradcheck_gatv2():
    torch.manual_seed(2)
    edge_index = torch.randint(0, 8, (2, 20))
    layer = gnn.GATv2Conv(3, 2, heads=2).double()
    nn.init.normal_(layer.bias)
    x = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    graph = gnnfuse.Graph.from_edge_index(edge_index, num_nodes=10)
    params = (x, layer.lin_l.weight, layer.lin_r.bias, layer.att)
    assert torch.autograd.gradcheck(lambda x, *_: layer(x, graph), params)


def test_gradcheck_cgat():
    torch.manual_seed(3)
    edge_index = torch.randint(0, 8, (2, 20))
    layer = gnn.CGATConv(3, 2, heads=2).double()
    x = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    params = (x, layer.lin.weight, layer.att_src, layer.att_dst)
    assert torch.autograd.gradcheck(lambda x, *_: layer(x, edge_index), params)


# --- attention dropout ----------------------------------------------------------------
DROPOUT_LAYERS = {"GATConv": lambda p: gnn.GATConv(F_IN, 4, heads=2, dropout=p),
                  "GATv2Conv": lambda p: gnn.GATv2Conv(F_IN, 4, heads=2, dropout=p)}


@pytest.mark.parametrize("make", DROPOUT_LAYERS.values(), ids=DROPOUT_LAYERS.keys())
def test_attention_dropout_in_training(make):
    """Training mode with p > 0: the output is random (differs across seeds, and from the
    eval output) but follows torch's RNG, and inverted dropout keeps its mean: averaged
    over many draws it approaches the eval output. With p close to 1 nearly every
    coefficient is dropped, so most vertices see only the bias. (Parameters frozen, so
    no backward is built: see `test_attention_dropout_gradient`.)"""
    torch.manual_seed(4)
    edge_index = _graph_edges()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    layer = make(0.5).double().requires_grad_(False)
    nn.init.normal_(layer.bias)
    expected = layer.eval()(x, edge_index)
    layer.train()
    torch.manual_seed(5)
    a = layer(x, edge_index)
    torch.manual_seed(6)
    b = layer(x, edge_index)
    assert not torch.allclose(a, b) and not torch.allclose(a, expected)
    torch.manual_seed(5)
    assert torch.equal(layer(x, edge_index), a)
    draws = 100
    torch.manual_seed(7)
    mean = sum(layer(x, edge_index) for _ in range(draws)) / draws
    spread = rel_err(a, expected)
    assert spread > 0.1                                  # one draw is materially off ...
    assert rel_err(mean, expected) < 3 * spread / math.sqrt(draws)   # ... the mean's error shrinks

    layer = make(0.999).double().requires_grad_(False).train()
    nn.init.normal_(layer.bias)
    torch.manual_seed(8)
    out = layer(x, edge_index)
    only_bias = (out == layer.bias).all(dim=1)
    assert only_bias.float().mean() > 0.7


@pytest.mark.parametrize("make", DROPOUT_LAYERS.values(), ids=DROPOUT_LAYERS.keys())
def test_attention_dropout_gradient(make):
    """With the RNG reseeded before each forward the mask is fixed, so the analytic
    directional derivative must match central differences -- which fails if backward
    drew a fresh mask instead of reusing the forward's."""
    torch.manual_seed(9)
    edge_index = _graph_edges()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    layer = make(0.5).double().train()

    def f(x):
        torch.manual_seed(11)
        return layer(x, edge_index)

    xa = x.clone().requires_grad_()
    out = f(xa)
    seed = torch.randn_like(out)
    (out * seed).sum().backward()
    step = 1e-6 * torch.randn_like(x)
    numeric = ((f(x + step) * seed).sum() - (f(x - step) * seed).sum()) / 2
    assert abs(numeric - (xa.grad * step).sum()) < 1e-7 * abs(numeric)


def test_dropout_argument_is_checked():
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\]"):
        gnn.GATConv(4, 4, dropout=1.5)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\]"):
        gnn.GATv2Conv(4, 4, dropout=-0.1)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "RGATConv"])
def test_dropout_of_one_drops_every_attention_weight_as_pygs(name):
    """PyG takes dropout=1.0 (every attention weight zero while training: the output is
    the bias); it was refused, and set after construction it failed to compile."""
    edge_index, edge_type = torch.randint(0, 10, (2, 30)), torch.randint(0, 2, (30,))
    extra = (edge_type,) if name == "RGATConv" else ()
    make = {"GATConv": lambda m: m.GATConv(4, 3, heads=2, dropout=1.0),
            "GATv2Conv": lambda m: m.GATv2Conv(4, 3, heads=2, dropout=1.0),
            "RGATConv": lambda m: m.RGATConv(4, 3, 2, dropout=1.0)}[name]
    torch.manual_seed(0)
    theirs = make(pyg).double()
    ours = make(gnn).double()
    ours.load_state_dict(theirs.state_dict())
    for training in (True, False):
        results = []
        for layer in (ours, theirs):
            layer.train(training)
            layer.zero_grad()
            x = torch.randn(10, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
            out = layer(x, edge_index, *extra)
            out.pow(2).sum().backward()
            results.append([out, x.grad, *(p.grad if p.grad is not None else torch.zeros_like(p)
                                           for p in layer.parameters())])
        for got, expected in zip(*results):
            torch.testing.assert_close(got, expected)


def test_unknown_edgeconv_aggregation_is_rejected():
    with pytest.raises(ValueError, match="EdgeConv: aggr must be one of"):
        gnn.EdgeConv(_mlp(3), aggr="median")
    with pytest.raises(ValueError, match="EdgeConv: aggr must be one of"):
        gnn.EdgeConv(_mlp(3), aggr=["max", "mean"])


def test_gat_logits_fold_into_one_gemm_only_where_it_moves_fewer_bytes(monkeypatch):
    """Folded (x @ W_att^T) and as written ((lin(x) * att).sum(-1)) are the same sums; a
    small graph's first pass on a GPU takes the form with fewer ops."""
    from gnnfuse.nn.conv import _folded_logits, _folds
    assert _folds(gnn.GATConv(6, 4, heads=2).lin, torch.zeros(1, 6))
    assert not _folds(gnn.GATConv(100, 4, heads=2).lin, torch.zeros(1, 100))
    with torch.autocast("cpu", dtype=torch.bfloat16):     # the folded GEMM would round PyG's float32 logits
        assert not _folds(gnn.GATConv(6, 4, heads=2).lin, torch.zeros(1, 6))
    small = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 0]), 2).to(FIRST_PASS_DEVICE)
    lin = gnn.GATConv(6, 4, heads=2).lin
    assert _folds(lin, torch.zeros(1, 6), small)     # a graph built explicitly: never on a first pass
    small.first_pass = True
    with monkeypatch.context() as patched:     # Triton the default, as on a GPU: a small graph's first pass,
        triton_by_default(patched)             # bound by host time, takes fewer ops
        assert not _folds(lin, torch.zeros(1, 6), small)
    layer = gnn.GATConv(6, 4, heads=2).double()
    nn.init.normal_(layer.att_dst)
    x = torch.randn(N, 6, dtype=torch.float64)
    h = layer.lin(x).view(-1, 2, 4)
    folded = _folded_logits(layer.lin.weight, x, layer.att_src, layer.att_dst)
    torch.testing.assert_close(folded, [(h * layer.att_src).sum(-1), (h * layer.att_dst).sum(-1)], rtol=1e-12, atol=1e-12)


def test_one_head_without_concat_is_the_head_itself_not_a_copy():
    """PyG averages heads when ``concat=False``; with one head that is the head, taken
    as a view (a mean would copy the output forward and the gradient backward)."""
    from gnnfuse.nn.conv import _combine_heads
    out = torch.randn(5, 1, 3, requires_grad=True)
    combined = _combine_heads(out, concat=False, bias=None)
    assert combined.data_ptr() == out.data_ptr() and torch.equal(combined, out.mean(dim=1))
    several = torch.randn(5, 2, 3)
    assert torch.equal(_combine_heads(several, concat=False, bias=None), several.mean(dim=1))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_edgeconv_max_in_half_precision_gives_pyg_gradients(backend, monkeypatch):
    """A max over a computed per-edge value (EdgeConv's MLP) in float16: the Triton kernels
    compute it in float32 and store the maximum rounded, so the backward's recomputed values
    equalled no edge's and every gradient was 0 / 0 = NaN (an H200 and the interpreter).
    It now compares the values as float16 stores them, as torch's per-edge tensor holds them."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(0)
    mlp = nn.Linear(4, 3).half().to(device)
    ours, theirs = gnn.EdgeConv(mlp, aggr="max"), pyg.EdgeConv(mlp, aggr="max")
    x = torch.randn(6, 2).half().to(device)
    edge_index = torch.tensor([[1, 2, 3, 0, 4, 5, 5], [0, 0, 1, 2, 3, 3, 0]], device=device)
    grads = []
    for layer in (ours, theirs):
        leaf = x.clone().requires_grad_()
        out = layer(leaf, edge_index)
        (out.float() * torch.linspace(-1, 1, out.numel(), device=device).view_as(out)).sum().backward()
        grads.append((out.detach(), leaf.grad, mlp.weight.grad.clone()))
        mlp.weight.grad = None
    for got, want in zip(*grads):
        assert got.isfinite().all()
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


def _normed_mlp(in_channels: int, norm: str) -> nn.Module:
    """PyG's MLP as PyG's EdgeCNN builds it with ``norm=``: a norm over all of its input's rows."""
    return pyg.MLP([2 * in_channels, 5, 4], norm=norm)


@pytest.mark.parametrize("aggr", ["max", "mean", "add"])
@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm", "graph_norm"])
def test_edgeconv_with_a_norm_over_all_edges_runs_eagerly_as_pyg(norm, aggr, monkeypatch):
    """EdgeConv traces ``nn`` per edge; a norm whose statistics span every edge's row
    (PyG's EdgeCNN(norm=...) puts one in its MLP) cannot be traced that way. It failed with
    torch's "expected 2D or 3D input (got 1D input)" (BatchNorm) or a CompileError; it now
    runs PyG's formula eagerly, with a warning naming the module, and gives PyG's numbers."""
    from gnnfuse.nn import edge_conv_eager
    monkeypatch.setattr(edge_conv_eager, "_WARNED", set())
    torch.manual_seed(0)
    net = _normed_mlp(F_IN, norm).double()
    ours, ref = gnn.EdgeConv(copy.deepcopy(net), aggr=aggr), pyg.EdgeConv(net, aggr=aggr)
    ours.load_state_dict(ref.state_dict())
    edge_index = _graph_edges()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"EdgeConv runs eagerly \(not compiled\): nn\.norms\.0 \("):
        assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index), lambda xs: ref(xs, edge_index), x)
    for key, value in ref.state_dict().items():           # a BatchNorm's running statistics too
        torch.testing.assert_close(ours.state_dict()[key], value, rtol=1e-12, atol=1e-12)


def test_edgeconv_eager_fallback_takes_bipartite_input(monkeypatch):
    from gnnfuse.nn import edge_conv_eager
    monkeypatch.setattr(edge_conv_eager, "_WARNED", set())
    torch.manual_seed(0)
    net = _normed_mlp(F_IN, "batch_norm").double()
    ours, ref = gnn.EdgeConv(copy.deepcopy(net)), pyg.EdgeConv(net)
    ours.load_state_dict(ref.state_dict())
    x_src, x_dst = torch.randn(N, F_IN, dtype=torch.float64), torch.randn(5, F_IN, dtype=torch.float64)
    edge_index = torch.stack([_graph_edges()[0], _graph_edges()[1] % 5])
    with pytest.warns(UserWarning):
        got = ours((x_src, x_dst), edge_index)
    torch.testing.assert_close(got, ref((x_src, x_dst), edge_index), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [lambda: gnn.NGCFConv(3, 4), lambda: gnn.CGATConv(3, 4), lambda: gnn.DotGATConv(3, 4),
                                  lambda: gnn.MLPAggConv(3, 4), lambda: gnn.GCNConv(3, 4), lambda: gnn.SAGEConv(3, 4)],
                         ids=["ngcf", "cgat", "dotgat", "mlpagg", "gcn", "sage"])
def test_one_dimensional_features_are_refused_by_name(make):
    """A [N] ``x`` where the node count equals ``in_channels``: NGCF's ``x + s`` broadcast
    it against an [N, 1] sum into an [N, N] matrix and returned [N, out], silently; the
    other layers failed naming compiler inputs ('score_src', 'z', 'a')."""
    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 2]])
    with pytest.raises(ValueError, match=r"x must be a \[num_nodes, F\] tensor, got shape \[3\]"):
        make()(torch.randn(3), ei)


def test_edgeconv_eager_fallback_is_warned_about_at_the_callers_line(monkeypatch):
    """The warning is shown at the user's call of the layer, not at gnnfuse/nn/compiling.py."""
    import sys
    import warnings
    from gnnfuse.nn import edge_conv_eager
    monkeypatch.setattr(edge_conv_eager, "_WARNED", set())
    layer = gnn.EdgeConv(_normed_mlp(F_IN, "batch_norm").double())
    x = torch.randn(N, F_IN, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        layer(x, _graph_edges())
    said = [(w.filename, w.lineno) for w in caught if "EdgeConv runs eagerly" in str(w.message)]
    assert said == [(__file__, line)]


def test_a_sweep_over_gat_settings_keeps_a_bounded_number_of_attention_udfs(monkeypatch):
    """GAT's attention UDF is built per (slope, dropout, training, dst_term) and every one
    built was kept for the process (`compiled_call._MADE`): a random search over the slope
    kept two per trial (training and eval), 6.8 KiB a trial on the CPU once the trace
    caches were full, without bound. With the bound at 8, 30 trials kept 60; now 8."""
    import gc

    from gnnfuse.frontend import compiled_call
    from gnnfuse.frontend.message import UpdateAll
    monkeypatch.setattr(compiled_call, "_MADE_LIMIT", 8, raising=False)
    edge_index, x = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), torch.randn(4, 3)
    for trial in range(30):
        layer = gnn.GATConv(3, 2, negative_slope=0.01 * (trial + 1))
        layer(x, edge_index).sum().backward()
        with torch.no_grad():
            layer.eval()(x, edge_index)
    del layer
    gc.collect()
    alive = sum(isinstance(o, UpdateAll) for o in gc.get_objects())
    assert alive <= 8, alive
