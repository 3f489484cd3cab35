"""OGB node data sets through the ogb package, on tiny raw layouts written here in OGB's
on-disk format (no download): ogbn-arxiv (homogeneous) and ogbn-mag (heterogeneous)."""
from __future__ import annotations

import gzip
import importlib.util
import socket
import sys
from pathlib import Path

import pytest
import torch

from gnnfuse.cli import main
from gnnfuse.data import load_dataset

# find_spec, not importorskip: importing ogb here would start its PyPI version check
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ogb") is None,
                                reason="the OGB loaders need the ogb package (pip install ogb)")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """ogb must not reach the network on import or load (its PyPI version check included)."""
    def refuse(self, address):
        raise AssertionError(f"a test tried to reach {address}")
    monkeypatch.setattr(socket.socket, "connect", refuse)


def write_csv(path: Path, rows, header: list[str] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ([",".join(header)] if header else []) + [",".join(str(v) for v in row) for row in rows]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def write_split(folder: Path, train, valid, test) -> None:
    for part, ids in (("train", train), ("valid", valid), ("test", test)):
        write_csv(folder / f"{part}.csv.gz", [[i] for i in ids])


ARXIV_EDGES = [(0, 1), (1, 2), (2, 0), (3, 2), (4, 3)]          # node 5 is isolated


def write_arxiv(root: Path) -> Path:
    folder = root / "ogbn_arxiv"
    raw = folder / "raw"
    write_csv(raw / "edge.csv.gz", ARXIV_EDGES)
    write_csv(raw / "num-node-list.csv.gz", [[6]])
    write_csv(raw / "num-edge-list.csv.gz", [[len(ARXIV_EDGES)]])
    write_csv(raw / "node-feat.csv.gz", [[i + 0.5, -i] for i in range(6)])
    write_csv(raw / "node-label.csv.gz", [[c] for c in (3, 0, 39, 1, 3, 2)])
    write_csv(raw / "node_year.csv.gz", [[2010 + i] for i in range(6)])
    write_split(folder / "split" / "time", [0, 1, 2], [3], [4, 5])
    (folder / "RELEASE_v1.txt").write_text("tiny test layout\n")
    return folder


def test_ogbn_arxiv_from_its_raw_layout(tmp_path, capsys):
    write_arxiv(tmp_path)
    outdated_before = "outdated" in sys.modules
    for _ in range(2):                                   # raw files, then ogb's processed cache
        d = load_dataset("ogbn-arxiv", tmp_path)
        assert (d.graph.num_nodes, d.graph.num_edges, d.num_features, d.num_classes) == (6, 5, 2, 40)
        assert torch.equal(d.graph.edge_index, torch.tensor(ARXIV_EDGES).t())     # directed, as stored
        assert torch.equal(d.x[:, 0], torch.arange(6) + 0.5) and d.y.tolist() == [3, 0, 39, 1, 3, 2]
        assert [m.nonzero().flatten().tolist() for m in (d.train_mask, d.val_mask, d.test_mask)] == \
            [[0, 1, 2], [3], [4, 5]]
    assert ("outdated" in sys.modules) == outdated_before   # ogb's PyPI version check was not started
    capsys.readouterr()

    assert main(["info", "ogbn-arxiv", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ogbn-arxiv: OGB ogbn-arxiv") and "edges       5" in out
    assert "train 3 / val 1 / test 2" in out and "Loading" not in out      # ogb's chatter is on stderr


def test_ogbn_mag_node_types_become_one_typed_graph(tmp_path):
    folder = tmp_path / "ogb" / "ogbn_mag"                   # <root>/ogb/<name> is found too
    raw = folder / "raw"
    write_csv(raw / "num-node-dict.csv.gz", [[2, 3]], header=["author", "paper"])
    relations = {("author", "writes", "paper"): [(0, 0), (1, 0), (1, 2)],
                 ("paper", "cites", "paper"): [(2, 1), (0, 1)]}
    write_csv(raw / "triplet-type-list.csv.gz", list(relations))
    for triplet, edges in relations.items():
        write_csv(raw / "relations" / "___".join(triplet) / "edge.csv.gz", edges)
        write_csv(raw / "relations" / "___".join(triplet) / "num-edge-list.csv.gz", [[len(edges)]])
    write_csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", [[1.0], [2.0], [3.0]])
    write_csv(raw / "nodetype-has-label.csv.gz", [[False, True]], header=["author", "paper"])
    write_csv(raw / "node-label" / "paper" / "node-label.csv.gz", [[5], [7], [348]])
    split = folder / "split" / "time"
    write_csv(split / "nodetype-has-split.csv.gz", [[False, True]], header=["author", "paper"])
    write_split(split / "paper", [0], [1], [2])
    (folder / "RELEASE_v2.txt").write_text("tiny test layout\n")

    d = load_dataset("ogbn-mag", tmp_path)
    g = d.graph
    # authors are vertices 0-1, papers 2-4; relations in ogb's sorted order
    assert (g.num_nodes, g.num_node_types, g.num_edge_types, d.num_classes) == (5, 2, 2, 349)
    assert g.node_type.tolist() == [0, 0, 1, 1, 1]
    assert g.src.tolist() == [0, 1, 1, 4, 2] and g.dst.tolist() == [2, 2, 4, 3, 3]
    assert g.edge_type.tolist() == [0, 0, 0, 1, 1]
    assert d.x.flatten().tolist() == [0, 0, 1, 2, 3] and d.y.tolist() == [0, 0, 5, 7, 348]
    assert [m.nonzero().flatten().tolist() for m in (d.train_mask, d.val_mask, d.test_mask)] == [[2], [3], [4]]


def test_a_folder_of_another_release_is_an_error_not_a_prompt(tmp_path):
    folder = write_arxiv(tmp_path)
    (folder / "RELEASE_v1.txt").unlink()
    with pytest.raises(ValueError, match="not release 1 of ogbn-arxiv"):
        load_dataset("ogbn-arxiv", tmp_path)


def test_without_ogb_the_error_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    for module in [m for m in sys.modules if m == "ogb" or m.startswith("ogb.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "ogb", None)
    with pytest.raises(ImportError, match="pip install ogb"):
        load_dataset("ogbn-products", tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["info", "ogbn-products", "--root", str(tmp_path)])
    assert exit_info.value.code == 2 and "pip install ogb" in capsys.readouterr().err


def test_a_cache_write_stopped_halfway_leaves_no_cache_to_misread(tmp_path, monkeypatch):
    """The processed cache is written beside its name and renamed: a Ctrl-C (or a full
    disk) in the middle of ``torch.save`` must not leave a truncated cache that every later
    load trips over."""
    folder = write_arxiv(tmp_path)
    real_save = torch.save

    def interrupted_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        if "gnnfuse" in Path(f).name:                   # gnnfuse's cache, not ogb's own file
            with open(f, "r+b") as written:             # half of it reached the disk
                written.truncate(Path(f).stat().st_size // 2)
            raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        load_dataset("ogbn-arxiv", tmp_path)
    monkeypatch.setattr(torch, "save", real_save)
    d = load_dataset("ogbn-arxiv", tmp_path)                # built again from the raw files
    assert (d.graph.num_nodes, d.graph.num_edges) == (6, 5)
    assert (folder / "processed" / "gnnfuse_node_dataset.pt").is_file()
    assert load_dataset("ogbn-arxiv", tmp_path).y.tolist() == [3, 0, 39, 1, 3, 2]  # from the cache


def test_ranks_writing_the_cache_at_once_do_not_take_each_others_file(tmp_path, monkeypatch):
    """Every rank of a distributed run loads the data set: with one shared ``.partial``
    name, a second rank finishing its write and rename between the first's ``torch.save``
    and its rename left the first renaming a file that was gone (FileNotFoundError)."""
    folder = write_arxiv(tmp_path)
    real_save = torch.save
    other_ranks = [1]

    def save_then_another_rank_loads(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        if "gnnfuse" in Path(f).name and other_ranks:
            other_ranks.pop()
            load_dataset("ogbn-arxiv", tmp_path)       # writes and renames its own copy
    monkeypatch.setattr(torch, "save", save_then_another_rank_loads)
    assert load_dataset("ogbn-arxiv", tmp_path).y.tolist() == [3, 0, 39, 1, 3, 2]
    assert not other_ranks
    assert sorted(p.name for p in (folder / "processed").iterdir() if "gnnfuse" in p.name) == \
        ["gnnfuse_node_dataset.pt"]                    # no partial file left behind


def test_ogbs_own_processed_file_without_gnnfuses_cache_is_rebuilt_from_raw(tmp_path, capsys):
    """ogb (1.3.6) loads its processed pickle with torch's safe default, which torch >= 2.6
    refuses; with gnnfuse's cache gone (ogb used on the folder directly, say) the load
    rebuilds from the raw files instead of failing on every call."""
    folder = write_arxiv(tmp_path)
    load_dataset("ogbn-arxiv", tmp_path)
    (folder / "processed" / "gnnfuse_node_dataset.pt").unlink()
    assert (folder / "processed" / "data_processed").is_file()
    d = load_dataset("ogbn-arxiv", tmp_path)
    assert d.y.tolist() == [3, 0, 39, 1, 3, 2] and "removing" in capsys.readouterr().err

    (folder / "processed" / "gnnfuse_node_dataset.pt").unlink()
    for f in (folder / "raw").iterdir():                   # the pickle is then the only copy: kept
        f.unlink()
    with pytest.raises(ValueError, match="no raw files"):
        load_dataset("ogbn-arxiv", tmp_path)
    assert (folder / "processed" / "data_processed").is_file()


def test_an_unreadable_gnnfuse_cache_is_rebuilt(tmp_path, capsys):
    folder = write_arxiv(tmp_path)
    load_dataset("ogbn-arxiv", tmp_path)
    cache = folder / "processed" / "gnnfuse_node_dataset.pt"
    with open(cache, "r+b") as f:                           # truncated, as an in-place write stopped halfway
        f.truncate(cache.stat().st_size // 2)
    assert load_dataset("ogbn-arxiv", tmp_path).y.tolist() == [3, 0, 39, 1, 3, 2]
    assert "rebuilding" in capsys.readouterr().err
    torch.load(cache, weights_only=True)                    # whole again
