"""Fetching one data file from the network: checked against its SHA-256, written atomically.

A file lands under its final name only after its hash matched, so an interrupted or
corrupted download never leaves a file that the loaders would then read as data: the
bytes go to a temporary file in the target folder and are renamed into place (atomic
on one file system), and the temporary file is deleted on any failure.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import urllib.request
from pathlib import Path

from ..progress import progress_bar

CHUNK = 1 << 16
TIMEOUT_S = 30.0


class DownloadError(OSError):
    """A data file could not be fetched or did not match its expected SHA-256."""


def fetch(url: str, destination: Path, sha256: str, *, timeout: float = TIMEOUT_S) -> None:
    """Download `url` to `destination` if its SHA-256 is `sha256`; `DownloadError` otherwise
    (network failure, HTTP error or hash mismatch), with nothing left at `destination`."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name per call (concurrent downloads do not collide), opened like any file so
    # that the umask, not mkstemp's owner-only mode, sets who may read the data
    temporary = destination.with_name(f".{destination.name}.{secrets.token_hex(4)}.part")
    try:
        digest = hashlib.sha256()
        with open(temporary, "xb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            size = response.headers.get("Content-Length")
            with progress_bar(total=int(size) if size else None, unit="B", unit_scale=True,
                              desc=destination.name) as bar:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if digest.hexdigest() != sha256:
            raise DownloadError(f"{url}: SHA-256 {digest.hexdigest()} does not match the expected {sha256} "
                                "(a corrupted or different file); it was deleted, nothing was saved")
        os.replace(temporary, destination)
    except (OSError, http.client.HTTPException) as error:     # URLError and timeouts are OSErrors
        if isinstance(error, DownloadError):
            raise
        raise DownloadError(f"{url}: {getattr(error, 'reason', None) or error}") from error
    finally:
        temporary.unlink(missing_ok=True)            # already gone after the rename into place
