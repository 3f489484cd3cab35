"""backend/triton/direct_launch.py without a GPU: a stand-in JIT function and compiled
kernel record what Triton would be asked, so the argument order, the constant tail, the
grid, the stream and the fallbacks are checked where CI runs (on the GPU every fused
kernel's second launch goes this way, and the GPU test files check their results)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gnnfuse.backend.triton import direct_launch
from gnnfuse.backend.triton.direct_launch import Replays, fingerprint


class Param:
    def __init__(self, name, constexpr=False, do_not_specialize=False, default=None):
        self.name, self.is_constexpr, self.do_not_specialize = name, constexpr, do_not_specialize
        self.has_default, self.default = default is not None, default


class Compiled:
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, g0, g1, g2, stream, function, packed, metadata, enter, exit_, *args):
        self.runs.append(((g0, g1, g2), stream, args))


class JitFunction:
    """Launches through "Triton" count in ``through``; each returns the compiled kernel
    of its fingerprint (None: an interpreter, which returns nothing)."""

    def __init__(self, returns=True):
        self.params = [Param("x"), Param("out"), Param("n"), Param("size_class", do_not_specialize=True),
                       Param("BLOCK", constexpr=True), Param("SCALE", constexpr=True, default=2)]
        self.through, self.returns, self.compiled = [], returns, {}

    def run(self, *args, **kwargs):
        raise AssertionError("launched through __getitem__")

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.through.append((grid, args, kwargs))
            spec = fingerprint(args, [not p.do_not_specialize for p in self.params])
            return self.compiled.setdefault(spec, Compiled()) if self.returns else None
        return launch


@pytest.fixture
def fake_triton(monkeypatch):
    monkeypatch.setattr(direct_launch, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: 777)))
    monkeypatch.setattr(direct_launch, "knobs", SimpleNamespace(runtime=SimpleNamespace(
        launch_enter_hook=None, launch_exit_hook=None)))


def grid(meta):
    return (-(-meta["n"] // meta["BLOCK"]),)


def test_a_launched_specialization_is_replayed_directly(fake_triton):
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16, "num_warps": 4})
    x, out = torch.zeros(64), torch.zeros(64)
    replays(grid, (x, out, 64, 7))
    assert len(fn.through) == 1 and fn.through[0][2] == {"BLOCK": 16, "num_warps": 4}
    y = torch.ones(64)                          # another tensor, same specialization
    replays(grid, (y, out, 64, 9))              # size_class is not specialized on
    (compiled,) = fn.compiled.values()
    assert len(fn.through) == 1 and len(compiled.runs) == 1
    shape, stream, args = compiled.runs[0]
    assert shape == (4, 1, 1) and stream == 777
    assert args[0] is y and args[1:] == (out, 64, 9, 16, 2)   # positional, then BLOCK, then SCALE's default
    replays(grid, (y, out, 48, 9))              # the grid reads this call's n (same specialization)
    assert len(fn.through) == 1 and compiled.runs[1][0] == (3, 1, 1)


def test_another_specialization_goes_through_triton_once(fake_triton):
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    x, out = torch.zeros(65), torch.zeros(64)
    replays(grid, (x[:64], out, 64, 1))
    replays(grid, (x[1:], out, 64, 1))          # 4 bytes off a 16-byte boundary
    replays(grid, (x[:64], out, 63, 1))         # no longer a multiple of 16
    replays(grid, (x[:64], out, 1, 1))          # equal to 1
    assert len(fn.through) == 4
    for args in [(x[1:], out, 64, 1), (x[:64], out, 63, 1), (x[:64], out, 1, 1), (x[:64], out, 64, 1)]:
        replays(grid, args)
    assert len(fn.through) == 4 and sum(len(c.runs) for c in fn.compiled.values()) == 4


def test_an_interpreter_launch_keeps_going_through_triton(fake_triton):
    fn = JitFunction(returns=False)
    replays = Replays(fn, {"BLOCK": 16})
    for _ in range(3):
        replays(grid, (torch.zeros(16), torch.zeros(16), 16, 1))
    assert len(fn.through) == 3


def test_without_knobs_nothing_is_replayed(monkeypatch):
    monkeypatch.setattr(direct_launch, "knobs", None)
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    for _ in range(2):
        replays(grid, (torch.zeros(16), torch.zeros(16), 16, 1))
    assert len(fn.through) == 2


def test_fingerprint_follows_tritons_specialization():
    x = torch.zeros(8)
    spec = [True, True, False]
    assert fingerprint((x, 32, 5), spec) == fingerprint((torch.ones(8), 48, 6), spec)
    assert fingerprint((x, 32, 5), spec) != fingerprint((x.double(), 32, 5), spec)
    assert fingerprint((x, 32, 5), spec) != fingerprint((x, 2**31, 5), spec)       # a 64-bit integer
    assert fingerprint((x, 32, 5), spec) != fingerprint((x, 32, 2**40), spec)      # width counts even unspecialized


def test_pre_run_hooks_send_every_call_through_triton(fake_triton):
    fn = JitFunction()
    fn.pre_run_hooks = [lambda *a, **k: None]
    replays = Replays(fn, {"BLOCK": 16})
    for _ in range(2):
        replays(grid, (torch.zeros(16), torch.zeros(16), 16, 1))
    assert len(fn.through) == 2


def test_a_recorded_launch_keeps_none_of_its_calls_tensors(fake_triton):
    """The recording call's tensors (a step's outputs and inputs) must die with the call:
    a replay keeps only the kernel and the constant arguments."""
    import gc
    import weakref
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    x, out = torch.zeros(64), torch.zeros(64)
    refs = [weakref.ref(x), weakref.ref(out)]
    replays(grid, (x, out, 64, 7))
    fn.through.clear()                       # the stand-in's own record of the call
    del x, out
    gc.collect()
    assert all(r() is None for r in refs)
    replays(grid, (torch.ones(64), torch.ones(64), 64, 7))
    assert not fn.through                    # still replayed directly
