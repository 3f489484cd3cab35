"""Graph classification: a training step on batches of many small graphs, gnnfuse's
PyG-named models against PyG's, from the same weights.

The other benchmarks time one large graph whose layouts are built once. Graph-level
tasks (molecules, TU data sets) give every step a new disjoint union of small graphs: a
new ``edge_index`` (as ``torch_geometric.loader.DataLoader`` collates it), other vertex
and edge counts, and so whatever a layer derives from the graph (gnnfuse's CSR, degrees,
kernel segments) is built again each step, on a few thousand vertices where host time
dominates. Batches here are molecule-sized graphs (10-40 vertices, about 1.1 undirected
edges per vertex, ogbg-molhiv's scale), made ahead on the device; each step clones its
batch's tensors, so no cache keyed by the tensor outlives the step, as with a loader.
Each cell first checks that both models give the same eval-mode output.

    python benchmarks/bench_graph_batches.py --device cuda --json benchmarks/results/graph_batches.json
    python benchmarks/bench_graph_batches.py --device cpu --steps 3 --warmup 1 --graphs 8 --json /tmp/g.json
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn

import gnnfuse.nn
from gnnfuse.bench import max_rel_err
from gnnfuse.bench.timing import failure_status, free_memory, summarize, time_calls

from bench_training import comma_list
from common import (add_step_arguments, environment, fmt, load_results, log, new_run_id, parse_step_arguments,
                    prune_runs, resolve_device, results_saver, runs_markdown)

MODELS = ("GIN", "GCN", "GraphSAGE", "GAT")
FEATURES, CLASSES = 32, 2


def molecule_batches(count: int, graphs: int, device: torch.device, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``count`` batches of ``graphs`` random molecule-sized graphs each (both directions of
    every edge, as PyG's molecule data sets store them): x, edge_index, batch vector, labels."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        xs, edges, owner, offset = [], [], [], 0
        for g in range(graphs):
            n = int(torch.randint(10, 41, (1,), generator=gen))
            m = int(n * 1.1)
            src = torch.randint(0, n, (m,), generator=gen)
            dst = (src + torch.randint(1, n, (m,), generator=gen)) % n            # no self loops
            edges.append(torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]) + offset)
            xs.append(torch.randn(n, FEATURES, generator=gen))
            owner.append(torch.full((n,), g))
            offset += n
        out.append({"x": torch.cat(xs).to(device), "edge_index": torch.cat(edges, 1).to(device),
                    "batch": torch.cat(owner).to(device),
                    "y": torch.randint(0, CLASSES, (graphs,), generator=gen).to(device)})
    return out


class Classifier(torch.nn.Module):
    """A PyG ``BasicGNN`` model, sum pooling per graph, a linear head."""

    def __init__(self, body: torch.nn.Module, hidden: int):
        super().__init__()
        self.body, self.head = body, torch.nn.Linear(hidden, CLASSES)

    def forward(self, x, edge_index, batch, graphs: int):
        return self.head(pyg_nn.global_add_pool(self.body(x, edge_index), batch, size=graphs))


def make_pair(name: str, hidden: int, layers: int, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(gnnfuse's, PyG's) classifier of model ``name``, PyG's weights copied into gnnfuse's."""
    kwargs = {"heads": 4} if name == "GAT" else {}
    theirs = Classifier(getattr(pyg_nn, name)(FEATURES, hidden, layers, **kwargs), hidden).to(device)
    ours = Classifier(getattr(gnnfuse.nn, name)(FEATURES, hidden, layers, **kwargs), hidden).to(device)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def step_fn(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]], graphs: int):
    """One training step per call, on the next batch, its tensors cloned (a loader's)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    position = [0]

    def step() -> None:
        b = {k: v.clone() for k, v in batches[position[0] % len(batches)].items()}
        position[0] += 1
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(b["x"], b["edge_index"], b["batch"], graphs), b["y"]).backward()
        optimizer.step()
    return step


def run_cell(name: str, args: argparse.Namespace, device: torch.device, batches) -> dict[str, Any]:
    torch.manual_seed(0)
    ours, theirs = make_pair(name, args.hidden, args.layers, device)
    b = batches[0]
    with torch.no_grad():
        err = max_rel_err(ours.eval()(b["x"], b["edge_index"], b["batch"], args.graphs),
                          theirs.eval()(b["x"], b["edge_index"], b["batch"], args.graphs))
    cell: dict[str, Any] = {"model": name, "graphs": args.graphs, "hidden": args.hidden, "layers": args.layers,
                            "vertices_per_batch": sum(t["x"].shape[0] for t in batches) / len(batches),
                            "max_rel_err": err}
    for label, model in (("gnnfuse", ours.train()), ("pyg", theirs.train())):
        step = step_fn(model, batches, args.graphs)
        try:
            start = time.perf_counter()
            for _ in range(args.warmup):
                step()
            cell[f"{label}_warmup_s"] = time.perf_counter() - start
            cell[label] = summarize(time_calls(step, args.steps, device))
        except Exception as exc:      # one failing cell must not end the run
            cell[label] = {"status": failure_status(exc)}
        free_memory(device)
    ratio = (cell["pyg"].get("median_ms", 0) / cell["gnnfuse"]["median_ms"]
             if "median_ms" in cell["gnnfuse"] and "median_ms" in cell["pyg"] else None)
    cell["speedup"] = ratio
    log(f"{name}: gnnfuse {fmt(cell['gnnfuse'].get('median_ms'), '.2f')} ms, PyG "
        f"{fmt(cell['pyg'].get('median_ms'), '.2f')} ms ({fmt(ratio, '.2f')}x), rel err {err:.1e}")
    return cell


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Graph classification: training step on batches of small graphs", "",
             "Median ms per step (Adam, cross-entropy over sum-pooled graphs); each step a new batch of "
             "molecule-sized graphs with cloned tensors. Speed-up is PyG's time over gnnfuse's.", "",
             "| model | graphs/batch | vertices/batch | hidden x layers | gnnfuse ms | PyG ms | speed-up | rel err |",
             "|---|---|---|---|---|---|---|---|"]
    for c in results["cells"].values():
        lines.append(f"| {c['model']} | {c['graphs']} | {c['vertices_per_batch']:.0f} | {c['hidden']} x {c['layers']} "
                     f"| {fmt(c['gnnfuse'].get('median_ms'), '.2f')} | {fmt(c['pyg'].get('median_ms'), '.2f')} "
                     f"| {fmt(c['speedup'], '.2f')} | {c['max_rel_err']:.1e} |")
    return "\n".join(lines + ["", *runs_markdown(results), ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=comma_list(MODELS), default=list(MODELS))
    parser.add_argument("--graphs", type=int, default=128, help="graphs per batch (default 128)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batches", type=int, default=64,
                        help="distinct batches, cycled (default 64: more than any gnnfuse cache holds, so a "
                             "repeated batch is not served a kept graph, as in an epoch of a loader)")
    parser.add_argument("--json", type=Path, required=True)
    add_step_arguments(parser)
    args = parse_step_arguments(parser, argv)
    device = resolve_device(args.device)
    results = load_results(args.json)
    run = new_run_id()
    results["runs"][run] = environment(device)
    save = results_saver(args.json, markdown)
    batches = molecule_batches(args.batches, args.graphs, device)
    for name in args.models:
        results["cells"][f"{name}/{args.graphs}"] = {**run_cell(name, args, device, batches), "run": run}
        prune_runs(results)
        save(results)


if __name__ == "__main__":
    main()
