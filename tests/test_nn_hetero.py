"""PyG's heterogeneous graphs and layers: `HeteroGraph` (an edge_index dict or a HeteroData
laid onto one typed Graph), and HGTConv, RGATConv, HeteroConv and FastRGCNConv against
PyG's layers with copied parameters -- outputs and every gradient in float64, on both
backends -- then gradcheck and the errors they raise."""
from __future__ import annotations

import copy
import importlib
import sys

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric import EdgeIndex
from torch_geometric.data import HeteroData

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.graph.hetero import HeteroGraph
from gnnfuse.graph import hetero_cache
from gnnfuse.graph.hetero_cache import cached_hetero_graph

f64 = torch.float64
METADATA = (["a", "b", "c"], [("a", "r", "b"), ("b", "s", "a"), ("a", "t", "a"), ("b", "u", "b"), ("c", "w", "a")])
IN_CHANNELS = {"a": 6, "b": 3, "c": 2}


def hetero_inputs(seed: int, device: str = "cpu", absent: tuple = (("b", "u", "b"),)):
    """Per-type features and edges: 'a' as wide as the output (its skip gate applies),
    'c' only a source type (no output), a vertex of each type with no in-edge, and edge
    types of the metadata left out of the dict (their weights must get zero gradients)."""
    g = torch.Generator().manual_seed(seed)
    counts = {"a": 6, "b": 4, "c": 3}
    x = {t: torch.randn(n, IN_CHANNELS[t], dtype=f64, generator=g).to(device) for t, n in counts.items()}
    edges = {}
    for src, rel, dst in METADATA[1]:
        if (src, rel, dst) in absent:
            continue
        e = 9
        edges[(src, rel, dst)] = torch.stack([torch.randint(0, counts[src], (e,), generator=g),
                                              torch.randint(0, counts[dst] - 1, (e,), generator=g)]).to(device)
    return x, edges


def dict_outputs_and_grads(layer, x_dict, call):
    """Outputs and the gradients of inputs and parameters under a fixed projection."""
    layer.zero_grad()
    leaves = {t: x.clone().requires_grad_() for t, x in x_dict.items()}
    out = call(layer, leaves)
    outs = out if isinstance(out, dict) else {"out": out}
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype, device=o.device).view_as(o)).sum()
               for o in outs.values())
    if isinstance(loss, torch.Tensor):     # no edge types given: no output, nothing to differentiate
        loss.backward()
    # an input or parameter a call did not use has no gradient in one and a zero one in the
    # other: the same
    grads = {f"x[{t}]": torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for t, leaf in leaves.items()}
    grads.update({n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in layer.named_parameters()})
    return {k: o.detach() for k, o in outs.items()}, grads


def assert_same(ours, pyg, x, call_ours, call_pyg=None):
    out, grads = dict_outputs_and_grads(ours, x, call_ours)
    ref, ref_grads = dict_outputs_and_grads(pyg, x, call_pyg or call_ours)
    assert out.keys() == ref.keys()
    for key in ref:
        torch.testing.assert_close(out[key], ref[key], rtol=1e-10, atol=1e-12, msg=lambda m: f"{key}: {m}")
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")
    return grads


def randomized(layer: torch.nn.Module, seed: int) -> torch.nn.Module:
    """PyG's initial gates and scales are ones and biases zeros: draw every parameter, so
    that a mis-wired one cannot hide behind its initial value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype, generator=g) * 0.5)
    return layer


# --- HeteroGraph ----------------------------------------------------------------------------
def test_hetero_graph_numbers_types_by_offsets_and_splits_into_views():
    x, edges = hetero_inputs(0)
    hetero = HeteroGraph(edges, {t: v.shape[0] for t, v in x.items()}, edge_types=METADATA[1])
    assert hetero.offsets == {"a": 0, "b": 6, "c": 10} and hetero.num_nodes == 13
    graph = hetero.graph
    assert graph.num_edge_types == len(METADATA[1]) and graph.num_node_types == 3
    assert graph.node_type.tolist() == [0] * 6 + [1] * 4 + [2] * 3
    for edge_type, index in edges.items():
        src, _, dst = edge_type
        start = hetero.edge_offsets[edge_type]
        rows = slice(start, start + index.shape[1])
        assert torch.equal(graph.src[rows], index[0] + hetero.offsets[src])
        assert torch.equal(graph.dst[rows], index[1] + hetero.offsets[dst])
        assert (graph.edge_type[rows] == METADATA[1].index(edge_type)).all()
    table = hetero.concat(x | {"b": torch.randn(4, 6, dtype=f64), "c": torch.randn(3, 6, dtype=f64)})
    parts = hetero.split(table)
    assert torch.equal(parts["a"], x["a"]) and parts["b"].data_ptr() == table[6:].data_ptr()


def test_hetero_graph_from_hetero_data_matches_the_dicts():
    x, edges = hetero_inputs(1)
    data = HeteroData()
    for t, v in x.items():
        data[t].x = v
    for edge_type, index in edges.items():
        data[edge_type].edge_index = index
    hetero = HeteroGraph.from_data(data)
    direct = HeteroGraph(edges, {t: v.shape[0] for t, v in x.items()})
    assert hetero.node_types == direct.node_types and hetero.edge_types == direct.edge_types
    assert torch.equal(hetero.graph.edge_index, direct.graph.edge_index)
    assert torch.equal(hetero.graph.edge_type, direct.graph.edge_type)


HETERO_MODULES = ("gnnfuse.graph.hetero", "gnnfuse.graph.hetero_cache", "gnnfuse.nn.hetero_conv",
                  "gnnfuse.nn.hetero_relational", "gnnfuse.nn.hetero_transformer")


@pytest.mark.parametrize("module", HETERO_MODULES)
def test_hetero_modules_import_without_torch_geometric(module, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_geometric", None)       # any torch_geometric import now fails
    monkeypatch.delitem(sys.modules, module)
    importlib.import_module(module)


@pytest.mark.parametrize("edges, counts, message", [
    ({("a", "r", "b"): torch.tensor([[0], [4]])}, {"a": 2, "b": 4}, "destination id is outside 0..3"),
    ({("a", "r", "b"): torch.tensor([[2], [0]])}, {"a": 2, "b": 4}, "source id is outside 0..1"),
    ({("a", "r", "z"): torch.tensor([[0], [0]])}, {"a": 2, "b": 4}, "node type 'z'"),
    ({("a", "r", "b"): torch.tensor([0, 1])}, {"a": 2, "b": 4}, "expected a [2, E] edge_index"),
    # a count that is no vertex count: int() raised about NoneType, -1 gave "outside 0..-2",
    # and 2.5 was read as 2 without a word
    ({("a", "r", "b"): torch.tensor([[0], [0]])}, {"a": None, "b": 4}, "node type 'a'.*non-negative int, got None"),
    ({("a", "r", "b"): torch.tensor([[0], [0]])}, {"a": -1, "b": 4}, "node type 'a'.*non-negative int, got -1"),
    ({("a", "r", "b"): torch.tensor([[0], [0]])}, {"a": 2.5, "b": 4}, "node type 'a'.*non-negative int, got 2.5"),
])
def test_hetero_graph_errors(edges, counts, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("[", r"\[").replace("]", r"\]")):
        HeteroGraph(edges, counts)


def test_hetero_graph_refuses_an_edge_type_outside_the_numbering():
    with pytest.raises(ValueError, match="not among the edge types"):
        HeteroGraph({("a", "r", "b"): torch.tensor([[0], [0]])}, {"a": 1, "b": 1}, edge_types=[("b", "s", "a")])



def test_hetero_graph_refuses_a_type_listed_twice():
    """An edge type listed twice laid its edges on twice: HGTConv with metadata
    [("a", "r", "b"), ("a", "r", "b"), ("b", "s", "b")] gave -0.0960 where PyG gives -0.0714."""
    edges = {("a", "r", "b"): torch.tensor([[0, 1], [0, 0]]), ("b", "s", "b"): torch.tensor([[1], [0]])}
    with pytest.raises(ValueError, match=r"edge type\(s\) \[\('a', 'r', 'b'\)\] are listed more than once"):
        HeteroGraph(edges, {"a": 2, "b": 2}, edge_types=[("a", "r", "b"), ("a", "r", "b"), ("b", "s", "b")])
    with pytest.raises(ValueError, match=r"node type\(s\) \['a'\] are listed more than once"):
        HeteroGraph(edges, {"a": 2, "b": 2}, node_types=["a", "b", "a"])
    layer = gnn.HGTConv(4, 4, (["a", "b"], [("a", "r", "b"), ("a", "r", "b"), ("b", "s", "b")]))
    with pytest.raises(ValueError, match="listed more than once"):
        layer({"a": torch.randn(2, 4), "b": torch.randn(2, 4)}, edges)

def test_hetero_graph_is_reused_while_the_edge_tensors_are_unchanged():
    x, edges = hetero_inputs(2)
    counts = {t: v.shape[0] for t, v in x.items()}
    make = lambda e: cached_hetero_graph(e, counts, node_types=list(counts), edge_types=METADATA[1])  # noqa: E731
    first = make(edges)
    assert make(dict(edges)) is first                        # a new dict of the same tensors (PyG's x_dict)
    replaced = dict(edges)
    key = ("a", "r", "b")
    replaced[key] = edges[key].clone()                       # equal values, another tensor
    assert make(replaced) is not first
    edges[key][1, 0] = 3 - edges[key][1, 0]                  # edited in place: a new graph with the new edge
    second = make(edges)
    assert second is not first and second.graph.dst[0] == edges[key][1, 0] + second.offsets["b"]
    entries = len(hetero_cache._ENTRIES)
    del replaced                                             # frees the clone: its entry goes with it
    assert len(hetero_cache._ENTRIES) == entries - 1


def test_hetero_graph_sees_an_edit_through_the_tensor_an_edge_index_holds():
    """An ``EdgeIndex``'s edit through ``ei.as_tensor()`` moves only the held tensor's
    version, which the hetero cache did not stamp: HGTConv ran on the old edges (0.01-0.06
    off the same call on a copy), where HeteroConv and to_hetero saw the edit."""
    x, edges = hetero_inputs(2)
    counts = {t: v.shape[0] for t, v in x.items()}
    key = ("a", "r", "b")
    edges[key] = EdgeIndex(edges[key], sparse_size=(counts["a"], counts["b"]))
    make = lambda e: cached_hetero_graph(e, counts, node_types=list(counts), edge_types=METADATA[1])  # noqa: E731
    first = make(edges)
    edges[key].as_tensor()[1, 0] = 3 - edges[key].as_tensor()[1, 0]
    second = make(edges)
    assert second is not first and second.graph.dst[0] == edges[key].as_tensor()[1, 0] + second.offsets["b"]


# --- HGTConv --------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", [1, 2])
def test_hgt_matches_pyg(heads, backend, device):
    torch.manual_seed(0)
    pyg = randomized(pyg_nn.HGTConv(IN_CHANNELS, 6, METADATA, heads=heads).double().to(device), heads)
    ours = gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=heads).double().to(device)
    ours.load_state_dict(pyg.state_dict())
    x, edges = hetero_inputs(heads, device)
    grads = assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges))
    assert set(grads) >= {"x[a]", "x[b]", "x[c]", "k_rel.weight", "v_rel.weight", "p_rel.a__r__b", "skip.a"}
    unused = METADATA[1].index(("b", "u", "b"))
    for name in ("k_rel.weight", "v_rel.weight"):      # [heads * R, D, D], entry h * R + r
        assert (grads[name].view(heads, len(METADATA[1]), -1)[:, unused] == 0).all()
    assert (grads[name].view(heads, len(METADATA[1]), -1)[:, 0] != 0).any()


def test_hgt_takes_a_prebuilt_hetero_graph():
    layer = randomized(gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double(), 3)
    x, edges = hetero_inputs(3)
    hetero = HeteroGraph(edges, {t: v.shape[0] for t, v in x.items()}, edge_types=METADATA[1])
    expected = layer(x, edges)
    got = layer(x, hetero)
    assert got.keys() == expected.keys() == {"a", "b"}
    for t in got:
        torch.testing.assert_close(got[t], expected[t], rtol=0, atol=0)
    with pytest.raises(ValueError, match="edge_types=metadata"):
        layer(x, HeteroGraph(edges, {t: v.shape[0] for t, v in x.items()}))


@pytest.mark.parametrize("in_channels", [-1, {"a": -1, "b": 3, "c": -1}])
def test_a_lazy_hgt_runs_on_the_weights_load_state_dict_gives_it(in_channels):
    """A lazy HGTConv given PyG's materialized weights refused its first call ('width 4,
    but the layer was built for width 0'): torch's load fills a lazy map's weight but not
    its in_features, which the width check read."""
    x, edges = hetero_inputs(5)
    pyg = pyg_nn.HGTConv(in_channels, 6, METADATA, heads=2).double()
    pyg(x, edges)       # materialized by a first call
    ours = gnn.HGTConv(in_channels, 6, METADATA, heads=2).double()
    ours.load_state_dict(pyg.state_dict())
    got, expected = ours(x, edges), pyg(x, edges)
    assert got.keys() == expected.keys()
    for t in got:
        torch.testing.assert_close(got[t], expected[t], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="node type 'a' has features of width 5, but the layer was built for width 6"):
        ours({**x, "a": x["a"][:, :5]}, edges)


def _hgt_pair(seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """gnnfuse's and PyG's float64 HGTConv (heads 2, width 6) with PyG's weights drawn from ``seed``."""
    pyg = randomized(pyg_nn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double(), seed)
    ours = gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double()
    ours.load_state_dict(pyg.state_dict())
    return ours, pyg


def _without_b_edges(edges, left_out="b"):
    return {t: e for t, e in edges.items() if left_out not in (t[0], t[-1])}


@pytest.mark.parametrize("left_out", ["b", "a"])
def test_hgt_on_a_hetero_graph_without_a_destination_type_gives_it_pyg_s_output(left_out):
    """A HeteroGraph leaving out a node type (no edge touches it), with x_dict holding it:
    PyG (and the edge_index_dict path) give it the output of no messages (``out_lin(gelu(0))``,
    for 'a', as wide as the output, gated with its input); the HeteroGraph path left it out."""
    torch.manual_seed(0)
    ours, pyg = _hgt_pair(7)
    x, edges = hetero_inputs(7, absent=())
    edges = _without_b_edges(edges, left_out)
    hetero = HeteroGraph(edges, {t: v.shape[0] for t, v in x.items() if t != left_out}, edge_types=METADATA[1])
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, hetero), lambda layer, xs: layer(xs, edges))


def test_hgt_on_a_hetero_graph_with_a_type_outside_the_metadata_ignores_it():
    """A HeteroGraph holding node type 'z' (not in the metadata, so without edges): PyG
    ignores 'z's features; the HeteroGraph path raised "no features for node type 'z'"
    although x_dict held them."""
    torch.manual_seed(0)
    ours, pyg = _hgt_pair(8)
    x, edges = hetero_inputs(8)
    x["z"] = torch.randn(2, 6, dtype=f64)
    hetero = HeteroGraph(edges, {t: v.shape[0] for t, v in x.items()}, node_types=["a", "z", "b", "c"],
                         edge_types=METADATA[1])
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, hetero), lambda layer, xs: layer(xs, edges))


def test_hgt_on_a_hetero_graph_with_an_edgeless_type_x_dict_leaves_out():
    """Node type 'b' in the HeteroGraph but not in x_dict, no edge touching it: no output
    for 'b', as PyG gives on the dicts; with an edge reading 'b' the call is refused,
    naming it."""
    torch.manual_seed(0)
    ours, pyg = _hgt_pair(9)
    x, all_edges = hetero_inputs(9)
    counts = {t: v.shape[0] for t, v in x.items()}
    edges = _without_b_edges(all_edges)
    hetero = HeteroGraph(edges, counts, edge_types=METADATA[1])
    del x["b"]
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, hetero), lambda layer, xs: layer(xs, edges))
    with pytest.raises(ValueError, match=r"HGTConv: edge type \('a', 'r', 'b'\) of the HeteroGraph reads node "
                                         r"type 'b', which x_dict has no features for"):
        ours(x, HeteroGraph(all_edges, counts, edge_types=METADATA[1]))


def test_hgt_parameters_come_in_pyg_s_order():
    """An optimizer's state is matched to parameters by position, so a PyG checkpoint
    (model and Adam state) resumed on gnnfuse's HGTConv needs PyG's parameter order.
    ``p_rel`` was a torch ParameterDict built from a plain dict, which torch sorts by key,
    where PyG keeps the metadata's order: two relations swapped their Adam moments and one
    resumed step left p_rel.b__s__a 0.12 off PyG's."""
    torch.manual_seed(0)
    pyg = randomized(pyg_nn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double(), 3)
    ours = gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in pyg.named_parameters()]
    x, edges = hetero_inputs(3, absent=())

    def step(layer, optimizer):
        optimizer.zero_grad()
        out = layer(x, edges)
        sum((o * torch.linspace(-1, 1, o.numel(), dtype=f64).view_as(o)).sum() for o in out.values()).backward()
        optimizer.step()

    adam = torch.optim.Adam(pyg.parameters(), lr=0.1)
    step(pyg, adam)
    ours.load_state_dict(pyg.state_dict())
    resumed = torch.optim.Adam(ours.parameters(), lr=0.1)
    resumed.load_state_dict(copy.deepcopy(adam.state_dict()))
    step(pyg, adam)
    step(ours, resumed)
    expected = pyg.state_dict()
    for name, value in ours.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def test_hgt_ignores_features_of_node_types_outside_its_metadata():
    torch.manual_seed(0)
    ours, pyg = _hgt_pair(5)
    x, edges = hetero_inputs(5)
    x["z"] = torch.randn(2, 6, dtype=f64)
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges))


def test_hgt_takes_dotted_relation_names_and_edge_index_objects_as_pyg_does(backend, device):
    """torch's containers refuse '.' in a key and PyG's ParameterDict stores it as '#';
    PyG's EdgeIndex is a tensor subclass whose storage a Triton kernel could not address."""
    metadata = (METADATA[0], [(s, f"{r}.v2", d) for s, r, d in METADATA[1]])
    torch.manual_seed(0)
    pyg = randomized(pyg_nn.HGTConv(IN_CHANNELS, 6, metadata, heads=2).double().to(device), 7)
    ours = gnn.HGTConv(IN_CHANNELS, 6, metadata, heads=2).double().to(device)
    ours.load_state_dict(pyg.state_dict())
    x, edges = hetero_inputs(7, device)
    edges = {(s, f"{r}.v2", d): e for (s, r, d), e in edges.items()}
    wrapped = {t: EdgeIndex(e) for t, e in edges.items()}
    grads = assert_same(ours, pyg, x, lambda layer, xs: layer(xs, wrapped), lambda layer, xs: layer(xs, edges))
    assert "p_rel.a__r#v2__b" in grads



def test_hgt_takes_a_node_type_named_after_a_module_attribute():
    """A node type 'training' (an nn.Module instance attribute, which PyG's key mangling
    misses) failed HGTConv's construction with torch's "attribute 'training' already
    exists", as PyG's does. Its maps are stored under '<training>', and the layer gives
    what it gives with the type named 'a'."""
    named = {"a": "training"}
    metadata = ([named.get(t, t) for t in METADATA[0]],
                [(named.get(s, s), r, named.get(d, d)) for s, r, d in METADATA[1]])
    torch.manual_seed(0)
    plain = randomized(gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double(), 8)
    layer = gnn.HGTConv({named.get(t, t): c for t, c in IN_CHANNELS.items()}, 6, metadata, heads=2).double()
    layer.load_state_dict({k.replace("lins.a.", "lins.<training>.").replace("skip.a", "skip.<training>")
                           .replace("a__", "training__").replace("__a", "__training"): v
                           for k, v in plain.state_dict().items()})
    assert "kqv_lin.lins.<training>.weight" in layer.state_dict()
    x, edges = hetero_inputs(8)
    out = layer({named.get(t, t): v for t, v in x.items()},
                {(named.get(s, s), r, named.get(d, d)): e for (s, r, d), e in edges.items()})
    for t, expected in plain(x, edges).items():
        torch.testing.assert_close(out[named.get(t, t)], expected, rtol=0, atol=0)


class _OneSage(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = gnn.SAGEConv((3, 3), 4)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


SHARED_KEY = [("a", "r_", "b"), ("a", "r", "_b")]      # both '<a___r____b>' / 'a__r___b'


@pytest.mark.parametrize("build", [
    lambda: gnn.HeteroConv({t: gnn.SAGEConv((3, 3), 4) for t in SHARED_KEY}),
    lambda: gnn.HGTConv(3, 4, (["a", "b", "_b"], SHARED_KEY)),
    lambda: gnn.HGTConv(3, 4, (["a.b", "a#b"], [("a.b", "r", "a#b")])),
    lambda: gnn.to_hetero(_OneSage(), (["a", "b", "_b"], SHARED_KEY + [("b", "s", "a"), ("_b", "s", "a")])),
], ids=["HeteroConv", "HGTConv-relations", "HGTConv-node-types", "to_hetero"])
def test_types_stored_under_one_key_are_refused(build):
    """Two types PyG's naming stores under one key had one entry: HeteroConv ran the
    second relation's layer for both (PyG's dropped the first relation), HGTConv's two
    relations shared one p_rel and to_hetero's one layer copy, silently."""
    with pytest.raises(ValueError, match="are both stored under the key"):
        build()

def test_hgt_refuses_an_edge_index_dict_with_no_edge_type_of_its_metadata():
    """An empty dict returned outputs for every destination type, computed without a
    single edge, where PyG's HGTConv raises (torch.cat of an empty list); a dict of types
    outside the metadata is refused too (PyG: a KeyError). Left-out types have no edges,
    as in PyG."""
    layer = randomized(gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double(), 9)
    x, edges = hetero_inputs(9)
    with pytest.raises(ValueError, match=r"HGTConv: edge_index_dict holds no edge type.*\('a', 'r', 'b'\)"):
        layer(x, {})
    with pytest.raises(ValueError, match=r"\('a', 'q', 'b'\)\] are not among the edge types"):
        layer(x, {("a", "q", "b"): edges[("a", "r", "b")]})
    empty = {t: torch.empty(2, 0, dtype=torch.long) for t in METADATA[1]}
    one = {("a", "r", "b"): edges[("a", "r", "b")]}
    for given, spelled_out in ((one, empty | one), ({("a", "r", "b"): empty[("a", "r", "b")]}, empty)):
        got, want = layer(x, given), layer(x, spelled_out)
        assert got.keys() == want.keys() == {"a", "b"}
        for t in got:
            torch.testing.assert_close(got[t], want[t], rtol=0, atol=0)


def test_hgt_refuses_metadata_whose_edge_type_names_an_unlisted_node_type():
    """The layer was built, and its call said x_dict had no features for 'b' even when
    x_dict held them (they were dropped as outside the metadata); PyG's: a KeyError 'b'."""
    with pytest.raises(ValueError, match=r"HGTConv: edge type \('a', 'r', 'b'\) names node type\(s\) \['b'\], "
                                         r"which metadata\[0\] \['a'\] does not list"):
        gnn.HGTConv(2, 4, (["a"], [("a", "r", "b")]))


@pytest.mark.parametrize("change, message", [
    (lambda x: {**x, "b": torch.randn(4, 5, dtype=f64)}, r"HGTConv: node type 'b' has features of width 5, but "
                                                         r"the layer was built for width 3"),
    (lambda x: {t: v for t, v in x.items() if t != "c"}, r"HGTConv: edge type \('c', 'w', 'a'\) reads node type "
                                                         r"'c', which x_dict has no features for"),
    (lambda x: {**x, "b": x["b"][:, 0].contiguous()}, r"HGTConv: the features of node type 'b' must be a "
                                                      r"\[num_nodes, F\] tensor, got shape \[4\]"),
    (lambda x: {**x, "b": x["b"].unsqueeze(0)}, r"HGTConv: the features of node type 'b' must be a \[num_nodes, F\] "
                                                r"tensor, got shape \[1, 4, 3\]"),
], ids=["width", "missing", "1-D", "3-D"])
def test_hgt_errors_name_the_node_type(change, message):
    """A feature table of the wrong width got torch's 'mat1 and mat2 shapes cannot be
    multiplied (4x5 and 3x18)', naming no type; a missing one, that the node type 'has
    no vertex count'. A [4] table was refused as 'features of width 4', a [1, 4, 3] one
    as 'a destination id is outside 0..0 (node type 'b' has 1 vertices)'."""
    layer = gnn.HGTConv(IN_CHANNELS, 6, METADATA, heads=2).double()
    x, edges = hetero_inputs(4)
    with pytest.raises(ValueError, match=message):
        layer(change(x), edges)


@pytest.mark.parametrize("index, message", [
    (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), "integer ids, got torch.float32"),
    (torch.tensor([[True, False], [False, True]]), "integer ids, got torch.bool"),
    (torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.ones(2), (2, 2)), "torch.sparse_coo tensor"),
])
def test_hetero_graph_refuses_float_bool_and_sparse_edge_indices(index, message):
    """Floats were truncated to ids, silently; a [2, N] sparse tensor got an aten error."""
    with pytest.raises((ValueError, TypeError), match=message):
        HeteroGraph({("a", "r", "b"): index}, {"a": 2, "b": 2})


def test_hgt_gradcheck():
    """The inputs and the relation parameters the compiled attention reads (the per-type
    linear maps are torch's own, compared with PyG above)."""
    layer = randomized(gnn.HGTConv(IN_CHANNELS, 4, METADATA, heads=2).double(), 4)
    x, edges = hetero_inputs(4)
    names = ["k_rel.weight", "v_rel.weight", "p_rel.a__r__b"]
    params = [layer.get_parameter(n).detach().clone().requires_grad_() for n in names]
    xs = [x[t].clone().requires_grad_() for t in "abc"]

    def run(a, b, c, *values):
        out = torch.func.functional_call(layer, dict(zip(names, values)), ({"a": a, "b": b, "c": c}, edges))
        return out["a"], out["b"]
    assert torch.autograd.gradcheck(run, (*xs, *params), eps=1e-6, atol=1e-6)


# --- RGATConv -------------------------------------------------------------------------------
RELATIONS = 3


def typed_edges(seed: int, n: int = 8, num_edges: int = 22, device: str = "cpu"):
    """Edges with self loops, multi-edges, a vertex without in-edges and a relation no edge has."""
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randint(0, n, (num_edges,), generator=g),
                         torch.randint(0, n - 1, (num_edges,), generator=g)])
    return index.to(device), torch.randint(0, RELATIONS - 1, (num_edges,), generator=g).to(device)


RGAT_OPTIONS = {
    "across-additive": {},
    "within-additive": {"attention_mechanism": "within-relation", "heads": 2},
    "across-multiplicative": {"attention_mode": "multiplicative-self-attention", "dim": 2, "heads": 2},
    "within-multiplicative": {"attention_mechanism": "within-relation", "attention_mode":
                              "multiplicative-self-attention", "dim": 2, "concat": False},
    "bases-edge_dim": {"num_bases": 2, "edge_dim": 3, "heads": 2, "concat": False},
    "blocks-within-edge_dim": {"num_blocks": 2, "edge_dim": 3, "attention_mechanism": "within-relation",
                               "attention_mode": "multiplicative-self-attention"},
}


@pytest.mark.parametrize("options", RGAT_OPTIONS.values(), ids=RGAT_OPTIONS.keys())
def test_rgat_matches_pyg(options, backend, device):
    if backend == "triton" and options.get("num_blocks"):
        pytest.skip("the reference run covers the decomposition; Triton runs the same graph program")
    torch.manual_seed(0)
    pyg = randomized(pyg_nn.RGATConv(4, 2, RELATIONS, **options).double().to(device), 1)
    ours = gnn.RGATConv(4, 2, RELATIONS, **options).double().to(device)
    ours.load_state_dict(pyg.state_dict())
    index, types = typed_edges(2, device=device)
    x = {"x": torch.randn(8, 4, dtype=f64, device=device)}
    edge_attr = torch.randn(index.shape[1], 3, dtype=f64, device=device) if "edge_dim" in options else None
    grads = assert_same(ours, pyg, x, lambda layer, xs: layer(xs["x"], index, types, edge_attr))
    if not options.get("num_bases") and not options.get("num_blocks"):
        assert (grads["weight"][RELATIONS - 1] == 0).all()        # the relation no edge has


def test_rgat_takes_a_typed_graph():
    layer = randomized(gnn.RGATConv(4, 2, RELATIONS, attention_mechanism="within-relation", heads=2).double(), 5)
    index, types = typed_edges(5)
    x = torch.randn(8, 4, dtype=f64)
    graph = gnnfuse.Graph(index[0], index[1], 8, edge_type=types, num_edge_types=RELATIONS)
    torch.testing.assert_close(layer(x, graph), layer(x, index, types), rtol=0, atol=0)


def test_rgat_gradcheck_within_relation():
    layer = randomized(gnn.RGATConv(3, 2, RELATIONS, attention_mechanism="within-relation",
                                    attention_mode="multiplicative-self-attention", dim=2).double(), 6)
    index, types = typed_edges(6, n=6, num_edges=14)
    names = ["weight", "q", "k"]             # the parameters the compiled attention reads
    params = [layer.get_parameter(n).detach().clone().requires_grad_() for n in names]
    x = torch.randn(6, 3, dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *values: torch.func.functional_call(
        layer, dict(zip(names, values)), (x, index, types)), (x, *params), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("build, call, error, message", [
    (lambda: gnn.RGATConv(4, 2, 3, mod="additive"), None, NotImplementedError, "mod='additive'"),
    # PyG's forward reads mod on every call: set afterwards it was ignored (2.0 off PyG, 'scaled')
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: (setattr(layer, "mod", "scaled"), layer(x, i, t)),
     NotImplementedError, r"mod='scaled' \(set after construction\)"),
    (lambda: gnn.RGATConv(4, 2, 3, attention_mode="x"), None, ValueError, "attention mode"),
    (lambda: gnn.RGATConv(4, 2, 3, attention_mechanism="x"), None, ValueError, "attention mechanism"),
    (lambda: gnn.RGATConv(4, 2, 3, dim=2), None, ValueError, "cannot be applied when value of d"),
    (lambda: gnn.RGATConv(4, 2, 3, aggr="mean"), None, TypeError, "aggr='mean' is not taken"),
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: layer(torch.arange(8), i, t), TypeError, "float"),
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: layer(x, i, t, return_attention_weights=True),
     NotImplementedError, "return_attention_weights"),
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: layer(x.double(), i, t), TypeError,
     "x is torch.float64 but the layer's parameters are torch.float32"),
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: layer(x, i), ValueError, "needs edge types"),
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: layer(x, i.t(), t), ValueError, r"shape \[2, E\]"),
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: layer(x, torch.sparse_coo_tensor(
        i, torch.ones(i.shape[1]), (8, 8)), t), NotImplementedError, "sparse adjacency"),
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: layer(x, i, t, torch.randn(22, 3)), ValueError,
     "no edge_dim"),
    (lambda: gnn.RGATConv(5, 2, 3), lambda layer, x, i, t: layer(x, i, t), ValueError,
     "RGATConv: x has 4 features per node, but the layer was built for in_channels=5"),
    (lambda: gnn.RGATConv(4, 2, 5), lambda layer, x, i, t: layer(x, gnnfuse.Graph(
        i[0], i[1], 8, edge_type=t, num_edge_types=3)), ValueError, "num_relations=5"),
    (lambda: gnn.RGATConv(4, 2, 3), lambda layer, x, i, t: layer(x, gnnfuse.Graph.bipartite(
        i[0], i[1] % 5, 8, 5, edge_type=t, num_edge_types=3)), ValueError, "needs one vertex set"),
])
def test_rgat_errors_say_what_is_wrong(build, call, error, message):
    index, types = typed_edges(7)
    with pytest.raises(error, match=message):
        layer = build()
        call(layer, torch.randn(8, 4), index, types)


# --- HeteroConv -----------------------------------------------------------------------------
def hetero_convs(module, aggr):
    return module.HeteroConv({
        ("a", "r", "b"): module.SAGEConv((6, 3), 5),
        ("b", "s", "a"): module.GATConv((3, 6), 5, heads=2, concat=False, add_self_loops=False),
        ("a", "t", "a"): module.GCNConv(6, 5),
    }, aggr=aggr)


@pytest.mark.parametrize("aggr", ["sum", "mean", "max", "cat", None])
def test_hetero_conv_matches_pyg(aggr, backend, device):
    if backend == "triton" and aggr not in ("sum", None):
        pytest.skip("the groupings are torch code; one Triton run covers the wrapped layers")
    torch.manual_seed(0)
    pyg = hetero_convs(pyg_nn, aggr).double().to(device)
    ours = hetero_convs(gnn, aggr).double().to(device)
    ours.load_state_dict(pyg.state_dict())
    x, edges = hetero_inputs(8, device)
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges))


def test_hetero_conv_skips_an_edge_type_the_call_gives_no_edges_for():
    """PyG's HeteroConv runs a relation's layer only when some dict has an entry for its
    edge type: without ("a", "r", "b") in edge_index_dict, "b" gets no output and "a"
    sums the other two relations. Nothing called it so; running every relation instead
    handed ("a", "r", "b")'s SAGEConv no edge_index."""
    torch.manual_seed(0)
    pyg, ours = hetero_convs(pyg_nn, "sum").double(), hetero_convs(gnn, "sum").double()
    ours.load_state_dict(pyg.state_dict())
    x, edges = hetero_inputs(10)
    partial = {t: index for t, index in edges.items() if t != ("a", "r", "b")}
    got, expected = ours(x, partial), pyg(x, partial)
    assert got.keys() == expected.keys() == {"a"}
    torch.testing.assert_close(got["a"], expected["a"])


def test_hetero_conv_routes_edge_level_keyword_dicts():
    torch.manual_seed(0)
    make = lambda m: m.HeteroConv({("a", "t", "a"): m.GATConv(6, 4, edge_dim=2),          # noqa: E731
                                   ("b", "s", "a"): m.GATConv((3, 6), 4, add_self_loops=False, edge_dim=2)})
    pyg, ours = make(pyg_nn).double(), make(gnn).double()
    ours.load_state_dict(pyg.state_dict())
    x, edges = hetero_inputs(9)
    attrs = {t: torch.randn(index.shape[1], 2, dtype=f64) for t, index in edges.items()}
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges, edge_attr_dict=attrs))


@pytest.mark.parametrize("edit", ["add-by-type", "add-by-key", "replace", "delete-by-type", "delete-by-key"])
def test_hetero_conv_runs_the_layers_it_holds_at_the_call(edit):
    """PyG's HeteroConv runs the layers in ``convs`` at each call, so a relation set or
    deleted after construction is run or left out. gnnfuse's ran the edge types it was
    built with: a layer added afterwards by its key was ignored, silently (2.0 off PyG on
    'b'), one set or deleted by its edge type raised torch's "module name should be a
    string. Got tuple", and one deleted by its key a KeyError."""
    torch.manual_seed(0)
    pyg, ours = hetero_convs(pyg_nn, "sum").double(), hetero_convs(gnn, "sum").double()
    ours.load_state_dict(pyg.state_dict())
    x, edges = hetero_inputs(8)
    edges = {**edges, ("c", "v", "b"): edges[("c", "w", "a")].flip(0)[:, :4] % 3}
    ours(x, edges)
    widths = (6, 3) if edit == "replace" else (2, 3)
    added = {module: module.GraphConv(widths, 5).double() for module in (pyg_nn, gnn)}
    added[gnn].load_state_dict(added[pyg_nn].state_dict())
    for module, layer in ((pyg_nn, pyg), (gnn, ours)):
        change = {"add-by-type": lambda: layer.convs.__setitem__(("c", "v", "b"), added[module]),
                  "add-by-key": lambda: layer.convs.__setitem__("<c___v___b>", added[module]),
                  "replace": lambda: layer.convs.__setitem__(("a", "r", "b"), added[module]),
                  "delete-by-type": lambda: layer.convs.__delitem__(("a", "r", "b")),
                  "delete-by-key": lambda: layer.convs.__delitem__("<a___r___b>")}[edit]
        change()
    assert_same(ours, pyg, x, lambda layer, xs: layer(xs, edges))
    assert ours.edge_types == list(pyg.convs.keys())


def test_hetero_conv_errors():
    with pytest.raises(ValueError, match="add_self_loops"):
        gnn.HeteroConv({("a", "r", "b"): gnn.GATConv((6, 3), 5)})
    with pytest.raises(ValueError, match="aggr must be one of"):
        gnn.HeteroConv({("a", "t", "a"): gnn.GCNConv(6, 5)}, aggr="prod")
    layer = gnn.HeteroConv({("a", "t", "a"): gnn.GCNConv(6, 5)})
    with pytest.raises(ValueError, match="need to end with '_dict'"):
        layer(*hetero_inputs(0), edge_weight={})


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
@pytest.mark.parametrize("change, error, note", [
    (lambda x: {t: v for t, v in x.items() if t != "a"}, TypeError,
     "x_dict has no entry for node type 'a'"),
    (lambda x: {**x, "b": torch.randn(4, 5, dtype=f64)}, RuntimeError, None),
], ids=["missing", "width"])
def test_hetero_conv_errors_name_the_edge_type(change, error, note):
    """A relation's layer raised its own error ('SAGEConv: (x_src, x_dst) must be tensors
    ..., got (NoneType, Tensor)', torch's 'mat1 and mat2 shapes cannot be multiplied (4x5
    and 3x5)'), naming neither the edge type nor the node type that was wrong."""
    layer = hetero_convs(gnn, "sum").double()
    x, edges = hetero_inputs(0)
    with pytest.raises(error) as info:
        layer(change(x), edges)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "HeteroConv: raised by the SAGEConv of edge type ('a', 'r', 'b')" in notes
    assert note is None or note in notes


# --- FastRGCNConv ---------------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"aggr": "add", "num_bases": 2}], ids=["mean", "add-bases"])
def test_fast_rgcn_matches_pyg(options, backend, device):
    torch.manual_seed(0)
    pyg = randomized(pyg_nn.FastRGCNConv(4, 3, RELATIONS, **options).double().to(device), 2)
    ours = gnn.FastRGCNConv(4, 3, RELATIONS, **options).double().to(device)
    ours.load_state_dict(pyg.state_dict())
    index, types = typed_edges(3, device=device)
    assert_same(ours, pyg, {"x": torch.randn(8, 4, dtype=f64, device=device)},
                lambda layer, xs: layer(xs["x"], index, types))


def test_node_slice_names_each_types_rows_of_the_global_table():
    """``node_slice(t)`` is the global ids `split` gives node type ``t``, last row included
    (a slice one short dropped each type's last vertex)."""
    counts = {"paper": 4, "author": 3, "venue": 2}
    edges = {("author", "writes", "paper"): torch.tensor([[0, 2], [3, 1]]),
             ("paper", "in", "venue"): torch.tensor([[3], [1]])}
    hetero = HeteroGraph(edges, counts)
    ids = torch.arange(hetero.num_nodes)
    for t, rows in hetero.split(ids).items():
        assert ids[hetero.node_slice(t)].tolist() == rows.tolist() and rows.numel() == counts[t]
