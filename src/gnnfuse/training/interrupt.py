"""Ctrl-C in a training loop, taken at the end of the epoch instead of wherever it lands.

A KeyboardInterrupt raised inside an epoch can leave the weights half-updated (between
two parameters' Adam steps), so the state at that moment is no epoch's: resuming from it
could not give the numbers an uninterrupted run gives. `DeferredInterrupt` turns the
first Ctrl-C into a request the loop honours once its epoch is recorded; a second one
raises at once, for a user who will not wait.

Several ranks each get a terminal's Ctrl-C themselves and also from their launcher
(torchrun's agent passes a SIGINT on to its workers; so does ``gnnfuse train --gpus`` or
``--cpu-ranks``, so that a signal to the launcher alone reaches them), and ``timeout``
signals its command twice: the signals of one ``duplicate_window_s`` count as one Ctrl-C.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any

INTERRUPTED = 130          # a shell's status for a command stopped by SIGINT (128 + 2)

# Signals closer together than this are one request to stop delivered twice: a terminal's
# Ctrl-C reaches ranks directly and through their launcher within milliseconds, and
# ``timeout`` signals the command and then its whole process group, the command again --
# a one-process run took the second as "stop at once" and lost its epochs. A person's
# second Ctrl-C takes longer.
DUPLICATE_WINDOW_S = 1.0


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C at the end of an epoch, with everything needed to continue
    it (`state`, see `loop.train_run`)."""

    def __init__(self, state: dict[str, Any]):
        super().__init__(f"interrupted after epoch {state['epoch']}")
        self.state = state


class StoppedAtOnce(KeyboardInterrupt):
    """Ctrl-C in a run that could not go on exactly from the end of its epoch, which
    therefore stopped where it landed; ``reason`` says why, for the message at the stop."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class DeferredInterrupt:
    """While entered, the first SIGINT sets `requested` instead of raising; the second
    raises KeyboardInterrupt -- unless it came within ``duplicate_window_s`` of the
    first (the same Ctrl-C delivered twice, see the module doc). ``quiet``: say nothing
    on stderr (ranks but the first, which says it for all); else say it stops ``when``.
    Only where Python delivers signals -- the main thread, with Python's own SIGINT
    handler in place -- elsewhere a Ctrl-C raises where it lands.

    ``terminate``: a SIGTERM (``kill``, ``timeout``, a batch scheduler's stop, which
    sends SIGKILL only after a grace period) is taken the same way where nothing else
    handles it: it ended the process at once, losing the epochs of the run in progress
    that a Ctrl-C keeps. Ranks take it so as well (`distributed.stopping.rank_interrupt`
    says why a launcher ending them after a peer failed still can)."""

    def __init__(self, duplicate_window_s: float = DUPLICATE_WINDOW_S, quiet: bool = False,
                 when: str = "at the end of this epoch", terminate: bool = False) -> None:
        self.requested = False
        self.duplicate_window_s, self.quiet, self.when, self.terminate = duplicate_window_s, quiet, when, terminate
        self._first = 0.0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is not threading.main_thread():
            return self
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        if self.terminate and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.requested:
            if now - self._first < self.duplicate_window_s:
                return
            raise KeyboardInterrupt
        self.requested, self._first = True, now
        if not self.quiet:
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            print(f"\n{name}: stopping {self.when} ({name} again stops at once, losing the epoch)",
                  file=sys.stderr, flush=True)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
