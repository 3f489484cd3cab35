"""Full-graph GAT training on a graph whose activations do not fit one GPU in PyG: gnnfuse
with the vertices partitioned over N GPUs (`gnnfuse.distributed`), against PyG and
gnnfuse on one GPU, in one call.

The default cell (issue #17): the ``products-like`` preset's power-law topology scaled by
``--scale`` (default 2: 4.9M vertices, 124M edges; PyG's GATConv needs about 1.4 KB per
edge for a training step of this model -- measured on the CPU at 1/25 of the size --
so about 90 GB at scale 1, which an H200 holds, and 180 GB at scale 2, which it does
not), F=512 random features, 47 classes, the GAT paper's network (8 heads x 8 hidden,
ELU, one averaged output head, dropout 0.6 on features and attention), Adam. Each
method runs in its own processes (``torch.multiprocessing``; NCCL on GPUs, gloo on the
CPU), one after the other:

- ``pyg-1``: PyG's GATConv model on one GPU; an out-of-memory error is caught and
  recorded with the peak memory reached (the expected result at the default size);
- ``gnnfuse-N``: N ranks, vertices partitioned (``--partition``), halo exchange per
  layer, gradients summed by all-reduce: per-rank step time (median of ``--steps``
  after ``--warmup``, CUDA events), peak memory, halo rows and bytes per step, and the
  partition's edge cut;
- ``gnnfuse-1``: the same compiled model on one GPU, unpartitioned.

Every method first computes the eval-mode loss of the same initial weights on the same
features; the partitioned loss must equal the one-process losses (a loud warning
otherwise), the benchmark's correctness check.

    python benchmarks/bench_distributed_fullgraph.py --gpus 2            # nvidia-h200-x2
    python benchmarks/bench_distributed_fullgraph.py --smoke --json /tmp/smoke.json   # CPU, gloo, seconds
"""
from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gnnfuse.bench import failure_status, summarize, time_calls
from gnnfuse.data.registry import POWER_LAW_PRESETS
from gnnfuse.data.synthetic import power_law_graph
from gnnfuse.distributed.fullgraph import PartitionedModel, agreed_owners
from gnnfuse.distributed.gradients import all_reduce_gradients
from gnnfuse.distributed.halo import HaloExchange
from gnnfuse.distributed.launch import free_port, start_ranks
from gnnfuse.distributed.process_group import leave_process_group
from gnnfuse.distributed.partition import partition_graph, partition_stats
from gnnfuse.graph import Graph
from gnnfuse.nn.models import TwoLayerGNN, build_model

from common import REPO_ROOT, environment, log, resolve_device, results_saver, warn

HEADS, HIDDEN, DROPOUT, LR = 8, 8, 0.6, 0.005
SMOKE = {"nodes": 300, "edges": 2000, "features": 8, "classes": 5, "device": "cpu", "steps": 1, "warmup": 1}


# --- the data every process reads ------------------------------------------------------
def write_graph(args: argparse.Namespace, folder: Path) -> Path:
    """The topology, labels and training split, built once (seeded) and saved for the
    workers; features are drawn by each worker from the same seed on its own device."""
    data = power_law_graph(args.nodes, args.edges, 0, args.classes, seed=args.seed, name="products-like")
    path = folder / "graph.pt"
    torch.save({"src": data.graph.src, "dst": data.graph.dst, "y": data.y, "train": data.train_mask}, path)
    return path


FEATURE_CHUNK = 1 << 20      # rows drawn per generator seed


def features(args: argparse.Namespace, device: torch.device, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The [N, F] N(0, 1) features from ``args.seed`` (drawn on ``device``), or their ``rows``.

    Drawn in chunks of `FEATURE_CHUNK` rows, each from its own seed, so a rank draws only
    the chunks holding its rows: drawing the whole table on every GPU to keep a quarter
    of it ran out of memory at 10x products-like (50 GB) before training began."""
    wanted, order = (None, None) if rows is None else rows.to(device).sort()
    parts = []
    for start in range(0, args.nodes, FEATURE_CHUNK):
        stop = min(start + FEATURE_CHUNK, args.nodes)
        if wanted is not None:
            inside = wanted[(wanted >= start) & (wanted < stop)]
            if inside.numel() == 0:
                continue
        generator = torch.Generator(device=device).manual_seed(args.seed * 1_000_003 + start // FEATURE_CHUNK)
        chunk = torch.randn(stop - start, args.features, generator=generator, device=device)
        parts.append((start, chunk if wanted is None else chunk[inside - start]))
    if wanted is None:
        return torch.cat([chunk for _, chunk in parts])
    x = torch.empty(wanted.numel(), args.features, device=device)
    x[order] = torch.cat([chunk for _, chunk in parts])     # the chunks' rows in increasing id order
    return x


def pyg_gat(in_channels: int, out_channels: int) -> nn.Module:
    """The registry's ``gat`` network (`gnnfuse.nn.models`) built from PyG's GATConv: same
    parameter names, so the same state dict loads into both."""
    from torch_geometric.nn import GATConv
    return TwoLayerGNN(GATConv(in_channels, HIDDEN, heads=HEADS, dropout=DROPOUT),
                       GATConv(HEADS * HIDDEN, out_channels, heads=1, concat=False, dropout=DROPOUT), F.elu, DROPOUT)


def initial_state(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    torch.manual_seed(args.seed)
    return build_model("gat", args.features, args.classes, HIDDEN, DROPOUT).state_dict()


def rank_device(args: argparse.Namespace, rank: int) -> torch.device:
    if args.device == "cpu":
        return torch.device("cpu")
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def memory(device: torch.device) -> dict[str, float | None]:
    if device.type != "cuda":
        return {"peak_gb": None, "reserved_gb": None}
    return {"peak_gb": torch.cuda.max_memory_allocated(device) / 1e9,
            "reserved_gb": torch.cuda.max_memory_reserved(device) / 1e9}


# --- one process on one device -----------------------------------------------------------
def single(rank: int, framework: str, args: argparse.Namespace, graph_path: Path, out: Path) -> None:
    """``pyg-1`` / ``gnnfuse-1``: the whole graph on one device."""
    device = rank_device(args, rank)
    saved = torch.load(graph_path)
    cell: dict[str, Any] = {"status": "ok"}
    try:
        x = features(args, device)
        y, train = saved["y"].to(device), saved["train"].nonzero().squeeze(1).to(device)
        graph = Graph(saved["src"], saved["dst"], args.nodes).to(device)
        model = pyg_gat(args.features, args.classes) if framework == "pyg" else \
            build_model("gat", args.features, args.classes, HIDDEN, DROPOUT)
        model.load_state_dict(initial_state(args))
        model = model.to(device)
        graph_input = graph.edge_index if framework == "pyg" else graph
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        model.eval()
        with torch.no_grad():
            cell["initial_loss"] = F.cross_entropy(model(x, graph_input)[train], y[train]).item()
        model.train()

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x, graph_input)[train], y[train]).backward()
            optimizer.step()
        time_calls(step, args.warmup, device)
        cell.update(summarize(time_calls(step, args.steps, device)))
    except Exception as error:          # the expected OOM of PyG, or any failure: recorded, not fatal
        cell = {"status": failure_status(error), **({} if "initial_loss" not in cell
                                                    else {"initial_loss": cell["initial_loss"]})}
        if cell["status"] != "oom":
            cell["traceback"] = traceback.format_exc(limit=4)
    cell.update(memory(device))
    (out / f"{framework}-1.json").write_text(json.dumps(cell))


# --- N ranks, the graph partitioned ------------------------------------------------------
def ranked(rank: int, world: int, port: int, args: argparse.Namespace, graph_path: Path, out: Path) -> None:
    device = rank_device(args, rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=args.collective_timeout))
    cell: dict[str, Any] = {"status": "ok", "rank": rank}
    try:
        saved = torch.load(graph_path)
        begin = time.perf_counter()
        graph = Graph(saved["src"], saved["dst"], args.nodes).to(device)
        owner = agreed_owners(graph, device, args.partition)
        part = partition_graph(graph, owner, rank, world)
        cell["partition_s"] = time.perf_counter() - begin
        if rank == 0:
            stats = partition_stats(graph, owner, world)
            cell["partition"] = {"method": args.partition, "edge_cut": stats.edge_cut,
                                 "halo_rows": stats.halo_rows, "imbalance": stats.imbalance}
        whole = Graph(saved["src"], saved["dst"], args.nodes)      # on the host: only GCN reads it (degrees)
        del graph, owner
        x = features(args, device, part.owned)
        y = saved["y"][part.owned.cpu()].to(device)
        train = saved["train"][part.owned.cpu()].nonzero().squeeze(1).to(device)
        global_train = int(saved["train"].sum())
        cell.update(owned=part.num_owned, halo=part.num_halo, local_edges=part.graph.num_edges)
        model = build_model("gat", args.features, args.classes, HIDDEN, DROPOUT)
        model.load_state_dict(initial_state(args))
        model = model.to(device)
        exchange = HaloExchange(part)
        net = PartitionedModel(model, whole, exchange)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        model.eval()
        with torch.no_grad():
            total = F.cross_entropy(net(x)[train], y[train], reduction="sum").double().reshape(1)
            dist.all_reduce(total)
        cell["initial_loss"] = total.item() / global_train
        model.train()

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            (F.cross_entropy(net(x)[train], y[train], reduction="sum") / global_train).backward()
            all_reduce_gradients(model.parameters())
            optimizer.step()
        time_calls(step, args.warmup, device)
        exchange.reset_counts()
        cell.update(summarize(time_calls(step, args.steps, device)))
        cell["halo_mb_per_step"] = {"forward": exchange.forward_bytes / args.steps / 1e6,
                                    "backward": exchange.backward_bytes / args.steps / 1e6}
    except Exception as error:
        cell.update(status=failure_status(error), traceback=traceback.format_exc(limit=4))
    cell.update(memory(device))
    (out / f"gnnfuse-{world}.rank{rank}.json").write_text(json.dumps(cell))
    leave_process_group()


# --- the driver --------------------------------------------------------------------------
def launch(fn: Any, args_tuple: tuple, nprocs: int, device: str) -> str | None:
    """Run ``fn`` in ``nprocs`` processes (`gnnfuse.distributed.launch.start_ranks`: forked
    from a fork server on the CPU, spawned for CUDA); None, or why they failed."""
    try:
        start_ranks(fn, args_tuple, nprocs, "cpu" if device == "cpu" else "cuda")
    except Exception as error:          # a crashed or killed worker: keep the other methods' results
        return failure_status(error)
    return None


def run(args: argparse.Namespace, save: Any) -> dict[str, Any]:
    device = resolve_device(args.device)
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "json"},
                               "environment": environment(device), "methods": {}}
    with tempfile.TemporaryDirectory(prefix="bench_dist_fg_") as tmp:
        folder = Path(tmp)
        begin = time.perf_counter()
        graph_path = write_graph(args, folder)
        log(f"[products-like x{args.scale:g}] {args.nodes:,} nodes, {args.edges:,} edges, F={args.features}: "
            f"built in {time.perf_counter() - begin:.1f} s")
        for method in args.methods:
            framework, count = method.rsplit("-", 1)
            world = int(count)
            begin = time.perf_counter()
            if world == 1:
                failure = launch(single, (framework, args, graph_path, folder), 1, args.device)
                files = [folder / f"{framework}-1.json"]
            else:
                failure = launch(ranked, (world, free_port(), args, graph_path, folder), world, args.device)
                files = [folder / f"gnnfuse-{world}.rank{r}.json" for r in range(world)]
            cells = [json.loads(f.read_text()) for f in files if f.exists()]
            entry: dict[str, Any] = {"wall_s": time.perf_counter() - begin}
            if failure and not cells:
                entry["status"] = failure
            elif world == 1:
                entry.update(cells[0])
            else:
                entry.update(status=next((c["status"] for c in cells if c["status"] != "ok"), failure or "ok"),
                             ranks=cells)
            results["methods"][method] = entry
            save(results)
            log(summary_line(method, entry))
    check_losses(results)
    save(results)
    return results


def summary_line(method: str, entry: dict[str, Any]) -> str:
    cells = entry.get("ranks", [entry])
    if entry["status"] != "ok":
        peaks = [c.get("peak_gb") for c in cells if c.get("peak_gb") is not None]
        return f"{method}: {entry['status']}" + (f" (peak {max(peaks):.1f} GB reached)" if peaks else "")
    peaks = ", ".join("–" if c["peak_gb"] is None else f"{c['peak_gb']:.1f}" for c in cells)
    return (f"{method}: step {cells[0]['median_ms']:.1f} ms (median), peak GB per GPU [{peaks}], "
            f"initial loss {cells[0]['initial_loss']:.6f}")


def check_losses(results: dict[str, Any]) -> None:
    """The eval-mode loss of the initial weights, one per method that got that far; the
    partitioned runs must give the one-process value (float32 sums in another order)."""
    losses = {}
    for method, entry in results["methods"].items():
        cell = entry.get("ranks", [entry])[0]
        if "initial_loss" in cell:
            losses[method] = cell["initial_loss"]
    results["initial_losses"] = losses
    if losses:
        low, high = min(losses.values()), max(losses.values())
        results["initial_loss_rel_spread"] = (high - low) / abs(high)
        if results["initial_loss_rel_spread"] > 1e-4:
            warn(f"the methods' initial losses differ: {losses}")


def markdown(results: dict[str, Any]) -> str:
    config, env = results["config"], results["environment"]
    lines = ["# Full-graph GAT on several GPUs (partitioned, halo exchange)", "",
             f"products-like topology x{config['scale']:g}: {config['nodes']:,} vertices, {config['edges']:,} edges, "
             f"F={config['features']}, {config['classes']} classes; GAT {HEADS} heads x {HIDDEN}, dropout {DROPOUT}, "
             f"Adam; {config['partition']} partition. {env['device_name']}, torch {env['torch']}, "
             f"torch_geometric {env['torch_geometric']}, commit {(env['git_commit'] or 'unknown')[:12]}"
             f"{' (dirty)' if env['git_dirty'] else ''}, {env['date']}.", "",
             f"Median of {config['steps']} training steps after {config['warmup']} (forward, loss, backward, "
             "gradient all-reduce, Adam); peak = torch's max allocated per GPU from the start of training "
             "(features, graph, model resident).", "",
             "| method | status | step ms | peak GB per GPU | owned / halo vertices per rank "
             "| halo MB per step (fwd / bwd, rank 0) |",
             "|---|---|---|---|---|---|"]
    for method, entry in results["methods"].items():
        cells = entry.get("ranks", [entry])
        ok = entry["status"] == "ok"
        peaks = " / ".join("–" if c.get("peak_gb") is None else f"{c['peak_gb']:.1f}" for c in cells)
        step = f"{cells[0]['median_ms']:.1f}" if ok else "–"
        shares = " / ".join(f"{c['owned']:,} + {c['halo']:,}" for c in cells if "owned" in c) or "–"
        halo = cells[0].get("halo_mb_per_step")
        halo_text = f"{halo['forward']:.4g} / {halo['backward']:.4g}" if halo else "–"
        lines.append(f"| {method} | {entry['status']} | {step} | {peaks} | {shares} | {halo_text} |")
    for method, entry in results["methods"].items():
        partition = entry.get("ranks", [{}])[0].get("partition")
        if partition:
            lines += ["", f"{method} partition ({partition['method']}): {100 * partition['edge_cut']:.1f}% of edges "
                      f"cut, {partition['halo_rows']:,} halo rows in all, load imbalance {partition['imbalance']:.3f}."]
    losses = results.get("initial_losses")
    if losses:
        lines += ["", "Initial eval-mode loss (same weights and features): " +
                  ", ".join(f"{m} {v:.6f}" for m, v in losses.items()) +
                  f"; relative spread {results['initial_loss_rel_spread']:.1e}."]
    return "\n".join(lines) + "\n"


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gpus", type=int, default=2, help="ranks of the partitioned run (default 2)")
    parser.add_argument("--methods", help="comma-separated, run in this order (default pyg-1,gnnfuse-N,gnnfuse-1)")
    parser.add_argument("--scale", type=float, default=2.0, help="products-like's vertices and edges times this "
                                                                 "(default 2)")
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--partition", default="contiguous", choices=["greedy", "contiguous"],
                        help="vertex partition (default contiguous: on this Chung-Lu graph every vertex has "
                             "neighbours on both sides, so the greedy pass, the library's default, fetches only "
                             "0.4%% fewer halo rows -- 2,430,963 vs 2,440,671 at scale 1, 2 ranks -- for a minute "
                             "of partitioning on the host)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--collective-timeout", type=float, default=120.0,
                        help="seconds a rank waits in a collective before giving up (a peer that failed)")
    parser.add_argument("--smoke", action="store_true", help="a tiny graph on the CPU over gloo, in seconds")
    parser.add_argument("--json", help="results file (default benchmarks/results/distributed_fullgraph.json, "
                                       "a .md beside it)")
    args = parser.parse_args(argv)
    nodes, edges, _, classes = POWER_LAW_PRESETS["products-like"]
    args.nodes, args.edges, args.classes = int(nodes * args.scale), int(edges * args.scale), classes
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
        args.scale = args.nodes / nodes
    args.methods = (args.methods or f"pyg-1,gnnfuse-{args.gpus},gnnfuse-1").split(",")
    for method in args.methods:
        framework, _, count = method.rpartition("-")
        if framework not in ("pyg", "gnnfuse") or not count.isdigit() or (framework == "pyg" and count != "1"):
            parser.error(f"unknown method {method!r}: pyg-1 or gnnfuse-N")
    if args.device == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() < max(
            int(m.rpartition("-")[2]) for m in args.methods):
        parser.error(f"{torch.cuda.device_count()} GPU(s) visible, fewer than the methods ask for")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_arguments(argv)
    path = Path(args.json) if args.json else REPO_ROOT / "benchmarks" / "results" / "distributed_fullgraph.json"

    results = run(args, results_saver(path, markdown))
    log(f"wrote {path} and {path.with_suffix('.md')}")
    return results


if __name__ == "__main__":
    main()
