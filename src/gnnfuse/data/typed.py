"""Seeded synthetic typed graphs sized like the relational benchmarks: AIFB, MUTAG, BGS and
AM (R-GCN's entity-classification knowledge graphs, as PyG's ``Entities`` holds them)
and ogbn-mag (HGT's heterogeneous academic graph).

The real graphs need downloads of up to a few GB and RDF parsing; for throughput and
memory measurements what matters is their shape, which these reproduce:

- the node and edge counts and the number of relations (PyG's counts, inverse relations
  included -- the knowledge graphs store every triple in both directions, as a relation
  and its inverse, and so do these);
- power-law degrees: endpoints are drawn by Zipf rank (`synthetic._zipf_ranks`, the
  Chung-Lu weights of the power-law presets), so a few hubs hold many edges;
- skewed relation frequencies: relation r (of R) is drawn with probability proportional
  to 1 / (r + 1) (`relation_skew`, Zipf with exponent 1), as in real KGs where a few
  relations (``rdf:type``, ``hasAuthor``...) hold most triples and the long tail has a
  handful each. The skew is over the base relations, each inverse having its relation's
  count: on AIFB's 90 (45 and their inverses) the commonest relation holds ~11% of the
  edges and the rarest ~0.25%. ogbn-mag-like uses the real graph's per-relation edge
  counts instead.

Features are N(0, 1) (the KGs have none; R-GCN uses learnt embeddings), labels uniform,
and the split random 60/20/20 (on papers only, for mag-like): accuracy is meaningless,
these are for benchmarks. Everything is vectorised numpy: the AM-sized graph (12M edges)
builds in a few seconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..graph import Graph
from .dataset import NodeDataset, index_mask
from .synthetic import _zipf_ranks

EdgeType = tuple[str, str, str]


@dataclass(frozen=True)
class TypedPreset:
    """One preset: vertex counts per node type, edge types with their edge counts (a KG
    preset gives the total and its relation count instead), and the labelled node type."""
    mimics: str
    node_counts: tuple[tuple[str, int], ...]
    num_classes: int
    num_features: int
    num_edges: int = 0                   # KG presets: all edges, inverses included
    num_relations: int = 0               # KG presets: relations, inverses included (even)
    edge_counts: tuple[tuple[EdgeType, int], ...] = ()    # heterogeneous presets

    def __post_init__(self) -> None:
        """A KG preset's edges are drawn half at a time, each with its inverse, and its
        relations come in (r, rev_r) pairs: an odd count would silently lose one."""
        if self.edge_counts:
            return
        for field, value in (("num_edges", self.num_edges), ("num_relations", self.num_relations)):
            if value < 2 or value % 2:
                raise ValueError(f"TypedPreset {self.mimics!r}: {field}={value}; a knowledge-graph preset counts "
                                 f"every edge and relation with its inverse, so {field} must be even and at least 2")

    @property
    def node_types(self) -> list[str]:
        return [t for t, _ in self.node_counts]

    @property
    def edge_types(self) -> list[EdgeType]:
        if self.edge_counts:
            return [t for t, _ in self.edge_counts]
        base = self.num_relations // 2
        return [("entity", f"r{r}", "entity") for r in range(base)] + \
               [("entity", f"rev_r{r}", "entity") for r in range(base)]

    @property
    def labelled_type(self) -> str:
        return self.node_types[0]


def _kg(mimics: str, nodes: int, edges: int, relations: int, classes: int) -> TypedPreset:
    return TypedPreset(mimics, (("entity", nodes),), classes, 16, num_edges=edges, num_relations=relations)


TYPED_PRESETS: dict[str, TypedPreset] = {
    "aifb-like": _kg("AIFB", 8_285, 58_086, 90, 4),
    "mutag-like": _kg("MUTAG", 23_644, 148_454, 46, 2),
    "bgs-like": _kg("BGS", 333_845, 1_832_398, 206, 2),
    "am-like": _kg("AM", 1_666_764, 11_976_642, 266, 11),
    "mag-like": TypedPreset(
        "ogbn-mag", (("paper", 736_389), ("author", 1_134_649), ("institution", 8_740), ("field_of_study", 59_965)),
        349, 128, edge_counts=((("author", "affiliated_with", "institution"), 1_043_998),
                               (("author", "writes", "paper"), 7_145_660),
                               (("paper", "cites", "paper"), 5_416_271),
                               (("paper", "has_topic", "field_of_study"), 7_505_078))),
}


def relation_skew(num_relations: int) -> torch.Tensor:
    """P(relation r) proportional to 1 / (r + 1): Zipf's law over the relations."""
    weights = 1.0 / torch.arange(1, num_relations + 1, dtype=torch.float64)
    return weights / weights.sum()


def _endpoints(count: int, type_size: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` power-law endpoint ids in 0..type_size-1, hubs at random ids."""
    return rng.permutation(type_size)[_zipf_ranks(type_size, count, 2.5, rng)]


def _kg_edges(preset: TypedPreset, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half the edges drawn with skewed relations, then each one's inverse (relation + R/2)."""
    nodes, base = preset.node_counts[0][1], preset.num_relations // 2
    half = preset.num_edges // 2
    # per-relation counts, then that many edges each: the endpoints are drawn independently
    # of the relation, so listing the edges relation by relation loses nothing
    relation = np.repeat(np.arange(base), rng.multinomial(half, relation_skew(base).numpy()))
    src, dst = _endpoints(half, nodes, rng), _endpoints(half, nodes, rng)
    loops = src == dst
    dst[loops] = (dst[loops] + 1) % nodes
    return np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([relation, relation + base])


def _hetero_edges(preset: TypedPreset, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each edge type's count of power-law edges between its node types, in global ids."""
    counts = dict(preset.node_counts)
    offsets = dict(zip(preset.node_types, np.cumsum([0] + [c for _, c in preset.node_counts])[:-1].tolist()))
    srcs, dsts, types = [], [], []
    for relation, ((src_type, _, dst_type), count) in enumerate(preset.edge_counts):
        srcs.append(_endpoints(count, counts[src_type], rng) + offsets[src_type])
        dsts.append(_endpoints(count, counts[dst_type], rng) + offsets[dst_type])
        types.append(np.full(count, relation, dtype=np.int64))
    return np.concatenate(srcs), np.concatenate(dsts), np.concatenate(types)


def typed_graph(name: str, seed: int = 0, num_features: int | None = None) -> NodeDataset:
    """The preset ``name`` of `TYPED_PRESETS` (see `build_typed_graph`)."""
    if name not in TYPED_PRESETS:
        raise ValueError(f"unknown typed preset {name!r}; known: {', '.join(TYPED_PRESETS)}")
    return build_typed_graph(TYPED_PRESETS[name], name, seed, num_features)


def build_typed_graph(preset: TypedPreset, name: str, seed: int = 0, num_features: int | None = None) -> NodeDataset:
    """``preset`` as a node data set on a typed `Graph` (``edge_type`` numbered as
    ``preset.edge_types``; ``node_type`` as its ``node_types``, global ids type after type)."""
    rng = np.random.default_rng(seed)
    src, dst, relation = (_hetero_edges if preset.edge_counts else _kg_edges)(preset, rng)
    sizes = [c for _, c in preset.node_counts]
    num_nodes = sum(sizes)
    node_type = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    graph = Graph(torch.from_numpy(src), torch.from_numpy(dst), num_nodes, edge_type=torch.from_numpy(relation),
                  num_edge_types=len(preset.edge_types), node_type=node_type, num_node_types=len(sizes))
    generator = torch.Generator().manual_seed(seed)
    labelled = sizes[0]                        # the labelled type comes first
    order = torch.randperm(labelled, generator=generator)
    train, val = int(0.6 * labelled), int(0.8 * labelled)
    width = preset.num_features if num_features is None else num_features
    types = (f"{len(preset.edge_types)} relations" if not preset.edge_counts else
             f"{len(sizes)} node types, {len(preset.edge_types)} relations")
    return NodeDataset(
        name=name, graph=graph, x=torch.randn(num_nodes, width, generator=generator),
        y=torch.randint(preset.num_classes, (num_nodes,), generator=generator),
        train_mask=index_mask(num_nodes, order[:train]), val_mask=index_mask(num_nodes, order[train:val]),
        test_mask=index_mask(num_nodes, order[val:]), num_classes=preset.num_classes,
        description=f"synthetic typed graph sized like {preset.mimics} ({types}; power-law degrees, Zipf "
                    f"relation frequencies, seed {seed}); random features and labels, for benchmarking only")
