"""Draw the mini-batch scaling curve of issue #18 from bench_distributed.py's results:
seeds per second against GPUs, features replicated and partitioned, beside the ideal
line through the one-GPU point, and each world size's epoch time.

Both runs must come from one machine (the benchmark runs one call per machine kind); the
partitioned run has no one-GPU cell of its own (one GPU holds every row), so its speed-ups
are taken against the replicated run's. A repeat of the replicated run from another call
(``--repeat``) is drawn against its own one-GPU cell, to show the spread between calls.

    python benchmarks/plot_scaling.py            # results/scaling_minibatch_*cuda.json -> results/scaling_cuda.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import REPO_ROOT

RESULTS = REPO_ROOT / "benchmarks" / "results"


def curve(path: Path) -> tuple[list[int], list[float], list[float]]:
    """(world sizes, seeds per second, full-epoch seconds) of one bench_distributed run."""
    worlds = json.loads(path.read_text())["worlds"]
    sizes = sorted(int(w) for w in worlds)
    return sizes, [worlds[str(w)]["seeds_per_s"] for w in sizes], [worlds[str(w)]["full_epoch_s"] for w in sizes]


def steps(path: Path) -> str:
    """How a run's training steps ran: replayed from CUDA graphs (``--cuda-graph``) or
    eagerly with DDP's hooks -- the one-GPU cell, and so every speed-up, differs by 2.5x."""
    return "replayed steps" if json.loads(path.read_text())["config"].get("cuda_graph") else "eager steps"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicated", type=Path, default=RESULTS / "scaling_minibatch_cuda.json")
    parser.add_argument("--partitioned", type=Path, default=RESULTS / "scaling_minibatch_partitioned_cuda.json")
    parser.add_argument("--repeat", type=Path, default=RESULTS / "scaling_minibatch_repeat_cuda.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "scaling_cuda.png")
    args = parser.parse_args(argv)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = json.loads(args.replicated.read_text())["environment"]
    replicated = curve(args.replicated)
    if replicated[0][0] != 1:
        raise SystemExit(f"{args.replicated} has no one-GPU cell to scale from")
    base = replicated[1][0]
    figure, (speed, epoch) = plt.subplots(1, 2, figsize=(10, 4))
    most = max(replicated[0])
    speed.plot([1, most], [1, most], ":", color="grey", label="ideal")
    runs = [(f"features replicated, {steps(args.replicated)}", replicated, base)]
    if args.partitioned.exists():
        runs.append(("features partitioned", curve(args.partitioned), base))
    if args.repeat.exists():
        repeat = curve(args.repeat)
        commit = json.loads(args.repeat.read_text())["environment"].get("git_commit")
        runs.append((f"replicated, {steps(args.repeat)}, another call ({commit})", repeat, repeat[1][0]))
    for label, (sizes, rates, epochs), base in runs:
        speed.plot(sizes, [r / base for r in rates], "o-", label=label)
        epoch.plot(sizes, epochs, "o-", label=label)
        for size, rate in zip(sizes, rates):
            speed.annotate(f"x{rate / base:.2f}", (size, rate / base), textcoords="offset points", xytext=(4, -12))
    speed.set(xlabel="GPUs", ylabel="speed-up (seeds/s against 1 GPU)", xticks=replicated[0])
    epoch.set(xlabel="GPUs", ylabel="epoch s (196,615 seeds)", xticks=replicated[0], ylim=(0, None))
    speed.legend()
    epoch.legend()
    figure.suptitle(f"GraphSAGE 3x256, fanouts 15,10,5, 1024 seeds per GPU, products-like; "
                    f"{env.get('device_name')}, commit {env.get('git_commit')}", fontsize=9)
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
