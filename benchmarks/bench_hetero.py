"""Relational training step: gnnfuse's R-GCN and HGT against PyG's RGCNConv, FastRGCNConv
and HGTConv on typed graphs sized like AIFB, MUTAG, BGS, AM and ogbn-mag
(gnnfuse.data.typed), plus Graphiler's R-GCN and HGT UDFs compiled unchanged, and PyG's
``to_hetero`` of GraphSAGE with either library's layers.

Models (two layers each, hidden ``--hidden``, the presets' random features):

- ``rgcn``: RGCNConv(mean) -> ReLU -> RGCNConv(mean). Frameworks: ``gnnfuse``
  (gnnfuse.nn.RGCNConv), ``pyg-rgcn`` (RGCNConv), ``pyg-fastrgcn`` (FastRGCNConv, which
  gathers an [E, in, out] weight per edge) and ``graphiler-udf``: Graphiler's R-GCN
  message, ``bmm(edges.src['h'].unsqueeze(1), W[edges.data['type']]) * norm``, with
  ``sum`` reduce, run by ``gnnfuse.message_passing`` unchanged (plus the root term and
  bias in its ``update_fn``, DGL's ``apply_node_func``).
- ``hgt``: HGTConv(heads 2) -> ReLU -> HGTConv -> Linear on the labelled node type.
  Frameworks: ``gnnfuse`` (gnnfuse.nn.HGTConv), ``pyg-hgt`` and ``graphiler-udf``: HGTConv with
  its attention written as Graphiler's message/reduce UDF (``bmm`` of the source row and the
  relation matrix read by ``edges.data['type']``, softmax over the mailbox), compiled unchanged.
  gnnfuse's two take the Linear and the loss together through
  `gnnfuse.nn.functional.linear_cross_entropy` (the same weights and loss, no [papers, 349]
  logits); ``gnnfuse-linear-head`` is gnnfuse.nn.HGTConv under PyG's head (``nn.Linear``
  then ``F.cross_entropy``), so the layers' share of the memory stays visible.
- ``sage``: PyG's heterogeneous tutorial model, SAGEConv(mean) -> ReLU -> SAGEConv made
  heterogeneous by ``to_hetero(model, metadata, aggr="sum")`` on the graph with each
  relation's reverse added (PyG's ``ToUndirected``), the labelled type's rows out.
  Frameworks: ``gnnfuse`` (gnnfuse.nn.SAGEConv through gnnfuse.nn.to_hetero) and
  ``pyg-sage`` (PyG's, through PyG's to_hetero). Only on presets with several node types
  (mag-like); cells from 2026-12-01 on record their ``hidden``.

gnnfuse's R-GCN steps (its layer and the UDF) take their loss as ``gnnfuse train`` and
bench_training do, `gnnfuse.nn.functional.cross_entropy(out, y[train], rows=train)`
(cells recording ``"loss": "rows"``; PyG's ``F.cross_entropy(out[train], y[train])``
before): the same loss, computed in a captured step by two kernels over the training rows.
``gnnfuse-train-rows`` is gnnfuse's R-GCN with its second layer computed for the training
vertices only (`TrainRows`): the same loss and gradients without the [N, classes] output.

Every framework of a model starts from the same weights (PyG's state dict loaded into
gnnfuse's layers; the UDF reads the same tensors), and before timing the eval-mode
forward of each is checked against PyG's (max rel err, flagged above 1e-3). A step is
forward + cross-entropy on the training nodes + backward + Adam; median ms over
``--steps``, peak GB = ``torch.cuda.max_memory_allocated`` over the timed steps (a
captured step's also over its recording, as bench_training counts it: replays allocate
nothing; runs before 2026-11-24 afternoon added the graph pool's free part instead). OOM,
time-outs and errors are recorded as the cell's status and the run goes on.

Memory is reported two ways. ``peak_gb`` is the allocator's peak, which holds what every
framework shares: the data set on the device and the cuBLAS workspaces torch allocates
through its caching allocator on the first matmul (32 MiB per handle on Hopper), tens of
MB that dominate the small presets. ``own_peak_gb`` is the peak above what was allocated
when the cell began (``base_gb``): the framework's parameters, optimizer state, graph
layouts and activations. The cuBLAS workspaces of the stream gnnfuse's `StepCapture`
records on (forward and backward; one stream per process,
`gnnfuse.runtime.cuda_graph.capture_stream`) are made before the first cell
(`gnnfuse.bench.measure.prime_capture_stream`), so they sit in every cell's base like the
default stream's, and in ``peak_gb``; runs before 20261128T223551Z counted them (64 MiB, each
capture then having a stream of its own) in gnnfuse's own peaks. Each cell runs on a fresh
`Graph` (and the `HeteroGraph` cache is cleared), so gnnfuse's cached layouts are counted
in its own cell and no other.

``--profile`` adds, per cell, one profiled step: device kernels launched, their summed
time, host syncs (``torch.cuda.set_sync_debug_mode``) and Python calls per step, logged
with torch.profiler's table of the heaviest kernels.

Results merge into ``<out>/hetero.json`` (cells keyed data set/model/framework, with the
device and commit of their run) and ``<out>/hetero.md`` is regenerated after every cell,
so a run cut off by the device's 10-minute limit keeps what it measured; ``--max-size``
stops at a preset so one call fits.

    python benchmarks/bench_hetero.py --max-size bgs-like
    python benchmarks/bench_hetero.py --datasets am-like,mag-like --steps 10
    python benchmarks/bench_hetero.py --device cpu --max-size aifb-like --steps 2 --warmup 1
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import gnnfuse
from gnnfuse.bench import allocated_gb, guarded, peak_memory_gb, reset_peak_memory, synchronize
from gnnfuse.bench.measure import (CAPTURE_WARMUP, REL_ERR_LIMIT, max_rel_err, prime_capture_stream,
                                   training_step, warm_up)
from gnnfuse.data.typed import TYPED_PRESETS, typed_graph
from gnnfuse.graph.hetero_cache import clear_hetero_cache
from gnnfuse.graph.in_edges import in_edges_block
from gnnfuse.nn.functional import cross_entropy, linear_cross_entropy

from bench_attention import kernel_profile
from bench_training import comma_list
from common import (check_failed, device_names, environment, fail_mark, fmt, free_memory, load_results, log,
                    new_run_id, prune_runs, resolve_device, runs_markdown, save_json, summarize, time_calls, warn,
                    worst_error, write_atomically)

DATASETS = tuple(TYPED_PRESETS)          # smallest first
MODELS = ("rgcn", "hgt", "sage")
TRAIN_ROWS = "gnnfuse-train-rows"      # R-GCN's second layer on the rows its loss reads (`TrainRows`)
FRAMEWORKS = {"rgcn": ("gnnfuse", TRAIN_ROWS, "pyg-rgcn", "pyg-fastrgcn", "graphiler-udf"),
              "hgt": ("gnnfuse", "gnnfuse-linear-head", "pyg-hgt", "graphiler-udf"),
              "sage": ("gnnfuse", "pyg-sage")}
GNNFUSE_FRAMEWORKS = ("gnnfuse", "gnnfuse-linear-head", TRAIN_ROWS, "graphiler-udf")   # steps compiled by gnnfuse
FUSED_HEAD = ("gnnfuse", "graphiler-udf")            # HGT's classifier and loss by linear_cross_entropy
PYG = {"rgcn": ("pyg-rgcn", "pyg-fastrgcn"), "hgt": ("pyg-hgt",), "sage": ("pyg-sage",)}


# --- data --------------------------------------------------------------------------------
@dataclass
class TypedData:
    """A preset on the device, in both frameworks' forms."""
    name: str
    graph: gnnfuse.Graph                 # typed, global ids
    x: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor              # global ids of labelled training vertices
    edge_index: torch.Tensor             # [2, E] for PyG's R-GCNs
    norm: torch.Tensor                   # 1 / |N_r(v)| per edge (R-GCN's mean), for the UDF
    x_dict: dict[str, torch.Tensor]
    edge_index_dict: dict[tuple[str, str, str], torch.Tensor]
    metadata: tuple[list[str], list[tuple[str, str, str]]]
    labelled: str
    num_classes: int


def load_typed(name: str, device: torch.device) -> TypedData:
    preset = TYPED_PRESETS[name]
    begin = time.perf_counter()
    data = typed_graph(name)
    log(f"[{name}] built in {time.perf_counter() - begin:.1f} s: {data.graph.num_nodes} nodes, "
        f"{data.graph.num_edges} edges, {data.graph.num_edge_types} relations")
    graph = data.graph.to(device)
    x = data.x.to(device)
    offsets = torch.cumsum(torch.tensor([0] + [c for _, c in preset.node_counts]), 0).tolist()
    starts = dict(zip(preset.node_types, offsets))
    x_dict = {t: x[starts[t]:starts[t] + c] for t, c in preset.node_counts}
    order = torch.sort(graph.edge_type, stable=True).indices
    counts = torch.bincount(graph.edge_type, minlength=graph.num_edge_types).tolist()
    edge_index_dict = {}
    for (src_t, rel, dst_t), ids in zip(preset.edge_types, torch.split(order, counts)):
        edge_index_dict[(src_t, rel, dst_t)] = torch.stack([graph.src[ids] - starts[src_t],
                                                            graph.dst[ids] - starts[dst_t]])
    key = graph.dst * graph.num_edge_types + graph.edge_type
    norm = 1.0 / torch.bincount(key, minlength=graph.num_nodes * graph.num_edge_types)[key].float()
    return TypedData(name, graph, x, data.y.to(device), data.train_mask.nonzero().squeeze(1).to(device),
                     torch.stack([graph.src, graph.dst]), norm[:, None], x_dict, edge_index_dict,
                     (preset.node_types, preset.edge_types), preset.labelled_type, preset.num_classes)


def with_fresh_graph(data: TypedData) -> TypedData:
    """``data`` on a new `Graph` of the same tensors, without cached layouts, and the
    `HeteroGraph` cache cleared: a cell builds (and counts) its own gnnfuse layouts, and
    the next cell does not hold them."""
    clear_hetero_cache()
    g = data.graph
    graph = gnnfuse.Graph(g.src, g.dst, g.num_nodes, edge_type=g.edge_type, num_edge_types=g.num_edge_types,
                          node_type=g.node_type, num_node_types=g.num_node_types)
    return dataclasses.replace(data, graph=graph)


# --- models --------------------------------------------------------------------------------
def _pyg():
    import torch_geometric.nn as pyg_nn
    return pyg_nn


class TwoRelational(nn.Module):
    """conv1 -> ReLU -> conv2 over (x, edge_index, edge_type) or a typed Graph."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, graph_args: Callable[[TypedData], tuple]):
        super().__init__()
        self.conv1, self.conv2, self.graph_args = conv1, conv2, graph_args

    def forward(self, data: TypedData) -> torch.Tensor:
        args = self.graph_args(data)
        return self.conv2(F.relu(self.conv1(data.x, *args)), *args)


class GraphilerRGCNLayer(nn.Module):
    """Graphiler's R-GCN layer as its authors wrote it for DGL (message: the source row
    times the edge's relation weight by ``torch.bmm``, scaled by the mean norm; reduce:
    sum), run by ``gnnfuse.message_passing``; ``root`` and ``bias`` as RGCNConv's, so
    the parameters load from one, added in the node update (DGL's ``apply_node_func``)
    where the compiler folds them into the sum as it does the layer's."""

    def __init__(self, in_channels: int, out_channels: int, num_relations: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_relations, in_channels, out_channels))
        self.root = nn.Parameter(torch.empty(in_channels, out_channels))
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x: torch.Tensor, data: TypedData) -> torch.Tensor:
        weight = self.weight

        def message(edges):
            w = weight[edges.data["_TYPE"]]
            msg = torch.bmm(edges.src["h"].unsqueeze(1), w).squeeze(1)
            return {"m": msg * edges.data["norm"]}

        def reduce(nodes):
            return {"h": torch.sum(nodes.mailbox["m"], dim=1)}

        def update(nodes):        # the root term and bias (RGCNConv's) as DGL's apply_node_func
            return {"h": nodes.data["h"] + nodes.data["x"] @ root + bias}
        root, bias = self.root, self.bias
        return gnnfuse.message_passing(data.graph, message, reduce, update, ndata={"h": x, "x": x},
                                       edata={"_TYPE": data.graph.edge_type, "norm": data.norm})["h"]


def graphiler_hgt_attention(hetero, k, q, v, w_k, w_v, p, heads: int, dim: int) -> torch.Tensor:
    """HGT's attention as Graphiler's DGL UDF writes it: the edge's relation matrices read
    from parameter tables by ``edges.data['type']`` and applied with ``torch.bmm`` per edge,
    a softmax over the mailbox, and the weighted sum; run by ``gnnfuse.message_passing``."""
    def message(edges):
        relation = edges.data["type"]
        key = torch.bmm(edges.src["k"].unsqueeze(1), w_k[relation]).squeeze(1).view(-1, heads, dim)
        value = torch.bmm(edges.src["v"].unsqueeze(1), w_v[relation]).squeeze(1).view(-1, heads, dim)
        return {"s": (key * edges.dst["q"]).sum(-1) * p[relation], "v": value}

    def reduce(nodes):
        alpha = torch.softmax(nodes.mailbox["s"], dim=1)
        return {"o": torch.sum(alpha.unsqueeze(-1) * nodes.mailbox["v"], dim=1)}
    graph = hetero.graph
    return gnnfuse.message_passing(graph, message, reduce, ndata={"k": k, "q": q, "v": v},
                                   edata={"type": graph.edge_type})["o"]


class GraphilerHGTConv(gnnfuse.nn.HGTConv):
    """gnnfuse.nn.HGTConv (parameters, projections, gate) with Graphiler's UDF as its attention."""
    attention = staticmethod(graphiler_hgt_attention)


class TrainRows(nn.Module):
    """`TwoRelational`'s R-GCN (same parameters), its second layer computed only for the
    training vertices: a bipartite layer over their in-edges (`gnnfuse.graph.in_edges_block`)
    from every vertex's hidden row, so its output is [training vertices, classes] in
    ``train_idx`` order -- ``out[train_idx]`` of the whole model, the same loss and gradients, without
    the [N, classes] output and its gradient that no loss term reads (at mag's size 2.7
    GB each). Why a separate cell: PyG's R-GCN step, and gnnfuse's own, compute every
    row; this is what a user who knows that can write with gnnfuse's layers."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2
        self.block: gnnfuse.Graph | None = None

    def prepare(self, data: TypedData) -> None:
        """The training vertices' in-edges as a graph from every vertex to them, built once
        per cell (it reads the edge count back, which a captured step must not)."""
        self.block = in_edges_block(data.graph, data.train_idx)

    def forward(self, data: TypedData) -> torch.Tensor:
        if self.block is None:
            self.prepare(data)
        h = F.relu(self.conv1(data.x, data.graph))
        return self.conv2((h, h[data.train_idx]), self.block)


class TwoHGT(nn.Module):
    """HGTConv -> ReLU -> HGTConv -> Linear on the labelled node type's rows."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, hidden: int, num_classes: int, labelled: str):
        super().__init__()
        self.conv1, self.conv2, self.labelled = conv1, conv2, labelled
        self.lin = nn.Linear(hidden, num_classes)

    def forward(self, data: TypedData) -> torch.Tensor:
        return self.lin(self.embed(data))

    def embed(self, data: TypedData) -> torch.Tensor:
        """The labelled type's rows before the classifier."""
        # node types no relation ends at (mag-like's authors) get no output: their input
        # features go on to the second layer, whose in_channels say so
        h = {**data.x_dict, **{t: F.relu(v) for t, v in self.conv1(data.x_dict, data.edge_index_dict).items()}}
        return self.conv2(h, data.edge_index_dict)[self.labelled]


class SAGE(nn.Module):
    """PyG's heterogeneous tutorial model before ``to_hetero``: SAGEConv -> ReLU -> SAGEConv."""

    def __init__(self, lib: Any, width: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1, self.conv2 = lib.SAGEConv(width, hidden), lib.SAGEConv(hidden, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class HeteroSAGE(nn.Module):
    """`SAGE` made heterogeneous by ``to_hetero`` (gnnfuse.nn's for gnnfuse's layers, PyG's
    for PyG's) on the graph with each relation's reverse added (PyG's ``ToUndirected``,
    so every node type receives messages), the labelled type's rows out."""

    def __init__(self, lib: Any, data: TypedData, hidden: int):
        super().__init__()
        self.labelled = data.labelled
        model = SAGE(lib, data.x.shape[1], hidden, data.num_classes)
        self.model = lib.to_hetero(model, undirected(data)[0], aggr="sum")

    def forward(self, data: TypedData) -> torch.Tensor:
        return self.model(data.x_dict, undirected(data)[1])[self.labelled]


_UNDIRECTED: list[tuple[dict, tuple]] = []      # the last (edge_index_dict, its undirected form)


def undirected(data: TypedData) -> tuple[tuple[list[str], list[tuple[str, str, str]]], dict]:
    """``(metadata, edge_index_dict)`` with ``(dst, rev_<relation>, src)`` added for every
    relation, made once per data set (the per-step dict holds the same tensors)."""
    if not _UNDIRECTED or _UNDIRECTED[0][0] is not data.edge_index_dict:
        edges = dict(data.edge_index_dict)
        for (src, relation, dst), edge_index in data.edge_index_dict.items():
            edges[(dst, f"rev_{relation}", src)] = edge_index.flip(0)
        _UNDIRECTED[:] = [(data.edge_index_dict, ((data.metadata[0], list(edges)), edges))]
    return _UNDIRECTED[0][1]


def build(model: str, framework: str, data: TypedData, hidden: int) -> nn.Module:
    relations, width = data.graph.num_edge_types, data.x.shape[1]
    if model == "sage":
        return HeteroSAGE(gnnfuse.nn if framework == "gnnfuse" else _pyg(), data, hidden)
    if model == "rgcn":
        sizes = ((width, hidden), (hidden, data.num_classes))
        if framework in ("gnnfuse", TRAIN_ROWS):
            convs = [gnnfuse.nn.RGCNConv(i, o, relations) for i, o in sizes]
            return TrainRows(*convs) if framework == TRAIN_ROWS else TwoRelational(*convs, lambda d: (d.graph,))
        if framework == "graphiler-udf":
            convs = [GraphilerRGCNLayer(i, o, relations) for i, o in sizes]
            return TwoRelational(*convs, lambda d: (d,))
        cls = _pyg().RGCNConv if framework == "pyg-rgcn" else _pyg().FastRGCNConv
        return TwoRelational(*(cls(i, o, relations) for i, o in sizes), lambda d: (d.edge_index, d.graph.edge_type))
    cls = {"gnnfuse": gnnfuse.nn.HGTConv, "gnnfuse-linear-head": gnnfuse.nn.HGTConv,
           "graphiler-udf": GraphilerHGTConv}.get(framework) or _pyg().HGTConv
    node_types, edge_types = data.metadata
    second = {t: hidden if t in {e[-1] for e in edge_types} else width for t in node_types}
    return TwoHGT(cls(width, hidden, data.metadata, heads=2), cls(second, hidden, data.metadata, heads=2),
                  hidden, data.num_classes, data.labelled)


def reference_state(model: str, data: TypedData, hidden: int) -> dict[str, torch.Tensor]:
    """PyG's initial weights (seed 0), which every framework of ``model`` loads."""
    torch.manual_seed(0)
    return build(model, PYG[model][0], data, hidden).state_dict()


def instantiate(model: str, framework: str, data: TypedData, hidden: int, state: dict[str, torch.Tensor],
                device: torch.device) -> nn.Module:
    module = build(model, framework, data, hidden).to(device)
    module.load_state_dict(state)
    return module


# --- measurement --------------------------------------------------------------------------
def check(model: str, data: TypedData, hidden: int, state, device: torch.device) -> dict[str, Any]:
    """Each framework's eval-mode forward against PyG's first variant: max rel err, or
    the failure (an OOM of one framework leaves the others checked)."""
    def forward(framework: str) -> dict[str, Any]:
        module = instantiate(model, framework, data, hidden, state, device).eval()
        with torch.no_grad():
            return {"status": "ok", "out": module(with_fresh_graph(data)).float()}
    reference = guarded(lambda: forward(PYG[model][0]), device)
    if reference["status"] != "ok":
        return {"status": f"{PYG[model][0]}: {reference['status']}"}
    errors: dict[str, float | str] = {}
    for framework in (f for f in FRAMEWORKS[model] if f != PYG[model][0]):
        got = guarded(lambda: forward(framework), device)
        expected = reference["out"][data.train_idx] if framework == TRAIN_ROWS else reference["out"]
        errors[framework] = max_rel_err(got["out"], expected) if got["status"] == "ok" else got["status"]
    return {"status": "ok", "max_rel_err": errors}


def measure(model: str, framework: str, data: TypedData, hidden: int, state, steps: int, warmup: int,
            device: torch.device, profile: bool = False, cuda_graph: str = "auto") -> dict[str, Any]:
    """gnnfuse's steps (its layers and the Graphiler UDF it compiles) go through
    `StepCapture` as in bench_training and ``gnnfuse train``: on CUDA, captured in a CUDA
    graph after warm-up when replayable (``cuda_graph`` in the cell says which ran); PyG's
    run eagerly, as PyG users run these layers."""
    data = with_fresh_graph(data)
    base = allocated_gb(device)
    module = instantiate(model, framework, data, hidden, state, device)
    if framework == TRAIN_ROWS:
        module.prepare(data)
    ours = framework in GNNFUSE_FRAMEWORKS
    train_y = data.y[data.train_idx]

    def loss() -> torch.Tensor:
        # R-GCN outputs every vertex, HGT its labelled type's (the first type: local ids = global)
        if model == "hgt" and framework in FUSED_HEAD:
            return linear_cross_entropy(module.embed(data)[data.train_idx], module.lin.weight, module.lin.bias,
                                        train_y)
        if framework == TRAIN_ROWS:      # its output holds the training rows only
            return cross_entropy(module(data), train_y)
        if model == "rgcn" and ours:     # the loss over the training rows, without the gather
            return cross_entropy(module(data), train_y, rows=data.train_idx)
        return F.cross_entropy(module(data)[data.train_idx], train_y)
    step = training_step(module, loss, device, cuda_graph if ours else "off", framework, lr=0.01)
    begin = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first_ms = (time.perf_counter() - begin) * 1e3
    recorded_peak = warm_up(step, max(warmup, CAPTURE_WARMUP if ours else 0), device)
    synchronize(device)
    reset_peak_memory(device)
    times = time_calls(step, steps, device)
    peak = peak_memory_gb(device)
    if peak is not None and recorded_peak is not None:   # replays allocate nothing: the recording's peak counts
        peak = max(peak, recorded_peak)
    cell = {"status": "ok", **summarize(times), "peak_gb": peak, "base_gb": base,
            "own_peak_gb": None if peak is None else peak - base, "first_step_ms": first_ms,
            **({"cuda_graph": step.status} if ours else {}),
            **({"head": "linear_cross_entropy" if framework in FUSED_HEAD else "nn.Linear"} if model == "hgt" else {}),
            **({"loss": "rows"} if model == "rgcn" and ours and framework != TRAIN_ROWS else {}),
            "hidden": hidden}
    if profile:
        cell["profile"] = step_profile(step, device)
    return cell


def step_profile(step: Callable[[], None], device: torch.device) -> dict[str, Any]:
    """One more step, counted: device kernels launched and their summed time (ms), host
    synchronisations (CUDA's sync debug mode warns on each) and Python calls; then one
    profiled step's table of the heaviest kernels, logged."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"
    synchronize(device)
    with warnings.catch_warnings(record=True) as syncs:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        sys.setprofile(count)
        try:
            step()
        finally:
            sys.setprofile(None)
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        step()
        synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    log(kernel_profile(step, device))
    return {"kernels": len(kernels), "kernel_ms": sum(e.device_time_total for e in kernels) / 1e3,
            "host_syncs": sum("synchroniz" in str(w.message) for w in syncs), "python_calls": calls}


# --- results ---------------------------------------------------------------------------------
def ratios(results: dict[str, Any], dataset: str, model: str) -> dict[str, Any]:
    """gnnfuse's speedup over and memory share of the fastest PyG variant that ran, and
    the Graphiler UDF's time relative to gnnfuse.nn's; None where a cell is missing,
    failed, or ran on another device, or whose forward check did not pass (`agrees`):
    a step computing something else than PyG's is no speedup to report."""
    cells = results["cells"]
    ours = cells.get(f"{dataset}/{model}/gnnfuse")
    agreed = agrees(results, dataset, model)
    if not ours or ours["status"] != "ok" or not agreed("gnnfuse"):
        return {"fastest_pyg": None, "speedup": None, "memory_ratio": None, "udf_vs_nn": None}
    theirs = [(fw, cells.get(f"{dataset}/{model}/{fw}")) for fw in PYG[model] if agreed(fw)]
    ran = [(fw, c) for fw, c in theirs if c and c["status"] == "ok" and len(device_names(results, [ours, c])) == 1]
    out: dict[str, Any] = {"fastest_pyg": None, "speedup": None, "memory_ratio": None, "own_memory_ratio": None}
    if ran:
        fw, best = min(ran, key=lambda item: item[1]["median_ms"])
        out = {"fastest_pyg": fw, "speedup": best["median_ms"] / ours["median_ms"],
               "memory_ratio": _ratio(ours.get("peak_gb"), best.get("peak_gb")),
               "own_memory_ratio": _ratio(ours.get("own_peak_gb"), best.get("own_peak_gb"))}
        plain = cells.get(f"{dataset}/{model}/gnnfuse-linear-head")
        if (plain and agreed("gnnfuse-linear-head") and plain["status"] == "ok"
                and len(device_names(results, [plain, best])) == 1):
            out["linear_head_own_memory_ratio"] = _ratio(plain.get("own_peak_gb"), best.get("own_peak_gb"))
        rows = cells.get(f"{dataset}/{model}/{TRAIN_ROWS}")
        if rows and agreed(TRAIN_ROWS) and rows["status"] == "ok" and len(device_names(results, [rows, best])) == 1:
            out["train_rows_speedup"] = best["median_ms"] / rows["median_ms"]
            out["train_rows_own_memory_ratio"] = _ratio(rows.get("own_peak_gb"), best.get("own_peak_gb"))
    udf = cells.get(f"{dataset}/{model}/graphiler-udf")
    out["udf_vs_nn"] = (udf["median_ms"] / ours["median_ms"]
                        if udf and udf["status"] == "ok" and agreed("graphiler-udf")
                        and len(device_names(results, [ours, udf])) == 1 else None)
    return out


def agrees(results: dict[str, Any], dataset: str, model: str) -> Callable[[str], bool]:
    """Whether a framework's forward passed the check of ``dataset``/``model``: within
    `REL_ERR_LIMIT` of PyG's first variant (the reference itself, where that ran). A
    check that failed or is missing leaves agreement unknown: not passed."""
    checked = results.get("checks", {}).get(f"{dataset}/{model}", {})
    errors = checked.get("max_rel_err", {})

    def agreed(framework: str) -> bool:
        if framework == PYG[model][0]:
            return checked.get("status") == "ok"
        error = errors.get(framework)
        return isinstance(error, float) and error <= REL_ERR_LIMIT
    return agreed


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours and theirs else None


def row_keys(results: dict[str, Any]) -> list[tuple[str, str]]:
    pairs = {tuple(key.split("/")[:2]) for key in results["cells"]}
    rank = {name: i for i, name in enumerate(DATASETS + MODELS)}
    return sorted(pairs, key=lambda p: (rank.get(p[0], len(rank)), rank.get(p[1], len(rank))))


def cell_text(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "–"
    if cell["status"] != "ok":
        return cell["status"][:40]
    peak = "" if cell["peak_gb"] is None else f" / {cell['peak_gb']:.3f} GB"
    own = "" if cell.get("own_peak_gb") is None else f" ({cell['own_peak_gb']:.3f} own)"
    graph = {"captured": " captured", None: ""}.get(cell.get("cuda_graph"), " eager")
    return f"{cell['median_ms']:.2f} ms{graph}{peak}{own}"


def render_markdown(results: dict[str, Any]) -> str:
    frameworks = ("gnnfuse", "gnnfuse-linear-head", TRAIN_ROWS, "pyg-rgcn", "pyg-fastrgcn", "pyg-hgt",
                  "pyg-sage", "graphiler-udf")
    head = ["dataset", "model", *frameworks, "fastest PyG", "speedup", "mem vs PyG", "own mem vs PyG",
            "own mem vs PyG, Linear head", "train rows: speedup / own mem vs PyG", "UDF / nn", "max rel err"]
    lines = ["# Relational training step: gnnfuse vs PyG (R-GCN, HGT, to_hetero(SAGE)) and Graphiler's R-GCN UDF", "",
             "Median ms per step (forward + loss + backward + Adam; gnnfuse's steps captured in a CUDA graph where "
             "marked, PyG's eager) / peak GB over the timed steps and, for a captured step, its recording (own: the "
             "peak above what was allocated when the cell began -- the data set and the cuBLAS workspaces "
             "every framework shares are left out, from run 20261128T223551Z on also those of gnnfuse's capture stream, "
             "made once per process before the first cell); speedup = fastest PyG variant's time / gnnfuse's; "
             "mem = gnnfuse peak / that variant's peak, own mem the same for the own peaks; "
             "own mem vs PyG, Linear head = the same for gnnfuse-linear-head (HGT under PyG's classifier head, "
             "nn.Linear then F.cross_entropy; gnnfuse and the UDF take head and loss through "
             "gnnfuse.nn.functional.linear_cross_entropy from run 20261129T022028Z on, earlier runs through PyG's head; "
             "gnnfuse's R-GCN steps take gnnfuse.nn.functional.cross_entropy(out, y[train], rows=train) in runs after "
             "20261129T042437Z, F.cross_entropy(out[train], y[train]) before); "
             f"{TRAIN_ROWS} = gnnfuse's R-GCN with its second layer computed for the training vertices only "
             "(a bipartite layer over their in-edges, output [train, classes]: the same loss and gradients, "
             "bench_hetero.TrainRows), from run 20261129T182259Z on; "
             "UDF / nn = Graphiler's R-GCN UDF compiled by gnnfuse / gnnfuse.nn.RGCNConv; max rel err = worst "
             f"eval-mode forward difference from PyG over the frameworks (flagged above {REL_ERR_LIMIT:g}). "
             "Data: gnnfuse.data.typed presets. See benchmarks/bench_hetero.py.", "",
             *runs_markdown(results), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for dataset, model in row_keys(results):
        cells = [results["cells"].get(f"{dataset}/{model}/{fw}") if fw in FRAMEWORKS[model] else None
                 for fw in frameworks]
        r = results["ratios"][f"{dataset}/{model}"]
        errors = results["checks"].get(f"{dataset}/{model}", {})
        worst = worst_error(_numbers(errors.get("max_rel_err", {})))
        err = errors.get("status", "–") if worst is None else f"{worst:.1e}{fail_mark(worst, REL_ERR_LIMIT)}"
        lines.append("| " + " | ".join([dataset, model, *(cell_text(c) if fw in FRAMEWORKS[model] else "n/a"
                                                             for fw, c in zip(frameworks, cells)),
                                          r["fastest_pyg"] or "–", fmt(r["speedup"], ".2f"),
                                          fmt(r["memory_ratio"], ".2f"), fmt(r.get("own_memory_ratio"), ".2f"),
                                          fmt(r.get("linear_head_own_memory_ratio"), ".2f"),
                                          _pair(r.get("train_rows_speedup"), r.get("train_rows_own_memory_ratio")),
                                          fmt(r["udf_vs_nn"], ".2f"), err]) + " |")
    return "\n".join(lines) + "\n"


def _pair(speedup: float | None, memory: float | None) -> str:
    return "–" if speedup is None else f"{speedup:.2f} / {fmt(memory, '.2f')}"


def _numbers(errors: dict[str, Any]) -> list[float]:
    return [e for e in errors.values() if isinstance(e, float)]


def store(results: dict[str, Any], out: Path) -> None:
    prune_runs(results)
    results["ratios"] = {f"{d}/{m}": ratios(results, d, m) for d, m in row_keys(results)}
    save_json(out / "hetero.json", results)
    write_atomically(out / "hetero.md", render_markdown(results))


# --- driver ---------------------------------------------------------------------------------
def run_dataset(name: str, args: argparse.Namespace, device: torch.device, results: dict[str, Any],
                run_id: str) -> None:
    data = load_typed(name, device)
    for model in args.models:
        if model == "sage" and len(data.metadata[0]) == 1:     # to_hetero of a one-node-type KG: R-GCN's job
            continue
        state = reference_state(model, data, args.hidden)
        checked = guarded(lambda: check(model, data, args.hidden, state, device), device, args.cell_timeout)
        results["checks"][f"{name}/{model}"] = {**checked, "run": run_id}
        log(f"[{name}] {model} forward check: {checked.get('max_rel_err', checked['status'])}")
        worst = worst_error(_numbers(checked.get("max_rel_err", {})))
        if check_failed(worst, REL_ERR_LIMIT):
            warn(f"{name}/{model}: a framework's forward differs from PyG's by {worst:.2e} (> {REL_ERR_LIMIT:g})")
        for framework in (f for f in FRAMEWORKS[model] if f in args.frameworks):
            begin = time.perf_counter()
            cell = guarded(lambda: measure(model, framework, data, args.hidden, state, args.steps, args.warmup,
                                           device, args.profile, args.cuda_graph), device, args.cell_timeout)
            results["cells"][f"{name}/{model}/{framework}"] = {**cell, "run": run_id}
            store(results, args.out)
            log(f"[{name}] {model} {framework}: {cell_text(cell)} [{time.perf_counter() - begin:.1f} s]"
                + (f" per step: {cell['profile']}" if "profile" in cell else ""))
    del data
    free_memory(device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=comma_list(DATASETS), default=list(DATASETS))
    parser.add_argument("--max-size", choices=DATASETS, help="skip the presets larger than this one")
    parser.add_argument("--models", type=comma_list(MODELS), default=list(MODELS))
    every = tuple(dict.fromkeys(fw for fws in FRAMEWORKS.values() for fw in fws))
    parser.add_argument("--frameworks", type=comma_list(every), default=list(every))
    parser.add_argument("--hidden", type=int, default=16, help="hidden width (default 16, R-GCN's)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per cell (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the first (default 3)")
    parser.add_argument("--cell-timeout", type=float, default=None,
                        help="seconds one cell may take; past it the cell is recorded as a time-out")
    parser.add_argument("--profile", action="store_true",
                        help="per cell, count one step's kernels, host syncs and Python calls, and log its "
                             "heaviest kernels")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cuda-graph", choices=("auto", "off"), default="auto",
                        help="gnnfuse's steps in a CUDA graph when replayable (auto, the default) or eager")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="folder of hetero.json (merged into) and hetero.md")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.max_size:
        args.datasets = [d for d in args.datasets if DATASETS.index(d) <= DATASETS.index(args.max_size)]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    results = load_results(args.out / "hetero.json")
    results.setdefault("checks", {})
    run_id = new_run_id()
    prime_capture_stream(device)
    results["runs"][run_id] = environment(device)
    log(f"run {run_id} on {results['runs'][run_id]['device_name']}; {', '.join(args.datasets)}; results -> {args.out}")
    begin = time.perf_counter()
    for name in args.datasets:
        run_dataset(name, args, device, results, run_id)
    store(results, args.out)
    log(f"done in {time.perf_counter() - begin:.1f} s; {args.out / 'hetero.md'}")


if __name__ == "__main__":
    main()
