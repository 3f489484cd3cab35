"""Checking that every rank describes its inputs alike before a collective that assumes it.

A collective moves buffers whose sizes each rank sets from its own tensors. Where ranks
disagree (a rank built its model for another feature width, loaded another graph), gloo
aborts the process inside the collective ("Received data size doesn't match expected
size") and NCCL does not compare sizes at all: a rank may read past what was sent or
wait for bytes that never come. `check_agreement` compares a short text per rank first,
with one all-gather of a fingerprint, and raises the same `ValueError` on every rank,
naming the first line in which a rank differs from rank 0.
"""
from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

from ..training.data import PreparedData


def describe_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """One line per tensor: its name, shape and dtype."""
    return [f"{name} {list(t.shape)} {t.dtype}" for name, t in tensors.items()]


def describe_data(data: PreparedData) -> list[str]:
    """What every rank's copy of a data set must share: sizes, and fingerprints of the
    labels and the split (a split drawn with another seed has the same sizes)."""
    lines = [f"data set {data.name}: graph of {data.graph.num_nodes} vertices and {data.graph.num_edges} edges, "
             f"features {list(data.x.shape)} {data.x.dtype}, {data.num_classes} classes, labels {_fingerprint(data.y)}"]
    for split, mask in zip(("train", "validation", "test"), data.masks):
        lines.append(f"{split} split: {int(mask.sum())} vertices {_fingerprint(mask)}")
    return lines


def _fingerprint(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:12]


def check_agreement(lines: list[str], what: str, group: Any = None) -> None:
    """Raise `ValueError` on every rank unless every rank of ``group`` passes the same
    ``lines``; ``what`` names them in the message. A collective: every rank calls it."""
    device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl"
              else torch.device("cpu"))
    text = "\n".join(lines)
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)
    mine = torch.tensor([digest], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    digests = [int(d) for d in every]
    differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if not differing:
        return
    reference = _broadcast_text(text, 0, device, group).split("\n")
    problems = []
    for rank in differing:
        theirs = _broadcast_text(text, rank, device, group).split("\n")
        problems.append(f"rank {rank}: {_first_difference(theirs, reference)}")
    raise ValueError(f"{what} differ between ranks, which every rank must hold alike -- {'; '.join(problems)}")


def _broadcast_text(text: str, src: int, device: torch.device, group: Any) -> str:
    """Rank ``src``'s ``text`` (its rank in ``group``) on every rank."""
    root = src if group is None else dist.get_global_rank(group, src)
    data = torch.tensor(list(text.encode()), dtype=torch.uint8, device=device)
    length = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    dist.broadcast(length, src=root, group=group)
    if dist.get_rank(group) != src:
        data = torch.empty(int(length), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=root, group=group)
    return bytes(data.tolist()).decode()


def _first_difference(lines: list[str], reference: list[str]) -> str:
    for line, expected in zip(lines, reference):
        if line != expected:
            return f"{line} where rank 0 has {expected}"
    if len(lines) > len(reference):
        return f"{lines[len(reference)]}, which rank 0 lacks"
    return f"no {reference[len(lines)]}, which rank 0 has"
