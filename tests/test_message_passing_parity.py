"""Differential tests of `gnnfuse.nn.MessagePassing` against PyG's eager base class:
one user layer (a class body written once, built on either base), the same weights and
inputs in float64, and every output and gradient compared -- on the reference backend
and the Triton interpreter. Each test is a PyG feature a user's layer relies on that
gave other numbers than PyG's without an error or warning (or failed where PyG runs)
before its fix, with the numbers it gave; a hypothesis test draws graphs and layers."""
from __future__ import annotations

import types
import warnings
from typing import Any, Callable, Optional

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch_geometric.nn.aggr import SoftmaxAggregation
from torch_geometric.utils import softmax

import gnnfuse.nn
from gnnfuse.frontend import pyg_message_passing
from gnnfuse.frontend.trace_cache import TraceCache
from gnnfuse.runtime import record_calls
from graph_strategies import features, graphs
from test_pyg_message_passing import assert_same as close

# 6 vertices (4 and 5 send nothing, 4 receives nothing), a self loop (3 -> 3) and a
# duplicate edge (0 -> 1 twice)
EDGES = torch.tensor([[0, 1, 2, 3, 1, 2, 2, 0, 5, 0],
                      [1, 2, 3, 3, 0, 0, 1, 1, 1, 1]])


def make_aggregating(Base: type) -> type:
    """Messages are the sources' rows; ``aggr`` is the constructor's."""
    class Aggregating(Base):
        def __init__(self, aggr, aggr_kwargs=None):
            super().__init__(aggr=aggr, aggr_kwargs=aggr_kwargs)

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            return x_j
    return Aggregating


def run(layer: torch.nn.Module, *args: Any, **kwargs: Any):
    """Output and the gradients of a fixed projection of it w.r.t. every float input and
    parameter."""
    leaves = [a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in args]
    out = layer(*leaves, **kwargs)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    inputs = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad] + list(layer.parameters())
    return out.detach(), torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True)


def assert_same(ours, theirs) -> None:
    close(ours, theirs, rtol=1e-12, atol=1e-12)


def compiled_run(layer: torch.nn.Module, *args: Any, **kwargs: Any):
    """`run`, checking that a compiled program ran and nothing fell back."""
    with warnings.catch_warnings(record=True) as caught, record_calls() as calls:
        warnings.simplefilter("always")
        result = run(layer, *args, **kwargs)
    fallbacks = [str(w.message) for w in caught if "eager message passing" in str(w.message)]
    assert not fallbacks, fallbacks
    assert calls, "no compiled program ran"
    return result


def twins(make: Callable[..., type], *args, **kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The layer ``make(Base, *args)(**kwargs)`` on gnnfuse's base and on PyG's, with the
    same float64 weights."""
    ours = make(gnnfuse.nn.MessagePassing, *args)(**kwargs).double()
    theirs = make(pyg_nn.MessagePassing, *args)(**kwargs).double()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize("aggr, aggr_kwargs", [
    (lambda: SoftmaxAggregation(t=0.3), None), (lambda: SoftmaxAggregation(t=0.3, semi_grad=True), None),
    (lambda: "softmax", {"t": 0.3})], ids=["module", "semi_grad", "aggr_kwargs"])
def test_a_softmax_temperature_scales_in_the_messages_dtype(aggr, aggr_kwargs, backend, device):
    """PyG multiplies the messages by the Python float ``t``; the trace took it as a
    float32 constant (0.30000001192...): 1.4e-8 off PyG's float64 output."""
    ours, theirs = twins(make_aggregating, aggr=aggr(), aggr_kwargs=aggr_kwargs)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    assert_same(compiled_run(ours.to(device), x, edges), run(theirs.to(device), x, edges))


def test_genconv_with_a_fixed_temperature_matches_pyg(backend, device):
    """PyG's GENConv(aggr='softmax', t=0.3) through the same aggregation: 1.3e-9 off PyG's
    float64 output before."""
    torch.manual_seed(0)
    theirs = pyg_nn.GENConv(6, 4, aggr="softmax", t=0.3).double().to(device)
    ours = gnnfuse.nn.GENConv(6, 4, aggr="softmax", t=0.3).double().to(device)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    assert_same(compiled_run(ours, x, edges), run(theirs, x, edges))


def make_reverse_pair(Base: type, call: str) -> type:
    """``flow='target_to_source'`` with a pair ``x=(x, 2 * x)``, its ``propagate`` called
    with keywords only (PyG generates its template propagate from the call it finds in
    the class's source), with ``**kwargs`` or with ``size`` given positionally (PyG
    cannot parse either call, so it runs its generic propagate), or a ``message`` taking
    ``ptr`` without ``Optional[Tensor]`` (its template then fails on the type, generic
    too). The two read the pair differently. One class per call: PyG parses the first
    call in a class's source."""
    class Keywords(Base):
        def __init__(self):
            super().__init__(aggr="add", flow="target_to_source")

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=(x, 2 * x))

        def message(self, x_i, x_j):
            return 3 * x_i + x_j

    class StarKwargs(Base):
        def __init__(self):
            super().__init__(aggr="add", flow="target_to_source")

        def forward(self, x, edge_index, **kwargs):
            return self.propagate(edge_index, x=(x, 2 * x), **kwargs)

        def message(self, x_i, x_j):
            return 3 * x_i + x_j

    class PositionalSize(Base):
        def __init__(self):
            super().__init__(aggr="add", flow="target_to_source")

        def forward(self, x, edge_index):
            return self.propagate(edge_index, None, x=(x, 2 * x))

        def message(self, x_i, x_j):
            return 3 * x_i + x_j

    class UntypedPtr(Base):
        def __init__(self):
            super().__init__(aggr="add", flow="target_to_source")

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=(x, 2 * x))

        def message(self, x_i, x_j, ptr):       # PyG's aggregate types it Optional[Tensor]
            return 3 * x_i + x_j
    return {"keywords": Keywords, "**kwargs": StarKwargs, "positional size": PositionalSize,
            "untyped ptr": UntypedPtr}[call]


@pytest.mark.parametrize("call", ["keywords", "**kwargs", "positional size", "untyped ptr"])
def test_a_pair_is_read_as_the_propagate_pyg_runs_reads_it(call, backend, device):
    """PyG's template propagate reads ``x_j`` from ``x[0]`` under either flow; its generic
    one, which PyG runs where it cannot build the template, from ``x[flow's j]``: ``x[1]``
    under target_to_source. The trace always read ``x[0]``: the output was 18.1 off
    PyG's where PyG ran its generic propagate."""
    ours, theirs = twins(make_reverse_pair, call)
    generic = type(theirs).propagate is pyg_nn.MessagePassing.propagate
    assert generic == (call != "keywords")     # what PyG runs for each call
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    assert_same(compiled_run(ours.to(device), x, edges), run(theirs.to(device), x, edges))


def make_subclassed_pair(Base: type, parent_first: bool) -> type:
    """``make_reverse_pair``'s keyword layer and a subclass whose ``forward`` passes
    ``**kwargs``: PyG cannot build the subclass's template and keeps what it inherits,
    the parent's template if the parent was instantiated first (PyG installs it on the
    parent class then), else the generic propagate."""
    parent = make_reverse_pair(Base, "keywords")

    class Child(parent):
        def forward(self, x, edge_index, **kwargs):
            return self.propagate(edge_index, x=(x, 2 * x), **kwargs)
    if parent_first:
        parent()
    return Child


@pytest.mark.parametrize("parent", ["first", "never", "after the subclass"])
def test_a_subclass_reads_a_pair_as_the_propagate_pyg_gives_it(parent, backend, device):
    """Which propagate PyG runs for such a subclass depends on whether its parent has
    been instantiated by the time of the call (PyG looks it up then); reading the pair by
    the subclass's own template alone was 5.5 off PyG's output where the parent came
    first, and by what the subclass found when it was built 11.2 off where the parent came
    after it."""
    ours, theirs = twins(make_subclassed_pair, parent == "first")
    if parent == "after the subclass":
        type(ours).__bases__[0](), type(theirs).__bases__[0]()
    generic = type(theirs).propagate is pyg_nn.MessagePassing.propagate
    assert generic == (parent == "never")
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    assert_same(compiled_run(ours.to(device), x, edges), run(theirs.to(device), x, edges))


class FuzzedMessage:
    """One of five messages (``self.variant``): the source row, a product of both ends
    and the edge weight, a difference, an attention-weighted source row (PyG's softmax
    over each target's in-edges), a gated one. A base of both classes below, before
    PyG's or gnnfuse's ``MessagePassing``."""

    def message(self, x_i: torch.Tensor, x_j: torch.Tensor, edge_weight: torch.Tensor, index: torch.Tensor,
                ptr: Optional[torch.Tensor], size_i: Optional[int]) -> torch.Tensor:
        w = edge_weight.view(-1, *[1] * (x_j.dim() - 1))
        if self.variant == "src":
            return x_j
        if self.variant == "prod":
            return x_i * x_j * w
        if self.variant == "diff":
            return F.leaky_relu(x_j - x_i, 0.2)
        score = (x_i * x_j).sum(-1)
        if self.variant == "att":
            return softmax(score, index, ptr, size_i).unsqueeze(-1) * x_j
        return torch.sigmoid(score).unsqueeze(-1) * x_j + w


def make_fuzzed(Base: type, generic: bool) -> type:
    """A layer of every combination drawn below: the message, ``aggr``, ``flow``, features
    [N, F] or [N, heads, F / heads] (``node_dim=0``), ``x`` or a pair ``(x, 2 * x)``;
    its ``propagate`` call is one PyG parses (template) or one it cannot (``generic``)."""
    class Fuzzed(FuzzedMessage, Base):
        def __init__(self, variant, aggr, flow, heads):
            super().__init__(aggr=aggr, flow=flow, node_dim=0 if heads else -2)
            self.variant, self.heads = variant, heads
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, edge_index, edge_weight, pair):
            h = self.lin(x).view(-1, 2, 2) if self.heads else self.lin(x)
            return self.propagate(edge_index, x=(h, 2 * h) if pair else h, edge_weight=edge_weight)

    class FuzzedGeneric(FuzzedMessage, Base):
        def __init__(self, variant, aggr, flow, heads):
            super().__init__(aggr=aggr, flow=flow, node_dim=0 if heads else -2)
            self.variant, self.heads = variant, heads
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, edge_index, edge_weight, pair, **kwargs):
            h = self.lin(x).view(-1, 2, 2) if self.heads else self.lin(x)
            return self.propagate(edge_index, x=(h, 2 * h) if pair else h, edge_weight=edge_weight, **kwargs)
    return FuzzedGeneric if generic else Fuzzed


@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=graphs(max_nodes=5, max_edges=12, hub_degrees=st.sampled_from([0, 0, 40])), data=st.data(),
       variant=st.sampled_from(["src", "prod", "diff", "att", "gate"]),
       aggr=st.sampled_from(["add", "mean", "max", "min", "softmax"]),
       flow=st.sampled_from(["source_to_target", "target_to_source"]),
       heads=st.booleans(), pair=st.booleans(), generic=st.booleans())
def test_random_layers_on_random_graphs_match_pyg(backend, device, case, data, variant, aggr, flow, heads, pair,
                                                  generic):
    """Drawn graphs (isolated vertices, loops, repeated edges, a hub, int32 or strided
    indices for gnnfuse; PyG gets the contiguous int64 copy, its scatter backward being
    wrong through an int32 index) and drawn layers: outputs and every gradient equal."""
    case = case.to(device)
    x = data.draw(features(case.num_nodes, 4, non_finite=False)).to(device)
    weight = torch.rand(case.edge_index.shape[1], dtype=torch.float64,
                        generator=torch.Generator().manual_seed(1)).to(device)
    ours, theirs = twins(make_fuzzed, generic, variant=variant, aggr=aggr, flow=flow, heads=heads)
    ours, theirs = ours.to(device), theirs.to(device)
    assert_same(compiled_run(ours, x, case.given, weight, pair), run(theirs, x, case.edge_index, weight, pair))


KEPT: list = []      # `make_keeping`'s global list
KEPT_LAST = None     # and the global `_keep_last` rebinds
KEPT_LISTS: dict = {"alpha": []}     # and the global dict of lists


def _keep_last(alpha: torch.Tensor) -> None:
    global KEPT_LAST
    KEPT_LAST = alpha


def make_keeping(Base: type, how: str) -> type:
    """Attention whose ``message`` keeps the weights (for a plot, a regulariser) in a
    container the layer holds -- appended to a list, stored under a dict key, set on an
    object's attribute -- or on a submodule (an attribute, a list it holds), in a
    global or closure list, or in a global a helper rebinds."""
    kept_here: list = []

    class Keeping(Base):
        def __init__(self):
            super().__init__(aggr="add")
            self.kept_list, self.kept_dict, self.kept = [], {}, types.SimpleNamespace(alpha=None)
            self.kept_lists = {"alpha": []}
            self.store = torch.nn.Module()
            self.store.kept = []

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_i, x_j, index):
            alpha = softmax((x_i * x_j).sum(-1), index)
            if how == "list":
                self.kept_list.append(alpha)
            elif how == "dict":
                self.kept_dict["alpha"] = alpha
            elif how == "dict of lists":
                self.kept_lists["alpha"].append(alpha)
            elif how == "global dict of lists":
                KEPT_LISTS["alpha"].append(alpha)
            elif how == "object":
                self.kept.alpha = alpha
            elif how == "module":
                self.store.alpha = alpha
            elif how == "module list":
                self.store.kept.append(alpha)
            elif how == "global":
                KEPT.append(alpha)
            elif how == "helper global":
                _keep_last(alpha)
            else:
                kept_here.append(alpha)
            return alpha.unsqueeze(-1) * x_j
    Keeping.kept_here = kept_here       # the test's handle on the closure's list
    return Keeping


@pytest.mark.parametrize("how", ["list", "dict", "object", "module", "module list", "global", "helper global",
                                 "closure", "dict of lists", "global dict of lists"])
def test_a_message_keeping_values_in_a_container_runs_pyg_semantics(how, backend, device):
    """A compiled call runs ``message`` once, on symbolic rows, when it traces: the list,
    dict or object the layer holds, or the global or closure list ``message`` appends to,
    received the tracer's symbolic values (summing the kept weights raised a
    CompileError naming message's line), on every call, with no warning; a submodule's
    attribute or list too (``self.store.alpha = alpha``, ``self.store.kept.append``), and
    a global a helper rebinds (``global last; last = alpha``), and a list inside a dict the
    layer holds or a global dict (``self.kept_lists["alpha"].append(alpha)``: the dict
    kept its items, so only its list changed). The
    call now runs PyG's propagate, warning why, and the container holds PyG's weights."""
    ours, theirs = twins(make_keeping, how)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    KEPT.clear()
    KEPT_LISTS["alpha"].clear()
    stored = r"(self\.kept|self\.store|KEPT|kept_here|global .*KEPT_LAST|a container in (self\.kept_lists|KEPT_LISTS))"
    with pytest.warns(UserWarning, match=r"message\(\) (writes into|sets) " + stored):
        result = run(ours.to(device), x, edges)
    kept = {"list": lambda layer: layer.kept_list[-1], "dict": lambda layer: layer.kept_dict["alpha"],
            "object": lambda layer: layer.kept.alpha, "module": lambda layer: layer.store.alpha,
            "module list": lambda layer: layer.store.kept[-1], "global": lambda layer: KEPT[-1],
            "helper global": lambda layer: KEPT_LAST,
            "closure": lambda layer: type(layer).kept_here[-1],
            "dict of lists": lambda layer: layer.kept_lists["alpha"][-1],
            "global dict of lists": lambda layer: KEPT_LISTS["alpha"][-1]}[how]
    ours_kept = kept(ours)
    assert_same(result, run(theirs.to(device), x, edges))
    assert type(ours_kept) is torch.Tensor
    torch.testing.assert_close(ours_kept, kept(theirs))


COUNT = torch.zeros(())     # `make_writing_in_place`'s global counter


def make_writing_in_place(Base: type, how: str) -> type:
    """``message`` writes a tensor it reaches in place, counting its calls: a buffer, a
    tensor in a list the layer holds, a global or a closure tensor; or it halves a
    parameter under ``torch.no_grad()``, or (in training) calls an MLP whose BatchNorm
    counts ``num_batches_tracked`` before its batch_norm fails the trace ("reading":
    writes nothing). One class per way, each ``message`` reading only what it writes (as
    a user's would)."""
    count = torch.zeros(())

    class WritingInPlace(Base):
        def __init__(self):
            super().__init__(aggr="add")
            self.register_buffer("count", torch.zeros(()))
            self.kept = [torch.zeros(())]
            self.w = torch.nn.Parameter(torch.linspace(-2, 2, 4))
            self.mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

    class Buffer(WritingInPlace):
        def message(self, x_j):
            self.count.add_(1)
            return x_j * self.count

    class InAList(WritingInPlace):
        def message(self, x_j):
            self.kept[0].add_(1)
            return x_j * self.kept[0]

    class Global(WritingInPlace):
        def message(self, x_j):
            COUNT.add_(1)
            return x_j * COUNT

    class Closure(WritingInPlace):
        def message(self, x_j):
            count.add_(1)
            return x_j * count

    class Parameter(WritingInPlace):
        def message(self, x_j):
            with torch.no_grad():
                self.w.mul_(0.5)
            return x_j * self.w

    class BatchNorm(WritingInPlace):
        def message(self, x_j):
            return self.mlp(x_j)

    class SpectralNorm(WritingInPlace):     # its power iteration writes the Linear's _u, _v
        def __init__(self):
            super().__init__()
            self.normed = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(4, 4))

        def message(self, x_j):
            return self.normed(x_j)

    class Reading(WritingInPlace):      # writes nothing
        def message(self, x_j):
            return x_j * self.w + self.count
    return {"buffer": Buffer, "list": InAList, "global": Global, "closure": Closure, "parameter": Parameter,
            "batch norm": BatchNorm, "spectral norm": SpectralNorm, "reading": Reading}[how]


@pytest.mark.parametrize("how", ["buffer", "list", "global", "closure", "parameter", "spectral norm", "batch norm"])
def test_a_message_writing_a_tensor_in_place_matches_pyg_on_every_call(how, backend, device):
    """A kept trace runs ``message`` once, when it traces, so its in-place write to a
    buffer, a parameter, a tensor in a list the layer holds or a global or closure tensor
    happened once and never again: a call counter gave 1x, 1x, 1x of the messages where
    PyG gave 1x, 2x, 3x (output 7.4 then 14.8 off on the second and third calls, with no
    warning), a halved weight stayed halved once. Such a ``message`` now traces on every
    call, writing once per call as PyG does, and compiles. Where the trace fails for
    another reason (a BatchNorm in ``message``), PyG's eager run wrote the tensor a second
    time on the same call (``num_batches_tracked`` 2 after one call): the tensors the
    failed trace wrote are put back first. (Refusing every such trace instead made a
    spectral-normed Linear in ``message`` fall back, which compiled before.)"""
    ours, theirs = twins(make_writing_in_place, how)
    ours, theirs = ours.to(device), theirs.to(device)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    COUNT.zero_()
    if how == "batch norm":
        with pytest.warns(UserWarning, match="batch_norm"):
            results = [run(ours, x, edges)]
        results += [run(ours, x, edges) for _ in range(2)]
    else:
        results = [compiled_run(ours, x, edges) for _ in range(3)]
    COUNT.zero_()
    for result in results:
        assert_same(result, run(theirs, x, edges))
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name
    assert torch.equal(ours.kept[0], theirs.kept[0])


def test_a_layer_made_under_inference_mode_compiles_and_its_in_place_writes_recur(backend, device):
    """Tensors made under ``torch.inference_mode`` have no version counter, which the
    in-place write check reads: every layer built and called there fell back to PyG's
    propagate ("tracing message() raised RuntimeError: Inference tensors do not track
    version counter"). Their values are compared instead: a layer that writes nothing
    compiles, and a buffer counter compiles and counts as PyG's does."""
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    with torch.inference_mode():
        for how in ("buffer", "reading"):
            ours, theirs = twins(make_writing_in_place, how)
            ours, theirs = ours.to(device), theirs.to(device)
            for _ in range(3):
                with warnings.catch_warnings(), record_calls() as calls:
                    warnings.simplefilter("error")
                    torch.testing.assert_close(ours(x, edges), theirs(x, edges), rtol=1e-12, atol=1e-12)
                assert calls
            assert ours.count.item() == theirs.count.item() == (3 if how == "buffer" else 0)


def test_a_lazy_module_in_message_initialises_and_compiles(backend, device):
    """A LazyLinear's first call writes its module's hook tables (it drops its
    initialising hook); checking a submodule's containers for writes (the test above)
    put the hook back on the Linear it had become, and PyG's run then failed naming
    initialize_parameters. torch's own tables are not checked: the layer compiles."""
    def make(Base):
        class Lazy(Base):
            def __init__(self):
                super().__init__(aggr="add")
                self.lin = torch.nn.LazyLinear(3)

            def forward(self, x, edge_index):
                return self.propagate(edge_index, x=x)

            def message(self, x_j):
                return self.lin(x_j)
        return Lazy
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    ours, theirs = make(gnnfuse.nn.MessagePassing)().double().to(device), make(pyg_nn.MessagePassing)().double()
    first = compiled_run(ours, x, edges)
    theirs = theirs.to(device)
    theirs(x, edges)
    theirs.load_state_dict(ours.state_dict())
    assert_same(first, run(theirs, x, edges))
    assert_same(compiled_run(ours, x, edges), run(theirs, x, edges))


CALLS = 0      # `make_counting`'s global counter


def make_counting(Base: type, how: str) -> type:
    """Messages scaled by how many times ``message`` has run, counted in a global
    (``global CALLS``) or in a variable of the enclosing function (``nonlocal``)."""
    calls = 0

    class CountingGlobally(Base):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_j):
            global CALLS
            CALLS += 1
            return CALLS * x_j

    class CountingInAClosure(CountingGlobally):
        def message(self, x_j):
            nonlocal calls
            calls += 1
            return calls * x_j
    return CountingGlobally if how == "global" else CountingInAClosure


@pytest.mark.parametrize("how", ["global", "nonlocal"])
def test_a_message_rebinding_a_global_or_closure_variable_runs_pyg_semantics(how):
    """``message`` was traced with copies of its globals and closure cells, so a counter
    it rebinds never moved: three calls gave 1x, 1x, 1x the messages where PyG gave 1x,
    2x, 3x, with no warning. The call now runs PyG's propagate, warning with the line."""
    global CALLS
    ours, theirs = twins(make_counting, how)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    with pytest.warns(UserWarning, match=f"rebinds {how} '(CALLS|calls)'.*\\n  at .*(CALLS|calls) \\+= 1"):
        CALLS = 0
        got = [run(ours, x, EDGES) for _ in range(3)]
    CALLS = 0
    for result in got:
        assert_same(result, run(theirs, x, EDGES))


@pytest.mark.parametrize("aggr", ["max", "min"])
def test_a_tie_at_exactly_zero_splits_the_gradient_as_the_readme_says(aggr, backend, device):
    """The one difference from PyG README lists for max and min: two edges tied at 0 get
    1/2 of the gradient each here, 1/3 in PyG (torch's scatter_reduce backward counts its
    zero initial value as a tie). If torch or gnnfuse changes, this fails and README with it."""
    ours, theirs = twins(make_aggregating, aggr=aggr)
    x = torch.tensor([[0.0], [-1.0 if aggr == "max" else 1.0], [0.0], [5.0]], dtype=torch.float64, device=device)
    edges = torch.tensor([[0, 1, 2], [3, 3, 3]], device=device)
    grads = []
    for layer in (ours, theirs):
        leaf = x.clone().requires_grad_()
        grads.append(torch.autograd.grad(layer.to(device)(leaf, edges)[3].sum(), leaf)[0].view(-1).tolist())
    assert grads == [[0.5, 0.0, 0.5, 0.0], [1 / 3, 0.0, 1 / 3, 0.0]]


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_a_torch_func_transform_runs_pyg_semantics(transform, backend, device):
    """Inside ``torch.func.grad`` or ``vmap`` the compiled program's kernels cannot follow
    the transform's tensors: the call raised FunctorchTransformError, where PyG's eager
    propagate, with the same class body, runs. It now runs that, with the fallback
    warning naming the transform."""
    ours, theirs = twins(make_aggregating, aggr="mean")
    ours, theirs = ours.to(device), theirs.to(device)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    if transform == "grad":
        def apply(layer):
            return torch.func.grad(lambda h: layer(h.tanh(), edges).pow(2).sum())(x)
    else:
        def apply(layer):
            return torch.func.vmap(lambda h: layer(h, edges))(torch.stack([x, 2 * x]))
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    with pytest.warns(UserWarning, match="torch.func transform"):
        got = apply(ours)
    torch.testing.assert_close(got, apply(theirs), rtol=1e-12, atol=1e-12)


def test_a_learnt_softmax_temperature_reuses_the_trace_and_reads_the_current_value(monkeypatch):
    """SoftmaxAggregation(learn=True) (GENConv's learn_t) was traced afresh on every call:
    its temperature was captured from a place the trace cache did not know. One trace
    now serves every call, each reading the temperature as it is then (a stale one would
    give the first call's output)."""
    traced = []
    real = pyg_message_passing.trace_message
    monkeypatch.setattr(pyg_message_passing, "trace_message", lambda *a, **k: traced.append(1) or real(*a, **k))
    monkeypatch.setattr(pyg_message_passing, "_TRACES", TraceCache())
    ours, theirs = twins(make_aggregating, aggr=SoftmaxAggregation(learn=True))
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for t in (1.0, 0.2, 3.0):
        with torch.no_grad():
            ours.aggr_module.t.fill_(t)
            theirs.aggr_module.t.fill_(t)
        assert_same(compiled_run(ours, x, EDGES), run(theirs, x, EDGES))
    assert len(traced) == 1


def test_a_learnt_softmax_temperature_keeps_full_gradients_when_semi_grad_is_set_later():
    """PyG's SoftmaxAggregation stops the softmax's gradient only when ``semi_grad`` is set
    and ``t`` is not learnt (its constructor refuses both, but the attribute can be set
    afterwards): a learnt ``t`` keeps every gradient, x's and t's, whatever ``semi_grad``."""
    ours, theirs = twins(make_aggregating, aggr=SoftmaxAggregation(t=0.7, learn=True))
    ours.aggr_module.semi_grad = theirs.aggr_module.semi_grad = True
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert_same(compiled_run(ours, x, EDGES), run(theirs, x, EDGES))


def make_defaulted_update(Base: type) -> type:
    """``update`` with a defaulted flag that the ``propagate`` call does not pass (PyG's
    template-generated propagate gives it its default, False)."""
    class DefaultedUpdate(Base):
        def __init__(self):
            super().__init__(aggr="add")
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=self.lin(x))

        def update(self, inputs, normalize: bool = False):
            return F.normalize(inputs, dim=-1) if normalize else inputs
    return DefaultedUpdate


def test_an_update_parameter_propagate_was_not_given_takes_its_default(backend, device):
    """update() got inspect.Parameter.empty (PyG's generic collect's placeholder, a class,
    so truthy) for a defaulted parameter ``propagate`` was not given, where PyG's
    template-generated propagate passes the default: the flag read as set and every row
    came back normalised (2.36 off PyG's output on the reference backend), silently."""
    ours, theirs = twins(make_defaulted_update)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    assert_same(compiled_run(ours.to(device), x, edges), run(theirs.to(device), x, edges))


def make_target_reading(Base: type) -> type:
    """``message`` reads the targets' rows only (``x_i``) and a per-edge weight."""
    class TargetReading(Base):
        def __init__(self):
            super().__init__(aggr="add")

        def forward(self, x, edge_index, weight):
            return self.propagate(edge_index, x=x, weight=weight)

        def message(self, x_i, weight):
            return x_i * weight.view(-1, 1)
    return TargetReading


def test_targets_given_alone_with_more_sources_run_pyg_semantics(backend, device):
    """Only the 4 targets' rows given, sources numbered up to 7 (a bipartite edge_index):
    PyG sizes the output by the targets and never reads a source row, but the compiled
    call built a 4-vertex graph from the edges and raised "src has id 7 at position 1, but
    num_nodes=4". It now runs PyG's propagate, with the fallback warning."""
    ours, theirs = twins(make_target_reading)
    edges = torch.tensor([[0, 7, 5, 3, 6, 1], [0, 1, 1, 3, 2, 0]], device=device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64, generator=gen).to(device)
    weight = torch.rand(6, dtype=torch.float64, generator=gen).to(device)
    gnnfuse.nn.message_passing._WARNED.pop(type(ours), None)
    with pytest.warns(UserWarning, match="bipartite"):
        got = run(ours.to(device), x, edges, weight)
    assert_same(got, run(theirs.to(device), x, edges, weight))


def make_edge_updating(Base: type) -> type:
    """Attention weights from ``edge_updater`` (PyG's GATConv pattern), fed to ``propagate``;
    one class whose ``edge_updater`` call PyG makes a template from, one (``**kwargs``) it
    cannot, which runs PyG's generic ``edge_updater``."""
    class EdgeUpdating(Base):
        def __init__(self):
            super().__init__(aggr="add")
            self.att = torch.nn.Parameter(torch.linspace(-1, 1, 4, dtype=torch.float64))

        def forward(self, x, edge_index):
            alpha = self.edge_updater(edge_index, x=x)
            return self.propagate(edge_index, x=x, alpha=alpha)

        def edge_update(self, x_i, x_j, index, ptr: Optional[torch.Tensor], size_i: Optional[int]):
            return softmax(((x_i + x_j) * self.att).sum(-1, keepdim=True), index, ptr, size_i)

        def message(self, x_j, alpha):
            return alpha * x_j

    class Generic(EdgeUpdating):
        def forward(self, x, edge_index, **kwargs):
            alpha = self.edge_updater(edge_index, x=x, **kwargs)
            return self.propagate(edge_index, x=x, alpha=alpha)
    return EdgeUpdating, Generic


@pytest.mark.parametrize("which", [0, 1], ids=["template", "generic"])
def test_edge_updater_takes_a_gnnfuse_graph_as_propagate_does(which, backend, device):
    """``propagate`` takes a gnnfuse `Graph` (a loader block's ``block.graph``) as its
    edges; ``edge_updater`` handed it to PyG, which failed with "`MessagePassing.propagate`
    only supports integer tensors of shape `[2, num_messages]`" -- naming the method that
    took the graph. It now reads the graph's edges too."""
    ours = make_edge_updating(gnnfuse.nn.MessagePassing)[which]().double().to(device)
    theirs = make_edge_updating(pyg_nn.MessagePassing)[which]().double().to(device)
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    edges = EDGES.to(device)
    graph = gnnfuse.Graph.from_edge_index(edges, 6)
    assert_same(compiled_run(ours, x, graph), run(theirs, x, edges))
