"""Multi-head attention layers at many heads and wide heads, against the same PyG layers.

The per-edge, per-head sums of an attention layer's backward (GAT's output gradient dotted
with each source row, head by head; GATv2's and TransformerConv's scores) are evaluated as
[edges, heads, channels] tiles. Eight heads of 32 or more channels make those tiles wider
than one program holds, and they are walked in blocks of whole heads
(`codegen.edge_tile_block`). This times one layer's forward and backward, as
`bench_pyg_layers.py` does (same weights, eval-mode forward checked first, extra peak
memory), for each layer and heads x channels cell below, gnnfuse against PyG. ``GAT
8x47 mean`` is PyG's ``GAT`` model's last layer on a 47-class data set: eight heads
averaged (``concat=False``). Results merge into ``--json`` keyed by data set/cell; the
Markdown beside it is rewritten after every cell.

    python benchmarks/bench_heads.py --device cuda --json benchmarks/results/heads_<commit>_cuda.json
    python benchmarks/bench_heads.py --device cpu --datasets cora --cells "GAT 8x64" --steps 2 --warmup 1 ...
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
from gnnfuse.bench.timing import failure_status, free_memory

from bench_pyg_layers import eval_outputs, measure_layer
from bench_training import comma_list
from common import (add_step_arguments, device_names, environment, fmt, load_data_or_exit, load_results, log,
                    new_run_id, parse_step_arguments, prune_runs, resolve_device, results_saver, runs_markdown)

# cell name -> (layer class name, constructor keywords besides in_channels)
CELLS: dict[str, tuple[str, dict[str, Any]]] = {
    "GAT 8x8": ("GATConv", {"out_channels": 8, "heads": 8}),
    "GAT 8x32": ("GATConv", {"out_channels": 32, "heads": 8}),
    "GAT 8x64": ("GATConv", {"out_channels": 64, "heads": 8}),
    "GAT 8x47 mean": ("GATConv", {"out_channels": 47, "heads": 8, "concat": False}),
    "GATv2 4x32": ("GATv2Conv", {"out_channels": 32, "heads": 4}),
    "GATv2 8x32": ("GATv2Conv", {"out_channels": 32, "heads": 8}),
    "TransformerConv 4x32": ("TransformerConv", {"out_channels": 32, "heads": 4}),
    "TransformerConv 8x32": ("TransformerConv", {"out_channels": 32, "heads": 8}),
}
DATASETS = ("arxiv-like",)


def twins(cell: str, channels: int, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(gnnfuse's, PyG's) layer of ``cell``, PyG's weights copied into gnnfuse's."""
    name, kwargs = CELLS[cell]
    make: Callable[[type], torch.nn.Module] = lambda cls: cls(channels, **kwargs)
    torch.manual_seed(0)
    theirs = make(getattr(pyg_nn, name)).to(device)
    ours = make(getattr(gnnfuse.nn, name)).to(device)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def run_cell(cell_name: str, data: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    ours, theirs = twins(cell_name, data.x.shape[1], device)
    inputs: list[Any] = [data.x, data.edge_index]
    cell: dict[str, Any] = {}
    layers = {"gnnfuse": ours, "pyg": theirs}
    outputs = eval_outputs(layers, inputs, cell, device)
    if len(outputs) == 2:
        cell["rel_err"] = max_rel_err(outputs["gnnfuse"], outputs["pyg"])
    elif "gnnfuse" not in outputs:
        return cell
    del outputs
    for framework in [f for f in layers if f not in cell]:
        free_memory(device)
        layers[framework].train()
        try:
            cell[framework] = measure_layer(layers[framework], inputs, args.steps, args.warmup, device)
        except Exception as exc:
            cell[framework] = {"status": failure_status(exc)}
    return cell


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Multi-head attention layers: gnnfuse's against PyG's", "",
             "One layer, forward + backward, the data set's features in; median ms (extra peak GB); speed-up = "
             "PyG / gnnfuse; warm-up = seconds of gnnfuse's untimed first calls (compiling and tuning). "
             "`rel_err`: eval-mode forward, max |diff| / max |PyG|.", "",
             "| data set | layer, heads x channels | gnnfuse ms (GB) | PyG ms (GB) | speed-up | memory ratio | "
             "warm-up s | rel_err |",
             "|---|---|---|---|---|---|---|---|"]
    cells = results["cells"]
    for key in sorted(cells):
        cell = cells[key]
        dataset, name = key.split("/")
        if "status" in cell:
            lines.append(f"| {dataset} | {name} | {cell['status']} | | | | | |")
            continue
        ours, theirs = cell.get("gnnfuse", {}), cell.get("pyg", {})

        def shown(m: dict[str, Any]) -> str:
            return m.get("status") or f"{fmt(m.get('median_ms'), '.2f')} ({fmt(m.get('peak_gb'), '.2f')})"
        speed = (f"{theirs['median_ms'] / ours['median_ms']:.2f}x"
                 if "median_ms" in ours and "median_ms" in theirs else "–")
        memory = (f"{ours['peak_gb'] / theirs['peak_gb']:.2f}"
                  if ours.get("peak_gb") and theirs.get("peak_gb") else "–")
        lines.append(f"| {dataset} | {name} | {shown(ours)} | {shown(theirs)} | {speed} | {memory} | "
                     f"{fmt(ours.get('warmup_s'), '.1f')} | {fmt(cell.get('rel_err'), '.1e')} |")
    lines += ["", f"Devices: {', '.join(device_names(results, list(cells.values())))}", ""]
    return "\n".join(lines + runs_markdown(results)) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    others = ("reddit2-like", "products-like", "cora", "pubmed", "synthetic")
    parser.add_argument("--datasets", type=comma_list(DATASETS + others), default=list(DATASETS))
    parser.add_argument("--cells", type=comma_list(tuple(CELLS)), default=list(CELLS))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/heads.json"))
    add_step_arguments(parser)
    args = parse_step_arguments(parser, argv)
    device = resolve_device(args.device)
    results = load_results(args.json)
    run_id = new_run_id()
    results.setdefault("runs", {})[run_id] = environment(device)
    results.setdefault("cells", {})
    save = results_saver(args.json, markdown)
    for dataset in args.datasets:
        data = load_data_or_exit(dataset, args.data_root, device)
        for name in args.cells:
            log(f"{dataset} {name}")
            begin = time.perf_counter()
            cell = run_cell(name, data, args, device)
            if cell.get("rel_err", 0) > REL_ERR_LIMIT:
                cell["status"] = f"forward differs from PyG (rel_err {cell['rel_err']:.1e})"
            results["cells"][f"{dataset}/{name}"] = {"run": run_id, **cell}
            prune_runs(results)
            save(results)
            log(f"  {time.perf_counter() - begin:.1f} s: {cell}")
        del data
        free_memory(device)


if __name__ == "__main__":
    main()
