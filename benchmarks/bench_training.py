"""Full-graph training step: gnnfuse's compiled layers against PyG, eager and torch.compile'd.

For every data set x model x framework it times one optimisation step (forward, loss
on the training nodes, backward, Adam) on the same graph from the same initial weights (models, timing and
memory accounting are gnnfuse.bench's, shared with the ``gnnfuse bench`` command),
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
import time
from pathlib import Path
from typing import Any, Callable

import torch

from gnnfuse.bench import (COMPILE_EXTRA_WARMUP, FRAMEWORKS, MODELS, REL_ERR_LIMIT, check_forward, free_memory,
                           guarded, measure, reference_state)
from gnnfuse.bench.measure import prime_capture_stream

from common import (add_step_arguments, check_failed, device_names, environment, fail_mark, fmt, load_data_or_exit,
                    load_results, log, new_run_id, parse_step_arguments, prune_runs, resolve_device, runs_markdown,
                    save_json, warn, write_atomically)

DATASETS = ("cora", "citeseer", "pubmed", "arxiv-like", "reddit2-like", "products-like")


# --- results ---------------------------------------------------------------------------
def ratios(results: dict[str, Any], dataset: str, model: str) -> dict[str, float | None]:
    """gnnfuse's speedup (other time / gnnfuse time) and memory ratio (gnnfuse peak /
    other peak) against each PyG variant; None where a cell is missing, failed, or was
    measured on a different device than gnnfuse's, or where the forward check did not
    pass (the module doc's promise: no speedup for a layer that computes something else).

    The memory ratio also needs both cells from one run: a peak counts everything the
    process holds, which differs between runs (pubmed/gcn: 0.518 GB resident in one
    run, 0.114 in another, and a 'mem vs pyg' of 2.65 where the run's compiled PyG
    peaked at gnnfuse's 0.581 GB)."""
    cells = results["cells"]
    ours = cells.get(f"{dataset}/{model}/gnnfuse")
    err = results["checks"].get(f"{dataset}/{model}", {}).get("max_rel_err")
    agrees = err is not None and err <= REL_ERR_LIMIT
    out: dict[str, float | None] = {}
    for other in FRAMEWORKS[1:]:
        theirs = cells.get(f"{dataset}/{model}/{other}")
        usable = (agrees and ours and theirs and ours["status"] == theirs["status"] == "ok"
                  and len(device_names(results, [ours, theirs])) == 1)
        out[f"speedup_vs_{other}"] = theirs["median_ms"] / ours["median_ms"] if usable else None
        out[f"memory_ratio_vs_{other}"] = (ours["peak_gb"] / theirs["peak_gb"]
                                           if usable and ours["run"] == theirs["run"] and ours["peak_gb"]
                                           and theirs["peak_gb"] else None)
    return out


def row_keys(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(data set, model) pairs present, in the canonical order, unknown names last."""
    pairs = {tuple(key.split("/")[:2]) for key in results["cells"]}
    rank = {name: i for i, name in enumerate(DATASETS + MODELS)}
    return sorted(pairs, key=lambda p: (rank.get(p[0], len(rank)), p[0], rank.get(p[1], len(rank)), p[1]))


def time_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "–"
    if cell["status"] == "ok":
        return fmt(cell["median_ms"], ".2f")
    held = cell.get("held_gb")   # memory earlier cells left allocated (see gnnfuse.bench.guarded)
    return f"{cell['status']} ({held:.1f} GB held before)" if held is not None and held >= 1.0 else cell["status"]


def render_markdown(results: dict[str, Any]) -> str:
    """The summary table, regenerated from the whole merged JSON."""
    head = ["dataset", "model", "gnnfuse ms", "pyg ms", "pyg-compile ms", "speedup vs pyg",
            "speedup vs pyg-compile", "gnnfuse GB", "pyg GB", "pyg-compile GB", "mem vs pyg",
            "mem vs pyg-compile", "reserved GB gnnfuse / pyg-compile", "max rel err"]
    lines = ["# Full-graph training step: gnnfuse vs PyG", "",
             "Median of per-step times (forward + loss + backward + Adam); peak GB = "
             "`torch.cuda.max_memory_allocated` over the timed steps (a step gnnfuse captured in a CUDA "
             "graph: over its recording and its replays); reserved GB = `torch.cuda.max_memory_reserved` "
             "over the timed steps (cached and fragmented blocks, and a captured step's whole graph pool, "
             "included; – where not measured); speedup = PyG time / gnnfuse "
             "time; mem = gnnfuse peak / PyG peak, both cells from one run (– otherwise); "
             "max rel err = max|gnnfuse - PyG| / max|PyG| of the "
             f"eval-mode forward (flagged above {REL_ERR_LIMIT:g}). Loss: PyG's steps use torch's "
             "`F.cross_entropy(out[train_idx], y[train_idx])`; gnnfuse's, in cells measured from commit ce793c6 "
             "on, `gnnfuse.nn.functional.cross_entropy(out, y[train_idx], rows=train_idx)` (the loss "
             "`gnnfuse train` uses; earlier cells used torch's). See benchmarks/README.md.", "",
             *runs_markdown(results), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for dataset, model in row_keys(results):
        cells = [results["cells"].get(f"{dataset}/{model}/{fw}") for fw in FRAMEWORKS]
        r = results["ratios"][f"{dataset}/{model}"]
        check = results["checks"].get(f"{dataset}/{model}", {})
        err = check.get("max_rel_err")
        err_text = check.get("status", "–") if err is None else f"{err:.1e}{fail_mark(err, REL_ERR_LIMIT)}"
        row = [dataset, model, *(time_cell(c) for c in cells),
               fmt(r["speedup_vs_pyg"], ".2f"), fmt(r["speedup_vs_pyg-compile"], ".2f"),
               *(fmt(c.get("peak_gb") if c else None, ".3f") for c in cells),
               fmt(r["memory_ratio_vs_pyg"], ".2f"), fmt(r["memory_ratio_vs_pyg-compile"], ".2f"),
               " / ".join(fmt(c.get("reserved_gb") if c else None, ".2f")
                          for c in (cells[FRAMEWORKS.index("gnnfuse")], cells[FRAMEWORKS.index("pyg-compile")])),
               err_text]
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
    data = load_data_or_exit(name, args.data_root, device)
    for model in args.models:
        state = reference_state(model, data)
        check = guarded(lambda: {"status": "ok", "max_rel_err": check_forward(model, data, state, device)}, device)
        results["checks"][f"{name}/{model}"] = {**check, "run": run_id}
        err = check.get("max_rel_err")
        log(f"[{name}] {model} forward check: " + (f"max rel err {err:.2e}" if err is not None else check["status"]))
        if check_failed(err, REL_ERR_LIMIT):
            warn(f"{name}/{model}: gnnfuse forward differs from PyG by {err:.2e} (> {REL_ERR_LIMIT:g})")
        for framework in args.frameworks:
            begin = time.perf_counter()
            cell = guarded(lambda: measure(framework, model, data, state, args.steps, args.warmup, device), device,
                           args.cell_timeout)
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
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="folder of training.json (merged into) and training.md")
    add_step_arguments(parser, warmup_note=f"; pyg-compile gets {COMPILE_EXTRA_WARMUP} more",
                       cell_timeout_help="seconds one framework may take on one model and data set, compile "
                                         "included; past it the cell is recorded as a time-out and the run goes "
                                         "on (default: none)")
    return parse_step_arguments(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    results = load_results(args.out / "training.json")
    results.setdefault("checks", {})
    run_id = new_run_id()
    prime_capture_stream(device)     # in every cell's peak, whichever framework comes first (`gnnfuse.bench.run_bench`)
    results["runs"][run_id] = environment(device)
    log(f"run {run_id} on {results['runs'][run_id]['device_name']}; results -> {args.out}")
    begin = time.perf_counter()
    for name in args.datasets:
        run_dataset(name, args, device, results, run_id)
    store(results, args.out)
    log(f"done in {time.perf_counter() - begin:.1f} s; {args.out / 'training.md'}")


if __name__ == "__main__":
    main()
