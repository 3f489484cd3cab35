"""PyG's call forms on gnnfuse's layers: every ``forward`` takes PyG 2.8's positional
parameters in PyG's order (so ``conv(x, edge_index, edge_weight)`` never binds the weights
to another parameter), ``edge_weight`` matches PyG on outputs and every gradient (the
weights' included), and what is not supported -- bipartite ``(x_src, x_dst)`` input
outside the five layers that take it (test_nn_bipartite.py), edge features to a layer
built without edge_dim, attention weights in training with dropout -- fails loudly
instead of being ignored."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex

import gnnfuse
from gnnfuse import nn as gnn
from layer_check import assert_same_outputs_and_grads, rel_err
from oracle_check import device_for

# Every layer class gnnfuse.nn exports, except the plain-torch baseline model GCN (PyG's
# GCN of that name is a whole model with another signature).
LAYER_NAMES = sorted(name for name in gnn.__all__ if isinstance(getattr(gnn, name), type)
                     and issubclass(getattr(gnn, name), torch.nn.Module) and name != "GCN")


def positional_parameters(forward) -> list[str]:
    """Names of the parameters a positional call can reach, ``self`` left out."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(forward).parameters.values() if p.kind in kinds][1:]


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_forward_takes_pygs_positional_parameters_in_pygs_order(name):
    """A layer PyG has takes exactly PyG's positional parameters; one PyG lacks takes
    ``(x, edge_index)`` like every PyG convolution."""
    ours = positional_parameters(getattr(gnn, name).forward)
    expected = positional_parameters(getattr(pyg, name).forward) if hasattr(pyg, name) else ["x", "edge_index"]
    assert ours == expected


N, F_IN = 9, 5


def weighted_graph() -> tuple[torch.Tensor, torch.Tensor]:
    """A multigraph with self loops (one vertex with two of different weights), a
    duplicated edge and isolated vertices 7 and 8, and positive per-edge weights."""
    edge_index = torch.tensor([[0, 1, 2, 3, 3, 4, 5, 6, 1, 2, 2, 0, 4],
                               [1, 2, 0, 4, 4, 5, 3, 0, 1, 2, 2, 3, 4]])
    weight = torch.linspace(0.4, 1.9, edge_index.shape[1], dtype=torch.float64)
    return edge_index, weight


# name -> factory of (ours, PyG), for every layer that takes edge_weight
WEIGHTED = {
    "gcn": lambda: (gnn.GCNConv(F_IN, 3), pyg.GCNConv(F_IN, 3)),
    "gcn-improved": lambda: (gnn.GCNConv(F_IN, 3, improved=True), pyg.GCNConv(F_IN, 3, improved=True)),
    "gcn-no-loops": lambda: (gnn.GCNConv(F_IN, 3, add_self_loops=False),
                             pyg.GCNConv(F_IN, 3, add_self_loops=False)),
    "gcn-unnormalized": lambda: (gnn.GCNConv(F_IN, 3, normalize=False), pyg.GCNConv(F_IN, 3, normalize=False)),
    "graphconv-add-narrowing": lambda: (gnn.GraphConv(F_IN, 3), pyg.GraphConv(F_IN, 3)),
    "graphconv-mean-widening": lambda: (gnn.GraphConv(F_IN, 7, aggr="mean"), pyg.GraphConv(F_IN, 7, aggr="mean")),
    "graphconv-max": lambda: (gnn.GraphConv(F_IN, 3, aggr="max"), pyg.GraphConv(F_IN, 3, aggr="max")),
    "sgc-narrowing": lambda: (gnn.SGConv(F_IN, 3, K=2), pyg.SGConv(F_IN, 3, K=2)),
    "sgc-widening-no-loops": lambda: (gnn.SGConv(F_IN, 7, K=2, add_self_loops=False),
                                      pyg.SGConv(F_IN, 7, K=2, add_self_loops=False)),
    "tag-narrowing": lambda: (gnn.TAGConv(F_IN, 3, K=2), pyg.TAGConv(F_IN, 3, K=2)),
    "tag-widening-unnormalized": lambda: (gnn.TAGConv(F_IN, 7, K=2, normalize=False),
                                          pyg.TAGConv(F_IN, 7, K=2, normalize=False)),
    "appnp": lambda: (gnn.APPNP(K=2, alpha=0.2), pyg.APPNP(K=2, alpha=0.2)),
    "appnp-no-loops": lambda: (gnn.APPNP(2, 0.2, add_self_loops=False), pyg.APPNP(2, 0.2, add_self_loops=False)),
    "appnp-unnormalized": lambda: (gnn.APPNP(2, 0.2, normalize=False), pyg.APPNP(2, 0.2, normalize=False)),
    "cheb-sym": lambda: (gnn.ChebConv(F_IN, 3, K=3), pyg.ChebConv(F_IN, 3, K=3)),
    "cheb-rw": lambda: (gnn.ChebConv(F_IN, 3, K=3, normalization="rw"),
                        pyg.ChebConv(F_IN, 3, K=3, normalization="rw")),
    "cheb-unnormalized": lambda: (gnn.ChebConv(F_IN, 3, K=3, normalization=None),
                                  pyg.ChebConv(F_IN, 3, K=3, normalization=None)),
}


def assert_weighted_call_matches_pyg(ours, ref, edge_index, weight, x, *rest, graph=None) -> None:
    """``layer(x, edge_index, edge_weight, *rest)`` positionally on both: outputs, input,
    parameter and edge-weight gradients agree."""
    wa, wb = weight.clone().requires_grad_(), weight.clone().requires_grad_()
    graph = edge_index if graph is None else graph
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, graph, wa, *rest),
                                  lambda xs: ref(xs, edge_index, wb, *rest), x)
    assert rel_err(wa.grad, wb.grad) < 1e-9


@pytest.mark.parametrize("name", WEIGHTED)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_edge_weight_matches_pyg(name, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)     # the Triton backend runs CUDA tensors on a GPU machine
    torch.manual_seed(0)
    ours, ref = (m.double().to(device) for m in WEIGHTED[name]())
    ours.load_state_dict(ref.state_dict())
    edge_index, weight = (t.to(device) for t in weighted_graph())
    x = torch.randn(N, F_IN, dtype=torch.float64).to(device)
    graph = gnnfuse.Graph.from_edge_index(edge_index, num_nodes=N) if backend == "reference" else None
    assert_weighted_call_matches_pyg(ours, ref, edge_index, weight, x, graph=graph)


@pytest.mark.parametrize("normalization", ["sym", None])
def test_chebyshev_lambda_max_per_graph_of_a_batch_matches_pyg(normalization):
    """PyG's full positional form ``(x, edge_index, edge_weight, batch, lambda_max)``
    with one lambda_max per graph (a tensor that also receives a gradient)."""
    torch.manual_seed(1)
    ours, ref = (m.double() for m in (gnn.ChebConv(F_IN, 3, K=3, normalization=normalization),
                                      pyg.ChebConv(F_IN, 3, K=3, normalization=normalization)))
    ours.load_state_dict(ref.state_dict())
    edge_index, weight = weighted_graph()
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 0, 2, 2])    # 0->3 crosses graphs: PyG scales it by its source's
    lam_a = torch.tensor([2.5, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    lam_b = lam_a.detach().clone().requires_grad_()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    wa, wb = weight.clone().requires_grad_(), weight.clone().requires_grad_()
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index, wa, batch, lam_a),
                                  lambda xs: ref(xs, edge_index, wb, batch, lam_b), x)
    assert rel_err(wa.grad, wb.grad) < 1e-9
    assert rel_err(lam_a.grad, lam_b.grad) < 1e-9


def test_chebyshev_one_edge_weight_is_not_taken_for_lambda_max():
    """The issue's silent case: on a one-edge graph ``conv(x, edge_index, w)`` put ``w``
    into lambda_max, and a one-number lambda_max fits, so no error told the user."""
    torch.manual_seed(2)
    ours, ref = (m.double() for m in (gnn.ChebConv(F_IN, 3, K=2), pyg.ChebConv(F_IN, 3, K=2)))
    ours.load_state_dict(ref.state_dict())
    edge_index, weight = torch.tensor([[0], [1]]), torch.tensor([0.5], dtype=torch.float64)
    x = torch.randn(2, F_IN, dtype=torch.float64)
    torch.testing.assert_close(ours(x, edge_index, weight), ref(x, edge_index, weight), rtol=1e-12, atol=1e-12)


def test_edge_weight_of_the_wrong_length_is_rejected():
    edge_index, weight = weighted_graph()
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[13\]"):
        gnn.GCNConv(F_IN, 3)(torch.randn(N, F_IN), edge_index, weight[:-1].float())


@pytest.mark.parametrize("name", sorted(WEIGHTED))
def test_edge_weight_of_several_columns_on_a_graph_without_edges_is_rejected(name):
    """[0, 2] weights for 0 edges hold E = 0 numbers, which the length check counted: every
    weighted layer returned a result (PyG's GCN, SGConv, ChebConv and APPNP raise; its GraphConv
    and TAGConv take them). One weight per edge is [E] or [E, 1]."""
    layer = WEIGHTED[name]()[0]
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[0\] .* got \[0, 2\]"):
        layer(torch.randn(N, F_IN), torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, 2))


@pytest.mark.parametrize("name", sorted(WEIGHTED))
def test_a_complex_edge_weight_is_refused(name):
    """An edge weight is cast to the features' dtype (an integer one too, as README says);
    a complex one lost its imaginary part there, with at most torch's one-time warning:
    GCNConv gave a float32 output where PyG's is complex64, and GraphConv, SGConv, TAGConv
    and APPNP, where PyG's raise, a float one too. It is refused by name."""
    edge_index, weight = weighted_graph()
    layer, _ = WEIGHTED[name]()
    with pytest.raises(TypeError, match="edge_weight is torch.complex64: complex edge weights are not supported"):
        layer(torch.randn(N, F_IN), edge_index, torch.complex(weight.float(), weight.float()))

@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_complex_edge_features_are_refused(name):
    """GAT/GATv2 cast ``edge_attr`` to ``lin_edge``'s dtype, so complex features lost their
    imaginary part (a float32 output, where PyG's layers raise), with at most torch's
    one-time warning. They are refused by name."""
    edge_index, weight = weighted_graph()
    layer = getattr(gnn, name)(F_IN, 2, edge_dim=2)
    features = torch.randn(edge_index.shape[1], 2, dtype=torch.complex64)
    with pytest.raises(TypeError, match=f"{name}: edge_attr is torch.complex64: complex edge features"):
        layer(torch.randn(N, F_IN), edge_index, features)

@pytest.mark.parametrize("layer", [gnn.GCNConv(F_IN, 3, cached=True), gnn.APPNP(2, 0.1, cached=True)])
def test_cached_layers_refuse_edge_weight(layer):
    edge_index, weight = weighted_graph()
    with pytest.raises(NotImplementedError,
                       match=r"cached=True\) with edge weights \(edge_weight, or a sparse adj_t's values"):
        layer(torch.randn(N, F_IN), edge_index, weight.float())


@pytest.mark.parametrize("call, argument", [
    (lambda x, ei: gnn.GATConv(F_IN, 2)(x, ei, torch.ones(ei.shape[1], 3)), "edge_attr"),
    (lambda x, ei: gnn.GATConv(F_IN, 2, dropout=0.5)(x, ei, None, None, True), "return_attention_weights"),
    (lambda x, ei: gnn.GATv2Conv(F_IN, 2)(x, ei, torch.ones(ei.shape[1], 3)), "edge_attr"),
    (lambda x, ei: gnn.GATv2Conv(F_IN, 2, dropout=0.5)(x, ei, None, True), "return_attention_weights"),
])
def test_unsupported_pyg_arguments_are_named(call, argument):
    """PyG's GAT uses edge_attr only with edge_dim (ignoring it otherwise), and returns
    dropped-out weights for return_attention_weights=True in training: neither may be
    silently dropped or approximated."""
    edge_index, _ = weighted_graph()
    with pytest.raises(NotImplementedError, match=rf"{argument}=(\.\.\.|True)\) (is not|needs the layer built with|in training)"):
        call(torch.randn(N, F_IN), edge_index)


@pytest.mark.parametrize("make", [lambda: gnn.SAGEConv(F_IN, 3), lambda: gnn.GINConv(torch.nn.Identity()),
                                  lambda: gnn.GraphConv(F_IN, 3), lambda: gnn.GATConv(F_IN, 3)])
def test_size_must_fit_a_single_feature_tensor(make):
    """One x is both tables; a size other than (N, N) needs the (x_src, x_dst) pair, as in PyG."""
    edge_index, _ = weighted_graph()
    layer, x = make(), torch.randn(N, F_IN)
    layer(x, edge_index, size=(N, N))
    with pytest.raises(ValueError, match=r"size=\(9, 7\) does not fit x with 9 rows; pass \(x_src, x_dst\)"):
        layer(x, edge_index, size=(N, N - 2))


BIPARTITE_LAYERS = ("EdgeConv", "GATConv", "GATv2Conv", "GINConv", "GraphConv", "RGCNConv", "SAGEConv")
# Layers taking per-type dicts, and FastRGCNConv, whose inputs are RGCNConv's (checked there).
NOT_SINGLE_TABLE_LAYERS = ("FastRGCNConv", "HGTConv", "HeteroConv")


@pytest.mark.parametrize("name", [name for name in LAYER_NAMES
                                  if name not in BIPARTITE_LAYERS + NOT_SINGLE_TABLE_LAYERS])
def test_bipartite_feature_pairs_are_refused_by_name(name):
    """``layer((x_src, x_dst), edge_index)``, PyG's bipartite form, raised "'tuple' object
    has no attribute 'shape'"; now it says what is unsupported."""
    layer = {"EdgeConv": lambda: gnn.EdgeConv(torch.nn.Linear(2 * F_IN, 3)),
             "GINConv": lambda: gnn.GINConv(torch.nn.Identity()),
             "APPNP": lambda: gnn.APPNP(2, 0.1),
             "ChebConv": lambda: gnn.ChebConv(F_IN, 3, K=2),
             "RGCNConv": lambda: gnn.RGCNConv(F_IN, 3, num_relations=2),
             "RGATConv": lambda: gnn.RGATConv(F_IN, 3, num_relations=2),
             }.get(name, lambda: getattr(gnn, name)(F_IN, 3))()
    edge_index, _ = weighted_graph()
    x = torch.randn(N, F_IN)
    extra = (torch.zeros(edge_index.shape[1], dtype=torch.long),) if name in ("RGCNConv", "RGATConv") else ()
    with pytest.raises(NotImplementedError, match=rf"{name}: bipartite input .*issue #12"):
        layer((x, x), edge_index, *extra)


@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "DotGATConv"])
def test_attention_on_a_graph_without_vertices_gives_an_empty_output(name, concat):
    """PyG gives [0, heads * C] (concat) or [0, C]; the concatenation's reshape(0, -1) raised."""
    layer = getattr(gnn, name)(F_IN, 4, heads=3, concat=concat)
    out = layer(torch.randn(0, F_IN), torch.zeros(2, 0, dtype=torch.long))
    assert out.shape == (0, 12 if concat else 4)
    if hasattr(pyg, name):
        assert out.shape == getattr(pyg, name)(F_IN, 4, heads=3, concat=concat)(
            torch.randn(0, F_IN), torch.zeros(2, 0, dtype=torch.long)).shape


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_return_attention_weights_false_returns_just_the_output_like_pyg(name):
    edge_index, _ = weighted_graph()
    layer, x = getattr(gnn, name)(F_IN, 2), torch.randn(N, F_IN)
    assert torch.equal(layer(x, edge_index, return_attention_weights=False), layer(x, edge_index))


def uncoalesced_adj_t(weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(edge_index, adj_t): the loop-free edges 0->1 (stored twice), 2->1, 1->0, 3->2 as a
    COO adj_t straight from ``torch.sparse_coo_tensor``, which leaves the duplicate
    uncoalesced; ``weights`` (ones by default) are the stored values."""
    edge_index = torch.tensor([[0, 0, 2, 1, 3], [1, 1, 1, 0, 2]])
    values = torch.ones(5, dtype=torch.float64) if weights is None else weights
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), values, (4, 4))
    assert not adj_t.is_coalesced()
    return edge_index, adj_t


@pytest.mark.parametrize("aggr", ["add", "mean", "max"])
def test_an_uncoalesced_weighted_adj_t_is_its_sum(aggr, device):
    """A sparse tensor's duplicate entries are one entry holding their sum: PyG's
    GraphConv reads its coalesced form (one neighbour of weight 0.5 + 1.5), where
    gnnfuse read two edges, so the mean halved and the max took the larger copy
    (outputs 0.177 and 0.395 off relative on a fuzzed multigraph)."""
    torch.manual_seed(0)
    ours, ref = gnn.GraphConv(F_IN, 3, aggr=aggr).double().to(device), pyg.GraphConv(F_IN, 3, aggr=aggr).double()
    ours.load_state_dict(ref.state_dict())
    _, adj_t = uncoalesced_adj_t(torch.tensor([0.5, 1.5, 0.7, 1.2, 0.9], dtype=torch.float64))
    x = torch.randn(4, F_IN, dtype=torch.float64)
    out = ours(x.to(device), adj_t.to(device))
    torch.testing.assert_close(out.cpu(), ref(x, adj_t.coalesce()), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_sage_refuses_an_uncoalesced_adj_t_with_a_repeated_entry(aggr):
    """Two stored ones at one position are the entry 2: PyG's SAGE aggregates by spmm over
    the coalesced matrix, one neighbour of weight 2, where gnnfuse took two unweighted
    edges (mean 0.167 off relative on a fuzzed multigraph, max 0.347). gnnfuse's SAGE
    reads only a pattern, so the weight is refused; without the repeat it runs."""
    edge_index, adj_t = uncoalesced_adj_t()
    layer, x = gnn.SAGEConv(F_IN, 3, aggr=aggr).double(), torch.randn(4, F_IN, dtype=torch.float64)
    with pytest.raises(ValueError, match="edge weights .a COO entry stored twice counts as 2"):
        layer(x, adj_t)
    unique = torch.sparse_coo_tensor(edge_index[:, 1:].flip(0), torch.ones(4, dtype=torch.float64), (4, 4))
    torch.testing.assert_close(layer(x, unique), layer(x, edge_index[:, 1:]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sparse_size", [(N + 2, N + 2), (N, N + 2), (N + 2, None)])
@pytest.mark.parametrize("make", [lambda: gnn.GCNConv(F_IN, 3), lambda: gnn.SAGEConv(F_IN, 3), lambda: gnn.GATConv(F_IN, 3)])
def test_edge_index_declaring_other_node_counts_than_x_is_refused(make, sparse_size):
    """An EdgeIndex whose sparse_size says 11 vertices, given features of 9, ran on 9 (its
    declared size silently dropped) where PyG raises, and where gnnfuse itself refuses a
    sparse adj_t of the wrong size."""
    edge_index, _ = weighted_graph()
    wrapped = EdgeIndex(edge_index, sparse_size=sparse_size)
    with pytest.raises(ValueError, match=r"EdgeIndex has sparse_size=.* but the node features have 9 rows"):
        make()(torch.randn(N, F_IN), wrapped)
    make()(torch.randn(N, F_IN), EdgeIndex(edge_index, sparse_size=(N, N)))


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_attention_refuses_an_uncoalesced_adj_t_with_a_repeated_entry(name):
    """PyG's GAT and GATv2 read an uncoalesced COO adj_t as its coalesced matrix: adding
    self loops coalesces it, so a position stored twice is one edge (without loops PyG
    refuses it). gnnfuse scored two edges, 0.146 (GAT) and 0.149 (GATv2) off PyG's output
    on the same input; the repeat is now the value 2, which the pattern-only layer refuses."""
    edge_index, adj_t = uncoalesced_adj_t()
    layer, x = getattr(gnn, name)(F_IN, 3).double(), torch.randn(4, F_IN, dtype=torch.float64)
    with pytest.raises(ValueError, match="edge weights .a COO entry stored twice counts as 2"):
        layer(x, adj_t)
    unique = torch.sparse_coo_tensor(edge_index[:, 1:].flip(0), torch.ones(4, dtype=torch.float64), (4, 4))
    ref = getattr(pyg, name)(F_IN, 3).double()
    ref.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x, unique), ref(x, unique), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_attention_refuses_edge_attr_with_an_uncoalesced_adj_t(name):
    """edge_attr's rows follow an uncoalesced adj_t's stored entries, which reading it as
    its coalesced matrix reorders: GAT paired the rows with other edges (0.336 off the
    same call on edge_index). PyG refuses the pair too (it cannot index an uncoalesced
    tensor, or asserts no edge_attr when adding loops); coalesced, it runs."""
    edge_index = torch.tensor([[3, 0, 2, 1, 3], [0, 1, 0, 2, 2]])      # stored out of row order
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(5, dtype=torch.float64), (4, 4))
    edge_attr = torch.randn(5, 2, dtype=torch.float64)
    layer, x = getattr(gnn, name)(F_IN, 3, edge_dim=2).double(), torch.randn(4, F_IN, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"{name}: edge_attr with an uncoalesced COO adj_t"):
        layer(x, adj_t, edge_attr)
    order = (edge_index[1] * 4 + edge_index[0]).argsort()             # the coalesced (row-major) order
    torch.testing.assert_close(layer(x, adj_t.coalesce(), edge_attr[order]), layer(x, edge_index, edge_attr),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["gcn", "graphconv-add-narrowing", "sgc-narrowing", "tag-narrowing", "appnp"])
@pytest.mark.parametrize("coalesce", [False, True])
def test_edge_weight_beside_a_sparse_adj_t_is_refused(name, coalesce):
    """PyG takes a sparse adj_t's weights from its values and ignores an edge_weight
    passed beside it; gnnfuse applied that edge_weight to the stored entries, 0.25 off
    PyG's GraphConv output (0.16 GCN), and 0.36 off its own edge_index call once the
    entries were coalesced into another order. The pair is refused; the weights go in
    the adj_t's values."""
    ours, _ = WEIGHTED[name]()
    edge_index, weight = weighted_graph()
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(len(weight), dtype=torch.float64), (N, N))
    adj_t = adj_t.coalesce() if coalesce else adj_t
    with pytest.raises(ValueError, match="edge_weight beside a sparse adj_t"):
        ours.double()(torch.randn(N, F_IN, dtype=torch.float64), adj_t, weight)


# name -> factory of (ours, PyG) for the layers whose PyG forward takes a CSC adj_t
CSC_LAYERS = {
    "sage-mean": lambda: (gnn.SAGEConv(F_IN, 3), pyg.SAGEConv(F_IN, 3)),
    "sage-max": lambda: (gnn.SAGEConv(F_IN, 3, aggr="max"), pyg.SAGEConv(F_IN, 3, aggr="max")),
    "gin": lambda: (gnn.GINConv(torch.nn.Linear(F_IN, 3)), pyg.GINConv(torch.nn.Linear(F_IN, 3))),
    "graphconv": lambda: (gnn.GraphConv(F_IN, 3, aggr="mean"), pyg.GraphConv(F_IN, 3, aggr="mean")),
}


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name", sorted(CSC_LAYERS))
def test_a_csc_adj_t_is_read_as_its_matrix(name, weighted, device):
    """A CSC tensor stores the same matrix as a CSR one, column by column, and PyG's SAGE,
    GIN and GraphConv take it (their spmm reads the matrix: the output of PyG's call on the
    edge_index and weights); gnnfuse refused it ("must be a sparse COO or CSR tensor").
    Read as its matrix, it gives PyG's output and gradients; its values, when not all 1,
    are weights as a CSR tensor's are (GraphConv weighs by them, the pattern-only layers
    refuse them). PyG is called on the edge_index here: it generates a layer class's
    ``propagate`` once, for its first instance, so a PyG SAGE built after one with a list
    aggregation (test_torch_compile's) fails on every sparse adj_t."""
    torch.manual_seed(0)
    ours, ref = (m.double() for m in CSC_LAYERS[name]())
    ours.load_state_dict(ref.state_dict())
    ours = ours.to(device)
    edge_index, _ = weighted_graph()
    edge_index = torch.unique(edge_index, dim=1)                     # a CSC tensor stores each position once
    values = (torch.linspace(0.5, 1.5, edge_index.shape[1], dtype=torch.float64) if weighted
              else torch.ones(edge_index.shape[1], dtype=torch.float64))
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), values, (N, N)).coalesce().to_sparse_csc()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    if weighted and name != "graphconv":
        with pytest.raises(ValueError, match="values other than 1"):
            ours(x.to(device), adj_t.to(device))
        return
    pyg_args = (edge_index, values) if weighted else (edge_index,)
    assert_same_outputs_and_grads(ours, ref, lambda inp: ours(inp.to(device), adj_t.to(device)).cpu(),
                                  lambda inp: ref(inp, *pyg_args), x)


LOOP_ADDING = {"GCNConv": lambda m: m.GCNConv(5, 3), "APPNP": lambda m: m.APPNP(K=2, alpha=0.1),
               "SGConv": lambda m: m.SGConv(5, 3, K=2)}


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])     # csc: was accepted, silently
@pytest.mark.parametrize("name", LOOP_ADDING)
def test_a_torch_sparse_adj_t_with_stored_loops_is_refused_where_pyg_adds_more(name, layout):
    """PyG's gcn_norm adds a loop to every vertex of a torch sparse adj_t on top of a
    stored one, where gnnfuse (and PyG for an edge_index) keeps one: refused by name. The
    same adj_t without its diagonal gives PyG's numbers."""
    torch.manual_seed(0)
    ours_layer, pyg_layer = LOOP_ADDING[name](gnn).double(), LOOP_ADDING[name](pyg).double()
    pyg_layer.load_state_dict(ours_layer.state_dict())
    x = torch.randn(4, 5, dtype=torch.float64)
    edge_index = torch.tensor([[0, 2, 1, 3, 1], [1, 1, 0, 2, 1]])       # 1 -> 1 is a stored loop
    as_layout = {"coo": lambda a: a, "csr": lambda a: a.to_sparse_csr(), "csc": lambda a: a.to_sparse_csc()}[layout]

    def adj(ei):
        return as_layout(torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64), (4, 4)).coalesce())
    with pytest.raises(ValueError, match=f"{name}: the torch sparse adj_t stores self loops"):
        ours_layer(x, adj(edge_index))
    # PyG's gcn_norm refuses a CSC adj_t: the same matrix as CSR is its oracle
    theirs = adj if layout != "csc" else (lambda ei: adj(ei).to_sparse_coo().coalesce().to_sparse_csr())
    assert not torch.allclose(pyg_layer(x, theirs(edge_index)), pyg_layer(x, edge_index))     # why it is refused
    loop_free = edge_index[:, edge_index[0] != edge_index[1]]
    torch.testing.assert_close(ours_layer(x, adj(loop_free)), pyg_layer(x, theirs(loop_free)))
    ours_layer.add_self_loops = False      # nothing added: the stored loop is an edge as any other
    pyg_layer.add_self_loops = False
    torch.testing.assert_close(ours_layer(x, adj(edge_index)), pyg_layer(x, theirs(edge_index)))


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "SAGEConv", "GraphConv"])
def test_a_coo_adj_t_flagged_coalesced_that_repeats_a_position_is_refused(name):
    """PyG's ``to_edge_index``, ``GCNConv`` and ``GATConv`` flag a COO adj_t coalesced in
    place without merging it (``adj._coalesced_(True)``); gnnfuse trusted the flag and
    read a position stored twice as two edges (GAT 0.16, SAGE's mean 1.3 off PyG, which
    sums it), while PyG's GraphConv mean and max keep the two (summed, 0.5-2 off): PyG
    disagrees with itself, so the input is refused. Stored out of order alone, it is the
    same matrix and runs."""
    edge_index, adj_t = uncoalesced_adj_t()
    flagged = torch.sparse_coo_tensor(adj_t._indices(), adj_t._values(), adj_t.shape, is_coalesced=True)
    assert flagged.is_coalesced()
    kwargs = {"aggr": "mean"} if name == "GraphConv" else {}
    layer, x = getattr(gnn, name)(F_IN, 3, **kwargs).double(), torch.randn(4, F_IN, dtype=torch.float64)
    with pytest.raises(ValueError, match="flagged coalesced but stores a position twice"):
        layer(x, flagged)
    # the repeat stored next to itself, every other entry in row-major order: only the
    # repeat itself shows (a check for order alone, ``>=``, read it as two edges)
    rows, cols = adj_t._indices()
    in_order = (rows * 4 + cols).argsort(stable=True)
    flagged = torch.sparse_coo_tensor(adj_t._indices()[:, in_order], adj_t._values()[in_order], adj_t.shape,
                                      is_coalesced=True)
    with pytest.raises(ValueError, match="flagged coalesced but stores a position twice"):
        layer(x, flagged)
    ordered = torch.sparse_coo_tensor(edge_index[:, 1:].flip(0), torch.ones(4, dtype=torch.float64),
                                      (4, 4)).coalesce()
    flagged = torch.sparse_coo_tensor(ordered._indices().flip(1), ordered._values(), (4, 4), is_coalesced=True)
    ref = getattr(pyg, name)(F_IN, 3, **kwargs).double()
    ref.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x, flagged), ref(x, ordered), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", ["GCNConv", "GraphConv", "SGConv", "APPNP", "SAGEConv", "GATConv"])
@pytest.mark.parametrize("make", [lambda a: a.to_sparse_bsr((2, 2)), lambda a: a.to_sparse_bsc((2, 2)),
                                  lambda a: torch.stack([a, a])], ids=["bsr", "bsc", "batched"])
def test_a_blocked_or_batched_adj_t_is_refused(layer, make):
    """A block layout stores the zeros of its blocks, which GCN, SGC and APPNP read as
    edges (the diagonal's became loops of weight 0, so no unit loop was added: 1.66 off
    PyG's output, without a word); a batched adj_t failed on 'too many values to unpack'."""
    adj = torch.sparse_coo_tensor(torch.tensor([[1, 2, 3, 0], [0, 1, 2, 3]]), torch.ones(4, dtype=torch.float64),
                                  (4, 4)).coalesce()
    conv = gnn.APPNP(K=2, alpha=0.1) if layer == "APPNP" else getattr(gnn, layer)(F_IN, 3).double()
    with pytest.raises(ValueError, match="a sparse adjacency must be (a sparse COO, CSR or CSC tensor|2-D)"):
        conv(torch.randn(4, F_IN, dtype=torch.float64), make(adj))


@pytest.mark.parametrize("layer", ["GCNConv", "GraphConv", "SGConv", "APPNP", "SAGEConv", "GATConv"])
def test_a_blocked_scipy_matrix_is_refused(layer):
    """A scipy BSR matrix stores the zeros of its blocks too, and its ``tocoo()`` lists
    them: GCNConv read the diagonal block's zeros as loops of weight 0 and added no unit
    loop there (1.13 off the same matrix in CSR, without a word), as a torch BSR adj_t
    did; the graph constructors took them for edges."""
    import scipy.sparse as sp
    dense = torch.zeros(4, 4, dtype=torch.float64)
    dense[0, 1] = dense[1, 0] = dense[2, 3] = 1
    blocked = sp.bsr_matrix(dense.numpy(), blocksize=(2, 2))
    conv = gnn.APPNP(K=2, alpha=0.1) if layer == "APPNP" else getattr(gnn, layer)(F_IN, 3).double()
    with pytest.raises(ValueError, match="scipy BSR matrix stores the zeros of its blocks"):
        conv(torch.randn(4, F_IN, dtype=torch.float64), blocked)
    with pytest.raises(ValueError, match="scipy BSR matrix stores the zeros of its blocks"):
        gnnfuse.Graph.from_scipy(blocked)


# PyG's layers build their aggregation at construction (``aggr_module``), so a later
# ``layer.aggr = ...`` changes nothing -- except FastRGCNConv, whose ``aggregate`` reads
# ``self.aggr`` at each call. GraphConv, EdgeConv and RGCNConv read the name at each call
# here (RGCNConv summed for 'max'): outputs off by up to 2.0, without a word.
REASSIGNED_AGGR = {
    "GraphConv": (lambda m: m.GraphConv(4, 3), False, ("max", "mean")),
    "EdgeConv": (lambda m: m.EdgeConv(torch.nn.Linear(8, 3)), False, ("mean", "add")),
    "RGCNConv": (lambda m: m.RGCNConv(4, 3, 2), True, ("max", "add")),
    "FastRGCNConv-mean": (lambda m: m.FastRGCNConv(4, 3, 2), True, ("add",)),
    "FastRGCNConv-add": (lambda m: m.FastRGCNConv(4, 3, 2, aggr="add"), True, ("mean",)),
    "SAGEConv": (lambda m: m.SAGEConv(4, 3, aggr="max"), False, ("mean",)),
}


@pytest.mark.parametrize("name", sorted(REASSIGNED_AGGR))
def test_an_aggr_set_after_construction_does_what_it_does_in_pyg(name):
    make, typed, names = REASSIGNED_AGGR[name]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, dtype=torch.float64, generator=gen)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 0, 0]])
    args = (x, edge_index, torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])) if typed else (x, edge_index)
    theirs, ours = make(pyg).double(), make(gnn).double()
    ours.load_state_dict(theirs.state_dict())
    for aggr in names:
        theirs.aggr = ours.aggr = aggr
        torch.testing.assert_close(ours(*args), theirs(*args), rtol=1e-12, atol=1e-12)


# Layers whose PyG namesake's aggregate() calls aggr_module, while gnnfuse's fuses the
# reduction it was built with (SAGEConv runs its aggr_module, as PyG's does)
FUSED_AGGREGATION = {
    "GCNConv": lambda m: m.GCNConv(4, 3), "GATConv": lambda m: m.GATConv(4, 3), "GATv2Conv": lambda m: m.GATv2Conv(4, 3),
    "GINConv": lambda m: m.GINConv(torch.nn.Linear(4, 3)), "GraphConv": lambda m: m.GraphConv(4, 3),
    "APPNP": lambda m: m.APPNP(2, 0.1), "SGConv": lambda m: m.SGConv(4, 3), "TAGConv": lambda m: m.TAGConv(4, 3),
    "ChebConv": lambda m: m.ChebConv(4, 3, 2), "EdgeConv": lambda m: m.EdgeConv(torch.nn.Linear(8, 3)),
    "RGCNConv": lambda m: m.RGCNConv(4, 3, 2), "RGATConv": lambda m: m.RGATConv(4, 3, 2),
    # HGTConv kept its sum silently: 0.094 off PyG's output after a MaxAggregation
    "HGTConv": lambda m: m.HGTConv(4, 3, (["a"], [("a", "to", "a")])),
}


@pytest.mark.parametrize("name", sorted(FUSED_AGGREGATION))
def test_an_aggr_module_set_after_construction_is_refused_where_pyg_would_use_it(name):
    """PyG's layer aggregates with an ``aggr_module`` assigned after construction; torch
    stored one assigned to gnnfuse's layer as a submodule nothing read, and the layer kept
    its own reduction silently (GraphConv 0.95, GINConv 0.63, EdgeConv 0.48 off PyG's
    output for a max or softmax aggregation)."""
    from torch_geometric.nn.aggr import MaxAggregation
    theirs, ours = FUSED_AGGREGATION[name](pyg), FUSED_AGGREGATION[name](gnn)
    theirs.aggr_module = MaxAggregation()          # PyG takes it
    with pytest.raises(AttributeError, match=f"{name} fuses the aggregation it was built with .* SAGEConv"):
        ours.aggr_module = MaxAggregation()
    assert "aggr_module" not in dict(ours.named_children())


def test_an_aggr_module_set_after_construction_is_taken_where_pyg_ignores_it_or_runs_it():
    """PyG's FastRGCNConv overrides aggregate() and never calls aggr_module; SAGEConv runs it."""
    from torch_geometric.nn.aggr import MaxAggregation
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, dtype=torch.float64, generator=gen)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 0, 0]])
    edge_type = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    for make, args in ((lambda m: m.FastRGCNConv(4, 3, 2), (x, edge_index, edge_type)),
                       (lambda m: m.SAGEConv(4, 3), (x, edge_index))):
        theirs, ours = make(pyg).double(), make(gnn).double()
        ours.load_state_dict(theirs.state_dict())
        theirs.aggr_module = MaxAggregation()
        ours.aggr_module = MaxAggregation()
        torch.testing.assert_close(ours(*args), theirs(*args), rtol=1e-12, atol=1e-12)


def test_fast_rgcn_refuses_an_aggr_it_cannot_take_set_after_construction():
    conv = gnn.FastRGCNConv(4, 3, 2)
    conv.aggr = "max"       # PyG's fails on an assert without a message
    with pytest.raises(ValueError, match="FastRGCNConv: aggr must be 'mean', 'add' or 'sum', got 'max'"):
        conv(torch.randn(6, 4), torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 1]))


def test_relational_layers_name_themselves_and_every_refused_argument():
    """FastRGCNConv's refusals, inherited from RGCNConv, named RGCNConv (a ``flow`` gave
    Python's "RGCNConv.__init__() got an unexpected keyword argument"), and RGATConv left
    out an ``aggr`` it refused beside another argument."""
    edge_index, edge_type = torch.tensor([[0], [1]]), torch.tensor([0])
    with pytest.raises(TypeError, match=r"^FastRGCNConv: flow='target_to_source' is not taken"):
        gnn.FastRGCNConv(5, 4, 3, flow="target_to_source")
    with pytest.raises(ValueError, match="^FastRGCNConv: block-diagonal decomposition"):
        gnn.FastRGCNConv(5, 4, 3, num_blocks=1)(None, edge_index, edge_type)
    with pytest.raises(ValueError, match="^RGCNConv: aggr must be 'mean', 'add' or 'sum'"):
        gnn.RGCNConv(5, 4, 3, aggr="max")
    with pytest.raises(TypeError, match=r"^RGATConv: aggr='mean', node_dim=1 are not taken"):
        gnn.RGATConv(5, 4, 3, aggr="mean", node_dim=1)
    gnn.RGATConv(5, 4, 3, aggr="sum")      # PyG's default, named


def test_relational_layers_on_a_graph_without_edge_types_say_so():
    """Said "the graph has None edge types", advising num_edge_types=..., which a Graph
    without edge_type refuses; with a forward edge_type, "not both"."""
    x, edge_type = torch.randn(3, 3), torch.tensor([0, 1, 0, 1])
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    for layer in (gnn.RGCNConv(3, 2, 2), gnn.FastRGCNConv(3, 2, 2), gnn.RGATConv(3, 2, 2)):
        for args in ((x, graph), (x, graph, edge_type)):
            with pytest.raises(ValueError, match=f"^{type(layer).__name__}: the Graph has no edge types; build it "
                                                 r"with Graph\(src, dst, edge_type="):
                layer(*args)


@pytest.mark.parametrize("layout", ["csr", "csc"])
@pytest.mark.parametrize("layer", ["GCNConv", "GraphConv", "SGConv", "TAGConv"])
def test_edge_weights_packed_into_an_adj_t_take_their_gradient(layer, layout):
    """Learnt weights given as a CSR adj_t's values got no gradient (left None, so an
    optimizer never moved them): their values were read by ``_values()``, which autograd
    does not follow. PyG's gradients are the oracle."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 4, dtype=torch.float64, generator=gen)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 0]])
    grads = []
    theirs = getattr(pyg, layer)(4, 3).double()
    ours = getattr(gnn, layer)(4, 3).double()
    ours.load_state_dict(theirs.state_dict())
    for conv in (theirs, ours):
        weight = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).add(0.5)
        weight.requires_grad_()
        adj_t = torch.sparse_coo_tensor(edge_index.flip(0), weight, (5, 5)).coalesce()
        # csc: its COO form comes uncoalesced, and reading its values raised torch's
        # "Cannot get values on an uncoalesced tensor" (PyG's forward takes it)
        adj_t = adj_t.to_sparse_csc() if layout == "csc" and conv is ours else adj_t.to_sparse_csr()
        conv(x, adj_t).pow(2).sum().backward()
        grads.append(weight.grad)
    assert grads[1] is not None
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-12)


def test_a_pattern_only_layer_refuses_an_adj_t_whose_values_take_a_gradient():
    """All-1 values that require a gradient: a pattern-only layer would silently give none."""
    adj_t = torch.sparse_coo_tensor(torch.tensor([[1, 2], [0, 1]]), torch.ones(2, dtype=torch.float64),
                                    (3, 3)).coalesce().requires_grad_()
    with pytest.raises(ValueError, match="values require a gradient"):
        gnn.GATConv(4, 3).double()(torch.randn(3, 4, dtype=torch.float64), adj_t)


@pytest.mark.parametrize("name,kwargs", [("SAGEConv", {}), ("GraphConv", {}), ("SGConv", {}),
                                         ("GATv2Conv", {"heads": 2}), ("GATConv", {"heads": 2}), ("GCNConv", {})])
@pytest.mark.parametrize("in_channels", [-1, 0])
def test_features_of_width_zero_give_the_bias_as_in_pyg(name, kwargs, in_channels):
    """An [N, 0] x: PyG's layers return [N, out] (their bias alone). gnnfuse's failed in
    PyG's weight initialiser (ZeroDivisionError at a fan of 0) or, for GAT, reshaping
    the folded attention. PyG draws nothing for a map of no inputs and leaves its bias
    uninitialised; gnnfuse draws nothing either (the other parameters are PyG's draws)
    and zeroes that bias, as torch's Linear draws it."""
    import torch_geometric.nn as pyg_nn
    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 0]])
    x = torch.randn(3, 0, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(in_channels, 2, **kwargs).double()
    expected_shape = theirs(x, ei).shape
    torch.manual_seed(0)
    ours = getattr(gnn, name)(in_channels, 2, **kwargs).double()
    out = ours(x, ei)
    out.sum().backward()
    assert out.shape == expected_shape and x.grad.shape == x.shape
    bias = ours.bias if getattr(ours, "bias", None) is not None else torch.zeros(())
    lin_bias = [p for n, p in ours.named_parameters() if n.endswith(".bias")]
    torch.testing.assert_close(out, (bias + sum(lin_bias, torch.zeros(()))).expand_as(out).to(out.dtype))
    for key, value in theirs.state_dict().items():     # the same draws, the uninitialised maps' aside
        if value.numel() and not (key.endswith(".bias") and "lin" in key):
            torch.testing.assert_close(ours.state_dict()[key], value, msg=key)
