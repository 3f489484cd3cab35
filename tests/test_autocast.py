"""Compiled UDFs under ``torch.autocast`` give what eager evaluation of the same UDF gives.

The oracle runs each UDF eagerly under the same autocast block: a vertex function one
vertex at a time (its neighbours as rows), a message/reduce pair one vertex's mailbox at
a time. Dtypes must be equal exactly, values within float16/bfloat16 rounding (eager
rounds after every op, a fused kernel where it stores), and gradients come back in the
inputs' own dtypes. On a GPU machine the block is CUDA's autocast, whose lists differ
(``exp`` runs in float32 there): the oracle, run on the same device, says which.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import gnnfuse
from layer_check import assert_same_under_autocast
from oracle_check import device_for

# every vertex has in-edges (an empty Python sum is the int 0 in eager code)
SRC, DST = [1, 0, 2, 0, 1, 3, 2, 3], [0, 1, 1, 2, 2, 2, 3, 0]
LOW = (torch.bfloat16, torch.float16)


@pytest.fixture(params=["reference", "triton", "cpu"])
def device(request, monkeypatch) -> str:
    """Where a test on GNNFUSE_BACKEND ``request.param`` places its graph and tensors."""
    monkeypatch.setenv("GNNFUSE_BACKEND", request.param)
    return device_for(request.param)


def _tables(device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    drawn = {"h": torch.randn(4, 8, generator=gen), "w": torch.rand(len(SRC), 1, generator=gen),
             "W": torch.randn(8, 5, generator=gen) / 3, "W2": torch.randn(5, 8, generator=gen) / 3,
             "b": torch.randn(5, generator=gen)}
    return {k: t.to(device).requires_grad_() for k, t in drawn.items()}


def _vertex_outputs(v, W, W2, b):
    """The same per-vertex maths, traced (``v`` a vertex) and eager (``v`` a row)."""
    lin = sum([u.h @ W for u in v.innbs])
    return {"lin": lin,                                                  # a product: the autocast dtype
            "edge": sum([F.linear(e.src.h, W2, b) * e.w for e in v.inedges]),   # times float32: promoted
            "root": v.h @ W + sum([u.h[:5] for u in v.innbs]),          # autocast dtype + float32
            "act": torch.exp(torch.tanh(lin)) * 2.0,                      # float32 on CUDA (exp), else low
            "rmatmul": sum([W2 @ u.h for u in v.innbs]),                 # W @ x, through __rmatmul__
            "bias_keyword": sum([F.linear(u.h, W2, bias=b) for u in v.innbs])}  # bias= cast as a positional one


def _vertex_udf(W, W2, b):
    @gnnfuse.vertex
    def layer(v):
        return _vertex_outputs(v, W, W2, b)
    return layer


class _Row:
    def __init__(self, **features):
        self.__dict__.update(features)


def _vertex_eager(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    rows = []
    for vertex in range(4):
        ins = [i for i, d in enumerate(DST) if d == vertex]
        v = _Row(h=t["h"][vertex], innbs=[_Row(h=t["h"][SRC[i]]) for i in ins],
                 inedges=[_Row(src=_Row(h=t["h"][SRC[i]]), w=t["w"][i]) for i in ins])
        rows.append(_vertex_outputs(v, t["W"], t["W2"], t["b"]))
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def _check(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], leaves: list[torch.Tensor]) -> None:
    assert {k: x.dtype for k, x in got.items()} == {k: x.dtype for k, x in expected.items()}
    for k in expected:
        torch.testing.assert_close(got[k].float(), expected[k].float(), rtol=3e-2, atol=3e-2, msg=k)
    weights = {k: torch.linspace(-1, 1, x.numel(), device=x.device).view_as(x) for k, x in expected.items()}
    grads = torch.autograd.grad(sum((got[k].float() * weights[k]).sum() for k in got), leaves)
    wanted = torch.autograd.grad(sum((expected[k].float() * weights[k]).sum() for k in expected), leaves)
    for leaf, g, e in zip(leaves, grads, wanted):
        assert g.dtype == e.dtype == leaf.dtype
        torch.testing.assert_close(g, e, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", LOW)
def test_vertex_function_follows_autocast(device, dtype):
    """``u.h @ W`` of float32 data is float16/bfloat16 under autocast in eager code; the
    compiled function gave float32 (Triton), or bfloat16 forward and a failing backward
    (reference: its torch ops were cast behind the program's back)."""
    t = _tables(device)
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    layer = _vertex_udf(t["W"], t["W2"], t["b"])
    kind = torch.device(device).type
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the interpreter's and the cpu backend's notes on low precision
        with torch.autocast(kind, dtype=dtype):
            got = layer(graph, {"h": t["h"]}, {"w": t["w"]})
            expected = _vertex_eager(t)
        _check(got, expected, [t[k] for k in ("h", "w", "W", "W2", "b")])


def _udfs(W: torch.Tensor, V: torch.Tensor):
    """A DGL message/reduce pair with products, sums and the mailbox reductions."""
    def message(edges):
        return {"m": edges.src["h"] @ W, "s": (edges.src["h"] * edges.data["w"]).sum(-1, keepdim=True)}

    def reduce(nodes):
        m = nodes.mailbox["m"]
        return {"sum": torch.sum(m, dim=1), "mean": m.mean(1), "max": m.max(1).values,
                "lin": F.linear(torch.sum(nodes.mailbox["s"], 1) * nodes.data["h"], V)}
    return message, reduce


def _message_eager(t: dict[str, torch.Tensor], message, reduce) -> dict[str, torch.Tensor]:
    rows = []
    for vertex in range(4):
        ins = [i for i, d in enumerate(DST) if d == vertex]
        edges = _Row(src={"h": t["h"][[SRC[i] for i in ins]]}, data={"w": t["w"][ins]})
        mailbox = {k: x.unsqueeze(0) for k, x in message(edges).items()}
        rows.append(reduce(_Row(mailbox=mailbox, data={"h": t["h"][vertex:vertex + 1]})))
    return {k: torch.cat([r[k] for r in rows]) for k in rows[0]}


@pytest.mark.parametrize("dtype", LOW)
def test_message_and_reduce_follow_autocast(device, dtype):
    """DGL-style UDFs: the message's product and the reduce's F.linear in the autocast
    dtype, the mailbox reductions of it as torch's (``torch.sum`` is float32 on CUDA)."""
    t = _tables(device)
    message, reduce = _udfs(t["W"], t["W2"][:2])
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast(torch.device(device).type, dtype=dtype):
            got = gnnfuse.message_passing(graph, message, reduce, ndata={"h": t["h"]}, edata={"w": t["w"]})
            expected = _message_eager(t, message, reduce)
        _check(got, expected, [t["h"], t["w"], t["W"], t["W2"]])


@pytest.mark.parametrize("outer", [True, False])
def test_an_autocast_block_inside_the_udf_after_an_input_read(device, outer):
    """A UDF that reads an input and then enters its own ``torch.autocast`` block: the
    casts were fixed by the state at the first input read, so ``enabled=False`` around a
    product inside a bfloat16 block gave bfloat16 (eager: float32, 0.015 off), and a block
    turned on inside a plain call gave float32 (eager: bfloat16)."""
    t = _tables(device)
    kind = torch.device(device).type

    def message(edges):
        h = edges.src["h"]
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=not outer):
            inner = h @ t["W"]
        return {"m": inner, "both": inner + h @ t["W"]}

    def reduce(nodes):
        return {"m": nodes.mailbox["m"].sum(1), "both": nodes.mailbox["both"].sum(1)}

    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=outer):
            got = gnnfuse.message_passing(graph, message, reduce, ndata={"h": t["h"]})
            expected = _message_eager(t, message, reduce)
    _check(got, expected, [t["h"], t["W"]])


def test_each_autocast_state_gets_its_own_trace(device):
    """The trace cache and the repeat of a prepared call (two inference calls keep one)
    key on the autocast state: a trace or a prepared call made outside autocast served
    calls inside it (float32 for bfloat16), and the other way round."""
    gen = torch.Generator().manual_seed(1)
    table = {"h": torch.randn(4, 1, 8, generator=gen).to(device), "M": torch.randn(4, 8, 5, generator=gen).to(device)}
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)

    @gnnfuse.vertex
    def lin(v):     # per-vertex matrices, nothing captured: a repeat call can take it
        return sum([u.h @ u.M for u in v.innbs])

    kind = torch.device(device).type
    plain = torch.zeros(4, 1, 5, device=device).index_add(0, graph.dst, table["h"][graph.src] @ table["M"][graph.src])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seen = [lin(graph, table).dtype for _ in range(3)]
        with torch.autocast(kind, dtype=torch.bfloat16):
            seen += [lin(graph, table).dtype for _ in range(3)]
            with torch.autocast(kind, enabled=False):
                seen.append(lin(graph, table).dtype)
            with torch.autocast(kind, dtype=torch.float16):
                seen += [lin(graph, table).dtype for _ in range(3)]
        last = lin(graph, table)
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    assert seen == [f32, f32, f32, bf16, bf16, bf16, f32, f16, f16, f16]
    torch.testing.assert_close(last, plain)


def test_a_backward_called_inside_the_autocast_block(device):
    """The backward, run inside the block (autograd then runs it under autocast on the
    CPU), computes in the program's dtypes too."""
    t = _tables(device)
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    layer = _vertex_udf(t["W"], t["W2"], t["b"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            got = layer(graph, {"h": t["h"]}, {"w": t["w"]})["lin"]
            (grad,) = torch.autograd.grad(got.float().sum(), t["W"])
            expected = _vertex_eager(t)["lin"]
            (wanted,) = torch.autograd.grad(expected.float().sum(), t["W"])
    assert grad.dtype == torch.float32
    torch.testing.assert_close(grad, wanted, rtol=5e-2, atol=5e-2)


def _summed_product(W):
    @gnnfuse.vertex
    def layer(v):
        return sum([u.h @ W for u in v.innbs])
    return layer


def test_a_plain_forward_s_backward_in_an_autocast_block_keeps_float32(device):
    """A float32 program run outside autocast, its backward called inside a bfloat16
    block (autograd runs it under the caller's autocast on the CPU): the backward program
    runs with autocast off, in the program's float32, so its ``u.h @ W`` gradients are
    float64's to float32 rounding (1e-7 here). Run under the block, they were rounded to
    bfloat16 (2.5e-3 off) and no test failed: the test above compares with eager code,
    which itself computes that backward in bfloat16."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    gen = torch.Generator().manual_seed(0)
    h0, w0 = torch.randn(4, 8, generator=gen).to(device), (torch.randn(8, 5, generator=gen) / 3).to(device)
    grads = {}
    for dtype in (torch.float64, torch.float32):
        h, W = h0.to(dtype).detach().requires_grad_(), w0.to(dtype).detach().requires_grad_()
        out = _summed_product(W)(graph, {"h": h})
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == torch.float32):
            out.square().sum().backward()
        grads[dtype] = (h.grad, W.grad)
    for got, exact in zip(grads[torch.float32], grads[torch.float64]):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5 * exact.abs().max().item())


def test_a_sage_backward_called_in_an_autocast_block_after_a_plain_forward(device):
    """SAGEConv's paired linear computed its backward under the caller's autocast, whose
    cast ``grad @ W`` then met a float32 in-place ``addmm_``: "self and mat2 must have the
    same dtype, but got BFloat16 and Float". The backward computes in the forward's dtypes,
    as a compiled program's does: float64's gradients to float32 rounding. (6 -> 4
    channels: the paired linear maps before aggregating.)"""
    from gnnfuse import nn as gnn
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 6, generator=gen).to(device)
    edge_index = torch.randint(0, 12, (2, 40), generator=gen).to(device)
    torch.manual_seed(1)
    layer = gnn.SAGEConv(6, 4).to(device)
    grads = {}
    for dtype in (torch.float64, torch.float32):
        xs = x.to(dtype).requires_grad_()
        layer.to(dtype).zero_grad()
        out = layer(xs, edge_index)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == torch.float32):
            out.square().sum().backward()
        grads[dtype] = [xs.grad] + [p.grad.clone() for p in layer.parameters()]
    for got, exact in zip(grads[torch.float32], grads[torch.float64]):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5 * exact.abs().max().item())


def test_per_type_and_indexed_matrices_follow_autocast(device):
    """``x @ e.type.W`` and ``bmm(x, T[idx])`` are cast as the tables they read (not
    edge by edge), and stay the per-type and grouped products they compile to."""
    gen = torch.Generator().manual_seed(2)
    h, W, T = (torch.randn(*s, generator=gen).to(device).requires_grad_() for s in ((4, 8), (3, 8, 5), (3, 8, 5)))
    types = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1], device=device)
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4, edge_type=types.cpu()).to(device)

    @gnnfuse.vertex
    def typed(v):
        return sum([e.src.h @ e.type.W for e in v.inedges])

    def message(edges):
        return {"m": torch.bmm(edges.src["h"].unsqueeze(1), T[edges.data["t"]]).squeeze(1)}

    def reduce(nodes):
        return {"o": nodes.mailbox["m"].sum(1)}

    src, dst = graph.src, graph.dst     # in edge-id order, as the edge types
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            got = {"typed": typed(graph, {"h": h}, etype_feature={"W": W}),
                   "indexed": gnnfuse.message_passing(graph, message, reduce, ndata={"h": h},
                                                      edata={"t": types})["o"]}
            expected = {}
            for key, table in (("typed", W), ("indexed", T)):
                m = torch.bmm(h[src].unsqueeze(1), table[types]).squeeze(1)
                # the reduce's ``mailbox.sum(1)`` is on CUDA autocast's float32 list: eager
                # DGL-style evaluation sums the bfloat16 messages in float32 there
                summed = torch.float32 if key == "indexed" and torch.device(device).type == "cuda" else m.dtype
                expected[key] = torch.zeros(4, 5, dtype=summed, device=device).index_add(0, dst, m.to(summed))
        _check(got, expected, [h, W, T])


def test_torch_compile_traces_a_udf_under_autocast():
    """Under torch.compile a UDF call is traced once on meta stand-ins, which have no
    autocast: the compiled operator ran the plain program (float32 where eager autocast
    gives bfloat16). The stand-ins are traced under the call's autocast state, and the
    call stays one graph with no break."""
    @gnnfuse.vertex
    def rows(v):
        return sum([u.h @ u.M for u in v.innbs])

    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4)
    table = {"h": torch.randn(4, 1, 8), "M": torch.randn(4, 8, 5)}
    compiled = torch.compile(lambda h, M: rows(graph, {"h": h, "M": M}), backend="aot_eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, eager = compiled(table["h"], table["M"]), rows(graph, table)
    plain = compiled(table["h"], table["M"])
    assert (got.dtype, eager.dtype, plain.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)
    torch.testing.assert_close(got, eager)


@gnnfuse.vertex
def _product_outside_autocast(v):
    h = v.h
    with torch.autocast("cpu", enabled=False):
        own = h @ v.M
    return own + sum([u.h @ u.M for u in v.innbs])


@gnnfuse.vertex
def _first_read_outside_autocast(v):
    with torch.autocast("cpu", enabled=False):
        own = v.h @ v.M
    return own + sum([u.h @ u.M for u in v.innbs])


@pytest.mark.parametrize("udf", [_product_outside_autocast, _first_read_outside_autocast])
def test_torch_compile_follows_an_autocast_block_inside_the_udf(udf):
    """Traced on meta stand-ins under torch.compile, ``enabled=False`` inside the vertex
    function was ignored too: bfloat16 where eager torch gives float32 (0.02 off); and
    where the block read the first input, the state then was taken for the call's (0.04
    off, and the trace then served eager calls too)."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4)
    gen = torch.Generator().manual_seed(3)
    h, M = torch.randn(4, 1, 8, generator=gen), torch.randn(4, 8, 5, generator=gen)
    compiled = torch.compile(lambda h, M: udf(graph, {"h": h, "M": M}), backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(h, M)
        summed = torch.zeros(4, 1, 5, dtype=torch.bfloat16).index_add(0, graph.dst, h[graph.src] @ M[graph.src])
    with torch.autocast("cpu", enabled=False):
        expected = h @ M + summed
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)


@gnnfuse.vertex
def _product_under_its_own_autocast(v):
    h = v.h
    with torch.autocast("cpu", dtype=torch.bfloat16):
        own = h @ v.M
    return own + sum([u.h @ u.M for u in v.innbs])


def test_torch_compile_refuses_an_autocast_block_it_cannot_place():
    """Called outside autocast, a block the vertex function enters names no device the
    meta stand-ins can tie it to: the product was computed in float32 (0.01 off eager's
    bfloat16 one); now the trace is refused by name."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4)
    gen = torch.Generator().manual_seed(3)
    h, M = torch.randn(4, 1, 8, generator=gen), torch.randn(4, 8, 5, generator=gen)
    compiled = torch.compile(lambda h, M: _product_under_its_own_autocast(graph, {"h": h, "M": M}),
                             backend="aot_eager")
    with pytest.raises(Exception, match="torch.autocast block entered inside a function traced under torch.compile"):
        compiled(h, M)


@pytest.mark.parametrize("name", ["RGCNConv", "FastRGCNConv", "RGATConv", "EdgeConv", "SGConv", "TAGConv"])
def test_traced_layers_under_autocast_match_pyg(device, name):
    """gnnfuse.nn layers whose aggregation traces products: before the UDF casts were
    traced, RGCNConv and RGATConv failed under CPU bf16 autocast ("Index put requires the
    source and destination dtypes match"), EdgeConv ("expected m1 and m2 to have the same
    dtype") and FastRGCNConv returned bfloat16 on the Triton backend where PyG's is float32.
    SGConv narrowing 6 -> 4 moved its map before the hops and returned float32 (PyG: bfloat16),
    and so did TAGConv without a bias."""
    pyg = pytest.importorskip("torch_geometric.nn")
    from gnnfuse import nn as gnn
    make = {"RGCNConv": lambda m: m.RGCNConv(6, 4, 3), "FastRGCNConv": lambda m: m.FastRGCNConv(6, 4, 3),
            "RGATConv": lambda m: m.RGATConv(6, 4, 3),
            "EdgeConv": lambda m: m.EdgeConv(torch.nn.Linear(12, 4)), "SGConv": lambda m: m.SGConv(6, 4, K=2),
            "TAGConv": lambda m: m.TAGConv(6, 4, K=2, bias=False)}[name]
    torch.manual_seed(1)
    ref = make(pyg).to(device)
    ours = make(gnn).to(device)
    ours.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 6, generator=gen).to(device)
    edge_index = torch.randint(0, 10, (2, 30), generator=gen).to(device)
    edge_type = torch.randint(0, 3, (30,), generator=gen).to(device)
    def call(layer, xs):
        return (layer(xs, edge_index) if name in ("EdgeConv", "SGConv", "TAGConv")
                else layer(xs, edge_index, edge_type))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same_under_autocast(ours, ref, call, x, torch.device(device).type)


def test_gat_logits_under_autocast_are_pyg_float32(device):
    """GATConv folds its attention vectors into one skinny GEMM for the logits, which
    autocast runs in bfloat16: PyG's ``(lin(x) * att).sum(-1)`` (bfloat16 times a float32
    parameter) is float32, so the attention weights returned were bfloat16 where PyG's
    are float32, and every logit carried bfloat16 rounding. Under autocast it multiplies
    as PyG does."""
    pyg = pytest.importorskip("torch_geometric.nn")
    from gnnfuse import nn as gnn
    torch.manual_seed(1)
    ref = pyg.GATConv(6, 4, heads=2).to(device)
    ours = gnn.GATConv(6, 4, heads=2).to(device)
    ours.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 6, generator=gen).to(device)
    edge_index = torch.randint(0, 10, (2, 30), generator=gen).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            out, (_, alpha) = ours(x, edge_index, return_attention_weights=True)
            ref_out, (_, ref_alpha) = ref(x, edge_index, return_attention_weights=True)
    assert (out.dtype, alpha.dtype) == (ref_out.dtype, ref_alpha.dtype) == (torch.float32, torch.float32)
    torch.testing.assert_close(alpha, ref_alpha, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out, ref_out, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("order", [None, "combine-first"])
def test_sage_without_root_weight_under_autocast_is_pyg_bfloat16(device, order):
    """SAGEConv narrowing 6 -> 4 on an input that needs a gradient maps first (the static
    rule, or a kernel placement choosing combine-first); without a root term the float32
    bias then promoted the bfloat16 sum, and the layer returned float32 where PyG's
    returns bfloat16. Under autocast it aggregates first, as PyG and GCNConv do."""
    pyg = pytest.importorskip("torch_geometric.nn")
    from gnnfuse import nn as gnn
    from gnnfuse.nn.placement import FixedPlacement
    torch.manual_seed(1)
    ref = pyg.SAGEConv(6, 4, root_weight=False).to(device)
    ours = gnn.SAGEConv(6, 4, root_weight=False).to(device)
    ours.load_state_dict(ref.state_dict())
    ours.placement = FixedPlacement(order) if order else None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 6, generator=gen).to(device)
    edge_index = torch.randint(0, 10, (2, 30), generator=gen).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same_under_autocast(ours, ref, lambda layer, xs: layer(xs, edge_index), x, torch.device(device).type)
