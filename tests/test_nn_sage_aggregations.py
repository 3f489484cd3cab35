"""SAGEConv's ``aggr`` as PyG takes it -- a name, a list of names combined by
``aggr_kwargs`` (PyG's MultiAggregation: cat, proj, attn, dense modes), an Aggregation
module -- against PyG 2.8 with PyG's state loaded (so parameter names and shapes are
PyG's): outputs and the gradients of x and every parameter in float64.

Sum, mean, max, min, var and std are fused (one compiled program for all of a list's),
and so is softmax (fixed or learnt t); the tests make the eager path fail to prove it is
not taken, on both backends. Other aggregations (lstm, MLPAggregation, median,
semi-gradient std and softmax) run
PyG's own module eagerly, with one warning per layer class and aggregation naming it;
without PyG they are refused by name, while the fused ones need no PyG."""
from __future__ import annotations

import ast
import inspect
import sys
import warnings

import pytest
import torch
import torch_geometric.nn as pyg

from gnnfuse import nn as gnn
from gnnfuse.nn import aggregation
from layer_check import assert_same_outputs_and_grads, assert_same_values
from oracle_check import device_for
from test_nn_bipartite import F_DST, F_SRC, compare_with_pyg

N, F_IN, F_OUT = 6, 4, 3
# Sorted by destination (LSTM reads neighbours as sequences and needs that, as in PyG);
# vertex 5 has no in-edges, vertex 2 has a repeated edge, a self loop at 3.
EDGE_INDEX = torch.tensor([[1, 2, 4, 0, 3, 3, 5, 3, 0, 1, 2],
                           [0, 0, 0, 1, 2, 2, 2, 3, 4, 4, 4]])

# (id, aggr (made per layer: modules are not shared), aggr_kwargs)
FUSED = [
    ("cat", lambda: ["mean", "max", "sum", "min"], None),
    ("add-and-mean", lambda: ["add", "mean"], {"mode": "cat"}),
    ("proj-moments", lambda: ["mean", "std", "var"],
     {"mode": "proj", "mode_kwargs": {"in_channels": F_IN, "out_channels": 5}}),
    ("attn", lambda: ["sum", "max"], {"mode": "attn", "mode_kwargs": {"in_channels": F_IN, "out_channels": 4,
                                                                       "num_heads": 2}}),
    ("dense-max", lambda: ["min", "mean"], {"mode": "max"}),
    ("dense-logsumexp", lambda: ["sum", "var"], {"mode": "logsumexp"}),
    ("one-in-a-list", lambda: ["max"], None),
    ("min", lambda: "min", None),
    ("var", lambda: "var", None),
    ("std", lambda: "std", None),
    ("pyg-mean-module", lambda: pyg.MeanAggregation(), None),
    ("pyg-std-module", lambda: pyg.StdAggregation(), None),
    ("mean-and-learnt-softmax", lambda: ["mean", "softmax"], {"aggrs_kwargs": [{}, {"learn": True, "t": 0.5}]}),
    ("softmax-per-channel", lambda: pyg.SoftmaxAggregation(learn=True, channels=F_IN), None),
    ("softmax-fixed-t", lambda: pyg.SoftmaxAggregation(t=2.0), None),
    ("softmax-fixed-t-below-one", lambda: pyg.SoftmaxAggregation(t=0.5), None),
    ("var-by-name-full-gradient", lambda: "var", {"semi_grad": False}),
    # in a list PyG runs var and std together (FusedAggregation): one var's semi_grad gives
    # every var and std of the list the squares' sum without gradient; a std's own is not read
    ("semi-grad-var-in-a-list", lambda: ["mean", "var"], {"aggrs_kwargs": [{}, {"semi_grad": True}]}),
    ("semi-grad-var-sets-the-list-s-std", lambda: ["std", "var"], {"aggrs_kwargs": [{}, {"semi_grad": True}]}),
    ("semi-grad-std-in-a-list-is-not-read", lambda: ["std", "var"], {"aggrs_kwargs": [{"semi_grad": True}, {}]}),
    ("semi-grad-var-alone-in-a-list", lambda: ["var"], {"aggrs_kwargs": [{"semi_grad": True}]}),
    ("pyg-multi-module-semi-grad", lambda: pyg.MultiAggregation(["max", "var", "std"], [{}, {"semi_grad": True}, {}]),
     None),
    ("pyg-multi-module-var-full-gradient", lambda: pyg.MultiAggregation(["mean", "var"]), None),
    ("pyg-multi-module", lambda: pyg.MultiAggregation(["sum", "min", "std"], mode="proj",
                                                      mode_kwargs={"in_channels": F_IN, "out_channels": 2}), None),
]
EAGER = [
    ("lstm", lambda: "lstm", None, "LSTMAggregation"),
    ("mlp", lambda: pyg.MLPAggregation(F_IN, F_IN, max_num_elements=3, num_layers=1), None, "MLPAggregation"),
    ("semi-grad-softmax", lambda: pyg.SoftmaxAggregation(t=2.0, semi_grad=True), None, "SoftmaxAggregation"),
    ("median", lambda: "median", None, "MedianAggregation"),
    ("semi-grad-std", lambda: pyg.StdAggregation(semi_grad=True), None, "StdAggregation"),
    ("semi-grad-std-by-name", lambda: "std", {"semi_grad": True}, "StdAggregation"),
]
TRITON_FUSED = ("cat", "proj-moments", "softmax-per-channel")


def layers(aggr, aggr_kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(ours, PyG's) with PyG's parameters (biases drawn, not zero) loaded into ours."""
    kwargs = {} if aggr_kwargs is None else {"aggr_kwargs": aggr_kwargs}
    torch.manual_seed(0)
    ref = pyg.SAGEConv(F_IN, F_OUT, aggr=aggr(), **kwargs).double()
    for p in ref.parameters():
        if p.dim() == 1:
            torch.nn.init.normal_(p)
    ours = gnn.SAGEConv(F_IN, F_OUT, aggr=aggr(), **kwargs).double()
    ours.load_state_dict(ref.state_dict())
    assert str(ours) == str(ref)
    return ours, ref


def features(device: str = "cpu") -> torch.Tensor:
    return torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)


def no_eager(layer, module, graph, messages):
    raise AssertionError(f"{module} ran eagerly; it should be fused")


@pytest.mark.parametrize("case, backend", [pytest.param(case, backend, id=f"{backend}-{case[0]}")
                                           for backend in ("reference", "triton") for case in FUSED
                                           if backend == "reference" or case[0] in TRITON_FUSED])
def test_fused_aggregations_match_pyg(case, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    monkeypatch.setattr(aggregation, "_eager", no_eager)
    _, aggr, aggr_kwargs = case
    device = device_for(backend)
    ours, ref = (layer.to(device) for layer in layers(aggr, aggr_kwargs))
    edge_index = EDGE_INDEX.to(device)
    assert_same_outputs_and_grads(ours, ref, lambda x: ours(x, edge_index), lambda x: ref(x, edge_index),
                                  features(device))


def test_fused_list_on_bipartite_input_matches_pyg(monkeypatch):
    monkeypatch.setattr(aggregation, "_eager", no_eager)
    from test_nn_bipartite import EDGE_INDEX as BIPARTITE_EDGES, NUM_DST, NUM_SRC
    compare_with_pyg("SAGEConv", lambda: ((F_SRC, F_DST), 4, ["sum", "max", "std"]), {}, True,
                     BIPARTITE_EDGES, NUM_SRC, NUM_DST)


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which fallbacks have warned, so this test sees its first warning."""
    monkeypatch.setattr(aggregation, "_WARNED", set())


@pytest.mark.parametrize("aggr", ["var", "std", ["mean", "var"], pyg.VarAggregation()])
def test_semi_grad_set_after_construction_on_a_fused_moment_is_refused(aggr):
    """PyG's ``VarAggregation``/``StdAggregation`` read ``semi_grad`` on every call, so
    ``conv.aggr_module.semi_grad = True`` after construction gives PyG's layer the
    semi-gradient; gnnfuse's fused slot (printed as PyG's class) stored the attribute
    and kept the full gradient: 2.96 off PyG's x-gradient on a 7-vertex graph, silently.
    (In a list PyG fixes the semi-gradient at construction and ignores the later value, as
    gnnfuse did: refused there too, since either way it would not apply.)"""
    conv = gnn.SAGEConv(4, 3, aggr=aggr)
    slot = conv.aggr_module.aggrs[1] if isinstance(aggr, list) else conv.aggr_module
    with pytest.raises(AttributeError, match=r"Aggregation\(\) in a gnnfuse layer is a fused reduction .* "
                                             r"aggr_kwargs=\{'semi_grad': True\}"):
        slot.semi_grad = True
    conv(torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]]))     # the layer runs as built



@pytest.mark.parametrize("case", EAGER, ids=lambda c: c[0])
def test_other_aggregations_run_pyg_modules_with_one_warning(case, fresh_warnings):
    _, aggr, aggr_kwargs, name = case
    ours, ref = layers(aggr, aggr_kwargs)
    with pytest.warns(UserWarning, match=rf"SAGEConv: aggregation {name}.* not fused by gnnfuse"):
        ours(features(), EDGE_INDEX)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)        # once per layer class and aggregation
        assert_same_outputs_and_grads(ours, ref, lambda x: ours(x, EDGE_INDEX), lambda x: ref(x, EDGE_INDEX),
                                      features())


@pytest.mark.parametrize("aggr", [lambda: "median", lambda: pyg.QuantileAggregation(0.5, interpolation="linear"),
                                  lambda: pyg.QuantileAggregation(0.3, interpolation="higher")],
                         ids=["median", "linear", "higher"])
def test_quantiles_run_where_vertex_0_has_no_in_edges(aggr, fresh_warnings):
    # PyG's quantile aggregation indexes row -0.5 of the sorted messages for vertex 0
    # without in-edges and raises IndexError (PyG 2.8); here the oracle is PyG on the same
    # graph with vertices 0 and 2 swapped (vertex 2 has in-edges), its output swapped back
    ours, ref = layers(aggr, None)
    edge_index = EDGE_INDEX[:, EDGE_INDEX[1] != 0]      # vertices 0 and 5 read nothing
    swap = torch.tensor([2, 1, 0, 3, 4, 5])
    with pytest.warns(UserWarning, match="not fused by gnnfuse"):
        assert_same_outputs_and_grads(ours, ref, lambda x: ours(x, edge_index),
                                      lambda x: ref(x[swap], swap[edge_index])[swap], features())


def test_lstm_refuses_an_unsorted_index_as_pyg_does(fresh_warnings):
    ours, _ = layers(lambda: "lstm", None)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="'index' tensor is not sorted"):
        ours(features(), EDGE_INDEX.flip(1))


def test_lstm_reads_a_sparse_adj_t_in_destination_order(fresh_warnings):
    """A CSR adj_t's edges come grouped by destination, in PyG's order for that layout."""
    ours, ref = layers(lambda: "lstm", None)
    edges = torch.unique(EDGE_INDEX, dim=1)                 # an adj_t would sum the repeated edge
    adj_t = torch.sparse_coo_tensor(edges.flip(0), torch.ones(edges.shape[1]), (N, N)).to_sparse_csr()
    with pytest.warns(UserWarning):
        assert_same_values(ours(features(), adj_t), ref(features(), adj_t), "output")


def test_without_pyg_other_aggregations_are_refused_by_name_and_fused_ones_run(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_geometric.nn.resolver", None)     # as if PyG were not installed
    with pytest.raises(ImportError, match=r"SAGEConv\(aggr='lstm'\): gnnfuse fuses only .*install torch_geometric"):
        gnn.SAGEConv(F_IN, F_OUT, aggr="lstm")
    kwargs = {"aggr_kwargs": {"mode": "proj", "mode_kwargs": {"in_channels": F_IN, "out_channels": 5}}}
    ours = gnn.SAGEConv(F_IN, F_OUT, aggr=["mean", "std"], **kwargs).double()
    monkeypatch.undo()
    ref = pyg.SAGEConv(F_IN, F_OUT, aggr=["mean", "std"], **kwargs).double()
    ours.load_state_dict(ref.state_dict())
    assert_same_values(ours(features(), EDGE_INDEX), ref(features(), EDGE_INDEX), "output")


def test_pyg_is_imported_only_inside_the_fallback():
    """No module-level import of torch_geometric in the aggregation module (gnnfuse.nn
    must import without PyG); a subprocess import check would cost seconds of torch import."""
    tree = ast.parse(inspect.getsource(aggregation))
    imported = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                and "torch_geometric" in ast.unparse(node)]
    assert not imported


@pytest.mark.parametrize("aggr, kwargs, error, match", [
    ("mean", {"learn": True}, TypeError, r"SAGEConv\(aggr='mean'\) takes no aggr_kwargs"),
    ("std", {"semi_grad": True, "learn": True}, TypeError, r"SAGEConv\(aggr='std'\) takes \['semi_grad'\] aggr_kwargs"),
    (["mean", "max"], {"mode": "nosuch"}, ValueError, "mode='nosuch' is not one of PyG's combine modes"),
    (["mean", "max"], {"mode": "proj"}, ValueError, "'proj' needs in_channels and out_channels"),
    (["mean"], {"mode": "attn", "mode_kwargs": {"in_channels": 4, "out_channels": 4}}, ValueError,
     "'attn' needs several aggregations"),
    (["mean", "max"], {"aggrs_kwargs": [{}]}, ValueError, "aggrs_kwargs has 1 entries for 2 aggregations"),
    ([], {}, ValueError, r"aggr=\[\] names no aggregation"),
    (["mean", ["max"]], {}, ValueError, "nests a list"),
    (3, {}, ValueError, "aggr must be a name, a list of names or an Aggregation module"),
])
def test_bad_aggregation_arguments_are_named(aggr, kwargs, error, match):
    with pytest.raises(error, match=match):
        gnn.SAGEConv(F_IN, F_OUT, aggr=aggr, aggr_kwargs=kwargs)


def test_an_eager_aggregation_is_warned_about_at_the_callers_line(fresh_warnings):
    """The fallback's warning is shown at the user's call of the layer: a fixed stacklevel
    pointed it at gnnfuse/nn/conv.py, where no user can act on it (or filter it by module)."""
    ours, _ = layers(lambda: "median", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        ours(features(), EDGE_INDEX)
    said = [(w.filename, w.lineno) for w in caught if "not fused by gnnfuse" in str(w.message)]
    assert said == [(__file__, line)]
