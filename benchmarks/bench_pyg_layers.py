"""PyG's own layers compiled by gnnfuse (`gnnfuse.nn.pyg_layers`) against the same PyG layers.

A user who changes ``from torch_geometric.nn import TransformerConv`` to ``from gnnfuse.nn
import TransformerConv`` gets PyG's class with ``propagate`` compiled. This times one layer's
forward and backward (the layer alone, as in a training step, gradient of a fixed random
projection) on each data set for both, from the same weights, first checking the
eval-mode forward agrees; peak memory is what the call needs beyond what was resident.
Results merge into ``--json`` keyed by data set/layer; the Markdown table beside it (``.md``)
is rewritten after every cell.

    python benchmarks/bench_pyg_layers.py --device cuda --json benchmarks/results/pyg_layers.json
    python benchmarks/bench_pyg_layers.py --device cpu --datasets cora --layers LEConv --steps 2 --warmup 1 ...
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch_geometric.nn as pyg_nn

import gnnfuse.nn
from gnnfuse.bench import REL_ERR_LIMIT, max_rel_err
from gnnfuse.bench.timing import extra_peak_gb, failure_status, free_memory, summarize, time_calls
from gnnfuse.nn.pyg_layers import COMPILED_PYG_LAYERS

from bench_training import comma_list
from common import (add_step_arguments, check_failed, device_names, environment, fmt, load_data_or_exit, load_results,
                    log, new_run_id, parse_step_arguments, prune_runs, resolve_device, results_saver, runs_markdown)

HIDDEN, EDGE_DIM = 64, 8


def _mlp(i: int, hidden: int, o: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(i, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, o))


# constructor per layer, given (in_channels, out_channels); what forward takes besides x and
# edge_index ("edge_attr": per-edge features after them; "x0": the initial features x_0,
# "pos": 3-D positions, both before them); the input width it is given where not the data
# set's (None): GatedGraphConv takes no more input channels than it gives out, FAConv and
# GCN2Conv give out their input width, and NNConv's per-edge [in, out] weights are E x in x out
CONFIGS: dict[str, tuple[Callable[[type, int, int], torch.nn.Module], str, int | None]] = {
    "TransformerConv": (lambda c, i, o: c(i, o // 4, heads=4), "plain", None),
    "GINEConv": (lambda c, i, o: c(_mlp(i, o, o), edge_dim=EDGE_DIM), "edge_attr", None),
    "GENConv": (lambda c, i, o: c(i, o, aggr="softmax", learn_t=True), "plain", None),
    "ResGatedGraphConv": (lambda c, i, o: c(i, o), "plain", None),
    "GeneralConv": (lambda c, i, o: c(i, o, attention=True, heads=4), "plain", None),
    "LEConv": (lambda c, i, o: c(i, o), "plain", None),
    "ClusterGCNConv": (lambda c, i, o: c(i, o), "plain", None),
    "FeaStConv": (lambda c, i, o: c(i, o, heads=2), "plain", None),
    "PDNConv": (lambda c, i, o: c(i, o, edge_dim=EDGE_DIM, hidden_channels=16), "edge_attr", None),
    "MFConv": (lambda c, i, o: c(i, o), "plain", None),
    "GatedGraphConv": (lambda c, i, o: c(o, 2), "plain", HIDDEN),
    "SSGConv": (lambda c, i, o: c(i, o, alpha=0.1, K=2), "plain", None),
    "CGConv": (lambda c, i, o: c(i, dim=EDGE_DIM), "edge_attr", None),
    "NNConv": (lambda c, i, o: c(i, o, _mlp(EDGE_DIM, 32, i * o)), "edge_attr", 16),
    "GMMConv": (lambda c, i, o: c(i, o, dim=EDGE_DIM, kernel_size=4), "edge_attr", None),
    "FiLMConv": (lambda c, i, o: c(i, o), "plain", None),
    "LGConv": (lambda c, i, o: c(), "plain", None),
    "MixHopConv": (lambda c, i, o: c(i, o, powers=[0, 1, 2]), "plain", None),
    "SimpleConv": (lambda c, i, o: c(), "plain", None),
    "WLConvContinuous": (lambda c, i, o: c(), "plain", None),
    "AGNNConv": (lambda c, i, o: c(requires_grad=True), "plain", None),
    "FAConv": (lambda c, i, o: c(o, eps=0.1), "x0", HIDDEN),
    "GCN2Conv": (lambda c, i, o: c(o, alpha=0.1, theta=0.5, layer=1), "x0", HIDDEN),
    "PointTransformerConv": (lambda c, i, o: c(i, o), "pos", None),
}
DATASETS = ("arxiv-like", "reddit2-like")


def twins(name: str, channels: int, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    make = CONFIGS[name][0]
    torch.manual_seed(0)
    ours = make(getattr(gnnfuse.nn, name), channels, HIDDEN).to(device)
    theirs = make(getattr(pyg_nn, name), channels, HIDDEN).to(device)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def measure_layer(layer: torch.nn.Module, inputs: list[Any], steps: int, warmup: int,
                  device: torch.device) -> dict[str, Any]:
    """Forward and backward of a fixed projection: median ms and extra peak GB."""
    x = inputs[0].detach().requires_grad_()
    torch.manual_seed(1)

    def step() -> None:
        out = layer(x, *inputs[1:])
        out.backward(torch.ones_like(out))
    begin = time.perf_counter()
    for _ in range(warmup):
        step()
    warm_s = time.perf_counter() - begin
    _, peak, _ = extra_peak_gb(step, device)
    return {"warmup_s": round(warm_s, 2), "peak_gb": peak, **summarize(time_calls(step, steps, device))}


def run_cell(name: str, data: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    width = CONFIGS[name][2]
    x = data.x if width is None else data.x[:, :width].contiguous()
    ours, theirs = twins(name, x.shape[1], device)
    inputs: list[Any] = [x, data.edge_index]
    generator, kind = torch.Generator(device).manual_seed(2), CONFIGS[name][1]
    if kind == "edge_attr":
        inputs.append(torch.rand(data.edge_index.shape[1], EDGE_DIM, device=device, generator=generator))
    elif kind == "x0":
        inputs.insert(1, torch.rand(x.shape, device=device, generator=generator))
    elif kind == "pos":
        inputs.insert(1, torch.rand(x.shape[0], 3, device=device, generator=generator))
    return compare_layers(ours, theirs, inputs, args, device)


def compare_layers(ours: torch.nn.Module, theirs: torch.nn.Module, inputs: list[Any], args: argparse.Namespace,
                   device: torch.device) -> dict[str, Any]:
    """One cell: both layers' eval-mode forwards compared (``rel_err``), then each timed
    (`measure_layer`); a framework that fails gets its status instead."""
    cell: dict[str, Any] = {}
    layers = {"gnnfuse": ours, "pyg": theirs}
    outputs = eval_outputs(layers, inputs, cell, device)
    if len(outputs) == 2:
        cell["rel_err"] = max_rel_err(outputs["gnnfuse"], outputs["pyg"])
    elif "gnnfuse" not in outputs:
        return cell              # gnnfuse failed: its status is the cell's result
    del outputs
    for framework in [f for f in layers if f not in cell]:
        free_memory(device)
        layers[framework].train()
        try:
            cell[framework] = measure_layer(layers[framework], inputs, args.steps, args.warmup, device)
        except Exception as exc:
            cell[framework] = {"status": failure_status(exc)}
    return cell


def eval_outputs(layers: dict[str, torch.nn.Module], inputs: list[Any], cell: dict[str, Any],
                 device: torch.device) -> dict[str, torch.Tensor]:
    """Each framework's eval-mode forward, one at a time on the CPU between them (both
    outputs at once can exhaust a large graph's memory); a framework that fails gets its
    status in ``cell`` -- the one that fails is named, and the other one is still timed
    (gnnfuse training where PyG runs out of memory is a result)."""
    outputs = {}
    with torch.no_grad():
        for framework, layer in layers.items():
            free_memory(device)
            layer.eval()
            try:
                outputs[framework] = layer(*inputs).cpu()
            except Exception as exc:     # recorded, not fatal: the next cell still runs
                cell[framework] = {"status": failure_status(exc)}
    return outputs


def markdown(results: dict[str, Any]) -> str:
    return comparison_markdown(
        results, "# PyG's own layers compiled by gnnfuse (`gnnfuse.nn.<Layer>`) against PyG's",
        f"One layer, forward + backward, {HIDDEN} output channels (CGConv, LGConv, SimpleConv and "
        f"WLConvContinuous keep their input's 128, MixHopConv gives 3 x {HIDDEN})", "layer")


def comparison_markdown(results: dict[str, Any], title: str, setup: str, layer_column: str) -> str:
    """The table of `compare_layers` cells keyed ``data set/layer``: median ms (extra peak
    GB) of each, speed-up, memory ratio, gnnfuse's warm-up seconds and the forward's error
    (**FAIL** beyond REL_ERR_LIMIT, and then no speed-up or memory ratio: a layer computing
    something else than PyG's is no speed-up)."""
    lines = [title, "", f"{setup}; median ms (extra peak GB); speed-up = PyG / gnnfuse; warm-up = seconds of "
             "gnnfuse's untimed first calls (compiling and tuning). `rel_err`: eval-mode forward, max |diff| / "
             f"max |PyG|; **FAIL** above {REL_ERR_LIMIT:g} (no speed-up or memory ratio then).", "",
             f"| data set | {layer_column} | gnnfuse ms (GB) | PyG ms (GB) | speed-up | memory ratio | warm-up s "
             "| rel_err |",
             "|---|---|---|---|---|---|---|---|"]
    cells = results["cells"]
    for key in sorted(cells):
        cell = cells[key]
        dataset, layer = key.split("/")
        if "status" in cell:
            lines.append(f"| {dataset} | {layer} | {cell['status']} | | | | | |")
            continue
        ours, theirs = cell.get("gnnfuse", {}), cell.get("pyg", {})

        def shown(m: dict[str, Any]) -> str:
            return m.get("status") or f"{fmt(m.get('median_ms'), '.2f')} ({fmt(m.get('peak_gb'), '.2f')})"
        failed = check_failed(cell.get("rel_err"), REL_ERR_LIMIT)
        speed = (f"{theirs['median_ms'] / ours['median_ms']:.2f}x"
                 if "median_ms" in ours and "median_ms" in theirs and not failed else "–")
        memory = (f"{ours['peak_gb'] / theirs['peak_gb']:.2f}"
                  if ours.get("peak_gb") and theirs.get("peak_gb") and not failed else "–")
        lines.append(f"| {dataset} | {layer} | {shown(ours)} | {shown(theirs)} | {speed} | {memory} | "
                     f"{fmt(ours.get('warmup_s'), '.1f')} | {fmt(cell.get('rel_err'), '.1e')}"
                     f"{' **FAIL**' if failed else ''} |")
    lines += ["", f"Devices: {', '.join(device_names(results, list(cells.values())))}", ""]
    return "\n".join(lines + runs_markdown(results)) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=comma_list(DATASETS + ("cora", "pubmed")), default=list(DATASETS))
    parser.add_argument("--layers", type=comma_list(tuple(CONFIGS)), default=list(CONFIGS))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/pyg_layers.json"))
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting new cells after this")
    add_step_arguments(parser)
    args = parse_step_arguments(parser, argv)
    assert set(CONFIGS) <= set(COMPILED_PYG_LAYERS)
    run_cells(args, args.layers, run_cell, markdown, args.budget_s)


def run_cells(args: argparse.Namespace, names: list[str], run_cell: Callable[..., dict[str, Any]],
              markdown: Callable[[dict[str, Any]], str], budget_s: float | None = None) -> None:
    """``run_cell(name, data, args, device)`` for each data set of ``args.datasets`` and
    each of ``names``, every cell merged into ``args.json`` (and its Markdown) as it ends,
    a forward that differs from PyG's marked so; no new cell after ``budget_s`` seconds."""
    device = resolve_device(args.device)
    results = load_results(args.json)
    run_id = new_run_id()
    results.setdefault("runs", {})[run_id] = environment(device)
    results.setdefault("cells", {})
    save = results_saver(args.json, markdown)
    begin = time.perf_counter()
    for dataset in args.datasets:
        data = load_data_or_exit(dataset, args.data_root, device)
        for name in names:
            if budget_s is not None and time.perf_counter() - begin > budget_s:
                log(f"budget reached; {dataset}/{name} and later cells not run")
                break
            log(f"{dataset} {name}")
            started = time.perf_counter()
            cell = run_cell(name, data, args, device)
            if check_failed(cell.get("rel_err"), REL_ERR_LIMIT):
                cell["status"] = f"forward differs from PyG (rel_err {cell['rel_err']:.1e})"
            results["cells"][f"{dataset}/{name}"] = {"run": run_id, **cell}
            prune_runs(results)
            save(results)
            log(f"  {time.perf_counter() - started:.1f} s: {cell}")
        del data
        free_memory(device)

if __name__ == "__main__":
    main()
