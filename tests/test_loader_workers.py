"""NeighborLoader's worker processes (loader/workers.py): the batches of a loader without
workers, in order, over several epochs; an abandoned epoch leaves nothing behind; a
worker's failure reaches the training loop with its traceback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import gnnfuse
from gnnfuse.loader import NeighborLoader


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _graph_and_features(device: str = "cpu") -> tuple[gnnfuse.Graph, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    graph = gnnfuse.Graph(torch.randint(0, 50, (300,), generator=gen), torch.randint(0, 50, (300,), generator=gen), 50)
    return graph.to(device), torch.randn(50, 4, generator=gen).to(device)


def _epochs(loader: NeighborLoader, count: int) -> list:
    torch.manual_seed(11)
    return [[(b.n_id, b.x, b.y, [(blk.edge_index, blk.graph.reverse_csr()) for blk in b.blocks]) for b in loader]
            for _ in range(count)]


@pytest.mark.parametrize("device", DEVICES)
def test_workers_yield_the_batches_of_a_loader_without_them(device):
    """On a GPU the batches come through CUDA IPC, on the CPU through shared memory."""
    graph, x = _graph_and_features(device)
    y = torch.arange(50, device=device)
    make = lambda **kw: NeighborLoader(graph, [4, 3], batch_size=7, shuffle=True, x=x, y=y, **kw)  # noqa: E731
    plain = _epochs(make(prefetch=0), 2)
    loader = make(num_workers=2)
    try:
        with_workers = _epochs(loader, 2)
        totals = loader.stage_times.totals()
    finally:
        loader.close()
    assert [len(epoch) for epoch in plain] == [8, 8]
    assert not torch.equal(plain[0][0][0], plain[1][0][0])        # each epoch draws anew
    for a, b in zip(plain, with_workers, strict=True):
        for batch_a, batch_b in zip(a, b, strict=True):
            torch.testing.assert_close(batch_a, batch_b, rtol=0, atol=0)
    assert loader.stage_times.batches == 16
    assert totals["sample"] > 0 and totals["reindex"] > 0 and totals["lookup"] > 0


def test_an_abandoned_epoch_leaves_nothing_for_the_next_and_failures_carry_the_workers_traceback():
    graph, x = _graph_and_features()
    loader = NeighborLoader(graph, [3], batch_size=5, x=x, num_workers=1, prefetch=2)
    processes = []
    try:
        first = next(iter(loader))                # abandoned after one batch, two more already queued
        processes = loader_processes(loader)
        full = [b.n_id for b in loader]
        assert len(full) == 10 and torch.equal(full[0][:5], first.n_id[:5])
        assert torch.equal(torch.cat([ids[:5] for ids in full]), torch.arange(50))
    finally:
        loader.close()
    assert processes and all(not p.is_alive() for p in processes)

    broken = NeighborLoader(graph, [3], batch_size=5, x=x, num_workers=1)
    broken._maker.rowptr = broken._maker.rowptr * 100     # sampled edges now read past the column array
    try:
        with pytest.raises(RuntimeError, match=r"worker 0 failed on batch 0:\n.*Traceback"):
            list(broken)
    finally:
        broken.close()


def test_an_epoch_started_while_another_is_iterated_supersedes_it_and_the_first_says_so():
    """With workers, a second iteration started while the first was live (a peek,
    ``next(iter(loader))``, in the middle of an epoch) left the first waiting forever:
    the peek's abandonment told the workers to skip every epoch up to its own, and the
    first then waited for a batch no worker would make. Now the new epoch supersedes the
    old one, whose next batch raises, saying why (run in a thread: the hang is caught)."""
    graph, x = _graph_and_features()
    loader = NeighborLoader(graph, [3], batch_size=5, x=x, num_workers=1)
    first = iter(loader)
    outcome: dict[str, str] = {}

    def resume_first() -> None:
        try:
            next(first)
            outcome["got"] = "a batch"
        except RuntimeError as exc:
            outcome["got"] = str(exc)
    try:
        assert torch.equal(next(first).n_id[:5], torch.arange(5))
        assert torch.equal(next(iter(loader)).n_id[:5], torch.arange(5))      # the peek
        thread = threading.Thread(target=resume_first, daemon=True)
        thread.start()
        thread.join(30)
        hung = thread.is_alive()
        if not hung:
            assert len(list(loader)) == 10            # whole epochs still come after
    finally:
        loader.close()
    assert not hung, "the first epoch waited forever for its second batch"
    assert "superseded" in outcome["got"]


def loader_processes(loader: NeighborLoader) -> list:
    workers = loader._preparation.workers
    return [] if workers is None else workers._processes


def test_bad_worker_counts_are_refused():
    graph, x = _graph_and_features()
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        NeighborLoader(graph, [3], x=x, num_workers=-1)


def run_script(script) -> str:
    """What the training script ``script`` printed, run as a user runs it; it must exit 0."""
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_script_without_a_main_guard_starts_its_workers(tmp_path):
    """Spawned workers do not import the training script: one without ``if __name__ ==
    "__main__":`` would otherwise run again in every worker and fail there."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, gnnfuse\n"
        "from gnnfuse.loader import NeighborLoader\n"
        "g = gnnfuse.Graph(torch.randint(0, 30, (100,)), torch.randint(0, 30, (100,)), 30)\n"
        "loader = NeighborLoader(g, [3], batch_size=5, x=torch.randn(30, 2), num_workers=1)\n"
        "print('batches', sum(1 for _ in loader), 'and', sum(1 for _ in loader))\n")
    assert run_script(script) == "batches 6 and 6"


def test_a_hetero_data_referring_to_the_scripts_own_class_is_refused_naming_it(tmp_path):
    """The workers do not import the script, so a HeteroData (sent whole) holding an
    object of a class the script defines killed each at start, and the loader said only
    "worker 0 exited (code 1) before batch 0"; now it names the class before starting any."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from torch_geometric.data import HeteroData\n"
        "from gnnfuse.loader import NeighborLoader\n"
        "class Vocabulary:\n"
        "    pass\n"
        "data = HeteroData()\n"
        "data['paper'].x = torch.randn(6, 2)\n"
        "data['paper', 'cites', 'paper'].edge_index = torch.tensor([[1, 2, 3], [0, 0, 3]])\n"
        "data.vocabulary = Vocabulary()\n"
        "loader = NeighborLoader(data, [2], batch_size=3, input_nodes='paper', num_workers=1)\n"
        "try:\n"
        "    next(iter(loader))\n"
        "except TypeError as exc:\n"
        "    print(exc)\n")
    out = run_script(script)
    assert "refer to 'Vocabulary', defined in it" in out and "num_workers=0" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned features are read by a CUDA kernel")
def test_workers_read_pinned_features_from_shared_memory():
    """With features in host memory the workers share one shared-memory table, each
    page-locking it for the zero-copy gather: the batches equal device-feature ones."""
    graph, x = _graph_and_features("cuda")
    plain = _epochs(NeighborLoader(graph, [4, 3], batch_size=7, shuffle=True, x=x, prefetch=0), 1)
    loader = NeighborLoader(graph, [4, 3], batch_size=7, shuffle=True, x=x.cpu(), device="cuda",
                            feature_device="pinned", num_workers=2)
    try:
        pinned = _epochs(loader, 1)
    finally:
        loader.close()
    for a, b in zip(plain[0], pinned[0], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_workers_share_this_process_threads(monkeypatch):
    """Each worker gets its share of the intra-op threads (workers and this process), at
    least one: each with every core, their OpenMP pools oversubscribed the CPU."""
    from gnnfuse.loader.workers import worker_threads
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert [worker_threads(n) for n in (1, 2, 3, 15, 16)] == [8, 5, 4, 1, 1]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert worker_threads(2) == 1


def test_workers_end_once_the_training_process_is_killed(tmp_path):
    """A training process ended by SIGKILL (or a crash) never tells its workers to stop:
    they polled for jobs for good, orphaned, each holding the graph and using CPU."""
    script, pids_file = tmp_path / "train.py", tmp_path / "pids"
    script.write_text(
        "import multiprocessing, os, sys, torch, gnnfuse\n"
        "from gnnfuse.loader import NeighborLoader\n"
        "g = gnnfuse.Graph(torch.randint(0, 30, (100,)), torch.randint(0, 30, (100,)), 30)\n"
        "loader = NeighborLoader(g, [3], batch_size=5, x=torch.randn(30, 2), num_workers=1)\n"
        "next(iter(loader))\n"
        "open(sys.argv[1], 'w').write(' '.join(str(p.pid) for p in multiprocessing.active_children()))\n"
        "os._exit(0)\n")         # no finalizer runs, as under SIGKILL
    # not piped: an orphaned worker would hold the pipe open
    done = subprocess.run([sys.executable, str(script), str(pids_file)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0
    pids = [int(pid) for pid in pids_file.read_text().split()]
    assert pids
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []
