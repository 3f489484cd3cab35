"""Where a host-bound step's time goes, by sampling Python stacks from a second thread.

cProfile and torch's profiler both slow every call they record, and cProfile sees only
the thread that enabled it, while on a GPU the autograd engine runs a step's backward
(custom Functions' Python included) on a thread of its own. Neither shows what a step
loses to the other threads of its process -- a data loader's prefetch thread holding the
interpreter lock or building what the step then waits for. A sampler thread instead
reads ``sys._current_frames()`` every ``interval`` seconds: the step's thread's stack,
and while that thread waits inside ``backward()``, the stack of the thread running the
backward's Python (one whose frames hold an autograd Function or a ``backward``). A
line's share of the samples is its share of the wall time, lock waits and all.

This is how the in-step sort of every mini-batch block (the loader's recipe not taken,
78144c8) was found: it shows only with the loader's thread running.

    with StackSampler(where="train_step") as sampler:
        for batch in loader:
            train_step(batch)
    print(sampler.report(steps=len(loader), wall_ms=elapsed_ms))
"""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any


def _frames(frame: FrameType | None) -> list[tuple[str, int]]:
    """(``file:function``, line) from ``frame`` outwards; site-packages paths shortened."""
    stack = []
    while frame is not None:
        code = frame.f_code
        stack.append((f"{code.co_filename.split('site-packages/')[-1]}:{code.co_name}", frame.f_lineno))
        frame = frame.f_back
    return stack


class StackSampler:
    """Samples the stack of the thread that enters it (see the module doc). Only samples
    whose stack holds a function named ``where`` count, when given (the step, not the
    loop around it). ``inclusive`` counts functions anywhere on a sampled stack,
    ``leaf`` the innermost function and ``lines`` the innermost line."""

    def __init__(self, interval: float = 0.0002, where: str | None = None) -> None:
        self.interval, self.where = interval, where
        self.samples = 0
        self.inclusive: Counter[str] = Counter()
        self.leaf: Counter[str] = Counter()
        self.lines: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._target = 0
        self._switch = 0.0

    def __enter__(self) -> StackSampler:
        self._target = threading.get_ident()
        self._stop.clear()
        # the sampler needs the interpreter lock to read stacks: hand it over often
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, self.interval / 2))
        self._thread = threading.Thread(target=self._run, name="gnnfuse-stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        sys.setswitchinterval(self._switch)

    def _run(self) -> None:
        own = threading.get_ident()
        while not self._stop.is_set():
            frames = sys._current_frames()
            stack = _frames(frames.get(self._target))
            if stack and stack[0][0].endswith(":_engine_run_backward"):
                for ident, frame in frames.items():        # the thread running the backward's Python
                    if ident not in (own, self._target):
                        other = _frames(frame)
                        if any("backward" in name or "autograd/function.py" in name for name, _ in other):
                            stack = other + stack
                            break
            if stack and (self.where is None or any(name.endswith(f":{self.where}") for name, _ in stack)):
                self.samples += 1
                name, line = stack[0]
                self.leaf[name] += 1
                self.lines[f"{name}:{line}"] += 1
                self.inclusive.update({name for name, _ in stack})
            time.sleep(self.interval)

    def report(self, steps: int, wall_ms: float, top: int = 40) -> str:
        """Tables of ms per step by inclusive function, leaf function and leaf line: each
        count's share of the samples times ``wall_ms``, the sampled run's wall time, over
        ``steps``."""
        if not self.samples:
            return "no samples (a run shorter than the sampling interval, or `where` never on the stack)"
        scale = wall_ms / self.samples / max(steps, 1)
        out = [f"{self.samples} samples, {self.samples / max(steps, 1):.1f} a step"]
        for title, counts in (("inclusive", self.inclusive), ("leaf function", self.leaf), ("leaf line", self.lines)):
            out.append(f"-- {title} (ms per step)")
            out += [f"{count * scale:9.3f} {name}" for name, count in counts.most_common(top)]
        return "\n".join(out)
