"""Checks on the files a command will write, made before its work starts."""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable


def folder_problem(folder: Path, *, made: bool = False) -> str | None:
    """Why no file can be written in ``folder`` (made with its missing parents first when
    ``made``), or None. A missing folder whose nearest existing parent is a file is named
    as such (it was called "does not exist"), and the folder is tried with a temporary
    file, which nothing else tells reliably (``/proc``, a read-only mount, or a folder
    without write permission all failed only at the write, after the work)."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if existing != folder and not made:
        return f"the folder {folder} does not exist"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        return f"no file can be written in {existing} ({error.strerror or error})"
    return None


def unwritable_output(outputs: dict[str, str | Path | None]) -> str | None:
    """A usage error for the first output (``{"--save": path, ...}``) that cannot be
    written as a file -- its folder does not exist or cannot be written to, the path is a
    folder or a file that cannot be written, or another output names the same file -- or
    None. Why up front: the write comes after the training or timing, so a mistyped path
    cost the whole run and then ended in a traceback, or (two flags on one path) the
    second write replaced the first."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        resolved = Path(path).resolve()
        if in_place(path):      # written where it is: its folder (/dev) need not be writable
            if not os.access(path, os.W_OK):
                return f"{flag} {path}: it cannot be written"
            continue
        problem = folder_problem(resolved.parent)
        if problem is not None:
            return f"{flag} {path}: {problem}"
        if resolved.is_dir():
            return f"{flag} {path}: that is a folder; give a file name in it"
        if resolved.exists() and not os.access(resolved, os.W_OK):
            return f"{flag} {path}: the file exists and cannot be written"
        if resolved in seen:
            return f"{flag} {path}: {seen[resolved]} writes the same file; give each output its own"
        seen[resolved] = flag
    return None


def unwritable_image(outputs: dict[str, str | Path | None]) -> str | None:
    """A usage error for the first image output (``{"--plot": path}``) whose suffix names
    no file type matplotlib writes, or None -- also when matplotlib is missing, which the
    command reports itself. Up front for `unwritable_output`'s reason: the drawing comes
    last, and matplotlib raised ValueError for ``curves.xyz`` after the whole run, and
    saved ``curves`` (no suffix) as ``curves.png`` where the command said it wrote ``curves``."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return None
    supported = sorted(FigureCanvasBase.get_supported_filetypes())
    for flag, path in outputs.items():
        if path is not None and Path(path).suffix.lstrip(".").lower() not in supported:
            return (f"{flag} {path}: the file type is taken from the name's ending, which must be one of "
                    f".{', .'.join(supported)}")
    return None


def replaced_outputs(outputs: dict[str, str | Path | None]) -> str | None:
    """A note naming the outputs (``{"--json": path, ...}``) that already exist, which the
    command replaces, or None. Printed before the work, so a file of the same name from an
    earlier command is never replaced without a word while there is still time to stop."""
    existing = [f"{flag} {path}" for flag, path in outputs.items() if path is not None and Path(path).is_file()]
    if not existing:
        return None
    return f"note: {', '.join(existing)} {'exists and is' if len(existing) == 1 else 'exist and are'} replaced"


def in_place(path: str | Path) -> bool:
    """Whether ``path`` (followed through links) is a device, a pipe or a socket
    (``/dev/stdout``, ``/dev/null``, a named pipe): written where it is, since renaming a
    file over it would replace it -- a reader of the pipe got nothing, and as root
    ``/dev/null`` became a regular file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_atomically(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it over ``path``.

    Written in place, a command stopped mid-write (Ctrl-C, a full disk, an error in the
    writer) left a truncated file where the previous result was, which read as a result.
    Now the previous file stays whole and the temporary one is removed. The temporary
    name keeps ``path``'s suffix, since image writers take the file type from it. A
    symbolic link is written through, and a file that exists keeps its permissions, as
    an in-place write did: not replaced by a file of the umask's mode (a group-writable
    shared file, such as the tuned-schedule store, locked the group out). A device, pipe
    or socket is written in place (`in_place`)."""
    path = Path(path)
    if in_place(path):
        write(path)
        return path
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp{target.suffix}")
    try:
        write(tmp)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
