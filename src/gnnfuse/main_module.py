"""Starting child processes without re-running the parent's main script.

Shared by the loader's worker processes (`gnnfuse.loader.workers`) and the CPU ranks of
`gnnfuse.distributed.launch`, both started as fresh interpreters (spawn, fork server).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start processes without their importing the parent's main module.

    A ``spawn`` or fork-server child first imports the parent's ``__main__`` (by module
    name or file), so that functions defined there unpickle. A loader worker or a rank
    running a function of another module needs none of it, but a training script without
    an ``if __name__ == "__main__":`` guard would run again inside every child, start
    children of its own and fail in multiprocessing's bootstrapping check, and a guarded
    one would still repeat its imports in each. multiprocessing decides what to import
    from ``__main__``'s ``__spec__`` and ``__file__`` when a process starts, so they are
    hidden for that moment."""
    main = sys.modules.get("__main__")
    saved = {name: main.__dict__[name] for name in ("__spec__", "__file__") if main and name in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)
