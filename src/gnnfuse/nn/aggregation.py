"""PyG's ``aggr`` argument (SAGEConv's): one aggregation by name, a list of them combined
(PyG's ``MultiAggregation``, configured by ``aggr_kwargs``), or an ``Aggregation`` module.

What gnnfuse can fuse -- sum, mean, max, min and the two moments behind var and std --
runs as one compiled program over the graph, however many of them a list names: every
reduction reads the same gathered rows, so one kernel produces them all. PyG's
``SoftmaxAggregation`` (fixed or learnt temperature ``t``) is fused too, one program per
such slot, reading its ``t`` (PyG's parameter, so the state loads) on every call. The
rest of a list's combination (concatenation, PyG's ``proj``/``attn`` modes, dense
reductions over the aggregations) is dense per-vertex work and runs in torch, with PyG's
parameter names, so ``load_state_dict`` of a PyG layer's state works.

Everything else (``'lstm'``, ``MLPAggregation``, ``'median'``, semi-gradient variants,
...) is not fused: it runs eagerly through PyG's own ``Aggregation`` module -- exactly the
semantics the user asked for -- on the messages in edge order, with a warning once per
layer class and aggregation. PyG is imported only then; without it such an aggregation is
refused by name at construction.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .. import frontend
from ..graph import Graph
from ..runtime.compile_op import GraphRef
from ..user_warning import warn
from . import pyg_init

# gnnfuse's fused reductions by PyG's name, and PyG's class of each.
_FUSED_NAMES = {"sum": "sum", "add": "sum", "mean": "mean", "max": "max", "min": "min", "var": "var", "std": "std"}
_PYG_CLASSES = {"sum": "SumAggregation", "mean": "MeanAggregation", "max": "MaxAggregation",
                "min": "MinAggregation", "var": "VarAggregation", "std": "StdAggregation"}
_KIND_OF_PYG_CLASS = {cls: kind for kind, cls in _PYG_CLASSES.items()}
_FUSED_DESCRIPTION = f"gnnfuse fuses only {sorted(set(_FUSED_NAMES))} and PyG's SoftmaxAggregation"
# The per-vertex reductions the compiled program computes for each kind.
_MOMENTS = {"sum": ("sum",), "mean": ("mean",), "max": ("max",), "min": ("min",),
            "var": ("mean", "square_mean"), "std": ("mean", "square_mean")}
# What PyG's VarAggregation and StdAggregation take (their only argument).
_MOMENT_KWARGS = {"semi_grad"}
_DENSE_MODES = ("sum", "mean", "max", "min", "logsumexp", "std", "var")
_MODES = ("cat", "proj", "attn") + _DENSE_MODES
# Why an aggregation PyG offers is not fused; others get the generic reason.
_UNFUSED_REASONS = {
    "LSTMAggregation": "it reads each vertex's neighbours as an ordered sequence (sorted dense batches) "
                       "through an LSTM",
    "GRUAggregation": "it reads each vertex's neighbours as an ordered sequence (sorted dense batches) "
                      "through a GRU",
    "MLPAggregation": "it runs an MLP over each vertex's neighbours padded into one dense row",
    "SoftmaxAggregation": "semi_grad=True (no gradient through the softmax weights) is not fused",
    "MedianAggregation": "it sorts each vertex's neighbours",
    "QuantileAggregation": "it sorts each vertex's neighbours",
}
_WARNED: set[tuple[str, str]] = set()


class Reduction(nn.Module):
    """A fused reduction (sum, mean, max, min, var or std) in an aggregation slot: no
    parameters, like PyG's module of the same meaning, whose name it prints."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def __setattr__(self, name: str, value: Any) -> None:
        """Refuses ``semi_grad`` on a var or std slot: PyG's ``VarAggregation`` and
        ``StdAggregation``, which this one prints as, read it on every call, so
        ``conv.aggr_module.semi_grad = True`` gives PyG's layer a semi-gradient; set here
        it was stored and never read, and the fused full gradient stayed (2.96 off PyG's
        x-gradient on a 7-vertex graph). The semi-gradient runs PyG's module, chosen at
        construction."""
        if name == "semi_grad" and self.kind in ("var", "std"):
            raise AttributeError(f"{self!r} in a gnnfuse layer is a fused reduction with the full gradient: "
                                 f"semi_grad set after construction would be ignored; build the layer with "
                                 f"aggr_kwargs={{'semi_grad': {value!r}}} (or aggrs_kwargs in a list) instead")
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        return f"{_PYG_CLASSES[self.kind]}()"


class LinearHeads(nn.Module):
    """One linear map per aggregation output, held as PyG's ``HeteroDictLinear`` holds
    them (``lins.<i>``), so the ``attn`` mode's state loads from PyG, and drawn as it
    draws them: each at its construction, then all once more."""

    def __init__(self, in_channels: list[int], out_channels: int):
        super().__init__()
        self.lins = nn.ModuleList(pyg_init.linear(width, out_channels) for width in in_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in self.lins:
            pyg_init.reset_linear(lin)

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [lin(x) for lin, x in zip(self.lins, inputs)]


class MultiAggregation(nn.Module):
    """Several aggregations of the same messages, combined by ``mode`` as PyG's
    ``MultiAggregation`` does: ``cat`` concatenates, ``proj`` maps the concatenation
    through ``lin``, ``attn`` maps each through ``lin_heads`` and mixes them with
    ``multihead_attn`` (averaged over the aggregations), and a dense mode (sum, mean, max,
    min, logsumexp, std, var) reduces over them. Parameter names and shapes are PyG's."""

    def __init__(self, layer: str, aggrs: list[Any], aggrs_kwargs: list[dict] | None = None,
                 mode: str = "cat", mode_kwargs: dict | None = None):
        super().__init__()
        if not aggrs:
            raise ValueError(f"{layer}: aggr=[] names no aggregation")
        if any(isinstance(a, (list, tuple)) for a in aggrs):
            raise ValueError(f"{layer}: aggr={aggrs!r} nests a list; PyG's aggregation lists are flat")
        aggrs_kwargs = aggrs_kwargs or [{}] * len(aggrs)
        if len(aggrs_kwargs) != len(aggrs):
            raise ValueError(f"{layer}: aggrs_kwargs has {len(aggrs_kwargs)} entries for {len(aggrs)} aggregations")
        if mode not in _MODES:
            raise ValueError(f"{layer}: aggr_kwargs mode={mode!r} is not one of PyG's combine modes {list(_MODES)}")
        self.aggrs = nn.ModuleList(resolve_aggregation(layer, a, kw) for a, kw in zip(aggrs, aggrs_kwargs))
        self.mode = mode
        mode_kwargs = dict(mode_kwargs or {})
        self.in_channels, self.out_channels = mode_kwargs.pop("in_channels", None), mode_kwargs.pop("out_channels", None)
        if mode in ("proj", "attn"):
            if len(aggrs) == 1:
                raise ValueError(f"{layer}: combine mode {mode!r} needs several aggregations")
            if self.in_channels is None or self.out_channels is None:
                raise ValueError(f"{layer}: combine mode {mode!r} needs in_channels and out_channels in mode_kwargs")
            if isinstance(self.in_channels, int):
                self.in_channels = [self.in_channels] * len(aggrs)
            if mode == "proj":
                self.lin = nn.Linear(sum(self.in_channels), self.out_channels, **mode_kwargs)   # PyG: torch's
            else:
                self.lin_heads = LinearHeads(self.in_channels, self.out_channels)
                self.multihead_attn = nn.MultiheadAttention(self.out_channels, mode_kwargs.pop("num_heads", 1),
                                                            **mode_kwargs)

    def reset_parameters(self) -> None:
        for module in self.aggrs:
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        if self.mode == "proj":
            self.lin.reset_parameters()
        elif self.mode == "attn":
            self.lin_heads.reset_parameters()
            self.multihead_attn._reset_parameters()

    def get_out_channels(self, in_channels: int) -> int:
        """The combined width for messages of width ``in_channels`` (PyG's rule)."""
        if self.out_channels is not None:
            return self.out_channels
        return in_channels * len(self.aggrs) if self.mode == "cat" else in_channels

    def combine(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        if len(outputs) == 1:
            return outputs[0]
        if self.mode == "cat":
            return torch.cat(outputs, dim=-1)
        if self.mode == "proj":
            return self.lin(torch.cat(outputs, dim=-1))
        if self.mode == "attn":
            stacked = torch.stack(self.lin_heads(outputs), dim=0)     # [aggregations, N, C]: a sequence per vertex
            return self.multihead_attn(stacked, stacked, stacked)[0].mean(dim=0)
        out = getattr(torch, self.mode)(torch.stack(outputs, dim=0), dim=0)
        return out if isinstance(out, torch.Tensor) else out[0]      # max/min return (values, indices)

    def extra_repr(self) -> str:
        return f"mode={self.mode}"


def pyg_aggr_name(aggr: Any) -> Any:
    """``aggr`` as PyG's layers keep it in ``self.aggr``: a string, or a list of strings."""
    return [str(a) for a in aggr] if isinstance(aggr, (list, tuple)) else str(aggr)


def resolve_aggregation(layer: str, aggr: Any, aggr_kwargs: dict | None = None) -> nn.Module:
    """The module an ``aggr`` argument means: a `Reduction` gnnfuse fuses, a
    `MultiAggregation` of a list, or (not fused) PyG's module for that name, or the
    module given. ``aggr_kwargs`` are passed as PyG passes them (a list's: ``aggrs_kwargs``,
    ``mode``, ``mode_kwargs``)."""
    aggr_kwargs = dict(aggr_kwargs or {})
    if isinstance(aggr, (list, tuple)):
        return MultiAggregation(layer, list(aggr), **aggr_kwargs)
    if isinstance(aggr, str) and aggr.lower() in _FUSED_NAMES:
        kind = _FUSED_NAMES[aggr.lower()]
        taken = _MOMENT_KWARGS if kind in ("var", "std") else set()
        if set(aggr_kwargs) - taken:
            raise TypeError(f"{layer}(aggr={aggr!r}) takes {sorted(taken) or 'no'} aggr_kwargs, "
                            f"got {sorted(aggr_kwargs)}")
        if not aggr_kwargs.get("semi_grad"):
            return Reduction(kind)
        # semi_grad=True: PyG's module, run eagerly below like the module form
    if isinstance(aggr, nn.Module):
        if aggr_kwargs:
            raise TypeError(f"{layer}: aggr_kwargs configure an aggregation given by name, not the module {aggr}")
        kind = _fusable_pyg_module(aggr)
        return aggr if kind is None else Reduction(kind)
    if not isinstance(aggr, str):
        raise ValueError(f"{layer}: aggr must be a name, a list of names or an Aggregation module, got {aggr!r}")
    try:
        from torch_geometric.nn.resolver import aggregation_resolver
    except ImportError as exc:
        raise ImportError(f"{layer}(aggr={aggr!r}): {_FUSED_DESCRIPTION}; other aggregations run PyG's own "
                          "Aggregation module, so install torch_geometric (pip install torch_geometric)") from exc
    return aggregation_resolver(aggr, **aggr_kwargs)


def _fusable_pyg_module(module: nn.Module, in_list: bool = False) -> str | None:
    """The `Reduction` kind of one of PyG's parameter-free basic aggregation modules, else
    None. Alone, var/std fuse only with their default full gradient; in a list PyG's
    ``MultiAggregation`` computes them together whatever their ``semi_grad``
    (`_list_semi_grad` says which gradient they all get)."""
    if type(module).__module__ != "torch_geometric.nn.aggr.basic":
        return None
    kind = _KIND_OF_PYG_CLASS.get(type(module).__name__)
    semi_grad = getattr(getattr(module, "var_aggr", module), "semi_grad", False)
    return None if semi_grad and not in_list else kind


def _list_semi_grad(slots: list[nn.Module]) -> bool:
    """Whether a list's var and std get PyG's semi-gradient: its ``MultiAggregation``
    runs them in one ``FusedAggregation``, whose ``semi_grad`` is set by any
    ``VarAggregation`` entry's and holds for every var and std of the list (a
    ``StdAggregation``'s own ``semi_grad`` is not read there); the squares' sum then
    takes no gradient (``x.detach() * x.detach()``), unlike one var aggregation's
    semi-gradient (its mean under ``no_grad``)."""
    return any(type(slot).__name__ == "VarAggregation" and type(slot).__module__.startswith("torch_geometric")
               and slot.semi_grad for slot in slots)


def aggregate(layer: str, module: nn.Module, graph: Graph, messages: torch.Tensor) -> torch.Tensor:
    """``module``'s aggregation of the per-source ``messages`` into each destination of
    ``graph``: the fused reductions in one compiled program, the others eagerly. A
    multi-aggregation (ours, or PyG's passed as a module: the same ``aggrs``/``combine``)
    fuses its reductions and combines as it defines."""
    multi = type(module).__name__ == "MultiAggregation"
    slots = _slots(module)
    kinds = [slot.kind if isinstance(slot, Reduction) else _fusable_pyg_module(slot, multi) for slot in slots]
    moments = tuple(k for k in kinds if k is not None)
    fused = _fused(graph, messages, moments, multi and _list_semi_grad(slots)) if moments else {}
    outputs = [fused[kind] if kind is not None
               else _softmax(graph, messages, slot) if _is_fusable_softmax(slot)
               else _eager(layer, slot, graph, messages) for slot, kind in zip(slots, kinds)]
    return module.combine(outputs) if multi else outputs[0]


def _slots(module: nn.Module) -> list[nn.Module]:
    """The aggregations ``module`` computes: a multi-aggregation's (ours, or PyG's passed
    as a module), else the module itself."""
    return list(module.aggrs) if type(module).__name__ == "MultiAggregation" else [module]


def eager_slots(module: nn.Module) -> list[str]:
    """The class names of ``module``'s aggregations that `aggregate` runs eagerly."""
    multi = type(module).__name__ == "MultiAggregation"
    return [type(slot).__name__ for slot in _slots(module) if not isinstance(slot, Reduction)
            and _fusable_pyg_module(slot, multi) is None and not _is_fusable_softmax(slot)]


def _is_fusable_softmax(module: nn.Module) -> bool:
    """PyG's ``SoftmaxAggregation`` with full gradients (a learnt ``t``, or ``semi_grad`` off)."""
    return (type(module).__name__ == "SoftmaxAggregation" and type(module).__module__.startswith("torch_geometric")
            and (module.learn or not module.semi_grad))


@frontend.vertex
def _softmax_weighted_sum(v):
    # Normalised per edge, as PyG does, so a vertex without in-edges sums nothing (0).
    peak = max([u.scaled for u in v.innbs])
    total = sum([torch.exp(u.scaled - peak) for u in v.innbs])
    return sum([torch.exp(u.scaled - peak) / total * u.h for u in v.innbs])


def _softmax(graph: Graph, messages: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """PyG's softmax aggregation, ``sum_u softmax_u(t * x_u) * x_u`` per feature channel
    (PyG's ``t``: a number, or a learnt [channels] parameter, one per channel group). The
    scaling runs in torch on the source rows, so ``t``'s gradient flows through it. PyG
    scales gathered rows, so a row no edge reads (a NaN feature there) never meets ``t``:
    such rows are scaled as 1s, or ``t``'s gradient would be ``0 * NaN``."""
    t = module.t
    if isinstance(t, torch.Tensor) and module.channels != 1:
        t = t.view(-1, module.channels)
    scaled = _unread_rows_as_ones(graph, messages) * t if isinstance(t, torch.Tensor) or t != 1 else messages
    return _softmax_weighted_sum(graph, {"h": messages, "scaled": scaled})


def _unread_rows_as_ones(graph: Graph | GraphRef, messages: torch.Tensor) -> torch.Tensor:
    """``messages`` with 1s on the source rows no edge reads: their gradient is then an
    exact 0, where work done on every row (not on gathered rows, as PyG does) would give a
    NaN feature's row ``0 * NaN``. Under ``torch.compile`` the graph is a reference
    (`runtime.compile_op.GraphRef`): its out-degrees are counted in the traced graph, as
    the in-degrees of its reverse."""
    if isinstance(graph, GraphRef):
        out_degrees = graph.derived("reversed").in_degrees(messages.dtype)
    else:
        out_degrees = graph.out_degrees()
    read = (out_degrees > 0).view(-1, *(1,) * (messages.dim() - 1))
    return torch.where(read, messages, 1.0)


def _fused(graph: Graph, messages: torch.Tensor, kinds: tuple[str, ...],
           semi_grad: bool = False) -> dict[str, torch.Tensor]:
    """Each fused kind's result: the moments it needs from one compiled program, then the
    per-vertex arithmetic of var (E[x^2] - E[x]^2) and std (PyG's: sqrt of var clamped at
    1e-5, 0 where that clamp decided) in torch. The squares are computed once per source
    row, and a NaN on a row no edge reads would meet its zero gradient there (PyG squares
    gathered rows only), so those rows are read as 1s. ``semi_grad`` (a list's, see
    `_list_semi_grad`): E[x^2] of the detached messages, in a program of its own."""
    moments = tuple(sorted({m for kind in kinds for m in _MOMENTS[kind]}))
    if "square_mean" in moments:
        messages = _unread_rows_as_ones(graph, messages)
    own = tuple(m for m in moments if not (semi_grad and m == "square_mean"))
    result = _reductions(own)(graph, {"h": messages}) if own else {}
    result = result if isinstance(result, dict) else {own[0]: result}
    if len(own) < len(moments):
        squares = _reductions(("square_mean",))(graph, {"h": messages.detach()})
        result["square_mean"] = squares["square_mean"] if isinstance(squares, dict) else squares
    out = {}
    for kind in kinds:
        if kind in ("var", "std"):
            var = result["square_mean"] - result["mean"] * result["mean"]
            if kind == "std":
                std = var.clamp(min=1e-5).sqrt()
                var = std.masked_fill(std <= math.sqrt(1e-5), 0.0)
            out[kind] = var
        else:
            out[kind] = result[kind]
    return out


@frontend.udf_factory
def _reductions(moments: tuple[str, ...]) -> frontend.VertexFunction:
    """A vertex function computing every reduction in ``moments`` over the same
    in-neighbour rows (one program, so one kernel reads each gathered row once)."""
    def reductions(v):
        rows = [u.h for u in v.innbs]
        out = {}
        for moment in moments:
            if moment == "sum":
                out[moment] = sum(rows)
            elif moment == "mean":
                out[moment] = sum(rows) / len(rows)
            elif moment == "square_mean":
                out[moment] = sum([u.h * u.h for u in v.innbs]) / len(rows)
            elif moment == "max":
                out[moment] = max(rows)
            else:
                out[moment] = min(rows)
        return out
    return frontend.vertex(reductions)


def _eager(layer: str, module: nn.Module, graph: Graph, messages: torch.Tensor) -> torch.Tensor:
    """PyG's ``aggregate``: ``module`` on the messages in edge order, indexed by
    destination, as PyG's ``propagate`` calls it (so an order-dependent aggregation such
    as LSTM sees PyG's order and refuses an unsorted index as PyG does)."""
    name = type(module).__name__
    if (layer, name) not in _WARNED:
        _WARNED.add((layer, name))
        reason = _UNFUSED_REASONS.get(name, _FUSED_DESCRIPTION)
        warn(f"{layer}: aggregation {module} runs eagerly through its module, not fused by gnnfuse: "
             f"{reason}")
    rows = messages[graph.src]
    if _first_vertex_unread(module, graph):
        # PyG's quantiles index row ``q * (count - 1) + start`` of each vertex's sorted
        # messages before masking the empty ones: -0.5 for vertex 0 without in-edges, an
        # IndexError (a directed graph's source, a rank's partition, a sampled block). A
        # zero row for a stand-in vertex in front gives every real vertex a start >= 1.
        rows = torch.cat([rows.new_zeros((1, *rows.shape[1:])), rows])
        index = torch.cat([graph.dst.new_zeros(1), graph.dst + 1])
        return module(rows, index, dim_size=graph.num_nodes + 1)[1:]
    return module(rows, graph.dst, dim_size=graph.num_nodes)


def _first_vertex_unread(module: nn.Module, graph: Graph) -> bool:
    """Whether ``module`` is PyG's quantile aggregation (median included) and vertex 0
    has no in-edges, where PyG's own call fails (`_eager`)."""
    quantile = any(klass.__name__ == "QuantileAggregation" and klass.__module__.startswith("torch_geometric")
                   for klass in type(module).__mro__)
    return quantile and graph.num_nodes > 0 and not bool((graph.dst == 0).any())
