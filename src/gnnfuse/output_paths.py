"""Checks on the files a command will write, made before its work starts."""
from __future__ import annotations

from pathlib import Path


def missing_folder(outputs: dict[str, str | Path | None]) -> str | None:
    """A usage error for the first output (``{"--save": path, ...}``) whose folder does
    not exist, or None. Why up front: the write comes after the training or timing, so a
    mistyped folder cost the whole run and then ended in a traceback."""
    for flag, path in outputs.items():
        if path is not None and not Path(path).resolve().parent.is_dir():
            return f"{flag} {path}: the folder {Path(path).resolve().parent} does not exist"
    return None
