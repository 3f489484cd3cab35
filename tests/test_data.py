"""Data loaders against the real files (exact published counts) and the synthetic generators."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnfuse.data import (DATASET_NAMES, NodeDataset, find_data_file, load_dataset, load_npz, load_planetoid,
                          load_wn18rr, planted_partition, power_law_graph, random_split)


def split_sizes(dataset: NodeDataset) -> tuple[int, int, int]:
    return tuple(int(m.sum()) for m in (dataset.train_mask, dataset.val_mask, dataset.test_mask))


def sizes(dataset: NodeDataset) -> tuple[int, int, int, int]:
    return dataset.graph.num_nodes, dataset.graph.num_edges, dataset.num_features, dataset.num_classes


def assert_symmetric_simple(dataset: NodeDataset) -> None:
    """Undirected (every edge both ways), no duplicates, no self loops."""
    g = dataset.graph
    n = g.num_nodes
    forward = set((g.src * n + g.dst).tolist())
    assert len(forward) == g.num_edges
    assert forward == set((g.dst * n + g.src).tolist())
    assert not bool((g.src == g.dst).any())


@pytest.mark.parametrize("name, nodes, edges, features, classes, split", [
    ("cora", 2708, 10556, 1433, 7, (140, 500, 1000)),
    ("citeseer", 3327, 9104, 3703, 6, (120, 500, 1000)),
])
def test_planetoid_counts(shared_data, name, nodes, edges, features, classes, split):
    d = load_planetoid(name, shared_data)
    assert sizes(d) == (nodes, edges, features, classes)
    assert d.x.dtype == torch.float32 and d.y.dtype == torch.int64 and d.x.shape == (nodes, features)
    assert split_sizes(d) == split
    assert not d.features_partial
    assert_symmetric_simple(d)


def test_planetoid_public_split_and_row_normalisation(shared_data):
    d = load_planetoid("cora", shared_data)
    assert d.train_mask[:140].all() and not d.train_mask[140:].any()
    assert d.val_mask[140:640].all() and int(d.val_mask.sum()) == 500
    assert not (d.test_mask & (d.train_mask | d.val_mask)).any()
    assert torch.allclose(d.x.sum(dim=1), torch.ones(2708))
    # citeseer pads its featureless isolated test ids with zero rows, which stay zero
    citeseer = load_planetoid("citeseer", shared_data)
    sums = citeseer.x.sum(dim=1)
    assert torch.allclose(sums[sums != 0], torch.ones_like(sums[sums != 0]))
    assert int((sums == 0).sum()) > 0


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_planetoid_labels_features_and_split_match_pygs_reader(shared_data, name):
    """PyG's own reader of the same files is the oracle: the test rows of ``ty``/``tx``
    belong at the (unsorted) ids of ``test.index``; labels placed in file order instead
    gave most of the 1000 test nodes another node's label while every count stayed right."""
    from torch_geometric.io import read_planetoid_data
    pyg = read_planetoid_data(str(shared_data / "planetoid"), name)
    ours = load_planetoid(name, shared_data)
    assert torch.equal(ours.y, pyg.y)
    sums = pyg.x.sum(dim=1, keepdim=True)
    torch.testing.assert_close(ours.x, pyg.x / torch.where(sums == 0, 1, sums))
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(ours, mask), getattr(pyg, mask)), mask


def test_pubmed_has_real_topology_and_random_features(shared_data):
    with pytest.warns(UserWarning, match="allx"):
        d = load_planetoid("pubmed", shared_data)
    assert sizes(d) == (19717, 88648, 500, 3)
    assert split_sizes(d) == (60, 500, 1000)
    assert d.features_partial and "random" in d.description.lower()
    assert int(d.x_known_mask.sum()) == 1060
    assert (d.x_known_mask == (d.train_mask | d.test_mask)).all()
    assert (d.x_known[~d.x_known_mask] == 0).all() and (d.x_known[d.x_known_mask].sum(dim=1) > 0).all()
    assert_symmetric_simple(d)


def test_pubmeds_random_features_are_warned_about_at_the_callers_line(shared_data):
    """Through load_dataset the warning pointed at gnnfuse/data/registry.py (stacklevel=3
    counted from the planetoid reader); it is shown at the user's call."""
    import sys
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        load_dataset("pubmed", shared_data)
    assert [(w.filename, w.lineno) for w in caught if "allx" in str(w.message)] == [(__file__, line)]


def test_npz_directed_counts_and_random_split(shared_data):
    cora = load_npz("cora", shared_data)
    citeseer = load_npz("citeseer", shared_data)
    # directed, de-duplicated, no self loops: cora stores none of either; citeseer has 124 loops
    assert sizes(cora) == (2708, 5429, 1433, 7)
    assert (citeseer.graph.num_nodes, citeseer.graph.num_edges, citeseer.num_classes) == (3312, 4591, 6)
    assert cora.train_mask is None
    assert load_npz("cora", shared_data, undirected=True).graph.num_edges == 10556
    # a row is the cited paper (Cora's .cites is "cited citing"): paper "35", cited 166
    # times, is the source of 166 edges; a paper cites at most 5 others within cora
    names = list(np.load(shared_data / "gnn-benchmark" / "cora.npz")["node_names"])
    out_degree = torch.bincount(cora.graph.src, minlength=2708)
    assert out_degree[names.index("35")] == 166 == out_degree.max()
    assert torch.bincount(cora.graph.dst, minlength=2708).max() == 5

    split = random_split(cora, seed=3)
    assert split_sizes(split) == (140, 500, 1000)
    assert torch.bincount(split.y[split.train_mask], minlength=7).tolist() == [20] * 7
    assert not (split.train_mask & split.val_mask).any() and not (split.val_mask & split.test_mask).any()
    assert torch.equal(random_split(cora, seed=3).test_mask, split.test_mask)
    assert cora.train_mask is None                      # the original is untouched


def test_random_split_follows_its_seed_and_refuses_a_split_that_does_not_fit(shared_data):
    """Two seeds give two splits (a split ignoring its seed repeated one split for every
    seed of a multi-seed run), and cora's 2568 nodes left after 140 training ones cannot
    hold 2000 validation plus 1000 test ones: refused, not a test set 432 short."""
    cora = load_npz("cora", shared_data)
    one, other = random_split(cora, seed=0), random_split(cora, seed=1)
    assert not torch.equal(one.train_mask, other.train_mask) and not torch.equal(one.test_mask, other.test_mask)
    with pytest.raises(ValueError, match="2568 nodes left after training, fewer than num_val \\+ num_test = 3000"):
        random_split(cora, num_val=2000, num_test=1000)


def test_wn18rr(shared_data):
    d = load_wn18rr(shared_data)
    assert d.graph.num_nodes == len(d.entity_ids) == 40943
    assert d.graph.num_edge_types == len(d.relation_names) == 11
    assert (len(d.train_triples), len(d.valid_triples), len(d.test_triples)) == (86835, 3034, 3134)
    assert d.graph.num_edges == 86835
    assert torch.equal(d.graph.edge_type, d.train_triples[:, 1])
    assert all(len(e) == 8 for e in d.entity_ids[:10])   # leading zeros kept
    # edges run head -> tail, as the file's first line reads: 00260881 _hypernym 00260622
    first = d.train_triples[0].tolist()
    assert [d.entity_ids[first[0]], d.relation_names[first[1]], d.entity_ids[first[2]]] == \
        ["00260881", "_hypernym", "00260622"]
    assert torch.equal(d.graph.src, d.train_triples[:, 0]) and torch.equal(d.graph.dst, d.train_triples[:, 2])


def test_missing_file_names_every_place_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNFUSE_DATA", str(tmp_path / "env"))
    with pytest.raises(FileNotFoundError) as error:
        find_data_file("planetoid", "ind.nosuch.x", tmp_path / "explicit")
    message = str(error.value)
    assert "ind.nosuch.x" in message and "is the only folder searched" in message
    for looked in (tmp_path / "explicit" / "planetoid", tmp_path / "explicit"):
        assert f"{looked}: no such folder" in message
    assert str(tmp_path / "env") not in message         # an explicit root is the only one searched


def test_root_from_environment_and_flat_layout(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("GNNFUSE_DATA", str(shared_data))
    monkeypatch.chdir(tmp_path)                         # so ../shared/data cannot be what is found
    assert load_dataset("cora").graph.num_nodes == 2708
    monkeypatch.setenv("GNNFUSE_DATA", str(shared_data / "planetoid"))   # <root>/ind.cora.x
    assert load_dataset("citeseer").graph.num_edges == 9104


def test_a_root_under_home_is_expanded_as_pyg_expands_it(shared_data, tmp_path, monkeypatch):
    """``root="~/data"`` (as PyG's ``Planetoid(root="~/data", ...)`` takes it) searched a
    folder literally named ``~`` under the working directory: the data set there was not
    found, and a missing Planetoid would have been downloaded into ``./~/data``."""
    from gnnfuse.data import download_root
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    _copy(shared_data / "planetoid", tmp_path / "data" / "planetoid", _CORA)
    assert load_dataset("cora", "~/data").graph.num_nodes == 2708
    assert download_root("~/data") == tmp_path / "data"
    monkeypatch.setenv("GNNFUSE_DATA", "~/data")
    assert load_dataset("cora").graph.num_nodes == 2708
    assert not (tmp_path / "~").exists()


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="cora.*products-like"):
        load_dataset("imagenet")
    # documented case-insensitive: a lookup by the name as typed let "SBM" through the
    # name check and then failed with a KeyError
    assert load_dataset("SBM", num_nodes=300).graph.num_nodes == 300
    assert {"cora", "citeseer", "pubmed", "cora-npz", "citeseer-npz", "wn18rr", "synthetic",
            "arxiv-like", "reddit2-like", "products-like"} <= set(DATASET_NAMES)


def test_power_law_presets_have_the_published_widths():
    """ogbn-arxiv has 128 features and 40 classes (OGB's statistics), which arxiv-like
    copies; nothing checked them, so the two swapped went unseen."""
    assert sizes(load_dataset("arxiv-like")) == (169_343, 1_166_243, 128, 40)


def test_power_law_graph_is_seeded_sized_and_heavy_tailed():
    a = power_law_graph(20_000, 200_000, 8, 4, seed=1)
    assert sizes(a) == (20_000, 200_000, 8, 4)
    assert a.graph.src.dtype == torch.int64 and a.x.dtype == torch.float32
    assert not bool((a.graph.src == a.graph.dst).any())
    degrees = a.graph.in_degrees().float()
    assert degrees.max() > 50 * degrees.mean()
    b = power_law_graph(20_000, 200_000, 8, 4, seed=1)
    assert torch.equal(a.graph.src, b.graph.src) and torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.graph.src, power_law_graph(20_000, 200_000, 8, 4, seed=2).graph.src)
    # a random 60/20/20 split of every node: each node in exactly one mask
    assert split_sizes(a) == (12_000, 4_000, 4_000)
    assert bool((a.train_mask.int() + a.val_mask.int() + a.test_mask.int() == 1).all())
    # exponent 1 has no power law (a = 1 / (exponent - 1)): refused by name, not a ZeroDivisionError
    with pytest.raises(ValueError, match="exponent must be > 1, got 1"):
        power_law_graph(10, 10, 2, 2, exponent=1.0)


def test_planted_partition_is_seeded_homophilous_with_default_split():
    d = load_dataset("synthetic")
    assert (d.graph.num_nodes, d.num_features, d.num_classes) == (2000, 64, 5)
    assert split_sizes(d) == (100, 500, 1000)
    assert 9 < d.graph.num_edges / d.graph.num_nodes < 11
    same_class = (d.y[d.graph.src] == d.y[d.graph.dst]).float().mean()
    assert same_class > 0.6                             # p_ratio 8 with 5 classes: 8 / (8 + 4)
    assert_symmetric_simple(d)
    again = planted_partition(seed=0)
    assert torch.equal(d.graph.src, again.graph.src) and torch.equal(d.x, again.x)
    assert torch.equal(d.train_mask, again.train_mask)


def test_relational_data_sets_are_refused_by_name_before_reading():
    """Training, benchmarks and explain need node labels: wn18rr is refused at once,
    even where its files are absent, instead of after (or instead of) a file search."""
    from gnnfuse.data import load_node_dataset
    with pytest.raises(ValueError, match="wn18rr is not a node-classification data set"):
        load_node_dataset("wn18rr", "/nonexistent-gnnfuse-root")
    assert load_node_dataset("synthetic").train_mask is not None


def test_graph_from_pyg_data_keeps_isolated_nodes_types_and_layer_results():
    """`Graph.from_data` reads a PyG Data's edge_index (here non-contiguous), its num_nodes
    (vertex 4 is isolated, so edge_index alone would lose it) and edge/node types; a layer
    on the graph gives PyG's result on the Data."""
    from torch_geometric.data import Data, HeteroData
    from torch_geometric.nn import GCNConv

    from gnnfuse import Graph
    from gnnfuse.nn import GCNConv as FusedGCNConv

    edges = torch.tensor([[0, 1], [1, 2], [2, 0], [3, 1]])
    data = Data(x=torch.randn(5, 3, dtype=torch.float64), edge_index=edges.t(),
                edge_type=torch.tensor([0, 2, 1, 0]))
    graph = Graph.from_data(data)
    assert (graph.num_nodes, graph.num_edges, graph.num_edge_types) == (5, 4, 3)
    assert torch.equal(graph.edge_index, edges.t()) and torch.equal(graph.edge_type, data.edge_type)

    pyg = GCNConv(3, 2).double()
    fused = FusedGCNConv(3, 2).double()
    fused.load_state_dict(pyg.state_dict())
    assert torch.allclose(fused(data.x, graph), pyg(data.x, data.edge_index))

    hetero = HeteroData()
    hetero["paper"].x = torch.zeros(3, 1)
    hetero["author"].x = torch.zeros(2, 1)
    hetero["author", "writes", "paper"].edge_index = torch.tensor([[0, 1], [2, 2]])
    with pytest.raises(TypeError, match="to_homogeneous"):
        Graph.from_data(hetero)
    flat = Graph.from_data(hetero.to_homogeneous())
    assert (flat.num_nodes, flat.num_edges, flat.num_node_types) == (5, 2, 2)



def test_graph_from_to_homogeneous_counts_the_types_it_names_without_edges_or_vertices():
    """The last relation (and node type) of a HeteroData had no edges (vertices): counted
    from the ids, `Graph.from_data` of its ``to_homogeneous()`` lost them, and an R-GCN
    built for the metadata's relations refused the graph, advising ``num_edge_types=``,
    which from_data has no argument for. The counts are the names the Data records."""
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import RGCNConv

    from gnnfuse import Graph
    from gnnfuse.nn import RGCNConv as FusedRGCNConv

    hetero = HeteroData()
    hetero["paper"].x = torch.zeros(3, 2)
    hetero["venue"].x = torch.zeros(0, 2)
    hetero["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1], [1, 2]])
    hetero["paper", "in", "venue"].edge_index = torch.zeros(2, 0, dtype=torch.long)
    data = hetero.to_homogeneous()
    graph = Graph.from_data(data)
    assert (graph.num_edge_types, graph.num_node_types) == (2, 2)
    pyg = RGCNConv(2, 3, num_relations=2).double()
    fused = FusedRGCNConv(2, 3, num_relations=2).double()
    fused.load_state_dict(pyg.state_dict())
    x = torch.randn(3, 2, dtype=torch.float64)
    torch.testing.assert_close(fused(x, graph), pyg(x, data.edge_index, data.edge_type))

def test_a_data_set_is_read_from_one_folder_not_mixed_with_a_partial_copy(shared_data, tmp_path, monkeypatch):
    """A partial copy of cora under one searched root (only ``ind.cora.x``, altered) and
    the full set under $GNNFUSE_DATA: files were looked up one at a time, so ``x`` came
    from the copy and everything else from the other folder, silently. Now the whole
    data set comes from the first folder holding all its files, which its description
    names."""
    partial = tmp_path / "partial" / "planetoid"
    partial.mkdir(parents=True)
    (partial / "ind.cora.x").write_bytes(b"not a pickle")
    monkeypatch.setenv("GNNFUSE_DATA", str(tmp_path / "partial"))
    monkeypatch.setattr("gnnfuse.data.paths.candidate_roots",
                        lambda root=None: [tmp_path / "partial", shared_data])     # two searched roots
    cora = load_planetoid("cora")
    assert cora.graph.num_nodes == 2708
    assert str(shared_data / "planetoid") in cora.description


def test_an_explicit_root_without_the_data_set_is_an_error_naming_it(shared_data, tmp_path, monkeypatch):
    """``--root DIR`` holding no (or part of a) data set fell through to $GNNFUSE_DATA's copy."""
    monkeypatch.setenv("GNNFUSE_DATA", str(shared_data))
    given = tmp_path / "given" / "gnn-benchmark"
    given.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=str(given)):
        load_npz("cora", tmp_path / "given")
    with pytest.raises(FileNotFoundError, match="test.txt"):
        (tmp_path / "given" / "wn18rr").mkdir()
        (tmp_path / "given" / "wn18rr" / "train.txt").write_text("")
        load_wn18rr(tmp_path / "given")


def _copy(source, target, names):
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        (target / name).write_bytes((source / name).read_bytes())
    return target


_CORA = [f"ind.cora.{p}" for p in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")]


@pytest.mark.parametrize("damage, named", [
    (lambda d: (d / "ind.cora.x").write_bytes((d / "ind.cora.x").read_bytes()[:1000]), "ind.cora.x cannot be read"),
    (lambda d: (d / "ind.cora.graph").write_bytes(b""), "ind.cora.graph cannot be read"),
    (lambda d: (d / "ind.cora.test.index").write_text("1708\nabc\n"), "ind.cora.test.index cannot be read"),
    # another data set's graph (ids up to 3326 of 2708 nodes): Graph's ValueError named no file
    (lambda d: (d / "ind.cora.graph").write_bytes((d.parent / "other" / "ind.citeseer.graph").read_bytes()),
     "ind.cora.graph cannot be read as Planetoid cora's adjacency dict over the 2708 nodes"),
])
def test_a_corrupted_planetoid_file_is_a_usage_error_naming_it(shared_data, tmp_path, damage, named, capsys):
    """A truncated pickle gave pickle's UnpicklingError and the CLI a traceback (exit 1),
    neither naming the file."""
    from gnnfuse.cli import main
    from gnnfuse.data.dataset import DataFileError
    folder = _copy(shared_data / "planetoid", tmp_path / "planetoid", _CORA)
    _copy(shared_data / "planetoid", tmp_path / "other", ["ind.citeseer.graph"])
    damage(folder)
    with pytest.raises(DataFileError, match=named):
        load_planetoid("cora", tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["info", "cora", "--root", str(tmp_path)])
    assert exit_.value.code == 2 and named in capsys.readouterr().err


def test_planetoid_files_whose_rows_do_not_line_up_are_refused(shared_data, tmp_path):
    """An allx ten rows short loaded without a word: x had 2698 rows for 2708 nodes, the
    test features shifted onto other nodes' ids."""
    import pickle
    folder = _copy(shared_data / "planetoid", tmp_path / "planetoid", _CORA)
    with open(folder / "ind.cora.allx", "rb") as f:
        allx = pickle.load(f, encoding="latin1")
    with open(folder / "ind.cora.allx", "wb") as f:
        pickle.dump(allx[:-10], f, protocol=2)
    with pytest.raises(ValueError, match="ind.cora.allx has 1698 rows but ind.cora.ally has 1708"):
        load_planetoid("cora", tmp_path)


@pytest.mark.parametrize("part, stored", [("y", "csr_matrix"), ("ty", "csr_matrix"), ("ally", "csr_matrix"),
                                           ("ty", "csr_array"), ("tx", "csr_array"), ("allx", "csr_array")])
def test_planetoid_parts_stored_as_any_scipy_sparse_type_read_as_pyg_reads_them(shared_data, tmp_path, part,
                                                                                 stored):
    """PyG's reader densifies any part with ``todense``; here sparse labels failed (``len()``
    of a sparse y or ally: "sparse array length is ambiguous"; a sparse ty: "setting an
    array element with a sequence", naming no file) and a scipy ``csr_array`` (no
    ``spmatrix``) was refused as not a feature matrix or label array."""
    import pickle

    import scipy.sparse as sp
    folder = _copy(shared_data / "planetoid", tmp_path / "planetoid", _CORA)
    with open(folder / f"ind.cora.{part}", "rb") as f:
        value = pickle.load(f, encoding="latin1")
    with open(folder / f"ind.cora.{part}", "wb") as f:
        pickle.dump(getattr(sp, stored)(value), f, protocol=2)
    got, want = load_planetoid("cora", tmp_path), load_planetoid("cora", shared_data)
    assert torch.equal(got.y, want.y) and torch.equal(got.x, want.x) and got.num_classes == want.num_classes
    assert all(torch.equal(getattr(got, m), getattr(want, m)) for m in ("train_mask", "val_mask", "test_mask"))


def test_pubmed_reads_an_allx_its_folder_holds(shared_data, tmp_path):
    """pubmed's allx is not among the published files, so x is a seeded stand-in; a copy
    holding one was ignored with a warning that called the file missing."""
    import pickle

    import scipy.sparse as sp
    names = [f"ind.pubmed.{p}" for p in ("x", "tx", "y", "ty", "ally", "graph", "test.index")]
    folder = _copy(shared_data / "planetoid", tmp_path / "planetoid", names)
    with open(folder / "ind.pubmed.ally", "rb") as f:
        rows = len(pickle.load(f, encoding="latin1"))
    allx = sp.random(rows, 500, density=0.01, format="csr", random_state=0, dtype="float32")
    with open(folder / "ind.pubmed.allx", "wb") as f:
        pickle.dump(allx, f, protocol=2)
    pubmed = load_planetoid("pubmed", tmp_path)
    assert not pubmed.features_partial and pubmed.x_known is None
    sums = torch.from_numpy(allx.sum(axis=1).A1)
    expected = torch.from_numpy(allx.toarray()) / torch.where(sums == 0, 1, sums)[:, None]
    torch.testing.assert_close(pubmed.x[:rows], expected)


def test_corrupted_npz_and_wn18rr_files_are_usage_errors_naming_them(shared_data, tmp_path):
    from gnnfuse.data.dataset import DataFileError
    npz = _copy(shared_data / "gnn-benchmark", tmp_path / "gnn-benchmark", ["cora.npz"]) / "cora.npz"
    npz.write_bytes(npz.read_bytes()[:500])
    with pytest.raises(DataFileError, match="cora.npz cannot be read"):
        load_npz("cora", tmp_path)
    # an out-of-range column id: scipy's constructor let it through, and converting the
    # matrix later raised a bare "ValueError: axis 1 index 9999 exceeds matrix dimension"
    import numpy as np
    with np.load(shared_data / "gnn-benchmark" / "cora.npz", allow_pickle=True) as original:
        parts = dict(original)
    parts["adj_indices"] = parts["adj_indices"].copy()
    parts["adj_indices"][3] = 9999
    np.savez(npz, **parts)
    with pytest.raises(DataFileError, match="cora.npz cannot be read.*adj_.* arrays are not a valid CSR matrix"):
        load_npz("cora", tmp_path)
    # a valid archive of the format's dense-attribute variant: named as lacking the arrays, not as corrupted
    with np.load(shared_data / "gnn-benchmark" / "cora.npz", allow_pickle=True) as original:
        dense = {key: value for key, value in original.items() if not key.startswith("attr_")}
    np.savez(npz, attr_matrix=np.eye(2708, 3, dtype=np.float32), **dense)
    with pytest.raises(DataFileError, match=r"cora.npz lacks the array\(s\) attr_data, attr_indices, attr_indptr, "
                                            r"attr_shape \(it holds .*attr_matrix"):
        load_npz("cora", tmp_path)
    wn = _copy(shared_data / "wn18rr", tmp_path / "wn18rr", ["train.txt", "valid.txt", "test.txt"])
    lines = (wn / "valid.txt").read_text().splitlines()
    (wn / "valid.txt").write_text("\n".join(line.replace("\t", " ") for line in lines[:3]) + "\n")
    with pytest.raises(DataFileError, match="valid.txt, line 1: .* has 1 tab-separated column"):
        load_wn18rr(tmp_path)   # three lines of one column each: a reshape made them one "triple"


def test_npz_arrays_of_two_node_counts_are_refused(shared_data, tmp_path):
    """One label short (2707 labels for 2708 rows of adj and attr) is two counts, not three:
    still a file whose arrays do not describe one node set, refused naming them."""
    from gnnfuse.data.dataset import DataFileError
    npz = tmp_path / "gnn-benchmark" / "cora.npz"
    npz.parent.mkdir()
    with np.load(shared_data / "gnn-benchmark" / "cora.npz", allow_pickle=True) as original:
        parts = dict(original)
    np.savez(npz, **{**parts, "labels": parts["labels"][:-1]})
    with pytest.raises(DataFileError, match="disagree on the node count .*labels 2707"):
        load_npz("cora", tmp_path)


def test_planetoid_test_ids_not_right_after_ally_are_refused(shared_data, tmp_path):
    """cora's test ids start at 1708, right after ally's 1708 rows; ids shifted by one
    left a node with no label row (masks of 2709 nodes, y of 2708) without a word."""
    folder = _copy(shared_data / "planetoid", tmp_path / "planetoid", _CORA)
    ids = np.loadtxt(folder / "ind.cora.test.index", dtype=np.int64)
    np.savetxt(folder / "ind.cora.test.index", ids + 1, fmt="%d")
    with pytest.raises(ValueError, match="test ids start at 1709, expected right after the 1708 rows of ally"):
        load_planetoid("cora", tmp_path)


def test_wn18rr_whitespace_around_an_id_does_not_make_another_entity(tmp_path):
    """A trailing space (or CR) kept in ``"00000002 "`` made it an entity of its own beside
    ``"00000002"``: 4 entities and a train edge to a vertex no other split knew, where
    PyG's WordNet18RR reads 3; an empty relation field was taken for a relation ``""``."""
    from gnnfuse.data.dataset import DataFileError
    folder = tmp_path / "wn18rr"
    folder.mkdir()
    (folder / "train.txt").write_bytes(b"00000001\t_r\t00000002 \r\n00000002\t_s\t00000003\r\n\n")
    (folder / "valid.txt").write_text("00000002\t_r\t00000003\n")
    (folder / "test.txt").write_text("00000003\t_s\t00000001\n")
    d = load_wn18rr(tmp_path)
    assert d.entity_ids == ["00000001", "00000002", "00000003"] and d.relation_names == ["_r", "_s"]
    assert d.train_triples.tolist() == [[0, 0, 1], [1, 1, 2]] and d.valid_triples.tolist() == [[1, 0, 2]]
    (folder / "test.txt").write_text("00000003\t\t00000001\n")
    with pytest.raises(DataFileError, match="test.txt, line 1: .*with an empty one"):
        load_wn18rr(tmp_path)
    # a byte-order mark made the first head "\ufeff00000003", an entity of its own
    (folder / "test.txt").write_text("\ufeff00000003\t_s\t00000001\n", encoding="utf-8")
    d = load_wn18rr(tmp_path)
    assert d.entity_ids == ["00000001", "00000002", "00000003"] and d.test_triples.tolist() == [[2, 1, 0]]


def test_an_empty_root_is_refused_not_taken_for_no_root(monkeypatch, tmp_path):
    """``--root "$DATA"`` with $DATA unset searched the discovered folders instead."""
    with pytest.raises(ValueError, match="data root given is empty"):
        load_dataset("cora", root="")
    monkeypatch.setenv("GNNFUSE_DATA", str(tmp_path / "typo"))
    with pytest.raises(FileNotFoundError, match="GNNFUSE_DATA is set .*typo.*only folder searched"):
        find_data_file("gnn-benchmark", "cora.npz")


def test_planted_partition_features_carry_the_class_signal():
    """Each vertex's features are ``0.15 * centroid[class] + N(0, I)``: the class means of
    x differ by about 2 * 64 * 0.15^2 = 2.9 in squared distance (plus 0.3 of sampling
    noise). Every class drawn around one centroid left them 0.3 apart -- features with
    no class signal -- and no test noticed."""
    d = planted_partition(seed=0)
    means = torch.stack([d.x[d.y == c].mean(dim=0) for c in range(d.num_classes)])
    distances = torch.cdist(means, means).pow(2)
    off_diagonal = distances[~torch.eye(d.num_classes, dtype=torch.bool)]
    assert 1.5 < off_diagonal.mean() < 5


def test_planted_partition_splits_a_small_graph_and_refuses_a_tiny_one():
    small = planted_partition(num_nodes=300)
    assert split_sizes(small) == (100, 66, 134)
    assert split_sizes(planted_partition(num_nodes=1000)) == (100, 250, 500)     # unchanged where it fitted
    with pytest.raises(ValueError, match="num_nodes=102 with num_classes=5 leaves 2"):
        planted_partition(num_nodes=102)


def test_a_knowledge_graph_preset_with_an_odd_count_is_refused():
    """101 edges gave 100 and 5 relations 4, silently."""
    from gnnfuse.data.typed import TypedPreset
    for edges, relations, named in ((101, 4, "num_edges=101"), (100, 5, "num_relations=5"), (100, 1, "num_rel")):
        with pytest.raises(ValueError, match=named):
            TypedPreset("x", (("entity", 40),), 3, 4, num_edges=edges, num_relations=relations)
