"""The ``gnnfuse`` command line: `info` output, `train` (runs, early stopping, saved weights,
curves, the model registry) and reference accuracy."""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_geometric.nn as pyg

from gnnfuse.cli import main
from gnnfuse.data import load_dataset
from gnnfuse.nn import models
from gnnfuse.training import ConfigError, EarlyStopping, load_checkpoint, make_config, train_runs
from gnnfuse.training.checkpoint import save_checkpoint
from gnnfuse.training.loop import BestEpoch, RunResult, TrainSummary, accuracy

FAST = ["--epochs", "3"]


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_info_prints_counts_and_degree_summary(shared_data, capsys):
    assert main(["info", "cora", "--root", str(shared_data)]) == 0
    out = capsys.readouterr().out
    for expected in ("2708", "10556", "1433", "classes     7", "train 140 / val 500 / test 1000",
                     "median", "p99", "isolated"):
        assert expected in out


def test_degree_summary_of_a_hand_counted_graph():
    """Vertex v (0..10) has v in-edges, all from vertex 0: in-degrees 0..10, whose
    linearly interpolated 90th, 99th and 99.9th percentiles are 9, 9.9 and 9.99. Vertex 0
    has no in-edge but 55 out-edges, so no vertex is isolated."""
    from gnnfuse.cli import degree_summary
    from gnnfuse.graph import Graph
    dst = torch.repeat_interleave(torch.arange(11), torch.arange(11))
    lines = degree_summary(Graph(torch.zeros_like(dst), dst, 11))
    assert lines == ["in-degree   min 0, median 5, mean 5.00, max 10", "percentiles p90 9, p99 9.9, p99.9 9.99",
                     "isolated    0 nodes (no in- or out-edges)"]


def test_train_logs_epochs_and_summary(capsys):
    assert main(["train", *FAST]) == 0
    out = capsys.readouterr().out
    assert out.count("epoch ") >= 3 and "peak" in out and " ms " in out
    assert out.strip().splitlines()[-1].startswith("summary: test acc")


def test_quiet_train_writes_the_runs_and_summary_without_a_line_per_epoch(capsys):
    """A 1000-epoch GAT over 10 seeds wrote 10,000 epoch lines and no option kept them out
    of a log; --quiet keeps the first line, one line per run and the summary."""
    assert main(["train", "--runs", "2", *FAST, "--quiet"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert not any(" epoch " in line or line.startswith("epoch ") for line in lines), lines
    assert [line[:9] for line in lines[1:]] == ["run 1/2 (", "run 2/2 (", "summary: "]


def test_runs_report_mean_and_std_over_seeds(capsys):
    assert main(["train", "--runs", "2", "--epochs", "5"]) == 0
    out = capsys.readouterr().out
    assert "run 1/2 (seed 0)" in out and "run 2/2 (seed 1)" in out
    summary = out.strip().splitlines()[-1]
    assert "±" in summary and "over 2 run(s)" in summary
    tests = [float(line.split("test acc at best val ")[1].split(",")[0])
             for line in out.splitlines() if "(seed " in line]
    mean = float(summary.split("test acc ")[1].split(" ±")[0])
    assert mean == pytest.approx(sum(tests) / 2, abs=1e-4)


def test_early_stopping_stops_when_patience_runs_out():
    # lr 0: validation never improves after epoch 1, so the run ends at exactly 1 + patience
    summary = train_runs(make_config("gcn", epochs=50, patience=4, lr=0.0))
    run = summary.runs[0]
    assert (run.best_epoch, run.epochs_run, len(run.history["val_acc"])) == (1, 5, 5)
    assert train_runs(make_config("gcn", epochs=6, patience=0, lr=0.0)).runs[0].epochs_run == 6


def test_patience_counts_epochs_where_neither_val_accuracy_nor_loss_improved():
    stopping = EarlyStopping(patience=2)
    trace = [(0.5, 1.0), (0.6, 0.9), (0.6, 0.8), (0.55, 0.7), (0.6, 0.85), (0.6, 0.82), (0.58, 0.71)]
    best = [stopping.step(epoch, *values) for epoch, values in enumerate(trace, start=1)]
    # epoch 3 ties on accuracy with a lower loss (new best); 4 only lowers the loss, which
    # still counts as progress; 5 and 6 improve neither, so the run stops after 6
    assert best == [True, True, True, False, False, False, False]
    assert (stopping.best_epoch, stopping.best_val_acc, stopping.last_progress) == (3, 0.6, 4)
    assert [EarlyStopping(2).step(1, 0.5, 1.0), EarlyStopping(None).should_stop] == [True, False]
    stopping = EarlyStopping(patience=2)
    for epoch, values in enumerate(trace[:6], start=1):
        stopping.step(epoch, *values)
    assert stopping.should_stop and stopping.epoch == 6



def test_a_run_diverged_from_its_first_epoch_reports_nan_not_the_starting_minus_one():
    """No epoch was ever best: the run's validation accuracy is NaN (``-1``, the value
    the comparison starts from, had passed the suite as a result)."""
    stopping = EarlyStopping(patience=None)
    stopping.diverge(1)
    assert math.isnan(stopping.reported_val_acc)
    stopping = EarlyStopping(patience=None)
    stopping.step(1, 0.25, 1.0)
    assert stopping.reported_val_acc == 0.25

def test_a_diverged_run_stops_and_never_reports_a_nan_models_accuracy():
    """An epoch whose loss is not finite: its accuracies are argmax over NaN logits
    (class 0 everywhere), which once became the run's best epoch and result."""
    stopping = EarlyStopping(patience=None)
    history = {"loss": [], "val_loss": [], "train_acc": [], "val_acc": [], "test_acc": []}
    best = BestEpoch(history, stopping)
    model = torch.nn.Linear(2, 2)
    best.record(1, (1.0, 0.9, 0.4, 0.5, 0.45), model, 0.5, 0.9, 0.45)
    with pytest.warns(RuntimeWarning, match="diverged at epoch 2.*epoch 1"):
        best.record(2, (float("nan"), float("nan"), 0.2, 0.9, 0.9), model, 0.9, float("nan"), 0.9)
    assert stopping.should_stop and (stopping.best_epoch, best.test_acc) == (1, 0.45)
    with pytest.raises(SystemExit):      # an infinite learning rate is a usage error
        main(["train", "--dataset", "synthetic", "--epochs", "1", "--lr", "inf"])


def test_accuracy_takes_an_index_mask_as_pyg_users_pass_it():
    """`accuracy` asked `mask.any()` whether rows were selected: for the index mask [0]
    (vertex 0 only) that is False, so a correct prediction came out NaN; [0, 2] counted."""
    logits, y = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), torch.tensor([0, 0, 1])
    assert accuracy(logits, y, torch.tensor([0])) == 1.0
    assert accuracy(logits, y, torch.tensor([0, 2])) == 0.5
    assert math.isnan(accuracy(logits, y, torch.tensor([], dtype=torch.long)))
    assert math.isnan(accuracy(logits, y, torch.zeros(3, dtype=torch.bool)))


def test_nan_logits_have_no_accuracy_and_a_diverged_run_makes_the_summary_nan(capsys):
    """An argmax over NaN logits is class 0 (or the NaN's): the epoch line and curves of a
    diverged run showed it as an accuracy. A run with no finite epoch (NaN results) made
    the summary's statistics.stdev raise after every run had trained."""
    y, mask = torch.tensor([0, 0, 1]), torch.tensor([True, True, False])
    assert accuracy(torch.tensor([[1.0, 0.0], [2.0, 1.0], [0.0, 1.0]]), y, mask) == 1.0
    assert math.isnan(accuracy(torch.tensor([[float("nan"), 0.0], [2.0, 1.0], [0.0, 1.0]]), y, mask))
    config = make_config("gcn", epochs=1, runs=2)
    runs = [RunResult(seed=seed, best_epoch=0 if seed else 1, best_val_acc=float("nan") if seed else 0.5,
                      test_acc=float("nan") if seed else 0.4, epochs_run=1, seconds=0.0, state_dict={}, history={})
            for seed in range(2)]
    assert all(math.isnan(v) for v in TrainSummary(config, "synthetic", 4, 2, runs).mean_std("test_acc"))
    assert TrainSummary(config, "synthetic", 4, 2, runs[:1]).mean_std("test_acc") == (0.4, 0.0)
    assert main(["train", "--model", "gat", "--epochs", "3", "--lr", "1e12", "--runs", "2", "-q"]) == 0
    assert "summary: test acc nan ± nan over 2 run(s)" in capsys.readouterr().out


def test_test_accuracy_is_taken_at_the_best_validation_epoch():
    run = train_runs(make_config("gcn", epochs=30)).runs[0]
    best = max(range(run.epochs_run), key=lambda i: (run.history["val_acc"][i], -run.history["val_loss"][i]))
    assert run.best_epoch == best + 1 and run.best_val_acc == run.history["val_acc"][best]
    assert run.test_acc == run.history["test_acc"][best]


def test_save_writes_loadable_best_val_weights(tmp_path, capsys):
    path = tmp_path / "weights.pt"
    assert main(["train", "--model", "sage", "--runs", "2", "--epochs", "4", "--hidden", "12",
                 "--save", str(path)]) == 0
    model, checkpoint = load_checkpoint(path, run=1)
    assert checkpoint["config"]["model"] == "sage" and checkpoint["config"]["hidden"] == 12
    assert [r["seed"] for r in checkpoint["runs"]] == [0, 1]
    data = load_dataset("synthetic")
    logits = model(data.x, data.graph)
    test_acc = (logits[data.test_mask].argmax(1) == data.y[data.test_mask]).float().mean().item()
    assert test_acc == pytest.approx(checkpoint["runs"][1]["test_acc"], abs=1e-6)
    with pytest.raises(ValueError, match="run 2 does not exist"):
        load_checkpoint(path, run=2)
    # True (== 1) rebuilt run 1's model, 1.0 raised "list indices must be integers"
    for run in (True, 1.0):
        with pytest.raises(ValueError, match=re.escape(f"run must be the index of a run (0 to 1), got {run!r}")):
            load_checkpoint(path, run=run)


def test_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'gnnfuse[plot]')")
    path = tmp_path / "curves.png"
    assert main(["train", "--runs", "2", *FAST, "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_plot_that_fails_midway_keeps_the_existing_file_whole(tmp_path, monkeypatch, capsys):
    """The curves were drawn straight onto --plot's path: a write stopped halfway (Ctrl-C
    after the training, a full disk) left a truncated image where the previous one was,
    as ``bench --plot`` no longer does (`output_paths.write_atomically`)."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'gnnfuse[plot]')")
    from matplotlib.figure import Figure
    path = tmp_path / "curves.png"
    path.write_bytes(b"earlier curves")

    def stopped_savefig(self, target, **kwargs):
        Path(target).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Figure, "savefig", stopped_savefig)
    with pytest.raises(OSError, match="No space left"):
        main(["train", *FAST, "--quiet", "--plot", str(path)])
    assert path.read_bytes() == b"earlier curves" and [p.name for p in tmp_path.iterdir()] == ["curves.png"]


@pytest.mark.parametrize("argv, message", [
    (["--model", "gat2"], "unknown model 'gat2'; known: gcn, gat, sage, gcn-reference"),
    (["--runs", "0"], "runs must be >= 1"),
    (["--dropout", "1.0"], "dropout must be in [0, 1)"),
    (["--patience", "-1"], "patience must be >= 0"),
    (["--dataset", "wn18rr"], "not a node-classification data set"),
    (["--dataset", "nope"], "unknown data set 'nope'"),
    (["--dataset", "cora-npz", "--root", "/nonexistent-gnnfuse-root"], "data file(s) cora.npz not found"),
    (["--hidden", "0"], "hidden must be >= 1"),
    # trained on synthetic; split a data set without a split (cora-npz) and numpy's
    # default_rng raised ValueError: expected non-negative integer, a traceback
    (["--seed", "-1"], "seed must be >= 0"),
    # torch.manual_seed raised "ValueError: Overflow when unpacking long long", a traceback
    (["--seed", str(2**64)], "seed must be below 2**63"),
    (["--seed", str(2**63 - 1), "--runs", "2"], "got 9223372036854775808"),
    # one process has nothing to partition the features over: the option was accepted and ignored
    (["--model", "sage", "--fanout", "5", "--features", "partitioned"],
     "--features partitioned splits the feature table over several ranks"),
])
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *argv, *FAST])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: gnnfuse train" in err and message in err


def test_train_cuda_without_cuda_is_a_usage_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--device", "cuda", "--epochs", "1"])
    assert exit_info.value.code == 2
    assert "CUDA is not available" in capsys.readouterr().err


@pytest.mark.parametrize("name", models.model_names())
def test_every_registered_model_trains_on_synthetic(name):
    """A few epochs from the paper's recipe lower the training loss and are called as model(x, graph);
    sparse COO features (what train passes bag-of-words data) give the dense result."""
    summary = train_runs(make_config(name, epochs=8, dropout=0.0))
    losses = summary.runs[0].history["loss"]
    assert losses[-1] < losses[0] and summary.runs[0].test_acc > 0.3
    data = load_dataset("synthetic")
    model = models.build_model(name, data.num_features, data.num_classes).eval()
    out = model(data.x, data.graph)
    assert out.shape == (data.graph.num_nodes, data.num_classes)
    if models.get_model(name).sparse_input:
        assert torch.allclose(model(data.x.to_sparse(), data.graph), out, atol=1e-5)
    if models.get_model(name).task != "link":   # an edge_index as well ('gcn-reference' read graph.cached)
        assert torch.allclose(model(data.x, data.graph.edge_index), out, atol=1e-5)


def test_registry_builds_the_papers_architectures():
    gat = models.build_model("gat", 10, 3)
    assert (gat.conv1.heads, gat.conv1.out_channels, gat.conv2.heads, gat.conv2.concat) == (8, 8, 1, False)
    assert gat.dropout == 0.6 and models.get_model("gat").defaults.patience == 100
    gcn = models.build_model("gcn", 10, 3, hidden=5, dropout=0.1)
    assert (gcn.conv1.out_channels, gcn.dropout) == (5, 0.1)
    assert models.get_model("gcn").defaults == models.Hyperparameters(16, 0.01, 5e-4, 0.5, 200, None)
    assert models.get_model("sage").defaults.hidden == 64 and models.build_model("sage", 4, 2).conv1.aggr == "mean"
    with pytest.raises(ValueError, match="already registered"):
        models.register(models.get_model("gcn"))


def test_gcn_state_dict_is_pygs_layout():
    """The registry's GCN is built from PyG-compatible layers: a PyG conv's weights load into it."""
    model = models.build_model("gcn", 6, 3)
    model.conv1.load_state_dict(pyg.GCNConv(6, 16).state_dict())
    model.conv2.load_state_dict(pyg.GCNConv(16, 3).state_dict())


def test_appnp_and_sgc_train_with_their_paper_recipes():
    for name in ("appnp", "sgc"):
        summary = train_runs(make_config(name, epochs=5, dropout=0.0))
        assert summary.runs[0].history["loss"][-1] < summary.runs[0].history["loss"][0]
    with pytest.raises(ValueError, match="no hidden layer"):
        make_config("sgc", hidden=32)
    with pytest.raises(ValueError, match="dropout does not apply"):      # it was accepted and ignored
        make_config("sgc", dropout=0.5)


def test_gcn_learns_the_default_synthetic_data_set():
    assert train_runs(make_config("gcn", epochs=100)).runs[0].test_acc > 0.7


def test_gcn_reaches_published_accuracy_on_cora(shared_data):
    summary = train_runs(make_config("gcn", "cora", root=shared_data), log_epochs=False)
    assert summary.runs[0].test_acc >= 0.79


@pytest.mark.parametrize("argv, message", [
    (["info", "nosuch"], "unknown data set 'nosuch'"),
    (["info", "cora-npz", "--root", "/nonexistent-gnnfuse-root"],
     "data file(s) cora.npz not found together in one folder; looked in:\n"
     "  /nonexistent-gnnfuse-root/gnn-benchmark: no such folder"),
    (["explain", "--dataset", "citeseer-npz", "--root", "/nonexistent-gnnfuse-root"], "citeseer.npz"),
])
def test_unknown_or_missing_data_is_a_usage_error_not_a_traceback(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: gnnfuse {argv[0]}" in err and message in err and "Traceback" not in err


def test_no_progress_bar_redraws_when_stderr_is_not_a_terminal(capsys):
    """tqdm's `\\r` redraws filled logs (hundreds of KB per long run); off a terminal the
    per-epoch lines on stdout are the only progress report."""
    assert main(["train", "--epochs", "40", "--patience", "0"]) == 0
    captured = capsys.readouterr()
    assert sum(line.startswith("epoch ") for line in captured.out.splitlines()) == 40
    assert "\r" not in captured.err and len(captured.err) < 200, captured.err[:300]


def test_progress_bar_draws_on_a_terminal(monkeypatch, capsys):
    from gnnfuse import progress
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    for _ in progress.progress_bar(range(3), desc="steps"):
        pass
    assert "steps" in capsys.readouterr().err


@pytest.fixture
def restore_threads(monkeypatch):
    for name in ("GNNFUSE_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_thread_count_defaults_to_half_the_usable_cpus_and_yields_to_the_user(restore_threads, monkeypatch,
                                                                              capsys):
    from gnnfuse import threads
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)     # the 2-core machine of the report
    assert threads.configure_threads() == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(threads, "usable_cpus", lambda: 9)
    assert threads.default_num_threads() == 4
    assert threads.configure_threads(3) == 3 and torch.get_num_threads() == 3      # --threads
    monkeypatch.setenv("GNNFUSE_NUM_THREADS", "2")
    assert threads.configure_threads() == 2 and torch.get_num_threads() == 2
    monkeypatch.delenv("GNNFUSE_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")                   # torch honours it itself: left alone
    torch.set_num_threads(3)
    assert threads.configure_threads() is None and torch.get_num_threads() == 3

    assert main(["train", "--threads", "2", "--epochs", "1"]) == 0
    assert "on cpu (2 CPU thread(s))" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--threads", "0"])
    assert exit_info.value.code == 2 and "thread count (--threads) must be >= 1" in capsys.readouterr().err
    monkeypatch.setenv("GNNFUSE_NUM_THREADS", "0")      # the message said "the thread count" for this too
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--epochs", "1"])
    assert exit_info.value.code == 2 and "$GNNFUSE_NUM_THREADS must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("count", [100_000, 2**70])
def test_a_thread_count_past_any_machine_is_a_usage_error(count, restore_threads, monkeypatch, capsys):
    """--threads 100000 reached torch.set_num_threads: the OpenMP runtime, creating them
    at the first parallel op past the OS's thread limit, ended gnnfuse train with a
    segmentation fault (exit 139) or libgomp's "Thread creation failed" abort, after the
    first output line; --threads 2**70 was "error: Overflow when unpacking long long"."""
    def guarded(n: int) -> None:
        assert n < count, f"torch.set_num_threads({n}) was called"
    monkeypatch.setattr(torch, "set_num_threads", guarded)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--threads", str(count), "--epochs", "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "thread count (--threads) must be at most" in err and str(count) in err, err


def test_explain_says_why_its_edge_count_differs_from_info(capsys):
    assert main(["info", "synthetic"]) == 0
    edges = int(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("edges")).split()[1])
    assert main(["explain", "--model", "gcn"]) == 0
    out = capsys.readouterr().out
    looped = edges + 2000
    assert f"{edges:,} edges (as `gnnfuse info` counts them)" in out
    assert f"GCNConv adds a self loop to every node (add_self_loops=True, as in PyG), so the programs below " \
           f"run on {looped:,} edges" in out and f"E={looped:,} edges" in out


def test_plot_with_a_link_model_is_a_usage_error_before_training(tmp_path, capsys):
    """Its history has no node-classification curves: the plot failed after training."""
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--model", "rgcn", "--plot", str(tmp_path / "curves.png")])
    assert stopped.value.code == 2 and "link-prediction model" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["train", "--save"], ["train", "--plot"], ["bench", "--json"],
                                  ["explain", "--dot"], ["explain", "--graph"]], ids=lambda a: " ".join(a))
def test_an_output_in_a_missing_folder_is_a_usage_error_before_any_work(argv, tmp_path, capsys):
    """The write came after the training or timing, which a typo then cost in full."""
    target = tmp_path / "missing" / "out.file"
    with pytest.raises(SystemExit) as stopped:
        main([*argv, str(target)])
    assert stopped.value.code == 2 and "does not exist" in capsys.readouterr().err
    assert not target.parent.exists()


@pytest.mark.parametrize("argv", [["train", "--save"], ["bench", "--json"], ["explain", "--dot"]],
                         ids=lambda a: " ".join(a))
@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_an_output_where_no_file_can_be_written_is_a_usage_error_naming_why(argv, where, tmp_path, capsys):
    """A folder that is a file was said not to exist; one that cannot be written to
    (``/proc`` here, a read-only folder for a user) failed only at the write, after the work."""
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / "out.file" if where == "under a file" else Path("/proc/gnnfuse-out.file")
    with pytest.raises(SystemExit) as stopped:
        main([*argv, str(target)])
    why = "is a file, not a folder" if where == "under a file" else "no file can be written in /proc"
    assert stopped.value.code == 2 and why in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["train", "--save"], ["train", "--plot"], ["bench", "--json"],
                                  ["explain", "--dot"], ["explain", "--graph"]], ids=lambda a: " ".join(a))
def test_an_output_that_is_a_folder_is_a_usage_error_before_any_work(argv, tmp_path, capsys):
    """``--save DIR`` trained, then died in IsADirectoryError renaming ``DIR.partial``
    (written beside the folder) onto it: the run was lost."""
    with pytest.raises(SystemExit) as stopped:
        main([*argv, str(tmp_path)])
    assert stopped.value.code == 2 and "is a folder" in capsys.readouterr().err
    assert list(tmp_path.parent.glob(f"{tmp_path.name}.partial")) == []


@pytest.mark.parametrize("argv", [["train", *FAST], ["bench", "--frameworks", "gnnfuse", "--steps", "1"]],
                         ids=lambda a: a[0])
@pytest.mark.parametrize("name", ["curves.xyz", "curves"])
def test_a_plot_name_without_an_image_type_is_a_usage_error_before_any_work(argv, name, tmp_path, capsys):
    """``curves.xyz``: matplotlib's ValueError 'Format 'xyz' is not supported' after the
    whole run; ``curves``: saved as curves.png while the command said it wrote curves."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'gnnfuse[plot]')")
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--dataset", "synthetic", "--plot", str(tmp_path / name)])
    assert stopped.value.code == 2 and "must be one of" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["graph.xyz", "graph"])
def test_an_explain_drawing_without_an_image_type_is_a_usage_error_before_any_work(name, tmp_path, capsys):
    """``explain --graph graph.xyz`` drew through matplotlib (no Graphviz here) and ended
    in its ValueError traceback after the work; ``--graph graph`` wrote graph.png and
    printed 'wrote graph'."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'gnnfuse[plot]')")
    from gnnfuse.runtime.explain import graphviz_renders
    if graphviz_renders():
        pytest.skip("Graphviz draws here, and takes its own formats")
    with pytest.raises(SystemExit) as stopped:
        main(["explain", "--graph", str(tmp_path / name)])
    assert stopped.value.code == 2 and "--graph" in (err := capsys.readouterr().err) and "must be one of" in err
    assert list(tmp_path.iterdir()) == []


def test_two_outputs_on_one_file_are_a_usage_error_before_any_work(tmp_path, capsys):
    """``--save out --plot out`` saved the checkpoint, then drew the curves over it."""
    target = str(tmp_path / "out")
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--save", target, "--plot", target])
    assert stopped.value.code == 2 and "same file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_is_written_after_every_run(tmp_path):
    """It was written once all runs had finished: Ctrl-C in run 5 of 10 lost runs 1-4."""
    path = tmp_path / "runs.pt"
    seen = []

    def after(index, run):
        seen.append(len(torch.load(path, weights_only=True)["runs"]))
    train_runs(make_config("gcn", runs=2, epochs=2), on_run=after, save_to=str(path), log_epochs=False)
    assert seen == [1, 2] and not (tmp_path / "runs.pt.partial").exists()
    model, checkpoint = load_checkpoint(path, run=1)
    assert checkpoint["runs"][1]["seed"] == 1


def test_a_checkpoint_through_a_link_updates_the_linked_file_and_a_failed_save_leaves_no_litter(tmp_path,
                                                                                                monkeypatch):
    """save_checkpoint renamed its ``.partial`` file over --save's path: a symbolic link
    there (latest.pt -> runs/exp.pt) became a plain file while runs/exp.pt kept the old
    checkpoint, a shared group-writable file took the umask's mode, and a failed write
    (a full disk) left ``.partial`` beside it -- unlike every other output
    (`output_paths.write_atomically`)."""
    target = tmp_path / "exp.pt"
    target.write_bytes(b"old checkpoint")
    target.chmod(0o664)
    link = tmp_path / "latest.pt"
    link.symlink_to(target)
    train_runs(make_config("gcn", runs=1, epochs=2), save_to=str(link), log_epochs=False)
    assert link.is_symlink() and torch.load(target, weights_only=True)["runs"][0]["seed"] == 0
    assert target.stat().st_mode & 0o777 == 0o664

    def full_disk(obj, file, *args, **kwargs):
        Path(file).write_bytes(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(torch, "save", full_disk)
    summary = TrainSummary(make_config("gcn"), "synthetic", 1, 1, [])
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(summary, link)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.pt", "latest.pt"]
    assert torch.load(target, weights_only=True)["runs"][0]["seed"] == 0


def test_loading_a_run_that_kept_no_weights_names_why(tmp_path):
    """A run that diverged at its first epoch is saved with an empty state dict; loading
    it failed in load_state_dict's 'Missing key(s)' RuntimeError."""
    config = make_config("gcn", epochs=1)
    diverged = RunResult(seed=0, best_epoch=0, best_val_acc=float("nan"), test_acc=float("nan"), epochs_run=1,
                         seconds=0.0, state_dict={})
    save_checkpoint(TrainSummary(config, "synthetic", 64, 5, [diverged]), tmp_path / "runs.pt")
    with pytest.raises(ValueError, match=r"run 0 \(seed 0\) has no weights: it diverged"):
        load_checkpoint(tmp_path / "runs.pt")


@pytest.mark.parametrize("command", ["info", "train", "explain", "bench", "tune"])
def test_every_commands_help_names_where_data_is_looked_for_and_the_top_help_names_it(command, capsys):
    """``bench --help`` and ``tune --help`` left the download cache out of ``--root``'s
    default, though they load through the same search (and download) as ``info``; the
    top-level description left ``tune`` out."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("--root ROOT data folder, the only one searched when given (default: $GNNFUSE_DATA, else "
            "../shared/data, then shared/data beside a folder above the gnnfuse package, then the download "
            "cache)") in help_text
    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"(`{command}`)" in " ".join(capsys.readouterr().out.split())


def test_a_reader_that_leaves_early_gets_no_traceback():
    """``gnnfuse info synthetic | head -3`` printed a BrokenPipeError traceback once head
    had left; the command now stops quietly (exit status 1), as shell tools do."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    src = Path(__file__).resolve().parent.parent / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    read, write = os.pipe()
    os.close(read)                  # the reader is gone before the command prints anything
    try:
        done = subprocess.run([sys.executable, "-m", "gnnfuse", "info", "synthetic"], stdout=write,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 1


def test_a_reader_that_leaves_a_multi_rank_train_early_gets_no_traceback():
    """``gnnfuse train --cpu-ranks 2 | head -3``: rank 0 stopped quietly, but rank 1 then
    failed in its next collective, and the launch printed rank 1's gloo traceback
    ("Connection reset by peer") and "rank 0 of 2 failed: ... exit code 1"."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    src = Path(__file__).resolve().parent.parent / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "gnnfuse", "train", "--cpu-ranks", "2", "--epochs", "100000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        process.stdout.readline()
        process.stdout.close()          # the reader leaves while the ranks train
        err = process.stderr.read()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert "Traceback" not in err and "failed" not in err, err
    assert process.returncode == 1


def test_info_says_the_npz_graphs_are_directed_unlike_pygs_reading_of_them(shared_data, capsys):
    """cora-npz trains on the raw directed graph (5429 edges) where PyG's ``read_npz``
    (``CitationFull``, ``Amazon``, ``Coauthor``) symmetrises the same file; only a code
    comment said so. `gnnfuse info` now says it where users see the data set."""
    assert main(["info", "cora-npz", "--root", str(shared_data)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "directed" in first and "PyG's read_npz" in first and "undirected=True" in first, first


@pytest.mark.parametrize("overrides, message", [
    ({"epochs": 2.5}, "epochs must be an integer, got 2.5"),
    ({"runs": 1.5}, "runs must be an integer, got 1.5"),
    ({"hidden": 4.5}, "hidden must be an integer, got 4.5"),
    ({"seed": 0.5}, "seed must be an integer, got 0.5"),      # trained silently as seed 0
    ({"lr": "0.1"}, "lr must be a number, got '0.1'"),
    ({"model": "sage", "fanout": (5, 2.0)}, "fanout must be a sequence of integers"),
    # PyG's per-edge-type num_neighbors: trained silently on its keys, here fanout (5,)
    ({"model": "sage", "fanout": {5: [10, 10]}}, "fanout must be a sequence of integers"),
    ({"model": "sage", "fanout": {10, 5}}, "fanout must be a sequence of integers"),     # in no set order
    ({"model": "sage", "fanout": (5, 5), "dkp": "no"}, "dkp must be True or False, got 'no'"),   # trained with dkp
    ({"patience": False}, "patience must be an integer, got False"),        # trained without early stopping
    ({"dataset": 123}, "dataset must be a data set's name, got 123"),       # an AttributeError once training
])
def test_make_config_refuses_values_of_the_wrong_type(overrides, message):
    """The range checks only compared values, so a float count passed and failed inside
    training with Python's "'float' object cannot be interpreted as an integer"."""
    overrides = {"model": "gcn", **overrides}
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_config(overrides.pop("model"), **overrides)
    config = make_config("gcn", epochs=np.int64(3), lr=np.float32(0.1), runs=1)     # numpy scalars are numbers
    assert config.epochs == 3
    # an iterator is read once: the type check emptied it, and the range check then
    # reported "fanout must be one count >= 1 ... per layer, got []"
    assert make_config("sage", fanout=map(int, "5,3".split(","))).fanout == (5, 3)


def test_numpy_scalars_in_a_config_leave_a_checkpoint_that_reloads(tmp_path):
    """make_config took numpy scalars as numbers and kept them: a run trained and saved,
    but its checkpoint held numpy objects, which torch.load(weights_only=True) refuses,
    so load_checkpoint and --resume called the file "not a gnnfuse train checkpoint"."""
    config = make_config("gcn", epochs=np.int64(1), seed=np.int64(2), lr=np.float64(0.01), dropout=np.float32(0.5))
    path = tmp_path / "run.pt"
    summary = train_runs(config, log_epochs=False, save_to=str(path))
    model, checkpoint = load_checkpoint(path)
    assert checkpoint["runs"][0]["test_acc"] == summary.runs[0].test_acc and checkpoint["config"]["seed"] == 2
    sampled = make_config("sage", fanout=np.array([3, 2]), batch_size=np.int64(64), runs=np.int64(1))
    for value in (*dataclasses.astuple(config), *dataclasses.astuple(sampled), *sampled.fanout):
        assert type(value) in (int, float, str, bool, tuple, type(None)), (value, type(value))


@pytest.mark.parametrize("options, message", [
    (["--lr", "1e38"], "lr must be finite, >= 0 and at most 3.4e+37"),            # Adam's first step, lr / 0.1
    (["--weight-decay", "1e300"], "weight decay must be finite, >= 0 and at most 3.4e+37"),
    (["--epochs", str(2**63)], "epochs must be below 2**63"),                     # range()'s length
    (["--model", "sage", "--fanout", "2", "--batch-size", str(2**63)], "batch size must be below 2**63"),
])
def test_a_value_too_large_to_train_with_is_a_usage_error(options, message, capsys):
    """Finite values past what training holds: a float32 step size (RuntimeError: value
    cannot be converted to type float without overflow, from inside Adam's first step)
    or a 64-bit count (OverflowError, ValueError) ended the command with a traceback."""
    with pytest.raises(SystemExit) as stop:
        main(["train", "--epochs", "1", *options])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_mini_batches_of_a_typed_data_set_are_a_usage_error(capsys):
    """--fanout on a data set with typed edges (the *-like relational presets) ended with
    the loader's "ValueError: NeighborLoader samples a homogeneous graph ..." traceback,
    after the data set was loaded."""
    with pytest.raises(SystemExit) as stop:
        main(["train", "--model", "sage", "--dataset", "aifb-like", "--fanout", "2", "--epochs", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--fanout" in err and "aifb-like" in err and "Traceback" not in err, err


def test_more_loader_workers_than_can_start_is_a_usage_error(monkeypatch, capsys):
    """--num-workers 10**20 spawned worker processes until "OSError: [Errno 24] Too many
    open files" ended the command with a traceback."""
    import gnnfuse.loader.workers as workers
    def spawned(*args, **kwargs):
        raise AssertionError("a loader worker was started")
    monkeypatch.setattr(workers, "_check_spawnable", spawned)
    with pytest.raises(SystemExit) as stop:
        main(["train", "--model", "sage", "--fanout", "2", "--epochs", "1", "--num-workers", str(10**20)])
    assert stop.value.code == 2 and "loader workers must be at most" in capsys.readouterr().err


@pytest.mark.parametrize("name,value", [("GNNFUSE_BACKEND", "tritn"), ("GNNFUSE_AUTOTUNE", "yes")])
def test_a_bad_setting_variable_is_a_usage_error_not_a_traceback(name, value, monkeypatch, capsys):
    """A bad GNNFUSE_* value surfaced as a ValueError traceback from inside the first
    layer call, after the data set was loaded."""
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stop:
        main(["train", "--epochs", "1"])
    assert stop.value.code == 2 and name in capsys.readouterr().err


def test_a_full_graph_epochs_losses_are_the_train_and_val_cross_entropies():
    """With no learning rate and no dropout an epoch's loss is the cross-entropy over the
    training vertices and its validation loss the one over the validation vertices (the
    test vertices' had passed the suite, and that loss picks the best epoch among ties
    and drives the patience rule)."""
    import torch.nn.functional as F
    from gnnfuse.data import load_node_dataset
    config = make_config("gcn", epochs=1, lr=0.0, dropout=0.0, hidden=8, weight_decay=0.0)
    run = train_runs(config, log_epochs=False).runs[0]
    data = load_node_dataset(config.dataset)
    torch.manual_seed(run.seed)
    model = models.build_model("gcn", data.num_features, data.num_classes, 8, 0.0).eval()
    with torch.no_grad():
        logits = model(data.x, data.graph)
    for key, mask in (("loss", data.train_mask), ("val_loss", data.val_mask)):
        expected = F.cross_entropy(logits[mask], data.y[mask]).item()
        assert run.history[key] == pytest.approx([expected], rel=1e-5), key


def test_load_checkpoint_gives_each_runs_own_weights(tmp_path):
    """``load_checkpoint(path, run)`` builds run ``run``'s model (runs of other seeds have
    other weights; reading the next run's had passed the suite)."""
    summary = train_runs(make_config("gcn", runs=2, epochs=1, hidden=8), log_epochs=False)
    path = tmp_path / "two_runs.pt"
    save_checkpoint(summary, path)
    for run in range(2):
        model, checkpoint = load_checkpoint(path, run)
        expected = summary.runs[run].state_dict
        assert model.state_dict().keys() == expected.keys()
        for key, value in model.state_dict().items():
            torch.testing.assert_close(value, expected[key], rtol=0, atol=0)


def test_the_curves_drawn_are_the_runs_histories(tmp_path, monkeypatch):
    """The plot's lines hold the history's numbers: validation loss dashed beside the
    training loss, the best epoch's marker at ``best_epoch``, and each stage's bar
    stacked on the sum of the stages below it (read back from the figure drawn)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure
    from gnnfuse import curves
    from gnnfuse.loader import STAGES
    drawn = []

    class Recorded(Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            drawn.append(self)
    monkeypatch.setattr(curves, "require_matplotlib", lambda: Recorded)
    history = {"loss": [1.0, 0.5, 0.4], "val_loss": [1.2, 0.9, 1.1], "train_acc": [0.3, 0.6, 0.7],
               "val_acc": [0.2, 0.5, 0.45], "epoch_seconds": [3.0, 3.0, 3.0],
               **{f"stage_{s}": [float(i + 1)] * 3 for i, s in enumerate(STAGES)}}
    run = RunResult(seed=0, best_epoch=2, best_val_acc=0.5, test_acc=0.4, epochs_run=3, seconds=1.0,
                    state_dict={}, history=history)
    curves.plot_curves(TrainSummary(make_config("gcn"), "synthetic", 4, 2, [run]), tmp_path / "curves.png")
    loss_axes, acc_axes, stage_axes = drawn[0].axes
    assert [list(line.get_ydata()) for line in loss_axes.get_lines()] == [history["loss"], history["val_loss"]]
    assert [line.get_linestyle() for line in loss_axes.get_lines()] == ["-", "--"]
    assert list(acc_axes.get_lines()[-1].get_xdata()) == [2, 2]
    bottoms = [[bar.get_y() for bar in bars] for bars in stage_axes.containers]
    assert bottoms == [[float(sum(range(1, i + 1)))] * 3 for i in range(len(STAGES))]
