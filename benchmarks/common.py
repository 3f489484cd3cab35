"""Helpers shared by the benchmark scripts: devices, environment records, result files.

Kept in one place so both scripts time, label and merge results the same way; the
scripts import it as a sibling module (``python benchmarks/<script>.py`` puts this
folder on ``sys.path``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

# Timing, memory and failure handling live in the package (one implementation, also
# behind `gnnfuse bench`); re-exported for bench_aggregate.py.
from gnnfuse.bench import failure_status, free_memory, guarded, summarize, synchronize, time_calls  # noqa: F401
from gnnfuse.bench.environment import environment  # noqa: F401 - the scripts' run records

REPO_ROOT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    """Print one progress line at once, so a killed or piped run still shows how far it got."""
    print(message, flush=True)


def warn(message: str) -> None:
    """A banner on stdout and stderr: a failed correctness check must not scroll by unseen."""
    banner = f"\n{'!' * 78}\n!!! {message}\n{'!' * 78}\n"
    print(banner, flush=True)
    print(banner, file=sys.stderr, flush=True)


def resolve_device(name: str) -> torch.device:
    """The requested device; fails early instead of benchmarking the CPU by accident."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}, but CUDA is not available to torch {torch.__version__}")
    return device


















def new_run_id() -> str:
    """A sortable id naming one invocation; cells point at it for their environment."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def load_results(path: Path) -> dict[str, Any]:
    """The accumulated results, or an empty skeleton if none were written yet."""
    if path.is_file():
        return json.loads(path.read_text())
    return {"runs": {}, "cells": {}}


def prune_runs(results: dict[str, Any]) -> None:
    """Drop environments no stored entry refers to any more (all their cells re-run)."""
    used = {entry["run"] for key, section in results.items() if key != "runs" and isinstance(section, dict)
            for entry in section.values() if isinstance(entry, dict) and "run" in entry}
    results["runs"] = {rid: env for rid, env in results["runs"].items() if rid in used}


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a run killed mid-write (the device
    machine's time limit) leaves the previous complete file, never a truncated one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_json(path: Path, results: dict[str, Any]) -> None:
    write_atomically(path, json.dumps(results, indent=1, sort_keys=True) + "\n")


def results_saver(path: Path, markdown: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], None]:
    """A function writing a run's results to ``path`` (JSON) and its Markdown table beside
    it (``.md``), both atomically: called after every cell, so a run cut off by a time
    limit keeps what it measured. Results that keep ``runs`` lose those no entry refers
    to (`prune_runs`) first, so the file names only the runs its cells came from."""
    def save(results: dict[str, Any]) -> None:
        if "runs" in results:
            prune_runs(results)
        write_atomically(path, json.dumps(results, indent=1, default=str) + "\n")
        write_atomically(path.with_suffix(".md"), markdown(results))
    return save


def device_names(results: dict[str, Any], entries: list[dict[str, Any]]) -> list[str]:
    """Distinct device names the given cells were measured on, via their runs."""
    return sorted({results["runs"][e["run"]]["device_name"] for e in entries})


def runs_markdown(results: dict[str, Any]) -> list[str]:
    """One bullet per run whose cells are in the file: device, versions, commit, date.

    Results accumulate across invocations, possibly on different machines; a loud note
    when they do, because ratios across devices mean nothing.
    """
    lines = []
    for rid, env in sorted(results["runs"].items()):
        commit = (env["git_commit"] or "unknown")[:12] + (" (dirty)" if env["git_dirty"] else "")
        lines.append(f"- run `{rid}`: {env['device_name']}; torch {env['torch']}, triton "
                     f"{env['triton']}, torch_geometric {env['torch_geometric']}; commit {commit}; "
                     f"{env['date']}")
    if len({env["device_name"] for env in results["runs"].values()}) > 1:
        lines.append("")
        lines.append("**Warning: these results come from more than one device; ratios are only "
                     "given where all cells of a row share one.**")
    return lines


def check_failed(err: float | None, limit: float) -> bool:
    """Whether a measured error shows the result wrong: above ``limit``, or NaN (which no
    ``err > limit`` catches). None (not checked, or the oracle itself) is not a failure.
    A speed-up beside a failed check times something else than the peer computes, so the
    tables give none there."""
    return err is not None and not err <= limit


def fail_mark(err: float | None, limit: float) -> str:
    """The tables' `` **FAIL**`` after an error that `check_failed`, else nothing."""
    return " **FAIL**" if check_failed(err, limit) else ""


def worst_error(errors: Iterable[float]) -> float | None:
    """The largest error, NaN before any number (``max`` keeps whichever of NaN and a
    number comes first, so a NaN gradient beside a good output would pass); None if none."""
    errors = list(errors)
    return next((e for e in errors if e != e), max(errors, default=None))


def fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def add_step_arguments(parser: argparse.ArgumentParser, warmup_note: str = "",
                       cell_timeout_help: str = "seconds one measurement may take; past it the cell is "
                                                "recorded as a time-out") -> None:
    """The options every training-step benchmark takes: how many steps, the per-cell
    time limit, the device and where the real data sets are."""
    parser.add_argument("--steps", type=int, default=20, help="timed steps per cell (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help=f"untimed steps first (default 5{warmup_note})")
    parser.add_argument("--cell-timeout", type=float, default=None, help=cell_timeout_help)
    add_device_arguments(parser)


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """The device and data-root options every driver shares."""
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-root", help="folder of the real data sets (default: $GNNFUSE_DATA, "
                                            "then ../shared/data)")


def check_methods(parser: argparse.ArgumentParser, methods: list[str], known: tuple[str, ...]) -> None:
    """A usage error naming any method not in ``known``."""
    unknown = [m for m in methods if m not in known]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(known)}")


def parse_step_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def load_data_or_exit(name: str, data_root: str | None, device: torch.device) -> Any:
    """`gnnfuse.bench.load_data`, with a data set that cannot be loaded ending the run with
    its message instead of a traceback."""
    from gnnfuse.bench import load_data
    try:
        return load_data(name, data_root, device, log)
    except ValueError as error:
        raise SystemExit(str(error)) from error


def replayed_calls(call: Callable[[], Any], graph_calls: int, warmup: int, repeats: int,
                   device: torch.device) -> tuple[dict[str, float] | None, Any, str | None]:
    """``call`` timed replayed from a CUDA graph holding ``graph_calls`` calls of it
    (`StepCapture`, after ``warmup`` eager calls), ``repeats`` replays: the per-call
    `summarize` statistics, the graph's last output, and None -- or (None, None, the
    reason) when the capture was refused. Kernel time only: no host work per call."""
    from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning, StepCapture

    def calls() -> Any:
        for _ in range(graph_calls - 1):
            call()
        return call()
    step = StepCapture(calls, mode="on", copy_outputs=False, warmup=warmup, name="replayed calls")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)     # the reason is returned
        for _ in range(warmup):
            step()
    if not step.captured:
        return None, None, step.reason
    replays = summarize(time_calls(step, repeats, device))
    return {key: value / graph_calls for key, value in replays.items()}, step(), None

