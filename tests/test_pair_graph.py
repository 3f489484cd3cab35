"""The graph over (source, relation) pairs (runtime/pair_graph.py) that programs rewritten
by passes/pair_sources.py run on: each edge runs from its own pair to its destination,
in the typed graph's edge order with its type; `pair_matmul` gives each pair its
vertex's row times its relation's matrix, with gradients checked in float64."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse
from gnnfuse.runtime.pair_graph import pair_graph, pair_matmul

f64 = torch.float64


@st.composite
def typed_graphs(draw):
    """Small typed graphs as users have them: multi-edges, self loops, isolated vertices,
    relations without edges."""
    n = draw(st.integers(1, 7))
    relations = draw(st.integers(1, 4))
    m = draw(st.integers(0, 25))
    ints = st.lists(st.integers(0, n - 1), min_size=m, max_size=m)
    src, dst = draw(ints), draw(ints)
    types = draw(st.lists(st.integers(0, relations - 1), min_size=m, max_size=m))
    return gnnfuse.Graph(torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long), n,
                         edge_type=torch.tensor(types, dtype=torch.long), num_edge_types=relations)


@settings(max_examples=40, deadline=None)
@given(typed_graphs())
def test_each_edge_runs_from_its_own_pair(graph):
    over_pairs, pairs = pair_graph(graph)
    src, dst, types = graph.src, graph.dst, graph.edge_type
    pair_src = over_pairs.src
    assert over_pairs.num_src_nodes == len(pairs.vertex) and over_pairs.num_nodes == graph.num_nodes
    assert torch.equal(over_pairs.dst, dst) and torch.equal(over_pairs.edge_type, types)
    assert torch.equal(pairs.vertex[pair_src], src)                    # the pair's vertex is the source
    relation = torch.empty(len(pairs.vertex), dtype=torch.long)
    for r, ids in enumerate(pairs.groups):
        relation[ids] = r
    assert torch.equal(relation[pair_src], types)                      # and its relation the edge's type
    keys = {(int(s), int(t)) for s, t in zip(src, types)}
    assert len(pairs.vertex) == len(keys)                              # one pair per (source, relation)


@settings(max_examples=25, deadline=None)
@given(typed_graphs(), st.integers(1, 3), st.integers(1, 3))
def test_pair_rows_are_the_vertex_row_times_the_relation_matrix(graph, width_in, width_out):
    gen = torch.Generator().manual_seed(graph.num_edges)
    x = torch.randn(graph.num_nodes, width_in, dtype=f64, generator=gen)
    w = torch.randn(graph.num_edge_types, width_in, width_out, dtype=f64, generator=gen)
    got = pair_matmul(graph, x, w)
    over_pairs, _ = pair_graph(graph)
    per_edge = torch.bmm(x[graph.src].unsqueeze(1), w[graph.edge_type]).squeeze(1)
    torch.testing.assert_close(got[over_pairs.src], per_edge, rtol=1e-12, atol=1e-12)


def test_pair_matmul_gradcheck():
    graph = gnnfuse.Graph(torch.tensor([0, 0, 1, 2, 2, 2, 3]), torch.tensor([1, 2, 2, 0, 0, 3, 3]), 5,
                          edge_type=torch.tensor([0, 0, 1, 2, 1, 2, 0]), num_edge_types=4)
    x = torch.randn(5, 3, dtype=f64, requires_grad=True)
    w = torch.randn(4, 3, 2, dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: pair_matmul(graph, a, b), (x, w))


def test_pair_matmul_gradient_of_either_input_alone():
    """A frozen ``x`` (embeddings kept fixed) with a trainable ``w``, and the other way:
    each backward gives the needed gradient by the other input's ``needs_input_grad``
    alone. (``w``'s gradient tied to ``x``'s need was None with ``x`` frozen, silently
    leaving the relation matrices untrained, and no test failed.)"""
    graph = gnnfuse.Graph(torch.tensor([0, 0, 1, 2, 2, 2, 3]), torch.tensor([1, 2, 2, 0, 0, 3, 3]), 5,
                          edge_type=torch.tensor([0, 0, 1, 2, 1, 2, 0]), num_edge_types=4)
    x = torch.randn(5, 3, dtype=f64)
    w = torch.randn(4, 3, 2, dtype=f64)
    assert torch.autograd.gradcheck(lambda b: pair_matmul(graph, x, b), (w.clone().requires_grad_(),))
    assert torch.autograd.gradcheck(lambda a: pair_matmul(graph, a, w), (x.clone().requires_grad_(),))


def test_bad_inputs_say_what_is_wrong():
    untyped = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    with pytest.raises(ValueError, match="edge types"):
        pair_graph(untyped)
    typed = gnnfuse.Graph(torch.tensor([0, 1]), torch.tensor([1, 0]), 2, edge_type=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"x \[sources, in\] and w \[relations, in, out\]"):
        pair_matmul(typed, torch.randn(2, 3), torch.randn(2, 4, 2))
