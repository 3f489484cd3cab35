"""The IO rule (issue #13): no compiled forward or backward program of a gnnfuse.nn layer,
a registered model or an example's layer writes a per-edge tensor of more than H
elements per edge (H = heads for attention layers, 1 otherwise) that is computed from
gathered vertex rows. Read from the plans `gnnfuse.explain` reports -- the partition the
Triton backend runs -- so a change that brings back an |E| x H x D tensor fails here,
not in a benchmark. Exempt (passes/io_rule.py): per-edge values computed from the
user's edge inputs and parameters alone, such as GAT's lin_edge(edge_attr)."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from oracle_check import device_for
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import gnnfuse
from gnnfuse import nn as gnn
from gnnfuse.passes.fusion import MAX_EDGE_FEATURES

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
N, F_IN, EDGE_DIM, RELATIONS = 7, 6, 3, 3
HEADS, CHANNELS = 4, 8      # attention layers: D = CHANNELS > H = HEADS, so a [E, H, D] tensor shows


def _graph(typed: bool = False) -> gnnfuse.Graph:
    src = torch.tensor([0, 1, 2, 3, 4, 5, 6, 0, 2, 4, 1])
    dst = torch.tensor([1, 2, 3, 4, 5, 6, 0, 3, 5, 1, 1])
    etype = torch.arange(len(src)) % RELATIONS if typed else None
    return gnnfuse.Graph(src, dst, N, edge_type=etype, num_edge_types=RELATIONS if typed else None)


def _mlp(width_in: int, width_out: int = 5) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, width_out), nn.ReLU(), nn.Linear(width_out, width_out))


def _edge_attr(graph: gnnfuse.Graph) -> torch.Tensor:
    return torch.randn(graph.num_edges, EDGE_DIM)


def _example(module: str, attr: str):
    """A class of an example script. The examples import their sibling ``common`` by bare
    name, as benchmarks/ scripts import theirs: another test's ``common`` must not be the
    one found, and the examples' must not stay behind for the next test."""
    if module not in sys.modules:
        other = sys.modules.pop("common", None)
        sys.path.insert(0, str(EXAMPLES))
        try:
            __import__(module)
        finally:
            sys.path.remove(str(EXAMPLES))
            sys.modules.pop("common", None)
            if other is not None:
                sys.modules["common"] = other
    return getattr(sys.modules[module], attr)


def _similarity_attention(x: torch.Tensor, graph: gnnfuse.Graph) -> torch.Tensor:
    layer = _example("custom_attention", "SimilarityAttention")(F_IN, CHANNELS)
    sim = torch.randn(graph.num_edges, 1)   # a user edge input, [E, 1]
    return layer(x, graph, sim)


HETERO_EDGES = {("a", "r", "b"): torch.tensor([[0, 1, 2, 3, 0], [0, 1, 2, 0, 2]]),
                ("b", "s", "a"): torch.tensor([[0, 1, 2, 2], [1, 2, 3, 0]]),
                ("a", "t", "a"): torch.tensor([[0, 1, 2], [1, 2, 3]])}
HETERO_METADATA = (["a", "b"], list(HETERO_EDGES))


def _hetero(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A dict-taking layer on node types a (the first 4 rows of x) and b (the other 3)."""
    out = layer({"a": x[:4], "b": x[4:]}, HETERO_EDGES)
    return torch.cat([out[t] for t in sorted(out)])


def _rgat(x: torch.Tensor, graph: gnnfuse.Graph) -> torch.Tensor:
    layer = gnn.RGATConv(F_IN, CHANNELS, RELATIONS, heads=HEADS)
    return layer(x, torch.stack([graph.src, graph.dst]), graph.edge_type)


# name -> (heads H, run(x, graph) -> output); every layer in gnnfuse.nn.__all__ appears
LAYERS: dict[str, tuple[int, Callable[[torch.Tensor, gnnfuse.Graph], torch.Tensor]]] = {
    "GCNConv": (1, lambda x, g: gnn.GCNConv(F_IN, CHANNELS)(x, g)),
    "GATConv": (HEADS, lambda x, g: gnn.GATConv(F_IN, CHANNELS, heads=HEADS)(x, g)),
    "GATConv-edge_dim": (HEADS, lambda x, g: gnn.GATConv(F_IN, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM)(
        x, g, _edge_attr(g))),
    "GATConv-mean-heads-no-loops": (HEADS, lambda x, g: gnn.GATConv(
        F_IN, CHANNELS, heads=HEADS, concat=False, add_self_loops=False)(x, g)),
    "GATv2Conv": (HEADS, lambda x, g: gnn.GATv2Conv(F_IN, CHANNELS, heads=HEADS)(x, g)),
    "GATv2Conv-no-loops": (HEADS, lambda x, g: gnn.GATv2Conv(F_IN, CHANNELS, heads=HEADS, add_self_loops=False)(x, g)),
    "GATv2Conv-edge_dim": (HEADS, lambda x, g: gnn.GATv2Conv(F_IN, CHANNELS, heads=HEADS, edge_dim=EDGE_DIM)(
        x, g, _edge_attr(g))),
    "GATv2Conv-share_weights": (HEADS, lambda x, g: gnn.GATv2Conv(F_IN, CHANNELS, heads=HEADS,
                                                                   share_weights=True)(x, g)),
    "SAGEConv-mean": (1, lambda x, g: gnn.SAGEConv(F_IN, CHANNELS)(x, g)),
    "SAGEConv-max": (1, lambda x, g: gnn.SAGEConv(F_IN, CHANNELS, aggr="max")(x, g)),
    "SAGEConv-sum": (1, lambda x, g: gnn.SAGEConv(F_IN, CHANNELS, aggr="sum")(x, g)),
    "GINConv": (1, lambda x, g: gnn.GINConv(_mlp(F_IN), train_eps=True)(x, g)),
    "GraphConv": (1, lambda x, g: gnn.GraphConv(F_IN, CHANNELS)(x, g)),
    "GraphConv-max": (1, lambda x, g: gnn.GraphConv(F_IN, CHANNELS, aggr="max")(x, g)),
    "APPNP": (1, lambda x, g: gnn.APPNP(K=2, alpha=0.1)(x, g)),
    "SGConv": (1, lambda x, g: gnn.SGConv(F_IN, CHANNELS, K=2)(x, g)),
    "TAGConv": (1, lambda x, g: gnn.TAGConv(F_IN, CHANNELS, K=2)(x, g)),
    "ChebConv": (1, lambda x, g: gnn.ChebConv(F_IN, CHANNELS, K=3)(x, g)),
    "EdgeConv": (1, lambda x, g: gnn.EdgeConv(_mlp(2 * F_IN))(x, g)),
    "RGCNConv": (1, lambda x, g: gnn.RGCNConv(F_IN, CHANNELS, RELATIONS)(x, g)),
    "RGCNConv-bases": (1, lambda x, g: gnn.RGCNConv(F_IN, CHANNELS, RELATIONS, num_bases=2)(x, g)),
    "FastRGCNConv": (1, lambda x, g: gnn.FastRGCNConv(F_IN, CHANNELS, RELATIONS)(x, g)),
    "RGATConv": (HEADS, _rgat),
    "HGTConv": (HEADS, lambda x, g: _hetero(gnn.HGTConv(F_IN, CHANNELS * HEADS, HETERO_METADATA, heads=HEADS), x)),
    "HeteroConv": (1, lambda x, g: _hetero(gnn.HeteroConv({t: gnn.SAGEConv(F_IN, CHANNELS) for t in HETERO_EDGES}), x)),
    "CGATConv": (HEADS, lambda x, g: gnn.CGATConv(F_IN, CHANNELS, heads=HEADS)(x, g)),
    "DotGATConv": (HEADS, lambda x, g: gnn.DotGATConv(F_IN, CHANNELS, heads=HEADS)(x, g)),
    "MLPAggConv": (1, lambda x, g: gnn.MLPAggConv(F_IN, CHANNELS)(x, g)),
    "NGCFConv": (1, lambda x, g: gnn.NGCFConv(F_IN, CHANNELS)(x, g)),
    **{f"model-{name}": (8 if name == "gat" else 1,     # the registered GAT has 8 heads
                         lambda x, g, name=name: gnn.build_model(name, F_IN, 3)(x, g))
       for name in gnn.model_names()},
    "example-gat_vertex": (HEADS, lambda x, g: _example("gat_vertex", "GATLayer")(F_IN, CHANNELS, HEADS)(x, g)),
    "example-gat_message": (HEADS, lambda x, g: _example("gat_message", "MessageGATLayer")(F_IN, CHANNELS, HEADS)(
        x, g)),
    "example-custom_attention": (1, _similarity_attention),
}


# Layers whose per-edge work is a matmul of gathered rows: the message is [E, F] x [F, C]
# per edge (EdgeConv's MLP on (x_i, x_j - x_i)), which the fused units cannot evaluate in
# registers (they hold elementwise work and matmuls of the user's edge inputs, not
# matmuls of gathered rows: an in-kernel tl.dot is not built yet). Strict: fixing one
# fails here until it is taken off the list. (R-GCN's x_j @ W_r left the list: it runs
# as a typed aggregation, whose edge stage is one row scatter writing nothing per edge.)
MATMUL_ON_EDGES = {"EdgeConv"}
# Layers whose relation-typed transforms are compacted per (vertex, relation) pair
# (passes/compact.py): the forward gathers the pair rows inside the kernels, but the
# backward sums each edge's gradient row into its pair with a torch scatter, which reads
# an [E, H * D] gradient; a fused reduce by pair is not built yet. (HGT's keys and values
# left the list: they are source tables of the graph over pairs, passes/pair_sources.py.
# RGAT transforms both endpoints per relation, and that graph has pairs on one side.)
PAIR_GRADIENT_ON_EDGES = {"RGATConv"}


def _plans(run, typed: bool):
    graph = _graph(typed)
    x = torch.randn(N, F_IN, requires_grad=True)
    report = gnnfuse.explain(run, x, graph)
    return [plan for program in report.programs for plan in (program.forward, program.backward) if plan]


def test_every_layer_of_gnnfuse_nn_is_listed():
    covered = {name.split("-")[0] for name in LAYERS}
    public_layers = {n for n in gnn.__all__ if n[0].isupper() and n not in ("Hyperparameters", "ModelSpec", "GCN")}
    assert public_layers <= covered


def _known_gap(name: str):
    if name in MATMUL_ON_EDGES:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="per-edge matmul of gathered rows"))
    if name in PAIR_GRADIENT_ON_EDGES:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="pair gradients summed from edges"))
    return name


@pytest.mark.parametrize("name", [_known_gap(name) for name in LAYERS])
def test_no_wide_edge_tensor_from_gathered_rows(name):
    heads, run = LAYERS[name]
    torch.manual_seed(0)
    plans = _plans(run, typed=name.startswith(("RGCN", "FastRGCN", "RGAT")))
    wide = [f"{plan.phase}: {t.value.op} {t.value.residency.name}{list(t.value.shape)}"
            for plan in plans for t in plan.edge_tensors if t.width > heads and not t.exempt]
    assert wide == [], f"{name} writes per-edge tensors wider than H={heads}: {wide}"


SOFTMAX_LAYERS = ["GATv2Conv", "GATv2Conv-no-loops", "GATv2Conv-edge_dim", "GATv2Conv-share_weights", "DotGATConv",
                  "GATConv", "example-gat_vertex", "example-gat_message"]


@pytest.mark.parametrize("name", SOFTMAX_LAYERS)
def test_softmax_keeps_only_per_vertex_statistics_for_the_backward(name):
    """The forward saves no per-edge value for the backward: its softmax keeps the
    per-(vertex, head) max and sum, and the backward recomputes the [E, H] scores from
    the saved vertex rows (autodiff's recomputed feature sums)."""
    heads, run = LAYERS[name]
    torch.manual_seed(0)
    [program] = gnnfuse.explain(run, torch.randn(N, F_IN, requires_grad=True), _graph()).programs
    assert [t.value.op for t in program.forward.edge_tensors if t.saved] == []
    saved = program.call.compiled.backward_for(program.call.wrt).saved
    assert [v.op for v in saved if v.residency.is_edge_rowed and v.op != "input"] == []   # edge inputs: the user's


@pytest.mark.parametrize("name", ["GATConv", "GATConv-edge_dim", "GATConv-mean-heads-no-loops", "GATv2Conv",
                                  "GATv2Conv-no-loops", "GATv2Conv-edge_dim", "GATv2Conv-share_weights", "DotGATConv",
                                  "example-gat_vertex", "example-gat_message"])
def test_attention_scores_never_reach_memory(name, monkeypatch):
    """The [E, H] attention scores are recomputed from gathered rows in every unit that
    reads them (passes.fusion's tiled feature sums): the max pass, the sum pass and the
    weighted aggregation of the forward, and the backward units. Neither program writes
    anything per edge. That is the default plan on graphs of millions of edges, forced
    here (backend/forced_schedule.py)."""
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", "1")
    heads, run = LAYERS[name]
    torch.manual_seed(0)
    [program] = gnnfuse.explain(run, torch.randn(N, F_IN, requires_grad=True), _graph()).programs
    written = [f"{plan.phase}: {t.value.op}{list(t.value.shape)}" for plan in (program.forward, program.backward)
               for t in plan.edge_tensors]
    assert written == []


def test_hgt_writes_nothing_per_edge(monkeypatch):
    """HGT with its scores tiled and its walks over the CSR (the plan of graphs of
    millions of edges; this 12-edge graph would take the edge-parallel schedule): keys and
    values are pair tables (passes/pair_sources.py), the relation prior is read by each
    edge's type inside the kernels (`fusion.type_gather`) and its gradient rides the
    backward's walk (passes/type_sums.py), so neither program writes a per-edge tensor,
    exempt or not."""
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", "1")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    heads, run = LAYERS["HGTConv"]
    torch.manual_seed(0)
    [program] = gnnfuse.explain(run, torch.randn(N, F_IN, requires_grad=True), _graph()).programs
    written = [f"{plan.phase}: {t.value.op}{list(t.value.shape)}" for plan in (program.forward, program.backward)
               for t in plan.edge_tensors]
    assert program.backward is not None and written == []


def test_report_gives_largest_edge_tensor_and_total_bytes():
    """C-GAT's pairwise edge weights (one per edge and head) are written, so report them."""
    graph = _graph()
    x = torch.randn(N, F_IN, requires_grad=True)
    report = gnnfuse.explain(gnn.CGATConv(F_IN, CHANNELS, heads=HEADS, add_self_loops=False), x, graph)
    [program] = report.programs
    for plan in (program.forward, program.backward):
        largest = plan.largest_edge_tensor
        assert largest is not None and largest.width == HEADS   # one per edge and head
        assert plan.edge_bytes(largest) == graph.num_edges * HEADS * 4
        assert plan.edge_tensor_bytes == sum(graph.num_edges * t.width * 4 for t in plan.edge_tensors)
    text = str(report)
    assert text.count("edge-rowed tensors written:") == 2
    assert f"EDGE[{graph.num_edges}, {HEADS}]" in text


def test_exemption_covers_only_values_free_of_gathered_rows():
    """An edge input times a parameter (as lin_edge(edge_attr)) is exempt, and so is the
    gradient returned for the edge input; a matmul of per-edge work on gathered rows is
    not (it is what keeps EdgeConv on the known list). The edge input is wider than
    passes.fusion.MAX_EDGE_FEATURES, so its matmul is stored, not unrolled in a kernel."""
    wide = MAX_EDGE_FEATURES + 1
    w, w2 = torch.randn(wide, CHANNELS, requires_grad=True), torch.randn(CHANNELS, 2, requires_grad=True)

    @gnnfuse.vertex
    def layer(v):
        return sum([torch.relu(e.a @ w + e.src.h) @ w2 for e in v.inedges])

    graph = _graph()
    h = torch.randn(N, CHANNELS, requires_grad=True)
    a = torch.randn(graph.num_edges, wide, requires_grad=True)
    [program] = gnnfuse.explain(layer, graph, {"h": h}, {"a": a}).programs
    [lin_edge] = [t for t in program.forward.edge_tensors if t.exempt]
    assert lin_edge.value.op == "matmul" and lin_edge.value.inputs[0].attrs["key"] == "e.a"
    wide = [t.value.op for t in program.forward.edge_tensors if not t.exempt]
    assert "relu" in wide and "matmul" in wide        # relu(...) @ w2: per-edge work on gathered rows
    returned = program.backward.program.outputs["grad:e.a"]
    assert [t.exempt for t in program.backward.edge_tensors if t.value is returned] == [True]
    assert all(not t.exempt for t in program.backward.edge_tensors if t.value is not returned)


@pytest.mark.parametrize("name", ["GATConv-edge_dim", "GATv2Conv-edge_dim"])
def test_edge_features_are_projected_in_registers(name):
    """With edge_dim <= MAX_EDGE_FEATURES, GAT and GATv2 trace lin_edge(edge_attr) into the
    program, so nothing per edge wider than max(H, edge_dim) exists anywhere: not as a
    program input, not written by the forward or the backward (exempt or not), not saved
    for the backward -- by the program or by torch's autograd around it (lin_edge run
    in torch would save its [E, H * D] result). The looped edge_attr rows themselves are
    edge_dim wide."""
    heads, run = LAYERS[name]
    limit = max(heads, EDGE_DIM)
    assert EDGE_DIM <= MAX_EDGE_FEATURES
    torch.manual_seed(0)
    graph, x = _graph(), torch.randn(N, F_IN, requires_grad=True)
    [program] = gnnfuse.explain(run, x, graph).programs
    inputs = [f"{key}{list(v.shape)}" for key, v in program.forward.program.inputs.items()
              if v.residency.is_edge_rowed and math.prod(v.shape) > limit]
    written = [f"{plan.phase}: {t.value.op}{list(t.value.shape)}" for plan in (program.forward, program.backward)
               for t in plan.edge_tensors if t.width > limit]
    saved = [v.op for v in program.call.compiled.backward_for(program.call.wrt).saved
             if v.residency.is_edge_rowed and math.prod(v.shape) > limit]
    assert (inputs, written, saved) == ([], [], [])
    looped_edges = int((graph.src != graph.dst).sum()) + N
    held: list[list[int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dim() and t.shape[0] == looped_edges and t[0].numel() > limit:
            held.append(list(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(x, graph)
    out.sum().backward()
    assert held == []


# The plain-PyTorch GCN baseline (gnnfuse.nn.reference.GCN) is registered to compare
# against, not compiled: its x[src] * norm saves an [E, hidden] product, as PyG's does.
EAGER_BASELINES = {"model-gcn-reference"}
# Graphs for measuring tensors by their row count: every edge count (with or without the
# self-loops a layer adds) differs from every vertex, pair and type count and from N.
MEASURED_EDGES = 41
MEASURED_HETERO_EDGES = {("a", "r", "b"): 23, ("b", "s", "a"): 19, ("a", "t", "a"): 17}
HETERO_SIZES = {"a": 4, "b": 3}
# Ops that make no new storage: a view of a tensor counted where it was made.
VIEW_OPS = ("view", "alias", "detach", "slice", "select", "split", "unbind", "expand", "permute", "squeeze",
            "transpose", "aten.t.", "set_")


def _measured_graph(typed: bool) -> gnnfuse.Graph:
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, N, (2, MEASURED_EDGES), generator=gen)
    etype = torch.arange(MEASURED_EDGES) % RELATIONS if typed else None
    return gnnfuse.Graph(src, dst, N, edge_type=etype, num_edge_types=RELATIONS if typed else None)


def _measured_hetero_edges() -> dict[tuple[str, str, str], torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return {(s, r, d): torch.stack([torch.randint(0, HETERO_SIZES[s], (count,), generator=gen),
                                    torch.randint(0, HETERO_SIZES[d], (count,), generator=gen)])
            for (s, r, d), count in MEASURED_HETERO_EDGES.items()}


def _edge_row_counts(graph: gnnfuse.Graph, hetero: dict[tuple[str, str, str], torch.Tensor] | None) -> set[int]:
    """Row counts a per-edge tensor of the layer can have: its edges, with self-loops added
    (after removing the graph's own) or appended, and, for dict-taking layers, each edge
    type's and all of them together."""
    if hetero is None:
        return {graph.num_edges, graph.num_edges + N, int((graph.src != graph.dst).sum()) + N}
    counts = {sum(e.shape[1] for e in hetero.values())}
    for (_, _, dst), e in hetero.items():
        counts |= {e.shape[1], e.shape[1] + HETERO_SIZES[dst], int((e[0] != e[1]).sum()) + HETERO_SIZES[dst]}
    return counts


class _EdgeRowedAllocations(TorchDispatchMode):
    """Floating tensors with one of ``rows`` rows and more than ``limit`` elements per row
    that any op makes, in torch or around a kernel (its output buffer), and their bytes
    per phase."""

    def __init__(self, rows: set[int], limit: int):
        super().__init__()
        self.rows, self.limit, self.phase, self.found = rows, limit, "forward", []
        self.bytes = {"forward": 0, "backward": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(view in str(func) for view in VIEW_OPS):
            made = [t for t in tree_flatten(out)[0] if _wide_edge_rowed(t, self.rows, self.limit)]
            self.found += [f"{self.phase}: {func} {list(t.shape)}" for t in made]
            self.bytes[self.phase] += sum(t.numel() * t.element_size() for t in made)
        return out


def _wide_edge_rowed(t: object, rows: set[int], limit: int) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0 and t.shape[0] in rows
            and t[0].numel() > limit)


@pytest.mark.parametrize("name", [_known_gap(name) for name in LAYERS if name not in EAGER_BASELINES])
def test_measured_tensors_respect_the_rule(name, monkeypatch):
    """The rule as it holds in memory, not in the plans `explain` derives: running the
    layer's forward and backward on the Triton backend (its CPU interpreter here), no op
    makes -- and torch's autograd saves -- a floating tensor with |E| rows and more than H
    elements per row. The plans cannot see per-edge work a layer does in torch around its
    compiled programs: a GCNConv that saved x[src] * x[src] for the backward passed every
    other test of this file. Edge inputs here are at most H wide, so nothing is exempt."""
    heads, run = LAYERS[name]
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    hetero = _measured_hetero_edges() if name in ("HGTConv", "HeteroConv") else None
    if hetero is not None:
        monkeypatch.setattr(sys.modules[__name__], "HETERO_EDGES", {k: e.to(device) for k, e in hetero.items()})
    graph = _measured_graph(typed=name.startswith(("RGCN", "FastRGCN", "RGAT")))
    rows = _edge_row_counts(graph, hetero)
    assert not rows & {N, *HETERO_SIZES.values()}
    with torch.device(device):
        graph = graph.to(device)
        torch.manual_seed(0)
        x = torch.randn(N, F_IN, requires_grad=True)
        run(x, graph).sum().backward()       # compiles, and runs any first pass on torch ops
        saved: list[str] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            if _wide_edge_rowed(t, rows, heads):
                saved.append(f"saved: {list(t.shape)}")
            return t

        made = _EdgeRowedAllocations(rows, heads)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), made:
            out = run(x, graph)
            made.phase = "backward"
            out.sum().backward()
    assert (saved, made.found) == ([], []), f"{name} holds per-edge tensors wider than H={heads}"


def test_cpu_backend_report_lists_what_its_kernels_write(monkeypatch):
    """The CPU backend has no shared-reduce kernel: it writes the per-edge operand of a
    sum over every edge (GATv2's attention-vector gradient, [E, H, D]) and sums it with a
    torch op (backend/cpu/executor.py `_per_edge_part`). `explain` reports the units that
    backend runs, so it lists that tensor: the per-edge bytes it reports for each program
    are the bytes the run allocates per edge."""
    pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    heads, run = LAYERS["GATv2Conv"]
    graph = _measured_graph(typed=False)
    torch.manual_seed(0)
    x = torch.randn(N, F_IN, requires_grad=True)
    [program] = gnnfuse.explain(run, x, graph).programs
    made = _EdgeRowedAllocations(_edge_row_counts(graph, None), 0)
    with made:
        out = run(x, graph)
        made.phase = "backward"
        out.sum().backward()
    assert program.backward.largest_edge_tensor.width == HEADS * CHANNELS
    assert (program.forward.edge_tensor_bytes, program.backward.edge_tensor_bytes) == \
        (made.bytes["forward"], made.bytes["backward"])


def test_reference_report_says_its_plans_are_the_triton_backends(monkeypatch):
    """The torch reference executor runs a program op by op and writes every per-edge
    value (GATv2Conv's forward: [E, H, D] sums and products); the plans `explain` prints
    for such a call are the Triton backend's, whose per-edge bytes are not what this run
    allocated, so the executor line says whose they are."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    heads, run = LAYERS["GATv2Conv"]
    graph = _measured_graph(typed=False)
    torch.manual_seed(0)
    x = torch.randn(N, F_IN, requires_grad=True)
    report = gnnfuse.explain(run, x, graph)
    made = _EdgeRowedAllocations(_edge_row_counts(graph, None), heads)
    with made:
        run(x, graph)
    assert made.found and report.programs[0].forward.edge_tensor_bytes < made.bytes["forward"]
    assert "executor: reference (" in str(report) and "the plans below are the Triton backend's" in str(report)
