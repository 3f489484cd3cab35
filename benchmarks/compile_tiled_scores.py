"""Ahead-of-time compile of the tiled-score kernels for an H100 (sm_90), without a GPU.

The H100 run found that Triton 3.6 could not compile the tiled plan's first form (an
assertion in TritonGPUOptimizeThreadLocality at 2 heads x 3 channels, a 40 s compile at
4 x 32). Triton's compiler runs its whole pipeline, down to ptxas and a cubin, on a
machine without a GPU, so the kernels can be checked against the GPU machine's exact
Triton version before any GPU time is spent:

1. this process runs GATConv and GATv2Conv (forward and backward,
   ``GNNFUSE_TILED_SCORES=1``) under the Triton interpreter at each heads x channels, on
   a dense graph (the CSR kernels) and a sparse one (the COO kernels), and records every
   kernel: its source as the GPU gets it (behind its autotuner), its feature block and
   its argument types;
2. ``--python`` (any Python with the Triton under test, e.g. a venv with
   ``triton==3.6.0``; no torch needed) compiles each kernel in every configuration its
   autotuner would try, one child per kernel, so that an MLIR assertion, which aborts
   the process, is reported as that kernel's failure.

One line per kernel configuration (compile seconds: CPU time of the compiler and its
ptxas child, which a loaded machine does not inflate, and wall time; ok or the error),
then a summary per case -- one layer, shape, dtype and graph (``dense``: CSR kernels,
``sparse``: COO kernels), i.e. one first forward + backward: how many configurations
its autotuners compile and their CPU seconds in all. ``--untiled`` compiles the default
plan's kernels instead, for comparison.

    python -m venv /tmp/triton36 && /tmp/triton36/bin/pip install triton==3.6.0
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/compile_tiled_scores.py --python /tmp/triton36/bin/python
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# (name, vertices, edges): a dense graph runs the sums over CSR, a sparse one over COO
GRAPHS = (("dense", 20, 400), ("sparse", 20, 60))
TYPES = {"torch.float32": "*fp32", "torch.float64": "*fp64", "torch.int64": "*i64", "torch.int32": "*i32",
         "torch.int16": "*i16", "torch.int8": "*i8", "torch.bool": "*i1", "torch.uint8": "*u8"}
# The child: compile one kernel file in every autotuner configuration, for sm_90.
COMPILE = r'''
import importlib.util, json, resource, sys, time
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
kernel = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("kernel", kernel["path"])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
tuner = getattr(module, kernel["name"])
params = list(tuner.fn.arg_names)
for config in tuner.configs:
    values = {"BLOCK_F": kernel["block_f"], **config.kwargs}
    signature = {p: "constexpr" if p in values else kernel["types"][i] for i, p in enumerate(params)}
    constexprs = {(i,): values[p] for i, p in enumerate(params) if p in values}
    begin, cpu = time.perf_counter(), time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    triton.compile(ASTSource(fn=tuner.fn, signature=signature, constexprs=constexprs),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": config.num_warps})
    cpu = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - cpu
    print(f"{values} warps={config.num_warps}: {cpu:.1f} s cpu ({time.perf_counter() - begin:.1f} s wall) ok",
          flush=True)
'''


def collect(layers: list[str], shapes: list[str], folder: Path, dtype: str = "float32",
            edge_dims: tuple[int | None, ...] = (None,), tiled: bool = True) -> list[dict[str, Any]]:
    """Every kernel the layers launch, per case (layer, shape, dtype, edge features and
    graph: one first forward + backward), with what compiling it needs (see step 1)."""
    os.environ["GNNFUSE_TILED_SCORES"], os.environ["GNNFUSE_BACKEND"] = "1" if tiled else "0", "triton"
    import torch
    import gnnfuse.nn as gnn
    from gnnfuse.backend.triton import executor
    loaded: dict[int, dict[str, Any]] = {}                     # id(kernel) -> its name and GPU source
    kernels: dict[tuple[int, int, str], dict[str, Any]] = {}   # (id(kernel), BLOCK_F, case) -> what compiling needs
    current: dict[str, Any] = {}
    real_source, real_load, real_launch = executor.kernel_source, executor._load_kernel, executor.launch

    def kernel_source(unit, acc, schedule):
        name, source, leaves = real_source(unit, acc, schedule)
        current["tuned"] = executor._GENERATORS[schedule][1](unit, name, acc, tuned=True)[0]
        return name, source, leaves

    def load_kernel(source, name):
        kernel = real_load(source, name)
        loaded.setdefault(id(kernel), {"name": name, "source": current["tuned"]})
        return kernel

    def launch(kernel, grid, sizes, args, kwargs, known_signature=None):
        types = [TYPES[str(a.dtype)] if isinstance(a, torch.Tensor) else "i32" for a in args]
        kernels.setdefault((id(kernel), kwargs.get("BLOCK_F"), current["case"]),
                           {**loaded[id(kernel)], "case": current["case"], "block_f": kwargs.get("BLOCK_F"),
                            "types": types})
        return real_launch(kernel, grid, sizes, args, kwargs, known_signature)

    executor.kernel_source, executor._load_kernel, executor.launch = kernel_source, load_kernel, launch
    for layer in layers:
        for shape in shapes:
            heads, channels = (int(n) for n in shape.split("x"))
            for (graph, nodes, edges), edge_dim in itertools.product(GRAPHS, edge_dims):
                current["case"] = f"{layer} {shape} {dtype} {graph}" + ("" if edge_dim is None else f" edge_dim {edge_dim}")
                gen = torch.Generator().manual_seed(0)
                features = {} if edge_dim is None else {"edge_dim": edge_dim}
                module = getattr(gnn, layer)(16, channels, heads=heads, **features).to(getattr(torch, dtype))
                x = torch.randn(nodes, 16, generator=gen, requires_grad=True, dtype=getattr(torch, dtype))
                attr = () if edge_dim is None else (torch.randn(edges, edge_dim, generator=gen, dtype=x.dtype),)
                module(x, torch.randint(0, nodes, (2, edges), generator=gen), *attr).sum().backward()
    found = []
    for n, entry in enumerate(kernels.values()):
        entry["path"] = str(folder / f"{entry['name']}_{n}.py")
        Path(entry["path"]).write_text(entry.pop("source"))
        found.append(entry)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="a Python with the Triton version to check")
    parser.add_argument("--layers", default="GATConv,GATv2Conv")
    parser.add_argument("--shapes", default="1x64,2x3,4x32,8x8,3x5")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--edge-dim", type=int, help="also run the layers with edge features of this width")
    parser.add_argument("--untiled", action="store_true", help="compile the default plan's kernels "
                        "(GNNFUSE_TILED_SCORES=0) instead, for comparison")
    parser.add_argument("--limit", type=float, default=300, help="seconds for one kernel's configurations")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("run with TRITON_INTERPRET=1: the kernels are collected under the interpreter", flush=True)
        return 2
    compiling = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # the children's environment
    version = subprocess.run([args.python, "-c", "import triton; print(triton.__version__)"],
                             capture_output=True, text=True, env=compiling).stdout.strip()
    print(f"compiling for cuda sm_90 with triton {version or '(not importable)'} ({args.python})", flush=True)
    failures: dict[str, list[str]] = {}
    configs: dict[str, list[float]] = {}    # case -> compile CPU seconds of each configuration
    with tempfile.TemporaryDirectory() as name:
        kernels = collect(args.layers.split(","), args.shapes.split(","), Path(name), args.dtype,
                          (None,) if args.edge_dim is None else (None, args.edge_dim), not args.untiled)
        for n, kernel in enumerate(kernels):
            label = f"{kernel['case']}: {kernel['name']} (BLOCK_F {kernel['block_f']})"
            # compile for real: a cache of its own, so a kernel another case launched too is no cache hit
            env = {**compiling, "TRITON_CACHE_DIR": str(Path(name) / "triton-cache" / str(n))}
            try:
                done = subprocess.run([args.python, "-c", COMPILE, json.dumps(kernel)], capture_output=True,
                                      text=True, env=env, timeout=args.limit)
                lines = done.stdout.splitlines()
                error = None if done.returncode == 0 else " / ".join(
                    [line for line in done.stderr.splitlines() if "error" in line.lower()][:2]
                    or done.stderr.strip().splitlines()[-1:])
            except subprocess.TimeoutExpired as exc:     # the configurations compiled before it still count
                lines = (exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or "").splitlines()
                error = f"still compiling after {args.limit:g} s"
            for line in lines:
                print(f"{label} {line}", flush=True)
                seconds = float(line.split(": ")[-1].split(" s cpu")[0])
                configs.setdefault(kernel["case"], []).append(seconds)
            if error is not None:
                print(f"{label} FAILED: {error[:400]}", flush=True)
                failures.setdefault(kernel["case"], []).append(kernel["name"])
            failures.setdefault(kernel["case"], [])
    print("\nsummary (per case: the configurations its first forward + backward compiles, their CPU seconds):")
    for case, failed in failures.items():
        times = configs.get(case, [0.0])
        print(f"  {case}: {len(configs.get(case, []))} configs, {sum(times):.1f} s cpu in all, slowest "
              f"{max(times):.1f} s: {'ok' if not failed else 'FAILED in ' + ', '.join(failed)}")
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
