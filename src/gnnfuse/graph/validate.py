"""Turning user-supplied id arrays into checked int64 tensors.

Every kernel downstream indexes memory with these ids without bounds checks, so a bad id
must be caught here, once, with a message that says which array and which position is
wrong -- not later as a silent out-of-bounds read or a wrapped-around int32.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .capture_refusals import refuse_export, refuse_jit_trace

_INT64_MAX = np.iinfo(np.int64).max


def integer_ids(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a plain tensor of integer ids: PyG's ``Index`` and ``EdgeIndex`` are
    tensor subclasses whose storage a kernel cannot address, so the plain tensor they hold
    is kept; float, complex or bool ids are refused (truncating them would be a silent
    wrong graph)."""
    if type(tensor) is not torch.Tensor and hasattr(tensor, "as_tensor"):    # (a plain tensor has none)
        tensor = tensor.as_tensor()
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer ids, got {tensor.dtype}")
    return tensor


def as_index_tensor(name: str, value: Any, device: torch.device | None = None) -> torch.Tensor:
    """`value` as a contiguous 1-D int64 tensor; rejects float/bool ids and non-1-D input.

    Kernels read index arrays through a bare pointer, as if contiguous, so the graph
    owns one layout of one dtype: a strided view (a row of ``edges.t()``, a sliced
    ``edge_index``) is copied here, once, instead of every kernel having to handle strides.
    Contiguous int64 tensors are used as they are (no copy), so a 62M-edge graph does not
    double its memory on construction; other integer types are widened, never narrowed.
    Non-tensor input (a numpy array, a list) is copied and placed on `device` (the device
    of the tensor it travels with).
    """
    if isinstance(value, torch.Tensor):
        tensor = integer_ids(name, value)
        if tensor.dtype == torch.uint64 and tensor.numel():
            widened = tensor.to(torch.int64)        # wraps ids above the int64 range to negatives
            if bool((widened < 0).any()):
                raise ValueError(f"{name} holds ids above the int64 range (a torch.uint64 id of 2**63 or more)")
    else:
        array = np.asarray(value)
        if array.size == 0 and array.dtype.kind == "f" and not isinstance(value, np.ndarray):
            array = array.astype(np.int64)          # `[]` parses as float64; it holds no ids
        if array.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integer ids, got numpy dtype {array.dtype}")
        if array.dtype == np.uint64 and array.size and int(array.max()) > _INT64_MAX:
            raise ValueError(f"{name} holds ids above the int64 range (largest {int(array.max())})")
        # a copy, always: a graph sharing a numpy array's memory would miss the user's later
        # writes to it (numpy moves no version counter), its layouts describing the old edges
        tensor = torch.from_numpy(np.array(array, dtype=np.int64, copy=True))
        if device is not None:
            tensor = tensor.to(device)
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor.to(torch.int64).contiguous()


def id_bounds(*tensors: torch.Tensor) -> list[tuple[int, int] | None]:
    """(smallest, largest) id of each tensor, None for an empty one, read back to the host
    in one read. Why one: every read waits for the GPU's queue, and a graph-classification
    step builds a graph per batch, whose src and dst bounds were four reads (a min and a
    max each) before any kernel of the step could be queued behind them.

    Under torch.compile (a `Graph` built in the compiled code) the read breaks the graph
    by name: dynamo traced it as data-dependent values, and fullgraph=True refused the
    model with "Could not guard on data-dependent expression u0 < 0" at a gnnfuse line."""
    if torch.compiler.is_dynamo_compiling():
        torch._dynamo.graph_break(msg="a gnnfuse Graph built inside torch.compile'd code reads its ids' values "
                                      "(their range, checked when it is built), which a compiled graph cannot: "
                                      "build the Graph outside the compiled code, or pass the edge_index tensor "
                                      "to the layer")
    present = [t for t in tensors if t.numel()]
    if not present:
        return [None] * len(tensors)
    values = iter(torch.stack([v for t in present for v in torch.aminmax(t)]).tolist())
    return [(next(values), next(values)) if t.numel() else None for t in tensors]


def check_ids(name: str, ids: torch.Tensor, bound: int, bound_name: str) -> None:
    """Raise unless every id is in [0, bound); name the first offending position."""
    refuse_export(f"a gnnfuse graph checking its {name}")
    _within(name, ids, bound, bound_name, id_bounds(ids)[0])


def _within(name: str, ids: torch.Tensor, bound: int, bound_name: str, bounds: tuple[int, int] | None) -> None:
    """`check_ids` of ``ids`` whose `id_bounds` are ``bounds``, read already: raise
    unless they lie in [0, bound), naming the first offending position (found only then)."""
    if bounds is None:
        return
    low, high = bounds
    if low < 0:
        pos = int(torch.nonzero(ids < 0)[0])
        raise ValueError(f"{name} has a negative id {int(ids[pos])} at position {pos}")
    if high >= bound:
        pos = int(torch.nonzero(ids >= bound)[0])
        raise ValueError(
            f"{name} has id {int(ids[pos])} at position {pos}, but {bound_name}={bound} "
            f"(ids must be < {bound_name}; {bound_name} is smaller than the largest id + 1 = "
            f"{high + 1})")


def edge_counts(src: torch.Tensor, dst: torch.Tensor, num_nodes: int | None, num_src_nodes: int | None) -> int:
    """A graph's ``num_nodes`` (given, else the largest id + 1: of ``src`` and ``dst``, or
    of ``dst`` alone where ``num_src_nodes`` makes it bipartite), with every id of
    ``src`` and ``dst`` checked in range, as `infer_count` and `check_ids` would -- the
    same errors, in the same order -- from one host read of their bounds (`id_bounds`)."""
    if num_nodes is None:
        refuse_export("a gnnfuse graph inferring its num_nodes")
    else:
        num_nodes = infer_count(num_nodes, "num_nodes")
    sources = None if num_src_nodes is None else infer_count(num_src_nodes, "num_src_nodes")
    refuse_export("a gnnfuse graph checking its src")
    src_bounds, dst_bounds = id_bounds(src, dst)
    if num_nodes is None:
        counted = (dst_bounds,) if sources is not None else (src_bounds, dst_bounds)
        num_nodes = max((b[1] + 1 for b in counted if b is not None), default=0)
    if sources is None:
        _within("src", src, num_nodes, "num_nodes", src_bounds)
    else:
        _within("src", src, sources, "num_src_nodes", src_bounds)
    _within("dst", dst, num_nodes, "num_nodes", dst_bounds)
    return num_nodes


def infer_count(explicit: int | None, name: str, *tensors: torch.Tensor) -> int:
    """`explicit` if given (checked to be a non-negative int), else largest id + 1 (0 if empty)."""
    if explicit is not None:
        if isinstance(explicit, torch.Tensor):      # a size read under torch.jit.trace is a tensor
            refuse_jit_trace(f"a gnnfuse graph's {name}")
        if isinstance(explicit, bool) or not isinstance(explicit, (int, np.integer)):
            raise ValueError(f"{name} must be an int, got {type(explicit).__name__}")
        if explicit < 0:
            raise ValueError(f"{name} must be >= 0, got {explicit}")
        return int(explicit)
    refuse_export(f"a gnnfuse graph inferring its {name}")
    return max((high + 1 for _, high in filter(None, id_bounds(*tensors))), default=0)


def choose_index_dtype(num_nodes: int, num_edges: int) -> torch.dtype:
    """int32 when the vertex count N and the edge count plus one fit, else int64.

    Halving index bandwidth matters for memory-bound sparse kernels, but a wrapped int32
    offset corrupts results silently, so narrow only when provably safe: ids and the
    count N itself (a kernel's row bound) need N <= INT32_MAX, and offsets reach E, with
    one slot of headroom for an exclusive end pointer.
    """
    limit = torch.iinfo(torch.int32).max
    return torch.int32 if num_nodes <= limit and num_edges + 1 <= limit else torch.int64
