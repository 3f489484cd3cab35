"""The ``gnnfuse bench`` command line."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


from ..data import DATASET_NAMES, LOAD_ERRORS, ROOT_HELP
from .compare import figure_class, format_table, plot, run_bench
from ..output_paths import replaced_outputs, unwritable_image, unwritable_output, write_atomically
from ..runtime.cuda_graph import MODES
from .models import FRAMEWORKS, KNOWN_FRAMEWORKS, MODELS, MissingDependency


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``gnnfuse bench`` options."""
    parser.add_argument("--model", default="gcn", choices=MODELS)
    parser.add_argument("--dataset", default="cora", help=f"one of: {', '.join(DATASET_NAMES)} (default cora)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"comma list of {', '.join(KNOWN_FRAMEWORKS)} (default: {','.join(FRAMEWORKS)}; "
                             "pyg-compile-ro is torch.compile(mode='reduce-overhead'), PyG with CUDA graphs)")
    parser.add_argument("--cuda-graph", choices=MODES, default="auto",
                        help="capture gnnfuse's training step in a CUDA graph: auto (default) when replayable on "
                             "CUDA, on (warn when not), off")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps (default 20)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps first (default 5; each framework runs at least 1, gnnfuse at least 3, "
                             "compiled PyG 5 more)")
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    parser.add_argument("--plot", type=Path, help="also draw a bar chart (PNG) here")
    parser.add_argument("--root", help=ROOT_HELP)


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``gnnfuse bench``: exit status 0, or 1 when the forward outputs disagree or gnnfuse failed."""
    frameworks = tuple(f.strip() for f in args.frameworks.split(",") if f.strip())
    problem = unwritable_output({"--json": args.json, "--plot": args.plot}) or unwritable_image({"--plot": args.plot})
    if problem:
        parser.error(problem)
    if args.plot:
        try:
            figure_class()
        except MissingDependency as error:
            parser.error(str(error))
    note = replaced_outputs({"--json": args.json, "--plot": args.plot})
    if note:
        print(note, flush=True)
    try:
        report = run_bench(args.model, args.dataset, args.device, frameworks, args.steps, args.warmup,
                           args.root, log=lambda message: print(message, flush=True), cuda_graph=args.cuda_graph)
    except (*LOAD_ERRORS, MissingDependency) as error:     # a data set missing and not downloadable, too
        parser.error(str(error))
    print(format_table(report), end="")
    if args.json:
        text = json.dumps(report, indent=1) + "\n"
        write_atomically(args.json, lambda tmp: tmp.write_text(text))
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {write_atomically(args.plot, lambda tmp: plot(report, tmp))}")
    ours = report["results"].get("gnnfuse", {"status": "ok"})
    return 0 if report["check"]["agrees"] and ours["status"] == "ok" else 1
