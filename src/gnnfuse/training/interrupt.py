"""Ctrl-C in a training loop, taken at the end of the epoch instead of wherever it lands.

A KeyboardInterrupt raised inside an epoch can leave the weights half-updated (between
two parameters' Adam steps), so the state at that moment is no epoch's: resuming from it
could not give the numbers an uninterrupted run gives. `DeferredInterrupt` turns the
first Ctrl-C into a request the loop honours once its epoch is recorded; a second one
raises at once, for a user who will not wait.
"""
from __future__ import annotations

import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C at the end of an epoch, with everything needed to continue
    it (`state`, see `loop.train_run`)."""

    def __init__(self, state: dict[str, Any]):
        super().__init__(f"interrupted after epoch {state['epoch']}")
        self.state = state


class DeferredInterrupt:
    """While entered, the first SIGINT sets `requested` instead of raising; the second
    raises KeyboardInterrupt. Only where Python delivers signals -- the main thread, with
    Python's own SIGINT handler in place -- elsewhere a Ctrl-C raises where it lands."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> DeferredInterrupt:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: stopping at the end of this epoch (Ctrl-C again stops at once, losing the epoch)",
              file=sys.stderr, flush=True)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
