"""The ops marked ``autograd_reference`` (ir/registry.py): torch's autograd through their
references must give what their derivative rules give, because a small graph's first pass
runs such programs' forwards under autograd and leaves the backward to torch
(runtime/first_pass.py). Each case runs one program twice on the same graph and inputs --
through the autograd Function with gnnfuse's backward program on the reference executor
(the oracle), and on its first pass under autograd -- in float64, on small integer
features (ties for max/min and maximum, zeros for abs, relu and sqrt), and compares the
outputs and every input's gradient. A last test checks that the cases cover every marked
op: marking one means adding a case."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

import gnnfuse
import gnnfuse.nn
from first_pass_check import DEVICE, triton_by_default
from gnnfuse.ir.registry import _REGISTRY
from gnnfuse.runtime.compiled import _ProgramFunction, record_calls

SRC = torch.tensor([0, 1, 2, 3, 3, 4, 1, 2, 2, 5])
DST = torch.tensor([1, 2, 0, 0, 0, 4, 3, 3, 1, 5])     # a multi-edge (3 -> 0), self loops, vertex 6 alone
N, FEAT, HEADS = 7, 4, 2


def leaf(*shape: int, seed: int, integer: bool = True) -> torch.Tensor:
    """Small integers (ties and zeros) or normal values, float64, on the tests' device."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(-2, 3, shape, generator=gen).double() if integer else torch.randn(*shape, generator=gen,
                                                                                         dtype=torch.float64)
    return t.to(DEVICE).requires_grad_()


def message_sum(graph, message, ndata, reduce: str = "sum"):
    """DGL-style message and reduce: ``torch.<reduce>`` of the mailbox."""
    def reduced(nodes):
        box = nodes.mailbox["m"]
        if reduce in ("max", "min"):
            return {"out": getattr(torch, reduce)(box, dim=1).values}
        return {"out": getattr(torch, reduce)(box, dim=1)}
    return gnnfuse.message_passing(graph, lambda edges: {"m": message(edges)}, reduced, ndata=ndata)["out"]


def edge_ops(graph, p):
    """Elementwise ops on every edge, summed per destination."""
    def message(e):
        a, b = e.src["h"], e.dst["h"]
        return (a * b - a / (b.abs() + 1) + (-a) + torch.exp(a * 0.3) + torch.log(b.abs() + 0.5)
                + torch.sqrt(a.abs()) + (a - b).clamp(min=0.0) + torch.maximum(a, b) - torch.minimum(a, 2 * b))
    return message_sum(graph, message, {"h": p["h"]})


def activations(graph, p):
    def message(e):
        a, b = e.src["h"], e.dst["h"]
        return (torch.relu(a - b) + F.leaky_relu(a, 0.2) + F.elu(b - a) + F.softplus(a, 2.0, 1.5) + F.silu(b)
                + torch.sigmoid(a) + torch.tanh(a * b))
    return message_sum(graph, message, {"h": p["h"]})


def reductions(reduce: str) -> Callable:
    def run(graph, p):
        return message_sum(graph, lambda e: e.src["h"] * e.dst["h"] + e.src["h"], {"h": p["h"]}, reduce)
    run.__name__ = f"reduce_{reduce}"
    return run


def feature_dims(graph, p):
    """Sums and means over feature dims, a concatenation, a per-head view and a matmul."""
    def message(e):
        a, b = e.src["h"], e.dst["h"]
        heads = (a @ p["W"]).view(-1, HEADS, FEAT) * b.view(-1, HEADS, FEAT // HEADS).sum(-1, keepdim=True)
        return (torch.cat([a * b, a], dim=-1) @ p["W2"] + (a * b).sum(-1, keepdim=True)
                + a.mean(-1, keepdim=True) + heads.reshape(-1, HEADS * FEAT)[:, :FEAT])
    return message_sum(graph, message, {"h": p["h"]})


def vertex_attention(graph, p):
    """GAT's attention written per vertex (Seastar's Figure 3): a softmax over in-edges."""
    @gnnfuse.vertex
    def gat(v):
        e = [torch.exp(F.leaky_relu((u.h * p["a"]).sum(-1) + (v.h * p["b"]).sum(-1), 0.2)) for u in v.innbs]
        return sum([e[i] / sum(e) * (u.h @ p["W2"][:FEAT]) for i, u in enumerate(v.innbs)])
    return gat(graph, {"h": p["h"]})


def softmax_messages(graph, p):
    """DGL's softmax over each vertex's mailbox (the edge_softmax op)."""
    def reduce(nodes):
        box = nodes.mailbox["m"]
        return {"out": torch.sum(torch.softmax(box, dim=1) * box, dim=1)}
    return gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"] * e.dst["h"]}, reduce,
                                   ndata={"h": p["h"]})["out"]


def linear_messages(graph, p):
    """``u.h @ W + b`` per edge: one addmm (passes/addmm.py)."""
    @gnnfuse.vertex
    def linear(v):
        return sum([u.h @ p["W"][:, :FEAT] + p["bias"] for u in v.innbs])
    return linear(graph, {"h": p["h"]})


LAYERS = {
    "GATConv": lambda: gnnfuse.nn.GATConv(FEAT, 3, heads=HEADS),
    "GATv2Conv": lambda: gnnfuse.nn.GATv2Conv(FEAT, 3, heads=HEADS),
    "SAGEConv-mean": lambda: gnnfuse.nn.SAGEConv(FEAT, 3),
    "SAGEConv-max": lambda: gnnfuse.nn.SAGEConv(FEAT, 3, aggr="max"),
    "GCNConv": lambda: gnnfuse.nn.GCNConv(FEAT, 3),
    "GINConv": lambda: gnnfuse.nn.GINConv(torch.nn.Linear(FEAT, 3), train_eps=True),
    "GraphConv-mean": lambda: gnnfuse.nn.GraphConv(FEAT, 3, aggr="mean"),
    "TransformerConv": lambda: gnnfuse.nn.TransformerConv(FEAT, 3, heads=HEADS),
    # PyG's own classes, compiled: their messages' products read rows by zero_unread_rows
    "GeneralConv": lambda: gnnfuse.nn.GeneralConv(FEAT, 3, attention=True, heads=HEADS),
    "FeaStConv": lambda: gnnfuse.nn.FeaStConv(FEAT, 3, heads=HEADS),
}


def layer_case(name: str) -> Callable:
    def run(graph, p):
        torch.manual_seed(0)
        layer = LAYERS[name]().double().to(DEVICE)
        p.update({f"param:{k}": param for k, param in layer.named_parameters()})
        return layer(p["h"], torch.stack([SRC, DST]).to(DEVICE))     # a PyG user's call: a graph on its first pass
    run.__name__ = name
    return run


CASES = ([edge_ops, activations, feature_dims, vertex_attention, softmax_messages, linear_messages,
          reductions("mean")] + [layer_case(n) for n in LAYERS if not n.endswith("max")])
# a max or min reduction is not marked (ir/ops/movement.py: torch counts the zero its
# output starts from as a tie), so these run through the autograd Function on a first pass too
FUNCTION_CASES = [reductions("max"), reductions("min"), layer_case("SAGEConv-max")]


def inputs() -> dict[str, torch.Tensor]:
    return {"h": leaf(N, FEAT, seed=0), "W": leaf(FEAT, HEADS * FEAT, seed=1, integer=False),
            "W2": leaf(2 * FEAT, FEAT, seed=2, integer=False), "a": leaf(FEAT, seed=3, integer=False),
            "b": leaf(FEAT, seed=4, integer=False), "bias": leaf(FEAT, seed=5)}


@contextmanager
def first_pass_native(monkeypatch) -> Iterator[None]:
    """Triton as the default backend, as on a GPU, so a graph on its first pass runs on
    the reference executor: under autograd where its program's ops allow."""
    with monkeypatch.context() as patched:
        triton_by_default(patched)
        yield


def run(case: Callable, graph: gnnfuse.Graph) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """``case``'s output and every input's (a layer's parameters too) gradient under a fixed projection."""
    p = inputs()
    out = case(graph, p)
    weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * weight).sum().backward()
    return out.detach(), {k: t.grad for k, t in p.items()}


def graph_on_first_pass() -> gnnfuse.Graph:
    graph = gnnfuse.Graph(SRC, DST, N).to(DEVICE)
    graph.first_pass = True
    return graph


def compare(case: Callable, monkeypatch, under_autograd: bool = True) -> set[str]:
    """Run ``case`` both ways and compare; the ops of the programs run under autograd
    (where ``under_autograd``; else none may have)."""
    with monkeypatch.context() as patched:
        patched.setenv("GNNFUSE_BACKEND", "reference")      # the autograd Function, gnnfuse's backward program
        ref_out, ref_grads = run(case, graph_on_first_pass())
    with first_pass_native(monkeypatch), record_calls() as calls:
        out, grads = run(case, graph_on_first_pass())
    assert all(c.executor == "reference (first pass)" for c in calls)
    native = [c for c in calls if c.compiled.runs_under_autograd]
    assert bool(native) == under_autograd, f"{case.__name__}: {len(native)} programs ran under autograd"
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12, equal_nan=True)
    assert grads.keys() == ref_grads.keys()
    for key, want in ref_grads.items():
        got = grads[key]
        assert (got is None) == (want is None), f"{case.__name__}: {key} has a gradient on one path only"
        if got is not None:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, equal_nan=True,
                                       msg=lambda m, key=key: f"{case.__name__}, gradient of {key}: {m}")
    return {v.op for c in native for v in c.compiled.program.values}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_first_pass_under_autograd_gives_the_backward_programs_gradients(case, monkeypatch):
    compare(case, monkeypatch)


@pytest.mark.parametrize("case", FUNCTION_CASES, ids=lambda c: c.__name__)
def test_max_and_min_keep_the_backward_programs_tie_rule(case, monkeypatch):
    """Integer features put a row's maximum at 0 on some rows: torch's own backward would
    count the zero its output starts from as one more tie there."""
    compare(case, monkeypatch, under_autograd=False)


def zero_width_mean(graph, p):
    """A mean over a zero-width feature slice: NaN, as torch's, and an empty gradient."""
    return message_sum(graph, lambda e: e.src["h"][:, :0].mean(-1, keepdim=True) + e.src["h"] * e.dst["h"],
                       {"h": p["h"]})


def test_a_mean_over_a_zero_width_dim_differentiates_on_both_paths(monkeypatch):
    """torch's autograd (the first pass) gives the empty slice an empty gradient; the
    backward program divided by the zero count while it was built (``1.0 / 0``), a
    ZeroDivisionError on the autograd Function -- the step after the first pass."""
    compare(zero_width_mean, monkeypatch)


def test_the_gradients_arrival_ends_the_first_pass(monkeypatch):
    """As the autograd Function's backward does (runtime/first_pass.py): the graph's next
    step runs on its device's backend. A program's forward alone leaves it on its first pass."""
    graph, h = graph_on_first_pass(), leaf(N, FEAT, seed=0)
    with first_pass_native(monkeypatch):
        out = activations(graph, {"h": h})
        assert graph.first_pass and out.grad_fn is not None
        assert not isinstance(out.grad_fn, _ProgramFunction._backward_cls)
        out.sum().backward()
    assert not graph.first_pass


def test_an_op_without_the_mark_keeps_the_program_on_the_autograd_function(monkeypatch):
    """``pow`` is not marked: a program reading it runs through the autograd Function on
    its first pass too (the backward program, on the reference executor)."""
    h = leaf(N, FEAT, seed=0)
    with first_pass_native(monkeypatch):
        out = message_sum(graph_on_first_pass(), lambda e: e.src["h"] ** 3, {"h": h})
    assert isinstance(out.grad_fn, _ProgramFunction._backward_cls)
    out.sum().backward()
    torch.testing.assert_close(h.grad, 3 * h.detach() ** 2 * torch.bincount(SRC, minlength=N).to(h).view(-1, 1))


def test_the_cases_cover_every_marked_op(monkeypatch):
    """Marking an op ``autograd_reference`` without a case that runs it under autograd
    here fails: the mark is a claim about its derivative that only a comparison checks."""
    covered = set()
    for case in CASES:
        covered |= compare(case, monkeypatch)
    marked = {name for name, op in _REGISTRY.items() if op.autograd_reference}
    assert marked <= covered, f"marked but never compared: {sorted(marked - covered)}"
