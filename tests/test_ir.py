"""Residency inference, the verifier, the printed listing and the backward programs."""
from __future__ import annotations

import pytest
import torch

from gnnfuse.autodiff import build_backward
from gnnfuse.ir import CompileError, Movement, Program, Residency, join, registered_ops, verify

R = Residency
f64 = torch.float64


@pytest.mark.parametrize("inputs, expected", [
    ([R.SRC, R.SRC], R.SRC), ([R.DST, R.SHARED], R.DST), ([R.SRC, R.DST], R.EDGE),
    ([R.EDGE, R.SRC], R.EDGE), ([R.NODE, R.SHARED], R.NODE), ([R.SHARED], R.SHARED),
    ([R.EDGE_TYPE, R.SHARED], R.EDGE_TYPE),
])
def test_dense_residency_join(inputs, expected):
    assert join(inputs) is expected


@pytest.mark.parametrize("inputs", [[R.NODE, R.EDGE], [R.NODE, R.SRC], [R.EDGE_TYPE, R.EDGE]])
def test_join_rejects_vertex_data_mixed_with_edges(inputs):
    with pytest.raises(ValueError, match="broadcast"):
        join(inputs)


def gat_like() -> Program:
    p = Program()
    h = p.input("h", R.NODE, (2, 3), f64)
    a = p.input("a", R.SHARED, (2, 3), f64)
    el = p.add("sum_dim", p.add("mul", h, a), dim=(-1,), keepdim=False)
    s = p.add("broadcast", el, by="src")
    d = p.add("broadcast", el, by="dst")
    e = p.add("leaky_relu", p.add("add", s, d), negative_slope=0.2)
    alpha = p.add("edge_softmax", e, by="dst")
    msg = p.add("mul", p.add("reshape", alpha, shape=(2, 1)), p.add("broadcast", h, by="src"))
    p.output("out", p.add("reduce", msg, op="sum", by="dst"))
    return p


def test_residency_and_shapes_are_inferred():
    p = gat_like()
    kinds = [(v.op, v.residency, v.shape) for v in p if v.op != "input"]
    assert kinds == [
        ("mul", R.NODE, (2, 3)), ("sum_dim", R.NODE, (2,)), ("broadcast", R.SRC, (2,)),
        ("broadcast", R.DST, (2,)), ("add", R.EDGE, (2,)), ("leaky_relu", R.EDGE, (2,)),
        ("edge_softmax", R.EDGE, (2,)), ("reshape", R.EDGE, (2, 1)), ("broadcast", R.SRC, (2, 3)),
        ("mul", R.EDGE, (2, 3)), ("reduce", R.NODE, (2, 3)),
    ]
    assert [v.movement for v in p if v.op in ("broadcast", "reduce", "edge_softmax", "mul")][:4] == [
        Movement.DENSE, Movement.BROADCAST, Movement.BROADCAST, Movement.NORM]
    verify(p)


def test_pretty_lists_residency_shape_and_movement():
    text = gat_like().pretty()
    assert "EDGE[2] float64" in text and "= edge_softmax(%" in text and "[norm]" in text
    assert text.splitlines()[-1].strip().startswith("return out=")


def test_program_rejects_ill_formed_ops():
    p = Program()
    h = p.input("h", R.NODE, (3,), f64)
    w = p.input("w", R.EDGE, (3,), f64)
    with pytest.raises(CompileError, match="cannot take operands.*NODE.*EDGE"):
        p.add("add", h, w)
    with pytest.raises(CompileError, match="reduce takes edge data"):
        p.add("reduce", h, op="sum", by="dst")
    with pytest.raises(CompileError, match="no registry entry for op 'frobnicate'"):
        p.add("frobnicate", h)
    with pytest.raises(CompileError, match="reduce op must be one of"):
        p.add("reduce", w, op="median", by="dst")
    with pytest.raises(CompileError, match="matmul"):
        p.add("matmul", h, p.input("W", R.SHARED, (4, 2), f64))


def test_verifier_catches_corrupted_programs():
    p = gat_like()
    verify(p)
    victim = next(v for v in p if v.op == "edge_softmax")
    victim.shape = (5,)
    with pytest.raises(CompileError, match="records EDGE\\[5\\].*infers EDGE\\[2\\]"):
        verify(p)
    p = gat_like()
    p.values.reverse()
    with pytest.raises(CompileError, match="before it is defined"):
        verify(p)
    with pytest.raises(CompileError, match="no outputs"):
        verify(Program())


def test_every_op_has_one_complete_registry_entry():
    for name, op in registered_ops().items():
        assert op.name == name and callable(op.reference) and isinstance(op.movement, Movement)


def test_backward_of_source_broadcast_is_a_reduce_over_out_edges():
    p = Program()
    h = p.input("h", R.NODE, (4,), f64)
    w = p.input("W", R.SHARED, (4, 3), f64)
    msg = p.add("matmul", p.add("broadcast", h, by="src"), w)
    p.output("out", p.add("reduce", msg, op="sum", by="dst"))
    bwd = build_backward(p, ["h", "W"])
    ops = [(v.op, v.attrs.get("by")) for v in bwd.program if v.op != "input"]
    assert ("broadcast", "dst") in ops            # d(reduce by dst) = broadcast by dst
    assert ("reduce", "src") in ops               # d(broadcast by src) = reduce over out-edges
    assert ("matmul_tn", None) in ops             # parameter gradient reduces over all rows
    assert set(bwd.program.outputs) == {"grad:h", "grad:W"}
    assert bwd.program.outputs["grad:W"].residency is R.SHARED
    assert {v.op for v in bwd.saved} <= {"input", "broadcast"}   # only what the rules read


def test_backward_skips_inputs_without_gradient():
    p = gat_like()
    bwd = build_backward(p, ["a"])
    assert list(bwd.program.outputs) == ["grad:a"]
    assert bwd.program.outputs["grad:a"].shape == (2, 3)


EDGE_VALUES = [0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e-310, -1e-310, 3.5]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, f64])
def test_reference_select_and_relu_slope_give_torch_where_bits(dtype):
    """The torch reference of ``select(mask, a, 0)`` and of ``relu_slope`` run as
    ``threshold_backward`` (torch's CPU ``where`` branches per element: 15x slower on a
    random sign pattern); every pair of edge values -- signed zeros, NaN, infinities,
    subnormals -- gives the bits ``torch.where`` gives (a NaN for a NaN: bfloat16 goes
    through float32 and back, which may change a NaN's payload), and the gradient reaches
    ``a``."""
    ops = registered_ops()
    pairs = torch.tensor([[m, a] for m in EDGE_VALUES for a in EDGE_VALUES], dtype=dtype)
    mask, a = pairs[:, 0].contiguous(), pairs[:, 1].contiguous().requires_grad_()
    zero = torch.tensor(0.0, dtype=dtype)
    got = ops["select"].reference(None, mask, a, zero)
    expected = torch.where(mask != 0, a, zero)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    grad, = torch.autograd.grad(got.sum(), a)
    assert torch.equal(grad, (mask != 0).to(dtype))
    got, expected = got.detach(), expected.detach()
    assert bool(((got.view(bits) == expected.view(bits)) | (got.isnan() & expected.isnan())).all())
    slope = ops["relu_slope"].reference(None, mask)
    assert torch.equal(slope.view(bits), torch.where(mask <= 0, torch.zeros_like(mask), torch.ones_like(mask)).view(bits))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, f64])
@pytest.mark.parametrize("slope", [0.2, -0.3, 0.0, 1.5, 1e-30])
def test_reference_leaky_relu_grad_is_torch_s_leaky_relu_gradient(dtype, slope):
    """``leaky_relu_grad`` runs as torch's ``leaky_relu_backward`` of the incoming gradient:
    negative slopes, a slope above 1, one that rounds to 0 in half precision, gradients
    and inputs at every edge value (NaN, infinities, signed zeros, subnormals): it has the
    bits of torch's own gradient of ``leaky_relu``, in the input's dtype. In float32 and
    float64 also those of the product of the gradient and the slope multiplier (1 above
    0, else the slope) that it replaced; in half precision that product took the slope
    rounded to the dtype (3.5 * 0.2 gave 0.6997 in float16 where torch gives 0.7002, and
    inf * 1e-30 NaN where torch gives inf), torch and the kernels the float32 slope."""
    x = torch.tensor(EDGE_VALUES, dtype=dtype).repeat_interleave(len(EDGE_VALUES)).requires_grad_()
    g = torch.tensor(EDGE_VALUES, dtype=dtype).repeat(len(EDGE_VALUES))
    expected, = torch.autograd.grad(torch.nn.functional.leaky_relu(x, slope), x, g)
    got = registered_ops()["leaky_relu_grad"].reference(None, g, x.detach(), negative_slope=slope)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    assert got.dtype == dtype and torch.equal(got.view(bits), expected.view(bits))
    if dtype in (torch.float32, f64):
        old = g * torch.where(x.detach() > 0, torch.ones_like(x), torch.full_like(x, slope))
        assert torch.equal(got.view(bits), old.view(bits))
