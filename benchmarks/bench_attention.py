"""GATv2 attention aggregation alone, forward + backward: gnnfuse vs turbo-gnn vs plain torch.

Per head h, for every vertex i and its in-edges j -> i (issue 13's table):

    e_ji  = att_h . leaky_relu(x_l[j, h] + x_r[i, h], 0.2)
    out_i = sum_j softmax_j(e_ji) * x_l[j, h]

with gradients for x_l, x_r and att. The methods, each from the same seeded inputs:

- ``gnnfuse``: the vertex function `gnnfuse.nn.GATv2Conv` traces (its graph part, with
  x_l, x_r and att given directly instead of coming from its linear layers);
- ``turbo-gnn``: its fused ``gatv2_aggr`` (CSR forward, reverse-CSR backward, only a
  logsumexp per vertex and head saved), built from its sdist by `build_turbo_gnn.py`;
  its ``x`` is the destination side (our x_r), its ``x_neighbors`` the source (x_l);
- ``torch``: gather/scatter in plain torch (index_select, scatter_reduce amax, index_add),
  which materializes every [E, H, D] intermediate -- the oracle the others are checked
  against (or gnnfuse, where torch runs out of memory), computed untimed when
  ``--methods`` leaves torch out.

Each cell gets the median of CUDA-event-timed forward+backward calls after warm-up, the
EXTRA peak memory of one forward+backward (peak allocated minus what was allocated
before it: inputs, the output gradient and each method's graph layouts, built in warm-up,
are excluded; the output and the three gradients are included), and the max relative
error of the output and each gradient. Results merge into ``<out>/attention.json`` and
``<out>/attention.md``, with a table of issue 13's targets (gnnfuse time and memory at
most turbo-gnn's, per cell).

    python benchmarks/bench_attention.py --turbo .turbo/turbo_gnn-0.1.0rc4.tar.gz
    python benchmarks/bench_attention.py --device cpu --datasets synthetic --reps 2
"""
from __future__ import annotations

import argparse
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

import gnnfuse
from gnnfuse.bench import extra_peak_gb, max_rel_err
from gnnfuse.data import load_dataset

from common import (add_device_arguments, check_failed, check_methods, environment, fail_mark, failure_status,
                    free_memory, guarded, load_results, log, new_run_id, prune_runs, resolve_device, runs_markdown,
                    save_json, summarize, synchronize, time_calls, warn, worst_error, write_atomically)

METHODS = ("gnnfuse", "turbo-gnn", "torch")
TURBO_MIN_DIM = 16      # narrower heads are not run: a crash would end the whole run
CHECK_ORDER = ("torch", "gnnfuse", "turbo-gnn")   # measured in this order; the first that runs is the oracle
DATASETS = ("arxiv-like", "reddit2-like", "products-like")
DEFAULT_SHAPES = ((4, 32), (1, 64))
EXTRA_SHAPES = {"products-like": ((8, 8),)}          # issue 13's products-sized 8 x 8 row
NEGATIVE_SLOPE = 0.2
REL_ERR_LIMIT = 1e-3          # float32, softmax over up to ~1e5 in-edges summed in another order
GRADIENTS = ("x_l", "x_r", "att")
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# --- the three implementations ----------------------------------------------------------
def torch_gatv2(src: torch.Tensor, dst: torch.Tensor, num_nodes: int, x_l: torch.Tensor, x_r: torch.Tensor,
                att: torch.Tensor, slope: float = NEGATIVE_SLOPE) -> torch.Tensor:
    """GATv2 aggregation as gather/scatter torch code: x_l, x_r [N, H, D], att [H, D].

    The per-destination maximum only keeps exp from overflowing (it cancels in the
    softmax), so it is taken without gradient, as PyG's softmax does."""
    source = x_l.index_select(0, src)                                        # [E, H, D]
    scores = (F.leaky_relu(source + x_r.index_select(0, dst), slope) * att).sum(-1)   # [E, H]
    index = dst.unsqueeze(1).expand_as(scores)
    with torch.no_grad():
        peak = scores.new_full((num_nodes, scores.shape[1]), float("-inf"))
        peak = peak.scatter_reduce(0, index, scores, "amax", include_self=True)
    weights = torch.exp(scores - peak.index_select(0, dst))
    total = weights.new_zeros(num_nodes, weights.shape[1]).index_add(0, dst, weights)
    alpha = weights / total.index_select(0, dst)
    return x_l.new_zeros(x_l.shape).index_add(0, dst, alpha.unsqueeze(-1) * source)


def gnnfuse_gatv2(att: torch.Tensor, slope: float = NEGATIVE_SLOPE) -> gnnfuse.frontend.VertexFunction:
    """The vertex function `gnnfuse.nn.GATv2Conv.forward` runs (no dropout, no edge
    features), reading ``att`` from its closure as the layer does, so it compiles to the
    same program and the gradient reaches ``att``."""
    @gnnfuse.vertex
    def gatv2(v):
        scores = [(F.leaky_relu(e.src.x_l + v.x_r, slope) * att).sum(-1) for e in v.inedges]
        peak = max(scores)
        weights = [torch.exp(s - peak) for s in scores]
        alpha = [w / sum(weights) for w in weights]
        return sum([alpha[i].unsqueeze(-1) * e.src.x_l for i, e in enumerate(v.inedges)])
    return gatv2


@dataclass
class Problem:
    """One graph on the device: the edge list every method builds its own layout from."""
    name: str
    edge_index: torch.Tensor      # [2, E] int64: source row, destination row
    num_nodes: int

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]


def build_method(method: str, problem: Problem, att: torch.Tensor, turbo: Any) -> Forward:
    """`method` as a function of (x_l, x_r, att) -> [N, H, D]. Layouts each method keeps
    per graph (turbo-gnn's CSR pair here, gnnfuse's cached in its Graph on first call)
    are built before the memory baseline is taken, like inputs."""
    src, dst = problem.edge_index
    if method == "torch":
        return lambda x_l, x_r, a: torch_gatv2(src, dst, problem.num_nodes, x_l, x_r, a)
    if method == "gnnfuse":
        graph = gnnfuse.Graph(src, dst, problem.num_nodes)      # fresh: its caches die with the cell
        fn = gnnfuse_gatv2(att)
        return lambda x_l, x_r, a: fn(graph, {"x_l": x_l, "x_r": x_r})   # `a` is `att`, closed over
    if method == "turbo-gnn":
        adjacency = turbo.AdjacencyForwardBackwardWithNodeBuckets.from_edge_list(
            problem.edge_index, problem.num_nodes, index_dtype=torch.int32)
        return lambda x_l, x_r, a: turbo.gatv2_aggr(adjacency, x_r, x_l, a, NEGATIVE_SLOPE).view(x_l.shape)
    raise ValueError(f"unknown method {method!r}")


# --- measuring -------------------------------------------------------------------------
@dataclass
class Inputs:
    x_l: torch.Tensor
    x_r: torch.Tensor
    att: torch.Tensor
    grad_out: torch.Tensor

    @classmethod
    def seeded(cls, num_nodes: int, heads: int, dim: int, device: torch.device) -> "Inputs":
        torch.manual_seed(1000 * heads + dim)
        x_l, x_r = (torch.randn(num_nodes, heads, dim, device=device, requires_grad=True) for _ in range(2))
        att = (torch.randn(heads, dim, device=device) / dim ** 0.5).requires_grad_()
        return cls(x_l, x_r, att, torch.randn(num_nodes, heads, dim, device=device))


def forward_backward(forward: Forward, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """The output and the gradients of x_l, x_r and att for one fixed output gradient."""
    out = forward(inputs.x_l, inputs.x_r, inputs.att)
    return (out.detach(), *torch.autograd.grad(out, (inputs.x_l, inputs.x_r, inputs.att), inputs.grad_out))


def rel_errors(result: tuple[torch.Tensor, ...], reference: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """max|a - b| / max|b| per tensor, on the CPU copies of the reference."""
    return {name: max_rel_err(got.cpu(), want) for name, got, want in zip(("out", *GRADIENTS), result, reference)}


def measure(method: str, problem: Problem, inputs: Inputs, turbo: Any, reference: dict[str, Any] | None,
            args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Warm up, one forward+backward for peak memory and numerics, then the timed calls.

    When `reference` is None this method becomes the oracle: its results are copied to
    the CPU into ``reference`` (so holding them costs no device memory)."""
    forward = build_method(method, problem, inputs.att, turbo)
    begin = time.perf_counter()
    forward_backward(forward, inputs)
    first_call_ms = (time.perf_counter() - begin) * 1e3
    for _ in range(args.warmup - 1):
        forward_backward(forward, inputs)
    result, extra, before = extra_peak_gb(lambda: forward_backward(forward, inputs), device)
    cell = {"status": "ok", "first_call_ms": first_call_ms, "extra_peak_gb": extra, "resident_gb": before}
    if reference is None:
        cell["rel_err"], cell["checked_against"] = None, None
        oracle = {"method": method, "tensors": tuple(t.cpu() for t in result)}
    else:
        cell["rel_err"], cell["checked_against"] = rel_errors(result, reference["tensors"]), reference["method"]
        oracle = None
    del result
    times = time_calls(lambda: forward_backward(forward, inputs), args.reps, device)
    if args.profile:
        log(kernel_profile(lambda: forward_backward(forward, inputs), device))
    return {**cell, **summarize(times), "reps": args.reps, "warmup": args.warmup, "oracle": oracle}


def torch_reference(problem: Problem, inputs: Inputs) -> dict[str, Any]:
    """torch's output and gradients on the CPU, as `measure` keeps an oracle's, untimed."""
    result = forward_backward(build_method("torch", problem, inputs.att, None), inputs)
    return {"method": "torch", "tensors": tuple(t.cpu() for t in result)}


def kernel_profile(call: Callable[[], Any], device: torch.device, rows: int = 12) -> str:
    """torch.profiler's table of one call, heaviest device kernels first: the measured
    split between kernels (which one dominates) and host time (the CPU total against
    the summed kernel time) behind a cell's median."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        call()
        synchronize(device)
    averages = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total"):
        try:
            return averages.table(sort_by=key, row_limit=rows)
        except (AttributeError, KeyError, ValueError):
            continue
    return averages.table(row_limit=rows)


def run_cell(problem: Problem, heads: int, dim: int, turbo: Any, turbo_status: str | None,
             args: argparse.Namespace, device: torch.device, results: dict[str, Any], run_id: str) -> None:
    """All methods on one (graph, heads x dim), the first to run being the others' oracle.

    torch is the oracle even when ``--methods`` leaves it out (re-timing gnnfuse alone):
    its answer is then computed untimed, so gnnfuse is checked as in a full run instead
    of becoming the unchecked oracle beside the file's earlier torch cell. Only where
    torch fails (out of memory) does the first method that runs become the oracle."""
    inputs = Inputs.seeded(problem.num_nodes, heads, dim, device)
    reference = None
    if "torch" not in args.methods:
        reference = guarded(lambda: {"status": "ok", "oracle": torch_reference(problem, inputs)}, device,
                            args.cell_timeout).get("oracle")
    for method in (m for m in CHECK_ORDER if m in args.methods):
        if method == "turbo-gnn" and turbo_status is not None:
            cell = {"status": turbo_status}
        elif method == "turbo-gnn" and dim < TURBO_MIN_DIM:
            cell = {"status": f"unsupported: turbo-gnn's kernels need dim >= {TURBO_MIN_DIM} (0.1.0rc4 crashed the "
                              "process with a segmentation fault at 8x8 on the H100)"}
        else:
            cell = guarded(lambda: measure(method, problem, inputs, turbo, reference, args, device), device,
                           args.cell_timeout)
        oracle = cell.pop("oracle", None)
        reference = reference or oracle
        key = f"{problem.name}/{heads}x{dim}/{method}"
        results["cells"][key] = {**cell, "run": run_id}
        log(f"[{problem.name}] {heads}x{dim} {method:9s} {describe(cell)}")
        worst = max_error(cell)
        if check_failed(worst, REL_ERR_LIMIT):
            warn(f"{key}: differs from {cell['checked_against']} by {worst:.2e} (> {REL_ERR_LIMIT:g}): "
                 f"{cell['rel_err']}")
        store(results, args.out)


def max_error(cell: dict[str, Any]) -> float | None:
    return worst_error((cell.get("rel_err") or {}).values())


def describe(cell: dict[str, Any]) -> str:
    if cell["status"] != "ok":
        return cell["status"]
    memory = "" if cell["extra_peak_gb"] is None else f", extra peak {cell['extra_peak_gb']:.3f} GB"
    worst = max_error(cell)
    check = "oracle" if worst is None else f"max rel err {worst:.1e} vs {cell['checked_against']}"
    return f"median {cell['median_ms']:.3f} ms (min {cell['min_ms']:.3f}){memory}; {check}"


def load_problem(name: str, args: argparse.Namespace, device: torch.device, results: dict[str, Any],
                 run_id: str) -> Problem:
    begin = time.perf_counter()
    graph = load_dataset(name, args.data_root).graph
    problem = Problem(name, torch.stack([graph.src, graph.dst]).long().to(device), graph.num_nodes)
    synchronize(device)
    results["graphs"][name] = {"num_nodes": problem.num_nodes, "num_edges": problem.num_edges, "run": run_id}
    log(f"[{name}] {problem.num_nodes:,} nodes, {problem.num_edges:,} edges, ready in "
        f"{time.perf_counter() - begin:.1f} s")
    return problem


def shapes_for(name: str, args: argparse.Namespace) -> tuple[tuple[int, int], ...]:
    return tuple(args.shapes) if args.shapes else DEFAULT_SHAPES + EXTRA_SHAPES.get(name, ())


def prepare_turbo(args: argparse.Namespace, device: torch.device) -> tuple[Any, str | None, dict[str, Any]]:
    """The turbo_gnn package, or None with the status its cells get; and what the run
    records about it."""
    if "turbo-gnn" not in args.methods:
        return None, "not requested", {"status": "not requested"}
    if device.type != "cuda":
        return None, "skipped: turbo-gnn needs CUDA", {"status": "skipped: needs CUDA"}
    if args.turbo is None:
        return None, "not run: no --turbo sdist given", {"status": "no --turbo sdist given"}
    import build_turbo_gnn
    begin = time.perf_counter()
    try:
        turbo = build_turbo_gnn.install(args.turbo, args.turbo_arch, log=log)
    except Exception as exc:  # noqa: BLE001 - a failed baseline build must not end the run
        traceback.print_exc()
        status = f"unavailable: {failure_status(exc).removeprefix('error: ')}"
        log(f"turbo-gnn: {status}")
        return None, status, {"status": status, "sdist": str(args.turbo)}
    return turbo, None, {"status": "ok", "sdist": str(args.turbo), "build_s": time.perf_counter() - begin}


# --- results ---------------------------------------------------------------------------
def cell_text(cell: dict[str, Any] | None) -> str:
    """``ms (extra GB)`` as issue 13's table writes it, or the failure status."""
    if cell is None:
        return "–"
    if cell["status"] != "ok":
        return cell["status"]
    memory = "" if cell["extra_peak_gb"] is None else f" ({cell['extra_peak_gb']:.2f})"
    return f"{cell['median_ms']:.2f}{memory}"


def error_text(cell: dict[str, Any] | None) -> str:
    worst = None if cell is None else max_error(cell)
    if worst is None:
        return "oracle" if cell and cell["status"] == "ok" else "–"
    return f"{worst:.1e} vs {cell['checked_against']}{fail_mark(worst, REL_ERR_LIMIT)}"


def cell_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(graph, "HxD") pairs in the file, graphs in measured order, shapes as first seen."""
    rows = []
    for key in results["cells"]:
        name, shape, _ = key.split("/")
        if (name, shape) not in rows:
            rows.append((name, shape))
    order = list(results["graphs"])
    return sorted(rows, key=lambda row: order.index(row[0]) if row[0] in order else len(order))


def target_rows(results: dict[str, Any]) -> list[list[str]]:
    """Issue 13's targets per cell: gnnfuse's median time and extra peak memory at most
    turbo-gnn's. ``met``/``missed`` where both ran on one device; where turbo-gnn ran out
    of memory and gnnfuse did not, both are met; any other turbo-gnn failure leaves no
    number to meet (``n/a``), and a gnnfuse failure misses both. A failed numerical check
    counts as a failure: gnnfuse's misses both, turbo-gnn's leaves no number to meet."""
    rows = []
    for name, shape in cell_rows(results):
        ours = results["cells"].get(f"{name}/{shape}/gnnfuse")
        theirs = results["cells"].get(f"{name}/{shape}/turbo-gnn")
        if ours is None or theirs is None:
            continue
        if ours["status"] != "ok":
            verdicts = [("–", f"missed (gnnfuse: {ours['status']})")] * 2
        elif check_failed(max_error(ours), REL_ERR_LIMIT):
            verdicts = [("–", "missed (gnnfuse's check failed)")] * 2
        elif theirs["status"] == "oom":
            verdicts = [("–", "met (turbo-gnn: oom)")] * 2
        elif theirs["status"] != "ok":
            verdicts = [("–", f"n/a (turbo-gnn: {theirs['status']})")] * 2
        elif check_failed(max_error(theirs), REL_ERR_LIMIT):
            verdicts = [("–", "n/a (turbo-gnn's check failed)")] * 2
        elif results["runs"][ours["run"]]["device_name"] != results["runs"][theirs["run"]]["device_name"]:
            verdicts = [("–", "n/a (measured on different devices)")] * 2
        else:
            verdicts = [compare(ours["median_ms"], theirs["median_ms"], ".2f", "ms"),
                        compare(ours["extra_peak_gb"], theirs["extra_peak_gb"], ".2f", "GB")]
        rows.append([name, shape, *(text for verdict in verdicts for text in verdict)])
    return rows


def compare(ours: float | None, theirs: float | None, spec: str, unit: str) -> tuple[str, str]:
    """``ours / theirs unit`` and whether ours is at most theirs."""
    if ours is None or theirs is None:
        return "–", "n/a (not measured on this device)"
    return f"{ours:{spec}} / {theirs:{spec}} {unit}", "met" if ours <= theirs else "missed"


def turbo_line(record: dict[str, Any]) -> str:
    """What a run recorded about turbo-gnn: built from which sdist, or why not."""
    source = f", built from `{Path(record['sdist']).name}`" if record.get("sdist") else ""
    return f"{record.get('status', 'not recorded')}{source}"


def render_markdown(results: dict[str, Any]) -> str:
    lines = ["# GATv2 attention aggregation, forward + backward: gnnfuse vs turbo-gnn vs torch", "",
             "Median ms of one forward+backward (output and gradients of x_l, x_r, att; CUDA events, "
             "after warm-up), and in parentheses the EXTRA peak GB of one forward+backward (peak "
             "allocated minus allocated before: inputs, the output gradient and each method's graph "
             "layouts excluded; output and gradients included). turbo-gnn's backward also "
             "cudaMallocs an [N, H] float buffer outside torch's allocator, which is not counted. "
             f"Max rel err = max|a - b| / max|b| over the output and the three gradients, against "
             f"the method named (torch, or gnnfuse where torch failed); **FAIL** above {REL_ERR_LIMIT:g}.",
             "", *runs_markdown(results), ""]
    lines += [f"- turbo-gnn in run `{rid}`: {turbo_line(env.get('turbo_gnn', {}))}"
              for rid, env in sorted(results["runs"].items())]
    lines.append("")
    head = ["graph", "heads × dim", *(f"{m} ms (GB)" for m in METHODS), "gnnfuse rel err", "turbo-gnn rel err"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, shape in cell_rows(results):
        cells = [results["cells"].get(f"{name}/{shape}/{m}") for m in METHODS]
        meta = results["graphs"].get(name, {})
        label = f"{name} ({meta.get('num_nodes', 0):,} n, {meta.get('num_edges', 0):,} e)"
        lines.append("| " + " | ".join([label, shape.replace("x", " × "), *map(cell_text, cells),
                                        error_text(cells[0]), error_text(cells[1])]) + " |")
    targets = target_rows(results)
    if targets:
        head = ["graph", "heads × dim", "time gnnfuse / turbo-gnn", "time target", "memory gnnfuse / turbo-gnn",
                "memory target"]
        lines += ["", "## Issue 13 targets: gnnfuse time <= turbo-gnn's and extra memory <= turbo-gnn's", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join([name, shape.replace("x", " × "), *rest]) + " |" for name, shape, *rest in targets]
    return "\n".join(lines) + "\n"


def store(results: dict[str, Any], out: Path) -> None:
    """Rewrite both files from the merged results (after every cell, so a run cut off by a
    time limit keeps what it measured)."""
    prune_runs(results)
    save_json(out / "attention.json", results)
    write_atomically(out / "attention.md", render_markdown(results))


# --- driver ----------------------------------------------------------------------------
def shape_list(text: str) -> list[tuple[int, int]]:
    """An argparse type: comma-separated ``HEADSxDIM`` pairs, e.g. ``4x32,1x64``."""
    try:
        shapes = [tuple(int(n) for n in item.lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected comma-separated HEADSxDIM pairs such as 4x32,1x64, got {text!r}")
    return shapes


def name_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=name_list, default=list(DATASETS),
                        help=f"comma list of data sets (default {','.join(DATASETS)})")
    parser.add_argument("--shapes", type=shape_list,
                        help="comma list of HEADSxDIM for every data set (default 4x32,1x64, and 8x8 on "
                             "products-like)")
    parser.add_argument("--methods", type=name_list, default=list(METHODS), help=f"comma list of {', '.join(METHODS)}")
    parser.add_argument("--turbo", type=Path, help="turbo_gnn sdist (.tar.gz) to build and measure, e.g. "
                                                   ".turbo/turbo_gnn-0.1.0rc4.tar.gz; without it turbo-gnn is skipped")
    parser.add_argument("--turbo-arch", help="TORCH_CUDA_ARCH_LIST for the turbo-gnn build (default: the GPU's)")
    parser.add_argument("--reps", type=int, default=20, help="timed forward+backward calls per cell (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3; at least 1)")
    parser.add_argument("--cell-timeout", type=float, default=120.0,
                        help="seconds one method's measurement may take (default 120); past it the cell is "
                             "recorded as a time-out")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="folder of attention.json (merged into) and attention.md")
    parser.add_argument("--profile", action="store_true",
                        help="print torch.profiler's kernel table of one call per method and cell")
    add_device_arguments(parser)
    args = parser.parse_args(argv)
    check_methods(parser, args.methods, METHODS)
    if args.reps < 1 or args.warmup < 1:
        parser.error("--reps and --warmup must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    turbo, turbo_status, turbo_record = prepare_turbo(args, device)
    results = load_results(args.out / "attention.json")
    results.setdefault("graphs", {})
    run_id = new_run_id()
    env = environment(device)
    env["turbo_gnn"] = turbo_record
    results["runs"][run_id] = env
    log(f"run {run_id} on {env['device_name']}; turbo-gnn: {turbo_record['status']}; results -> {args.out}")
    for name in args.datasets:
        problem = load_problem(name, args, device, results, run_id)
        for heads, dim in shapes_for(name, args):
            run_cell(problem, heads, dim, turbo, turbo_status, args, device, results, run_id)
            free_memory(device)                 # the cell's inputs and oracle copies are gone now
        del problem
        free_memory(device)
    log(f"done; {args.out / 'attention.md'}")


if __name__ == "__main__":
    main()
