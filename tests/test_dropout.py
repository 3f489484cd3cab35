"""gnnfuse.nn.functional.dropout: torch's dropout distribution and arguments, a counter-based
mask on the CPU that the backward regenerates, and torch's own path everywhere else."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse.nn.functional as gF
from gnnfuse.backend.cpu import random_mask

pytestmark = pytest.mark.skipif(not random_mask.available(), reason="the counter kernel needs numba")


@pytest.fixture
def small_counter(monkeypatch):
    """Let small tensors take the counter kernel, so gradcheck stays cheap."""
    monkeypatch.setattr(gF, "COUNTER_MIN_ELEMENTS", 1)


def _seeded(fn, seed: int = 0):
    def call(*args):
        torch.manual_seed(seed)
        return fn(*args)
    return call


def _within_binomial(count: int, n: int, prob: float, sigmas: float = 6.0) -> bool:
    return abs(count - n * prob) <= sigmas * math.sqrt(n * prob * (1 - prob)) + 1


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keeps_one_minus_p_and_scales_the_kept(p, dtype):
    x = torch.ones(301, 257, dtype=dtype)                 # odd element count: the last pair is half
    out = gF.dropout(x, p)
    kept = out != 0
    assert _within_binomial(int(kept.sum()), x.numel(), 1 - p)
    assert torch.equal(out[kept], torch.full_like(out[kept], 1.0) * (1.0 / (1.0 - p)))


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_neighbouring_decisions_are_independent(p):
    """Elements 2j and 2j+1 share one SplitMix64 output (its high and low halves), and
    consecutive pairs share consecutive outputs: all three kinds of neighbours must be
    kept together as often as independent draws would be."""
    kept = (gF.dropout(torch.ones(1 << 20), p) != 0).view(-1, 4)
    n, both = kept.shape[0], (1 - p) ** 2
    for a, b in [(0, 1), (1, 2), (0, 2), (2, 3)]:
        assert _within_binomial(int((kept[:, a] & kept[:, b]).sum()), n, both), (a, b)


def test_the_seed_comes_from_torch_generator():
    x = torch.randn(512, 256)
    torch.manual_seed(3)
    first, second = gF.dropout(x, 0.5), gF.dropout(x, 0.5)
    torch.manual_seed(3)
    assert torch.equal(gF.dropout(x, 0.5), first)
    assert not torch.equal(first, second)


def test_backward_regenerates_the_forward_mask():
    x = torch.randn(700, 130, requires_grad=True)
    out = gF.dropout(x, 0.4)
    weight = torch.randn_like(out)
    (out * weight).sum().backward()
    expected = torch.where(out != 0, weight / 0.6, torch.zeros_like(weight))
    torch.testing.assert_close(x.grad, expected)


def test_gradcheck_and_gradgradcheck_in_float64(small_counter):
    x = torch.randn(9, 7, dtype=torch.float64, requires_grad=True)
    fn = _seeded(lambda t: gF.dropout(t, 0.3))
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


def test_in_place_writes_the_input(small_counter):
    leaf = torch.randn(40, 30, requires_grad=True)
    x = leaf * 2.0
    torch.manual_seed(1)
    expected = gF.dropout(x.detach().clone(), 0.5)
    torch.manual_seed(1)
    out = gF.dropout(x, 0.5, inplace=True)
    assert out is x and torch.equal(out, expected)
    out.sum().backward()
    torch.testing.assert_close(leaf.grad, torch.where(expected != 0, 4.0, 0.0))


def test_strided_input_is_masked_as_its_contiguous_copy(small_counter):
    x = torch.randn(33, 65).t()
    torch.manual_seed(2)
    out = gF.dropout(x, 0.5)
    torch.manual_seed(2)
    assert out.shape == x.shape and torch.equal(out, gF.dropout(x.contiguous(), 0.5))
    assert torch.equal(out[out != 0], (x * 2.0)[out != 0])


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(0, 9), min_size=0, max_size=3), p=st.floats(0.0, 1.0),
       training=st.booleans())
def test_every_element_is_dropped_or_scaled(shape, p, training):
    gF_min, gF.COUNTER_MIN_ELEMENTS = gF.COUNTER_MIN_ELEMENTS, 1
    try:
        x = torch.rand(shape, dtype=torch.float64) + 0.5          # no zeros: a kept zero would look dropped
        out = gF.dropout(x, p, training)
    finally:
        gF.COUNTER_MIN_ELEMENTS = gF_min
    assert out.shape == x.shape
    if not training or p == 0.0:
        assert out is x
    elif p == 1.0:
        assert not out.any()
    else:
        kept = out != 0
        torch.testing.assert_close(out[kept], x[kept] / (1.0 - p))


@pytest.mark.parametrize("shape", [(512, 256), (8, 4)], ids=["counter", "uniform"])
def test_a_tensor_probability_is_taken_as_torch_takes_it(shape):
    """torch's dropout takes p as a 0-dim tensor (a scheduled rate kept in a buffer); the
    counter path raised "type Tensor doesn't define __round__ method"."""
    p = torch.tensor(0.25)
    out = gF.dropout(torch.ones(shape), p)
    kept = out != 0
    assert _within_binomial(int(kept.sum()), out.numel(), 0.75)
    assert torch.equal(out[kept], torch.full_like(out[kept], 1.0 / 0.75))


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_a_probability_outside_0_1_is_refused(p):
    with pytest.raises(ValueError, match="between 0 and 1"):
        gF.dropout(torch.ones(3), p)


def test_an_integer_input_is_refused_by_dtype():
    """torch's uniforms failed on it with '"check_uniform_bounds" not implemented for
    'Long''; in eval mode it passes through, as torch's does."""
    with pytest.raises(TypeError, match="needs a floating-point input; got torch.int64"):
        gF.dropout(torch.arange(6), 0.5)
    torch.testing.assert_close(gF.dropout(torch.arange(6), 0.5, training=False), torch.arange(6))


def test_sparse_features_drop_stored_values_only():
    dense = torch.zeros(6, 5)
    dense[0, 1], dense[3, 4], dense[5, 0] = 1.0, 2.0, 3.0
    out = gF.dropout(dense.to_sparse(), 0.5)
    assert out.is_sparse and out._nnz() == 3
    assert torch.equal(out.coalesce().indices(), dense.to_sparse().indices())
    values = out.coalesce().values()
    assert all(v in (0.0, 2 * w) for v, w in zip(values.tolist(), (1.0, 2.0, 3.0)))


def test_uncoalesced_sparse_features_drop_each_element_whole():
    """torch.sparse_coo_tensor's tensors come uncoalesced: that failed with 'Cannot get
    indices on an uncoalesced tensor'. An element stored twice (1 + 2 here) is one value,
    kept (as 6) or dropped whole, and its gradient is the same decision's."""
    indices = torch.tensor([[0, 2, 0], [1, 3, 1]])
    for seed in range(4):
        sparse = torch.sparse_coo_tensor(indices, torch.tensor([1.0, 5.0, 2.0]), (3, 4)).requires_grad_()
        torch.manual_seed(seed)
        out = gF.dropout(sparse, 0.5)
        out.to_dense().sum().backward()
        values, grads = out.to_dense()[[0, 2], [1, 3]], sparse.grad.to_dense()[[0, 2], [1, 3]]
        assert out.is_sparse and out._nnz() == 2
        assert values[0].item() in (0.0, 6.0) and values[1].item() in (0.0, 10.0)
        assert torch.equal(grads, 2.0 * (values != 0))


def test_sparse_features_dropped_in_place_are_the_input():
    """inplace=True on sparse features returned a dropped copy and left the input as it
    was: code using the input afterwards (``dropout(x, inplace=True)`` as a statement)
    trained with no dropout. The coalesced input's stored values are now dropped where
    they are; where that cannot be done it is refused by name."""
    torch.manual_seed(0)
    x = torch.rand(40, 30).add(0.5).to_sparse().coalesce()
    before = x.values().clone()
    out = gF.dropout(x, 0.5, inplace=True)
    assert out is x
    kept = x.values() != 0
    assert 0 < int(kept.sum()) < kept.numel()
    assert torch.equal(x.values()[kept], before[kept] * 2.0)
    uncoalesced = torch.sparse_coo_tensor(torch.tensor([[0, 0], [1, 1]]), torch.tensor([1.0, 2.0]), (2, 2))
    with pytest.raises(ValueError, match="uncoalesced sparse tensor"):
        gF.dropout(uncoalesced, 0.5, inplace=True)
    recorded = torch.rand(4, 4).to_sparse().requires_grad_()
    with pytest.raises(ValueError, match="requires grad"):
        gF.dropout(recorded, 0.5, inplace=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_takes_the_uniform_path(dtype):
    x = torch.ones(300, 300, dtype=dtype)
    out = gF.dropout(x, 0.25)
    assert out.dtype == dtype
    assert _within_binomial(int((out != 0).sum()), x.numel(), 0.75)


@pytest.mark.parametrize("p", [0.1, 0.9, 0.999])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_keeps_one_minus_p_as_torch_does(p, dtype):
    """The uniform path compared ``torch.rand_like`` of the input's dtype with ``p``: a
    bfloat16 uniform takes one of 256 values per binade and ``p`` rounds to bfloat16 for
    the comparison, so a bfloat16 dropout of 0.999 dropped every element (torch's keeps
    0.1%), of 0.9 kept 10.17% (over 10 standard deviations off 10% on 4M draws) and of
    0.1 kept 89.8%. The uniforms are now float32 for half-precision inputs."""
    torch.manual_seed(0)
    n = 1 << 22
    out = gF.dropout(torch.ones(n, dtype=dtype), p)
    assert _within_binomial(int((out != 0).sum()), n, 1 - p)


def test_without_numba_the_uniform_path_runs(monkeypatch):
    monkeypatch.setattr(random_mask, "available", lambda: False)
    calls = []
    monkeypatch.setattr(gF._CounterDropout, "apply", lambda *a: calls.append(a))
    out = gF.dropout(torch.ones(512, 256), 0.5)
    assert not calls and _within_binomial(int((out != 0).sum()), out.numel(), 0.5)


def test_torch_compile_traces_torch_dropout():
    def model(x):
        return gF.dropout(x, 0.5) + 1.0
    compiled = torch.compile(model, backend="eager", fullgraph=True)     # a graph break would raise
    out = compiled(torch.ones(512, 256))
    assert _within_binomial(int((out != 1.0).sum()), out.numel(), 0.5)


@pytest.mark.parametrize("transform", ["dual", "func.jvp", "func.grad", "vmap"])
def test_forward_ad_and_torch_func_transforms_drop_as_torch_does(transform, small_counter):
    """The counter path's autograd Function had no ``jvp`` and no ``setup_context``: a dual
    input (forward-mode AD) stopped in torch's "You must implement the jvp function",
    and ``torch.func.grad`` (or ``jvp``, ``vmap`` of a sample as large as the counter
    path takes) in "it must override the setup_context staticmethod", naming neither
    gnnfuse nor dropout, where ``F.dropout`` runs. Those inputs take torch's dropout: the
    derivative is the mask the output was drawn with, scaled by 1 / (1 - p)."""
    x, tangent = torch.randn(9, 7, dtype=torch.float64), torch.randn(9, 7, dtype=torch.float64)

    def scale(out):      # d out / d x, elementwise: 0 where dropped, 1 / (1 - p) where kept
        return torch.where(out != 0, 1.0 / 0.7, 0.0).to(out.dtype)
    if transform == "dual":
        with fwAD.dual_level():
            out, got = fwAD.unpack_dual(gF.dropout(fwAD.make_dual(x, tangent), 0.3))
        torch.testing.assert_close(got, tangent * scale(out))
    elif transform == "func.jvp":
        out, got = torch.func.jvp(lambda t: gF.dropout(t, 0.3), (x,), (tangent,))
        torch.testing.assert_close(got, tangent * scale(out))
    elif transform == "func.grad":
        def loss(t):
            out = gF.dropout(t, 0.3)
            return out.sum(), out
        got, out = torch.func.grad(loss, has_aux=True)(x)
        torch.testing.assert_close(got, scale(out))
    else:
        out = torch.func.vmap(lambda t: gF.dropout(t, 0.3), randomness="different")(x)
        assert set((out / x).round(decimals=9).unique().tolist()) <= {0.0, round(1.0 / 0.7, 9)}


@pytest.mark.parametrize("shape", [(512, 256), (8, 4)], ids=["counter", "uniform"])
def test_torch_jit_trace_draws_a_new_mask_per_call(shape):
    """The counter path read its seed with ``.item()``, which torch.jit.trace records as a
    constant: every call of the traced module dropped the same elements (512 x 256 ones:
    two calls gave identical outputs), where torch's traced dropout draws anew."""
    import warnings

    class Dropout(torch.nn.Module):
        def forward(self, x):
            return gF.dropout(x, 0.5)
    x = torch.ones(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(Dropout(), (x,), check_trace=False)
    torch.manual_seed(0)
    outputs = [traced(x) for _ in range(4)]
    assert any(not torch.equal(outputs[0], out) for out in outputs[1:])
    bigger = traced(torch.ones(shape[0] + 8, shape[1]))
    assert bigger.shape == (shape[0] + 8, shape[1]) and set(bigger.unique().tolist()) <= {0.0, 2.0}


def test_torch_thread_count_is_left_as_the_user_set_it():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        gF.dropout(torch.ones(512, 256), 0.5)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_matches_torch_dropout_in_distribution():
    """Same mean and second moment as torch's inverted dropout on one input."""
    torch.manual_seed(0)
    x = torch.randn(1024, 256)
    ours, theirs = gF.dropout(x, 0.3), F.dropout(x, 0.3)
    for stat in (lambda t: t.mean(), lambda t: (t * t).mean()):
        torch.testing.assert_close(stat(ours), stat(theirs), atol=0.02, rtol=0.02)


def test_a_udfs_dropout_of_one_is_torchs_times_zero_and_above_one_is_refused():
    """torch's F.dropout(p=1) multiplies by zero (NaN stays where the input is infinite);
    a compiled UDF refused it ("zeroes everything"), which made PyG's GATConv(dropout=1.0)
    fail to compile."""
    import gnnfuse
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    h = torch.tensor([[1.0, 2.0], [float("inf"), 3.0], [4.0, 5.0]], requires_grad=True)

    def reduce(nodes):
        return {"h": nodes.mailbox["m"].sum(1)}
    out = gnnfuse.message_passing(graph, lambda e: {"m": F.dropout(e.src["h"], 1.0, True)}, reduce, ndata={"h": h})
    expected = torch.zeros(3, 2)
    expected[2, 0] = float("nan")      # the edge 1 -> 2 carries vertex 1's infinity times zero
    torch.testing.assert_close(out["h"], expected, equal_nan=True)
    with pytest.raises(Exception, match="dropout probability has to be between 0 and 1, but got 1.5"):
        gnnfuse.message_passing(graph, lambda e: {"m": F.dropout(e.src["h"], 1.5, True)}, reduce, ndata={"h": h})


def test_gnnfuses_dropout_inside_a_udf_is_the_compiled_mask():
    """The README offers gnnfuse.nn.functional.dropout for F.dropout; inside a compiled
    message function it failed to trace ("tensor method .is_floating_point() has no
    gnnfuse op"), so a MessagePassing layer using it ran eagerly and gnnfuse.message_passing
    raised. A traced value now goes to F.dropout, which the tracer compiles to its mask."""
    import gnnfuse
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]), 3)
    h = torch.randn(3, 64, dtype=torch.float64, requires_grad=True)

    def reduce(nodes):
        return {"h": nodes.mailbox["m"].sum(1)}
    outs = []
    for drop in (gF.dropout, F.dropout):
        torch.manual_seed(3)
        outs.append(gnnfuse.message_passing(graph, lambda e: {"m": drop(e.src["h"], 0.5, True)}, reduce,
                                            ndata={"h": h})["h"])
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert 0 < int((outs[0] == 0).sum()) < outs[0].numel()


def test_a_compiled_half_precision_mask_keeps_one_minus_p_as_torch_does():
    """A compiled function's dropout mask (the ``dropout_mask`` op) drew
    ``bernoulli(full_like(x, 1 - p))``: the keep probability rounded to x's dtype, so a
    bfloat16 mask with 1 - p = 0.501953125 (halfway between two bfloat16 numbers) kept
    each element with probability 0.5 (15 standard deviations off on 16M draws), where
    torch's dropout draws with the exact probability."""
    from gnnfuse.ir.registry import get_op
    keep = 0.501953125
    torch.manual_seed(0)
    mask = get_op("dropout_mask").reference(None, torch.zeros(1 << 24, dtype=torch.bfloat16), p=1.0 - keep)
    assert mask.dtype == torch.bfloat16
    assert _within_binomial(int((mask != 0).sum()), mask.numel(), keep)


def test_the_first_mask_keeps_torchs_thread_count():
    """Setting Numba's thread count starts its pool, which resets OpenMP's -- torch's
    too -- to every core: done outside the launch that puts torch's count back, a process
    with torch.set_num_threads(1) ran on every core after its first dropout (and `gnnfuse
    tune` stored its choices for that count, so a second run reused none)."""
    script = """
import torch
torch.set_num_threads(1)
from gnnfuse.nn.functional import dropout
dropout(torch.ones(4096), p=0.5, training=True)
print(torch.get_num_threads())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1"
