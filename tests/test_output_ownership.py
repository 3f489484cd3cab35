"""A compiled program's outputs never share memory with its inputs (runtime/compiled.py's
`_own_storage`).

A program whose output is an input, or a view of one (``return v.h``, a reshape,
``gsddmm(g, None, edge=e)``, which the README says copies its operand), was handed back
as the input itself: ``out += 5`` then wrote the caller's features, silently, and with an
input needing a gradient autograd refused the edit naming ``_ProgramFunction``. Eager
per-vertex code stacks fresh rows, so these outputs are copies now, on every backend
(found by differential fuzzing of in-place edits)."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse.ops import gsddmm
from gnnfuse.runtime.compiled import CompiledProgram

ON_HOST = ["reference", "cpu"]


def _graph() -> gnnfuse.Graph:
    return gnnfuse.Graph(torch.tensor([0, 1, 2, 3, 3]), torch.tensor([1, 2, 3, 0, 0]), 4)


@gnnfuse.vertex
def _identity(v):
    return v.h


@gnnfuse.vertex
def _reshaped(v):
    return v.h.reshape(2, 1)


CALLS = {
    "identity": lambda g, x: _identity(g, {"h": x}),
    "reshape": lambda g, x: _reshaped(g, {"h": x}),
    "gsddmm None": lambda g, x: gsddmm(g, None, edge=torch.cat([x, x[:1]])[:5]),
}


@pytest.mark.parametrize("backend", ON_HOST)
@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("grad", [False, True])
def test_an_output_computed_from_inputs_alone_is_a_copy(name, grad, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    x = torch.arange(8, dtype=torch.float64).reshape(4, 2).requires_grad_(grad)
    before = x.detach().clone()
    for _ in range(2):     # the second call may run a prepared one
        out = CALLS[name](_graph(), x)
        with torch.no_grad():
            out.mul_(10)
        torch.testing.assert_close(x.detach(), before)
    if grad:     # an edit of an output that is no view of an input is autograd's usual business
        out = CALLS[name](_graph(), x)
        out.relu_()
        out.sum().backward()
        assert x.grad is not None


@gnnfuse.vertex
def _in_degree(v):
    return {"d": len(v.innbs), "h": v.h}


@pytest.mark.parametrize("backend", ON_HOST)
def test_a_degree_output_is_not_the_graphs_cached_count(backend, monkeypatch):
    """``len(v.innbs)`` returned as it is was the graph's cached in-degrees itself:
    ``d.add_(1)`` on it wrote the count every layer on the graph reads, and the next
    call raised GraphModifiedError blaming a write to ``Graph.in_degrees`` the user
    never made (the compiled operator's copy is tested in test_torch_compile.py)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    graph, h = _graph(), torch.randn(4, 2)
    for _ in range(3):
        d = _in_degree(graph, {"h": h})["d"]
        d.add_(1)
        assert d.tolist() == [3, 2, 2, 2]
    assert graph.in_degrees().tolist() == [2, 1, 1, 1]


@gnnfuse.vertex
def _in_degree_alone(v):
    return len(v.innbs)


@pytest.mark.parametrize("backend", ON_HOST)
def test_a_degree_alone_is_not_the_graphs_cached_count(backend, monkeypatch):
    """A program whose one output is ``len(v.innbs)`` reads no input beside it, so only
    the degree op counting as input-like (`_may_alias_inputs`) has its output copied:
    without that, ``d.add_(1)`` wrote the graph's cached in-degrees (the test above
    returns ``v.h`` too, which marked the program on its own)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    graph, h = _graph(), torch.randn(4, 2)
    for _ in range(3):
        d = _in_degree_alone(graph, {"h": h})
        d.add_(1)
        assert d.tolist() == [3, 2, 2, 2]
    assert graph.in_degrees().tolist() == [2, 1, 1, 1]


@gnnfuse.vertex
def _one_sum_two_names(v):
    total = sum([u.h * u.h for u in v.innbs])
    return {"a": total, "b": total}


@pytest.mark.parametrize("backend", ON_HOST)
def test_two_outputs_of_one_value_are_two_tensors(backend, monkeypatch):
    """Eager per-vertex code stacks each returned key's rows into a tensor of its own, so
    ``out["a"].mul_(10)`` leaves ``out["b"]`` as it was; the backends hand one value's
    buffer to both names, and `_own_storage` copies the second. (Not copied, ``b`` came
    back 10x, and no test failed.) The gradient through both names is the sum of both."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    graph = _graph()
    h = torch.randn(4, 2, dtype=torch.float64)
    expected = torch.zeros_like(h).index_add(0, graph.dst, h[graph.src] ** 2)
    out = _one_sum_two_names(graph, {"h": h})
    out["a"].mul_(10)
    torch.testing.assert_close(out["b"], expected)
    leaf, eager = h.clone().requires_grad_(), h.clone().requires_grad_()
    out = _one_sum_two_names(graph, {"h": leaf})
    (out["a"] + 2 * out["b"]).sum().backward()
    (3 * torch.zeros_like(h).index_add(0, graph.dst, eager[graph.src] ** 2)).sum().backward()
    torch.testing.assert_close(leaf.grad, eager.grad)


def test_an_edge_table_handed_to_gsddmm_is_not_written_through_its_output():
    e = torch.ones(5, 2)
    s = gsddmm(_graph(), None, edge=e)
    s.mul_(10)
    assert bool((e == 1).all())


def test_layer_programs_do_not_pay_for_the_check():
    """Only a program with an output reached from inputs through local ops alone (or two
    outputs of one value) checks its outputs' memory; an aggregation's never does."""
    import gnnfuse.nn as gnn
    made: list[CompiledProgram] = []
    real = CompiledProgram.__init__

    def recording(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)
    torch.manual_seed(0)
    x, ei = torch.randn(9, 4, requires_grad=True), torch.randint(0, 9, (2, 30))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CompiledProgram, "__init__", recording)
        gnn.SAGEConv(4, 3)(x, ei).sum().backward()
        gnn.GCNConv(4, 3)(x, ei).sum().backward()     # its norms come from degrees, aggregated
        gnnfuse.vertex(lambda v: v.h)(_graph(), {"h": torch.randn(4, 2)})     # a fresh trace
    flags = [p._may_alias for p in made]
    assert flags and flags[-1] and not any(flags[:-1]), flags
