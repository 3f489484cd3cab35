"""Data-parallel mini-batch training on 2 CPU processes (gloo), against 1 process.

One 2-rank job (`distributed_worker.run_rank`, started by `start_ranks` from its fork
server) records what every test here checks. The launch path itself
(``gnnfuse train --cpu-ranks 2``) runs once, end to end.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import distributed_worker as worker
from gnnfuse.cli import main
from gnnfuse.distributed import DistributedError, PartitionedFeatures, init_process_group, launch_or_join, row_ranges
from gnnfuse.distributed import dispatch, minibatch, process_group
from gnnfuse.distributed.launch import free_port, start_ranks
from gnnfuse.distributed.fullgraph import train_full_graph_run
from gnnfuse.distributed.minibatch import train_distributed_minibatch_run
from gnnfuse.loader import STAGES, NeighborLoader
from gnnfuse.nn.block_models import build_block_model
from gnnfuse.nn.models import get_model
from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning
from gnnfuse.training import load_checkpoint, make_config, prepare_data
from gnnfuse.training.minibatch import train_minibatch_run


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Each rank's recorded results of one 2-process gloo job."""
    out = tmp_path_factory.mktemp("ranks")
    start_ranks(worker.run_rank, (free_port(), str(out)), worker.WORLD, "cpu")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(worker.WORLD)]


def test_sampler_shares_are_disjoint_equal_and_reshuffled_every_epoch(ranks):
    seeds = set(worker.SAMPLER_SEEDS.tolist())
    assert ranks[0]["sampler"]["len"] == ranks[1]["sampler"]["len"] == 3      # 11 seeds in batches of 4
    orders = []
    for epoch in range(2):
        shares = [[s for batch in r["sampler"]["epochs"][epoch] for s in batch] for r in ranks]
        assert [len(b) for b in ranks[0]["sampler"]["epochs"][epoch]] == [4, 4, 3]
        assert len(shares[0]) == len(shares[1]) == 11                    # equal steps on every rank
        assert not set(shares[0]) & set(shares[1])                       # disjoint
        assert len(seeds - set(shares[0]) - set(shares[1])) == 1         # all but 23 % 2 seeds covered
        orders.append(shares)
    assert orders[0] != orders[1]                                        # a new shuffle per epoch


def test_fewer_training_vertices_than_ranks_is_refused(ranks):
    """1 seed for 2 ranks: drop_last left every rank an empty share, and the run reported
    a training loss of 0.0 each epoch for weights no step moved."""
    for result in ranks:
        assert "1 training vertices for 2 data-parallel ranks" in result["fewer_seeds"]


def test_a_run_with_no_best_epoch_reports_nan_validation_accuracy_as_one_process_does(ranks):
    """Both stop at epoch 1 (NaN validation loss); the ranks reported -1.0, the sentinel
    that starts EarlyStopping's comparison, as the best validation accuracy."""
    config = worker.training_config(4, epochs=2)
    with pytest.warns(RuntimeWarning, match="diverged"):
        alone = train_minibatch_run(config, get_model("sage"), worker.small_split(list(range(8)), []), 0,
                                    log_epochs=False)
    assert alone.best_val_acc != alone.best_val_acc
    assert all(r["without_validation"] != r["without_validation"] for r in ranks)     # NaN, not -1.0


def test_partitioned_fetch_equals_the_replicated_gather_and_counts_its_bytes(ranks):
    for rank, result in enumerate(ranks):
        table = result["features"]["table"]
        for ids, rows in zip(worker.FEATURE_IDS[rank], result["features"]["rows"]):
            assert torch.equal(rows, table[torch.tensor(ids, dtype=torch.int64)])
    # By hand: rank 0 owns rows 0..4, rank 1 rows 5..10; rows are 3 float32 = 12 bytes.
    # Rank 0 asks [10, 0, 7, 3, 4] (10 and 7 from rank 1), then [2] (its own); rank 1
    # asks [1, 9, 5, 6] (1 from rank 0), then nothing. Each gather also swaps one count and
    # the table's fingerprint (int64 each).
    counts = 2 * 16
    assert ranks[0]["features"]["bytes"] == {
        "sent": counts + 2 * 8 + 1 * 12, "received": counts + 1 * 8 + 2 * 12,
        "sent_counts": counts, "sent_ids": 2 * 8, "sent_rows": 1 * 12,
        "received_counts": counts, "received_ids": 1 * 8, "received_rows": 2 * 12}
    assert ranks[1]["features"]["bytes"] == {
        "sent": counts + 1 * 8 + 2 * 12, "received": counts + 2 * 8 + 1 * 12,
        "sent_counts": counts, "sent_ids": 1 * 8, "sent_rows": 2 * 12,
        "received_counts": counts, "received_ids": 2 * 8, "received_rows": 1 * 12}


def test_partitioned_fetch_between_tables_of_other_row_shapes_or_dtypes_is_refused_on_every_rank(ranks):
    """Rank 1 held 2 float64 values per row where rank 0 held 4 float32: rows of the same
    16 bytes, so the all-to-all moved them without a word and rank 0 read row 10 from rank 1
    as [0.0, 3.0625, 0.0, 3.0703] instead of [40, 41, 42, 43] (bytes of another size
    aborted the process inside gloo: "Received data size doesn't match expected size")."""
    for result in ranks:
        said = result["features"]["mismatched"]
        assert isinstance(said, str), said
        assert "rank 1" in said and "[2] torch.float64" in said and "[4] torch.float32" in said, said


@pytest.mark.parametrize("ids", [[3, 11], [-1, 2]])
def test_partitioned_fetch_refuses_ids_outside_the_table_before_any_collective(ids):
    """An id past the last row failed inside the all-to-all ("Number of tensor splits not
    equal to group size"), a negative one in bincount; refused here without a process group."""
    table = torch.arange(11 * 3, dtype=torch.float32).reshape(11, 3)
    store = PartitionedFeatures(table[:5], row_ranges(11, 2), 0)
    with pytest.raises(ValueError, match=r"row ids must lie in \[0, 11\)"):
        store.gather(torch.tensor(ids))


def test_row_ranges_split_evenly_and_a_rank_holding_other_rows_is_refused():
    """11 rows on 4 ranks: sizes 2, 3, 3, 3 (differing by at most one, not 2, 2, 2, 5);
    a rank handed 4 rows where its range holds 2 is refused before any collective."""
    assert row_ranges(11, 4) == [0, 2, 5, 8, 11]
    assert row_ranges(3, 4) == [0, 0, 1, 2, 3]
    table = torch.arange(11 * 3, dtype=torch.float32).reshape(11, 3)
    with pytest.raises(ValueError, match="rank 0 owns rows 0..1 but holds 4 rows"):
        PartitionedFeatures(table[:4], row_ranges(11, 4), 0)


@pytest.mark.parametrize("ids", [[True, False, True, False], [2.0, 0.0]], ids=["mask", "float"])
def test_partitioned_fetch_refuses_ids_that_are_not_integers(ids):
    """A boolean mask went in as ids 1 and 0 (``ids.to(int64)``): gather(mask) returned
    rows [1, 0, 1, 0] of the table where ``table[mask]`` selects rows [0, 2], silently."""
    table = torch.arange(11 * 3, dtype=torch.float32).reshape(11, 3)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="integer row ids"):
            PartitionedFeatures(table, row_ranges(11, 1), 0).gather(torch.tensor(ids))
    finally:
        dist.destroy_process_group()


def test_partitioned_fetch_from_a_learnable_table_is_refused_unless_gradients_are_off():
    """gather moves rows by collectives outside autograd: rows of a table that requires
    grad (an embedding trained across ranks) came back with requires_grad False, so the
    table never trained and nothing said so, where ``table[ids]`` on one process trains
    it. Refused before any collective; under no_grad (inference) it reads as before."""
    table = torch.arange(11 * 3, dtype=torch.float32).reshape(11, 3)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        store = PartitionedFeatures(table.clone().requires_grad_(), row_ranges(11, 1), 0)
        with pytest.raises(ValueError, match="requires grad"):
            store.gather(torch.tensor([4, 0]))
        with torch.no_grad():
            assert torch.equal(store.gather(torch.tensor([4, 0])), table[[4, 0]])
    finally:
        dist.destroy_process_group()


def one_rank_steps(reduce_gradients) -> dict[str, torch.Tensor]:
    """A step of SGD with weight decay on a model with a frozen weight and a layer the loss
    does not read, on one process (``reduce_gradients`` None) or with the gradients
    reduced over a process group of one rank: the weights after it, and which got a gradient."""
    torch.manual_seed(0)
    used, unused, frozen = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    frozen.requires_grad_(False)
    model = torch.nn.ModuleDict({"used": used, "unused": unused, "frozen": frozen})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.1)
    (used(torch.ones(4, 3)) + frozen(torch.ones(4, 3))).sum().backward()
    if reduce_gradients is not None:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            reduce_gradients(model.parameters())
        finally:
            dist.destroy_process_group()
    got = {name: p.grad is not None for name, p in model.named_parameters()}
    optimizer.step()
    return {**{name: p.detach().clone() for name, p in model.named_parameters()}, "got": got}


def test_a_frozen_weight_gets_no_gradient_from_averaging_and_stays_put_as_on_one_process():
    """average_gradients fills missing gradients with zeros for the parameters that
    require one; a frozen weight given a zero gradient would be moved by weight decay."""
    from gnnfuse.distributed.gradients import average_gradients
    alone, averaged = one_rank_steps(None), one_rank_steps(average_gradients)
    assert not averaged["got"]["frozen.weight"] and not averaged["got"]["frozen.bias"]
    for name in ("frozen.weight", "frozen.bias", "used.weight"):
        assert torch.equal(averaged[name], alone[name]), name


def test_summed_gradients_leave_none_where_no_rank_reached_a_parameter_as_on_one_process():
    """all_reduce_gradients keeps ``grad = None`` for a layer no rank's loss read: a zero
    gradient there would let weight decay move it, which one process does not."""
    from gnnfuse.distributed.gradients import all_reduce_gradients
    alone, summed = one_rank_steps(None), one_rank_steps(all_reduce_gradients)
    assert summed["got"] == alone["got"] and not summed["got"]["unused.weight"]
    for name in ("unused.weight", "unused.bias", "used.weight"):
        assert torch.equal(summed[name], alone[name]), name


def test_ddp_gradients_are_the_average_of_each_ranks_own(ranks):
    own = ranks[0]["grads"]["per_rank"]
    assert not torch.allclose(own[0], own[1])                # the ranks' batches differ
    for result in ranks:
        torch.testing.assert_close(result["grads"]["ddp"], (own[0] + own[1]) / 2, rtol=1e-12, atol=1e-14)


def test_explicit_gradient_averaging_equals_ddps_and_includes_parameters_a_rank_did_not_reach(ranks):
    own = ranks[0]["grads"]["per_rank"]
    for result in ranks:
        torch.testing.assert_close(result["grads"]["explicit"], (own[0] + own[1]) / 2, rtol=1e-12, atol=1e-14)
        # rank 0's loss gave the parameter gradient 2, rank 1's none (zeros take part)
        torch.testing.assert_close(result["grads"]["unreached"], torch.ones(3))
        assert result["grads"]["unreached"].dtype == torch.float32


def test_a_step_through_ddp_is_not_captured_and_the_reason_names_the_replacement(ranks):
    for result in ranks:
        reason = result["grads"]["refused"]
        assert "DistributedDataParallel" in reason and "average_gradients" in reason


def test_broadcast_parameters_gives_every_rank_rank_0s_weights(ranks):
    torch.testing.assert_close(ranks[1]["grads"]["broadcast"], ranks[0]["grads"]["broadcast"], rtol=0, atol=0)
    torch.manual_seed(100)
    mine = torch.cat([p.detach().flatten() for p in build_block_model("sage", 4, 3, 5, 0.0, 2).parameters()])
    torch.testing.assert_close(ranks[0]["grads"]["broadcast"], mine, rtol=0, atol=0)


def test_layerwise_inference_across_ranks_equals_the_whole_graph_forward(ranks):
    for result in ranks:
        inference = result["inference"]
        torch.testing.assert_close(inference["replicated"], inference["full"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(inference["partitioned"], inference["full"], rtol=1e-12, atol=1e-12)
        (accuracies, val_loss), (expected, expected_loss) = inference["summed"], inference["whole"]
        assert accuracies == pytest.approx(expected, rel=1e-6)       # training.accuracy counts in float32
        assert val_loss == pytest.approx(expected_loss, rel=1e-12)


def test_partitioned_features_train_exactly_as_replicated_ones(ranks):
    for result in ranks:
        partitioned, replicated = result["training"]["partitioned"], result["training"]["replicated"]
        for key in ("loss", "val_loss", "train_acc", "val_acc", "test_acc"):
            assert partitioned["history"][key] == replicated["history"][key][:3], key


def test_two_processes_train_like_one_by_loss_curve_statistics(ranks):
    """2 ranks x 25 seeds per batch against 1 process x 50 (the same effective batch and
    steps per epoch), on the same data and split.

    Sampled batches and dropout differ, so curves are compared by statistics: the final
    loss (mean training loss over the last 4 of 12 epochs) of the 2-process run must lie
    within 4 standard deviations (at least 0.05) of the final losses of 1-process runs
    from seeds 0..4 -- their spread measures what seed noise alone does (three seeds
    happened to agree within 0.01 where eight spread 0.04, which failed a 2-sigma
    2-process run once the loader's draws changed) -- and both must
    have fallen by at least 0.2 from the first epoch. Every rank reports the same curve
    (the loss is summed over ranks), and training ran the same epochs on each."""
    two = ranks[0]["training"]["replicated"]["history"]
    for key in ("loss", "val_loss", "train_acc", "val_acc", "test_acc"):      # not the per-rank timings
        assert ranks[1]["training"]["replicated"]["history"][key] == two[key], key
    spec = get_model("sage")
    config = worker.training_config(50)
    data = prepare_data(config, spec)
    final = lambda losses: statistics.fmean(losses[-4:])       # noqa: E731
    one = [train_minibatch_run(config, spec, data, seed, log_epochs=False).history["loss"] for seed in range(5)]
    finals = [final(losses) for losses in one]
    tolerance = max(4 * statistics.stdev(finals), 0.05)
    assert abs(final(two["loss"]) - statistics.fmean(finals)) <= tolerance, (final(two["loss"]), finals)
    for losses in one + [two["loss"]]:
        assert len(losses) == worker.TRAIN_EPOCHS and losses[0] - final(losses) >= 0.2, losses


def test_cpu_ranks_train_end_to_end_from_the_command_line(tmp_path, capfd):
    path = tmp_path / "ddp.pt"
    status = main(["train", "--cpu-ranks", "2", "--model", "sage", "--fanout", "3,3", "--batch-size", "25",
                   "--epochs", "2", "--hidden", "8", "--save", str(path)])
    out = capfd.readouterr().out
    assert status == 0
    assert out.count("data-parallel over 2 ranks (gloo), features replicated") == 1     # rank 0 only
    assert out.count("epoch    2 |") == 1 and out.count("saved best-val weights") == 1
    model, checkpoint = load_checkpoint(path)
    assert len(checkpoint["runs"]) == 1 and tuple(checkpoint["config"]["fanout"]) == (3, 3)


def test_cpu_ranks_train_a_partitioned_full_graph_from_the_command_line_and_say_so(tmp_path, capfd):
    """Without --fanout the ranks partition the graph; the banner said "data-parallel over
    2 ranks (gloo), features replicated", neither of which such a run does."""
    path = tmp_path / "full.pt"
    status = main(["train", "--cpu-ranks", "2", "--model", "gcn", "--dataset", "synthetic", "--epochs", "2",
                   "--hidden", "8", "--save", str(path)])
    out = capfd.readouterr().out
    assert status == 0
    assert out.count("full graph partitioned over 2 ranks (gloo)") == 1 and "data-parallel" not in out
    assert out.count("epoch    2 |") == 1 and out.count("saved best-val weights") == 1
    model, checkpoint = load_checkpoint(path)
    assert len(checkpoint["runs"]) == 1 and checkpoint["config"]["fanout"] is None


def test_the_distributed_benchmark_runs_1_and_2_cpu_ranks_in_one_invocation(import_script, tmp_path):
    bench = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_distributed")
    path = tmp_path / "distributed_cpu.json"
    bench.main(["--device", "cpu", "--dataset", "synthetic", "--fanout", "3,3", "--batch-size", "16", "--hidden", "8",
                "--max-batches", "2", "--warmup", "1", "--features", "partitioned", "--json", str(path)])
    results = json.loads(path.read_text())
    assert set(results["worlds"]) == {"1", "2"} and results["speedup_vs_1"]["2"] > 0
    for world, cell in results["worlds"].items():
        assert [r["rank"] for r in cell["ranks"]] == list(range(int(world)))
        for rank in cell["ranks"]:
            assert rank["batches"] == 2 and set(rank["stages_s"]) == set(STAGES) and rank["stages_s"]["compute"] > 0
            spread = rank["step_ms"]
            assert 0 < spread["median"] <= spread["p90"] <= spread["max"]
            assert (rank["feature_bytes"] is None) == (world == "1")
            assert world == "1" or rank["feature_bytes"]["received_rows"] > 0
    table = path.with_suffix(".md").read_text()
    assert "| 2 | 1 | 2 |" in table and "| 2 | x" in table and "x1.8 " in table
    plot = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "plot_scaling")
    figure = plot.main(["--replicated", str(path), "--partitioned", str(tmp_path / "none.json"),
                        "--repeat", str(path), "--out", str(tmp_path / "scaling.png")])
    assert figure.stat().st_size > 1000


def test_the_benchmarks_replayable_steps_average_gradients_so_ranks_end_with_equal_weights(import_script, tmp_path):
    """``--cuda-graph`` on CPU ranks: the steps run eagerly (the reason recorded), through
    the same averaging step a GPU would replay, and both ranks end with rank 0's weights."""
    bench = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_distributed")
    path = tmp_path / "distributed_cpu.json"
    bench.main(["--device", "cpu", "--dataset", "synthetic", "--fanout", "3,3", "--batch-size", "16", "--hidden", "8",
                "--max-batches", "3", "--warmup", "2", "--world-sizes", "2", "--cuda-graph", "--json", str(path)])
    ranks = json.loads(path.read_text())["worlds"]["2"]["ranks"]
    for rank in ranks:
        assert rank["weights_off_rank_0"] == 0.0
        assert rank["cuda_graph"]["replayed"] == 0 and rank["cuda_graph"]["eager"] == 5
        assert "CUDA graphs need a CUDA device" in rank["cuda_graph"]["status"]
    assert "0 / 5 (eager: CUDA graphs need" in path.with_suffix(".md").read_text()


def test_the_benchmark_times_the_ranks_loaders_alone_with_several_threads(import_script, tmp_path):
    """``--loader-alone``: each rank iterates its loader (here with two prefetch threads)
    and never trains, so whether N ranks' loaders slow each other can be read apart from
    the step; the table says so."""
    bench = import_script(Path(__file__).resolve().parent.parent / "benchmarks", "bench_distributed")
    path = tmp_path / "distributed_cpu.json"
    bench.main(["--device", "cpu", "--dataset", "synthetic", "--fanout", "3,3", "--batch-size", "16", "--hidden", "8",
                "--max-batches", "3", "--warmup", "1", "--world-sizes", "1", "--loader-alone",
                "--prefetch-threads", "2", "--json", str(path)])
    results = json.loads(path.read_text())
    assert results["config"]["prefetch_threads"] == 2
    rank, = results["worlds"]["1"]["ranks"]
    assert rank["batches"] == 3 and rank["stages_s"]["sample"] > 0 and "cuda_graph" not in rank
    assert rank["stages_s"]["compute"] == 0 and rank["busy_s"] == 0 and rank["step_ms"] == {}     # no step ran
    assert "2 loader threads per rank, the loaders alone (no training step)" in path.with_suffix(".md").read_text()


def test_several_ranks_run_data_parallel_mini_batches_with_a_fanout_else_the_partitioned_full_graph(monkeypatch):
    config = worker.training_config(25)
    assert dispatch.train_run_function(config) is None                  # one process: the plain loops
    monkeypatch.setattr(dispatch, "world_size", lambda: 2)
    assert dispatch.train_run_function(config) is train_distributed_minibatch_run
    full_graph = make_config("gcn", "synthetic")
    assert dispatch.train_run_function(full_graph) is train_full_graph_run


# --- refusals ----------------------------------------------------------------------------
def test_gpu_ranks_without_gpus_or_nccl_are_refused_naming_what_is_missing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DistributedError, match="sees no GPU"):
        launch_or_join(2, None, "cpu", main, [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(DistributedError, match=r"2 GPU ranks per machine asked for, but only 1 GPU\(s\) are "
                                               r"visible \(CUDA_VISIBLE_DEVICES=3\)"):
        launch_or_join(2, None, "cpu", main, [])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(process_group.dist, "is_nccl_available", lambda: False)
    with pytest.raises(DistributedError, match="through NCCL, which torch .* was built without"):
        launch_or_join(2, None, "cpu", main, [])


def test_a_rank_without_torchrun_environment_names_the_missing_variables(monkeypatch):
    for name in process_group.LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DistributedError, match="needs WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT"):
        init_process_group("cpu")


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "2", "--cpu-ranks", "2"], "give one"),
    (["--cpu-ranks", "0"], "--cpu-ranks must be >= 1"),
    # an OverflowError traceback from inside torch.multiprocessing before
    (["--cpu-ranks", str(10**20)], "--cpu-ranks 10+ starts a process per rank, but this machine lets a user run"),
    (["--cpu-ranks", "2", "--device", "cuda"], "for GPU ranks use --gpus N"),
    (["--gpus", "2"], "sees no GPU|NCCL|visible"),
    (["--features", "partitioned"], "partitioned features .* need a fanout"),
    # one rank holds the whole table: partitioned would be a no-op the run reported as asked for
    (["--cpu-ranks", "1", "--model", "sage", "--fanout", "5,5", "--features", "partitioned"],
     "--features partitioned splits the feature table over several ranks"),
    # refused before the ranks start (each rank failed alike after loading the data)
    (["--cpu-ranks", "2", "--model", "sgc"], "model 'sgc' has no version of .* give a fanout"),
    (["--cpu-ranks", "2", "--model", "nope"], "unknown model 'nope'"),
    (["--cpu-ranks", "2", "--dataset", "nope"], "unknown data set 'nope'"),
    (["--cpu-ranks", "2", "--dataset", "wn18rr"], "wn18rr is not a node-classification data set"),
    (["--gpus", "2", "--model", "rgcn", "--dataset", "wn18rr"], "--gpus 2: link-prediction models"),
    (["--cpu-ranks", "2", "--model", "sage", "--fanout", "5,5", "--features", "partitioned", "--dkp"],
     "dynamic kernel placement .* with --features partitioned"),
])
def test_bad_launch_options_are_usage_errors(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--epochs", "1", *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_loader_sampler_excludes_shuffle():
    with pytest.raises(ValueError, match="sampler is mutually exclusive with shuffle"):
        NeighborLoader(worker.random_graph(5, 8, 0), [2], shuffle=True, sampler=range(5))


def _fails_on_rank_1(argv: list[str]) -> int:
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 broke")
    return 0


def test_a_failing_rank_ends_the_launch_with_status_1_naming_it(capsys):
    """A rank that raises stops the launch with a one-line error naming it (the launcher
    once caught an exception class torch does not have, and crashed instead)."""
    from gnnfuse.distributed.launch import run_ranks
    assert run_ranks(2, "cpu", _fails_on_rank_1, []) == 1
    assert "rank 1 of 2 failed" in capsys.readouterr().err


def _usage_error_on_every_rank(argv: list[str]) -> int:
    import argparse
    argparse.ArgumentParser(prog="gnnfuse train").error("cora is not in /nowhere")
    return 0


def test_a_usage_error_found_by_the_ranks_ends_the_launch_with_status_2_as_in_one_process(capfd):
    """Data files missing where the ranks look are found only there: the launch ended with
    status 1 and "rank 0 of 2 failed: process 0 terminated with exit code 2"."""
    from gnnfuse.distributed.launch import run_ranks
    assert run_ranks(2, "cpu", _usage_error_on_every_rank, []) == 2
    err = capfd.readouterr().err
    assert "error: cora is not in /nowhere" in err and "failed" not in err, err


def _fails_on_both_ranks(argv: list[str]) -> int:
    import torch.distributed as dist
    init_process_group("cpu")
    dist.barrier()
    raise RuntimeError(f"rank {dist.get_rank()} broke after the barrier")


def test_every_failing_rank_is_reported_not_only_the_first_seen(capsys):
    """The launch showed one rank's error: whichever exit it saw first, often a peer's
    "Connection closed by peer" that only followed from the real error, which was lost."""
    from gnnfuse.distributed.launch import run_ranks
    assert run_ranks(2, "cpu", _fails_on_both_ranks, []) == 1
    err = capsys.readouterr().err
    assert "rank 0 broke after the barrier" in err and "rank 1 broke after the barrier" in err, err


@pytest.mark.parametrize("env, requested, local_world, threads", [
    ({}, None, 2, 4), ({}, None, 16, 1), ({"OMP_NUM_THREADS": "3"}, None, 2, None), ({}, None, 1, None),
    ({"GNNFUSE_NUM_THREADS": "2"}, None, 2, None), ({"MKL_NUM_THREADS": "2"}, None, 2, None), ({}, 2, 2, None)])
def test_ranks_share_the_cores_unless_the_user_chose_a_count(monkeypatch, env, requested, local_world, threads):
    """Before: every rank kept one intra-op thread per core, so two GPU ranks on one
    machine ran twice the machine's spinning OpenMP workers against each other. A count
    the user chose (--threads, $GNNFUSE_NUM_THREADS) was replaced by the share, silently;
    the share is of the CPUs the process may use (8 here), not of os.cpu_count()."""
    from gnnfuse import threads as thread_settings
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "GNNFUSE_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(thread_settings, "_REQUESTED", [requested])
    monkeypatch.setattr(process_group, "usable_cpus", lambda: 8)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    process_group.share_cores(local_world)
    assert set_to == ([] if threads is None else [threads])


@pytest.mark.parametrize("mode, device, features, expected, warned", [
    ("off", "cuda", "replicated", False, None),
    ("auto", "cuda", "replicated", minibatch.CAPTURE_RANKS_ON_AUTO, None),
    ("on", "cuda", "replicated", True, None),
    ("on", "cpu", "replicated", False, "need GPU ranks"),
    ("on", "cuda", "partitioned", False, "all-to-all"),
    ("auto", "cpu", "replicated", False, None)])
def test_which_data_parallel_ranks_replay_their_steps(mode, device, features, expected, warned):
    config = worker.training_config(25, features)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert minibatch._captures(mode, torch.device(device), config, tell=True) is expected
        assert minibatch._captures(mode, torch.device(device), config, tell=False) is expected
    messages = [str(w.message) for w in caught if issubclass(w.category, CaptureFallbackWarning)]
    assert (messages == []) if warned is None else (len(messages) == 1 and warned in messages[0])


def test_leaving_the_process_group_releases_the_graphs_first():
    """A captured step's graph holds its NCCL work: two H200 ranks whose graphs were still
    alive hung leaving the group after their last epoch."""
    import torch.distributed as dist
    from gnnfuse.runtime.cuda_graph import StepCapture

    class Rerun:
        def capture(self, fn):
            return fn()

        def replay(self):
            pass
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    step = StepCapture(lambda x: x * 2, warmup=1, _graph_factory=Rerun)
    step(torch.ones(2))
    assert step.captured
    process_group.leave_process_group()
    assert not dist.is_initialized() and not step.captured and "released" in step.status


def test_summed_accuracies_of_nan_logits_are_nan_as_on_one_process():
    """A diverged epoch's accuracies, an argmax over NaN logits, were counted as
    predictions by the ranks (`gnnfuse train --cpu-ranks 2 --model sage --fanout 5,5
    --lr 1e20`: "train 0.2000 | val 0.1900 | test 0.2110"), where one process reports NaN."""
    import torch.distributed as dist
    from gnnfuse.distributed.inference import summed_accuracies
    from gnnfuse.training.loop import accuracy
    logits = torch.tensor([[0.0, 1.0], [2.0, 0.0], [float("nan"), 0.0], [1.0, 0.0]])
    y = torch.tensor([1, 0, 0, 1])
    masks = tuple(torch.tensor(m) for m in ([True, True, False, False], [False, False, True, False],
                                            [False, True, False, True]))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        accuracies, _, _ = summed_accuracies(logits, y, masks, masks[0])
    finally:
        dist.destroy_process_group()
    expected = [accuracy(logits, y, mask) for mask in masks]
    assert expected[0] == 1.0 and expected[1] != expected[1] and expected[2] == 0.5
    assert accuracies[0] == 1.0 and accuracies[1] != accuracies[1] and accuracies[2] == 0.5
