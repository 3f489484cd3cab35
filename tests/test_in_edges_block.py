"""`graph.in_edges_block`: the in-edges of chosen rows as a bipartite graph, checked
against the full graph's edges and against a layer computed for every row."""
from __future__ import annotations

import pytest
import torch
from graph_strategies import NUM_RELATIONS, graphs
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse
import gnnfuse.nn
from gnnfuse.graph import in_edges_block

f64 = torch.float64


@settings(max_examples=40, deadline=None)
@given(case=graphs(max_nodes=8, max_edges=30), picks=st.lists(st.integers(0, 9), max_size=12))
def test_the_block_holds_each_chosen_rows_in_edges(case, picks):
    """Loops, multi-edges, isolated rows, rows chosen twice, no rows: destination i of the
    block has exactly the in-edges of rows[i] (sources, types and ids), in edge order."""
    rows = torch.tensor([p % case.num_nodes for p in picks], dtype=torch.long)
    graph = gnnfuse.Graph(case.given[0], case.given[1], case.num_nodes, edge_type=case.edge_type,
                          num_edge_types=NUM_RELATIONS)
    block, edges = in_edges_block(graph, rows, return_edge_ids=True)
    src, dst = case.edge_index
    assert (block.num_nodes, block.num_src_nodes) == (rows.numel(), case.num_nodes)
    for i, row in enumerate(rows.tolist()):
        mine = (block.dst == i).nonzero().squeeze(1)
        expected = (dst == row).nonzero().squeeze(1)
        assert edges[mine].tolist() == expected.tolist()
        assert block.src[mine].tolist() == src[expected].tolist()
        assert block.edge_type[mine].tolist() == case.edge_type[expected].tolist()


@pytest.mark.parametrize("aggr", ["mean", "add"])
def test_a_bipartite_layer_on_the_block_gives_the_full_layers_rows(aggr):
    """RGCNConv((h, h[rows]), block) equals RGCNConv(h, graph)[rows], forward and every
    gradient, with a row chosen twice and a row without in-edges."""
    g = torch.Generator().manual_seed(0)
    n, e, relations = 30, 160, 3
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n - 1, (e,), generator=g)
    graph = gnnfuse.Graph(src, dst, n, edge_type=torch.randint(0, relations, (e,), generator=g),
                          num_edge_types=relations)
    rows = torch.tensor([4, n - 1, 17, 4, 0])                 # n - 1 has no in-edges; 4 twice
    conv = gnnfuse.nn.RGCNConv(5, 4, relations, aggr=aggr).double()
    x = torch.randn(n, 5, dtype=f64, generator=g, requires_grad=True)
    weight = torch.randn(rows.numel(), 4, dtype=f64, generator=g)
    results = []
    for out in (lambda: conv(x, graph)[rows], lambda: conv((x, x[rows]), in_edges_block(graph, rows))):
        value = out()
        results.append([value.detach(), *torch.autograd.grad((value * weight).sum(), [x, *conv.parameters()])])
    for ours, full in zip(results[1], results[0]):
        torch.testing.assert_close(ours, full, rtol=1e-12, atol=1e-12)


def test_a_mask_chooses_the_rows_it_marks():
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 1]), 4)
    mask = torch.tensor([False, True, False, True])
    by_mask, by_ids = in_edges_block(graph, mask), in_edges_block(graph, torch.tensor([1, 3]))
    assert by_mask.src.tolist() == by_ids.src.tolist() == [0, 3, 2]
    assert by_mask.dst.tolist() == by_ids.dst.tolist() == [0, 0, 1]


@pytest.mark.parametrize("rows, error, words", [
    (torch.tensor([1, 7]), ValueError, "rows has id 7 at position 1"),
    (torch.tensor([-1]), ValueError, "rows has a negative id -1"),
    (torch.tensor([1.0]), ValueError, "integer destination ids"),
    (torch.tensor([[1]]), ValueError, "1-D"),
    (torch.tensor([True, False]), ValueError, "one entry per destination (4)"),
    ([1, 2], TypeError, "a tensor"),
])
def test_bad_rows_are_refused_with_what_was_wrong(rows, error, words):
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 1]), 4)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        in_edges_block(graph, rows)


def test_layers_on_the_block_give_the_full_layers_rows_and_self_loops_are_refused():
    """SAGEConv reads its own-vertex term from the destination features it is given, so it
    runs on a block as it is; GATConv adds self loops, which a block refuses (its
    destination i is vertex rows[i], not source i) with the way round: loops added to
    the graph first and ``add_self_loops=False``, which then equals the full layer."""
    g = torch.Generator().manual_seed(1)
    n, e = 24, 120
    graph = gnnfuse.Graph(torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g), n)
    rows = torch.tensor([3, 11, 3, 20])
    x = torch.randn(n, 6, dtype=f64, generator=g)
    sage = gnnfuse.nn.SAGEConv(6, 5).double()
    torch.testing.assert_close(sage((x, x[rows]), in_edges_block(graph, rows)), sage(x, graph)[rows])
    gat = gnnfuse.nn.GATConv(6, 4, heads=2).double()
    block = in_edges_block(graph, rows)
    for moved in (block, block.remove_self_loops(), block.to("cpu")):
        with pytest.raises(ValueError, match="in_edges_block: its destination i is vertex rows"):
            gat((x, x[rows]), moved)
    looped = in_edges_block(graph.remove_self_loops().add_self_loops(), rows)
    gat.add_self_loops = False
    ours = gat((x, x[rows]), looped)
    gat.add_self_loops = True
    torch.testing.assert_close(ours, gat(x, graph)[rows])
    with pytest.raises(ValueError, match="its source \\(of its reverse\\) i is vertex rows"):
        block.reverse().add_self_loops()      # its source i is vertex rows[i]: loops i -> i join other vertices


def test_under_torch_compile_a_block_runs_as_its_eager_call():
    """Traced, a block was passed on as its src/dst arrays alone, which do not say that
    destination i is vertex rows[i]: a compiled GATConv added loops i -> i on it without
    a word (0.10 off the full layer's rows), where its eager call refuses them. A block
    now runs eagerly under torch.compile (with a warning naming it): the loops refused
    as there, and layers without loops give the full layer's rows."""
    g = torch.Generator().manual_seed(2)
    n, e = 16, 60
    graph = gnnfuse.Graph(torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g), n)
    rows = torch.tensor([5, 2, 7])
    x = torch.randn(n, 6, dtype=f64, generator=g)
    gat = gnnfuse.nn.GATConv(6, 4).double()
    block = in_edges_block(graph, rows)
    compiled = torch.compile(lambda layer, blk: layer((x, x[rows]), blk), backend="eager")
    with pytest.warns(UserWarning, match="in_edges_block"), \
            pytest.raises(ValueError, match="in_edges_block: its destination i is vertex rows"):
        compiled(gat, block)
    looped = in_edges_block(graph.remove_self_loops().add_self_loops(), rows)
    expected = gat(x, graph)[rows]
    gat.add_self_loops = False
    torch.testing.assert_close(compiled(gat, looped), expected)
    sage = gnnfuse.nn.SAGEConv(6, 5).double()
    torch.testing.assert_close(compiled(sage, block), sage(x, graph)[rows])


@settings(max_examples=40, deadline=None)
@given(case=graphs(max_nodes=12), data=st.data())
def test_a_blocks_self_loops_are_its_chosen_vertices_edges_to_themselves(case, data):
    """Destination i of a block is vertex rows[i]: remove_self_loops compared source ids
    with block positions, dropping an edge 0 -> rows[0] and keeping a real loop; and the
    block's reverse let add_self_loops join positions to unrelated vertices."""
    graph = gnnfuse.Graph(case.given[0], case.given[1], case.num_nodes)
    rows = torch.tensor(data.draw(st.lists(st.integers(0, graph.num_nodes - 1), min_size=1, max_size=6,
                                           unique=True)), dtype=torch.long)
    block, edges = in_edges_block(graph, rows, return_edge_ids=True)
    kept = block.remove_self_loops()
    expected = [(int(graph.src[e]), int(graph.dst[e])) for e in edges.tolist() if graph.src[e] != graph.dst[e]]
    assert list(zip(kept.src.tolist(), rows[kept.dst].tolist())) == expected
    with pytest.raises(ValueError, match="would join the wrong vertices"):
        block.reverse().add_self_loops()
    assert block.reverse().reverse().remove_self_loops().num_edges == kept.num_edges


def test_pyg_class_layers_refuse_a_block_they_would_read_as_a_square_graph():
    """gnnfuse.nn's PyG-class layers (FeaStConv, PointNetConv, ...) get a `Graph` as its
    plain ``[2, E]`` edge_index, which says nothing of destination i being vertex rows[i]:
    FeaStConv's default self loops on a block joined source i to destination i (0.31 off
    the full layer's rows on this graph, pairs given as the README says), and a single
    ``x`` (or ``pos``) was read as the destinations' rows x[i] (AGNNConv without loops
    0.88 off), silently. Both are refused as the block's own add_self_loops is; pairs without
    loops still give the full layer's rows."""
    g = torch.Generator().manual_seed(0)
    n, e = 20, 80
    graph = gnnfuse.Graph(torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g), n)
    graph = graph.remove_self_loops()
    rows = torch.tensor([3, 5, 0, 17, 9])
    block = in_edges_block(graph, rows)
    x = torch.randn(n, 6, dtype=f64, generator=g)
    pos = torch.randn(n, 3, dtype=f64, generator=g)
    feast = gnnfuse.nn.FeaStConv(6, 4).double()
    with pytest.raises(ValueError, match="FeaStConv.*add_self_loops.*in_edges_block"):
        feast((x, x[rows]), block)
    with pytest.raises(ValueError, match="PointNetConv.*add_self_loops.*in_edges_block"):
        gnnfuse.nn.PointNetConv().double()((x, x[rows]), (pos, pos[rows]), block)
    with pytest.raises(ValueError, match="AGNNConv.*x has 20 rows.*in_edges_block.*x\\[rows\\]"):
        gnnfuse.nn.AGNNConv(add_self_loops=False)(x, block)
    with pytest.raises(ValueError, match="PointNetConv.*pos has 20 rows"):
        gnnfuse.nn.PointNetConv(add_self_loops=False).double()((x, x[rows]), pos, block)
    looped = in_edges_block(graph.add_self_loops(), rows)
    expected = feast(x, graph)[rows]
    feast.add_self_loops = False
    torch.testing.assert_close(feast((x, x[rows]), looped), expected)
    simple = gnnfuse.nn.SimpleConv()
    torch.testing.assert_close(simple((x, x[rows]), block), simple(x, graph)[rows])


class _ProductOfEnds(gnnfuse.nn.MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        return x_i * x_j


def test_a_message_passing_layer_refuses_a_single_table_on_a_block():
    """Your own `gnnfuse.nn.MessagePassing` handed a block reads it as its ``[2, E]``
    edges: with one ``x`` its ``x_i`` was x[i] for destination i, which is vertex
    rows[i] (8.8 off the full layer's rows on this graph), silently. A single table is
    refused naming the pair to pass; the pair gives the full layer's rows."""
    g = torch.Generator().manual_seed(0)
    n = 20
    graph = gnnfuse.Graph(torch.randint(0, n, (80,), generator=g), torch.randint(0, n, (80,), generator=g), n)
    rows = torch.tensor([3, 5, 0, 17, 9])
    block = in_edges_block(graph, rows)
    x = torch.randn(n, 6, dtype=f64, generator=g)
    layer = _ProductOfEnds()
    with pytest.raises(ValueError, match="_ProductOfEnds: x has 20 rows.*in_edges_block.*\\(x, x\\[rows\\]\\)"):
        layer(x, block)
    torch.testing.assert_close(layer((x, x[rows]), block), layer(x, graph)[rows])


def test_a_single_table_passes_only_a_block_of_every_vertex_in_order():
    """A block of every vertex has as many destinations as sources, so a single table
    passed the row count check; with the vertices permuted its ``x_i`` was x[i] for
    vertex rows[i], silently. Refused unless destination i is vertex i."""
    g = torch.Generator().manual_seed(0)
    n = 20
    graph = gnnfuse.Graph(torch.randint(0, n, (80,), generator=g), torch.randint(0, n, (80,), generator=g), n)
    x = torch.randn(n, 6, dtype=f64, generator=g)
    layer = _ProductOfEnds()
    rows = torch.randperm(n, generator=g)
    with pytest.raises(ValueError, match="_ProductOfEnds: x has 20 rows.*in_edges_block"):
        layer(x, in_edges_block(graph, rows))
    torch.testing.assert_close(layer((x, x[rows]), in_edges_block(graph, rows)), layer(x, graph)[rows])
    torch.testing.assert_close(layer(x, in_edges_block(graph, torch.arange(n))), layer(x, graph))


def test_a_single_table_is_refused_on_a_reversed_block():
    """A block's reverse numbers its chosen vertices as sources 0..k-1: a single table of
    every vertex passed (it has one row per destination) and ``x_j`` was x[j] for vertex
    rows[j], silently. Refused; the pair ``(x[rows], x)`` gives the full graph's messages
    from the chosen vertices."""
    g = torch.Generator().manual_seed(0)
    n = 20
    graph = gnnfuse.Graph(torch.randint(0, n, (80,), generator=g), torch.randint(0, n, (80,), generator=g), n)
    x = torch.randn(n, 6, dtype=f64, generator=g)
    rows = torch.tensor([3, 5, 0, 17, 9])
    reverse = in_edges_block(graph, rows).reverse()
    layer = _ProductOfEnds()
    with pytest.raises(ValueError, match="_ProductOfEnds: x has 20 rows.*\\(x\\[rows\\], x\\)"):
        layer(x, reverse)
    local = reverse.edge_index
    torch.testing.assert_close(layer((x[rows], x), reverse), layer(x, torch.stack([rows[local[0]], local[1]])))


class _EdgeScores(gnnfuse.nn.MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")

    def forward(self, x, edge_index):
        return self.edge_updater(edge_index, x=x)

    def edge_update(self, x_i, x_j):
        return (x_i * x_j).sum(-1)


def test_an_edge_updater_refuses_a_single_table_on_a_block():
    """``edge_updater`` takes a `Graph` as ``propagate`` does: with one ``x`` on a block
    its ``x_i`` was x[i] for destination i, which is vertex rows[i] (per-edge scores 6.4
    off the full graph's on this graph), silently; it is refused as in ``propagate``, and
    the pair gives the full graph's scores of the block's edges."""
    g = torch.Generator().manual_seed(0)
    n = 20
    graph = gnnfuse.Graph(torch.randint(0, n, (80,), generator=g), torch.randint(0, n, (80,), generator=g), n)
    rows = torch.tensor([3, 5, 0, 17, 9])
    block, edge_ids = in_edges_block(graph, rows, return_edge_ids=True)
    x = torch.randn(n, 6, dtype=f64, generator=g)
    layer = _EdgeScores()
    with pytest.raises(ValueError, match="_EdgeScores: x has 20 rows.*in_edges_block"):
        layer(x, block)
    torch.testing.assert_close(layer((x, x[rows]), block), layer(x, graph)[edge_ids])


class _ScaledByDestination(gnnfuse.nn.MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")

    def forward(self, x, edge_index, scale):
        return self.propagate(edge_index, x=x, scale=scale)

    def message(self, x_j, scale_i):
        return x_j * scale_i


def test_a_table_of_the_chosen_vertices_alone_passes_on_a_block():
    """A table with one row per chosen destination (``scale_i``) is read as PyG reads a
    bipartite graph's destination table: not refused, and equal to the full graph's rows."""
    g = torch.Generator().manual_seed(1)
    n = 20
    graph = gnnfuse.Graph(torch.randint(0, n, (80,), generator=g), torch.randint(0, n, (80,), generator=g), n)
    x, scale = torch.randn(n, 6, dtype=f64, generator=g), torch.randn(n, 1, dtype=f64, generator=g)
    rows = torch.tensor([3, 5, 0, 17, 9])
    layer = _ScaledByDestination()
    torch.testing.assert_close(layer((x, x[rows]), in_edges_block(graph, rows), scale[rows]),
                               layer(x, graph, scale)[rows])


def test_a_graph_whose_edges_were_edited_in_place_is_refused():
    """The block trusts the graph's destination order (no sort where a PyG ``EdgeIndex``
    says its edges come sorted by target): after an in-place edit that order is gone, and
    unchecked the block gave row 0 edge 0 (now into vertex 2) and row 1 edge 1 (into
    vertex 0), where the edited edges give them edges 1 and 2. The edit is refused, as on
    a layer call."""
    from torch_geometric import EdgeIndex
    ei = torch.tensor([[3, 4, 5, 6], [0, 0, 1, 2]])
    by_col = EdgeIndex(ei.clone(), sparse_size=(7, 7), sort_order="col")
    graph = gnnfuse.Graph.coerce(by_col, 7)
    graph.csr()
    by_col.as_tensor()[1, 0] = 2           # edge 0 now 3 -> 2: the destinations no longer rise
    with pytest.raises(gnnfuse.graph.GraphModifiedError, match="version"):
        in_edges_block(graph, torch.tensor([0, 1]))
