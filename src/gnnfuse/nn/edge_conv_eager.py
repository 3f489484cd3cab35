"""EdgeConv run eagerly, as PyG computes it, for an ``nn`` that cannot be traced per edge.

gnnfuse's `EdgeConv` traces ``nn`` inside a vertex function, one edge's row at a time. A
module whose output for one row depends on the other rows -- a BatchNorm or InstanceNorm
(batch statistics), or PyG's normalisation layers (``LayerNorm`` and ``GraphNorm`` over the
whole graph, ...) -- has no per-row form: PyG applies it to the [E, 2F] table of every
edge's input at once. PyG's ``EdgeCNN(norm=...)`` puts one in each layer's MLP. Such an
``nn`` failed with torch's "expected 2D or 3D input" or a CompileError; it now runs the
whole layer in PyG's order (gather, ``nn`` on every edge's row, scatter), with a warning,
once per reason, naming the module. So does an ``nn`` the tracer cannot compile per edge
(an activation without a gnnfuse op, as ``EdgeCNN(act='gelu')``'s MLP has, or an op over
dim 0, the edges, which combines rows): it raised the CompileError, where PyG's layer runs.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from ..graph import Graph
from ..user_warning import warn

_WARNED: set[str] = set()


def rows_coupled_by(module: Callable) -> tuple[str, type] | None:
    """Name (``nn.norms.0``) and class of the first submodule of ``module`` whose output
    rows depend on each other (torch's BatchNorm/InstanceNorm, any of
    ``torch_geometric.nn.norm``), or None when every row is computed alone as far as that
    tells."""
    if not isinstance(module, nn.Module):
        return None
    for name, sub in module.named_modules(prefix="nn"):
        if isinstance(sub, _NormBase) or type(sub).__module__.startswith("torch_geometric.nn.norm"):
            return name, type(sub)
    return None


def coupled_reason(coupled: tuple[str, type]) -> str:
    """Why an ``nn`` in which `rows_coupled_by` found ``coupled`` runs eagerly."""
    name, module = coupled
    return f"{name} ({module.__name__}) normalises over all edges' rows together, which has no per-edge form to trace"


def eager_edge_conv(h: Callable, aggr: str, x_src: torch.Tensor, x_dst: torch.Tensor, graph: Graph,
                    reason: str) -> torch.Tensor:
    """PyG's EdgeConv: ``aggr`` over each destination's in-edges of
    ``h([x_dst[v], x_src[u] - x_dst[v]])``, every edge's row through ``h`` together; a
    vertex without in-edges gets 0, as in PyG's scatter. ``reason`` (why it is not
    compiled) is warned once."""
    if reason not in _WARNED:
        _WARNED.add(reason)
        warn(f"EdgeConv runs eagerly (not compiled): {reason}")
    src, dst = graph.src.to(x_src.device), graph.dst.to(x_src.device)
    x_i = x_dst.index_select(0, dst)
    messages = h(torch.cat([x_i, x_src.index_select(0, src) - x_i], dim=-1))
    out = messages.new_zeros(graph.num_nodes, *messages.shape[1:])
    if aggr == "max":
        index = dst.view(-1, *([1] * (messages.dim() - 1))).expand_as(messages)
        return out.scatter_reduce(0, index, messages, "amax", include_self=False)
    out = out.index_add(0, dst, messages)
    if aggr == "mean":
        count = torch.bincount(dst, minlength=graph.num_nodes).clamp(min=1).to(out.dtype)
        out = out / count.view(-1, *([1] * (out.dim() - 1)))
    return out
