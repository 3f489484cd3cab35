"""Ctrl-C on several ranks: every rank stops at the end of the same epoch, and a resumed
run puts each rank back where it stopped.

A Ctrl-C reaches each rank by itself: a terminal's reaches every one (and their
launcher, which passes it on: `training.interrupt` counts the two as one), ``kill -INT``
of one rank's process only that rank. A rank that stopped alone would leave its peers
waiting for it in their next collective, so each rank's request (`DeferredInterrupt`)
rides as one more number in the float64 vector its epoch all-reduces last anyway (its
losses and accuracies), and every rank stops after the epoch in which any asked. No collective of its own: a separate one-number all-reduce cost 0.2 ms per
epoch on two gloo ranks here, 1.5% of a 13 ms cora full-graph epoch.

What a rank needs to go on: the weights and Adam's state, the same on every rank (the
gradients are averaged or summed before each step), the early-stopping record and
curves, the same (built from all-reduced numbers), and its own random state -- each
rank draws dropout masks and neighbour samples from a stream of its own -- which
`ranks_run_state` gathers so that rank 0 writes them all into the checkpoint. (Not
enough for DDP's steps on more than two ranks, which therefore stop at once:
`minibatch.inexact_resume` says why.)
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..training.config import ConfigError
from ..training.interrupt import DUPLICATE_WINDOW_S, DeferredInterrupt
from ..training.loop import BestEpoch, restore_run, run_state


class _Carried:
    """A request that came after a run's last agreement (`carry_over`), for the next run."""
    requested = False


def rank_interrupt() -> DeferredInterrupt:
    """The `DeferredInterrupt` a rank's epoch loop runs under (rank 0 alone says so on
    stderr, where every rank's errors go), already requested when the run before left a
    request over (`carry_over`).

    A SIGTERM is taken as a Ctrl-C too: ``timeout`` and a batch scheduler's stop send it to
    every process of the job, ranks included, and the ranks died of it at once while their
    launcher passed it on as a Ctrl-C -- the run in progress was lost, nothing saved. A
    launcher that ends the ranks after a peer failed still does: torch.multiprocessing
    sends SIGKILL one grace period (`launch.FAILURE_GRACE_S`) after its SIGTERM, torchrun's
    agent after its shutdown timeout, and a rank waiting in a collective with a failed gloo
    peer fails at once anyway."""
    interrupt = DeferredInterrupt(duplicate_window_s=DUPLICATE_WINDOW_S, quiet=dist.get_rank() != 0,
                                  when="every rank at the end of this epoch, or of the next one if this one's "
                                       "last all-reduce is past", terminate=True)
    interrupt.requested, _Carried.requested = _Carried.requested, False
    return interrupt


def carry_over(interrupt: DeferredInterrupt, agreed: bool) -> None:
    """Keep a request the ranks did not agree on -- it came after the run's last epoch's
    all-reduce -- for the next run, whose first epoch's all-reduce carries it: dropped
    with this run's interrupt, it was lost, and every later run trained as if no Ctrl-C
    had come. (After a command's last run there is nothing left to stop.)"""
    _Carried.requested = interrupt.requested and not agreed


def ranks_run_state(epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer, best: BestEpoch,
                    seconds: float, own: dict[str, Any] | None = None) -> dict[str, Any]:
    """`loop.run_state` after ``epoch``, with ``"ranks"``: every rank's random state and
    ``own`` (what else differs by rank), in rank order. A collective: every rank calls it."""
    state = run_state(epoch, model, optimizer, best, seconds)
    mine = {"rng": state["rng"], "cuda_rng": state["cuda_rng"], **(own or {})}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    state["ranks"] = every
    return state


def restore_ranks_run(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
                      best: BestEpoch) -> tuple[int, dict[str, Any]]:
    """Put a `ranks_run_state` back into this rank's freshly built run: (the epoch it was
    taken after, this rank's entry of ``"ranks"``)."""
    ranks = state.get("ranks")
    if ranks is None or len(ranks) != dist.get_world_size():
        held = "no rank's random state" if ranks is None else f"the random states of {len(ranks)} ranks"
        raise ConfigError(f"the stopped run's state holds {held}, and {dist.get_world_size()} ranks resume it")
    own = ranks[dist.get_rank()]
    return restore_run({**state, "rng": own["rng"], "cuda_rng": own["cuda_rng"]}, model, optimizer, best), own
