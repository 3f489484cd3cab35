"""Gradient averaging across ranks as one collective a CUDA graph can hold.

``DistributedDataParallel`` averages gradients from hooks that run while autograd walks
the backward: Python-side bookkeeping (bucket readiness, bucket rebuilds after the first
steps) decides which all-reduces launch and where their results are copied. A CUDA graph
replays the kernels of one captured step and none of that bookkeeping, so a step captured
through DDP replays whatever the bookkeeping did at capture time -- correct only under
conditions DDP cannot check (PyTorch's recipe asks for DDP built on a side stream, 11
eager steps first and NCCL's async error handling off). `StepCapture` therefore refuses
DDP-wrapped modules, and a step that wants to be replayed averages its gradients
explicitly with `average_gradients` between ``backward()`` and ``optimizer.step()``:

    optimizer.zero_grad()
    loss_fn(model(batch)).backward()
    average_gradients(model.parameters())
    optimizer.step()

The average is one all-reduce over the gradients laid end to end (one per dtype), the
same work whether the step runs eagerly or is replayed, so ranks can mix both (a batch
that does not fit the static shapes runs eagerly on one rank while the others replay):
every rank issues the same collectives of the same sizes in the same order each step.
What the call cannot know is whether a peer skipped a step; that stays the caller's
contract, as with DDP (equal batch counts: `DistributedSampler(drop_last=True)`).
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist


def average_gradients(parameters: Iterable[torch.Tensor], group: dist.ProcessGroup | None = None) -> None:
    """Replace each parameter's gradient by its mean over the ranks of ``group`` (default:
    the whole world), in place, with one all-reduce per gradient dtype.

    Parameters that require a gradient but got none this step (a layer this batch did
    not reach) take part with zeros, and keep that zero gradient afterwards: the
    flattened buffers must have the same length on every rank, or the all-reduce would
    mix one rank's gradient with another's different parameter."""
    params = [p for p in parameters if p.requires_grad]
    if not params:
        return
    if not dist.is_initialized():
        raise RuntimeError("average_gradients needs an initialised process group "
                           "(gnnfuse.distributed.init_process_group, or torchrun's environment)")
    world = dist.get_world_size(group)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            raise ValueError(f"average_gradients flattens dense gradients; a parameter of shape {tuple(p.shape)} has "
                             "a sparse one (an Embedding with sparse=True)")
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        torch._foreach_copy_(grads, [part.view_as(g) for part, g in zip(flat.split([g.numel() for g in grads]),
                                                                           grads)])


def broadcast_parameters(module: torch.nn.Module, src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Give every rank ``src``'s parameters and buffers, as DDP does when it wraps a
    module: ranks that average gradients must also start from the same weights."""
    for tensor in [*module.parameters(), *module.buffers()]:
        with torch.no_grad():
            dist.broadcast(tensor, src=src, group=group)
