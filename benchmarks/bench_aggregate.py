"""Neighbour-sum micro-benchmark: ``out[v] = sum of x[u] over in-neighbours u of v``.

The aggregation every GNN layer is built on, isolated from dense work, so its speed can
be read against the memory system: gnnfuse's generated kernel (through the
vertex-centric API) against ``torch.sparse.mm`` on a CSR adjacency (cuSPARSE on CUDA)
and PyG's gather-then-scatter, for feature widths 1..512 on a power-law graph.

Each time is also given as effective bandwidth under one fixed byte model (see
`bytes_moved`), next to the device's measured copy bandwidth. Results merge into
``<out>/aggregate.json`` (keyed by data set/width/method) and ``<out>/aggregate.md``.

Timed call by call, a small graph measures the host (Python, launches) as much as the
kernel; those launched calls are timed in ``--blocks`` rounds with the methods taking
turns (see `measure`). ``--cuda-graph`` also times every method through a CUDA graph holding
``--graph-calls`` calls (`gnnfuse.runtime.cuda_graph.StepCapture`), replayed and divided
by the call count: kernel against kernel. Those cells are keyed ``.../<method>@graph``
and get their own tables.

    python benchmarks/bench_aggregate.py --dataset arxiv-like,reddit2-like
    python benchmarks/bench_aggregate.py --dataset arxiv-like --cuda-graph --features 16,32,64,128
    python benchmarks/bench_aggregate.py --device cpu --dataset cora --features 1,8 --repeats 2
"""
from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch_geometric.utils import scatter

import gnnfuse
from gnnfuse.data import load_dataset

from common import (add_device_arguments, check_failed, check_methods, environment, fail_mark, failure_status, fmt,
                    free_memory, guarded, load_results, log, new_run_id, prune_runs, replayed_calls, resolve_device,
                    runs_markdown, save_json, summarize, synchronize, time_calls, warn, worst_error, write_atomically)

FEATURES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
METHODS = ("gnnfuse", "sparse-mm", "pyg-scatter")
REFERENCE = "sparse-mm"        # the others are checked against cuSPARSE's result
REL_ERR_LIMIT = 1e-4           # float32 sums in another order differ by ~1e-6 of the scale
GRAPH = "@graph"               # key suffix of cells timed through a CUDA graph
VALUE_BYTES, INDEX_BYTES = 4, 4
BYTES_MODEL = (f"bytes = E*F*{VALUE_BYTES} (one source row gathered per edge) + E*{INDEX_BYTES} (column "
               f"index) + (N+1)*{INDEX_BYTES} (row pointer) + N*F*{VALUE_BYTES} (output written); "
               "float32 values, int32 CSR indices, no cache reuse assumed, the same bytes for every "
               "method. Hub rows of a power-law graph are re-read from cache, so small widths can "
               "exceed DRAM bandwidth.")


@gnnfuse.vertex
def neighbour_sum(v):
    return sum([u.h for u in v.innbs])


def bytes_moved(num_nodes: int, num_edges: int, features: int) -> int:
    """The byte model of `BYTES_MODEL`: what an ideal one-pass CSR kernel must move.

    One model for all methods makes GB/s a rescaled time that can be compared with the
    copy bandwidth, not a claim about any method's actual traffic.
    """
    return ((num_edges * features + num_nodes * features) * VALUE_BYTES
            + (num_edges + num_nodes + 1) * INDEX_BYTES)


@dataclass
class Operands:
    """The graph in each method's own input format, built before any timing."""
    graph: gnnfuse.Graph
    adjacency: torch.Tensor      # [N, N] CSR, row = destination, entry counts edges u -> v
    src: torch.Tensor            # int64, PyG's edge_index rows
    dst: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes


def build_operands(graph: gnnfuse.Graph, device: torch.device) -> Operands:
    """Move the graph over and build the CSR adjacency cuSPARSE multiplies with.

    The adjacency is coalesced (a multi-edge becomes one entry holding its count),
    giving cuSPARSE canonical sorted rows; it then has at most E entries, never more.
    """
    graph = graph.to(device)
    coo = torch.sparse_coo_tensor(torch.stack([graph.dst, graph.src]),
                                  torch.ones(graph.num_edges, device=device),
                                  (graph.num_nodes, graph.num_nodes), check_invariants=False).coalesce()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        csr = coo.to_sparse_csr()
    adjacency = torch.sparse_csr_tensor(csr.crow_indices().to(torch.int32), csr.col_indices().to(torch.int32),
                                        csr.values(), csr.shape, check_invariants=False)
    return Operands(graph, adjacency, graph.src, graph.dst)


def methods(ops: Operands) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Each method as a function of the feature matrix alone, so all are timed alike."""
    return {
        "gnnfuse": lambda x: neighbour_sum(ops.graph, {"h": x}),
        "sparse-mm": lambda x: torch.sparse.mm(ops.adjacency, x),
        "pyg-scatter": lambda x: scatter(x.index_select(0, ops.src), ops.dst, dim=0,
                                         dim_size=ops.num_nodes, reduce="sum"),
    }


def max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|a - b| / max|b|, on the output's own scale (entries near zero would make an
    element-wise ratio meaningless)."""
    scale = expected.abs().max().clamp_min(torch.finfo(expected.dtype).tiny)
    return ((actual - expected).abs().max() / scale).item()


def copy_bandwidth(megabytes: int, repeats: int, device: torch.device) -> float:
    """GB/s of ``clone`` on a large buffer: 2 x bytes (read + write) over the median time,
    the practical ceiling the aggregation bandwidths are read against."""
    buffer = torch.empty(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    for _ in range(3):
        buffer.clone()
    median = summarize(time_calls(buffer.clone, repeats, device))["median_ms"]
    return 2 * buffer.numel() * 4 / (median * 1e-3) / 1e9


def measure(fns: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor,
            expected: dict[str, torch.Tensor | None], args: argparse.Namespace, device: torch.device,
            num_edges: int) -> dict[str, dict[str, Any]]:
    """Launched cells of every method in ``fns``: warm up each (gnnfuse compiles and
    autotunes on its first calls), then ``args.blocks`` rounds of ``args.repeats`` calls
    per method, the methods taking turns, then check each output.

    Why in turns: a launched call of a small sum is mostly host time, and the GPU
    machine's host ran 2-2.5x slower or faster within one process (torch.empty took 3.6
    to 9.5 us between cells of one run). Timed one method after another, a slow spell
    landed on one method and flipped cells near 1.0x between runs; in turns, each
    method meets the same spells. A method that fails keeps its failure as its status."""
    cells: dict[str, dict[str, Any]] = {}
    times: dict[str, list[float]] = {}

    def warm(fn: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
        for _ in range(args.warmup):
            fn(x)
        return {"status": "ok"}
    for method, fn in fns.items():
        cells[method] = guarded(lambda: warm(fn), device)
    for _ in range(args.blocks):
        for method, fn in fns.items():
            if cells[method]["status"] == "ok":
                block = guarded(lambda: {"status": "ok", "times": time_calls(lambda: fn(x), args.repeats, device)},
                                device)
                if block["status"] == "ok":
                    times.setdefault(method, []).extend(block["times"])
                else:
                    cells[method] = block
    moved = bytes_moved(x.shape[0], num_edges, x.shape[1])
    for method, fn in fns.items():
        if cells[method]["status"] == "ok":
            stats = summarize(times[method])
            check = expected[method]
            cells[method] = {"status": "ok", **stats, "repeats": len(times[method]), "blocks": args.blocks,
                             "bytes": moved, "gb_per_s": moved / (stats["median_ms"] * 1e-3) / 1e9,
                             "rel_err": None if check is None else max_rel_err(fn(x), check)}
    return cells


def measure_captured(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, expected: torch.Tensor | None,
                     args: argparse.Namespace, device: torch.device, num_edges: int) -> dict[str, Any]:
    """`measure`, with ``args.graph_calls`` calls captured in one CUDA graph per replay;
    times are per call. A method the capture refuses gets that reason as its status."""
    stats, out, reason = replayed_calls(lambda: fn(x), args.graph_calls, max(args.warmup, 2), args.repeats, device)
    if stats is None:
        return {"status": f"not captured: {reason}"[:200]}
    moved = bytes_moved(x.shape[0], num_edges, x.shape[1])
    return {"status": "ok", **stats, "repeats": args.repeats, "graph_calls": args.graph_calls, "bytes": moved,
            "gb_per_s": moved / (stats["median_ms"] * 1e-3) / 1e9,
            "rel_err": None if expected is None else max_rel_err(out, expected)}


def run_width(name: str, ops: Operands, features: int, args: argparse.Namespace, device: torch.device,
              results: dict[str, Any], run_id: str) -> None:
    """All methods at one feature width, against the reference method's output."""
    torch.manual_seed(features)
    x = torch.randn(ops.num_nodes, features, device=device)
    fns = methods(ops)
    try:
        expected = fns[REFERENCE](x)
    except Exception as exc:  # noqa: BLE001 - timings are still worth having unchecked
        log(f"[{name}] F={features}: reference {REFERENCE} failed ({failure_status(exc)}); outputs unchecked")
        expected = None
    launched = measure({method: fns[method] for method in args.methods}, x,
                       {method: None if method == REFERENCE else expected for method in args.methods},
                       args, device, ops.graph.num_edges)
    cells = [(method, "", launched[method]) for method in args.methods]
    if args.cuda_graph:
        cells += [(method, GRAPH, guarded(lambda: measure_captured(fns[method], x, expected, args, device,
                                                                   ops.graph.num_edges), device))
                  for method in args.methods]
    for method, suffix, cell in cells:
        results["cells"][f"{name}/{features}/{method}{suffix}"] = {**cell, "run": run_id}
        log(f"[{name}] F={features:4d} {method + suffix:18s} {describe(cell)}")
        err = cell.get("rel_err")
        if check_failed(err, REL_ERR_LIMIT):
            warn(f"{name} F={features} {method}{suffix}: output differs from {REFERENCE} by {err:.2e} "
                 f"(> {REL_ERR_LIMIT:g})")
    del x, expected
    store(results, args.out)


def describe(cell: dict[str, Any]) -> str:
    if cell["status"] != "ok":
        return cell["status"]
    err = "" if cell["rel_err"] is None else f", rel err {cell['rel_err']:.1e}"
    return f"median {cell['median_ms']:.3f} ms (min {cell['min_ms']:.3f}), {cell['gb_per_s']:.0f} GB/s{err}"


def run_dataset(name: str, args: argparse.Namespace, device: torch.device, results: dict[str, Any],
                run_id: str) -> None:
    begin = time.perf_counter()
    graph = load_dataset(name, args.data_root).graph
    ops = build_operands(graph, device)
    synchronize(device)
    results["graphs"][name] = {"num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                               "adjacency_nnz": ops.adjacency.values().numel(), "run": run_id}
    log(f"[{name}] {graph.num_nodes:,} nodes, {graph.num_edges:,} edges "
        f"({ops.adjacency.values().numel():,} distinct), ready in {time.perf_counter() - begin:.1f} s")
    for features in args.features:
        run_width(name, ops, features, args, device, results, run_id)
    del ops, graph
    free_memory(device)


# --- results ---------------------------------------------------------------------------
def render_markdown(results: dict[str, Any]) -> str:
    """One table per data set, rows by width, regenerated from the merged JSON."""
    lines = ["# Neighbour-sum aggregation: gnnfuse vs torch.sparse.mm (cuSPARSE) vs PyG scatter", "",
             "Median time per call; GB/s = modelled bytes / median time; % copy = that over the "
             "device's measured copy bandwidth (clone: 2 x bytes / time); speedup = other time / "
             f"gnnfuse time; max rel err = max|out - {REFERENCE}| / max|{REFERENCE}|, worst method.", "",
             f"Byte model: {BYTES_MODEL}", "", *runs_markdown(results), ""]
    lines += [f"- copy bandwidth, run `{rid}`: {env['copy_bandwidth_gbs']:.0f} GB/s"
              for rid, env in sorted(results["runs"].items())]
    cells = results["cells"]
    modes = (("", "each call launched from Python"),
             (GRAPH, "calls replayed from a CUDA graph (time per call; no host overhead)"))
    for name, meta in results["graphs"].items():
        head = ["F", *(f"{m} ms" for m in METHODS), *(f"{m} GB/s" for m in METHODS), "gnnfuse % copy",
                *(f"speedup vs {m}" for m in METHODS[1:]), "max rel err"]
        for suffix, how in modes:
            widths = sorted({int(key.split("/")[1]) for key in cells
                             if key.split("/")[0] == name and key.endswith(suffix) and (suffix or GRAPH not in key)})
            if not widths:
                continue
            lines += ["", f"## {name}: {meta['num_nodes']:,} nodes, {meta['num_edges']:,} edges "
                          f"({meta['adjacency_nnz']:,} distinct), {how}", "",
                      "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for features in widths:
                row = [cells.get(f"{name}/{features}/{m}{suffix}") for m in METHODS]
                lines.append("| " + " | ".join(table_row(results, features, row)) + " |")
    return "\n".join(lines) + "\n"


def table_row(results: dict[str, Any], features: int, row: list[dict[str, Any] | None]) -> list[str]:
    ok = [c if c and c["status"] == "ok" else None for c in row]
    ours = ok[0]
    times = [fmt(c["median_ms"], ".3f") if c else (r["status"] if r else "–") for c, r in zip(ok, row)]
    bandwidths = [fmt(c["gb_per_s"] if c else None, ".0f") for c in ok]
    copy = (100 * ours["gb_per_s"] / results["runs"][ours["run"]]["copy_bandwidth_gbs"]) if ours else None
    right = [c if c and not check_failed(c["rel_err"], REL_ERR_LIMIT) else None for c in ok]
    speedups = [fmt(c["median_ms"] / right[0]["median_ms"] if c and right[0] and same_device(results, c, ours)
                    else None, ".2f") for c in right[1:]]
    errors = [c["rel_err"] for c in ok if c and c["rel_err"] is not None]
    worst = worst_error(errors)
    err = fmt(worst, ".1e") + fail_mark(worst, REL_ERR_LIMIT)
    return [str(features), *times, *bandwidths, fmt(copy, ".0f"), *speedups, err]


def same_device(results: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> bool:
    runs = results["runs"]
    return runs[a["run"]]["device_name"] == runs[b["run"]]["device_name"]


def store(results: dict[str, Any], out: Path) -> None:
    """Rewrite both files from the merged results (after every width, so a run cut off
    by a time limit keeps what it measured)."""
    prune_runs(results)
    save_json(out / "aggregate.json", results)
    write_atomically(out / "aggregate.md", render_markdown(results))


# --- driver ----------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated positive integers."""
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def name_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=name_list, default=["arxiv-like"],
                        help="comma list of data sets (default arxiv-like; e.g. arxiv-like,reddit2-like)")
    parser.add_argument("--features", type=int_list, default=list(FEATURES),
                        help="comma list of feature widths (default 1,2,...,512)")
    parser.add_argument("--methods", type=name_list, default=list(METHODS),
                        help=f"comma list of {', '.join(METHODS)}")
    parser.add_argument("--repeats", type=int, default=20,
                        help="timed calls per cell, per block for launched cells (default 20)")
    parser.add_argument("--blocks", type=int, default=5,
                        help="rounds of launched calls, the methods taking turns (default 5)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="also time every method through a CUDA graph of --graph-calls calls")
    parser.add_argument("--graph-calls", type=int, default=20, help="calls per captured graph (default 20)")
    parser.add_argument("--copy-mb", type=int, default=1024, help="buffer size of the copy-bandwidth test")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="folder of aggregate.json (merged into) and aggregate.md")
    add_device_arguments(parser)
    args = parser.parse_args(argv)
    check_methods(parser, args.methods, METHODS)
    if args.repeats < 1 or args.graph_calls < 1 or args.blocks < 1:
        parser.error("--repeats, --blocks and --graph-calls must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    results = load_results(args.out / "aggregate.json")
    results.setdefault("graphs", {})
    results["bytes_model"] = BYTES_MODEL
    run_id = new_run_id()
    env = environment(device)
    env["copy_bandwidth_gbs"] = copy_bandwidth(args.copy_mb, args.repeats, device)
    results["runs"][run_id] = env
    log(f"run {run_id} on {env['device_name']}: copy bandwidth {env['copy_bandwidth_gbs']:.0f} GB/s; "
        f"results -> {args.out}")
    log(f"byte model: {BYTES_MODEL}")
    for name in args.dataset:
        run_dataset(name, args, device, results, run_id)
    log(f"done; {args.out / 'aggregate.md'}")


if __name__ == "__main__":
    main()
