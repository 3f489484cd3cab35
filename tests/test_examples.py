"""Each script in examples/ runs end to end on CPU for a couple of epochs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["gat_vertex", "gat_message", "custom_attention"])
def test_example_trains(name):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(EXAMPLES.parent / "src"), os.environ.get("PYTHONPATH", "")]), "GNNFUSE_BACKEND": "reference"}
    done = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--epochs", "2"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "epoch   2" in done.stdout and "test accuracy" in done.stdout
    if name == "gat_message":
        assert "max |difference|" in done.stdout


@pytest.mark.parametrize("epochs", ["0", "-3"])
def test_example_refuses_no_epochs_by_name(epochs):
    """With --epochs 0 the loop ran no epoch and then read the last epoch's logits, an
    UnboundLocalError naming `logits`; it is a usage error naming the option."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(EXAMPLES / "gat_vertex.py"), "--epochs", epochs], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "--epochs" in done.stderr and "at least 1" in done.stderr
