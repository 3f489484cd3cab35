"""Pairwise mailbox terms (issue #11 §2): reduce UDFs that combine every pair of a
vertex's messages, ``m.unsqueeze(1) - m.unsqueeze(2)``, as Graphiler's C-GAT does.

Each UDF pair is checked against DGL's semantics written out in plain torch: the same
UDFs run on real tensors, vertices bucketed by in-degree so every bucket's mailbox is a
dense [n, D, ...] tensor, zero-degree vertices left at 0. Outputs and the gradients of
the input and of every captured parameter in float64, on the reference backend and on
generated kernels (Triton's interpreter without a GPU); pair ops themselves run as torch
ops on both backends. C-GAT's hinge sum runs once through its sorted rewrite
(``hinge_sum``) and once through the general pair rows, so both stay covered."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import gnnfuse
from gnnfuse import CompileError
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.frontend import trace_message_passing
from gnnfuse.ir.ops.pairwise import hinge_sum, hinge_sum_grad, in_edge_pairs
from gnnfuse.passes import pipeline
from gnnfuse.runtime import CompiledProgram
from gnnfuse.runtime import compiled as compiled_module
from layer_check import rel_err

N, F_IN, F_OUT = 8, 3, 4
BACKENDS = ("reference", "triton")


def _device(backend: str) -> str:
    """Generated kernels on a GPU when there is one, else in Triton's interpreter (conftest)."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _graph() -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-edges (equal scores), self loops, in-degrees 0..9; vertices 6 and 7 get no edges in."""
    gen = torch.Generator().manual_seed(0)
    src = torch.cat([torch.randint(0, N, (24,), generator=gen), torch.tensor([2, 2, 5])])
    dst = torch.cat([torch.randint(0, N - 2, (24,), generator=gen), torch.tensor([4, 4, 5])])
    return src, dst


def _params(device: str = "cpu") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {"W": torch.randn(F_IN, F_OUT, dtype=torch.float64, generator=gen).to(device),
            "attn": torch.randn(2 * F_OUT, 1, dtype=torch.float64, generator=gen).to(device)}


# --- the UDFs (C-GAT as Graphiler's benchmark writes it, and other pairwise terms) -------
def make_message(p):
    def message(edges):
        z_src = torch.mm(edges.src["h"], p["W"])
        z_dst = torch.mm(edges.dst["h"], p["W"])
        score = torch.mm(torch.cat([z_src, z_dst], dim=1), p["attn"])
        return {"z": z_src, "e": F.leaky_relu(score), "t": edges.data["t"], "hd": edges.dst["h"]}
    return message


def cgat_reduce(nodes):
    score = nodes.mailbox["e"]
    below = score.unsqueeze(2)
    above = score.unsqueeze(1)
    alpha = (above - below).clamp(min=0).sum(1)
    return {"h": torch.sum(alpha * nodes.mailbox["z"], dim=1)}


def weighted_cgat_reduce(nodes):
    """C-GAT's weights on messages that differ between multi-edges (their scores tie):
    clamp's gradient at a tie then reaches both edges unequally."""
    score = nodes.mailbox["e"]
    alpha = (score.unsqueeze(1) - score.unsqueeze(2)).clamp(min=0).sum(1)
    return {"h": torch.sum(alpha * nodes.mailbox["t"] * nodes.mailbox["z"], dim=1)}


def flipped_hinge_reduce(nodes):
    """sum_a max(0, e_a - e_b): the hinge the other way round (sorted as hinge_sum(-e)),
    with relu, whose gradient at ties is 0, on messages that differ between multi-edges."""
    e = nodes.mailbox["e"]
    alpha = torch.relu(e.unsqueeze(2) - e.unsqueeze(1)).sum(1)
    return {"h": torch.sum(alpha * nodes.mailbox["t"] * nodes.mailbox["z"], dim=1)}


def spread_reduce(nodes):
    """Mean squared score gap per edge, reduced over axis 2."""
    e = nodes.mailbox["e"]
    gap = (e.unsqueeze(1) - e.unsqueeze(2)) ** 2
    return {"h": torch.sum(gap.mean(2) * nodes.mailbox["z"], dim=1)}


def similarity_reduce(nodes):
    """Pairs of feature vectors (plus a per-edge tie-breaker): each edge's least similar
    in-edge, and a keepdim max whose size-1 axis is then summed away (the identity)."""
    z, t, e = nodes.mailbox["z"], nodes.mailbox["t"], nodes.mailbox["e"]
    sim = torch.tanh((z.unsqueeze(1) * z.unsqueeze(2)).sum(-1, keepdim=True)) + t.unsqueeze(1) * t.unsqueeze(2)
    sim = sim * e.unsqueeze(1)                                              # [N, D, D, 1]
    least = torch.min(sim, dim=2).values                                    # [N, D, 1]
    peak = torch.max(sim, dim=1, keepdim=True).values                       # [N, 1, D, 1]
    return {"h": torch.sum((least + peak.sum(1)) * z, dim=1)}


def view_reduce(nodes):
    """[N, 1, D, F] alone: per-edge ops, and over its size-1 axis the identity."""
    z, e = nodes.mailbox["z"], nodes.mailbox["e"]
    same = torch.relu(z.unsqueeze(1) * e.unsqueeze(1)).sum(1)              # [N, D, F]
    peak = torch.max(torch.tanh(z.unsqueeze(-3)), dim=1, keepdim=True).values   # [N, 1, D, F]
    return {"h": torch.sum(same * peak.mean(1), dim=1)}


def node_view_reduce(nodes):
    """Per-vertex values in pair terms: node data with two size-1 neighbour axes
    ([N, 1, 1, F]), a destination's data read through the mailbox ([N, D, F]: the same on
    every in-edge, but a real neighbour axis), and a row view reduced over its edges
    ([N, 1, F], the per-vertex sum)."""
    z, e, hd = nodes.mailbox["z"], nodes.mailbox["e"], nodes.mailbox["hd"]
    own = nodes.data["h"].unsqueeze(1).unsqueeze(1)                                  # [N, 1, 1, F_IN]
    near = torch.relu(hd.unsqueeze(1) * own * e.unsqueeze(2)).sum(-1, keepdim=True)  # [N, D, D, 1]
    total = z.unsqueeze(1).sum(2)                                                    # [N, 1, F_OUT]
    return {"h": torch.sum(near.sum(2) * z, dim=1) + total.squeeze(1) * hd.sum(1).sum(-1, keepdim=True)}


def counted_mean_reduce(nodes):
    """Means divided by the pair axes' sizes: ``x.shape[2]`` / ``x.size(1)`` of a pair term
    and ``x.shape[2]`` of an [N, 1, D, F] view are the in-degree D (they read as 1, a
    silently wrong divisor), and a reshape to a pair term's own shape keeps it."""
    z, e = nodes.mailbox["z"], nodes.mailbox["e"]
    sim = z.unsqueeze(1) * z.unsqueeze(2)                                   # [N, D, D, F]
    sim = sim.reshape(sim.shape)
    gap = (e.unsqueeze(1) - e.unsqueeze(2)).abs()                           # [N, D, D, 1]
    scaled = gap * z.unsqueeze(1).shape[2]
    return {"h": torch.sum(sim.sum(2) / sim.shape[2] + scaled.sum(1) / gap.size(1) * z, dim=1)}


def offset_hinge_reduce(nodes):
    """``clamp(min=0.5)`` of a pair difference is no hinge: only a floor of 0 sorts into ``hinge_sum``."""
    score = nodes.mailbox["e"]
    alpha = (score.unsqueeze(1) - score.unsqueeze(2)).clamp(min=0.5).sum(1)
    return {"h": torch.sum(alpha * nodes.mailbox["z"], dim=1)}


def max_hinge_reduce(nodes):
    """The largest hinge over a kept edge's pairs, not their sum: no ``hinge_sum`` either."""
    score = nodes.mailbox["e"]
    alpha = torch.amax((score.unsqueeze(1) - score.unsqueeze(2)).clamp(min=0), dim=1)
    return {"h": torch.sum(alpha * nodes.mailbox["z"], dim=1)}


REDUCES = {"cgat": cgat_reduce, "weighted-cgat": weighted_cgat_reduce, "flipped-hinge": flipped_hinge_reduce,
           "spread": spread_reduce, "similarity": similarity_reduce, "view": view_reduce,
           "node-view": node_view_reduce, "counted-mean": counted_mean_reduce,
           "offset-hinge": offset_hinge_reduce, "max-hinge": max_hinge_reduce}
SORTED, PER_EDGE = {"cgat", "weighted-cgat", "flipped-hinge"}, {"view"}   # hinge_sum; no pair rows; the rest: pairs


# --- DGL's update_all on real tensors -------------------------------------------------
def dgl_update_all(src, dst, num_nodes, message, reduce, ndata, edata):
    edges = SimpleNamespace(src={k: v[src] for k, v in ndata.items()},
                            dst={k: v[dst] for k, v in ndata.items()}, data=edata)
    messages = message(edges)
    degree = torch.bincount(dst, minlength=num_nodes)
    out = {}
    for d in sorted(set(degree.tolist()) - {0}):
        vertices = (degree == d).nonzero().squeeze(1)
        eids = torch.stack([(dst == v).nonzero().squeeze(1) for v in vertices])       # [n, d], id order
        nodes = SimpleNamespace(mailbox={k: m[eids] for k, m in messages.items()},
                                data={k: v[vertices] for k, v in ndata.items()})
        for key, rows in reduce(nodes).items():
            if key not in out:
                out[key] = rows.new_zeros((num_nodes,) + rows.shape[1:])
            out[key] = out[key].index_add(0, vertices, rows)
    return out


def _edata(num_edges: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """A per-edge value that tells multi-edges apart (their messages are otherwise equal)."""
    gen = torch.Generator().manual_seed(5)
    return {"t": torch.randn(num_edges, 1, dtype=torch.float64, generator=gen).to(device)}


def _run(fn, h, p):
    """fn's output and the gradients of a fixed projection of it (h first, then p)."""
    h = h.clone().requires_grad_()
    p = {k: v.clone().requires_grad_() for k, v in p.items()}
    out = fn(h, p)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), [h, *p.values()])
    return out.detach(), grads


def _check(name, backend, src, dst, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    launched = []
    real_run_unit = triton_executor.run_unit
    monkeypatch.setattr(triton_executor, "run_unit", lambda unit, *a: launched.append(unit) or real_run_unit(unit, *a))
    device = _device(backend)
    src, dst = src.to(device), dst.to(device)
    graph = gnnfuse.Graph(src, dst, N)
    h = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    reduce = REDUCES[name]
    edata = _edata(len(src), device)
    ours = _run(lambda h, p: gnnfuse.message_passing(graph, make_message(p), reduce, ndata={"h": h},
                                                     edata=edata)["h"], h, _params(device))
    expected = _run(lambda h, p: dgl_update_all(src, dst, N, make_message(p), reduce, {"h": h}, edata)["h"],
                    h, _params(device))
    assert rel_err(ours[0], expected[0]) < 1e-12
    for got, want in zip(ours[1], expected[1]):
        assert rel_err(got, want) < 1e-12
    assert bool(launched) == (backend == "triton"), "generated kernels ran exactly on the Triton backend"


def _optimized_ops(reduce) -> set[str]:
    p = _params()
    tracer = trace_message_passing(make_message(p), reduce, None, {"h": torch.zeros(N, F_IN, dtype=torch.float64)},
                                   _edata(3))
    return {v.op for v in CompiledProgram(tracer.program).program}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", REDUCES)
def test_pairwise_udf_matches_dgl_semantics(name, backend, monkeypatch):
    _check(name, backend, *_graph(), monkeypatch)


@pytest.mark.parametrize("name", REDUCES)
def test_hinge_sums_are_sorted_other_pair_terms_keep_pair_rows(name):
    ops = _optimized_ops(REDUCES[name])
    if name in SORTED:
        assert "hinge_sum" in ops and not ops & {"pair_broadcast", "pair_reduce"}
    elif name in PER_EDGE:
        assert not ops & {"hinge_sum", "pair_broadcast", "pair_reduce"}
    else:
        assert {"pair_broadcast", "pair_reduce"} <= ops and "hinge_sum" not in ops


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SORTED))
def test_hinge_sums_through_pair_rows_without_the_sorting_rewrite(name, backend, monkeypatch):
    """The general path for the hinge UDFs: same numbers with the pass switched off."""
    monkeypatch.setattr(pipeline, "sort_hinge_pairs", lambda program: program)
    monkeypatch.setattr(compiled_module, "_BY_STRUCTURE", {})
    assert {"pair_broadcast", "pair_reduce"} <= _optimized_ops(REDUCES[name])
    _check(name, backend, *_graph(), monkeypatch)


def _tied_scores(backend: str, monkeypatch):
    """The backend's graph (with its src and dst) and, needing gradients, features ``h``
    and integer edge scores with many exact ties between different edges; the generator
    that drew them, for more."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = _device(backend)
    src, dst = (t.to(device) for t in _graph())
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(N, F_OUT, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    score = torch.randint(0, 3, (len(src), 1), generator=gen).to(device, torch.float64).requires_grad_()
    return gnnfuse.Graph(src, dst, N), src, dst, h, score, gen


def _projected_grads(out: torch.Tensor, wrt: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Gradients of ``out`` under a fixed projection, so every output element counts."""
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    return torch.autograd.grad((out * weight).sum(), wrt)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["weighted-cgat", "flipped-hinge"])
def test_tied_scores_get_torchs_gradient(name, backend, monkeypatch):
    """Scores read from edge data with many exact ties between different edges: clamp's
    gradient at a tie passes (torch.clamp), relu's does not; the edge data's gradient
    shows which, on the sorted path and on pair rows."""
    graph, src, dst, h, score, gen = _tied_scores(backend, monkeypatch)
    t = torch.randn(len(src), 1, dtype=torch.float64, generator=gen).to(h.device)

    def message(edges):
        return {"z": edges.src["h"], "e": edges.data["s"], "t": edges.data["t"]}

    def grads(run):
        return _projected_grads(run(), [h, score])

    expected = grads(lambda: dgl_update_all(src, dst, N, message, REDUCES[name], {"h": h}, {"s": score, "t": t})["h"])
    assert expected[1].abs().sum() > 0
    for sort in (True, False):
        if not sort:
            monkeypatch.setattr(pipeline, "sort_hinge_pairs", lambda program: program)
            monkeypatch.setattr(compiled_module, "_BY_STRUCTURE", {})
        ours = grads(lambda: gnnfuse.message_passing(graph, message, REDUCES[name], ndata={"h": h},
                                                     edata={"s": score, "t": t})["h"])
        for got, want in zip(ours, expected):
            assert rel_err(got, want) < 1e-12, ("sorted" if sort else "pair rows")


def tied_pair_max_reduce(nodes):
    """amax over a pair axis of integer gaps: many pairs tie for each maximum."""
    e, z = nodes.mailbox["e"], nodes.mailbox["z"]
    gap = (e.unsqueeze(1) - e.unsqueeze(2)).abs()                          # [N, D, D, 1]
    return {"h": torch.sum(torch.amax(gap, dim=1) * z - torch.amin(gap * z.unsqueeze(1), dim=2), dim=1)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_tied_pair_maxima_split_their_gradient_as_torch_amax(backend, monkeypatch):
    """A max or min over a pair axis gives each of the tied pairs an equal share of the
    gradient, as torch.amax/amin do: a backward sending each tied pair the whole gradient
    (no division by the tie count) passed every other test here, whose maxima are untied."""
    graph, src, dst, h, score, _ = _tied_scores(backend, monkeypatch)

    def message(edges):
        return {"z": edges.src["h"], "e": edges.data["s"]}

    def grads(run):
        out = run()
        return (out, *_projected_grads(out, [h, score]))

    expected = grads(lambda: dgl_update_all(src, dst, N, message, tied_pair_max_reduce, {"h": h}, {"s": score})["h"])
    assert expected[2].abs().sum() > 0
    ours = grads(lambda: gnnfuse.message_passing(graph, message, tied_pair_max_reduce, ndata={"h": h},
                                                 edata={"s": score})["h"])
    assert {"pair_reduce"} <= _optimized_ops(tied_pair_max_reduce)
    for got, want in zip(ours, expected):
        assert rel_err(got, want) < 1e-12


def squeezed_view_reduce(nodes):
    """torch always drops axis 1 of an [N, 1, D, ...] pairwise view (m.unsqueeze(1), or
    a keepdim reduction over a pair term's axis 1): squeeze() of the view is [N, D], and
    its sum over dim -1 the per-vertex [N, 1] (gnnfuse kept the axis: [N, 1, 1])."""
    e, z = nodes.mailbox["e"], nodes.mailbox["z"]
    hinge = (e.unsqueeze(1) - e.unsqueeze(2)).clamp(min=0).sum(1, keepdim=True)    # [N, 1, D, 1]
    spread = (e.unsqueeze(1) * e.unsqueeze(2)).mean(1, keepdim=True).squeeze(1)    # [N, D, 1]
    return {"h": hinge.squeeze().sum(-1, keepdim=True) * torch.sum(spread * z.unsqueeze(-3).squeeze(-3), dim=1)}


def test_squeezing_a_pairwise_views_size_1_axis_drops_it():
    """On a graph whose in-degree buckets each hold several vertices (torch's squeeze()
    of a bucket of one would drop its vertex axis too)."""
    src = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 0, 2, 4, 6, 1, 3, 5, 7])
    dst = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5, 6, 6, 6])
    h = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    edata = _edata(len(src))
    ours = _run(lambda h, p: gnnfuse.message_passing(gnnfuse.Graph(src, dst, N), make_message(p), squeezed_view_reduce,
                                                     ndata={"h": h}, edata=edata)["h"], h, _params())
    expected = _run(lambda h, p: dgl_update_all(src, dst, N, make_message(p), squeezed_view_reduce, {"h": h},
                                                edata)["h"], h, _params())
    assert ours[0].shape == expected[0].shape == (N, F_OUT)
    assert rel_err(ours[0], expected[0]) < 1e-12
    for got, want in zip(ours[1], expected[1]):
        assert rel_err(got, want) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_without_edges(backend, monkeypatch):
    """No in-edges anywhere: no pairs, zeros out, zero gradients (DGL fills zeros)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = _device(backend)
    empty = torch.empty(0, dtype=torch.long, device=device)
    graph = gnnfuse.Graph(empty, empty, N)
    for reduce in (cgat_reduce, spread_reduce):
        out, grads = _run(lambda h, p: gnnfuse.message_passing(graph, make_message(p), reduce, ndata={"h": h},
                                                               edata=_edata(0, device))["h"],
                          torch.randn(N, F_IN, dtype=torch.float64, device=device), _params(device))
        assert torch.equal(out, torch.zeros(N, F_OUT, dtype=torch.float64, device=device))
        assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


def test_gradcheck_cgat_udf():
    src, dst = _graph()
    graph = gnnfuse.Graph(src, dst, N)
    h = torch.randn(N, F_IN, dtype=torch.float64, requires_grad=True)
    W, attn = (t.requires_grad_() for t in _params().values())

    def f(h, W, attn):
        return gnnfuse.message_passing(graph, make_message({"W": W, "attn": attn}), cgat_reduce,
                                       ndata={"h": h}, edata=_edata(len(src)))["h"]
    assert torch.autograd.gradcheck(f, (h, W, attn))


# --- the sorted hinge sum and the pair index --------------------------------------------
def test_hinge_sum_ties_and_columns():
    """Equal values contribute 0 to each other; each feature column is its own problem."""
    score = torch.tensor([[1.0, 0.0], [3.0, 0.0], [1.0, 5.0], [2.0, 1.0]], dtype=torch.float64)
    dst = torch.tensor([0, 0, 0, 1])
    # vertex 0, column 0: scores 1, 3, 1 -> 0, (2 + 2), 0; column 1: 0, 0, 5 -> 0, 0, 10.
    assert torch.equal(hinge_sum(score, dst, 2),
                       torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 10.0], [0.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("hinge", [torch.relu, lambda gap: gap.clamp(min=0)], ids=["relu", "clamp"])
@pytest.mark.parametrize("special", [None, "nan-x", "inf-x", "nan-grad"])
def test_hinge_sum_and_its_gradient_against_all_pairs(special, hinge):
    """Against torch's pair table (relu's or clamp's gradient at ties); NaN and
    infinities stay in their vertex's group."""
    gen = torch.Generator().manual_seed(3)
    dst = torch.randint(0, 5, (30,), generator=gen)
    x = torch.randn(30, 2, 3, dtype=torch.float64, generator=gen).round(decimals=1)   # many ties
    g = torch.randn(30, 2, 3, dtype=torch.float64, generator=gen)
    first = int((dst == dst[0]).nonzero()[0])
    if special == "nan-x":
        x[first, 0, 0] = float("nan")
    elif special == "inf-x":
        x[first, 0, 0], x[first, 1, 1] = float("inf"), -float("inf")
    elif special == "nan-grad":
        g[first, 0, 0] = float("nan")
    same = (dst.unsqueeze(0) == dst.unsqueeze(1)).view(30, 30, 1, 1)
    xs = x.clone().requires_grad_()
    gap = hinge(xs.unsqueeze(1) - xs.unsqueeze(0))                            # [e, t] = x_e - x_t
    pairs = torch.where(same, gap, torch.zeros_like(gap)).sum(1)
    (expected_grad,) = torch.autograd.grad((pairs * g).sum(), xs)
    inclusive = hinge is not torch.relu
    torch.testing.assert_close(hinge_sum(x, dst, 5), pairs.detach(), rtol=1e-12, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(hinge_sum_grad(x, g, dst, 5, inclusive), expected_grad, rtol=1e-12, atol=1e-12,
                               equal_nan=True)
    if special is not None:   # other vertices keep finite values
        assert torch.isfinite(hinge_sum(x, dst, 5)[dst != dst[0]]).all()


def test_hinge_sum_keeps_one_vertexs_large_scores_out_of_anothers_sums():
    """Sums of one vertex's scores (and gradients) are scanned within its own group: a
    running sum over all groups once rounded vertex 1's O(1) sums to the ulp of vertex
    0's 1e17 total: vertex 1's hinge sums off by up to 3.0 (1.5x), silently."""
    dst = torch.tensor([0, 0, 1, 1, 1, 2])
    x = torch.tensor([[1e17], [3e16], [1.0], [2.5], [2.0], [7.0]], dtype=torch.float64)
    g = torch.tensor([[4e17], [1e17], [0.5], [-1.5], [2.0], [1.0]], dtype=torch.float64)
    xs = x.clone().requires_grad_()
    same = (dst.unsqueeze(0) == dst.unsqueeze(1)).view(6, 6, 1)
    gap = torch.relu(xs.unsqueeze(1) - xs.unsqueeze(0))
    pairs = torch.where(same, gap, torch.zeros_like(gap)).sum(1)
    (expected_grad,) = torch.autograd.grad((pairs * g).sum(), xs)
    torch.testing.assert_close(hinge_sum(x, dst, 3), pairs.detach(), rtol=1e-12, atol=0.0)
    torch.testing.assert_close(hinge_sum_grad(x, g, dst, 3), expected_grad, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_hinge_sum_in_low_precision_rounds_once(dtype):
    """(#smaller) x_e - sum(smaller) is a difference of two large terms: taken in the
    scores' dtype it cancelled (bfloat16 scores near 100 on a 300-edge vertex: hinge sums
    off by 60 of 444, a C-GAT output off by 15%). Both it and its gradient now equal the
    float64 pair-table sums rounded once."""
    gen = torch.Generator().manual_seed(0)
    dst = torch.zeros(300, dtype=torch.long)
    x = (100 + 0.5 * torch.randn(300, 1, generator=gen)).to(dtype)
    g = (100 + 0.5 * torch.randn(300, 1, generator=gen)).to(dtype)
    i, j = in_edge_pairs(dst, 1)
    x64, g64 = x.double(), g.double()
    passes = x64[i] - x64[j] > 0
    expected = torch.zeros_like(x64).index_add_(0, i, torch.relu(x64[i] - x64[j]))
    passed = torch.where(passes, g64[i], torch.zeros_like(g64[i]))
    expected_grad = torch.zeros_like(g64).index_add_(0, i, passed).index_add_(0, j, -passed)
    assert torch.equal(hinge_sum(x, dst, 1), expected.to(dtype))
    assert torch.equal(hinge_sum_grad(x, g, dst, 1), expected_grad.to(dtype))


def test_in_edge_pairs_are_every_ordered_pair_per_destination():
    dst = torch.tensor([2, 0, 2, 2, 1, 0])
    i, j = in_edge_pairs(dst, 4)
    expected = {(a, b) for a in range(6) for b in range(6) if dst[a] == dst[b]}
    assert sorted(zip(i.tolist(), j.tolist())) == sorted(expected)


# --- what cannot be lined up is an error naming the line ----------------------------------
def _line(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(n for n, line in enumerate(lines) if text in line)


def _expect_error(reduce, text: str, match: str):
    graph = gnnfuse.Graph(*_graph(), N)
    h = torch.randn(N, F_IN, dtype=torch.float64)
    with pytest.raises(CompileError, match=match) as info:
        gnnfuse.message_passing(graph, make_message(_params()), reduce, ndata={"h": h},
                                edata=_edata(graph.num_edges))
    assert f":{_line(reduce, text)}:" in str(info.value)


def test_misaligned_operands_are_rejected():
    """Each error names the misaligned operand by the shape the UDF sees ([N, D, ...] a
    mailbox value, [N, 1, D, ...] its unsqueeze(1)); a mailbox's neighbour axis was shown
    as a SymTensor repr, and an unsqueeze(1) view as [E, 1, 1]."""
    def rank_mismatch(nodes):
        e = nodes.mailbox["e"]
        bad = e.unsqueeze(1) - e            # [N, 1, D, 1] - [N, D, 1]: N meets D
        return {"h": torch.sum(bad.sum(1) * nodes.mailbox["z"], dim=1)}
    _expect_error(rank_mismatch, "bad = ", r"a \[N, D, 1\] value \(\w+\) does not line up")

    def not_singleton(nodes):
        z = nodes.mailbox["z"]
        bad = z.unsqueeze(1) - z.unsqueeze(3)   # [N, 1, D, F] - [N, D, F, 1]: D meets F
        return {"h": torch.sum(bad.sum(1).sum(-1) * z, dim=1)}
    _expect_error(not_singleton, "bad = ", rf"a \[N, D, {F_OUT}, 1\] value \(\w+\) does not line up")

    def node_data(nodes):
        e = nodes.mailbox["e"]
        bad = e.unsqueeze(1) - nodes.data["h"]
        return {"h": torch.sum(bad.sum(1) * nodes.mailbox["z"], dim=1)}
    _expect_error(node_data, "bad = ", rf"a \[N, {F_IN}\] value \(NODE\) does not line up")

    def low_rank_view(nodes):
        e = nodes.mailbox["e"]
        bad = e.squeeze(-1).unsqueeze(1) - e.unsqueeze(2)   # [N, 1, D] - [N, D, 1, 1]: N meets D
        return {"h": torch.sum(bad.sum(1).sum(1) * nodes.mailbox["z"], dim=1)}
    _expect_error(low_rank_view, "bad = ", r"a \[N, 1, D\] value \(\w+\) does not line up")


def test_shape_errors_show_the_neighbour_axes_as_d():
    """A mailbox's and a pairwise view's shapes in an error read [N, D, ...] and [N, 1, D,
    ...]; the in-degree showed as 'SymTensor(NODE, 1 graph dims, feature shape=[])'."""
    def bmm_of_views(nodes):
        z = nodes.mailbox["z"]
        bad = torch.bmm(z.unsqueeze(1), z.unsqueeze(2))
        return {"h": bad.sum(1).sum(1)}
    _expect_error(bmm_of_views, "bad = ", rf"got \[N, 1, D, {F_OUT}\] and \[N, D, 1, {F_OUT}\]")

    def bmm_of_mailbox(nodes):
        bad = torch.bmm(nodes.mailbox["z"].unsqueeze(-1), torch.ones(2, 2, 2, dtype=torch.float64))
        return {"h": bad.sum(1)}
    _expect_error(bmm_of_mailbox, "bad = ", rf"got \[N, D, {F_OUT}, 1\] and \[2, 2, 2\]")


def test_softmax_over_a_pair_axis_is_rejected():
    def pair_softmax(nodes):
        e = nodes.mailbox["e"]
        att = torch.softmax(e.unsqueeze(1) - e.unsqueeze(2), dim=1)
        return {"h": torch.sum(att.sum(2) * nodes.mailbox["z"], dim=1)}
    _expect_error(pair_softmax, "att = ", "softmax over an axis of a pairwise")


def test_reducing_both_pair_axes_at_once_is_rejected():
    def both(nodes):
        e = nodes.mailbox["e"]
        total = (e.unsqueeze(1) - e.unsqueeze(2)).sum((1, 2))
        return {"h": total}
    _expect_error(both, "total = ", "separate calls")


def test_returning_a_pair_term_is_rejected():
    def unreduced(nodes):
        e = nodes.mailbox["e"]
        pairs = e.unsqueeze(1) - e.unsqueeze(2)
        return {"h": pairs}
    graph = gnnfuse.Graph(*_graph(), N)
    with pytest.raises(CompileError, match="reduce_fn output 'h' is PAIR data"):
        gnnfuse.message_passing(graph, make_message(_params()), unreduced, edata=_edata(graph.num_edges),
                                ndata={"h": torch.randn(N, F_IN, dtype=torch.float64)})


def test_clamp_traces_with_constant_bounds():
    """clamp(min=, max=) and its gradient against torch (no ties at the bounds)."""
    graph = gnnfuse.Graph(*_graph(), N)
    h = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def message(edges):
        return {"m": edges.src["h"]}

    def reduce(nodes):
        return {"h": torch.sum(nodes.mailbox["m"].clamp(min=-0.5, max=0.7), dim=1)}

    ours = _run(lambda h, p: gnnfuse.message_passing(graph, message, reduce, ndata={"h": h})["h"], h, {})
    expected = _run(lambda h, p: dgl_update_all(*_graph(), N, message, reduce, {"h": h}, {})["h"], h, {})
    assert rel_err(ours[0], expected[0]) < 1e-12 and rel_err(ours[1][0], expected[1][0]) < 1e-12


def test_explain_counts_pair_rows():
    """explain() sizes PAIR values by the graph's in-edge pairs (sum of squared in-degrees)."""
    src, dst = _graph()
    graph = gnnfuse.Graph(src, dst, N)

    class Spread(torch.nn.Module):
        def forward(self, x, graph):
            return gnnfuse.message_passing(graph, make_message(_params()), spread_reduce, ndata={"h": x},
                                           edata=_edata(graph.num_edges))["h"]
    report = str(gnnfuse.explain(Spread(), torch.randn(N, F_IN, dtype=torch.float64), graph))
    assert "pair_reduce" in report and "PAIR" in report
    assert len(in_edge_pairs(dst, N)[0]) == int((torch.bincount(dst, minlength=N) ** 2).sum())


def test_cgat_layer_keeps_a_nan_score_in_its_vertex():
    """nn.CGATConv against the pair table: a NaN feature makes its out-neighbours' scores
    NaN, which must not spread to vertices it has no edge into (prefix sums over all
    vertices' sorted scores did that)."""
    from gnnfuse import nn as gnn
    src, dst = _graph()
    layer = gnn.CGATConv(F_IN, F_OUT, heads=2, add_self_loops=False).double()
    x = torch.randn(N, F_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    x[0, 0] = float("nan")
    out = layer(x, torch.stack([src, dst]))
    z = (x @ layer.lin.weight.t()).view(N, 2, F_OUT)
    e = F.leaky_relu((z[src] * layer.att_src).sum(-1) + (z[dst] * layer.att_dst).sum(-1), layer.negative_slope)
    same = (dst.unsqueeze(0) == dst.unsqueeze(1)).unsqueeze(-1)
    gap = torch.relu(e.unsqueeze(1) - e.unsqueeze(0))                          # [b, a] = e_b - e_a
    w = torch.where(same, gap, torch.zeros_like(gap)).sum(1)
    expected = torch.zeros(N, 2, F_OUT, dtype=torch.float64).index_add(0, dst, w.unsqueeze(-1) * z[src])
    expected = expected.reshape(N, -1) + layer.bias
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12, equal_nan=True)
    clean = torch.ones(N, dtype=torch.bool)
    clean[0] = False                                           # its own score half is NaN
    clean[dst[src == 0]] = False                               # no in-edge from the NaN vertex
    assert clean.sum() >= 3 and torch.isfinite(out[clean]).all()
