"""Aten ops per eager training step on batches of small graphs, gnnfuse against PyG.

`bench_graph_batches.py`'s step (128 molecule-sized graphs a batch, a new batch each
step, hidden 128 x 4 layers, Adam) is bound by the host on a GPU: every aten op
dispatched costs a dispatcher trip, and most a CUDA launch. This counts the ops of that
step -- forward, loss, backward and optimizer step, the same models from
`bench_graph_batches.make_pair` -- with a `TorchDispatchMode`, on the CPU, after warm-up
steps, each measured step on a new batch. The Triton backend is made the default as on
a GPU (what tests/first_pass_check.py does), so gnnfuse's small graphs take their first
pass on the reference executor, as they do on a GPU (runtime/first_pass.py).

Per model: ops per step; those that are views or metadata only (no kernel on a GPU: view,
t, select, detach, ...) apart; Adam's ops apart (the same on both sides, and on a GPU a
few foreach kernels instead of the CPU's per-parameter ops); and the host syncs a GPU
would take (`gnnfuse.bench.host_syncs`: ``.item()``, ``.tolist()``, ``nonzero``, a
boolean mask index, ``bincount``; Adam's CPU step count left out). Counts are per step.
The CPU takes some paths a GPU does not (gnnfuse's degrees by ``bincount``, counted as a
sync here, where a GPU scatters ones; no padded row strides; no bias-gradient
Functions), so a GPU's counts differ by a few ops.

``--sites N`` lists, for gnnfuse, the N source lines that dispatched the most ops, and
the ops by module: a backward op is put at the line of the forward op autograd
differentiates (anomaly mode's record, without its NaN checks), or at the gnnfuse line
running it (a compiled program's backward).

    python benchmarks/count_step_ops.py
    python benchmarks/count_step_ops.py --models GAT --sites 40
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import bench_graph_batches as graph_batches
from gnnfuse.bench.host_syncs import HostSyncCounter, op_syncs
from gnnfuse.graph.index_cache import clear_index_cache
from gnnfuse.runtime import compiled

# ops that make no kernel: views and metadata
VIEWS = frozenset({"view", "_unsafe_view", "t", "transpose", "select", "expand", "unsqueeze", "squeeze", "unbind",
                   "detach", "alias", "as_strided", "slice", "split", "permute", "_reshape_alias", "narrow",
                   "split_with_sizes", "_record_function_enter_new", "_record_function_exit"})
PACKAGE = os.sep + "gnnfuse" + os.sep
PYG = "torch_geometric" + os.sep
OPTIMIZER = os.sep + "optim" + os.sep


@contextmanager
def triton_by_default() -> Iterator[None]:
    """Within the block `compiled.backend_name` answers "triton" for CPU tensors too, in
    every module that imported it by name, as on a GPU (tests/first_pass_check.py)."""
    real = compiled.backend_name
    modules = [m for m in list(sys.modules.values()) if getattr(m, "backend_name", None) is real]
    forced = os.environ.pop("GNNFUSE_BACKEND", None)
    for module in modules:
        module.backend_name = lambda on_cuda: "triton"
    try:
        yield
    finally:
        for module in modules:
            module.backend_name = real
        if forced is not None:
            os.environ["GNNFUSE_BACKEND"] = forced


def _site(filename: str, line: int) -> str | None:
    """``module:line`` for gnnfuse's and PyG's source (PyG's generated propagate files
    included), else None."""
    if PACKAGE in filename:
        return filename.split(PACKAGE, 1)[1] + f":{line}"
    if "torch_geometric" in filename:
        return "pyg/" + (filename.split(PYG, 1)[1] if PYG in filename else os.path.basename(filename)) + f":{line}"
    return None


class StepOps(TorchDispatchMode):
    """Counts aten ops by name, host syncs, Adam's ops and (``sites``) where each op came from."""

    def __init__(self, sites: bool) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.optimizer = 0
        self.sites: Counter[tuple[str, str, str]] | None = Counter() if sites else None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        frames = []
        frame = sys._getframe(1)
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        in_optimizer = any(OPTIMIZER in f.f_code.co_filename for f in frames)
        self.optimizer += in_optimizer
        if op_syncs(str(func), args, kwargs) and not in_optimizer:
            self.syncs[name] += 1
        if self.sites is not None and not in_optimizer:
            self.sites[self._where(frames, name)] += 1
        return func(*args, **kwargs)

    @staticmethod
    def _where(frames: list, name: str) -> tuple[str, str, str]:
        """(phase, op, site) of an op dispatched under ``frames`` (innermost first)."""
        node = torch._C._current_autograd_node()
        phase = "forward" if node is None else "backward"
        for f in frames:
            site = _site(f.f_code.co_filename, f.f_lineno)
            if site is not None and "bench/host_syncs.py" not in site:
                return phase, name, site
        if node is not None:        # autograd's own derivative of a torch op: its forward's line
            record = "".join(node.metadata.get("traceback_", ()))
            lines = [line.split('"')[1:3] for line in record.splitlines() if line.strip().startswith("File")]
            for filename, rest in reversed(lines):
                site = _site(filename, int(rest.split("line")[1].split(",")[0]))
                if site is not None and "bench/host_syncs.py" not in site:
                    return phase, name, f"{type(node).__name__} of {site}"
            return phase, name, type(node).__name__
        return phase, name, "the step (loss)"


def count(model: torch.nn.Module, batches: list, graphs: int, warmup: int, steps: int, sites: bool) -> StepOps:
    """The ops of ``steps`` training steps after ``warmup`` ones, a new batch each (the
    Triton backend made the default by the caller: `triton_by_default`)."""
    step = graph_batches.step_fn(model.train(), batches, graphs)
    for _ in range(warmup):
        step()
    counter = StepOps(sites)
    with torch.autograd.set_detect_anomaly(sites, check_nan=False):
        for _ in range(steps):
            reads = HostSyncCounter()        # for .tolist() and .numpy(), which dispatch no op on the CPU
            with reads, counter:
                step()
            for name, n in reads.syncs.items():
                if name.startswith("Tensor."):
                    counter.syncs[name] += n
    return counter


def summary(counter: StepOps, steps: int) -> dict[str, float]:
    """Per step: ops, views among them, Adam's ops, host syncs."""
    total = sum(counter.ops.values())
    views = sum(n for name, n in counter.ops.items() if name in VIEWS)
    return {"ops": total / steps, "views": views / steps, "optimizer": counter.optimizer / steps,
            "syncs": sum(counter.syncs.values()) / steps}


def step_counts(name: str, graphs: int, hidden: int, layers: int, warmup: int, steps: int,
                sites: bool = False) -> dict[str, StepOps]:
    """{"gnnfuse": ..., "pyg": ...}: `count` of model ``name``'s steps on each side, from
    the same weights, on the same batches (made here, on the CPU), ``sites`` for gnnfuse."""
    batches = graph_batches.molecule_batches(warmup + steps, graphs, torch.device("cpu"))
    # a graph kept by the index cache from an earlier model's steps on these batches has
    # had its backward: no first pass (small graphs are kept by their contents)
    clear_index_cache()
    torch.manual_seed(0)
    ours, theirs = graph_batches.make_pair(name, hidden, layers, torch.device("cpu"))
    with triton_by_default():
        return {label: count(model, batches, graphs, warmup, steps, sites and label == "gnnfuse")
                for label, model in (("gnnfuse", ours), ("pyg", theirs))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=graph_batches.comma_list(graph_batches.MODELS),
                        default=list(graph_batches.MODELS))
    parser.add_argument("--graphs", type=int, default=128, help="graphs per batch (default 128)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="measured steps (default 2)")
    parser.add_argument("--sites", type=int, default=0, help="list gnnfuse's N busiest source lines (default 0)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = ["| model | gnnfuse ops | PyG ops | gnnfuse views | PyG views | Adam's ops (each) "
            "| gnnfuse syncs | PyG syncs |", "|---|---|---|---|---|---|---|---|"]
    for name in args.models:
        counters = step_counts(name, args.graphs, args.hidden, args.layers, args.warmup, args.steps, args.sites > 0)
        ours_n, theirs_n = (summary(counters[k], args.steps) for k in ("gnnfuse", "pyg"))
        rows.append(f"| {name} | {ours_n['ops']:.0f} | {theirs_n['ops']:.0f} | {ours_n['views']:.0f} "
                    f"| {theirs_n['views']:.0f} | {ours_n['optimizer']:.0f} | {ours_n['syncs']:.0f} "
                    f"| {theirs_n['syncs']:.0f} |")
        sites = counters["gnnfuse"].sites
        if sites:
            print(f"\n{name}, gnnfuse: ops per step by module")
            modules: Counter[tuple[str, str]] = Counter()
            for (phase, _, site), n in sites.items():
                modules[phase, site.rsplit(":", 1)[0]] += n
            for (phase, module), n in modules.most_common():
                print(f"  {n / args.steps:6.1f}  {phase:8s} {module}")
            print(f"{name}, gnnfuse: the {args.sites} busiest lines")
            for (phase, op, site), n in sites.most_common(args.sites):
                print(f"  {n / args.steps:6.1f}  {phase:8s} {op:24s} {site}")
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
