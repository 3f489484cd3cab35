"""Where data sets live: an explicit root, $GNNFUSE_DATA, the shared folder nearby, or
the user's cache folder that downloads go to.

The real data sets are read-only files beside the repository (``../shared/data``) and
must never be copied into it, so the loaders find them in place; only data that is found
nowhere is downloaded, into `download_root`.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

DATA_ENV = "GNNFUSE_DATA"
# Every command's ``--root`` help: they all load through `candidate_roots`, so one text
# cannot leave a place out for some of them
ROOT_HELP = (f"data folder, the only one searched when given (default: ${DATA_ENV}, else ../shared/data, then "
             "shared/data beside a folder above the gnnfuse package, then the download cache)")


def user_cache_dir() -> Path:
    """The per-user cache folder for downloaded data sets, by each platform's convention
    (what platformdirs gives, without the dependency): ``$XDG_CACHE_HOME/gnnfuse/data``
    or ``~/.cache/gnnfuse/data`` on Linux, ``~/Library/Caches/gnnfuse/data`` on macOS,
    ``%LOCALAPPDATA%\\gnnfuse\\Cache\\data`` on Windows."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "gnnfuse" / "Cache" / "data"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "gnnfuse" / "data"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gnnfuse" / "data"


def _configured(root: str | os.PathLike | None) -> str | None:
    """`root` when given, else $GNNFUSE_DATA when set and not empty, with a leading ``~``
    expanded as PyG's datasets expand their root: taken literally, ``root="~/data"``
    searched a folder named ``~`` under the working directory (not finding the data set
    there) and downloaded Planetoid into it. An empty `root` (``--root "$DATA"`` with
    ``$DATA`` unset) is refused: it would have been taken as no root and searched the
    discovered folders, the silent replacement `candidate_roots` promises never to make."""
    if root is not None and not os.fspath(root):
        raise ValueError("the data root given is empty (root='' or --root ''): pass the folder holding the data "
                         "sets, or leave the root out to search the usual places")
    chosen = root or os.environ.get(DATA_ENV)
    return os.path.expanduser(chosen) if chosen else None


def download_root(root: str | os.PathLike | None = None) -> Path:
    """Where missing files are downloaded: `root` if given, else $GNNFUSE_DATA, else the
    user cache folder -- always one of the places `candidate_roots` searches."""
    chosen = _configured(root)
    return Path(chosen) if chosen else user_cache_dir()


def candidate_roots(root: str | os.PathLike | None = None) -> list[Path]:
    """Roots to search, in order: `root` alone when given; else $GNNFUSE_DATA alone when
    set; only when neither is, ``../shared/data`` from the working directory,
    ``shared/data`` beside any folder above this package, then the download cache
    (`user_cache_dir`).

    A location the user configured is never silently replaced by a discovered one -- nor
    an explicit root by $GNNFUSE_DATA -- so a mistyped root fails loudly instead of
    loading some other copy of the data.
    """
    chosen = _configured(root)
    if chosen:
        return [Path(chosen)]
    roots = [Path.cwd().parent / "shared" / "data"]
    roots.extend(parent / "shared" / "data" for parent in Path(__file__).resolve().parents)
    roots.append(user_cache_dir())
    unique: list[Path] = []
    for path in roots:
        if path not in unique:
            unique.append(path)
    return unique


def find_data_folder(subdir: str, filenames: Sequence[str], root: str | os.PathLike | None = None) -> Path:
    """The first ``<root>/<subdir>`` or ``<root>`` holding every one of ``filenames``.

    A data set's files are read from one folder: looked up one at a time, a partial copy
    in one searched folder mixed with a full one in the next (``x`` of one copy, labels
    and split of another). Raises `FileNotFoundError` naming every folder tried and the
    files each lacks, so a user can see at once whether the root or a file is wrong.
    """
    tried = []
    for base in candidate_roots(root):
        for folder in (base / subdir, base):
            missing = [name for name in filenames if not (folder / name).is_file()]
            if not missing:
                return folder
            tried.append(f"{folder}: lacks {' '.join(missing)}" if folder.is_dir() else f"{folder}: no such folder")
    listing = "\n  ".join(tried)
    hint = (f"the root given ({root}) is the only folder searched: point it at the one holding them" if root else
            f"{DATA_ENV} is set ({os.environ[DATA_ENV]}), so it is the only folder searched: point it at the one "
            f"holding them, or unset it" if os.environ.get(DATA_ENV) else
            f"pass root=... (--root DIR), or set {DATA_ENV} to the folder holding them")
    raise FileNotFoundError(
        f"data file(s) {' '.join(filenames)} not found together in one folder; looked in:\n  {listing}\n{hint}")


def find_data_file(subdir: str, filename: str, root: str | os.PathLike | None = None) -> Path:
    """The first ``<root>/<subdir>/<filename>`` or ``<root>/<filename>`` that exists
    (`find_data_folder` for one file); a data set of several files takes their folder
    from `find_data_folder` instead."""
    return find_data_folder(subdir, [filename], root) / filename
