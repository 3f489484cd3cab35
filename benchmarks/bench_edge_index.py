"""Training step with a `gnnfuse.Graph` against the same model given PyG's raw ``edge_index``.

A PyG user who only swaps the import passes ``edge_index`` on every call; `Graph.coerce`
remembers the graph made for an unchanged index tensor, so that path should cost what
passing a `Graph` costs (issue #12: within 5% on the GPU at every size). For every data
set x model this times the two-layer gnnfuse model of `gnnfuse.bench` (same weights,
same timing as bench_training.py) once per input kind, and first checks that both
inputs give the same eval-mode forward.

Each edge_index measurement starts with an empty index cache, so its layouts are built
in its own warm-up, as a fresh `Graph` is for the Graph measurement. Results merge into
``--json`` keyed by data set/model/input; ``--md`` is regenerated after every cell.

    python benchmarks/bench_edge_index.py --device cuda --json benchmarks/results/edge_index.json \\
        --md benchmarks/results/edge_index.md
    python benchmarks/bench_edge_index.py --device cpu --datasets cora --models gcn --steps 3 --warmup 1 ...
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from gnnfuse.bench import MODELS, REL_ERR_LIMIT, guarded, instantiate, max_rel_err, measure, reference_state
from gnnfuse.graph import clear_index_cache

from bench_training import comma_list, describe
from common import (add_step_arguments, check_failed, device_names, environment, fail_mark, fmt, free_memory,
                    load_data_or_exit, load_results, log, new_run_id, parse_step_arguments, prune_runs, resolve_device,
                    runs_markdown, save_json, warn, write_atomically)

DATASETS = ("cora", "pubmed", "arxiv-like", "reddit2-like", "products-like")
DEFAULT_DATASETS = DATASETS[1:]      # the sizes issue #12 measured
INPUTS = ("graph", "edge_index")


def graph_argument(kind: str, data) -> Any:
    """What the model is called with: a fresh `Graph`, or the raw edge_index (cache emptied)."""
    if kind == "graph":
        return data.gnnfuse_graph()
    clear_index_cache()
    return data.edge_index


def check_same_forward(model: str, data, state: dict[str, torch.Tensor], device: torch.device) -> float:
    """max rel err between the eval-mode forwards on the two inputs (both gnnfuse)."""
    module = instantiate("gnnfuse", model, data, state, device).eval()
    with torch.no_grad():
        outputs = [module(data.x, graph_argument(kind, data)) for kind in INPUTS]
    return max_rel_err(*outputs)


# --- results ---------------------------------------------------------------------------
def ratio(results: dict[str, Any], dataset: str, model: str) -> float | None:
    """edge_index time / Graph time; None unless both cells are ok on one device and the
    two inputs' forwards agreed (a ratio between two different results means nothing). A
    check that did not run (it failed, or none is stored) leaves agreement unknown: no ratio."""
    graph, raw = (results["cells"].get(f"{dataset}/{model}/{kind}") for kind in INPUTS)
    err = results["checks"].get(f"{dataset}/{model}", {}).get("max_rel_err")
    usable = (graph and raw and graph["status"] == raw["status"] == "ok"
              and err is not None and not check_failed(err, REL_ERR_LIMIT)
              and len(device_names(results, [graph, raw])) == 1)
    return raw["median_ms"] / graph["median_ms"] if usable else None


def render_markdown(results: dict[str, Any]) -> str:
    lines = ["# Training step: gnnfuse Graph vs raw edge_index", "",
             "Median per-step time (forward + loss + backward + Adam) of the same two-layer model "
             "(benchmarks/bench_training.py's models and timing), called with a `gnnfuse.Graph` or with "
             "PyG's `edge_index` tensor; ratio = edge_index / Graph (goal: at most 1.05). max rel err "
             "compares the eval-mode forwards on the two inputs.", "",
             *runs_markdown(results), "",
             "| dataset | model | Graph ms | edge_index ms | ratio | max rel err |", "|---|---|---|---|---|---|"]
    rank = {name: i for i, name in enumerate(DATASETS + MODELS)}
    pairs = sorted({tuple(key.split("/")[:2]) for key in results["cells"]},
                   key=lambda p: (rank.get(p[0], len(rank)), p[0], rank.get(p[1], len(rank))))
    for dataset, model in pairs:
        cells = [results["cells"].get(f"{dataset}/{model}/{kind}") for kind in INPUTS]
        times = ["–" if c is None else fmt(c["median_ms"], ".2f") if c["status"] == "ok" else c["status"]
                 for c in cells]
        check = results["checks"].get(f"{dataset}/{model}", {})
        err = check.get("max_rel_err")
        err_text = check.get("status", "–") if err is None else f"{err:.1e}{fail_mark(err, REL_ERR_LIMIT)}"
        lines.append(f"| {dataset} | {model} | {times[0]} | {times[1]} | {fmt(ratio(results, dataset, model), '.3f')} "
                     f"| {err_text} |")
    return "\n".join(lines) + "\n"


def store(results: dict[str, Any], args: argparse.Namespace) -> None:
    prune_runs(results)
    save_json(args.json, results)
    write_atomically(args.md, render_markdown(results))


# --- driver ----------------------------------------------------------------------------
def run_dataset(name: str, args: argparse.Namespace, device: torch.device, results: dict[str, Any],
                run_id: str) -> None:
    data = load_data_or_exit(name, args.data_root, device)
    for model in args.models:
        state = reference_state(model, data)
        check = guarded(lambda: {"status": "ok", "max_rel_err": check_same_forward(model, data, state, device)},
                        device)
        results["checks"][f"{name}/{model}"] = {**check, "run": run_id}
        err = check.get("max_rel_err")
        if check_failed(err, REL_ERR_LIMIT):
            warn(f"{name}/{model}: the edge_index forward differs from the Graph forward by {err:.2e}")
        for kind in INPUTS:
            begin = time.perf_counter()
            cell = guarded(lambda: measure("gnnfuse", model, data, state, args.steps, args.warmup, device,
                                           graph=graph_argument(kind, data)), device, args.cell_timeout)
            clear_index_cache()
            results["cells"][f"{name}/{model}/{kind}"] = {**cell, "run": run_id}
            store(results, args)
            log(f"[{name}] {model} {kind}: {describe(cell)} [{time.perf_counter() - begin:.1f} s]")
    del data
    free_memory(device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=comma_list(DATASETS), default=list(DEFAULT_DATASETS))
    parser.add_argument("--models", type=comma_list(MODELS), default=list(MODELS))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/edge_index.json"),
                        help="results file, merged into")
    parser.add_argument("--md", type=Path, default=Path("benchmarks/results/edge_index.md"),
                        help="table regenerated from --json")
    add_step_arguments(parser)
    return parse_step_arguments(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    results = load_results(args.json)
    results.setdefault("checks", {})
    run_id = new_run_id()
    results["runs"][run_id] = environment(device)
    log(f"run {run_id} on {results['runs'][run_id]['device_name']}; results -> {args.json}, {args.md}")
    begin = time.perf_counter()
    for name in args.datasets:
        run_dataset(name, args, device, results, run_id)
    store(results, args)
    log(f"done in {time.perf_counter() - begin:.1f} s; {args.md}")


if __name__ == "__main__":
    main()
