"""``gnnfuse explain``: what the compiler makes of a two-layer model's graph layers.

Builds the model `gnnfuse bench` times (same layers and widths), runs one training-mode
forward on the data set under `gnnfuse.explain`, so the backward programs and the values
saved for them are those of real training, and prints the report.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from .bench import MODELS, build_model
from .data import DATASET_NAMES, LOAD_ERRORS, ROOT_HELP, load_node_dataset
from .graph import Graph
from .output_paths import replaced_outputs, unwritable_image, unwritable_output, write_atomically
from .runtime import explain
from .runtime.explain import graphviz_renders


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``gnnfuse explain`` options."""
    parser.add_argument("--model", default="gcn", choices=MODELS)
    parser.add_argument("--dataset", default="synthetic", help=f"one of: {', '.join(DATASET_NAMES)} (default synthetic)")
    parser.add_argument("--source", action="store_true", help="also print each fused unit's Triton kernel")
    parser.add_argument("--graph", type=Path, metavar="OUT.png", help="draw the dataflow graph to this file")
    parser.add_argument("--dot", type=Path, metavar="OUT.dot", help="write the dataflow graph as Graphviz DOT")
    parser.add_argument("--root", help=ROOT_HELP)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the forward runs (cuda: the generated kernels, autotuned)")


def edge_count_note(name: str, graph: Graph, model: torch.nn.Module) -> str:
    """Why the programs' E can differ from `gnnfuse info`'s: layers with ``add_self_loops``
    (GCN, GAT, as in PyG) run on the graph with one self loop per vertex."""
    note = f"{name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges (as `gnnfuse info` counts them)"
    looped = sorted({type(m).__name__ for m in model.modules() if getattr(m, "add_self_loops", False)})
    if looped:
        with_loops = graph.remove_self_loops().num_edges + graph.num_nodes
        verb = "adds" if len(looped) == 1 else "add"
        note += (f"; {' and '.join(looped)} {verb} a self loop to every node (add_self_loops=True, as in PyG), "
                 f"so the programs below run on {with_loops:,} edges")
    return note


def drawing_problem(path: Path | None) -> str | None:
    """Why ``--graph path`` cannot be drawn, or None -- checked before the work, since the
    drawing comes last. Without Graphviz, matplotlib draws it and takes the file type from
    the name's ending: an unknown one raised its ValueError after the work, and none was
    saved as ``path.png`` while the command said it wrote ``path``."""
    if path is None or graphviz_renders():
        return None
    missing = [name for name in ("matplotlib", "networkx") if importlib.util.find_spec(name) is None]
    if missing:
        return (f"--graph needs Graphviz (the graphviz package and its dot binary), or matplotlib and networkx "
                f"(missing: {', '.join(missing)})")
    return unwritable_image({"--graph": path})


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    problem = unwritable_output({"--dot": args.dot, "--graph": args.graph}) or drawing_problem(args.graph)
    if problem:
        parser.error(problem)
    if args.device == "cuda" and not torch.cuda.is_available():     # before a data set that may take minutes
        parser.error(f"--device cuda, but CUDA is not available to this torch ({torch.__version__})")
    try:
        dataset = load_node_dataset(args.dataset, args.root)
    except LOAD_ERRORS as error:
        parser.error(str(error))
    note = replaced_outputs({"--dot": args.dot, "--graph": args.graph})
    if note:
        print(note)
    torch.manual_seed(0)
    model = build_model("gnnfuse", args.model, dataset.num_features, dataset.num_classes).train()
    try:
        report = explain(model.to(args.device), dataset.x.to(args.device), dataset.graph.to(args.device),
                         source=args.source)
    except RuntimeError as error:      # source=True without triton
        parser.error(str(error))
    print(edge_count_note(args.dataset, dataset.graph, model))
    print(report)
    if args.dot:
        dot = report.to_dot()
        write_atomically(args.dot, lambda tmp: tmp.write_text(dot))
        print(f"wrote {args.dot}")
    if args.graph:
        print(f"wrote {write_atomically(args.graph, report.render)}")
    return 0
