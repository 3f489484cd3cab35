"""PyG's bipartite layer shape -- ``in_channels=(a, b)``, ``forward((x_src, x_dst),
edge_index, size=(num_src, num_dst))`` -- on SAGEConv, GraphConv, GINConv, GATConv and
GATv2Conv, against PyG 2.8 with copied weights: outputs and the gradients of x_src,
x_dst and every parameter in float64, on the reference backend and the Triton
interpreter. The graph has fewer destinations than sources, a destination without
in-edges and sources without out-edges."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnfuse import nn as gnn
from gnnfuse.graph import Graph
from layer_check import assert_same_values
from oracle_check import device_for

NUM_SRC, NUM_DST, F_SRC, F_DST = 6, 4, 5, 3
# destination 3 has no in-edges; sources 3 and 5 have no out-edges
EDGE_INDEX = torch.tensor([[0, 1, 4, 4, 2, 1, 0, 2], [0, 0, 1, 0, 2, 1, 2, 2]])
EDGE_WEIGHT = torch.tensor([0.5, 2.0, -1.0, 1.5, 0.25, 1.0, -0.5, 3.0], dtype=torch.float64)


def gin_mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(width, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


# (id, layer class name, constructor arguments (nn modules made per call), forward extras, uses x_dst)
CASES = [
    ("sage-mean", "SAGEConv", lambda: ((F_SRC, F_DST), 4), {}, True),
    ("sage-narrowing", "SAGEConv", lambda: ((F_SRC, F_DST), 2), {}, True),
    ("sage-max", "SAGEConv", lambda: ((F_SRC, F_DST), 4, "max"), {}, True),
    ("sage-no-x_dst", "SAGEConv", lambda: ((F_SRC, F_DST), 4), {}, False),
    ("graph-add", "GraphConv", lambda: ((F_SRC, F_DST), 4), {}, True),
    ("graph-weighted-narrowing", "GraphConv", lambda: ((F_SRC, F_DST), 2), {"edge_weight": EDGE_WEIGHT}, True),
    ("graph-mean", "GraphConv", lambda: ((F_SRC, F_DST), 4, "mean"), {}, True),
    ("gin", "GINConv", lambda: (gin_mlp(F_SRC), 0.3, True), {}, "same-width"),
    ("gin-no-x_dst", "GINConv", lambda: (gin_mlp(F_SRC),), {}, False),
    ("gat-loops", "GATConv", lambda: ((F_SRC, F_DST), 3, 2), {}, True),
    ("gat-no-loops", "GATConv", lambda: ((F_SRC, F_DST), 3, 2, False, 0.2, 0.0, False), {}, True),
    ("gat-no-x_dst", "GATConv", lambda: ((F_SRC, F_DST), 3, 2), {}, False),
    ("gatv2-loops", "GATv2Conv", lambda: ((F_SRC, F_DST), 3, 2), {}, True),
    ("gatv2-no-loops", "GATv2Conv", lambda: ((F_SRC, F_DST), 3, 2, True, 0.2, 0.0, False), {}, True),
]


# The Triton interpreter runs one case per layer (suite time); the reference runs them all.
TRITON_CASES = ("sage-narrowing", "graph-weighted-narrowing", "gin", "gat-loops", "gatv2-loops")
PARAMS = [pytest.param(case, backend, id=f"{backend}-{case[0]}") for backend in ("reference", "triton")
          for case in CASES if backend == "reference" or case[0] in TRITON_CASES]


@pytest.mark.parametrize("case, backend", PARAMS)
def test_bipartite_layer_matches_pyg(case, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    _, name, arguments, extra, with_dst = case
    compare_with_pyg(name, arguments, extra, with_dst, EDGE_INDEX, NUM_SRC, NUM_DST, device_for(backend))


def compare_with_pyg(name: str, arguments, extra: dict, with_dst, edge_index: torch.Tensor,
                     num_src: int, num_dst: int, device: str = "cpu") -> None:
    """Outputs and the gradients of x_src, x_dst and every parameter equal PyG's."""
    torch.manual_seed(0)
    ref = getattr(pyg, name)(*arguments()).double().to(device)
    for p in ref.parameters():
        if p.dim() == 1:
            torch.nn.init.normal_(p)      # biases start at zero: draw them so their use shows
    torch.manual_seed(1)
    ours = getattr(gnn, name)(*arguments()).double().to(device)
    ours.load_state_dict(ref.state_dict())
    width_dst = F_SRC if with_dst == "same-width" else F_DST
    x_src = torch.randn(num_src, F_SRC, dtype=torch.float64).to(device)
    x_dst = torch.randn(num_dst, width_dst, dtype=torch.float64).to(device) if with_dst else None
    edge_index = edge_index.to(device)
    extra = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in extra.items()}   # edge_weight
    results = []
    for layer in (ours, ref):
        leaves = [x_src.clone().requires_grad_()] + ([x_dst.clone().requires_grad_()] if with_dst else [])
        out = layer((leaves[0], leaves[1] if with_dst else None), edge_index,
                    **extra, **({} if name == "GATv2Conv" else {"size": (num_src, num_dst)}))
        cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2)).to(device)
        (out * cotangent).sum().backward()
        params = {k: p.grad for k, p in layer.named_parameters()}
        results.append((out.detach(), [x.grad for x in leaves], params))
        layer.zero_grad(set_to_none=True)
    (out, grads, params), (expected, expected_grads, expected_params) = results
    assert out.shape == expected.shape == (num_dst, out.shape[1])
    assert_same_values(out, expected, "output")
    for what, a, b in zip(("x_src", "x_dst"), grads, expected_grads):
        assert_same_values(a, b, f"gradient of {what}")
    assert params.keys() == expected_params.keys()
    for key, grad in params.items():
        if expected_params[key] is None:
            assert grad is None or not grad.any(), key
        else:
            assert_same_values(grad, expected_params[key], f"gradient of {key}")


@st.composite
def bipartite_graphs(draw):
    """(edge_index, num_src, num_dst): either set may be empty; multi-edges, vertices of
    either side without edges, and i -> i edges (self loops only by number) all occur."""
    num_src, num_dst = draw(st.integers(0, 7)), draw(st.integers(0, 7))
    num_edges = draw(st.integers(0, 16)) if num_src and num_dst else 0
    src = draw(st.lists(st.integers(0, max(num_src - 1, 0)), min_size=num_edges, max_size=num_edges))
    dst = draw(st.lists(st.integers(0, max(num_dst - 1, 0)), min_size=num_edges, max_size=num_edges))
    return torch.tensor([src, dst], dtype=torch.long).view(2, num_edges), num_src, num_dst


PROPERTY_CASES = [c for c in CASES if c[0] in ("sage-mean", "sage-max", "graph-weighted-narrowing", "gin",
                                               "gat-loops", "gat-no-loops", "gatv2-loops")]


@pytest.mark.parametrize("case", PROPERTY_CASES, ids=[c[0] for c in PROPERTY_CASES])
@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(graph=bipartite_graphs())
def test_bipartite_layers_match_pyg_on_random_graphs(case, graph):
    _, name, arguments, extra, with_dst = case
    edge_index, num_src, num_dst = graph
    if "edge_weight" in extra:
        extra = {"edge_weight": torch.linspace(-1.0, 2.0, edge_index.shape[1], dtype=torch.float64)}
    compare_with_pyg(name, arguments, extra, with_dst, edge_index, num_src, num_dst)


def test_in_channels_pair_gives_pygs_parameter_names():
    for name, arguments in [("SAGEConv", ((F_SRC, F_DST), 4)), ("GraphConv", ((F_SRC, F_DST), 4)),
                            ("GATConv", ((F_SRC, F_DST), 3, 2)), ("GATv2Conv", ((F_SRC, F_DST), 3, 2))]:
        ours, ref = getattr(gnn, name)(*arguments), getattr(pyg, name)(*arguments)
        assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
               {k: tuple(v.shape) for k, v in ref.state_dict().items()}, name


def test_a_bipartite_graph_object_and_size_are_checked_against_the_features():
    layer = gnn.SAGEConv((F_SRC, F_DST), 4).double()
    x_src, x_dst = torch.randn(NUM_SRC, F_SRC, dtype=torch.float64), torch.randn(NUM_DST, F_DST, dtype=torch.float64)
    graph = Graph.from_edge_index(EDGE_INDEX, NUM_DST, num_src_nodes=NUM_SRC)
    from_graph = layer((x_src, x_dst), graph)
    torch.testing.assert_close(from_graph, layer((x_src, x_dst), EDGE_INDEX, size=(NUM_SRC, NUM_DST)))
    with pytest.raises(ValueError, match=r"size=\(6, 5\) does not fit"):
        layer((x_src, x_dst), EDGE_INDEX, size=(NUM_SRC, NUM_DST + 1))
    with pytest.raises(ValueError, match="num_nodes=3 given but the graph has 4 nodes"):
        layer((x_src, x_dst[:3]), graph)
    with pytest.raises(ValueError, match=r"x has 6 rows but the graph has 6 source and 4 destination nodes; pass \(x_src, x_dst\)"):
        gnn.SAGEConv(F_SRC, 4).double()(x_src, graph)


@pytest.mark.parametrize("with_dst, size", [(False, (NUM_SRC, None)), (False, (None, None)), (False, (None, NUM_DST)),
                                            (True, (None, NUM_DST)), (True, (NUM_SRC, None)),
                                            (True, torch.tensor([NUM_SRC, NUM_DST]))])
@pytest.mark.parametrize("name", ["SAGEConv", "GraphConv"])
def test_size_entries_left_none_are_read_from_the_features_as_in_pyg(name, with_dst, size):
    """PyG's ``propagate`` fills a None entry of ``size`` from that side's features (a
    missing x_dst's count from the sources'): ``((x_src, None), edge_index, size=(6,
    None))`` gave 3 rows here -- the None taken as the count, inferred from the largest
    destination id -- where PyG gives 6; a size with a None beside a pair was refused."""
    torch.manual_seed(0)
    ref = getattr(pyg, name)((F_SRC, F_DST), 4).double()
    ours = getattr(gnn, name)((F_SRC, F_DST), 4).double()
    ours.load_state_dict(ref.state_dict())
    x_src = torch.randn(NUM_SRC, F_SRC, dtype=torch.float64)
    x = (x_src, torch.randn(NUM_DST, F_DST, dtype=torch.float64) if with_dst else None)
    expected = ref(x, EDGE_INDEX, size=size)
    assert_same_values(ours(x, EDGE_INDEX, size=size), expected, "out")
    ref, ours = getattr(pyg, name)(F_SRC, 4).double(), getattr(gnn, name)(F_SRC, 4).double()
    ours.load_state_dict(ref.state_dict())
    torch.testing.assert_close(ours(x_src, EDGE_INDEX, size=(None, NUM_SRC)),
                               ref(x_src, EDGE_INDEX, size=(None, NUM_SRC)))


@pytest.mark.parametrize("name", ["SAGEConv", "GraphConv"])
def test_an_edge_index_declaring_only_its_destination_count_sizes_the_output_as_in_pyg(name):
    """``EdgeIndex(..., sparse_size=(None, num_dst))`` beside ``(x_src, None)``: PyG takes
    the destination count from it and the source count from x_src; it was refused ("the
    EdgeIndex has sparse_size=(None, 4) ... but the bipartite graph has 6 source and 6
    destination nodes"), only a fully declared sparse size being read."""
    from torch_geometric import EdgeIndex
    torch.manual_seed(0)
    ref = getattr(pyg, name)((F_SRC, F_DST), 4).double()
    ours = getattr(gnn, name)((F_SRC, F_DST), 4).double()
    ours.load_state_dict(ref.state_dict())
    x = (torch.randn(NUM_SRC, F_SRC, dtype=torch.float64), None)
    for sparse_size in [(None, NUM_DST + 1), (NUM_SRC, None)]:
        expected = ref(x, EdgeIndex(EDGE_INDEX, sparse_size=sparse_size))
        assert_same_values(ours(x, EdgeIndex(EDGE_INDEX, sparse_size=sparse_size)), expected, str(sparse_size))

def test_a_size_that_is_no_pair_is_refused_by_name():
    layer = gnn.SAGEConv(F_SRC, 4)
    x = torch.randn(NUM_SRC, F_SRC)
    with pytest.raises(ValueError, match=r"SAGEConv: size must be a pair \(num_src, num_dst\), got 3 entries"):
        layer(x, EDGE_INDEX, size=(NUM_SRC, NUM_SRC, NUM_SRC))
    with pytest.raises(TypeError, match=r"SAGEConv: size entries must be ints or None, got \(float, int\)"):
        layer((x, None), EDGE_INDEX, size=(6.0, 4))
    with pytest.raises(ValueError, match=r"size=\(None, 4\) does not fit x with 6 rows"):
        layer(x, EDGE_INDEX, size=(None, NUM_DST))

@pytest.mark.parametrize("name", ["GINConv", "SAGEConv", "GraphConv", "GATConv"])
def test_boolean_node_features_are_refused_naming_the_layer(name):
    """PyG's GINConv sums boolean features as their logical or (its scatter), where a
    count would be torch's sum; gnnfuse refused them only inside the compiled program,
    at its own line ("op 'reduce' cannot take operands (SRC[4]:bool) ... at
    gnnfuse/nn/conv.py: return sum([u.h for u in v.innbs])"), naming neither the layer nor x."""
    layer = gnn.GINConv(torch.nn.Linear(F_SRC, 2)) if name == "GINConv" else getattr(gnn, name)(F_SRC, 2)
    flags = torch.rand(NUM_SRC, F_SRC) > 0.5
    with pytest.raises(TypeError, match=rf"{name}: x has dtype torch.bool; .* convert them first, e.g. x.float\(\)"):
        layer(flags, EDGE_INDEX)
    with pytest.raises(TypeError, match=rf"{name}: x_src has dtype torch.bool"):
        layer((flags, None), EDGE_INDEX)

def test_gatv2_needs_x_dst():
    layer = gnn.GATv2Conv((F_SRC, F_DST), 3)
    with pytest.raises(ValueError, match="GATv2Conv: bipartite input needs x_dst"):
        layer((torch.randn(NUM_SRC, F_SRC), None), EDGE_INDEX)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv", "SAGEConv", "GraphConv"])
def test_in_channels_pair_with_one_feature_tensor_uses_both_maps(name):
    """A layer built with ``in_channels=(a, a)`` and called with one x maps it through
    the source and the destination weights, as PyG does (GAT used lin_src for both)."""
    torch.manual_seed(0)
    ref = getattr(pyg, name)((F_SRC, F_SRC), 3).double()
    ours = getattr(gnn, name)((F_SRC, F_SRC), 3).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(NUM_SRC, F_SRC, dtype=torch.float64)
    assert_same_values(ours(x, EDGE_INDEX), ref(x, EDGE_INDEX), "output")


@pytest.mark.parametrize("concat", [True, False])
def test_gat_forward_projected_equals_forward_on_the_inputs(concat):
    """`GATConv.forward_projected` (partitioned full-graph training maps rows before
    exchanging them) gives the layer's own bipartite output and gradients, float64; the
    destinations are a prefix of the sources, as a partition's owned rows are."""
    torch.manual_seed(0)
    conv = gnn.GATConv(F_SRC, 3, heads=2, concat=concat).double()
    torch.nn.init.normal_(conv.bias)
    graph = Graph.bipartite(EDGE_INDEX[0], EDGE_INDEX[1], NUM_SRC, NUM_DST)
    x = torch.randn(NUM_SRC, F_SRC, dtype=torch.float64, requires_grad=True)
    params = list(conv.parameters())

    def grads(out):
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        return torch.autograd.grad((out * weight).sum(), [x, *params])

    expected = conv((x, x[:NUM_DST]), graph)
    h = conv.lin(x)
    got = conv.forward_projected(h, h[:NUM_DST], graph)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for g, e in zip(grads(got), grads(expected)):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_gat_forward_projected_refuses_layers_that_read_the_inputs():
    conv = gnn.GATConv(F_SRC, 3, heads=2, residual=True)
    assert not conv.projects_first()
    with pytest.raises(ValueError, match="forward_projected needs one shared lin"):
        conv.forward_projected(torch.zeros(NUM_SRC, 6), torch.zeros(NUM_DST, 6),
                               Graph.bipartite(EDGE_INDEX[0], EDGE_INDEX[1], NUM_SRC, NUM_DST))
