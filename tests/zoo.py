"""Every model of the compiler-core issue written twice — vertex-centric and
message/reduce — each next to an outside oracle (a PyG layer, or plain PyTorch where PyG
has no counterpart). Parameters are plain tensors so gradcheck can reach them."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg
from torch_geometric.utils import softmax as pyg_softmax

import gnnfuse

F_IN, F_OUT, HEADS = 5, 4, 2


def params(name: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    return {
        "gcn": lambda: {"W": r(F_IN, F_OUT)},
        "gat": lambda: {"W": r(F_IN, HEADS * F_OUT), "a_src": r(HEADS, F_OUT), "a_dst": r(HEADS, F_OUT)},
        "sage_mean": lambda: {"Wl": r(F_IN, F_OUT), "bl": r(F_OUT), "Wr": r(F_IN, F_OUT)},
        "sage_max": lambda: {"Wl": r(F_IN, F_OUT), "bl": r(F_OUT), "Wr": r(F_IN, F_OUT)},
        "gin": lambda: {"W1": r(F_IN, F_OUT), "b1": r(F_OUT), "W2": r(F_OUT, F_OUT), "b2": r(F_OUT)},
        "appnp": lambda: {},
        "diffgat": lambda: {"W": r(F_IN, F_OUT), "a": r(F_OUT)},
        "dotgat": lambda: {"W": r(F_IN, F_OUT)},
        "mlp_agg": lambda: {"W": r(F_IN, F_OUT)},
    }[name]()


def gcn_norm(graph: gnnfuse.Graph) -> torch.Tensor:
    """deg^-1/2 of the in-degree, 0 for isolated vertices (PyG's gcn_norm)."""
    norm = graph.in_degrees().to(torch.float64).pow(-0.5)
    return norm.masked_fill(torch.isinf(norm), 0.0)


# --- vertex-centric -------------------------------------------------------------------
def vertex_models(x, graph, p):
    """name -> output, each computed by a vertex-centric function."""
    out = {}
    norm = gcn_norm(graph)

    @gnnfuse.vertex
    def gcn(v):
        return sum([torch.mm(u.h, p["W"]) * u.norm for u in v.innbs]) * v.norm
    out["gcn"] = lambda: gcn(graph, {"h": x, "norm": norm})

    @gnnfuse.vertex
    def gat(v):   # Seastar Figure 3, multi-head
        e = [torch.exp(F.leaky_relu(_att(u.h, p["W"], p["a_src"]) + _att(v.h, p["W"], p["a_dst"]), 0.2))
             for u in v.innbs]
        a = [c / sum(e) for c in e]
        hu = [(u.h @ p["W"]).view(HEADS, F_OUT) for u in v.innbs]
        return sum([a[i].unsqueeze(-1) * hu[i] for i in range(len(v.innbs))]).view(HEADS * F_OUT)
    out["gat"] = lambda: gat(graph, {"h": x})

    @gnnfuse.vertex
    def sage_mean(v):
        return torch.mm(sum([u.h for u in v.innbs]) / len(v.innbs), p["Wl"]) + p["bl"] + v.h @ p["Wr"]
    out["sage_mean"] = lambda: sage_mean(graph, {"h": x})

    @gnnfuse.vertex
    def sage_max(v):
        return torch.mm(max([u.h for u in v.innbs]), p["Wl"]) + p["bl"] + v.h @ p["Wr"]
    out["sage_max"] = lambda: sage_max(graph, {"h": x})

    @gnnfuse.vertex
    def gin(v):
        z = (1 + 0.1) * v.h + sum([u.h for u in v.innbs])
        return torch.relu(z @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
    out["gin"] = lambda: gin(graph, {"h": x})

    @gnnfuse.vertex
    def appnp(v):
        return 0.9 * sum([u.h * u.norm for u in v.innbs]) * v.norm + 0.1 * v.h0
    out["appnp"] = lambda: appnp(graph, {"h": x, "h0": x * 0.5, "norm": norm})

    # Attention scored on the difference of the endpoints' features -- a test of
    # per-edge arithmetic on both endpoints, not Graphiler's constrained GAT (that is
    # gnnfuse.nn.CGATConv, tested in test_nn_attention.py).
    @gnnfuse.vertex
    def diffgat(v):
        scores = [F.leaky_relu(((v.h - u.h) @ p["W"] * p["a"]).sum(-1), 0.2) for u in v.innbs]
        att = [torch.exp(s) / sum([torch.exp(t) for t in scores]) for s in scores]
        return sum([att[i].unsqueeze(-1) * (u.h @ p["W"]) for i, u in enumerate(v.innbs)])
    out["diffgat"] = lambda: diffgat(graph, {"h": x})

    @gnnfuse.vertex
    def dotgat(v):
        s = [torch.exp(((u.h @ p["W"]) * (v.h @ p["W"])).sum(-1) / math.sqrt(F_OUT)) for u in v.innbs]
        a = [c / sum(s) for c in s]
        return sum([a[i].unsqueeze(-1) * (u.h @ p["W"]) for i, u in enumerate(v.innbs)])
    out["dotgat"] = lambda: dotgat(graph, {"h": x})

    @gnnfuse.vertex
    def mlp_agg(v):
        return max([torch.relu((u.h + v.h) @ p["W"]) for u in v.innbs])
    out["mlp_agg"] = lambda: mlp_agg(graph, {"h": x})
    return out


def _att(h, W, a):
    return ((h @ W).view(HEADS, F_OUT) * a).sum(-1)


# --- message / reduce -----------------------------------------------------------------
def message_models(x, graph, p):
    """name -> output, each computed by DGL-style message/reduce UDFs."""
    norm = gcn_norm(graph).unsqueeze(-1)    # [N, 1], as DGL code broadcasts it over [E, F] messages
    mp = gnnfuse.message_passing
    out = {}

    def summed(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1)}

    out["gcn"] = lambda: mp(graph, lambda e: {"m": (e.src["h"] @ p["W"]) * e.src["norm"] * e.dst["norm"]},
                            summed, ndata={"h": x, "norm": norm})["out"]

    def gat_msg(edges):
        h = (edges.src["h"] @ p["W"]).view(-1, HEADS, F_OUT)
        el = (h * p["a_src"]).sum(-1)
        er = ((edges.dst["h"] @ p["W"]).view(-1, HEADS, F_OUT) * p["a_dst"]).sum(-1)
        return {"e": F.leaky_relu(el + er, 0.2), "h": h}

    def gat_reduce(nodes):
        alpha = torch.softmax(nodes.mailbox["e"], dim=1)
        return {"out": torch.sum(alpha.unsqueeze(-1) * nodes.mailbox["h"], dim=1).view(-1, HEADS * F_OUT)}
    out["gat"] = lambda: mp(graph, gat_msg, gat_reduce, ndata={"h": x})["out"]

    def sage_update(nodes):
        return {"out": nodes.data["n"] @ p["Wl"] + p["bl"] + nodes.data["h"] @ p["Wr"]}
    out["sage_mean"] = lambda: mp(graph, lambda e: {"m": e.src["h"]},
                                  lambda n: {"n": torch.mean(n.mailbox["m"], dim=1)},
                                  sage_update, ndata={"h": x})["out"]
    out["sage_max"] = lambda: mp(graph, lambda e: {"m": e.src["h"]},
                                 lambda n: {"n": torch.max(n.mailbox["m"], dim=1).values},
                                 sage_update, ndata={"h": x})["out"]

    def gin_update(nodes):
        z = (1 + 0.1) * nodes.data["h"] + nodes.data["n"]
        return {"out": torch.relu(z @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]}
    out["gin"] = lambda: mp(graph, lambda e: {"m": e.src["h"]}, lambda n: {"n": torch.sum(n.mailbox["m"], dim=1)},
                            gin_update, ndata={"h": x})["out"]

    # The teleport term goes in update_fn, which DGL runs on every vertex; reduce_fn's
    # outputs are zero on vertices without in-edges (DGL's update_all).
    out["appnp"] = lambda: mp(graph, lambda e: {"m": e.src["h"] * e.src["norm"] * e.dst["norm"]},
                              lambda n: {"agg": torch.sum(n.mailbox["m"], dim=1)},
                              lambda n: {"out": 0.9 * n.data["agg"] + 0.1 * n.data["h0"]},
                              ndata={"h": x, "h0": x * 0.5, "norm": norm})["out"]

    def diffgat_msg(edges):
        s = ((edges.dst["h"] - edges.src["h"]) @ p["W"] * p["a"]).sum(-1)
        return {"s": F.leaky_relu(s, 0.2), "h": edges.src["h"] @ p["W"]}

    def attend(score):
        def reduce(nodes):
            alpha = torch.softmax(nodes.mailbox[score], dim=1)
            return {"out": torch.sum(alpha.unsqueeze(-1) * nodes.mailbox["h"], dim=1)}
        return reduce
    out["diffgat"] = lambda: mp(graph, diffgat_msg, attend("s"), ndata={"h": x})["out"]

    def dot_msg(edges):
        hs, hd = edges.src["h"] @ p["W"], edges.dst["h"] @ p["W"]
        return {"s": (hs * hd).sum(-1) / math.sqrt(F_OUT), "h": hs}
    out["dotgat"] = lambda: mp(graph, dot_msg, attend("s"), ndata={"h": x})["out"]

    out["mlp_agg"] = lambda: mp(graph, lambda e: {"m": torch.relu((e.src["h"] + e.dst["h"]) @ p["W"])},
                                lambda n: {"out": torch.max(n.mailbox["m"], dim=1)[0]}, ndata={"h": x})["out"]
    return out


# --- oracles --------------------------------------------------------------------------
def oracle(name, x, graph, p):
    """The same model computed by PyG layers, or plain PyTorch where PyG has none."""
    ei = graph.edge_index
    src, dst, n = graph.src, graph.dst, graph.num_nodes

    def aggregate(msg):
        return torch.zeros(n, *msg.shape[1:], dtype=msg.dtype).index_add(0, dst, msg)

    def call(module, weights):
        """Run a PyG module with our tensors as its parameters, differentiably, so the
        oracle's parameter gradients exist (PyG stores Linear weights transposed)."""
        return torch.func.functional_call(module, weights, (x, ei), strict=False)

    if name == "gcn":
        conv = pyg.GCNConv(F_IN, F_OUT, add_self_loops=False, bias=False).double()
        return call(conv, {"lin.weight": p["W"].t()})
    if name == "gat":
        conv = pyg.GATConv(F_IN, F_OUT, heads=HEADS, add_self_loops=False, bias=False, negative_slope=0.2).double()
        return call(conv, {"lin.weight": p["W"].t(),
                           "att_src": p["a_src"].view(1, HEADS, F_OUT),
                           "att_dst": p["a_dst"].view(1, HEADS, F_OUT)})
    if name in ("sage_mean", "sage_max"):
        conv = pyg.SAGEConv(F_IN, F_OUT, aggr=name.split("_")[1]).double()
        return call(conv, {"lin_l.weight": p["Wl"].t(), "lin_l.bias": p["bl"], "lin_r.weight": p["Wr"].t()})
    if name == "gin":
        mlp = torch.nn.Sequential(torch.nn.Linear(F_IN, F_OUT), torch.nn.ReLU(), torch.nn.Linear(F_OUT, F_OUT))
        conv = pyg.GINConv(mlp, eps=0.1).double()
        return call(conv, {"nn.0.weight": p["W1"].t(), "nn.0.bias": p["b1"],
                           "nn.2.weight": p["W2"].t(), "nn.2.bias": p["b2"]})
    if name == "appnp":
        norm = gcn_norm(graph)
        weight = norm[src] * norm[dst]
        prop = pyg.APPNP(K=1, alpha=0.1, add_self_loops=False, normalize=False)
        return prop(x, ei, weight) - 0.1 * x + 0.1 * x * 0.5
    if name in ("diffgat", "dotgat"):
        h = x @ p["W"]
        if name == "diffgat":
            s = F.leaky_relu(((x[dst] - x[src]) @ p["W"] * p["a"]).sum(-1), 0.2)
        else:
            s = (h[src] * h[dst]).sum(-1) / math.sqrt(F_OUT)
        alpha = pyg_softmax(s, dst, num_nodes=n)
        return aggregate(alpha.unsqueeze(-1) * h[src])
    if name == "mlp_agg":
        m = torch.relu((x[src] + x[dst]) @ p["W"])
        return torch.zeros(n, F_OUT, dtype=x.dtype).index_reduce(0, dst, m, "amax", include_self=False)
    raise KeyError(name)


MODELS = ["gcn", "gat", "sage_mean", "sage_max", "gin", "appnp", "diffgat", "dotgat", "mlp_agg"]
