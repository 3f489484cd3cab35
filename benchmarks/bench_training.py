"""Full-graph training step: gnnfuse's compiled layers against PyG, eager and torch.compile'd.

For every data set x model x framework it times one optimisation step (forward, loss
on the training nodes, backward, Adam) on the same graph from the same initial weights,
and records peak GPU memory. Before timing, each (data set, model) checks that the
gnnfuse forward matches PyG's with identical weights, so a speedup is never reported
for a layer that computes something else.

Results merge into ``<out>/training.json`` keyed by data set/model/framework, so several
short runs (the device machine allows 10 minutes a command) accumulate, and
``<out>/training.md`` is regenerated from the merged file after every cell.

    python benchmarks/bench_training.py --datasets cora,citeseer,pubmed
    python benchmarks/bench_training.py --device cpu --datasets cora --steps 2 --warmup 1
"""
from __future__ import annotations

import argparse
import functools
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import nn

import gnnfuse
import gnnfuse.nn as gnn_nn
from gnnfuse.data import NodeDataset, load_dataset

from common import (allocated_gb, device_names, environment, failure_status, fmt, free_memory, load_results,
                    log, new_run_id, peak_memory_gb, prune_runs, reset_peak_memory, resolve_device, runs_markdown,
                    save_json, summarize, synchronize, time_calls, warn, write_atomically)

DATASETS = ("cora", "citeseer", "pubmed", "arxiv-like", "reddit2-like", "products-like")
MODELS = ("gcn", "gat", "sage")
FRAMEWORKS = ("gnnfuse", "pyg", "pyg-compile")

HIDDEN = 64                  # gcn and sage hidden width
GAT_HEADS, GAT_HIDDEN = 8, 8  # gat first layer: 8 heads x 8 channels, concatenated
DROPOUT = 0.5
LR, WEIGHT_DECAY = 0.01, 5e-4
COMPILE_EXTRA_WARMUP = 5     # torch.compile compiles (and may recompile once) in its first steps
REL_ERR_LIMIT = 1e-3         # float32 forward disagreement beyond this is a bug, not rounding


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
    """The two-layer `model` from gnnfuse's or PyG's layers; both libraries share
    constructor arguments and parameter names, so one state dict fits both.

    PyG's GCNConv gets ``cached=True`` -- its documented setting for transductive
    full-graph training -- so it does not recompute self loops and normalisation every
    step, which gnnfuse caches on the `Graph`; the baseline should not lose on that.
    """
    lib = gnn_nn if framework == "gnnfuse" else pyg_nn
    if model == "gcn":
        conv = lib.GCNConv if lib is gnn_nn else functools.partial(lib.GCNConv, cached=True)
        return TwoLayer(conv(in_dim, HIDDEN), conv(HIDDEN, num_classes), F.relu)
    if model == "gat":
        return TwoLayer(lib.GATConv(in_dim, GAT_HIDDEN, heads=GAT_HEADS),
                        lib.GATConv(GAT_HEADS * GAT_HIDDEN, num_classes, heads=1, concat=False), F.elu)
    if model == "sage":
        return TwoLayer(lib.SAGEConv(in_dim, HIDDEN, aggr="mean"),
                        lib.SAGEConv(HIDDEN, num_classes, aggr="mean"), F.relu)
    raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")


@dataclass
class DeviceData:
    """One data set's tensors on the device, shared by every cell of that data set.

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

    def gnnfuse_graph(self) -> gnnfuse.Graph:
        """A fresh `Graph` per cell: its cache (CSR layouts, self-looped copy, norms) is
        built inside that cell and freed with it, so one cell's cached layouts never
        count towards another's peak memory or make its first step look cheap."""
        return gnnfuse.Graph(self.edge_index[0], self.edge_index[1], self.num_nodes)


def load(name: str, root: str | None, device: torch.device) -> DeviceData:
    """Load (or, for power-law presets, generate on CPU) a data set and move it over."""
    begin = time.perf_counter()
    dataset = load_dataset(name, root)
    if not isinstance(dataset, NodeDataset) or dataset.train_mask is None:
        raise SystemExit(f"{name} is not a node-classification data set with a split")
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
            args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Warm up, then time `args.steps` training steps one by one; peak memory covers the
    timed steps only (compilation, autotuning and layout building happen in warm-up)."""
    module = instantiate(framework, model, data, state, device)
    graph = graph_input(framework, data)
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
    warmup = max(args.warmup, 1) + (COMPILE_EXTRA_WARMUP if framework == "pyg-compile" else 0)
    for _ in range(warmup - 1):
        step()
    synchronize(device)
    resident = allocated_gb(device)
    reset_peak_memory(device)
    times = time_calls(step, args.steps, device)
    return {"status": "ok", **summarize(times), "steps": args.steps, "warmup": warmup,
            "first_step_ms": first_step_ms, "first_loss": first_loss,
            "resident_gb": resident, "peak_gb": peak_memory_gb(device)}


def guarded(fn: Callable[[], dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """Run one cell; an OOM or any failure (e.g. torch.compile's) becomes its status.

    Memory is released only after the except block has dropped the traceback, which
    would otherwise keep the failed cell's tensors alive. Errors other than OOM print
    their traceback to stderr, since a one-line status rarely says how to fix them.
    """
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - one failing cell must not end the run
        result = {"status": failure_status(exc)}
        if result["status"] != "oom":
            traceback.print_exc()             # the table keeps one line; stderr gets the rest
    torch._dynamo.reset()
    free_memory(device)
    return result


def reference_state(model: str, data: DeviceData, seed: int = 0) -> dict[str, torch.Tensor]:
    """The PyG model's seeded initial weights (on CPU), loaded by every framework."""
    torch.manual_seed(seed)
    module = build_model("pyg", model, data.x.shape[1], data.num_classes)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# --- results ---------------------------------------------------------------------------
def ratios(results: dict[str, Any], dataset: str, model: str) -> dict[str, float | None]:
    """gnnfuse's speedup (other time / gnnfuse time) and memory ratio (gnnfuse peak /
    other peak) against each PyG variant; None where a cell is missing, failed, or was
    measured on a different device than gnnfuse's."""
    cells = results["cells"]
    ours = cells.get(f"{dataset}/{model}/gnnfuse")
    out: dict[str, float | None] = {}
    for other in FRAMEWORKS[1:]:
        theirs = cells.get(f"{dataset}/{model}/{other}")
        usable = (ours and theirs and ours["status"] == theirs["status"] == "ok"
                  and len(device_names(results, [ours, theirs])) == 1)
        out[f"speedup_vs_{other}"] = theirs["median_ms"] / ours["median_ms"] if usable else None
        out[f"memory_ratio_vs_{other}"] = (ours["peak_gb"] / theirs["peak_gb"]
                                           if usable and ours["peak_gb"] and theirs["peak_gb"] else None)
    return out


def row_keys(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(data set, model) pairs present, in the canonical order, unknown names last."""
    pairs = {tuple(key.split("/")[:2]) for key in results["cells"]}
    rank = {name: i for i, name in enumerate(DATASETS + MODELS)}
    return sorted(pairs, key=lambda p: (rank.get(p[0], len(rank)), p[0], rank.get(p[1], len(rank)), p[1]))


def time_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "–"
    return fmt(cell["median_ms"], ".2f") if cell["status"] == "ok" else cell["status"]


def render_markdown(results: dict[str, Any]) -> str:
    """The summary table, regenerated from the whole merged JSON."""
    head = ["dataset", "model", "gnnfuse ms", "pyg ms", "pyg-compile ms", "speedup vs pyg",
            "speedup vs pyg-compile", "gnnfuse GB", "pyg GB", "pyg-compile GB", "mem vs pyg",
            "mem vs pyg-compile", "max rel err"]
    lines = ["# Full-graph training step: gnnfuse vs PyG", "",
             "Median of per-step times (forward + loss + backward + Adam); peak GB = "
             "`torch.cuda.max_memory_allocated` over the timed steps; speedup = PyG time / gnnfuse "
             "time; mem = gnnfuse peak / PyG peak; max rel err = max|gnnfuse - PyG| / max|PyG| of the "
             f"eval-mode forward (flagged above {REL_ERR_LIMIT:g}). See benchmarks/README.md.", "",
             *runs_markdown(results), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for dataset, model in row_keys(results):
        cells = [results["cells"].get(f"{dataset}/{model}/{fw}") for fw in FRAMEWORKS]
        r = results["ratios"][f"{dataset}/{model}"]
        check = results["checks"].get(f"{dataset}/{model}", {})
        err = check.get("max_rel_err")
        err_text = check.get("status", "–") if err is None else (
            f"{err:.1e}" + (" **FAIL**" if err > REL_ERR_LIMIT else ""))
        row = [dataset, model, *(time_cell(c) for c in cells),
               fmt(r["speedup_vs_pyg"], ".2f"), fmt(r["speedup_vs_pyg-compile"], ".2f"),
               *(fmt(c.get("peak_gb") if c else None, ".3f") for c in cells),
               fmt(r["memory_ratio_vs_pyg"], ".2f"), fmt(r["memory_ratio_vs_pyg-compile"], ".2f"), err_text]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def store(results: dict[str, Any], out: Path) -> None:
    """Recompute ratios from the merged cells and rewrite both files (after every cell,
    so a run cut off by a time limit keeps what it measured)."""
    prune_runs(results)
    results["ratios"] = {f"{d}/{m}": ratios(results, d, m) for d, m in row_keys(results)}
    save_json(out / "training.json", results)
    write_atomically(out / "training.md", render_markdown(results))


# --- driver ----------------------------------------------------------------------------
def run_dataset(name: str, args: argparse.Namespace, device: torch.device, results: dict[str, Any],
                run_id: str) -> None:
    data = load(name, args.data_root, device)
    for model in args.models:
        state = reference_state(model, data)
        check = guarded(lambda: {"status": "ok", "max_rel_err": check_forward(model, data, state, device)}, device)
        results["checks"][f"{name}/{model}"] = {**check, "run": run_id}
        err = check.get("max_rel_err")
        log(f"[{name}] {model} forward check: " + (f"max rel err {err:.2e}" if err is not None else check["status"]))
        if err is not None and err > REL_ERR_LIMIT:
            warn(f"{name}/{model}: gnnfuse forward differs from PyG by {err:.2e} (> {REL_ERR_LIMIT:g})")
        for framework in args.frameworks:
            begin = time.perf_counter()
            cell = guarded(lambda: measure(framework, model, data, state, args, device), device)
            results["cells"][f"{name}/{model}/{framework}"] = {**cell, "run": run_id}
            store(results, args.out)
            log(f"[{name}] {model} {framework}: {describe(cell)} [{time.perf_counter() - begin:.1f} s]")
    del data
    free_memory(device)


def describe(cell: dict[str, Any]) -> str:
    if cell["status"] != "ok":
        return cell["status"]
    peak = "" if cell["peak_gb"] is None else f", peak {cell['peak_gb']:.3f} GB"
    return (f"median {cell['median_ms']:.2f} ms (min {cell['min_ms']:.2f}, mean {cell['mean_ms']:.2f}){peak}, "
            f"first step {cell['first_step_ms']:.0f} ms")


def comma_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated subset of `choices`, in the order given."""
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in choices]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(choices)}; got {text!r}")
        return items
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=comma_list(DATASETS), default=list(DATASETS))
    parser.add_argument("--models", type=comma_list(MODELS), default=list(MODELS))
    parser.add_argument("--frameworks", type=comma_list(FRAMEWORKS), default=list(FRAMEWORKS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per cell (default 20)")
    parser.add_argument("--warmup", type=int, default=5,
                        help=f"untimed steps first (default 5; pyg-compile gets {COMPILE_EXTRA_WARMUP} more)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="folder of training.json (merged into) and training.md")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-root", help="folder of the real data sets (default: $GNNFUSE_DATA, "
                                            "then ../shared/data)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    results = load_results(args.out / "training.json")
    results.setdefault("checks", {})
    run_id = new_run_id()
    results["runs"][run_id] = environment(device)
    log(f"run {run_id} on {results['runs'][run_id]['device_name']}; results -> {args.out}")
    begin = time.perf_counter()
    for name in args.datasets:
        run_dataset(name, args, device, results, run_id)
    store(results, args.out)
    log(f"done in {time.perf_counter() - begin:.1f} s; {args.out / 'training.md'}")


if __name__ == "__main__":
    main()
