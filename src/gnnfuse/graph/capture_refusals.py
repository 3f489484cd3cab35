"""Refusing torch.jit.trace (and torch.onnx.export's tracer) and a graph built under
torch.export, with a message.

The tracer records the torch ops a call makes and replays them later. A gnnfuse call's
work is mostly outside them: Triton and numba kernels write into tensors the tracer saw
allocated (so a replay returns uninitialised memory), and sizes read as Python ints
become tensors under it. Traced, a layer failed with an unrelated message ("num_nodes
must be an int, got Tensor", a numba typing error, a C++ ``unordered_map::at``) or
crashed the process (CPython's "double free or corruption" after a Triton interpreter
call). Every entry to compiled code asks `refuse_jit_trace` first.

torch.export captures the layers that torch.compile does (their graphs are built inside
gnnfuse's operator from the exported ``edge_index``), but a `Graph` built in the exported
code itself reads its ids' values on symbolic tensors: that failed on "Could not extract
specialized integer from data-dependent expression u0". `refuse_export` names it instead.
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


def refuse_export(what: str) -> None:
    """Raise if torch.export is capturing now, naming ``what`` read the ids' values. Only
    non-strict export runs this code as Python (strict export and torch.compile trace it
    with dynamo, which reads the ids as data-dependent values and breaks the graph there,
    and whose torch 2.11 cannot trace ``is_exporting``)."""
    if not torch.compiler.is_dynamo_compiling() and torch.compiler.is_exporting():
        raise NotImplementedError(
            f"{what} under torch.export: a gnnfuse Graph reads its ids' values, which export cannot capture. "
            "Export a model whose layers take the edge_index tensor (GCNConv, GATConv, SAGEConv, GINConv, "
            "GraphConv, SGConv, APPNP and TAGConv are captured), or build the Graph outside the exported code")
