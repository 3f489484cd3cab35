"""Shared fixtures: the read-only real data sets beside the repository, the test folder
on sys.path so test modules can import the model zoo, Triton's CPU interpreter on
machines without a GPU (it must be chosen before triton is first imported), one
torch thread, the `backend`/`device` pair that runs a test on both backends, and a limit
that stops a hung run."""
from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Test tensors are tiny: torch's intra-op threads cost more than they save, and on a
# 2-core CI machine they made the suite 2-3x slower.
torch.set_num_threads(1)
os.environ.setdefault("GNNFUSE_NUM_THREADS", "1")     # and for the CLI, which sets its own count
# Tests never reach the network: a Planetoid download they trigger goes to a closed
# loopback port (tests of the download serve files on 127.0.0.1 themselves).
os.environ["GNNFUSE_PLANETOID_URL"] = "http://127.0.0.1:9/planetoid"
# Tests never read the tuner's choices stored on this machine (gnnfuse tune): the CPU and
# Triton backends run their cost rules unless a test stores choices of its own.
os.environ["GNNFUSE_TUNED_SCHEDULES"] = str(Path(__file__).resolve().parent / "no-tuned-schedules.json")

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from oracle_check import device_for  # noqa: E402  (needs the test folder on sys.path)

from gnnfuse.data.paths import DATA_ENV  # noqa: E402  (after the interpreter is chosen above)


# A test still running after this long is hung (the slowest takes ~50 s on a cold 2-core
# machine): its process stops with every thread's traceback (under pytest-xdist the test
# fails as its worker's crash and the run goes on) instead of waiting for CI's own limit,
# which ended the run of 0e9f523 after 90 minutes with no sign of where it hung.
HANG_LIMIT_S = 600
_REAL_STDERR: list[int] = []


def pytest_configure(config) -> None:
    _REAL_STDERR.append(os.dup(sys.stderr.fileno()))     # not yet captured here, unlike at import


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True, file=_REAL_STDERR[0])
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def _loader_blocks_as_at_start():
    """A layer that asks for a loader block's self-looped graph makes the loader build
    it for every later block at that position (`nn.conv.looped_blocks_wanted`); each test
    starts as a fresh process would."""
    from gnnfuse.nn import conv
    conv._LOOPED_POSITIONS.clear()
    yield


@pytest.fixture(params=["reference", "triton"])
def backend(request, monkeypatch) -> str:
    """Runs a test once per backend, forced through GNNFUSE_BACKEND. Triton needs its
    graph and tensors on `device_for` (CUDA on a GPU machine): use the `device` fixture."""
    monkeypatch.setenv("GNNFUSE_BACKEND", request.param)
    return request.param


@pytest.fixture
def device(backend: str) -> str:
    """Where the graph, features and oracle tensors of a `backend` test live."""
    return device_for(backend)


@pytest.fixture
def fresh_compile(monkeypatch) -> None:
    """Programs compiled afresh during the test: an empty structure cache (`compiled_for`)
    and no cached traces. For tests that watch kernel source being generated or loaded,
    which happens once per compiled structure in a process: under xdist's work stealing an
    earlier test in the same worker may have compiled the same one, and then nothing is
    generated for the test to see (test_attention_gradient_row_sums_match_reference failed
    so once in a full run)."""
    from gnnfuse.frontend.trace_cache import clear_trace_caches
    from gnnfuse.runtime import compiled
    monkeypatch.setattr(compiled, "_BY_STRUCTURE", {})
    clear_trace_caches()


@pytest.fixture(autouse=True)
def _no_data_root_from_the_environment(monkeypatch):
    """Tests see no $GNNFUSE_DATA unless they set it: the loaders search it when no root
    is given, so a user's (or the GPU run's) setting would hand data to the tests of
    missing-data errors and downloads. `shared_data` reads it once, before this runs."""
    monkeypatch.delenv(DATA_ENV, raising=False)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data sets: $GNNFUSE_DATA when set (as the loaders read it; the GPU machine
    gets a copy carried in a git-ignored folder, since ``../shared`` does not travel
    there), else the ../shared/data folder beside the repository."""
    configured = os.environ.get(DATA_ENV)
    path = Path(configured) if configured else TESTS.parent.parent / "shared" / "data"
    if not path.is_dir():
        where = f"${DATA_ENV}" if configured else "the ../shared/data folder beside the repository"
        pytest.skip(f"real data sets not found at {path} ({where})")
    return path



@pytest.fixture
def import_script():
    """Import a module of a script folder (benchmarks/, examples/) whose scripts import
    their siblings by bare name (``from common import ...``). Both folders have a
    ``common``: whatever the import adds to ``sys.modules`` and ``sys.path`` is undone
    after the test, so the next folder's scripts get their own siblings. Only modules
    loaded from those folders are forgotten: a library module the script imported
    first (``multiprocessing.heap``, say) must stay, or a later import makes a second
    copy whose classes no longer pickle as the first's."""
    saved_path, saved_modules = list(sys.path), dict(sys.modules)
    folders: list[Path] = []

    def load(folder: Path, module: str):
        folders.append(Path(folder).resolve())
        sys.path.insert(0, str(folder))
        for name in (module, "common"):
            sys.modules.pop(name, None)
        return __import__(module)

    def from_folders(name: str) -> bool:
        file = getattr(sys.modules[name], "__file__", None)
        return file is not None and any(Path(file).resolve().is_relative_to(f) for f in folders)
    yield load
    sys.path[:] = saved_path
    for name in [n for n in set(sys.modules) - set(saved_modules) if from_folders(n)]:
        del sys.modules[name]
    sys.modules.update({n: m for n, m in saved_modules.items() if n in ("common",)})


@pytest.fixture(autouse=True)
def _every_config_when_asked(monkeypatch):
    """``GNNFUSE_TEST_EVERY_CONFIG=1``: every test runs gnnfuse's kernels autotuned in the
    interpreter, each config compared on first launch (tests/every_config.py); a kernel
    whose result depends on its block size raises `ConfigMismatch`. Off by default."""
    import every_config     # here, not at the top: it imports Triton, after the interpreter is chosen
    if every_config.asked():
        every_config.interpret_every_config(monkeypatch)
    yield
