"""``gnnfuse train`` stopped by Ctrl-C: what it keeps (checkpoint, curves), what it says,
and `--resume` continuing it to the same numbers an uninterrupted run gives."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnfuse.cli import main
from gnnfuse.training import ConfigError, TrainingInterrupted, load_checkpoint, make_config, train_runs
from gnnfuse.training import loop

RUNS = ["--runs", "3", "--epochs", "3"]


def interrupt_at_seed(monkeypatch, seed: int) -> None:
    """Ctrl-C in the middle of the run of ``seed`` (the others train as usual)."""
    real = loop.train_run

    def run(config, spec, data, run_seed, **kw):
        if run_seed == seed:
            raise KeyboardInterrupt
        return real(config, spec, data, run_seed, **kw)
    monkeypatch.setattr(loop, "train_run", run)


def values(history: dict) -> dict:
    """A run's curves less the mini-batch stage timings, which no two runs share."""
    return {key: curve for key, curve in history.items() if key != "epoch_seconds" and not key.startswith("stage_")}


def same_runs(a: list, b: list) -> bool:
    """Whether two checkpoints' runs are the same: seeds, curves, best epochs, the summary's
    numbers (test and best validation accuracy, epochs run) and every weight, bit for bit."""
    return len(a) == len(b) and all(
        x["seed"] == y["seed"] and values(x["history"]) == values(y["history"]) and x["best_epoch"] == y["best_epoch"]
        and (x["test_acc"], x["best_val_acc"], x["epochs_run"]) == (y["test_acc"], y["best_val_acc"], y["epochs_run"])
        and x["state_dict"].keys() == y["state_dict"].keys()
        and all(torch.equal(x["state_dict"][k], y["state_dict"][k]) for k in x["state_dict"])
        for x, y in zip(a, b))


def test_an_interrupted_train_keeps_its_runs_and_resumes_to_the_uninterrupted_numbers(tmp_path, monkeypatch,
                                                                                     capsys):
    """Ctrl-C in run 2 of 3 ended in a KeyboardInterrupt traceback (exit 1, no curves, no
    word on what was kept), and there was no way to continue: runs were retrained."""
    whole, cut = tmp_path / "whole.pt", tmp_path / "cut.pt"
    assert main(["train", *RUNS, "--save", str(whole)]) == 0
    with monkeypatch.context() as patch:
        interrupt_at_seed(patch, 1)
        assert main(["train", *RUNS, "--save", str(cut)]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted in run 2/3 (seed 1)" in err
    assert f"--save {cut} --resume" in err
    assert len(torch.load(cut, weights_only=True)["runs"]) == 1
    assert main(["train", *RUNS, "--save", str(cut), "--resume"]) == 0
    assert "resuming" in capsys.readouterr().out
    assert same_runs(torch.load(cut, weights_only=True)["runs"], torch.load(whole, weights_only=True)["runs"])


def test_an_interrupted_train_still_draws_the_finished_runs_curves(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'gnnfuse[plot]')")
    plot = tmp_path / "curves.png"
    interrupt_at_seed(monkeypatch, 1)
    assert main(["train", *RUNS, "--plot", str(plot)]) == 130
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"saved learning curves of 1 finished run(s) to {plot}" in capsys.readouterr().out


def test_train_runs_raises_an_interrupt_that_carries_the_finished_runs(monkeypatch):
    interrupt_at_seed(monkeypatch, 1)
    with pytest.raises(TrainingInterrupted) as stopped:
        train_runs(make_config("gcn", runs=2, epochs=2), log_epochs=False)
    assert isinstance(stopped.value, KeyboardInterrupt)            # `except KeyboardInterrupt` still sees it
    assert [run.seed for run in stopped.value.summary.runs] == [0] and stopped.value.index == 1


@pytest.mark.parametrize("change, message", [
    (dict(lr=0.02), "lr 0.01 in the checkpoint, 0.02 asked for"),
    (dict(model="sage"), "model 'gcn' in the checkpoint, 'sage' asked for"),
    (dict(dataset="sbm", seed=3), "dataset 'synthetic' in the checkpoint, 'sbm' asked for; seed 0"),
])
def test_resume_refuses_a_checkpoint_of_another_recipe_by_name(tmp_path, change, message):
    path = tmp_path / "runs.pt"
    base = dict(model="gcn", dataset="synthetic", epochs=2, lr=0.01, seed=0)
    train_runs(make_config(**{k: v for k, v in base.items() if k not in ("model", "dataset")},
                           model=base["model"], dataset=base["dataset"]), log_epochs=False, save_to=str(path))
    asked = {**base, **change, "runs": 2}
    config = make_config(asked.pop("model"), asked.pop("dataset"), **asked)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        train_runs(config, log_epochs=False, save_to=str(path), resume=True)
    assert len(load_checkpoint(path)[1]["runs"]) == 1              # left as it was


def test_resume_takes_another_loader_worker_count_which_draws_the_same_batches(tmp_path):
    """--num-workers changes who prepares the batches, not which (the loader docs; resumed
    bit-exactly with workers below), yet a resume with another count was refused as
    "another recipe: loader_workers 0 in the checkpoint, 2 asked for"."""
    path = tmp_path / "runs.pt"
    sampled = dict(fanout=(3, 3), batch_size=64, epochs=1)
    train_runs(make_config("sage", "synthetic", **sampled), log_epochs=False, save_to=str(path))
    summary = train_runs(make_config("sage", "synthetic", loader_workers=2, **sampled), log_epochs=False,
                         save_to=str(path), resume=True)
    assert len(summary.runs) == 1 and summary.config.loader_workers == 2


def test_resume_takes_the_data_set_name_in_another_case(tmp_path):
    """Data set names are case-blind (--dataset CORA loads cora), yet a run saved as CORA
    was refused on resume as cora: "another recipe: dataset 'CORA' in the checkpoint,
    'cora' asked for"."""
    path = tmp_path / "runs.pt"
    train_runs(make_config("sgc", "synthetic", epochs=1), log_epochs=False, save_to=str(path))
    summary = train_runs(make_config("sgc", "SYNTHETIC", epochs=1, runs=2), log_epochs=False,
                         save_to=str(path), resume=True)
    assert len(summary.runs) == 2 and summary.config.dataset == "synthetic"
    saved = torch.load(path, weights_only=True)     # a checkpoint saved before names were lowered
    saved["config"]["dataset"] = "Synthetic"
    torch.save(saved, path)
    summary = train_runs(make_config("sgc", "synthetic", epochs=1, runs=3), log_epochs=False,
                         save_to=str(path), resume=True)
    assert len(summary.runs) == 3


def test_resume_without_a_checkpoint_to_continue_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--epochs", "1", "--resume"])
    assert stopped.value.code == 2 and "--resume continues the --save checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--epochs", "1", "--save", str(tmp_path / "none.pt"), "--resume"])
    assert stopped.value.code == 2 and "there is no checkpoint to resume" in capsys.readouterr().err


def test_resuming_a_finished_checkpoint_trains_nothing_and_reports_it(tmp_path, capsys):
    path = tmp_path / "runs.pt"
    assert main(["train", "--epochs", "2", "--save", str(path)]) == 0
    before = path.stat().st_mtime_ns
    capsys.readouterr()
    assert main(["train", "--epochs", "2", "--save", str(path), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "epoch    1" not in out and "summary: test acc" in out and path.stat().st_mtime_ns == before


def test_ctrl_c_in_a_terminal_leaves_no_traceback_and_says_how_to_resume(tmp_path):
    """A real SIGINT to the command, as a terminal's Ctrl-C sends it."""
    src = Path(__file__).resolve().parent.parent / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    path = tmp_path / "runs.pt"
    process = subprocess.Popen([sys.executable, "-m", "gnnfuse", "train", "--epochs", "100000", "--save", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               # a background child inherits SIGINT ignored from a non-interactive shell
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in process.stdout:
        if "epoch    2 " in line:
            break
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()                # a command that ignored the Ctrl-C would train 100000 epochs
    assert process.returncode == 130, err
    assert "Traceback" not in err and "interrupted in run 1/1 (seed 0) after epoch" in err
    assert f"--save {path} --resume" in err
    assert torch.load(path, weights_only=True)["interrupted"]["epoch"] >= 2


# loaded by the training process (a sitecustomize on its path): the stopping signal's
# duplicate arrives just after the first was handled, as ``timeout``'s second can
_DUPLICATE_AFTER_THE_FIRST = """
import os
import gnnfuse.training.interrupt as interrupt
real = interrupt.DeferredInterrupt._handle
def _handle(self, signum, frame):
    first = not self.requested
    real(self, signum, frame)
    if first:
        os.kill(os.getpid(), signum)
interrupt.DeferredInterrupt._handle = _handle
"""


def test_a_signal_delivered_twice_at_once_as_timeout_sends_it_stops_after_the_epoch(tmp_path):
    """``timeout`` signals the command, then its whole process group: the command gets
    the signal twice within microseconds. Where the first was handled before the second
    came, the second counted as "SIGTERM again stops at once": the run in progress was
    lost ("during an epoch; that run's epochs are not kept"), nothing saved. (The
    duplicate is sent by the handler itself once the first is handled: sent from here
    after reading "stopping", a busy machine delivered it after the process had stopped.)"""
    path = tmp_path / "runs.pt"
    err = stopped_by_sigterm(tmp_path, _DUPLICATE_AFTER_THE_FIRST, path)
    assert "interrupted in run 1/1 (seed 0) after epoch" in err, err
    assert torch.load(path, weights_only=True)["interrupted"]["epoch"] >= 2


def signal_first(module: str, function: str) -> str:
    """A sitecustomize (loaded by the training process: `train_job`'s ``path_first``)
    that makes ``module.function`` send its process a SIGTERM first: the stopping
    signal's duplicate, arriving while that function runs."""
    return f"""
import os, signal
import {module} as module
real = module.{function}
def {function}(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
module.{function} = {function}
"""


def test_a_duplicate_signal_while_the_stop_is_reported_is_held(tmp_path):
    """After the stopped run is saved, the command writes its curves and the resume
    hint. A duplicate of the signal arriving then ended the process by SIGTERM's default
    action (status -15) without them; it is held there too."""
    err = stopped_by_sigterm(tmp_path, signal_first("gnnfuse.cli", "interrupted"), tmp_path / "runs.pt")
    assert "continue with:" in err, err


def test_a_duplicate_signal_while_the_stopped_run_is_saved_is_held(tmp_path):
    """The epoch's hold on SIGTERM ends with the epoch; the checkpoint of the stopped run
    is written after it. A duplicate arriving then (``timeout``'s second, read late on a
    busy machine) ended the process by SIGTERM's default action (status -15), before the
    checkpoint was written. It is held while saving, as between finished runs."""
    path = tmp_path / "runs.pt"
    stopped_by_sigterm(tmp_path, signal_first("gnnfuse.training.checkpoint", "save_checkpoint"), path)
    assert torch.load(path, weights_only=True)["interrupted"]["epoch"] >= 2


def ctrl_c_after_epoch(monkeypatch, module, epoch: int) -> None:
    """A real SIGINT to this process during epoch ``epoch`` (at its log line) of a run
    of ``module`` (`loop`, `minibatch`)."""
    calls = []
    real = module.peak_memory_mib

    def peak(device):
        calls.append(device)
        if len(calls) == epoch:
            signal.raise_signal(signal.SIGINT)
        return real(device)
    monkeypatch.setattr(module, "peak_memory_mib", peak)


def check_stop_and_resume(argv, module, epoch, tmp_path, monkeypatch, capsys, while_resuming=None) -> None:
    """``argv`` stopped by Ctrl-C in ``epoch`` and resumed ends as it does uninterrupted,
    where the run's best epoch comes before the Ctrl-C (so the early-stopping record must
    carry over) and the run goes on after it. ``while_resuming(monkeypatch)`` patches
    what the resumed command must not do."""
    whole, cut = tmp_path / "whole.pt", tmp_path / "cut.pt"
    assert main([*argv, "--save", str(whole)]) == 0
    assert load_checkpoint(whole)[1]["runs"][0]["best_epoch"] < epoch < load_checkpoint(whole)[1]["runs"][0]["epochs_run"]
    with monkeypatch.context() as patch:
        ctrl_c_after_epoch(patch, module, epoch)
        assert main([*argv, "--save", str(cut)]) == 130
    err = capsys.readouterr().err
    assert f"after epoch {epoch}" in err and f"--save {cut} --resume" in err, err
    with monkeypatch.context() as patch:
        if while_resuming is not None:
            while_resuming(patch)
        assert main([*argv, "--save", str(cut), "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"epoch {epoch:4d} " not in out and f"epoch {epoch + 1:4d} " in out
    assert same_runs(torch.load(cut, weights_only=True)["runs"], torch.load(whole, weights_only=True)["runs"])


def test_ctrl_c_inside_a_run_keeps_its_epochs_and_resume_continues_them_bit_exactly(tmp_path, monkeypatch,
                                                                                   capsys):
    """The interrupted run's epochs were lost: a single 1000-epoch run stopped at epoch 900
    started again from epoch 1. Ctrl-C now ends the run at the end of its epoch and saves
    its whole state (weights, Adam, RNG, early stopping, best epoch, curves)."""
    # lr 0.5 overshoots: the best epoch (5) comes before the Ctrl-C
    check_stop_and_resume(["train", "--epochs", "12", "--patience", "3", "--lr", "0.5"], loop, 6,
                          tmp_path, monkeypatch, capsys)


def test_ctrl_c_inside_a_mini_batch_run_resumes_bit_exactly(tmp_path, monkeypatch, capsys):
    """Mini-batch runs (the long ones, on large graphs) started again from epoch 1."""
    from gnnfuse.training import minibatch
    # lr 0.2 overshoots: the best epoch (8) comes before the Ctrl-C
    check_stop_and_resume(["train", "--model", "sage", "--fanout", "5,5", "--batch-size", "64", "--epochs", "12",
                           "--lr", "0.2"], minibatch, 10, tmp_path, monkeypatch, capsys)


def test_ctrl_c_in_a_mini_batch_run_with_loader_workers_resumes_bit_exactly(tmp_path, monkeypatch, capsys):
    """With --num-workers, Ctrl-C stopped at once and the run started again from its seed;
    the batches are drawn from torch's generator in this process, whoever prepares them,
    so the run's state is the same as without workers."""
    from gnnfuse.training import minibatch
    check_stop_and_resume(["train", "--model", "sage", "--fanout", "5,5", "--batch-size", "64", "--epochs", "12",
                           "--lr", "0.2", "--num-workers", "1"], minibatch, 10, tmp_path, monkeypatch, capsys)


def timed_by_formula(graph, aggregate, f_in, f_out, input_grad, repeats=2):
    """`placement.kernel_times` as a formula of the kernels' sizes: measured times differ
    from run to run (on a busy machine, enough to fit other orders), these do not."""
    from gnnfuse.nn.placement import KernelTime, _terms
    n_src, n_dst, edges = graph.num_src_nodes, graph.num_dst_nodes, graph.num_edges
    matmul = "matmul" if input_grad else "matmul-weight-only"
    aggregate_x = "aggregate" if input_grad else "aggregate-forward-only"
    kernels = ((matmul, n_dst, 0, f_in, f_out), (matmul, n_src, 0, f_in, f_out),
               (aggregate_x, n_dst, edges, f_in, f_in), ("aggregate", n_dst, edges, f_out, f_out))
    return [KernelTime(kind, rows, e, w_in, w_out, sum(c * t for c, t in zip((1e-9, 2e-8, 1e-5),
                                                                            _terms(kind, rows, e, w_in, w_out))))
            for kind, rows, e, w_in, w_out in kernels]


def test_ctrl_c_in_a_dkp_run_keeps_its_fitted_placement_and_resumes_bit_exactly(tmp_path, monkeypatch, capsys):
    """With --dkp, Ctrl-C stopped at once: a resumed run would have refitted the kernel
    placement on new kernel times, which can choose other orders for the same batches
    (other roundings). The state holds the fitted model; the resumed run does not refit.
    Kernel times come from a formula, so that the uninterrupted run fits the same model."""
    from gnnfuse.nn import placement
    from gnnfuse.training import minibatch
    monkeypatch.setattr(placement, "kernel_times", timed_by_formula)

    def no_refit(patch):
        def refit(*args):
            raise AssertionError("a resumed --dkp run refitted its kernel placement")
        patch.setattr(minibatch, "_fit_placement", refit)
    # lr 1.0 overshoots: the best epoch (10) comes before the Ctrl-C
    check_stop_and_resume(["train", "--model", "sage", "--fanout", "5,5", "--batch-size", "64", "--epochs", "12",
                           "--lr", "1.0", "--dkp"], minibatch, 11, tmp_path, monkeypatch, capsys, no_refit)


def test_a_kernel_placement_rebuilt_from_its_state_takes_the_same_decisions():
    from gnnfuse.nn.placement import PlacementModel, KernelTime
    samples = [KernelTime(kind, rows, edges, width, width if kind.startswith("aggregate") else 5, seconds)
               for kind in ("matmul", "aggregate") for rows, edges, width, seconds in
               ((10, 40, 64, 1e-4), (50, 200, 64, 4e-4), (200, 900, 16, 3e-4), (80, 300, 32, 2e-4))]
    fitted = PlacementModel.fit(samples)
    sizes = [(120, 40, 500, 64, 5), (40, 10, 90, 8, 64), (300, 100, 1200, 64, 64)]
    for size in sizes:
        fitted.choose(*size, True)
    rebuilt = PlacementModel.from_state(torch.load(_saved(fitted.state()), weights_only=True))
    assert rebuilt.coefficients == fitted.coefficients and rebuilt.decisions == fitted.decisions
    assert [rebuilt.choose(*size, True) for size in sizes] == [fitted.choose(*size, True) for size in sizes]


def _saved(value) -> io.BytesIO:
    """``value`` as torch.save writes it (into memory), to be read back as a checkpoint is."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def stopped_by_sigterm(tmp_path: Path, sitecustomize: str, path: Path) -> str:
    """Stderr of ``gnnfuse train --epochs 100000 --save PATH`` with ``sitecustomize``
    loaded at its start, sent one SIGTERM after its second epoch; asserts it exited
    with 130 (a command that ignored the signal would train 100000 epochs: killed)."""
    (tmp_path / "sitecustomize.py").write_text(sitecustomize)
    process = train_job(["--epochs", "100000", "--save", str(path)], path_first=tmp_path)
    try:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err
    return err


def train_job(args: list[str], path_first: Path | None = None) -> subprocess.Popen:
    """``gnnfuse train ARGS`` started in its own process group, as a terminal runs a job
    (a Ctrl-C there reaches the whole group), with Python's SIGINT handling; returned
    once it has printed its second epoch, its stdout and stderr still piped. ``path_first``:
    a folder put first on its path (a sitecustomize there runs at its start)."""
    src = Path(__file__).resolve().parent.parent / "src"
    first = [str(path_first)] if path_first is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*first, str(src), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "gnnfuse", "train", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in process.stdout:
        if "epoch    2 " in line:
            break
    return process


@pytest.mark.parametrize("signum, workers", [(signal.SIGINT, 2), (signal.SIGTERM, 1)], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_the_whole_job_leaves_loader_workers_running_until_the_epoch_ends(tmp_path, signum, workers):
    """A signal to the whole process group: a terminal's Ctrl-C (SIGINT), or the SIGTERM
    a batch scheduler sends every process of the job. The loader's worker processes got
    it too and died (of KeyboardInterrupt, or at once), and the training process,
    finishing its epoch, failed it ("Connection reset by peer"), losing the run's epochs."""
    path = tmp_path / "runs.pt"
    process = train_job(["--model", "sage", "--fanout", "5,5", "--batch-size", "16", "--num-workers", str(workers),
                         "--epochs", "100000", "--save", str(path)])
    try:
        os.killpg(process.pid, signum)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "interrupted in run 1/1 (seed 0) after epoch" in err, err
    assert torch.load(path, weights_only=True)["interrupted"]["epoch"] >= 2


def test_resume_refuses_a_checkpoint_trained_on_another_number_of_ranks(tmp_path, monkeypatch):
    """Ranks are no field of the config, and one process and two --cpu-ranks train the same
    recipe to different numbers (synthetic, 5 epochs: test acc 0.5710 vs 0.5550): resuming
    mixed the two experiments' runs into one summary."""
    import gnnfuse.distributed
    path = tmp_path / "runs.pt"
    train_runs(make_config("gcn", epochs=1), log_epochs=False, save_to=str(path))
    monkeypatch.setattr(gnnfuse.distributed, "world_size", lambda: 2)
    with pytest.raises(ConfigError, match="ranks 1 in the checkpoint, 2 asked for"):
        train_runs(make_config("gcn", epochs=1, runs=2), log_epochs=False, save_to=str(path), resume=True)


@pytest.mark.parametrize("content", [b"garbage\n", b"", b"hello world\nline2\n", b"a"])
def test_a_file_that_is_no_checkpoint_is_refused_by_name(tmp_path, capsys, content):
    """torch.load's UnpicklingError (advising weights_only=False, which would run the
    file's code) came out of load_checkpoint, and as a traceback out of --resume; so did
    the KeyError and IndexError its legacy reader raises on other text."""
    path = tmp_path / "notes.pt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{path} is not a gnnfuse train checkpoint"):
        load_checkpoint(path)
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--epochs", "1", "--save", str(path), "--resume"])
    assert stopped.value.code == 2 and f"{path} is not a gnnfuse train checkpoint" in capsys.readouterr().err


def test_ctrl_c_in_a_runs_last_epoch_stops_before_the_next_run(tmp_path, monkeypatch, capsys):
    """A Ctrl-C waiting for the end of the epoch was dropped when that epoch was the run's
    last (its epoch limit, or early stopping): the next run started as if none came."""
    path = tmp_path / "runs.pt"
    ctrl_c_after_epoch(monkeypatch, loop, 3)
    assert main(["train", "--runs", "2", "--epochs", "3", "--save", str(path)]) == 130
    err = capsys.readouterr().err
    assert "interrupted before run 2/2 (seed 1)" in err and f"--save {path} --resume" in err, err
    assert len(torch.load(path, weights_only=True)["runs"]) == 1


def test_ctrl_c_before_the_first_run_finishes_keeps_the_file_the_save_path_held(tmp_path, monkeypatch, capsys):
    """The note promised an existing --save file is replaced only once the first run
    finishes, but a Ctrl-C in that run -- the user stopping the command on reading the
    note -- replaced it with the stopped run's state. Both are kept now."""
    path = tmp_path / "runs.pt"
    assert main(["train", "--epochs", "2", "--runs", "2", "--save", str(path)]) == 0
    before = path.read_bytes()
    capsys.readouterr()
    with monkeypatch.context() as patch:
        ctrl_c_after_epoch(patch, loop, 1)
        assert main(["train", "--epochs", "3", "--save", str(path)]) == 130
    err = capsys.readouterr().err
    assert f"it is kept as {path}.previous" in err, err
    assert Path(f"{path}.previous").read_bytes() == before
    assert torch.load(path, weights_only=True)["interrupted"]["epoch"] == 1
    assert main(["train", "--epochs", "3", "--save", str(path), "--resume"]) == 0


def test_resuming_on_another_number_of_cpu_threads_warns_that_the_numbers_differ(tmp_path, monkeypatch):
    """torch's CPU kernels split their work by thread count, so a run continued on another
    count rounds differently from the uninterrupted one -- and the count is the machine's
    (half its CPUs by default), no field of the recipe: a resume on another machine gave
    other numbers than --resume promises, without a word."""
    path, config, before = tmp_path / "runs.pt", make_config("gcn", epochs=3), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with monkeypatch.context() as patch:
            ctrl_c_after_epoch(patch, loop, 1)
            with pytest.raises(TrainingInterrupted):
                train_runs(config, save_to=str(path))      # logs its epochs: the Ctrl-C comes in the first line
        torch.set_num_threads(2)
        with pytest.warns(RuntimeWarning, match="trained on 1 CPU thread.* this command uses 2.*--threads 1 gives"):
            train_runs(config, save_to=str(path), resume=True, log_epochs=False)
    finally:
        torch.set_num_threads(before)


def test_a_sigterm_stops_one_process_after_its_epoch_and_keeps_the_run(tmp_path):
    """``kill``, ``timeout`` and batch schedulers stop a command with SIGTERM, which ended
    it at once: the run in progress lost every epoch that a Ctrl-C keeps."""
    src = Path(__file__).resolve().parent.parent / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    path = tmp_path / "runs.pt"
    process = subprocess.Popen([sys.executable, "-m", "gnnfuse", "train", "--epochs", "100000", "--save", str(path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in process.stdout:
        if "epoch    2 " in line:
            break
    process.terminate()
    try:
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "SIGTERM: stopping at the end of this epoch" in err and "interrupted in run 1/1 (seed 0) after epoch" in err
    assert torch.load(path, weights_only=True)["interrupted"]["epoch"] >= 2


def test_ctrl_c_while_a_finished_run_is_saved_keeps_it_and_stops_before_the_next(tmp_path, monkeypatch, capsys):
    """A Ctrl-C between a run's end and its checkpoint raised in the save: the finished
    run was lost (the file kept the runs before it) and the command said only
    "interrupted", with no resume hint. It is held until the run is saved now."""
    from gnnfuse.training import checkpoint
    path, real = tmp_path / "runs.pt", checkpoint.save_checkpoint

    def save(summary, to, **kw):
        if len(summary.runs) == 1 and not kw:
            signal.raise_signal(signal.SIGINT)
        return real(summary, to, **kw)
    monkeypatch.setattr(checkpoint, "save_checkpoint", save)
    assert main(["train", "--runs", "2", "--epochs", "2", "--save", str(path)]) == 130
    err = capsys.readouterr().err
    assert "interrupted before run 2/2 (seed 1)" in err and f"--save {path} --resume" in err, err
    assert len(torch.load(path, weights_only=True)["runs"]) == 1
