"""The reference executor writes a binary op's result over an operand that dies at that
step (backend/reference/overwrite.py) only where nothing else can see that operand, and
the numbers are the same as without it."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as pyg_nn

import gnnfuse.nn
from gnnfuse.backend.reference import executor, overwrite
from gnnfuse.graph import Graph
from gnnfuse.ir import Program, Residency


def _graph() -> Graph:
    return Graph(torch.tensor([0, 1, 2, 3, 1, 0]), torch.tensor([1, 2, 3, 0, 0, 2]), 4)


def _product_program(view_kept: bool) -> Program:
    """out = sum over in-edges of x_src * w_edge; with ``view_kept`` a view of the
    gathered rows is read after the product, so the product must not overwrite them."""
    p = Program()
    x = p.input("x", Residency.NODE, (3,), torch.float64)
    w = p.input("w", Residency.EDGE, (3,), torch.float64)
    gathered = p.add("broadcast", x, by="src")
    view = p.add("reshape", gathered, shape=(3, 1)) if view_kept else None
    product = p.add("mul", gathered, w)
    if view_kept:
        product = p.add("add", product, p.add("reshape", view, shape=(3,)))
    p.outputs["out"] = p.add("reduce", product, op="sum", by="dst")
    return p


def _positions(program: Program) -> dict[str, int | None]:
    plan = [v for v in program.values if v.op != "input"]
    _, steps = executor.schedule_steps(program, plan, ())
    return {f"{step[0].op}{n}": step[7] for n, step in enumerate(steps) if step[0].op in overwrite.OVERWRITING}


def _oracle(graph: Graph, x: torch.Tensor, w: torch.Tensor, view_kept: bool) -> torch.Tensor:
    gathered = x[graph.src.long()]
    product = gathered * w + (gathered if view_kept else 0)
    return torch.zeros_like(x).index_add_(0, graph.dst.long(), product)


def test_a_product_overwrites_the_rows_it_gathered():
    assert _positions(_product_program(view_kept=False)) == {"mul1": 0}


def test_an_operand_with_a_view_alive_is_not_overwritten():
    positions = _positions(_product_program(view_kept=True))
    assert positions["mul2"] is None, positions


def test_overwriting_runs_give_the_oracle_values():
    graph = _graph()
    torch.manual_seed(0)
    x, w = torch.randn(4, 3, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    for view_kept in (False, True):
        program = _product_program(view_kept)
        before = x.clone(), w.clone()
        with torch.no_grad():       # as inside an autograd function's forward and backward
            outputs, _ = executor.execute(program, executor.GraphContext(graph), {"x": x, "w": w})
        torch.testing.assert_close(outputs["out"], _oracle(graph, x, w, view_kept))
        torch.testing.assert_close((x, w), before)       # the program's inputs are never written


def test_gat_overwrites_and_matches_pyg_values_and_gradients(monkeypatch):
    """A training GAT layer's products run into their gathered tables, and its output and
    gradients equal PyG's in float64."""
    written = []
    mul = overwrite.OVERWRITING["mul"]
    monkeypatch.setitem(overwrite.OVERWRITING, "mul", lambda a, b, out: written.append(out.shape) or mul(a, b, out=out))
    torch.manual_seed(0)
    theirs = pyg_nn.GATConv(5, 3, heads=2).double()
    ours = gnnfuse.nn.GATConv(5, 3, heads=2).double()
    ours.load_state_dict(theirs.state_dict())
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 1, 0], [1, 2, 3, 4, 0, 0, 3]])
    x = torch.randn(5, 5, dtype=torch.float64)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    outs = [ours(xs[0], edge_index), theirs(xs[1], edge_index)]
    torch.testing.assert_close(outs[0], outs[1])
    grads = [torch.autograd.grad(o.square().sum(), [xi, *m.parameters()]) for o, xi, m in zip(outs, xs, (ours, theirs))]
    torch.testing.assert_close(grads[0], grads[1])
    edges = edge_index.shape[1] + 5         # with self loops
    assert (edges, 2, 3) in written, written


_F = 5


def _mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(width, _F), torch.nn.ReLU(), torch.nn.Linear(_F, _F))


# layers whose compiled programs overwrite operands, with the extra inputs they take
_LAYERS = {
    "gatv2_edges": lambda: (gnnfuse.nn.GATv2Conv(_F, 3, heads=2, edge_dim=_F), ("edge_attr",)),
    "transformer": lambda: (gnnfuse.nn.TransformerConv(_F, 3, heads=2, edge_dim=_F, beta=True), ("edge_attr",)),
    "gine": lambda: (gnnfuse.nn.GINEConv(_mlp(_F), edge_dim=_F), ("edge_attr",)),
    "edgeconv": lambda: (gnnfuse.nn.EdgeConv(_mlp(2 * _F)), ()),
    "cheb": lambda: (gnnfuse.nn.ChebConv(_F, 4, K=3), ()),
    "appnp": lambda: (gnnfuse.nn.APPNP(3, 0.1), ()),
    "genconv": lambda: (gnnfuse.nn.GENConv(_F, _F, aggr="softmax", learn_t=True), ()),
    "rgat": lambda: (gnnfuse.nn.RGATConv(_F, 4, 3), ("edge_type",)),
}


@pytest.mark.parametrize("layer", sorted(_LAYERS))
def test_layers_give_the_same_bits_with_and_without_overwriting(layer, monkeypatch):
    """Outputs and gradients (training, no_grad and inference_mode) of layers whose
    programs overwrite operands are those of the same runs with no step overwriting
    (`overwritable` answering None throughout), bit for bit, in float64; each layer does
    overwrite, so the comparison is not of two identical runs."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 1, 0, 2, 2], [1, 2, 3, 4, 5, 6, 0, 0, 3, 5, 5]])
    gen = torch.Generator().manual_seed(0)
    extra = {"edge_attr": torch.randn(11, _F, generator=gen, dtype=torch.float64),
             "edge_type": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1])}
    x = torch.randn(7, _F, generator=gen, dtype=torch.float64)
    run_over, written = executor.run_over, []

    def counted(*args):
        out = run_over(*args)
        if out is not None:
            written.append(out.shape)
        return out
    monkeypatch.setattr(executor, "run_over", counted)

    def run() -> list[torch.Tensor]:
        executor._SCHEDULES.clear()
        torch.manual_seed(1)
        module, names = _LAYERS[layer]()
        module = module.double()
        kwargs = {name: extra[name] for name in names}
        xi = x.clone().requires_grad_()
        out = module(xi, edge_index, **kwargs)
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum(),
                                    [xi, *module.parameters()], allow_unused=True)
        with torch.no_grad():
            plain = module(x, edge_index, **kwargs)
        with torch.inference_mode():
            inferred = module(x, edge_index, **kwargs).clone()
        return [out.detach(), *[g for g in grads if g is not None], plain, inferred]

    overwriting = run()
    assert written
    monkeypatch.setattr(executor, "overwritable", lambda plan, reads, frees: [None] * len(plan))
    written.clear()
    plain = run()
    assert not written
    assert len(overwriting) == len(plain)
    for a, b in zip(overwriting, plain):
        assert torch.equal(a, b)


def test_a_product_is_written_over_its_operand_only_where_that_holds_the_result_dtype():
    """run_over decides by torch's promotion (operands all of the target's dtype skip
    torch.result_type): a float32 buffer never takes a float64 product, a float64 one
    takes a product with a float32 operand, as torch.mul's out= would."""
    a32, a64 = torch.randn(4, 3), torch.randn(4, 3, dtype=torch.float64)
    for a, b, position, writes in ((a32.clone(), a32.clone(), 0, True), (a32.clone(), a64.clone(), 0, False),
                                   (a32.clone(), a64.clone(), 1, True), (a64.clone(), a64[:1].clone(), 0, True)):
        expected = a * b
        with torch.no_grad():       # as the executor runs: inside a program's forward or backward
            out = overwrite.run_over("mul", [a, b], position)
        assert (out is not None) == writes, (a.dtype, b.dtype, position)
        if writes:
            assert out.data_ptr() == (a, b)[position].data_ptr()
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
