"""A compiled program's run as one opaque torch operator, so ``torch.compile`` captures
models built on gnnfuse in one graph.

Dynamo traces Python bytecode. gnnfuse's eager path is Python it cannot trace into one
graph: layouts built and cached per index tensor (object identity, version counters),
front-end tracing of the user's function, an executor choosing kernels. Under
``torch.compile`` all of that moves behind two custom operators:

- ``gnnfuse::run_program`` runs one registered `CompiledProgram` on a graph given as
  raw index tensors (a `GraphRef`). Inside it -- real tensors, outside dynamo's view --
  the `Graph` and its layouts are built (and cached, as in eager mode, by the index
  tensor's identity and version) and the usual executor runs: Triton's fused kernels
  on CUDA, the torch reference elsewhere. Its fake implementation gives the outputs'
  shapes from the program's IR (node rows are ``num_nodes``; per-row shapes are the
  IR's), so dynamo never runs a kernel to learn a shape.
- ``gnnfuse::run_program_backward`` is its autograd formula: the generated backward
  program. The backward program reads forward intermediates (``saved:`` values), and
  an opaque operator's outputs are fixed by its schema, so the backward operator runs
  the forward program again, keeping those values, then the backward program: one
  extra forward per training step, the price of a graph with no breaks.

So inductor sees each fused graph kernel as one node and compiles the dense work around
it (linear maps, activations, the per-graph degree arithmetic done in torch). Programs
that draw random numbers (dropout) are refused here: the backward's re-run would draw a
different mask.
"""
from __future__ import annotations

import hashlib
import itertools
from typing import Any, Callable, NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..backend.reference import GraphContext
from ..graph import Graph
from ..graph.index_cache import cached_graph
from ..ir import CompileError, Residency
from ..user_warning import warn
from .autocast import autocast_off
from .compiled import CompiledProgram, backward_feeds, _run_forward

# Graph transforms a `GraphRef` can name; the operator applies them to the built graph.
GRAPH_STEPS = {
    "looped": lambda g: g.remove_self_loops().add_self_loops(),   # exactly one loop per vertex (PyG's)
    "reversed": Graph.reverse,
}
_RANDOM_OPS = ("dropout_mask",)


class GraphRef(NamedTuple):
    """A graph as a traced model holds it: index tensors, vertex counts and the named
    transforms (`GRAPH_STEPS`) to apply, all building deferred to the operator.

    ``edges`` is ``(edge_index,)`` (the user's [2, E] tensor, passed through unchanged so
    the operator meets the very object the index cache knows) or ``(src, dst)`` of a
    `Graph`. ``num_src_nodes`` is -1 for one vertex set."""
    edges: tuple[torch.Tensor, ...]
    num_nodes: int
    num_src_nodes: int
    steps: tuple[str, ...] = ()

    @staticmethod
    def of(graph: "Graph | torch.Tensor | GraphRef", num_nodes: int, num_src_nodes: int | None = None) -> GraphRef:
        """The reference for a graph input that `graph_input_problem` accepts: a
        `GraphRef`, an untyped `Graph` or a plain [2, E] index tensor."""
        problem = graph_input_problem(graph)
        if problem is not None:
            raise CompileError(f"under torch.compile {problem} cannot be traced")
        if isinstance(graph, GraphRef):
            return graph
        if isinstance(graph, Graph):
            return GraphRef((graph.src, graph.dst), graph.num_nodes,
                            graph.num_src_nodes if graph.is_bipartite else -1)
        return GraphRef((graph,), num_nodes, -1 if num_src_nodes is None else num_src_nodes)

    def derived(self, step: str) -> GraphRef:
        return GraphRef(self.edges, self.num_nodes, self.num_src_nodes, self.steps + (step,))

    @property
    def num_src(self) -> int:
        return self.num_nodes if self.num_src_nodes < 0 else self.num_src_nodes

    @property
    def device(self) -> torch.device:
        """The edges' device, as `Graph.device` (TAGConv's ``normalize=False`` ones are
        made there: without it the layer's frame failed under compile, refused by
        ``fullgraph=True`` as "'GraphRef' object has no attribute 'device'")."""
        return self.edges[0].device

    def in_degrees(self, dtype: torch.dtype) -> torch.Tensor:
        """[num_nodes] in-degrees of the transformed graph, from an operator that builds
        (and checks) the graph as the program's operator will: computed in traced torch
        they indexed with the user's ids unchecked, an id out of range an IndexError (a
        device assert on a GPU) instead of the error naming it."""
        for n, step in enumerate(self.steps):
            if step == "looped" and n != len(self.steps) - 1:
                raise CompileError(f"graph steps {self.steps}: nothing may follow 'looped'")
        return _degree_op("+".join(self.steps), self.num_nodes, self.num_src_nodes, list(self.edges), dtype)


@torch.library.custom_op("gnnfuse::in_degrees", mutates_args=())
def _degree_op(steps: str, num_nodes: int, num_src_nodes: int, edges: list[torch.Tensor],
               dtype: torch.dtype) -> torch.Tensor:
    # a copy even in int64: the cached layout is no output to hand out (`Graph.cached_tensors`)
    return _built_graph(edges, num_nodes, num_src_nodes, steps).in_degrees().to(dtype, copy=True)


@_degree_op.register_fake
def _degree_fake(steps, num_nodes, num_src_nodes, edges, dtype):
    num_dst, num_src = num_nodes, num_nodes if num_src_nodes < 0 else num_src_nodes
    for step in steps.split("+") if steps else ():
        if step == "reversed":
            num_dst, num_src = num_src, num_dst
    return torch.empty(num_dst, dtype=dtype, device=edges[0].device)


def graph_input_problem(graph: object) -> str | None:
    """Why a graph argument cannot be traced into a `GraphRef`, or None: a plain [2, E]
    index tensor (not PyG's EdgeIndex subclass, not a sparse adjacency) or a `Graph`
    without edge or node types, neither an `in_edges_block` nor read from an EdgeIndex or
    from another graph's edges, can."""
    if isinstance(graph, GraphRef):
        return None
    if isinstance(graph, Graph):
        if graph.edge_type is not None or graph.node_type is not None:
            return "a Graph with edge or node types"
        # traced as its src/dst alone, a block lost which vertex each destination is: the
        # traced GATConv joined destination i to source i by its self loop, where the
        # eager call refuses the loops (`Graph.add_self_loops`)
        if graph.is_block:
            return "a Graph from in_edges_block"
        # and a graph read from an EdgeIndex lost the EdgeIndex, whose in-place edits move
        # no counter of src/dst: the traced graph kept its layouts of the old edges under
        # the edited ids (a SAGEConv 0.058 off a fresh graph's), where eager calls refuse it
        if graph.reads_edge_index:
            return "a Graph read from a PyG EdgeIndex"
        # likewise a graph made by add/remove_self_loops lost the edge_index its edges are
        # read from: after an edit there the traced graph ran its own arrays, built from the
        # old edges (a SAGEConv 1.3-3.5 off a fresh graph's), where eager calls refuse it
        if graph.reads_other_edges:
            return "a Graph made by add_self_loops or remove_self_loops (its clone() compiles)"
        return None
    # torch.export's non-strict tracing runs this code on FakeTensors (dynamo on plain ones)
    if (type(graph) is torch.Tensor or type(graph) is FakeTensor) and graph.layout is torch.strided and graph.dim() == 2:
        return None
    return f"a graph given as {type(graph).__name__}"


_WARNED: set[str] = set()


def run_eagerly(reason: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` outside the traced graph (one graph break) when a call has
    no traced path, with a warning once per reason: the eager result, never a silently
    different one. Under torch.compile the break is asked for by name first: with
    fullgraph=True dynamo's refusal then gives gnnfuse's reason (it said only that
    ``torch.compiler.disable`` is marked as skipped)."""
    if torch.compiler.is_compiling():
        torch._dynamo.graph_break(msg=f"gnnfuse runs this call eagerly: {reason}")
    return torch.compiler.disable(_warned_call)(reason, fn, *args, **kwargs)


def _warned_call(reason: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    # asked here, outside dynamo: torch 2.11's dynamo cannot trace is_exporting() itself
    if torch.compiler.is_exporting():       # export allows no graph break to run it behind
        raise CompileError(f"torch.export cannot capture {reason} (torch.compile runs it eagerly behind a "
                           "graph break)")
    if reason not in _WARNED:
        _WARNED.add(reason)
        warn(f"gnnfuse runs eagerly under torch.compile (a graph break): {reason}")
    result = fn(*args, **kwargs)
    for out in (result if isinstance(result, (tuple, list)) else (result,)):
        if isinstance(out, torch.Tensor) and out.dim():
            # rows may vary: a static row count met an input the user marked dynamic
            # (``mark_dynamic(x, 0)``) in the code after the break, and dynamo refused
            # the specialization naming the input (ConstraintViolationError)
            torch._dynamo.maybe_mark_dynamic(out, 0)
    return result


_PROGRAMS: dict[str, CompiledProgram] = {}
_IDS: dict[int, str] = {}
_CHECKS: dict[str, Callable[[], None]] = {}     # name with a check -> the check (`register_program`)
_COUNTER = itertools.count()


def register_program(compiled: CompiledProgram, check: Callable[[], None] | None = None) -> str:
    """The operator's name for ``compiled`` (registered once; programs live as long as
    `compiled_for`'s table keeps them: the process). With ``check``, a name of its own
    (``p<n>-<digest>.<m>``) under which every forward run calls ``check()`` first: it raises where
    the program is no longer what the traced call would run (frontend/compiled_call.py)."""
    if id(compiled) not in _IDS:
        random = sorted({v.op for v in compiled.program.values if v.op in _RANDOM_OPS})
        if random:
            raise CompileError(f"the program draws random numbers ({', '.join(random)}); under torch.compile "
                               "its backward re-runs the forward and would draw anew: use eval mode or p=0")
        name = f"p{next(_COUNTER)}-{_digest(compiled)}"
        _IDS[id(compiled)], _PROGRAMS[name] = name, compiled
    if check is None:
        return _IDS[id(compiled)]
    name = f"{_IDS[id(compiled)]}.{next(_COUNTER)}"
    _CHECKS[name] = check
    return name


def _digest(compiled: CompiledProgram) -> str:
    """A digest of the program's structure for its name. A name is this process's: an
    exported program saved with ``torch.export.save`` and loaded in another process names
    the exporting process's programs, and by its count alone ("p0") it ran whatever
    program had that count there -- a GCNConv's export loaded after a
    ``GCNConv(normalize=False)`` had compiled ran the unnormalised sum, 2.1 off. With the
    digest another program's name never matches (`_program` refuses it)."""
    return hashlib.sha1(repr(compiled.program.fingerprint()).encode()).hexdigest()[:12]


def _program(name: str) -> CompiledProgram:
    """The program registered under ``name`` (see `register_program`)."""
    found = _PROGRAMS.get(name.partition(".")[0])
    if found is None:
        raise RuntimeError(f"gnnfuse program {name!r} is not one this process has built: an exported program saved "
                           "with torch.export.save names the programs of the process that exported it, which are not "
                           "saved with it. Export the model again in this process (torch.export.export) instead of "
                           "loading the saved one")
    return found


def run_program(program: str, graph: GraphRef, feeds: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run registered ``program`` on ``graph`` with its inputs in program order."""
    return torch.ops.gnnfuse.run_program(program, "+".join(graph.steps), graph.num_nodes, graph.num_src_nodes,
                                         list(graph.edges), feeds)


def _built_graph(edges: list[torch.Tensor], num_nodes: int, num_src_nodes: int, steps: str) -> Graph:
    """The `Graph` a `GraphRef` describes, from the index caches: one per index tensor
    while it is unchanged, its transforms cached on it."""
    bipartite = None if num_src_nodes < 0 else num_src_nodes
    if len(edges) == 1:
        graph = Graph.coerce(edges[0], num_nodes=num_nodes, num_src_nodes=bipartite)
    else:
        src, dst = edges      # a Graph's own tensors: the rebuilt graph shares their memory, not the objects
        graph = cached_graph(src, edges, ("pair", num_nodes, bipartite),
                             lambda pair: Graph(pair[0].detach(), pair[1].detach(), num_nodes, num_src_nodes=bipartite))
    done = []
    for step in steps.split("+") if steps else ():
        done.append(step)
        graph = graph.cached("compile_steps_" + "+".join(done), GRAPH_STEPS[step])
    return graph


def _program_inputs(compiled: CompiledProgram, graph: Graph, feeds: list[torch.Tensor]
                    ) -> tuple[tuple[str, ...], list[torch.Tensor]]:
    keys = tuple(compiled.program.inputs)
    return keys, compiled.checked_inputs(graph, dict(zip(keys, feeds)))


@torch.library.custom_op("gnnfuse::run_program", mutates_args=())
def _run_op(program: str, steps: str, num_nodes: int, num_src_nodes: int, edges: list[torch.Tensor],
            feeds: list[torch.Tensor]) -> list[torch.Tensor]:
    check = _CHECKS.get(program)
    if check is not None:
        check()
    compiled = _program(program)
    graph = _built_graph(edges, num_nodes, num_src_nodes, steps)
    keys, tensors = _program_inputs(compiled, graph, feeds)
    # `_run_forward` has copied an output that is what the graph keeps (a vertex function
    # returning ``len(v.innbs)`` gives the cached in-degrees): inductor writes an operator's
    # output in place without moving a version counter, and ``d.add_(1)`` on it raised the
    # graph's cached in-degrees by 1 per compiled call (2, then 3 where it was 1)
    outputs, _, _ = _run_forward(compiled, GraphContext(graph), keys, tensors, None)
    return _unaliased(outputs, feeds)


def _unaliased(outputs, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """An operator's outputs may alias neither its inputs nor each other (a program
    can return an input, or one value under two names): such outputs are copied."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    result = []
    for out in outputs:
        if out.numel() and out.untyped_storage().data_ptr() in seen:
            out = out.clone()
        seen.add(out.untyped_storage().data_ptr())
        result.append(out)
    return result


@_run_op.register_fake
def _run_fake(program, steps, num_nodes, num_src_nodes, edges, feeds):
    device = feeds[0].device if feeds else edges[0].device
    return [torch.empty(_rows(value.residency, num_nodes, key) + tuple(value.shape), dtype=value.dtype, device=device)
            for key, value in _program(program).program.outputs.items()]


def _rows(residency: Residency, num_nodes: int, key: str) -> tuple[int, ...]:
    if residency is Residency.NODE:
        return (num_nodes,)
    if residency is Residency.SHARED:
        return ()
    raise CompileError(f"program output {key!r} is {residency.name} data; under torch.compile a program "
                       "returns per-vertex values only")


@torch.library.custom_op("gnnfuse::run_program_backward", mutates_args=())
def _backward_op(program: str, steps: str, num_nodes: int, num_src_nodes: int, edges: list[torch.Tensor],
                 feeds: list[torch.Tensor], wrt: list[int], output_grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of the inputs at positions ``wrt``, the forward re-run to recover what
    the backward program reads."""
    compiled = _program(program)
    graph = _built_graph(edges, num_nodes, num_src_nodes, steps)
    keys, tensors = _program_inputs(compiled, graph, feeds)
    backward = compiled.backward_for(tuple(keys[i] for i in wrt))
    if not backward.wrt:     # no gradient reaches these inputs (`CompiledProgram.backward_for`)
        return [torch.zeros_like(tensors[i]) for i in wrt]
    graph_ctx = GraphContext(graph)
    _, kept, execute = _run_forward(compiled, graph_ctx, keys, tensors, backward)
    saved = [kept[i] for i in compiled.backward_inputs(backward).saved_ids]
    with autocast_off(graph.device):
        grads, _ = execute(backward.program, graph_ctx, backward_feeds(compiled, backward, saved, output_grads))
    graph.first_pass = False    # a backward pass ran on it (runtime/first_pass.py; at once here, where
    # `_ProgramFunction.backward` ends it after the whole backward: `end_after_backward`)
    by_key = {k.removeprefix("grad:"): g for k, g in grads.items()}
    # a gradient may be an incoming output gradient itself (a program returning a
    # linear map of an input passes it through), or one value for two inputs
    return _unaliased([by_key[keys[i]] if by_key.get(keys[i]) is not None else torch.zeros_like(tensors[i])
                       for i in wrt], [*edges, *feeds, *output_grads])


@_backward_op.register_fake
def _backward_fake(program, steps, num_nodes, num_src_nodes, edges, feeds, wrt, output_grads):
    return [torch.empty_like(feeds[i]) for i in wrt]


def _setup_context(ctx, inputs, output) -> None:
    program, steps, num_nodes, num_src_nodes, edges, feeds = inputs
    ctx.program, ctx.steps, ctx.num_nodes, ctx.num_src_nodes = program, steps, num_nodes, num_src_nodes
    ctx.num_edges = len(edges)
    ctx.save_for_backward(*edges, *feeds)
    ctx.output_meta = [(o.shape, o.dtype, o.device) for o in output]


def _backward(ctx, output_grads):
    saved = ctx.saved_tensors
    edges, feeds = list(saved[:ctx.num_edges]), list(saved[ctx.num_edges:])
    wrt = [i for i, need in enumerate(ctx.needs_input_grad[5]) if need]
    grads = [None] * len(feeds)
    if wrt:
        output_grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                        for g, (shape, dtype, device) in zip(output_grads, ctx.output_meta)]
        computed = torch.ops.gnnfuse.run_program_backward(ctx.program, ctx.steps, ctx.num_nodes, ctx.num_src_nodes,
                                                          edges, feeds, wrt, output_grads)
        for i, g in zip(wrt, computed):
            grads[i] = g
    return None, None, None, None, [None] * len(edges), grads


_run_op.register_autograd(_backward, setup_context=_setup_context)


def _no_second_derivative(ctx, *output_grads):
    """A second derivative (``create_graph=True``, then a backward through the gradient:
    a gradient penalty) reaches the backward operator, which has no derivative of its
    own. Without this torch refused it in words for the operator's author ("no autograd
    formula was registered. Please use register_autograd to add one"), under
    ``backend="eager"``; aot_autograd's backends refuse double backward themselves."""
    raise NotImplementedError(
        "a second derivative (backward with create_graph=True) through the compiled gnnfuse program on "
        f"({', '.join(sorted(_program(ctx.program).program.inputs))}) under torch.compile is not supported: its "
        "backward runs as one operator, which has no derivative. Run the "
        "layers of that term uncompiled (gnnfuse's eager GCN and SAGE sums take a second derivative), or compute "
        "the term in plain torch")


def _setup_backward_context(ctx, inputs, output) -> None:
    ctx.program = inputs[0]


_backward_op.register_autograd(_no_second_derivative, setup_context=_setup_backward_context)
