"""The host work the Triton backend does for every new graph (a graph-classification
step's batch) stays what the graph needs: its launch plans share the constant tensors
every plan holds (`executor._one_element`) instead of making their own."""
from __future__ import annotations

import torch
from oracle_check import device_for

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.backend.triton import executor as triton_executor


def _molecules(seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of a few small graphs: every row short, none split into segments."""
    gen = torch.Generator().manual_seed(seed)
    nodes = 30
    src = torch.randint(0, nodes, (60,), generator=gen)
    dst = (src + torch.randint(1, nodes, (60,), generator=gen)) % nodes
    return torch.stack([src, dst]).to(device), torch.randn(nodes, 8, generator=gen, dtype=torch.float64).to(device)


def _plans(graph: gnnfuse.Graph) -> list:
    return [entry[1] for per_graph in triton_executor._LAUNCHES._plans.values()
            for g, entry in per_graph.items() if g is graph and isinstance(entry[1], triton_executor._Launch)]


def test_the_plans_of_new_graphs_share_their_stand_ins_and_templates(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    layer = gnn.GINConv(torch.nn.Linear(8, 4)).double().to(device)
    plans = []
    for seed in (0, 1):
        edge_index, x = _molecules(seed, device)
        graph = gnnfuse.Graph.coerce(edge_index, num_nodes=x.shape[0])
        x.requires_grad_()
        layer(x, graph).sum().backward()
        plans.append(_plans(graph))
    first, second = plans
    assert first and second
    # a CSR plan without split rows takes a workspace and counters that it never touches
    walks = [[plan for plan in plans if len(plan.after) == 2 and plan.after[1].dtype == torch.int32]
             for plans in (first, second)]
    assert all(walks)
    walks = walks[0] + walks[1]
    assert len({tuple(id(t) for t in plan.after) for plan in walks}) == 1, "plans made stand-ins of their own"
    assert [(t.dtype, t.numel(), t.any().item()) for t in walks[0].after] == [(torch.float64, 1, False),
                                                                             (torch.int32, 1, False)]
    bases = {id(plan.template._base) for plan in first + second if plan.template.dtype == torch.float64}
    assert len(bases) == 1, "plans made a template base of their own"
    for plan in first + second:
        assert plan.template.shape == plan.out_shape and plan.template.dtype == plan.out_dtype


def test_constants_made_inside_a_transform_are_not_kept():
    """A tensor made inside a torch.func transform is the transform's wrapper, unusable
    after it: the shared constants are made fresh there and not kept."""
    triton_executor._ONE_ELEMENT.pop((torch.float16, torch.device("cpu")), None)

    def inside(x):
        triton_executor._one_element(torch.float16, torch.device("cpu"))
        return (x * x).sum()
    torch.func.grad(inside)(torch.ones(3))
    assert (torch.float16, torch.device("cpu")) not in triton_executor._ONE_ELEMENT
    kept = triton_executor._one_element(torch.float16, torch.device("cpu"))
    assert kept is triton_executor._one_element(torch.float16, torch.device("cpu"))
    assert kept[0].shape == (1,) and kept[1].shape == () and kept[1]._base is kept[0]
