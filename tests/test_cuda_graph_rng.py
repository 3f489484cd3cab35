"""A failed capture leaves torch's CUDA generator usable (`StepCapture`'s fallback).

On an H100 (torch 2.11) the first capture of a GCN step failed, fell back to eager as
it should, and the next eager step with dropout raised torch's "Offset increment
outside graph capture encountered unexpectedly". The cause is in torch's C++:
``CUDAGraph::capture_begin`` registers the default generator's state and calls its
``capture_prologue`` (``capturing_ = true``); ``capture_end`` calls
``capture_epilogue`` (``capturing_ = false``) only after ``cudaStreamEndCapture``
succeeds, so when the capture was invalidated it throws first and the state stays in
capture mode for good; every later eager draw checks ``!capturing_`` and throws.

These tests run `_CudaGraph`'s real logic against `_FakeCuda`, which models exactly
those rules of torch's generator state and graph (aten/src/ATen/cuda/CUDAGraph.cpp,
CUDAGeneratorImpl.cpp); a real capture is checked on the GPU by
benchmarks/check_cuda_graph.py's failed-capture section."""
from __future__ import annotations

import copy
import warnings

import pytest

from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning, GeneratorStuckError, StepCapture, _CudaGraph

DRAW = 4   # philox offset one dropout call advances (torch rounds increments to multiples of 4)


class _State:
    """CUDAGeneratorState: the philox offset eager draws advance, the offset a capture
    records into, and whether it is being captured."""

    def __init__(self) -> None:
        self.offset, self.intragraph, self.capturing = 0, 0, False


class _Generator:
    """A torch.Generator on CUDA: a handle on a shared `_State`."""

    def __init__(self, cuda: "_FakeCuda", state: _State):
        self.cuda, self.state = cuda, state

    def graphsafe_get_state(self) -> "_Generator":
        return _Generator(self.cuda, self.state)        # shares the state, as torch's does

    def graphsafe_set_state(self, other: "_Generator") -> None:
        self.state = other.state

    def clone_state(self) -> "_Generator":
        return _Generator(self.cuda, copy.copy(self.state))

    def increase(self, increment: int) -> None:
        """CUDAGeneratorState::increase: a draw inside a capture must find the state
        capturing, one outside must not."""
        if self.cuda.stream_capturing:
            if not self.state.capturing:
                raise RuntimeError("Attempt to increase offset for a CUDA generator not in capture mode.")
            self.state.intragraph += increment
        else:
            if self.state.capturing:
                raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")
            self.state.offset += increment


class _Graph:
    def __init__(self, cuda: "_FakeCuda"):
        self.cuda, self.state, self.increment = cuda, None, None

    def replay(self) -> None:   # replay_prologue: the graph's draws advance the state it registered
        assert self.increment is not None, "replay without a successful capture"
        _Generator(self.cuda, self.state).increase(self.increment)


class _Capturing:
    """torch.cuda.graph: capture_begin on entry, capture_end on exit (also on an error,
    where cudaStreamEndCapture reports the invalidated capture and throws before
    capture_epilogue)."""

    def __init__(self, cuda: "_FakeCuda", graph: _Graph):
        self.cuda, self.graph = cuda, graph

    def __enter__(self) -> None:
        state = self.graph.state = self.cuda.default_generators[0].state   # register_generator_state
        state.capturing, state.intragraph = True, 0                         # capture_prologue
        self.cuda.stream_capturing = True

    def __exit__(self, kind, error, trace) -> None:
        self.cuda.stream_capturing = False      # cudaStreamEndCapture ends the capture either way
        if kind is not None:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        self.graph.increment = self.graph.state.intragraph                  # capture_epilogue
        self.graph.state.capturing = False


class _FakeCuda:
    """The part of torch.cuda that `_CudaGraph` uses, with torch 2.11's generator rules."""

    def __init__(self) -> None:
        self.stream_capturing = False
        self.default_generators = (_Generator(self, _State()),)

    def current_device(self) -> int:
        return 0

    def synchronize(self) -> None:
        assert not self.stream_capturing

    def CUDAGraph(self) -> _Graph:  # noqa: N802 - torch's name
        return _Graph(self)

    def graph(self, graph: _Graph, **_options) -> _Capturing:
        return _Capturing(self, graph)

    def dropout(self) -> None:
        self.default_generators[0].increase(DRAW)

    @property
    def offset(self) -> int:
        return self.default_generators[0].state.offset


def _step(cuda: _FakeCuda, fail_in_capture: bool):
    """A step with one dropout draw; ``fail_in_capture``: it synchronises while captured
    (as an unaudited host read would), which invalidates the capture."""
    def step() -> int:
        cuda.dropout()
        if fail_in_capture and cuda.stream_capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return cuda.offset
    return step


def _capture(cuda: _FakeCuda, fail_in_capture: bool) -> StepCapture:
    return StepCapture(_step(cuda, fail_in_capture), warmup=2, _graph_factory=lambda: _CudaGraph(cuda))


def test_eager_dropout_after_a_failed_capture_draws_on():
    cuda = _FakeCuda()
    capture = _capture(cuda, fail_in_capture=True)
    with pytest.warns(CaptureFallbackWarning, match="capture failed"):
        capture(), capture()            # warm-up, then the audited call whose capture fails
    assert not capture.captured and "previous error during capture" in capture.reason
    assert "raised first in the step: RuntimeError: CUDA error: operation not permitted" in capture.reason
    assert cuda.offset == 2 * DRAW      # the failed capture's draw went to the discarded copy
    capture(), capture()                # eager steps with dropout
    assert cuda.offset == 4 * DRAW


def test_graphs_captured_before_and_after_a_failed_capture_share_one_random_stream():
    """Every graph registers the one default generator state, so replays of any graph
    and eager draws advance one offset and never repeat each other's masks. A graph
    captured before the failure keeps replaying (it reads the same state, which a
    failure must not leave in capture mode), and one captured after it must register
    that same state, not a copy drawing the same offsets again."""
    cuda = _FakeCuda()
    before = _capture(cuda, fail_in_capture=False)
    before(), before()                  # two eager draws (warm-up, audit), one recorded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        failed = _capture(cuda, fail_in_capture=True)
        failed(), failed()              # two eager draws, then the failed capture
    after = _capture(cuda, fail_in_capture=False)
    after(), after()                    # two eager draws, one recorded
    assert before.captured and after.captured and cuda.offset == 6 * DRAW
    before(), after(), before()         # three replays, one draw each
    cuda.dropout()
    assert cuda.offset == 10 * DRAW


def test_a_later_capture_succeeds_and_its_replays_continue_the_eager_stream():
    cuda = _FakeCuda()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        failed = _capture(cuda, fail_in_capture=True)
        failed(), failed()
    captured = _capture(cuda, fail_in_capture=False)
    captured(), captured()              # warm-up, audited call, capture (one draw recorded)
    assert captured.captured and cuda.offset == 4 * DRAW
    captured(), captured()              # two replays: each advances the offset by its draw
    assert cuda.offset == 6 * DRAW
    cuda.dropout()                      # eager code after the replays draws after them, never the same masks
    assert cuda.offset == 7 * DRAW


def test_a_generator_that_cannot_be_reset_is_an_error_not_a_fallback():
    """If even an empty capture fails, eager random ops would fail later with torch's
    puzzling message: say so at the capture instead of falling back."""
    class Broken(_FakeCuda):
        def graph(self, graph: _Graph, **_options) -> _Capturing:
            if graph is not self.first:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().graph(graph)

        def CUDAGraph(self) -> _Graph:  # noqa: N802
            graph = super().CUDAGraph()
            self.first = getattr(self, "first", graph)
            return graph
    cuda = Broken()
    with pytest.raises(GeneratorStuckError, match="left torch's CUDA generator in capture mode"):
        capture = _capture(cuda, fail_in_capture=True)
        capture(), capture()
