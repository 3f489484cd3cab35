"""`StepCapture` and `audit_step` on the CPU: the eager fallback gives the numbers an
uncaptured loop gives and says why once; the audit names what a CUDA graph could not
replay; replays copy moved inputs and refuse changed shapes, replaced parameters and a
switched train/eval mode. Real capture needs a GPU (benchmarks/check_cuda_graph.py);
the bookkeeping around it runs here against `_Rerun`, a stand-in whose replay re-runs
the captured function on the static buffers, which is what a CUDA graph replays."""
from __future__ import annotations

import collections
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

from gnnfuse import nn as gnn_nn
from gnnfuse.graph import Graph
from gnnfuse.ir import get_op
from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning, StepCapture, audit_step, release_captures


class _Rerun:
    """Capture runs the function once; replay runs it again and writes its results into
    the outputs of the capture, as a graph's kernels write its static outputs."""

    def capture(self, fn):
        self.fn = fn
        self.outputs = fn()
        return self.outputs

    def replay(self):
        fresh = self.fn()
        for static, value in zip(torch.utils._pytree.tree_leaves(self.outputs),
                                 torch.utils._pytree.tree_leaves(fresh)):
            static.copy_(value)


class _FailingCapture(_Rerun):
    def capture(self, fn):
        fn()
        raise RuntimeError("operation not permitted when stream is capturing")


def _graph() -> Graph:
    src = torch.tensor([0, 1, 2, 3, 4, 0, 2, 5])
    dst = torch.tensor([1, 2, 3, 4, 5, 5, 0, 1])
    return Graph(src, dst, 6)


def _training(seed: int, optimizer=torch.optim.Adam):
    """A dropout GCN on a tiny graph, its optimizer and one step function, from ``seed``."""
    torch.manual_seed(seed)
    graph, x, y = _graph(), torch.randn(6, 5), torch.tensor([0, 1, 0, 1, 1, 0])
    model = torch.nn.ModuleList([gnn_nn.GCNConv(5, 8), gnn_nn.GCNConv(8, 2)])
    opt = optimizer(model.parameters(), lr=0.05)

    def step():
        opt.zero_grad(set_to_none=True)
        h = F.dropout(torch.relu(model[0](x, graph)), 0.5, True)
        loss = F.cross_entropy(model[1](h, graph), y)
        loss.backward()
        opt.step()
        return loss
    return model, opt, step


def test_cpu_fallback_trains_exactly_as_eager_and_says_why_once():
    model, _, step = _training(0)
    eager = [step().item() for _ in range(6)]
    captured_model, opt, captured_step = _training(0)
    capture = StepCapture(captured_step, optimizers=[opt], modules=[captured_model], mode="on")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = [capture().item() for _ in range(6)]
    assert losses == eager
    for mine, theirs in zip(captured_model.parameters(), model.parameters()):
        assert torch.equal(mine, theirs)
    fallbacks = [w for w in caught if issubclass(w.category, CaptureFallbackWarning)]
    assert len(fallbacks) == 1 and "CUDA device" in str(fallbacks[0].message)
    assert fallbacks[0].filename == __file__      # the user's line, not gnnfuse's
    assert not capture.captured and capture.status.startswith("eager: CUDA graphs need a CUDA device")


@pytest.mark.parametrize("mode, status", [("auto", "eager: CUDA graphs need"), ("off", "eager: disabled")])
def test_auto_and_off_run_eagerly_without_a_warning(mode, status):
    _, opt, step = _training(1)
    capture = StepCapture(step, optimizers=[opt], mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        capture(), capture()
    assert capture.status.startswith(status)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="mode must be one of"):
        StepCapture(lambda: None, mode="always")
    for warmup in (0, "3", None, 1.5, True):
        with pytest.raises(ValueError, match="warmup must be a whole number of at least 1"):
            StepCapture(lambda: None, warmup=warmup)
    from gnnfuse.training import BlockStepCapture, GraphStepCapture
    for capture in (BlockStepCapture, GraphStepCapture):      # at construction, not at the first padded batch
        with pytest.raises(ValueError, match="warmup must be"):
            capture(lambda batch: None, warmup=0)


def test_audit_accepts_a_device_only_step():
    x = torch.randn(5, 3)
    result, reason = audit_step(lambda: (x * 2).sum(), torch.device("cpu"))
    assert reason is None and torch.equal(result, (x * 2).sum())


@pytest.mark.parametrize("step, named", [
    (lambda x: float(x.sum()), "Tensor.__float__"),
    (lambda x: torch.nonzero(x > 0), "torch.nonzero"),
    (lambda x: x[x > 0], "boolean mask"),
    (lambda x: x.sum() if x.sum() > 0 else x.mean(), "Tensor.__bool__"),   # `if tensor:`
    (lambda x: x.sum().item(), "Tensor.item"),
])
def test_audit_names_host_synchronisations(step, named):
    result, reason = audit_step(lambda: step(torch.randn(5, 3)), torch.device("cpu"))
    assert reason is not None and named in reason


def test_audit_names_the_line_of_the_read():
    def step(x):
        return x.sum().item()
    _, reason = audit_step(lambda: step(torch.randn(5, 3)), torch.device("cpu"))
    line = step.__code__.co_firstlineno + 1
    assert reason.endswith(f", at {__file__}:{line} (step)")


def test_audit_names_gnnfuse_s_own_read_and_the_step_s_line_that_led_there():
    """A new graph's ids are checked on the host on its first call: the reason names
    gnnfuse's line, the step's, and the longer warm-up that avoids it."""
    layer, x, edge_index = gnn_nn.GCNConv(3, 2), torch.randn(4, 3), torch.tensor([[0, 1, 2], [1, 2, 3]])

    def step():
        return layer(x, edge_index)
    _, reason = audit_step(step, torch.device("cpu"))
    assert "Tensor.tolist" in reason and ", in gnnfuse/graph/validate.py:" in reason
    assert f"called from {__file__}:{step.__code__.co_firstlineno + 1} (step)" in reason
    assert "warmup=2 or more" in reason


def test_audit_reads_metadata_of_another_devices_tensors_without_objection():
    """Sizes and dtypes of a CPU tensor freeze no value: only calls that make or read a
    tensor's values count."""
    index = torch.arange(3)
    _, reason = audit_step(lambda: torch.zeros(index.numel(), index.shape[0], device="meta").sum(),
                           torch.device("meta"))
    assert reason is None


def test_the_audited_step_runs_the_ops_an_unaudited_step_runs():
    """Before: the audit was a dispatch mode, under which torch's backward formulas take
    their out-of-place variants: ``x[index]``'s backward made its zeroed gradient and
    then a second one by ``index_put`` (2.7 GB more than the step on an ogbn-mag-sized
    R-GCN, the peak of the run). The audited step must run the same aten ops."""
    from torch.profiler import ProfilerActivity, profile
    weight, index = torch.randn(50, 4, requires_grad=True), torch.tensor([1, 3, 3, 7])

    def step():
        weight.grad = None
        loss = torch.nn.functional.cross_entropy((weight * 2)[index], torch.tensor([0, 1, 2, 3]))
        loss.backward()
        return loss

    def aten_ops(run):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    plain = aten_ops(step)
    audited = aten_ops(lambda: audit_step(step, torch.device("cpu")))
    assert "aten::_index_put_impl_" in plain and "aten::index_put" not in plain
    assert audited == plain


def test_audit_names_work_off_the_capture_device():
    """A CPU tensor inside a CUDA step is read at capture and frozen: the audit of a
    step meant for another device (meta here) reports the first CPU op."""
    _, reason = audit_step(lambda: torch.ones(3) * 2, torch.device("meta"))
    assert reason is not None and "cpu tensor" in reason


def test_const_op_fills_on_the_device_without_a_host_copy():
    """Before: torch.tensor(value, device=...) copied a host scalar to the GPU on every
    call (a synchronisation, which also breaks capture); the audit saw no device op."""
    class Ctx:
        device = torch.device("meta")
    seen = []

    class Watch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen.append((func.overloadpacket.__name__, out.device.type))
            return out
    with Watch():
        value = get_op("const").run(Ctx(), [], [], {"value": 0.5, "dtype": torch.float32})
    assert value.device.type == "meta" and seen == [("full", "meta")]


def _captured(step, **kwargs) -> StepCapture:
    return StepCapture(step, warmup=1, _graph_factory=_Rerun, **kwargs)


def test_a_released_capture_drops_its_graph_and_runs_eagerly():
    """A data-parallel step's graph holds NCCL work and must go before the process group."""
    calls = []
    capture = _captured(lambda x: calls.append("step") or x * 2)
    capture(torch.ones(3))
    assert capture.captured
    capture.release()
    assert not capture.captured and capture.static_inputs == [] and "released" in capture.status
    calls.clear()
    assert torch.equal(capture(torch.full((2,), 3.0)), torch.full((2,), 6.0))    # any shape: eager now
    assert calls == ["step"]


def test_release_captures_releases_every_graph_still_held():
    """What leave_process_group runs first: a step still referenced anywhere (a user's
    variable, an exception's traceback) lets its graph go before the process group."""
    release_captures()
    held = [_captured(lambda x: x + 1), _captured(lambda x: x * 3)]
    for capture in held:
        capture(torch.ones(2))
    never = _captured(lambda x: x - 1)                 # warming up: no graph to release
    assert all(c.captured for c in held)
    assert release_captures() == 2
    assert not any(c.captured for c in held) and never.reason is None
    assert release_captures() == 0


def test_replay_copies_new_input_data_into_the_static_buffer():
    capture = _captured(lambda x: x * 2)
    first = torch.ones(3)
    capture(first)
    assert capture.captured
    moved = torch.full((3,), 4.0)
    assert torch.equal(capture(moved), moved * 2)
    capture.static_inputs[0].fill_(5.0)            # written in place: no copy, same result
    assert torch.equal(capture(capture.static_inputs[0]), torch.full((3,), 10.0))
    assert torch.equal(first, torch.ones(3))       # the caller's first tensor is never written


def test_replay_returns_copies_unless_asked_for_the_static_outputs():
    capture = _captured(lambda x: x + 1)
    capture(torch.zeros(2))
    a = capture(torch.zeros(2))
    b = capture(torch.ones(2))
    assert torch.equal(a, torch.ones(2)) and torch.equal(b, torch.full((2,), 2.0))
    static = _captured(lambda x: x + 1, copy_outputs=False)
    static(torch.zeros(2))
    assert static(torch.zeros(2)) is static(torch.ones(2))


@pytest.mark.parametrize("given, error", [
    (torch.zeros(4), "changed from"), (torch.zeros(3, dtype=torch.float64), "changed from"),
    (torch.zeros(6)[::2], "changed from"), ("x", "was a tensor")])
def test_replay_refuses_changed_shapes_dtypes_and_strides(given, error):
    capture = _captured(lambda x: x * 2)
    capture(torch.zeros(3))
    with pytest.raises((ValueError, TypeError), match=error):
        capture(given)


def test_replay_refuses_a_changed_python_argument():
    capture = _captured(lambda x, scale: x * scale)
    capture(torch.ones(2), 2.0)
    assert torch.equal(capture(torch.ones(2), 2.0), torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="changed from 2.0 to 3.0"):
        capture(torch.ones(2), 3.0)


def test_replay_refuses_replaced_parameters_and_a_switched_mode():
    layer = torch.nn.Linear(3, 2)
    capture = _captured(lambda: layer(torch.ones(1, 3)), modules=[layer])
    capture()
    with torch.no_grad():
        layer.weight.copy_(torch.zeros(2, 3))      # in place: fine, and seen by the replay
    assert torch.equal(capture(), layer.bias.detach().unsqueeze(0))
    layer.eval()
    with pytest.raises(RuntimeError, match="train\\(\\) and eval\\(\\)"):
        capture()
    layer.train()
    layer.weight.data = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="new storage"):
        capture()


@pytest.mark.parametrize("change", ["replace", "add", "remove"])
def test_replay_refuses_a_changed_submodule(change):
    """The replay runs the modules it captured: one replaced, added or removed since
    would be silently skipped or kept."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    capture = _captured(lambda: model(torch.ones(1, 3)), modules=[model])
    capture()
    capture()
    if change == "replace":
        model[1] = torch.nn.Tanh()
    elif change == "add":
        model.append(torch.nn.Identity())
    else:
        del model[1]
    with pytest.raises(RuntimeError, match="added, removed or replaced"):
        capture()


def test_an_optimizer_without_capturable_runs_eagerly_with_a_reason():
    model, opt, step = _training(2)
    capture = StepCapture(step, optimizers=[opt], warmup=2, _graph_factory=_Rerun)
    with pytest.warns(CaptureFallbackWarning, match="capturable=True"):
        capture(), capture()
    assert not capture.captured
    capture()          # later calls: eager, no new warning (an error under pytest.warns' absence)


def test_an_unreplayable_step_runs_eagerly_after_one_warning():
    calls = []

    def step(x):
        calls.append(1)
        return x[x > 0].sum()
    capture = StepCapture(step, warmup=2, _graph_factory=_Rerun)
    x = torch.tensor([1.0, -1.0, 2.0])
    with pytest.warns(CaptureFallbackWarning, match="boolean mask"):
        results = [capture(x), capture(x)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        results.append(capture(x))
    assert [r.item() for r in results] == [3.0, 3.0, 3.0] and len(calls) == 3


def test_a_failed_capture_falls_back_and_drops_unwritten_gradients():
    model, opt, step = _training(3, torch.optim.SGD)     # no host-side step count (Adam's capturable is CUDA-only)
    capture = StepCapture(step, optimizers=[opt], modules=[model], warmup=2, _graph_factory=_FailingCapture)
    with pytest.warns(CaptureFallbackWarning, match="capture failed .*stream is capturing"):
        capture(), capture()     # the first call builds the graph's caches (a boolean mask): not audited
    assert not capture.captured and all(p.grad is None for p in model.parameters())


def test_the_audited_call_frees_its_autograd_graph_before_the_capture():
    """Before: the audited call's loss was held, with its graph and the parameters'
    AccumulateGrad nodes (made on the default stream), while the capture ran; the
    captured backward then reached the default stream and failed on an H100."""
    import gc
    model, opt, step = _training(3, torch.optim.SGD)
    seen_at_capture = []

    def tensors_with_a_graph() -> set[int]:
        return {id(obj) for obj in gc.get_objects() if type(obj) is torch.Tensor and obj.grad_fn is not None}

    class Watching(_Rerun):
        def capture(self, fn):
            seen_at_capture.append(tensors_with_a_graph() - before)
            return super().capture(fn)

    capture = StepCapture(lambda: {"loss": step()}, optimizers=[opt], modules=[model], warmup=2,
                          _graph_factory=Watching)
    capture()                # the first call builds the graph's caches (a boolean mask)
    before = tensors_with_a_graph()          # other tests' leftovers
    audited = capture()
    assert capture.captured and audited["loss"].grad_fn is None
    assert seen_at_capture == [set()]


def test_sage_on_a_graph_with_unread_rows_is_replayable_after_its_first_call():
    """Before: SAGEConv's transform-before-aggregate ran torch.nonzero over the vertices
    without out-edges on every call (a host sync per step, and an unreplayable step)."""
    graph = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 4)    # vertex 3 sends nothing
    layer, x = gnn_nn.SAGEConv(6, 2), torch.randn(4, 6)
    first = layer(x, graph)
    again, reason = audit_step(lambda: layer(x, graph), torch.device("cpu"))
    assert reason is None and torch.equal(again, first)


@pytest.mark.parametrize("batches", [{}, {"fanout": (3, 2), "batch_size": 512}], ids=["full-graph", "mini-batch"])
def test_training_with_cuda_graph_on_falls_back_on_the_cpu_with_the_same_history(batches):
    """Mini-batch training on the CPU said nothing and reported "disabled (mode 'off')"."""
    from gnnfuse.training import make_config, train_runs
    config = make_config("sage" if batches else "gcn", epochs=3, **batches)
    eager = train_runs(config, log_epochs=False, cuda_graph="off").runs[0]
    with pytest.warns(CaptureFallbackWarning, match="CUDA device") as caught:
        asked = train_runs(config, log_epochs=False, cuda_graph="on").runs[0]
    assert len([w for w in caught if issubclass(w.category, CaptureFallbackWarning)]) == 1
    timings = ("seconds", "stage_")
    assert {k: v for k, v in asked.history.items() if not any(t in k for t in timings)} == \
        {k: v for k, v in eager.history.items() if not any(t in k for t in timings)}
    assert asked.cuda_graph.startswith("eager: CUDA graphs need")
    assert eager.cuda_graph == "eager: disabled (mode 'off')"


def test_cli_train_takes_the_cuda_graph_flag(capsys):
    from gnnfuse.cli import main
    assert main(["train", "--epochs", "2", "--cuda-graph", "off"]) == 0
    with pytest.raises(SystemExit):
        main(["train", "--epochs", "2", "--cuda-graph", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


def test_bench_reports_how_gnnfuse_step_ran(tmp_path, capsys):
    import json

    from gnnfuse import bench
    from gnnfuse.cli import main
    assert main(["bench", "--dataset", "synthetic", "--frameworks", "gnnfuse", "--steps", "1", "--warmup", "1",
                 "--cuda-graph", "off", "--json", str(tmp_path / "bench.json")]) == 0
    assert "CUDA graph of gnnfuse's training step: eager: disabled (mode 'off')" in capsys.readouterr().out
    cell = json.loads((tmp_path / "bench.json").read_text())["results"]["gnnfuse"]
    assert cell["status"] == "ok" and cell["cuda_graph"] == "eager: disabled (mode 'off')"
    assert cell["warmup"] >= 3 and cell["host_ms"] > 0    # the timed steps would be replays where it captures
    with pytest.raises(ValueError, match="pyg-compile-ro"):
        bench.run_bench("gcn", "synthetic", "cpu", ("pyg-cudagraphs",), log=lambda m: None)


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="real CUDA-graph capture needs a GPU")


def _gpu_gcn_training(mode: str, lr=0.05, schedule: bool = False):
    """Six steps of a two-layer GCN with capturable Adam on the GPU, captured or not
    (``mode``), its LR stepped after each (``schedule``): (capture, losses, weights)."""
    torch.manual_seed(0)
    graph = _graph().to("cuda")
    x, y = torch.randn(6, 5, device="cuda"), torch.tensor([0, 1, 0, 1, 1, 0], device="cuda")
    model = torch.nn.ModuleList([gnn_nn.GCNConv(5, 8), gnn_nn.GCNConv(8, 2)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=lr, capturable=True)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7) if schedule else None

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model[1](torch.relu(model[0](x, graph)), graph), y)
        loss.backward()
        opt.step()
        return loss
    capture = StepCapture(step, optimizers=[opt], modules=[model], mode=mode)
    losses = []
    for _ in range(6):
        losses.append(capture())
        if scheduler is not None:
            scheduler.step()
    return capture, torch.stack(losses), list(model.parameters())


def _same_training(a, b) -> None:
    torch.testing.assert_close(a[1], b[1], rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(a[2], b[2]):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


@needs_gpu
def test_gpu_captured_training_matches_eager():
    """Dropout-free GCN steps replayed from a CUDA graph give eager's losses and weights."""
    captured = _gpu_gcn_training("on")
    assert captured[0].status == "captured"
    _same_training(captured, _gpu_gcn_training("off"))


@needs_gpu
def test_gpu_a_syncing_step_falls_back_with_the_reason():
    x = torch.randn(8, device="cuda")
    capture = StepCapture(lambda: x * float(x.sum()), mode="auto")
    with pytest.warns(CaptureFallbackWarning, match="Tensor.__float__"):
        results = [capture() for _ in range(4)]
    assert not capture.captured and all(torch.equal(r, x * float(x.sum())) for r in results)


def test_a_container_of_tensors_is_not_captured():
    capture = _captured(lambda tables: tables["x"] * 2)
    with pytest.warns(CaptureFallbackWarning, match="argument 0 is a dict holding tensors"):
        assert torch.equal(capture({"x": torch.ones(2)}), torch.full((2,), 2.0))
    assert not capture.captured and torch.equal(capture({"x": torch.zeros(2)}), torch.zeros(2))


def test_sync_debug_mode_notice_is_not_a_synchronisation(monkeypatch):
    """Turning torch's sync debug mode on warns that it "is a prototype feature and does not
    yet detect all synchronizing operations"; the audit took that notice for a sync and no
    step was ever captured on the H100. Only torch's actual report counts."""
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: warnings.warn(
        "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations")
        if mode == "warn" else None)
    cuda = torch.device("cuda")
    assert audit_step(lambda: 1, cuda) == (1, None)
    _, reason = audit_step(lambda: warnings.warn("called a synchronizing CUDA operation"), cuda)
    assert reason is not None and "called a synchronizing" in reason


def test_every_capture_on_a_device_shares_one_stream(monkeypatch):
    """A stream per capture made cuBLAS's and cuBLASLt's workspaces (32 MiB each on
    Hopper) anew for every captured step; `capture_stream` makes one per device."""
    from gnnfuse.runtime import cuda_graph
    made = []
    monkeypatch.setattr(cuda_graph, "_CAPTURE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", lambda index: made.append(index) or object())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    first = cuda_graph.capture_stream(torch.device("cuda", 0))
    assert cuda_graph.capture_stream(0) is first and made == [0]
    assert cuda_graph.capture_stream(torch.device("cuda")) is not first and made == [0, 1]
    assert cuda_graph.capture_stream(1) is cuda_graph.capture_stream(torch.device("cuda")) and made == [0, 1]
    steps = [StepCapture(lambda: None) for _ in range(2)]
    assert steps[0]._side_stream(torch.device("cuda", 0)) is steps[1]._side_stream(torch.device("cuda", 0)) is first


@needs_gpu
def test_gpu_a_second_capture_makes_no_new_blas_workspace():
    """The second of two captured steps with matrix products allocates only its own
    tensors: no second pair of 32 MiB workspaces."""
    def captured_step():
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        x = torch.randn(128, 64, device="cuda")

        def step():
            opt.zero_grad(set_to_none=False)
            loss = lin(x).square().mean()
            loss.backward()
            opt.step()
            return loss
        capture = StepCapture(step, optimizers=[opt], modules=[lin], mode="on")
        for _ in range(5):
            capture()
        assert capture.status == "captured"
        return capture
    keep = [captured_step()]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    keep.append(captured_step())
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 8 * 2**20


def _sgd_capture(**options):
    layer = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(layer.parameters(), **options)

    def step():
        opt.zero_grad()
        loss = layer(torch.ones(1, 3)).sum()
        loss.backward()
        opt.step()
        return loss
    capture = _captured(step, optimizers=[opt], modules=[layer])
    capture()
    capture()
    return layer, opt, capture


def test_replay_refuses_a_learning_rate_a_scheduler_changed_and_names_the_tensor_fix():
    """A float lr is a constant of the recorded kernels: a scheduler's new value would be
    ignored by every replay."""
    _, opt, capture = _sgd_capture(lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)    # adds initial_lr: no change
    capture()
    scheduler.step()
    with pytest.raises(RuntimeError, match=r"param group 0 'lr' changed from 0.1 to 0.05.*tensor learning rate"):
        capture()


def test_replay_refuses_changed_optimizer_settings_and_groups_and_frozen_parameters():
    layer, opt, capture = _sgd_capture(lr=0.1, momentum=0.9)
    opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(RuntimeError, match="'momentum' changed from 0.9 to 0.5"):
        capture()
    opt.param_groups[0]["momentum"] = 0.9
    capture()
    layer.bias.requires_grad_(False)
    with pytest.raises(RuntimeError, match="Linear.bias's requires_grad changed to False"):
        capture()
    layer.bias.requires_grad_(True)
    opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
    with pytest.raises(RuntimeError, match="parameter groups changed"):
        capture()


def test_a_tensor_learning_rate_changed_in_place_replays():
    _, opt, capture = _sgd_capture(lr=torch.tensor(0.1))
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scheduler.step()
    capture()        # not refused: the same tensor, which a replay reads (on a GPU: the test below)
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.05)


@needs_gpu
def test_gpu_a_scheduled_tensor_learning_rate_replays_as_eager_and_a_float_one_is_refused():
    """(SGD reads a tensor lr on the host: its step is not captured.)"""
    captured = _gpu_gcn_training("on", torch.tensor(0.05, device="cuda"), schedule=True)
    assert captured[0].status == "captured"
    _same_training(captured, _gpu_gcn_training("off", torch.tensor(0.05, device="cuda"), schedule=True))
    as_captured = 0.05 * 0.7 * 0.7      # two scheduler steps, in the scheduler's float arithmetic
    with pytest.raises(RuntimeError, match=f"'lr' changed from {re.escape(repr(as_captured))} "):
        _gpu_gcn_training("on", 0.05, schedule=True)
