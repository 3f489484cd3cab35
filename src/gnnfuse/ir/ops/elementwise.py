"""Elementwise ops: per-element, per-row math with right-aligned feature broadcasting."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import OpDef, register
from ..residency import Movement
from ..rounded import quotient, square_root


def _ew(name: str, fn, derivative=None, arity: int | None = None, doc: str = "", emit: str | None = None,
        bounded: bool = False, autograd: bool = False) -> OpDef:
    """``emit`` is the op's Triton expression: ``{0}``, ``{1}`` are operands, ``{attr}`` attrs;
    ``bounded``: the derivative is finite wherever the operands are (`OpDef.bounded_derivative`);
    ``autograd``: torch's autograd through ``fn`` gives ``derivative`` (`OpDef.autograd_reference`)."""
    return register(OpDef(name, Movement.DENSE, lambda ctx, *xs, **a: fn(*xs, **a),
                          derivative=derivative, elementwise=True, arity=arity, doc=doc, emit=emit,
                          bounded_derivative=bounded, autograd_reference=autograd))


def _wide(v) -> bool:
    """Whether a kernel computes ``v`` in float64 (`rounded`): float32, float16 and bfloat16
    values are computed in float32."""
    return v.dtype == torch.float64


# --- binary -------------------------------------------------------------------------
_ew("add", torch.add, lambda b, v, g: [g, g], 2, emit="({0} + {1})", bounded=True, autograd=True)
def _sub(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``torch.sub``, refusing a bool operand as torch's CPU and CUDA kernels do: its meta
    function, which infers the op's dtype at trace time, lets ``bool - float`` through, so
    ``1.0 - mask`` of a bool mask ran in the Triton and Numba kernels (1.0 - True = 0.0)
    where torch, and the reference backend at run time, raise."""
    if torch.bool in (x.dtype, y.dtype):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying "
                           "to invert a mask, use the `~` or `logical_not()` operator instead.")
    return torch.sub(x, y)


_ew("sub", _sub, lambda b, v, g: [g, b.add("neg", g)], 2, emit="({0} - {1})", bounded=True, autograd=True)
_ew("mul", torch.mul, lambda b, v, g: [b.add("mul", g, b.fwd(v.inputs[1])),
                                        b.add("mul", g, b.fwd(v.inputs[0]))], 2, emit="({0} * {1})", bounded=True,
                                        autograd=True)
# The divisor's gradient is torch's ``-g * ((x / y) / y)``: ``-(g * (x / y)) / y`` rounds
# and overflows elsewhere -- at y = 1e-20 (float32, x = 1, g = 1e-10) it gave -1e30 where
# torch gives -inf, and where g is 0 (an edge a max did not pick) 0 where torch gives NaN.
_ew("div", torch.div, lambda b, v, g: [
    b.add("div", g, b.fwd(v.inputs[1])),
    b.add("neg", b.add("mul", g, b.add("div", b.fwd(v), b.fwd(v.inputs[1])))),
], 2, emit=lambda v: quotient("{0}", "{1}", _wide(v)), autograd=True)
_ew("eq", lambda x, y: (x == y).to(torch.promote_types(x.dtype, y.dtype)), None, 2,
    doc="1 where equal else 0; not differentiable (used by max/min derivatives)", emit="tl.where({0} == {1}, 1.0, 0.0)")

for _name, _tl in (("stored_float16", "tl.float16"), ("stored_bfloat16", "tl.bfloat16")):
    _ew(_name, lambda x: x, None, 1,
        doc="x as its dtype stores it: a kernel computes float16/bfloat16 values in float32 (ACC), and a "
            "max's stored result is the rounded one; torch holds them rounded already",
        emit="tl.cast(tl.cast({0}, %s), ACC)" % _tl)

def _passed(b, g, share):
    """``g * share`` where ``share`` is nonzero and an exact 0 elsewhere, as torch's
    backward for relu, clamp and maximum/minimum does with ``where``/``masked_fill``: a
    plain product would turn an infinite or NaN gradient into NaN on the elements the op
    cut off (``sqrt(relu(x))`` at ``x < 0`` gets ``inf * 0``; torch gives 0 there)."""
    return b.add("select", share, b.add("mul", g, share), b.const(0.0, g))


# --- unary --------------------------------------------------------------------------
def _expm1(u: str, y: str) -> str:
    """``exp(y) - 1`` from ``u = tl.exp(y)`` without the cancellation of ``u - 1`` near
    y = 0 (``tl`` has no expm1 in Triton 3.6): one Newton step on ``log``, ``(u - 1) -
    u * (log(u) - y)``, corrects the rounding of ``u`` (and of an approximate GPU exp)
    to within a few ulps. ``u < 0.5`` needs no correction and keeps ``log(0)`` out;
    ``u == 1`` gives y itself, so -0.0 keeps its sign."""
    return (f"tl.where({u} < 0.5, {u} - 1.0, tl.where({u} == 1.0, {y}, "
            f"({u} - 1.0) - {u} * (tl.log({u}) - {y})))")


# tanh(|x|) = expm1(2|x|) / (expm1(2|x|) + 2), with the sign put back (x itself at 0
# and NaN): ``2 * sigmoid(2x) - 1`` cancelled near 0 -- 1.19e-7 for tanh(1e-7) in
# float32, 0 for tanh(1e-30). |x| is clamped at 20, where tanh is 1 in float64 too.
def _tanh(v) -> tuple[str, ...]:
    return ("tl.abs({0})",
            "tl.where({s0} > 20.0, 40.0, {s0} + {s0})",
            "tl.exp({s1})",
            _expm1("{s2}", "{s1}"),
            quotient("{s3}", "({s3} + 2.0)", _wide(v)),
            "tl.where({0} < 0, -{s4}, tl.where({0} > 0, {s4}, {0}))")
_ew("neg", torch.neg, lambda b, v, g: [b.add("neg", g)], 1, emit="(-{0})", bounded=True, autograd=True)
_ew("exp", torch.exp, lambda b, v, g: [b.add("mul", g, b.fwd(v))], 1, emit="tl.exp({0})", autograd=True)
_ew("log", torch.log, lambda b, v, g: [b.add("div", g, b.fwd(v.inputs[0]))], 1, emit="tl.log({0})", autograd=True)
_ew("sqrt", torch.sqrt, lambda b, v, g: [
    b.add("div", g, b.add("mul", b.fwd(v), b.const(2.0, g)))], 1, emit=lambda v: square_root("{0}", _wide(v)),
    autograd=True)
def _pow_derivative(b, v, g):
    """``g * (c * x ** (c - 1))``, and none for ``x ** 0``, as torch's backward gives
    zeros there: the product made ``0 * 0 ** -1`` = NaN at x = 0 (and at NaN)."""
    exponent = v.attrs["exponent"]
    if exponent == 0:
        return [None]
    return [b.add("mul", g, b.add("mul", b.add("pow", b.fwd(v.inputs[0]), exponent=exponent - 1.0),
                                  b.const(exponent, g)))]


# No kernel expression: on an H200 the emitted powers lost a zero's sign (fast-math nsz),
# 1 / x was 1 ulp off in float32, and float32 x ** 4 through exp(4 log|x|) gave NaN, where
# the interpreter and the CPU agreed with torch; a power runs as a torch op.
_ew("pow", lambda x, exponent: torch.pow(x, exponent), _pow_derivative, 1)
# NaN follows torch in both directions: the forward keeps it (tl.maximum would drop it),
# and each slope takes the branch torch's backward kernel takes for NaN.
_ew("relu", torch.relu, lambda b, v, g: [_passed(b, g, b.add("relu_slope", b.fwd(v.inputs[0])))], 1,
    emit="tl.where({0} < 0, 0.0, {0})", bounded=True, autograd=True)   # x itself at 0: torch's relu(-0.0) is -0.0
# threshold_backward is torch's own relu backward, ``x <= 0 ? 0 : 1`` here: torch's CPU ``where``
# branches per element, and on a random sign pattern took 0.45 ms for [1900, 64] where this
# takes 0.02 (a GINEConv training step on a batch of 32 small graphs: 2 of these per step)
_ew("relu_slope", lambda x: torch.ops.aten.threshold_backward(torch.ones_like(x), x, 0), None, 1,
    doc="derivative multiplier of relu: 0 where x <= 0, else 1 (NaN included, as torch)",
    emit="tl.where({0} <= 0, 0.0, 1.0)")
_ew("step", lambda x: (x > 0).to(x.dtype), None, 1, doc="1 where x > 0 else 0", emit="tl.where({0} > 0, 1.0, 0.0)")
_ew("leaky_relu", lambda x, negative_slope: F.leaky_relu(x, negative_slope),
    lambda b, v, g: [b.add("leaky_relu_grad", g, b.fwd(v.inputs[0]), negative_slope=v.attrs["negative_slope"])],
    1, emit="tl.where({0} > 0, {0}, {0} * {negative_slope})", bounded=True, autograd=True)
# leaky_relu's backward as one op, torch's own: g where x > 0, else g * negative_slope (NaN
# included, as torch). The same numbers as g times the slope (g * 1 is g): the reference
# executor ran that as three ops (ones, leaky_relu_backward of them, the product) per
# attention layer's backward, a dispatch each on a small graph's host-bound step; and
# torch.where took 66 us for GAT's [10K, 4] attention logits on a CPU thread, this 7.
# Its derivative in x is 0 wherever it has one, as torch's double backward gives it.
_ew("leaky_relu_grad", lambda g, x, negative_slope: torch.ops.aten.leaky_relu_backward(g, x, negative_slope, False),
    lambda b, v, gg: [b.add("leaky_relu_grad", gg, b.fwd(v.inputs[1]), negative_slope=v.attrs["negative_slope"]),
                      None], 2,
    doc="leaky_relu's backward of gradient g at x: g where x > 0, else g * negative_slope (NaN included)",
    emit="tl.where({1} > 0, {0}, {0} * {negative_slope})", bounded=True)
# elu's negative side is alpha * expm1(x), as torch computes it: ``exp(x) - 1`` gave
# -5.96e-8 for elu(-1e-7) in float32 and 0 for elu(-1e-30)
_ew("elu", lambda x, alpha: F.elu(x, alpha),
    lambda b, v, g: [b.add("mul", g, b.add("elu_slope", b.fwd(v.inputs[0]), alpha=v.attrs["alpha"]))], 1,
    emit=("tl.exp({0})", _expm1("{s0}", "{0}"), "tl.where({0} > 0, {0}, {alpha} * {s1})"), bounded=True, autograd=True)
_ew("elu_slope", lambda x, alpha: torch.where(x <= 0, alpha * torch.exp(x), torch.ones_like(x)),
    None, 1, doc="derivative multiplier of elu", emit="tl.where({0} <= 0, {alpha} * tl.exp({0}), 1.0)")
def _log1p(w: str, z: str, wide: bool) -> str:
    """``log(1 + z)`` from ``w = 1 + z`` (``tl`` has no log1p in Triton 3.6): Kahan's
    ``log(w) * z / (w - 1)``, which cancels the rounding of ``w``; ``log(w)`` itself
    where ``w - 1`` is exactly z (z = inf included), z where ``w`` rounds to 1."""
    return (f"tl.where({w} == 1.0, {z}, tl.where({w} - 1.0 == {z}, tl.log({w}), "
            f"tl.log({w}) * {quotient(z, f'({w} - 1.0)', wide)}))")


# softplus as torch computes it: linear above the threshold, log1p(exp) below.
# ``log(1 + exp(x))`` lost exp(x) below 1e-8 (softplus(-30) = 0 in float32, 9.36e-14 in
# torch) and was 2e-4 off at -9.
_ew("softplus", lambda x, beta, threshold: F.softplus(x, beta, threshold),
    lambda b, v, g: [b.add("softplus_backward", g, b.fwd(v.inputs[0]), beta=v.attrs["beta"],
                           threshold=v.attrs["threshold"])], 1,
    emit=lambda v: ("{beta} * {0}", "tl.exp({s0})", "1.0 + {s1}", _log1p("{s2}", "{s1}", _wide(v)),
                    f"tl.where({{s0}} > {{threshold}}, {{0}}, {quotient('{s3}', '{beta}', _wide(v))})"), bounded=True,
                    autograd=True)
# Its backward is torch's formula, ``g * z / (z + 1)`` with ``z = exp(beta x)``, one
# rounding per step: the slope written as ``sigmoid(beta x)`` is ``1 / (1 + exp(-beta
# x))``, whose exp overflows below beta x = -88.7 in float32 (-709.8 in float64), so the
# gradient was 0 at x = -100 where torch's is 3.78e-44 (a float32 subnormal).
_ew("softplus_backward", lambda g, x, beta, threshold: torch.ops.aten.softplus_backward(g, x, beta, threshold),
    None, 2, doc="the gradient g of softplus's output times its derivative at x, as torch computes it",
    emit=lambda v: ("{beta} * {1}", "tl.exp({s0})", "{0} * {s1}", "{s1} + 1.0",
                    f"tl.where({{s0}} > {{threshold}}, {{0}}, {quotient('{s2}', '{s3}', _wide(v))})"))
# silu and its gradient as torch computes them, ``x / (1 + exp(-x))`` and ``g * s * (1 +
# x * (1 - s))`` with ``s = 1 / (1 + exp(-x))``: traced as ``x * sigmoid(x)``, the product
# rule's ``(g * x) * (s * (1 - s))`` overflowed to inf * 0 = NaN at x = -3e38 (float32, g
# = -1.5) where torch's gradient is 0.
_ew("silu", F.silu, lambda b, v, g: [b.add("silu_backward", g, b.fwd(v.inputs[0]))], 1,
    emit=lambda v: ("tl.exp(-{0})", "1.0 + {s0}", quotient("{0}", "{s1}", _wide(v))), bounded=True, autograd=True)
_ew("silu_backward", lambda g, x: torch.ops.aten.silu_backward(g, x), None, 2,
    doc="the gradient g of silu's output times its derivative at x, as torch computes it",
    emit=lambda v: ("tl.exp(-{1})", "1.0 + {s0}", quotient("1.0", "{s1}", _wide(v)), "1.0 - {s2}", "{1} * {s3}",
                    "1.0 + {s4}", "{0} * {s2}", "{s6} * {s5}"))
_ew("sigmoid", torch.sigmoid, lambda b, v, g: [
    b.add("mul", g, b.add("mul", b.fwd(v), b.add("sub", b.const(1.0, g), b.fwd(v))))], 1,
    emit=lambda v: ("tl.exp(-{0})", quotient("1.0", "(1.0 + {s0})", _wide(v))), bounded=True, autograd=True)
_ew("tanh", torch.tanh, lambda b, v, g: [
    b.add("mul", g, b.add("sub", b.const(1.0, g), b.add("mul", b.fwd(v), b.fwd(v))))], 1, emit=_tanh, bounded=True,
    autograd=True)
_ew("stop_gradient", torch.Tensor.detach, lambda b, v, g: [None], 1, emit="{0}",
    doc="identity whose gradient is zero: marks a value the result does not really depend on, such as "
        "the shift a softmax subtracts for stability, so autodiff spends no work on it", bounded=True, autograd=True)
def _at_least(b, x, bound):
    """1 where x >= bound, else 0 (NaN too): where torch's clamp passes its gradient,
    the bound included (relu's step excludes 0)."""
    return b.add("add", b.add("step", b.add("sub", x, bound)), b.add("eq", x, bound))


_ew("clamp_min", lambda x, min: torch.clamp_min(x, min),
    lambda b, v, g: [_passed(b, g, _at_least(b, b.fwd(v.inputs[0]), b.const(v.attrs["min"], g)))], 1,
    emit="tl.where({0} < {min}, {min}, {0})", bounded=True, autograd=True)

# --- sign-dependent ops whose derivative follows torch's at 0 and at ties ---------------
_ew("abs", torch.abs, lambda b, v, g: [b.add("mul", g, b.add("sign", b.fwd(v.inputs[0])))], 1,
    emit="tl.abs({0})", bounded=True, autograd=True)
_ew("sign", torch.sign, None, 1, doc="-1, 0 or 1, and 0 at NaN as torch.sign: the derivative multiplier "
    "of abs, 0 at 0 as in torch", emit="tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))")
_ew("tie_share", lambda x, y: torch.where(x == y, 0.5, torch.where(x < y, 0.0, 1.0)).to(
        torch.promote_types(x.dtype, y.dtype)), None, 2,
    doc="1 where x > y (or either is NaN), 1/2 where x == y, 0 where x < y: x's share of the gradient of "
        "maximum(x, y) (and y's of minimum(y, x)); torch splits a tie evenly between the operands",
    emit="tl.where({0} == {1}, 0.5, tl.where({0} < {1}, 0.0, 1.0))")
_ew("maximum", torch.maximum, lambda b, v, g: [
    _passed(b, g, b.add("tie_share", b.fwd(v.inputs[0]), b.fwd(v.inputs[1]))),
    _passed(b, g, b.add("tie_share", b.fwd(v.inputs[1]), b.fwd(v.inputs[0])))], 2,
    doc="elementwise max; NaN propagates", emit="tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", bounded=True,
    autograd=True)
_ew("minimum", torch.minimum, lambda b, v, g: [
    _passed(b, g, b.add("tie_share", b.fwd(v.inputs[1]), b.fwd(v.inputs[0]))),
    _passed(b, g, b.add("tie_share", b.fwd(v.inputs[0]), b.fwd(v.inputs[1])))], 2,
    doc="elementwise min; NaN propagates", emit="tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", bounded=True,
    autograd=True)
