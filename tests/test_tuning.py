"""The tuner (`gnnfuse tune`, FeatGraph's grid search) on the CPU backend: it times every
fused unit of a tiny model's forward and backward programs over a small schedule space,
stores the fastest per unit, reuses stored choices on a second run; the backend then
runs the stored choice (the values unchanged against the reference backend), `explain`
says so, and a corrupt or stale file is ignored with a warning."""
from __future__ import annotations

import contextlib
import json
import warnings

import pytest
import torch

pytest.importorskip("numba")

import gnnfuse  # noqa: E402
from gnnfuse import nn as gnn  # noqa: E402
from gnnfuse.backend import tuned_schedule  # noqa: E402
from gnnfuse.backend.cpu import executor as cpu_executor  # noqa: E402
from gnnfuse.backend.cpu import schedule as cpu_schedule  # noqa: E402
from gnnfuse.backend.forced_schedule import ForcedSchedule, forcing  # noqa: E402
from gnnfuse.cli import main  # noqa: E402
from gnnfuse.tuning import candidates, tune  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private tuned-schedule file, read afresh by this test."""
    path = tmp_path / "tuned.json"
    monkeypatch.setenv(tuned_schedule.PATH_ENV, str(path))
    monkeypatch.setattr(tuned_schedule, "_loaded", {"path": None, "version": None, "checked": 0.0, "entries": {}})
    monkeypatch.setattr(tuned_schedule, "_warned", set())
    return path


def tiny():
    src = torch.tensor([0, 0, 2, 3, 1, 4, 0, 5, 3, 6, 1])
    dst = torch.tensor([1, 1, 2, 1, 3, 4, 3, 3, 0, 5, 6])
    graph = gnnfuse.Graph(src, dst, 7)
    torch.manual_seed(0)
    model = gnn.GCNConv(8, 3).double()     # maps first (3 lanes twice < 8 once), so it aggregates backward too
    x = torch.randn(7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return model, graph, x


def output_and_grads(model, graph, x, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    x = x.clone().requires_grad_()
    model.zero_grad()
    out = model(x, graph)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum().backward()
    return [out.detach(), x.grad, *(p.grad.clone() for p in model.parameters())]


def test_tune_stores_choices_and_a_second_run_reuses_them(cache, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    model, graph, x = tiny()
    first = tune(lambda: model(x, graph), "cpu", space="small", repeats=1)
    # GCN: forward aggregation by destination, backward by source (the input gradient)
    assert {r.unit.split("]")[0] for r in first} >= {"unit reduce[sum by dst", "unit reduce[sum by src"}
    assert not any(r.reused for r in first) and all(r.candidates > 1 for r in first)
    stored = json.loads(cache.read_text())
    assert stored["stamp"] == tuned_schedule.STAMP and set(stored["entries"]) == {r.key for r in first}
    timed = []
    monkeypatch.setattr("gnnfuse.tuning.search.time_calls", lambda *a: timed.append(a) or [1.0])
    second = tune(lambda: model(x, graph), "cpu", space="small", repeats=1)
    assert all(r.reused for r in second) and not timed
    assert {r.key: r.schedule for r in second} == {r.key: r.schedule for r in first}


def test_the_backend_runs_the_tuned_choice_with_unchanged_values(cache, monkeypatch):
    model, graph, x = tiny()
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    results = tune(lambda: model(x, graph), "cpu", space="small", repeats=1)
    # Whatever the timings said, store a choice that changes the kernels: two-column
    # tiles over source ranges of one vertex each.
    tuned_schedule.store({r.key: {"schedule": {"feature_tile": 2, "partition_bytes": 8}} for r in results})
    chosen, partitioned = [], []
    real_chosen, real_kernel_for = cpu_schedule.chosen, cpu_executor._kernel_for
    monkeypatch.setattr(cpu_schedule, "chosen", lambda *a: chosen.append(real_chosen(*a)) or chosen[-1])
    monkeypatch.setattr(cpu_executor, "_kernel_for",
                        lambda unit, acc, par, parts=False, *kind: partitioned.append(parts) or real_kernel_for(
                            unit, acc, par, parts, *kind))
    got = output_and_grads(model, graph, x, "cpu", monkeypatch)
    assert chosen and all(c.feature_tile == 2 and c.partition_bytes == 8 for c in chosen) and any(partitioned)
    expected = output_and_grads(model, graph, x, "reference", monkeypatch)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    report = str(gnnfuse.explain(model, x, graph))
    assert "tuned schedule, cpu backend: feature tile 2, source partitions of 8 B" in report
    # explained on the cpu backend, every unit it runs with a stored choice is marked: the
    # Triton plan it showed added the bias inside the forward sum, a unit of another key
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    report = str(gnnfuse.explain(model, x.requires_grad_(), graph))
    assert "executor: cpu (the plans below are its units" in report
    assert report.count("[tuned schedule, cpu backend: ") == len(results) == 2, report


def test_explain_marks_no_stored_choice_the_backend_passes_over(cache, monkeypatch):
    """GNNFUSE_CPU_FEATURE_TILE or a schedule the call forces wins over a stored choice
    (`forced_or_tuned`): the report said the stored choice ran while the override did."""
    model, graph, x = tiny()
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    results = tune(lambda: model(x, graph), "cpu", space="small", repeats=1)
    tuned_schedule.store({r.key: {"schedule": {"feature_tile": 2}} for r in results})
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    assert str(gnnfuse.explain(model, x.requires_grad_(), graph)).count("[tuned schedule, cpu backend: ") == 2
    with forcing(ForcedSchedule(feature_tile=3)):
        assert "[tuned schedule" not in str(gnnfuse.explain(model, x, graph))
    monkeypatch.setenv("GNNFUSE_CPU_FEATURE_TILE", "3")
    assert "[tuned schedule" not in str(gnnfuse.explain(model, x, graph))


@pytest.mark.parametrize("content, message", [
    ("{not json", "ignoring the tuned-schedule cache"),
    (json.dumps({"stamp": {"format": 0}, "entries": {}}), "written for other kernels"),
    pytest.param("[" * 100_000 + "]" * 100_000, "ignoring the tuned-schedule cache", id="nested too deep"),
])
def test_a_corrupt_or_stale_cache_is_ignored_with_a_warning(content, message, cache, monkeypatch):
    model, graph, x = tiny()
    expected = output_and_grads(model, graph, x, "reference", monkeypatch)
    cache.write_text(content)
    with pytest.warns(RuntimeWarning, match=message):
        got = output_and_grads(model, graph, x, "cpu", monkeypatch)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        output_and_grads(model, graph, x, "cpu", monkeypatch)   # warned once, not per call


def test_a_corrupt_entry_is_skipped_and_the_others_kept(cache, monkeypatch):
    cache.write_text(json.dumps({"stamp": tuned_schedule.STAMP, "entries": {
        "a": {"schedule": {"feature_tile": 2}}, "b": {"schedule": {"chunk": -3}}, "c": {"nothing": 1},
        "d": {"schedule": {"feature_tile": 3}}, "e": {"schedule": {"kind": "diagonal"}}}}))
    with pytest.warns(RuntimeWarning, match="corrupt entry"):
        table = tuned_schedule.entries()
    assert set(table) == {"a"} and table["a"].feature_tile == 2



@pytest.mark.parametrize("tile", [1 << 40, 2048, True])
def test_an_entry_naming_a_tile_gspmm_would_refuse_is_skipped(tile, cache):
    """A stored tile of 2**40 was taken, and the Triton backend then failed in its kernel
    (Scalar 1099511627776 is out of range for type int32) instead of running its cost rule."""
    cache.write_text(json.dumps({"stamp": tuned_schedule.STAMP, "entries": {
        "a": {"schedule": {"feature_tile": 1024}}, "b": {"schedule": {"feature_tile": tile}}}}))
    with pytest.warns(RuntimeWarning, match="corrupt entry"):
        table = tuned_schedule.entries()
    assert set(table) == {"a"}

def test_a_chunk_on_a_serial_kernel_leaves_torch_threads_alone(monkeypatch):
    """Setting Numba's chunk size starts its thread pool, which resets OpenMP's (and so
    torch's) thread count to every core: serial kernels must not set it. (Checked on
    the call, since a pool started by an earlier test would hide the reset.)"""
    model, graph, x = tiny()
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    entered = []
    monkeypatch.setattr(cpu_executor.numba, "parallel_chunksize",
                        lambda n: entered.append(n) or contextlib.nullcontext())
    with forcing(ForcedSchedule(chunk=4)):
        model(x, graph)
    assert not entered and torch.get_num_threads() == 1


def test_spaces_start_with_the_cost_rule_and_grow_with_threads():
    model, graph, x = tiny()
    from gnnfuse.passes.fusion import partition
    from gnnfuse.runtime.compiled import record_calls
    with record_calls() as calls:
        model(x, graph)
    unit = next(u for u in partition(calls[0].compiled.program) if hasattr(u, "reduce"))
    one, two = candidates(unit, "cpu", 1), candidates(unit, "cpu", 2)
    assert one[0] == two[0] == gnnfuse.ops.Schedule() and len(two) > len(one) > 1
    assert len(set(one)) == len(one) and all(s.feature_tile is None or s.feature_tile < 4 for s in one)
    triton = candidates(unit, "triton", 1)
    assert {s.kind for s in triton} == {"auto", "csr", "coo", "rows"}
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:     # a forced coo is refused under the switch: the tuner (which forces each candidate) skips it
        torch.use_deterministic_algorithms(True)
        assert {s.kind for s in candidates(unit, "triton", 1)} == {"auto", "csr", "rows"}
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_tune_command_line_errors(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["tune", "--dataset", "cora", "--backend", "cpu", "--device", "cuda"])
    assert stop.value.code == 2 and "--backend cpu runs host tensors" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["tune", "--dataset", "nosuch", "--space", "small"])
    assert stop.value.code == 2


def test_a_store_that_is_a_folder_is_refused_before_the_search(tmp_path, monkeypatch, capsys):
    """The whole search ran, then os.replace failed with an IsADirectoryError traceback
    and left a temporary file beside the folder."""
    monkeypatch.setenv(tuned_schedule.PATH_ENV, str(tmp_path))
    monkeypatch.setattr("gnnfuse.tuning.command.tune", lambda *args, **kwargs: pytest.fail("searched"))
    with pytest.raises(SystemExit) as stop:
        main(["tune", "--dataset", "synthetic", "--space", "small"])
    assert stop.value.code == 2 and f"{tmp_path} " in capsys.readouterr().err
    with pytest.raises(IsADirectoryError):
        tuned_schedule.store({})
    assert list(tmp_path.parent.glob("*.tmp*")) == []


def test_a_store_under_a_file_is_refused_before_the_search_and_a_missing_folder_is_not(tmp_path, monkeypatch,
                                                                                       capsys):
    """Under a file, the search ran, then the store's mkdir failed with FileExistsError and
    the results were lost; a folder that does not exist yet is made by the store."""
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv(tuned_schedule.PATH_ENV, str(tmp_path / "afile" / "tuned.json"))
    monkeypatch.setattr("gnnfuse.tuning.command.tune", lambda *args, **kwargs: pytest.fail("searched"))
    with pytest.raises(SystemExit) as stop:
        main(["tune", "--dataset", "synthetic", "--space", "small"])
    assert stop.value.code == 2 and f"{tmp_path / 'afile'} is a file, not a folder" in capsys.readouterr().err
    monkeypatch.setenv(tuned_schedule.PATH_ENV, str(tmp_path / "new" / "tuned.json"))
    monkeypatch.setattr("gnnfuse.tuning.command.tune", lambda *args, **kwargs: [])
    main(["tune", "--dataset", "synthetic", "--space", "small"])
    assert "choices in" in capsys.readouterr().out


def test_the_triton_backend_runs_a_tuned_choice(cache, monkeypatch):
    """A stored Triton choice (here the vertex-parallel CSR schedule with 2-wide feature
    blocks, where the cost rule picks the edge-parallel COO one for this sparse graph)
    is what runs, forward and backward, with the values of the reference backend;
    GNNFUSE_SCHEDULE still overrides it."""
    pytest.importorskip("triton")
    from gnnfuse.backend.triton import executor as triton_executor
    from gnnfuse.runtime.compiled import record_calls
    from oracle_check import device_for
    device = device_for("triton")
    model, graph, x = tiny()
    model, graph, x = model.to(device), graph.to(device), x.to(device)
    coo = []
    real = triton_executor._plan_coo_unit   # planned once per unit, graph and settings (launch_cache.py)
    monkeypatch.setattr(triton_executor, "_plan_coo_unit", lambda *a: coo.append(1) or real(*a))
    with record_calls() as calls:
        output_and_grads(model, graph, x, "triton", monkeypatch)
    assert len(coo) == 2, "the cost rule no longer picks COO here: pick another tuned choice"
    call = calls[0]
    units = [u for p in (call.compiled.program, call.compiled.backward_for(call.wrt).program)
             for u in gnnfuse.passes.fusion.partition(p, row_addends=True) if hasattr(u, "reduce")]
    tuned_schedule.store({tuned_schedule.key(u, call.graph, "triton"): {"schedule": {"kind": "csr", "feature_tile": 2}}
                          for u in units})
    got = output_and_grads(model, graph, x, "triton", monkeypatch)
    assert len(coo) == 2, "a tuned CSR choice ran as COO"
    for a, b in zip(got, output_and_grads(model, graph, x, "reference", monkeypatch)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    report = str(gnnfuse.explain(model, x, graph))
    assert report.count("[csr schedule on CUDA] [tuned schedule, triton backend: csr schedule, feature tile 2]") == 2   # forward, backward
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    output_and_grads(model, graph, x, "triton", monkeypatch)
    assert len(coo) == 4


def test_tune_command_tunes_then_reuses(cache, capsys, monkeypatch):
    # Unpartitioned schedules only: a partitioned kernel is one more compile per unit on a cold
    # CI cache, and partitions are tested above.
    real = gnnfuse.tuning.search.candidates
    monkeypatch.setattr("gnnfuse.tuning.search.candidates",
                        lambda *a: [s for s in real(*a) if s.partition_bytes is None])
    assert main(["tune", "--dataset", "synthetic", "--model", "gcn", "--space", "small", "--repeats", "1"]) == 0
    first = capsys.readouterr().out
    assert "tuning the cpu backend for gcn on synthetic" in first and "0 reused" in first
    assert cache.exists()
    assert main(["tune", "--dataset", "synthetic", "--model", "gcn", "--space", "small"]) == 0
    second = capsys.readouterr().out
    assert "0 unit(s) tuned" in second and "reused:" in second


def test_a_store_keeps_the_choices_another_process_stored_since_the_last_lookup(cache):
    """`store` merged into `entries`' table, which a lookup had read up to a second
    before: another `gnnfuse tune` run's choices written in between were dropped."""
    tuned_schedule.store({"mine-1": {"schedule": {"feature_tile": 2}}})
    tuned_schedule.entries()                     # a launch's lookup, cached for a second
    data = json.loads(cache.read_text())         # another process's store, now
    data["entries"]["other"] = {"schedule": {"feature_tile": 4}}
    aside = cache.with_name("other.json")
    aside.write_text(json.dumps(data))
    aside.replace(cache)
    tuned_schedule.store({"mine-2": {"schedule": {"feature_tile": 8}}})
    assert sorted(json.loads(cache.read_text())["entries"]) == ["mine-1", "mine-2", "other"]


def test_the_store_gets_a_new_files_permissions_not_a_private_temporary_files(cache):
    """The store was renamed from a 0600 temporary file: a store shared by several users
    became unreadable to all but the last one to tune."""
    import os
    mask = os.umask(0o022)
    try:
        tuned_schedule.store({"mine": {"schedule": {"feature_tile": 2}}})
    finally:
        os.umask(mask)
    assert cache.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in cache.parent.iterdir() if ".tmp" in p.name] == []


def test_a_shared_store_keeps_its_permissions_and_its_symbolic_link(cache, tmp_path):
    """A store that was a symbolic link to a shared file was replaced by a file of this
    user's own (the others never saw the choices), and a group-writable store became the
    umask's 0644 on the first store, locking the group out."""
    import os
    shared = tmp_path / "shared" / "tuned.json"
    shared.parent.mkdir()
    tuned_schedule.store({"first": {"schedule": {"feature_tile": 2}}})
    cache.replace(shared)
    cache.symlink_to(shared)
    shared.chmod(0o664)
    mask = os.umask(0o022)
    try:
        tuned_schedule.store({"mine": {"schedule": {"feature_tile": 4}}})
    finally:
        os.umask(mask)
    assert cache.is_symlink() and cache.resolve() == shared.resolve()
    assert sorted(json.loads(shared.read_text())["entries"]) == ["first", "mine"]
    assert shared.stat().st_mode & 0o777 == 0o664



def test_a_ctrl_c_mid_search_keeps_the_units_already_tuned(cache, monkeypatch):
    """Choices were stored only after the last unit, so a Ctrl-C in a long search lost
    every unit already timed; the unit being timed when it came is not stored."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    model, graph, x = tiny()
    real = gnnfuse.tuning.search._time_schedules
    calls = []

    def stopped_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr("gnnfuse.tuning.search._time_schedules", stopped_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        tune(lambda: model(x, graph), "cpu", space="small", repeats=1)
    assert len(json.loads(cache.read_text())["entries"]) == 1
    monkeypatch.setattr("gnnfuse.tuning.search._time_schedules", real)
    again = tune(lambda: model(x, graph), "cpu", space="small", repeats=1)
    assert sum(r.reused for r in again) == 1 and len(again) >= 2


@pytest.mark.parametrize("content", [json.dumps({"model": "gcn", "results": {}}) + "\n", "a,b\n1,2\n"],
                         ids=["another command's JSON", "not JSON"])
def test_a_store_path_naming_a_file_that_is_not_a_store_is_refused_before_the_search(content, cache, monkeypatch,
                                                                                     capsys):
    """$GNNFUSE_TUNED_SCHEDULES pointed at another file (a `gnnfuse bench --json` result)
    was searched, then silently replaced by the store: the file's content was lost."""
    cache.write_text(content)
    monkeypatch.setattr("gnnfuse.tuning.command.tune", lambda *args, **kwargs: pytest.fail("searched"))
    with pytest.raises(SystemExit) as stop:
        main(["tune", "--dataset", "synthetic", "--space", "small"])
    assert stop.value.code == 2 and "is not a store of tuned choices" in capsys.readouterr().err
    assert cache.read_text() == content
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    model, graph, x = tiny()
    with pytest.raises(ValueError, match="is not a store of tuned choices"):
        tune(lambda: model(x, graph), "cpu", space="small", repeats=1)
    assert cache.read_text() == content
    cache.write_text(json.dumps({"stamp": {"format": 0}, "entries": {}}))     # a stale store is replaced
    assert len(tune(lambda: model(x, graph), "cpu", space="small", repeats=1)) >= 2
    assert json.loads(cache.read_text())["stamp"] == tuned_schedule.STAMP


def timed_by_schedule(monkeypatch, rounds: dict[ForcedSchedule, list[float]], repeats: int) -> None:
    """Make every timed call under schedule ``s`` take ``rounds[s][i]`` ms in repeat round
    ``i`` (the untimed warm-up call 100 ms; schedules not named 2 ms a round)."""
    from gnnfuse.backend import forced_schedule
    calls: dict[ForcedSchedule, int] = {}

    def fake_time_calls(fn, count, device):
        schedule = forced_schedule._CURRENT.get()
        done = calls.get(schedule, 0)
        calls[schedule] = done + 1
        step = done % (repeats + 1)          # each unit calls each schedule once, then once a round
        return [100.0 if step == 0 else rounds.get(schedule, [2.0] * repeats)[step - 1]]
    monkeypatch.setattr("gnnfuse.tuning.search.time_calls", fake_time_calls)


def test_the_tuner_keeps_the_schedule_with_the_fastest_repeat_and_reports_the_cost_rules_time(cache, monkeypatch):
    """Hand-set times: the cost rule takes 3 ms a call, feature tile 2 takes 1 ms then 5 ms
    (its fastest call is the fastest of all), every other schedule 2 ms. The tuner must
    keep tile 2 at 1 ms and report the cost rule's 3 ms beside it, in its results and in
    the store."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    model, graph, x = tiny()
    tile = ForcedSchedule(feature_tile=2)
    timed_by_schedule(monkeypatch, {ForcedSchedule(): [3.0, 3.0], tile: [1.0, 5.0]}, repeats=2)
    results = tune(lambda: model(x, graph), "cpu", space="small", repeats=2)
    assert results and all(r.candidates > 2 for r in results)
    for result in results:
        assert (result.schedule, result.best_ms, result.cost_rule_ms) == (tile, 1.0, 3.0)
    for entry in json.loads(cache.read_text())["entries"].values():
        assert (entry["ms"], entry["cost_rule_ms"]) == (1.0, 3.0)


def test_retune_times_units_with_a_stored_choice_again_and_stores_the_new_choice(cache, monkeypatch):
    """A first search stores tile 2 (the fastest then); with ``retune`` the stored choices
    are timed again, not reused, and the schedule now fastest replaces them."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    model, graph, x = tiny()
    tile, untiled = ForcedSchedule(feature_tile=2), ForcedSchedule()
    timed_by_schedule(monkeypatch, {untiled: [3.0], tile: [1.0]}, repeats=1)
    assert {r.schedule for r in tune(lambda: model(x, graph), "cpu", space="small", repeats=1)} == {tile}
    timed_by_schedule(monkeypatch, {untiled: [0.5], tile: [1.0]}, repeats=1)
    again = tune(lambda: model(x, graph), "cpu", space="small", repeats=1, retune=True)
    assert again and not any(r.reused for r in again) and {r.schedule for r in again} == {untiled}
    assert {e["ms"] for e in json.loads(cache.read_text())["entries"].values()} == {0.5}
