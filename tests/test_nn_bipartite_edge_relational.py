"""PyG's bipartite form of EdgeConv (``conv((x_src, x_dst), edge_index)``) and RGCNConv
(``in_channels=(a, b)``, ``conv((x_src, x_dst), edge_index, edge_type)``, with node indices
or None for featureless sides, and a typed ``SparseTensor`` adj_t), against PyG 2.8 with
copied weights: outputs and the gradients of every float input and every parameter in
float64, on the reference backend and the Triton interpreter. The graph has fewer
destinations than sources, a destination without in-edges and sources without out-edges."""
from __future__ import annotations

import types

import pytest
import torch
import torch_geometric.nn as pyg
from hypothesis import given, settings

from gnnfuse import nn as gnn
from layer_check import assert_same_values
from oracle_check import device_for
from test_nn_bipartite import EDGE_INDEX, NUM_DST, NUM_SRC, bipartite_graphs

EDGE_TYPE = torch.tensor([0, 1, 2, 0, 1, 1, 2, 0])
RELATIONS, F_SRC, F_DST, F_OUT = 3, 5, 3, 4


def compare(ours: torch.nn.Module, ref: torch.nn.Module, inputs: tuple, run) -> None:
    """``run(layer, inputs)`` on both layers (PyG's weights copied into ours): the same
    output, and the same gradients for every float tensor in ``inputs`` and every parameter."""
    torch.manual_seed(0)
    for p in ref.parameters():
        if p.dim() == 1:
            torch.nn.init.normal_(p)          # biases start at zero: draw them so their use shows
    ours.load_state_dict(ref.state_dict())
    results = []
    for layer in (ours, ref):
        leaves = tuple(t.clone().requires_grad_() if t is not None and t.is_floating_point() else t for t in inputs)
        out = run(layer, leaves)
        cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
        (out * cotangent.to(out.device)).sum().backward()
        grads = [t.grad for t in leaves if t is not None and t.is_floating_point()]
        results.append((out.detach(), grads, {k: p.grad for k, p in layer.named_parameters()}))
    (out, grads, params), (expected, expected_grads, expected_params) = results
    assert out.shape == expected.shape
    assert_same_values(out, expected, "output")
    for i, (a, b) in enumerate(zip(grads, expected_grads)):
        if b is None:                         # an input only counted (x_dst without root)
            assert a is None or not a.any(), i
        else:
            assert_same_values(a, b, f"gradient of input {i}")
    assert params.keys() == expected_params.keys()
    for key, grad in params.items():
        assert grad is not None and expected_params[key] is not None, key
        assert_same_values(grad, expected_params[key], f"gradient of {key}")


def edge_mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(2 * width, 6), torch.nn.Tanh(), torch.nn.Linear(6, F_OUT))


@pytest.mark.parametrize("aggr, backend", [("max", "reference"), ("mean", "reference"), ("add", "reference"),
                                           ("max", "triton")])
def test_bipartite_edge_conv_matches_pyg(aggr, backend, monkeypatch):
    """x_i is the destination's row of x_dst, x_j the source's row of x_src."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    torch.manual_seed(3)
    ref = pyg.EdgeConv(edge_mlp(F_SRC), aggr=aggr).double().to(device)
    ours = gnn.EdgeConv(edge_mlp(F_SRC), aggr=aggr).double().to(device)
    x_src = torch.randn(NUM_SRC, F_SRC, dtype=torch.float64, device=device)
    x_dst = torch.randn(NUM_DST, F_SRC, dtype=torch.float64, device=device)
    compare(ours, ref, (x_src, x_dst), lambda layer, xs: layer(xs, EDGE_INDEX.to(device)))


def test_bipartite_edge_conv_takes_a_rectangular_adj_t():
    """PyG's [num_dst, num_src] sparse adj_t gives the edge_index result."""
    torch.manual_seed(4)
    ours = gnn.EdgeConv(edge_mlp(F_SRC)).double()
    x = (torch.randn(NUM_SRC, F_SRC, dtype=torch.float64), torch.randn(NUM_DST, F_SRC, dtype=torch.float64))
    edge_index = EDGE_INDEX[:, :-1]            # without the repeated edge 2 -> 2, which an adj_t would sum
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.shape[1]), (NUM_DST, NUM_SRC))
    assert_same_values(ours(x, adj_t.coalesce()), ours(x, edge_index), "output")
    assert_same_values(ours(x, adj_t.to_sparse_csr()), ours(x, edge_index), "output")


def test_bipartite_edge_conv_without_x_dst_is_refused():
    with pytest.raises(ValueError, match=r"EdgeConv: bipartite input needs x_dst"):
        gnn.EdgeConv(edge_mlp(F_SRC))((torch.randn(NUM_SRC, F_SRC), None), EDGE_INDEX)


# (id, constructor keywords, x_src kind, x_dst kind): "float" features, "index" node ids, None
RGCN_CASES = [
    ("mean-float", dict(), "float", "float"),
    ("sum-float", dict(aggr="sum"), "float", "float"),
    ("bases-float", dict(num_bases=2), "float", "float"),
    ("blocks-float", dict(num_blocks=1), "float", "float"),
    ("no-root-float", dict(root_weight=False, aggr="sum"), "float", "float"),
    ("featureless-src", dict(aggr="sum"), None, "index"),
    ("index-both", dict(), "index", "index"),
    ("bases-featureless", dict(num_bases=2, aggr="sum"), None, "index"),
    ("no-root-index-both", dict(root_weight=False), "index", "index"),
]


def rgcn_inputs(src_kind, dst_kind, device: str) -> tuple:
    generator = torch.Generator().manual_seed(5)
    float_rows = {"src": (NUM_SRC, F_SRC), "dst": (NUM_DST, F_DST)}
    index_rows = {"src": torch.tensor([2, 0, 1, 4, 3, 1]), "dst": torch.tensor([1, 0, 2, 1])}

    def side(kind, name):
        if kind == "float":
            return torch.randn(*float_rows[name], dtype=torch.float64, generator=generator).to(device)
        return None if kind is None else index_rows[name].to(device)
    return side(src_kind, "src"), side(dst_kind, "dst")


@pytest.mark.parametrize("case, backend", [pytest.param(case, backend, id=f"{backend}-{case[0]}")
                                           for backend in ("reference", "triton") for case in RGCN_CASES
                                           if backend == "reference" or case[0] in ("mean-float", "featureless-src")])
def test_bipartite_rgcn_matches_pyg(case, backend, monkeypatch):
    """Relation matrices read x_src (width a, or one-hot node ids: a rows each), root reads
    x_dst (width b, or node ids); mean averages each relation's messages apart."""
    _, options, src_kind, dst_kind = case
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    widths = (F_SRC if src_kind == "float" else NUM_SRC, F_DST if dst_kind == "float" else NUM_DST)
    ref = pyg.RGCNConv(widths, F_OUT, RELATIONS, **options).double().to(device)
    ours = gnn.RGCNConv(widths, F_OUT, RELATIONS, **options).double().to(device)
    assert str(ours) == str(ref)
    inputs = rgcn_inputs(src_kind, dst_kind, device)
    compare(ours, ref, inputs,
            lambda layer, xs: layer(tuple(xs), EDGE_INDEX.to(device), EDGE_TYPE.to(device)))


def test_rgcn_reads_edge_types_from_a_sparse_tensor_adj_t():
    """PyG's typed adjacency: a torch_sparse.SparseTensor [num_dst, num_src] whose values
    are the edge types (read through ``coo`` and ``sparse_sizes``, as torch_sparse is not
    installed here) gives the edge_index + edge_type result."""
    fake = types.new_class("SparseTensor")
    fake.__module__ = "torch_sparse.tensor"
    adj_t = fake()
    adj_t.coo = lambda: (EDGE_INDEX[1], EDGE_INDEX[0], EDGE_TYPE)
    adj_t.sparse_sizes = lambda: (NUM_DST, NUM_SRC)
    ours = gnn.RGCNConv((F_SRC, F_DST), F_OUT, RELATIONS).double()
    x = rgcn_inputs("float", "float", "cpu")
    assert_same_values(ours(x, adj_t), ours(x, EDGE_INDEX, EDGE_TYPE), "output")
    adj_t.sparse_sizes = lambda: (NUM_SRC, NUM_DST)
    with pytest.raises(ValueError, match=r"adj_t has shape \[6, 4\]"):
        ours(x, adj_t)


@pytest.mark.parametrize("layer", ["RGCNConv", "FastRGCNConv"])
def test_rgcn_refuses_a_torch_sparse_adj_t_by_name(layer):
    """A torch sparse adj_t holds no edge types (PyG's RGCNConv fails on it too); before,
    its rows were taken for an edge_index ("src must hold integer ids"), and then
    FastRGCNConv's refusal named RGCNConv."""
    adj_t = torch.sparse_coo_tensor(EDGE_INDEX.flip(0), torch.ones(EDGE_INDEX.shape[1]), (NUM_DST, NUM_SRC))
    ours = getattr(gnn, layer)((F_SRC, F_DST), F_OUT, RELATIONS).double()
    with pytest.raises(ValueError, match=f"^{layer}: a torch sparse adj_t carries no edge types"):
        ours(rgcn_inputs("float", "float", "cpu"), adj_t.coalesce(), EDGE_TYPE)


def test_bipartite_rgcn_counts_are_checked():
    ours = gnn.RGCNConv((F_SRC, F_DST), F_OUT, RELATIONS)
    x_src, x_dst = torch.randn(NUM_SRC, F_SRC), torch.randn(NUM_DST, F_DST)
    with pytest.raises(ValueError, match="num_blocks"):
        gnn.RGCNConv((F_SRC, F_DST), F_OUT, RELATIONS, num_blocks=2)
    with pytest.raises(ValueError, match="RGCNConv: bipartite input is a pair"):
        ours((x_src, x_dst, x_dst), EDGE_INDEX, EDGE_TYPE)
    with pytest.raises(ValueError, match=r"RGCNConv: bipartite input needs x_dst"):
        ours((x_src, None), EDGE_INDEX, EDGE_TYPE)
    with pytest.raises(ValueError, match="RGCNConv: x_src holds node indices and x_dst float features; PyG's "
                                         "RGCNConv fails on this pair and its FastRGCNConv reads"):
        ours((torch.arange(NUM_SRC), x_dst), EDGE_INDEX, EDGE_TYPE)
    with pytest.raises(ValueError, match="node ids .* out of range|num_src_nodes|source"):
        ours((x_src[:2], x_dst), EDGE_INDEX, EDGE_TYPE)


@pytest.mark.parametrize("layer", [gnn.RGCNConv, gnn.FastRGCNConv])
@pytest.mark.parametrize("src_kind, dst_kind", [(None, "float"), ("float", "index")], ids=["None-float", "float-index"])
@pytest.mark.parametrize("aggr", ["mean", "add"])
def test_rgcn_mixed_pairs_match_pyg_s_fast_rgcn(layer, src_kind, dst_kind, aggr):
    """``(None, x_dst)`` with float destination features (one-hot sources, ``x_dst @
    root``) and ``(x_src, node indices)`` (``root[x_dst]``): PyG's FastRGCNConv computes
    both, its RGCNConv fails on both (an integer or float matmul). They were refused
    ("x_src and x_dst must both be float features or both node indices (x_src may be
    None)"), a message that even named the first as allowed."""
    widths = (NUM_SRC if src_kind is None else F_SRC, F_DST if dst_kind == "float" else NUM_DST)
    ref = pyg.FastRGCNConv(widths, F_OUT, RELATIONS, aggr=aggr).double()
    compare(layer(widths, F_OUT, RELATIONS, aggr=aggr).double(), ref, rgcn_inputs(src_kind, dst_kind, "cpu"),
            lambda layer, xs: layer(tuple(xs), EDGE_INDEX, EDGE_TYPE))


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(graph=bipartite_graphs())
def test_bipartite_edge_conv_and_rgcn_match_pyg_on_random_bipartite_graphs(graph):
    """Either vertex set empty, multi-edges, destinations without in-edges, relations
    without edges: the same results as PyG's (mean R-GCN averages each relation apart)."""
    edge_index, num_src, num_dst = graph
    edge_type = torch.arange(edge_index.shape[1]) % RELATIONS
    generator = torch.Generator().manual_seed(6)
    x_src = torch.randn(num_src, F_SRC, dtype=torch.float64, generator=generator)
    x_dst = torch.randn(num_dst, F_SRC, dtype=torch.float64, generator=generator)
    torch.manual_seed(7)
    compare(gnn.RGCNConv(F_SRC, F_OUT, RELATIONS).double(), pyg.RGCNConv(F_SRC, F_OUT, RELATIONS).double(),
            (x_src, x_dst), lambda layer, xs: layer(tuple(xs), edge_index, edge_type))
    compare(gnn.EdgeConv(edge_mlp(F_SRC), aggr="mean").double(), pyg.EdgeConv(edge_mlp(F_SRC), aggr="mean").double(),
            (x_src, x_dst), lambda layer, xs: layer(tuple(xs), edge_index))
