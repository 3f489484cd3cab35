"""One comparison: gnnfuse against PyG eager and compiled on one data set, as a report, a table and a plot."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from .environment import environment
from .measure import REL_ERR_LIMIT, check_forward, guarded, measure, prime_capture_stream
from .models import FRAMEWORKS, KNOWN_FRAMEWORKS, MissingDependency, load_data, reference_state, require_pyg


def run_bench(model: str = "gcn", dataset: str = "cora", device: str | torch.device = "cpu",
              frameworks: tuple[str, ...] = FRAMEWORKS, steps: int = 20, warmup: int = 5,
              root: str | None = None, log: Callable[[str], None] = print,
              cuda_graph: str = "auto") -> dict[str, Any]:
    """Compare `frameworks` on one model and data set; returns a JSON-ready dict with the
    forward check (``check``), one entry per framework (``results``), gnnfuse's
    speedup and memory ratio against each other framework (``ratios``) and the machine,
    versions and commit the numbers came from (``environment``). ``cuda_graph``
    is the capture mode of gnnfuse's training step (`measure`).

    The capture stream's cuBLAS workspaces are made before the first framework
    (`prime_capture_stream`): made in gnnfuse's warm-up they stay allocated, so a
    framework measured after gnnfuse counted them in its peak and one measured before
    it did not, and the memory ratio depended on the order of ``frameworks``."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} requested, but CUDA is not available to torch {torch.__version__}")
    unknown = [f for f in frameworks if f not in KNOWN_FRAMEWORKS]
    if unknown or not frameworks:
        raise ValueError(f"frameworks must be a non-empty subset of {KNOWN_FRAMEWORKS}, got {list(frameworks)}")
    repeated = next((f for n, f in enumerate(frameworks) if f in frameworks[:n]), None)
    if repeated is not None:      # timed twice, the report keeping the last timing as the only one
        raise ValueError(f"frameworks lists {repeated!r} twice, got {list(frameworks)}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if warmup < 0:
        raise ValueError(f"warmup must be at least 0, got {warmup}")
    require_pyg()
    data = load_data(dataset, root, device, log)
    state = reference_state(model, data)
    prime_capture_stream(device)
    check = guarded(lambda: {"status": "ok", "max_rel_err": check_forward(model, data, state, device)}, device)
    check["agrees"] = check.get("max_rel_err") is not None and check["max_rel_err"] <= REL_ERR_LIMIT
    results = {}
    for framework in frameworks:
        results[framework] = guarded(lambda: measure(framework, model, data, state, steps, warmup, device,
                                                     cuda_graph=cuda_graph), device)
        log(f"[{dataset}] {model} {framework}: {results[framework]['status']}")
    return {"model": model, "dataset": dataset, "device": str(device), "num_nodes": data.num_nodes,
            "num_edges": data.edge_index.shape[1], "steps": steps, "rel_err_limit": REL_ERR_LIMIT,
            "check": check, "results": results, "ratios": ratios(results, check["agrees"]),
            "environment": environment(device)}


def ratios(results: dict[str, dict[str, Any]], agrees: bool) -> dict[str, dict[str, float | None]]:
    """Per other framework: ``speedup`` (its median / gnnfuse's) and ``memory`` (gnnfuse's
    peak / its peak); None where either failed, memory was not measured, or the forward
    check did not pass (``agrees`` False): a step that computes something else, or one
    whose agreement is unknown, is no speedup to report."""
    ours = results.get("gnnfuse", {})
    out = {}
    for name, theirs in results.items():
        if name == "gnnfuse":
            continue
        ok = agrees and ours.get("status") == theirs.get("status") == "ok"
        out[name] = {"speedup": theirs["median_ms"] / ours["median_ms"] if ok else None,
                     "memory": ours["peak_gb"] / theirs["peak_gb"]
                     if ok and ours.get("peak_gb") and theirs.get("peak_gb") else None}
    return out


def format_table(report: dict[str, Any]) -> str:
    """The result as a fixed-width table, with the forward check above it."""
    check = report["check"]
    err = check.get("max_rel_err")
    verdict = (f"max rel err {err:.2e} ({'agree' if check['agrees'] else 'DISAGREE'}, limit "
               f"{report['rel_err_limit']:g})" if err is not None else check["status"])
    width = max(12, *map(len, report["results"]))     # pyg-compile-ro is 14 characters long
    lines = [f"{report['model']} on {report['dataset']} ({report['num_nodes']:,} nodes, {report['num_edges']:,} "
             f"edges), {report['device']}, median of {report['steps']} training steps",
             _machine_line(report.get("environment")),
             f"forward check gnnfuse vs pyg: {verdict}", "",
             f"{'framework':<{width}} {'status':<8} {'median ms':>10} {'peak memory':>12} "
             f"{'speedup':>9} {'mem ratio':>10}"]
    for name, cell in report["results"].items():
        ok = cell["status"] == "ok"
        ratio = report["ratios"].get(name, {})
        peak = "n/a" if not ok or cell["peak_gb"] is None else f"{cell['peak_gb']:.3f} GB"
        lines.append(f"{name:<{width}} {cell['status'] if ok else 'failed':<8} "
                     f"{cell['median_ms'] if ok else float('nan'):>10.2f} {peak:>12} "
                     f"{_ratio(ratio.get('speedup'), name):>9} {_ratio(ratio.get('memory'), name):>10}")
    failures = [f"{name}: {cell['status']}" for name, cell in report["results"].items() if cell["status"] != "ok"]
    notes = ["", "speedup = framework median / gnnfuse median; mem ratio = gnnfuse peak / framework peak"]
    if not check["agrees"]:
        notes.append("speedup and mem ratio: n/a, the forward check did not pass")
    if report["device"].startswith("cpu"):
        notes.append("peak memory: n/a on CPU (only the CUDA allocator tracks the timed steps alone)")
    if "cuda_graph" in report["results"].get("gnnfuse", {}):
        notes.append(f"CUDA graph of gnnfuse's training step: {report['results']['gnnfuse']['cuda_graph']}")
    return "\n".join(lines + notes + failures) + "\n"


def _machine_line(env: dict[str, Any] | None) -> str:
    """Where the numbers came from: device, threads, backend, the torch, PyG and gnnfuse
    versions and the commit (``dirty``: tracked files differed from it). A report saved
    before threads and backend were recorded leaves them out. PyG's version, which the
    README says this line names, was left out: the baselines' numbers move with it."""
    if env is None:
        return "machine: not recorded"
    commit = (env["git_commit"] or "unknown")[:12] + (" (dirty)" if env["git_dirty"] else "")
    setup = (f", {env['threads']} CPU thread(s), gnnfuse backend {env['backend']}" if "threads" in env else "")
    return (f"machine: {env['device_name']}{setup}; torch {env['torch']}; PyG {env.get('torch_geometric')}; "
            f"gnnfuse {env['gnnfuse']}, commit {commit}")


def _ratio(value: float | None, name: str) -> str:
    return "-" if name == "gnnfuse" else ("n/a" if value is None else f"{value:.2f}x")


def figure_class() -> Any:
    """matplotlib's `Figure`, or `MissingDependency` saying how to get it: `plot` needs it,
    and ``gnnfuse bench --plot`` asks before timing, since a missing matplotlib surfaced
    only after every framework was timed, as a traceback."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependency("--plot needs matplotlib: pip install matplotlib") from exc
    return Figure


def plot(report: dict[str, Any], path: str | Path) -> Path:
    """A bar chart of median step time per framework (and peak memory where measured)."""
    Figure = figure_class()
    ok = {name: cell for name, cell in report["results"].items() if cell["status"] == "ok"}
    with_memory = {name: cell["peak_gb"] for name, cell in ok.items() if cell["peak_gb"] is not None}
    fig = Figure(figsize=(9 if with_memory else 5, 3.5))
    axes = fig.subplots(1, 2 if with_memory else 1, squeeze=False)[0]
    axes[0].bar(list(ok), [cell["median_ms"] for cell in ok.values()], color="#4a7fb5")
    axes[0].set_ylabel("median training step (ms)")
    if with_memory:
        axes[1].bar(list(with_memory), list(with_memory.values()), color="#d98c3f")
        axes[1].set_ylabel("peak memory (GB)")
    fig.suptitle(f"{report['model']} on {report['dataset']} ({report['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)
