"""`gnnfuse.nn.to_hetero`: a homogeneous model of gnnfuse layers made heterogeneous by PyG's
transformer, checked against PyG's ``to_hetero`` of the same model built from PyG's layers,
with PyG's state dict loaded -- outputs and every gradient in float64, on both backends."""
from __future__ import annotations

import io
import pickle

import pytest
import torch
import torch_geometric.nn as pyg_nn

from gnnfuse import nn as gnn

f64 = torch.float64
METADATA = (["paper", "author"],
            [("author", "writes", "paper"), ("paper", "rev_writes", "author"), ("paper", "cites", "paper")])
COUNTS = {"paper": 7, "author": 5}


def hetero_inputs(device: str, seed: int = 0):
    """Features of two widths and three edge types; a paper and an author with no in-edge."""
    g = torch.Generator().manual_seed(seed)
    x = {"paper": torch.randn(COUNTS["paper"], 4, dtype=f64, generator=g),
         "author": torch.randn(COUNTS["author"], 3, dtype=f64, generator=g)}
    edges = {}
    for src, rel, dst in METADATA[1]:
        edges[(src, rel, dst)] = torch.stack([torch.randint(0, COUNTS[src], (11,), generator=g),
                                              torch.randint(0, COUNTS[dst] - 1, (11,), generator=g)])
    return ({k: v.to(device).requires_grad_() for k, v in x.items()},
            {k: v.to(device) for k, v in edges.items()})


def two_layer_model(lib, conv: str, **kwargs) -> torch.nn.Module:
    """The model of PyG's to_hetero example, with either library's layers."""
    Conv = getattr(lib, conv)

    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = Conv((-1, -1), 8, **kwargs)
            self.conv2 = Conv((-1, -1), 6, **kwargs)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)
    return GNN()


def converted_pair(conv: str, hetero_aggr: str, device: str, kwargs: dict):
    """PyG's to_hetero of PyG's layers, and ours of gnnfuse's with PyG's state dict loaded
    (lazy shapes are set by one call of each first)."""
    x, edges = hetero_inputs(device)
    theirs = pyg_nn.to_hetero(two_layer_model(pyg_nn, conv, **kwargs), METADATA, aggr=hetero_aggr).to(device, f64)
    ours = gnn.to_hetero(two_layer_model(gnn, conv, **kwargs), METADATA, aggr=hetero_aggr).to(device, f64)
    theirs(x, edges), ours(x, edges)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


@pytest.mark.parametrize("conv, hetero_aggr, kwargs", [
    ("SAGEConv", "sum", {}),
    ("SAGEConv", "mean", {"aggr": "max"}),
    ("GraphConv", "max", {}),
    ("GATConv", "sum", {"add_self_loops": False, "heads": 2, "concat": False}),
    ("GATv2Conv", "sum", {"add_self_loops": False, "heads": 2}),
])
def test_matches_pyg_to_hetero(device, conv, hetero_aggr, kwargs):
    ours, theirs = converted_pair(conv, hetero_aggr, device, kwargs)
    x, edges = hetero_inputs(device, seed=1)
    out, ref = ours(x, edges), theirs(x, edges)
    assert set(out) == set(ref) == set(METADATA[0])
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=f64, device=device).view_as(o)).sum() for o in out.values())
    loss_ref = sum((o * torch.linspace(-1, 1, o.numel(), dtype=f64, device=device).view_as(o)).sum() for o in ref.values())
    inputs = list(x.values())
    grads = torch.autograd.grad(loss, inputs + list(ours.parameters()))
    grads_ref = torch.autograd.grad(loss_ref, inputs + list(theirs.parameters()))
    for t in METADATA[0]:
        torch.testing.assert_close(out[t], ref[t], rtol=1e-10, atol=1e-10)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


def test_holds_gnnfuse_layers_and_leaves_the_model_alone():
    model = two_layer_model(gnn, "SAGEConv")
    converted = gnn.to_hetero(model, METADATA)
    assert type(model.conv1) is gnn.SAGEConv and type(model.conv2) is gnn.SAGEConv
    per_edge_type = converted.conv1
    assert sorted(per_edge_type.keys()) == sorted("__".join(k) for k in METADATA[1])
    assert all(type(layer) is gnn.SAGEConv for layer in per_edge_type.values())
    assert len({id(layer) for layer in per_edge_type.values()} | {id(model.conv1)}) == 4


def test_layers_inside_sequential():
    def model(lib):
        class GNN(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.convs = torch.nn.Sequential(lib.SAGEConv((-1, -1), 5))

            def forward(self, x, edge_index):
                return self.convs[0](x, edge_index)
        return GNN()
    out, ref = _converted_outputs(model)
    for t in METADATA[0]:
        torch.testing.assert_close(out[t], ref[t])


def _converted_outputs(model) -> tuple[dict, dict]:
    """``model(lib)`` through gnnfuse's and PyG's to_hetero, PyG's weights loaded into
    gnnfuse's (after one call fixes the lazy widths): both outputs on the same inputs."""
    x, edges = hetero_inputs("cpu")
    theirs = pyg_nn.to_hetero(model(pyg_nn), METADATA).double()
    ours = gnn.to_hetero(model(gnn), METADATA).double()
    theirs(x, edges), ours(x, edges)
    ours.load_state_dict(theirs.state_dict())
    return ours(x, edges), theirs(x, edges)


@pytest.mark.parametrize("holder", ["ModuleList", "ModuleDict"])
def test_layers_held_in_module_lists_and_dicts(holder):
    """PyG's tracer calls a layer held in a ``ModuleList`` or ``ModuleDict`` as a module of
    its own and copies it per edge type. Only children of the model and layers inside
    ``Sequential`` were put in shells: a model looping over ``ModuleList([SAGEConv,
    SAGEConv])`` returned a dict keyed by edge type, and on a four-type graph its rows
    were off PyG's by up to 5.9."""
    keys = (0, 1) if holder == "ModuleList" else ("first", "second")

    def model(lib):
        class GNN(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                layers = [lib.SAGEConv((-1, -1), 5), lib.SAGEConv((-1, -1), 4)]
                self.convs = torch.nn.ModuleList(layers) if holder == "ModuleList" else \
                    torch.nn.ModuleDict(dict(zip(keys, layers)))

            def forward(self, x, edge_index):
                x = self.convs[keys[0]](x, edge_index).relu()
                return self.convs[keys[1]](x, edge_index)
        return GNN()
    out, ref = _converted_outputs(model)
    assert set(out) == set(ref) == set(METADATA[0])
    for t in METADATA[0]:
        torch.testing.assert_close(out[t], ref[t], rtol=1e-10, atol=1e-10)


def test_a_layer_held_under_two_names():
    """One layer reached through two attributes (weights shared by two calls): only the
    first name was put in a shell, and PyG's transformer failed on the second with
    'conv.layer.author__writes__paper references nonexistent attribute layer of conv',
    where PyG's to_hetero of PyG's layers converts the model."""
    def model(lib):
        class GNN(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = pyg_nn.Linear(-1, 5)
                self.conv = lib.SAGEConv(5, 5)
                self.conv_again = self.conv

            def forward(self, x, edge_index):
                x = self.conv(self.lin(x), edge_index).relu()
                return self.conv_again(x, edge_index)
        return GNN()
    x, edges = hetero_inputs("cpu")
    theirs = pyg_nn.to_hetero(model(pyg_nn), METADATA).double()
    plain = model(gnn)
    ours = gnn.to_hetero(plain, METADATA).double()
    assert plain.conv is plain.conv_again and type(plain.conv) is gnn.SAGEConv     # left as it was
    theirs(x, edges), ours(x, edges)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    out, ref = ours(x, edges), theirs(x, edges)
    assert all(type(layer) is gnn.SAGEConv for layer in ours.conv.values())
    for t in METADATA[0]:
        torch.testing.assert_close(out[t], ref[t], rtol=1e-10, atol=1e-10)


def test_an_edge_type_between_unlisted_node_types_is_refused():
    """PyG's transformer drops an edge type whose node type metadata[0] does not list:
    with (['a'], [('a', 'r', 'b')]) the converted model returned {'a': None}, silently
    (PyG warns only that 'a' is never updated)."""
    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = gnn.SAGEConv((-1, -1), 4)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)
    with pytest.raises(ValueError, match=r"edge type \('a', 'r', 'b'\) names node type\(s\) \['b'\], which "
                                         r"metadata\[0\] \['a'\] does not list"):
        gnn.to_hetero(GNN(), (["a"], [("a", "r", "b")]))


@pytest.mark.parametrize("conv", ["SAGEConv", "GATv2Conv"])
def test_an_edge_type_left_out_of_the_call_is_named(conv):
    """An edge type of the metadata missing from the edge_index_dict reached its layer as
    None: "cannot make a Graph from NoneType", naming neither the edge type nor the dict
    (PyG's layers fail as namelessly). An edge type without edges is a [2, 0] tensor."""
    model = gnn.to_hetero(two_layer_model(gnn, conv, add_self_loops=False) if conv == "GATv2Conv"
                          else two_layer_model(gnn, conv), METADATA).double()
    x, edges = hetero_inputs("cpu")
    del edges[("paper", "cites", "paper")]
    with pytest.raises(ValueError, match=r"to_hetero: the model's conv1 got no edge_index for edge type "
                                         r"\('paper', 'cites', 'paper'\), which metadata\[1\] lists: the "
                                         r"edge_index_dict has no entry for it"):
        model(x, edges)
    edges[("paper", "cites", "paper")] = torch.zeros(2, 0, dtype=torch.long)
    assert model(x, edges)["paper"].shape == (7, 6)


@pytest.mark.parametrize("conv", ["SAGEConv", "GATv2Conv"])
def test_a_source_node_type_left_out_of_the_call_is_named(conv):
    """A node type missing from the x_dict reached the layers of the edge types it is the
    source of as a None source: "(x_src, x_dst) must be tensors, got (NoneType, Tensor)",
    naming neither the node type nor the dict (PyG's layers fail with "'NoneType' object
    has no attribute 'dim'")."""
    model = gnn.to_hetero(two_layer_model(gnn, conv, add_self_loops=False) if conv == "GATv2Conv"
                          else two_layer_model(gnn, conv), METADATA).double()
    x, edges = hetero_inputs("cpu")
    source = next(t for t in METADATA[1] if t[0] != t[2])[0]
    del x[source]
    with pytest.raises(ValueError, match=rf"to_hetero: the model's conv1 got no features for node type "
                                         rf"'{source}', the source of edge type \('{source}', .* the x_dict "
                                         r"has no entry for it"):
        model(x, edges)


@pytest.mark.parametrize("conv", ["GraphConv", "RGCNConv"])
def test_a_layer_reading_a_node_type_no_earlier_layer_updated_is_refused_at_conversion(conv):
    """A node type no edge type ends at ('inst', only a source) has no representation after
    the first layer, so PyG's transformer hands the second layer of ('inst', 'hosts',
    'author') the literal pair (None, x_author): the converted model failed at every call
    with "GraphConv: (x_src, x_dst) must be tensors (x_dst may be None), got (NoneType,
    Tensor)", naming neither the edge type nor the node type nor why (PyG's fails with
    "'NoneType' object has no attribute 'dim'"), and RGCNConv, which reads a None source
    as featureless input, ran on one-hot rows in place of 'inst''s features, silently
    (PyG's RGCNConv fails there). Refused at conversion, naming all three."""
    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if conv == "GraphConv":
                self.conv1, self.conv2 = gnn.SAGEConv((-1, -1), 4), gnn.GraphConv((-1, -1), 3)
            else:
                self.conv1, self.conv2 = gnn.RGCNConv((3, 3), 3, 2), gnn.RGCNConv((3, 3), 3, 2)

        def forward(self, x, edge_index, edge_type):
            if conv == "GraphConv":
                return self.conv2(self.conv1(x, edge_index), edge_index)
            return self.conv2(self.conv1(x, edge_index, edge_type), edge_index, edge_type)
    metadata = (["paper", "author", "inst"], [("author", "writes", "paper"), ("paper", "rev_writes", "author"),
                                             ("inst", "hosts", "author")])
    with pytest.warns(UserWarning, match="do not get updated"):
        with pytest.raises(ValueError, match=r"to_hetero: the model's conv2 reads node type 'inst', the source of "
                                             r"edge type \('inst', 'hosts', 'author'\), but no earlier layer gives "
                                             r"'inst' a representation: no edge type of metadata\[1\] ends at it"):
            gnn.to_hetero(GNN(), metadata)


@pytest.mark.parametrize("round_trip", ["pickle", "torch.save"])
def test_a_saved_model_still_names_an_edge_type_left_out(round_trip):
    """A pickled or saved converted model is rebuilt by tracing its generated code anew,
    where the check of `test_an_edge_type_left_out_of_the_call_is_named` ran on the trace's
    Proxy and dropped out of the graph: the loaded model failed namelessly again."""
    model = gnn.to_hetero(two_layer_model(gnn, "SAGEConv"), METADATA).double()
    x, edges = hetero_inputs("cpu")
    expected = model(x, edges)
    buffer = io.BytesIO()
    if round_trip == "pickle":
        loaded = pickle.loads(pickle.dumps(model))
    else:
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
    out = loaded(x, edges)
    for t in METADATA[0]:
        torch.testing.assert_close(out[t], expected[t], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"to_hetero: the model's conv1 got no features for node type 'author'"):
        loaded({"paper": x["paper"]}, edges)
    del edges[("paper", "cites", "paper")]
    with pytest.raises(ValueError, match=r"to_hetero: the model's conv1 got no edge_index for edge type "
                                         r"\('paper', 'cites', 'paper'\)"):
        loaded(x, edges)


def test_self_loops_on_bipartite_edge_types_are_refused_as_pyg_does():
    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = gnn.GATConv((-1, -1), 4)     # add_self_loops=True by default

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)
    with pytest.raises(ValueError, match="add_self_loops"):
        gnn.to_hetero(GNN(), METADATA)


def test_twelve_edge_types_reuse_their_graphs(monkeypatch):
    """Each relation's layer gets its own ``edge_index``; with the index cache holding 8
    entries, a 12-relation model rebuilt all 24 layer graphs (CSR sorts) on every call."""
    from gnnfuse.graph import graph as graph_module
    types = ["t0", "t1", "t2", "t3"]
    relations = [(a, f"r{i}", b) for i, (a, b) in enumerate((a, b) for a in types for b in types)][:12]
    g = torch.Generator().manual_seed(0)
    x = {t: torch.randn(9, 4, generator=g) for t in types}
    edges = {k: torch.randint(0, 9, (2, 20), generator=g) for k in relations}
    model = gnn.to_hetero(two_layer_model(gnn, "SAGEConv"), (types, relations))
    build = graph_module.Graph._from_torch.__func__
    builds = []

    def counted(cls, *args, **kwargs):
        builds.append(args)
        return build(cls, *args, **kwargs)
    monkeypatch.setattr(graph_module.Graph, "_from_torch", classmethod(counted))
    model(x, edges)
    assert len(builds) == len(relations)
    model(x, edges)
    assert len(builds) == len(relations)


def test_each_type_is_combined_as_soon_as_its_relations_have_run():
    """PyG's transformer calls every relation's layer before any per-type sum, so all
    relations' outputs were alive at once; now a sum follows its operands."""
    metadata = (METADATA[0], [METADATA[1][i] for i in (0, 2, 1)])   # paper's two relations, then author's
    model = gnn.to_hetero(two_layer_model(gnn, "SAGEConv"), metadata, aggr="mean")
    nodes = list(model.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    combining = [n for n in nodes if n.op == "call_function" and n.target in (torch.add, torch.div)]
    assert combining
    for node in combining:
        last_operand = max(position[a] for a in node.args if isinstance(a, torch.fx.Node))
        assert position[node] == last_operand + 1, node.name
    x, edges = hetero_inputs("cpu")
    reference = pyg_nn.to_hetero(two_layer_model(pyg_nn, "SAGEConv"), metadata, aggr="mean").double()
    model = model.double()
    model(x, edges), reference(x, edges)
    model.load_state_dict(reference.state_dict())
    out, expected = model(x, edges), reference(x, edges)
    for t in METADATA[0]:
        torch.testing.assert_close(out[t], expected[t])


def test_a_combination_does_not_move_above_an_in_place_op_on_its_operands():
    """``torch.div(h, 2)`` of a layer's output after the model's own ``h.relu_()``: moved to
    just after the layer (to combine early), it read the values before the in-place ReLU
    (PyG's to_hetero keeps the model's order), silently; it now stays after it."""
    class Net(torch.nn.Module):
        def __init__(self, lib) -> None:
            super().__init__()
            self.conv = lib.SAGEConv((-1, -1), 4)

        def forward(self, x, edge_index):
            h = self.conv(x, edge_index)
            r = h.relu_()
            return torch.div(h, 2) + r
    x, edges = hetero_inputs("cpu")
    x = {k: v.detach() for k, v in x.items()}
    theirs = pyg_nn.to_hetero(Net(pyg_nn), METADATA, aggr="sum").double()
    ours = gnn.to_hetero(Net(gnn), METADATA, aggr="sum").double()
    theirs(x, edges), ours(x, edges)
    ours.load_state_dict(theirs.state_dict())
    out, expected = ours(x, edges), theirs(x, edges)
    for t in METADATA[0]:
        torch.testing.assert_close(out[t], expected[t])
        assert bool((out[t] >= 0).all())
