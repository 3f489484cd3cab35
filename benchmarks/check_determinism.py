"""On a GPU: ``torch.use_deterministic_algorithms(True)`` gives the same bits call after call.

gnnfuse's Triton kernels add some sums atomically (split hub rows, the COO and scan
schedules, the typed row scatter and weight gradient) and autotune their block sizes, so
with torch's switch off a layer's output and gradients may differ in their last bits
from one call to the next. With it on they must not (backend/determinism.py). CI runs
Triton's interpreter, which runs one program at a time and so always adds in one order;
only a GPU shows the difference. For each layer this runs the same forward and backward
``--calls`` times with the switch off and then on, counts the calls whose output or any
gradient differs bitwise from the first call's, times a call (median ms) in each mode, and
compares the first calls of the two modes (the switch changes the order of additions, so
they may differ in their last bits only), for gnnfuse's layers and PyG's with the same
weights.

    PYTHONPATH=src:benchmarks python benchmarks/check_determinism.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # torch's deterministic matmuls need it

import torch  # noqa: E402

import gnnfuse.nn as gnn  # noqa: E402
from common import environment, load_results, new_run_id, results_saver, runs_markdown  # noqa: E402
from gnnfuse.data import load_dataset  # noqa: E402

RELATIONS = 8


def layers(width: int) -> dict[str, Callable[[], tuple[torch.nn.Module, torch.nn.Module]]]:
    """Per name, a maker of (gnnfuse layer, PyG layer with the same weights)."""
    import torch_geometric.nn as pyg

    def pair(ours: torch.nn.Module, theirs: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
        theirs.load_state_dict(ours.state_dict())
        return ours, theirs
    return {"GCNConv": lambda: pair(gnn.GCNConv(width, 64), pyg.GCNConv(width, 64)),
            "SAGEConv": lambda: pair(gnn.SAGEConv(width, 64), pyg.SAGEConv(width, 64)),
            "GATConv 8x8": lambda: pair(gnn.GATConv(width, 8, heads=8), pyg.GATConv(width, 8, heads=8)),
            "GATv2Conv 4x16": lambda: pair(gnn.GATv2Conv(width, 16, heads=4), pyg.GATv2Conv(width, 16, heads=4)),
            "RGCNConv 8 relations": lambda: pair(gnn.RGCNConv(width, 64, RELATIONS),
                                                 pyg.FastRGCNConv(width, 64, RELATIONS))}


def one_call(layer: torch.nn.Module, x: torch.Tensor, edges: tuple) -> list[torch.Tensor]:
    """Output, input gradient and parameter gradients of one forward and backward."""
    layer.zero_grad(set_to_none=True)
    x.grad = None
    out = layer(x, *edges)
    out.backward(torch.ones_like(out).div_(out.numel() ** 0.5))   # a fixed gradient: out's last bits only
    return [out.detach(), x.grad, *(p.grad for p in layer.parameters())]


def measure(layer: torch.nn.Module, x: torch.Tensor, edges: tuple, calls: int, deterministic: bool,
            kept: list) -> dict[str, Any]:
    """The cell of one mode; the first call's tensors are appended to ``kept``."""
    torch.use_deterministic_algorithms(deterministic)
    try:
        first = one_call(layer, x, edges)          # also the warm-up: compiles, tunes, plans
        kept.append([t.clone() for t in first])
        one_call(layer, x, edges)
        differing, times = 0, []
        for _ in range(calls):
            torch.cuda.synchronize()
            start = time.perf_counter()
            got = one_call(layer, x, edges)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
            differing += any(not torch.equal(a, b) for a, b in zip(got, first))
        return {"differing_calls": differing, "calls": calls, "median_ms": statistics.median(times)}
    except RuntimeError as error:                  # a torch operation with no deterministic form
        return {"error": str(error).splitlines()[0][:160]}
    finally:
        torch.use_deterministic_algorithms(False)


def worst_difference(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest difference between matching tensors, relative to the reference's
    largest magnitude: the switch changes the order of additions, never the values."""
    return max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(ours, reference))


def render_markdown(results: dict[str, Any]) -> str:
    lines = ["# Determinism: bitwise repeatability with torch.use_deterministic_algorithms", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "", *runs_markdown(results), "",
             "| graph | layer | library | differing calls, switch off | differing calls, switch on "
             "| ms off | ms on | on / off | on against off (largest relative difference) |",
             "|---|---|---|---|---|---|---|---|---|"]

    def differing(m: dict[str, Any]) -> str:
        return f"failed: {m['error'][:40]}" if "error" in m else f"{m['differing_calls']} of {m['calls']}"

    def ms(m: dict[str, Any]) -> str:
        return "–" if "error" in m else f"{m['median_ms']:.2f}"
    for c in results["cells"].values():
        off, on = c["off"], c["on"]
        ratio = (f"{on['median_ms'] / off['median_ms']:.2f}" if "median_ms" in on and "median_ms" in off else "–")
        agreement = f"{c['on_vs_off']:.1e}" if "on_vs_off" in c else "–"
        lines.append(f"| {c['graph']} | {c['layer']} | {c['library']} | {differing(off)} | {differing(on)} | "
                     f"{ms(off)} | {ms(on)} | {ratio} | {agreement} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="arxiv-like")
    parser.add_argument("--layers", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("check_determinism.py compares runs of CUDA kernels: no CUDA device is available")
    path = args.out / "determinism.json"
    results = load_results(path)
    run = new_run_id()
    results["runs"][run] = environment(torch.device("cuda"))
    save = results_saver(path, render_markdown)
    failed = False
    for name in args.dataset.split(","):
        data = load_dataset(name, os.environ.get("GNNFUSE_DATA"))
        graph = data.graph.to("cuda")
        x = data.x.to("cuda").requires_grad_()
        edge_index = torch.stack([graph.src, graph.dst])
        edge_type = torch.randint(0, RELATIONS, (graph.num_edges,), generator=torch.Generator().manual_seed(0)).cuda()
        made = layers(x.shape[1])
        for layer_name in (args.layers.split(",") if args.layers else made):
            torch.manual_seed(0)
            ours, theirs = (m.cuda() for m in made[layer_name]())
            typed = layer_name.startswith("RGCN")
            for library, layer in (("gnnfuse", ours), ("PyG", theirs)):
                edges = (edge_index, edge_type) if typed else (edge_index,)
                kept: list = []
                cell = {"graph": name, "layer": layer_name, "library": library, "run": run,
                        "off": measure(layer, x, edges, args.calls, False, kept),
                        "on": measure(layer, x, edges, args.calls, True, kept)}
                if len(kept) == 2:
                    cell["on_vs_off"] = worst_difference(kept[1], kept[0])
                results["cells"][f"{name}/{layer_name}/{library}"] = cell
                save(results)
                failed |= library == "gnnfuse" and (cell["on"].get("differing_calls", 1) != 0
                                                    or cell.get("on_vs_off", 1.0) > 1e-3)
                print(name, layer_name, library, "off:", cell["off"], "on:", cell["on"], flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
