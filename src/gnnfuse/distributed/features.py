"""A feature table split across ranks by contiguous row ranges, read through all-to-all.

With ``--features partitioned`` each rank keeps only rows ``[start, end)`` of the
feature table (1/world of it), so a table larger than one GPU's memory fits across
several. A batch names the rows it needs (``n_id``); each rank asks every owner for its
rows and answers the others' requests, in three ``all_to_all_single`` exchanges: the
request counts (each with a fingerprint of the rank's table, `PartitionedFeatures`), the
requested ids, the rows. gloo (CPU, torch >= 2.0) and NCCL both
implement ``all_to_all_single`` with uneven split sizes, so one code path serves both.

Contiguous ranges, not a hash or a METIS partition: ownership is a ``searchsorted``
against ``world + 1`` boundaries (no id -> owner table to store or replicate), and
the data sets' vertex orders keep some locality (communities are numbered together).

`bytes` counts what crossed between ranks, per kind: a rank's own rows are copied
locally by the collective and are not counted.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter

import torch
import torch.distributed as dist

from .agreement import check_agreement

ID_BYTES = 8        # the requested ids travel as int64


def row_ranges(num_rows: int, world_size: int) -> list[int]:
    """``world_size + 1`` boundaries of an even contiguous split: rank r owns rows
    ``[bounds[r], bounds[r + 1])``; sizes differ by at most one."""
    return [r * num_rows // world_size for r in range(world_size + 1)]


class PartitionedFeatures:
    """This rank's rows of a table split by `row_ranges`, and the collective that reads
    any rows of the whole table (`gather`). Every rank must call `gather` the same
    number of times in the same order (it is a collective), each with its own ids.

    Every rank's table must have the same row count, split and row shape and dtype
    (`layout`): the rows cross as bytes, and where two ranks' rows had the same size in
    bytes (4 float32 values against 2 float64) one read the other's as garbage, silently.
    Each rank's request counts travel with a fingerprint of its layout, so a `gather`
    between tables that differ raises `ValueError` on every rank before any row moves."""

    def __init__(self, local: torch.Tensor, bounds: list[int], rank: int, group: dist.ProcessGroup | None = None):
        if local.shape[0] != bounds[rank + 1] - bounds[rank]:
            raise ValueError(f"rank {rank} owns rows {bounds[rank]}..{bounds[rank + 1] - 1} but holds "
                             f"{local.shape[0]} rows")
        self.local, self.rank, self.group = local, rank, group
        self.bounds = torch.tensor(bounds, dtype=torch.int64, device=local.device)
        self.world_size = len(bounds) - 1
        self.layout = (f"a table of {bounds[-1]} rows split at {list(bounds)}, each row "
                       f"{list(local.shape[1:])} {local.dtype}")
        self._fingerprint = int.from_bytes(hashlib.sha256(self.layout.encode()).digest()[:8], "little", signed=True)
        self.bytes: Counter[str] = Counter()   # {sent,received}_{counts,ids,rows}

    @classmethod
    def from_full(cls, table: torch.Tensor, rank: int, world_size: int, device: torch.device,
                  group: dist.ProcessGroup | None = None) -> PartitionedFeatures:
        """This rank's slice of ``table`` (rows of all vertices), moved to ``device``."""
        bounds = row_ranges(table.shape[0], world_size)
        return cls(table[bounds[rank]:bounds[rank + 1]].to(device), bounds, rank, group)

    @property
    def num_rows(self) -> int:
        return int(self.bounds[-1])

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        """The rank that holds each row id."""
        return torch.searchsorted(self.bounds, ids, right=True) - 1

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (global, on this rank's device) of the whole table, in order."""
        if self.local.requires_grad and torch.is_grad_enabled():
            # the rows cross by collectives outside autograd: they would come back detached
            raise ValueError("gather reads rows without autograd, so a table that requires grad (a learnt "
                             "embedding) would get no gradient from them; gather under torch.no_grad(), or keep "
                             "a learnt table replicated")
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            # converted to int64, a mask read rows 1 and 0 where table[mask] selects rows
            raise ValueError(f"gather takes integer row ids, got a {ids.dtype} tensor; for a boolean mask pass "
                             "mask.nonzero().squeeze(1)")
        ids = ids.to(self.local.device, torch.int64)
        self._check_ids(ids)
        owners = self.owner(ids)
        order = torch.argsort(owners, stable=True)
        wanted = ids[order]                                   # grouped by owner
        send_counts = torch.bincount(owners, minlength=self.world_size)
        header = torch.stack([send_counts, torch.full_like(send_counts, self._fingerprint)], dim=1)
        received = torch.empty_like(header)
        dist.all_to_all_single(received, header, group=self.group)       # a [count, fingerprint] per peer
        send, (recv, fingerprints) = send_counts.tolist(), received.t().tolist()
        if any(f != self._fingerprint for f in fingerprints):
            # every rank got every peer's fingerprint, so all of them are here, in step
            check_agreement([self.layout], "the feature tables the ranks gather rows from", self.group)
        asked = torch.empty(sum(recv), dtype=torch.int64, device=ids.device)
        dist.all_to_all_single(asked, wanted, recv, send, group=self.group)
        answer = self.local.index_select(0, asked - self.bounds[self.rank])
        rows = torch.empty((ids.numel(),) + self.local.shape[1:], dtype=self.local.dtype, device=ids.device)
        dist.all_to_all_single(rows, answer, send, recv, group=self.group)
        self._count(send, recv)
        out = torch.empty_like(rows)
        out[order] = rows
        return out

    def _check_ids(self, ids: torch.Tensor) -> None:
        """Refuse ids outside the table before any collective: an id past the last row
        has owner ``world_size`` and failed inside the all-to-all ("Number of tensor
        splits not equal to group size"), a negative one in ``bincount``, naming neither."""
        if ids.numel() and not bool(((ids >= 0) & (ids < self.bounds[-1])).all()):
            raise ValueError(f"row ids must lie in [0, {self.num_rows}) (the table's rows); got ids from "
                             f"{int(ids.min())} to {int(ids.max())}")

    def _count(self, send: list[int], recv: list[int]) -> None:
        """Bytes that crossed to or from other ranks in one `gather`."""
        row_bytes = math.prod(self.local.shape[1:]) * self.local.element_size()
        asked_of_others = sum(send) - send[self.rank]       # their rows come back to us
        asked_of_us = sum(recv) - recv[self.rank]           # our rows go out
        self.bytes["sent_counts"] += 2 * ID_BYTES * (self.world_size - 1)        # each with the fingerprint
        self.bytes["received_counts"] += 2 * ID_BYTES * (self.world_size - 1)
        self.bytes["sent_ids"] += ID_BYTES * asked_of_others
        self.bytes["received_ids"] += ID_BYTES * asked_of_us
        self.bytes["sent_rows"] += row_bytes * asked_of_us
        self.bytes["received_rows"] += row_bytes * asked_of_others

    def bytes_moved(self) -> dict[str, int]:
        """Bytes this rank sent to and received from other ranks so far: ``sent`` and
        ``received`` totals and their split into counts, ids and rows."""
        kinds = ("counts", "ids", "rows")
        return {"sent": sum(self.bytes[f"sent_{k}"] for k in kinds),
                "received": sum(self.bytes[f"received_{k}"] for k in kinds),
                **{f"{d}_{k}": self.bytes[f"{d}_{k}"] for d in ("sent", "received") for k in kinds}}
