"""CSR (vertex-parallel) against COO (edge-parallel, atomic) schedules, and the cost rule.

The data behind `gnnfuse.backend.triton.executor.prefers_coo`: a neighbour sum through
the vertex-centric API, forced into each schedule with ``GNNFUSE_SCHEDULE``, on seeded
power-law graphs of one size and several average degrees, at several feature widths.
Every cell records both times, which schedule the rule picks, and what the pick costs
against the faster one (1.00 = the rule chose the faster schedule).

    python benchmarks/bench_schedules.py --degrees 1,2,4,8,16,64 --features 16,64,256
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

import gnnfuse
from gnnfuse.backend.triton.executor import prefers_coo
from gnnfuse.data.synthetic import power_law_graph

from common import (environment, fmt, load_results, log, new_run_id, prune_runs, resolve_device, runs_markdown,
                    save_json, summarize, time_calls, write_atomically)

SCHEDULES = ("csr", "coo")


@gnnfuse.vertex
def neighbour_sum(v):
    return sum([u.h for u in v.innbs])


def time_schedule(schedule: str, graph: gnnfuse.Graph, x: torch.Tensor, repeats: int,
                  device: torch.device) -> float:
    """Median ms of the neighbour sum with every unit forced into ``schedule``; the first
    calls compile and autotune and are not timed."""
    previous = os.environ.get("GNNFUSE_SCHEDULE")
    os.environ["GNNFUSE_SCHEDULE"] = schedule
    try:
        for _ in range(3):
            neighbour_sum(graph, {"h": x})
        return summarize(time_calls(lambda: neighbour_sum(graph, {"h": x}), repeats, device))["median_ms"]
    finally:
        if previous is None:
            del os.environ["GNNFUSE_SCHEDULE"]
        else:
            os.environ["GNNFUSE_SCHEDULE"] = previous


def measure(degree: int, args: argparse.Namespace, device: torch.device, results: dict[str, Any],
            run_id: str) -> None:
    graph = power_law_graph(args.nodes, args.nodes * degree, 1, 2, seed=degree).graph.to(device)
    max_degree = int(graph.in_degrees().max())
    for width in args.features:
        x = torch.randn(args.nodes, width, device=device)
        times = {s: time_schedule(s, graph, x, args.repeats, device) for s in SCHEDULES}
        pick = "coo" if prefers_coo(graph.num_edges / graph.num_nodes, width) else "csr"
        cell = {**{f"{s}_ms": t for s, t in times.items()}, "rule": pick, "max_in_degree": max_degree,
                "pick_cost": times[pick] / min(times.values()), "run": run_id}
        results["cells"][f"{degree}/{width}"] = cell
        log(f"degree {degree:3d} F={width:4d}: csr {times['csr']:.3f} ms, coo {times['coo']:.3f} ms; "
            f"rule picks {pick} ({cell['pick_cost']:.2f}x the faster)")
        store(results, args.out)


def render_markdown(results: dict[str, Any]) -> str:
    lines = ["# CSR vs COO schedule: neighbour sum on power-law graphs", "",
             "Median ms per call through the vertex-centric API (host overhead included, equal for both); "
             "rule = the schedule `prefers_coo` picks; pick cost = its time / the faster time.", "",
             *runs_markdown(results), "",
             f"Graphs: {results['nodes']:,} vertices, Chung-Lu power law (exponent 2.5), "
             "edges = vertices x average degree.", "",
             "| avg degree | max in-degree | F | csr ms | coo ms | rule | pick cost |", "|---|---|---|---|---|---|---|"]
    for key, c in sorted(results["cells"].items(), key=lambda kv: tuple(int(p) for p in kv[0].split("/"))):
        degree, width = key.split("/")
        lines.append(f"| {degree} | {c['max_in_degree']:,} | {width} | {fmt(c['csr_ms'], '.3f')} | "
                     f"{fmt(c['coo_ms'], '.3f')} | {c['rule']} | {fmt(c['pick_cost'], '.2f')} |")
    return "\n".join(lines) + "\n"


def store(results: dict[str, Any], out: Path) -> None:
    prune_runs(results)
    save_json(out / "schedules.json", results)
    write_atomically(out / "schedules.md", render_markdown(results))


def int_list(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--degrees", type=int_list, default=[1, 2, 4, 8, 16, 64])
    parser.add_argument("--features", type=int_list, default=[16, 64, 256])
    parser.add_argument("--nodes", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    results = load_results(args.out / "schedules.json")
    if results.get("nodes", args.nodes) != args.nodes:
        results["cells"] = {}          # another graph size: the old cells would not compare
    results["nodes"] = args.nodes
    run_id = new_run_id()
    results["runs"][run_id] = environment(device)
    for degree in args.degrees:
        measure(degree, args, device, results, run_id)
    log(f"done; {args.out / 'schedules.md'}")


if __name__ == "__main__":
    main()
