"""Refusing torch.jit.trace (and torch.onnx.export's tracer) with a message.

The tracer records the torch ops a call makes and replays them later. A gnnfuse call's
work is mostly outside them: Triton and numba kernels write into tensors the tracer saw
allocated (so a replay returns uninitialised memory), and sizes read as Python ints
become tensors under it. Traced, a layer failed with an unrelated message ("num_nodes
must be an int, got Tensor", a numba typing error, a C++ ``unordered_map::at``) or
crashed the process (CPython's "double free or corruption" after a Triton interpreter
call). Every entry to compiled code asks `refuse_jit_trace` first.
"""
from __future__ import annotations

import torch


def refuse_jit_trace(what: str) -> None:
    """Raise if torch.jit's tracer is recording now, naming ``what`` was called."""
    if torch._C._get_tracing_state() is not None:
        raise NotImplementedError(
            f"{what} under torch.jit.trace (or torch.onnx.export, which traces): gnnfuse's kernels run "
            "outside the tracer, so a traced replay would not compute them. Use torch.compile "
            "(fullgraph=True works) or call the model eagerly")
