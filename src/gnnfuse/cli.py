"""The ``gnnfuse`` command: inspect a data set (`info`), train a model on it (`train`), show
what the compiler makes of a model (`explain`), time it against PyG (`bench`) or find the
fastest schedule of each of its fused units (`tune`)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from typing import Sequence

import numpy as np
import torch

from . import bench, cli_explain
from .data import (DATASET_NAMES, DEFAULT_DATASET, LOAD_ERRORS, ROOT_HELP, NodeDataset, RelationalDataset,
                   check_node_dataset_name, load_dataset)
from .distributed import DistributedError, Rank, current, launch_or_join, world_size
from .distributed.launch import READER_LEFT, end_rank_now
from .distributed.fullgraph import PARTITIONED_MODELS
from .distributed.process_group import launched_by_torchrun
from .graph import Graph
from .nn.models import get_model, model_names
from .output_paths import replaced_outputs, unwritable_image, unwritable_output
from .runtime.compiled import backend_name
from .runtime.cuda_graph import MODES
from .runtime.settings_check import check_settings
from .threads import THREADS_ENV, configure_threads
from .tuning import command as tuning_command
from .training import (ConfigError, RunResult, TrainConfig, TrainingInterrupted, TrainSummary, make_config,
                       train_runs)
from .training.checkpoint import read_checkpoint
from .training.interrupt import INTERRUPTED
from .training.loop import held_while_saving, interrupted_result
from .training.config import FEATURE_PLACEMENTS


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
    try:
        dataset = load_dataset(args.dataset, args.root)
    except LOAD_ERRORS as error:
        parser.error(str(error))
    print("\n".join(describe(dataset)))
    return 0


# --- train -----------------------------------------------------------------------------
class UsageError(Exception):
    """A bad combination of options, reported as an argparse usage error (exit status 2)."""


def _model_epilog() -> str:
    """One line per runnable model with its paper defaults, for `gnnfuse train --help`."""
    lines = ["models (defaults from each paper; options override them):"]
    for name in model_names(task=None):
        spec = get_model(name)
        d = spec.defaults
        patience = "none" if d.patience is None else d.patience
        lines.append(f"  {name:14s} {spec.description}\n  {'':14s} hidden {d.hidden}, lr {d.lr:g}, "
                     f"weight decay {d.weight_decay:g}, dropout {d.dropout:g}, epochs {d.epochs}, "
                     f"patience {patience}")
    return "\n".join(lines)


def _task(model: str) -> str | None:
    """The task of a model name (None for an unknown name, which `make_config` reports)."""
    try:
        return get_model(model).task
    except (KeyError, ValueError):
        return None


def checked_config(args: argparse.Namespace) -> TrainConfig:
    """The run's `TrainConfig`, or a `UsageError` naming the bad option: checked before
    any data is read, and, with several ranks asked for, before they start (each rank
    would otherwise fail alike after loading the data, or -- a link model -- train the
    same run once per rank)."""
    problem = unwritable_output({"--save": args.save, "--plot": args.plot})
    if problem:
        raise UsageError(problem)
    if args.resume and not args.save:
        raise UsageError("--resume continues the --save checkpoint: give --save PT as well")
    if args.resume and not os.path.isfile(args.save):
        raise UsageError(f"--resume: {args.save} does not exist, so there is no checkpoint to resume")
    if args.plot and args.model and _task(args.model) == "link":
        raise UsageError(f"--plot draws node-classification curves; {args.model} is a link-prediction model")
    if args.plot:
        from .curves import require_matplotlib
        try:
            require_matplotlib()
        except ImportError as error:
            raise UsageError(f"--plot: {error}") from None
        problem = unwritable_image({"--plot": args.plot})
        if problem:
            raise UsageError(problem)
    try:
        config = make_config(args.model, args.dataset, runs=args.runs, seed=args.seed, device=args.device,
                             root=args.root, hidden=args.hidden, lr=args.lr, weight_decay=args.weight_decay,
                             dropout=args.dropout, epochs=args.epochs, patience=args.patience,
                             fanout=args.fanout, batch_size=args.batch_size, dkp=args.dkp, features=args.features,
                             loader_workers=args.num_workers)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    if _task(config.model) != "link":        # a link model's data set is checked by make_config
        try:
            check_node_dataset_name(config.dataset)
        except ValueError as error:
            raise UsageError(str(error)) from None
    ranks, flag = next(((count, f"{name} {count}") for name, count in (("--gpus", args.gpus),
                                                                      ("--cpu-ranks", args.cpu_ranks))
                        if count is not None), (None, ""))
    if ranks is None and launched_by_torchrun():
        ranks = int(os.environ["WORLD_SIZE"])
        flag = f"{ranks} ranks (WORLD_SIZE)"
    if args.resume:
        _check_resumed_ranks(args.save, ranks or 1, flag)
    if config.features == "partitioned" and (ranks is None or ranks == 1):
        raise UsageError("--features partitioned splits the feature table over several ranks; one process "
                         "holds all of it (give --gpus N or --cpu-ranks N)")
    if ranks is not None and ranks > 1:
        if _task(config.model) == "link":
            raise UsageError(f"{flag}: link-prediction models ({config.model}) train in one process; every rank "
                             "would train the same run")
        if config.fanout is None and config.model not in PARTITIONED_MODELS:
            raise UsageError(f"{flag} without --fanout trains on a partitioned full graph, which model "
                             f"{config.model!r} has no version of (partitioned models: "
                             f"{', '.join(PARTITIONED_MODELS)}); give a fanout for data-parallel mini-batches")
    return config


def _check_resumed_ranks(path: str, ranks: int, flag: str) -> None:
    """Refuse to resume a checkpoint trained on another number of ranks, before any rank
    starts: the stopped run's state holds one random state per rank, and one process and
    two train the same recipe to different numbers (partitioned graph, per-rank dropout
    streams), so the finished runs would not belong to this command's experiment."""
    try:
        saved = read_checkpoint(path).get("ranks")
    except ConfigError as error:
        raise UsageError(f"--resume: {error}") from None
    if saved is not None and saved != ranks:
        asked = flag or "1 process"
        again = (f" (--gpus {saved} or --cpu-ranks {saved}, or torchrun with {saved} processes)" if saved > 1
                 else " (without --gpus or --cpu-ranks)")
        raise UsageError(f"--resume: {path} was trained on {saved} rank(s), and {asked} would resume it on {ranks}; "
                         f"resume it on {saved}{again}")


def train(args: argparse.Namespace) -> TrainSummary:
    """Train `args.model` on `args.dataset` for `args.runs` seeds, logging every epoch.

    Options left unset take the model's paper defaults. Bad options raise `UsageError`
    before any training, including a missing matplotlib when `--plot` is given.
    """
    config = checked_config(args)
    patience = "none" if config.patience is None else config.patience
    print(f"training {config.model} on {config.dataset} on {config.device} ({torch.get_num_threads()} CPU "
          f"thread(s)): {config.runs} run(s), "
          f"up to {config.epochs} epochs, patience {patience}, hidden {config.hidden}, lr {config.lr:g}, "
          f"weight decay {config.weight_decay:g}, dropout {config.dropout:g}")
    if config.fanout is not None:
        workers = f", {config.loader_workers} loader worker process(es)" if config.loader_workers else ""
        print(f"mini-batch: fanout {','.join(map(str, config.fanout))} (hop 1 first), batch size "
              f"{config.batch_size}{workers}; held-out accuracy by full-neighbourhood inference")
    note = replaced_outputs({"--save": None if args.resume else args.save, "--plot": args.plot})
    if note:
        print(f"{note} (by a checkpoint once the first run finishes; a Ctrl-C before that keeps it as "
              f"{args.save}.previous; --resume continues one instead)"
              if args.save and not args.resume and os.path.isfile(args.save) else note)

    def report(index: int, run: RunResult) -> None:
        stopped = (f", stopped early at epoch {run.epochs_run}" if run.epochs_run < config.epochs else "")
        graph = f", training step {run.cuda_graph}" if config.device == "cuda" else ""
        print(f"run {index + 1}/{config.runs} (seed {run.seed}): best val {run.metric} {run.best_val_acc:.4f} "
              f"(epoch {run.best_epoch}), test {run.metric} at best val {run.test_acc:.4f}{stopped}, "
              f"{run.seconds:.2f} s{graph}")

    try:
        return train_runs(config, on_run=report, cuda_graph=args.cuda_graph, save_to=args.save, resume=args.resume,
                          log_epochs=not args.quiet)
    except ConfigError as error:           # data set kind or files, unavailable device
        raise UsageError(str(error)) from None


def run_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.gpus is not None or args.cpu_ranks is not None:
        try:
            checked_config(args)          # in this process, before the ranks start
        except UsageError as error:
            parser.error(str(error))
    try:
        status, args.device = launch_or_join(args.gpus, args.cpu_ranks, args.device, main, args.argv)
    except DistributedError as error:
        parser.error(str(error))
    if status is not None:                            # this process started the ranks; they trained
        return status
    rank = current()
    if rank.world_size > 1:                           # only rank 0 writes to stdout
        print(_ranks_banner(rank, args))
    try:
        summary = train(args)
    except UsageError as error:
        parser.error(str(error))                      # prints usage, exits with status 2
    except TrainingInterrupted as stopped:
        # a duplicate of the stopping signal (``timeout`` sends two; a busy machine reads
        # the second late) arriving while the curves and the resume hint are written ended
        # the process by SIGTERM's default action, without them: held, as while saving
        with held_while_saving(rank.world_size, quiet=True):
            status = interrupted(stopped, args) if rank.is_main else INTERRUPTED
        if rank.world_size > 1 and stopped.state is None and not stopped.between_runs:
            if not rank.is_main:      # rank 0 may not know: the signal may have reached this rank alone
                print(f"gnnfuse train: rank {rank.rank} of {rank.world_size} stopped at once by Ctrl-C in run "
                      f"{stopped.index + 1}/{stopped.summary.config.runs}; the run is not kept"
                      + (f": {stopped.reason}" if stopped.reason else ""), file=sys.stderr)
            end_rank_now(status)      # peers may wait in a collective with this rank (`end_rank_now`)
        return status
    if not rank.is_main:                              # files are written once, by rank 0
        return 0
    if args.save:                                     # written after every run (`train_runs`)
        print(f"saved best-val weights of {len(summary.runs)} run(s) and the config to {args.save}")
    if args.plot:
        from .curves import plot_curves
        plot_curves(summary, args.plot)
        print(f"saved learning curves to {args.plot}")
    test, test_std = summary.mean_std("test_acc")
    val, val_std = summary.mean_std("best_val_acc")
    total = sum(run.seconds for run in summary.runs)
    metric = summary.runs[0].metric
    print(f"summary: test {metric} {test:.4f} ± {test_std:.4f} over {len(summary.runs)} run(s) "
          f"(at the best val epoch; best val {metric} {val:.4f} ± {val_std:.4f}), total time {total:.2f} s")
    return 0


def interrupted(stopped: TrainingInterrupted, args: argparse.Namespace) -> int:
    """Ctrl-C during training: draw the curves so far, say what was kept and how to
    continue, and exit with `INTERRUPTED` -- not a KeyboardInterrupt traceback that left
    the user to guess whether --save and --plot had been written."""
    config, finished = stopped.summary.config, stopped.summary.runs
    seed = config.seed + stopped.index
    curves = finished + ([interrupted_result(stopped.state, seed)] if args.plot and stopped.state else [])
    if args.plot and curves:
        from .curves import plot_curves
        plot_curves(dataclasses.replace(stopped.summary, runs=curves), args.plot)
        print(f"saved learning curves of {len(finished)} finished run(s)"
              + (f" and of run {stopped.index + 1} up to its epoch {stopped.state['epoch']}" if stopped.state else "")
              + f" to {args.plot}")
    run = f"run {stopped.index + 1}/{config.runs} (seed {seed})"
    if stopped.between_runs:
        lines = [f"gnnfuse train: interrupted before {run}"]
    elif stopped.state is not None:
        lines = [f"gnnfuse train: interrupted in {run} after epoch {stopped.state['epoch']}"]
    else:
        lines = [f"gnnfuse train: interrupted in {run} during an epoch; that run's epochs are not kept"
                 + (f": {stopped.reason}" if stopped.reason else "")]
    kept = [f"the {len(finished)} finished run(s)"] if finished else []
    if stopped.state is not None:
        kept.append(f"run {stopped.index + 1}'s state after epoch {stopped.state['epoch']}")
    if not args.save:
        lines.append("nothing was saved (no --save); give --save PT to keep runs and continue them")
    elif not kept:
        lines.append(f"no run had finished, so {args.save} was not written")
    else:
        argv = [arg for arg in args.argv if arg != "--resume"]
        command = (f"torchrun <its options as now, {current().world_size} ranks> -m gnnfuse"
                   if launched_by_torchrun() and args.gpus is None and args.cpu_ranks is None else "gnnfuse")
        lines.append(f"{args.save} holds {' and '.join(kept)}; continue with:\n"
                     f"  {command} {shlex.join(argv)} --resume")
    print("\n".join(lines), file=sys.stderr)
    return INTERRUPTED


def _ranks_banner(rank: Rank, args: argparse.Namespace) -> str:
    """How the ranks split the work: data-parallel mini-batches with a fanout, else the
    partitioned full graph (where every rank keeps its own vertices' features, so
    ``--features`` does not apply)."""
    if args.fanout is not None:
        return f"data-parallel over {rank.world_size} ranks ({rank.backend}), features {args.features}"
    return f"full graph partitioned over {rank.world_size} ranks ({rank.backend}), each holding its vertices' features"


def _fanout(text: str) -> tuple[int, ...]:
    """``15,10,5`` -> (15, 10, 5), an argparse type (its errors are usage errors)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 15,10,5, got {text!r}") from None


# --- entry point -----------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gnnfuse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    threads = argparse.ArgumentParser(add_help=False)
    threads.add_argument("--threads", type=int, metavar="N",
                         help=f"torch CPU threads (default: ${THREADS_ENV}, else $OMP_NUM_THREADS or "
                              "$MKL_NUM_THREADS, else half the CPUs this process may use)")

    info = commands.add_parser("info", help="print size, split and degree statistics of a data set")
    info.add_argument("dataset", help=f"one of: {', '.join(DATASET_NAMES)}")
    info.add_argument("--root", help=ROOT_HELP)
    info.set_defaults(run=run_info, command_parser=info)

    train = commands.add_parser(
        "train", help="train a node-classification model, with early stopping, over several seeds",
        description="Train a registered model (paper hyperparameters unless overridden) and report the "
                    "test accuracy at the best validation epoch, mean ± std over --runs seeds.",
        epilog=_model_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter, parents=[threads])
    train.add_argument("--model", default="gcn", help=f"one of: {', '.join(model_names(task=None))} (default gcn)")
    train.add_argument("--dataset", default=DEFAULT_DATASET,
                       help=f"one of: {', '.join(DATASET_NAMES)} (default {DEFAULT_DATASET})")
    train.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    train.add_argument("--runs", type=int, default=1, help="seeds --seed, --seed+1, ... (default 1)")
    train.add_argument("--seed", type=int, default=0, help="first seed; also seeds the split of "
                       "data sets without one (default 0)")
    defaults = "(default: the model's)"
    train.add_argument("--epochs", type=int, help=f"most epochs per run {defaults}")
    train.add_argument("--patience", type=int, help="stop after this many epochs in which neither "
                       f"validation accuracy nor loss improved; 0 never stops early {defaults}")
    train.add_argument("--hidden", type=int, help=f"hidden width (per head for gat) {defaults}")
    train.add_argument("--lr", type=float, help=f"Adam learning rate {defaults}")
    train.add_argument("--weight-decay", type=float, help=f"L2 penalty {defaults}")
    train.add_argument("--dropout", type=float, help=f"dropout rate {defaults}")
    train.add_argument("--cuda-graph", choices=MODES, default="auto",
                       help="capture the training step in a CUDA graph and replay it: auto (default) does on "
                            "CUDA when the step is replayable, else runs eagerly; on also warns when it cannot; "
                            "off never captures (full-graph training, and with --fanout one process: batches are "
                            "then padded to fixed shapes, gnnfuse.loader.static_shapes; with --fanout on several "
                            "GPUs the ranks' steps, averaging gradients inside the graph instead of through DDP, "
                            "replicated features only)")
    train.add_argument("--fanout", type=_fanout, metavar="K1,K2,..",
                       help="sampled mini-batch training: in-edges sampled per vertex at each hop from the "
                            "batch (PyG's num_neighbors; -1 takes all: --fanout=-1,-1), one hop per layer (sage, "
                            "gat)")
    train.add_argument("--batch-size", type=int, metavar="B", help="seed vertices per mini-batch (default 1024; "
                       "needs --fanout)")
    train.add_argument("--num-workers", type=int, default=0, metavar="N",
                       help="with --fanout: prepare batches in N loader worker processes (PyG's num_workers), "
                            "so sampling's Python runs beside the training step's; 0 (default) prepares them in "
                            "a background thread (100 products-sized batches on an H100: 2.01 s with the thread, "
                            "1.55 / 1.05 / 1.01 s with 1 / 2 / 3 workers)")
    train.add_argument("--dkp", action="store_true", help="dynamic kernel placement (GraphTensor): fit a cost "
                       "model on the first batches' kernel times and let each sage layer pick aggregate- or "
                       "combine-first per batch (needs --fanout)")
    train.add_argument("--gpus", type=int, metavar="N", help="train on N GPUs of this machine, one process each "
                       "(NCCL), as torchrun --nproc-per-node N -m gnnfuse train with these options would; data-parallel "
                       "with --fanout, partitioned full-graph without")
    train.add_argument("--cpu-ranks", type=int, metavar="N", help="the same on N CPU processes (gloo), for machines "
                       "without GPUs and CI")
    train.add_argument("--features", choices=FEATURE_PLACEMENTS, default="replicated",
                       help="several ranks with --fanout: every rank holds all features (replicated, default), or "
                            "a contiguous 1/N of the rows, a batch's rows fetched from their owner by all-to-all")
    train.add_argument("--plot", metavar="PNG", help="save learning curves (needs matplotlib); with --fanout "
                       "also the per-epoch stage breakdown")
    train.add_argument("--save", metavar="PT", help="save each run's best-val state dict and the config "
                       "(torch.save; reload with gnnfuse.training.load_checkpoint)")
    train.add_argument("--quiet", "-q", action="store_true", help="no line per epoch: only the first line, one "
                       "line per run and the summary (warnings and, on a terminal, the progress bar still show)")
    train.add_argument("--resume", action="store_true", help="continue the --save checkpoint of an interrupted "
                       "train with the same options: its finished runs are kept and the rest trained, to the "
                       "numbers an uninterrupted train gives; a checkpoint of another recipe or number of ranks is "
                       "refused")
    train.add_argument("--root", help=ROOT_HELP)
    train.set_defaults(run=run_train, command_parser=train)

    explain = commands.add_parser("explain", help="show fused units, memory traffic and kernels of a model",
                                  parents=[threads])
    cli_explain.add_arguments(explain)
    explain.set_defaults(run=cli_explain.run_command, command_parser=explain)
    bench_cmd = commands.add_parser("bench", help="time training steps against PyG (eager and compiled)",
                                    parents=[threads])
    bench.add_arguments(bench_cmd)
    bench_cmd.set_defaults(run=bench.run_command, command_parser=bench_cmd)
    tune_cmd = commands.add_parser("tune", help="time every fused unit of a model under each schedule and "
                                   "store the fastest for the backends (FeatGraph's grid search)", parents=[threads])
    tuning_command.add_arguments(tune_cmd)
    tune_cmd.set_defaults(run=tuning_command.run_command, command_parser=tune_cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (usage errors exit with 2)."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # what --gpus/--cpu-ranks hand to each rank
    try:
        configure_threads(getattr(args, "threads", None))
        backend_name(False)     # a bad GNNFUSE_* value: a usage error now, not a traceback mid-run
        check_settings()
    except ValueError as error:
        args.command_parser.error(str(error))
    try:
        status = args.run(args, args.command_parser)    # usage errors show the sub-command's usage
        sys.stdout.flush()          # a reader that left is met here, not in the interpreter's exit
        return status
    except KeyboardInterrupt:       # Ctrl-C outside training's runs (loading, timing): no traceback
        print(f"gnnfuse {args.command}: interrupted", file=sys.stderr)
        if world_size() > 1:
            end_rank_now(INTERRUPTED)     # peers may wait in a collective with this rank
        return INTERRUPTED
    except BrokenPipeError:
        # The reader left (``gnnfuse info cora | head -3``): stop quietly, as shell tools do,
        # with stdout pointed at devnull so the interpreter's last flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if world_size() > 1:      # peers may wait in a collective with this rank; the launcher stays quiet
            end_rank_now(READER_LEFT)
        return 1
