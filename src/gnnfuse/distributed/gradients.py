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
A captured step's graph holds its all-reduce: call its ``release()`` (`StepCapture`,
`BlockStepCapture`), or `gnnfuse.runtime.release_captures()` for every graph of the
process, before ``dist.destroy_process_group()`` (`leave_process_group` does the
latter); on two H200 ranks graphs left alive hung both on leaving the process group,
after their last epoch.

`all_reduce_gradients` is the partitioned full-graph step's: a sum (its loss is already
divided by the global count) that leaves ``grad = None`` where no rank reached a
parameter, which takes a read of those flags back to the host -- fine for a step that is
never captured (its halo exchanges have host-side sizes), not for one that is.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from .agreement import check_agreement, describe_tensors


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


def all_reduce_gradients(parameters: Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None = None) -> None:
    """Sum every parameter's gradient over the ranks, with one ``all_reduce`` per dtype.

    A parameter no rank computed a gradient for keeps ``grad = None`` (Adam skips it, as
    on one process); one that some rank did not reach counts zeros from that rank."""
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in parameters:
        if p.requires_grad:
            by_dtype.setdefault(p.dtype, []).append(p)
    for params in by_dtype.values():
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        reached = torch.tensor([p.grad is not None for p in params], dtype=params[0].dtype, device=params[0].device)
        flat = torch.cat([g.reshape(-1) for g in grads] + [reached])
        dist.all_reduce(flat, group=group)
        offset = 0
        for p, g, got in zip(params, grads, flat[-len(params):].tolist()):
            p.grad = flat[offset:offset + g.numel()].view_as(p) if got else None
            offset += g.numel()


def broadcast_parameters(model: torch.nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Rank 0's weights and buffers on every rank, as DDP gives them when it wraps a
    module: ranks that average their gradients must also start from the same weights
    (the same seed already gives them; this makes it so whatever the initialisation path).

    Ranks whose state dicts differ in names, shapes or dtypes (a rank that built its model
    for another feature width) are refused first, naming the tensor (`check_agreement`)."""
    state = model.state_dict()
    check_agreement(describe_tensors(state), "the model's parameters and buffers", group)
    for tensor in state.values():
        dist.broadcast(tensor, src=0, group=group)
