"""PyG's bipartite layers called with a rectangular adjacency instead of an edge_index:
a torch sparse ``adj_t`` [num_dst, num_src] (CSR, as ``to_torch_csc_tensor(...).t()``
gives, or COO; entry (i, j) is the edge j -> i) and an ``EdgeIndex`` whose
``sparse_size`` is (num_src, num_dst). On SAGEConv, GraphConv, GINConv, GATConv and
GATv2Conv each form must give the output and the gradients of x_src, x_dst and every
parameter that the edge_index form gives, and that PyG 2.8's layer with copied weights
gives on the edge_index (float64). A weighted adj_t weights GraphConv's messages as
``edge_weight`` does. An adjacency whose shape disagrees with the features is a
ValueError naming both."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg
from torch_geometric import EdgeIndex

from gnnfuse import nn as gnn
from layer_check import assert_same_values
from oracle_check import device_for
from test_nn_bipartite import CASES, EDGE_INDEX, EDGE_WEIGHT, F_DST, F_SRC, NUM_DST, NUM_SRC

# PyG's CSC adjacency and sort_order='col' want the edges grouped by destination
ORDER = torch.argsort(EDGE_INDEX[1], stable=True)
SORTED_INDEX, SORTED_WEIGHT = EDGE_INDEX[:, ORDER], EDGE_WEIGHT[ORDER]


def adjacency(form: str, values: torch.Tensor | None, num_src: int = NUM_SRC, num_dst: int = NUM_DST):
    """The graph of ``SORTED_INDEX`` in one of PyG's adjacency forms (``values`` on the
    stored entries of the sparse ones; None stores ones)."""
    if form == "edge-index":
        return EdgeIndex(SORTED_INDEX, sort_order="col", sparse_size=(num_src, num_dst))
    values = torch.ones(SORTED_INDEX.shape[1], dtype=torch.float64) if values is None else values
    if form == "csr":      # the transpose of a CSC [num_src, num_dst] adjacency, as PyG's tests build it
        return torch.sparse_csc_tensor(*_csc(num_dst), values, (num_src, num_dst)).t()
    return torch.sparse_coo_tensor(SORTED_INDEX.flip(0), values, (num_dst, num_src))   # form == "coo"


def _csc(num_dst: int) -> tuple[torch.Tensor, torch.Tensor]:
    counts = torch.bincount(SORTED_INDEX[1], minlength=num_dst)
    return torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]), SORTED_INDEX[0]


def outputs_and_gradients(layer, x_src, x_dst, graph_input, extra: dict, device: str):
    """``layer((x_src, x_dst), graph_input, **extra)``, and the gradients of a fixed
    random projection of it for x_src, x_dst and every parameter."""
    leaves = [x_src.clone().requires_grad_(), None if x_dst is None else x_dst.clone().requires_grad_()]
    out = layer((leaves[0], leaves[1]), graph_input, **extra)
    cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2)).to(device)
    (out * cotangent).sum().backward()
    grads = {"x_src": leaves[0].grad, "x_dst": None if x_dst is None else leaves[1].grad}
    grads.update({k: p.grad for k, p in layer.named_parameters()})
    layer.zero_grad(set_to_none=True)
    return out.detach(), grads


def layers(name: str, arguments, device: str):
    """(PyG's layer, ours with its weights); biases drawn so their use shows."""
    torch.manual_seed(0)
    ref = getattr(pyg, name)(*arguments()).double().to(device)
    for p in ref.parameters():
        if p.dim() == 1:
            torch.nn.init.normal_(p)
    ours = getattr(gnn, name)(*arguments()).double().to(device)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def features(with_dst, device: str):
    torch.manual_seed(3)
    x_src = torch.randn(NUM_SRC, F_SRC, dtype=torch.float64).to(device)
    width_dst = F_SRC if with_dst == "same-width" else F_DST
    return x_src, torch.randn(NUM_DST, width_dst, dtype=torch.float64).to(device) if with_dst else None


def assert_same(a: tuple, b: tuple, what: str) -> None:
    (out, grads), (expected, expected_grads) = a, b
    assert out.shape == expected.shape == (NUM_DST, out.shape[1]), what
    assert_same_values(out, expected, f"{what}: output")
    assert grads.keys() == expected_grads.keys()
    for key, grad in grads.items():
        if expected_grads[key] is None:
            assert grad is None or not grad.any(), f"{what}: {key}"
        else:
            assert_same_values(grad, expected_grads[key], f"{what}: gradient of {key}")


FORMS = ("csr", "coo", "edge-index")
LAYER_CASES = [c for c in CASES if c[0] in ("sage-mean", "sage-no-x_dst", "graph-add", "graph-weighted-narrowing",
                                            "gin", "gin-no-x_dst", "gat-loops", "gat-no-x_dst", "gatv2-loops")]
PARAMS = [pytest.param(case, form, "reference", id=f"reference-{case[0]}-{form}")
          for case in LAYER_CASES for form in FORMS
          if not ("edge_weight" in case[3] and form == "edge-index")      # an EdgeIndex holds no weights
          # the COO form stores the edge 2 -> 2 twice: PyG's SAGE (spmm), GAT and GATv2 (which
          # coalesce it) read that as one entry 2, which gnnfuse refuses (test_nn_pyg_calls.py)
          and not (case[1] in ("SAGEConv", "GATConv", "GATv2Conv") and form == "coo")]
PARAMS += [pytest.param(next(c for c in CASES if c[0] == "gat-loops"), "csr", "triton", id="triton-gat-loops-csr")]


@pytest.mark.parametrize("case, form, backend", PARAMS)
def test_rectangular_adjacency_matches_edge_index_and_pyg(case, form, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    _, name, arguments, extra, with_dst = case
    weighted = "edge_weight" in extra
    ref, ours = layers(name, arguments, device)
    x_src, x_dst = features(with_dst, device)
    size = {} if name == "GATv2Conv" else {"size": (NUM_SRC, NUM_DST)}
    by_index = {**size, **({"edge_weight": SORTED_WEIGHT.to(device)} if weighted else {})}
    graph_input = adjacency(form, SORTED_WEIGHT if weighted else None).to(device)
    index = SORTED_INDEX.to(device)
    from_adjacency = outputs_and_gradients(ours, x_src, x_dst, graph_input, {}, device)
    assert_same(from_adjacency, outputs_and_gradients(ours, x_src, x_dst, index, by_index, device),
                f"{form} vs gnnfuse's edge_index")
    assert_same(from_adjacency, outputs_and_gradients(ref, x_src, x_dst, index, by_index, device),
                f"{form} vs PyG's edge_index")


@pytest.mark.parametrize("case", [c for c in LAYER_CASES if c[0] in ("sage-mean", "graph-add", "graph-weighted-narrowing",
                                                                     "gin", "gat-loops", "gat-no-x_dst", "gatv2-loops")],
                         ids=lambda c: c[0])
def test_mis_shaped_adjacency_is_a_value_error(case):
    _, name, arguments, extra, with_dst = case
    _, ours = layers(name, arguments, "cpu")
    x_src, x_dst = features(with_dst, "cpu")
    values = SORTED_WEIGHT if "edge_weight" in extra else None
    # without x_dst the adjacency sets the destination count (as in PyG): only its sources can disagree
    shapes = ((NUM_SRC + 1, NUM_DST), (NUM_SRC, NUM_DST + 1)) if with_dst else ((NUM_SRC + 1, NUM_DST),)
    for form in ("csr", "coo"):
        for num_src, num_dst in shapes:
            wrong = adjacency(form, values, num_src, num_dst)
            pattern = (fr"adj_t has shape \[{num_dst}, {num_src}\].* {NUM_SRC} source and {NUM_DST} destination"
                       if with_dst else fr"size=\({num_src}, {num_dst}\) does not fit x_src with {NUM_SRC} rows")
            with pytest.raises(ValueError, match=pattern):
                ours((x_src, x_dst), wrong)
    wrong = adjacency("edge-index", None, NUM_SRC, NUM_DST + 1)
    if with_dst:
        with pytest.raises(ValueError, match=fr"sparse_size=\({NUM_SRC}, {NUM_DST + 1}\).* {NUM_SRC} source and "
                                             fr"{NUM_DST} destination"):
            ours((x_src, x_dst), wrong)


def test_square_adj_t_without_a_pair_still_needs_a_square_shape():
    layer = gnn.SAGEConv(F_SRC, 4).double()
    x = torch.randn(NUM_SRC, F_SRC, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"must be square .* needs num_src_nodes"):
        layer(x, adjacency("coo", None))
