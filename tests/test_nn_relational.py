"""RGCNConv against PyG's RGCNConv with the same parameters: outputs and every gradient
in float64, on both backends, for each aggregation, with and without bases, root weight
and bias, given a typed Graph or an edge_index with edge types; then its errors."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import RGCNConv as PygRGCNConv

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.nn import RGCNConv
from oracle_check import device_for

RELATIONS = 4


def typed_graph(seed: int, n: int = 11, num_edges: int = 40) -> gnnfuse.Graph:
    """Random typed multigraph with self loops, isolated vertices and one relation no edge
    has (its matrix must get a zero gradient)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n - 2, (num_edges,), generator=g)
    dst = torch.randint(0, n - 2, (num_edges,), generator=g)
    etype = torch.randint(0, RELATIONS - 1, (num_edges,), generator=g)
    return gnnfuse.Graph(src, dst, n, edge_type=etype, num_edge_types=RELATIONS)


def outputs_and_grads(layer, x, call):
    layer.zero_grad()
    xs = x.clone().requires_grad_()
    out = call(layer, xs)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * weight).sum().backward()
    return out.detach(), {"x": xs.grad, **{n: p.grad.clone() for n, p in layer.named_parameters()}}


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("as_graph", [True, False], ids=["Graph", "edge_index"])
@pytest.mark.parametrize("options", [
    {}, {"aggr": "add"}, {"num_bases": 2}, {"root_weight": False, "bias": False}, {"aggr": "sum", "num_bases": 3},
], ids=["mean", "add", "bases", "no-root-no-bias", "sum-bases"])
def test_rgcn_matches_pyg(options, as_graph, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)     # the Triton backend runs CUDA tensors on a GPU machine
    graph = typed_graph(0).to(device)
    torch.manual_seed(0)
    pyg = PygRGCNConv(6, 3, RELATIONS, **options).double()
    if pyg.bias is not None:
        torch.nn.init.normal_(pyg.bias)
    ours = RGCNConv(6, 3, RELATIONS, **options).double()
    ours.load_state_dict(pyg.state_dict())
    pyg, ours = pyg.to(device), ours.to(device)
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64).to(device)
    if as_graph:
        out, grads = outputs_and_grads(ours, x, lambda layer, xs: layer(xs, graph))
    else:
        out, grads = outputs_and_grads(ours, x, lambda layer, xs: layer(xs, graph.edge_index, graph.edge_type))
    ref, ref_grads = outputs_and_grads(pyg, x, lambda layer, xs: layer(xs, graph.edge_index, graph.edge_type))
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12, msg=name)
    if "num_bases" not in options:
        assert (grads["weight"][RELATIONS - 1] == 0).all()      # the relation no edge has


def test_rgcn_gradcheck():
    graph = typed_graph(1, n=6, num_edges=14)
    layer = RGCNConv(3, 2, RELATIONS, num_bases=2).double()
    x = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *params: torch.func.functional_call(
        layer, dict(zip([n for n, _ in layer.named_parameters()], params)), (x, graph)),
        (x, *[p.detach().clone().requires_grad_() for p in layer.parameters()]), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("build, call, message", [
    (lambda: RGCNConv(3, 2, 4, num_blocks=2), None, "num_blocks"),
    (lambda: RGCNConv(3, 2, 4, aggr="max"), None, "aggr must be"),
    (lambda: RGCNConv(3, 2, 5), lambda layer, g: layer(torch.randn(11, 3), g), "num_relations=5"),
    (lambda: RGCNConv(3, 2, 4), lambda layer, g: layer(torch.randn(11, 3), g.edge_index), "needs edge types"),
    (lambda: RGCNConv(3, 2, 4), lambda layer, g: layer(torch.randn(7, 3), g), "x has 7 rows"),
    (lambda: RGCNConv(3, 2, 4), lambda layer, g: layer(None, g), "x=None"),
    (lambda: RGCNConv(3, 2, 4), lambda layer, g: layer(torch.randn(11, 5), g),
     r"RGCNConv: x has 5 features per node, but the layer was built for in_channels=3"),
    (lambda: RGCNConv((3, 4), 2, 4), lambda layer, g: layer((torch.randn(11, 3), torch.randn(11, 5)), g.edge_index,
                                                            g.edge_type),
     r"RGCNConv: x_dst has 5 features per node, but the layer was built for in_channels\[1\]=4"),
])
def test_rgcn_errors_say_what_is_wrong(build, call, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        layer = build()
        call(layer, typed_graph(2))


@pytest.mark.parametrize("call, message", [
    (lambda layer, g: layer(torch.arange(11) % 9, g), r"RGCNConv: x holds node index 8, outside 0\.\.7 "
                                                      r"\(in_channels=8 embedding rows\)"),
    (lambda layer, g: layer(torch.arange(11) - 1, g), r"RGCNConv: x holds node index -1, outside 0\.\.7"),
    (lambda layer, g: layer((None, torch.tensor([0, 3, 12] + [1] * 8)), g.edge_index, g.edge_type),
     r"RGCNConv: x_dst holds node index 12, outside 0\.\.7 \(in_channels\[1\]=8 root rows\)"),
], ids=["x-too-large", "x-negative", "x_dst"])
def test_rgcn_out_of_range_node_indices_are_named(call, message):
    """A featureless input's node index past the embedding rows got torch's one_hot
    "Class values must be smaller than num_classes" (or "must be non-negative"), naming
    neither the argument nor the bound."""
    with pytest.raises(ValueError, match=message):
        call(RGCNConv(8, 2, 4), typed_graph(2))


@pytest.mark.parametrize("layer", [gnn.RGCNConv, gnn.FastRGCNConv])
@pytest.mark.parametrize("shape", [(11,), (11, 8)], ids=["vector", "matrix"])
def test_rgcn_complex_x_is_refused(layer, shape):
    """A complex ``x`` is not floating point, so it was taken for node indices: a complex
    vector was cast to int64 (its imaginary part and fraction dropped, torch's one-time
    warning at most) and one-hot encoded, silently; a complex matrix was told "integer x
    must be a vector of node indices". Both are refused naming the dtype."""
    with pytest.raises(TypeError, match="RGCNConv: x is a torch.complex64 tensor; give float node features"):
        layer(8, 2, 4)(torch.randn(shape, dtype=torch.complex64), typed_graph(2))

@pytest.mark.parametrize("backend, dtype", [("reference", torch.float64), ("triton", torch.float32)])
@pytest.mark.parametrize("order", [None, "dense"], ids=["picked", "dense"])
@pytest.mark.parametrize("in_channels, out_channels, options", [
    (0, 3, {}), (3, 0, {}), (3, 0, {"root_weight": False}),
], ids=["in0", "out0", "out0-no-root"])
def test_rgcn_zero_width_features_match_pyg(in_channels, out_channels, options, dtype, order, backend, monkeypatch):
    """Zero-width features: every weight-gradient GEMM (the root's, each relation's, the
    dense order's stacked weights, the float32 segment-matmul kernel's rows) flattened its
    operand with reshape(-1, 0), which cannot infer the rows of an empty tensor -- a
    RuntimeError where PyG gives the bias and zero gradients."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    if order is not None:
        monkeypatch.setenv("GNNFUSE_TYPED_ORDER", order)
    device = device_for(backend)
    graph = typed_graph(3, n=6, num_edges=14).to(device)
    torch.manual_seed(0)
    pyg = PygRGCNConv(in_channels, out_channels, RELATIONS, **options).to(dtype)
    if pyg.bias is not None:
        torch.nn.init.normal_(pyg.bias)
    ours = RGCNConv(in_channels, out_channels, RELATIONS, **options).to(dtype)
    ours.load_state_dict(pyg.state_dict())
    pyg, ours = pyg.to(device), ours.to(device)
    x = torch.randn(graph.num_nodes, in_channels, dtype=dtype).to(device)
    out, grads = outputs_and_grads(ours, x, lambda layer, xs: layer(xs, graph))
    ref, ref_grads = outputs_and_grads(pyg, x, lambda layer, xs: layer(xs, graph.edge_index, graph.edge_type))
    torch.testing.assert_close(out, ref)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], msg=name)


@pytest.mark.parametrize("x_src", [None, torch.zeros(0, dtype=torch.long)], ids=["None", "no-indices"])
def test_rgcn_featureless_input_without_source_nodes_matches_pyg(x_src):
    """in_channels=(0, b) with node-index input: no source has an embedding row, and
    one_hot(x, 0) of the empty index raised torch's 'Can not infer total number of classes'
    where PyG gives each destination its root row plus the bias."""
    torch.manual_seed(0)
    pyg = PygRGCNConv((0, 5), 3, RELATIONS).double()
    torch.nn.init.normal_(pyg.bias)
    ours = RGCNConv((0, 5), 3, RELATIONS).double()
    ours.load_state_dict(pyg.state_dict())
    x_dst = torch.tensor([4, 0, 2])
    edge_index, edge_type = torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    out = ours((x_src, x_dst), edge_index, edge_type)
    torch.testing.assert_close(out, pyg((x_src, x_dst), edge_index, edge_type), rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert torch.equal(ours.root.grad.sum(-1), torch.tensor([1.0, 0, 1, 0, 1], dtype=torch.float64) * 3)


@pytest.mark.parametrize("layer", [gnn.RGCNConv, gnn.FastRGCNConv])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16])
def test_rgcn_node_indices_of_any_integer_dtype_match_pyg(layer, dtype):
    """PyG reads int32 node indices as it reads int64 ones; here torch's one_hot, which
    takes int64 only, raised 'one_hot is only applicable to index tensor of type
    LongTensor' (int16 as well, which PyG's indexing refuses)."""
    graph = typed_graph(4)
    torch.manual_seed(0)
    # PyG's RGCNConv, whose reading of node indices both follow (FastRGCNConv's docstring)
    pyg = PygRGCNConv(graph.num_nodes, 3, RELATIONS).double()
    torch.nn.init.normal_(pyg.bias)
    ours = layer(graph.num_nodes, 3, RELATIONS).double()
    ours.load_state_dict(pyg.state_dict())
    x = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(1))
    ref, ref_grads = outputs_and_grads(pyg, x.double(), lambda l, _: l(x, graph.edge_index, graph.edge_type))
    out, grads = outputs_and_grads(ours, x.double(), lambda l, _: l(x.to(dtype), graph.edge_index, graph.edge_type))
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for name in ("weight", "root", "bias"):
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_rgcn_refuses_mask_typed_node_input_by_name(dtype):
    """torch indexes by a bool or uint8 tensor as a mask (PyG's layers then fail on a
    shape, or worse), and one_hot refuses them: named instead."""
    with pytest.raises(TypeError, match=f"RGCNConv: x is a {dtype} tensor"):
        RGCNConv(4, 3, RELATIONS)(torch.ones(4, dtype=dtype), torch.zeros(2, 0, dtype=torch.long),
                                  torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("build", [lambda: gnn.RGCNConv(-1, 4, 3), lambda: gnn.RGCNConv((-1, 5), 4, 3),
                                   lambda: gnn.FastRGCNConv(-1, 4, 3), lambda: gnn.RGATConv(-1, 4, 3)])
def test_a_lazy_width_is_refused_by_name(build):
    """PyG's lazy ``in_channels=-1`` cannot size a relational layer's per-relation weights
    at construction (PyG's layers fail there too): it failed with torch's "Trying to
    create tensor with negative dimension -1: [3, -1, 4]"; the error now names the layer
    and says what to give."""
    with pytest.raises(ValueError, match=r"in_channels=-1 .* give the input feature width"):
        build()


def test_the_typed_graph_of_raw_tensors_is_built_once_while_they_are_unchanged(monkeypatch):
    """PyG's R-GCN takes edge_index and edge_type raw every step; the typed graph (ids
    validated, CSR sorted, relation pairs found) was built anew on every call. It is kept
    while both tensors are the same and unchanged: an in-place edit of either, or another
    edge_type tensor, gives the new graph's answer (PyG's, weights copied)."""
    torch.manual_seed(0)
    theirs = PygRGCNConv(6, 4, 3).double()
    ours = RGCNConv(6, 4, 3).double()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(12, 6, dtype=torch.float64)
    edge_index, edge_type = torch.randint(0, 12, (2, 40)), torch.randint(0, 3, (40,))
    built = []
    real = gnnfuse.Graph.__init__

    def counted(self, *args, **kwargs):
        built.append(kwargs.get("edge_type") is not None)
        real(self, *args, **kwargs)
    monkeypatch.setattr(gnnfuse.Graph, "__init__", counted)

    def check(message):
        torch.testing.assert_close(ours(x, edge_index, edge_type), theirs(x, edge_index, edge_type), msg=message)
    check("first call")
    check("same tensors")
    assert built.count(True) == 1
    edge_type[:5] = (edge_type[:5] + 1) % 3
    check("edge_type edited in place")
    edge_type = edge_type.clone()
    edge_type[-3:] = (edge_type[-3:] + 2) % 3
    check("another edge_type tensor")
    edge_index[0, :4] = (edge_index[0, :4] + 1) % 12
    check("edge_index edited in place")
    assert built.count(True) == 4
    check("same tensors again")
    assert built.count(True) == 4
