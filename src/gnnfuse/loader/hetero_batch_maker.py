"""`HeteroBatchMaker`: what turns a batch of seeds into a heterogeneous batch.

It is to `HeteroNeighborLoader` what `BatchMaker` is to `NeighborLoader`, and runs in
the same machinery (`loader.preparation`): called when a batch is asked for, in a
prefetch thread, or pickled into worker processes (`loader.workers`), the ``HeteroData``
and the typed CSRs crossing once, as shared memory (CUDA IPC on a GPU). A batch is a PyG
``HeteroData``, which `loader.packing` sends back as it sends any batch: pickled with
its tensors left out (the stores, ``num_sampled_nodes`` lists, ``batch_size``), the
tensors packed into one buffer per device. It holds only tensors, the ``HeteroData``
and settings, so it pickles.

Randomness: a batch samples from the one generator it is given (`batch_generator`: the
epoch's seed and the batch's index), so it is the same whichever thread or process
prepares it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..graph.graph import CSR
from .hetero_batch import hetero_batch
from .hetero_sampler import EdgeType, sample_hetero
from .stages import StageTimes, device_stream


@dataclass
class HeteroBatchMaker:
    """The ``HeteroData`` the batches are cut from (``data``), its typed CSRs on
    ``sample_device`` (`typed_csr`), its node counts, the seeds' type and the sampling
    settings. Batches stay where the ``HeteroData``'s tensors are (``device`` is where
    they are sampled, which `loader.workers` reads)."""
    data: Any
    csrs: dict[EdgeType, CSR]
    num_nodes: dict[str, int]
    input_type: str
    num_neighbors: dict[EdgeType, list[int]]
    num_hops: int
    replace: bool
    sample_device: torch.device

    @property
    def device(self) -> torch.device:
        return self.sample_device

    def pin_shared_tables(self) -> None:
        """In a worker process: nothing to page-lock (the batches read the ``HeteroData``'s
        tensors where they are; no zero-copy reads)."""

    def prepare(self, seeds: torch.Tensor, generator: torch.Generator, times: StageTimes,
                input_id: torch.Tensor) -> Any:
        """The batch of ``seeds`` (of ``input_type``; PyG's ``input_id`` ``input_id``),
        sampled from ``generator`` (timed as ``sample``), then cut from the ``HeteroData``
        (timed as ``lookup``)."""
        stream = device_stream(self.sample_device)
        with times.timing("sample", stream=stream):
            sample = sample_hetero(self.csrs, self.num_nodes, self.input_type, seeds.to(self.sample_device),
                                   self.num_neighbors, self.num_hops, self.replace, generator)
        with times.timing("lookup", stream=stream):
            return hetero_batch(self.data, sample, self.input_type, input_id)


def hetero_batch_tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor of a heterogeneous batch (each store's), which a prefetch thread's
    side stream hands to the consumer's stream on a GPU (`Prefetcher`)."""
    return [value for store in batch.stores for value in store.values() if isinstance(value, torch.Tensor)]
