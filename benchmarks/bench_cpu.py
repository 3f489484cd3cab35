"""CPU benchmark of the Numba backend (``GNNFUSE_BACKEND=cpu``): the aggregation kernels
alone, and full training steps, against PyG and torch on the same CPU.

Kernels (forward, float32, vertex features given): neighbour sum, GCN-normalized sum
(``sum(norm_u * h_u) * norm_v``) and GAT attention aggregation (edge softmax of
``leaky_relu(al_u + ar_v)`` weighting ``h_u``, one head), each as gnnfuse's fused kernel,
as PyG's gather-then-scatter, and as ``torch.sparse.mm`` on a CSR adjacency holding the
edge weights (for GAT the weights are the softmax, computed by PyG's ``softmax`` inside
the timed call: that is what a sparse-matmul implementation must do each step). Every
method is checked against PyG's output. Then GCN/GAT/SAGE training steps
(`gnnfuse.bench.measure`) for gnnfuse on the CPU backend, gnnfuse on the torch
reference, PyG eager and compiled PyG, each gnnfuse model's eval-mode forward first
checked against PyG's on its backend. Each is run at every thread count asked for.

Results merge into ``<out>/cpu.json`` and ``<out>/cpu.md`` with the CPU's name and the
commit. On a shared machine the numbers are noise-bound: rerun on a quiet one.

    python benchmarks/bench_cpu.py                                  # pubmed + arxiv-like, F 16/64/256, 1 and 2 threads
    python benchmarks/bench_cpu.py --dataset pubmed --features 16 --threads 1 --repeats 3 --models gcn

The backend runs the tuner's stored choices where they exist (``gnnfuse tune`` for the
training models, ``--tune`` here for the kernels); otherwise its cost rule.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch_geometric.utils import scatter
from torch_geometric.utils import softmax as pyg_softmax

import gnnfuse
from gnnfuse import bench
from gnnfuse.data import load_dataset
from gnnfuse.tuning import SPACES, tune

from bench_aggregate import build_operands, max_rel_err, neighbour_sum
from common import (check_failed, environment, fmt, guarded, load_results, log, new_run_id, prune_runs,
                    runs_markdown, save_json, summarize, time_calls, warn, write_atomically)

KERNELS = ("sum", "gcn", "gat")
METHODS = ("gnnfuse-cpu", "pyg-scatter", "sparse-mm")
TRAINERS = ("gnnfuse-cpu", "gnnfuse-reference", "pyg", "pyg-compile")
REL_ERR_LIMIT = 1e-4
NEGATIVE_SLOPE = 0.2


@gnnfuse.vertex
def gcn_sum(v):
    return sum([u.h * u.norm for u in v.innbs]) * v.norm


@gnnfuse.vertex
def gat_aggregate(v):
    e = [torch.exp(F.leaky_relu(u.al + v.ar, NEGATIVE_SLOPE)) for u in v.innbs]
    total = sum(e)
    return sum([e[i] / total * u.h for i, u in enumerate(v.innbs)])


def weighted_adjacency(ops, weight: torch.Tensor) -> torch.Tensor:
    """CSR [dst, src] adjacency holding ``weight`` per edge (multi-edges summed)."""
    n = ops.num_nodes
    coo = torch.sparse_coo_tensor(torch.stack([ops.dst, ops.src]), weight, (n, n), check_invariants=False)
    return coo.coalesce().to_sparse_csr()


def kernel_methods(kernel: str, ops, x: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """Each method of one kernel as a call of no arguments (operands prebuilt)."""
    src, dst, n, graph = ops.src, ops.dst, ops.num_nodes, ops.graph
    if kernel == "sum":
        return {"gnnfuse-cpu": lambda: neighbour_sum(graph, {"h": x}),
                "pyg-scatter": lambda: scatter(x.index_select(0, src), dst, dim=0, dim_size=n, reduce="sum"),
                "sparse-mm": lambda: torch.sparse.mm(ops.adjacency, x)}
    if kernel == "gcn":
        norm = graph.in_degrees().float().clamp_min(1).pow(-0.5)
        adjacency = weighted_adjacency(ops, norm[dst] * norm[src])
        return {"gnnfuse-cpu": lambda: gcn_sum(graph, {"h": x, "norm": norm}),
                "pyg-scatter": lambda: scatter(x.index_select(0, src) * (norm[src] * norm[dst]).unsqueeze(1), dst,
                                               dim=0, dim_size=n, reduce="sum"),
                "sparse-mm": lambda: torch.sparse.mm(adjacency, x)}
    gen = torch.Generator().manual_seed(1)
    al, ar = torch.randn(n, generator=gen), torch.randn(n, generator=gen)

    def alpha() -> torch.Tensor:
        return pyg_softmax(F.leaky_relu(al[src] + ar[dst], NEGATIVE_SLOPE), dst, num_nodes=n)
    return {"gnnfuse-cpu": lambda: gat_aggregate(graph, {"h": x, "al": al, "ar": ar}),
            "pyg-scatter": lambda: scatter(x.index_select(0, src) * alpha().unsqueeze(1), dst, dim=0,
                                           dim_size=n, reduce="sum"),
            "sparse-mm": lambda: torch.sparse.mm(weighted_adjacency(ops, alpha()), x)}


WARMUP_SECONDS = 0.3   # and at least this long: the process's first parallel calls run slow


def warm(fn: Callable[[], torch.Tensor], args) -> None:
    """``args.warmup`` untimed calls lasting at least `WARMUP_SECONDS`: with two warm-up
    calls, the first kernel timed in a process (the neighbour sum at two threads) read
    1.23 ms where the same call later read 0.34 ms."""
    begin, calls = time.perf_counter(), 0
    while calls < args.warmup or time.perf_counter() - begin < WARMUP_SECONDS:
        fn()
        calls += 1


def interleaved(fns: dict[str, Callable[[], torch.Tensor]], args) -> dict[str, list[float]]:
    """Per method, the median of ``args.repeats`` calls in each of ``args.rounds`` rounds;
    the methods take turns within a round, each round starting one method later.

    Why rounds: this VM's memory bandwidth and the second core come and go, and timing
    one method's calls back to back put a slow spell on one method only. Pubmed's
    F=256 one-thread sum read 15.7 ms in one run and 8.0 ms in the next, and torch's
    sparse-mm 28.4 ms in a first block against 10.5 ms in the blocks after it. Taking
    turns gives every method the same spells; the cell is the median over rounds."""
    names = list(fns)
    for name in names:
        warm(fns[name], args)
    rounds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rounds[name].append(statistics.median(time_calls(fns[name], args.repeats, torch.device("cpu"))))
    return rounds


def run_kernels(name: str, threads: int, args, results: dict[str, Any], run_id: str) -> None:
    ops = build_operands(load_dataset(name, args.data_root).graph, torch.device("cpu"))
    for features in args.features:
        x = torch.randn(ops.num_nodes, features, generator=torch.Generator().manual_seed(features))
        for kernel in args.kernels:
            fns = kernel_methods(kernel, ops, x)
            if args.tune:   # FeatGraph's grid search for this kernel, graph, width and thread count
                tune(fns["gnnfuse-cpu"], "cpu", space=args.tune, log=log)
            expected = fns["pyg-scatter"]()
            errors = {m: guarded(lambda: {"status": "ok", "rel_err": None if m == "pyg-scatter"
                                          else max_rel_err(fns[m](), expected)}, torch.device("cpu"))
                      for m in METHODS}
            runnable = {m: fns[m] for m in METHODS if errors[m]["status"] == "ok"}
            rounds = guarded(lambda: {"status": "ok", "rounds": interleaved(runnable, args)}, torch.device("cpu"))
            for method in METHODS:
                cell = errors[method]
                if cell["status"] == "ok" and rounds["status"] != "ok":
                    cell = {k: v for k, v in rounds.items() if k != "rounds"}
                elif cell["status"] == "ok":
                    medians = rounds["rounds"][method]
                    cell = {**cell, **summarize(medians), "round_medians_ms": medians, "rounds": args.rounds,
                            "repeats": args.repeats}
                results["kernels"][f"{name}/{kernel}/{features}/{threads}/{method}"] = {**cell, "run": run_id}
                err = cell.get("rel_err")
                log(f"[{name}] {kernel} F={features} threads={threads} {method}: "
                    f"{fmt(cell.get('median_ms'), '.2f')} ms ({cell['status']}, rel err {fmt(err, '.1e')})")
                if check_failed(err, REL_ERR_LIMIT):
                    warn(f"{name} {kernel} F={features} {method} differs from PyG by {err:.2e}")
        store(results, args.out)


def run_training(name: str, threads: int, args, results: dict[str, Any], run_id: str) -> None:
    """Each trainer's steps (`gnnfuse.bench.measure`); a gnnfuse trainer's eval-mode forward
    is first checked against PyG's on its own backend (``rel_err``, and ``check`` its
    status), since its speedup in the table is none where that check failed or did not run."""
    device = torch.device("cpu")
    data = bench.load_data(name, args.data_root, device, log)
    for model in args.models:
        state = bench.reference_state(model, data)
        for trainer in TRAINERS:
            framework = trainer if trainer.startswith("pyg") else "gnnfuse"
            os.environ["GNNFUSE_BACKEND"] = "reference" if trainer == "gnnfuse-reference" else "cpu"
            check = {}
            if framework == "gnnfuse":
                check = guarded(lambda: {"status": "ok", "rel_err": bench.check_forward(model, data, state, device)},
                                device)
                check = {"check": check["status"], "rel_err": check.get("rel_err")}
                if check_failed(check["rel_err"], REL_ERR_LIMIT) or check["check"] != "ok":
                    warn(f"{name} {model} {trainer}: forward differs from PyG "
                         f"({check['check']}, rel err {fmt(check['rel_err'], '.1e')})")
            cell = guarded(lambda: bench.measure(framework, model, data, state, args.steps, args.warmup, device),
                           device)
            cell.update(check)
            results["training"][f"{name}/{model}/{threads}/{trainer}"] = {**cell, "run": run_id}
            log(f"[{name}] {model} threads={threads} {trainer}: {fmt(cell.get('median_ms'), '.1f')} ms/step "
                f"({cell['status']}, first step {fmt(cell.get('first_step_ms'), '.0f')} ms)")
        store(results, args.out)


def ratio(results: dict[str, Any], section: str, key: str, ours: str, theirs: str) -> str:
    """Their time over ours; none beside a kernel whose output failed its check against PyG's,
    or a training cell whose forward check failed or could not run (``check``): a faster
    kernel or step computing something else is no speedup."""
    a, b = results[section].get(f"{key}/{ours}", {}), results[section].get(f"{key}/{theirs}", {})
    if a.get("status") != "ok" or b.get("status") != "ok":
        return "–"
    if any(check_failed(cell.get("rel_err"), REL_ERR_LIMIT) or cell.get("check", "ok") != "ok" for cell in (a, b)):
        return "check failed"
    return f"{b['median_ms'] / a['median_ms']:.2f}x"


def render_markdown(results: dict[str, Any]) -> str:
    lines = ["# CPU backend (Numba) against PyG and torch", "",
             "Milliseconds per call: a kernel cell is the median over rounds in which the three methods "
             "take turns (`--rounds`) of each round's median call (`--repeats`), a training cell the median "
             "step; speedup = their time / gnnfuse-cpu's. Targets (issue 15): "
             "kernels >= 3x pyg-scatter and >= 1.5x sparse-mm; training >= 1.5x PyG eager and >= 1.2x "
             "compiled PyG. Timings taken while other work shares the CPU are noise-bound (one call's "
             "time varied up to 20x between cells of the first run here): compare runs on a quiet machine.",
             "", *runs_markdown(results), "", "## Aggregation kernels (forward, float32)", "",
             "| graph | kernel | F | threads | gnnfuse-cpu | pyg-scatter | sparse-mm | vs scatter | vs sparse-mm |",
             "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({k.rsplit("/", 1)[0] for k in results["kernels"]},
                  key=lambda k: (k.split("/")[0], k.split("/")[1], int(k.split("/")[2]), int(k.split("/")[3])))
    for key in keys:
        cells = [results["kernels"].get(f"{key}/{m}", {}) for m in METHODS]
        lines.append(f"| {' | '.join(key.split('/'))} | "
                     + " | ".join(fmt(c.get("median_ms"), ".2f") for c in cells)
                     + f" | {ratio(results, 'kernels', key, 'gnnfuse-cpu', 'pyg-scatter')}"
                     f" | {ratio(results, 'kernels', key, 'gnnfuse-cpu', 'sparse-mm')} |")
    lines += ["", "## Training step (forward + backward + Adam)", "",
              "| graph | model | threads | " + " | ".join(TRAINERS) + " | vs pyg | vs pyg-compile |",
              "|---|---|---|" + "---|" * (len(TRAINERS) + 2)]
    for key in sorted({k.rsplit("/", 1)[0] for k in results["training"]}):
        cells = [results["training"].get(f"{key}/{t}", {}) for t in TRAINERS]
        lines.append(f"| {' | '.join(key.split('/'))} | "
                     + " | ".join(fmt(c.get("median_ms"), ".1f") for c in cells)
                     + f" | {ratio(results, 'training', key, 'gnnfuse-cpu', 'pyg')}"
                     f" | {ratio(results, 'training', key, 'gnnfuse-cpu', 'pyg-compile')} |")
    return "\n".join(lines) + "\n"


def store(results: dict[str, Any], out: Path) -> None:
    prune_runs(results)
    save_json(out / "cpu.json", results)
    write_atomically(out / "cpu.md", render_markdown(results))


def csv(kind: Callable[[str], Any]) -> Callable[[str], list]:
    return lambda text: [kind(part) for part in text.split(",") if part]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=csv(str), default=["pubmed", "arxiv-like"])
    parser.add_argument("--features", type=csv(int), default=[16, 64, 256])
    parser.add_argument("--kernels", type=csv(str), default=list(KERNELS))
    parser.add_argument("--threads", type=csv(int), default=[1, 2])
    parser.add_argument("--models", type=csv(str), default=list(bench.MODELS))
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per method and round (default 50: "
                        "on this VM a kernel's first ~10 calls after another method's ran up to 2x slow, "
                        "pubmed's F=16 sum 0.43 ms falling to 0.20, so 10 calls timed mostly that)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds in which the kernel methods take turns; "
                        "a kernel cell is the median of its round medians")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per cell")
    parser.add_argument("--tune", choices=SPACES, help="tune each kernel (gnnfuse.tuning, this schedule space) "
                        "before timing it; tuned choices are stored and reused by later runs")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    unknown = set(args.kernels) - set(KERNELS)
    if unknown:
        parser.error(f"--kernels: unknown {sorted(unknown)}; choose from {KERNELS}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = load_results(args.out / "cpu.json")
    results.setdefault("kernels", {})
    results.setdefault("training", {})
    run_id = new_run_id()
    results["runs"][run_id] = environment(torch.device("cpu"))     # names the CPU model
    begin = time.perf_counter()
    for threads in args.threads:
        torch.set_num_threads(threads)    # the CPU backend's kernels follow torch's count
        for name in args.dataset:
            if not args.skip_kernels:
                os.environ["GNNFUSE_BACKEND"] = "cpu"
                run_kernels(name, threads, args, results, run_id)
            if not args.skip_training:
                run_training(name, threads, args, results, run_id)
    log(f"done in {time.perf_counter() - begin:.0f} s; results in {args.out / 'cpu.md'}")


if __name__ == "__main__":
    main()
