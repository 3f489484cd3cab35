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
from pathlib import Path
from typing import Any, Callable

import torch
import torch_geometric.nn as pyg_nn

import gnnfuse.nn
from bench_pyg_layers import compare_layers, comparison_markdown, run_cells
from bench_training import comma_list
from common import add_step_arguments, parse_step_arguments

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
    return compare_layers(ours, theirs, [data.x, data.edge_index], args, device)


def markdown(results: dict[str, Any]) -> str:
    return comparison_markdown(results, "# Multi-head attention layers: gnnfuse's against PyG's",
                               "One layer, forward + backward, the data set's features in", "layer, heads x channels")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    others = ("reddit2-like", "products-like", "cora", "pubmed", "synthetic")
    parser.add_argument("--datasets", type=comma_list(DATASETS + others), default=list(DATASETS))
    parser.add_argument("--cells", type=comma_list(tuple(CELLS)), default=list(CELLS))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/heads.json"))
    add_step_arguments(parser)
    args = parse_step_arguments(parser, argv)
    run_cells(args, args.cells, run_cell, markdown)


if __name__ == "__main__":
    main()
