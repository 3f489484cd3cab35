"""Tensor ops that real DGL / Graphiler / Seastar UDFs use (issue #11 §2-3), written the
way those repositories write them, in both front ends, against plain PyTorch in float64
on outputs and every gradient, on the reference backend and on the Triton kernels (the
interpreter without a GPU: see conftest). The graph has a self loop (equal endpoint
features: ties for max/min, zeros for abs and normalize), a multi-edge and a vertex
with no in-edges; features are small integers, so ties are common."""
from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import gnnfuse
from gnnfuse import CompileError
from gnnfuse.passes.fusion import partition
from gnnfuse.runtime import CompiledProgram

SRC = torch.tensor([0, 1, 2, 3, 3, 4, 1, 2, 2])
DST = torch.tensor([1, 2, 0, 0, 0, 4, 3, 3, 1])
N, FEAT, R = 6, 4, 3
ETYPE = torch.tensor([0, 2, 1, 0, 0, 1, 2, 2, 1])


def graph(device: str, typed: bool = False) -> gnnfuse.Graph:
    if typed:
        return gnnfuse.Graph(SRC, DST, N, edge_type=ETYPE, num_edge_types=R).to(device)
    return gnnfuse.Graph(SRC, DST, N).to(device)


def features(device: str, *shape, integer: bool = True, seed: int = 0) -> torch.Tensor:
    """Drawn on the CPU (one stream for every device), then moved: a leaf on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    if integer:
        return torch.randint(-2, 3, shape, generator=gen).double().to(device).requires_grad_()
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()


def aggregate(messages: torch.Tensor) -> torch.Tensor:
    """DGL's sum reduce, written out: messages added into their destination's row."""
    return torch.zeros((N,) + messages.shape[1:], dtype=messages.dtype,
                       device=messages.device).index_add(0, DST.to(messages.device), messages)


def assert_matches(run, oracle, leaves: list[torch.Tensor]) -> None:
    """Outputs, and the gradients of every leaf under a fixed projection of the output."""
    grads = []
    for fn in (run, oracle):
        for t in leaves:
            t.grad = None
        out = fn()
        weight = torch.linspace(-1, 2, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
        (out * weight).sum().backward()
        grads.append((out.detach(), [t.grad.clone() for t in leaves]))
    (out, got), (ref, want) = grads
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12, equal_nan=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, equal_nan=True)


def line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


# --- per-edge ops in both front ends ---------------------------------------------------
# Each takes the source's and the destination's features, real or traced, and is written
# with dims that mean the same per vertex (vertex code) and per batch of edges (messages).
EDGE_OPS = {
    "abs": lambda a, b: abs(a - b) + torch.abs(a) * b.abs(),
    "pow": lambda a, b: (a - b) ** 2 + a ** 3 * 0.5,
    "max_min": lambda a, b: torch.max(a, b) * 2 + torch.min(a, b),
    "maximum_minimum": lambda a, b: torch.maximum(a, b) - torch.minimum(a * 0.5, b) + a.max(b),
    "math_on_constants": lambda a, b: a * math.exp(0.5) + b * math.sqrt(2.0) - math.pi,
    "normalize": lambda a, b: F.normalize(a - b, p=2, dim=-1) + F.normalize(a, p=1, dim=-1),
    "norm": lambda a, b: a * (a - b).norm(dim=-1, keepdim=True) + torch.norm(b, dim=-1, keepdim=True)
    + torch.linalg.vector_norm(a * b, dim=-1, keepdim=True) * a.norm(p=1, dim=-1, keepdim=True),
    "softmax": lambda a, b: torch.softmax(a * b, dim=-1) + F.softmax(a, dim=-1) * F.log_softmax(b, dim=-1),
    "slices": lambda a, b: torch.cat([a[..., 1:] * b[..., :-1], a[..., ::2]], dim=-1) * b[..., 0:1],
    "integer_index": lambda a, b: a[..., 2] * b[..., -1],
    "softplus_silu": lambda a, b: F.softplus(a * b, 2.0, 1.5) + F.silu(a - b) + F.softplus(a, threshold=1.0)
    + F.softplus(3 * a),
    # numpy's spelling, which torch takes: ignored, the reduced dim was dropped and a [*, F] * [*] product misread
    "keepdims": lambda a, b: a * b.sum(dim=-1, keepdims=True) + (a * b).mean(-1, keepdims=True),
}


def run_vertex(op, h):
    @gnnfuse.vertex
    def f(v):
        return sum([op(u.h, v.h) for u in v.innbs])
    return f(graph(h.device), {"h": h})


def run_message(op, h):
    def message(edges):
        return {"m": op(edges.src["h"], edges.dst["h"])}

    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
    return gnnfuse.message_passing(graph(h.device), message, reduce, ndata={"h": h})["out"]


@pytest.mark.parametrize("front_end", [run_vertex, run_message], ids=["vertex", "message"])
@pytest.mark.parametrize("name", EDGE_OPS)
def test_edge_op_matches_torch(name, front_end, device):
    op, h = EDGE_OPS[name], features(device, N, FEAT)
    assert_matches(lambda: front_end(op, h), lambda: aggregate(op(h[SRC], h[DST])), [h])


def test_maximum_splits_the_gradient_of_a_tie_evenly_like_torch(device):
    """A self loop's endpoints are equal: torch gives each operand half the gradient."""
    h = features(device, N, FEAT, integer=False)
    self_loop_only = gnnfuse.Graph(torch.tensor([4]), torch.tensor([4]), N).to(device)
    gnnfuse.message_passing(self_loop_only, lambda e: {"m": torch.maximum(e.src["h"], e.dst["h"])},
                            lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": h})["o"].sum().backward()
    torch.testing.assert_close(h.grad[4], torch.ones(FEAT, dtype=torch.float64, device=device))   # 0.5 + 0.5


def test_nan_features_propagate_like_torch(device):
    """NaN goes through abs and maximum in the forward; torch's gradients there are 0 for
    abs (sign(NaN) is 0) and the whole gradient to both operands of maximum."""
    h = features(device, N, FEAT, integer=False).detach()
    h[2, 1] = h[4, 0] = float("nan")
    h.requires_grad_()
    op = lambda a, b: torch.maximum(a, b) + abs(a - b) * 2 + torch.minimum(a, b)   # noqa: E731
    for front_end in (run_vertex, run_message):
        assert_matches(lambda: front_end(op, h), lambda: aggregate(op(h[SRC], h[DST])), [h])


@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"], indirect=True)
def test_cut_off_elements_get_exact_zero_gradients_like_torch(backend, device):
    """relu, clamp and maximum/minimum pass no gradient to the elements they cut off, by
    torch's ``where``: an infinite gradient from ``sqrt`` at 0 stays out of them. As a
    product with a 0/1 slope it made ``inf * 0`` = NaN where torch gives 0."""
    h = features(device, N, FEAT, integer=False)
    op = lambda a, b: (torch.sqrt(torch.relu(a - b)) + torch.sqrt((b - a).clamp(min=0.0))   # noqa: E731
                       + torch.sqrt(torch.maximum(a - b, 0 * a)) - torch.sqrt(-torch.minimum(a - b, 0 * b))
                       + torch.sqrt(1.0 - (a - b).clamp(-1.0, 1.0)))
    for front_end in (run_vertex, run_message):
        assert_matches(lambda: front_end(op, h), lambda: aggregate(op(h[SRC], h[DST])), [h])


def test_power_zero_has_a_zero_gradient_like_torch(backend, device):
    """``x ** 0`` is 1 and torch's backward gives it a zero gradient everywhere; the
    general rule ``g * 0 * x ** -1`` gave NaN at x = 0 and at NaN."""
    h = torch.tensor([[0.0, -0.0], [2.0, float("nan")], [-3.0, 0.5]], dtype=torch.float64, device=device)
    ring = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3).to(device)
    op = lambda a, b: a ** 0 + b * (a ** 0.0)   # noqa: E731
    leaf = h.clone().requires_grad_()
    out = gnnfuse.message_passing(ring, lambda e: {"m": op(e.src["h"], e.dst["h"])},
                                  lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": leaf})["o"]
    out.sum().backward()
    expected = h.clone().requires_grad_()
    torch.zeros_like(h).index_add(0, ring.dst, op(expected[ring.src], expected[ring.dst])).sum().backward()
    torch.testing.assert_close(leaf.grad, expected.grad, equal_nan=True)
    assert not leaf.grad.isnan().any()


@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"], indirect=True)
def test_a_constant_beyond_the_dtypes_range_is_inf_as_in_torch(backend, device):
    """``a + 1e40`` on float32 raised torch.full's "value cannot be converted to type float
    without overflow", naming no construct; torch rounds the scalar to inf."""
    ring = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3).to(device)
    h = torch.tensor([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.0]], device=device)
    for op in (lambda a: a + 1e40, lambda a: a * -1e40, lambda a: a * 1e-50):
        out = gnnfuse.ops.gspmm(ring, op, "sum", src=h)
        torch.testing.assert_close(out, torch.zeros_like(h).index_add(0, ring.dst, op(h[ring.src])), equal_nan=True)


def test_power_zero_alone_compiles_with_a_zero_gradient(device):
    """With nothing else reading ``x``, no gradient reaches it: the backward program had
    no outputs and the call raised ``CompileError: program has no outputs`` where torch
    gives the in-degree and a zero gradient."""
    ring = gnnfuse.Graph(torch.tensor([0, 1, 1]), torch.tensor([1, 2, 0]), 3).to(device)
    x = torch.tensor([[2.0, float("inf")], [0.0, -1.0], [float("nan"), 3.0]], device=device, requires_grad=True)
    out = gnnfuse.ops.gspmm(ring, lambda xs: xs ** 0, "sum", src=x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    expected = torch.zeros_like(x).index_add(0, ring.dst, x.detach()[ring.src] ** 0)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, torch.zeros_like(x))


def test_feature_softmax_and_normalize_in_node_apply(device):
    """A node-apply step (DGL's update_fn; after the aggregate in vertex code) over features."""
    h = features(device, N, FEAT, integer=False)

    def reduce(nodes):
        return {"agg": torch.sum(nodes.mailbox["m"], dim=1)}

    def apply(nodes):
        return {"out": torch.softmax(nodes.data["agg"], dim=-1) + F.normalize(nodes.data["agg"], dim=1)}

    @gnnfuse.vertex
    def vertex_fn(v):
        agg = sum([u.h for u in v.innbs])
        return torch.softmax(agg, dim=-1) + F.normalize(agg, dim=-1)

    def oracle():
        agg = aggregate(h[SRC])
        return torch.softmax(agg, dim=-1) + F.normalize(agg, dim=1)
    assert_matches(lambda: gnnfuse.message_passing(graph(device), lambda e: {"m": e.src["h"]}, reduce, apply,
                                                   ndata={"h": h})["out"], oracle, [h])
    assert_matches(lambda: vertex_fn(graph(device), {"h": h}), oracle, [h])


def test_softmax_of_large_logits_is_stable(device):
    h = (features(device, N, FEAT, integer=False) * 1000).detach().requires_grad_()

    @gnnfuse.vertex
    def f(v):
        return torch.softmax(v.h, dim=-1)
    assert_matches(lambda: f(graph(device), {"h": h}), lambda: torch.softmax(h, dim=-1), [h])


# --- elementwise precision against torch, value by value ------------------------------
# Where a kernel formula built from exp and log cancels or overflows: around 0 (down to
# 1e-30), the flat ends of the curves, and the non-finite values.
NEAR_EDGES = [0.0, 1e-30, -1e-7, 1e-7, -1e-4, 3e-3, -0.1, 0.3, -0.55, 1.0, -2.0, 5.0, -9.0, 15.0, 30.0, -100.0,
              float("inf"), float("-inf"), float("nan")]
PRECISE_OPS = {"tanh": torch.tanh, "elu": F.elu, "elu_alpha": lambda t: F.elu(t, 0.5), "softplus": F.softplus,
               "softplus_beta": lambda t: F.softplus(t, 0.5, 4.0),
               # slopes at exactly 0 (and NaN): torch's relu passes 0 there, leaky_relu the slope,
               # clamp the whole gradient at its bound (once: `step` plus `eq` of the bound)
               "relu": torch.relu, "leaky_relu": lambda t: F.leaky_relu(t, 0.2),
               "clamp_min": lambda t: t.clamp(min=0.0)}
ULPS = 4   # Triton's interpreter takes float32 exp and log from numpy, which are not exact themselves
# On a GPU, Triton's float32 exp is the approximate instruction, whose error grows with
# |x| (softplus(-100, beta=0.5) was 9 ulps off on the H200), and it flushes subnormal
# results to zero (softplus(-100) = 3.8e-44 read 0): both bounded here, not exactness.
GPU_ULPS = 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"], indirect=True)
@pytest.mark.parametrize("name", PRECISE_OPS)
def test_unary_op_is_within_a_few_ulps_of_torch(name, backend, device, dtype):
    """Each value goes through the op inside a kernel (times an edge weight of 1, so it is
    not evaluated per vertex first) along its vertex's one in-edge. Triton's ``2 *
    sigmoid(2x) - 1`` gave tanh(1e-7) = 1.19e-7 in float32 (19% off) and tanh(1e-30) = 0;
    elu's ``exp(x) - 1`` gave elu(-1e-7) = -5.96e-8, softplus's ``log(1 + exp(x))``
    softplus(-30) = 0 where torch gives 9.36e-14.
    Gradients may differ by an ulp of 1 more, where torch's own formula (1 - tanh^2)
    cancels. The reference backend runs the ops' torch references (elu_slope's among them,
    whose ``x <= 0`` gives alpha at 0: ``x < 0`` there gave 1 for elu(x, 0.5) unnoticed)."""
    op, n = PRECISE_OPS[name], len(NEAR_EDGES)
    ring = gnnfuse.Graph(torch.arange(n), (torch.arange(n) + 1) % n, n).to(device)
    x = torch.tensor(NEAR_EDGES, dtype=dtype, device=device).view(-1, 1).requires_grad_()
    ones = torch.ones(n, 1, dtype=dtype, device=device)
    out = gnnfuse.ops.gspmm(ring, lambda xs, w: op(xs * w), "sum", src=x, edge=ones)[ring.dst]
    expected, eps = op(x), torch.finfo(dtype).eps
    # on a CPU, subnormal results within a few of their own ulps (tiny * eps, the smallest
    # subnormal): torch's softplus(-100) in
    # float32 is 27 or 28 times the smallest subnormal by the machine's vector path (CPUs of
    # one CI image differed), where the kernel's log1p(exp(x)) gives 28
    info = torch.finfo(dtype)
    ulps, subnormal = (GPU_ULPS, info.tiny) if x.is_cuda else (ULPS, ULPS * info.tiny * info.eps)
    torch.testing.assert_close(out, expected, rtol=ulps * eps, atol=subnormal, equal_nan=True)
    (grad,), (want,) = torch.autograd.grad(out.sum(), x), torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(grad, want, rtol=ulps * eps, atol=eps, equal_nan=True)


# Far into softplus's flat tail its slope exp(beta x) / (1 + exp(beta x)) is subnormal
# (float32 below beta x = -87.3, float64 below -708.4) or 0; with an open threshold, exp
# overflows at the other end and torch's gradient is NaN (inf / inf).
SOFTPLUS_TAILS = [-100.0, -90.0, -60.0, -720.0, -740.0, -800.0, 30.0, 50.0, 400.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"], indirect=True)
@pytest.mark.parametrize("beta, threshold", [(1.0, 20.0), (0.5, 1000.0)])
def test_softplus_gradient_in_its_tails_is_torchs(beta, threshold, backend, device, dtype):
    """The slope was ``sigmoid(beta x)`` = ``1 / (1 + exp(-beta x))``, whose exp overflows
    first: the gradient at x = -100 was 0 on every backend where torch's is 3.78e-44
    (float32), and 0 at x = -720 in float64 where torch's is 2.9e-313. Torch computes
    ``g * z / (z + 1)`` with ``z = exp(beta x)``, and so do the kernels now."""
    n = len(SOFTPLUS_TAILS)
    ring = gnnfuse.Graph(torch.arange(n), (torch.arange(n) + 1) % n, n).to(device)
    x = torch.tensor(SOFTPLUS_TAILS, dtype=dtype, device=device).view(-1, 1).requires_grad_()
    ones = torch.ones(n, 1, dtype=dtype, device=device)
    out = gnnfuse.ops.gspmm(ring, lambda xs, w: F.softplus(xs * w, beta, threshold), "sum", src=x, edge=ones)
    (grad,) = torch.autograd.grad(out[ring.dst].sum(), x)
    (want,) = torch.autograd.grad(F.softplus(x, beta, threshold).sum(), x)
    assert want[0].item() > 0   # the tail is representable: a 0 here is an underflow
    if x.is_cuda and dtype == torch.float32:
        # Triton's float32 exp is exp2(x log2 e) with an approximate exp2: the rounding of
        # the product is amplified |beta x| times (26 ulps at beta x = -45 on the H200),
        # and subnormal results flush to zero (README); torch's expf is exact to an ulp.
        bound = (GPU_ULPS + (beta * x.detach()).abs()) * torch.finfo(dtype).eps * want.abs() + torch.finfo(dtype).tiny
        finite = want.isfinite()
        assert ((grad - want).abs()[finite] <= bound[finite]).all(), (grad, want)
        assert torch.equal(grad.isnan(), want.isnan()) and torch.equal(grad[~finite & ~want.isnan()], want[~finite & ~want.isnan()])
    else:
        subnormal = torch.finfo(dtype).tiny if x.is_cuda else 0.0
        torch.testing.assert_close(grad, want, rtol=ULPS * torch.finfo(dtype).eps, atol=subnormal, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"], indirect=True)
def test_silu_gradient_of_huge_negative_values_is_torchs(backend, device, dtype):
    """silu was traced as ``x * sigmoid(x)``, whose product rule computes ``g * x``: at x
    = -3e38 (float32; -1.7e308 in float64) with g = -1.5 that overflowed, and ``inf *
    sigmoid'(x)`` = inf * 0 made the gradient NaN where torch's is 0."""
    huge = torch.finfo(dtype).max * 0.9
    values = [-huge, -1e30, -100.0, -1.0, 0.0, 2.5, 1e30, huge]
    n = len(values)
    ring = gnnfuse.Graph(torch.arange(n), (torch.arange(n) + 1) % n, n).to(device)
    x = torch.tensor(values, dtype=dtype, device=device).view(-1, 1).requires_grad_()
    ones = torch.ones(n, 1, dtype=dtype, device=device)
    out = gnnfuse.ops.gspmm(ring, lambda xs, w: F.silu(xs * w), "sum", src=x, edge=ones)[ring.dst]
    (grad,) = torch.autograd.grad((out * -1.5).sum(), x)
    (want,) = torch.autograd.grad((F.silu(x) * -1.5).sum(), x)
    assert torch.isfinite(want).all()
    torch.testing.assert_close(out, F.silu(x), rtol=ULPS * torch.finfo(dtype).eps, atol=0.0)
    torch.testing.assert_close(grad, want, rtol=ULPS * torch.finfo(dtype).eps, atol=0.0)


@pytest.mark.parametrize("reduce", ["sum", "max"])
@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"], indirect=True)
def test_divisor_gradient_rounds_and_overflows_as_torchs(reduce, backend, device):
    """The divisor's gradient was ``-(g * (x / y)) / y``; torch's is ``-g * ((x / y) /
    y)``. At y = 1e-20 (float32, x = 1) ``(x / y) / y`` overflows: with g = 1e-10 torch
    gives -inf and the kernels gave -1e30, and on an edge a max did not pick (g = 0)
    torch gives NaN (0 * inf) and the kernels gave 0."""
    ring = gnnfuse.Graph(torch.tensor([0, 2, 1]), torch.tensor([1, 1, 2]), 3).to(device)
    x = torch.tensor([[1.0], [-3.0], [2.0]], device=device)
    y = torch.tensor([[1.0], [1e-20], [0.5]], device=device, requires_grad=True)
    seed = torch.tensor([[1.0], [1e-10], [-1.0]], device=device)
    out = gnnfuse.ops.gspmm(ring, lambda xs, yd: xs / yd, reduce, src=x, dst=y)
    (grad,) = torch.autograd.grad((out * seed).sum(), y)
    yd = y.detach().clone().requires_grad_()
    terms = x[ring.src] / yd[ring.dst]
    index = ring.dst.view(-1, 1)
    expected = torch.zeros_like(yd).scatter_reduce(0, index, terms, {"sum": "sum", "max": "amax"}[reduce],
                                                   include_self=False)
    (want,) = torch.autograd.grad((expected * seed).sum(), yd)
    assert not torch.isfinite(want[1]).any()
    torch.testing.assert_close(grad, want, equal_nan=True)


@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
def test_negative_zero_keeps_its_sign_in_edge_values_and_max(backend, device):
    """-0.0 equals 0, but ``1 / -0.0`` is -inf: the Triton kernels broadcast a value to
    its tile by adding +0.0, which made a stored edge value ``-h`` at h = 0, and a max
    over it, +0.0; both kernels' relu gave 0.0 for -0.0."""
    if str(device).startswith("cuda") and backend == "triton":
        pytest.xfail("compiled for the GPU by Triton 3.6, -h * w at h = 0 stores +0.0 where the kernel's "
                     "text, (-h) * w + -0.0, gives -0.0 (H200, also with -1 * h; the interpreter keeps the sign)")
    ring = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3).to(device)
    h = torch.tensor([[0.0, 1.0], [-0.0, 2.0], [3.0, 0.0]], device=device)
    ones = torch.ones(3, 1, device=device)
    stored = gnnfuse.apply_edges(ring, lambda e: {"s": -e.src["h"] * e.data["w"]}, ndata={"h": h},
                                 edata={"w": ones})["s"]
    largest = gnnfuse.ops.gspmm(ring, lambda xs, w: -xs * w, "max", src=h, edge=ones)[ring.dst]
    cut = gnnfuse.ops.gspmm(ring, lambda xs, w: torch.relu(-xs * w), "max", src=h, edge=ones)[ring.dst]
    expected = -h[ring.src]
    assert torch.equal(torch.signbit(stored), torch.signbit(expected))
    assert torch.equal(torch.signbit(largest), torch.signbit(expected))
    assert torch.equal(torch.signbit(cut), torch.signbit(torch.relu(expected)))   # relu(-0.0) is -0.0


@pytest.mark.parametrize("backend", ["triton", "cpu"], indirect=True)
def test_non_finite_constants_compile(backend, device):
    """An infinite or NaN constant or attribute (an open clamp bound, a softplus that is
    never linear, a NaN) was written into the kernel as a bare ``inf`` or ``nan``: a
    NameError from both code generators."""
    inf = float("inf")
    op = lambda a, b: ((b - a).clamp(-inf, inf) + (a + float("nan")) * 0.0   # noqa: E731
                       + F.softplus(a - b, threshold=inf) + a.clamp(min=0.5) * (b + inf))
    h = features(device, N, FEAT, integer=False)
    for front_end in (run_vertex, run_message):
        assert_matches(lambda: front_end(op, h), lambda: aggregate(op(h[SRC], h[DST])), [h])


def test_slicing_a_graph_value_in_message_and_vertex_code(device):
    """``u.h[0:1]`` in vertex code is the row's first feature; ``[:, 0:1]`` in a message."""
    h = features(device, N, FEAT)

    @gnnfuse.vertex
    def f(v):
        return sum([u.h[0:1] * v.h[1:] for u in v.innbs])

    def message(edges):
        return {"m": edges.src["h"][:, 0:1] * edges.dst["h"][:, 1:]}

    def oracle():
        return aggregate(h[SRC][:, 0:1] * h[DST][:, 1:])
    assert_matches(lambda: f(graph(device), {"h": h}), oracle, [h])
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                                   ndata={"h": h})["o"], oracle, [h])
    # Feature dims of a mailbox ([nodes, neighbours, features]) slice the same way.
    assert_matches(lambda: gnnfuse.message_passing(
        graph(device), lambda e: {"m": e.src["h"] * 1.5}, lambda n: {"o": n.mailbox["m"][:, :, 1:3].sum(1)},
        ndata={"h": h})["o"], lambda: aggregate(h[SRC][:, 1:3] * 1.5), [h])


def test_slicing_multi_head_features_with_none_and_integer(device):
    h = features(device, N, 2, 4)

    def message(edges):
        return {"m": edges.src["h"][:, 1, None, 1:3] * edges.dst["h"][:, :, -1:]}
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                                   ndata={"h": h})["o"],
                   lambda: aggregate(h[SRC][:, 1, None, 1:3] * h[DST][:, :, -1:]), [h])


# --- per-row lookups and per-row matrices (R-GCN, HGT) -----------------------------------
def rgcn_oracle(h, W, squeeze_dim=None):
    rows = torch.bmm(h[SRC].unsqueeze(1), W[ETYPE])
    return aggregate(rows.squeeze() if squeeze_dim is None else rows.squeeze(squeeze_dim))


@pytest.mark.parametrize("out_features", [3, 1])
def test_graphiler_rgcn_bmm_over_indexed_weights(out_features, device):
    """Graphiler's R-GCN message, verbatim in shape: the relation's weight read through edge
    data. With one output feature, squeeze() drops it as DGL does (the edge axis never)."""
    h, W = features(device, N, FEAT, integer=False), features(device, R, FEAT, out_features, integer=False, seed=1)

    def message(edges):
        return {"m": torch.bmm(edges.src["h"].unsqueeze(1), W[edges.data["type"]]).squeeze()}

    def reduce(nodes):
        return {"h": torch.sum(nodes.mailbox["m"], dim=1)}
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, reduce, ndata={"h": h},
                                                   edata={"type": ETYPE.to(device)})["h"],
                   lambda: rgcn_oracle(h, W), [h, W])
    # Grouped by relation, as typed_matmul: no [E, in, out] tensor of gathered weights; and
    # computed once per (vertex, relation) pair, before or after the sum (passes/compact.py,
    # passes/linear_reorder.py).
    tracer = gnnfuse.frontend.trace_message_passing(message, reduce, None, {"h": h}, {"type": ETYPE.to(device)})
    ops = [v.op for v in CompiledProgram(tracer.program).program]
    assert "typed_aggregate" in ops and "index_rows" not in ops and "row_matmul" not in ops


def test_table_indices_wrap_and_fail_like_torch(device):
    """Negative indices count from the end, as torch's do; an index past the table fails."""
    h, W = features(device, N, FEAT, integer=False), features(device, R, FEAT, 2, integer=False, seed=1)

    def run(types):
        return gnnfuse.message_passing(
            graph(device),
            lambda e: {"m": torch.bmm(e.src["h"].unsqueeze(1), W[e.data["t"]]).squeeze(1) * embed_scale(e)},
            lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": h}, edata={"t": types})["o"]

    def embed_scale(e):
        return W[e.data["t"]][:, 0, 0:1]
    assert_matches(lambda: run(ETYPE.to(device) - R), lambda: aggregate(
        torch.bmm(h[SRC].unsqueeze(1), W[ETYPE]).squeeze(1) * W[ETYPE][:, 0, 0:1]), [h, W])
    if torch.device(device).type == "cpu":   # on CUDA torch's own indexing is a device-side assert,
        with pytest.raises(IndexError):       # which would poison the process's CUDA context
            run(ETYPE.to(device) + 1)


def test_bmm_over_typed_lookup_becomes_typed_matmul(device):
    h, W = features(device, N, FEAT, integer=False), features(device, R, FEAT, 3, integer=False, seed=1)

    def message(edges):
        return {"m": torch.bmm(edges.src["h"].unsqueeze(1), edges.type["W"]).squeeze(1)}

    def reduce(nodes):
        return {"h": torch.sum(nodes.mailbox["m"], dim=1)}
    run = lambda: gnnfuse.message_passing(graph(device, typed=True), message, reduce, ndata={"h": h},  # noqa: E731
                                          etype_data={"W": W})["h"]
    assert_matches(run, lambda: rgcn_oracle(h, W, squeeze_dim=1), [h, W])
    tracer = gnnfuse.frontend.trace_message_passing(message, reduce, None, {"h": h}, {}, {"W": W})
    assert tracer.program.op_count("typed_matmul") == 1 and tracer.program.op_count("row_matmul") == 0


def test_per_edge_matrices_from_edge_data(device):
    h, We = features(device, N, FEAT, integer=False), features(device, len(SRC), FEAT, 2, integer=False, seed=2)

    def message(edges):
        return {"m": torch.bmm(edges.src["h"].unsqueeze(1), edges.data["W"]).squeeze(1)}
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                                   ndata={"h": h}, edata={"W": We})["o"],
                   lambda: aggregate(torch.bmm(h[SRC].unsqueeze(1), We).squeeze(1)), [h, We])


def test_vertex_code_indexes_weights_and_embeddings_with_integer_data(device):
    """``e.src.h @ W[e.rel]`` per in-edge and ``embed[v.idx]`` per vertex, vertex-centric."""
    h, W = features(device, N, FEAT, integer=False), features(device, R, FEAT, 3, integer=False, seed=1)
    embed, idx = features(device, 4, 3, integer=False, seed=3), torch.tensor([3, 0, 0, 2, 1, 3], device=device)

    @gnnfuse.vertex
    def f(v):
        return sum([e.src.h @ W[e.rel] for e in v.inedges]) + embed[v.idx]

    def oracle():
        return aggregate(torch.einsum("ef,efo->eo", h[SRC], W[ETYPE])) + embed[idx]
    assert_matches(lambda: f(graph(device), {"h": h, "idx": idx}, {"rel": ETYPE.to(device)}), oracle, [h, W, embed])


def test_message_reads_embedding_rows_by_edge_data(device):
    h, embed = features(device, N, FEAT, integer=False), features(device, R, FEAT, integer=False, seed=4)
    assert_matches(lambda: gnnfuse.message_passing(
        graph(device), lambda e: {"m": e.src["h"] * embed[e.data["type"]]},
        lambda n: {"o": n.mailbox["m"].sum(1)}, ndata={"h": h}, edata={"type": ETYPE.to(device)})["o"],
        lambda: aggregate(h[SRC] * embed[ETYPE]), [h, embed])


def test_dgl_rgcn_input_layer_embedding_lookup(device):
    """DGL's R-GCN input layer: the weight viewed as one embedding table, indexed by an
    index computed from integer edge and vertex data."""
    weight = features(device, R, N, 3, integer=False, seed=5)
    norm = features(device, len(SRC), 1, integer=False, seed=6)
    ids, etype = torch.arange(N, device=device), ETYPE.to(device)

    def message(edges):
        embed = weight.view(-1, 3)
        index = edges.data["rel_type"] * N + edges.src["id"]
        return {"msg": embed[index] * edges.data["norm"]}

    @gnnfuse.vertex
    def f(v):
        return sum([weight.view(-1, 3)[e.rel_type * N + e.src.id] * e.norm for e in v.inedges])

    def oracle():
        return aggregate(weight.view(-1, 3)[etype * N + ids[SRC]] * norm)
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, lambda n: {"h": n.mailbox["msg"].sum(1)},
                                                   ndata={"id": ids}, edata={"rel_type": etype, "norm": norm})["h"],
                   oracle, [weight, norm])
    assert_matches(lambda: f(graph(device), {"id": ids}, {"rel_type": etype, "norm": norm}), oracle, [weight, norm])


def test_embedding_module_and_table_index_with_slices(device):
    """``nn.Embedding`` on node data and ``table[idx, <slices>]`` on edge data."""
    embedding, W = torch.nn.Embedding(4, FEAT).double().to(device), features(device, R, FEAT, 3, integer=False, seed=1)
    h, ids = features(device, N, FEAT, integer=False), torch.tensor([3, 0, 0, 2, 1, 3], device=device)

    def message(edges):
        return {"m": edges.src["h"] * embedding(edges.src["id"]) + W[edges.data["t"], :, 1]}
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                                   ndata={"h": h, "id": ids}, edata={"t": ETYPE.to(device)})["o"],
                   lambda: aggregate(h[SRC] * embedding(ids[SRC]) + W[ETYPE, :, 1]), [h, embedding.weight, W])


def test_index_select_with_long_cast(device):
    h, W = features(device, N, FEAT, integer=False), features(device, R, FEAT, 2, integer=False, seed=1)

    def message(edges):
        w = W.index_select(0, edges.data["type"].int().long())
        return {"m": torch.bmm(edges.src["h"].unsqueeze(1), w).squeeze(1)}
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                                   ndata={"h": h}, edata={"type": ETYPE.int().to(device)})["o"],
                   lambda: rgcn_oracle(h, W, squeeze_dim=1), [h, W])


def test_integer_index_arithmetic_is_exact_on_every_backend(device):
    """Integer arithmetic is never evaluated in a kernel's float accumulator: with float32
    it rounds integers above 2**24, and this index would read the wrong rows."""
    embed, ids = features(device, N, 2, integer=False), torch.arange(N, device=device)
    big = torch.full((len(SRC),), 2**25 + 1, device=device)
    out = gnnfuse.message_passing(graph(device), lambda e: {"m": embed[(e.data["big"] + e.src["id"]) - e.data["big"]]},
                                  lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)},
                                  ndata={"id": ids}, edata={"big": big})["o"]
    torch.testing.assert_close(out, aggregate(embed[SRC]))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.bool])
def test_torch_sum_of_narrow_integers_and_booleans_is_int64_as_in_torch(dtype, device):
    """torch.sum of bool or of integers narrower than int64 returns int64; the mailbox and
    feature sums kept the dtype: three int32 2**30 summed to -2**30 (torch: 3 * 2**30),
    uint8 200s to 88 (torch: 600), and a sum of booleans was refused."""
    big = {torch.int32: 2**30, torch.int16: 20000, torch.uint8: 200, torch.bool: True}[dtype]
    table = torch.full((N, 2), big, dtype=dtype, device=device)
    out = gnnfuse.message_passing(graph(device), lambda e: {"m": e.src["x"], "r": e.src["x"].sum(-1)},
                                  lambda n: {"o": n.mailbox["m"].sum(1), "p": torch.sum(n.mailbox["r"], dim=1)},
                                  ndata={"x": table})
    wide = table.long()
    assert out["o"].dtype == out["p"].dtype == torch.int64
    assert torch.equal(out["o"], aggregate(wide[SRC]))
    assert torch.equal(out["p"], aggregate(wide[SRC].sum(-1)))
    # dtype=torch.int64 asks for the same widening (it was refused as a dtype conversion)
    asked = gnnfuse.message_passing(graph(device), lambda e: {"m": e.src["x"].sum(-1, dtype=torch.int64)},
                                    lambda n: {"o": torch.sum(n.mailbox["m"], 1, dtype=torch.long)},
                                    ndata={"x": table})["o"]
    assert asked.dtype == torch.int64 and torch.equal(asked, aggregate(wide[SRC].sum(-1)))



@pytest.mark.parametrize("dtype", [torch.int32, torch.int16])
def test_a_feature_sum_with_its_own_narrow_dtype_keeps_it_as_in_torch(dtype, device):
    """``x.sum(-1, dtype=torch.int32)`` of int32 data sums in int32, wrapping, as torch
    does; it came back int64, unwrapped: 2**32 where torch gives 0 for four int32 2**30."""
    big = {torch.int32: 2**30, torch.int16: 2**14}[dtype]
    table = torch.full((len(SRC), 4), big, dtype=dtype, device=device)
    out = gnnfuse.apply_edges(graph(device), lambda e: {"s": e.data["x"].sum(-1, dtype=dtype),
                                                        "t": torch.sum(e.data["x"], dim=-1, keepdim=True, dtype=dtype)},
                              edata={"x": table})
    assert out["s"].dtype == out["t"].dtype == dtype
    assert torch.equal(out["s"], table.sum(-1, dtype=dtype))
    assert torch.equal(out["t"], table.sum(-1, keepdim=True, dtype=dtype))

NTYPE = torch.tensor([0, 1, 1, 0, 1, 0])


def hgt_weights(device: str):
    shapes = {"k": (2, FEAT, FEAT), "q": (2, FEAT, FEAT), "v": (2, FEAT, FEAT), "a": (2, FEAT, FEAT),
              "att": (R, FEAT, FEAT), "msg": (R, FEAT, FEAT), "pri": (R, 1), "skip": (2,)}
    return {k: features(device, *shape, integer=False, seed=10 + i) for i, (k, shape) in enumerate(shapes.items())}


def hgt_oracle(h, w):
    """HGT with one head, written out in torch over the edge list (DGL's naive UDFs)."""
    k = torch.bmm(h[SRC].unsqueeze(1), w["k"][NTYPE[SRC]]).squeeze(1)
    v = torch.bmm(h[SRC].unsqueeze(1), w["v"][NTYPE[SRC]]).squeeze(1)
    q = torch.bmm(h[DST].unsqueeze(1), w["q"][NTYPE[DST]]).squeeze(1)
    k = torch.bmm(k.unsqueeze(1), w["att"][ETYPE]).squeeze(1)
    v = torch.bmm(v.unsqueeze(1), w["msg"][ETYPE]).squeeze(1)
    score = (k * q).sum(1, keepdim=True) * w["pri"][ETYPE] / math.sqrt(FEAT)
    peak = torch.full((N, 1), -math.inf, dtype=score.dtype, device=score.device).index_reduce(
        0, DST.to(score.device), score, "amax")
    e = torch.exp(score - peak[DST])
    t = aggregate(e / aggregate(e)[DST] * v)
    return torch.bmm(t.unsqueeze(1), w["a"][NTYPE]).squeeze(1) * torch.sigmoid(w["skip"][NTYPE]).unsqueeze(1)


def test_hgt_with_weights_indexed_by_type_data(device):
    """Graphiler's HGT as DGL's naive UDFs write it: every per-type weight indexed with the
    type ids stored as edge and node data, bmm'd and squeeze()d."""
    h, w = features(device, N, FEAT, integer=False), hgt_weights(device)

    def message(edges):
        k = torch.bmm(edges.src["h"].unsqueeze(1), w["k"][edges.src["_TYPE"]]).squeeze()
        v = torch.bmm(edges.src["h"].unsqueeze(1), w["v"][edges.src["_TYPE"]]).squeeze()
        q = torch.bmm(edges.dst["h"].unsqueeze(1), w["q"][edges.dst["_TYPE"]]).squeeze()
        k = torch.bmm(k.unsqueeze(1), w["att"][edges.data["_TYPE"]]).squeeze()
        v = torch.bmm(v.unsqueeze(1), w["msg"][edges.data["_TYPE"]]).squeeze()
        score = torch.sum(k * q, dim=1, keepdim=True) * w["pri"][edges.data["_TYPE"]] / math.sqrt(FEAT)
        return {"attn": score, "v": v}

    def reduce(nodes):
        return {"t": torch.sum(torch.softmax(nodes.mailbox["attn"], dim=1) * nodes.mailbox["v"], dim=1)}

    def update(nodes):
        alpha = torch.sigmoid(w["skip"][nodes.data["_TYPE"]])
        trans_out = torch.bmm(nodes.data["t"].unsqueeze(1), w["a"][nodes.data["_TYPE"]]).squeeze()
        return {"h": trans_out * alpha.unsqueeze(1)}
    ndata, edata = {"h": h, "_TYPE": NTYPE.to(device)}, {"_TYPE": ETYPE.to(device)}
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, reduce, update, ndata=ndata, edata=edata)["h"],
                   lambda: hgt_oracle(h, w), [h, *w.values()])


def test_derivative_rules_pass_gradcheck():
    """The new ops' derivative rules against finite differences (away from ties and zeros,
    where the ops are differentiable), independently of torch's autograd formulas."""
    def run(h, We, W, embed):
        def message(edges):
            a, b = edges.src["h"], edges.dst["h"]
            m = F.normalize(a, dim=-1) * torch.softmax(b, dim=-1) + abs(a) * torch.maximum(a, b * 0.7)
            m = m[:, 1:3] + torch.bmm(a.unsqueeze(1), W[edges.data["t"]]).squeeze(1)
            return {"m": m + torch.bmm(b.unsqueeze(1), edges.data["W"]).squeeze(1) * embed[edges.data["t"]][:, ::2]}
        return gnnfuse.message_passing(graph("cpu"), message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                       ndata={"h": h}, edata={"W": We, "t": ETYPE})["o"]
    inputs = (features("cpu", N, FEAT, integer=False), features("cpu", len(SRC), FEAT, 2, integer=False, seed=2),
              features("cpu", R, FEAT, 2, integer=False, seed=1), features("cpu", R, FEAT, integer=False, seed=4))
    assert torch.autograd.gradcheck(run, inputs, fast_mode=True)


# --- errors name the construct and the line -------------------------------------------
def _message_error(message, reduce, match: str, at, text: str) -> None:
    """message_passing raises a CompileError matching ``match`` at the line of ``at``
    (one of the UDFs) holding ``text``."""
    with pytest.raises(CompileError, match=match) as info:
        gnnfuse.message_passing(graph("cpu"), message, reduce, ndata={"h": torch.randn(N, FEAT)},
                                edata={"type": ETYPE})
    assert f":{line_of(at, text)}:" in str(info.value)


def test_math_function_on_a_graph_value_is_a_compile_error():
    @gnnfuse.vertex
    def f(v):
        return sum([math.exp(u.h) for u in v.innbs])
    with pytest.raises(CompileError, match="cannot become a Python number") as info:
        f(graph("cpu"), {"h": torch.randn(N, FEAT)})
    assert f":{line_of(f.fn, 'math.exp')}:" in str(info.value)


def _rounded_degree(v):
    return sum([u.h * round(len(v.innbs) / 2) for u in v.innbs])


def _truncated_row(v):
    return sum([math.trunc(u.h) for u in v.innbs])


@pytest.mark.parametrize("fn, text", [(_rounded_degree, "round(len(v.innbs) / 2)"), (_truncated_row, "math.trunc(u.h)")])
def test_round_or_trunc_of_a_graph_value_is_a_compile_error(fn, text):
    """``round`` and ``math.trunc`` call ``__round__``/``__trunc__``, with no ``__float__``
    fallback: eager code rounds the in-degree as a Python number (and raises on a tensor),
    and the traced value raised a bare TypeError ("type SymTensor doesn't define __round__
    method") naming neither the construct nor the user's line."""
    with pytest.raises(CompileError, match="cannot become a Python number") as info:
        gnnfuse.vertex(fn)(graph("cpu"), {"h": torch.randn(N, FEAT)})
    assert f":{line_of(fn, text)}:" in str(info.value)


def _range_short_of_the_degree(v):
    d = len(v.innbs) - 1
    return sum([u.h for u in v.innbs]) * len(range(d))


def _rows_cut_at_a_clamped_degree(v):
    return sum([u.h[:max(len(v.innbs), 1)] for u in v.innbs])


@pytest.mark.parametrize("fn, text", [(_range_short_of_the_degree, "len(range(d))"),
                                      (_rows_cut_at_a_clamped_degree, "u.h[:max(len(v.innbs), 1)]")])
def test_a_graph_value_taken_as_a_python_int_is_a_compile_error(fn, text):
    """``range(d)`` with ``d = len(v.innbs) - 1``, or a slice bound computed from the
    in-degree, asks a graph value for ``__index__``: eager code has a Python int per
    vertex, and the traced value raised a bare TypeError ("'SymTensor' object cannot be interpreted as an
    integer") naming neither the construct nor the user's line."""
    with pytest.raises(CompileError, match="cannot be taken as a Python int") as info:
        gnnfuse.vertex(fn)(graph("cpu"), {"h": torch.randn(N, FEAT)})
    assert f":{line_of(fn, text)}:" in str(info.value)


def test_unary_plus_is_the_value_itself():
    """``+x`` is torch's ``positive``, the tensor itself; on a traced value it raised a
    bare TypeError ("bad operand type for unary +: 'SymTensor'") naming neither the
    construct nor the line, in vertex functions and message UDFs alike."""
    h = torch.randn(N, FEAT, dtype=torch.float64)

    @gnnfuse.vertex
    def vertex_fn(v):
        return sum([+u.h * +v.h for u in v.innbs])
    message = lambda edges: {"m": +(edges.src["h"] * edges.dst["h"])}      # noqa: E731
    g = graph("cpu")
    expected = torch.zeros_like(h).index_add(0, g.dst, h[g.src] * h[g.dst])
    torch.testing.assert_close(vertex_fn(g, {"h": h}), expected)
    torch.testing.assert_close(gnnfuse.message_passing(g, message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                                       ndata={"h": h})["o"], expected)


def test_indexing_a_graph_axis_is_a_compile_error():
    """An edge's row or a slice of the mailbox's neighbour axis is not a feature: the
    graph axis can only be taken whole (one message by position, ``mailbox['m'][:, 0]``,
    is tests/test_frontend_gaps.py's)."""
    def message(edges):
        return {"m": edges.src["h"][0]}

    def reduce(nodes):
        return {"o": torch.sum(nodes.mailbox["m"], dim=1)}
    _message_error(message, reduce, "graph axis", message, 'edges.src["h"][0]')

    def first_messages(nodes):
        return {"o": nodes.mailbox["m"][:, 0:2].sum(1)}
    _message_error(lambda e: {"m": e.src["h"]}, first_messages, "neighbour axis", first_messages, "[:, 0:2]")


@pytest.mark.parametrize("expr, match", [
    ('torch.bmm(edges.src["h"].unsqueeze(1), W3)', "captured tensor has no rows"),
    ('edges.src["h"] @ W[edges.data["type"]]', "batches over the graph axis"),
    ('F.normalize(edges.src["h"], dim=0)', "graph axis|row axis"),
    ('edges.src["h"].unsqueeze(1).squeeze(0)', "graph axis|row axis"),
    ('torch.norm(edges.src["h"])', "pass dim=-1"),
    ('edges.src["h"] / edges.src["h"].norm(p=3, dim=-1, keepdim=True)', "p=1 and p=2"),
    ('edges.src["h"][:, [0, 1]]', "tensor, list or bool"),
    ('W[edges.data["type"], edges.data["type"]]', "not by several tensors"),
    ('(W * 2)[edges.data["type"], 0] * (W * 2)[edges.src["h"][:, 0]][:, 0]', "integer data"),
    ('F.embedding(edges.data["type"], W[:, :, 0], padding_idx=0)', "padding_idx"),
    ('F.softmax(edges.src["h"], dim=-1, dtype=torch.float32)', "dtype"),
    ('torch.log_softmax(edges.src["h"], -1, torch.float32)', "dtype"),
    ('torch.div(edges.src["h"], 2, rounding_mode="floor")', "rounding_mode='floor'"),
    ('edges.src["h"].div(2, rounding_mode="trunc")', "rounding_mode='trunc'"),
    ('edges.src["h"].clamp(min=float("nan"))', "NaN bound"),
    ('torch.clamp(edges.src["h"], 0.0, float("nan"))', "NaN bound"),
])
def test_message_op_misuse_is_a_compile_error(expr, match):
    namespace = {"torch": torch, "F": F, "W": torch.randn(R, FEAT, 3), "W3": torch.randn(len(SRC), FEAT, 3)}
    exec(f"def message(edges):\n    return {{'m': {expr}}}\n", namespace)
    with pytest.raises(CompileError, match=match) as info:
        gnnfuse.message_passing(graph("cpu"), namespace["message"], lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)},
                                ndata={"h": torch.randn(N, FEAT, dtype=torch.float64)}, edata={"type": ETYPE})
    assert ":2:" in str(info.value)


def test_operands_by_torch_keyword_names_trace_as_positional(device):
    """Torch takes each operand by its documented name (``input=``, ``other=``,
    ``shape=``, ``weight=``) and NumPy's ``axis=`` for ``dim=``; such calls raised a bare
    TypeError naming gnnfuse's handler (``_binary.<locals>.handler() got an unexpected
    keyword argument 'input'``), without the line."""
    h, W = features(device, N, FEAT, integer=False), features(device, 3, FEAT, integer=False, seed=1)

    def message(edges):
        x = torch.add(input=edges.src["h"], other=edges.dst["h"], alpha=2)
        y = torch.mul(x, other=0.5).sub(other=edges.src["h"]) + torch.maximum(input=x, other=edges.dst["h"])
        z = torch.reshape(input=y, shape=(-1, 2, 2)).sum(axis=-1)
        return {"m": torch.cat([z, F.linear(input=x, weight=W)], axis=-1)}

    def oracle():
        x = h[SRC] + 2 * h[DST]
        y = x * 0.5 - h[SRC] + torch.maximum(x, h[DST])
        return aggregate(torch.cat([y.reshape(-1, 2, 2).sum(-1), x @ W.t()], -1))
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                                   ndata={"h": h})["o"], oracle, [h, W])


def test_a_keyword_the_op_does_not_take_is_a_compile_error_at_its_line():
    def message(edges):
        return {"m": torch.mm(edges.src["h"], torch.ones(FEAT, 2), out_dtype=torch.float32)}
    _message_error(message, lambda n: {"o": n.mailbox["m"].sum(1)}, "torch function mm .*'out_dtype'",
                   message, "out_dtype")


def test_dtype_conversions_match_torch(device):
    """``mask.float()``, ``idx.double()``, ``x.to(dtype)``, ``x.type_as(y)``, ``.half()``:
    DGL and PyG code converts dtypes this way, and each was a CompileError ("tensor method
    .float() has no gnnfuse op"). A conversion to the value's own dtype is the value itself,
    as in torch, and ``copy=True`` a value of its own."""
    h = features(device, N, FEAT, integer=False)
    ids = torch.arange(N, device=device).view(-1, 1) - 2
    kept = (torch.arange(len(SRC), device=device) % 3 == 0).view(-1, 1)

    def message(edges):
        x = (edges.src["h"] * edges.dst["h"]).float().double() + edges.src["i"].double() * edges.data["b"].float()
        y = x.to(torch.float64)          # x itself: the in-place op below writes both
        y.mul_(2)
        z = x.to(dtype=torch.float64, copy=True)
        z.add_(1)
        return {"m": x + z + edges.data["b"].type_as(x) * edges.dst["h"].half().to(edges.src["h"])}

    def oracle():
        x = ((h[SRC] * h[DST]).float().double() + ids[SRC].double() * kept.float()) * 2
        return aggregate(x + (x + 1) + kept.double() * h[DST].half().double())
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, lambda n: {"o": n.mailbox["m"].sum(1)},
                                                   ndata={"h": h, "i": ids}, edata={"b": kept})["o"], oracle, [h])


@pytest.mark.parametrize("expr, match", [
    ('edges.src["h"].to("cpu")', "names a device"),
    ('edges.src["h"].to(W)', "names a device"),
    ('edges.src["h"].type("torch.DoubleTensor")', "takes a torch.dtype"),
])
def test_a_conversion_to_a_device_is_a_compile_error(expr, match):
    def reduce(nodes):
        return {"o": torch.sum(nodes.mailbox["m"], dim=1)}
    namespace = {"torch": torch, "W": torch.ones(1)}
    exec(f"def message(edges):\n    return {{'m': {expr}}}\n", namespace)
    with pytest.raises(CompileError, match=match) as info:
        gnnfuse.message_passing(graph("cpu"), namespace["message"], reduce, ndata={"h": torch.randn(N, FEAT)})
    assert ":2:" in str(info.value)


def test_log_softmax_over_the_neighbour_axis_is_a_compile_error():
    def reduce(nodes):
        return {"o": torch.sum(F.log_softmax(nodes.mailbox["m"], dim=1), dim=1)}
    _message_error(lambda e: {"m": e.src["h"]}, reduce, "graph axis", reduce, "F.log_softmax")


def test_slice_of_an_edge_value_is_fused_into_the_kernel(device):
    """A slice of per-edge work is a coordinate map inside the aggregation kernel, not a
    torch op over an edge-sized tensor."""
    h = features(device, N, FEAT)

    def message(edges):
        return {"m": (edges.src["h"] * edges.dst["h"])[:, 1::2] + (edges.src["h"] - edges.dst["h"])[:, 0, None]}

    def reduce(nodes):
        return {"o": torch.sum(nodes.mailbox["m"], dim=1)}
    tracer = gnnfuse.frontend.trace_message_passing(message, reduce, None, {"h": h}, {})
    plan = partition(CompiledProgram(tracer.program).program)
    assert not [v for v in plan if getattr(v, "op", None) == "slice_features"]
    assert_matches(lambda: gnnfuse.message_passing(graph(device), message, reduce, ndata={"h": h})["o"],
                   lambda: aggregate((h[SRC] * h[DST])[:, 1::2] + (h[SRC] - h[DST])[:, 0, None]), [h])


def test_alpha_of_add_and_sub_scales_in_the_promoted_dtype(device):
    """``torch.add(x, y, alpha=a)`` computes ``x + a * y`` in x's and y's promoted dtype.
    ``a * y`` was computed in y's own dtype first: float64 ``x`` plus float32 ``y = 1`` with
    ``alpha=0.1`` gave 0.10000000149011612 where torch gives 0.1, an int64 ``y`` of
    2**25 + 1 was rounded to float32 (3355443.25 where torch gives 3355443.3), and integer
    operands with a float alpha, which torch refuses, gave floats."""
    x = torch.zeros(N, 2, dtype=torch.float64, device=device)
    edata = {"y": torch.ones(len(SRC), 2, device=device), "k": torch.full((len(SRC), 2), 2**25 + 1, device=device)}
    out = gnnfuse.apply_edges(graph(device), lambda e: {"add": torch.add(e.src["x"], e.data["y"], alpha=0.1),
                                                        "sub": e.src["x"].sub(e.data["y"], alpha=0.1),
                                                        "int": e.src["x"].add(e.data["k"], alpha=0.1)},
                              ndata={"x": x}, edata=edata)
    xs = x[SRC.to(device)]
    expected = {"add": torch.add(xs, edata["y"], alpha=0.1), "sub": xs.sub(edata["y"], alpha=0.1),
                "int": xs.add(edata["k"], alpha=0.1)}
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with pytest.raises(CompileError, match="floating-point alpha=0.5"):
        gnnfuse.apply_edges(graph(device), lambda e: {"o": torch.add(e.data["k"], e.data["k"], alpha=0.5)},
                            edata=edata)
