"""CPU ranks started from a launcher that has already run parallel work.

A forked child of such a process inherits torch's OpenMP team as threads that no longer
exist and hangs in its first parallel region; the CI run of 0e9f523 hung for 90 minutes
in `test_the_distributed_benchmark_runs_1_and_2_cpu_ranks_in_one_invocation` that way.
`start_ranks` forks CPU ranks from a fresh fork server instead, and hands each what a
forked child would have had: the launcher's environment, torch thread count, stdout and
stderr at the launch. The launcher is a script without an ``if __name__ == "__main__":``
guard, which the ranks must not run again (they run a function of another module). It
runs in a subprocess, so that a hang fails the test after a timeout instead of stopping
the suite.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

LAUNCHER = """
import json, os, sys
sys.path.insert(0, {tests!r})
import torch
import distributed_worker
from gnnfuse.distributed.launch import start_ranks

torch.set_num_threads(2)
torch.ones(1 << 22).exp().sum()            # torch's OpenMP team now runs in this process
out = {out!r}
start_ranks(distributed_worker.parallel_work, (out + "/first",), 2, "cpu")
os.environ["GNNFUSE_LAUNCH_PROBE"] = "set after the server started"
torch.set_num_threads(1)
log = os.open(out + "/second.log", os.O_WRONLY | os.O_CREAT)
os.dup2(log, 1)                             # the launcher's stdout is now a file
start_ranks(distributed_worker.parallel_work, (out + "/second",), 2, "cpu")
"""


def test_ranks_of_a_launcher_that_ran_parallel_work_finish_and_see_its_launch_state(tmp_path):
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER.format(tests=str(TESTS), out=str(tmp_path)))
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"the ranks did not finish in 180 s (hung): {hung.stdout} {hung.stderr}") from None
    assert done.returncode == 0, done.stderr[-3000:]
    records = {run: [json.loads((tmp_path / run / f"rank{r}.json").read_text()) for r in range(2)]
               for run in ("first", "second")}
    assert [r["threads"] for r in records["first"]] == [2, 2]
    assert [r["probe"] for r in records["first"]] == [None, None]
    assert [r["threads"] for r in records["second"]] == [1, 1]           # set after the server started
    assert [r["probe"] for r in records["second"]] == ["set after the server started"] * 2
    assert "rank 0 summed" in done.stdout and "rank 1 summed" in done.stdout
    second = (tmp_path / "second.log").read_text()
    assert "rank 0 summed" in second and "rank 1 summed" in second
    assert second not in done.stdout


RANK_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from gnnfuse.distributed.launch import launch_or_join

launch_or_join(None, None, "cpu", None, [])        # joins as torchrun's ranks do (WORLD_SIZE is set)
if dist.get_rank() == 1:
    raise RuntimeError("rank 1 failed before its all-reduce")
dist.all_reduce(torch.zeros(3))                    # rank 0 waits for rank 1 here
"""


def test_a_rank_that_raises_under_torchrun_ends_both_ranks_promptly(tmp_path):
    """A rank's uncaught error ran the exit hook that leaves the process group, whose
    barrier its peer -- waiting in an all-reduce for it -- never joined: the barrier's
    60 s bound expired, then destroying the group waited for the barrier's worker thread
    for gloo's 30-minute timeout, and the peer waited as long (torchrun ends the others
    only once a rank has exited). Both now end in seconds, the failing rank first."""
    from gnnfuse.distributed.launch import free_port
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    ranks = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        ranks.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        outcomes = [rank.communicate(timeout=45) for rank in ranks]
    except subprocess.TimeoutExpired:
        for rank in ranks:
            rank.kill()
        raise AssertionError("the ranks were still running 45 s after rank 1 failed (hung in leaving the "
                             "process group)") from None
    assert [rank.returncode for rank in ranks] == [1, 1], outcomes
    assert "rank 1 failed before its all-reduce" in outcomes[1][1]
    assert "by peer" in outcomes[0][1], outcomes[0][1]       # gloo: connection closed (or reset) by peer


LEAVING = """
import sys
sys.path.insert(0, {tests!r})
import distributed_worker
from gnnfuse.distributed.launch import free_port, start_ranks

for function in ("fail_before_a_collective", "leave_while_the_peer_waits"):
    try:
        start_ranks(getattr(distributed_worker, function), (free_port(),), 2, "cpu")
    except Exception as error:
        print(function, "failed:", str(error).strip().splitlines()[-1], flush=True)
"""


def test_leaving_the_process_group_ends_when_a_peer_never_joins(tmp_path):
    """A rank leaving while its peer waits in a collective (an error passing through the
    ``finally`` that leaves; ranks that disagree on the number of collectives): its
    leaving barrier timed out, then destroying the group waited for the barrier's gloo
    thread for the group's 30-minute timeout, and the peer waited as long -- the ranks
    were still running after 60 s. The leaving rank now ends at once, or when
    ``timeout_s`` expires; its peer's collective then fails ("Connection closed by peer")."""
    script = tmp_path / "leave.py"
    script.write_text(LEAVING.format(tests=str(TESTS)))
    launcher = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)      # its ranks and fork server: one group
    try:
        out, err = launcher.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        out, err = launcher.communicate()
        raise AssertionError(f"the ranks were still running after 60 s (hung leaving the process group): {out}") \
            from None
    lines = out.splitlines()
    assert any(line.startswith("fail_before_a_collective failed") for line in lines), out + err[-3000:]
    assert any(line.startswith("leave_while_the_peer_waits failed") and "by peer" in line for line in lines), \
        out + err[-3000:]



ENDING_RANK = """
import os, sys
import torch
import torch.distributed as dist
from gnnfuse.distributed import process_group
from gnnfuse.distributed.launch import launch_or_join

out = sys.argv[1]
with open(os.path.join(out, "pid" + os.environ["RANK"]), "w") as pid:    # torchrun's ranks have their own sessions
    pid.write(str(os.getpid()))
process_group.LEAVE_TIMEOUT_S = 2.0                # the leaving barrier's bound (60 s by default)
launch_or_join(None, None, "cpu", None, [])        # joins as the ranks of `torchrun -m gnnfuse train` do
if dist.get_rank() == 1:
    dist.all_reduce(torch.zeros(3))                # waits here for a rank that has left
with open(os.path.join(out, "kept.txt"), "w") as kept:
    kept.write("written before leaving")
print("rank 0 is done", end="")                    # unflushed: must not be lost
{ending}
"""


def _torchrun(script: Path, out: Path) -> tuple[int, str, str]:
    """Run ``script out`` under torchrun with two CPU ranks; fail the test, killing
    torchrun and its ranks, after 90 s instead of hanging the suite."""
    from gnnfuse.distributed.launch import free_port
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), str(script), str(out)]
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        job = subprocess.Popen(command, stdout=stdout, stderr=stderr, env={**os.environ, "OMP_NUM_THREADS": "1"},
                               start_new_session=True)
        try:
            job.wait(timeout=90)
        except subprocess.TimeoutExpired:
            for pid in [job.pid] + [int(path.read_text()) for path in out.glob("pid*")]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            job.wait()
            raise AssertionError("torchrun's ranks were still running after 90 s (hung at exit): "
                                 f"{(out / 'stderr').read_text()[-3000:]}") from None
    return job.returncode, (out / "stdout").read_text(), (out / "stderr").read_text()


@pytest.mark.parametrize("ending", ["pass", "sys.exit(0)", "sys.exit(3)"])
def test_a_rank_that_ends_while_its_peer_waits_under_torchrun_ends_the_job_promptly(tmp_path, ending):
    """Rank 0 ends (normally, or by sys.exit) while rank 1 waits for it in an all-reduce:
    its leaving barrier timed out and left the group alone, but the interpreter's shutdown
    then destroyed the group, joining gloo's thread still in the barrier -- for the
    group's 30-minute timeout, rank 1 waiting as long (still running after 12 minutes).
    Rank 0 now says why and ends at once, its outputs flushed; rank 1's all-reduce fails."""
    script = tmp_path / "rank.py"
    script.write_text(ENDING_RANK.format(ending=ending))
    status, out, err = _torchrun(script, tmp_path)
    assert status != 0, (out, err[-3000:])
    assert (tmp_path / "kept.txt").read_text() == "written before leaving"
    assert "rank 0 is done" in out, out
    assert "rank 0 of 2 left while a peer still waited in a collective" in err, err[-3000:]


@pytest.mark.parametrize("rank", ["0", "1"])
def test_train_runs_under_torchrun_without_a_process_group_is_refused(tmp_path, monkeypatch, rank):
    """`train_runs` called in a torchrun rank that joined no process group trained alone
    in every process, each as rank 0, all writing ``save_to`` -- silently. It now refuses,
    naming the variables it saw and what to call."""
    from gnnfuse.distributed import DistributedError
    from gnnfuse.training import make_config, train_runs
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    save = tmp_path / "runs.pt"
    with pytest.raises(DistributedError, match=r"WORLD_SIZE=2.*RANK=" + rank + r".*init_process_group"):
        train_runs(make_config("gcn", "synthetic", epochs=2), save_to=str(save), log_epochs=False)
    assert not save.exists()
