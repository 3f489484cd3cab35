"""A node classifier's loss on the GPU, forward and backward: torch's
``F.cross_entropy(out[idx], y[idx])`` against the kernels that
``gnnfuse.nn.functional.cross_entropy(out, y[idx], rows=idx)`` records in a captured step
(`backend.triton.cross_entropy`, called here through its autograd function in both
timings), at the sizes of the training benchmark's graphs (all rows' logits, the
training rows selected).

Each call is one loss and its gradient with respect to the whole logit matrix
(``torch.autograd.grad``), timed two ways, median of ``--repeats``: launched from Python
(`time_calls`: host time included, as an uncaptured training step pays it) and replayed
from a CUDA graph of ``--graph-calls`` calls (`StepCapture`; kernel time only, as in the
training benchmark's captured steps). Each cell also records the two losses' and
gradients' largest relative difference, and each method's replayed answer's against
torch's launched one: past `REL_ERR_LIMIT` (or NaN) a cell gets **FAIL** and no speed-up.

    PYTHONPATH=src:benchmarks python benchmarks/bench_loss.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from common import (check_failed, environment, fail_mark, load_results, new_run_id, replayed_calls, results_saver,
                    runs_markdown, worst_error)
from gnnfuse.bench import REL_ERR_LIMIT, extra_peak_gb, max_rel_err, summarize, time_calls
from gnnfuse.nn.cross_entropy import _SelectedCrossEntropy

# name: (rows, classes, training rows) -- ogbn-arxiv's, Reddit2's, ogbn-products' and
# ogbn-mag's sizes (mag: an R-GCN's output for every vertex, the training papers selected)
SIZES = {"arxiv-like": (169_343, 40, 90_941), "reddit2-like": (232_965, 41, 153_932),
         "products-like": (2_449_029, 47, 196_615), "mag-like": (1_939_743, 349, 441_833)}
METHODS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "torch": lambda out, y, idx: F.cross_entropy(out[idx], y),
    "gnnfuse": lambda out, y, idx: _SelectedCrossEntropy.apply(out, y, idx, -100, "mean"),
}


def loss_and_gradient(method: str, out: torch.Tensor, y: torch.Tensor, idx: torch.Tensor):
    def call() -> tuple[torch.Tensor, torch.Tensor]:
        loss = METHODS[method](out, y, idx)
        return loss, torch.autograd.grad(loss, out)[0]
    return call


def replayed(call: Callable[[], Any], graph_calls: int, repeats: int,
             device: torch.device) -> tuple[float | str, tuple[torch.Tensor, torch.Tensor] | None]:
    """The replayed call's median ms and its last answer, or why it was not captured and None."""
    stats, out, reason = replayed_calls(call, graph_calls, 2, repeats, device)
    if stats is None:
        return f"not captured: {reason}"[:200], None
    return stats["median_ms"], out


def rel_diffs(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    """(loss, gradient) relative differences: |a - b| / |b| and max|a - b| / max|b|."""
    (a, ga), (b, gb) = got, want
    return ((a - b).abs() / b.abs()).item(), max_rel_err(ga, gb)


def run_size(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    rows, classes, selected = SIZES[name]
    g = torch.Generator(device=device).manual_seed(0)
    out = (2 * torch.randn(rows, classes, device=device, generator=g)).requires_grad_()
    idx = torch.randperm(rows, device=device, generator=g)[:selected]
    y = torch.randint(0, classes, (selected,), device=device, generator=g)
    cell: dict[str, Any] = {"rows": rows, "classes": classes, "selected": selected}
    answers = {}
    for method in METHODS:
        call = loss_and_gradient(method, out, y, idx)
        # no graph through ``out`` outlives the call (not even in a local): it would keep
        # ``out``'s gradient accumulator, made on the default stream, and the replay's
        # capture would then make that stream wait on the capturing one, which CUDA refuses
        answers[method] = tuple([t.detach() for t in call()])
        for _ in range(3):
            call()
        launched_ms = summarize(time_calls(call, args.repeats, device))["median_ms"]
        replayed_ms, replayed_answer = replayed(call, args.graph_calls, args.repeats, device)
        cell[method] = {"launched_ms": launched_ms, "replayed_ms": replayed_ms,
                        "replayed_rel_diff": None if replayed_answer is None
                        else worst_error(rel_diffs(replayed_answer, answers["torch"])),
                        "peak_gb": extra_peak_gb(call, device)[1]}
    cell["loss_rel_diff"], cell["grad_rel_diff"] = rel_diffs(answers["gnnfuse"], answers["torch"])
    launched_wrong = check_failed(worst_error([cell["loss_rel_diff"], cell["grad_rel_diff"]]), REL_ERR_LIMIT)
    for kind in ("launched_ms", "replayed_ms"):
        ours, theirs = cell["gnnfuse"][kind], cell["torch"][kind]
        wrong = launched_wrong or (kind == "replayed_ms" and any(
            check_failed(cell[m]["replayed_rel_diff"], REL_ERR_LIMIT) for m in METHODS))
        cell[f"speedup_{kind[:-3]}"] = (theirs / ours if isinstance(ours, float) and isinstance(theirs, float)
                                        and not wrong else None)
    return cell


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Node-classification loss, forward + backward (GPU)", "",
             "torch: `F.cross_entropy(out[idx], y)`; gnnfuse: the kernels `gnnfuse.nn.functional.cross_entropy(out, "
             "y, rows=idx)` runs in captured steps, and launched from Python for selections of at least "
             "gnnfuse.nn.cross_entropy.LAUNCHED_ELEMENTS logits (torch's below); one call = the "
             "loss and its gradient for the whole [rows, classes] logits. launched: "
             "median of calls from Python (host time included); replayed: from a CUDA graph of several calls "
             "(kernel time). speed-up = torch / gnnfuse. peak GB: one launched call's allocations above what was "
             "allocated before it, its [rows, classes] gradient included (– in runs before it was recorded). "
             "rel diff: gnnfuse's launched loss and gradient against torch's; replayed: the worst of each "
             f"method's replayed answer against torch's launched one; **FAIL** above {REL_ERR_LIMIT:g} or NaN, "
             "and then no speed-up.", "",
             *runs_markdown(results), "",
             "| size | rows x classes, selected | torch launched ms | gnnfuse launched ms | speed-up | torch replayed "
             "ms | gnnfuse replayed ms | speed-up | peak GB torch / gnnfuse | loss / grad rel diff | replayed rel diff "
             "torch / gnnfuse |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def ms(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    def ratio(value: Any) -> str:
        return f"{value:.2f}x" if value else "–"

    def gb(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else "–"

    def diff(value: Any) -> str:
        return f"{value:.1e}{fail_mark(value, REL_ERR_LIMIT)}" if isinstance(value, float) else "–"
    for name, cell in results["cells"].items():
        lines.append(f"| {name} | {cell['rows']:,} x {cell['classes']}, {cell['selected']:,} | "
                     f"{ms(cell['torch']['launched_ms'])} | {ms(cell['gnnfuse']['launched_ms'])} | "
                     f"{ratio(cell['speedup_launched'])} | {ms(cell['torch']['replayed_ms'])} | "
                     f"{ms(cell['gnnfuse']['replayed_ms'])} | {ratio(cell['speedup_replayed'])} | "
                     f"{gb(cell['torch'].get('peak_gb'))} / {gb(cell['gnnfuse'].get('peak_gb'))} | "
                     f"{diff(cell['loss_rel_diff'])} / {diff(cell['grad_rel_diff'])} | "
                     f"{diff(cell['torch'].get('replayed_rel_diff'))} / "
                     f"{diff(cell['gnnfuse'].get('replayed_rel_diff'))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda s: s.split(","), default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--graph-calls", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    path = args.out / "loss.json"
    results = load_results(path)
    run_id = new_run_id()
    results["runs"][run_id] = environment(device)
    save = results_saver(path, markdown)
    for name in args.sizes:
        results["cells"][name] = {**run_size(name, args, device), "run": run_id}
        save(results)
        print(name, results["cells"][name], flush=True)
    return results


if __name__ == "__main__":
    main()
