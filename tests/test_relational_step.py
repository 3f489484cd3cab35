"""What one relational training step costs on the host, and Graphiler's R-GCN UDF against
`gnnfuse.nn.RGCNConv` (issue #16).

- Graphiler's UDF (``bmm(edges.src['h'].unsqueeze(1), W[edges.data['_TYPE']]) * norm``,
  summed) compiles to the layer's plan: the same ops forward and backward, and, on the
  Triton backend, the same kernel launches and torch ops per step;
- after the first step nothing is read back from the device (no ``tolist``/``item``/
  ``int(tensor)``, no ``unique``): the (vertex, relation) pairs and the segment matmul's
  tile maps are cached per graph, for the graph's edge types and for a per-edge index
  tensor alike;
- the host work of a step (Python calls) does not grow with the number of relations.
"""
from __future__ import annotations

import collections
import gc
import math
import sys

import pytest
import torch
from oracle_check import device_for

import gnnfuse
from gnnfuse.backend import tuned_schedule
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.backend.triton import scatter_rows
from gnnfuse.backend.triton import segment_matmul as sm
from gnnfuse.nn import RGCNConv
from gnnfuse.ir.ops.typed_aggregate import ORDER_ENV, ORDERS

f64 = torch.float64


def relational_graph(relations: int, device: str = "cpu", seed: int = 0) -> gnnfuse.Graph:
    g = torch.Generator().manual_seed(seed)
    n, e = 12, 80
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    etype = torch.randint(0, relations, (e,), generator=g)
    return gnnfuse.Graph(src.to(device), dst.to(device), n, edge_type=etype.to(device), num_edge_types=relations)


def mean_norm(graph: gnnfuse.Graph, dtype: torch.dtype) -> torch.Tensor:
    """DGL's [E, 1] per-relation mean norm ``1 / |N_r(v)|``, as Graphiler's R-GCN reads it."""
    key = graph.dst * graph.num_edge_types + graph.edge_type
    return (1.0 / torch.bincount(key, minlength=graph.num_nodes * graph.num_edge_types)[key].to(dtype))[:, None]


class GraphilerRGCN(torch.nn.Module):
    """Graphiler's R-GCN layer as published for DGL, run by `gnnfuse.message_passing`
    unchanged, with RGCNConv's parameters (so one state dict loads into both)."""

    def __init__(self, layer: RGCNConv):
        super().__init__()
        self.weight, self.root, self.bias = layer.weight, layer.root, layer.bias

    def forward(self, x: torch.Tensor, graph: gnnfuse.Graph, norm: torch.Tensor) -> torch.Tensor:
        weight = self.weight

        def message(edges):
            w = weight[edges.data["_TYPE"]]
            return {"m": torch.bmm(edges.src["h"].unsqueeze(1), w).squeeze(1) * edges.data["norm"]}

        def reduce(nodes):
            return {"h": torch.sum(nodes.mailbox["m"], dim=1)}

        def update(nodes):        # the root term and bias (RGCNConv's) as DGL's apply_node_func
            return {"h": nodes.data["h"] + nodes.data["x"] @ root + bias}
        root, bias = self.root, self.bias
        return gnnfuse.message_passing(graph, message, reduce, update, ndata={"h": x, "x": x},
                                       edata={"_TYPE": graph.edge_type, "norm": norm})["h"]


def two_layers(relations: int, device: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """(graph, x, nn step, UDF step): each step runs RGCNConv(mean) -> ReLU -> RGCNConv
    forward and backward, through the layers or through Graphiler's UDF on the same weights."""
    torch.manual_seed(seed)
    graph = relational_graph(relations, device, seed)
    convs = [RGCNConv(8, 16, relations).to(device, dtype), RGCNConv(16, 4, relations).to(device, dtype)]
    udfs = [GraphilerRGCN(c) for c in convs]
    x = torch.randn(graph.num_nodes, 8, dtype=dtype, device=device, requires_grad=True)
    norm = mean_norm(graph, dtype)

    def nn_step():
        out = convs[1](torch.relu(convs[0](x, graph)), graph)
        out.square().sum().backward()
        return out

    def udf_step():
        out = udfs[1](torch.relu(udfs[0](x, graph, norm)), graph, norm)
        out.square().sum().backward()
        return out
    return graph, x, convs, nn_step, udf_step


def op_lists(report) -> list[tuple[list[str], list[str]]]:
    """Per compiled program, the ops of its optimized forward and backward programs."""
    return [([v.op for v in p.forward.program.values if v.op != "input"],
             [v.op for v in p.backward.program.values if v.op != "input"]) for p in report.programs]


def test_graphiler_rgcn_udf_compiles_to_the_layers_plan():
    """Both forwards are one op: the relation sum with the root term and the bias folded
    in (passes/typed_root.py). The backwards differ only where the UDF reads its input
    under two names (``h`` for the messages, ``x`` for the root term): its gradient is two
    outputs, the relation sum's and the root's, where the layer's one input folds them
    into one ``typed_aggregate_rooted``."""
    _, _, _, nn_step, udf_step = two_layers(5, "cpu")
    ours, graphiler = gnnfuse.explain(nn_step), gnnfuse.explain(udf_step)
    weight_grads = ["matmul_tn", "sum_to", "transpose", "transpose", "typed_aggregate_tn"]
    for (forward, backward), (udf_forward, udf_backward) in zip(op_lists(ours), op_lists(graphiler), strict=True):
        assert forward == udf_forward == ["typed_aggregate_rooted"]
        assert sorted(backward) == sorted(weight_grads + ["typed_aggregate_rooted"])
        assert sorted(udf_backward) == sorted(weight_grads + ["matmul", "typed_aggregate"])


@pytest.mark.parametrize("backend", ["reference", "triton"], indirect=True)
def test_graphiler_rgcn_udf_matches_the_layer_in_float64(backend, device):
    _, x, convs, nn_step, udf_step = two_layers(5, device, f64)
    params = [x] + [p for c in convs for p in c.parameters()]
    expected = nn_step()
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    torch.testing.assert_close(udf_step(), expected, rtol=1e-12, atol=1e-12)
    for p, grad in zip(params, grads):
        torch.testing.assert_close(p.grad, grad, rtol=1e-12, atol=1e-12)


class HostWork:
    """Counts, while active, what a step does on the host: reads of device values
    (``tolist``, ``item``, ``int(tensor)``), ``torch.unique`` calls, segment-matmul and
    fused-kernel launches by kernel name, torch ops by name, and Python calls."""

    def __init__(self, monkeypatch, run_kernels: bool = True):
        self.active = False
        self.reads: collections.Counter = collections.Counter()
        self.launches: collections.Counter = collections.Counter()
        self.python_calls = 0
        for name in ("tolist", "item", "__int__"):
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name), name))
        monkeypatch.setattr(torch, "unique", self._counted(torch.unique, "unique"))
        for module in (sm, scatter_rows, triton_executor):
            monkeypatch.setattr(module, "launch", self._launch(module.launch, run_kernels))
        monkeypatch.setattr(tuned_schedule, "RECHECK_SECONDS", float("inf"))

    def _counted(self, fn, name):
        def counted(*args, **kwargs):
            if self.active:
                self.reads[name] += 1
            return fn(*args, **kwargs)
        return counted

    def _launch(self, launch, run_kernels: bool):
        def counted(kernel, *args, **kwargs):
            if self.active:
                self.launches[getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))] += 1
            if run_kernels:
                launch(kernel, *args, **kwargs)
        return counted

    def step(self, fn) -> None:
        """Runs ``fn`` counting. What is not the step's own work stays out of the count:
        the tuned-schedule file's look, due every `tuned_schedule.RECHECK_SECONDS` of
        wall time (it fell inside one step and not the other: 8 Python calls more with 4
        relations or with 40, depending on the tests run before), is taken just before and
        not again; the cyclic garbage collector is held off (a collection inside the step
        would run callbacks and finalizers of objects from before it)."""
        def profile(frame, event, arg):
            if event == "call":
                self.python_calls += 1
        self.active = True
        tuned_schedule.entries()
        collecting = gc.isenabled()
        gc.collect()
        gc.disable()
        sys.setprofile(profile)
        try:
            fn()
        finally:
            sys.setprofile(None)
            if collecting:
                gc.enable()
            self.active = False


# Per layer, the forward, input and weight gradients are one row scatter each (the first
# layer's input gradient too: x needs one), and in the pair orders one segment matmul each
# (the weight gradient's a transposed one); the dense order's products are torch GEMMs.
# The after order's forward and input gradient sum their (vertex, relation) products
# across relations with one more row scatter each.
LAUNCHES = {"before": {"_segment_matmul": 4, "_segment_matmul_tn": 2, "_scatter_scaled_rows": 6},
            "after": {"_segment_matmul": 4, "_segment_matmul_tn": 2, "_scatter_scaled_rows": 10},
            "dense": {"_scatter_scaled_rows": 6}}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("layer", ["nn", "graphiler-udf"])
def test_a_step_after_the_first_reads_nothing_back_from_the_device(layer, order, monkeypatch):
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv(ORDER_ENV, order)
    _, _, _, nn_step, udf_step = two_layers(6, device_for("triton"))
    step = nn_step if layer == "nn" else udf_step
    work = HostWork(monkeypatch)
    step()
    work.step(step)
    assert not work.reads, f"host reads of device values in a step after the first: {dict(work.reads)}"
    assert work.launches == LAUNCHES[order]


def test_the_udf_step_runs_the_layers_launches_and_torch_ops(monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self, ops: collections.Counter):
            super().__init__()
            self.ops = ops

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    _, _, _, nn_step, udf_step = two_layers(6, device_for("triton"))
    work = HostWork(monkeypatch, run_kernels=False)
    ran = {}
    for name, step in (("nn", nn_step), ("graphiler-udf", udf_step)):
        step()
        ops: collections.Counter = collections.Counter()
        with CountOps(ops):
            work.step(step)
        ran[name] = (dict(work.launches), ops)
        work.launches.clear()
    (udf_launches, udf_ops), (nn_launches, nn_ops) = ran["graphiler-udf"], ran["nn"]
    assert udf_launches == nn_launches
    # the input gradients' root terms (see test_graphiler_rgcn_udf_compiles_to_the_layers_plan):
    # the UDF's separate `mm` and the `add` of its two gradients, per layer, against the
    # layer's folded form -- the root's product added in place (`addmm_`) after the dense
    # order's GEMM in one layer, an `addmm` in the other
    assert udf_ops - nn_ops == collections.Counter({"aten.mm.default": 2, "aten.add.Tensor": 2})
    assert nn_ops - udf_ops == collections.Counter({"aten.addmm_.default": 1, "aten.addmm.default": 1})


@pytest.mark.parametrize("order", ORDERS)
def test_host_work_per_step_does_not_grow_with_the_relation_count(order, monkeypatch):
    """Kernels are not run (their cost is the device's); the Python calls around them are
    counted. With 40 relations on the same-sized graph a step makes no more than with 4
    (in each order: the byte model may pick another for each relation count). On a GPU
    the 40-relation step made 8 fewer (422 against 430, an H200): kernel choices there
    follow the device, so the count may fall, never grow."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv(ORDER_ENV, order)
    calls = {}
    for relations in (4, 40):
        _, _, _, nn_step, _ = two_layers(relations, device_for("triton"))
        work = HostWork(monkeypatch, run_kernels=False)
        nn_step()
        work.step(nn_step)
        calls[relations] = work.python_calls
    assert calls[40] <= calls[4], calls


def indexed_relation_layer(device: str):
    """(the layer's weight-table index, a call of a Graphiler-style layer reading its
    relation from that per-edge index, the float64 oracle of that call): the index is a
    copy of the graph's edge types with negative entries counted from the end, so not
    the graph's edge-type memory."""
    graph = relational_graph(5, device)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(graph.num_nodes, 8, generator=gen).to(device)
    w = torch.randn(5, 8, 3, generator=gen).to(device).requires_grad_()
    index = graph.edge_type - 5

    def layer():
        def message(edges):
            return {"m": torch.bmm(edges.src["h"].unsqueeze(1), w[edges.data["rel"]]).squeeze(1)}

        def reduce(nodes):
            return {"h": torch.sum(nodes.mailbox["m"], dim=1)}
        return gnnfuse.message_passing(graph, message, reduce, ndata={"h": x}, edata={"rel": index})["h"]

    def expected():
        rows = torch.einsum("ei,eio->eo", x[graph.src].double(), w.detach().double()[index])
        return torch.zeros(graph.num_nodes, 3, dtype=f64, device=device).index_add(0, graph.dst, rows)
    return index, layer, expected


def test_a_per_edge_index_is_served_from_the_cache_while_unchanged_and_rebuilt_once_edited(monkeypatch):
    """An index that is not the graph's edge-type memory is grouped once; an in-place
    edit is seen."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    index, layer, expected = indexed_relation_layer(device_for("triton"))
    work = HostWork(monkeypatch)
    layer().sum().backward()
    work.step(lambda: layer().sum().backward())
    assert not work.reads
    index.copy_(torch.flip(index, [0]))             # an in-place edit: version counter bumped
    torch.testing.assert_close(layer().double(), expected(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ["before", "after"])
def test_no_per_edge_table_is_alive_while_the_pair_products_run(order, monkeypatch):
    """The typed aggregation gathers [E, F] rows only to sum them per (vertex, relation)
    pair; they must be gone when the [P, F] products are made (the backward's peak)."""
    import gc

    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.ir.ops.typed_aggregate import ORDER_ENV
    monkeypatch.setenv(ORDER_ENV, order)
    graph = relational_graph(3)
    alive: list[tuple] = []

    def watched(matmul):
        def run(x, w, groups, gather=None):
            alive.extend(tuple(t.shape) for t in gc.get_objects()
                         if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[0] == graph.num_edges)
            return matmul(x, w, groups, gather)
        return staticmethod(run)
    monkeypatch.setattr(GraphContext, "grouped_matmul", watched(GraphContext.grouped_matmul))
    monkeypatch.setattr(GraphContext, "grouped_matmul_tn", watched(GraphContext.grouped_matmul_tn))
    conv = RGCNConv(8, 16, 3)
    x = torch.randn(graph.num_nodes, 8, requires_grad=True)
    conv(x, graph).sum().backward()
    assert not alive, f"per-edge tables alive during a pair matmul: {alive}"


def test_hgt_saves_no_per_edge_rows_for_its_backward():
    """HGT's relation-transformed keys and values (compact pair products gathered onto
    the edges, [E, H * D] each) are recomputed from the saved vertex tables in the
    backward, not kept alive between forward and backward."""
    from test_nn_hetero import IN_CHANNELS, METADATA, hetero_inputs

    from gnnfuse.nn import HGTConv
    x, edges = hetero_inputs(0)
    layer = HGTConv(IN_CHANNELS, 8, METADATA, heads=2).double()
    report = gnnfuse.explain(lambda: sum(o.sum() for o in layer(x, edges).values()).backward())
    saved = [(key, v.residency.name, list(v.shape)) for p in report.programs
             for key, v in p.backward.program.inputs.items()
             if key.startswith("saved:") and v.residency.is_edge_rowed and math.prod(v.shape) > 2]
    assert saved == []


def test_the_dense_order_reads_nothing_back_for_a_per_edge_index(monkeypatch):
    """A relation index that is not the graph's edge types, aggregated into the dense
    table: after the first step (which builds and checks the index's pairs) no step
    reads a value back from the device."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv(ORDER_ENV, "dense")
    _, layer, expected = indexed_relation_layer(device_for("triton"))
    work = HostWork(monkeypatch)
    torch.testing.assert_close(layer().double(), expected(), rtol=1e-5, atol=1e-5)
    layer().sum().backward()
    work.step(lambda: layer().sum().backward())
    assert not work.reads, dict(work.reads)
