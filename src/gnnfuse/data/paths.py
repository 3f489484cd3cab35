"""Where data sets live: an explicit root, $GNNFUSE_DATA, or the shared folder nearby.

The real data sets are read-only files beside the repository (``../shared/data``) and
must never be copied into it, so the loaders find them in place instead of downloading.
"""
from __future__ import annotations

import os
from pathlib import Path


def candidate_roots(root: str | os.PathLike | None = None) -> list[Path]:
    """Roots to search, in order: `root`, then $GNNFUSE_DATA; only when neither is set,
    ``../shared/data`` from the working directory, then ``shared/data`` beside any
    folder above this package.

    A location the user configured is never silently replaced by a discovered one, so a
    mistyped root fails loudly instead of loading some other copy of the data.
    """
    roots = [Path(p) for p in (root, os.environ.get("GNNFUSE_DATA")) if p]
    if not roots:
        roots.append(Path.cwd().parent / "shared" / "data")
        roots.extend(parent / "shared" / "data" for parent in Path(__file__).resolve().parents)
    unique: list[Path] = []
    for path in roots:
        if path not in unique:
            unique.append(path)
    return unique


def find_data_file(subdir: str, filename: str, root: str | os.PathLike | None = None) -> Path:
    """The first ``<root>/<subdir>/<filename>`` or ``<root>/<filename>`` that exists.

    Raises `FileNotFoundError` listing every path tried, so a user can see at once
    whether the root or the file name is wrong.
    """
    tried = []
    for base in candidate_roots(root):
        for path in (base / subdir / filename, base / filename):
            if path.is_file():
                return path
            tried.append(path)
    listing = "\n  ".join(str(p) for p in tried)
    raise FileNotFoundError(
        f"data file {filename!r} not found; looked in:\n  {listing}\n"
        "pass root=..., or set GNNFUSE_DATA to the folder holding it")
