"""gnnfuse's generated kernels autotuned in Triton's interpreter, every config of each
compared on its first launch (`backend.triton.config_check`).

The interpreter has no benchmarker and gnnfuse launches one fixed config per kernel
there (`executor._autotune` is False under TRITON_INTERPRET), so CI never runs the other
configs a GPU's autotuner may pick. Here the kernels are built autotuned, the
autotuner's timer is a stand-in that runs a config once and calls it as fast as any
other, and Triton's on-disk tuning cache is bypassed; with ``GNNFUSE_CHECK_CONFIGS=1`` each
first launch per call signature then runs every config on copies of the same arguments
and raises `ConfigMismatch` where one writes other values. The interpreter runs what a
kernel says, not what a compiler made of it, so a mismatch here is a kernel whose result
depends on its block size (a masked tail right at one block only, a per-program output
the check must sum), which no GPU timing decides to show or hide.

Used by tests/test_config_check.py's fixture and, for any test file, by conftest.py when
``GNNFUSE_TEST_EVERY_CONFIG=1`` is set (slow: every config of every kernel interpreted).
"""
from __future__ import annotations

import os

import pytest
import torch
from triton.runtime.autotuner import Autotuner

from gnnfuse.backend.triton import config_check, executor

VARIABLE = "GNNFUSE_TEST_EVERY_CONFIG"


def asked() -> bool:
    """Whether ``GNNFUSE_TEST_EVERY_CONFIG`` asks every test to run so (conftest.py)."""
    return os.environ.get(VARIABLE, "0") not in ("", "0")


def untimed(fn, quantiles=None):
    """The autotuner's timer on a CPU: every config equally fast, none run (the check
    has run each already; the autotuner then takes the first)."""
    return [1.0, 1.0, 1.0]


def interpret_every_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch for the rest of the test (through ``monkeypatch``): kernels generated
    autotuned, run in the interpreter, every config compared on first launch. Skipped on
    a GPU machine: there Triton was imported before TRITON_INTERPRET was set (conftest.py
    sets it only without a GPU), and the interpreter then cannot run the ``tl`` functions
    Triton defines with ``@triton.jit`` (``tl.zeros``, ``tl.sum``), which every generated
    kernel calls; the GPU suite checks every config on the real kernels instead."""
    if torch.cuda.is_available():
        pytest.skip("every config in the interpreter runs on a machine without a GPU")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(config_check.VARIABLE, "1")
    monkeypatch.setattr(executor, "_autotune", lambda: True)
    monkeypatch.setattr(Autotuner, "do_bench", property(lambda self: untimed))
    monkeypatch.setattr(Autotuner, "check_disk_cache", lambda self, key, configs, bench: bench() and False)
