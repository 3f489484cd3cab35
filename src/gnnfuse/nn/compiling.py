"""Which layer calls run as one captured graph under ``torch.compile``, and the fallback
for the rest.

Covered: SAGEConv (every fused ``aggr`` form: names, lists, softmax), GCNConv, GATConv,
GINConv, GraphConv, SGConv, APPNP and TAGConv, on a plain ``edge_index`` or an untyped
`Graph`, one vertex set or bipartite; each layer's ``_compile_problem`` names the
arguments that are not (edge weights, ``cached=True``, dropout drawn inside a program,
attention weights returned, ...).

A covered layer's ``forward`` traced by dynamo takes the graph as a `GraphRef` (index
tensors; layouts are built inside the fused program's operator, see
`runtime.compile_op`) and computes its per-graph coefficients in plain torch, so the
whole layer is one graph: dense transforms compiled by inductor, each fused graph kernel
one opaque node. Calls the compile path does not cover (an argument the layer's
``why_not`` names, or a layer not covered at all) run the layer's eager ``forward`` through
``torch.compiler.disable``: one graph break, the eager result, and a warning once per
layer class and reason -- never a silently different answer.

Inside a ``torch.func`` transform (grad, vmap, jacrev, ...) a layer runs only on the
reference backend, and fails naming the transform where a step of it is one the
transform cannot follow (`_under_functorch`).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ..graph.index_cache import functorch_interpreter
from ..graph.capture_refusals import refuse_jit_trace
from ..runtime.compile_op import graph_input_problem, run_eagerly
from ..runtime.compiled import (RUNNING_LAYERS, ForwardADError, FunctorchTransformError, backend_name,
                                functorch_backend_reason, running_layer)

__all__ = ["compile_path", "graph_input_problem", "names_its_programs", "propagation_problem", "traced_layer"]


# How many covered layers' forwards dynamo is tracing at this point of its trace
# (`compile_path`): a count dynamo follows as a side effect of the traced code. A list:
# torch 2.11's dynamo cannot trace setattr on a class, which a class attribute would need.
_TRACED_DEPTH = [0]


def traced_layer() -> bool:
    """Whether the code asking runs inside a covered layer's forward that dynamo traces:
    only there may a helper take the graph as a `GraphRef`, which only traced code can
    consume. ``torch.compiler.is_compiling()`` alone said more: where dynamo cannot
    trace a layer's frame (a torch sparse adj_t, which it cannot wrap) it runs the frame
    as Python and compiles the helpers it calls on their own, and a GraphRef one of them
    returned to the Python caller failed there ('GraphRef' object has no attribute
    'num_edges'; 'cannot make a Graph from GraphRef')."""
    return torch.compiler.is_compiling() and _TRACED_DEPTH[0] > 0


def compile_path(why_not: Callable[..., str | None] | None = None) -> Callable[[Callable], Callable]:
    """Decorator for a layer's ``forward``: under torch.compile, runs it traced when
    ``why_not(layer, *args, **kwargs)`` gives None, else eagerly (a graph break) for the
    reason it gives. Without ``why_not`` the layer always runs eagerly under compile."""
    def wrap(forward: Callable) -> Callable:
        @functools.wraps(forward)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                reason = "it has no torch.compile path yet" if why_not is None else why_not(self, *args, **kwargs)
                if reason is not None:
                    return run_eagerly(f"{type(self).__name__}: {reason}", forward, self, *args, **kwargs)
                _TRACED_DEPTH[0] += 1
                try:
                    return forward(self, *args, **kwargs)
                finally:
                    _TRACED_DEPTH[0] -= 1
            elif functorch_interpreter() is not None:     # one C call outside a transform
                return _under_functorch(forward, self, args, kwargs)
            elif torch._C._get_tracing_state() is not None:    # before its custom autograd Functions
                refuse_jit_trace(f"gnnfuse's {type(self).__name__} called")
            names = RUNNING_LAYERS.names     # (a backward's refusal names the layer: `running_layer`)
            names.append(type(self).__name__)
            try:
                return forward(self, *args, **kwargs)
            except ForwardADError as error:      # a program's refusal, named after the layer running it
                raise error.named(type(self).__name__) from None
            finally:
                names.pop()
        return run
    return wrap


def names_its_programs(forward: Callable) -> Callable:
    """Decorator for the ``forward`` of a typed-graph layer (R-GCN, RGAT, HGT), outside
    `compile_path`: the programs it runs name it in refusals raised later, in their
    backward (`runtime.compiled.running_layer`). Under torch.compile the whole forward
    runs eagerly behind one graph break: its typed graph has no traced path, and dynamo
    tracing the forward up to there broke the graph at each data-dependent step of the
    graph's build (27 breaks for one R-GCN call; fullgraph=True refused it naming none)."""
    @functools.wraps(forward)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return run_eagerly(f"{type(self).__name__}: a typed graph has no torch.compile path yet", run, self,
                               *args, **kwargs)
        with running_layer(type(self).__name__):
            return forward(self, *args, **kwargs)
    return run


# torch's message for an autograd.Function without setup_context inside a transform
_FUNCTORCH_FUNCTION = "autograd.Function with functorch transforms"


def _under_functorch(forward: Callable, layer: Any, args: tuple, kwargs: dict) -> Any:
    """A layer's ``forward`` inside a ``torch.func`` transform, refused by name where the
    transform cannot follow it: the Triton and CPU backends' kernels read raw memory,
    which a transform's tensors do not have (they failed with "Cannot access storage of
    TensorWrapper"), so only the reference backend runs; there a fused program or linear
    map whose inputs the transform differentiates is an autograd.Function it cannot
    enter, refused by the program (`runtime.compiled`) or by torch, whose message is
    replaced by one naming the layer. What runs is the reference's torch ops, which the
    transform follows (grad of a SAGE or GIN layer's weights, say)."""
    name = type(layer).__name__
    x = args[0] if args else next(iter(kwargs.values()), None)
    x = x[0] if isinstance(x, (tuple, list)) and x else x
    backend = backend_name(isinstance(x, torch.Tensor) and x.is_cuda)
    if backend != "reference":
        raise FunctorchTransformError(functorch_backend_reason(backend), name)
    try:
        return forward(layer, *args, **kwargs)
    except FunctorchTransformError as error:
        if error.layer is not None:     # an inner layer's (a model's submodule): it named itself
            raise
        raise FunctorchTransformError(error.reason, name) from None
    except RuntimeError as error:
        if _FUNCTORCH_FUNCTION not in str(error):
            raise
        raise FunctorchTransformError("a step of it is an autograd.Function whose inputs the transform "
                                      "differentiates, which only torch.autograd can run", name) from error


def propagation_problem(edge_index: Any, edge_weight: Any, cached: bool = False) -> str | None:
    """Why a normalising propagation's call (GCN, APPNP, SGC, TAG) has no traced path, or
    None: edge weights (their normalisation reorders edges by data: loops removed and
    re-added), PyG's ``cached=True`` (state kept on the layer) and untraceable graphs."""
    if edge_weight is not None:
        return "edge_weight"
    if cached:
        return "cached=True"
    return graph_input_problem(edge_index)
