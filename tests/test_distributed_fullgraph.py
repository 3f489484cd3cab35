"""Partitioned full-graph training (gnnfuse.distributed: partition, halo, fullgraph) on 2
CPU processes over gloo, against the one-process computation.

The 2-process work runs once per session (`ranks` fixture: one spawn, both ranks do every
case and save what they computed); each test compares one piece with plain one-process
torch in this process: the halo exchange and its gradient exactly (integer-valued
floats, so summation order cannot matter), forward logits, loss and every parameter
gradient of one step for GCN, GAT and SAGE in float64 (to 1e-12) and float32 (to float
tolerance), on the reference backend and, for the forward, on Triton, and a multi-step
run's loss curve against `train_run`. The graph has an isolated vertex and vertices all
of whose in-neighbours another rank owns, under both a contiguous and an interleaved
ownership.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gnnfuse.distributed.gradients import all_reduce_gradients, broadcast_parameters
from gnnfuse.distributed.fullgraph import (PartitionedModel, Shard, shard_data,
                                           train_full_graph_run)
from gnnfuse.distributed.halo import HaloExchange
from gnnfuse.distributed.launch import free_port, start_ranks
from gnnfuse.distributed.minibatch import train_distributed_minibatch_run
from gnnfuse.distributed.process_group import leave_process_group
from gnnfuse.distributed.partition import (contiguous_owners, greedy_owners, partition_graph,
                                           partition_stats)
from gnnfuse.data import load_node_dataset
from gnnfuse.graph import Graph
from gnnfuse.nn import GATConv, GCNConv, GINConv, SAGEConv
from gnnfuse.nn.models import TwoLayerGNN, build_model, get_model
from gnnfuse.training import PreparedData, make_config, prepare_data, train_run

WORLD = 2
NUM_NODES, NUM_FEATURES, NUM_CLASSES = 14, 6, 3
MODELS = ("gcn", "gat", "sage")
OWNERSHIPS = ("contiguous", "interleaved")
# The Triton case on these CPU ranks runs in Triton's interpreter, which conftest turns on
# only on a machine without a GPU
TRITON_ON_CPU_RANKS = not torch.cuda.is_available()
STEPS = 4


def graph() -> Graph:
    """Vertex 13 isolated; 6 has in-neighbours only among odd vertices (remote under the
    interleaved ownership) and 2 only among vertices >= 7 (remote under the contiguous
    one); a self loop and a multi-edge; 12 has out-edges only."""
    edges = [(0, 1), (1, 0), (10, 2), (8, 2), (9, 2), (2, 3), (3, 4), (4, 5), (5, 4), (1, 6), (3, 6), (9, 6),
             (6, 7), (7, 8), (8, 9), (9, 10), (10, 11), (11, 7), (5, 5), (4, 10), (4, 10), (12, 0), (12, 9),
             (2, 11), (7, 3)]
    src, dst = zip(*edges)
    return Graph(torch.tensor(src), torch.tensor(dst), NUM_NODES)


def owners(kind: str, world: int = WORLD) -> torch.Tensor:
    if kind == "contiguous":
        return contiguous_owners(graph(), world)
    return torch.arange(NUM_NODES) % world


def data(dtype: torch.dtype = torch.float32) -> PreparedData:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(NUM_NODES, NUM_FEATURES, generator=generator, dtype=torch.float64).to(dtype)
    y = torch.randint(NUM_CLASSES, (NUM_NODES,), generator=generator)
    train = torch.zeros(NUM_NODES, dtype=torch.bool)
    train[[0, 2, 3, 6, 9, 11, 13]] = True       # rank 1 of the contiguous split trains on 9, 11, 13
    val = ~train & (torch.arange(NUM_NODES) % 2 == 0)
    test = ~train & ~val
    return PreparedData("tiny", graph(), x, y, (train, val, test), NUM_FEATURES, NUM_CLASSES)


def model(name: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(name, NUM_FEATURES, NUM_CLASSES, hidden=4, dropout=0.0).to(dtype)


def integer_rows(rows: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, (rows, 3), generator=generator).to(torch.float64)


# --- the 2-process side ------------------------------------------------------------------
def _halo_case(rank: int, kind: str, world: int = WORLD) -> dict:
    part = partition_graph(graph(), owners(kind, world), rank, world)
    exchange = HaloExchange(part)
    rows = integer_rows(NUM_NODES, 1)[part.owned].requires_grad_()
    sources = exchange.sources(rows)
    upstream = integer_rows(NUM_NODES, 2)[part.src_nodes] * (rank + 1)
    (sources * upstream).sum().backward()
    return {"src_nodes": part.src_nodes, "sources": sources.detach(), "owned": part.owned, "grad": rows.grad,
            "bytes": (exchange.forward_bytes, exchange.backward_bytes)}


def _step_case(rank: int, name: str, dtype: torch.dtype, kind: str, sparse: bool = False,
               dropout: float = 0.0) -> dict:
    prepared = data(dtype)
    if sparse:      # bag-of-words features go in as sparse COO (training.data.SPARSE_FEATURES)
        prepared = dataclasses.replace(prepared, x=prepared.x.to_sparse())
    shard = shard_data(prepared, rank, WORLD, torch.device("cpu"), owner=owners(kind))
    net_model = model(name, dtype)
    net_model.dropout = dropout
    net = PartitionedModel(net_model, prepared.graph, HaloExchange(shard.partition))
    logits = net(shard.x)
    train = shard.masks[0]
    loss = F.cross_entropy(logits[train], shard.y[train], reduction="sum") / shard.split_sizes[0]
    total, grads = _summed_backward(loss, net_model)
    return {"owned": shard.partition.owned, "logits": logits.detach(), "loss": total, "grads": grads}


def _summed_backward(value: torch.Tensor, net_model: torch.nn.Module) -> tuple[torch.Tensor, dict]:
    """Backward of this rank's share of ``value``, the parameters' gradients summed over
    the ranks, and ``value`` summed over them: what one process computes on the whole."""
    value.backward()
    all_reduce_gradients(net_model.parameters())
    total = value.detach().clone()
    dist.all_reduce(total)
    return total, {k: p.grad for k, p in net_model.named_parameters()}


def _penalty_case(rank: int, kind: str) -> dict:
    """A gradient penalty through the partitioned GCN in float64: the squared norm of the
    loss's gradient in the input rows, differentiated in the weights (create_graph)."""
    prepared = data(torch.float64)
    shard = shard_data(prepared, rank, WORLD, torch.device("cpu"), owner=owners(kind))
    net_model = model("gcn", torch.float64)
    net = PartitionedModel(net_model, prepared.graph, HaloExchange(shard.partition))
    x = shard.x.clone().requires_grad_()
    train = shard.masks[0]
    loss = F.cross_entropy(net(x)[train], shard.y[train], reduction="sum") / shard.split_sizes[0]
    grad_x, = torch.autograd.grad(loss, x, create_graph=True)
    total, grads = _summed_backward(grad_x.pow(2).sum(), net_model)
    return {"owned": shard.partition.owned, "grad_x": grad_x.detach(), "penalty": total, "grads": grads}


def without_training_vertices() -> PreparedData:
    prepared = data()
    train, val, test = prepared.masks
    return dataclasses.replace(prepared, masks=(torch.zeros_like(train), val, test))


def _run_case(name: str, prepared: PreparedData | None = None) -> dict:
    config = make_config(name, "tiny", dropout=0.0, epochs=STEPS, hidden=4, patience=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train_full_graph_run(config, get_model(name), prepared or data(), seed=3, log_epochs=False,
                                      cuda_graph="on")
    return {"history": result.history, "state": result.state_dict,
            "warned": any("not captured" in str(w.message) for w in caught)}


def _worker(rank: int, port: int, out: str, world: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = {("halo", kind): _halo_case(rank, kind, world) for kind in OWNERSHIPS}
        if world != WORLD:      # the halo alone on more ranks: a row read by several gets their sum
            torch.save(results, os.path.join(out, f"rank{rank}.pt"))
            return
        for kind in OWNERSHIPS:
            results[("penalty", kind)] = _penalty_case(rank, kind)
        for name in MODELS:
            for kind in OWNERSHIPS:
                results[("step", name, torch.float64, kind)] = _step_case(rank, name, torch.float64, kind)
            results[("step", name, torch.float32, "contiguous")] = _step_case(rank, name, torch.float32, "contiguous")
            results[("sparse", name)] = _step_case(rank, name, torch.float64, "interleaved", sparse=True)
            results[("run", name)] = _run_case(name)
        results[("run", "no training vertex")] = _run_case("sage", without_training_vertices())
        results[("sparse", "dropout")] = _step_case(rank, "gcn", torch.float64, "interleaved", sparse=True,
                                                    dropout=0.5)
        if TRITON_ON_CPU_RANKS:
            os.environ["GNNFUSE_BACKEND"] = "triton"
            # GCN's aggregation is partition code; GAT's attention program is the layer's own
            for name in ("gcn", "sage"):
                results[("triton", name)] = _step_case(rank, name, torch.float32, "interleaved")
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        leave_process_group()


def _mismatch_worker(rank: int, port: int, out: str) -> None:
    """Rank-specific mistakes: rank 1 builds its model for 5 input features where rank 0
    has 6, then trains on another split of as many vertices; records what each raised."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        errors = {}
        try:
            broadcast_parameters(build_model("gcn", NUM_FEATURES - rank, NUM_CLASSES, hidden=4))
        except ValueError as caught:
            errors["model"] = str(caught)
        prepared = data()
        if rank == 1:         # as many training vertices, other ones (a split seeded per rank)
            train, val, test = prepared.masks
            prepared = dataclasses.replace(prepared, masks=(train.roll(1), val.roll(1), test.roll(1)))
        try:
            train_full_graph_run(make_config("sage", "tiny", dropout=0.0, epochs=1, hidden=4, patience=0),
                                 get_model("sage"), prepared, seed=3, log_epochs=False)
        except ValueError as caught:
            errors["split"] = str(caught)
        try:
            train_distributed_minibatch_run(make_config("sage", "tiny", dropout=0.0, epochs=1, hidden=4, patience=0,
                                                        fanout=(2, 2), batch_size=4),
                                            get_model("sage"), prepared, seed=3, log_epochs=False)
        except ValueError as caught:
            errors["mini-batch split"] = str(caught)
        prepared = data()
        for case, config, rank_data in (
                ("lr", make_config("sage", "tiny", dropout=0.0, epochs=1, hidden=4, patience=0, lr=0.01 * (1 + rank)),
                 prepared),
                ("epochs", make_config("sage", "tiny", dropout=0.0, epochs=1 + rank, hidden=4, patience=0), prepared),
                ("edges", make_config("sage", "tiny", dropout=0.0, epochs=1, hidden=4, patience=0),
                 _one_edge_moved(prepared) if rank == 1 else prepared),
                ("features", make_config("sage", "tiny", dropout=0.0, epochs=1, hidden=4, patience=0),
                 dataclasses.replace(prepared, x=prepared.x + rank))):
            try:
                train_full_graph_run(config, get_model("sage"), rank_data, seed=3, log_epochs=False)
            except ValueError as caught:
                errors[case] = str(caught)
        try:
            train_distributed_minibatch_run(make_config("sage", "tiny", dropout=0.0, epochs=1, hidden=4, patience=0,
                                                        fanout=(2, 2), batch_size=4 + rank),
                                            get_model("sage"), prepared, seed=3, log_epochs=False)
        except ValueError as caught:
            errors["mini-batch batch_size"] = str(caught)
        torch.save(errors, os.path.join(out, f"rank{rank}.pt"))
    finally:
        leave_process_group()


def _one_edge_moved(prepared: PreparedData) -> PreparedData:
    """The data set with its first edge pointing at the next vertex: the same sizes."""
    dst = prepared.graph.dst.clone()
    dst[0] = (dst[0] + 1) % prepared.graph.num_nodes
    return dataclasses.replace(prepared, graph=Graph(prepared.graph.src, dst, prepared.graph.num_nodes))


def run_ranks(out, world: int) -> list[dict]:
    start_ranks(_worker, (free_port(), str(out), world), world, "cpu")   # forked from the preloaded fork server
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(tmp_path_factory.mktemp("ranks"), WORLD)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(tmp_path_factory.mktemp("three_ranks"), 3)


def assembled(ranks: list[dict], key: tuple, field: str) -> torch.Tensor:
    """Per-vertex rows spread over the ranks, put back in global vertex order."""
    first = ranks[0][key][field]
    out = first.new_zeros((NUM_NODES, *first.shape[1:]))
    for result in ranks:
        out[result[key]["owned"]] = result[key][field]
    return out


# --- the one-process side ----------------------------------------------------------------
@pytest.mark.parametrize("kind", OWNERSHIPS)
def test_partition_covers_every_in_edge_once(kind):
    g = graph()
    parts = [partition_graph(g, owners(kind), r, WORLD) for r in range(WORLD)]
    edges = sorted((int(p.src_nodes[s]), int(p.owned[d])) for p in parts for s, d in zip(*p.graph.coo()))
    assert edges == sorted(zip(g.src.tolist(), g.dst.tolist()))
    assert sorted(torch.cat([p.owned for p in parts]).tolist()) == list(range(NUM_NODES))
    for p in parts:   # what rank q sends to r is exactly r's halo rows owned by q, in r's order
        for q in parts:
            if q.rank != p.rank:
                start = sum(q.send_counts[:p.rank])
                sent = q.owned[q.send_index[start:start + q.send_counts[p.rank]]]
                first = sum(p.recv_counts[:q.rank])
                assert sent.tolist() == p.halo[first:first + p.recv_counts[q.rank]].tolist()
    # the cases the graph was built for: some owned vertex has only remote in-neighbours
    remote_only = [int(v) for p in parts for v in range(p.num_owned)
                   if (p.graph.dst == v).any() and (p.graph.src[p.graph.dst == v] >= p.num_owned).all()]
    assert remote_only


def test_contiguous_owners_are_ranges_balanced_by_in_edges():
    g = graph()
    owner = contiguous_owners(g, WORLD)
    assert torch.all(owner[1:] >= owner[:-1]) and set(owner.tolist()) == {0, 1}
    assert partition_stats(g, owner, WORLD).imbalance < 1.3
    assert contiguous_owners(g, NUM_NODES + 3).max() < NUM_NODES + 3       # more ranks than vertices


def test_contiguous_owners_and_imbalance_of_a_hand_counted_graph():
    """Three edges into vertex 0: loads (in-degree + 1) 4, 1, 1, 1, total 7. The cost before
    each vertex is 0, 4, 5, 6, so on 2 ranks (a share of 3.5) vertex 0 alone is rank 0's
    and the rest rank 1's: loads 4 and 3, imbalance 4 / 3.5."""
    g = Graph(torch.tensor([1, 2, 3]), torch.tensor([0, 0, 0]), 4)
    owner = contiguous_owners(g, 2)
    assert owner.tolist() == [0, 1, 1, 1]
    assert partition_stats(g, owner, 2).imbalance == pytest.approx(4 / 3.5)
    assert contiguous_owners(Graph(torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64), 4),
                             2).tolist() == [0, 0, 1, 1]


def test_greedy_partition_of_cora_cuts_fewer_edges_than_ranges(shared_data):
    g = load_node_dataset("cora", shared_data).graph
    greedy = partition_stats(g, greedy_owners(g, WORLD), WORLD)
    ranges = partition_stats(g, contiguous_owners(g, WORLD), WORLD)
    assert greedy.edge_cut < 0.5 * ranges.edge_cut and greedy.halo_rows < 0.6 * ranges.halo_rows
    assert greedy.imbalance < 1.1


def test_partition_rejects_bad_owners():
    with pytest.raises(ValueError, match="owner"):
        partition_graph(graph(), torch.zeros(3, dtype=torch.int64), 0, WORLD)
    with pytest.raises(ValueError, match="rank"):
        partition_graph(graph(), torch.full((NUM_NODES,), 2), 0, WORLD)


def test_partition_refuses_a_bipartite_graph():
    """Owners are one rank per vertex of one vertex set; a block's sources and
    destinations are two sets, which no owner vector describes."""
    block = Graph(torch.tensor([0, 3, 4]), torch.tensor([0, 1, 1]), 2, num_src_nodes=5)
    with pytest.raises(ValueError, match="bipartite"):
        partition_graph(block, torch.zeros(2, dtype=torch.int64), 0, 1)


def test_halo_exchange_counters_restart_from_zero_after_reset():
    """The full-graph run logs each epoch's halo bytes then resets both counters: one left
    counting would report every epoch's gradients as the sum of all epochs so far."""
    exchange = HaloExchange(partition_graph(graph(), owners("contiguous"), 0, WORLD))
    exchange.forward_bytes, exchange.backward_bytes = 96, 48
    exchange.reset_counts()
    assert (exchange.forward_bytes, exchange.backward_bytes) == (0, 0)


def test_halo_exchange_refuses_rows_that_are_not_one_per_owned_vertex():
    """Refused before any collective (none is initialised here): rows of all vertices
    where the owned ones are due would send rows of the wrong vertices."""
    part = partition_graph(graph(), owners("contiguous"), 0, WORLD)
    with pytest.raises(ValueError, match=f"one row per owned vertex \\({part.num_owned}\\), got {NUM_NODES}"):
        HaloExchange(part)(torch.zeros(NUM_NODES, 3))


@pytest.mark.parametrize("world", [WORLD, 3])
@pytest.mark.parametrize("kind", OWNERSHIPS)
def test_halo_exchange_is_the_gather_and_its_gradient(request, kind, world):
    ranks = request.getfixturevalue("ranks" if world == WORLD else "three_ranks")
    x = integer_rows(NUM_NODES, 1).requires_grad_()
    loss = 0
    for rank, result in enumerate(ranks):
        got = result[("halo", kind)]
        assert torch.equal(got["sources"], x.detach()[got["src_nodes"]])
        loss = loss + (x[got["src_nodes"]] * integer_rows(NUM_NODES, 2)[got["src_nodes"]] * (rank + 1)).sum()
    loss.backward()
    assert torch.equal(assembled(ranks, ("halo", kind), "grad"), x.grad)
    owner = owners(kind, world)
    halos = [r[("halo", kind)]["src_nodes"][r[("halo", kind)]["owned"].numel():] for r in ranks]
    for rank, result in enumerate(ranks):
        sent_rows = sum(int((owner[halo] == rank).sum()) for halo in halos)
        assert result[("halo", kind)]["bytes"] == (sent_rows * 3 * 8, halos[rank].numel() * 3 * 8)


def one_process_step(name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, dict]:
    prepared = data(dtype)
    net = model(name, dtype)
    logits = net(prepared.x, prepared.graph)
    train = prepared.masks[0]
    loss = F.cross_entropy(logits[train], prepared.y[train])
    loss.backward()
    return logits.detach(), loss.detach(), {k: p.grad for k, p in net.named_parameters()}


def check_step(ranks: list[dict], key: tuple, name: str, dtype: torch.dtype, rtol: float, atol: float) -> None:
    logits, loss, grads = one_process_step(name, dtype)
    torch.testing.assert_close(assembled(ranks, key, "logits"), logits, rtol=rtol, atol=atol)
    for result in ranks:
        torch.testing.assert_close(result[key]["loss"], loss, rtol=rtol, atol=atol)
        assert result[key]["grads"].keys() == grads.keys()
        for param, grad in grads.items():
            torch.testing.assert_close(result[key]["grads"][param], grad, rtol=rtol, atol=atol, msg=param)


@pytest.mark.parametrize("kind", OWNERSHIPS)
@pytest.mark.parametrize("name", MODELS)
def test_two_process_step_equals_one_process_float64(ranks, name, kind):
    check_step(ranks, ("step", name, torch.float64, kind), name, torch.float64, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", OWNERSHIPS)
def test_a_gradient_penalty_through_the_halo_exchange_equals_one_process(ranks, kind):
    """Second derivatives cross ranks: the halo exchange's backward ran bare collectives,
    outside autograd, so a gradient of a gradient lost every halo reader's share, silently
    -- the penalty's weight gradients were up to 0.014 off, where none exceeds 0.023 (on
    the exchange alone, x -> sum of x[src]^3 over the edges gave [6, 0, 0] for [12, 12, 18])."""
    prepared = data(torch.float64)
    net = model("gcn", torch.float64)
    x = prepared.x.clone().requires_grad_()
    train = prepared.masks[0]
    grad_x, = torch.autograd.grad(F.cross_entropy(net(x, prepared.graph)[train], prepared.y[train]), x,
                                  create_graph=True)
    penalty = grad_x.pow(2).sum()
    penalty.backward()
    torch.testing.assert_close(assembled(ranks, ("penalty", kind), "grad_x"), grad_x.detach(), rtol=1e-12, atol=1e-12)
    for result in ranks:
        torch.testing.assert_close(result[("penalty", kind)]["penalty"], penalty.detach(), rtol=1e-12, atol=1e-12)
        for param, value in net.named_parameters():
            torch.testing.assert_close(result[("penalty", kind)]["grads"][param], value.grad, rtol=1e-10,
                                       atol=1e-12, msg=param)


@pytest.mark.parametrize("name", MODELS)
def test_two_process_step_on_sparse_features_equals_one_process(ranks, name):
    check_step(ranks, ("sparse", name), name, torch.float64, rtol=1e-12, atol=1e-12)


def test_feature_dropout_on_sparse_features_of_a_shard(ranks):
    """A shard's rows of sparse COO features come uncoalesced from index_select, which
    the sparse dropout refused ("Cannot get indices on an uncoalesced tensor")."""
    dropped, kept = ranks[0][("sparse", "dropout")], ranks[0][("sparse", "gcn")]
    assert torch.isfinite(dropped["loss"]) and not torch.equal(dropped["grads"]["conv1.lin.weight"],
                                                               kept["grads"]["conv1.lin.weight"])
    for param, grad in dropped["grads"].items():     # summed over ranks: the same update everywhere
        assert torch.equal(ranks[1][("sparse", "dropout")]["grads"][param], grad)


@pytest.mark.parametrize("name", MODELS)
def test_two_process_step_equals_one_process_float32(ranks, name):
    check_step(ranks, ("step", name, torch.float32, "contiguous"), name, torch.float32, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gcn", "sage"])
@pytest.mark.skipif(not TRITON_ON_CPU_RANKS,
                    reason="CPU ranks on the Triton backend need its interpreter, which conftest turns on only on "
                           "machines without a GPU")
def test_two_process_step_on_triton_equals_one_process(ranks, name):
    check_step(ranks, ("triton", name), name, torch.float32, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_two_process_run_follows_the_one_process_loss_curve(ranks, name):
    config = make_config(name, "tiny", dropout=0.0, epochs=STEPS, hidden=4, patience=0)
    expected = train_run(config, get_model(name), data(), seed=3, log_epochs=False)
    for result in ranks:
        history = result[("run", name)]["history"]
        for key in ("loss", "val_loss", "train_acc", "val_acc", "test_acc"):
            torch.testing.assert_close(torch.tensor(history[key]), torch.tensor(expected.history[key]),
                                       rtol=1e-5, atol=1e-6, msg=key)
        for param, value in expected.state_dict.items():
            torch.testing.assert_close(result[("run", name)]["state"][param], value, rtol=1e-5, atol=1e-6)
    assert [r[("run", name)]["warned"] for r in ranks] == [True, False]     # cuda_graph="on": said once


def test_a_run_without_training_vertices_diverges_as_on_one_process(ranks):
    """The one-process mean over no vertex is NaN and stops the run at epoch 1; the ranks
    reported a loss of 0.0 for every epoch instead, stepping on weight decay alone."""
    config = make_config("sage", "tiny", dropout=0.0, epochs=STEPS, hidden=4, patience=0)
    with pytest.warns(RuntimeWarning, match="diverged"):
        expected = train_run(config, get_model("sage"), without_training_vertices(), seed=3, log_epochs=False)
    for result in ranks:
        history = result[("run", "no training vertex")]["history"]
        assert len(history["loss"]) == len(expected.history["loss"]) == 1
        assert all(value != value for value in history["loss"])       # NaN
        assert history["val_loss"] == pytest.approx(expected.history["val_loss"], rel=1e-6)


@pytest.fixture(scope="module")
def mismatch(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("mismatch")
    start_ranks(_mismatch_worker, (free_port(), str(out)), WORLD, "cpu")
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]


def test_ranks_whose_models_differ_are_refused_naming_the_tensor(mismatch):
    """Broadcasting rank 0's weights to a rank whose model has other shapes aborted that
    rank inside gloo ("terminate called ... Received data size doesn't match expected
    size") and reset the other's connection; NCCL does not compare sizes at all."""
    for error in mismatch:
        assert "conv1.lin.weight" in error.get("model", "") and "rank 1" in error["model"], error


def test_ranks_training_on_different_splits_are_refused(mismatch):
    """Each rank's loss was divided by its own count of training vertices and its shard
    cut from its own masks: ranks given other splits trained on a mix of both, silently."""
    for error in mismatch:
        for run in ("split", "mini-batch split"):        # partitioned full graph, data-parallel mini-batches
            assert "train split" in error.get(run, "") and "rank 1" in error[run], (run, error)


@pytest.mark.parametrize("run, said", [("lr", "lr 0.02 where rank 0 has lr 0.01"),
                                       ("epochs", "epochs 2 where rank 0 has epochs 1"),
                                       ("edges", "edges "), ("features", "features "),
                                       ("mini-batch batch_size", "batch_size 5 where rank 0 has batch_size 4")])
def test_ranks_given_other_settings_or_data_are_refused(mismatch, run, said):
    """Ranks started apart (torchrun, processes of the user's own) with another learning
    rate each applied their own updates and their weights drifted apart silently; another
    epoch count or batch size left a rank waiting in a collective the others had left
    (gloo's "Connection closed by peer" a minute later, or an abort); another graph of the
    same sizes, or other features, trained on a mix of both. Each is refused on every rank."""
    for error in mismatch:
        assert said in error.get(run, "") and "rank 1" in error[run], (run, error)


def test_full_graph_ranks_keep_the_feature_table_on_the_host(monkeypatch):
    """Without a fanout every rank moves only its own rows to its device (shard_data);
    prepare_data had already moved the whole table there on every rank (cuda; a meta
    device stands in for it here), where it stayed for the run."""
    import gnnfuse.distributed
    monkeypatch.setattr(gnnfuse.distributed, "world_size", lambda: 2)
    config = dataclasses.replace(make_config("sage", "synthetic", epochs=1), device="meta")
    prepared = prepare_data(config, get_model("sage"))
    assert prepared.x.device.type == "cpu" and prepared.y.device.type == "meta"


def test_full_graph_run_needs_a_process_group_and_a_partitioned_model():
    config = make_config("gcn", "tiny", epochs=1)
    with pytest.raises(RuntimeError, match="torch.distributed"):
        train_full_graph_run(config, get_model("gcn"), data(), seed=0)
    with pytest.raises(ValueError, match="appnp"):
        train_full_graph_run(make_config("appnp", "tiny"), get_model("appnp"), data(), seed=0)


def test_partitioned_model_refuses_what_it_cannot_partition_exactly():
    part = partition_graph(graph(), owners("contiguous"), 0, WORLD)
    with pytest.raises(ValueError, match="improved=True"):
        PartitionedModel(TwoLayerGNN(GCNConv(4, 4, improved=True), GCNConv(4, 2), F.relu, 0.0), graph(),
                         HaloExchange(part))
    # the partition computes PyG's default GCN normalisation, source to target: any other
    # setting would give other rows than the layer on one process, so it must be refused
    for setting, named in (({"flow": "target_to_source"}, "flow='target_to_source'"),
                           ({"normalize": False}, "normalize=False"),
                           ({"add_self_loops": False}, "add_self_loops=False")):
        with pytest.raises(ValueError, match=named):
            PartitionedModel(TwoLayerGNN(GCNConv(4, 4), GCNConv(4, 2, **setting), F.relu, 0.0), graph(),
                             HaloExchange(part))
    with pytest.raises(ValueError, match="GINConv"):
        PartitionedModel(TwoLayerGNN(GINConv(torch.nn.Linear(4, 4)), GCNConv(4, 2), F.relu, 0.0), graph(),
                         HaloExchange(part))
    with pytest.raises(ValueError, match="APPNP|PropagatedMLP"):
        PartitionedModel(build_model("appnp", 4, 2), graph(), HaloExchange(part))


@pytest.mark.parametrize("lazy", [lambda: GCNConv(-1, 4), lambda: SAGEConv(-1, 4)])
def test_partitioned_model_refuses_lazy_layers(lazy):
    """A lazy layer draws its weights at its first call, on each rank from that rank's own
    random stream (dropout on rows of another count, or train_full_graph_run's per-rank
    seed before it): ranks started from different weights (0.83 apart on 2 ranks) and
    stayed apart, their summed gradients never reconciling them."""
    part = partition_graph(graph(), owners("contiguous"), 0, WORLD)
    with pytest.raises(ValueError, match="lazy"):
        PartitionedModel(TwoLayerGNN(lazy(), GCNConv(4, 2), F.relu, 0.0), graph(), HaloExchange(part))


class ScaledOutput(TwoLayerGNN):
    """A user's model built on TwoLayerGNN with a forward of its own."""

    def forward(self, x, graph):
        return 2 * super().forward(x, graph)


class ScaledGCN(GCNConv):
    def forward(self, x, edge_index):
        return 2 * super().forward(x, edge_index)


class ScaledGAT(GATConv):
    def forward(self, x, edge_index):
        return 2 * super().forward(x, edge_index)


def test_partitioned_model_refuses_a_gcn_layer_with_a_forward_of_its_own():
    """GCN's layer runs as partition code, not through the layer's forward: a subclass's
    own forward was skipped, silently."""
    part = partition_graph(graph(), owners("contiguous"), 0, WORLD)
    model = TwoLayerGNN(ScaledGCN(NUM_FEATURES, 4), SAGEConv(4, NUM_CLASSES), F.relu, 0.0)
    with pytest.raises(ValueError, match="ScaledGCN"):
        PartitionedModel(model, graph(), HaloExchange(part))


def test_a_gat_layer_with_a_forward_of_its_own_runs_it():
    """A GAT layer whose projected rows move fewer bytes than its input (64 features ->
    4) ran as forward_projected, skipping a subclass's own forward: logits up to 1.38
    off. Such a layer now runs through its forward (one rank: the whole graph)."""
    torch.manual_seed(0)
    _one_rank_matches_the_whole_graph(ScaledGAT(64, 4))


def _one_rank_matches_the_whole_graph(first: torch.nn.Module) -> None:
    """``first`` (64 features -> 4) then SAGE, partitioned on one gloo rank, gives the
    whole graph's logits."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = TwoLayerGNN(first, SAGEConv(4, NUM_CLASSES), F.relu, 0.0).double()
        x = torch.randn(NUM_NODES, 64, dtype=torch.float64)
        part = partition_graph(graph(), torch.zeros(NUM_NODES, dtype=torch.int64), 0, 1)
        got = PartitionedModel(model, graph(), HaloExchange(part))(x[part.owned])
        torch.testing.assert_close(got, model(x, graph())[part.owned], rtol=1e-12, atol=1e-12)
    finally:
        dist.destroy_process_group()


def test_hooks_on_partitioned_gcn_and_gat_layers_are_not_skipped():
    """A forward hook on GCNConv (computed as partition code) or on a GAT layer run as
    forward_projected was skipped, silently: GCN is refused, GAT runs its forward."""
    double = lambda module, inputs, output: 2 * output        # noqa: E731
    part = partition_graph(graph(), owners("contiguous"), 0, WORLD)
    gcn = GCNConv(NUM_FEATURES, 4)
    gcn.register_forward_hook(double)
    with pytest.raises(ValueError, match="hook"):
        PartitionedModel(TwoLayerGNN(gcn, SAGEConv(4, NUM_CLASSES), F.relu, 0.0), graph(), HaloExchange(part))
    torch.manual_seed(0)
    gat = GATConv(64, 4)
    gat.register_forward_hook(double)
    _one_rank_matches_the_whole_graph(gat)


def test_partitioned_model_refuses_a_model_with_a_forward_of_its_own():
    """PartitionedModel runs dropout -> conv -> activation per layer; for a subclass of
    TwoLayerGNN that computes something else it ran that instead, silently (here every
    logit half the model's)."""
    part = partition_graph(graph(), owners("contiguous"), 0, WORLD)
    model = ScaledOutput(GCNConv(NUM_FEATURES, 4), GCNConv(4, NUM_CLASSES), F.relu, 0.0)
    with pytest.raises(ValueError, match="ScaledOutput"):
        PartitionedModel(model, graph(), HaloExchange(part))


@pytest.mark.parametrize("hook", ["forward", "forward_pre"])
def test_partitioned_model_refuses_a_model_with_hooks(hook):
    """PartitionedModel runs the model's layers itself, never the model's own call: a
    forward hook doubling the logits (or a pre-hook scaling the input) on a TwoLayerGNN
    was skipped, silently -- on one rank holding the whole graph the logits were up to
    4.4 off those of ``model(x, graph)`` in float64."""
    part = partition_graph(graph(), owners("contiguous"), 0, WORLD)
    model = TwoLayerGNN(GCNConv(NUM_FEATURES, 4), SAGEConv(4, NUM_CLASSES), F.relu, 0.0)
    if hook == "forward":
        model.register_forward_hook(lambda module, inputs, output: 2 * output)
    else:
        model.register_forward_pre_hook(lambda module, inputs: (3 * inputs[0], *inputs[1:]))
    with pytest.raises(ValueError, match="TwoLayerGNN.*hook"):
        PartitionedModel(model, graph(), HaloExchange(part))


def batch_norm_activation() -> TwoLayerGNN:
    norm_relu = torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.ReLU())
    return TwoLayerGNN(GCNConv(NUM_FEATURES, 4), SAGEConv(4, NUM_CLASSES), norm_relu, 0.0)


def batch_norm_aggregation() -> TwoLayerGNN:
    pyg = pytest.importorskip("torch_geometric.nn.aggr")
    aggr = pyg.MLPAggregation(4, 4, max_num_elements=4, num_layers=2, hidden_channels=5)   # PyG's MLP: batch norm
    return TwoLayerGNN(GCNConv(NUM_FEATURES, 4), SAGEConv(4, NUM_CLASSES, aggr=aggr), F.relu, 0.0)


@pytest.mark.filterwarnings("ignore:SAGEConv. aggregation")
@pytest.mark.parametrize("make, named", [(batch_norm_activation, "BatchNorm1d"), (batch_norm_aggregation, "BatchNorm")],
                         ids=["activation", "aggregation"])
def test_partitioned_model_refuses_norms_over_all_rows(make, named):
    """A batch norm's training statistics are over all the vertices it gets; on a rank's
    partition they were over the rank's rows, silently: a BatchNorm1d in the activation
    moved the 2-rank logits by 0.50 in float64, one in an MLPAggregation's MLP a layer's
    output by 0.09."""
    torch.manual_seed(0)
    model = make().double()
    x = integer_rows(NUM_NODES, 1).repeat(1, 2)[:, :NUM_FEATURES]
    part = partition_graph(sorted_graph(), owners("interleaved"), 0, WORLD)
    with torch.no_grad():     # the refusal is justified: the activation or aggregation of the rank's rows differs
        hidden = model.conv1(x, sorted_graph())
        first = model.activation(hidden)
        assert not (torch.allclose(model.activation(hidden[part.owned]), first[part.owned], atol=1e-6)
                    and torch.allclose(model.conv2((first[part.src_nodes], first[part.owned]), part.graph),
                                       model.conv2(first, sorted_graph())[part.owned], atol=1e-6))
    with pytest.raises(ValueError, match=named):
        PartitionedModel(model, sorted_graph(), HaloExchange(part))


def sorted_graph() -> Graph:
    """`graph` with its edges grouped by destination, as PyG's sequence aggregations need."""
    g = graph()
    order = torch.argsort(g.dst, stable=True)
    return Graph(g.src[order], g.dst[order], NUM_NODES)


def graph_dependent_aggregations() -> dict:
    pyg = pytest.importorskip("torch_geometric.nn.aggr")
    return {"LSTMAggregation": lambda: "lstm", "GRUAggregation": lambda: pyg.GRUAggregation(3, 3),
            "EquilibriumAggregation": lambda: pyg.EquilibriumAggregation(3, 3, [4])}


@pytest.mark.filterwarnings("ignore:SAGEConv. aggregation")
@pytest.mark.parametrize("name", ["LSTMAggregation", "GRUAggregation", "EquilibriumAggregation"])
def test_partitioned_model_refuses_aggregations_that_read_the_whole_graph(name):
    """LSTM and GRU run each vertex's neighbour list padded to the longest list of the
    graph they get, Equilibrium optimises every vertex together: on a rank's block the
    rows differ from the whole graph's (float64: LSTM up to 0.029 in a 2-layer model's
    logits on 2 ranks, GRU 0.26 in one layer's output), and the partition ran them."""
    aggr = graph_dependent_aggregations()[name]
    g = sorted_graph()
    owner = (g.in_degrees() == g.in_degrees().max()).long()      # rank 0's longest neighbour list is shorter
    part = partition_graph(g, owner, 0, WORLD)
    torch.manual_seed(0)
    conv = SAGEConv(3, 3, aggr=aggr())
    with torch.no_grad():     # the refusal is justified: the block's rows are not the whole graph's
        x = integer_rows(NUM_NODES, 1)
        whole = conv.double()(x, g)[part.owned]
        assert not torch.allclose(conv((x[part.src_nodes], x[part.owned]), part.graph), whole, atol=1e-6)
    with pytest.raises(ValueError, match=name):
        PartitionedModel(TwoLayerGNN(SAGEConv(4, 4), conv, F.relu, 0.0), graph(), HaloExchange(part))


@pytest.mark.filterwarnings("ignore:SAGEConv. aggregation")
@pytest.mark.parametrize("aggr", ["median", "powermean", "attentional", "mlp"])
def test_per_vertex_eager_aggregations_partition_exactly(aggr):
    """The eager aggregations PartitionedModel accepts give the whole graph's rows on
    each rank's block (what it relies on to accept them)."""
    pyg = pytest.importorskip("torch_geometric.nn.aggr")
    make = {"median": lambda: "median", "powermean": lambda: "powermean",
            "attentional": lambda: pyg.AttentionalAggregation(torch.nn.Linear(3, 1)),
            "mlp": lambda: pyg.MLPAggregation(3, 3, max_num_elements=4, num_layers=1)}[aggr]
    torch.manual_seed(0)
    conv = SAGEConv(3, 2, aggr=make()).double().eval()
    x = integer_rows(NUM_NODES, 1)
    with torch.no_grad():
        whole = conv(x, sorted_graph())
        for rank in range(WORLD):
            part = partition_graph(sorted_graph(), owners("interleaved"), rank, WORLD)
            PartitionedModel(TwoLayerGNN(SAGEConv(3, 3), conv, F.relu, 0.0), sorted_graph(), HaloExchange(part))
            torch.testing.assert_close(conv((x[part.src_nodes], x[part.owned]), part.graph), whole[part.owned],
                                       rtol=1e-12, atol=1e-12)


def test_benchmark_smoke_run_trains_every_method_and_agrees(import_script, tmp_path):
    """benchmarks/bench_distributed_fullgraph.py --smoke: PyG and gnnfuse on one process and
    gnnfuse on 2 gloo ranks, one call; their initial losses agree and the report is written."""
    bench = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_distributed_fullgraph")
    results = bench.main(["--smoke", "--json", str(tmp_path / "smoke.json")])
    assert list(results["methods"]) == ["pyg-1", "gnnfuse-2", "gnnfuse-1"]
    assert all(entry["status"] == "ok" for entry in results["methods"].values()), results["methods"]
    assert results["initial_loss_rel_spread"] < 1e-5
    ranks = results["methods"]["gnnfuse-2"]["ranks"]
    assert sum(r["owned"] for r in ranks) == bench.SMOKE["nodes"]
    assert all(r["halo_mb_per_step"]["forward"] > 0 and r["median_ms"] > 0 for r in ranks)
    assert "| gnnfuse-2 | ok |" in (tmp_path / "smoke.md").read_text()


def test_benchmark_features_of_some_rows_are_those_rows_of_the_table(import_script, monkeypatch):
    """Each rank draws only the feature chunks holding its rows; they must be the rows of
    the table a one-process method draws, whatever order the rows come in."""
    bench = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_distributed_fullgraph")
    monkeypatch.setattr(bench, "FEATURE_CHUNK", 7)
    args = argparse.Namespace(nodes=30, features=3, seed=2)
    table = bench.features(args, torch.device("cpu"))
    assert table.shape == (30, 3)
    for rows in (torch.tensor([29, 4, 15, 3, 22, 5]), torch.randperm(30, generator=torch.Generator().manual_seed(0))):
        torch.testing.assert_close(bench.features(args, torch.device("cpu"), rows), table[rows], rtol=0, atol=0)


def test_epoch_accuracies_of_nan_logits_are_nan_as_on_one_process():
    """A diverged epoch's accuracies, an argmax over NaN logits, were counted as
    predictions by the ranks (`gnnfuse train --cpu-ranks 2 --model sage --lr 1e20`:
    "train 0.2000 | val 0.1900 | test 0.2110"), where one process reports NaN."""
    from gnnfuse.distributed.fullgraph import _EpochStats
    from gnnfuse.training.loop import accuracy
    logits = torch.tensor([[0.0, 1.0], [2.0, 0.0], [float("nan"), 0.0], [1.0, 0.0]])
    y = torch.tensor([1, 0, 0, 1])
    masks = tuple(torch.tensor(m) for m in ([True, True, False, False], [False, False, True, False],
                                            [False, True, False, True]))
    shard = Shard(None, None, y, masks, tuple(int(m.sum()) for m in masks))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        (loss, val_loss, *accuracies), _ = _EpochStats(shard).reduce(torch.tensor(0.5), logits)
    finally:
        dist.destroy_process_group()
    expected = [accuracy(logits, y, mask) for mask in masks]
    assert expected[0] == 1.0 and expected[1] != expected[1] and expected[2] == 0.5
    assert accuracies[0] == 1.0 and accuracies[1] != accuracies[1] and accuracies[2] == 0.5


def test_partition_stats_of_an_int32_owner_count_every_halo_row():
    """An int32 owner (METIS's) made the halo keys ``owner * N + src`` int32: vertex 5 read
    by ranks 0 and 2^20 of a 4096-vertex graph gave keys 5 and 2^32 + 5, which wrapped onto
    one, and one halo row was counted for two. Read as int64, both count."""
    n = 4096
    owner = torch.zeros(n, dtype=torch.int32)
    owner[5], owner[20] = 1, 2**20
    g = Graph(torch.tensor([5, 5]), torch.tensor([10, 20]), n)
    assert partition_stats(g, owner, 2**20 + 1).halo_rows == 2 == partition_stats(g, owner.long(), 2**20 + 1).halo_rows
