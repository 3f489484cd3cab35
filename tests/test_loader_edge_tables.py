"""A PyG ``Data``'s ``edge_attr``/``edge_weight`` carried into sampled blocks
(`NeighborLoader`, `Block.e_id`): every block edge's id names the full graph's edge with
the same endpoints, its rows are that edge's, on random multigraphs (loops, repeated
edges, a hub) through every sampling path; and a layer that reads edge attributes gives
on a full-neighbourhood block the full graph's rows."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import gnnfuse
from gnnfuse.loader import NeighborLoader
from graph_strategies import GraphCase, graphs

RUNS = settings(max_examples=20, deadline=None, derandomize=True, database=None)


def pyg_data(case, seed: int = 0):
    from torch_geometric.data import Data
    gen = torch.Generator().manual_seed(seed)
    num_edges = case.edge_index.shape[1]
    return Data(x=torch.randn(case.num_nodes, 2, generator=gen), y=torch.arange(case.num_nodes),
                edge_index=case.given, edge_attr=torch.randn(num_edges, 3, generator=gen),
                edge_weight=torch.rand(num_edges, generator=gen) + 0.5, num_nodes=case.num_nodes)


@RUNS
@given(graphs(max_nodes=8, max_edges=24, hub_degrees=st.sampled_from([0, 9])), st.sampled_from([[2], [3, 2], [-1, 1]]),
       st.booleans(), st.integers(1, 4))
def test_blocks_carry_their_edges_ids_and_rows(case, fanouts, replace, batch_size):
    data = pyg_data(case)
    torch.manual_seed(0)
    for batch in NeighborLoader(data, fanouts, batch_size=batch_size, shuffle=True, replace=replace, prefetch=0):
        assert len(batch.blocks) == len(fanouts)
        for block in batch.blocks:
            e_id = block.e_id
            assert e_id.dtype == torch.int64 and e_id.numel() == block.edge_index.shape[1]
            assert torch.equal(block.src_nodes[block.edge_index.long()], data.edge_index.long()[:, e_id])
            assert torch.equal(block.edge_attr, data.edge_attr[e_id])
            assert torch.equal(block.edge_weight, data.edge_weight[e_id])
            if not replace:
                assert e_id.unique().numel() == e_id.numel()


def test_padded_blocks_carry_the_plain_blocks_edges_then_zeros():
    """``static_shapes`` pads each block's edges (between padded vertices only): their
    ids are 0 and their rows zeros, the real edges' come first, as in the plain batch."""
    data = pyg_data(_power_law(60, 400))
    plain = NeighborLoader(data, [3, 2], batch_size=8, prefetch=0)
    padded = NeighborLoader(data, [3, 2], batch_size=8, prefetch=0, static_shapes=True)
    torch.manual_seed(1)
    plain_batches = list(plain)
    torch.manual_seed(1)
    for ours, theirs in zip(padded, plain_batches):
        assert ours.padded
        for block, reference in zip(ours.blocks, theirs.blocks):
            real = reference.e_id.numel()
            assert block.e_id.numel() == block.edge_index.shape[1] > real
            assert torch.equal(block.e_id[:real], reference.e_id)
            assert torch.equal(block.edge_attr[:real], reference.edge_attr)
            assert torch.equal(block.edge_weight[:real], reference.edge_weight)
            assert not block.e_id[real:].any() and not block.edge_attr[real:].any()
            assert not block.edge_weight[real:].any()


def _power_law(num_nodes: int, num_edges: int) -> GraphCase:
    from gnnfuse.data.synthetic import power_law_graph
    edge_index = power_law_graph(num_nodes, num_edges, 1, 2, seed=0).graph.edge_index
    return GraphCase(num_nodes, edge_index, edge_index, torch.zeros(edge_index.shape[1], dtype=torch.int64))


def test_a_worker_process_sends_the_same_edge_rows():
    data = pyg_data(_power_law(40, 200))
    batches = []
    for workers in (0, 1):
        loader = NeighborLoader(data, [3, 2], batch_size=8, prefetch=1, num_workers=workers)
        torch.manual_seed(2)
        batches.append(list(loader))
        loader.close()
    for ours, theirs in zip(*batches):
        for block, reference in zip(ours.blocks, theirs.blocks):
            assert torch.equal(block.e_id, reference.e_id) and torch.equal(block.edge_attr, reference.edge_attr)


@pytest.mark.parametrize("layer", ["gat", "gatv2", "graphconv"])
def test_a_layer_on_a_full_neighbourhood_block_reads_the_edges_rows(layer):
    """One hop with every in-edge: the seeds' rows of a layer that reads edge
    attributes (GAT/GATv2 ``edge_dim``) or weights (GraphConv) are the full graph's."""
    torch.manual_seed(3)
    data = pyg_data(_power_law(30, 150), seed=3)
    data.x = torch.randn(30, 4, dtype=torch.float64)
    data.edge_attr = data.edge_attr.double()
    data.edge_weight = data.edge_weight.double()
    conv = {"gat": lambda: gnnfuse.nn.GATConv(4, 5, heads=2, edge_dim=3),
            "gatv2": lambda: gnnfuse.nn.GATv2Conv(4, 5, heads=2, edge_dim=3),
            "graphconv": lambda: gnnfuse.nn.GraphConv(4, 5)}[layer]().double()
    edges = data.edge_weight if layer == "graphconv" else data.edge_attr
    full = conv(data.x, data.edge_index, edges)
    for batch in NeighborLoader(data, [-1], batch_size=7, shuffle=True, prefetch=0):
        block = batch.blocks[0]
        rows = block.edge_weight if layer == "graphconv" else block.edge_attr
        out = conv((batch.x, batch.x[:block.num_dst]), block.graph, rows)
        torch.testing.assert_close(out, full[batch.input_id])


def test_edge_tables_of_the_wrong_length_or_with_deferred_batches_are_refused():
    data = pyg_data(_power_law(20, 60))
    graph = gnnfuse.Graph.from_edge_index(data.edge_index, 20)
    with pytest.raises(ValueError, match=r"edge_attr must have a row per edge \(60\), got \[59, 3\]"):
        NeighborLoader(graph, [2], x=data.x, edge_attr=data.edge_attr[:59])
    with pytest.raises(ValueError, match="edge_weight would not reach the blocks"):
        NeighborLoader(graph, [2], x=data.x, edge_weight=data.edge_weight, static_shapes=True, deferred=True)


def test_an_in_place_change_to_an_edge_table_reaches_the_next_batch_as_one_to_x_does():
    """The loader kept a copy of each edge table reordered when it was made: after
    ``data.edge_attr.mul_(10)`` a block still held the old rows (0.0, 1.0, ... where
    PyG's batch, reading the table per batch, holds 0.0, 10.0, ...) while ``batch.x``
    held the new ones."""
    data = pyg_data(_power_law(20, 60))
    loader = NeighborLoader(data, [3], batch_size=8, prefetch=0)
    data.edge_attr.mul_(10)
    data.edge_weight.add_(1)
    data.x.mul_(10)
    batch = next(iter(loader))
    block = batch.blocks[0]
    assert torch.equal(batch.x, data.x[batch.n_id])
    assert torch.equal(block.edge_attr, data.edge_attr[block.e_id])
    assert torch.equal(block.edge_weight, data.edge_weight[block.e_id])


def test_a_bare_graphs_loader_carries_no_edge_ids():
    """Nothing asked for edge rows: the blocks hold none (no gather or copy per hop)."""
    data = pyg_data(_power_law(20, 60))
    graph = gnnfuse.Graph.from_edge_index(data.edge_index, 20)
    block = next(iter(NeighborLoader(graph, [2], batch_size=4, x=data.x, prefetch=0))).blocks[0]
    assert block.e_id is None and block.edge_attr is None and block.edge_weight is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: sampling on the device, zero-copy rows")
@pytest.mark.parametrize("feature_device", ["device", "pinned"])
@pytest.mark.parametrize("static_shapes", [False, True])
def test_batches_sampled_on_the_gpu_carry_their_edges_rows(feature_device, static_shapes):
    """The fused sampling kernels' CSR positions, the Triton padding and the pinned
    tables' in-place reads give each block edge its own id and rows."""
    data = pyg_data(_power_law(500, 4000))
    graph = gnnfuse.Graph.from_edge_index(data.edge_index, 500).to("cuda")
    loader = NeighborLoader(graph, [4, 3], batch_size=64, shuffle=True, x=data.x, y=data.y, device="cuda",
                            edge_attr=data.edge_attr, edge_weight=data.edge_weight, feature_device=feature_device,
                            static_shapes=static_shapes)
    edge_index = data.edge_index.cuda()
    for batch in loader:
        for block in batch.blocks:
            real = block.e_id.numel() if not batch.padded else int((block.edge_weight != 0).sum())
            e_id = block.e_id[:real]
            assert torch.equal(block.src_nodes[block.edge_index[:, :real].long()], edge_index[:, e_id])
            assert torch.equal(block.edge_attr[:real], data.edge_attr.cuda()[e_id])
            assert torch.equal(block.edge_weight[:real], data.edge_weight.cuda()[e_id])
            assert e_id.unique().numel() == e_id.numel()
