"""Dynamic kernel placement (GraphTensor §V-A, Table I): per layer and batch, aggregate
the input rows and then apply the layer's linear map, or map first and aggregate the
narrower (or wider) result.

For a layer ``h_dst = W · mean_{u in N(v)} x_u`` over a block with ``n_src`` sources,
``n_dst`` destinations and ``E`` edges, from ``F`` to ``H`` channels, the two orders cost

- aggregate first: aggregate(E, n_dst, width F) + matmul(n_dst rows, F -> H)
- combine first:   matmul(n_src rows, F -> H) + aggregate(E, n_dst, width H)

with GraphTensor's kernel models ``matmul = alpha·rows·F·H + beta·rows·H`` and
``aggregate = gamma·E·W + delta·n_dst·W``; their difference is Table I's pair of
benefits, ``(n_src - n_dst)(alpha·F·H + beta·H)`` against ``(F - H)(gamma·E + delta·n_dst)``.
Each kernel model here also has a constant term (launch and framework overhead, which
Table I leaves out): it cancels between orders built of the same kernels, but without
it a fit over small batches bends the slopes to absorb it.
The coefficients are machine-specific, so `calibrate` fits them by least squares on
kernel times measured on the first batches of training; each kernel is timed forward
and backward, as training runs it, and with or without its input's gradient (a first
layer's input needs none: GraphTensor's special case for the first layer's BWP), so
each (kernel, gradient) pair has its own two coefficients.

Only layers whose aggregation commutes with the map take a placement (SAGEConv with
mean or sum: `SAGEConv.placement`); without one they keep the static rule
(`conv.maps_first`: map first when the graph kernels then move fewer
feature lanes forward and backward).
"""
from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple

import torch
import torch.nn.functional as F

ORDERS = ("aggregate-first", "combine-first")
KINDS = ("matmul", "matmul-weight-only", "aggregate", "aggregate-forward-only")
# the same kernel timed with and without its input's gradient, each the other's stand-in
SIBLING = {"matmul": "matmul-weight-only", "matmul-weight-only": "matmul",
           "aggregate": "aggregate-forward-only", "aggregate-forward-only": "aggregate"}


class KernelTime(NamedTuple):
    """One measured kernel: ``kind`` (one of `KINDS`), its sizes and seconds (forward
    and backward). For a matmul ``rows`` are its rows; for an aggregation ``rows`` are
    the destinations and ``width_in == width_out`` the feature width."""
    kind: str
    rows: int
    edges: int
    width_in: int
    width_out: int
    seconds: float


def _terms(kind: str, rows: int, edges: int, width_in: int, width_out: int) -> tuple[float, float, float]:
    """The regressors of a kernel's time: Table I's two kernel-execution factors and 1.
    Plain numbers (no `KernelTime`): a layer evaluates it four times per call."""
    if kind.startswith("matmul"):
        return rows * width_in * width_out, rows * width_out, 1.0
    return edges * width_in, rows * width_in, 1.0


@dataclass
class PlacementModel:
    """Fitted coefficients per kernel kind: ``coefficients[kind] = (a, b, c)`` with
    ``time = a·term1 + b·term2 + c`` (`_terms`), and the decisions taken so far."""
    coefficients: dict[str, tuple[float, float, float]]

    def __post_init__(self) -> None:
        self.decisions: Counter[tuple[int, int, str]] = Counter()

    @classmethod
    def fit(cls, samples: Iterable[KernelTime]) -> PlacementModel:
        """Least squares per kernel kind, constrained to non-negative coefficients.
        A time that is not a finite number of seconds >= 0 is refused: a NaN crashed
        LAPACK with an internal assertion, and an infinite or negative one left every
        coefficient 0 (no subset fits better than nothing), a model that silently always
        aggregates first."""
        by_kind: dict[str, list[KernelTime]] = {}
        for sample in samples:
            if not (math.isfinite(sample.seconds) and sample.seconds >= 0):
                raise ValueError(f"kernel time {sample.seconds!r} s of a {sample.kind} kernel ({sample.rows} rows, "
                                 f"{sample.edges} edges, width {sample.width_in} -> {sample.width_out}) cannot be "
                                 f"fitted: kernel times must be finite numbers of seconds >= 0")
            by_kind.setdefault(sample.kind, []).append(sample)
        if not by_kind:
            raise ValueError("no kernel times to fit: calibrate on at least one batch of a model with a "
                             "placeable layer (SAGEConv, mean or sum)")
        return cls({kind: _nonnegative_fit(rows) for kind, rows in by_kind.items()})

    def predict(self, kind: str, rows: int, edges: int, width_in: int, width_out: int) -> float:
        """Predicted seconds of one kernel. A kind calibration never timed takes the
        coefficients of the same kernel with the other input-gradient setting (`SIBLING`):
        a model calibrated on one layer times only kernels without an input gradient,
        and calling it on an input that needs one failed with KeyError: 'matmul'."""
        coefficients = self.coefficients.get(kind) or self.coefficients.get(SIBLING[kind])
        if coefficients is None:
            raise ValueError(f"this placement model has no fitted times of a {kind} kernel (nor of "
                             f"{SIBLING[kind]}): fit it on samples of both a matmul and an aggregation")
        a, b, c = coefficients
        first, second, _ = _terms(kind, rows, edges, width_in, width_out)
        return a * first + b * second + c

    def order_times(self, n_src: int, n_dst: int, edges: int, f_in: int, f_out: int,
                    input_grad: bool) -> dict[str, float]:
        """Predicted seconds (forward + backward) of each order for one layer."""
        matmul = "matmul" if input_grad else "matmul-weight-only"
        aggregate_x = "aggregate" if input_grad else "aggregate-forward-only"
        return {"aggregate-first": self.predict(aggregate_x, n_dst, edges, f_in, f_in)
                + self.predict(matmul, n_dst, 0, f_in, f_out),
                "combine-first": self.predict(matmul, n_src, 0, f_in, f_out)
                + self.predict("aggregate", n_dst, edges, f_out, f_out)}

    def choose(self, n_src: int, n_dst: int, edges: int, f_in: int, f_out: int, input_grad: bool) -> str:
        times = self.order_times(n_src, n_dst, edges, f_in, f_out, input_grad)
        order = "combine-first" if times["combine-first"] < times["aggregate-first"] else "aggregate-first"
        self.decisions[f_in, f_out, order] += 1
        return order

    def combine_first(self, graph: Any, f_in: int, f_out: int, input_grad: bool) -> bool:
        """What `SAGEConv` asks: map before aggregating on this graph?"""
        return self.choose(graph.num_src_nodes, graph.num_dst_nodes, graph.num_edges, f_in, f_out,
                           input_grad) == "combine-first"

    def state(self) -> dict[str, Any]:
        """The fitted coefficients and the decisions so far, as plain numbers (what a
        training checkpoint holds: `from_state` rebuilds this model from it, where a
        refit on new kernel times could choose other orders for the same batches)."""
        return {"coefficients": {kind: list(c) for kind, c in self.coefficients.items()},
                "decisions": [[f_in, f_out, order, count] for (f_in, f_out, order), count in self.decisions.items()]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PlacementModel:
        model = cls({kind: tuple(c) for kind, c in state["coefficients"].items()})
        model.decisions.update({(f_in, f_out, order): count for f_in, f_out, order, count in state["decisions"]})
        return model

    def describe(self) -> str:
        lines = ["dynamic kernel placement (GraphTensor Table I), fitted by least squares:"]
        for kind in (k for k in KINDS if k in self.coefficients):    # a first layer alone has no "matmul"
            a, b, c = self.coefficients[kind]
            form = "a*rows*F*H + b*rows*H + c" if kind.startswith("matmul") else "a*E*W + b*n_dst*W + c"
            lines.append(f"  {kind:24s} t = {form:26s} a={a:.3e} b={b:.3e} c={c:.3e}")
        for (f_in, f_out, order), count in sorted(self.decisions.items()):
            lines.append(f"  layer {f_in}->{f_out}: {order} x{count}")
        return "\n".join(lines)


class FixedPlacement(PlacementModel):
    """Always one order (the baselines DKP is measured against)."""

    def __init__(self, order: str):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        super().__init__({})
        self.order = order

    def choose(self, n_src: int, n_dst: int, edges: int, f_in: int, f_out: int, input_grad: bool) -> str:
        self.decisions[f_in, f_out, self.order] += 1
        return self.order


def _nonnegative_fit(samples: list[KernelTime]) -> tuple[float, float, float]:
    """Non-negative least squares over the three terms, by trying every subset of
    columns (eight) and keeping the best fit whose coefficients are all >= 0."""
    terms = torch.tensor([_terms(s.kind, s.rows, s.edges, s.width_in, s.width_out) for s in samples],
                         dtype=torch.float64)
    seconds = torch.tensor([s.seconds for s in samples], dtype=torch.float64)
    scale = terms.abs().amax(0).clamp_min(1e-300)               # conditioning: the terms differ by 1e6
    best, best_residual = (0.0, 0.0, 0.0), float(seconds.pow(2).sum())
    # Fits whose residuals differ by rounding alone are ties, kept by the first found: with
    # collinear terms (one width in every sample) several subsets fit exactly, and the one
    # kept was decided by the last bits of LAPACK's residuals, which vary from call to call
    tie = 1e-12 * best_residual
    for mask in itertools.product((False, True), repeat=terms.shape[1]):
        columns = [i for i, keep in enumerate(mask) if keep]
        if not columns:
            continue
        a = terms[:, columns] / scale[columns]
        solution = torch.linalg.lstsq(a, seconds.unsqueeze(1)).solution.squeeze(1)
        if bool((solution < 0).any()):
            continue
        residual = float((a @ solution - seconds).pow(2).sum())
        if residual < best_residual - tie:
            coefficients = [0.0] * terms.shape[1]
            for i, value in zip(columns, (solution / scale[columns]).tolist()):
                coefficients[i] = value
            best, best_residual = tuple(coefficients), residual
    return best


# --- measuring kernels ------------------------------------------------------------------
def _seconds(run: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Best of ``repeats`` runs of ``run``, synchronized on a GPU."""
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        begin = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - begin)
    return best


def kernel_times(graph: Any, aggregate: Callable, f_in: int, f_out: int, input_grad: bool,
                 repeats: int = 2) -> list[KernelTime]:
    """Forward + backward seconds of the four kernels of one layer's two orders on
    ``graph`` (a block): the matmul on the destinations and on the sources, the
    aggregation at width ``f_in`` and at ``f_out``. ``aggregate(graph, {"h": x})`` is the
    layer's compiled aggregation. ``repeats`` must be at least 1: with none, every time
    was infinite and the fit silently gave an all-zero model. The random inputs come from
    a forked random state: drawn from the caller's, a seeded run that calibrated trained
    on other initialisations and dropout masks than the same seed without calibrating."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1 to time a kernel, got {repeats!r}")
    device = graph.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return _timed_kernels(graph, aggregate, f_in, f_out, input_grad, repeats)


def _timed_kernels(graph: Any, aggregate: Callable, f_in: int, f_out: int, input_grad: bool,
                   repeats: int) -> list[KernelTime]:
    """`kernel_times` on the random state it forked."""
    device = graph.device
    n_src, n_dst, edges = graph.num_src_nodes, graph.num_dst_nodes, graph.num_edges
    weight = torch.randn(f_out, f_in, device=device, requires_grad=True)
    matmul = "matmul" if input_grad else "matmul-weight-only"
    aggregate_x = "aggregate" if input_grad else "aggregate-forward-only"

    def time_matmul(rows: int) -> float:
        x = torch.randn(rows, f_in, device=device, requires_grad=input_grad)
        return _seconds(lambda: F.linear(x, weight).sum().backward(), device, repeats)

    def time_aggregate(width: int, grad: bool) -> float:
        x = torch.randn(n_src, width, device=device, requires_grad=grad)
        if grad:
            return _seconds(lambda: aggregate(graph, {"h": x}).sum().backward(), device, repeats)
        return _seconds(lambda: aggregate(graph, {"h": x}), device, repeats)

    return [KernelTime(matmul, n_dst, 0, f_in, f_out, time_matmul(n_dst)),
            KernelTime(matmul, n_src, 0, f_in, f_out, time_matmul(n_src)),
            KernelTime(aggregate_x, n_dst, edges, f_in, f_in, time_aggregate(f_in, input_grad)),
            KernelTime("aggregate", n_dst, edges, f_out, f_out, time_aggregate(f_out, True))]


# --- models ---------------------------------------------------------------------------
def placeable(conv: Any) -> bool:
    """Layers whose aggregation commutes with their linear map (a placement applies): by
    the aggregation the layer runs (``aggr_module``), not its ``aggr`` name, which a user
    may have set after construction."""
    from .conv import SAGEConv
    return isinstance(conv, SAGEConv) and _reduction(conv) in ("mean", "sum")


def _reduction(conv: Any) -> str | None:
    return getattr(conv.aggr_module, "kind", None)


def install(model: Any, placement: PlacementModel | None) -> None:
    """Let every placeable layer of ``model`` choose its order by ``placement`` (None:
    back to the static rule)."""
    for conv in model.modules():
        if placeable(conv):
            conv.placement = placement


def calibrate(model: Any, batches: Iterable[Any], repeats: int = 2) -> PlacementModel:
    """Fit a `PlacementModel` on the kernel times of ``model``'s placeable layers over
    ``batches`` (mini-batches of `gnnfuse.loader`; a few from the first epoch), and
    install it. Layer 0's input (the features) is taken to need no gradient."""
    from .conv import _AGGREGATORS
    samples = []
    for batch in batches:
        for index, conv in enumerate(model.convs):
            if placeable(conv):
                samples += kernel_times(batch.blocks[index].graph, _AGGREGATORS[_reduction(conv)],
                                        conv.lin_l.in_features, conv.out_channels, index > 0, repeats)
    placement = PlacementModel.fit(samples)
    install(model, placement)
    return placement
