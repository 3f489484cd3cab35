"""Dtypes in compiled UDFs, on every backend.

Result dtypes are eager torch's: a Python number -- a constant, or the in-degree
(``len(v.innbs)``, ``nodes.mailbox[k].shape[1]``), a Python int in eager code -- never
widens the tensor it meets, and only its kind counts (an integer tensor times ``0.5`` is
the default float dtype). The oracle runs each expression eagerly, one vertex at a time,
with the in-degree as the Python int it is there.

bfloat16 runs on the Triton backend: Triton's CPU interpreter has none (numpy lacks it), so
there the program runs on the torch reference backend, with a warning.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import gnnfuse
from gnnfuse.runtime import interpreter
from oracle_check import device_for

# in-degrees 1, 2, 3, 1: every vertex has in-edges (an empty neighbour sum divided by
# len(v.innbs) is the clamped 0 gnnfuse documents, not eager's NaN)
SRC, DST = [1, 0, 2, 0, 1, 3, 2], [0, 1, 1, 2, 2, 2, 3]


def tables(device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    drawn = {"h": torch.randn(4, 3, generator=gen), "d": torch.randn(4, 3, dtype=torch.float64, generator=gen),
             "q": torch.randn(4, 3, generator=gen).half(), "i": torch.randint(-9, 9, (4, 3), generator=gen),
             "j": torch.randint(-9, 9, (4, 3), generator=gen, dtype=torch.int32)}
    return {k: t.to(device).requires_grad_(t.is_floating_point()) for k, t in drawn.items()}


def expressions(v, n, total):
    """The same per-vertex expressions, traced (``v`` a vertex, ``n = len(v.innbs)``) and
    eager (``v`` a row of each table, ``n`` a Python int); ``total`` is the neighbour sum of h."""
    return {"mean": total / n, "scaled": v.h * n, "inverse": v.h * (1 / n), "root": v.d * n ** -0.5,
            "reciprocal": v.d * n ** -1, "count": v.i * n, "count32": v.j * n, "float_of_int": v.i * 0.5,
            "int_minus_float": v.j - 2.5, "half": v.q * 0.1, "half_count": v.q / n, "int_of_int": v.j * 3,
            # numpy scalars are the Python numbers they hold to torch (they were refused)
            "numpy_half": v.q * np.float32(0.1), "numpy_float_of_int": v.i * np.float32(0.5),
            "numpy_int_of_int": v.j * np.int64(3)}


@gnnfuse.vertex
def compiled(v):
    return expressions(v, len(v.innbs), sum([u.h for u in v.innbs]))


def eager(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    rows = []
    for vertex in range(4):
        row = type("Row", (), {k: x[vertex] for k, x in t.items()})
        sources = [s for s, d in zip(SRC, DST) if d == vertex]
        rows.append(expressions(row, len(sources), sum(t["h"][s] for s in sources)))
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def test_python_numbers_take_eager_dtypes_values_and_gradients(backend, device):
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    t = tables(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the cpu backend's warning for float16
        got = compiled(graph, t)
    expected = eager(t)
    assert {k: x.dtype for k, x in got.items()} == {k: x.dtype for k, x in expected.items()}
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    floats = [k for k, x in expected.items() if x.is_floating_point()]
    leaves = [t["h"], t["d"], t["q"]]
    weights = {k: torch.linspace(-1, 1, expected[k].numel(), device=device).view_as(expected[k]) for k in floats}
    grads = torch.autograd.grad(sum((got[k] * weights[k]).sum() for k in floats), leaves)
    expected_grads = torch.autograd.grad(sum((expected[k] * weights[k]).sum() for k in floats), leaves)
    for g, e in zip(grads, expected_grads):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-3)


def test_a_float64_degree_scale_keeps_double_precision(backend, device):
    """``len(v.innbs) ** -0.5`` is a Python double in eager code: next to float64 data it
    is computed in float64, not in the default float32."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    d = tables(device)["d"]
    got = compiled(graph, {**tables(device), "d": d})["root"]
    degree = torch.bincount(torch.tensor(DST), minlength=4).to(device)
    torch.testing.assert_close(got, d * degree.double().pow(-0.5)[:, None], rtol=1e-12, atol=0)


ROW_SCALAR_EXPRESSIONS = {
    # per-row scalars of a vertex function (``u.s`` of an [N] table, a feature sum, an item)
    # are 0-dim tensors in eager code run for one vertex, and promote as such
    "row": lambda u, v, c: u.h * u.s, "dst_row": lambda u, v, c: u.h * v.s,
    "summed": lambda u, v, c: u.h * u.d.sum(-1), "item": lambda u, v, c: u.h * u.d[0],
    "maximum": lambda u, v, c: torch.maximum(u.h, u.s), "alpha": lambda u, v, c: torch.add(u.h, v.s, alpha=2),
    "two_scalars": lambda u, v, c: u.t * c}


def test_per_row_scalars_of_a_vertex_function_promote_as_0_dim_tensors(backend, device):
    """Eager code for one vertex holds ``u.s`` of an [N] table as a 0-dim tensor, which
    does not widen a float32 [F] row: ``u.h * u.s`` of float32 ``h`` and float64 ``s`` is
    float32 there. The trace ranked both with their row axis and gave float64 (so a later
    ``@ W`` of a float32 W raised), and ``u.t * S`` of float32 ``t`` and a captured 0-dim
    float64 ``S`` float32 where eager gives float64 (two 0-dim tensors)."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    t = {k: x for k, x in tables(device).items() if k in ("h", "d")}
    gen = torch.Generator().manual_seed(1)
    t["s"] = torch.randn(4, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    t["t"] = torch.randn(4, generator=gen).to(device).requires_grad_()
    scale = torch.tensor(0.5, dtype=torch.float64, device=device)      # a captured 0-dim tensor

    @gnnfuse.vertex
    def row_scalars(v):
        return {"row": sum([u.h * u.s for u in v.innbs]), "dst_row": sum([u.h * v.s for u in v.innbs]),
                "summed": sum([u.h * u.d.sum(-1) for u in v.innbs]), "item": sum([u.h * u.d[0] for u in v.innbs]),
                "maximum": sum([torch.maximum(u.h, u.s) for u in v.innbs]),
                "alpha": sum([torch.add(u.h, v.s, alpha=2) for u in v.innbs]),
                "two_scalars": sum([u.t * scale for u in v.innbs])}
    got = row_scalars(graph, t)
    rows = []
    for vertex in range(4):
        sources = [s for s, d in zip(SRC, DST) if d == vertex]
        u_rows = [type("Row", (), {k: x[s] for k, x in t.items()}) for s in sources]
        v_row = type("Row", (), {k: x[vertex] for k, x in t.items()})
        rows.append({k: sum(f(u, v_row, scale) for u in u_rows) for k, f in ROW_SCALAR_EXPRESSIONS.items()})
    expected = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    assert {k: x.dtype for k, x in got.items()} == {k: x.dtype for k, x in expected.items()}
    torch.testing.assert_close(got, expected)
    leaves = list(t.values())
    grads = torch.autograd.grad(sum(x.double().sum() for x in got.values()), leaves)
    for g, e in zip(grads, torch.autograd.grad(sum(x.double().sum() for x in expected.values()), leaves)):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e)


def message(edges):
    return {"m": edges.src["h"], "k": edges.src["i"]}


def reduce(nodes):
    """DGL code: the mailbox's shape[1] is a Python int there."""
    n = nodes.mailbox["m"].shape[1]
    return {"mean": nodes.mailbox["m"].sum(1) / n, "count": nodes.mailbox["k"].sum(1) * n,
            "half": nodes.mailbox["k"].sum(1) * 0.5}


def test_mailbox_width_and_constants_take_eager_dtypes_in_message_passing(backend, device):
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    t = tables(device)
    got = gnnfuse.message_passing(graph, message, reduce, ndata={"d": t["d"], "h": t["h"], "i": t["i"]})
    degree = torch.bincount(torch.tensor(DST), minlength=4).to(device)
    total_h = torch.zeros_like(t["h"]).index_add(0, graph.dst, t["h"][graph.src])
    total_i = torch.zeros_like(t["i"]).index_add(0, graph.dst, t["i"][graph.src])
    expected = {"mean": total_h / degree[:, None].float(), "count": total_i * degree[:, None],
                "half": total_i * 0.5}
    assert {k: x.dtype for k, x in got.items()} == {k: x.dtype for k, x in expected.items()}
    torch.testing.assert_close(got, expected)


@gnnfuse.vertex
def scaled_sum(v):
    return sum([u.h * 2 for u in v.innbs]) / len(v.innbs)


def test_bfloat16_on_the_triton_backend_runs_or_falls_back_with_a_warning(monkeypatch):
    """The interpreter stopped inside Triton with "InterpreterError: ValueError('Unsupported
    data type')"; compiled kernels on a GPU read bfloat16, so only the interpreter warns."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setattr(interpreter, "_WARNED", [])
    device = device_for("triton")
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    h = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)).to(device, torch.bfloat16).requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = scaled_sum(graph, {"h": h})
        (grad,) = torch.autograd.grad(out.float().sum(), h)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    assert any("no bfloat16" in str(w.message) for w in caught) == interpreted
    h_ref = h.detach().requires_grad_()
    degree = torch.bincount(graph.dst, minlength=4)[:, None]
    expected = torch.zeros_like(h_ref).index_add(0, graph.dst, (h_ref * 2)[graph.src]) / degree
    (expected_grad,) = torch.autograd.grad(expected.float().sum(), h_ref)
    assert out.dtype == grad.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(grad, expected_grad, rtol=2e-2, atol=2e-2)


def test_a_captured_size_one_tensor_that_would_widen_edge_data_is_refused():
    """Its [1] axis lines up with the edge axis, so it was held as a 0-dim tensor: float32
    edge data times a [1] float64 tensor gave float32 where torch gives float64."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4)
    w, wide, same = torch.rand(len(SRC)), torch.tensor([2.0], dtype=torch.float64), torch.tensor([2.0])
    with pytest.raises(gnnfuse.CompileError, match="torch gives torch.float64"):
        gnnfuse.apply_edges(graph, lambda edges: {"o": edges.data["w"] * wide}, edata={"w": w})
    torch.testing.assert_close(gnnfuse.apply_edges(graph, lambda edges: {"o": edges.data["w"] * same},
                                                   edata={"w": w})["o"], w * same)


def test_a_pyg_message_of_integer_data_times_a_float_takes_the_default_dtype():
    """The PyG front end traces with the same tracer: ``k_j * 0.5`` of integer data was
    float64 beside a float64 x (the first float table) where PyG gives float32."""
    from torch_geometric.nn import MessagePassing as PyGMessagePassing

    from gnnfuse.nn import MessagePassing

    def layer(base: type):
        class Halved(base):
            def forward(self, x, edge_index, k):
                return self.propagate(edge_index, x=x, k=k)

            def message(self, x_j, k_j):
                return k_j * 0.5
        return Halved(aggr="mean")
    edge_index, k = torch.tensor([SRC, DST]), torch.randint(0, 9, (4, 3))
    x = torch.randn(4, 3, dtype=torch.float64)
    got, expected = layer(MessagePassing)(x, edge_index, k), layer(PyGMessagePassing)(x, edge_index, k)
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected)



def test_a_gradient_takes_its_inputs_dtype(backend, device):
    """A float32 product plus a float64 bias (float64 out, as in torch): the bias's
    float64 gradient reached the product's derivative as it was, and ``g @ W^T`` raised
    "expected m1 and m2 to have the same dtype" at backward, where torch's autograd casts
    each gradient to its input's dtype."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4, 3, generator=gen).to(device).requires_grad_()
    w = torch.randn(3, 4, generator=gen).to(device).requires_grad_()
    b = torch.randn(len(SRC), 4, dtype=torch.float64, generator=gen).to(device).requires_grad_()

    def widened_linear(edges):
        return {"m": (edges.src["h"] * edges.dst["h"]) @ w + edges.data["b"]}

    got = gnnfuse.message_passing(graph, widened_linear, lambda nodes: {"m": nodes.mailbox["m"].sum(1)},
                                  ndata={"h": h}, edata={"b": b})["m"]
    eager = torch.zeros(4, 4, dtype=torch.float64, device=device).index_add(
        0, graph.dst, (h[graph.src] * h[graph.dst]) @ w + b)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, eager)
    weight = torch.linspace(-1, 1, 16, dtype=torch.float64, device=device).view(4, 4)
    grads = torch.autograd.grad((got * weight).sum(), [h, w, b])
    for g, e in zip(grads, torch.autograd.grad((eager * weight).sum(), [h, w, b])):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e)


def test_a_trace_under_another_default_dtype_takes_that_dtype(backend, device):
    """Integer data made float (``t / 3``, ``torch.sigmoid(t)``) is the default dtype, as in
    torch. The op's inferred dtype was memoized by its operands alone, so once a trace had
    run under float32 a later trace under ``torch.set_default_dtype(torch.float64)`` was
    given float32 again: its kernels returned float32 (exp of ints off by 2e-6) where torch,
    and a first trace under float64, give float64."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    t = torch.randint(1, 9, (len(SRC), 3), generator=torch.Generator().manual_seed(0)).to(device)

    def floats(edges):
        return {"third": edges.data["t"] / 3, "gate": torch.sigmoid(edges.data["t"]),
                "grown": torch.exp(edges.data["t"])}

    previous = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64):
            torch.set_default_dtype(default)
            got = gnnfuse.apply_edges(graph, floats, edata={"t": t})
            expected = {"third": t / 3, "gate": torch.sigmoid(t), "grown": torch.exp(t)}
            assert {k: x.dtype for k, x in got.items()} == {k: default for k in expected}
            # float64's own tolerance (rtol 1e-7) let values computed in float32 pass on the
            # CPU (correctly rounded there; 2.4e-7 off with a GPU's exp)
            tight = {"rtol": 1e-12, "atol": 0.0} if default == torch.float64 else {}
            torch.testing.assert_close(got, expected, **tight)
    finally:
        torch.set_default_dtype(previous)


def test_a_feature_sum_of_integer_edge_data_stays_exact(backend, device):
    """``t.sum(-1)`` of integer edge data is an exact int64 in torch. On Triton the per-edge
    feature sum became an edge unit (and a body term of units reading it) summed in the
    kernel's float32 accumulator: int64 values near 2**53 came back 1e8 off, and an int32
    row (2**31 - 1, -2**31, 2**30) summed to 2**30 instead of 2**30 - 1; recomputed in the
    body of a float unit, (2**24 + 1, 2**24 + 1, -2**24) * 0.5 gave 2**23, not 2**23 + 1."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    big = torch.tensor([2 ** 53 + 1, 2 ** 40 + 3, -(2 ** 53) - 3, 2 ** 24 + 1, 2 ** 31 - 1, -(2 ** 31), 2 ** 62 + 7])
    t = torch.stack([big, big // 3, -big // 7], 1).to(device)
    k = torch.tensor([[2 ** 31 - 1, -(2 ** 31), 2 ** 30]] * len(SRC), dtype=torch.int32, device=device)
    m = torch.tensor([[2 ** 24 + 1, 2 ** 24 + 1, -(2 ** 24)]] * len(SRC), device=device)
    h = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)).to(device)

    def sums(edges):
        return {"wide": edges.data["t"].sum(-1), "narrow": edges.data["k"].sum(1),
                "scaled": edges.src["h"] * (edges.data["m"].sum(-1, keepdim=True) * 0.5)}

    got = gnnfuse.apply_edges(graph, sums, edata={"t": t, "k": k, "m": m}, ndata={"h": h})
    expected = {"wide": t.sum(-1), "narrow": k.sum(1), "scaled": h[graph.src] * (m.sum(-1, keepdim=True) * 0.5)}
    assert {n: x.dtype for n, x in got.items()} == {n: x.dtype for n, x in expected.items()}
    assert torch.equal(got["wide"], expected["wide"]) and torch.equal(got["narrow"], expected["narrow"])
    torch.testing.assert_close(got["scaled"], expected["scaled"], rtol=0, atol=0)


@pytest.mark.parametrize("subtract", [lambda e: 1.0 - e.data["b"], lambda e: e.data["f"] - e.data["b"],
                                      lambda e: e.data["b"] - e.src["h"]], ids=["constant", "edge", "gathered"])
def test_subtracting_a_bool_mask_is_refused_as_in_torch(backend, device, subtract):
    """torch refuses ``-`` with a bool operand; its meta function, gnnfuse's dtype
    inference, lets ``bool - float`` through: the Triton and Numba kernels computed
    ``1.0 - mask`` (0.0 where True) and the reference backend raised torch's RuntimeError
    only at run time."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    mask = (torch.arange(len(SRC)) % 2 == 0).view(-1, 1).to(device)
    with pytest.raises(gnnfuse.CompileError, match="Subtraction, the `-` operator, with a bool tensor"):
        gnnfuse.apply_edges(graph, lambda edges: {"o": subtract(edges)},
                            edata={"b": mask, "f": torch.rand(len(SRC), 1, device=device)},
                            ndata={"h": torch.rand(4, 1, device=device)})


@pytest.mark.parametrize("weight", [torch.int64, torch.float64], ids=["int64", "float64"])
def test_a_product_of_two_dtypes_is_refused_as_in_torch(backend, device, weight):
    """torch's matmul refuses operands of two dtypes; its meta function, gnnfuse's dtype
    inference, takes them and answers the left one's: float32 edge features @ an int64
    weight ran in the Triton and Numba kernels' unrolled edge-feature dot (float32 out),
    and the reference backend raised torch's RuntimeError only at run time."""
    graph = gnnfuse.Graph(torch.tensor(SRC), torch.tensor(DST), 4).to(device)
    w = torch.arange(12, device=device).view(3, 4).to(weight)
    with pytest.raises(gnnfuse.CompileError, match=f"got torch.float32 @ {weight}"):
        gnnfuse.apply_edges(graph, lambda edges: {"o": edges.data["f"] @ w},
                            edata={"f": torch.rand(len(SRC), 3, device=device)})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [(), (64,)], ids=["scalar", "wide"])
def test_a_half_precision_sum_over_a_hub_accumulates_as_torch_does(backend, device, dtype, width):
    """20,000 in-edges of one vertex, messages about 0.015, summed as DGL's
    ``torch.sum(mailbox, 1)`` sums them (in float32, rounded once). Added in the half
    type, each add rounding to it, the sum fell behind: the reference backend's
    ``index_add_`` of scalar messages (a 1-D tensor) and the Triton kernels' atomic adds
    (the COO and scan schedules) stopped at 64 of about 300 in float16, bfloat16 sooner."""
    edges = 20000
    graph = gnnfuse.Graph(torch.arange(edges), torch.full((edges,), edges), edges + 1).to(device)
    w = (torch.rand((edges, *width), generator=torch.Generator().manual_seed(0)) * 0.03).to(device, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the interpreter's bfloat16 fallback
        out = gnnfuse.message_passing(graph, lambda edges: {"m": edges.data["w"]},
                                      lambda nodes: {"s": torch.sum(nodes.mailbox["m"], dim=1)},
                                      ndata={}, edata={"w": w})["s"]
    expected = torch.sum(w.unsqueeze(0), dim=1)[0]
    torch.testing.assert_close(out[edges].float(), expected.float(), rtol=2 * torch.finfo(dtype).eps, atol=0)
