"""``os.environ.get`` at dictionary speed, for settings read on every call.

Environment variables steer gnnfuse's hot paths (``GNNFUSE_BACKEND``, the schedule and
tile overrides, where the tuned-schedule file lives), and they are read when a call is
made, not at import, so that a test's ``monkeypatch.setenv`` or a user's change between
calls takes effect. ``os.environ.get`` costs about 0.8 us (the ``Mapping`` ABC's ``get``,
then ``__getitem__``, key encoding and value decoding); a Numba kernel call on a small
graph read five of them, about 4 us of a 31 us host path. On POSIX, ``os.environ``
keeps its contents in a plain dict of encoded names to encoded values (``_data``),
which ``setenv``/``del`` update in place; `getenv` looks the encoded name up there
directly (about 0.05 us) and decodes a value once per distinct value.

Where that dict is not what we expect -- another platform, or ``os.environ`` replaced by
another object -- `getenv` is ``os.environ.get``; the answer is the same either way
(tests/test_environ.py checks it against ``os.environ.get`` under changes)."""
from __future__ import annotations

import os

_ENVIRON = os.environ
_DATA = getattr(_ENVIRON, "_data", None)
_FAST = os.name == "posix" and type(_ENVIRON) is os._Environ and type(_DATA) is dict
_KEYS: dict[str, bytes] = {}
_VALUES: dict[bytes, str] = {}
_VALUES_LIMIT = 1024      # distinct decoded values kept (a variable set in a loop cannot grow it forever)


def getenv(name: str, default: str | None = None) -> str | None:
    """``os.environ.get(name, default)``."""
    if not _FAST or os.environ is not _ENVIRON:
        return os.environ.get(name, default)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = _ENVIRON.encodekey(name)
    raw = _DATA.get(key)
    if raw is None:
        return default
    value = _VALUES.get(raw)
    if value is None:
        if len(_VALUES) >= _VALUES_LIMIT:
            _VALUES.clear()
        value = _VALUES[raw] = _ENVIRON.decodevalue(raw)
    return value


def flag(name: str, default: bool) -> bool:
    """An on/off variable: "1" on, "0" off, unset or empty ``default``. Anything else is
    refused by name: ``!= "0"`` tests read "false", "off" or "no" as on, silently."""
    value = getenv(name)
    if not value:
        return default
    if value == "1" or value == "0":
        return value == "1"
    raise ValueError(f"{name} must be 0 or 1 (or unset), got {value!r}")


def count(name: str, what: str) -> int | None:
    """A count variable: a whole number, at least 1, of ``what`` ("threads"); None where
    unset or empty. Anything else is refused by name."""
    value = getenv(name)
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a whole number of {what}") from None
    if number < 1:
        raise ValueError(f"{name}={value!r}: expected at least 1")
    return number


class Variables:
    """Several variables whose raw values are read in one lookup (`raw`): two reads give
    equal tuples exactly when none of them was set, unset or changed in between. Why: a
    caller that derives settings from several variables (the Triton backend reads seven
    per program run) can keep what it derived and derive again only when they differ.
    The values are not decoded; compare them, do not read them."""
    __slots__ = ("names", "_keys")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._keys = tuple([_ENVIRON.encodekey(name) for name in names]) if _FAST else ()

    def raw(self) -> tuple:
        if _FAST and os.environ is _ENVIRON:
            return tuple(map(_DATA.get, self._keys))
        return tuple([os.environ.get(name) for name in self.names])
