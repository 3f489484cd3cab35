"""gnnfuse.bench.stack_sampler: samples land where the sampled thread spends its time,
only inside the named function, and on the backward's thread while the step waits in
``backward()`` (on a GPU the autograd engine runs it on a thread of its own)."""
from __future__ import annotations

import threading
import time

from gnnfuse.bench.stack_sampler import StackSampler


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def step() -> None:
    _spin(0.15)


def outside() -> None:
    _spin(0.1)


def test_samples_fall_in_the_busy_function_and_only_inside_where():
    with StackSampler(interval=0.001, where="step") as sampler:
        outside()
        step()
    assert sampler.samples > 20
    assert sampler.leaf.most_common(1)[0][0].endswith(":_spin")
    assert not any(key.endswith(":outside") for key in sampler.inclusive), "a sample outside `where` counted"
    report = sampler.report(steps=1, wall_ms=150.0, top=3)
    assert "-- leaf line (ms per step)" in report and ":_spin:" in report


def _engine_run_backward(done: threading.Lock) -> None:
    """Stands in for torch's: the step's thread waits here, in a C call (no Python frame
    below), while another thread runs the backward's Python."""
    done.acquire()


def backward(done: threading.Lock) -> None:
    _spin(0.15)
    done.release()


def test_a_step_waiting_in_backward_is_charged_to_the_backwards_thread():
    done = threading.Lock()
    done.acquire()

    def step() -> None:
        worker = threading.Thread(target=backward, args=(done,))
        worker.start()
        _engine_run_backward(done)
        worker.join()
    with StackSampler(interval=0.001, where="step") as sampler:
        step()
    assert sampler.samples > 20
    top = sampler.leaf.most_common(1)[0][0]
    assert top.endswith(":_spin"), sampler.leaf.most_common(3)
    assert any(key.endswith(":backward") for key in sampler.inclusive)


def test_no_samples_report_says_so():
    with StackSampler(where="never_called") as sampler:
        _spin(0.01)
    assert sampler.samples == 0 and "no samples" in sampler.report(1, 10.0)
