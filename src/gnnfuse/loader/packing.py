"""A batch's tensors packed into one buffer per device for the trip between processes.

A `MiniBatch` holds some forty tensors (ids, blocks' CSRs and reverse CSRs, degrees,
the kernels' edge segments, features). Sent as they are, each CUDA tensor's storage
crosses as its own CUDA IPC handle, IPC event and shared reference counter, which the
receiving process opens one by one: on an H100 that rebuild took 3.1 ms per
products-sized batch with one worker and 6.3 ms with two -- more than the training step's
host time. `pack` copies every tensor into one byte buffer per device (each at an
offset aligned as the caching allocator aligns its blocks, so kernels see the same
pointer alignment) and pickles the rest of the batch with references to them; `unpack`
rebuilds the tensors as views of the one received buffer. Tensors that appear several
times (a CSR both in a graph's cache and in a block's layout list) stay one tensor.
Nothing here is particular to a `MiniBatch`: a PyG ``HeteroData`` batch crosses the same
way, its stores (and their ``num_sampled_nodes`` lists, ``batch_size``) pickled, their
tensors packed.
"""
from __future__ import annotations

import io
import math
import pickle
from typing import Any

import torch

ALIGN = 512          # bytes, as torch's CUDA caching allocator aligns blocks


class _Packer(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self._index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return None
        if obj.requires_grad or obj.is_sparse or obj.layout != torch.strided:
            raise TypeError("a loader batch holds only plain dense tensors; got one with "
                            f"requires_grad={obj.requires_grad}, layout={obj.layout}")
        key = id(obj)
        if key not in self._index:
            self._index[key] = len(self.tensors)
            self.tensors.append(obj)
        return self._index[key]


class _Unpacker(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid: Any) -> torch.Tensor:
        return self.tensors[pid]


def pack(obj: Any) -> tuple[bytes, dict[str, torch.Tensor], list[tuple[str, int, torch.dtype, tuple[int, ...]]]]:
    """(``obj`` pickled with its tensors left out, one uint8 buffer per device holding
    them, where each sits: (device, byte offset, dtype, shape))."""
    file = io.BytesIO()
    packer = _Packer(file)
    packer.dump(obj)
    by_device: dict[str, list[torch.Tensor]] = {}
    where = []
    offsets: dict[str, int] = {}
    for tensor in packer.tensors:
        device = str(tensor.device)
        offset = offsets.get(device, 0)
        nbytes = tensor.numel() * tensor.element_size()
        pieces = by_device.setdefault(device, [])
        pieces.append(_bytes_of(tensor.contiguous()))
        pad = -nbytes % ALIGN
        if pad:
            pieces.append(torch.empty(pad, dtype=torch.uint8, device=tensor.device))
        offsets[device] = offset + nbytes + pad
        where.append((device, offset, tensor.dtype, tuple(tensor.shape)))
    buffers = {device: torch.cat(pieces) for device, pieces in by_device.items()}
    return file.getvalue(), buffers, where


def unpack(data: bytes, buffers: dict[str, torch.Tensor],
           where: list[tuple[str, int, torch.dtype, tuple[int, ...]]]) -> Any:
    """What `pack` packed, its tensors in the memory of ``buffers``.

    Each is a tensor of its own, not a view of the buffer: views share their base's
    version counter, so an in-place write to one (``batch.x`` normalised in place) would
    read as a write to every other, a block graph's index tensors among them, which a
    `Graph` then refuses as edited (`Graph.check_unchanged`).

    Each also has a storage of its own, a slice of the buffer's that holds the buffer
    alive: on the buffer's one storage, ``torch.save`` refused the batch (tensors of
    several dtypes over the same memory: "Cannot save multiple tensors or storages that
    view the same data as different types"), and ``pickle`` wrote the whole buffer once
    per tensor (750 kB for a batch that pickles to 43 kB), each loaded tensor then
    holding its own copy of all of it.

    An empty tensor gets no slice: its slice would start where the next tensor's does,
    which ``torch.save`` would read as one memory seen as two dtypes."""
    tensors = []
    for device, offset, dtype, shape in where:
        storage = buffers[device].untyped_storage()
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes:
            tensors.append(torch.empty(0, dtype=dtype, device=storage.device).set_(
                storage[offset:offset + nbytes], 0, shape))
        else:
            tensors.append(torch.empty(shape, dtype=dtype, device=storage.device))
    return _Unpacker(io.BytesIO(data), tensors).load()


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
