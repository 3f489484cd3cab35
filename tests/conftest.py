"""Shared fixtures: the read-only real data sets beside the repository, and the test
folder on sys.path so test modules can import the model zoo."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = TESTS.parent.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"real data sets not found at {path} (the ../shared/data folder beside the repository)")
    return path
