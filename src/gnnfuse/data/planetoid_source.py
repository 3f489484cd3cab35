"""Where the Planetoid files come from, what they must hash to, and fetching missing ones.

The source is the public repository the files were published in (kimiyoung/planetoid,
the one PyG's `Planetoid` downloads from), pinned to one commit so that the SHA-256
sums below -- computed from copies of exactly that commit -- stay valid. Only the files
the loader reads are fetched: pubmed's ``allx`` is not among them (`load_planetoid`
uses stand-in pubmed features, see there), so it has no sum here.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from .download import DownloadError, fetch
from .paths import download_root, find_data_folder

URL_ENV = "GNNFUSE_PLANETOID_URL"
DEFAULT_URL = ("https://raw.githubusercontent.com/kimiyoung/planetoid/"
               "af6abf468a772cc055bec88c52e4d6f51b7c37e3/data")
SUBDIR = "planetoid"

SHA256: dict[str, str] = {
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.citeseer.x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
    "ind.citeseer.tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
    "ind.citeseer.allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
    "ind.citeseer.y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
    "ind.citeseer.ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
    "ind.citeseer.ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
    "ind.citeseer.graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
    "ind.citeseer.test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    "ind.pubmed.x": "fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33",
    "ind.pubmed.tx": "4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d",
    "ind.pubmed.y": "e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3",
    "ind.pubmed.ty": "ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd",
    "ind.pubmed.ally": "0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e",
    "ind.pubmed.graph": "5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9",
    "ind.pubmed.test.index": "b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5",
}


def planetoid_files(name: str) -> list[str]:
    """The file names `load_planetoid(name)` reads."""
    return [file for file in SHA256 if file.startswith(f"ind.{name}.")]


def source_url() -> str:
    """The folder URL the files are fetched from: ``$GNNFUSE_PLANETOID_URL`` or the pinned source."""
    return (os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def ensure_planetoid(name: str, root: str | os.PathLike | None = None) -> Path:
    """The folder holding all of `name`'s files (`find_data_folder`: never some from one
    folder and some from another). When no searched folder holds them all, those missing
    from ``download_root(root)/planetoid`` are downloaded there; a `DownloadError` says
    which files to put where when that fails (no network, a bad mirror)."""
    files = planetoid_files(name)
    try:
        return find_data_folder(SUBDIR, files, root)
    except FileNotFoundError:
        pass
    folder, base = download_root(root) / SUBDIR, source_url()
    missing = [file for file in files if not (folder / file).is_file()]
    print(f"gnnfuse: downloading {len(missing)} Planetoid {name} file(s) from {base} into {folder}",
          file=sys.stderr)
    made = [path for path in (folder, *folder.parents) if not path.exists()]     # what a failure takes back
    for file in missing:
        try:
            fetch(f"{base}/{file}", folder / file, SHA256[file])
        except DownloadError as error:
            for path in made:           # deepest first; a folder holding anything stays
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise DownloadError(_unavailable_message(name, missing, folder, base, error)) from error
    return folder


def _unavailable_message(name: str, missing: list[str], folder: Path, base: str, error: DownloadError) -> str:
    return (f"Planetoid {name} is missing and could not be downloaded: {error}\n"
            f"To install it by hand, fetch these files from {base}/ (on a machine with network, or "
            f"from any copy of the Planetoid data):\n  {' '.join(missing)}\n"
            f"and put them in {folder}{os.sep} -- or pass root=... (--root on the command line) or set "
            f"$GNNFUSE_DATA to a folder holding them as <folder>/{SUBDIR}/<file> or <folder>/<file>; "
            f"${URL_ENV} points the download at a mirror")
