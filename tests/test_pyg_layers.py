"""PyG's own layers compiled through `gnnfuse.nn.MessagePassing` (`gnnfuse.nn.pyg_layers`):
each name in `COMPILED_PYG_LAYERS`, with PyG's weights copied, must give PyG's outputs and
gradients in float64 on the reference backend and the Triton interpreter, and must really
run compiled (a compiled program ran, PyG's eager propagate did not)."""
from __future__ import annotations

import functools
import io
import pickle
import warnings
from typing import Callable, NamedTuple

import pytest
import torch
import torch_geometric.nn as pyg_nn

import gnnfuse.nn
from gnnfuse.graph.index_cache import clear_index_cache
from gnnfuse.nn import message_passing, pyg_layers
from gnnfuse.runtime import record_calls
from oracle_check import device_for
from pyg_user_layers import scaled_in_a_function

# 9 vertices (8 isolated: no in-edges), a self loop (3 -> 3), a repeated edge (1 -> 2 twice)
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 2, 3, 0, 5, 1, 6, 7, 4],
                      [1, 2, 3, 4, 5, 0, 0, 0, 4, 3, 2, 1, 2, 0, 2, 6]])
NUM_NODES, F, OUT, EDGE_DIM = 9, 6, 4, 3
LINEAR = torch.nn.Linear


def _mlp(width: int, out: int) -> torch.nn.Module:
    return torch.nn.Sequential(LINEAR(width, out), torch.nn.Tanh())


# forward(layer, tensors, edge_index): how each kind of layer is called on `inputs`
def PLAIN(layer, t, ei):
    return layer(t["x"], ei)


def EDGE_ATTR(layer, t, ei):
    return layer(t["x"], ei, t["edge_attr"])


def POINTS(layer, t, ei):
    return layer(t["x"], t["pos"], ei)


def WITH_X0(layer, t, ei):
    return layer(t["x"], t["x_0"], ei)


HAN_METADATA = (["a", "b"], [("a", "to", "b"), ("b", "to", "a"), ("a", "self", "a")])


def _hetero(layer, t, ei):
    """HANConv on two vertex types of NUM_NODES rows each (feature widths 6 and 3)."""
    out = layer({"a": t["x"], "b": t["x_0"][:, :3]},
                {("a", "to", "b"): ei, ("b", "to", "a"): ei.flip(0), ("a", "self", "a"): ei[:, ::2]})
    return torch.cat([out["a"], out["b"]], dim=-1)


def _types(ei: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HEATConv's vertex types (two) and edge types (three)."""
    return (torch.arange(NUM_NODES, device=ei.device) % 2, torch.arange(ei.shape[1], device=ei.device) % 3)


def _hypergraph(layer, t, ei):
    """Four hyperedges over the 9 vertices (vertex 8 in none), with attention features."""
    hyperedges = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3, 3, 0]], device=ei.device)
    return layer(t["x"], hyperedges, hyperedge_attr=t["x_0"][:4])


def _mesh_edges(ei: torch.Tensor) -> torch.Tensor:
    """MeshCNN's edge adjacency: row i of x (a mesh edge) has four neighbouring edges."""
    rows = torch.arange(NUM_NODES, device=ei.device).repeat_interleave(4)
    return torch.stack([rows, (rows + torch.arange(1, 5, device=ei.device).repeat(NUM_NODES)) % NUM_NODES])


class Case(NamedTuple):
    make: Callable[[type], torch.nn.Module]
    forward: Callable[..., torch.Tensor] = PLAIN
    # for a layer of EAGER_PYG_LAYERS: part of the warning that says why it runs eagerly
    eager_because: str | None = None


# name -> how to build and call it; non-default arguments where the layer has them, so
# their code paths are compared too
CONFIGS = {
    "AGNNConv": Case(lambda c: c(requires_grad=True)),
    "CGConv": Case(lambda c: c(F, dim=EDGE_DIM, aggr="mean", batch_norm=True), EDGE_ATTR),
    "ClusterGCNConv": Case(lambda c: c(F, OUT, diag_lambda=0.3)),
    # message() keeps its attention weights in self._alpha for forward() to return
    "FAConv": Case(lambda c: c(F, eps=0.2), WITH_X0),
    "FeaStConv": Case(lambda c: c(F, OUT, heads=2)),
    "FiLMConv": Case(lambda c: c(F, OUT, num_relations=1)),
    "GCN2Conv": Case(lambda c: c(F, alpha=0.2, theta=0.5, layer=2, shared_weights=False),
                     lambda layer, t, ei: layer(t["x"], t["x_0"], ei, t["edge_weight"])),
    "GENConv": Case(lambda c: c(F, OUT, aggr="softmax", learn_t=True, edge_dim=EDGE_DIM, num_layers=2), EDGE_ATTR),
    "GINEConv": Case(lambda c: c(LINEAR(F, OUT), edge_dim=EDGE_DIM, train_eps=True), EDGE_ATTR),
    "GMMConv": Case(lambda c: c(F, OUT, dim=EDGE_DIM, kernel_size=2), EDGE_ATTR),
    "GatedGraphConv": Case(lambda c: c(F, 2, aggr="mean")),
    "GeneralConv": Case(lambda c: c(F, OUT, in_edge_channels=EDGE_DIM, attention=True, heads=2), EDGE_ATTR),
    "HANConv": Case(lambda c: c({"a": F, "b": 3}, OUT, HAN_METADATA, heads=2), _hetero),
    "HEATConv": Case(lambda c: c(F, OUT, num_node_types=2, num_edge_types=3, edge_type_emb_dim=2,
                                 edge_dim=EDGE_DIM, edge_attr_emb_dim=2, heads=2),
                     lambda layer, t, ei: layer(t["x"], ei, *_types(ei), t["edge_attr"])),
    "LEConv": Case(lambda c: c(F, OUT)),
    "LGConv": Case(lambda c: c()),
    "MFConv": Case(lambda c: c(F, OUT, max_degree=3)),
    "MixHopConv": Case(lambda c: c(F, OUT, powers=[0, 1, 2])),
    "NNConv": Case(lambda c: c(F, OUT, LINEAR(EDGE_DIM, F * OUT), aggr="mean"), EDGE_ATTR),
    "PDNConv": Case(lambda c: c(F, OUT, edge_dim=EDGE_DIM, hidden_channels=5), EDGE_ATTR),
    "PointGNNConv": Case(lambda c: c(_mlp(F, 3), _mlp(F + 3, OUT), _mlp(OUT, F)), POINTS),
    "PointNetConv": Case(lambda c: c(_mlp(F + 3, OUT), _mlp(OUT, OUT)), POINTS),
    "PointTransformerConv": Case(lambda c: c(F, OUT), POINTS),
    "ResGatedGraphConv": Case(lambda c: c(F, OUT, edge_dim=EDGE_DIM), EDGE_ATTR),
    "SSGConv": Case(lambda c: c(F, OUT, alpha=0.2, K=2)),
    # the second layer's form: four propagations over halves of x, on positive and negative edges
    "SignedConv": Case(lambda c: c(F // 2, OUT, first_aggr=False),
                       lambda layer, t, ei: layer(t["x"], ei, ei[:, 1::3].flip(0))),
    "SimpleConv": Case(lambda c: c(aggr="max", combine_root="sum")),
    "TransformerConv": Case(lambda c: c(F, OUT, heads=2, edge_dim=EDGE_DIM, beta=True, concat=False), EDGE_ATTR),
    "WLConvContinuous": Case(lambda c: c()),
    # exported, but every call runs PyG's eager propagate (with the warning naming why)
    "ARMAConv": Case(lambda c: c(F, OUT, num_stacks=2, num_layers=2),
                     lambda layer, t, ei: layer(t["x"], ei, t["edge_weight"]), "node_dim=-2 selects a non-leading axis"),
    "DNAConv": Case(lambda c: c(2, heads=2, groups=2),
                    lambda layer, t, ei: layer(t["x"].view(NUM_NODES, 3, 2), ei), ".transpose() has no gnnfuse op"),
    "EGConv": Case(lambda c: c(F, OUT, aggregators=["sum", "max"], num_heads=2, num_bases=2),
                   eager_because="EGConv overrides aggregate()"),
    "HypergraphConv": Case(lambda c: c(F, OUT, use_attention=True, heads=2), _hypergraph, "bipartite message passing"),
    "MeshCNNConv": Case(lambda c: c(F, OUT), lambda layer, t, ei: layer(t["x"], _mesh_edges(ei)), "indexing dim 0"),
    "PNAConv": Case(lambda c: c(F, OUT, ["mean", "max", "std"], ["identity", "amplification"],
                                deg=torch.tensor([1, 2, 3, 1]), edge_dim=EDGE_DIM), EDGE_ATTR,
                    "DegreeScalerAggregation"),
    "PPFConv": Case(lambda c: c(_mlp(F + 4, OUT), _mlp(OUT, OUT)),
                    lambda layer, t, ei: layer(t["x"], t["pos"], torch.nn.functional.normalize(t["x_0"][:, :3]), ei),
                    "function cross has no gnnfuse op"),
    "SuperGATConv": Case(lambda c: c(F, OUT, heads=2, attention_type="MX"), eager_because=".is_cuda has no gnnfuse op"),
}
COMPILED = sorted(name for name, case in CONFIGS.items() if case.eager_because is None)
EAGER = sorted(set(CONFIGS) - set(COMPILED))


def test_every_listed_layer_is_checked():
    assert COMPILED == sorted(pyg_layers.COMPILED_PYG_LAYERS)
    assert EAGER == sorted(pyg_layers.EAGER_PYG_LAYERS)


def twins(name: str, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, torch.nn.Module]:
    """gnnfuse's layer and PyG's with the same float64 weights (and eval mode: no dropout)."""
    make = CONFIGS[name].make
    torch.manual_seed(0)
    ours = make(getattr(gnnfuse.nn, name)).double().to(device).eval()
    theirs = make(getattr(pyg_nn, name)).double().to(device).eval()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def run(layer: torch.nn.Module, forward: Callable[..., torch.Tensor], tensors: dict[str, torch.Tensor],
        edge_index: torch.Tensor):
    """Output and the gradients of a fixed projection of it w.r.t. every input tensor (None
    for those the layer does not read) and parameter."""
    tensors = {name: t.clone().requires_grad_() for name, t in tensors.items()}
    out = forward(layer, tensors, edge_index)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), [*tensors.values(), *layer.parameters()], allow_unused=True)
    return out.detach(), grads


def inputs(device: torch.device | str) -> dict[str, torch.Tensor]:
    """Every float tensor a layer's forward may take (vertex features, a second feature
    table, positions, edge features, positive edge weights), in float64."""
    gen = torch.Generator().manual_seed(1)
    tensors = {"x": torch.randn(NUM_NODES, F, dtype=torch.float64, generator=gen),
               "x_0": torch.randn(NUM_NODES, F, dtype=torch.float64, generator=gen),
               "pos": torch.randn(NUM_NODES, 3, dtype=torch.float64, generator=gen),
               "edge_attr": torch.rand(EDGES.shape[1], EDGE_DIM, dtype=torch.float64, generator=gen),
               "edge_weight": torch.rand(EDGES.shape[1], dtype=torch.float64, generator=gen) + 0.1}
    return {name: t.to(device) for name, t in tensors.items()}


def _assert_same(got, expected) -> None:
    torch.testing.assert_close(got[0], expected[0], rtol=1e-9, atol=1e-10)
    for grad, want in zip(got[1], expected[1], strict=True):
        assert (grad is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(grad, want, rtol=1e-9, atol=1e-10)


def _eager_is_an_error(*args, **kwargs):
    raise AssertionError("PyG's eager propagate ran: the layer did not compile")


FIRST_PASS = pytest.param("first-pass", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=(
    "a new small graph on a GPU runs on the reference backend (runtime/first_pass.py); on a CPU that is the "
    "reference case")))


@pytest.mark.parametrize("backend", ["reference", "triton", FIRST_PASS])
@pytest.mark.parametrize("name", COMPILED)
def test_layer_compiles_and_matches_pyg(name, backend, monkeypatch):
    if backend == "first-pass":      # the device's default: the reference backend's torch ops on CUDA tensors
        monkeypatch.delenv("GNNFUSE_BACKEND", raising=False)
        clear_index_cache()     # the triton case's graph of these edges, kept by contents, is no new one
        device = "cuda"
    else:
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        device = device_for(backend)     # the Triton backend runs CUDA tensors on a GPU machine
    ours, theirs = twins(name, device)
    tensors, edge_index, forward = inputs(device), EDGES.to(device), CONFIGS[name].forward
    expected = run(theirs, forward, tensors, edge_index)
    monkeypatch.setattr(message_passing, "_eager_propagate", _eager_is_an_error)
    with record_calls() as calls:
        got = run(ours, forward, tensors, edge_index)
    assert calls, "no compiled program ran"
    if backend == "first-pass":
        assert {c.executor for c in calls} == {"reference (first pass)"}
    _assert_same(got, expected)


@pytest.mark.parametrize("name", [n for n in COMPILED if n not in ("HANConv", "HEATConv", "SignedConv")])
def test_layer_takes_a_gnnfuse_graph_as_gnnfuse_s_own_layers_do(name):      # (those cases compute from the index)
    """A `Graph` for the edge_index reached PyG's checks, which refused it ("propagate only
    supports integer tensors"); it now runs as its [2, E] tensor, compiled."""
    ours, theirs = twins(name)
    tensors, forward = inputs("cpu"), CONFIGS[name].forward
    expected = run(theirs, forward, tensors, EDGES)
    graph = gnnfuse.Graph.from_edge_index(EDGES, NUM_NODES)
    with record_calls() as calls:
        got = run(ours, forward, tensors, graph)
    assert calls or name in EAGER, "no compiled program ran"
    _assert_same(got, expected)


@pytest.mark.parametrize("extra", [2, -1])
@pytest.mark.parametrize("name", [n for n in COMPILED if n not in ("HANConv", "HEATConv", "SignedConv")])
def test_a_gnnfuse_graph_of_other_vertex_counts_than_the_tables_rows_is_refused(name, extra):
    """The `Graph` reaches PyG's code as its bare [2, E] tensor, without its vertex count:
    a graph of NUM_NODES + 2 vertices beside tables of NUM_NODES rows gave NUM_NODES output
    rows (and one of NUM_NODES - 1 read tables of NUM_NODES rows), where gnnfuse's own layers
    refuse such a graph. Refused, naming the table."""
    ours, _ = twins(name)
    tensors, forward = inputs("cpu"), CONFIGS[name].forward
    graph = gnnfuse.Graph.from_edge_index(EDGES, NUM_NODES + extra)      # (the largest id is 7: 8 vertices hold it)
    with pytest.raises(ValueError, match=rf"{name}: \w+(\[\d\])? has {NUM_NODES} rows but the Graph has "
                                         rf"{NUM_NODES + extra} sources"):
        run(ours, forward, tensors, graph)


def test_a_bipartite_graph_s_tables_are_checked_side_by_side():
    """An ``(x_src, x_dst)`` pair is checked against the Graph's sources and destinations
    apart: the right pair runs as the same edges given as an edge_index with ``size``,
    and a pair of swapped sides is refused, naming the side."""
    layer = gnnfuse.nn.GINEConv(torch.nn.Linear(F, OUT), edge_dim=EDGE_DIM).double()
    gen = torch.Generator().manual_seed(3)
    edges = torch.tensor([[0, 1, 2, 4, 4], [0, 1, 1, 2, 0]])
    x_src, x_dst = torch.randn(5, F, dtype=torch.float64, generator=gen), torch.randn(3, F, dtype=torch.float64)
    edge_attr = torch.randn(5, EDGE_DIM, dtype=torch.float64, generator=gen)
    graph = gnnfuse.Graph.from_edge_index(edges, 3, num_src_nodes=5)
    expected = layer((x_src, x_dst), edges, edge_attr, size=(5, 3))
    torch.testing.assert_close(layer((x_src, x_dst), graph, edge_attr), expected)
    with pytest.raises(ValueError, match=r"GINEConv: x\[0\] has 3 rows but the Graph has 5 sources and 3 dest"):
        layer((x_dst, x_src), graph, edge_attr)


@pytest.mark.parametrize("name", EAGER)
def test_layer_runs_pyg_s_propagate_with_a_warning(name):
    """A layer of EAGER_PYG_LAYERS warns once, naming why, and gives PyG's numbers."""
    ours, theirs = twins(name)
    tensors, forward = inputs("cpu"), CONFIGS[name].forward
    expected = run(theirs, forward, tensors, EDGES)
    message_passing._WARNED.pop(type(ours), None)
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        got = run(ours, forward, tensors, EDGES)
    reasons = [str(w.message) for w in caught if "eager message passing" in str(w.message)]
    assert len(reasons) == 1 and reasons[0].startswith(f"{name}.propagate runs PyG's eager")
    assert CONFIGS[name].eager_because in reasons[0]
    assert not calls
    _assert_same(got, expected)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_hypergraph_conv_compiles_with_as_many_hyperedges_as_vertices(backend, monkeypatch):
    """HypergraphConv's two propagations (vertices to hyperedges, and back with PyG's flow
    reversed) are square when the counts agree: then they compile, and give PyG's numbers."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    ours, theirs = twins("HypergraphConv", device)
    hyperedges = torch.stack([EDGES[0], (EDGES[1] + 2) % NUM_NODES]).to(device)   # 9 hyperedges, 0 and 1 empty

    def forward(layer, t, ei):
        return layer(t["x"], ei, hyperedge_attr=t["x_0"])
    tensors = inputs(device)
    expected = run(theirs, forward, tensors, hyperedges)
    monkeypatch.setattr(message_passing, "_eager_propagate", _eager_is_an_error)
    with record_calls() as calls:
        got = run(ours, forward, tensors, hyperedges)
    assert len(calls) == 2
    _assert_same(got, expected)


def test_every_other_pyg_convolution_names_its_alternative():
    """``from gnnfuse.nn import AGNNConv`` was a bare "cannot import name"; a PyG layer
    gnnfuse.nn does not export says why, and what to use."""
    exported = {*gnnfuse.nn.__all__, *pyg_layers.COMPILED_PYG_LAYERS, *pyg_layers.EAGER_PYG_LAYERS, "MessagePassing"}
    missing = sorted(set(pyg_nn.conv.__all__) - exported)
    assert missing == sorted(pyg_layers.NOT_EXPORTED)
    for name in missing:
        with pytest.raises(ImportError, match=rf"gnnfuse.nn has no '{name}': .*torch_geometric.nn.{name}\b"):
            exec(f"from gnnfuse.nn import {name}", {})


@pytest.mark.parametrize("name", ["AntiSymmetricConv", "DirGNNConv", "DirGNNConv-SAGE", "GPSConv"])
def test_pyg_wrappers_around_gnnfuse_layers_compile_and_match(name):
    """What the ImportError of PyG's wrapper layers advises: the PyG wrapper around a
    gnnfuse.nn layer runs compiled and gives PyG's numbers. DirGNNConv switches its
    copies' ``root_weight`` off after construction, which SAGEConv refused."""
    wraps = {"AntiSymmetricConv": lambda m: pyg_nn.AntiSymmetricConv(F, phi=m.GCNConv(F, F, bias=False), num_iters=2),
             "DirGNNConv": lambda m: pyg_nn.DirGNNConv(m.GCNConv(F, OUT), alpha=0.3),
             "DirGNNConv-SAGE": lambda m: pyg_nn.DirGNNConv(m.SAGEConv(F, OUT), alpha=0.3),
             "GPSConv": lambda m: pyg_nn.GPSConv(F, m.GCNConv(F, F), heads=2)}[name]
    torch.manual_seed(0)
    ours, theirs = wraps(gnnfuse.nn).double().eval(), wraps(pyg_nn).double().eval()
    theirs.load_state_dict(ours.state_dict())
    tensors = inputs("cpu")
    expected = run(theirs, PLAIN, tensors, EDGES)
    with record_calls() as calls:
        got = run(ours, PLAIN, tensors, EDGES)
    assert calls
    _assert_same(got, expected)


def test_sage_root_weight_switched_off_keeps_lin_r_unused_as_pyg_does():
    ours, theirs = gnnfuse.nn.SAGEConv(F, OUT).double(), pyg_nn.SAGEConv(F, OUT).double()
    theirs.load_state_dict(ours.state_dict())
    ours.root_weight = theirs.root_weight = False
    assert not ours.root_weight and set(ours.state_dict()) == set(theirs.state_dict())
    tensors = inputs("cpu")
    _assert_same(run(ours, PLAIN, tensors, EDGES), run(theirs, PLAIN, tensors, EDGES))
    ours.root_weight = True
    assert ours.root_weight
    with pytest.raises(AttributeError, match="root_weight=True needs lin_r"):
        gnnfuse.nn.SAGEConv(F, OUT, root_weight=False).root_weight = True


def test_is_the_pyg_class_and_pickles():
    conv = gnnfuse.nn.TransformerConv(F, OUT, heads=2)
    assert isinstance(conv, pyg_nn.TransformerConv) and isinstance(conv, gnnfuse.nn.MessagePassing)
    assert repr(conv) == repr(pyg_nn.TransformerConv(F, OUT, heads=2)) == "TransformerConv(6, 4, heads=2)"
    buffer = io.BytesIO()
    torch.save(conv, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer, weights_only=False)) is gnnfuse.nn.TransformerConv
    with pytest.raises(AttributeError):
        gnnfuse.nn.NotALayer


class SumOfNeighbours(pyg_nn.MessagePassing):
    """A user's layer, which gnnfuse.nn does not export."""

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)


@pytest.mark.parametrize("pyg_class", [pyg_nn.GATConv, SumOfNeighbours])
def test_layers_of_a_compiled_class_gnnfuse_nn_does_not_export_pickle(pyg_class):
    """A compiled class was named gnnfuse.nn.<name>, which for PyG's GATConv is gnnfuse's own
    GATConv and for a user's layer nothing: torch.save(model) failed with "Can't pickle
    <class 'gnnfuse.nn.GATConv'>: it's not the same object as gnnfuse.nn.GATConv"."""
    conv = gnnfuse.nn.compiled_class(pyg_class)(*((F, OUT) if pyg_class is pyg_nn.GATConv else ()))
    x, edge_index = torch.randn(5, F), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    expected = conv(x, edge_index)
    buffer = io.BytesIO()
    torch.save(torch.nn.Sequential(conv), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)[0]
    assert type(loaded) is type(conv) and type(pickle.loads(pickle.dumps(conv))) is type(conv)
    torch.testing.assert_close(loaded(x, edge_index), expected, rtol=0, atol=0)
    assert repr(loaded) == repr(conv)


def test_compiled_class_takes_other_message_passing_classes():
    assert gnnfuse.nn.compiled_class(pyg_nn.GINEConv) is gnnfuse.nn.GINEConv
    assert gnnfuse.nn.compiled_class(gnnfuse.nn.GINEConv) is gnnfuse.nn.GINEConv
    with pytest.raises(TypeError, match="subclass of torch_geometric.nn.MessagePassing"):
        gnnfuse.nn.compiled_class(torch.nn.Linear)
    # PyG's wrappers are not MessagePassing layers: the error says how to compile what they wrap
    with pytest.raises(TypeError, match=r"got .*DirGNNConv.*: .*DirGNNConv\(gnnfuse.nn.GCNConv\(64, 64\)\)"):
        gnnfuse.nn.compiled_class(pyg_nn.DirGNNConv)



def test_compiled_class_of_a_class_made_in_a_loop_is_freed_with_it():
    """compiled_class cached by its argument, and its compiled class subclasses the argument:
    a sweep compiling a layer class defined in its loop kept all 20 classes, and the
    [1000, 100] tensor each one's message closed over, alive for good. The compiled class
    is still one per class while the class lives."""
    import gc
    import weakref

    refs = []
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    for _ in range(20):
        cls, scale = scaled_in_a_function(pyg_nn.MessagePassing)
        compiled = gnnfuse.nn.compiled_class(cls)
        assert gnnfuse.nn.compiled_class(cls) is compiled
        compiled()(torch.randn(3, 4), edge_index)
        refs += [weakref.ref(cls), weakref.ref(scale)]
        del cls, scale, compiled
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0

@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("name", ["FAConv", "TransformerConv"])
def test_attention_weights_are_pyg_s(name, flag):
    """message() keeps the weights in self._alpha; a call asking for them (True or False,
    as PyG reads the flag) runs eagerly and returns PyG's, the others compile."""
    ours, theirs = twins(name)
    tensors, forward = inputs("cpu"), CONFIGS[name].forward

    def asking(layer, t, ei):
        return forward(functools.partial(layer, return_attention_weights=flag), t, ei)
    with record_calls() as calls:
        out, (edge_index, alpha) = asking(ours, tensors, EDGES)
    assert not calls
    ref, (ref_index, ref_alpha) = asking(theirs, tensors, EDGES)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(alpha, ref_alpha)
    assert torch.equal(edge_index, ref_index)
    with record_calls() as calls:
        torch.testing.assert_close(forward(ours, tensors, EDGES), forward(theirs, tensors, EDGES))
    assert calls and ours._alpha is None


class _Doubling(pyg_nn.MessagePassing):
    """A layer of another library whose own propagate post-processes PyG's."""

    def __init__(self):
        super().__init__(aggr="add")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def propagate(self, edge_index, size=None, **kwargs):
        return 2 * super().propagate(edge_index, size=size, **kwargs)

    def message(self, x_j):
        return x_j


class _DoublingCompiled(gnnfuse.nn.MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")

    forward, message = _Doubling.forward, _Doubling.message

    def propagate(self, edge_index, size=None, **kwargs):
        return 2 * super().propagate(edge_index, size=size, **kwargs)


class _Plain(pyg_nn.MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_j):
        return x_j * 3


def test_compiled_class_refuses_a_class_with_its_own_propagate():
    """compiled_class puts gnnfuse's propagate first among the bases, so a class's own
    propagate never ran: compiled _Doubling gave [2, 0, 1] where PyG gives [4, 0, 2]. A
    propagate PyG generated on the class (after a PyG instance was built) is PyG's own."""
    edge_index, x = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.arange(3.0).view(-1, 1)
    assert _Doubling()(x, edge_index).flatten().tolist() == [4.0, 0.0, 2.0]
    with pytest.raises(TypeError, match=r"_Doubling overrides propagate\(\) .*subclass gnnfuse.nn.MessagePassing"):
        gnnfuse.nn.compiled_class(_Doubling)
    with record_calls() as calls:     # what the error advises
        assert _DoublingCompiled()(x, edge_index).flatten().tolist() == [4.0, 0.0, 2.0]
    assert calls
    expected = _Plain()(x, edge_index)    # PyG installs its template propagate on _Plain
    with record_calls() as calls:
        torch.testing.assert_close(gnnfuse.nn.compiled_class(_Plain)()(x, edge_index), expected)
    assert calls


class _KeepsMessages(gnnfuse.nn.MessagePassing):
    """Stores its messages on the layer, as PyG's attention layers store their weights."""

    def __init__(self):
        super().__init__(aggr="add")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x), self.last

    def message(self, x_j):
        self.last = x_j * 2
        return self.last


def test_message_storing_on_the_layer_runs_pyg_semantics():
    """A compiled call traces message() once, so what it stores on the layer would be a
    traced value (it was, and the caller received it); it runs eagerly with a warning."""
    layer = _KeepsMessages()
    x = torch.randn(NUM_NODES, 2)
    message_passing._WARNED.pop(_KeepsMessages, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, last = layer(x, EDGES)
    assert any("message() sets self.last" in str(w.message) for w in caught)
    torch.testing.assert_close(last, x[EDGES[0]] * 2)
    torch.testing.assert_close(out, torch.zeros_like(x).index_add_(0, EDGES[1], x[EDGES[0]] * 2))


@pytest.mark.parametrize("sources", [3, 4])
def test_pair_input_with_reversed_flow_is_pyg_s(sources):
    """PyG's layers run a template-generated collect that reads an (x[0], x[1]) pair as
    (source rows, target rows) under flow='target_to_source' too; the compiled call (3 and 3
    rows) read x_j from x[1] and gave [20, 30, 0] where PyG gives [2, 3, 0], and the eager
    fallback (4 and 3 rows: bipartite) ran PyG's generic propagate, which did the same."""
    edge_index = torch.tensor([[0, 1], [1, 2]])
    pair = (torch.arange(1.0, sources + 1).view(-1, 1), torch.tensor([[10.0], [20.0], [30.0]]))
    ours = gnnfuse.nn.SimpleConv(flow="target_to_source")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ours(pair, edge_index)
    torch.testing.assert_close(got, pyg_nn.SimpleConv(flow="target_to_source")(pair, edge_index))
    torch.testing.assert_close(got[:3], torch.tensor([[2.0], [3.0], [0.0]]))


def test_eager_fallback_on_an_int32_edge_index_has_int64_gradients():
    """PyG's eager propagate scatters messages with the edge index broadcast over the
    feature axis; torch 2.13's scatter_add backward reads such an expanded int32 index
    wrongly, so GENConv(aggr='powermean'), which runs eagerly, gave an input gradient 0.59
    off (absolute) on an int32 edge_index. The fallback takes the index as int64."""
    torch.manual_seed(0)
    layer = gnnfuse.nn.GENConv(4, 4, aggr="powermean", learn_p=True).double()
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 4, 1], [1, 2, 0, 0, 1, 3, 1]])
    x = torch.randn(5, 4, dtype=torch.float64)
    grads = []
    for index in (edge_index, edge_index.int()):
        xs = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer(xs, index).square().sum().backward()
        grads.append(xs.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)


def test_a_module_converted_between_forward_and_backward_is_named():
    """GINEConv's compiled backward reads its edge linear's bias itself (it recomputes
    the ReLU's argument), and autograd saves a parameter by reference, so ``.double()``
    between the call and ``backward()`` handed the float32 backward a float64 bias:
    'expected m1 and m2 to have the same dtype, but got: float != double', naming no
    layer and no conversion. The error now names the layer, the dtypes and the fix."""
    torch.manual_seed(0)
    layer = gnnfuse.nn.GINEConv(LINEAR(F, OUT), edge_dim=EDGE_DIM)
    x = torch.randn(NUM_NODES, F, requires_grad=True)
    out = layer(x, EDGES, torch.randn(EDGES.size(1), EDGE_DIM))
    layer.double()
    with pytest.raises(RuntimeError, match=r"GINEConv.*float32 in the forward but is torch.float64.*"
                                           r"between the call and backward"):
        out.sum().backward()


def test_a_pyg_layer_s_eager_propagate_is_warned_about_at_the_callers_line():
    """PyG's own ``forward`` calls ``propagate``: the warning is shown at the user's call of
    the layer, not inside torch_geometric/nn/conv/arma_conv.py."""
    import sys
    ours, _ = twins("ARMAConv")
    message_passing._WARNED.pop(type(ours), None)
    x = inputs("cpu")["x"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        ours(x, EDGES)
    said = [(w.filename, w.lineno) for w in caught if "eager message passing" in str(w.message)]
    assert said == [(__file__, line)]
