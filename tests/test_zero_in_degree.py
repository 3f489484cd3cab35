"""``message_passing`` follows DGL's ``update_all`` on vertices without in-edges: the reduce
UDF does not apply there and its outputs are zero-filled; the update UDF runs on every
vertex (issue #11 §1.6). The oracle is DGL's rule written out in plain torch, checked on
outputs and all gradients in float64 on both backends.
"""
from __future__ import annotations

import pytest
import torch

import gnnfuse

DOUBLE = torch.float64
EPS = 1e-6


def graph(device: str) -> gnnfuse.Graph:
    """In-degrees 1, 2, 0, 2, 0, 1: vertex 2 only sends, vertex 4 is isolated; a multi-edge
    into 3 and a self loop on 5."""
    return gnnfuse.Graph(torch.tensor([2, 0, 2, 1, 1, 5]), torch.tensor([0, 1, 1, 3, 3, 5]), 6).to(device)


def tensors(g: gnnfuse.Graph, width: int = 3) -> dict[str, torch.Tensor]:
    """Drawn on the CPU (one stream for every device), then moved to the graph's device."""
    gen = torch.Generator().manual_seed(1)
    node = {k: torch.randn(g.num_nodes, width, dtype=DOUBLE, generator=gen) for k in ("Ah", "Bh", "Dh", "Eh")}
    drawn = {**node, "Ce": torch.randn(g.num_edges, width, dtype=DOUBLE, generator=gen)}
    return {k: v.to(g.device) for k, v in drawn.items()}


def message(edges):
    return {"Bh_j": edges.src["Bh"], "e_ij": edges.data["Ce"] + edges.src["Dh"] + edges.dst["Eh"]}


def reduce(nodes):
    """GatedGCN's gated mean: node data plus a ratio of sums (Bresson & Laurent)."""
    sigma = torch.sigmoid(nodes.mailbox["e_ij"])
    gated = torch.sum(sigma * nodes.mailbox["Bh_j"], dim=1) / (torch.sum(sigma, dim=1) + EPS)
    return {"h": nodes.data["Ah"] + gated}


def update(nodes):
    return {"out": torch.relu(nodes.data["h"]) + nodes.data["Ah"] * 0.5}


def dgl_oracle(g: gnnfuse.Graph, t: dict[str, torch.Tensor], with_update: bool) -> dict[str, torch.Tensor]:
    """DGL's update_all: reduce only where a vertex has in-edges, zeros elsewhere; then apply."""
    sigma = torch.sigmoid(t["Ce"] + t["Dh"][g.src] + t["Eh"][g.dst])

    def total(x):
        return torch.zeros_like(t["Ah"]).index_add(0, g.dst, x)
    h = t["Ah"] + total(sigma * t["Bh"][g.src]) / (total(sigma) + EPS)
    has_in_edges = torch.bincount(g.dst, minlength=g.num_nodes) > 0
    h = torch.where(has_in_edges[:, None], h, torch.zeros_like(h))
    return {"out": torch.relu(h) + t["Ah"] * 0.5} if with_update else {"h": h}


def compare(run, oracle, t: dict[str, torch.Tensor]) -> None:
    """Outputs and the gradients of every input, compiled against the oracle."""
    results = []
    for fn in (run, oracle):
        leaves = {k: v.clone().requires_grad_() for k, v in t.items()}
        out = fn(leaves)
        loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=DOUBLE, device=o.device).view_as(o)).sum()
                   for o in out.values())
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        results.append((out, [torch.zeros_like(v) if gr is None else gr for v, gr in zip(t.values(), grads)]))
    (out, grads), (expected, expected_grads) = results
    assert out.keys() == expected.keys()
    for key in out:
        torch.testing.assert_close(out[key], expected[key])
    for name, gr, ex in zip(t, grads, expected_grads):
        torch.testing.assert_close(gr, ex, msg=lambda m: f"gradient of {name}: {m}")


def run_udfs(g, with_update):
    def run(t):
        ndata = {k: t[k] for k in ("Ah", "Bh", "Dh", "Eh")}
        return gnnfuse.message_passing(g, message, reduce, update if with_update else None,
                                       ndata=ndata, edata={"Ce": t["Ce"]})
    return run


@pytest.mark.parametrize("with_update", [False, True], ids=["reduce", "reduce+update"])
def test_gated_gcn_reduce_is_zero_filled_without_in_edges(backend, device, with_update, monkeypatch, fresh_compile):
    from gnnfuse.backend.triton import executor as triton_executor
    sources = []
    real = triton_executor.kernel_source
    monkeypatch.setattr(triton_executor, "kernel_source", lambda *a: sources.append(real(*a)[1]) or real(*a))
    g = graph(device)
    t = tensors(g)
    compare(run_udfs(g, with_update), lambda x: dgl_oracle(g, x, with_update), t)
    if backend == "triton":   # the zero fill's select also runs inside fused kernels (its emit string)
        assert any("!= 0" in source for source in sources)


def test_zero_fill_selects_rather_than_multiplies(device):
    """Node data that is infinite on an isolated vertex, and log(0) of an empty sum, give
    DGL's 0 there, not NaN (0 * inf); the finite vertices' values and gradients are exact."""
    g = graph(device)
    t = {"h": (torch.rand(6, 2, dtype=DOUBLE, generator=torch.Generator().manual_seed(2)) + 0.5).to(device)}
    t["h"][4] = float("inf")

    def reduce_log(nodes):
        return {"a": nodes.data["h"] + torch.sum(nodes.mailbox["m"], dim=1),
                "b": torch.log(torch.sum(nodes.mailbox["m"], dim=1))}

    def run(x):
        return gnnfuse.message_passing(g, lambda e: {"m": e.src["h"]}, reduce_log, ndata={"h": x["h"]})

    def oracle(x):
        total = torch.zeros_like(x["h"]).index_add(0, g.dst, x["h"][g.src])
        keep = (torch.bincount(g.dst, minlength=6) > 0)[:, None]
        return {"a": torch.where(keep, x["h"] + total, 0.0), "b": torch.where(keep, total.clamp(min=1e-300).log(), 0.0)}
    out = run(t)
    assert torch.isfinite(out["a"]).all() and torch.isfinite(out["b"]).all()
    compare(run, oracle, t)


def test_gradcheck_through_the_zero_fill():
    g = graph("cpu")
    t = tensors(g, width=2)
    names = list(t)

    def fn(*xs):
        return run_udfs(g, True)(dict(zip(names, xs)))["out"]
    assert torch.autograd.gradcheck(fn, tuple(v.clone().requires_grad_() for v in t.values()))



def test_integer_outputs_keep_their_dtype_and_value(device):
    """The zero fill's 0.0 promoted an integer reduce_fn output to a float: each vertex's
    first message id ``m[:, 0]`` came back float64, and with integer tables alone
    ``m.max(1)[0] + 1`` was float32, 2**53 + 2 reading 9007199254740992."""
    g = graph(device)
    ids = torch.tensor([2**53 + 1, 5, 7, -3, 0, 2**40], device=device)

    def reduce(nodes):
        return {"first": nodes.mailbox["m"][:, 0], "top": nodes.mailbox["m"].max(1)[0] + 1}

    out = gnnfuse.message_passing(g, lambda e: {"m": e.src["id"]}, reduce, ndata={"id": ids})
    assert out["first"].dtype == out["top"].dtype == torch.int64
    assert out["first"].tolist() == [7, 2**53 + 1, 0, 5, 0, 2**40]
    assert out["top"].tolist() == [8, 2**53 + 2, 0, 6, 0, 2**40 + 1]


def test_bool_outputs_stay_bool(device):
    """The zero fill's int 0 promoted a bool reduce_fn output as ``torch.where`` does:
    the last message ``m[:, -1]`` of a bool mailbox, which DGL hands back as bool (False
    where a vertex has no in-edges), came back int64."""
    g = graph(device)
    flag = torch.tensor([True, False, True, True, False, True], device=device)

    def reduce(nodes):
        return {"last": nodes.mailbox["m"][:, -1], "both": nodes.mailbox["m"][:, 0] * nodes.data["flag"]}

    out = gnnfuse.message_passing(g, lambda e: {"m": e.src["flag"]}, reduce, ndata={"flag": flag})
    assert out["last"].dtype == out["both"].dtype == torch.bool
    src, dst = g.src.cpu(), g.dst.cpu()
    last = [bool(flag[src[dst == v][-1]]) if (dst == v).any() else False for v in range(6)]
    both = [bool(flag[src[dst == v][0]] and flag[v]) if (dst == v).any() else False for v in range(6)]
    assert out["last"].tolist() == last and out["both"].tolist() == both


def test_a_graph_without_edges_zero_fills_existing_and_new_fields(device):
    """No edges at all: every vertex is one without in-edges, so every reduce_fn output
    is 0 -- one that overwrites a field the call was given (``h``) as well as a new one
    (``z``), a mailbox reduction as well as one adding node data -- and update_fn sees
    those zeros beside the untouched input fields. This is the rule DGL documents for
    ``update_all`` ("fill their aggregated messages with zero"); DGL 2.x's code writes
    nothing for a UDF reduce on a graph without edges, keeping an old ``h``."""
    empty = torch.zeros(0, dtype=torch.long)
    g = gnnfuse.Graph(empty, empty, num_nodes=3).to(device)
    h = torch.arange(1.0, 7.0, dtype=DOUBLE, device=device).view(3, 2).requires_grad_()

    def reduce(nodes):
        return {"h": nodes.data["h"] + torch.sum(nodes.mailbox["m"], dim=1), "z": nodes.mailbox["m"].max(1)[0]}

    def update(nodes):
        return {"o": nodes.data["h"] + nodes.data["z"] + 2 * nodes.data["x"]}

    ndata = {"h": h, "x": h * 10}
    out = gnnfuse.message_passing(g, lambda e: {"m": e.src["h"]}, reduce, ndata=ndata)
    assert out.keys() == {"h", "z"}
    assert not out["h"].any() and not out["z"].any()
    updated = gnnfuse.message_passing(g, lambda e: {"m": e.src["h"]}, reduce, update, ndata=ndata)["o"]
    torch.testing.assert_close(updated, 20 * h.detach())
    (grad,) = torch.autograd.grad(updated.sum(), h)
    torch.testing.assert_close(grad, torch.full_like(h, 20.0))
