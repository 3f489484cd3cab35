"""Downloading a missing Planetoid data set, offline: a loopback HTTP server on 127.0.0.1
serves the copies in ../shared/data/planetoid, and any other address is refused."""
from __future__ import annotations

import functools
import http.server
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest
import torch

from gnnfuse.cli import main
from gnnfuse.data import load_planetoid
from gnnfuse.data.download import DownloadError
from gnnfuse.data.paths import candidate_roots, download_root, user_cache_dir
from gnnfuse.data.planetoid_source import SHA256, URL_ENV, planetoid_files

CORA = planetoid_files("cora")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Fail any connection to an address other than 127.0.0.1 made during a test."""
    connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "localhost"):
            raise AssertionError(f"a test tried to reach {address}")
        return connect(self, address)
    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture
def serve(monkeypatch):
    """Serve a folder over HTTP on 127.0.0.1 (port chosen by the OS) and point the
    Planetoid download at it; yields a function folder -> the list of paths requested."""
    servers = []

    def start(folder: Path) -> list[str]:
        requested: list[str] = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                requested.append(self.path)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        monkeypatch.setenv(URL_ENV, f"http://127.0.0.1:{server.server_address[1]}/")
        return requested

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def test_missing_planetoid_is_downloaded_checked_and_loaded(shared_data, serve, tmp_path, capsys):
    requested = serve(shared_data / "planetoid")
    root = tmp_path / "root"
    downloaded = load_planetoid("cora", root)
    assert files_in(root / "planetoid") == set(CORA)          # exactly the files, no temporaries
    for file in CORA:
        assert (root / "planetoid" / file).read_bytes() == (shared_data / "planetoid" / file).read_bytes()
    reference = load_planetoid("cora", shared_data)
    assert downloaded.graph.num_edges == 10556
    assert torch.equal(downloaded.x, reference.x) and torch.equal(downloaded.graph.src, reference.graph.src)
    err = capsys.readouterr().err
    assert "downloading 8 Planetoid cora file(s)" in err and "\r" not in err and len(err) < 500

    requested.clear()                                          # present now: nothing is fetched again
    load_planetoid("cora", root)
    assert requested == []


def test_only_missing_files_are_fetched(shared_data, serve, tmp_path):
    requested = serve(shared_data / "planetoid")
    folder = tmp_path / "planetoid"
    folder.mkdir()
    for file in CORA[:5]:
        shutil.copy(shared_data / "planetoid" / file, folder / file)
    load_planetoid("cora", tmp_path)
    assert sorted(path.rsplit("/", 1)[1] for path in requested) == sorted(CORA[5:])


def test_a_corrupted_download_is_deleted_and_named(shared_data, serve, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for file in CORA:
        (mirror / file).symlink_to(shared_data / "planetoid" / file)
    bad = "ind.cora.graph"
    (mirror / bad).unlink()
    (mirror / bad).write_bytes((shared_data / "planetoid" / bad).read_bytes()[:-1] + b"!")
    serve(mirror)
    root = tmp_path / "root"
    with pytest.raises(DownloadError) as error:
        load_planetoid("cora", root)
    message = str(error.value)
    assert f"{bad}: SHA-256" in message and SHA256[bad] in message and "deleted" in message
    assert bad not in files_in(root / "planetoid")
    assert not [name for name in files_in(root / "planetoid") if name.endswith(".part")]


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offline_error_says_which_files_to_put_where(closed_port, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(URL_ENV, f"http://127.0.0.1:{closed_port}/data")
    root = tmp_path / "root"
    with pytest.raises(DownloadError) as error:
        load_planetoid("citeseer", root)
    message = str(error.value)
    assert "Planetoid citeseer is missing and could not be downloaded" in message
    assert " ".join(planetoid_files("citeseer")) in message
    assert f"put them in {root / 'planetoid'}" in message and "GNNFUSE_DATA" in message
    assert f"http://127.0.0.1:{closed_port}/data/" in message
    assert not root.exists()         # a mistyped root is not left behind as empty folders
    (root / "planetoid").mkdir(parents=True)
    (root / "mine.txt").write_text("kept")
    with pytest.raises(DownloadError):
        load_planetoid("citeseer", root)
    assert (root / "planetoid").is_dir() and (root / "mine.txt").exists()     # folders that were there stay

    with pytest.raises(SystemExit) as exit_info:                 # the CLI: a usage error, no traceback
        main(["info", "citeseer", "--root", str(root)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: gnnfuse info" in err and "ind.citeseer.x" in err and "Traceback" not in err


def test_download_goes_to_root_then_environment_then_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("GNNFUSE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = user_cache_dir()
    if sys.platform.startswith("linux"):
        assert cache == tmp_path / "xdg" / "gnnfuse" / "data"
    assert download_root() == cache and candidate_roots()[-1] == cache
    monkeypatch.setenv("GNNFUSE_DATA", str(tmp_path / "env"))
    assert download_root() == tmp_path / "env"
    assert download_root(tmp_path / "given") == tmp_path / "given"
