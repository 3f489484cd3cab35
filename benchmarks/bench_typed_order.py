"""R-GCN forward+backward with and without linear-operator reordering (passes/
linear_reorder.py), on a synthetic typed graph with many relations.

Variants, each in its own process (compiled programs are cached per process):

- ``compact``: the pipeline without the reordering pass -- the transform runs per
  (source, relation) pair (compact materialization) and the products are gathered onto
  the edges, scaled and summed;
- ``auto``: the pass on, the byte model choosing the order per op and graph;
- ``before`` / ``after`` / ``dense``: the pass on, the order forced (``GNNFUSE_TYPED_ORDER``);
- ``pyg``: PyG's ``RGCNConv`` from the same weights, for scale.

One step is ``layer(x, graph)``, a weighted sum of the output and ``backward()`` (input
and weight gradients). The first calls (tracing, pair building) are untimed. The
variants run interleaved, ``--rounds`` times each, ``--repeats`` steps a run; the median
and interquartile range of all steps are printed, as wall time and as the process's CPU
time (with one thread, the CPU time is what a step costs, and it is far less disturbed
than wall time when other processes share the cores; on CUDA only wall time means
anything). Compare medians within one run, and rerun when the ranges overlap.

    python benchmarks/bench_typed_order.py                          # AIFB-sized, 3 width pairs
    python benchmarks/bench_typed_order.py --nodes 2000 --edges 20000 --relations 50 --widths 16x16
    python benchmarks/bench_typed_order.py --device cuda --nodes 334000 --edges 1830000 --relations 206  # BGS-sized
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

VARIANTS = ("compact", "auto", "before", "after", "dense", "pyg")


def typed_graph(nodes: int, edges: int, relations: int, seed: int = 0):
    """Power-law-ish sources (a few hubs, as knowledge graphs have) and uniform destinations,
    relations drawn with skewed frequencies."""
    import gnnfuse
    g = torch.Generator().manual_seed(seed)
    src = (torch.rand(edges, generator=g) ** 3 * nodes).long()
    dst = torch.randint(0, nodes, (edges,), generator=g)
    weights = 1.0 / torch.arange(1, relations + 1, dtype=torch.float64)
    etype = torch.multinomial(weights, edges, replacement=True, generator=g)
    return gnnfuse.Graph(src, dst, nodes, edge_type=etype, num_edge_types=relations)


def run_variant(variant: str, args: argparse.Namespace, width_in: int, width_out: int) -> dict:
    if variant in ("before", "after", "dense"):
        os.environ["GNNFUSE_TYPED_ORDER"] = variant
    if variant == "compact":
        from gnnfuse.passes import pipeline
        pipeline.reorder_typed_linear = lambda program: program
    import gnnfuse
    from gnnfuse.bench import synchronize
    from gnnfuse.nn import RGCNConv
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    graph = typed_graph(args.nodes, args.edges, args.relations).to(device)
    layer = RGCNConv(width_in, width_out, args.relations, root_weight=False).to(device)
    x = torch.randn(args.nodes, width_in, device=device, requires_grad=True)
    if variant == "pyg":
        from torch_geometric.nn import RGCNConv as PygRGCNConv
        pyg = PygRGCNConv(width_in, width_out, args.relations, root_weight=False).to(device)
        pyg.load_state_dict(layer.state_dict())
        index, types = graph.edge_index, graph.edge_type

        def step():
            return pyg(x, index, types)
    else:
        def step():
            return layer(x, graph)
    cotangent = torch.randn(args.nodes, width_out, device=device)
    times, cpu_times = [], []
    for k in range(args.warmup + args.repeats):
        synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        (step() * cotangent).sum().backward()
        synchronize(device)
        if k >= args.warmup:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        x.grad = None
        layer.zero_grad()
    chosen = None
    if variant == "auto":
        report = gnnfuse.explain(lambda: (step() * cotangent).sum().backward())
        chosen = [line.strip() for line in str(report).splitlines() if "typed linear order" in line]
    return {"times_ms": [1e3 * t for t in times], "cpu_ms": [1e3 * t for t in cpu_times], "chosen": chosen}


def _median_iqr(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):7.1f} ms [{q[0]:.1f}, {q[2]:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8285)      # AIFB's size (issue #16)
    parser.add_argument("--edges", type=int, default=58086)
    parser.add_argument("--relations", type=int, default=90)
    parser.add_argument("--widths", default="16x16,64x16,16x64", help="in x out pairs, comma-separated")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--one", help=argparse.SUPPRESS)         # internal: run one variant, print JSON
    args = parser.parse_args()
    if args.one:
        variant, width_in, width_out = args.one.split(":")
        print(json.dumps(run_variant(variant, args, int(width_in), int(width_out))))
        return
    print(f"R-GCN forward+backward on {args.device}, N={args.nodes} E={args.edges} R={args.relations}, "
          f"{args.threads} thread(s), "
          f"median [IQR] of {args.rounds} rounds x {args.repeats} steps, variants interleaved per round")
    variants = args.variants.split(",")
    for pair in args.widths.split(","):
        width_in, width_out = pair.split("x")
        times: dict[str, list[float]] = {v: [] for v in variants}
        cpu_times: dict[str, list[float]] = {v: [] for v in variants}
        chosen: list[str] = []
        for _ in range(args.rounds):     # interleaved, so a burst of load from elsewhere hits every variant
            for variant in variants:
                command = [sys.executable, __file__, "--one", f"{variant}:{width_in}:{width_out}"] + [
                    f"--{k}={getattr(args, k)}" for k in ("nodes", "edges", "relations", "threads", "device",
                                                          "warmup", "repeats")]
                row = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
                times[variant] += row["times_ms"]
                cpu_times[variant] += row["cpu_ms"]
                chosen = row["chosen"] or chosen
        for variant in variants:
            print(f"in={width_in:>3} out={width_out:>3} {variant:>8}: wall {_median_iqr(times[variant])}, "
                  f"process CPU {_median_iqr(cpu_times[variant])}", flush=True)
        for line in chosen:
            print(f"{'':8}{line}")


if __name__ == "__main__":
    main()
