"""Generated kernel modules on disk, shared by the code generators.

Triton's JIT and Numba's on-disk cache both read a kernel's source from a real file, so
generated source is written to the gnnfuse cache folder (``$GNNFUSE_CACHE``, default
``~/.cache/gnnfuse``) under a name holding a digest of the source, and imported from
there: the same source is written and loaded once, whichever unit or program asks.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

_KERNELS: dict[str, object] = {}


def cache_dir() -> Path:
    path = Path(os.environ.get("GNNFUSE_CACHE", Path.home() / ".cache" / "gnnfuse")) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_kernel(source: str, name: str):
    """The object ``name`` defined by ``source``, imported from its file in the cache."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    if digest not in _KERNELS:
        path = cache_dir() / f"{name}_{digest}.py"
        if not path.exists() or path.read_text() != source:
            # written aside and renamed into place: another process (a training rank
            # compiling the same kernel) never imports a half-written file
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"gnnfuse_kernel_{digest}", path)
        module = importlib.util.module_from_spec(spec)
        # Registered before it runs: Numba's disk cache re-imports a kernel's module by
        # name when it loads machine code compiled by an earlier process.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _KERNELS[digest] = getattr(module, name)
    return _KERNELS[digest]
