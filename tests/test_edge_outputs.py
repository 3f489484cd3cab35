"""Edge data written in a message UDF (``edges.data[k] = ...``, GatedGCN's edge update),
returned by ``message_passing(..., return_edata=True)`` and by ``gnnfuse.apply_edges``:
outputs and every gradient against plain-PyTorch gather/index_add oracles in float64, on
both backends."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from oracle_check import BACKENDS, assert_matches_oracle, device_for

F = 3
EPS = 1e-6
# Every vertex has an in-edge (so no test depends on zero-in-degree semantics); a
# multi-edge 2->0 twice and a self loop on 3.
SRC = torch.tensor([0, 1, 2, 3, 1, 2, 0, 3, 3, 2])
DST = torch.tensor([1, 2, 0, 0, 3, 3, 2, 1, 3, 0])
N, E = 4, len(SRC)


def inputs(device: str, **shapes: tuple[int, ...]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, dtype=torch.float64, generator=gen).to(device) for k, s in shapes.items()}


def gated_message(A, B, C, V):
    """GatedGCN's edge gate: the edge feature is updated and stored in edges.data, and
    the gate reads it back from there."""
    def message(edges):
        edges.data["e"] = edges.dst["h"] @ A + edges.src["h"] @ B + edges.data["e"] @ C
        sigma = torch.sigmoid(edges.data["e"])
        return {"m": sigma * (edges.src["h"] @ V), "sigma": sigma}
    return message


def gated_reduce(U):
    def reduce(nodes):
        num = torch.sum(nodes.mailbox["m"], dim=1)
        return {"h": nodes.data["h"] @ U + num / (torch.sum(nodes.mailbox["sigma"], dim=1) + EPS)}
    return reduce


def gated_oracle(graph_src, graph_dst, h, e, A, B, C, U, V):
    e_new = h[graph_dst] @ A + h[graph_src] @ B + e @ C
    sigma = torch.sigmoid(e_new)
    num = torch.zeros_like(h).index_add(0, graph_dst, sigma * (h[graph_src] @ V))
    den = torch.zeros_like(h).index_add(0, graph_dst, sigma)
    return {"h": h @ U + num / (den + EPS), "e": e_new}


@pytest.mark.parametrize("backend", BACKENDS)
def test_gated_gcn_layer_returns_node_and_edge_outputs(backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    src, dst = SRC.to(device), DST.to(device)

    def ours(h, e, A, B, C, U, V):
        nodes, edges = gnnfuse.message_passing(graph, gated_message(A, B, C, V), gated_reduce(U),
                                               ndata={"h": h}, edata={"e": e}, return_edata=True)
        assert set(nodes) == {"h"} and set(edges) == {"e"}
        return {"h": nodes["h"], "e": edges["e"]}

    weights = {k: (F, F) for k in "ABCUV"}
    assert_matches_oracle(ours, lambda **t: gated_oracle(src, dst, **t),
                          inputs(device, h=(N, F), e=(E, F), **weights))


def test_written_edge_data_is_not_returned_unless_asked_and_traces_apart():
    """The same UDFs called with and without ``return_edata`` get programs with and without
    the edge outputs: a cached trace of one form must not answer the other."""
    t = inputs("cpu", h=(N, F), e=(E, F), A=(F, F), B=(F, F), C=(F, F), U=(F, F), V=(F, F))
    graph = gnnfuse.Graph(SRC, DST, N)
    message, reduce = gated_message(t["A"], t["B"], t["C"], t["V"]), gated_reduce(t["U"])
    expected = gated_oracle(SRC, DST, **t)
    for _ in range(2):
        plain = gnnfuse.message_passing(graph, message, reduce, ndata={"h": t["h"]}, edata={"e": t["e"]})
        assert set(plain) == {"h"}
        torch.testing.assert_close(plain["h"], expected["h"], rtol=1e-9, atol=1e-12)
        nodes, edges = gnnfuse.message_passing(graph, message, reduce, ndata={"h": t["h"]},
                                               edata={"e": t["e"]}, return_edata=True)
        torch.testing.assert_close(edges["e"], expected["e"], rtol=1e-9, atol=1e-12)


def test_gated_gcn_gradcheck():
    t = inputs("cpu", h=(N, 2), e=(E, 2), A=(2, 2), B=(2, 2), C=(2, 2), U=(2, 2), V=(2, 2))
    graph = gnnfuse.Graph(SRC, DST, N)

    def run(h, e, A, B, C, U, V):
        nodes, edges = gnnfuse.message_passing(graph, gated_message(A, B, C, V), gated_reduce(U),
                                               ndata={"h": h}, edata={"e": e}, return_edata=True)
        return nodes["h"], edges["e"]

    assert torch.autograd.gradcheck(run, tuple(x.requires_grad_() for x in t.values()))


def edge_scores(W):
    """A DGL ``apply_edges`` UDF: it writes one edge feature and returns two."""
    def edge_fn(edges):
        edges.data["gate"] = torch.sigmoid(edges.data["w"] * (edges.src["h"] @ W))
        return {"score": edges.data["gate"] * edges.dst["h"], "src_h": edges.src["h"]}
    return edge_fn


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_edges_returns_per_edge_values_in_edge_order(backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    src, dst = SRC.to(device), DST.to(device)

    def ours(h, w, W):
        return gnnfuse.apply_edges(graph, edge_scores(W), ndata={"h": h}, edata={"w": w})

    def oracle(h, w, W):
        gate = torch.sigmoid(w * (h[src] @ W))
        return {"gate": gate, "score": gate * h[dst], "src_h": h[src]}

    assert_matches_oracle(ours, oracle, inputs(device, h=(N, F), w=(E, 1), W=(F, 1)))


def test_a_written_key_shadows_the_input_for_later_reads():
    t = inputs("cpu", h=(N, F), w=(E, 1))
    graph = gnnfuse.Graph(SRC, DST, N)

    def message(edges):
        edges.data["w"] = edges.data["w"] * 2.0
        return {"m": edges.src["h"] * edges.data["w"]}

    out = gnnfuse.message_passing(graph, message, lambda nodes: {"h": torch.sum(nodes.mailbox["m"], dim=1)},
                                  ndata={"h": t["h"]}, edata={"w": t["w"]})["h"]
    expected = torch.zeros(N, F, dtype=torch.float64).index_add(0, DST, t["h"][SRC] * t["w"] * 2.0)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=0)


def test_edge_data_that_is_not_per_edge_is_rejected_at_its_line():
    W = torch.randn(F, F, dtype=torch.float64)
    graph = gnnfuse.Graph(SRC, DST, N)
    h = torch.randn(N, F, dtype=torch.float64)

    def writes_a_parameter(edges):
        edges.data["e"] = W * 2.0
        return {"m": edges.src["h"]}

    with pytest.raises(gnnfuse.CompileError, match=r"(?s)edges.data\['e'\] must be assigned a per-edge.*W \* 2.0"):
        gnnfuse.apply_edges(graph, writes_a_parameter, ndata={"h": h})


def test_a_node_output_named_like_returned_edge_data_is_rejected():
    graph = gnnfuse.Graph(SRC, DST, N)
    h = torch.randn(N, F, dtype=torch.float64)

    def message(edges):
        edges.data["x"] = edges.src["h"] * 2.0
        return {"m": edges.src["h"]}

    def reduce(nodes):
        return {"e.x": torch.sum(nodes.mailbox["m"], dim=1)}

    with pytest.raises(gnnfuse.CompileError, match="clashes with edge data 'x'"):
        gnnfuse.message_passing(graph, message, reduce, ndata={"h": h}, return_edata=True)


def test_writing_other_udf_tables_is_rejected_at_its_line():
    graph = gnnfuse.Graph(SRC, DST, N)
    h = torch.randn(N, F, dtype=torch.float64)

    def writes_source_data(edges):
        edges.src["h"] = edges.src["h"] * 2.0
        return {"m": edges.src["h"]}

    def writes_node_data(nodes):
        nodes.data["h"] = torch.sum(nodes.mailbox["m"], dim=1)
        return {"h": nodes.data["h"]}

    with pytest.raises(gnnfuse.CompileError, match=r"(?s)edges.src is read-only.*edges.src\[\"h\"\] ="):
        gnnfuse.apply_edges(graph, writes_source_data, ndata={"h": h})
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)nodes.data is read-only.*nodes.data\[\"h\"\] ="):
        gnnfuse.message_passing(graph, lambda edges: {"m": edges.src["h"]}, writes_node_data, ndata={"h": h})


class GatedGCNLayer(torch.nn.Module):
    """The shape GatedGCN layers take in DGL code (benchmarking-gnns): projections in
    ``forward``, UDFs as methods; the message UDF stores the new edge feature in
    ``edges.data`` and also sends it, and the caller reads the edge data back."""

    def __init__(self, dim: int):
        super().__init__()
        self.A, self.B, self.C, self.D, self.E = (torch.nn.Linear(dim, dim).double() for _ in range(5))

    def message_func(self, edges):
        e_ij = edges.data["Ce"] + edges.src["Dh"] + edges.dst["Eh"]
        edges.data["e"] = e_ij
        return {"Bh_j": edges.src["Bh"], "e_ij": e_ij}

    def reduce_func(self, nodes):
        sigma_ij = torch.sigmoid(nodes.mailbox["e_ij"])
        weighted = torch.sum(sigma_ij * nodes.mailbox["Bh_j"], dim=1)
        return {"h": nodes.data["Ah"] + weighted / (torch.sum(sigma_ij, dim=1) + EPS)}

    def forward(self, graph: gnnfuse.Graph, h: torch.Tensor, e: torch.Tensor):
        ndata = {"Ah": self.A(h), "Bh": self.B(h), "Dh": self.D(h), "Eh": self.E(h)}
        nodes, edges = gnnfuse.message_passing(graph, self.message_func, self.reduce_func, ndata=ndata,
                                               edata={"e": e, "Ce": self.C(e)}, return_edata=True)
        return nodes["h"], edges["e"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gated_gcn_layer_written_as_dgl_methods(backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = device_for(backend)
    graph = gnnfuse.Graph(SRC, DST, N).to(device)
    src, dst = SRC.to(device), DST.to(device)
    torch.manual_seed(0)
    layer = GatedGCNLayer(F).to(device)
    params = dict(layer.named_parameters())

    def ours(h, e, **weights):
        out_h, out_e = torch.func.functional_call(layer, weights, (graph, h, e))
        return {"h": out_h, "e": out_e}

    def oracle(h, e, **w):
        def lin(name, x):
            return x @ w[f"{name}.weight"].t() + w[f"{name}.bias"]
        e_new = lin("C", e) + lin("D", h)[src] + lin("E", h)[dst]
        sigma = torch.sigmoid(e_new)
        num = torch.zeros_like(h).index_add(0, dst, sigma * lin("B", h)[src])
        den = torch.zeros_like(h).index_add(0, dst, sigma)
        return {"h": lin("A", h) + num / (den + EPS), "e": e_new}

    tensors = {**inputs(device, h=(N, F), e=(E, F)), **{k: p.detach() for k, p in params.items()}}
    assert_matches_oracle(ours, oracle, tensors)


def test_apply_edges_rejects_a_tensor_where_a_dict_belongs():
    graph = gnnfuse.Graph(SRC, DST, N)
    with pytest.raises(TypeError, match="ndata must be a dict of feature name -> tensor"):
        gnnfuse.apply_edges(graph, lambda edges: {"x": edges.src["h"]}, ndata=torch.randn(N, 2))


def test_a_message_keeping_edge_data_in_a_closure_list_is_refused():
    """A message that stores its per-edge value in a list it closes over left gnnfuse's
    symbolic value there, not the [E, F] tensor DGL's eager call keeps; it is refused."""
    g = gnnfuse.Graph(SRC, DST, N)
    h = inputs("cpu", h=(N, F))["h"]
    kept = []

    def message(edges):
        kept.append(edges.src["h"] * 2.0)
        return {"m": edges.src["h"]}
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)closure variable 'kept'.*kept.append"):
        gnnfuse.apply_edges(g, message, ndata={"h": h})
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)closure variable 'kept'.*kept.append"):
        gnnfuse.message_passing(g, message, lambda nodes: {"h": nodes.mailbox["m"].sum(1)}, ndata={"h": h})
    assert kept == []
