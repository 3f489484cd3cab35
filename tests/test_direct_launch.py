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
        self.hooks = (metadata, enter, exit_)


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
    monkeypatch.setattr(direct_launch, "knobs", SimpleNamespace(runtime=SimpleNamespace(
        launch_enter_hook=None, launch_exit_hook=None)))
    monkeypatch.setattr(direct_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(direct_launch, "_raw_stream", lambda device: 777)


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


# --- a launch plan's bound launch (`BoundLaunch`) -----------------------------------------

def test_a_bound_launch_checks_only_the_varying_tensors(fake_triton):
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    index, x, out = torch.zeros(64, dtype=torch.int32), torch.zeros(64), torch.zeros(64)
    args = (index, out, 64, x, 7)
    fn.params.insert(3, Param("extra"))          # the shape of a plan's call: fixed, out, fixed, leaf, fixed
    assert replays.bind(grid, args, (1, 3)) is None      # nothing recorded yet: Triton launches first
    replays(grid, args)
    bound = replays.bind(grid, args, (1, 3))
    (compiled,) = fn.compiled.values()
    y, out2 = torch.ones(64), torch.ones(64)
    assert bound((out2, y)) and len(fn.through) == 1
    shape, stream, sent = compiled.runs[-1]
    assert shape == (4, 1, 1) and stream == 777
    # fixed tensors go as their addresses (Triton's launcher takes those unchecked), the call's as tensors
    assert sent[0] == index.data_ptr() and sent[1] is out2 and sent[2] == 64 and sent[3] is y
    assert sent[4:] == (7, 16, 2)
    assert not bound((out2, torch.ones(65)[1:]))      # 4 bytes off: another specialization
    assert not bound((out2, y.double()))
    assert len(compiled.runs) == 1 and len(fn.through) == 1      # neither launched anything


class _OnGpu(torch.Tensor):
    """A host tensor that says it is on CUDA device ``device``, as a bound launch asks."""
    device_index = 0

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return self.device_index


def _on_gpu(tensor: torch.Tensor, device: int = 0) -> torch.Tensor:
    t = tensor.as_subclass(_OnGpu)
    t.device_index = device
    return t


def test_a_bound_launch_passes_cuda_tensors_on_its_device_as_addresses(fake_triton):
    """A varying tensor on the CUDA device of the one the plan was bound with goes to the
    launcher as its address (no query there); one on another device, or not on CUDA,
    goes as the tensor, for Triton's launcher to check as it would."""
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    index = torch.zeros(64, dtype=torch.int32)
    args = (index, _on_gpu(torch.zeros(64)), 64, _on_gpu(torch.zeros(64)), 7)
    fn.params.insert(3, Param("extra"))
    replays(grid, args)
    bound = replays.bind(grid, args, (1, 3))
    (compiled,) = fn.compiled.values()
    out, y = _on_gpu(torch.ones(64)), _on_gpu(torch.ones(64))
    assert bound((out, y))
    sent = compiled.runs[-1][2]
    assert sent[1] == out.data_ptr() and sent[3] == y.data_ptr() and type(sent[3]) is int
    elsewhere, host = _on_gpu(torch.ones(64), device=1), torch.ones(64)
    assert bound((out, elsewhere)) and compiled.runs[-1][2][3] is elsewhere
    assert bound((host, y)) and compiled.runs[-1][2][1] is host


def test_a_bound_launch_takes_the_callers_own_tensors_unchecked_where_they_were_on_its_device(fake_triton):
    """The first ``made`` varying tensors (an executor's outputs, made for every call with
    the plan's dtype on its device) go as addresses without their checks where, as
    bound, each was an aligned CUDA tensor on the launch's device; the rest are checked
    as before. Bound on host tensors or on another device, every one is checked."""
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    index = torch.zeros(64, dtype=torch.int32)
    args = (index, _on_gpu(torch.zeros(64)), _on_gpu(torch.zeros(64)), _on_gpu(torch.zeros(64)), 7)
    replays(grid, args)
    bound = replays.bind(grid, args, (1, 2, 3), made=2)
    assert bound.made == (1, 2) and bound.checked == (3,)
    (compiled,) = fn.compiled.values()
    out, following, y = _on_gpu(torch.ones(64)), _on_gpu(torch.ones(64)), _on_gpu(torch.ones(64))
    assert bound((out, following, y))
    sent = compiled.runs[-1][2]
    assert sent[1] == out.data_ptr() and sent[2] == following.data_ptr() and sent[3] == y.data_ptr()
    assert not bound((out, following, y.double()))      # the leaf is still checked
    on_host = (index, torch.zeros(64), torch.zeros(64), torch.zeros(64), 7)
    replays(grid, on_host)
    checked = replays.bind(grid, on_host, (1, 2, 3), made=2)
    assert checked.made == () and checked.checked == (1, 2, 3)
    elsewhere = (index, _on_gpu(torch.zeros(64), device=1), _on_gpu(torch.zeros(64)), _on_gpu(torch.zeros(64)), 7)
    assert replays.bind(grid, elsewhere, (1, 2, 3), made=2).made == ()


def test_a_bound_launch_defers_to_triton_when_its_state_asks(fake_triton, monkeypatch):
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    args = (torch.zeros(16), torch.zeros(16), 16, 1)
    replays(grid, args)
    bound = replays.bind(grid, args, (0, 1))
    fn.pre_run_hooks = [lambda *a, **k: None]
    assert not bound(args[:2])
    fn.pre_run_hooks = []
    assert bound(args[:2])
    monkeypatch.setattr(direct_launch, "_current_device", lambda: 1)
    assert not bound(args[:2])
    fn.pre_run_hooks = [lambda *a, **k: None]
    assert replays.bind(grid, args, (0, 1)) is None


def test_a_bound_launch_keeps_none_of_the_calls_tensors(fake_triton):
    import gc
    import weakref
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    x, out = torch.zeros(64), torch.zeros(64)
    replays(grid, (x, out, 64, 7))
    bound = replays.bind(grid, (x, out, 64, 7), (0, 1))
    refs = [weakref.ref(x), weakref.ref(out)]
    fn.through.clear()
    del x, out
    gc.collect()
    assert all(r() is None for r in refs) and bound((torch.ones(64), torch.ones(64)))


def test_a_bound_launch_holds_the_fixed_tensors_whose_addresses_it_passes(fake_triton):
    import gc
    import weakref
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    index, out = torch.arange(64, dtype=torch.int32), torch.zeros(64)
    replays(grid, (index, out, 64, 7))
    bound = replays.bind(grid, (index, out, 64, 7), (1,))
    address, ref = index.data_ptr(), weakref.ref(index)
    fn.through.clear()                       # the stand-in's own record of the first call
    del index
    gc.collect()
    assert ref() is not None                  # its address is in every launch: it must stay allocated
    assert bound((torch.ones(64),))
    (compiled,) = fn.compiled.values()
    assert compiled.runs[-1][2][0] == address
    del bound
    gc.collect()
    assert ref() is None


def _launched_once(asked: list):
    """(Replays after Triton's first launch of one specialization, its arguments, the
    compiled kernel), the kernel's launch metadata requests appended to ``asked``."""
    fn = JitFunction()
    replays = Replays(fn, {"BLOCK": 16})
    args = (torch.zeros(64), torch.zeros(64), 64, 7)
    replays(grid, args)
    (compiled,) = fn.compiled.values()
    compiled.launch_metadata = lambda grid_, stream, *values: asked.append(values) or "meta"
    return replays, args, compiled


def test_launch_metadata_is_built_only_for_an_enter_hook(fake_triton):
    asked = []
    replays, args, compiled = _launched_once(asked)
    replays(grid, args)
    assert not asked and compiled.hooks == (None, None, None)
    hooked = []
    direct_launch.knobs.runtime.launch_enter_hook = hooked.append
    replays(grid, args)
    assert len(asked) == 1 and asked[0][:4] == args
    assert compiled.hooks == ("meta", hooked.append, None) and compiled.runs[-1][2][:4] == args


def test_empty_hook_chains_are_passed_as_no_hooks(fake_triton, monkeypatch):
    """Triton 3.6 keeps each launch hook as a ``HookChain``, never None: an empty chain
    goes to the launcher as None, with no metadata built; a chain with a hook (a
    profiler's) goes as it is, with the metadata, and the hook sees the launch."""
    chain = pytest.importorskip("triton.knobs").HookChain
    monkeypatch.setattr(direct_launch, "_HOOK_CHAIN", chain)
    enter, leave = chain(), chain(reversed=True)
    direct_launch.knobs.runtime.launch_enter_hook = enter
    direct_launch.knobs.runtime.launch_exit_hook = leave
    asked = []
    replays, args, compiled = _launched_once(asked)
    replays(grid, args)
    assert not asked and compiled.hooks == (None, None, None)
    seen = []
    enter.add(seen.append)
    replays(grid, args)
    assert len(asked) == 1 and compiled.hooks == ("meta", enter, None)
    compiled.hooks[1](compiled.hooks[0])        # what the launcher does with them
    assert seen == ["meta"]


class _Tuner:
    """An autotuner over a stand-in JIT function: what `launch` reads of one, nothing more."""

    def __new__(cls, fn):
        from triton.runtime.autotuner import Autotuner

        class Tuner(Autotuner):
            def __init__(self):
                self.fn, self.best_config = fn, SimpleNamespace(pre_hook=None, all_kwargs=lambda: {"BLOCK": 16})

            def __getitem__(self, grid_):
                return lambda *args, **kwargs: fn[grid_](*args, BLOCK=16)
        return Tuner()


def _bind_plan(plan, args, monkeypatch):
    """Launch ``plan`` through `executor._launch_bound` until it holds a bound launch."""
    from gnnfuse.backend.triton import executor, launch
    monkeypatch.setattr(launch, "first_launch", lambda call: call())
    # The stand-in tuner has no configs for the config check to compare (the GPU suite
    # sets GNNFUSE_CHECK_CONFIGS=1 for every test).
    monkeypatch.delenv("GNNFUSE_CHECK_CONFIGS", raising=False)
    for _ in range(3):
        executor._launch_bound(plan, args)
        if plan.bound[0] is not None:
            break
    return plan.bound[0]


def test_a_launch_plan_binds_after_tritons_first_launches(fake_triton, monkeypatch):
    """`executor._launch_bound` on a plan of an autotuned kernel: the autotuner's launch,
    then Triton's of the specialization, then the plan holds a bound launch whose
    varying positions are ``out`` and the leaves -- not the index arrays, counts or
    edge types around them."""
    from gnnfuse.backend.triton import executor

    fn = JitFunction()
    fn.params = [Param("rowptr"), Param("count"), Param("out"), Param("scale"), Param("x"), Param("y"),
                 Param("types"), Param("BLOCK", constexpr=True)]
    rowptr, types = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int8)
    plan = executor._Launch(kernel=_Tuner(fn), layouts=(), before=(rowptr, 40), after=(2,), out_shape=(40,),
                            out_dtype=torch.float32, device=torch.device("cpu"), zeros=False, zero_rows=None,
                            grid=lambda meta: (-(-40 // meta["BLOCK"]),), sizes=(1, 1), kwargs={}, signature="sig",
                            types=(types,), bound=[None, 0])
    bound = _bind_plan(plan, (rowptr, 40, torch.zeros(40), 2, torch.zeros(40), torch.zeros(40), types), monkeypatch)
    assert bound is not None and (*bound.made, *bound.checked) == (2, 4, 5)
    out, x, y = torch.ones(40), torch.ones(40), torch.ones(40)
    assert bound((out, x, y))
    (compiled,) = fn.compiled.values()
    shape, _, sent = compiled.runs[-1]
    assert shape == (3, 1, 1)
    assert sent[0] == rowptr.data_ptr() and sent[1] == 40 and sent[2] is out and sent[3] == 2 and sent[4] is x
    assert sent[5] is y and sent[6] == types.data_ptr() and sent[7] == 16


def test_a_plans_first_launch_binds_nothing(fake_triton, monkeypatch):
    """A new plan of a kernel whose specialization was launched already (the plan of the
    same unit on the previous batch's graph) could bind on its first launch, but a plan
    made for a graph used once never launches again: it binds from its second launch on."""
    from gnnfuse.backend.triton import executor, launch

    fn = JitFunction()
    fn.params = [Param("rowptr"), Param("count"), Param("out"), Param("x"), Param("BLOCK", constexpr=True)]
    kernel = _Tuner(fn)

    def plan():
        return executor._Launch(kernel=kernel, layouts=(), before=(torch.zeros(8, dtype=torch.int32), 40), after=(),
                                out_shape=(40,), out_dtype=torch.float32, device=torch.device("cpu"), zeros=False,
                                zero_rows=None, grid=lambda meta: (-(-40 // meta["BLOCK"]),), sizes=(1, 1),
                                kwargs={}, signature="sig", bound=[None, 0])

    def args(p):
        return (*p.before, torch.zeros(40), torch.zeros(40))
    first = plan()
    assert _bind_plan(first, args(first), monkeypatch) is not None      # the kernel's specialization is recorded
    binds = []
    monkeypatch.setattr(executor, "bind", lambda *a, **k: binds.append(a) or launch.bind(*a, **k))
    second = plan()
    executor._launch_bound(second, args(second))
    assert second.bound == [None, 1] and not binds
    executor._launch_bound(second, args(second))
    assert second.bound[0] is not None and len(binds) == 1


def test_a_sibling_groups_plan_binds_its_outputs_partials_and_leaves(fake_triton, monkeypatch):
    from gnnfuse.backend.triton import executor

    fn = JitFunction()
    fn.params = [Param("rowptr"), Param("count"), Param("a"), Param("b"), Param("part"), Param("x"),
                 Param("types"), Param("BLOCK", constexpr=True)]
    rowptr, types = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int8)
    plan = executor._SiblingLaunch(_Tuner(fn), (), (rowptr, 40), (), (), None, (), (types,), torch.device("cpu"),
                                   None, lambda meta: (-(-40 // meta["BLOCK"]),), (1,), {}, "sig", [None, 0])
    bound = _bind_plan(plan, (rowptr, 40, *[torch.zeros(40) for _ in range(4)], types), monkeypatch)
    assert bound is not None and (*bound.made, *bound.checked) == (2, 3, 4, 5)
    fresh = [torch.ones(40) for _ in range(4)]
    assert bound(fresh)
    (compiled,) = fn.compiled.values()
    _, _, sent = compiled.runs[-1]
    assert sent[0] == rowptr.data_ptr() and sent[1] == 40 and all(a is b for a, b in zip(sent[2:6], fresh))
    assert sent[6] == types.data_ptr() and sent[7] == 16


def test_a_constant_passed_by_position_makes_its_own_launch(fake_triton):
    """BLOCK given positionally: 16 and 32 have one fingerprint (both multiples of 16) but
    are two kernels, so the second value goes through Triton rather than replaying the
    first's."""
    fn = JitFunction()
    replays = Replays(fn, {})
    x, out = torch.zeros(64), torch.zeros(64)
    replays(grid, (x, out, 64, 7, 16))
    replays(grid, (x, out, 64, 7, 32))
    assert [call[1][4] for call in fn.through] == [16, 32]
    replays(grid, (x, out, 64, 7, 32))          # now recorded: replayed
    assert len(fn.through) == 2


def test_launch_replays_a_plain_jit_function(fake_triton):
    """`launch.launch` of a JIT function without an autotuner: Triton's first launch per
    specialization and keyword arguments, direct launches after; keyword values that do
    not hash keep going through Triton."""
    from gnnfuse.backend.triton.launch import launch
    fn = JitFunction()
    x, out = torch.zeros(64), torch.zeros(64)
    for _ in range(3):
        launch(fn, grid, (64,), (x, out, 64, 7), {"BLOCK": 16})
    launch(fn, grid, (64,), (x, out, 64, 7), {"BLOCK": 32})
    assert [call[2] for call in fn.through] == [{"BLOCK": 16}, {"BLOCK": 32}]
    assert sum(len(c.runs) for c in fn.compiled.values()) == 2
    for _ in range(2):
        launch(fn, grid, (64,), (x, out, 64, 7), {"BLOCK": 16, "extra": [1]})
    assert len(fn.through) == 4


class _Launcher36:
    """A launcher object shaped as Triton 3.6's: ``__call__`` passes its arguments on to
    ``launch`` (the C function) with its flags and no scratch."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self):
        self.calls, self.through_call = [], 0
        self.launch = lambda *args: self.calls.append(args)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.through_call += 1
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    None, None, *args)


@pytest.mark.parametrize("version, scratch, bare", [("3.6.0", 0, True), ("3.6.0", 64, False), ("3.9.0", 0, False)])
def test_a_direct_launch_calls_triton_36s_c_launcher_as_its_launcher_would(fake_triton, monkeypatch,
                                                                          version, scratch, bare):
    """Under Triton 3.6, a kernel without scratch is launched by the C function beneath its
    launcher object, with the arguments that object's ``__call__`` would pass; with
    scratch, or under another Triton (whose launcher passes other arguments), through
    the object."""
    monkeypatch.setattr(direct_launch, "_TRITON_VERSION", version)
    compiled = Compiled()
    compiled.run = _Launcher36()
    compiled.run.global_scratch_size = scratch
    launch = direct_launch.DirectLaunch(compiled, ["x", "out"], (16,), 0)
    x, out = torch.zeros(4), torch.zeros(4)
    launch((2, 1, 1), (x, out))
    compiled.run(2, 1, 1, 777, "fn-handle", "packed", None, None, None, x, out, 16)     # the object's own way
    direct, expected = compiled.run.calls
    assert direct == expected and compiled.run.through_call == (1 if bare else 2)
