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

import dataclasses
import hashlib
from typing import Any

import torch
import torch.distributed as dist

from ..training.config import TrainConfig
from ..training.data import PreparedData


def describe_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """One line per tensor: its name, shape and dtype."""
    return [f"{name} {list(t.shape)} {t.dtype}" for name, t in tensors.items()]


def describe_data(data: PreparedData) -> list[str]:
    """What every rank's copy of a data set must share: sizes, and fingerprints of the
    labels and the split (a split drawn with another seed has the same sizes), of the
    edges (another graph of the same sizes trained silently wrong, or aborted inside
    gloo) and of the features."""
    lines = [f"data set {data.name}: graph of {data.graph.num_nodes} vertices and {data.graph.num_edges} edges, "
             f"features {list(data.x.shape)} {data.x.dtype}, {data.num_classes} classes, labels {_fingerprint(data.y)}"]
    lines.append(f"edges {_checksum(data.graph.src)}/{_checksum(data.graph.dst)}, features {_checksum(data.x)}")
    for split, mask in zip(("train", "validation", "test"), data.masks):
        lines.append(f"{split} split: {int(mask.sum())} vertices {_fingerprint(mask)}")
    return lines


def describe_settings(config: TrainConfig, seed: int) -> list[str]:
    """The training settings every rank must share, one per line: ranks started apart
    (torchrun, or processes of the user's own) with another learning rate or weight
    decay each applied their own updates, and the weights drifted apart silently; with
    another epoch count, patience or batch size a rank waited in a collective the others
    had left. The data set's folder and the loader's worker count are each rank's own."""
    own = {"root", "loader_workers"}
    return [f"{f.name} {getattr(config, f.name)!r}" for f in dataclasses.fields(config) if f.name not in own] + \
        [f"run seed {seed}"]


def _fingerprint(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:12]


_CHUNK = 1 << 24


def _checksum(tensor: torch.Tensor) -> str:
    """A fingerprint of a large tensor's exact contents, from torch ops where it lies:
    its elements' bits as integers, each times an odd number set by its position, summed
    with int64 wrap-around, in chunks (sha256 of a products-sized edge list, a gigabyte
    copied to the host, took seconds)."""
    if tensor.layout is torch.sparse_coo:      # bag-of-words features (training.data.SPARSE_FEATURES)
        tensor = tensor.detach().coalesce()
        return f"{_checksum(tensor.indices())}:{_checksum(tensor.values())}"
    flat = tensor.detach().reshape(-1)
    if flat.dtype.is_floating_point:
        flat = flat.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()])
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, flat.numel(), _CHUNK):
        part = flat[start:start + _CHUNK]
        weight = torch.arange(start, start + part.numel(), dtype=torch.int64, device=flat.device).mul_(2).add_(1)
        total += weight.mul_(part).sum()      # into the weights: ``part`` may be the caller's own tensor
    return f"{int(total) & 0xFFFFFFFFFFFF:012x}"


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
