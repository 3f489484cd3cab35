"""Generated kernel modules on disk, shared by the code generators.

Triton's JIT and Numba's on-disk cache both read a kernel's source from a real file, so
generated source is written to the gnnfuse cache folder (``$GNNFUSE_CACHE``, default
``~/.cache/gnnfuse``) under a name holding a digest of the source, and imported from
there: the same source is written and loaded once, whichever unit or program asks.
A source this process writes has no machine code cached yet, so its first call compiles
(`first_call_compiles`: the CPU backend reports that time, `backend.first_use`).
"""
from __future__ import annotations

import builtins
import functools
import hashlib
import importlib.util
import os
import sys
import threading
from pathlib import Path

from ..user_warning import warn

try:
    import fcntl
except ImportError:     # not POSIX
    fcntl = None

_KERNELS: dict[str, object] = {}
_LOADING = threading.Lock()     # threads of one process loading kernels: one writes, imports and registers
# The builtins as at import, bound in every kernel module: a vertex function's trace swaps
# some for the whole process (frontend/vertex.py), and a Numba kernel compiled in another
# thread meanwhile read the swapped ``min`` ("Untyped global name 'min'"), for good
_BUILTINS = {name: getattr(builtins, name) for name in ("min", "max", "sum", "len", "zip", "abs", "range")}
_NEW: set[int] = set()        # ids of loaded kernels whose source this process wrote, not yet called


class KernelCacheError(OSError):
    """The kernel cache folder cannot be made or written; names ``$GNNFUSE_CACHE``."""


def _refuse(path: Path, error: OSError) -> KernelCacheError:
    return KernelCacheError(
        f"gnnfuse cannot write its generated kernels under {path} ({error.strerror or error}); "
        f"set $GNNFUSE_CACHE to a writable folder (default ~/.cache/gnnfuse; now "
        f"{os.environ.get('GNNFUSE_CACHE') or 'unset'!r})")


def cache_dir() -> Path:
    # a leading ~ expanded, as for $GNNFUSE_DATA: a quoted "~/cache" made a folder named ~
    path = Path(os.environ.get("GNNFUSE_CACHE") or Path.home() / ".cache" / "gnnfuse").expanduser() / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:     # $GNNFUSE_CACHE a file, read-only, ...: say which variable
        raise _refuse(path, error) from error
    return path


def load_kernel(source: str, name: str):
    """The object ``name`` defined by ``source``, imported from its file in the cache."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    if digest not in _KERNELS:
        with _LOADING:
            if digest not in _KERNELS:
                _load(source, name, digest)
    return _KERNELS[digest]


def _load(source: str, name: str, digest: str) -> None:
    """Write (where new), import and register ``source``'s module; under `_LOADING`."""
    path = cache_dir() / f"{name}_{digest}.py"
    # compared as bytes: a damaged file (not UTF-8) is rewritten, not a UnicodeDecodeError
    written = not path.exists() or path.read_bytes() != source.encode()
    if written:
        # written aside and renamed into place: another process (a training rank
        # compiling the same kernel) never imports a half-written file
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(source.encode())
            os.replace(tmp, path)
        except OSError as error:
            raise _refuse(path.parent, error) from error
    spec = importlib.util.spec_from_file_location(f"gnnfuse_kernel_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: Numba's disk cache re-imports a kernel's module by
    # name when it loads machine code compiled by an earlier process.
    sys.modules[spec.name] = module
    module.__dict__.update(_BUILTINS)
    spec.loader.exec_module(module)
    _KERNELS[digest] = getattr(module, name)
    guard_numba_disk_cache(_KERNELS[digest])
    if written:
        _NEW.add(id(_KERNELS[digest]))


def guard_numba_disk_cache(kernel: object) -> None:
    """Give ``kernel``'s Numba disk cache (if it is a ``cache=True`` dispatcher) a lock
    beside its index file for saves (POSIX ``flock``), and have it recompile over an
    index or data file that does not unpickle.

    Numba saves a newly compiled signature by reading the index, picking the first data
    file no entry names, then writing the index and that file, with no lock. Two
    processes compiling one kernel for different signatures at once (two scripts, float32
    and float64; ranks) both picked ``1.nbc``: the index kept one's entry and the data
    file the other's machine code, and every later process of that signature loaded the
    wrong code ("can't unbox array from PyObject into native value") until the cache was
    deleted. Held, the lock makes the second save read the first's index and pick another
    file. Generated kernels get the guard in `load_kernel`; the package's own ``cache=True``
    kernels of several signatures (dropout's mask, per dtype) ask for it. A Numba
    without these internals saves and loads as it did; without ``fcntl`` (Windows) saves
    are unlocked.

    A truncated or damaged index or data file (a disk error, a copy stopped midway) made
    every later call fail inside Numba with "pickle data was truncated", naming no file;
    it is machine code derived from the kernel's source, so it is now warned about once,
    by name, and compiled again over."""
    index = getattr(getattr(kernel, "_cache", None), "_cache_file", None)
    if all(hasattr(index, name) for name in ("_index_path", "save", "_load_index", "_load_data")):
        index.__class__ = _guarded_index_class(type(index))


def _damaged(path: str, error: Exception) -> None:
    warn(f"gnnfuse: Numba's cached machine code {path} could not be read ({type(error).__name__}: {error}); "
         "compiling the kernel again, which replaces it", RuntimeWarning)


@functools.cache
def _guarded_index_class(index_class: type) -> type:
    """``index_class`` (Numba's ``IndexDataCacheFile``) with `guard_numba_disk_cache`'s guards."""
    class GuardedIndexDataCacheFile(index_class):
        def save(self, key, data):
            try:
                lock = None if fcntl is None else open(f"{self._index_path}.lock", "a")  # noqa: SIM115
            except OSError:     # Numba checked the folder is writable; if not, its own save says so
                lock = None
            if lock is None:
                return super().save(key, data)
            with lock:      # closing releases the flock
                fcntl.flock(lock, fcntl.LOCK_EX)
                return super().save(key, data)

        # A damaged pickle may raise almost any error (UnpicklingError, EOFError,
        # ValueError, KeyError, ImportError, ...); the file is derived data either way.
        def _load_index(self):
            try:
                return super()._load_index()
            except Exception as error:      # noqa: BLE001 (see above)
                _damaged(self._index_path, error)
                return {}           # as if empty: the next save writes a whole index

        def _load_data(self, name):
            try:
                return super()._load_data(name)
            except OSError:
                raise
            except Exception as error:      # noqa: BLE001 (see above)
                _damaged(self._data_path(name), error)
                raise OSError(error) from error    # Numba's load: no entry, so compile and save
    return GuardedIndexDataCacheFile


def first_call_compiles(kernel: object) -> bool:
    """Whether ``kernel`` (from `load_kernel`) is uncalled and its source new to this
    cache folder, so that its first call compiles it (no earlier process left machine
    code for it); true once per kernel, as `compiled_by_call` is then told."""
    return id(kernel) in _NEW


def compiled_by_call(kernel: object) -> None:
    """``kernel`` has had its first call."""
    _NEW.discard(id(kernel))
