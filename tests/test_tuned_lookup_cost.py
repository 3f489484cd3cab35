"""The tuned-schedule lookup every fused unit makes per call stays cheap between file
checks (no path is built), and still follows the variables that name the file."""
from __future__ import annotations

import json

from gnnfuse.backend import tuned_schedule


def test_entries_builds_no_path_between_checks_and_follows_the_variable(tmp_path, monkeypatch):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    stored = {"k": {"schedule": {"kind": "csr"}}}
    second.write_text(json.dumps({"stamp": tuned_schedule.STAMP, "entries": stored}))
    monkeypatch.setenv(tuned_schedule.PATH_ENV, str(first))
    assert tuned_schedule.entries() == {}
    built = []
    monkeypatch.setattr(tuned_schedule, "cache_path", lambda original=tuned_schedule.cache_path: built.append(1)
                        or original())
    for _ in range(5):
        assert tuned_schedule.entries() == {}
    assert built == [], "entries() built the cache path on a call between file checks"
    monkeypatch.setenv(tuned_schedule.PATH_ENV, str(second))        # another file: read at once
    assert set(tuned_schedule.entries()) == {"k"}
