"""Full-graph training step, gnnfuse against PyG (eager and torch.compile'd), in one process.

`run_bench` loads a data set once, builds the same two-layer model from gnnfuse's and
PyG's layers with one set of initial weights, checks that their eval-mode forwards agree,
then times training steps (forward, loss on the training nodes, backward, Adam) for each
framework. A framework that fails (torch.compile on an unsupported set-up, OOM) gets a
status instead of a time; the run goes on. The ``gnnfuse bench`` command and
benchmarks/bench_training.py (the multi-data-set, results-merging driver) both use this
module, so models, timing and memory accounting have one implementation.

PyG is the outside oracle here, not a dependency of gnnfuse: ``pip install 'gnnfuse[bench]'``.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import signal
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from . import nn as gnn_nn
from .data import DATASET_NAMES, load_node_dataset
from .graph import Graph

MODELS = ("gcn", "gat", "sage")
FRAMEWORKS = ("gnnfuse", "pyg", "pyg-compile")

HIDDEN = 64                  # gcn and sage hidden width
GAT_HEADS, GAT_HIDDEN = 8, 8  # gat first layer: 8 heads x 8 channels, concatenated
DROPOUT = 0.5
LR, WEIGHT_DECAY = 0.01, 5e-4
COMPILE_EXTRA_WARMUP = 5     # torch.compile compiles (and may recompile once) in its first steps
REL_ERR_LIMIT = 1e-3         # float32 forward disagreement beyond this is a bug, not rounding


# --- PyG -------------------------------------------------------------------------------
class MissingDependency(RuntimeError):
    """An optional package the benchmark needs is not installed."""


def require_pyg() -> Any:
    """``torch_geometric.nn``, or an error that says how to get it."""
    try:
        import torch_geometric.nn as pyg_nn
    except ImportError as exc:
        raise MissingDependency("benchmarking against PyG needs torch_geometric, which is not installed: "
                           "pip install 'gnnfuse[bench]' (or torch_geometric>=2.5)") from exc
    return pyg_nn


# --- timing and memory -----------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], Any], repeats: int, device: torch.device) -> list[float]:
    """Milliseconds of each of `repeats` calls of `fn`, measured one call at a time.

    On CUDA each call is bracketed by events and synchronised before the next starts,
    so a time covers exactly one call from an idle GPU, host-side launch overhead
    included (the events wait on the stream while Python launches kernels). On CPU,
    where there are no events, wall time with `time.perf_counter`.
    """
    synchronize(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return times


def summarize(times_ms: list[float]) -> dict[str, float]:
    """Median (the headline: robust to one-off stalls), plus min and mean for spread."""
    return {"median_ms": statistics.median(times_ms), "min_ms": min(times_ms),
            "mean_ms": statistics.fmean(times_ms)}


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gb(device: torch.device) -> float | None:
    """Peak bytes allocated by torch's CUDA allocator since the last reset, in GB (1e9);
    None on CPU, where no allocator statistic covers just the measured calls."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 1e9


def allocated_gb(device: torch.device) -> float | None:
    """Bytes currently allocated, in GB: what is resident before a measurement starts."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device) / 1e9


def free_memory(device: torch.device) -> None:
    """Return cached blocks to the driver after the caller dropped its references, so
    the next measurement starts from the same baseline and a failure does not cascade."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def failure_status(exc: BaseException) -> str:
    """``"oom"`` for out-of-memory however it surfaces (torch, Triton, or wrapped by
    torch.compile), else ``"error: <type>: <first line>"`` short enough for a table."""
    text = str(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower():
        return "oom"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"error: {type(exc).__name__}: {first[:160]}"


# --- models ----------------------------------------------------------------------------
class TwoLayer(nn.Module):
    """conv -> activation -> conv, with feature dropout before each conv (as in the GCN
    and GAT papers); the same module wraps PyG's and gnnfuse's layers."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.conv1, self.conv2, self.activation = conv1, conv2, activation

    def forward(self, x: torch.Tensor, graph: Any) -> torch.Tensor:
        x = F.dropout(x, DROPOUT, self.training)
        x = self.activation(self.conv1(x, graph))
        x = F.dropout(x, DROPOUT, self.training)
        return self.conv2(x, graph)


def build_model(framework: str, model: str, in_dim: int, num_classes: int) -> TwoLayer:
    """The two-layer `model` from gnnfuse's (``framework="gnnfuse"``) or PyG's layers; both
    libraries share constructor arguments and parameter names, so one state dict fits both.

    PyG's GCNConv gets ``cached=True`` -- its documented setting for transductive
    full-graph training -- so it does not recompute self loops and normalisation every
    step, which gnnfuse caches on the `Graph`; the baseline should not lose on that.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    lib = gnn_nn if framework == "gnnfuse" else require_pyg()
    if model == "gcn":
        conv = lib.GCNConv if lib is gnn_nn else functools.partial(lib.GCNConv, cached=True)
        return TwoLayer(conv(in_dim, HIDDEN), conv(HIDDEN, num_classes), F.relu)
    if model == "gat":
        return TwoLayer(lib.GATConv(in_dim, GAT_HIDDEN, heads=GAT_HEADS),
                        lib.GATConv(GAT_HEADS * GAT_HIDDEN, num_classes, heads=1, concat=False), F.elu)
    return TwoLayer(lib.SAGEConv(in_dim, HIDDEN, aggr="mean"),
                    lib.SAGEConv(HIDDEN, num_classes, aggr="mean"), F.relu)


@dataclass
class DeviceData:
    """One data set's tensors on the device, shared by every framework measured on it.

    `edge_index` is PyG's input; gnnfuse graphs are views of its two rows, so both
    frameworks read the same resident edge tensors and memory peaks compare fairly.
    """
    name: str
    x: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor
    edge_index: torch.Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    def gnnfuse_graph(self) -> Graph:
        """A fresh `Graph` per measurement: its cache (CSR layouts, self-looped copy,
        norms) is built inside that measurement and freed with it, so one framework's
        cached layouts never count towards another's peak memory."""
        return Graph(self.edge_index[0], self.edge_index[1], self.num_nodes)


def load_data(name: str, root: str | None, device: torch.device,
              log: Callable[[str], None] = lambda message: None) -> DeviceData:
    """Load (or, for seeded presets, generate on CPU) a data set and move it over."""
    begin = time.perf_counter()
    dataset = load_node_dataset(name, root)
    if dataset.train_mask is None:
        raise ValueError(f"{name} has no train/validation/test split to time training on")
    loaded = time.perf_counter() - begin
    graph = dataset.graph
    data = DeviceData(name, dataset.x.to(device), dataset.y.to(device),
                      dataset.train_mask.nonzero().squeeze(1).to(device),   # index, not mask: no sync per step
                      torch.stack([graph.src, graph.dst]).to(device), dataset.num_classes)
    synchronize(device)
    log(f"[{name}] loaded in {loaded:.1f} s, on {device} after {time.perf_counter() - begin:.1f} s: "
        f"{graph.num_nodes:,} nodes, {graph.num_edges:,} edges, {dataset.num_features} features, "
        f"{dataset.num_classes} classes, {len(data.train_idx):,} training nodes")
    return data


def graph_input(framework: str, data: DeviceData) -> Any:
    return data.gnnfuse_graph() if framework == "gnnfuse" else data.edge_index


def instantiate(framework: str, model: str, data: DeviceData, state: dict[str, torch.Tensor],
                device: torch.device) -> nn.Module:
    """A fresh model with the shared initial weights; compiled for ``pyg-compile``.

    Dynamo is reset first: its caches are keyed by code object, so without a reset
    every new data set would count as a recompile of the same forward, turning on
    dynamic shapes and eventually hitting the recompile limit (silent eager fallback).
    """
    module = build_model(framework, model, data.x.shape[1], data.num_classes).to(device)
    module.load_state_dict(state)
    if framework == "pyg-compile":
        torch._dynamo.reset()
        module = torch.compile(module)
    return module


def reference_state(model: str, data: DeviceData, seed: int = 0) -> dict[str, torch.Tensor]:
    """The PyG model's seeded initial weights (on CPU), loaded by every framework."""
    torch.manual_seed(seed)
    module = build_model("pyg", model, data.x.shape[1], data.num_classes)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# --- measuring -------------------------------------------------------------------------
def max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|a - b| / max|b|: the worst element's error on the output's own scale.

    Element-wise relative error would blow up on logits that happen to be near zero.
    """
    scale = expected.abs().max().clamp_min(torch.finfo(expected.dtype).tiny)
    return ((actual - expected).abs().max() / scale).item()


def check_forward(model: str, data: DeviceData, state: dict[str, torch.Tensor], device: torch.device) -> float:
    """gnnfuse's eval-mode forward against PyG eager's, from the same weights."""
    outputs = []
    for framework in ("gnnfuse", "pyg"):
        module = instantiate(framework, model, data, state, device).eval()
        with torch.no_grad():
            outputs.append(module(data.x, graph_input(framework, data)))
        del module
    return max_rel_err(*outputs)


def measure(framework: str, model: str, data: DeviceData, state: dict[str, torch.Tensor],
            steps: int, warmup: int, device: torch.device, graph: Any = None) -> dict[str, Any]:
    """Warm up, then time `steps` training steps one by one; peak memory covers the
    timed steps only (compilation, autotuning and layout building happen in warm-up).
    `graph` overrides the framework's usual graph input (`graph_input`)."""
    module = instantiate(framework, model, data, state, device)
    graph = graph_input(framework, data) if graph is None else graph
    optimizer = torch.optim.Adam(module.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        out = module(data.x, graph)
        loss = F.cross_entropy(out[data.train_idx], data.y[data.train_idx])
        loss.backward()
        optimizer.step()
        return loss

    torch.manual_seed(1)                      # same dropout masks for every framework
    begin = time.perf_counter()
    first_loss = step().item()
    first_step_ms = (time.perf_counter() - begin) * 1e3
    warmup = max(warmup, 1) + (COMPILE_EXTRA_WARMUP if framework == "pyg-compile" else 0)
    for _ in range(warmup - 1):
        step()
    synchronize(device)
    resident = allocated_gb(device)
    reset_peak_memory(device)
    times = time_calls(step, steps, device)
    return {"status": "ok", **summarize(times), "steps": steps, "warmup": warmup,
            "first_step_ms": first_step_ms, "first_loss": first_loss,
            "resident_gb": resident, "peak_gb": peak_memory_gb(device)}


class CellTimeout(Exception):
    """A measurement ran past its time limit (see `guarded`)."""


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise `CellTimeout` in the main thread after ``seconds`` (POSIX timers; no limit
    when None). It lands at the next Python bytecode, so a long C++ call finishes first."""
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise CellTimeout(f"no result within {seconds:g} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _caused_by_timeout(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a `CellTimeout` or wraps one: torch.compile re-raises errors
    from inside its compiler as its own (``InductorError``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, CellTimeout):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__ or getattr(exc, "inner_exception", None)
    return False


def guarded(fn: Callable[[], dict[str, Any]], device: torch.device,
            time_limit_s: float | None = None) -> dict[str, Any]:
    """Run one measurement; an OOM, a time-out or any failure (e.g. torch.compile's)
    becomes its status, so one stuck or failing framework leaves the rest of a run intact.

    Memory is released only after the except block has dropped the traceback, which
    would otherwise keep the failed measurement's tensors alive. Errors other than OOM
    and time-outs print their traceback to stderr, since a one-line status rarely says
    how to fix them.
    """
    try:
        with _time_limit(time_limit_s):
            result = fn()
    except Exception as exc:  # noqa: BLE001 - one failing framework must not end the run
        if _caused_by_timeout(exc):
            result = {"status": f"timeout ({time_limit_s:g} s)"}
        else:
            result = {"status": failure_status(exc)}
            if result["status"] != "oom":
                traceback.print_exc()
    torch._dynamo.reset()
    free_memory(device)
    return result


# --- one comparison --------------------------------------------------------------------
def run_bench(model: str = "gcn", dataset: str = "cora", device: str | torch.device = "cpu",
              frameworks: tuple[str, ...] = FRAMEWORKS, steps: int = 20, warmup: int = 5,
              root: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Compare `frameworks` on one model and data set; returns a JSON-ready dict with the
    forward check (``check``), one entry per framework (``results``) and gnnfuse's
    speedup and memory ratio against each other framework (``ratios``)."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested, but CUDA is not available to torch {torch.__version__}")
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown or not frameworks:
        raise ValueError(f"frameworks must be a non-empty subset of {FRAMEWORKS}, got {list(frameworks)}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    require_pyg()
    data = load_data(dataset, root, device, log)
    state = reference_state(model, data)
    check = guarded(lambda: {"status": "ok", "max_rel_err": check_forward(model, data, state, device)}, device)
    check["agrees"] = check.get("max_rel_err") is not None and check["max_rel_err"] <= REL_ERR_LIMIT
    results = {}
    for framework in frameworks:
        results[framework] = guarded(lambda: measure(framework, model, data, state, steps, warmup, device), device)
        log(f"[{dataset}] {model} {framework}: {results[framework]['status']}")
    return {"model": model, "dataset": dataset, "device": str(device), "num_nodes": data.num_nodes,
            "num_edges": data.edge_index.shape[1], "steps": steps, "rel_err_limit": REL_ERR_LIMIT,
            "check": check, "results": results, "ratios": ratios(results)}


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per other framework: ``speedup`` (its median / gnnfuse's) and ``memory`` (gnnfuse's
    peak / its peak); None where either failed or memory was not measured."""
    ours = results.get("gnnfuse", {})
    out = {}
    for name, theirs in results.items():
        if name == "gnnfuse":
            continue
        ok = ours.get("status") == theirs.get("status") == "ok"
        out[name] = {"speedup": theirs["median_ms"] / ours["median_ms"] if ok else None,
                     "memory": ours["peak_gb"] / theirs["peak_gb"]
                     if ok and ours.get("peak_gb") and theirs.get("peak_gb") else None}
    return out


def format_table(report: dict[str, Any]) -> str:
    """The result as a fixed-width table, with the forward check above it."""
    check = report["check"]
    err = check.get("max_rel_err")
    verdict = (f"max rel err {err:.2e} ({'agree' if check['agrees'] else 'DISAGREE'}, limit "
               f"{report['rel_err_limit']:g})" if err is not None else check["status"])
    lines = [f"{report['model']} on {report['dataset']} ({report['num_nodes']:,} nodes, {report['num_edges']:,} "
             f"edges), {report['device']}, median of {report['steps']} training steps",
             f"forward check gnnfuse vs pyg: {verdict}", "",
             f"{'framework':<12} {'status':<8} {'median ms':>10} {'peak memory':>12} "
             f"{'speedup':>9} {'mem ratio':>10}"]
    for name, cell in report["results"].items():
        ok = cell["status"] == "ok"
        ratio = report["ratios"].get(name, {})
        peak = "n/a" if not ok or cell["peak_gb"] is None else f"{cell['peak_gb']:.3f} GB"
        lines.append(f"{name:<12} {cell['status'] if ok else 'failed':<8} "
                     f"{cell['median_ms'] if ok else float('nan'):>10.2f} {peak:>12} "
                     f"{_ratio(ratio.get('speedup'), name):>9} {_ratio(ratio.get('memory'), name):>10}")
    failures = [f"{name}: {cell['status']}" for name, cell in report["results"].items() if cell["status"] != "ok"]
    notes = ["", "speedup = framework median / gnnfuse median; mem ratio = gnnfuse peak / framework peak"]
    if report["device"].startswith("cpu"):
        notes.append("peak memory: n/a on CPU (only the CUDA allocator tracks the timed steps alone)")
    return "\n".join(lines + notes + failures) + "\n"


def _ratio(value: float | None, name: str) -> str:
    return "-" if name == "gnnfuse" else ("n/a" if value is None else f"{value:.2f}x")


def plot(report: dict[str, Any], path: str | Path) -> Path:
    """A bar chart of median step time per framework (and peak memory where measured)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependency("--plot needs matplotlib: pip install matplotlib") from exc
    ok = {name: cell for name, cell in report["results"].items() if cell["status"] == "ok"}
    with_memory = {name: cell["peak_gb"] for name, cell in ok.items() if cell["peak_gb"] is not None}
    fig = Figure(figsize=(9 if with_memory else 5, 3.5))
    axes = fig.subplots(1, 2 if with_memory else 1, squeeze=False)[0]
    axes[0].bar(list(ok), [cell["median_ms"] for cell in ok.values()], color="#4a7fb5")
    axes[0].set_ylabel("median training step (ms)")
    if with_memory:
        axes[1].bar(list(with_memory), list(with_memory.values()), color="#d98c3f")
        axes[1].set_ylabel("peak memory (GB)")
    fig.suptitle(f"{report['model']} on {report['dataset']} ({report['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)


# --- command line ----------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``gnnfuse bench`` options."""
    parser.add_argument("--model", default="gcn", choices=MODELS)
    parser.add_argument("--dataset", default="cora", help=f"one of: {', '.join(DATASET_NAMES)}")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"comma list of {', '.join(FRAMEWORKS)} (default: all)")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    parser.add_argument("--plot", type=Path, help="also draw a bar chart (PNG) here")
    parser.add_argument("--root", help="data folder (default: $GNNFUSE_DATA, then ../shared/data)")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``gnnfuse bench``: exit status 0, or 1 when the forward outputs disagree or gnnfuse failed."""
    frameworks = tuple(f.strip() for f in args.frameworks.split(",") if f.strip())
    try:
        report = run_bench(args.model, args.dataset, args.device, frameworks, args.steps, args.warmup,
                           args.root, log=lambda message: print(message, flush=True))
    except (ValueError, FileNotFoundError, MissingDependency) as error:
        parser.error(str(error))
    print(format_table(report), end="")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {plot(report, args.plot)}")
    ours = report["results"].get("gnnfuse", {"status": "ok"})
    return 0 if report["check"]["agrees"] and ours["status"] == "ok" else 1
