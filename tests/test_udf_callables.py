"""UDFs that are not plain functions (issue #11 §2): ``nn.Module`` instances whose forward
is the UDF (DGL's NodeApplyModule, GraphSAGE's pooling aggregator), bound methods (a
layer's ``self.message``), ``functools.partial`` and callable objects, in both front ends.
Each is checked against plain torch on outputs and all gradients in float64 on both
backends; errors inside them name their line; state they hold is never cached stale.
"""
from __future__ import annotations

import functools
import inspect

import pytest
import torch
from torch import nn

import gnnfuse
from gnnfuse import CompileError

DOUBLE = torch.float64


def graph(device: str = "cpu") -> gnnfuse.Graph:
    """Every vertex has an in-edge (so DGL's zero fill does not enter); a multi-edge into 2."""
    return gnnfuse.Graph(torch.tensor([0, 1, 3, 3, 2, 1]), torch.tensor([1, 2, 2, 2, 3, 0]), 4).to(device)


def neighbour(g: gnnfuse.Graph, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    index = g.dst[:, None].expand(-1, x.shape[1])
    zeros = torch.zeros(g.num_nodes, x.shape[1], dtype=x.dtype, device=x.device)
    if op == "sum":
        return zeros.index_add(0, g.dst, x)
    return zeros.scatter_reduce(0, index, x, op, include_self=False)


class NodeApply(nn.Module):
    """DGL's NodeApplyModule: the update UDF is a module holding a linear layer."""

    def __init__(self, f_in: int, f_out: int):
        super().__init__()
        self.linear = nn.Linear(f_in, f_out).double()
        self.scale = 1.0

    def forward(self, nodes):
        return {"out": torch.relu(self.linear(nodes.data["agg"])) * self.scale}


class PoolAggregator(nn.Module):
    """GraphSAGE's max-pool aggregator: a reduce UDF with a projection of the mailbox."""

    def __init__(self, f: int):
        super().__init__()
        self.fc = nn.Linear(f, f).double()

    def forward(self, nodes):
        return {"agg": torch.max(torch.relu(self.fc(nodes.mailbox["m"])), dim=1)[0]}


class Layer(nn.Module):
    """UDFs as bound methods of the layer, the usual way DGL layers are written."""

    def __init__(self, f: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(f, f, dtype=DOUBLE))

    def message(self, edges):
        return {"m": edges.src["h"] @ self.weight}

    def reduce(self, nodes, *, op):
        return {"agg": op(nodes.mailbox["m"], dim=1)}

    def forward(self, g, h):
        return gnnfuse.message_passing(g, self.message, functools.partial(self.reduce, op=torch.mean),
                                       ndata={"h": h})


class EdgeScale:
    """A callable object as message UDF."""

    def __init__(self, factor: float):
        self.factor = factor

    def __call__(self, edges):
        return {"m": edges.src["h"] * self.factor}


def grads_of(out: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    weight = torch.linspace(-1, 1, out.numel(), dtype=DOUBLE, device=out.device).view_as(out)
    return list(torch.autograd.grad((out * weight).sum(), tensors))


def assert_same(run, oracle, tensors: list[torch.Tensor]) -> None:
    out = run()
    grads = grads_of(out, tensors)
    expected = oracle()
    expected_grads = grads_of(expected, tensors)
    torch.testing.assert_close(out, expected)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e)


def test_modules_methods_partials_and_callables_as_message_passing_udfs(device):
    torch.manual_seed(0)   # drawn on the CPU, then moved
    g = graph(device)
    h = torch.randn(4, 3, dtype=DOUBLE).to(device).requires_grad_()
    layer, pool, apply = Layer(3).to(device), PoolAggregator(3).to(device), NodeApply(3, 2).to(device)
    params = [h, layer.weight, pool.fc.weight, pool.fc.bias, apply.linear.weight, apply.linear.bias]

    def run():
        agg = layer(g, h)["agg"]
        pooled = gnnfuse.message_passing(g, EdgeScale(2.0), pool, apply, ndata={"h": h, "unused": agg})
        return torch.cat([agg, pooled["out"]], dim=1)

    def oracle():
        agg = neighbour(g, (h @ layer.weight)[g.src], "mean")
        pooled = neighbour(g, torch.relu(pool.fc(h[g.src] * 2.0)), "amax")
        return torch.cat([agg, torch.relu(apply.linear(pooled))], dim=1)
    assert_same(run, oracle, params)


class VertexModule(nn.Module):
    """A vertex function as a module: sum of projected neighbours plus a root term."""

    def __init__(self, f_in: int, f_out: int):
        super().__init__()
        self.neighbour = nn.Linear(f_in, f_out, bias=False).double()
        self.root = nn.Parameter(torch.randn(f_in, f_out, dtype=DOUBLE))

    def forward(self, v):
        return sum([self.neighbour(u.h) for u in v.innbs]) / len(v.innbs) + v.h @ self.root

    def scaled(self, factor, v):
        return sum([u.h @ self.root for u in v.innbs]) * factor


def test_modules_methods_partials_and_callables_as_vertex_functions(device):
    torch.manual_seed(1)   # drawn on the CPU, then moved
    g = graph(device)
    h = torch.randn(4, 3, dtype=DOUBLE).to(device).requires_grad_()
    module = VertexModule(3, 2).to(device)
    params = [h, module.neighbour.weight, module.root]
    degree = torch.bincount(g.dst, minlength=4).to(DOUBLE)[:, None]

    def run():
        return torch.cat([gnnfuse.vertex(module)(g, {"h": h}),
                          gnnfuse.vertex(functools.partial(module.scaled, 3.0))(g, {"h": h}),
                          gnnfuse.vertex(functools.partial(VertexModule.scaled, module, 0.5))(g, {"h": h})], dim=1)

    def oracle():
        return torch.cat([neighbour(g, module.neighbour(h)[g.src]) / degree + h @ module.root,
                          neighbour(g, (h @ module.root)[g.src]) * 3.0,
                          neighbour(g, (h @ module.root)[g.src]) * 0.5], dim=1)
    assert_same(run, oracle, params)



def test_a_module_udfs_forward_hooks_run_in_message_passing_and_are_refused_in_a_vertex_function():
    """A message-passing UDF that is a module is called as one, so its forward hooks run on
    every call as ``module(edges)`` runs them (README said they did not). The vertex
    front end traces the module's forward alone, and a hook scaling the result by 10 was
    skipped without a word (out 2x the neighbour sum where ``module(v)`` gives 20x): a
    vertex module with forward hooks (its own or every module's) is refused by name."""
    g = graph()
    h = torch.randn(4, 3, dtype=DOUBLE)

    class Doubled(nn.Module):
        def forward(self, edges):
            return {"m": edges.src["h"] * 2.0}

    message = Doubled()
    message.register_forward_hook(lambda module, args, out: {"m": out["m"] * 10.0})
    out = gnnfuse.message_passing(g, message, lambda nodes: {"o": nodes.mailbox["m"].sum(1)}, ndata={"h": h})
    torch.testing.assert_close(out["o"], neighbour(g, h[g.src]) * 20.0)

    class VertexDoubled(nn.Module):
        def forward(self, v):
            return sum([u.h for u in v.innbs]) * 2.0

    vertex = VertexDoubled()
    handle = vertex.register_forward_hook(lambda module, args, out: out * 10.0)
    with pytest.raises(CompileError, match="VertexDoubled.*forward_hooks.*not run"):
        gnnfuse.vertex(vertex)(g, {"h": h})
    handle.remove()
    torch.testing.assert_close(gnnfuse.vertex(vertex)(g, {"h": h}), neighbour(g, h[g.src]) * 2.0)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
    try:
        with pytest.raises(CompileError, match="VertexDoubled.*forward_pre_hooks.*every module"):
            gnnfuse.vertex(vertex)(g, {"h": h})
    finally:
        handle.remove()

def test_module_state_is_read_on_every_call(monkeypatch):
    """A module's attributes and parameters can change without its identity changing:
    every call must see the current ones."""
    g = graph()
    h = torch.randn(4, 3, dtype=DOUBLE)
    apply = NodeApply(3, 3)

    def run():
        return gnnfuse.message_passing(g, lambda e: {"m": e.src["h"]},
                                       lambda n: {"agg": torch.sum(n.mailbox["m"], dim=1)}, apply,
                                       ndata={"h": h})["out"]
    first = run()
    apply.scale = 3.0
    torch.testing.assert_close(run(), 3.0 * first)
    with torch.no_grad():
        apply.linear.bias.add_(1.0)
    torch.testing.assert_close(run(), 3.0 * torch.relu(apply.linear(neighbour(g, h[g.src]))))


def test_errors_inside_module_and_method_udfs_name_their_line():
    class Broken(nn.Module):
        def forward(self, nodes):
            return {"o": torch.sin(torch.sum(nodes.mailbox["m"], dim=1))}

    class Callable:
        def __call__(self, v):
            return sum([torch.sin(u.h) for u in v.innbs])
    line = inspect.getsourcelines(Broken.forward)[1] + 1
    with pytest.raises(CompileError, match="torch function sin") as info:
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]}, Broken(), ndata={"h": torch.randn(4, 2)})
    assert f":{line}: return {{\"o\": torch.sin(" in str(info.value)
    line = inspect.getsourcelines(Callable.__call__)[1] + 1
    with pytest.raises(CompileError, match="torch function sin") as info:
        gnnfuse.vertex(Callable())(graph(), {"h": torch.randn(4, 2)})
    assert f":{line}: return sum([torch.sin(u.h)" in str(info.value)


def test_a_udf_that_is_not_callable_python_is_a_type_error():
    with pytest.raises(TypeError, match="a UDF must be a Python function, .* got builtin_function_or_method"):
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]}, torch.sum, ndata={"h": torch.randn(4, 2)})


def test_a_callable_keeping_a_traced_value_on_its_self_or_partial_argument_is_refused():
    """A method, module or partial that stores its traced rows on ``self`` or in a list it
    is bound to left gnnfuse's SymTensor there (eager code keeps the tensor); refused,
    naming the attribute, and put back."""
    g = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    x = torch.randn(3, 2, dtype=torch.float64)

    class Keeps(torch.nn.Module):
        def forward(self, xs):
            self.last = xs
            return xs * 2.0

    def store(xs, kept):
        kept.append(xs)
        return xs
    module, kept = Keeps(), []
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)sets self.last.*self.last = xs"):
        gnnfuse.ops.gsddmm(g, module, src=x)
    with pytest.raises(gnnfuse.CompileError, match=r"partial's argument 'kept'"):
        gnnfuse.ops.gsddmm(g, functools.partial(store, kept=kept), src=x)
    assert not hasattr(module, "last") and kept == []


LINEAR = nn.Linear(2, 2).double()


def test_a_traced_value_set_on_a_torch_module_the_function_names_is_refused():
    """A function whose trace the cache keeps (it reads only a torch module) and that sets
    ``LINEAR.last = xs`` left the SymTensor on the module; refused, and removed."""
    g = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)

    def keeps_on_module(xs):
        LINEAR.last = xs
        return LINEAR(xs)
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)sets LINEAR.last.*LINEAR.last = xs"):
        gnnfuse.ops.gsddmm(g, keeps_on_module, src=torch.randn(3, 2, dtype=torch.float64))
    assert not hasattr(LINEAR, "last")


@pytest.mark.parametrize("register", ["full", "pre", "legacy", "every module"])
def test_a_module_with_a_backward_hook_called_in_a_udf_is_refused(register):
    """torch attaches a module's backward hooks to its call's tensors; a traced call has
    none, so a hook scaling the input's gradient by 5 never ran on the compiled gradients
    (only torch's own warning about a SymTensor output said anything). A forward hook
    still runs on the traced call."""
    from torch.nn.modules import module as torch_module
    lin = nn.Linear(3, 3).double()

    def scaled(module, grad_in, grad_out=None):
        return (grad_in[0] * 5,)
    handle = {"full": lambda: lin.register_full_backward_hook(scaled),
              "pre": lambda: lin.register_full_backward_pre_hook(scaled),
              "legacy": lambda: lin.register_backward_hook(scaled),
              "every module": lambda: torch_module.register_module_full_backward_hook(scaled)}[register]()
    g, x = graph(), torch.randn(4, 3, dtype=DOUBLE)

    def message(edges):
        return {"m": lin(edges.src["h"])}

    def reduce(nodes):
        return {"h": nodes.mailbox["m"].sum(1)}
    try:
        with pytest.raises(CompileError, match=r"Linear has a backward hook \(register_full_backward") as caught:
            gnnfuse.message_passing(g, message, reduce, ndata={"h": x})
    finally:
        handle.remove()
    assert 'lin(edges.src["h"])' in caught.value.source
    lin.register_forward_hook(lambda module, args, out: out * 2)
    out = gnnfuse.message_passing(g, message, reduce, ndata={"h": x})["h"]
    torch.testing.assert_close(out, neighbour(g, lin(x[g.src])), rtol=1e-12, atol=1e-12)


LOGGED: dict[str, list] = {"m": []}


def test_a_traced_value_stored_in_a_container_inside_a_global_is_refused():
    """``LOGGED["m"].append(xs)`` writes into a dict's list and leaves the dict's own items
    as they were: the one-level check let the SymTensor stay in the user's list. A forward
    hook recording into a dict of lists it closes over the same (PyG's front end's hook
    check uses this one). Refused, naming the container, and put back."""
    g = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)

    def logs(xs):
        LOGGED["m"].append(xs)
        return xs * 2.0
    with pytest.raises(gnnfuse.CompileError, match=r"(?s)a container inside the global 'LOGGED'.*LOGGED"):
        gnnfuse.ops.gsddmm(g, logs, src=torch.randn(3, 2, dtype=torch.float64))
    assert LOGGED == {"m": []}
    lin, acts = nn.Linear(2, 2).double(), {"lin": [[]]}
    lin.register_forward_hook(lambda module, args, out: acts["lin"][0].append(out))

    def message(edges):
        return {"m": lin(edges.src["h"])}
    with pytest.raises(CompileError, match="a container inside"):
        gnnfuse.message_passing(g, message, lambda nodes: {"h": nodes.mailbox["m"].sum(1)},
                                ndata={"h": torch.randn(3, 2, dtype=DOUBLE)})
    assert acts == {"lin": [[]]}
