"""A small graph's first pass runs on the reference executor (runtime/first_pass.py).

On a GPU the Triton backend is the default; here (CPU) that default is simulated by
making `backend_name` answer "triton", whose kernels Triton's interpreter runs. Which
executor ran each forward and backward is counted by wrapping the executors, and every
result is compared with PyG's layer from the same weights.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch_geometric.nn as pyg_nn

import gnnfuse
import gnnfuse.nn
from gnnfuse.graph import Graph
from gnnfuse.runtime import first_pass
from gnnfuse.runtime.compiled import record_calls
from first_pass_check import DEVICE, triton_by_default



@pytest.fixture
def ran(monkeypatch) -> Counter:
    """Triton as the default backend, simulated, and the executors' runs counted."""
    return triton_by_default(monkeypatch)


def _graph(nodes: int = 7, edges: int = 16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, nodes, (2, edges), generator=gen).to(DEVICE)


def _pair(kind: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(gnnfuse's, PyG's) layer of ``kind``, PyG's weights copied into gnnfuse's."""
    torch.manual_seed(0)
    if kind == "GIN":
        def mlp():
            return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6))
        theirs, ours = pyg_nn.GINConv(mlp()), gnnfuse.nn.GINConv(mlp())
    elif kind == "SAGE":
        theirs, ours = pyg_nn.SAGEConv(5, 6), gnnfuse.nn.SAGEConv(5, 6)
    else:
        theirs, ours = pyg_nn.GCNConv(5, 6), gnnfuse.nn.GCNConv(5, 6)
    theirs, ours = theirs.to(DEVICE), ours.to(DEVICE)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _step(layer: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor):
    """Output and the input's and first weight's gradients of a sum of squares."""
    x = x.clone().requires_grad_()
    out = layer(x, edge_index)
    out.pow(2).sum().backward()
    weight = next(layer.parameters())
    grads = (x.grad, weight.grad.clone())
    layer.zero_grad()
    return out.detach(), grads


def _assert_same(ours, theirs) -> None:
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["GIN", "GCN", "SAGE"])
def test_first_pass_on_reference_then_triton_on_the_kept_graph(ran, kind):
    ours, theirs = _pair(kind)
    x, edge_index = torch.randn(7, 5, device=DEVICE), _graph()
    with record_calls() as calls:
        _assert_same(_step(ours, x, edge_index), _step(theirs, x, edge_index))
    assert ran == {"reference": 2}       # the forward and its backward (GCN: on the self-looped graph)
    assert [c.executor for c in calls] == ["reference (first pass)"]
    graph = calls[0].graph
    assert not graph.first_pass         # ended by the backward
    # degrees (SAGE's mean, GCN's norm) came without a sort
    assert not {"csr", "csr_rows", "reverse_csr", "reverse_csr_rows"} & set(graph._cache)
    _assert_same(_step(ours, x, edge_index), _step(theirs, x, edge_index))
    assert ran["reference"] == 2 and ran["triton"] == 2     # the graph a backward ran on: Triton


def test_only_the_backward_ends_a_first_pass(ran):
    ours, _ = _pair("GIN")
    x, edge_index = torch.randn(7, 5, device=DEVICE), _graph()
    with torch.no_grad():
        for _ in range(3):      # inference only, not recorded (a recorded call prepares nothing)
            ours(x, edge_index)
        with record_calls() as calls:
            ours(x, edge_index)
    assert ran == {"reference": 4}
    assert calls[0].graph.first_pass      # the graph stays on its first pass
    assert calls[0].compiled.prepared is None       # and no prepared Triton run was made for it


def test_larger_and_explicit_graphs_and_a_forced_backend_run_triton(ran, monkeypatch):
    ours, theirs = _pair("GIN")
    x = torch.randn(7, 5, device=DEVICE)
    monkeypatch.setattr(first_pass, "FIRST_PASS_EDGES", 15)
    _assert_same(_step(ours, x, _graph(edges=16)), _step(theirs, x, _graph(edges=16)))
    assert ran == {"triton": 2}      # more edges than the bound
    edge_index = _graph(edges=12, seed=1)
    _step(ours, x, Graph.from_edge_index(edge_index, 7))       # a Graph the user built
    assert ran == {"triton": 4}
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")     # forced: no first-pass placement
    _assert_same(_step(ours, x, edge_index), _step(theirs, x, edge_index))
    assert ran == {"triton": 6}


def test_graphs_derived_from_a_first_pass_graph_inherit_it():
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 0]], device=DEVICE)
    graph = Graph.coerce(edge_index)
    assert graph.first_pass
    assert graph.add_self_loops().first_pass and graph.remove_self_loops().first_pass
    assert not Graph.from_edge_index(edge_index).first_pass
    assert not Graph.from_edge_index(edge_index).add_self_loops().first_pass


def test_explain_names_the_first_pass_executor(ran):
    ours, _ = _pair("GIN")
    x, edge_index = torch.randn(7, 5, device=DEVICE), _graph(seed=2)
    first = str(gnnfuse.explain(ours, x, edge_index))
    assert "executor: reference (the graph's first pass" in first
    _step(ours, x, edge_index)
    assert "executor: triton ===" in str(gnnfuse.explain(ours, x, edge_index))


def test_a_captured_steps_warm_up_runs_on_each_devices_backend(ran):
    ours, theirs = _pair("GIN")
    x, edge_index = torch.randn(7, 5, device=DEVICE), _graph(seed=3)
    with first_pass.steady_executor(), record_calls() as calls:
        _assert_same(_step(ours, x, edge_index), _step(theirs, x, edge_index))
    assert ran == {"triton": 2}
    assert not calls[0].graph.first_pass     # its backward ran all the same


@pytest.mark.skipif(not torch.cuda.is_available(), reason="records a CUDA graph")
def test_a_step_captured_after_two_warm_up_calls_on_a_new_graph(ran):
    """The first warm-up call is the graph's first pass, and the audited second call runs
    the kernels the capture then records; the replayed losses follow PyG's eager steps.
    (GIN's aggregation takes ``x``, which needs no gradient: no backward of it ends the
    first pass, so without `steady_executor` both warm-up calls ran the reference backend
    and the capture compiled and built the Triton backend's kernels and layouts.)"""
    from gnnfuse.runtime.cuda_graph import StepCapture
    ours, theirs = _pair("GIN")
    x, edge_index = torch.randn(7, 5, device=DEVICE), _graph(seed=4)
    losses = {}
    for label, layer in (("ours", ours), ("theirs", theirs)):
        optimizer = torch.optim.Adam(layer.parameters(), lr=0.1, capturable=label == "ours")

        def step(layer=layer, optimizer=optimizer):
            optimizer.zero_grad(set_to_none=False)
            loss = layer(x, edge_index).pow(2).mean()
            loss.backward()
            optimizer.step()
            return loss.detach()
        run = StepCapture(step, optimizers=[optimizer], modules=[layer], mode="on", warmup=2) if label == "ours" else step
        losses[label] = torch.stack([run().clone() for _ in range(4)])
        if label == "ours":
            assert run.status == "captured"
    assert ran["reference"] == 0
    torch.testing.assert_close(losses["ours"], losses["theirs"], rtol=1e-4, atol=1e-5)
