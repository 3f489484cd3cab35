"""GPU check of tiled attention scores (the default plan; ``GNNFUSE_TILED_SCORES=0`` is the
untiled one; issue #13).

The tiled plan recomputes the [E, heads] attention scores inside every kernel that reads
them, so GATConv and GATv2Conv write nothing per edge. Its first form (a ``tl.gather``
per lane) did not compile with Triton 3.6 on an H100; this script checks the current one
on the GPU against the untiled plan, for GATConv and GATv2Conv at heads x channels 1x64,
2x3, 4x32, 8x8 and 3x5.

Each (layer, shape) runs in a child process, so a compile that hangs is stopped and the
other shapes still run: the child prints ``compiling ...`` before its first tiled call
and, if that call has not returned after ``--compile-limit`` seconds, Python's
faulthandler prints where every thread is and ends the child. In the child:

1. **small graph, float64**, with and without edge features (edge_dim 3): the first
   tiled forward + backward (where every kernel compiles; timed), then output and the
   gradients of x, edge_attr and every parameter against the untiled plan (rel 1e-9),
   and ``gnnfuse.explain`` must show no per-edge tensor in either program;
2. **arxiv-sized preset** (power-law, 169k vertices, 1.17M edges), float32, no edge
   features: the same comparison (rel 1e-4), then the median forward + backward time and
   the extra peak memory of both plans.

One summary line per (layer, shape); exit status 1 if any failed.

    PYTHONPATH=src python benchmarks/check_tiled_scores.py
    PYTHONPATH=src python benchmarks/check_tiled_scores.py --layers GATv2Conv --shapes 2x3,4x32
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/check_tiled_scores.py --device cpu --no-arxiv  # dry run
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

SHAPES = ("1x64", "2x3", "4x32", "8x8", "3x5")
LAYERS = ("GATConv", "GATv2Conv")
SMALL_NODES, SMALL_EDGES, SMALL_FEATURES = 300, 2000, 16
ARXIV_FEATURES = 128
LIMITS = {"float64": 1e-9, "float32": 1e-4}


# --- the child: one layer and shape ---------------------------------------------------------
def run_layer(layer: Any, x: torch.Tensor, edge_index: torch.Tensor, attr: torch.Tensor | None,
              tiled: bool) -> dict[str, torch.Tensor]:
    """Output and every gradient of one forward + backward, under the tiled plan or not
    (the executor keys its plans on the flag, so both live in one process)."""
    os.environ["GNNFUSE_TILED_SCORES"] = "1" if tiled else "0"
    layer.zero_grad(set_to_none=True)
    xs = x.clone().requires_grad_()
    attrs = None if attr is None else attr.clone().requires_grad_()
    out = layer(xs, edge_index, attrs)
    cotangent = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1)).to(out.device)
    (out * cotangent).sum().backward()
    grads = {"out": out.detach(), "x": xs.grad}
    if attrs is not None:
        grads["edge_attr"] = attrs.grad
    grads.update({name: p.grad for name, p in layer.named_parameters()})
    return grads


def worst_error(tiled: dict[str, torch.Tensor], untiled: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest error over the output and every gradient, and whose: a NaN before any
    number (``max`` keeps whichever of NaN and a number comes first), a missing gradient inf."""
    from gnnfuse.bench import max_rel_err
    errors = {name: (float("inf") if tiled[name] is None else max_rel_err(tiled[name], untiled[name]))
              for name in untiled}
    name = next((n for n, e in errors.items() if e != e), None) or max(errors, key=errors.get)
    return errors[name], name


def edge_tensors(layer: Any, x: torch.Tensor, edge_index: torch.Tensor, attr: torch.Tensor | None) -> list[str]:
    """Per-edge tensors the tiled plans write (the IO rule's exempt ones excluded)."""
    import gnnfuse
    os.environ["GNNFUSE_TILED_SCORES"] = "1"
    report = gnnfuse.explain(lambda xs: layer(xs, edge_index, attr), x.clone().requires_grad_())
    return [f"{plan.phase}: {t.value.op}{list(t.value.shape)}" for program in report.programs
            for plan in (program.forward, program.backward) for t in plan.edge_tensors if not t.exempt]


def time_fwd_bwd(fn: Callable[[], Any], device: torch.device, reps: int) -> tuple[float, float | None]:
    """(median ms, extra peak GB; None off CUDA) of ``fn`` after one warm call."""
    from gnnfuse.bench import allocated_gb, peak_memory_gb, reset_peak_memory, synchronize, time_calls
    fn()
    synchronize(device)
    base = allocated_gb(device)
    reset_peak_memory(device)
    fn()
    synchronize(device)
    peak = peak_memory_gb(device)
    return statistics.median(time_calls(fn, reps, device)), None if peak is None else peak - base


def child(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["GNNFUSE_BACKEND"] = "triton"      # the tiled plan is the Triton backend's (also on a CPU dry run)
    import gnnfuse.nn as gnn
    from gnnfuse.bench import synchronize
    device = torch.device(args.device)
    heads, channels = (int(n) for n in args.shape.split("x"))
    result: dict[str, Any] = {"layer": args.layer, "shape": args.shape}
    gen = torch.Generator().manual_seed(0)

    def build(features: int, edge_dim: int | None, dtype: torch.dtype) -> Any:
        torch.manual_seed(0)
        return getattr(gnn, args.layer)(features, channels, heads=heads, edge_dim=edge_dim).to(device, dtype)

    # 1. small graph, float64: compile, compare, no per-edge tensor
    edge_index = torch.randint(0, SMALL_NODES, (2, SMALL_EDGES), generator=gen).to(device)
    x = torch.randn(SMALL_NODES, SMALL_FEATURES, generator=gen, dtype=torch.float64).to(device)
    small = []
    for edge_dim in (None, 3):
        attr = None if edge_dim is None else torch.randn(SMALL_EDGES, edge_dim, generator=gen,
                                                           dtype=torch.float64).to(device)
        layer = build(SMALL_FEATURES, edge_dim, torch.float64)
        untiled = run_layer(layer, x, edge_index, attr, tiled=False)
        print(f"  compiling {args.layer} {args.shape} edge_dim={edge_dim} (limit {args.compile_limit:g} s)",
              flush=True)
        faulthandler.dump_traceback_later(args.compile_limit, exit=True)
        begin = time.perf_counter()
        tiled = run_layer(layer, x, edge_index, attr, tiled=True)
        synchronize(device)
        compile_s = time.perf_counter() - begin
        faulthandler.cancel_dump_traceback_later()
        print(f"  compiled and ran in {compile_s:.1f} s", flush=True)
        err, where = worst_error(tiled, untiled)
        written = edge_tensors(layer, x, edge_index, attr)
        small.append({"edge_dim": edge_dim, "compile_s": compile_s, "max_rel_err": err, "worst": where,
                      "edge_tensors": written, "passed": err <= LIMITS["float64"] and not written})
    result["small"] = small
    if args.arxiv is None:      # a dry run of the script
        result["passed"] = all(s["passed"] for s in small)
        return result

    # 2. arxiv-sized preset, float32: compare, time, memory
    saved = torch.load(args.arxiv)
    edge_index, nodes = saved["edge_index"].to(device), saved["num_nodes"]
    x = torch.randn(nodes, ARXIV_FEATURES, generator=gen).to(device)
    layer = build(ARXIV_FEATURES, None, torch.float32)
    untiled = run_layer(layer, x, edge_index, None, tiled=False)
    faulthandler.dump_traceback_later(args.compile_limit, exit=True)
    tiled = run_layer(layer, x, edge_index, None, tiled=True)
    faulthandler.cancel_dump_traceback_later()
    err, where = worst_error(tiled, untiled)
    arxiv: dict[str, Any] = {"max_rel_err": err, "worst": where}
    for name, flag in (("tiled", True), ("untiled", False)):
        arxiv[f"{name}_ms"], arxiv[f"{name}_gb"] = time_fwd_bwd(
            lambda: run_layer(layer, x, edge_index, None, tiled=flag), device, args.reps)
    arxiv["passed"] = err <= LIMITS["float32"]
    result["arxiv"] = arxiv
    result["passed"] = all(s["passed"] for s in small) and arxiv["passed"]
    return result


# --- the parent: one child per (layer, shape) ---------------------------------------------------
def summary(layer: str, shape: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"tiled scores {layer} {shape}: {result['error']} -> FAIL"
    small = "; ".join(f"edge_dim {s['edge_dim']}: compile+run {s['compile_s']:.1f} s, err {s['max_rel_err']:.1e} "
                      f"({s['worst']}), per-edge tensors {s['edge_tensors'] or 'none'}" for s in result["small"])
    a = result.get("arxiv")
    arxiv = "arxiv-sized not run" if a is None else (
        f"arxiv-sized err {a['max_rel_err']:.1e} ({a['worst']}), tiled {a['tiled_ms']:.2f} ms "
        f"+{gb(a['tiled_gb'])} vs untiled {a['untiled_ms']:.2f} ms +{gb(a['untiled_gb'])}")
    return f"tiled scores {layer} {shape}: small [{small}] | {arxiv} -> {'PASS' if result['passed'] else 'FAIL'}"


def gb(value: float | None) -> str:
    return "? GB" if value is None else f"{value:.3f} GB"


def run_child(layer: str, shape: str, arxiv: Path | None, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The child's progress goes straight to this stdout (a hang shows where it is); its
    result comes back in a file, its stderr (faulthandler's stacks) in another."""
    out, err = folder / f"{layer}-{shape}.json", folder / f"{layer}-{shape}.err"
    command = [sys.executable, __file__, "--child", "--layer", layer, "--shape", shape, "--result", str(out),
               "--compile-limit", str(args.compile_limit), "--reps", str(args.reps), "--device", args.device]
    command += ["--arxiv", str(arxiv)] if arxiv else []
    with open(err, "w") as stderr:
        try:
            done = subprocess.run(command, stderr=stderr, timeout=args.child_limit)
        except subprocess.TimeoutExpired:
            return {"error": f"child still running after {args.child_limit:g} s (killed)"}
    if out.exists():
        return json.loads(out.read_text())
    lines = err.read_text().strip().splitlines()
    hung = any("Timeout (" in line for line in lines)     # faulthandler's header
    stack = [line.strip() for line in lines if line.strip().startswith("File ")][:4]
    what = f"first tiled call over {args.compile_limit:g} s, stopped in {stack}" if hung else " / ".join(lines[-6:])
    return {"error": f"child exited with {done.returncode}: {what[-800:]}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="heads x channels, comma separated")
    parser.add_argument("--compile-limit", type=float, default=180, help="seconds for a first tiled call")
    parser.add_argument("--child-limit", type=float, default=420, help="seconds for one (layer, shape) child")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--layer", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--arxiv", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--no-arxiv", action="store_true", help="small graph only (a CPU dry run of the script)")
    args = parser.parse_args(argv)
    if args.child:
        Path(args.result).write_text(json.dumps(child(args)))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("check_tiled_scores: CUDA is not available; nothing to check", flush=True)
        return 1
    import triton
    from gnnfuse.data import load_dataset
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"{device}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    failed = 0
    with tempfile.TemporaryDirectory() as name:
        folder, arxiv = Path(name), None
        if not args.no_arxiv:
            graph = load_dataset("arxiv-like").graph
            arxiv = folder / "arxiv-like.pt"
            torch.save({"edge_index": torch.stack([graph.src, graph.dst]).long(), "num_nodes": graph.num_nodes},
                       arxiv)
        lines = []
        for layer in args.layers.split(","):
            for shape in args.shapes.split(","):
                print(f"[{layer} {shape}]", flush=True)
                result = run_child(layer, shape, arxiv, folder, args)
                lines.append(summary(layer, shape, result))
                print(lines[-1], flush=True)
                failed += not result.get("passed", False)
    print("\n".join(["", "summary:", *lines, f"{len(lines) - failed}/{len(lines)} passed"]), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
