"""What a benchmark number depends on besides the code: hardware, library versions, commit.

One implementation for ``gnnfuse bench --json`` and the scripts in benchmarks/: a result
file that said only ``"device": "cuda"`` could not tell an H100's numbers from an A100's,
nor which commit made them.
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from ..backend.tuned_schedule import cpu_name
from ..runtime.compiled import backend_name

# src/gnnfuse/bench/environment.py -> the repository root of a source checkout
REPO_ROOT = Path(__file__).resolve().parents[3]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                              timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _in_checkout() -> bool:
    """Whether gnnfuse runs from its own git checkout: an installed copy's folders may lie
    inside some other repository, whose commit would be recorded as gnnfuse's."""
    top = _git("rev-parse", "--show-toplevel")
    return top is not None and Path(top).resolve() == REPO_ROOT


def environment(device: torch.device) -> dict[str, Any]:
    """The run's hardware, versions, date and commit.

    ``git_dirty`` says whether tracked files differed from the commit, since a
    benchmark of uncommitted changes is not reproducible from the commit alone.
    ``threads`` (torch's CPU threads) and ``backend`` (what runs gnnfuse's programs on
    ``device``, `backend_name`) change a step's time as much as the machine does, and
    were not recorded.
    """
    import gnnfuse
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    try:
        import torch_geometric
        pyg_version = torch_geometric.__version__
    except ImportError:
        pyg_version = None
    # A copy of the tree on another machine may carry a stale .git (the device machine's
    # did, recording the seed commit for every run): GNNFUSE_COMMIT, set by whoever
    # knows what was sent, takes precedence over what git says there.
    sent = os.environ.get("GNNFUSE_COMMIT")
    checkout = not sent and _in_checkout()
    status = _git("status", "--porcelain", "--untracked-files=no") if checkout else None
    return {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
        else cpu_name(),          # platform.processor() is '' or 'x86_64' on Linux
        "threads": torch.get_num_threads(),
        "backend": backend_name(device.type == "cuda"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "torch_geometric": pyg_version,
        "gnnfuse": gnnfuse.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": sent or (_git("rev-parse", "HEAD") if checkout else None),
        "git_dirty": None if status is None else bool(status),
    }
