"""How long a training run's first steps take on a GPU: kernel compilation and
autotuning, which a user waits through before the first epoch line.

Each setup runs in a fresh process with an empty Triton cache (``TRITON_CACHE_DIR`` in a
temporary folder), so nothing compiled by an earlier setup or run is found on disk (on a
CPU, ``--device cpu``, the Numba kernels' own disk cache is kept); it
times its first ``--steps`` training steps (forward, loss, backward, Adam), each to an
idle device, and reports the kernels compiled on first use and their seconds
(`gnnfuse.backend.first_use`). ``--source`` also runs each setup on another gnnfuse source
tree (``git archive <commit> src | tar -x -C DIR``, then ``--source DIR/src``), for a
before/after in one run. A setup still compiling after ``--timeout`` seconds is stopped
and reported as such.

Setups: ``gat``, ``gcn``, ``sage`` (two layers on the whole graph, as bench_training.py
builds them) and ``gat-minibatch`` (PyG's idiom, ``gnnfuse.nn.GAT(..., heads=8)`` on a
``NeighborLoader`` batch's ``edge_index``, 3 layers, fanouts 15,10,5, batch 1024, as
bench_minibatch.py's idiom cell).

    python benchmarks/bench_first_step.py --dataset arxiv-like --setups gat
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from common import environment, log, resolve_device, results_saver

REPO_ROOT = Path(__file__).resolve().parent.parent
SETUPS = ("gat", "gcn", "sage", "gat-minibatch")


def child(setup: str, dataset: str, steps: int, device: torch.device) -> None:
    """One setup's first steps in this process; prints one JSON line per step."""
    import torch.nn.functional as F
    from gnnfuse.backend.first_use import compiled_so_far
    from gnnfuse.bench import synchronize
    if setup == "gat-minibatch":
        import bench_minibatch as bm
        args = argparse.Namespace(model="gat", hidden=256, fanout=[15, 10, 5], dropout=0.5, dataset=dataset,
                                  data_root=None, train_nodes=None, seed=0, batch_size=1024, prefetch=2)
        data, train_idx, graph = bm.load_problem(args, device)
        model = bm.basic_models(data, args)[0].to(device)
        loader = bm.NeighborLoader(graph, args.fanout, args.batch_size, input_nodes=train_idx, shuffle=True,
                                   x=data.x.to(device), y=data.y.to(device), device=device)
        batches = _endless(loader)      # made as the steps go, as a training loop takes them
        optimizer = torch.optim.Adam(model.parameters(), lr=0.003)

        def step() -> None:
            batch = next(batches)
            bm.train_step(model, optimizer, batch.x, batch.edge_index, batch.y, batch.batch_size)
    else:
        from gnnfuse.bench.measure import training_step
        from gnnfuse.bench.models import LR, build_model, load_data
        data = load_data(dataset, None, device)
        model = build_model("gnnfuse", setup, data.x.shape[1], data.num_classes).to(device)
        graph = data.gnnfuse_graph()
        step = training_step(model, lambda: F.cross_entropy(model(data.x, graph)[data.train_idx],
                                                            data.y[data.train_idx]), device, "off", setup, lr=LR)
    model.train()
    for index in range(steps):
        synchronize(device)
        begin = time.perf_counter()
        step()
        synchronize(device)
        kernels, seconds = compiled_so_far()
        print(json.dumps({"step": index, "s": time.perf_counter() - begin, "kernels": kernels,
                          "compile_s": seconds}), flush=True)


def _endless(loader: Any) -> Any:
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def run_setup(setup: str, source: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`child` in a fresh process importing gnnfuse from ``source``, with an empty Triton cache."""
    with tempfile.TemporaryDirectory(prefix="triton_cache_") as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache,
               "PYTHONPATH": os.pathsep.join([str(source), str(REPO_ROOT / "benchmarks")])}
        command = [sys.executable, __file__, "--child", setup, "--dataset", args.dataset, "--steps", str(args.steps),
                   "--device", args.device]
        begin = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
            output, status = done.stdout, ("ok" if done.returncode == 0 else f"exit {done.returncode}")
            errors = done.stderr
        except subprocess.TimeoutExpired as stopped:
            output = stopped.stdout.decode() if isinstance(stopped.stdout, bytes) else (stopped.stdout or "")
            status, errors = f"stopped after {args.timeout} s", ""
        wall = time.perf_counter() - begin
    steps = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    if status.startswith("exit"):
        log(f"{setup} from {source}: {status}\n{errors[-3000:]}")
    return {"setup": setup, "source": str(source), "status": status, "process_s": wall, "steps": steps}


def markdown(results: dict[str, Any]) -> str:
    env, steps = results["environment"], results["config"]["steps"]
    lines = ["# First training steps: compiling and autotuning on first use", "",
             f"{results['config']['dataset']}; {env['device_name']}, torch {env['torch']}, triton {env['triton']}, "
             f"commit {env['git_commit']}, {env['date']}. Each setup in a fresh process with an empty Triton cache; "
             "step seconds to an idle device; kernels and seconds compiled on first use, cumulative "
             "(`gnnfuse.backend.first_use`; a kernel's first launch that took 0.2 s or more).", "",
             "| setup | source | status | " + " | ".join(f"step {k + 1} s" for k in range(steps)) +
             " | kernels compiled | compile s |", "|---" * (steps + 5) + "|"]
    for cell in results["cells"]:
        times = [f"{s['s']:.2f}" for s in cell["steps"]] + ["–"] * (steps - len(cell["steps"]))
        last = cell["steps"][-1] if cell["steps"] else {}
        compiled = (f"{last['kernels']} | {last['compile_s']:.1f}" if last else "– | –")
        lines.append(f"| {cell['setup']} | {cell['label']} | {cell['status']} | {' | '.join(times)} | {compiled} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dataset", default="arxiv-like")
    parser.add_argument("--setups", type=lambda s: s.split(","), default=["gat"], help=f"of {', '.join(SETUPS)}")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--source", action="append", default=[],
                        help="another gnnfuse src folder to run each setup on too, LABEL=PATH (repeatable)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds before a setup is stopped (default 300)")
    parser.add_argument("--json", help="results file (default benchmarks/results/first_step_<dataset>_<device>.json)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.dataset, args.steps, resolve_device(args.device))
        return
    unknown = [s for s in args.setups if s not in SETUPS]
    if unknown:
        parser.error(f"unknown setups {', '.join(unknown)}; known: {', '.join(SETUPS)}")
    sources = [("this tree", REPO_ROOT / "src")]
    for given in args.source:
        label, _, path = given.rpartition("=")
        if not Path(path, "gnnfuse").is_dir():
            parser.error(f"--source {given!r}: {path} holds no gnnfuse package")
        sources.append((label or path, Path(path)))
    device = resolve_device(args.device)
    path = Path(args.json) if args.json else (REPO_ROOT / "benchmarks" / "results" /
                                              f"first_step_{args.dataset}_{device.type}.json")
    results = {"config": vars(args), "environment": environment(device), "cells": []}
    save = results_saver(path, markdown)
    for setup in args.setups:
        for label, source in sources:
            cell = run_setup(setup, source, args) | {"label": label}
            results["cells"].append(cell)
            save(results)
            log(f"{setup}, {label}: {cell['status']}; " + ", ".join(f"{s['s']:.2f} s" for s in cell["steps"]))
    log(f"wrote {path} and {path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
