"""Shared fixtures: the read-only real data sets beside the repository, the test folder
on sys.path so test modules can import the model zoo, and Triton's CPU interpreter on
machines without a GPU (it must be chosen before triton is first imported)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = TESTS.parent.parent / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"real data sets not found at {path} (the ../shared/data folder beside the repository)")
    return path
