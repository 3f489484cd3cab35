"""Synthetic typed presets (gnnfuse.data.typed): the sizes of the graphs they mimic, each
relation paired with its inverse, skewed relation frequencies, power-law degrees, node
types in their own id ranges, seeded, and listed by `gnnfuse info`."""
from __future__ import annotations

import torch

from gnnfuse.cli import main
from gnnfuse.data import DATASET_NAMES, load_dataset
from gnnfuse.data.typed import TYPED_PRESETS, TypedPreset, build_typed_graph


def test_kg_presets_have_the_real_sizes_and_inverse_relations():
    data = load_dataset("aifb-like")
    graph = data.graph
    assert (graph.num_nodes, graph.num_edges, graph.num_edge_types) == (8_285, 58_086, 90)
    half = graph.num_edges // 2
    assert torch.equal(graph.src[half:], graph.dst[:half]) and torch.equal(graph.dst[half:], graph.src[:half])
    assert torch.equal(graph.edge_type[half:], graph.edge_type[:half] + 45)
    counts = torch.bincount(graph.edge_type[:half], minlength=45)
    assert counts[0] > 20 * counts[-1] > 0            # Zipf over relations: a long, non-empty tail
    degree = graph.in_degrees().float()
    assert degree.max() > 20 * degree.mean()          # power-law hubs
    assert not bool((graph.src == graph.dst).any())


def test_presets_are_seeded():
    a, b, c = (load_dataset("mutag-like", seed=s) for s in (0, 0, 1))
    assert torch.equal(a.graph.src, b.graph.src) and torch.equal(a.x, b.x)
    assert not torch.equal(a.graph.src, c.graph.src)


def test_heterogeneous_preset_keeps_each_edge_type_between_its_node_types():
    preset = TypedPreset("tiny", (("paper", 50), ("author", 70), ("field", 5)), 3, 4,
                         edge_counts=((("author", "writes", "paper"), 300), (("paper", "has_topic", "field"), 120)))
    data = build_typed_graph(preset, "tiny")
    graph = data.graph
    assert (graph.num_nodes, graph.num_edges, graph.num_node_types) == (125, 420, 3)
    node_type = graph.node_type
    writes = graph.edge_type == 0
    assert bool((node_type[graph.src[writes]] == 1).all()) and bool((node_type[graph.dst[writes]] == 0).all())
    topic = graph.edge_type == 1
    assert bool((node_type[graph.src[topic]] == 0).all()) and bool((node_type[graph.dst[topic]] == 2).all())
    labelled = data.train_mask | data.val_mask | data.test_mask
    assert bool(labelled[:50].all()) and not bool(labelled[50:].any())     # papers only


def test_info_lists_the_presets(capsys):
    assert set(TYPED_PRESETS) <= set(DATASET_NAMES)
    assert main(["info", "aifb-like"]) == 0
    out = capsys.readouterr().out
    assert "sized like AIFB (90 relations" in out and "edges       58086" in out


def test_relation_frequencies_follow_zipf_over_the_relations():
    """P(r) proportional to 1 / (r + 1), as the module documents: 1, 1/2, 1/3, 1/4 is
    12 : 6 : 4 : 3 out of 25; on AIFB-like's 45 base relations (and their inverses) the
    commonest holds ~11% of all edges and the rarest ~0.25%. A skew of 1 / (r + 2) kept
    the looser tail check above passing (46 / 2 > 20) with the commonest at ~7%."""
    from gnnfuse.data.typed import relation_skew
    torch.testing.assert_close(relation_skew(4), torch.tensor([12.0, 6, 4, 3], dtype=torch.float64) / 25)
    graph = load_dataset("aifb-like").graph
    share = torch.bincount(graph.edge_type, minlength=90).double() / graph.num_edges
    assert 0.10 < share[0] < 0.13 and 0.0015 < share[44] < 0.0035
