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
Each cell first checks that both models give the same eval-mode output. The sides of a
cell take turns (``--blocks`` rounds of ``--steps // --blocks`` steps each, after each
side's warm-up): the GPU machine's host speeds up and slows down by a third within a
process, and timed one side after another a slow spell landed on one side.

A third column times gnnfuse's step replayed from a CUDA graph (`GraphStepCapture`) on the
same batches padded to fixed shapes as ``gnnfuse.loader.DataLoader(static_shapes=True)``
pads them (`loader.padded_graph_batch`), with capturable Adam; each step copies its
batch into the captured one. Its cell checks first that a replayed step's loss equals
an eager step's on the unpadded batch, from the same weights.

``--epochs N`` also times whole epochs over the same graphs as a training loop sees them,
the loader included: each model's loader collating on the host (``--epoch-workers``
processes, or in the training process for 0) and each batch moved to the device --
PyG's model on PyG's ``DataLoader``, gnnfuse's eager one on ``gnnfuse.loader.DataLoader``
and its replayed one on that loader's padded batches (``static_shapes=True``) -- and the
two loaders alone (PyG's, and gnnfuse's padded one, batches moved to the device), over
the graphs as a list and as an ``InMemoryDataset`` (``--epoch-sources``, as PyG's data
sets hold them); seconds per epoch, after one epoch of warm-up.

``--task regression`` trains a float target per graph instead (ZINC's task: L1 on the
pooled output), PyG's steps on plain batches and gnnfuse's replayed one on batches
padded with masked labels (``DataLoader(static_shapes=True, label_mask=True)``: the loss
multiplied by ``batch.y_mask``).

    python benchmarks/bench_graph_batches.py --device cuda --json benchmarks/results/graph_batches.json
    python benchmarks/bench_graph_batches.py --device cpu --steps 3 --warmup 1 --graphs 8 --json /tmp/g.json
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch_geometric.data import Batch, Data, InMemoryDataset
from torch_geometric.loader import DataLoader as PyGDataLoader

import gnnfuse.loader
import gnnfuse.nn
from gnnfuse.bench import REL_ERR_LIMIT, max_rel_err
from gnnfuse.bench.timing import failure_status, free_memory, summarize, synchronize, time_calls
from gnnfuse.loader.padded_graph_batch import GraphCapacities, pad_graph_batch
from gnnfuse.training import GraphStepCapture

from bench_training import comma_list
from common import (add_step_arguments, check_failed, environment, fail_mark, fmt, load_results, log, new_run_id,
                    parse_step_arguments, prune_runs, resolve_device, results_saver, runs_markdown)

MODELS = ("GIN", "GCN", "GraphSAGE", "GAT")
FEATURES, CLASSES = 32, 2
TASKS = ("classification", "regression")
TASK = "classification"     # --task: what `molecule_graphs` labels and the steps' losses train


def outputs() -> int:
    """The head's width: a logit per class, or the one regressed value."""
    return CLASSES if TASK == "classification" else 1


def plain_loss(out: torch.Tensor, batch: Any) -> torch.Tensor:
    """The loss on an unpadded batch: cross-entropy, or L1 of the one output (ZINC's)."""
    return F.cross_entropy(out, batch["y"]) if TASK == "classification" else F.l1_loss(out[:, 0], batch["y"])


def padded_loss(out: torch.Tensor, batch: Batch) -> torch.Tensor:
    """`plain_loss` on a padded batch: cross-entropy ignores the padding's labels; L1 is
    multiplied by ``y_mask`` (0 on the padding) and divided by the real count."""
    if TASK == "classification":
        return F.cross_entropy(out, batch.y)
    return (F.l1_loss(out[:, 0], batch.y, reduction="none") * batch.y_mask).sum() / batch.y_mask.sum()


def molecule_graphs(count: int, graphs: int, seed: int = 0) -> list[list[Data]]:
    """``count`` lists of ``graphs`` random molecule-sized graphs each (both directions of
    every edge, as PyG's molecule data sets store them), on the host; a class label each,
    or a float target for ``--task regression``."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        batch = []
        for _ in range(graphs):
            n = int(torch.randint(10, 41, (1,), generator=gen))
            m = int(n * 1.1)
            src = torch.randint(0, n, (m,), generator=gen)
            dst = (src + torch.randint(1, n, (m,), generator=gen)) % n            # no self loops
            batch.append(Data(x=torch.randn(n, FEATURES, generator=gen),
                              edge_index=torch.stack([torch.cat([src, dst]), torch.cat([dst, src])]),
                              y=(torch.randint(0, CLASSES, (1,), generator=gen) if TASK == "classification"
                                 else torch.randn(1, generator=gen))))
        out.append(batch)
    return out


def molecule_batches(count: int, graphs: int, device: torch.device, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """`molecule_graphs` collated as PyG's ``DataLoader`` collates them: x, edge_index,
    batch vector, labels, on ``device``."""
    return [{key: b[key].to(device) for key in ("x", "edge_index", "batch", "y")}
            for b in map(Batch.from_data_list, molecule_graphs(count, graphs, seed))]


def padded_batches(count: int, graphs: int, device: torch.device, seed: int = 0) -> list[Batch]:
    """The same batches padded to one set of capacities covering them all (as
    ``DataLoader(static_shapes=True)`` pads a data set's batches), on ``device``."""
    collated = [Batch.from_data_list(g) for g in molecule_graphs(count, graphs, seed)]
    capacities = GraphCapacities.covering([(b.num_nodes, b.num_edges) for b in collated], graphs + 1)
    return [pad_graph_batch(b, capacities, label_mask=TASK == "regression").to(device) for b in collated]


class Classifier(torch.nn.Module):
    """A PyG ``BasicGNN`` model, sum pooling per graph, a linear head."""

    def __init__(self, body: torch.nn.Module, hidden: int):
        super().__init__()
        self.body, self.head = body, torch.nn.Linear(hidden, outputs())

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
        plain_loss(model(b["x"], b["edge_index"], b["batch"], graphs), b).backward()
        optimizer.step()
    return step


def batch_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn=padded_loss):
    """One training step on a PyG ``Batch``: pooled over its ``num_graphs``, ``loss_fn``
    (default `padded_loss`, which leaves out a padded batch's padding graphs; `plain_loss`
    for unpadded batches, whose labels need no mask); returns the loss."""
    def train(batch: Batch) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch.x, batch.edge_index, batch.batch, batch.num_graphs), batch)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return train


def captured_step_fn(model: torch.nn.Module, batches: list[Batch]):
    """`step_fn` for padded batches, replayed from a CUDA graph after the warm-up
    (`GraphStepCapture`), with capturable Adam; returns (step, the capture)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    position = [0]
    capture = GraphStepCapture(batch_step(model, optimizer), optimizers=[optimizer], modules=[model], mode="on")

    def step() -> torch.Tensor:
        batch = batches[position[0] % len(batches)]
        position[0] += 1
        return capture(batch)
    return step, capture


def replayed_loss_error(name: str, args: argparse.Namespace, device: torch.device, plain, padded) -> float:
    """|loss of a replayed step - loss of an eager step| on the first batch, from the same
    weights: the captured step is warmed up and captured on the padded batches, then its
    weights are reset and it replays the first one."""
    torch.manual_seed(0)
    model, _ = make_pair(name, args.hidden, args.layers, device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    step, capture = captured_step_fn(model.train(), padded)
    for _ in range(4):              # warm-up, audit and capture
        step()
    if not capture.replayed and not capture.status == "captured":
        raise RuntimeError(f"the step was not captured: {capture.status}")
    model.load_state_dict(start)
    for state in capture.optimizers[0].state.values():      # as new: moments and step count zero
        for value in state.values():
            value.zero_()
    replayed = float(capture(padded[0]))
    model.load_state_dict(start)
    b = plain[0]
    with torch.no_grad():
        eager = float(plain_loss(model(b["x"], b["edge_index"], b["batch"], args.graphs), b))
    return abs(replayed - eager)


def run_cell(name: str, args: argparse.Namespace, device: torch.device, batches, padded) -> dict[str, Any]:
    torch.manual_seed(0)
    ours, theirs = make_pair(name, args.hidden, args.layers, device)
    b = batches[0]
    with torch.no_grad():
        err = max_rel_err(ours.eval()(b["x"], b["edge_index"], b["batch"], args.graphs),
                          theirs.eval()(b["x"], b["edge_index"], b["batch"], args.graphs))
    cell: dict[str, Any] = {"model": name, "task": TASK, "graphs": args.graphs, "hidden": args.hidden,
                            "layers": args.layers,
                            "vertices_per_batch": sum(t["x"].shape[0] for t in batches) / len(batches),
                            "max_rel_err": err}
    runs = [("gnnfuse", lambda: step_fn(ours.train(), batches, args.graphs)),
            ("pyg", lambda: step_fn(theirs.train(), batches, args.graphs))]
    if padded is not None:
        cell["captured_loss_error"] = replayed_loss_error(name, args, device, batches, padded)
        torch.manual_seed(0)
        replayed, _ = make_pair(name, args.hidden, args.layers, device)
        runs.append(("gnnfuse_captured", lambda: captured_step_fn(replayed.train(), padded)[0]))
    steps, times = {}, {}
    for label, make in runs:
        try:
            step = make()
            start = time.perf_counter()
            for _ in range(args.warmup):
                step()
            cell[f"{label}_warmup_s"] = time.perf_counter() - start
            steps[label], times[label] = step, []
        except Exception as exc:      # one failing cell must not end the run
            cell[label] = {"status": failure_status(exc)}
    for _ in range(args.blocks):      # in turns: a slow spell of the host meets every side
        for label, step in list(steps.items()):
            try:
                times[label] += time_calls(step, max(1, args.steps // args.blocks), device)
            except Exception as exc:
                cell[label] = {"status": failure_status(exc)}
                del steps[label]
    for label in steps:
        cell[label] = summarize(times[label])
    free_memory(device)
    cell["speedup"], cell["captured_speedup"] = speedups(cell)
    ratio, captured = cell["speedup"], cell.get("gnnfuse_captured", {}).get("median_ms")
    log(f"{name}: gnnfuse {fmt(cell['gnnfuse'].get('median_ms'), '.2f')} ms, PyG "
        f"{fmt(cell['pyg'].get('median_ms'), '.2f')} ms ({fmt(ratio, '.2f')}x), captured "
        f"{fmt(captured, '.2f')} ms ({fmt(cell['captured_speedup'], '.2f')}x), rel err {err:.1e}")
    return cell


class MoleculeSet(InMemoryDataset):
    """Graphs held as PyG's data sets hold them (TU data sets, OGB's molecules): collated
    once, each graph a slice of the shared tensors."""

    def __init__(self, graphs: list[Data]):
        super().__init__(None)
        self.data, self.slices = self.collate(graphs)


EPOCH_KINDS = ("pyg", "gnnfuse", "gnnfuse_captured", "loader_pyg", "loader_gnnfuse")


def epoch_seconds(name: str, args: argparse.Namespace, device: torch.device, graphs: Any, kind: str,
                  workers: int) -> float:
    """Seconds per epoch over ``graphs`` (after one epoch of warm-up), loader included:
    ``kind`` "pyg" runs PyG's eager steps on PyG's ``DataLoader``'s batches, "gnnfuse"
    gnnfuse's on ``gnnfuse.loader.DataLoader``'s, "gnnfuse_captured" replays its step on
    that loader's padded ones; "loader_pyg" and "loader_gnnfuse" only move PyG's and the
    padded batches to the device."""
    torch.manual_seed(0)
    ours, theirs = make_pair(name, args.hidden, args.layers, device)
    model = (theirs if kind == "pyg" else ours).train()
    shared = {"batch_size": args.graphs, "shuffle": True, "num_workers": workers, "pin_memory": device.type == "cuda",
              "persistent_workers": workers > 0}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=kind == "gnnfuse_captured"
                                 and device.type == "cuda")
    train = batch_step(model, optimizer, padded_loss if kind == "gnnfuse_captured" else plain_loss)
    if kind in ("gnnfuse_captured", "loader_gnnfuse"):
        loader = gnnfuse.loader.DataLoader(graphs, static_shapes=True, label_mask=TASK == "regression", **shared)
    elif kind == "gnnfuse":
        loader = gnnfuse.loader.DataLoader(graphs, **shared)
    else:
        loader = PyGDataLoader(graphs, **shared)
    if kind.startswith("loader_"):
        def step(batch: Batch) -> None:
            del batch
    elif kind == "gnnfuse_captured":
        step = GraphStepCapture(train, optimizers=[optimizer], modules=[model], mode="on")
    else:
        step = train
    times = []
    for _ in range(1 + args.epochs):
        synchronize(device)
        start = time.perf_counter()
        for batch in loader:
            step(batch.to(device, non_blocking=True))
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def epoch_cells(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    graphs = [g for batch in molecule_graphs(args.batches, args.graphs) for g in batch]
    sources = {"list": graphs, "in_memory": MoleculeSet(graphs)}
    out: dict[str, Any] = {}
    for source in args.epoch_sources:
        for workers in args.epoch_workers:
            row = {}
            for kind in EPOCH_KINDS:
                try:
                    row[kind] = epoch_seconds(name, args, device, sources[source], kind, workers)
                except Exception as exc:      # one failing cell must not end the run
                    row[kind] = failure_status(exc)
                free_memory(device)
            out[f"{source}/{workers}"] = row
            log(f"{name} epochs, {source}, {workers} loader workers: " + ", ".join(
                f"{k} {v:.3f} s" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    return out


def speedups(cell: dict[str, Any]) -> tuple[float | None, float | None]:
    """PyG's time over gnnfuse's eager step and over its replayed one; None where a side
    failed or its check did (the eager forward beyond REL_ERR_LIMIT of PyG's, or the
    replayed loss beyond it of the eager loss): a faster step computing something else is
    no speed-up."""
    pyg, eager, captured = (cell.get(k, {}).get("median_ms") for k in ("pyg", "gnnfuse", "gnnfuse_captured"))
    agrees = not check_failed(cell["max_rel_err"], REL_ERR_LIMIT)
    replays = agrees and not check_failed(cell.get("captured_loss_error"), REL_ERR_LIMIT)
    return (pyg / eager if pyg and eager and agrees else None,
            pyg / captured if pyg and captured and replays else None)


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Graph classification: training step on batches of small graphs", "",
             "Median ms per step (Adam over sum-pooled graphs: cross-entropy for classification, L1 of one "
             "output for regression, masked by y_mask on padded batches); each step a new batch of "
             "molecule-sized graphs with cloned tensors. Speed-up is PyG's time over gnnfuse's.", "",
             "Captured: gnnfuse's step replayed from a CUDA graph (`GraphStepCapture`) on the same batches "
             "padded to fixed shapes (`DataLoader(static_shapes=True)`); its speed-up is PyG's time over its "
             "time, and loss error |replayed - eager| on the first batch from the same weights.", "",
             "| model | task | graphs/batch | vertices/batch | hidden x layers | gnnfuse ms | PyG ms | speed-up "
             "| rel err | captured ms | captured speed-up | captured loss error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in results["cells"].values():
        captured = c.get("gnnfuse_captured", {})
        error = c.get("captured_loss_error")
        speedup, captured_speedup = speedups(c)
        lines.append(f"| {c['model']} | {c.get('task', 'classification')} | {c['graphs']} "
                     f"| {c['vertices_per_batch']:.0f} | {c['hidden']} x {c['layers']} "
                     f"| {fmt(c['gnnfuse'].get('median_ms'), '.2f')} | {fmt(c['pyg'].get('median_ms'), '.2f')} "
                     f"| {fmt(speedup, '.2f')} | {c['max_rel_err']:.1e}{fail_mark(c['max_rel_err'], REL_ERR_LIMIT)} "
                     f"| {captured.get('status') or fmt(captured.get('median_ms'), '.2f')} "
                     f"| {fmt(captured_speedup, '.2f')} "
                     f"| {'-' if error is None else f'{error:.1e}'}{fail_mark(error, REL_ERR_LIMIT)} |")
    epochs = [(c, workers, row) for c in results["cells"].values() for workers, row in c.get("epochs", {}).items()]
    if epochs:
        lines += ["", "Whole epochs, the loader included (seconds per epoch over the cell's batches' graphs, "
                  "shuffled, held as a list or an InMemoryDataset; PyG's DataLoader for PyG, "
                  "gnnfuse.loader.DataLoader for gnnfuse eager, its padded batches for captured; the loader "
                  "columns only move each loader's batches to the device, PyG's and gnnfuse's padded ones; "
                  "speed-up is PyG's time over captured's):", "",
                  "| model | graphs held as | loader workers | PyG s | gnnfuse eager s | gnnfuse captured s "
                  "| captured speed-up | PyG loader s | gnnfuse padded loader s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c, key, row in epochs:
            def cell(value: Any) -> str:
                return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
            source, _, workers = key.rpartition("/")
            ratio = (row["pyg"] / row["gnnfuse_captured"] if all(isinstance(row.get(k), float)
                                                                  for k in ("pyg", "gnnfuse_captured")) else None)
            lines.append(f"| {c['model']} | {source or 'list'} | {workers} | {cell(row.get('pyg'))} "
                         f"| {cell(row.get('gnnfuse'))} | {cell(row.get('gnnfuse_captured'))} | {fmt(ratio, '.2f')} "
                         f"| {cell(row.get('loader_pyg'))} | {cell(row.get('loader_gnnfuse'))} |")
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
    parser.add_argument("--epochs", type=int, default=0,
                        help="also time this many whole epochs per model, loader included (default 0: none)")
    parser.add_argument("--epoch-workers", type=lambda text: [int(w) for w in text.split(",")], default=[0, 4],
                        help="loader worker processes for the epochs, comma-separated (default 0,4)")
    parser.add_argument("--epoch-sources", type=comma_list(("list", "in_memory")), default=["list", "in_memory"],
                        help="how the epochs' graphs are held: a list of Data, an InMemoryDataset, or both "
                             "(default list,in_memory)")
    parser.add_argument("--blocks", type=int, default=4,
                        help="rounds in which the cell's sides take turns, --steps // --blocks steps each (default 4)")
    parser.add_argument("--task", choices=TASKS, default="classification",
                        help="a class per graph (cross-entropy) or a float target (L1, masked labels when padded)")
    parser.add_argument("--json", type=Path, required=True)
    add_step_arguments(parser)
    args = parse_step_arguments(parser, argv)
    global TASK
    TASK = args.task
    device = resolve_device(args.device)
    results = load_results(args.json)
    run = new_run_id()
    results["runs"][run] = environment(device)
    save = results_saver(args.json, markdown)
    batches = molecule_batches(args.batches, args.graphs, device)
    padded = padded_batches(args.batches, args.graphs, device) if device.type == "cuda" else None
    for name in args.models:
        cell = {**run_cell(name, args, device, batches, padded), "run": run}
        if args.epochs:
            cell["epochs"] = epoch_cells(name, args, device)
        key = f"{name}/{args.graphs}" if TASK == "classification" else f"{name}/{args.graphs}/{TASK}"
        results["cells"][key] = cell
        prune_runs(results)
        save(results)


if __name__ == "__main__":
    main()
