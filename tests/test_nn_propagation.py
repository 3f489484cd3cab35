"""The propagation-family layers (GIN, GraphConv, APPNP, SGC, TAG, Chebyshev) and GCNConv's
improved/cached/normalize options against PyG itself: same state dict, same outputs and
gradients in float64, with a gnnfuse Graph or a PyG edge_index, on the reference backend
and on generated kernels (Triton's interpreter without a GPU)."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg

import gnnfuse
from gnnfuse import nn as gnn
from layer_check import assert_same_outputs_and_grads, rel_err

N, F_IN = 20, 12


def graph_edges() -> torch.Tensor:
    """Random multigraph on N vertices: the last three isolated, loops on 2 and (twice) on 5."""
    g = torch.Generator().manual_seed(0)
    edges = torch.randint(0, N - 3, (2, 60), generator=g)
    return torch.cat([edges, torch.tensor([[2, 5, 5], [2, 5, 5]])], dim=1)


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(F_IN, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))


def gin_pair():
    return gnn.GINConv(mlp(), eps=0.3, train_eps=True), pyg.GINConv(mlp(), eps=0.3, train_eps=True)


def ones(edge_index: torch.Tensor) -> torch.Tensor:
    return torch.ones(edge_index.shape[1], dtype=torch.float64, device=edge_index.device)


# name -> (factory of (ours, PyG), extra forward arguments for the PyG layer)
LAYERS = {
    # PyG 2.8 applies improved's fill of 2 only when given edge weights; all-ones weights
    # make it compute the documented A + 2I.
    "gcn-improved": (lambda: (gnn.GCNConv(F_IN, 6, improved=True), pyg.GCNConv(F_IN, 6, improved=True)),
                     lambda ei: (ones(ei),)),
    "gcn-unnormalized": (lambda: (gnn.GCNConv(F_IN, 6, normalize=False), pyg.GCNConv(F_IN, 6, normalize=False)),
                         lambda ei: ()),
    "gin-train-eps": (gin_pair, lambda ei: ()),
    "graphconv-add": (lambda: (gnn.GraphConv(F_IN, 6), pyg.GraphConv(F_IN, 6)), lambda ei: ()),
    "graphconv-mean-widening": (lambda: (gnn.GraphConv(F_IN, 20, aggr="mean"), pyg.GraphConv(F_IN, 20, aggr="mean")),
                                lambda ei: ()),
    "graphconv-max": (lambda: (gnn.GraphConv(F_IN, 6, aggr="max"), pyg.GraphConv(F_IN, 6, aggr="max")),
                      lambda ei: ()),
    "appnp": (lambda: (gnn.APPNP(K=3, alpha=0.1), pyg.APPNP(K=3, alpha=0.1)), lambda ei: ()),
    "appnp-no-loops": (lambda: (gnn.APPNP(2, 0.2, add_self_loops=False), pyg.APPNP(2, 0.2, add_self_loops=False)),
                       lambda ei: ()),
    "appnp-unnormalized": (lambda: (gnn.APPNP(2, 0.2, normalize=False), pyg.APPNP(2, 0.2, normalize=False)),
                           lambda ei: ()),
    "sgc-narrowing": (lambda: (gnn.SGConv(F_IN, 6, K=2), pyg.SGConv(F_IN, 6, K=2)), lambda ei: ()),
    "sgc-widening-no-loops": (lambda: (gnn.SGConv(F_IN, 20, K=2, add_self_loops=False),
                                       pyg.SGConv(F_IN, 20, K=2, add_self_loops=False)), lambda ei: ()),
    "tag-narrowing": (lambda: (gnn.TAGConv(F_IN, 6, K=2), pyg.TAGConv(F_IN, 6, K=2)), lambda ei: ()),
    "tag-widening-unnormalized": (lambda: (gnn.TAGConv(F_IN, 20, K=2, normalize=False),
                                           pyg.TAGConv(F_IN, 20, K=2, normalize=False)), lambda ei: ()),
    "cheb-sym": (lambda: (gnn.ChebConv(F_IN, 6, K=3), pyg.ChebConv(F_IN, 6, K=3)), lambda ei: ()),
    "cheb-rw": (lambda: (gnn.ChebConv(F_IN, 6, K=3, normalization="rw"),
                         pyg.ChebConv(F_IN, 6, K=3, normalization="rw")), lambda ei: ()),
    "cheb-unnormalized": (lambda: (gnn.ChebConv(F_IN, 6, K=3, normalization=None),
                                   pyg.ChebConv(F_IN, 6, K=3, normalization=None)), lambda ei: ()),
}


def device_for(backend: str) -> str:
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def pair(name: str, device: str = "cpu"):
    ours, ref = (m.double().to(device) for m in LAYERS[name][0]())
    ours.load_state_dict(ref.state_dict())
    return ours, ref


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("as_graph", [True, False], ids=["Graph", "edge_index"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_layer_matches_pyg(name, as_graph, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    torch.manual_seed(0)
    device = device_for(backend)
    ours, ref = pair(name, device)
    edge_index = graph_edges().to(device)
    graph = gnnfuse.Graph.from_edge_index(edge_index, num_nodes=N) if as_graph else edge_index
    extra = LAYERS[name][1](edge_index)
    x = torch.randn(N, F_IN, dtype=torch.float64).to(device)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, graph), lambda xs: ref(xs, edge_index, *extra), x)


@pytest.mark.parametrize("normalization", ["sym", "rw", None])
def test_chebyshev_with_explicit_lambda_max(normalization):
    torch.manual_seed(1)
    ours, ref = (m.double() for m in (gnn.ChebConv(F_IN, 6, K=4, normalization=normalization),
                                      pyg.ChebConv(F_IN, 6, K=4, normalization=normalization)))
    ours.load_state_dict(ref.state_dict())
    edge_index = graph_edges()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    lam = torch.tensor(3.5, dtype=torch.float64)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index, lambda_max=3.5),
                                  lambda xs: ref(xs, edge_index, lambda_max=lam), x)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("normalization", ["sym", "rw", None])
def test_chebyshev_on_a_node_type_without_rows_in_a_hetero_batch(normalization, weighted):
    """A mini-batch in which a HeteroConv relation's node type has no rows: the output has
    no rows either, whatever lambda_max. The default lambda_max took the max of an empty
    Laplacian diagonal -- torch's "max(): Expected reduction dim to be specified for
    input.numel() == 0" even with lambda_max given, where PyG gives the [0, 6] output."""
    edge_type = ("a", "r", "a")
    torch.manual_seed(1)
    ref = pyg.HeteroConv({edge_type: pyg.ChebConv(F_IN, 6, K=3, normalization=normalization)}).double()
    ours = gnn.HeteroConv({edge_type: gnn.ChebConv(F_IN, 6, K=3, normalization=normalization)}).double()
    ours.load_state_dict(ref.state_dict())
    x = {"a": torch.zeros(0, F_IN, dtype=torch.float64)}
    edges = {edge_type: torch.zeros(2, 0, dtype=torch.long)}
    weights = {"edge_weight_dict": {edge_type: torch.zeros(0, dtype=torch.float64)}} if weighted else {}
    lam = {edge_type: torch.tensor(2.0, dtype=torch.float64)}
    assert ref(x, edges, lambda_max_dict=lam, **weights)["a"].shape == (0, 6)
    for extra in ({"lambda_max_dict": lam}, {}):
        out = ours(x, edges, **extra, **weights)
        assert out.keys() == {"a"} and out["a"].shape == (0, 6) and out["a"].dtype == torch.float64


def _cached_twins(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """gnnfuse's and PyG's ``cached=True`` layer of one kind."""
    return {
        "gcn": lambda: (gnn.GCNConv(F_IN, 6, cached=True), pyg.GCNConv(F_IN, 6, cached=True)),
        "appnp": lambda: (gnn.APPNP(2, 0.1, cached=True), pyg.APPNP(2, 0.1, cached=True)),
        "sgc": lambda: (gnn.SGConv(F_IN, 6, K=2, cached=True), pyg.SGConv(F_IN, 6, K=2, cached=True)),
    }[name]()


@pytest.mark.parametrize("name", ["gcn", "appnp", "sgc"])
def test_cached_layers_reuse_their_first_graph_like_pyg(name):
    """cached=True: the second call, given another graph (and for SGC other features),
    still propagates over what the first call saw -- PyG's transductive contract."""
    torch.manual_seed(2)
    ours, ref = _cached_twins(name)
    ours, ref = ours.double(), ref.double()
    ours.load_state_dict(ref.state_dict())
    first, second = graph_edges(), torch.randint(0, N, (2, 30))
    x = torch.randn(N, F_IN, dtype=torch.float64)
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, first), lambda xs: ref(xs, first), x)
    ours.zero_grad()
    ref.zero_grad()
    x2 = torch.randn(N, F_IN, dtype=torch.float64)
    again, expected = ours(x2, second), ref(x2, second)
    assert rel_err(again, expected) < 1e-9
    fresh = type(ours)(**{"gcn": dict(in_channels=F_IN, out_channels=6), "appnp": dict(K=2, alpha=0.1),
                          "sgc": dict(in_channels=F_IN, out_channels=6, K=2)}[name]).double()
    fresh.load_state_dict(ours.state_dict())
    assert rel_err(again, fresh(x2, second)) > 1e-3        # the cache really was used
    ours.reset_parameters()
    ours.load_state_dict(fresh.state_dict())
    assert rel_err(ours(x2, second), fresh(x2, second)) < 1e-12   # reset drops the cache


@pytest.mark.parametrize("name", ["gcn", "appnp", "sgc"])
def test_cached_layers_ignore_an_edit_of_their_first_edge_index_like_pyg(name, backend, device):
    """cached=True with the first ``edge_index`` then written in place: PyG keeps a
    normalised copy and propagates over the first graph. The layer kept the graph sharing
    the edited memory, which is refused once edited (the second GCN call raised
    GraphModifiedError where PyG returns the first graph's result); it keeps a copy now."""
    torch.manual_seed(3)
    ours, ref = _cached_twins(name)
    ours, ref = ours.double().to(device), ref.double().to(device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, F_IN, dtype=torch.float64, device=device)
    outputs = []
    for layer in (ours, ref):
        edge_index = graph_edges().to(device)
        layer(x, edge_index)
        edge_index[1, :8] = 0
        outputs.append(layer(x, edge_index))
    assert rel_err(*outputs) < 1e-9


@pytest.mark.parametrize("name", ["gcn", "appnp"])
def test_cached_layers_without_normalisation_propagate_over_the_graph_given_like_pyg(name):
    """PyG's GCN and APPNP read (and fill) their cache only when normalising: with
    ``normalize = False`` set after a cached call, PyG sums over the graph it is given. The
    kept first graph served that call (GCN 3.4 off PyG on a 9-vertex graph), and a call
    with another row count was refused."""
    torch.manual_seed(2)
    ours, ref = (layer.double() for layer in _cached_twins(name))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, F_IN, dtype=torch.float64)
    ours(x, graph_edges()), ref(x, graph_edges())
    for layer in (ours, ref):
        layer.normalize = layer.add_self_loops = False
    second = torch.randint(0, N, (2, 30))
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, second), lambda xs: ref(xs, second), x)
    fewer = torch.randn(N - 4, F_IN, dtype=torch.float64)
    third = torch.randint(0, N - 4, (2, 20))
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, third), lambda xs: ref(xs, third), fewer)


def test_gcn_normalize_turned_off_with_edge_weights_adds_no_self_loops_like_pyg():
    """``normalize = False`` set after construction leaves ``add_self_loops`` True (its
    default follows ``normalize`` at construction); PyG's forward adds loops only while
    normalising, so it sums the weighted edges given. With ``edge_weight`` gnnfuse added a
    loop of weight 1 per vertex all the same (1.85 off PyG on a 7-vertex graph)."""
    torch.manual_seed(3)
    ours, ref = gnn.GCNConv(F_IN, 6).double(), pyg.GCNConv(F_IN, 6).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, F_IN, dtype=torch.float64)
    edge_index = graph_edges()
    weight = torch.rand(edge_index.shape[1], dtype=torch.float64)
    ours(x, edge_index, weight)
    for layer in (ours, ref):
        layer.normalize = False
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, edge_index, weight),
                                  lambda xs: ref(xs, edge_index, weight), x)


@pytest.mark.parametrize("name, setting, value", [("gcn", "add_self_loops", False), ("gcn", "improved", True),
                                                  ("gcn", "flow", "target_to_source"),
                                                  ("appnp", "add_self_loops", False)])
def test_cached_layers_refuse_a_normalisation_setting_changed_after_caching(name, setting, value):
    """PyG keeps the *normalised* adjacency of the first call, so a setting that
    normalisation read, changed afterwards, does not reach it there; gnnfuse keeps the
    graph and normalised it anew with the new setting (GCN 1.2 off PyG after
    ``add_self_loops = False``), silently. That is refused, naming the setting; once the
    cache is dropped the setting applies, as in PyG."""
    torch.manual_seed(2)
    ours, ref = (layer.double() for layer in _cached_twins(name))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(N, F_IN, dtype=torch.float64)
    ours(x, graph_edges())
    setattr(ours, setting, value)
    with pytest.raises(ValueError, match=rf"cached=True\) normalised the graph of its first call with "
                                         rf"{setting}=.* would not apply {setting}={value!r}"):
        ours(x, graph_edges())
    ours._cached_edge_index = None
    setattr(ref, setting, value)
    # PyG 2.8 fills improved's loops with 2 only given edge weights (see LAYERS)
    weights = (ones(graph_edges()),) if setting == "improved" else ()
    assert_same_outputs_and_grads(ours, ref, lambda xs: ours(xs, graph_edges()),
                                  lambda xs: ref(xs, graph_edges(), *weights), x)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_appnp_edge_dropout_matches_pyg(normalize, backend, monkeypatch):
    """Training mode: with the same RNG state ours draws the same edge masks as PyG (same
    edge order, same weight vector), so outputs and gradients agree exactly; PyG needs
    explicit weights to drop out of an unnormalised adjacency."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    ours = gnn.APPNP(K=3, alpha=0.1, dropout=0.4, normalize=normalize).train()
    ref = pyg.APPNP(K=3, alpha=0.1, dropout=0.4, normalize=normalize).train()
    edge_index = graph_edges().to(device)
    extra = () if normalize else (ones(edge_index),)
    x = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(device)

    def seeded(fn):
        def run(xs):
            torch.manual_seed(4)
            return fn(xs)
        return run
    assert_same_outputs_and_grads(ours, ref, seeded(lambda xs: ours(xs, edge_index)),
                                  seeded(lambda xs: ref(xs, edge_index, *extra)), x)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("weighted", [False, True], ids=["", "edge_weight"])
def test_appnp_edge_dropout_on_a_feature_batch_drops_once_per_hop_like_pyg(normalize, weighted):
    """[B, N, F] features in training: PyG drops the adjacency's entries once per hop for
    the whole batch, so every matrix propagates over the same dropped graph. Each matrix
    drew its own masks (a seeded run 1.35 off PyG's, normalized, 0.98 unnormalized)."""
    ours = gnn.APPNP(K=3, alpha=0.1, dropout=0.5, normalize=normalize).train()
    ref = pyg.APPNP(K=3, alpha=0.1, dropout=0.5, normalize=normalize).train()
    edge_index = graph_edges()
    weight = torch.rand(edge_index.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(2)) + 0.1
    x = torch.randn(3, N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    outputs, grads = [], []
    for layer in (ours, ref):
        xs, ws = x.clone().requires_grad_(), weight.clone().requires_grad_()
        torch.manual_seed(4)
        out = layer(xs, edge_index, ws if weighted or not normalize else None)   # PyG drops given weights only
        (out * torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(5))).sum().backward()
        outputs.append(out)
        grads.append((xs.grad, ws.grad))
    assert rel_err(*outputs) < 1e-12
    assert rel_err(grads[0][0], grads[1][0]) < 1e-12
    if weighted or not normalize:
        assert rel_err(grads[0][1], grads[1][1]) < 1e-12


def test_appnp_edge_dropout_is_off_in_eval_and_unbiased_in_training():
    torch.manual_seed(5)
    graph = gnnfuse.Graph.from_edge_index(graph_edges(), num_nodes=N)
    x = torch.randn(N, 4, dtype=torch.float64)
    layer = gnn.APPNP(K=1, alpha=0.1, dropout=0.5)
    evaluated = layer.eval()(x, graph)
    assert torch.equal(evaluated, gnn.APPNP(K=1, alpha=0.1)(x, graph))
    assert rel_err(evaluated, pyg.APPNP(K=1, alpha=0.1, dropout=0.5).eval()(x, graph.edge_index)) < 1e-12
    layer.train()
    draws = torch.stack([layer(x, graph) for _ in range(1500)])
    assert (draws[0] - evaluated).abs().max() > 1e-3
    # One hop is linear in the dropped weights: its mean is the eval output, within a few
    # standard errors per entry (a missing 1/(1-p) rescale would be off by ~50%).
    stderr = draws.std(dim=0) / draws.shape[0] ** 0.5
    z = (draws.mean(dim=0) - evaluated).abs() / stderr.clamp_min(1e-12)
    assert z.max() < 5


@pytest.mark.parametrize("make", [lambda: gnn.ChebConv(3, 2, K=3), lambda: gnn.TAGConv(3, 2, K=2),
                                  lambda: gnn.GCNConv(3, 2, improved=True)], ids=["cheb", "tag-horner", "gcn-improved"])
def test_gradcheck(make):
    """Finite differences through the compiled forward and backward, for x and every parameter."""
    torch.manual_seed(6)
    layer = make().double()
    g = torch.Generator().manual_seed(7)
    edge_index = torch.cat([torch.randint(0, 6, (2, 14), generator=g), torch.tensor([[3], [3]])], dim=1)
    graph = gnnfuse.Graph.from_edge_index(edge_index, num_nodes=8)
    x = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
    names = [k for k, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in layer.named_parameters()]

    def run(x, *values):
        return torch.func.functional_call(layer, dict(zip(names, values)), (x, graph))
    assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("make", [lambda: gnn.GCNConv(4, 2), lambda: gnn.APPNP(2, 0.1), lambda: gnn.SGConv(4, 2),
                                  lambda: gnn.TAGConv(4, 2), lambda: gnn.ChebConv(4, 2, K=2)],
                         ids=["GCNConv", "APPNP", "SGConv", "TAGConv", "ChebConv"])
def test_a_bipartite_graph_is_refused_without_advising_a_pair_these_layers_refuse(make):
    """These layers take no (x_src, x_dst) pair, yet given a bipartite Graph they advised
    passing one, which they then refused as unsupported bipartite input."""
    graph = gnnfuse.Graph.bipartite([0, 1, 2], [1, 0, 1], 3, 2)
    layer = make()
    with pytest.raises(ValueError, match=r"3 source and 2 destination nodes; pass \(x_src, x_dst\) to a layer that "
                                         r"takes bipartite input \(GCNConv, APPNP, SGConv, TAGConv and ChebConv need "
                                         r"a graph with one vertex set\)"):
        layer(torch.randn(3, 4), graph)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="normalization must be 'sym', 'rw' or None, got 'lap'"):
        gnn.ChebConv(4, 4, K=2, normalization="lap")
    with pytest.raises(ValueError, match="K must be at least 1"):
        gnn.ChebConv(4, 4, K=0)
    with pytest.raises(ValueError, match="aggr must be one of"):
        gnn.GraphConv(4, 4, aggr="median")
    with pytest.raises(ValueError, match=r"GraphConv: aggr must be one of .* got \['sum', 'max'\]"):
        gnn.GraphConv(4, 4, aggr=["sum", "max"])     # was "unhashable type: 'list'"
    with pytest.raises(ValueError, match="does not support adding self-loops"):
        gnn.GCNConv(4, 4, add_self_loops=True, normalize=False)
    with pytest.raises(ValueError, match="dropout must be in"):
        gnn.APPNP(2, 0.1, dropout=1.5)
    edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="lambda_max must be positive"):
        gnn.ChebConv(4, 4, K=2)(torch.randn(3, 4), edge_index, lambda_max=0.0)
    with pytest.raises(ValueError, match="the default, twice the largest entry of L, is not positive"):
        gnn.ChebConv(4, 4, K=2, normalization=None)(torch.randn(3, 4), torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="lambda_max has 2 values .* no batch"):
        gnn.ChebConv(4, 4, K=2)(torch.randn(3, 4), edge_index, lambda_max=torch.tensor([2.0, 3.0]))
    for batch, named in (([0, 1, 2], 2), ([0, -1, 1], -1)):     # an IndexError from the lookup, as in PyG
        with pytest.raises(ValueError, match=f"batch names graph {named} but lambda_max has 2 values"):
            gnn.ChebConv(4, 4, K=2)(torch.randn(3, 4), edge_index, batch=torch.tensor(batch),
                                    lambda_max=torch.tensor([2.0, 3.0]))
    # one value per graph in a table of another shape: PyG raises; a [2, 2] one gave the two
    # graphs its first row, its second ignored
    for lam in ([[2.0, 3.0], [1.5, 2.5]], [[2.0, 3.0]], [[2.0], [3.0]]):
        with pytest.raises(ValueError, match=rf"lambda_max must be one number or a 1-D tensor .* got shape "
                                             rf"\[{len(lam)}, {len(lam[0])}\]"):
            gnn.ChebConv(4, 4, K=2)(torch.randn(3, 4), edge_index, batch=torch.tensor([0, 0, 1]),
                                    lambda_max=torch.tensor(lam))
    layer = gnn.APPNP(1, 0.1, cached=True)
    layer(torch.randn(3, 4), edge_index)
    with pytest.raises(ValueError, match="x has 5 rows but the cached graph has 3 nodes"):
        layer(torch.randn(5, 4), torch.tensor([[0, 4], [4, 0]]))


def test_chebconv_default_lambda_max_from_negative_degrees_names_them():
    """Weights summing to a negative degree make the "sym" Laplacian NaN (deg^-1/2), and
    with it the default lambda_max: PyG's output is NaN everywhere, gnnfuse refuses, but
    its hint blamed a graph without edges and told the user to pass lambda_max, which
    would leave those rows NaN. The hint names the vertices, or the non-finite weight."""
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    conv = gnn.ChebConv(4, 4, K=2)
    with pytest.raises(ValueError, match=r"vertices \[1\] have a negative degree"):
        conv(torch.randn(3, 4), edge_index, torch.tensor([1.0, 1.0, -3.0, 1.0]))
    with pytest.raises(ValueError, match=r"edge_weight\[2\] is inf"):
        conv(torch.randn(3, 4), edge_index, torch.tensor([1.0, 1.0, float("inf"), 1.0]))


@pytest.mark.parametrize("make", [lambda: gnn.APPNP(K=3, alpha=0.1), lambda: gnn.SGConv(4, 3, K=2),
                                  lambda: gnn.TAGConv(4, 3, K=2), lambda: gnn.ChebConv(4, 3, K=2),
                                  lambda: gnn.GCNConv(4, 3)], ids=["APPNP", "SGConv", "TAGConv", "ChebConv", "GCNConv"])
@pytest.mark.parametrize("weighted", [False, True], ids=["", "edge_weight"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_normalising_layers_refuse_non_floating_x(make, weighted, dtype, backend):
    """Their deg^-1/2 and Laplacian factors are built in x's dtype: integer x truncated them
    to 0, and APPNP returned wrong values (x times alpha's powers) without an error."""
    device = device_for(backend)
    layer = make().to(device)
    name = type(layer).__name__
    edge_index = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 3, 1]], device=device)
    weight = ((torch.rand(5) + 0.1).to(device),) if weighted else ()
    x = torch.randint(0, 3, (4, 4)).to(device, dtype)
    with pytest.raises(TypeError, match=rf"{name}: x must be a floating-point tensor, got dtype {dtype}"):
        layer(x, edge_index, *weight)
    layer(x.float(), edge_index, *weight)     # the conversion the message asks for runs


def test_sgconv_with_no_hops_caches_nothing_as_pyg():
    """``SGConv(K=0, cached=True)`` returned the first call's x on every later call;
    PyG caches inside its hop loop, so with K = 0 it never caches."""
    import torch_geometric.nn as pyg
    torch.manual_seed(0)
    ours, theirs = gnn.SGConv(4, 3, K=0, cached=True), pyg.SGConv(4, 3, K=0, cached=True)
    theirs.load_state_dict(ours.state_dict())
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(ours(x, edge_index), theirs(x, edge_index))


def test_sgconv_cached_propagation_takes_no_gradient_on_later_calls_as_pyg():
    """PyG reads the kept ``A^K X`` detached on every call after the first: x, learnt, gets
    its gradient from the first call only, and later calls' backwards run (through the
    first call's graph, already freed, they would fail)."""
    torch.manual_seed(0)
    ours, theirs = gnn.SGConv(4, 3, K=2, cached=True).double(), pyg.SGConv(4, 3, K=2, cached=True).double()
    theirs.load_state_dict(ours.state_dict())
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 0, 1]])
    grads = []
    for layer in (ours, theirs):
        x = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
        for _ in range(3):
            layer(x, edge_index).sum().backward()
        grads.append((x.grad, layer.lin.weight.grad))
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [lambda: gnn.SAGEConv(3, 2), lambda: gnn.GraphConv(3, 2),
                                  lambda: gnn.GATConv(3, 2), lambda: gnn.GINConv(torch.nn.Linear(3, 2)),
                                  lambda: gnn.APPNP(2, 0.1), lambda: gnn.EdgeConv(torch.nn.Linear(6, 2)),
                                  lambda: gnn.RGCNConv(3, 2, 2), lambda: gnn.FastRGCNConv(3, 2, 2),
                                  lambda: gnn.RGATConv(3, 2, 2),
                                  lambda: gnn.HGTConv(3, 2, (["a"], [("a", "to", "a")]))],
                         ids=["SAGEConv", "GraphConv", "GATConv", "GINConv", "APPNP", "EdgeConv", "RGCNConv",
                              "FastRGCNConv", "RGATConv", "HGTConv"])
def test_setting_flow_on_a_layer_that_does_not_follow_it_raises(make):
    """PyG reads ``self.flow`` on every call; these layers send source -> target only, and
    an assigned ``flow = 'target_to_source'`` was silently ignored (up to 1.1 off PyG; the
    relational layers too: R-GCN 3.6, FastRGCN 3.0, RGAT 2.8 off PyG on a 7-vertex graph)."""
    layer = make()
    layer.flow = "source_to_target"
    with pytest.raises(AttributeError, match=rf"{type(layer).__name__} sends messages source -> target only"):
        layer.flow = "target_to_source"


@pytest.mark.parametrize("make", [lambda: (gnn.GCNConv(4, 4), pyg.GCNConv(4, 4)),
                                  lambda: (gnn.GCNConv(4, 4, improved=True), pyg.GCNConv(4, 4, improved=True)),
                                  lambda: (gnn.ChebConv(4, 4, K=2), pyg.ChebConv(4, 4, K=2))],
                         ids=["gcn", "gcn-improved", "cheb"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weighted_degrees_of_a_hub_in_half_precision_are_pygs(make, dtype):
    """A vertex with 2,000 in-edges weighted in [0, 1): its degree, a sum of the weights
    (of out-edges for Chebyshev), was added by torch's CPU ``index_add`` of a 1-D half
    tensor, which adds in the half type -- a bfloat16 degree stopped at 256 of about
    1,000 and GCNConv's output was off by 85% of its largest entry, where PyG's
    ``scatter`` accumulates in float32. Compared with PyG in the same dtype, both
    ways of writing the hub (in-edges and out-edges)."""
    edges = 2000
    torch.manual_seed(0)
    ours, theirs = make()
    ours.load_state_dict(theirs.state_dict())
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = torch.rand(edges + 1, 4).to(dtype)
    weight = torch.rand(2 * edges).to(dtype)
    leaves, hub = torch.arange(edges), torch.full((edges,), edges)
    edge_index = torch.stack([torch.cat([leaves, hub]), torch.cat([hub, leaves])])
    expected = theirs(x, edge_index, weight).float()
    got = ours(x, edge_index, weight).float()
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()
