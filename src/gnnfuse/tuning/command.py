"""The ``gnnfuse tune`` command line: tune one of `gnnfuse bench`'s models on a data set."""
from __future__ import annotations

import argparse
import os

import torch

from ..backend.tuned_schedule import PATH_ENV, cache_path, describe, foreign_file
from ..bench.models import MODELS, instantiate, load_data, reference_state
from ..data import DATASET_NAMES, LOAD_ERRORS, ROOT_HELP
from ..output_paths import folder_problem
from .search import tune
from .space import SPACES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gcn", choices=MODELS, help="a `gnnfuse bench` model (default gcn)")
    parser.add_argument("--dataset", required=True, help=f"one of: {', '.join(DATASET_NAMES)}")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backend", choices=("cpu", "triton"),
                        help="the backend to tune (default: cpu on --device cpu, triton on cuda)")
    parser.add_argument("--space", default="full", choices=SPACES,
                        help="full: every schedule (default); small: a few, for a quick check")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per unit and schedule (default 5)")
    parser.add_argument("--retune", action="store_true", help="time units that already have a stored choice")
    parser.add_argument("--root", help=ROOT_HELP)


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    backend = args.backend or ("triton" if args.device == "cuda" else "cpu")
    if backend == "triton" and args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--backend triton on --device cpu needs TRITON_INTERPRET=1 (and times the interpreter)")
    if backend == "cpu" and args.device == "cuda":
        parser.error("--backend cpu runs host tensors: use --device cpu")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    store = cache_path()
    # found by the write, after the whole search, whose results were then lost
    problem = ("it is a folder" if store.is_dir() else folder_problem(store.parent, made=True))
    if problem is not None:
        parser.error(f"the store of tuned choices, {store} (${PATH_ENV}, else $GNNFUSE_CACHE/"
                     f"tuned_schedules.json), cannot be written: {problem}; set ${PATH_ENV} to a file name "
                     "in a folder you can write")
    problem = foreign_file(store)       # found after the whole search, then replaced
    if problem is not None:
        parser.error(problem)
    device = torch.device(args.device)
    try:
        data = load_data(args.dataset, args.root, device, log=print)
    except (*LOAD_ERRORS, ValueError) as error:
        parser.error(str(error))
    module = instantiate("gnnfuse", args.model, data, reference_state(args.model, data), device)
    graph = data.gnnfuse_graph()
    print(f"tuning the {backend} backend for {args.model} on {args.dataset} ({device}, "
          f"{torch.get_num_threads()} CPU thread(s), {args.space} space)", flush=True)
    results = tune(lambda: module(data.x, graph), backend, device, args.space, args.repeats, args.retune,
                   log=lambda message: print(message, flush=True))
    tuned = sum(not r.reused for r in results)
    print(f"{tuned} unit(s) tuned, {len(results) - tuned} reused; choices in {cache_path()}")
    if backend == "cpu":
        print(f"(CPU choices hold for {torch.get_num_threads()} thread(s): run with the same --threads / "
              "torch.set_num_threads, or tune again for another count)")
    for r in results:
        speedup = "" if r.reused or not r.best_ms else f" ({r.cost_rule_ms / r.best_ms:.2f}x the cost rule)"
        print(f"  {describe(r.schedule)}{speedup}: {r.unit}")
    return 0
