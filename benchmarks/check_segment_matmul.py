"""GPU check of the Triton segment matmul (backend/triton/segment_matmul.py): correctness
against float64 torch and timing against the torch loop it replaces and against torch's
own grouped GEMMs.

For each shape (rows, types, in, out) -- row counts of the compact (vertex, relation)
pairs of the AIFB..AM-sized presets, types skewed as in a KG (Zipf, the `relation_skew`
of gnnfuse.data.typed) -- and each dtype (float32 in IEEE and in tf32, bfloat16) it
checks, against the same maths in float64:

- forward ``out[i] = x[i] @ W[type(i)]``,
- the input gradient (the forward kernel with W transposed, as autodiff emits it),
- the weight gradient ``sum_i outer(x[i], g[i])`` per type,

and times each kernel (median of ``--repeats``) against ``typed_matmul``'s torch loop (one
GEMM per type, what the Triton backend ran before), ``torch._grouped_mm`` (needs rows
sorted by type and, on most builds, bf16) and ``pyg_lib.ops.segment_matmul`` when those
are importable. The grouped GEMMs get their rows already sorted by type (their sort is not
timed); the segment matmul gathers rows through the type order, as it does in gnnfuse.

Exits non-zero when a check fails. Results merge into ``<out>/segment_matmul.json`` (cells
keyed shape/widths/dtype) and ``<out>/segment_matmul.md`` is rewritten after every cell.

    python benchmarks/check_segment_matmul.py --shapes aifb-like,mutag-like,bgs-like
    python benchmarks/check_segment_matmul.py --shapes am-like
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from gnnfuse.backend.triton.segment_matmul import segment_matmul, segment_matmul_tn
from gnnfuse.data.typed import relation_skew
from gnnfuse.ir.ops.typed import RowGroups, group_rows, typed_matmul, typed_matmul_tn

from common import (environment, fmt, load_results, log, new_run_id, prune_runs, resolve_device, runs_markdown,
                    save_json, summarize, time_calls, warn, write_atomically)

# (name, rows, types): the compact pairs of the benchmark presets are about this many
SHAPES = (("aifb-like", 30_000, 90), ("mutag-like", 80_000, 46), ("bgs-like", 1_000_000, 206),
          ("am-like", 6_000_000, 266))
WIDTHS = ((16, 16), (64, 64), (128, 128))
# max |ours - exact| / max |exact| allowed per dtype (f32 IEEE is rounding only)
TOLERANCE = {"float32": 1e-5, "tf32": 5e-3, "bfloat16": 2e-2}


def rel_err(actual: torch.Tensor, exact: torch.Tensor) -> float:
    return ((actual.double() - exact).abs().max() / exact.abs().max().clamp_min(1e-30)).item()


def grouped(rows: int, types: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, RowGroups]:
    """Skewed row types and their groups as the graph caches hold them (`RowGroups`: the
    kernels' tile maps are built once, not timed)."""
    gen = torch.Generator().manual_seed(seed)
    kind = torch.multinomial(relation_skew(types), rows, replacement=True, generator=gen).to(device)
    return kind, group_rows(kind, types)


def timed(fn: Callable[[], Any], repeats: int, device: torch.device) -> dict[str, Any]:
    try:
        fn()
        return {"status": "ok", **summarize(time_calls(fn, repeats, device))}
    except Exception as exc:  # noqa: BLE001 - an unsupported baseline is recorded, not fatal
        return {"status": f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"}


def baselines(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, kind: torch.Tensor,
              groups: list[torch.Tensor]) -> dict[str, Callable[[], Any]]:
    """The forward and weight-gradient calls of every implementation, by name."""
    order = torch.cat(groups)
    x_sorted, g_sorted = x[order].contiguous(), g[order].contiguous()
    counts = torch.bincount(kind, minlength=w.shape[0])
    offs = counts.cumsum(0).to(torch.int32)
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    calls = {"segment_matmul fwd": lambda: segment_matmul(x, w, groups),
             "segment_matmul wgrad": lambda: segment_matmul_tn(x, g, groups),
             "torch loop fwd": lambda: typed_matmul(x, w, groups),
             "torch loop wgrad": lambda: typed_matmul_tn(x, g, groups),
             "torch._grouped_mm fwd (sorted)": lambda: torch._grouped_mm(x_sorted, w, offs=offs),
             "torch._grouped_mm wgrad (sorted)": lambda: torch._grouped_mm(
                 x_sorted.t(), g_sorted, offs=offs)}
    try:
        import pyg_lib
        calls["pyg_lib segment_matmul fwd (sorted)"] = lambda: pyg_lib.ops.segment_matmul(x_sorted, ptr, w)
    except ImportError:
        pass
    return calls


def check_shape(name: str, rows: int, types: int, k: int, n: int, dtype_name: str, device: torch.device,
                repeats: int) -> dict[str, Any]:
    dtype = torch.bfloat16 if dtype_name == "bfloat16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    kind, groups = grouped(rows, types, device)
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(rows, k, device=device, generator=gen).to(dtype)
    w = (torch.randn(types, k, n, device=device, generator=gen) / k ** 0.5).to(dtype)
    g = torch.randn(rows, n, device=device, generator=gen).to(dtype)
    x64, w64, g64 = x.double(), w.double(), g.double()
    errors = {"forward": rel_err(segment_matmul(x, w, groups), typed_matmul(x64, w64, groups)),
              "input grad": rel_err(segment_matmul(g, w.transpose(1, 2), groups),
                                    typed_matmul(g64, w64.transpose(1, 2), groups)),
              "weight grad": rel_err(segment_matmul_tn(x, g, groups), typed_matmul_tn(x64, g64, groups))}
    del x64, w64, g64
    times = {label: timed(fn, repeats, device) for label, fn in baselines(x, w, g, kind, groups).items()}
    torch.backends.cuda.matmul.allow_tf32 = False
    ok = all(e <= TOLERANCE[dtype_name] for e in errors.values())
    return {"shape": name, "rows": rows, "types": types, "in": k, "out": n, "dtype": dtype_name,
            "errors": errors, "ok": ok, "times": times}


def render(results: dict[str, Any]) -> str:
    cells = list(results["cells"].values())
    labels = sorted({label for cell in cells for label in cell["times"]})
    head = ["shape", "rows", "types", "in x out", "dtype", "max rel err (fwd / in-grad / w-grad)", *labels]
    lines = ["# Segment matmul (Triton) vs the torch loop and torch's grouped GEMMs", "",
             "Median ms per call. Errors are against the float64 torch loop. `(sorted)` baselines get rows "
             "already sorted by type; the segment matmul gathers through the type order.", "",
             *runs_markdown(results), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        errs = " / ".join(f"{cell['errors'][k]:.1e}" for k in ("forward", "input grad", "weight grad"))
        times = [fmt(cell["times"][lb].get("median_ms"), ".3f") if cell["times"].get(lb, {}).get("status") == "ok"
                 else cell["times"].get(lb, {}).get("status", "–")[:40] for lb in labels]
        lines.append("| " + " | ".join([cell["shape"], str(cell["rows"]), str(cell["types"]),
                                        f"{cell['in']}x{cell['out']}", cell["dtype"],
                                        errs + ("" if cell["ok"] else " **FAIL**"), *times]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    parser.add_argument("--dtypes", default="float32,tf32,bfloat16")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    # merged by (shape, widths, dtype) into what earlier calls stored, so several calls
    # (the device's 10-minute limit) fill one table; each cell names its run
    results = load_results(args.out / "segment_matmul.json")
    run_id = new_run_id()
    results["runs"][run_id] = environment(device)
    failed = False
    for name, rows, types in (s for s in SHAPES if s[0] in args.shapes.split(",")):
        for k, n in WIDTHS:
            for dtype_name in args.dtypes.split(","):
                cell = {**check_shape(name, rows, types, k, n, dtype_name, device, args.repeats), "run": run_id}
                results["cells"][f"{name}/{k}x{n}/{dtype_name}"] = cell
                failed |= not cell["ok"]
                log(f"{name} {k}x{n} {dtype_name}: errors {cell['errors']} "
                    + " ".join(f"{lb}={c.get('median_ms', c['status'])}" for lb, c in cell["times"].items()))
                if not cell["ok"]:
                    warn(f"{name} {k}x{n} {dtype_name}: segment matmul error above {TOLERANCE[dtype_name]}")
                prune_runs(results)
                save_json(args.out / "segment_matmul.json", results)
                write_atomically(args.out / "segment_matmul.md", render(results))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
