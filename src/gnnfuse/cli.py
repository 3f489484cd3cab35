"""The ``gnnfuse`` command: inspect a data set (`info`), train a model on it (`train`), show
what the compiler makes of a model (`explain`) or time it against PyG (`bench`)."""
from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from . import bench, cli_explain
from .data import DATASET_NAMES, DEFAULT_DATASET, NodeDataset, RelationalDataset, load_dataset, random_split
from .graph import Graph
from .nn.reference import GCN

MODELS = ("gcn",)
SPARSE_FEATURES = 0.1      # feature matrices with fewer non-zeros than this go in as sparse COO


def build_model(name: str, in_dim: int, hidden: int, out_dim: int, dropout: float) -> nn.Module:
    """The model `train` runs: a module called as ``model(x, graph)``, where `x` is dense
    or, for mostly-zero features, a sparse COO tensor.

    The single place that maps a model name to an implementation, so compiled layers
    can replace the plain-PyTorch reference without touching the training loop.
    """
    if name == "gcn":
        return GCN(in_dim, hidden, out_dim, dropout)
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


# --- info ------------------------------------------------------------------------------
def degree_summary(graph: Graph) -> list[str]:
    """Human-readable in-degree statistics: skew is what decides kernel load balance."""
    degrees = graph.in_degrees().cpu().numpy()
    isolated = int(((graph.in_degrees() + graph.out_degrees()) == 0).sum())
    if degrees.size == 0:
        return ["in-degree   (no nodes)"]
    percentiles = ", ".join(f"p{q:g} {np.percentile(degrees, q):g}" for q in (90, 99, 99.9))
    return [f"in-degree   min {degrees.min()}, median {np.median(degrees):g}, "
            f"mean {degrees.mean():.2f}, max {degrees.max()}",
            f"percentiles {percentiles}",
            f"isolated    {isolated} nodes (no in- or out-edges)"]


def describe(dataset: NodeDataset | RelationalDataset) -> list[str]:
    graph = dataset.graph
    lines = [f"{dataset.name}: {dataset.description}",
             f"nodes       {graph.num_nodes}",
             f"edges       {graph.num_edges}"]
    if isinstance(dataset, RelationalDataset):
        lines += [f"relations   {graph.num_edge_types}",
                  f"triples     train {len(dataset.train_triples)} / valid "
                  f"{len(dataset.valid_triples)} / test {len(dataset.test_triples)}"]
    else:
        lines += [f"features    {dataset.num_features}" + (" (partial: random stand-ins)"
                                                           if dataset.features_partial else ""),
                  f"classes     {dataset.num_classes}"]
        if dataset.train_mask is None:
            lines.append("split       none")
        else:
            lines.append(f"split       train {int(dataset.train_mask.sum())} / val "
                         f"{int(dataset.val_mask.sum())} / test {int(dataset.test_mask.sum())}")
    return lines + degree_summary(graph)


def run_info(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    print("\n".join(describe(load_dataset(args.dataset, args.root))))
    return 0


# --- train -----------------------------------------------------------------------------
def peak_memory_mib(device: torch.device) -> float:
    """Peak CUDA allocation on GPU; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10   # bytes vs KiB


def accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return (logits[mask].argmax(dim=1) == y[mask]).float().mean().item() if mask.any() else float("nan")


class UsageError(Exception):
    """A bad combination of options, reported as an argparse usage error (exit status 2)."""


def train(args: argparse.Namespace) -> dict[str, float]:
    """Train `args.model` on `args.dataset`, logging every epoch; returns the metrics.

    Returns best_val_acc, test_acc (at the best validation epoch), best_epoch and
    total_s, so tests and benchmarks can use the numbers without parsing output.
    """
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device cuda, but CUDA is not available to this torch ({torch.__version__})")
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    dataset = load_dataset(args.dataset, args.root)
    if not isinstance(dataset, NodeDataset):
        raise UsageError(f"{args.dataset} is not a node-classification data set")
    if dataset.train_mask is None:
        dataset = random_split(dataset, seed=args.seed)
        print(f"{dataset.name} has no split: using random_split(seed={args.seed})")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    graph = dataset.graph.to(device)
    x, y = dataset.x.to(device), dataset.y.to(device)
    if x.count_nonzero() < SPARSE_FEATURES * x.numel():
        # bag-of-words features (cora: 1.3% non-zero): dropout and the first matmul then
        # touch only the non-zeros, ~8x less work in what dominated a dense cora epoch
        x = x.to_sparse()
    masks = [m.to(device) for m in (dataset.train_mask, dataset.val_mask, dataset.test_mask)]
    model = build_model(args.model, dataset.num_features, args.hidden, dataset.num_classes,
                        args.dropout).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    print(f"training {args.model} on {dataset.name} ({graph.num_nodes} nodes, {graph.num_edges} edges) "
          f"on {device}")

    best_val, test_at_best, best_epoch = -1.0, float("nan"), 0
    start = time.perf_counter()
    progress = tqdm(range(1, args.epochs + 1), desc="train", unit="epoch", file=sys.stderr)
    for epoch in progress:
        epoch_start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x, graph)[masks[0]], y[masks[0]])
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_ms = (time.perf_counter() - epoch_start) * 1e3      # the training step only
        model.eval()
        with torch.no_grad():
            logits = model(x, graph)
        train_acc, val_acc, test_acc = (accuracy(logits, y, m) for m in masks)
        if val_acc > best_val:
            best_val, test_at_best, best_epoch = val_acc, test_acc, epoch
        progress.set_postfix(loss=f"{loss.item():.4f}", val=f"{val_acc:.4f}", test=f"{test_acc:.4f}")
        tqdm.write(f"epoch {epoch:4d} | loss {loss.item():.4f} | train {train_acc:.4f} | val {val_acc:.4f}"
                   f" | test {test_acc:.4f} | {epoch_ms:7.1f} ms | peak {peak_memory_mib(device):.0f} MiB",
                   file=sys.stdout)
    progress.close()
    return {"best_val_acc": best_val, "test_acc": test_at_best, "best_epoch": best_epoch,
            "total_s": time.perf_counter() - start}


def run_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        result = train(args)
    except UsageError as error:
        parser.error(str(error))                      # prints usage, exits with status 2
    print(f"summary: best val acc {result['best_val_acc']:.4f} (epoch {result['best_epoch']}), "
          f"test acc at best val {result['test_acc']:.4f}, total time {result['total_s']:.2f} s")
    return 0


# --- entry point -----------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gnnfuse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    root_help = "data folder (default: $GNNFUSE_DATA, then ../shared/data)"

    info = commands.add_parser("info", help="print size, split and degree statistics of a data set")
    info.add_argument("dataset", help=f"one of: {', '.join(DATASET_NAMES)}")
    info.add_argument("--root", help=root_help)
    info.set_defaults(run=run_info)

    train = commands.add_parser("train", help="train a 2-layer GNN for node classification")
    train.add_argument("--model", default="gcn", choices=MODELS)
    train.add_argument("--dataset", default=DEFAULT_DATASET, help=f"one of: {', '.join(DATASET_NAMES)}")
    train.add_argument("--epochs", type=int, default=200)
    train.add_argument("--hidden", type=int, default=16)
    train.add_argument("--lr", type=float, default=0.01)
    train.add_argument("--weight-decay", type=float, default=5e-4)
    train.add_argument("--dropout", type=float, default=0.5)
    train.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--root", help=root_help)
    train.set_defaults(run=run_train)

    explain = commands.add_parser("explain", help="show fused units, memory traffic and kernels of a model")
    cli_explain.add_arguments(explain)
    explain.set_defaults(run=cli_explain.run_command)
    bench_cmd = commands.add_parser("bench", help="time training steps against PyG (eager and compiled)")
    bench.add_arguments(bench_cmd)
    bench_cmd.set_defaults(run=bench.run_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (usage errors exit with 2)."""
    parser = _parser()
    args = parser.parse_args(argv)
    return args.run(args, parser)
