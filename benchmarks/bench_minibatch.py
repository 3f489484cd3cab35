"""Sampled mini-batch training epochs: gnnfuse's NeighborLoader + compiled layers, with the
per-stage breakdown, against PyG's NeighborLoader + PyG SAGEConv in the same run.

The default cell is GraphTensor's / SALIENT's setting (issue #14): the ``products-like``
preset (2.45M nodes, 61.9M edges, 100 features), GraphSAGE with 3 layers of 256 hidden
channels, fanouts 15,10,5, batches of 1024 seeds drawn from ogbn-products' training-set
size (196,615 vertices; the preset's own split is 60%). For each place the features can
live (``device``: gathered on the GPU; ``pinned``: gathered on the host into page-locked
buffers, copied asynchronously) it times one epoch after a warm-up and reports:

- the epoch's wall time and batches/s;
- the loader's stage seconds (sample, reindex, lookup, transfer -- in its background
  thread, overlapped with compute), the training loop's compute seconds and the time it
  waited for batches;
- the GPU busy fraction: the summed CUDA-event time of the training steps over the
  epoch's wall time (on the CPU: compute seconds over wall).

``--model gat`` times the epochs of a GAT of the same width instead (8 heads of
``hidden / 8`` channels, one averaged output head; eager and, with ``--cuda-graph``,
replayed steps, whose self loops on padded blocks are built in fixed shapes,
`nn.padded_loops`). Of the PyG comparisons below only PyG's idiom is run for it, with
``gnnfuse.nn.GAT`` against PyG's ``GAT`` (8 heads, the same weights): its other
comparisons run on blocks, for which PyG has no GAT of gnnfuse's block models' layout.

PyG: when ``torch_geometric.loader.NeighborLoader`` can sample (it needs ``pyg-lib`` or
``torch-sparse``), a full epoch of PyG's loader (host sampling, ``--pyg-workers``
worker processes, pinned batches) feeding PyG's SAGEConv model. Always, and the only
PyG number when neither library is importable: *compute only*, PyG's SAGEConv model and
gnnfuse's stepping on the same batches from gnnfuse's loader (after checking that their
forward outputs agree from the same weights): both warmed up, then taking turns on each
batch, each step timed from an idle device with its host time (until the Python call
returns), device time (CUDA events) and wall time apart, and each model's host syncs in
one forward + backward counted. DKP: the fitted model's prediction error per layer, then
the three policies (always aggregate-first, always combine-first, DKP) warmed up and
taking turns on the same batches, timed the same way. PyG's idiom (``--no-pyg-idiom``
skips it): ``model(batch.x, batch.edge_index)`` with gnnfuse on the batch's graph, on a
graph made in the step, and PyG's layer, whole and trimmed (`idiom_labels`), timed the
same way after checking that the forwards agree.

The GPU machine has neither library and no network. torch-sparse (and torch-scatter, which
it imports) are sdists on PyPI; CPU-only wheels for its Python and torch build here
(a Python 3.12 venv with torch==2.11.0 installed, then ``FORCE_ONLY_CPU=1 python setup.py
bdist_wheel`` in each unpacked sdist: torch-sparse 0.6.18, torch-scatter 2.1.2, a few
minutes each on two cores) and travel in the git-ignored ``.whl/`` folder (the device
tool's README says how to install them there); the results name the sampler PyG used.

    python benchmarks/bench_minibatch.py --device cuda --max-batches 100    # products-like, H100
    python benchmarks/bench_minibatch.py --device cpu --dataset cora --epochs 1
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from gnnfuse.bench import synchronize
from gnnfuse.bench.host_syncs import HostSyncCounter
from gnnfuse.data import load_node_dataset
from gnnfuse.loader import STAGES, NeighborLoader
from gnnfuse.loader.hop_kernels import fused_hops
from gnnfuse.loader.stages import ComputeTimer
from gnnfuse.nn.block_models import build_block_model
from gnnfuse.training.captured_step import BlockStepCapture

from common import REPO_ROOT, environment, log, resolve_device, warn, write_atomically

PRODUCTS_TRAIN_NODES = 196_615        # ogbn-products' training split


# --- models ----------------------------------------------------------------------------
class PygSage(nn.Module):
    """PyG's SAGEConv stack with the parameter names of gnnfuse's `BlockGNN` (so one
    state dict loads into both); runs on blocks or on a PyG subgraph's edge_index."""

    def __init__(self, widths: list[int], dropout: float):
        super().__init__()
        from torch_geometric.nn import SAGEConv
        self.convs = nn.ModuleList(SAGEConv(a, b, aggr="mean") for a, b in zip(widths, widths[1:]))
        self.dropout = dropout

    def forward(self, x: torch.Tensor, graph: Any) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = F.dropout(x, self.dropout, self.training)
            if isinstance(graph, list):
                block = graph[i]
                x = conv((x, x[:block.num_dst]), block.edge_index, size=(block.num_src, block.num_dst))
            else:
                x = conv(x, graph)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


def pyg_can_sample() -> bool:
    try:
        import torch_geometric.typing as typing
    except ImportError:
        return False
    return bool(typing.WITH_PYG_LIB or typing.WITH_TORCH_SPARSE)


# --- timing ----------------------------------------------------------------------------
class StepClock:
    """Times training steps: CUDA events on the compute stream (the GPU's busy time) on
    a GPU, host seconds on the CPU; summed, or step by step, when asked."""

    def __init__(self, device: torch.device):
        self.device, self.pairs, self.host = device, [], []

    def run(self, step: Callable[[], None]) -> None:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            self.pairs.append((start, end))
        else:
            begin = time.perf_counter()
            step()
            self.host.append(time.perf_counter() - begin)

    def steps(self) -> list[float]:
        """Each step's seconds, in order."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return [start.elapsed_time(end) / 1e3 for start, end in self.pairs]
        return list(self.host)

    def seconds(self) -> float:
        return sum(self.steps())

    def spread_ms(self) -> dict[str, float]:
        """Median, 90th percentile and slowest step in ms: whether slow steps are a few
        outliers (a kernel compiled or tuned inside the timed epoch) or all of them."""
        steps = sorted(self.steps())
        if not steps:
            return {}
        nearest_rank = math.ceil(0.9 * len(steps)) - 1
        return {"median": 1e3 * statistics.median(steps), "p90": 1e3 * steps[nearest_rank],
                "max": 1e3 * steps[-1]}


class IsolatedStepClock:
    """Times steps one at a time from an idle device, splitting each into

    - host: until the step's Python call returns (tracing, bookkeeping, launches; on a
      GPU the kernels are still running then, unless the step waited for them),
    - device: between CUDA events recorded around the step (None on the CPU),
    - wall: until the device has finished it.

    A step that never waits on the device has wall ~ max(host, device); one that syncs
    mid-step pays host + device. The device is synchronized before each step, so no
    step's time carries another's queued work."""

    def __init__(self, device: torch.device):
        self.device = device
        self.host: list[float] = []
        self.wall: list[float] = []
        self._events: list[tuple[Any, Any]] = []

    def run(self, step: Callable[[], None]) -> None:
        cuda = self.device.type == "cuda"
        synchronize(self.device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        begin = time.perf_counter()
        step()
        returned = time.perf_counter()
        if cuda:
            end.record()
            self._events.append((start, end))
        synchronize(self.device)
        self.host.append(returned - begin)
        self.wall.append(time.perf_counter() - begin)

    def device_times(self) -> list[float] | None:
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize(self.device)
        return [start.elapsed_time(end) / 1e3 for start, end in self._events]

    def summary(self) -> dict[str, Any]:
        """Totals (s) and per-step medians (ms) of host, device and wall time."""
        out: dict[str, Any] = {"steps": len(self.wall)}
        for name, values in (("host", self.host), ("device", self.device_times()), ("wall", self.wall)):
            out[f"{name}_s"] = None if values is None else sum(values)
            out[f"{name}_median_ms"] = None if not values else 1e3 * statistics.median(values)
        return out

    def total(self) -> float:
        """The time a comparison uses: the device's on a GPU, the wall's on the CPU."""
        summary = self.summary()
        return summary["device_s"] if summary["device_s"] is not None else summary["wall_s"]

    def median(self) -> float:
        """`total`'s per-step median (ms): a few first-use steps do not move it."""
        summary = self.summary()
        return summary["device_median_ms"] if summary["device_median_ms"] is not None else summary["wall_median_ms"]


def turn_order(names: list[str], index: int) -> list[str]:
    """The order ``names`` take their turns on batch ``index``: every permutation in
    turn, so each one runs before each other one on half the batches. Whoever runs
    first on a batch pays its first uses (per-graph caches; a kernel's autotuning on a
    size class not seen before, shared by the orders that run the same kernels): a
    rotation of three put DKP before always-aggregate-first on two batches of three,
    and charged DKP most of their shared autotuning."""
    orders = list(itertools.permutations(names))
    return list(orders[index % len(orders)])


def blocks_of(batch: Any) -> Any:
    return batch.blocks


def host_syncs_per_step(model: nn.Module, batch: Any, graph_of: Callable[[Any], Any] = blocks_of) -> dict[str, int]:
    """The syncing ops (`HostSyncCounter`) of one forward + backward of ``model`` on ``batch``
    (its ``graph_of(batch)``; no optimizer step: Adam reads its step counts on the host by design)."""
    counter = HostSyncCounter()
    with counter:
        F.cross_entropy(model(batch.x, graph_of(batch))[:batch.batch_size], batch.y[:batch.batch_size]).backward()
    model.zero_grad(set_to_none=True)
    return dict(counter.syncs)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, graph: Any,
               y: torch.Tensor, rows: int) -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(x, graph)[:rows], y[:rows]).backward()
    optimizer.step()


def warm_up(loader: Any, steps: dict[str, Callable[[Any], None]], batches: int, device: torch.device) -> None:
    """Run each step on the first ``batches`` batches of an abandoned epoch: kernel
    compilation and allocator growth stay out of the timed epoch."""
    for index, batch in enumerate(loader):
        if index >= batches:
            break
        for step in steps.values():
            step(batch)
    synchronize(device)


def gnnfuse_epoch(loader: NeighborLoader, model: nn.Module, device: torch.device, warmup: int,
                  max_batches: int | None, cuda_graph: bool = False) -> dict[str, Any]:
    """One timed epoch of gnnfuse's loader and layers, after `warm_up`; with
    ``cuda_graph`` (a loader with ``static_shapes``) each step is replayed from a CUDA
    graph where `BlockStepCapture` can (Adam then keeps its step count on the device)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003, capturable=cuda_graph and device.type == "cuda")
    model.train()

    def step(b: Any) -> None:
        train_step(model, optimizer, b.x, b.blocks, b.y, b.batch_size)
    if cuda_graph:
        step = BlockStepCapture(step, optimizers=[optimizer], modules=[model], mode="on", features=loader.features,
                                short_batches="replay")
    warm_up(loader, {"gnnfuse": step}, warmup, device)
    loader.stage_times.reset()
    compute = ComputeTimer(loader.stage_times, device)      # CUDA events on the compute stream
    begin = time.perf_counter()
    batches, host = 0, 0.0
    for batch in loader:
        step_begin = time.perf_counter()
        with compute.step():
            step(batch)
        host += time.perf_counter() - step_begin
        batches += 1
        if max_batches is not None and batches >= max_batches:
            break
    synchronize(device)
    wall = time.perf_counter() - begin
    compute.flush()
    stages = loader.stage_times.totals()
    busy = stages["compute"]
    cell = {"epoch_s": wall, "batches": batches, "batches_per_s": batches / wall, "stages_s": stages,
            "busy_fraction": busy / wall, "busy_s": busy, "step_host_s": host}
    if cuda_graph:
        cell["cuda_graph"] = {"status": step.status, "replayed": step.replayed, "eager": step.eager,
                              "capacities": str(loader.capacities), "deferred": loader._maker.deferred}
    return cell


COUNTED_BATCHES = 5


def loader_alone(graph: Any, x: torch.Tensor, y: torch.Tensor, train_idx: torch.Tensor, args: argparse.Namespace,
                 device: torch.device) -> dict[str, Any]:
    """The loader with nothing else running (features on ``device``): its batches/s --
    whether it can keep up with the training steps at all -- and stage seconds; then, on
    `COUNTED_BATCHES` batches prepared without prefetch (after one more), the aten ops
    and host syncs per batch of each stage (`minibatch_host.counting_stage_times`; the
    counting slows the ops, so no times from that run)."""
    from minibatch_host import counting_stage_times

    def new_loader(prefetch: int) -> NeighborLoader:
        return NeighborLoader(graph, args.fanout, args.batch_size, input_nodes=train_idx, shuffle=True, x=x, y=y,
                              device=device, prefetch=prefetch)
    loader = new_loader(args.prefetch)
    take(loader, args.warmup)
    synchronize(device)
    loader.stage_times.reset()
    begin, batches = time.perf_counter(), 0
    for _ in loader:
        batches += 1
        if args.max_batches is not None and batches >= args.max_batches:
            break
    synchronize(device)
    wall = time.perf_counter() - begin
    cell: dict[str, Any] = {"batches": batches, "seconds": wall, "batches_per_s": batches / wall,
                            "stages_s": loader.stage_times.totals()}
    counting = new_loader(0)
    counting.stage_times = counting_stage_times()
    take(counting, 1)
    counting.stage_times.reset()
    take(counting, COUNTED_BATCHES)       # stages only: an epoch's start (its seed drawn on the host) is not in one
    times = counting.stage_times
    cell["per_batch"] = {stage: {"aten_ops": sum(times.ops[stage].values()) / COUNTED_BATCHES,
                                 "host_syncs": sum(times.syncs[stage].values()) / COUNTED_BATCHES,
                                 "syncs_by_op": {op: n / COUNTED_BATCHES for op, n in times.syncs[stage].items()}}
                         for stage in times.ops}
    return cell


def compute_only(loader: NeighborLoader, models: dict[str, nn.Module], device: torch.device, warmup: int,
                 max_batches: int | None, graphs: dict[str, Callable[[Any], Any]] | None = None) -> dict[str, Any]:
    """Training-step times of each model on the same batches of gnnfuse's loader, each
    on its ``graphs[name](batch)`` (default the blocks): all
    warmed up on a whole epoch's batches, at least ``warmup`` (compilation, autotuning of
    every size class the epoch reaches, allocator growth: unpadded batches' sizes vary,
    and 20 batches left a size class to autotune inside the timed loop, 7.4 s for what
    took 1.4 s after it), then each batch stepped by each, every order
    of the models in turn (`turn_order`), each step timed from an idle device
    (`IsolatedStepClock`: host, device and wall time apart). Also counts each model's
    host syncs in one forward + backward."""
    graphs = {name: (graphs or {}).get(name, blocks_of) for name in models}
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=0.003) for name, m in models.items()}
    steps = {name: (lambda b, m=model, o=optimizers[name], g=graphs[name]: train_step(m, o, b.x, g(b), b.y,
                                                                                       b.batch_size))
             for name, model in models.items()}
    for model in models.values():
        model.train()
    warm_up(loader, steps, max(warmup, len(loader) if max_batches is None else min(len(loader), max_batches)), device)
    clocks = {name: IsolatedStepClock(device) for name in models}
    syncs: dict[str, dict[str, int]] = {}
    batches = 0
    for batch in loader:
        if not syncs:
            syncs = {name: host_syncs_per_step(model, batch, graphs[name]) for name, model in models.items()}
        for name in turn_order(list(models), batches):
            clocks[name].run(lambda: steps[name](batch))
        batches += 1
        if max_batches is not None and batches >= max_batches:
            break
    return {"batches": batches, "host_syncs_per_step": syncs} | {name: c.summary() for name, c in clocks.items()}


# the PyG-idiom cell's models: gnnfuse on the batch's edge_index (its graph remembered for
# it, built ahead once the loader has seen the idiom: `loader.pyg_batch`), gnnfuse on a
# copy of it (a new tensor: the graph made in the step, as before the loader built it),
# and PyG's layer on the edge_index; then the same three as PyG's model class trimming
# its layers (``num_sampled_nodes_per_hop=``: PyG's ``trim_to_layer``, `Trimmed`)
def idiom_labels(model: str) -> dict[str, str]:
    """The idiom cell's model names and row labels, for ``--model`` ``model``."""
    layer, net = IDIOM_CLASSES[model]
    return {"gnnfuse": "gnnfuse, the batch's graph", "gnnfuse_made_in_step": "gnnfuse, graph made in the step",
            "pyg": f"PyG {layer}",
            "gnnfuse_trimmed": f"trimmed: gnnfuse.nn.{net}, the batch's graphs",
            "gnnfuse_trimmed_made_in_step": f"trimmed: gnnfuse.nn.{net}, graphs made in the step",
            "pyg_trimmed": f"trimmed: PyG's {net}"}


# ``--model`` -> (PyG's layer, the PyG model class gnnfuse.nn mirrors by name and arguments)
IDIOM_CLASSES = {"sage": ("SAGEConv", "GraphSAGE"), "gat": ("GATConv", "GAT")}


class Trimmed(nn.Module):
    """A PyG ``BasicGNN`` run as PyG's hierarchical sampling tutorial runs it, on
    ``(edge_index, batch)``: ``model(x, edge_index, num_sampled_nodes_per_hop=...,
    num_sampled_edges_per_hop=...)``, each layer on the hops it still needs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, graph: tuple[torch.Tensor, Any]) -> torch.Tensor:
        edge_index, batch = graph
        return self.model(x, edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                          num_sampled_edges_per_hop=batch.num_sampled_edges)


def basic_models(dataset: Any, args: argparse.Namespace) -> tuple[nn.Module, nn.Module]:
    """gnnfuse.nn's and PyG's model of ``args.model``'s class (`IDIOM_CLASSES`; GAT with
    8 heads of ``hidden / 8`` channels, as the epochs' model), which share parameter
    names and layout (`pyg_idiom_cell` gives PyG's gnnfuse's weights)."""
    import gnnfuse.nn
    import torch_geometric.nn
    net = IDIOM_CLASSES[args.model][1]
    shape = (dataset.num_features, args.hidden, len(args.fanout), dataset.num_classes)
    extra = {"heads": 8} if args.model == "gat" else {}
    ours = getattr(gnnfuse.nn, net)(*shape, dropout=args.dropout, **extra)
    return ours, getattr(torch_geometric.nn, net)(*shape, dropout=args.dropout, **extra)


def trimmed_models(ours: nn.Module, dataset: Any, args: argparse.Namespace, device: torch.device
                   ) -> dict[str, nn.Module]:
    """gnnfuse's and PyG's model of ``args.model``'s class (`basic_models`: SAGE with mean
    aggregation), all from ``ours``' weights (the same parameter names), each `Trimmed`."""
    first, pyg = basic_models(dataset, args)
    built = {"gnnfuse_trimmed": first, "gnnfuse_trimmed_made_in_step": copy.deepcopy(first), "pyg_trimmed": pyg}
    for model in built.values():
        model.load_state_dict(ours.state_dict())
    return {name: Trimmed(model).to(device) for name, model in built.items()}


def pyg_idiom_cell(dataset: Any, graph: Any, train_idx: torch.Tensor, ours: nn.Module, pyg: nn.Module,
                   args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """`compute_only` of PyG's idiom, ``model(batch.x, batch.edge_index)[:batch.batch_size]``,
    the way a PyG script moved to gnnfuse's layers trains (`idiom_labels`), on a loader of
    its own (which learns the idiom in the warm-up), from the models' current weights."""
    loader = NeighborLoader(graph, args.fanout, args.batch_size, input_nodes=train_idx, shuffle=True,
                            x=dataset.x.to(device), y=dataset.y.to(device), device=device, prefetch=args.prefetch)
    models = {"gnnfuse": ours, "gnnfuse_made_in_step": copy.deepcopy(ours), "pyg": pyg,
              **trimmed_models(ours, dataset, args, device)}
    graphs = {"gnnfuse": lambda b: b.edge_index, "gnnfuse_made_in_step": lambda b: b.edge_index.clone(),
              "pyg": lambda b: b.edge_index, "gnnfuse_trimmed": lambda b: (b.edge_index, b),
              "gnnfuse_trimmed_made_in_step": lambda b: (b.edge_index.clone(), b),
              "pyg_trimmed": lambda b: (b.edge_index, b)}
    try:
        error = check_same_forward(ours, pyg, loader, lambda batch: batch.edge_index)
        if error > 1e-4:
            warn(f"gnnfuse and PyG forwards on edge_index differ (max rel err {error:.2e}); compute times are "
                 "not comparable")
        return compute_only(loader, models, device, args.warmup, args.max_batches, graphs) | {"max_rel_err": error}
    finally:
        loader.close()


def take(loader: NeighborLoader, count: int) -> list[Any]:
    """The next ``count`` batches, over as many epochs as that takes."""
    out: list[Any] = []
    while len(out) < count:
        for batch in loader:
            out.append(batch)
            if len(out) == count:
                break
    return out


def dkp_cells(loader: NeighborLoader, model: nn.Module, device: torch.device, args: argparse.Namespace
              ) -> dict[str, Any]:
    """GraphTensor's dynamic kernel placement on this model: fit on the kernel times of
    ``--dkp-calibration`` batches, the fitted model's prediction error per layer on as
    many further batches (both orders' predicted vs measured seconds), and training
    steps on the same batches always aggregating first, always combining first, and as
    the model chooses."""
    from gnnfuse.nn.conv import _AGGREGATORS
    from gnnfuse.nn.placement import FixedPlacement, calibrate, install, kernel_times
    held = take(loader, 2 * args.dkp_calibration)
    placement = calibrate(model, held[:args.dkp_calibration])
    errors: dict[int, list[float]] = {}
    for batch in held[args.dkp_calibration:]:
        for index, conv in enumerate(model.convs):
            f_in, f_out, graph = conv.lin_l.in_features, conv.out_channels, batch.blocks[index].graph
            measured = {(k.kind, k.rows, k.width_in): k.seconds
                        for k in kernel_times(graph, _AGGREGATORS[conv.aggr], f_in, f_out, index > 0)}
            matmul = "matmul" if index > 0 else "matmul-weight-only"
            aggregate_x = "aggregate" if index > 0 else "aggregate-forward-only"
            actual = {"aggregate-first": measured[aggregate_x, graph.num_dst_nodes, f_in]
                      + measured[matmul, graph.num_dst_nodes, f_in],
                      "combine-first": measured[matmul, graph.num_src_nodes, f_in]
                      + measured["aggregate", graph.num_dst_nodes, f_out]}
            predicted = placement.order_times(graph.num_src_nodes, graph.num_dst_nodes, graph.num_edges, f_in, f_out,
                                              index > 0)
            errors.setdefault(index, []).extend(abs(predicted[o] - actual[o]) / actual[o] for o in actual)
    del held
    policies = {"aggregate-first": FixedPlacement("aggregate-first"), "combine-first": FixedPlacement("combine-first"),
                "dkp": placement}
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)

    def step(name: str, batch: Any) -> None:
        install(model, policies[name])
        train_step(model, optimizer, batch.x, batch.blocks, batch.y, batch.batch_size)
    # Every policy compiles and tunes its kernels (each order runs its aggregation at
    # another width) before any is timed; then they take turns on each batch.
    warm_up(loader, {name: lambda b, n=name: step(n, b) for name in policies}, args.warmup, device)
    placement.decisions.clear()
    clocks = {name: IsolatedStepClock(device) for name in policies}
    batches_run = 0
    for batch in loader:
        for name in turn_order(list(policies), batches_run):
            clocks[name].run(lambda: step(name, batch))
        batches_run += 1
        if args.max_batches is not None and batches_run >= args.max_batches:
            break
    install(model, None)
    seconds = {name: clock.total() for name, clock in clocks.items()}
    medians = {name: clock.median() for name, clock in clocks.items()}
    fixed = ("aggregate-first", "combine-first")
    return {"coefficients": placement.coefficients, "model": placement.describe(), "batches": batches_run,
            "prediction_error_per_layer": {i: sum(e) / len(e) for i, e in errors.items()},
            "step_s": seconds, "steps": {name: clock.summary() for name, clock in clocks.items()},
            "speedup_vs": {name: seconds[name] / seconds["dkp"] for name in fixed},
            "median_speedup_vs": {name: medians[name] / medians["dkp"] for name in fixed}}


def pyg_epoch(dataset: Any, train_idx: torch.Tensor, model: nn.Module, args: argparse.Namespace,
              device: torch.device) -> dict[str, Any]:
    """One timed epoch of PyG's NeighborLoader feeding PyG's model (after a warm-up)."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader as PygNeighborLoader
    data = Data(x=dataset.x, y=dataset.y, edge_index=dataset.graph.edge_index, num_nodes=dataset.graph.num_nodes)
    workers = args.pyg_workers
    loader = PygNeighborLoader(data, num_neighbors=args.fanout, batch_size=args.batch_size, input_nodes=train_idx,
                               shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                               pin_memory=device.type == "cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    model.train()

    def step(batch: Any) -> None:
        batch = batch.to(device, non_blocking=True)
        train_step(model, optimizer, batch.x, batch.edge_index, batch.y, batch.batch_size)

    warm_up(loader, {"pyg": step}, args.warmup, device)
    clock = StepClock(device)
    begin, batches = time.perf_counter(), 0
    for batch in loader:
        clock.run(lambda: step(batch))
        batches += 1
        if args.max_batches is not None and batches >= args.max_batches:
            break
    synchronize(device)
    wall = time.perf_counter() - begin
    return {"epoch_s": wall, "batches": batches, "batches_per_s": batches / wall,
            "busy_fraction": clock.seconds() / wall, "workers": workers, "sampler": pyg_sampler()}


def pyg_sampler() -> str:
    """The package PyG's NeighborLoader samples with here (pyg-lib when installed, else
    torch-sparse), with its version: the two differ several-fold in speed."""
    import torch_geometric.typing as typing
    name = "pyg_lib" if typing.WITH_PYG_LIB else "torch_sparse"
    module = __import__(name)
    return f"{name.replace('_', '-')} {getattr(module, '__version__', '?')}"


# --- the run ---------------------------------------------------------------------------
def training_seeds(train_mask: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """``count`` training vertices (all when 0 or more than the split has), chosen at random."""
    ids = train_mask.nonzero().flatten()
    if 0 < count < ids.numel():
        ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed))[:count]].sort().values
    return ids


def check_same_forward(ours: nn.Module, pyg: nn.Module, loader: NeighborLoader,
                       graph: Callable[[Any], Any] = lambda batch: batch.blocks) -> float:
    """max |ours - PyG| / max |PyG| of both models' eval forward on one batch's
    ``graph(batch)`` (its blocks; its ``edge_index`` for PyG's idiom), from the same
    weights: a speedup is only reported for a model that computes the same thing."""
    pyg.load_state_dict(ours.state_dict())
    ours.eval(), pyg.eval()
    batch = next(iter(loader))
    with torch.no_grad():
        a, b = ours(batch.x, graph(batch)), pyg(batch.x, graph(batch))
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def load_problem(args: argparse.Namespace, device: torch.device):
    """The data set, the training seeds the epoch draws batches from (ogbn-products'
    training-set size on products-like unless ``--train-nodes`` says otherwise) and the
    graph on ``device`` with its CSR built, so no timed batch pays for it."""
    dataset = load_node_dataset(args.dataset, args.data_root)
    train_count = args.train_nodes if args.train_nodes is not None else (
        PRODUCTS_TRAIN_NODES if args.dataset == "products-like" else 0)
    train_idx = training_seeds(dataset.train_mask, train_count, args.seed)
    graph = dataset.graph.to(device)
    graph.csr()
    return dataset, train_idx, graph


def idiom_cell(dataset: Any, graph: Any, train_idx: torch.Tensor, ours: nn.Module, pyg: nn.Module,
               args: argparse.Namespace, device: torch.device, results: dict[str, Any],
               save: Callable[[dict[str, Any]], None]) -> None:
    """`pyg_idiom_cell` into ``results``, saved and logged."""
    cell = pyg_idiom_cell(dataset, graph, train_idx, ours, pyg, args, device)
    results["pyg_idiom"] = cell
    save(results)
    log(f"PyG's idiom model(batch.x, batch.edge_index), same {cell['batches']} batches: " + "; ".join(
        f"{name} {step_times(cell[name])}" for name in idiom_labels(args.model)) +
        f"; forward max rel err {cell['max_rel_err']:.1e}")


def epoch_model(args: argparse.Namespace, dataset: Any) -> nn.Module:
    """The model the epochs train: GraphSAGE, or GAT with 8 heads of ``hidden / 8``
    channels (the same hidden width) and one averaged output head."""
    hidden = args.hidden if args.model == "sage" else args.hidden // 8
    return build_block_model(args.model, dataset.num_features, dataset.num_classes, hidden, args.dropout,
                             len(args.fanout))


def run(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every cell in turn, ``save``-ing the results after each, so a run stopped by the
    device machine's time limit keeps what it measured."""
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    begin = time.perf_counter()
    dataset, train_idx, graph = load_problem(args, device)
    synchronize(device)
    log(f"[{args.dataset}] {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, {dataset.num_features} "
        f"features, {train_idx.numel():,} training seeds; loaded and on {device} in "
        f"{time.perf_counter() - begin:.1f} s")
    widths = [dataset.num_features] + [args.hidden] * (len(args.fanout) - 1) + [dataset.num_classes]
    fused = "Triton" if device.type == "cuda" else "Numba"
    hops = f"fused {fused} kernels" if fused_hops(device, max(args.fanout), False) else "vectorized torch ops"
    results: dict[str, Any] = {"config": {**{k: v for k, v in vars(args).items() if k != "json"},
                                          "train_seeds": train_idx.numel(), "hops": hops},
                               "environment": environment(device), "gnnfuse": {}}
    cell = loader_alone(graph, dataset.x.to(device), dataset.y.to(device), train_idx, args, device)
    results["loader"] = cell
    save(results)
    log(f"loader alone: {cell['batches']} batches in {cell['seconds']:.2f} s ({cell['batches_per_s']:.1f}/s); per "
        "batch: " + "; ".join(f"{stage} {c['aten_ops']:.0f} ops, {c['host_syncs']:.1f} syncs"
                              for stage, c in cell["per_batch"].items()))
    feature_devices = [p for p in args.feature_devices if p == "device" or device.type == "cuda"]
    # (feature placement, worker processes, loader threads): the in-process loader at each
    # thread count, then each worker-process count
    setups = [(place, 0, threads) for place in feature_devices if args.loader_thread for threads in args.loader_threads]
    setups += [(place, w, 1) for place in feature_devices for w in args.workers if w > 0]
    graphs = {"off": [False], "on": [True], "both": [False, True]}[args.cuda_graph]
    for (place, workers, threads), captured in itertools.product(setups, graphs):
        torch.manual_seed(args.seed)
        model = epoch_model(args, dataset).to(device)
        x = dataset.x.to(device) if place == "device" else dataset.x.pin_memory()
        loader = NeighborLoader(graph, args.fanout, args.batch_size, input_nodes=train_idx, shuffle=True, x=x,
                                y=dataset.y.to(device), device=device, feature_device=place, prefetch=args.prefetch,
                                num_workers=workers, prefetch_threads=threads, static_shapes=captured,
                                deferred=captured and place == "device" and args.deferred)
        label = place if not workers else f"{place}, {workers} worker process{'es' if workers > 1 else ''}"
        label += f", {threads} loader threads" if threads > 1 else ""
        label += ", CUDA graph" if captured else ""
        for epoch in range(args.epochs):
            cell = gnnfuse_epoch(loader, model, device, args.warmup if epoch == 0 else 0, args.max_batches, captured)
            results["gnnfuse"].setdefault(label, []).append(cell)
            save(results)
            split = " ".join(f"{s} {cell['stages_s'][s]:.2f}s" for s in STAGES)
            graph_note = (f" | CUDA graph: {cell['cuda_graph']['replayed']} replayed, {cell['cuda_graph']['eager']} "
                          f"eager, {cell['cuda_graph']['status']}" if captured else "")
            log(f"gnnfuse, features on {label}: epoch {cell['epoch_s']:.2f} s, {cell['batches']} batches "
                f"({cell['batches_per_s']:.1f}/s), busy {100 * cell['busy_fraction']:.0f}% | {split}{graph_note}")
        loader.close()
        del x, loader
    if args.model != "sage":
        log("the comparisons on blocks (compute only, DKP) are SAGE's; skipped for " + args.model)
        if args.pyg_idiom:
            torch.manual_seed(args.seed)
            ours, pyg = basic_models(dataset, args)
            idiom_cell(dataset, graph, train_idx, ours.to(device), pyg.to(device), args, device, results, save)
        return results
    torch.manual_seed(args.seed)
    ours = build_block_model("sage", dataset.num_features, dataset.num_classes, args.hidden, args.dropout,
                             len(args.fanout)).to(device)
    pyg = PygSage(widths, args.dropout).to(device)
    loader = NeighborLoader(graph, args.fanout, args.batch_size, input_nodes=train_idx, shuffle=True,
                            x=dataset.x.to(device), y=dataset.y.to(device), device=device, prefetch=args.prefetch)
    error = check_same_forward(ours, pyg, loader)
    if error > 1e-4:
        warn(f"gnnfuse and PyG SAGE forwards differ (max rel err {error:.2e}); compute times are not comparable")
    cell = compute_only(loader, {"gnnfuse": ours, "pyg": pyg}, device, args.warmup, args.max_batches) | {
        "max_rel_err": error}
    results["compute_only"] = cell
    save(results)
    log(f"compute only, same {cell['batches']} batches, each step from an idle device: gnnfuse "
        f"{step_times(cell['gnnfuse'])}; PyG SAGEConv {step_times(cell['pyg'])}; host syncs per forward + backward: "
        f"gnnfuse {sum(cell['host_syncs_per_step']['gnnfuse'].values())}, PyG "
        f"{sum(cell['host_syncs_per_step']['pyg'].values())}; forward max rel err {error:.1e}")
    if args.pyg_idiom:
        torch.manual_seed(args.seed)
        idiom_cell(dataset, graph, train_idx, ours, pyg, args, device, results, save)
    if args.dkp_calibration:
        torch.manual_seed(args.seed)
        cell = dkp_cells(loader, ours, device, args)
        results["dkp"] = cell
        save(results)
        log(cell["model"])
        log("DKP prediction error per layer: " + ", ".join(
            f"layer {i} {100 * e:.1f}%" for i, e in cell["prediction_error_per_layer"].items()))
        log(f"DKP training steps over {cell['batches']} batches, policies warmed up and taking turns: " + "; ".join(
            f"{name} {step_times(summary)}" for name, summary in cell["steps"].items()))
    if args.pyg_loader and pyg_can_sample():
        torch.manual_seed(args.seed)
        try:
            cell = pyg_epoch(dataset, train_idx, PygSage(widths, args.dropout).to(device), args, device)
        except Exception as error:          # keep the gnnfuse results of this run
            warn(f"PyG's loader epoch failed: {type(error).__name__}: {error}")
            results["pyg"] = {"error": f"{type(error).__name__}: {error}"}
            save(results)
            return results
        results["pyg"] = cell
        save(results)
        log(f"PyG NeighborLoader + SAGEConv: epoch {cell['epoch_s']:.2f} s, {cell['batches']} batches, "
            f"busy {100 * cell['busy_fraction']:.0f}%")
    else:
        reason = ("not run: PyG's NeighborLoader cannot sample here (neither pyg-lib nor torch-sparse is "
                  "importable), so only the compute-only comparison is against PyG" if args.pyg_loader
                  else "skipped (--no-pyg-loader)")
        results["pyg"] = {"skipped": reason}
        log(f"PyG's NeighborLoader epoch {reason}")
    save(results)
    return results


STEP_COLUMNS = ("device s", "host s", "wall s", "median device ms", "median host ms", "median wall ms")


def _value(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def step_row(summary: dict[str, Any]) -> str:
    """An `IsolatedStepClock.summary` as the cells of `STEP_COLUMNS`."""
    return " | ".join([*(_value(summary[f"{k}_s"], ".3f") for k in ("device", "host", "wall")),
                       *(_value(summary[f"{k}_median_ms"], ".2f") for k in ("device", "host", "wall"))])


def step_times(summary: dict[str, Any]) -> str:
    """``device 0.49 s, host 0.31 s, wall 0.52 s`` for a log line."""
    return ", ".join(f"{k} {summary[f'{k}_s']:.3f} s" for k in ("device", "host", "wall")
                     if summary[f"{k}_s"] is not None)


def step_table(cell: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """A `compute_only` cell's models (``labels``: name -> row label) as a table of
    `STEP_COLUMNS` and host syncs."""
    syncs = cell["host_syncs_per_step"]
    return (["| model | " + " | ".join(STEP_COLUMNS) + " | host syncs per fwd+bwd |",
             "|---|" + "---|" * (len(STEP_COLUMNS) + 1)]
            + [f"| {label} | {step_row(cell[name])} | {sum(syncs[name].values())} |" for name, label in labels.items()])


def markdown(results: dict[str, Any]) -> str:
    config, env = results["config"], results["environment"]
    model = {"sage": "GraphSAGE", "gat": "GAT, 8 heads"}[config.get("model", "sage")]
    lines = [f"# Mini-batch training epoch (sampled, {model})", "",
             f"{config['dataset']}, {len(config['fanout'])} layers hidden {config['hidden']}, fanouts "
             f"{','.join(map(str, config['fanout']))}, batch {config['batch_size']}, {config['train_seeds']:,} "
             f"training seeds; {env['device_name']}, torch {env['torch']}, commit "
             f"{(env['git_commit'] or 'unknown')[:12]}{' (dirty)' if env['git_dirty'] else ''}, {env['date']}; "
             f"hops sampled and reindexed by {config.get('hops', 'vectorized torch ops')} (`loader.hop_kernels`).", ""]
    pyg = results.get("pyg") or {}
    epochs = bool(results["gnnfuse"]) or bool(pyg and "error" not in pyg and "skipped" not in pyg)
    if not epochs:     # a run of the loader and the comparisons only (no loader thread, no workers)
        lines.append("No training epochs were timed in this run.")
    else:
        lines += [
             "Stage seconds are summed over batches; sample/reindex/lookup/transfer run in the loader's "
             "background thread (or its worker processes, where the features column says so; there transfer is "
             "the training process rebuilding each batch from the shared memory), overlapped with "
             "compute, each timed on a GPU by CUDA events on the stream it "
             "queues its work on (the loader's; a host-side lookup by the host clock); compute = the training "
             "steps' spans between CUDA events on the compute stream (a span includes gaps where the stream "
             "waited for the host's launches, so busy is an upper bound); wait = time the training loop waited "
             "for a batch; busy = compute / epoch wall time; step host = until each step's Python call "
             "returned.", "",
             "| loader | features | epoch s | batches/s | busy | " + " | ".join(STAGES) + " | step host |",
             "|---|---|---|---|---|" + "---|" * (len(STAGES) + 1)]
    for place, cells in results["gnnfuse"].items():
        for cell in cells:
            stages = " | ".join(f"{cell['stages_s'][s]:.2f}" for s in STAGES)
            lines.append(f"| gnnfuse | {place} | {cell['epoch_s']:.2f} | {cell['batches_per_s']:.1f} | "
                         f"{100 * cell['busy_fraction']:.0f}% | {stages} | {cell['step_host_s']:.2f} |")
    if "error" in pyg:
        lines += ["", f"PyG's NeighborLoader epoch failed: {pyg['error']}"]
    elif "skipped" in pyg:
        lines += ["", f"PyG's NeighborLoader epoch: {pyg['skipped']}."]
    elif pyg:
        sampler = f", {pyg['sampler']} sampler" if "sampler" in pyg else ""
        lines.append(f"| PyG ({pyg['workers']} workers{sampler}) | host | {pyg['epoch_s']:.2f} | {pyg['batches_per_s']:.1f} | "
                     f"{100 * pyg['busy_fraction']:.0f}% |" + " – |" * (len(STAGES) + 1))
    alone = results.get("loader")
    if alone is not None:
        stages = ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in alone["stages_s"].items() if seconds)
        lines += ["", "## The loader alone (features on the device, no training)", "",
                  f"{alone['batches']} batches in {alone['seconds']:.2f} s ({alone['batches_per_s']:.1f} batches/s); "
                  f"stage seconds {stages}.", "",
                  f"Per batch ({COUNTED_BATCHES} batches, no prefetch; reindex includes building the blocks' graphs "
                  "and layouts):", "", "| stage | aten ops | host syncs | by op |", "|---|---|---|---|"]
        lines += [f"| {stage} | {c['aten_ops']:.0f} | {c['host_syncs']:.1f} | "
                  f"{', '.join(f'{op} {n:g}' for op, n in c['syncs_by_op'].items()) or '–'} |"
                  for stage, c in alone["per_batch"].items()]
    compute = results.get("compute_only")
    if compute is not None:
        lines += ["", f"## Compute only (same {compute['batches']} batches of gnnfuse's loader, training step)", "",
                  "Both models warmed up on the first batches, then taking turns on each batch (who goes first "
                  "alternates); each step starts from an idle device. host = until the step's Python call returns, "
                  "device = CUDA events around the step, wall = until the device finished it.", ""]
        lines += step_table(compute, {"gnnfuse": "gnnfuse", "pyg": "PyG SAGEConv"})
        lines += ["", f"Forward max rel err {compute['max_rel_err']:.1e}."]
    idiom = results.get("pyg_idiom")
    if idiom is not None:
        net = IDIOM_CLASSES[config.get("model", "sage")][1]
        lines += ["", f"## PyG's idiom: `model(batch.x, batch.edge_index)` (same {idiom['batches']} batches)", "",
                  "Each model runs every layer on the batch's whole subgraph, as a PyG script does; gnnfuse's "
                  "layers find the graph the loader built ahead for the batch's `edge_index`, or, given a copy "
                  "of it, make the graph in the step (what they did before the loader built it). Trimmed: "
                  f"PyG's `{net}` model with `num_sampled_nodes_per_hop=` (`trim_to_layer`), each layer on "
                  f"the hops it still needs, gnnfuse's (`gnnfuse.nn.{net}`) on the prefix graphs the loader "
                  "built ahead, or made in the step. All warmed up on the first batches, then taking turns on "
                  "each batch (every order in turn), each step from an idle device: host = until the step's "
                  "Python call returns, device = CUDA events around it, wall = until the device finished it.", ""]
        lines += step_table(idiom, idiom_labels(config.get("model", "sage")))
        if "max_rel_err" in idiom:
            lines += ["", f"Forward on `edge_index` max rel err {idiom['max_rel_err']:.1e}."]
    dkp = results.get("dkp")
    if dkp:
        errors = ", ".join(f"layer {i} {100 * e:.1f}%" for i, e in dkp["prediction_error_per_layer"].items())
        lines += ["", "## Dynamic kernel placement (SAGE layers)", "", "```", dkp["model"], "```", "",
                  f"Prediction error (mean |predicted - measured| / measured, both orders): {errors}.", "",
                  f"Training steps over the same {dkp['batches']} batches, every policy warmed up first, then the "
                  "three taking turns on each batch (every order in turn, so each policy runs before each other "
                  "on half the batches), each step from an idle device:", "",
                  "| policy | " + " | ".join(STEP_COLUMNS) + " |", "|---|" + "---|" * len(STEP_COLUMNS)]
        lines += [f"| {name} | {step_row(summary)} |" for name, summary in dkp["steps"].items()]
        lines += ["", f"DKP speedup x{dkp['speedup_vs']['aggregate-first']:.2f} over always aggregate-first, "
                  f"x{dkp['speedup_vs']['combine-first']:.2f} over always combine-first (device time on a GPU, wall "
                  "on the CPU); on the per-step medians "
                  f"x{dkp['median_speedup_vs']['aggregate-first']:.2f} and "
                  f"x{dkp['median_speedup_vs']['combine-first']:.2f}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dataset", default="products-like")
    parser.add_argument("--data-root", help="folder of the real data sets (default: $GNNFUSE_DATA, ../shared/data)")
    parser.add_argument("--fanout", type=lambda s: [int(k) for k in s.split(",")], default=[15, 10, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--model", choices=("sage", "gat"), default="sage",
                        help="the epochs' model (gat: 8 heads of hidden/8 channels); of the PyG comparisons "
                             "gat runs PyG's idiom only")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per feature placement (default 1)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first (default 3)")
    parser.add_argument("--max-batches", type=int, help="stop each timed epoch after this many batches")
    parser.add_argument("--train-nodes", type=int, help="training seeds per epoch (default: ogbn-products' "
                        f"{PRODUCTS_TRAIN_NODES:,} for products-like, else the whole split; 0: the whole split)")
    parser.add_argument("--prefetch", type=int, default=2, help="batches the loader prepares ahead (default 2)")
    parser.add_argument("--pyg-workers", type=int, default=8, help="PyG loader worker processes (default 8)")
    parser.add_argument("--workers", type=lambda s: [int(k) for k in s.split(",")], default=[1],
                        help="also time an epoch with this many loader worker processes, per comma-separated "
                             "count and feature placement (default 1; 0 adds none)")
    parser.add_argument("--loader-threads", type=lambda s: [int(k) for k in s.split(",")], default=[1],
                        help="prefetch threads of the in-process loader, comma-separated: one setup each (default 1)")
    parser.add_argument("--no-loader-thread", dest="loader_thread", action="store_false",
                        help="skip the epochs whose batches come from the loader's thread (no worker processes)")
    parser.add_argument("--feature-devices", type=lambda s: s.split(","), default=["device", "pinned"],
                        help="feature placements to time epochs with (default device,pinned; pinned on a GPU only)")
    parser.add_argument("--cuda-graph", choices=("off", "on", "both"), default="off",
                        help="replay the training steps from a CUDA graph (loader with static_shapes, "
                             "gnnfuse.training.BlockStepCapture): off, on, or both, one epoch after the other")
    parser.add_argument("--no-deferred", dest="deferred", action="store_false",
                        help="with --cuda-graph: the loader gathers the feature rows and builds the layouts "
                             "(default with features on the device: the replayed step does, loader.static_shapes)")
    parser.add_argument("--no-pyg-loader", dest="pyg_loader", action="store_false",
                        help="skip the epoch with PyG's NeighborLoader")
    parser.add_argument("--no-pyg-idiom", dest="pyg_idiom", action="store_false",
                        help="skip the compute-only cell of PyG's idiom, model(batch.x, batch.edge_index)")
    parser.add_argument("--dkp-calibration", type=int, default=4, help="batches whose kernel times fit the DKP "
                        "cost model (and as many to measure its error); 0 skips the DKP measurement (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here (default benchmarks/results/minibatch_<device>.json, "
                                       "with a .md beside it)")
    args = parser.parse_args(argv)
    path = Path(args.json) if args.json else REPO_ROOT / "benchmarks" / "results" / f"minibatch_{args.device}.json"

    def save(results: dict[str, Any]) -> None:
        write_atomically(path, json.dumps(results, indent=1, default=str) + "\n")
        write_atomically(path.with_suffix(".md"), markdown(results))

    run(args, save)
    log(f"wrote {path} and {path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
