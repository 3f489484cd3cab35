"""GPU check of FeatGraph's templates (``gnnfuse.ops.gspmm`` / ``gsddmm``, issue 15): a
layer written as a user function through a template should compile to the same fused
Triton kernels as the equivalent ``gnnfuse.nn`` layer, so it should run at that layer's
speed.

For each graph and width it times forward + backward (median ms, from an idle GPU) of

- ``gcn``: ``nn.GCNConv(F, F)`` against the same maths as a template,
  ``gspmm(g_loops, lambda hs, nd: hs * nd, "sum", src=lin(x) * norm, dst=norm) + bias``;
- ``sage``: ``nn.SAGEConv(F, F, root_weight=False)`` against
  ``lin_l(gspmm(g, None, "mean", src=x))``;
- ``sddmm``: ``gsddmm(g, lambda xs, xd: (xs * xd).sum(-1, keepdim=True), src=x, dst=x)``
  against torch's gather (no ``nn`` layer computes a bare SDDMM),

with the template's output and input/weight gradients checked against the layer's
(max relative error; exits non-zero above 1e-4). Results merge into
``<out>/templates.json`` and ``templates.md``.

    python benchmarks/check_templates.py --datasets arxiv-like,products-like
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from gnnfuse import nn as gnn
from gnnfuse.bench import load_data
from gnnfuse.ops import gsddmm, gspmm

from common import (check_failed, environment, fail_mark, fmt, load_results, log, new_run_id, prune_runs,
                    resolve_device, runs_markdown, save_json, summarize, time_calls, warn, worst_error,
                    write_atomically)

TOLERANCE = 1e-4


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


def gcn_pair(graph: Any, width: int, device: torch.device) -> tuple[torch.nn.Module, Callable]:
    layer = gnn.GCNConv(width, width).to(device)
    looped = graph.add_self_loops()
    norm = looped.in_degrees().to(torch.float32).clamp_min(1).rsqrt().unsqueeze(1)

    def template(x: torch.Tensor) -> torch.Tensor:
        h = x @ layer.lin.weight.t()
        return gspmm(looped, lambda hs, nd: hs * nd, "sum", src=h * norm, dst=norm) + layer.bias
    return layer, template


def sage_pair(graph: Any, width: int, device: torch.device) -> tuple[torch.nn.Module, Callable]:
    layer = gnn.SAGEConv(width, width, aggr="mean", root_weight=False).to(device)
    return layer, lambda x: layer.lin_l(gspmm(graph, None, "mean", src=x))


def sddmm_pair(graph: Any, width: int, device: torch.device) -> tuple[Callable, Callable]:
    src, dst = graph.src, graph.dst
    return ((lambda x: (x[src] * x[dst]).sum(-1, keepdim=True)),
            lambda x: gsddmm(graph, lambda xs, xd: (xs * xd).sum(-1, keepdim=True), src=x, dst=x))


PAIRS = {"gcn": gcn_pair, "sage": sage_pair, "sddmm": sddmm_pair}


def forward_backward(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor,
                     params: list[torch.Tensor]) -> list[torch.Tensor]:
    out = fn(x)
    return [out.detach(), *torch.autograd.grad(out, [x, *params], grad)]


def run_cell(graph: Any, kernel: str, width: int, device: torch.device, repeats: int) -> dict[str, Any]:
    torch.manual_seed(0)
    peer, template = PAIRS[kernel](graph, width, device)
    is_layer = isinstance(peer, torch.nn.Module)
    params = list(peer.parameters()) if is_layer else []
    call_peer = (lambda x: peer(x, graph)) if is_layer else peer
    x = torch.randn(graph.num_nodes, width, device=device, requires_grad=True)
    grad = torch.randn_like(call_peer(x))
    expected = forward_backward(call_peer, x, grad, params)
    actual = forward_backward(template, x, grad, params)
    err = worst_error(rel_err(a, e) for a, e in zip(actual, expected))     # NaN anywhere is the worst
    times = {name: summarize(time_calls(lambda f=fn: forward_backward(f, x, grad, params), repeats, device))
             for name, fn in (("template", template), ("peer", call_peer))}
    return {"template_ms": times["template"]["median_ms"], "peer_ms": times["peer"]["median_ms"],
            "peer": "torch gather" if kernel == "sddmm" else f"gnnfuse.nn {type(peer).__name__}",
            "max_rel_err": err}


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Templates (gspmm / gsddmm) against the equivalent layer", "",
             "Forward + backward (input and weight gradients), median ms from an idle GPU; ratio = peer / "
             "template (1.00 = the template runs at the layer's speed), none beside a template whose output or "
             f"gradients differ from the peer's by more than {TOLERANCE:g} (**FAIL**). See "
             "benchmarks/check_templates.py.", "",
             *runs_markdown(results), "",
             "| graph | kernel | F | template ms | peer | peer ms | ratio | max rel err |",
             "|---|---|---|---|---|---|---|---|"]
    for key, cell in sorted(results["cells"].items()):
        graph, kernel, width = key.split("/")
        failed = check_failed(cell["max_rel_err"], TOLERANCE)
        ratio = None if failed else cell["peer_ms"] / cell["template_ms"]
        lines.append(f"| {graph} | {kernel} | {width} | {fmt(cell['template_ms'], '.3f')} | {cell['peer']} | "
                     f"{fmt(cell['peer_ms'], '.3f')} | {fmt(ratio, '.2f')} | "
                     f"{cell['max_rel_err']:.1e}{fail_mark(cell['max_rel_err'], TOLERANCE)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="arxiv-like,products-like")
    parser.add_argument("--kernels", default=",".join(PAIRS))
    parser.add_argument("--widths", default="64")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-root")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    path = args.out / "templates.json"
    results, run_id = load_results(path), new_run_id()
    results["runs"][run_id] = environment(device)
    failed = False
    for name in args.datasets.split(","):
        graph = load_data(name, args.data_root, device, log).gnnfuse_graph()
        for kernel in args.kernels.split(","):
            for width in map(int, args.widths.split(",")):
                cell = {**run_cell(graph, kernel, width, device, args.repeats), "run": run_id}
                results["cells"][f"{name}/{kernel}/{width}"] = cell
                log(f"[{name}] {kernel} F={width}: template {cell['template_ms']:.3f} ms, {cell['peer']} "
                    f"{cell['peer_ms']:.3f} ms, max rel err {cell['max_rel_err']:.1e}")
                if check_failed(cell["max_rel_err"], TOLERANCE):
                    warn(f"{name} {kernel} F={width}: the template differs from its peer by {cell['max_rel_err']:.1e}")
                    failed = True
                prune_runs(results)
                save_json(path, results)
                write_atomically(path.with_suffix(".md"), markdown(results))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
