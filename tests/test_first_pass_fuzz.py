"""A differential hunt over the first-pass executor placement (runtime/first_pass.py).

On a GPU a small graph a layer call makes from a raw index tensor runs on the reference
executor until a backward pass has run on it, then on Triton. Here (CPU) that default is
simulated as in test_first_pass.py: `backend_name` answers "triton" and Triton's
interpreter runs its kernels. Every step -- the first pass, the next step on the kept
graph, and a switch between them -- is compared with PyG's layer from the same weights in
float64 (outputs and the gradients of every input and parameter), over the PyG-named
layers and models, the inputs users hand them (empty graphs, isolated vertices, self
loops, repeated edges, bipartite pairs, ``EdgeIndex``, sparse adj_t, int32 indices, half
features) and the call patterns that move a graph between the executors (inference
first, eval after training, an ``edge_index`` edited in place, double backward,
autocast, ``torch.func``, activation checkpointing).
"""
from __future__ import annotations

import gc
import weakref
from collections import Counter

import pytest
import torch
import torch_geometric.nn as pyg_nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch_geometric import EdgeIndex

import gnnfuse.nn as gnn
from gnnfuse.graph import Graph
from gnnfuse.graph.index_cache import clear_index_cache
from gnnfuse.runtime.compiled import record_calls
from graph_strategies import graphs
from first_pass_check import DEVICE, triton_by_default

f64 = torch.float64
N, F, H = 8, 4, 6      # vertices (6 and 7 isolated), input and output widths


@pytest.fixture
def ran(monkeypatch) -> Counter:
    """Triton as the default backend, simulated, and the executors' runs counted."""
    return triton_by_default(monkeypatch)


def _mlp(i: int, o: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))


def _message_class(base: type) -> type:
    """A user's own ``MessagePassing`` subclass, written once for gnnfuse's base and PyG's."""
    class Message(base):
        def __init__(self) -> None:
            super().__init__(aggr="add")
            self.lin = torch.nn.Linear(F, H)

        def forward(self, x, edge_index, edge_weight):
            return self.propagate(edge_index, x=self.lin(x), w=edge_weight)

        def message(self, x_j, x_i, w):
            return (x_j - x_i).tanh() * w.unsqueeze(-1)
    return Message


_Message, _PygMessage = _message_class(gnn.MessagePassing), _message_class(pyg_nn.MessagePassing)


# kind -> (layer from a module of layers, the edge inputs it takes: keyword -> width, 1 for a weight)
LAYERS = {
    "GCN": (lambda m: m.GCNConv(F, H), {}),
    "GCN-cached": (lambda m: m.GCNConv(F, H, cached=True), {}),
    "GCN-unnormalized": (lambda m: m.GCNConv(F, H, normalize=False), {}),
    "GCN-weighted": (lambda m: m.GCNConv(F, H, improved=True), {"edge_weight": 1}),
    "GAT": (lambda m: m.GATConv(F, H, heads=2, edge_dim=3), {"edge_attr": 3}),
    "GAT-no-loops": (lambda m: m.GATConv(F, H, heads=2, add_self_loops=False, concat=False), {}),
    "GATv2": (lambda m: m.GATv2Conv(F, H, heads=2, edge_dim=3), {"edge_attr": 3}),
    "SAGE-mean": (lambda m: m.SAGEConv(F, H), {}),
    "SAGE-max": (lambda m: m.SAGEConv(F, H, aggr="max"), {}),
    "SAGE-sum": (lambda m: m.SAGEConv(F, H, aggr="sum", root_weight=False), {}),
    "SAGE-project": (lambda m: m.SAGEConv(F, H, project=True, normalize=True), {}),
    "GIN": (lambda m: m.GINConv(_mlp(F, H), train_eps=True), {}),
    "GINE": (lambda m: m.GINEConv(_mlp(F, H), edge_dim=3), {"edge_attr": 3}),
    "Transformer": (lambda m: m.TransformerConv(F, H, heads=2, edge_dim=3), {"edge_attr": 3}),
    "GraphConv": (lambda m: m.GraphConv(F, H), {"edge_weight": 1}),
    "GraphConv-max": (lambda m: m.GraphConv(F, H, aggr="max"), {}),
    "Cheb": (lambda m: m.ChebConv(F, H, K=3), {}),
    "APPNP": (lambda m: m.APPNP(K=3, alpha=0.1), {}),
    "EdgeConv": (lambda m: m.EdgeConv(_mlp(2 * F, H)), {}),
    "MessagePassing": (lambda m: _Message() if m is gnn else _PygMessage(), {"edge_weight": 1}),
    "GIN-model": (lambda m: m.GIN(F, H, num_layers=2), {}),
    "GCN-model": (lambda m: m.GCN(F, H, num_layers=2), {}),
    "GAT-model": (lambda m: m.GAT(F, H, num_layers=2, heads=2), {}),
    "GraphSAGE-model": (lambda m: m.GraphSAGE(F, H, num_layers=2), {}),
}
# what the first pass runs: a model's two layers and ChebConv's two propagations run two
# programs, APPNP's K steps three; GCNConv(cached=True) keeps its normalized graph
# built on its first call, no first-pass graph
PROGRAMS = {"Cheb": 2, "APPNP": 3, "GIN-model": 2, "GCN-model": 2, "GAT-model": 2, "GraphSAGE-model": 2}
NOT_FIRST_PASS = {"GCN-cached"}


def _pair(kind: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(gnnfuse's, PyG's) layer of ``kind`` in float64, PyG's weights copied into gnnfuse's."""
    build = LAYERS[kind][0]
    torch.manual_seed(0)
    theirs = build(pyg_nn).to(DEVICE, f64)
    torch.manual_seed(0)
    ours = build(gnn).to(DEVICE, f64)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _edges(seed: int = 0, edges: int = 18, nodes: int = N) -> torch.Tensor:
    """Random edges among the first ``nodes - 2`` vertices (the last two isolated), with
    two self loops and a repeated edge."""
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, nodes - 2, (2, edges), generator=gen)
    edge_index[:, :2] = torch.tensor([[1, 3], [1, 3]])
    edge_index[:, 2] = edge_index[:, 3]
    return edge_index.to(DEVICE)


def _edge_inputs(kind: str, edges: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {key: (torch.rand(edges, generator=gen, dtype=f64) if width == 1
                  else torch.randn(edges, width, generator=gen, dtype=f64)).to(DEVICE)
            for key, width in LAYERS[kind][1].items()}


def _leaf(value):
    if isinstance(value, tuple):
        return tuple(_leaf(v) for v in value)
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.layout is torch.strided:
        return value.detach().clone().requires_grad_()
    return value


def _leaves(value) -> list[torch.Tensor]:
    if isinstance(value, tuple):
        return [t for v in value for t in _leaves(v)]
    return [value] if isinstance(value, torch.Tensor) and value.requires_grad else []


def _step(layer: torch.nn.Module, *args, **kwargs):
    """A training step's output and the gradients of every floating input and parameter
    (a weighted sum of squares: every output element gets its own seed)."""
    args, kwargs = _leaf(args), {k: _leaf(v) for k, v in kwargs.items()}
    out = layer(*args, **kwargs)
    seed = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * seed).pow(2).sum().backward()
    grads = [t.grad for t in _leaves(args) + _leaves(tuple(kwargs.values()))]
    grads += [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in layer.parameters()]
    layer.zero_grad()
    return out.detach(), grads


def _assert_same(ours, theirs, what: str = "") -> None:
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-8, atol=1e-10, msg=lambda m: f"{what} output: {m}")
    assert len(ours[1]) == len(theirs[1])
    for n, (a, b) in enumerate(zip(ours[1], theirs[1])):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=lambda m, n=n: f"{what} gradient {n}: {m}")


def _two_steps(ran: Counter, ours, theirs, *args, programs: int = 1, first_pass: bool = True, **kwargs) -> None:
    """Step 1 (the graph's first pass) and step 2 (the kept graph) against PyG, and the
    executors each ran on: the first pass on the reference, the next on Triton."""
    _assert_same(_step(ours, *args, **kwargs), _step(theirs, *args, **kwargs), "step 1")
    if DEVICE == "cpu":
        assert ran == ({"reference": 2 * programs} if first_pass else {"triton": 2 * programs})
    _assert_same(_step(ours, *args, **kwargs), _step(theirs, *args, **kwargs), "step 2")
    if DEVICE == "cpu":
        assert ran["triton"] == 2 * programs * (1 if first_pass else 2)


@pytest.mark.parametrize("kind", list(LAYERS))
def test_every_layer_on_its_first_pass_and_the_next_step_matches_pyg(ran, kind):
    ours, theirs = _pair(kind)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), _edges()
    _two_steps(ran, ours, theirs, x, edge_index, **_edge_inputs(kind, edge_index.shape[1]),
               programs=PROGRAMS.get(kind, 1), first_pass=kind not in NOT_FIRST_PASS)


@pytest.mark.parametrize("kind", ["GCN", "GAT", "SAGE-max", "GIN", "Cheb"])
def test_an_empty_graph(ran, kind):
    ours, theirs = _pair(kind)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), torch.empty(2, 0, dtype=torch.long, device=DEVICE)
    _two_steps(ran, ours, theirs, x, edge_index, **_edge_inputs(kind, 0), programs=PROGRAMS.get(kind, 1))


@pytest.mark.parametrize("kind", ["GCN", "GAT", "SAGE-mean", "GIN", "GraphConv"])
def test_int32_edge_index(ran, kind):
    """gnnfuse is given int32 indices, PyG int64 (PyG's own int32 gradients are wrong)."""
    ours, theirs = _pair(kind)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), _edges(seed=1)
    kwargs, narrow = _edge_inputs(kind, edge_index.shape[1]), edge_index.int()
    for step in (1, 2):
        _assert_same(_step(ours, x, narrow, **kwargs), _step(theirs, x, edge_index, **kwargs), f"step {step}")
    if DEVICE == "cpu":
        assert ran == {"reference": 2, "triton": 2}


@pytest.mark.parametrize("kind", ["SAGE-max", "GIN", "GAT-bipartite"])
def test_a_bipartite_pair_with_size(ran, kind):
    if kind == "GAT-bipartite":
        torch.manual_seed(0)
        theirs = pyg_nn.GATConv((F, F), H, heads=2, add_self_loops=False).to(DEVICE, f64)
        ours = gnn.GATConv((F, F), H, heads=2, add_self_loops=False).to(DEVICE, f64)
        ours.load_state_dict(theirs.state_dict())
    else:
        ours, theirs = _pair(kind)
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(9, F, generator=gen, dtype=f64).to(DEVICE), torch.randn(5, F, generator=gen, dtype=f64).to(DEVICE))
    edge_index = torch.stack([torch.randint(0, 7, (15,), generator=gen), torch.randint(0, 4, (15,), generator=gen)])
    edge_index[:, 3] = edge_index[:, 4]
    _two_steps(ran, ours, theirs, x, edge_index.to(DEVICE), size=(9, 5))


@pytest.mark.parametrize("kind", ["GCN", "GIN"])
def test_a_pyg_edge_index(ran, kind):
    ours, theirs = _pair(kind)
    x = torch.randn(N, F, dtype=f64, device=DEVICE)
    edge_index = EdgeIndex(_edges(seed=2), sparse_size=(N, N)).sort_by("col")[0]
    _two_steps(ran, ours, theirs, x, edge_index, **_edge_inputs(kind, edge_index.shape[1]))


class _OnEdgeIndex(torch.nn.Module):
    """PyG's layer given the ``edge_index`` a torch sparse ``adj_t`` stands for (the
    transpose's indices): PyG's ``spmm`` refuses ``max`` on a sparse CUDA tensor, and its
    scatter path computes the same aggregation. SAGEConv too: PyG 2.8 renders the
    ``propagate`` of a class once, with the ``fuse`` flag of the first instance that
    runs, so once a SAGEConv with a list of aggregations has run in the process (as
    test_torch_compile's does in the same worker), PyG's own SAGEConv(aggr="mean") raises
    "'message_and_aggregate' not implemented" on a sparse ``adj_t``."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, adj_t: torch.Tensor) -> torch.Tensor:
        return self.layer(x, adj_t.to_sparse_coo().coalesce().indices().flip(0))


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("kind", ["SAGE-mean", "GIN", "GraphConv-max"])
def test_a_torch_sparse_adj_t(ran, kind, layout):
    ours, theirs = _pair(kind)
    if (kind.endswith("max") and DEVICE != "cpu") or kind.startswith("SAGE"):
        theirs = _OnEdgeIndex(theirs)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), torch.unique(_edges(seed=4), dim=1)
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.shape[1], dtype=f64, device=DEVICE),
                                    (N, N)).coalesce()
    _two_steps(ran, ours, theirs, x, adj_t if layout == "coo" else adj_t.to_sparse_csr())


@pytest.mark.parametrize("kind", ["GCN", "SAGE-max", "GINE"])
def test_inference_first_then_training_then_eval(ran, kind):
    """Inference keeps a graph on its first pass (no prepared Triton run); the training
    steps after it start there; eval inference after them runs Triton, prepared."""
    ours, theirs = _pair(kind)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), _edges(seed=5)
    kwargs = _edge_inputs(kind, edge_index.shape[1])
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(ours(x, edge_index, **kwargs), theirs(x, edge_index, **kwargs))
    if DEVICE == "cpu":
        assert ran == {"reference": 2}
    for _ in range(2):
        _assert_same(_step(ours, x, edge_index, **kwargs), _step(theirs, x, edge_index, **kwargs))
    ours.eval(), theirs.eval()
    with torch.no_grad(), record_calls() as calls:
        torch.testing.assert_close(ours(x, edge_index, **kwargs), theirs(x, edge_index, **kwargs))
    assert [c.executor for c in calls] == ["triton" if DEVICE == "cpu" else calls[0].executor]
    with torch.no_grad():
        for _ in range(3):      # the second call on the same graph prepares a Triton run, the third uses it
            torch.testing.assert_close(ours(x, edge_index, **kwargs), theirs(x, edge_index, **kwargs))
    assert calls[0].compiled.prepared is not None
    _assert_same(_step(ours, x, edge_index, **kwargs), _step(theirs, x, edge_index, **kwargs), "eval, training")
    if DEVICE == "cpu":
        assert ran["reference"] == 4


@pytest.mark.parametrize("kind", ["GCN", "SAGE-mean"])
def test_an_edge_index_edited_in_place_is_a_new_graph_on_its_first_pass(ran, kind):
    ours, theirs = _pair(kind)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), _edges(seed=6)
    kwargs = _edge_inputs(kind, edge_index.shape[1])
    for _ in range(2):
        _assert_same(_step(ours, x, edge_index, **kwargs), _step(theirs, x, edge_index, **kwargs))
    ours.eval(), theirs.eval()
    with torch.no_grad():
        for _ in range(3):      # a prepared Triton run on the graph before the edit
            ours(x, edge_index, **kwargs)
    edge_index[1, 7] = N - 1        # into an isolated vertex
    edge_index[0, 4] = (edge_index[0, 4] + 1) % (N - 2)
    with torch.no_grad(), record_calls() as calls:
        torch.testing.assert_close(ours(x, edge_index, **kwargs), theirs(x, edge_index, **kwargs))
    assert calls[0].graph.first_pass
    ours.train(), theirs.train()
    before = ran["reference"]
    _assert_same(_step(ours, x, edge_index, **kwargs), _step(theirs, x, edge_index, **kwargs), "after the edit")
    if DEVICE == "cpu":
        assert ran["reference"] == before + 2


@pytest.mark.parametrize("kind", ["GCN", "SAGE-sum", "GIN", "GAT"])
def test_double_backward_on_the_first_pass_and_the_next_step(ran, kind):
    """create_graph=True: the first pass runs under torch's autograd (runtime/first_pass.py),
    which differentiates its own backward, GAT's softmax too; the next step's Triton
    kernels are refused, with an error that names the first pass."""
    ours, theirs = _pair(kind)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), _edges(seed=8)

    def penalty(layer):
        leaf = x.clone().requires_grad_()
        grad, = torch.autograd.grad(layer(leaf, edge_index).pow(2).sum(), leaf, create_graph=True)
        grad.pow(2).sum().backward()
        # (a bias has no second derivative here: no gradient, in PyG's layers too)
        result = (grad.detach(), leaf.grad, [p.grad for p in layer.parameters()])
        layer.zero_grad()
        return result

    got, expected = penalty(ours), penalty(theirs)
    torch.testing.assert_close(got[:2], expected[:2])
    assert [g is None for g in got[2]] == [g is None for g in expected[2]]
    torch.testing.assert_close([g for g in got[2] if g is not None], [g for g in expected[2] if g is not None])
    if DEVICE == "cpu":
        with pytest.raises(NotImplementedError, match="first pass"):
            penalty(ours)


@pytest.mark.parametrize("kind", ["GCN", "GIN", "SAGE-mean", "GAT"])
def test_autocast_steps(ran, kind):
    """Under CPU autocast (bfloat16) each step follows PyG's under the same autocast."""
    ours, theirs = _pair(kind)
    ours, theirs = ours.float(), theirs.float()
    x, edge_index = torch.randn(N, F, device=DEVICE), _edges(seed=10)
    kwargs = {k: v.float() for k, v in _edge_inputs(kind, edge_index.shape[1]).items()}
    device_type = torch.device(DEVICE).type
    for step in (1, 2, 3):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            got, expected = _step(ours, x, edge_index, **kwargs), _step(theirs, x, edge_index, **kwargs)
        assert got[0].dtype == expected[0].dtype
        torch.testing.assert_close(got[0].float(), expected[0].float(), rtol=0.05, atol=0.05)
        for a, b in zip(got[1], expected[1]):
            torch.testing.assert_close(a.float(), b.float(), rtol=0.1, atol=0.1)
        if step == 1:
            assert set(ran) == {"reference"}      # the first pass, autocast or not


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["GCN", "GIN", "SAGE-mean"])
def test_half_features(ran, kind, dtype):
    ours, theirs = _pair(kind)
    ours, theirs = ours.to(dtype), theirs.float()
    x, edge_index = torch.randn(N, F, device=DEVICE), _edges(seed=9)
    for step in (1, 2):
        got, expected = _step(ours, x.to(dtype), edge_index), _step(theirs, x, edge_index)
        assert got[0].dtype == dtype
        torch.testing.assert_close(got[0].float(), expected[0], rtol=0.05, atol=0.05)
        torch.testing.assert_close(got[1][0].float(), expected[1][0], rtol=0.1, atol=0.1)


@pytest.mark.parametrize("kind", ["GIN", "SAGE-mean"])
def test_torch_func_grad_is_refused_on_both_steps(ran, kind):
    ours, _ = _pair(kind)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), _edges(seed=11)
    params = dict(ours.named_parameters())

    def loss(p, inputs):
        return torch.func.functional_call(ours, p, (inputs, edge_index)).pow(2).sum()
    for _ in range(2):
        with pytest.raises(NotImplementedError, match="torch.func transforms"):
            torch.func.grad(loss)(params, x)
        _step(ours, x, edge_index)


@pytest.mark.parametrize("dropout", [0.5, 0.0], ids=["autograd-function", "under-autograd"])
def test_checkpointed_layers_recompute_as_their_forward_ran_within_one_backward(ran, dropout):
    """Two checkpointed GAT layers on one new graph: the second layer's backward ends the
    first pass only once the whole backward has run, so the first layer's recomputation
    runs on the reference executor as its forward did, in the same forms (torch's
    checkpoint refuses recomputed values of other shapes: GAT's logits are unfolded on a
    first pass, and a program run under autograd -- no attention dropout -- saves other
    values than its autograd Function). The gradients equal those of the same steps
    without checkpointing, and the next call on the graph runs on Triton."""
    from torch.utils.checkpoint import checkpoint

    def run(use_checkpoint: bool):
        clear_index_cache()
        torch.manual_seed(0)
        first, second = (gnn.GATConv(F, F, heads=1, dropout=dropout).to(DEVICE, f64) for _ in range(2))
        x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE).requires_grad_(), _edges(seed=12)
        torch.manual_seed(5)
        if use_checkpoint:
            h = checkpoint(first, x, edge_index, use_reentrant=False)
            out = checkpoint(second, h.relu(), edge_index, use_reentrant=False)
        else:
            out = second(first(x, edge_index).relu(), edge_index)
        out.pow(2).sum().backward()
        ran.clear()
        with torch.no_grad():
            first(x, edge_index)
        return out.detach(), x.grad, [p.grad for p in (*first.parameters(), *second.parameters())]

    expected = run(False)
    got = run(True)
    if DEVICE == "cpu":
        assert ran == {"triton": 1}     # the graph past its first pass
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", ["SAGE-max", "GAT-no-loops"])
def test_a_checkpointed_output_waiting_for_its_backward_keeps_the_first_pass(ran, name):
    """A checkpointed layer's output waits while another output on the same new graph is
    backpropagated first (two views of a graph, one loss each): that backward ended the
    first pass, and the waiting output's recompute ran on Triton where its forward had run
    on the reference executor -- torch's CheckpointError (other tensors saved). The first
    pass now ends once no first-pass output waits for its backward."""
    from torch.utils.checkpoint import checkpoint
    ours, theirs = _pair(name)
    x = torch.randn(N, F, dtype=f64, device=DEVICE)
    clear_index_cache()
    edge_index = _edges(seed=31)
    inputs = [x.clone().requires_grad_() for _ in range(2)]
    waiting = checkpoint(ours, inputs[0], edge_index, use_reentrant=False)
    ours(inputs[1] * 2, edge_index).sum().backward()
    waiting.pow(2).sum().backward()
    expected = [x.clone().requires_grad_() for _ in range(2)]
    theirs(expected[1] * 2, edge_index).sum().backward()
    theirs(expected[0], edge_index).pow(2).sum().backward()
    for got, want in zip(inputs, expected):
        torch.testing.assert_close(got.grad, want.grad)
    ran.clear()
    with torch.no_grad():
        ours(x, edge_index)
    if DEVICE == "cpu":
        assert ran == {"triton": 1}     # past its first pass once nothing waits


def test_an_output_kept_without_a_backward_does_not_hold_the_first_pass(ran):
    """An evaluation forward with grad enabled, its output kept until the next epoch's:
    with every first-pass run waiting for its backward, one such output was always alive
    at each backward and the graph stayed on its first pass for good. Only checkpointed
    runs wait."""
    ours, _ = _pair("GCN")
    x = torch.randn(N, F, dtype=f64, device=DEVICE).requires_grad_()    # (the program's input needs a gradient)
    clear_index_cache()
    edge_index = _edges(seed=33)
    for epoch in range(3):
        ours.eval()
        kept = ours(x, edge_index)      # noqa: F841 (alive across the training step, as a loop variable is)
        ours.train()
        ran.clear()
        ours(x, edge_index).pow(2).sum().backward()
    if DEVICE == "cpu":
        assert ran == {"triton": 2}     # the step's forward and backward


def test_graphs_of_edge_index_tensors_let_go_are_freed(ran):
    """A new graph every step (a mini-batch loop), with inference between: none is kept."""
    ours, theirs = _pair("SAGE-max")
    x = torch.randn(N, F, dtype=f64, device=DEVICE)
    refs = []
    for seed in range(3):
        edge_index = _edges(seed=20 + seed)
        kwargs = _edge_inputs("SAGE-max", edge_index.shape[1])
        _assert_same(_step(ours, x, edge_index, **kwargs), _step(theirs, x, edge_index, **kwargs))
        with torch.no_grad(), record_calls() as calls:
            ours(x, edge_index, **kwargs)
        refs.append(weakref.ref(calls[0].graph))
        del calls, edge_index, kwargs
    gc.collect()
    assert [r() for r in refs] == [None] * 3


def test_to_hetero_model_steps(ran):
    from test_hetero_fuzz import hetero_graph, lazy_init_inputs, skip_model
    from test_nn_hetero import randomized

    metadata, x, edges = hetero_graph(5, every_type_a_destination=True, device=DEVICE)
    torch.manual_seed(0)
    theirs = pyg_nn.to_hetero(skip_model(pyg_nn), metadata, aggr="sum").double().to(DEVICE)
    ours = gnn.to_hetero(skip_model(gnn), metadata, aggr="sum").double().to(DEVICE)
    init = lazy_init_inputs(x)
    theirs(init, edges), ours(init, edges)
    ours.load_state_dict(randomized(theirs, 5).state_dict())
    theirs.eval(), ours.eval()      # (dropout off)
    clear_index_cache()
    ran.clear()

    def step(model):
        leaves = {t: v.clone().requires_grad_() for t, v in x.items()}
        out = model(leaves, edges)
        sum((o * torch.linspace(-1, 1, o.numel(), dtype=f64, device=DEVICE).view_as(o)).pow(2).sum()
            for o in out.values()).backward()
        result = ({t: o.detach() for t, o in out.items()}, {t: v.grad for t, v in leaves.items()},
                  [p.grad.clone() for p in model.parameters() if p.grad is not None])
        model.zero_grad()
        return result
    for _ in range(2):
        got, expected = step(ours), step(theirs)
        torch.testing.assert_close(got[0], expected[0])
        torch.testing.assert_close(got[1], expected[1])
        torch.testing.assert_close(got[2], expected[2])
    if DEVICE == "cpu":
        assert ran["reference"] and ran["triton"]


def test_a_torch_compiled_layer_ends_its_first_pass_with_its_backward(ran):
    """Under ``torch.compile`` a program runs as an opaque operator whose backward
    re-runs the forward (runtime/compile_op.py): that backward ends the first pass too,
    so the kept graph's next step runs Triton, as it does in eager mode. (GCN: its
    program runs on the self-looped graph derived from the first-pass one.)"""
    ours, theirs = _pair("GCN")
    compiled_layer = torch.compile(ours, backend="aot_eager", fullgraph=True)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), _edges(seed=13)
    for step in (1, 2):
        _assert_same(_step(compiled_layer, x, edge_index), _step(theirs, x, edge_index), f"step {step}")
        if DEVICE == "cpu":
            assert set(ran) == ({"reference"} if step == 1 else {"reference", "triton"}), (step, ran)
    if DEVICE == "cpu":
        assert ran["reference"] == 3      # the forward, and the backward's forward and backward


@pytest.mark.parametrize("kind, bound, executors", [
    ("GCN", 22, {"triton": 4}),               # 18 edges, 24 with the loops GCN adds: over the bound
    ("GCN", 24, {"reference": 2, "triton": 2}),
    ("Cheb", 17, {"reference": 4, "triton": 4}),   # over it, but not without its 2 loops
    ("SAGE-mean", 17, {"triton": 4}),
])
def test_the_bound_applies_to_the_graph_a_program_runs_on(ran, monkeypatch, kind, bound, executors):
    from gnnfuse.runtime import first_pass
    monkeypatch.setattr(first_pass, "FIRST_PASS_EDGES", bound)
    ours, theirs = _pair(kind)
    x, edge_index = torch.randn(N, F, dtype=f64, device=DEVICE), _edges()
    for step in (1, 2):
        _assert_same(_step(ours, x, edge_index), _step(theirs, x, edge_index), f"step {step}")
    if DEVICE == "cpu":
        assert ran == executors


@pytest.mark.parametrize("case", ["random", "empty", "bipartite", "self-looped", "loops-removed", "grouped"])
def test_first_pass_degrees_on_a_gpu_are_the_graphs_degrees(monkeypatch, case):
    """`Graph._degrees` on a GPU counts a first-pass graph's degrees by scatter (no
    sort) until a grouping is built, then reads the grouping; here its device is made
    to read "cuda" to take that branch on CPU tensors. Both equal the edges' counts."""
    edge_index = _edges(seed=30, edges=12)
    nodes, sources = N, None
    if case == "empty":
        edge_index = edge_index[:, :0]
    elif case == "bipartite":
        nodes, sources = 5, N
        edge_index = torch.stack([edge_index[0], edge_index[1] % nodes])
    graph = Graph.coerce(edge_index, nodes) if sources is None else Graph.coerce(edge_index, nodes, sources)
    if case == "self-looped":
        graph = graph.add_self_loops()
    elif case == "loops-removed":
        graph = graph.remove_self_loops()
    elif case == "grouped":
        graph.csr(), graph.reverse_csr()
    assert graph.first_pass
    src, dst = graph._endpoints(keep=False)
    expected = (torch.bincount(dst, minlength=graph.num_nodes), torch.bincount(src, minlength=graph.num_src_nodes))
    cached = set(graph._cache)
    monkeypatch.setattr(Graph, "device", property(lambda g: torch.device("cuda")))
    assert torch.equal(graph._degrees("dst"), expected[0]) and torch.equal(graph._degrees("src"), expected[1])
    assert set(graph._cache) == cached       # no grouping built for them


@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=graphs(max_nodes=8, max_edges=14), kind=st.sampled_from(["GIN", "GCN", "SAGE-mean", "GAT"]),
       seed=st.integers(0, 2 ** 16))
def test_first_and_second_steps_match_pyg_on_random_graphs(ran, case, kind, seed):
    """Random small multigraphs (isolated vertices, loops, repeats, int32 or strided
    indices): the first pass and the next step against PyG, given int64 indices."""
    clear_index_cache()
    ran.clear()
    case = case.to(DEVICE)
    ours, theirs = _pair(kind)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(case.num_nodes, F, generator=gen, dtype=f64).to(DEVICE)
    kwargs = _edge_inputs(kind, case.edge_index.shape[1], seed)
    for step in (1, 2):
        _assert_same(_step(ours, x, case.given, **kwargs), _step(theirs, x, case.edge_index, **kwargs),
                     f"step {step}")
    if DEVICE == "cpu":
        assert ran == {"reference": 2, "triton": 2}
