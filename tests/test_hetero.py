"""Typed graphs in both front ends: R-GCN against PyG's RGCNConv (random typed graphs and
WN18RR's relations), an HGT-style layer reading per-node-type and per-relation data against
plain PyTorch, gradcheck, both backends, and the errors a typed program can hit."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import RGCNConv
from torch_geometric.utils import softmax as pyg_softmax

import gnnfuse
from gnnfuse.backend.reference import GraphContext
from gnnfuse.frontend.vertex import VertexFunction
from gnnfuse.ir import CompileError, Program, Residency
from gnnfuse.passes.fusion import AggregateUnit, partition
from gnnfuse.runtime import CompiledProgram
from oracle_check import device_for

f64 = torch.float64
F_IN, F_OUT = 5, 4
BACKENDS = ["reference", "triton"]


def typed_graph(seed: int, n: int = 9, num_edges: int = 30, relations: int = 3,
                node_types: int = 2) -> gnnfuse.Graph:
    """Random typed multigraph with self loops, a relation no edge has (its gradient must
    be 0) and isolated vertices."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n - 2, (num_edges,), generator=g)
    dst = torch.randint(0, n - 2, (num_edges,), generator=g)
    etype = torch.randint(0, relations - 1, (num_edges,), generator=g)   # relation R-1 unused
    ntype = torch.randint(0, node_types, (n,), generator=g)
    return gnnfuse.Graph(src, dst, n, edge_type=etype, num_edge_types=relations,
                         node_type=ntype, num_node_types=node_types)


def relation_mean_norm(graph: gnnfuse.Graph) -> torch.Tensor:
    """1 / |N_r(dst)| per edge: PyG's RGCNConv averages each relation's messages apart."""
    key = graph.dst * graph.num_edge_types + graph.edge_type
    count = torch.bincount(key, minlength=graph.num_nodes * graph.num_edge_types).to(f64)
    return 1.0 / count[key]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


# --- the IR: residency rules of the type indices ------------------------------------------
R = Residency


@pytest.mark.parametrize("by, source, target", [
    ("etype", R.EDGE_TYPE, R.EDGE), ("srctype", R.NODE_TYPE, R.SRC),
    ("dsttype", R.NODE_TYPE, R.DST), ("ntype", R.NODE_TYPE, R.NODE),
])
def test_type_broadcast_and_reduce_residencies(by, source, target):
    p = Program()
    t = p.input("t", source, (3,), f64)
    rows = p.add("broadcast", t, by=by)
    assert rows.residency is target
    assert p.add("reduce", rows, op="sum", by=by).residency is source
    assert p.add("degree", by=by, dtype=f64).residency is source
    with pytest.raises(CompileError, match=f"broadcast by {by} takes {source.name} data"):
        p.add("broadcast", p.input("x", R.EDGE if source is R.NODE_TYPE else R.NODE_TYPE, (3,), f64), by=by)


def test_typed_matmul_rules():
    p = Program()
    w_e = p.input("We", R.EDGE_TYPE, (3, 2), f64)
    w_n = p.input("Wn", R.NODE_TYPE, (3, 2), f64)
    x_src = p.add("broadcast", p.input("h", R.NODE, (3,), f64), by="src")
    assert p.add("typed_matmul", x_src, w_e, by="etype").residency is R.EDGE
    assert p.add("typed_matmul", x_src, w_n, by="srctype").residency is R.SRC
    assert p.add("typed_matmul", x_src, w_n, by="dsttype").residency is R.EDGE
    assert p.add("typed_matmul", p.inputs["h"], w_n, by="ntype").shape == (2,)
    grad = p.add("typed_matmul_tn", x_src, p.input("g", R.EDGE, (2,), f64), by="etype")
    assert (grad.residency, grad.shape) == (R.EDGE_TYPE, (3, 2))
    with pytest.raises(CompileError, match="takes a weight table resident on EDGE_TYPE, got NODE_TYPE"):
        p.add("typed_matmul", x_src, w_n, by="etype")
    with pytest.raises(CompileError, match="by ntype takes per-vertex"):
        p.add("typed_matmul", x_src, w_n, by="ntype")
    with pytest.raises(CompileError, match=r"last dim must match.*\[4\] @ W \[3, 2\]"):
        p.add("typed_matmul", p.input("h4", R.NODE, (4,), f64), w_n, by="ntype")


def test_graph_context_type_indices_and_counts():
    graph = typed_graph(0)
    ctx = GraphContext(graph)
    assert torch.equal(ctx.index("srctype"), graph.node_type[graph.src])
    assert torch.equal(ctx.index("dsttype"), graph.node_type[graph.dst])
    assert torch.equal(ctx.degree("etype"), torch.bincount(graph.edge_type, minlength=3))
    groups = ctx.groups("etype")
    assert len(groups) == 3 and groups[2].numel() == 0
    assert torch.equal(torch.sort(torch.cat(groups)).values, torch.arange(graph.num_edges))
    assert all((graph.edge_type[rows] == t).all() for t, rows in enumerate(groups))


# --- R-GCN ------------------------------------------------------------------------------
def rgcn_vertex(graph, x, weight, root, bias):
    @gnnfuse.vertex
    def rgcn(v):
        return sum([(e.src.h @ e.type.W) * e.norm for e in v.inedges]) + v.h @ root + bias
    return rgcn(graph, {"h": x}, {"norm": relation_mean_norm(graph)}, etype_feature={"W": weight})


def rgcn_message(graph, x, weight, root, bias):
    def message(edges):
        return {"m": (edges.src["h"] @ edges.type["W"]) * edges.data["norm"]}

    def reduce(nodes):
        return {"agg": torch.sum(nodes.mailbox["m"], dim=1)}

    def update(nodes):   # DGL runs it on every vertex; reduce outputs are 0 without in-edges
        return {"h": nodes.data["agg"] + nodes.data["h"] @ root + bias}
    return gnnfuse.message_passing(graph, message, reduce, update, ndata={"h": x},
                                   edata={"norm": relation_mean_norm(graph).unsqueeze(-1)},   # DGL's [E, 1]
                                   etype_data={"W": weight})["h"]


RGCN = {"vertex": rgcn_vertex, "message": rgcn_message}


def rgcn_against_pyg(graph: gnnfuse.Graph, rgcn, f_in: int, f_out: int, seed: int) -> None:
    """Outputs and gradients (x, per-relation weights, root, bias) of ``rgcn`` vs RGCNConv
    (mean aggregation and root weight, its defaults) with the same parameters, on the
    graph's device (drawn on the CPU, so every device compares the same numbers)."""
    torch.manual_seed(seed)
    conv = RGCNConv(f_in, f_out, graph.num_edge_types).double()
    torch.nn.init.normal_(conv.bias)
    x = torch.randn(graph.num_nodes, f_in, dtype=f64)
    seed_grad = torch.randn(graph.num_nodes, f_out, dtype=f64)
    conv, x, seed_grad = conv.to(graph.device), x.to(graph.device), seed_grad.to(graph.device)

    def run(fn):
        conv.zero_grad()
        xs = x.clone().requires_grad_()
        out = fn(xs)
        (out * seed_grad).sum().backward()
        return out.detach(), [xs.grad, conv.weight.grad.clone(), conv.root.grad.clone(), conv.bias.grad.clone()]

    out, grads = run(lambda xs: rgcn(graph, xs, conv.weight, conv.root, conv.bias))
    ref, ref_grads = run(lambda xs: conv(xs, graph.edge_index, graph.edge_type))
    assert out.shape == ref.shape and rel_err(out, ref) < 1e-10
    for name, g, r in zip(["x", "weight", "root", "bias"], grads, ref_grads):
        assert rel_err(g, r) < 1e-10, name
    unused = torch.bincount(graph.edge_type, minlength=graph.num_edge_types) == 0
    assert (grads[1][unused] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", RGCN)
def test_rgcn_matches_pyg(kind, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    rgcn_against_pyg(typed_graph(1).to(device_for(backend)), RGCN[kind], F_IN, F_OUT, seed=1)


@pytest.fixture(scope="module")
def wn18rr_subgraph(shared_data) -> gnnfuse.Graph:
    """WN18RR's typed training graph induced on its first 6,000 entities (a few hundred
    edges over all 11 relations), renumbered densely."""
    from gnnfuse.data import load_wn18rr
    full = load_wn18rr(shared_data).graph
    keep = (full.src < 6000) & (full.dst < 6000)
    src, dst, etype = full.src[keep], full.dst[keep], full.edge_type[keep]
    ids, inverse = torch.unique(torch.cat([src, dst]), return_inverse=True)
    return gnnfuse.Graph(inverse[: src.numel()], inverse[src.numel():], ids.numel(),
                         edge_type=etype, num_edge_types=full.num_edge_types)


@pytest.mark.parametrize("kind", RGCN)
def test_rgcn_matches_pyg_on_wn18rr(kind, wn18rr_subgraph):
    graph = wn18rr_subgraph
    assert graph.num_edges > 200 and len(torch.unique(graph.edge_type)) >= 8
    rgcn_against_pyg(graph, RGCN[kind], 6, 3, seed=2)


@pytest.mark.parametrize("kind", RGCN)
def test_rgcn_gradcheck(kind):
    graph = typed_graph(3, n=6, num_edges=14)
    g = torch.Generator().manual_seed(3)
    args = [torch.randn(*shape, dtype=f64, generator=g, requires_grad=True)
            for shape in [(6, 3), (3, 3, 2), (3, 2), (2,)]]
    assert torch.autograd.gradcheck(lambda *a: RGCN[kind](graph, *a), args, eps=1e-6, atol=1e-6)


# --- HGT-style: per-node-type projections, per-relation scaling ---------------------------
def hgt_params(seed: int, node_types: int, relations: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, dtype=f64, generator=g)
    return {"Wk": r(node_types, F_IN, F_OUT), "Wq": r(node_types, F_IN, F_OUT),
            "Wv": r(node_types, F_IN, F_OUT), "Wa": r(node_types, F_OUT, F_OUT),
            "b": r(node_types, F_OUT), "mu": r(relations)}


NTYPE_KEYS, ETYPE_KEYS = ("Wk", "Wq", "Wv", "Wa", "b"), ("mu",)


def hgt_vertex(graph, x, p):
    @gnnfuse.vertex
    def hgt(v):
        q = v.h @ v.type.Wq
        s = [torch.exp(((e.src.h @ e.src.type.Wk) * q).sum(-1) * e.type.mu) for e in v.inedges]
        a = [c / sum(s) for c in s]
        agg = sum([a[i].unsqueeze(-1) * (e.src.h @ e.src.type.Wv) for i, e in enumerate(v.inedges)])
        return torch.relu(agg @ v.type.Wa + v.type.b)
    return hgt(graph, {"h": x}, etype_feature={k: p[k] for k in ETYPE_KEYS},
               ntype_feature={k: p[k] for k in NTYPE_KEYS})


def hgt_message(graph, x, p):
    def message(edges):
        k = edges.src["h"] @ edges.srctype["Wk"]
        q = edges.dst["h"] @ edges.dsttype["Wq"]
        return {"s": (k * q).sum(-1) * edges.type["mu"], "v": edges.src["h"] @ edges.srctype["Wv"]}

    def reduce(nodes):
        alpha = torch.softmax(nodes.mailbox["s"], dim=1)
        return {"agg": torch.sum(alpha.unsqueeze(-1) * nodes.mailbox["v"], dim=1)}

    def update(nodes):
        return {"out": torch.relu(nodes.data["agg"] @ nodes.type["Wa"] + nodes.type["b"])}
    return gnnfuse.message_passing(graph, message, reduce, update, ndata={"h": x},
                                   etype_data={k: p[k] for k in ETYPE_KEYS},
                                   ntype_data={k: p[k] for k in NTYPE_KEYS})["out"]


def hgt_oracle(graph, x, p):
    src, dst, et, nt = graph.src, graph.dst, graph.edge_type, graph.node_type
    k = torch.einsum("ei,eio->eo", x[src], p["Wk"][nt[src]])
    q = torch.einsum("ei,eio->eo", x[dst], p["Wq"][nt[dst]])
    v = torch.einsum("ei,eio->eo", x[src], p["Wv"][nt[src]])
    alpha = pyg_softmax((k * q).sum(-1) * p["mu"][et], dst, num_nodes=graph.num_nodes)
    agg = torch.zeros(graph.num_nodes, F_OUT, dtype=f64, device=x.device).index_add(0, dst, alpha.unsqueeze(-1) * v)
    return torch.relu(torch.einsum("ni,nio->no", agg, p["Wa"][nt]) + p["b"][nt])


HGT = {"vertex": hgt_vertex, "message": hgt_message}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", HGT)
def test_hgt_style_matches_oracle(kind, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)     # the Triton backend runs CUDA tensors on a GPU machine
    graph = typed_graph(4).to(device)
    x = torch.randn(graph.num_nodes, F_IN, dtype=f64, generator=torch.Generator().manual_seed(4)).to(device)
    p = {k: t.to(device) for k, t in hgt_params(4, graph.num_node_types, graph.num_edge_types).items()}
    seed_grad = torch.randn(graph.num_nodes, F_OUT, dtype=f64).to(device)

    def run(fn):
        ps = {k: t.clone().requires_grad_() for k, t in p.items()}
        out = fn(graph, x, ps)
        (out * seed_grad).sum().backward()
        return out.detach(), {k: t.grad for k, t in ps.items()}

    out, grads = run(HGT[kind])
    ref, ref_grads = run(hgt_oracle)
    assert rel_err(out, ref) < 1e-10
    for key in p:
        assert rel_err(grads[key], ref_grads[key]) < 1e-10, key


@pytest.mark.parametrize("kind", HGT)
def test_hgt_style_gradcheck(kind):
    graph = typed_graph(5, n=6, num_edges=14)
    x = torch.randn(6, F_IN, dtype=f64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    p = {k: t.mul(0.5).requires_grad_() for k, t in hgt_params(5, 2, 3).items()}
    keys = list(p)

    def run(x, *values):
        return HGT[kind](graph, x, dict(zip(keys, values)))
    assert torch.autograd.gradcheck(run, (x, *p.values()), eps=1e-6, atol=1e-6)


def test_endpoint_type_projection_runs_per_vertex_and_triton_fuses_around_it():
    """``edges.src['h'] @ edges.srctype['W']`` depends only on the source: after the passes
    it is one per-vertex typed matmul gathered onto edges, and the fused aggregation unit
    reads it while the typed op itself stays a torch op."""
    graph = typed_graph(6)
    x = torch.randn(graph.num_nodes, F_IN, dtype=f64)
    w = torch.randn(graph.num_node_types, F_IN, F_OUT, dtype=f64)

    @gnnfuse.vertex
    def project(v):
        return sum([u.h @ u.type.W for u in v.innbs])
    compiled = CompiledProgram(project.trace({"h": x}, ntype_feature={"W": w})[0].program)
    typed = [v for v in compiled.program.values if v.op == "typed_matmul"]
    assert [(v.attrs["by"], v.residency.name) for v in typed] == [("ntype", "NODE")]
    plan = partition(compiled.program)
    assert any(isinstance(item, AggregateUnit) for item in plan) and typed[0] in plan
    expected = torch.zeros(graph.num_nodes, F_OUT, dtype=f64).index_add(
        0, graph.dst, torch.einsum("ei,eio->eo", x[graph.src], w[graph.node_type[graph.src]]))
    assert rel_err(project(graph, {"h": x}, ntype_feature={"W": w}), expected) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_endpoints_rows_times_the_other_endpoints_type_matrix_stays_per_edge(backend, monkeypatch):
    """``edges.dst['h'] @ edges.srctype['W']`` mixes the endpoints: only a typed matmul whose
    rows and type come from one endpoint moves before the gather (a move keyed on the
    broadcast alone multiplied the source's rows instead of the destination's)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    graph = typed_graph(7).to(device)
    x = torch.randn(graph.num_nodes, F_IN, dtype=f64, generator=torch.Generator().manual_seed(7)).to(device)
    w = torch.randn(graph.num_node_types, F_IN, F_OUT, dtype=f64, generator=torch.Generator().manual_seed(8))
    w = w.to(device).requires_grad_()

    def message(edges):
        return {"m": edges.dst["h"] @ edges.srctype["W"]}

    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
    out = gnnfuse.message_passing(graph, message, reduce, ndata={"h": x}, ntype_data={"W": w})["out"]
    src, dst = graph.src, graph.dst
    expected = torch.zeros(graph.num_nodes, F_OUT, dtype=f64, device=device).index_add(
        0, dst, torch.einsum("ei,eio->eo", x[dst], w[graph.node_type[src]]))
    assert rel_err(out, expected) < 1e-12
    seed = torch.randn(out.shape, dtype=f64, generator=torch.Generator().manual_seed(9)).to(device)
    (grad,) = torch.autograd.grad((out * seed).sum(), w)
    (expected_grad,) = torch.autograd.grad((expected * seed).sum(), w)
    assert rel_err(grad, expected_grad) < 1e-12


# --- errors -------------------------------------------------------------------------------
def test_types_read_on_an_untyped_graph_is_a_compile_error():
    plain = gnnfuse.Graph([0, 1, 2], [1, 2, 0])
    x = torch.randn(3, F_IN, dtype=f64)
    w = torch.randn(2, F_IN, F_OUT, dtype=f64)
    with pytest.raises(gnnfuse.CompileError, match=r"reads edge types .* graph has none.*edge_type="):
        gnnfuse.message_passing(plain, lambda e: {"m": e.src["h"] @ e.type["W"]},
                                lambda n: {"h": torch.sum(n.mailbox["m"], dim=1)},
                                ndata={"h": x}, etype_data={"W": w})
    with pytest.raises(gnnfuse.CompileError, match=r"reads node types .* graph has none.*node_type="):
        VertexFunction(lambda v: sum([u.h @ u.type.W for u in v.innbs]))(
            plain, {"h": x}, ntype_feature={"W": w})


def test_type_feature_with_wrong_row_count_is_a_compile_error():
    graph = typed_graph(7)          # 3 relations, 2 node types
    x = torch.randn(graph.num_nodes, F_IN, dtype=f64)
    with pytest.raises(gnnfuse.CompileError, match=r"'etype.W' has 4 rows but the graph has 3 edge types"):
        rgcn_vertex(graph, x, torch.randn(4, F_IN, F_OUT, dtype=f64), torch.randn(F_IN, F_OUT, dtype=f64),
                    torch.zeros(F_OUT, dtype=f64))
    p = hgt_params(7, 3, graph.num_edge_types)
    with pytest.raises(gnnfuse.CompileError, match=r"'ntype.Wk' has 3 rows but the graph has 2 node types"):
        hgt_message(graph, x, p)


def test_type_feature_misuse_is_reported_at_its_line():
    graph = typed_graph(8)
    x = torch.randn(graph.num_nodes, F_IN, dtype=f64)
    w = torch.randn(graph.num_edge_types, F_IN, F_OUT, dtype=f64)
    with pytest.raises(gnnfuse.CompileError, match=r"per-type feature 'V' does not exist; etype_feature has \['W'\]"):
        VertexFunction(lambda v: sum([e.src.h @ e.type.V for e in v.inedges]))(graph, {"h": x},
                                                                             etype_feature={"W": w})
    # A per-type weight changed per edge is one matrix per edge: a per-row matmul.
    scaled = VertexFunction(lambda v: sum([e.src.h @ (e.type.W * 2) for e in v.inedges]))(
        graph, {"h": x}, etype_feature={"W": w})
    per_edge = torch.einsum("ei,eio->eo", x[graph.src], 2 * w[graph.edge_type])
    torch.testing.assert_close(scaled, torch.zeros_like(scaled).index_add(0, graph.dst, per_edge))
    with pytest.raises(gnnfuse.CompileError, match=r"edges.type \(etype_data\)\['V'\] does not exist"):
        gnnfuse.message_passing(graph, lambda e: {"m": e.src["h"] @ e.type["V"]},
                                lambda n: {"h": torch.sum(n.mailbox["m"], dim=1)},
                                ndata={"h": x}, etype_data={"W": w})
