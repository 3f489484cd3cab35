"""What each rank of the 2-process gloo job in test_distributed_minibatch.py runs.

One job (one process start-up, one process group) measures everything the tests
check, rank by rank, and saves it for the test process to assert on: spawning
processes costs seconds, checks cost milliseconds.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import gnnfuse
from gnnfuse.distributed import DistributedError, PartitionedFeatures, init_process_group, row_ranges
from gnnfuse.distributed.gradients import average_gradients, broadcast_parameters
from gnnfuse.distributed.inference import layerwise_logits, range_block, summed_accuracies
from gnnfuse.distributed.minibatch import train_distributed_minibatch_run
from gnnfuse.distributed.process_group import leave_process_group
from gnnfuse.loader import NeighborLoader
from gnnfuse.nn.block_models import build_block_model
from gnnfuse.nn.models import get_model
from gnnfuse.runtime.cuda_graph import StepCapture
from gnnfuse.training import PreparedData, accuracy, make_config, prepare_data

WORLD = 2
SAMPLER_SEEDS = torch.arange(3, 26)          # 23 seeds: 11 per rank, one sits out each epoch
FEATURE_ROWS = 11                            # rank 0 owns rows 0..4, rank 1 rows 5..10
FEATURE_IDS = {0: [[10, 0, 7, 3, 4], [2]], 1: [[1, 9, 5, 6], []]}    # two gathers per rank
TRAIN_EPOCHS = 12


def random_graph(num_nodes: int, num_edges: int, seed: int) -> gnnfuse.Graph:
    g = torch.Generator().manual_seed(seed)
    return gnnfuse.Graph(torch.randint(0, num_nodes, (num_edges,), generator=g),
                         torch.randint(0, num_nodes, (num_edges,), generator=g), num_nodes)


def training_config(batch_size: int, features: str = "replicated", epochs: int = TRAIN_EPOCHS):
    return make_config("sage", "synthetic", fanout=(4, 4), batch_size=batch_size, epochs=epochs, hidden=16,
                       patience=0, features=features)


def sampler_epochs(rank: int) -> dict[str, Any]:
    graph = random_graph(40, 120, 1)
    sampler = DistributedSampler(range(SAMPLER_SEEDS.numel()), num_replicas=WORLD, rank=rank, shuffle=True, seed=5,
                                 drop_last=True)
    loader = NeighborLoader(graph, [2], batch_size=4, input_nodes=SAMPLER_SEEDS, sampler=sampler)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append([batch.n_id[:batch.batch_size].tolist() for batch in loader])
    return {"epochs": epochs, "len": len(loader)}


def feature_fetch(rank: int) -> dict[str, Any]:
    table = torch.arange(FEATURE_ROWS * 3, dtype=torch.float32).reshape(FEATURE_ROWS, 3) * 1.5
    store = PartitionedFeatures.from_full(table, rank, WORLD, torch.device("cpu"))
    rows = [store.gather(torch.tensor(ids, dtype=torch.int64)) for ids in FEATURE_IDS[rank]]
    return {"rows": rows, "table": table, "bytes": store.bytes_moved(), "mismatched": mismatched_tables(rank)}


def mismatched_tables(rank: int) -> torch.Tensor | str:
    """A gather between ranks whose tables differ: rank 1 holds its rows as 2 float64 values
    where rank 0 holds 4 float32, rows of the same 16 bytes (the refusal, or the rows)."""
    table = torch.arange(FEATURE_ROWS * 4, dtype=torch.float32).reshape(FEATURE_ROWS, 4)
    store = PartitionedFeatures.from_full(table if rank == 0 else table[:, :2].double(), rank, WORLD,
                                          torch.device("cpu"))
    try:
        return store.gather(torch.tensor([0, FEATURE_ROWS - 1]))       # a row of each rank's
    except ValueError as error:
        return str(error)


def ddp_gradients(rank: int) -> dict[str, Any]:
    """DDP's gradients and each rank's own (no DDP) on the same batch, from equal weights."""
    graph = random_graph(30, 100, 2)
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = torch.randint(0, 3, (30,), generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    model = build_block_model("sage", 4, 3, 5, 0.0, 2).double()
    alone = copy.deepcopy(model)
    seeds = torch.arange(rank * 6, rank * 6 + 6)          # each rank its own batch
    torch.manual_seed(10 + rank)
    batch = next(iter(NeighborLoader(graph, [3, 3], batch_size=6, input_nodes=seeds, x=x, y=y, prefetch=0)))
    ddp = DistributedDataParallel(model)          # held: its reducer's hooks average in backward
    F.cross_entropy(ddp(batch.x, batch.blocks), batch.y).backward()
    F.cross_entropy(alone(batch.x, batch.blocks), batch.y).backward()
    flat = lambda m: torch.cat([p.grad.flatten() for p in m.parameters()])   # noqa: E731
    every = [torch.empty_like(flat(alone)) for _ in range(WORLD)]
    dist.all_gather(every, flat(alone))
    # the explicit average a captured step uses instead of DDP's hooks, on a model that
    # also holds a float32 parameter only rank 0's loss reaches
    explicit = copy.deepcopy(alone)
    explicit.zero_grad()
    explicit.reached_on_rank_0 = torch.nn.Parameter(torch.ones(3))
    loss = F.cross_entropy(explicit(batch.x, batch.blocks), batch.y)
    (loss + 2 * explicit.reached_on_rank_0.sum() if rank == 0 else loss).backward()
    average_gradients(explicit.parameters())
    # DDP inside a step StepCapture is asked to capture: refused, with the way out named
    refused = StepCapture(lambda: F.cross_entropy(ddp(batch.x, batch.blocks), batch.y), modules=[ddp], warmup=1,
                          _graph_factory=lambda: None)
    refused()
    # differing starting weights: rank 0's reach every rank
    torch.manual_seed(100 + rank)
    differing = build_block_model("sage", 4, 3, 5, 0.0, 2)
    broadcast_parameters(differing)
    shared = [p.grad.flatten() for name, p in explicit.named_parameters() if name != "reached_on_rank_0"]
    return {"ddp": flat(model), "per_rank": every, "explicit": torch.cat(shared),
            "unreached": explicit.reached_on_rank_0.grad, "refused": refused.reason,
            "broadcast": torch.cat([p.detach().flatten() for p in differing.parameters()])}


def inference(rank: int) -> dict[str, Any]:
    """Layer-wise inference of this rank's vertex range against the whole-graph forward."""
    graph = random_graph(25, 90, 6)
    x = torch.randn(25, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    torch.manual_seed(1)
    model = build_block_model("sage", 4, 3, 5, 0.5, 3).double().eval()
    bounds = row_ranges(25, WORLD)
    block = range_block(graph, bounds[rank], bounds[rank + 1])
    store = PartitionedFeatures.from_full(x, rank, WORLD, torch.device("cpu"))
    with torch.no_grad():
        whole = model(x, graph)
    mine = slice(bounds[rank], bounds[rank + 1])
    partitioned = layerwise_logits(model, block, store.gather, bounds, rank)
    y = torch.randint(0, 3, (25,), generator=torch.Generator().manual_seed(8))
    masks = tuple(torch.rand(25, generator=torch.Generator().manual_seed(9 + i)) < 0.5 for i in range(3))
    return {"full": whole[mine], "replicated": layerwise_logits(model, block, lambda ids: x[ids], bounds, rank),
            "partitioned": partitioned,
            "summed": summed_accuracies(partitioned, y[mine], tuple(m[mine] for m in masks), masks[1][mine])[:2],
            "whole": ([accuracy(whole, y, m) for m in masks], F.cross_entropy(whole[masks[1]], y[masks[1]]).item())}


def training(rank: int) -> dict[str, Any]:
    spec = get_model("sage")
    out = {}
    for features, epochs in (("replicated", TRAIN_EPOCHS), ("partitioned", 3)):
        config = training_config(25, features, epochs)
        result = train_distributed_minibatch_run(config, spec, prepare_data(config, spec), 0, log_epochs=False)
        out[features] = {"history": result.history, "state": result.state_dict, "best_epoch": result.best_epoch}
    return out


def small_split(train: list[int], val: list[int]) -> PreparedData:
    """A 12-vertex data set with the given training and validation vertices (the rest test)."""
    x = torch.randn(12, 4, generator=torch.Generator().manual_seed(11))
    y = torch.randint(0, 3, (12,), generator=torch.Generator().manual_seed(12))
    masks = [torch.zeros(12, dtype=torch.bool) for _ in range(3)]
    masks[0][train], masks[1][val] = True, True
    masks[2] = ~(masks[0] | masks[1])
    return PreparedData("small", random_graph(12, 30, 3), x, y, tuple(masks), 4, 3)


def fewer_seeds_than_ranks(rank: int) -> str | None:
    """The refusal of a run with one training vertex for two ranks (None: it ran)."""
    try:
        train_distributed_minibatch_run(training_config(4, epochs=2), get_model("sage"), small_split([3], [4, 5]), 0,
                                        log_epochs=False)
    except DistributedError as error:
        return str(error)
    return None


def without_validation(rank: int) -> float:
    """The best validation accuracy a run reports when no epoch can be best (no
    validation vertex: its loss is NaN, and the run stops as diverged)."""
    return train_distributed_minibatch_run(training_config(4, epochs=2), get_model("sage"),
                                           small_split(list(range(8)), []), 0, log_epochs=False).best_val_acc


def run_rank(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    init_process_group("cpu")
    results = {"sampler": sampler_epochs(rank), "features": feature_fetch(rank), "grads": ddp_gradients(rank),
               "inference": inference(rank), "training": training(rank), "fewer_seeds": fewer_seeds_than_ranks(rank),
               "without_validation": without_validation(rank)}
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    leave_process_group()


def parallel_work(rank: int, out_dir: str) -> None:
    """A rank that runs torch's intra-op threads (a reduction over 4M values) and records
    the environment and thread count it started with, and prints a line."""
    total = torch.ones(1 << 22).exp().sum().item()
    print(f"rank {rank} summed {total:.0f}", flush=True)
    record = {"threads": torch.get_num_threads(), "probe": os.environ.get("GNNFUSE_LAUNCH_PROBE")}
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(record))


def fail_before_a_collective(rank: int, port: int) -> None:
    """Rank 1 raises while rank 0 waits for it in an all-reduce; both leave the process
    group in ``finally``, as the test workers do."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        if rank == 1:
            raise RuntimeError("rank 1 failed before its all-reduce")
        dist.all_reduce(torch.zeros(3))
    finally:
        leave_process_group()


def leave_while_the_peer_waits(rank: int, port: int) -> None:
    """Rank 0 is done and leaves while rank 1 waits in one more all-reduce (ranks that
    disagree on the number of collectives)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    if rank == 1:
        dist.all_reduce(torch.zeros(3))
    leave_process_group(timeout_s=2.0)
