"""Max and min aggregation propagate NaN as torch's ``scatter_reduce("amax"/"amin",
include_self=False)`` -- PyG's max and min -- does, forward and backward, on both
backends. The Triton kernels once skipped NaN (hardware fmax): a vertex whose only
in-neighbour was NaN got -inf and a NaN among finite neighbours was ignored.

Backward semantics (torch's): a vertex whose max is NaN sends NaN to every in-edge; a
finite max goes to its arg-extreme edges, split evenly among ties."""
from __future__ import annotations

import pytest
import torch

import gnnfuse

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAN = float("nan")


@gnnfuse.vertex
def neighbour_max(v):
    return max([u.h for u in v.innbs])


@gnnfuse.vertex
def neighbour_min(v):
    return min([u.h for u in v.innbs])


def nan_graph() -> tuple[gnnfuse.Graph, torch.Tensor]:
    """(graph, features). Vertex 1's only in-neighbour (0) is NaN in column 0; vertex 2
    sees NaN among finite neighbours; vertex 3 has a tie; vertex 4 a 150-edge row (over
    one edge chunk) whose only NaN comes last; vertex 5 has no in-edges; vertex 6 sees
    +-inf and no NaN."""
    pairs = [(0, 1), (0, 2), (3, 2), (4, 2), (6, 3), (7, 3)] + [(8, 4)] * 149 + [(0, 4), (9, 6), (10, 6)]
    src, dst = torch.tensor(pairs).t()
    x = torch.randn(11, 2, dtype=torch.float64)
    x[0, 0] = NAN
    x[6] = x[7] = torch.tensor([1.5, -2.0], dtype=torch.float64)   # ties at vertex 3
    x[9] = torch.tensor([float("inf"), float("-inf")], dtype=torch.float64)
    x[10] = torch.tensor([float("-inf"), float("inf")], dtype=torch.float64)
    return gnnfuse.Graph(src, dst, 11).to(DEVICE), x.to(DEVICE)


def torch_oracle(x: torch.Tensor, graph: gnnfuse.Graph, reduce: str) -> torch.Tensor:
    index = graph.dst.view(-1, 1).expand(-1, x.shape[1])
    return x.new_zeros(x.shape).scatter_reduce(0, index, x[graph.src], reduce, include_self=False)


@pytest.mark.parametrize("reduce, fn", [("amax", neighbour_max), ("amin", neighbour_min)])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_max_and_min_propagate_nan_like_torch(reduce, fn, backend, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    graph, x = nan_graph()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = fn(graph, {"h": xa}), torch_oracle(xb, graph, reduce)
    torch.testing.assert_close(out, expected, equal_nan=True)
    assert out[1, 0].isnan() and out[2, 0].isnan() and out[4, 0].isnan() and not out[3].isnan().any()
    seed = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * seed).sum().backward()
    (expected * seed).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, equal_nan=True)
    assert xa.grad[[3, 4], 0].isnan().all() and not xa.grad[[6, 7, 9, 10]].isnan().any()


ACTIVATIONS = {
    "relu": torch.relu,
    "leaky_relu": lambda t: torch.nn.functional.leaky_relu(t, 0.2),
    "elu": torch.nn.functional.elu,
    "clamp_min": lambda t: t.clamp(min=0.5),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_activations_treat_nan_like_torch(name, backend, monkeypatch):
    """A NaN feature stays NaN through each activation, and its gradient takes the branch
    torch's backward takes for NaN (relu and elu pass it, leaky_relu scales it by the slope,
    clamp blocks it). Triton's maximum once turned relu(NaN) into 0."""
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    act = ACTIVATIONS[name]

    @gnnfuse.vertex
    def activated_sum(v):
        return sum([act(u.h) for u in v.innbs])

    graph = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3).to(DEVICE)
    x = torch.tensor([[NAN, -1.0], [0.25, 2.0], [-0.5, NAN]], dtype=torch.float64, device=DEVICE)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = activated_sum(graph, {"h": xa})
    expected = torch.zeros_like(xb).index_add(0, graph.dst, act(xb)[graph.src])
    torch.testing.assert_close(out, expected, equal_nan=True)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, equal_nan=True)



@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_max_gradients_survive_a_lossy_saved_tensor_hook(backend, monkeypatch):
    """A saved-tensor hook that keeps float64 tensors as float32 (activation compression)
    handed EdgeConv's backward the saved ``nn`` product and the saved maximum each rounded
    on its own: the tanh it recomputed from the rounded product matched no rounded
    maximum, so every in-edge's gradient was 0 / 0 = NaN (40 of 40 input gradients), where
    PyG's EdgeConv under the same hook is within float32's rounding of the exact one."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    import gnnfuse.nn
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 10, (2, 30), generator=gen).to(DEVICE)
    x = torch.randn(10, 4, dtype=torch.float64, generator=gen).to(DEVICE)
    layers = []
    for lib in (pyg_nn, gnnfuse.nn):
        torch.manual_seed(1)
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.Tanh())
        layers.append(torch.nn.Sequential(lib.EdgeConv(mlp, aggr="max").double().to(DEVICE)))
        # and a max of gathered features, which compares them with the saved maximum
        torch.manual_seed(2)
        layers[-1].append(lib.SAGEConv(3, 2, aggr="max").double().to(DEVICE))

    def pack(t: torch.Tensor):
        return t.dtype, t.float() if t.dtype == torch.float64 else t

    grads = []
    for layer in layers:
        xa = x.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda packed: packed[1].to(packed[0])):
            out = layer[1](layer[0](xa, edge_index), edge_index)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum().backward()
        grads.append([xa.grad] + [p.grad for p in layer.parameters()])
    for theirs, ours in zip(*grads):
        assert not ours.isnan().any()
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
