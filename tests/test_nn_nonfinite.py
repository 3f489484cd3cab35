"""NaN features where no propagation reads them: layers that reorder their linear map
and the propagation (transform first, to move narrower rows) or distribute it over a
neighbour sum computed ``W x_u`` or ``x_v * s_v`` for every vertex, so a NaN row met a
zero gradient (0 * NaN = NaN) and made a weight gradient NaN where PyG's (or the
oracle's) is a number. Outputs, input, parameter and edge-weight gradients must put
NaN exactly where the oracle does; found by tests/test_properties.py."""
from __future__ import annotations

import copy

import pytest
import torch
import torch_geometric.nn as pyg

from gnnfuse import nn as gnn
from layer_check import assert_same_values, outputs_and_grads
from test_nn_attention import MLPAggOracle, NGCFOracle

F_IN = 4
NAN = float("nan")
# 0 -> 1 -> 2 and 3 -> 0: vertex 2 has no out-edge, 4 and 5 none at all; 1's walks end
# after one hop, 3's after three.
EDGE_INDEX = torch.tensor([[0, 1, 3], [1, 2, 0]])
WEIGHT = torch.tensor([0.7, 1.3, 0.9], dtype=torch.float64)


def features(nan_rows: tuple[int, ...] = (1, 2, 4, 5)) -> torch.Tensor:
    x = torch.randn(6, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for column, row in enumerate(nan_rows):
        x[row, column % F_IN] = NAN
    return x


PYG_PAIRS = {
    "sage-mean-narrowing": lambda: (gnn.SAGEConv(F_IN, 3), pyg.SAGEConv(F_IN, 3)),
    "graphconv-add-narrowing": lambda: (gnn.GraphConv(F_IN, 3), pyg.GraphConv(F_IN, 3)),
    "sgc-no-loops": lambda: (gnn.SGConv(F_IN, 3, K=2, add_self_loops=False),
                             pyg.SGConv(F_IN, 3, K=2, add_self_loops=False)),
    "tag-narrowing": lambda: (gnn.TAGConv(F_IN, 3, K=2), pyg.TAGConv(F_IN, 3, K=2)),
    # Aggregations whose per-row work (x * x, t * x) runs once per vertex, not per edge:
    "sage-var": lambda: (gnn.SAGEConv(F_IN, 3, aggr="var"), pyg.SAGEConv(F_IN, 3, aggr="var")),
    "sage-std": lambda: (gnn.SAGEConv(F_IN, 3, aggr="std"), pyg.SAGEConv(F_IN, 3, aggr="std")),
    "sage-learnt-softmax": lambda: (
        gnn.SAGEConv(F_IN, 3, aggr=pyg.SoftmaxAggregation(learn=True, channels=F_IN)),
        pyg.SAGEConv(F_IN, 3, aggr=pyg.SoftmaxAggregation(learn=True, channels=F_IN))),
}


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "edge_weight"])
@pytest.mark.parametrize("name", PYG_PAIRS)
def test_transform_first_layers_keep_pygs_gradients_for_unread_nan_rows(name, weighted):
    if weighted and name.startswith("sage-"):
        pytest.skip("SAGEConv takes no edge_weight")
    torch.manual_seed(1)
    ours, ref = (m.double() for m in PYG_PAIRS[name]())
    ours.load_state_dict(ref.state_dict())
    wa, wb = WEIGHT.clone().requires_grad_(), WEIGHT.clone().requires_grad_()
    extra_a, extra_b = ((wa,), (wb,)) if weighted else ((), ())
    x = features()
    got = outputs_and_grads(ours, lambda xs: ours(xs, EDGE_INDEX, *extra_a), x)
    expected = outputs_and_grads(ref, lambda xs: ref(xs, EDGE_INDEX, *extra_b), x)
    assert got.keys() == expected.keys()
    for key in got:
        assert_same_values(got[key], expected[key], key)
    if weighted:
        assert_same_values(wa.grad, wb.grad, "edge_weight")


@pytest.mark.parametrize("make, oracle", [(lambda: gnn.MLPAggConv(F_IN, 3), MLPAggOracle),
                                          (lambda: gnn.NGCFConv(F_IN, 3), NGCFOracle)], ids=["mlp-agg", "ngcf"])
def test_per_vertex_rewrites_keep_the_oracles_gradients_for_unread_nan_rows(make, oracle):
    torch.manual_seed(2)
    ours = make().double()
    ref = oracle(copy.deepcopy(ours))
    x = features(nan_rows=(4, 5))      # only where no edge is: a NaN that max-aggregates is issue #11 §1.2's
    got = outputs_and_grads(ours, lambda xs: ours(xs, EDGE_INDEX), x)
    expected = outputs_and_grads(ref, lambda xs: ref(xs, EDGE_INDEX), x)
    for key in got:
        assert_same_values(got[key], expected["layer." + key if key not in ("out", "x") else key], key)


@pytest.mark.parametrize("hops", [1, 2])
def test_transform_first_linear_has_exact_first_and_second_derivatives(hops):
    """The Function behind transform-first layers writes its own backward: gradcheck it
    and its double backward (finite features) on a graph with unread rows, where (as
    after any propagation) unread rows' outputs get no gradient, and compare its weight
    gradient with the masked composite it stands for."""
    from gnnfuse.graph import Graph
    from gnnfuse.nn.conv import _transform_first, transform_first_rows

    graph = Graph.from_edge_index(EDGE_INDEX, num_nodes=6)
    rows = transform_first_rows(graph, hops)
    assert rows is not None
    read = rows.mask
    assert not bool(read.all()) and torch.equal((~read).nonzero().squeeze(1), rows.unread)
    x = torch.randn(6, F_IN, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, F_IN, dtype=torch.float64, requires_grad=True)
    def propagated(a, w):
        return _transform_first(a, w, graph, hops).masked_fill(~read.unsqueeze(-1), 0.0)

    assert torch.autograd.gradcheck(propagated, (x, weight))
    assert torch.autograd.gradgradcheck(propagated, (x, weight))
    probe = torch.randn(6, 3, dtype=torch.float64)
    nan_x = features(nan_rows=tuple((~read).nonzero().squeeze(1).tolist()))
    (got,) = torch.autograd.grad((_transform_first(nan_x, weight, graph, hops) * probe.masked_fill(
        ~read.unsqueeze(-1), 0.0)).sum(), weight)
    (expected,) = torch.autograd.grad((torch.nn.functional.linear(
        nan_x.masked_fill(~read.unsqueeze(-1), 0.0), weight) * probe).sum(), weight)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


PYG_MESSAGE_LAYERS = {   # the layer, and the parameters whose gradients PyG keeps finite
    # lin_msg(x_j) and (lin_msg(x_j) * att_msg).sum(-1) inside message()
    "general-attention": (lambda lib: lib.GeneralConv(F_IN, 3, attention=True), ("lin_msg.weight", "att_msg")),
    # (x_j - x_i) @ u, split by distribute_products, and x_j @ lin.weight^T inside message()
    "feast-no-loops": (lambda lib: lib.FeaStConv(F_IN, 3, heads=2, add_self_loops=False), ("lin.weight", "u.weight")),
}


def _compiled_against_pyg(name: str, device: str) -> tuple[dict, dict]:
    """Outputs and gradients of the compiled layer ``name`` on ``device`` and of PyG's,
    from the same weights, on features with NaN in rows no edge reads (4 and 5)."""
    import gnnfuse.nn as gnn_all
    torch.manual_seed(3)
    make, _ = PYG_MESSAGE_LAYERS[name]
    ref, ours = make(pyg).double(), make(gnn_all).double().to(device)
    ours.load_state_dict(ref.state_dict())
    x = features(nan_rows=(4, 5))
    got = outputs_and_grads(ours, lambda xs: ours(xs, EDGE_INDEX.to(device)), x.to(device))
    expected = outputs_and_grads(ref, lambda xs: ref(xs, EDGE_INDEX), x)
    assert got.keys() == expected.keys()
    for key in got:
        assert_same_values(got[key].cpu(), expected[key], key)
    return got, expected


@pytest.mark.parametrize("name", PYG_MESSAGE_LAYERS)
def test_compiled_pyg_messages_keep_pygs_gradients_for_unread_nan_rows(name):
    """PyG layers compiled from their ``message()`` (gnnfuse.nn.GeneralConv, FeaStConv)
    apply a parameter to gathered rows per edge in PyG; gnnfuse moves the product onto
    every vertex row (`reorder_broadcasts`), and the parameter's gradient met NaN rows of
    vertices no edge reads with their zero gradients: GeneralConv's ``lin_msg.weight`` and
    ``att_msg`` and FeaStConv's ``lin.weight`` and ``u.weight`` were NaN where PyG's are
    numbers (vertices 4 and 5 send no edge here)."""
    _, expected = _compiled_against_pyg(name, "cpu")
    assert all(torch.isfinite(expected[key]).all() for key in PYG_MESSAGE_LAYERS[name][1])


@pytest.mark.parametrize("name", PYG_MESSAGE_LAYERS)
def test_compiled_pyg_messages_run_a_first_pass_under_autograd_keeping_pygs_gradients(name, monkeypatch):
    """A PyG user's call on a new small graph runs its first pass under torch's autograd on
    a GPU (runtime/first_pass.py) where every op's reference differentiates as its rule
    does. ``zero_unread_rows`` (and ``transpose``, and a softmax's ``amax_dim`` read through
    ``stop_gradient``) lacked the mark, so these layers' mini-batch steps took the autograd
    Function and walked gnnfuse's backward program op by op instead. Under autograd the
    unread rows' NaN stays out of the weight gradients as well."""
    from first_pass_check import DEVICE, triton_by_default
    from gnnfuse.runtime import compiled
    triton_by_default(monkeypatch)
    runs = []
    real = compiled.CompiledProgram._run_under_autograd
    monkeypatch.setattr(compiled.CompiledProgram, "_run_under_autograd",
                        lambda self, *args: runs.append(self) or real(self, *args))
    got, _ = _compiled_against_pyg(name, DEVICE)
    assert len(runs) == 1, f"{name}: {len(runs)} programs ran under autograd"
    assert all(torch.isfinite(got[key]).all() for key in PYG_MESSAGE_LAYERS[name][1])


@pytest.mark.parametrize("name", PYG_MESSAGE_LAYERS)
def test_compiled_pyg_messages_mask_unread_rows_on_each_backend(name, backend, device):
    """The same on the Triton kernels (the interpreter here) as on the reference executor:
    ``zero_unread_rows`` runs as a torch op beside them."""
    _compiled_against_pyg(name, device)


def test_zero_unread_rows_zeroes_by_index_and_passes_a_fully_read_table_itself():
    """The op the PyG front end masks with: the rows a side never reads are zeroed (their
    NaN kept out of the copy) and so is their gradient; a graph whose every vertex sends
    and receives an edge gets ``x`` itself -- no copy per call (a select over every row
    wrote one per side, 1.1 GB of FeaStConv's peak on the reddit2-sized graph)."""
    import gnnfuse
    from gnnfuse.backend.reference.context import GraphContext
    x = features(nan_rows=(2, 4, 5)).requires_grad_()
    ctx = GraphContext(gnnfuse.Graph(EDGE_INDEX[0], EDGE_INDEX[1], 6))
    by_src = ctx.zero_unread_rows(x, "src")          # 2, 4, 5 send no edge
    by_dst = ctx.zero_unread_rows(x, "dst")          # 3, 4, 5 receive none
    expected_src = x.detach().clone().index_fill_(0, torch.tensor([2, 4, 5]), 0.0)
    expected_dst = x.detach().clone().index_fill_(0, torch.tensor([3, 4, 5]), 0.0)
    torch.testing.assert_close(by_src, expected_src, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(by_dst, expected_dst, rtol=0, atol=0, equal_nan=True)
    (by_src.sum() + 2 * by_dst.sum()).backward()
    expected_grad = torch.tensor([3.0, 3.0, 2.0, 1.0, 0.0, 0.0], dtype=x.dtype).unsqueeze(1).expand_as(x)
    assert torch.equal(x.grad, expected_grad)
    looped = GraphContext(gnnfuse.Graph(torch.arange(6), torch.arange(6), 6))
    assert looped.zero_unread_rows(x, "src") is x and looped.zero_unread_rows(x, "dst") is x
