"""Schedules chosen by the tuner (`gnnfuse tune`, FeatGraph's grid search), read by the
backends.

FeatGraph picks its scheduling parameters -- partitions, feature tiles, thread blocks --
by timing every point of the space on the input at hand, since no cost rule fits every
graph, width and machine. `gnnfuse.tuning` does the timing; this module holds what the
two sides share: the key a choice is stored under, the file it lives in, and the lookup
the backends make before falling back to their cost rule.

Key: the fused unit's structure (`unit_fingerprint`: its ops, attributes, shapes and
dtypes, independent of value ids, so every model and layer with the same unit shares a
choice), the graph's shape class (nodes, edges, average and maximum in-degree, each
bucketed to a power of two: a choice transfers between graphs of one class, and a
re-tuned graph of another class never reuses it), the feature width, the backend and the
device (the CPU model and the thread count, or the GPU's name).

File: JSON at ``$GNNFUSE_TUNED_SCHEDULES`` (default ``$GNNFUSE_CACHE/tuned_schedules.json``,
``~/.cache/gnnfuse``), stamped with a format number and a digest of the kernel
generators. A file that does not parse, or whose stamp differs (written for other
kernels), is ignored with one warning and the cost rules apply: a tuned choice only
changes speed, never values (at most the rounding of a float sum, whose edges a partitioned
or edge-parallel schedule adds in another order), so ignoring one is always safe. `store` merges into the
file as it is at that moment, under a lock beside it, so concurrent tuning runs keep each
other's choices.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:     # not POSIX
    fcntl = None

import torch

from ..graph import Graph
from ..passes.fusion import AggregateUnit, Unit
from .forced_schedule import SCHEDULES, ForcedSchedule, forced_schedule, valid_feature_tile
from ..environ import getenv
from ..output_paths import write_atomically
from ..user_warning import warn

PATH_ENV = "GNNFUSE_TUNED_SCHEDULES"
FORMAT = 1
_GENERATORS = [Path(__file__).parent / p for p in ("cpu/codegen.py", "cpu/scalar.py", "triton/codegen.py")]
STAMP = {"format": FORMAT, "generators": hashlib.sha1(
    b"".join(p.read_bytes() for p in _GENERATORS if p.exists())).hexdigest()[:16]}

_FINGERPRINTS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
RECHECK_SECONDS = 1.0
_loaded: dict[str, Any] = {"path": None, "where": None, "version": None, "checked": 0.0, "entries": {}}
_warned: set[str] = set()


def cache_path() -> Path:
    """Where the stored choices live. Every fused unit's launch asks (through `entries`),
    so the path is worked out once per setting of the variables it depends on:
    ``Path.home()`` and the Path arithmetic took ~0.2 ms a launch on an H100 host."""
    return _cache_path(*path_settings())


PATH_VARIABLES = (PATH_ENV, "GNNFUSE_CACHE", "HOME")     # what `cache_path` depends on


def path_settings() -> tuple[str | None, ...]:
    """The values of `PATH_VARIABLES` now, as `entries` compares them between looks."""
    return tuple(map(getenv, PATH_VARIABLES))


def _fresh(where: tuple) -> bool:
    """`entries`' test for returning its table without looking at the file: one was
    read for the path variables ``where`` less than `RECHECK_SECONDS` ago."""
    return (_loaded["path"] is not None and _loaded["where"] == where
            and time.monotonic() - _loaded["checked"] < RECHECK_SECONDS)


def still_current(table: dict[str, ForcedSchedule], where: tuple) -> bool:
    """Whether `entries()` would return ``table`` itself now without looking at the file,
    ``where`` being `path_settings()` now: for a caller that knows ``where`` without
    reading the variables again (`environ.Variables` told it they have not changed)."""
    return _loaded["entries"] is table and _fresh(where)


@functools.lru_cache(maxsize=16)
def _cache_path(explicit: str | None, cache_root: str | None, home: str | None) -> Path:
    if explicit:     # a leading ~ expanded, as for $GNNFUSE_DATA (not a folder named ~)
        return Path(explicit).expanduser()
    root = Path(cache_root).expanduser() if cache_root else Path.home() / ".cache" / "gnnfuse"    # (empty: unset)
    return root / "tuned_schedules.json"


def unit_fingerprint(unit: Unit) -> str:
    """A digest of the unit's structure: leaves, body and root as (op, operand positions,
    attributes, residency, shape, dtype), plus its kind and grouping index."""
    if unit not in _FINGERPRINTS:
        outputs = [unit.reduce, unit.root] if isinstance(unit, AggregateUnit) and unit.scale is not None else [unit.root]
        values = [*unit.leaves, *unit.body, *outputs]
        position = {v.id: n for n, v in enumerate(values)}
        computed = {v.id for v in unit.body} | {v.id for v in outputs}
        rows = [(v.op, tuple(position.get(i.id, -1) for i in v.inputs) if v.id in computed else (),
                 sorted((k, repr(a)) for k, a in v.attrs.items() if k != "key"),   # not an input's name
                 v.residency.name, tuple(v.shape), str(v.dtype)) for v in values]
        kind = ("aggregate", unit.by) if isinstance(unit, AggregateUnit) else ("edge",)
        _FINGERPRINTS[unit] = hashlib.sha1(repr((kind, rows)).encode()).hexdigest()[:16]
    return _FINGERPRINTS[unit]


def _bucket(x: float) -> int:
    return int(math.floor(math.log2(x))) if x >= 1 else 0


def shape_class(graph: Graph) -> str:
    """Nodes, edges, average and maximum in-degree as powers of two (see module doc)."""
    def build(g: Graph) -> str:
        degrees = g.in_degrees()
        top = int(degrees.max()) if degrees.numel() else 0
        return (f"n{_bucket(g.num_nodes)}-e{_bucket(g.num_edges)}-"
                f"avg{_bucket(g.num_edges / max(g.num_nodes, 1))}-max{_bucket(top)}")
    return graph.cached("tuned_shape_class", build)


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (platform.processor() is often just the ISA)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


_CPU_NAME = cpu_name()


def device_name(device: torch.device) -> str:
    """The machine a timing holds for: the GPU's name, or the CPU model and the torch
    thread count (the CPU backend's kernels use that many threads)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_CPU_NAME} x{torch.get_num_threads()} threads"


def key(unit: Unit, graph: Graph, backend: str) -> str:
    width = math.prod(unit.root.shape)
    return "|".join((backend, device_name(graph.device), shape_class(graph), f"F{width}", unit_fingerprint(unit)))


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warn(message, RuntimeWarning)


def _schedule(record: Any) -> ForcedSchedule:
    """The schedule of a stored entry; ValueError if it is not one (by the rule
    ``gspmm(schedule=)`` applies to a feature tile)."""
    fields = record["schedule"]
    schedule = ForcedSchedule(**fields)
    if schedule.kind not in SCHEDULES or not valid_feature_tile(schedule.feature_tile):
        raise ValueError(f"not a schedule: {fields!r}")
    return schedule


# what reading a file as a store may raise (RecursionError: json's, for arrays nested too deep)
_UNREADABLE = (OSError, ValueError, RecursionError)


def _table(path: Path) -> dict[str, Any]:
    """The file's JSON object, which holds an entries table; one of `_UNREADABLE` if not."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError("no 'entries' table")
    return data


def _parsed(path: Path, warn: Callable[[str], None]) -> dict[str, tuple[Any, ForcedSchedule]]:
    """The file's entries of the current stamp that hold a schedule, each as (its record,
    its schedule); {} for an unreadable or stale file. ``warn`` is told why a file or an
    entry is ignored (`_read` warns; `store`, merging into the file, need not)."""
    try:
        data = _table(path)
    except _UNREADABLE as error:
        warn(f"gnnfuse: ignoring the tuned-schedule cache {path} ({error}); the backends use their "
             "cost rules (remove it and run `gnnfuse tune` to rebuild it)")
        return {}
    if data.get("stamp") != STAMP:
        warn(f"gnnfuse: ignoring the tuned-schedule cache {path}: it was written for other kernels "
             f"(stamp {data.get('stamp')!r}, these are {STAMP!r}); run `gnnfuse tune` again")
        return {}
    entries = {}
    for k, record in data["entries"].items():
        try:
            entries[k] = (record, _schedule(record))
        except (TypeError, ValueError, KeyError) as error:
            warn(f"gnnfuse: ignoring a corrupt entry of the tuned-schedule cache {path} ({error})")
    return entries


def foreign_file(path: Path) -> str | None:
    """Why ``path`` is a file `store` must not replace, or None: it exists, is not empty,
    and is not a store (a JSON object with a stamp and an entries table) -- another file
    ``$GNNFUSE_TUNED_SCHEDULES`` names by mistake, such as a ``gnnfuse bench --json``
    result, which `store` replaced after the whole search, its content lost. A store of
    another stamp is one, and is replaced (its choices were for other kernels)."""
    try:
        if not path.is_file() or path.stat().st_size == 0 or "stamp" in _table(path):
            return None
        why = "no stamp"
    except _UNREADABLE as error:
        why = f"it does not read as one: {error}"
    return (f"{path} is not a store of tuned choices ({why}), and storing the choices would replace it: set "
            f"${PATH_ENV} to another file, or remove it if it is a damaged store")


def _read(path: Path) -> dict[str, ForcedSchedule]:
    return {k: schedule for k, (_, schedule) in _parsed(path, _warn_once).items()}


def entries() -> dict[str, ForcedSchedule]:
    """Every stored choice by key, read once and again whenever the file changes. The
    file is looked at most every `RECHECK_SECONDS` (every fused unit's launch asks, and
    a GPU step is a few hundred microseconds of launches); `store` re-reads at once.
    Between looks only the variables `cache_path` reads are compared: building the path
    cost more Python calls than the rest of a unit's launch."""
    where = path_settings()
    if _fresh(where):
        return _loaded["entries"]
    path = cache_path()
    _loaded["where"] = where
    try:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_ino, stat.st_size)
    except OSError:
        version = None
    if (_loaded["path"], _loaded["version"]) != (path, version):
        _loaded.update(path=path, version=version, entries=_read(path) if version is not None else {})
    _loaded["checked"] = time.monotonic()
    return _loaded["entries"]


def lookup(unit: Unit, graph: Graph, backend: str) -> ForcedSchedule | None:
    """The tuned schedule for ``unit`` on ``graph`` under ``backend``, or None."""
    table = entries()
    return table.get(key(unit, graph, backend)) if table else None


# Each backend's environment variable that forces a schedule for every unit (benchmarks,
# debugging): set, it wins over tuned choices as it wins over the cost rule.
OVERRIDES = {"cpu": "GNNFUSE_CPU_FEATURE_TILE", "triton": "GNNFUSE_SCHEDULE"}


def forced_or_tuned(unit: Unit, graph: Graph, backend: str) -> ForcedSchedule | None:
    """What a backend runs ``unit`` under, before its cost rule: a schedule the call
    forced, else the tuned choice (unless the backend's `OVERRIDES` variable is set),
    else None."""
    call = forced_schedule()
    if call is not None or getenv(OVERRIDES[backend], "auto") not in ("", "auto"):
        return call
    return lookup(unit, graph, backend)


def note(unit: Unit, graph: Graph) -> str | None:
    """For `gnnfuse.explain`: the tuned choices stored for ``unit`` on this graph and
    device that a backend would run, per backend, or None. A choice that `forced_or_tuned`
    passes over (the call forced a schedule, or the backend's `OVERRIDES` variable is set)
    is not noted: ``GNNFUSE_CPU_FEATURE_TILE=4`` ran tiles of 4 while the report said the
    stored tile of 2 ran."""
    found = [(b, forced_or_tuned(unit, graph, b)) for b in OVERRIDES] if forced_schedule() is None else []
    text = "; ".join(f"{b} backend: {describe(s)}" for b, s in found if s is not None)
    return f"tuned schedule, {text}" if text else None


def describe(schedule: ForcedSchedule) -> str:
    parts = [] if schedule.kind == "auto" else [f"{schedule.kind} schedule"]
    if schedule.feature_tile:
        parts.append(f"feature tile {schedule.feature_tile}")
    if schedule.partition_bytes:
        parts.append(f"source partitions of {schedule.partition_bytes} B")
    if schedule.chunk:
        parts.append(f"{schedule.chunk} row blocks per thread chunk")
    return ", ".join(parts) or "the cost rule"


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Holds a lock beside ``path`` (POSIX ``flock``) so that two processes storing at
    once (two `gnnfuse tune` runs) merge in turn instead of each writing the file it read
    before the other's write, dropping the other's choices. Without ``fcntl`` (Windows)
    the stores are not serialized."""
    if fcntl is None:
        yield
        return
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def store(records: dict[str, dict[str, Any]]) -> Path:
    """Merge ``records`` (key -> {"schedule": fields, ...}) into the cache file as it is
    now, under a lock and written atomically; an unreadable or stale file is replaced.

    Written by `output_paths.write_atomically`: a new store gets any new file's
    permissions (the umask's), not a temporary file's private 0600, which made a store
    shared by several users (``$GNNFUSE_TUNED_SCHEDULES``) unreadable to all but the last
    one to tune; a store that exists keeps its own, and one that is a symbolic link (to a
    shared file) is written where it points, not replaced by a file of this user's own.
    A write stopped midway (Ctrl-C) leaves no temporary file behind. The lock is taken
    beside the file the link points to, so every user's store takes the same one."""
    path = cache_path().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path):
        # the file as it is now, not `entries`' table, which may be up to `RECHECK_SECONDS` old
        merged = {k: record for k, (record, _) in _parsed(path, lambda message: None).items()}
        merged.update(records)
        text = json.dumps({"stamp": STAMP, "entries": merged}, indent=1, sort_keys=True)
        write_atomically(path, lambda tmp: tmp.write_text(text))
    _loaded["path"] = None   # read back on the next lookup
    return path
