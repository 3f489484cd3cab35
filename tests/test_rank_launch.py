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

import json
import subprocess
import sys
from pathlib import Path

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
