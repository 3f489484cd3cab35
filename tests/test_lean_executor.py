"""The executor's per-call bookkeeping is built once per (program, plan) and per (program,
graph): calls on several graphs, in any order, still give the oracle's numbers, and
the checks it caches still fire on every call that breaks them."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.graph import Graph
from gnnfuse.runtime import compile_program


@gnnfuse.vertex
def _weighted_mean(v):
    return sum([u.h * u.w for u in v.innbs]) / len(v.innbs) + v.h


def _oracle(graph: Graph, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    src, dst = graph.src.long(), graph.dst.long()
    total = torch.zeros_like(h).index_add_(0, dst, h[src] * w[src])
    degree = torch.bincount(dst, minlength=graph.num_nodes).to(h.dtype).unsqueeze(-1)
    return total / degree.clamp_min(1) + h


@pytest.mark.parametrize("backend", ["reference", "triton"], indirect=True)
def test_alternating_graphs_give_the_oracle_values_and_gradients(backend, device):
    torch.manual_seed(0)
    graphs = [Graph(torch.tensor([0, 1, 2, 3, 1]), torch.tensor([1, 2, 3, 0, 0]), 4),
              Graph(torch.tensor([0, 1, 2, 4, 3, 0]), torch.tensor([1, 2, 3, 3, 4, 4]), 5)]
    for graph in graphs * 2:                       # the second round reuses every cached schedule
        graph = graph.to(device)
        h = torch.randn(graph.num_nodes, 3, dtype=torch.float64, device=device, requires_grad=True)
        w = torch.randn(graph.num_nodes, 1, dtype=torch.float64, device=device, requires_grad=True)
        out = _weighted_mean(graph, {"h": h, "w": w})
        expected = _oracle(graph, h, w)
        torch.testing.assert_close(out, expected)
        grads = torch.autograd.grad(out.square().sum(), (h, w))
        torch.testing.assert_close(grads, torch.autograd.grad(expected.square().sum(), (h, w)))


def test_input_shapes_are_checked_per_graph_on_every_call():
    """The expected shapes are worked out once per (program, graph); a later call with a
    wrong shape, or the same program on another graph, is still checked."""
    small = Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    large = Graph(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]), 4)
    tracer, _ = _weighted_mean.trace({"h": torch.randn(3, 2), "w": torch.randn(3, 1)})
    program = compile_program(tracer.program)
    feeds = {"h": torch.randn(3, 2), "w": torch.randn(3, 1)}
    first = program(small, feeds)["out"]
    torch.testing.assert_close(program(small, feeds)["out"], first)
    with pytest.raises(ValueError, match=r"input 'w' \(NODE\) should have shape \[3, 1\], got \[3, 2\]"):
        program(small, {"h": feeds["h"], "w": torch.randn(3, 2)})
    with pytest.raises(ValueError, match=r"input 'h' \(NODE\) should have shape \[4, 2\], got \[3, 2\]"):
        program(large, feeds)
    with pytest.raises(KeyError, match=r"missing inputs \['w'\]; the program reads"):
        program(small, {"h": feeds["h"]})
    torch.testing.assert_close(program(large, {"h": torch.ones(4, 2), "w": torch.ones(4, 1)})["out"],
                               torch.full((4, 2), 2.0))


def test_a_bipartite_side_clash_is_refused_on_every_call():
    @gnnfuse.vertex
    def clash(v):
        return sum([u.h for u in v.innbs]) + v.h      # h read as sources and as destinations

    graph = Graph(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]), num_nodes=2, num_src_nodes=3)
    for _ in range(2):
        with pytest.raises(gnnfuse.CompileError, match="read both as a source-side table"):
            clash(graph, {"h": torch.randn(3, 2)})


def test_each_pattern_of_inputs_needing_gradients_gets_its_own_backward():
    """A program's backward is chosen once per pattern of inputs needing gradients
    (`CompiledProgram._backward_by_needs`): calls alternating the pattern each get the
    gradients of exactly their own inputs, the oracle's."""
    graph = Graph(torch.tensor([0, 1, 2, 3, 1]), torch.tensor([1, 2, 3, 0, 0]), 4)
    gen = torch.Generator().manual_seed(0)
    h0 = torch.randn(4, 3, dtype=torch.float64, generator=gen)
    w0 = torch.randn(4, 1, dtype=torch.float64, generator=gen)
    for wants in ((True, False), (False, True), (True, True), (True, False), (False, True)):
        h, w = h0.clone().requires_grad_(wants[0]), w0.clone().requires_grad_(wants[1])
        out = _weighted_mean(graph, {"h": h, "w": w})
        expected = _oracle(graph, h, w)
        torch.testing.assert_close(out, expected)
        needed = [t for t in (h, w) if t.requires_grad]
        torch.testing.assert_close(torch.autograd.grad(out.square().sum(), needed),
                                   torch.autograd.grad(expected.square().sum(), needed))
