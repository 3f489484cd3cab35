"""gnnfuse.nn.functional.dropout's GPU path (backend/triton/random_mask.py): Philox keep
masks that depend only on the seed and each element's position, torch's distribution and
scale, a backward that regenerates the mask, and a seed drawn on the device. Under the
interpreter the kernel runs on host tensors; the path through `dropout` and a captured
CUDA graph need a GPU."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse.nn.functional as gF
from gnnfuse.backend.triton import random_mask

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _seed(value: int, device=DEVICE) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64, device=device)


def _within_binomial(count: int, n: int, prob: float, sigmas: float = 6.0) -> bool:
    return abs(count - n * prob) <= sigmas * math.sqrt(n * prob * (1 - prob)) + 1


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keeps_one_minus_p_scaled(p, dtype):
    x = torch.randn(129, 77, dtype=dtype, device=DEVICE)         # not a whole number of blocks or groups
    out = random_mask.apply_mask(x, torch.empty_like(x), _seed(5), p)
    kept = out != 0
    assert _within_binomial(int(kept.sum()), x.numel(), 1 - p)
    torch.testing.assert_close(out[kept], x[kept] / (1 - p))


def test_the_mask_is_a_function_of_seed_and_position_only():
    x = torch.randn(5000, dtype=torch.float64, device=DEVICE)
    mask = random_mask.apply_mask(x, torch.empty_like(x), _seed(11), 0.5) != 0
    again = random_mask.apply_mask(torch.ones_like(x), torch.empty_like(x), _seed(11), 0.5) != 0
    prefix = random_mask.apply_mask(x[:37].clone(), torch.empty(37, dtype=x.dtype, device=DEVICE), _seed(11), 0.5)
    other = random_mask.apply_mask(x, torch.empty_like(x), _seed(12), 0.5) != 0
    assert torch.equal(mask, again) and torch.equal(prefix != 0, mask[:37])
    assert _within_binomial(int((mask != other).sum()), x.numel(), 0.5)    # another seed: independent


def test_neighbouring_elements_are_not_correlated():
    """The four numbers of one Philox draw go to four neighbouring elements: kept pairs
    of neighbours occur as often as independence says."""
    x = torch.ones(40000, device=DEVICE)
    kept = random_mask.apply_mask(x, torch.empty_like(x), _seed(3), 0.5) != 0
    for shift in (1, 2, 3, 4):
        both = int((kept[:-shift] & kept[shift:]).sum())
        assert _within_binomial(both, x.numel() - shift, 0.25)


def test_function_backward_regenerates_the_mask_and_gradchecks():
    x = torch.randn(6, 9, dtype=torch.float64, device=DEVICE, requires_grad=True)
    seed = _seed(21)
    out = gF._CounterDropout.apply(x, seed, 0.4, False, random_mask)
    grad = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, x, grad)
    torch.testing.assert_close(got, grad * (out.detach() != 0) / 0.6)
    fn = lambda t: gF._CounterDropout.apply(t, seed, 0.4, False, random_mask)     # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


def test_in_place_writes_the_input():
    x = torch.randn(4, 10, device=DEVICE)
    expected = random_mask.apply_mask(x.clone(), torch.empty_like(x), _seed(9), 0.3)
    out = gF._CounterDropout.apply(x, _seed(9), 0.3, True, random_mask)
    assert out.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, expected)


def test_bad_arguments_are_refused():
    x = torch.randn(4, 6, device=DEVICE)
    with pytest.raises(ValueError, match="contiguous"):
        random_mask.apply_mask(x.t(), torch.empty(6, 4, device=DEVICE), _seed(1), 0.5)
    with pytest.raises(ValueError, match="takes"):
        random_mask.apply_mask(x.half(), torch.empty_like(x.half()), _seed(1), 0.5)
    with pytest.raises(ValueError, match="0 <= p < 1"):
        random_mask.apply_mask(x, torch.empty_like(x), _seed(1), 1.0)


@settings(max_examples=15, deadline=None)
@given(count=st.integers(1, 3000), p=st.floats(0.0, 0.95), seed=st.integers(0, 2**62 - 1))
def test_drawn_sizes_keep_the_prefix_property(count, p, seed):
    x = torch.ones(count, dtype=torch.float64, device=DEVICE)
    out = random_mask.apply_mask(x, torch.empty_like(x), _seed(seed), p)
    assert set(out.unique().tolist()) <= {0.0, 1.0 / (1.0 - p)}
    head = min(count, 13)
    short = random_mask.apply_mask(x[:head].clone(), torch.empty_like(x[:head]), _seed(seed), p)
    assert torch.equal(short, out[:head])


def test_dropout_takes_the_device_path_for_large_cuda_tensors_only(monkeypatch):
    """Which path `dropout` picks, by size, dtype and device (the CUDA checks run on a GPU)."""
    monkeypatch.setattr(gF, "DEVICE_COUNTER_MIN_ELEMENTS", 100)
    seen = []
    monkeypatch.setattr(gF._CounterDropout, "apply", lambda *a: seen.append(a[-1]) or a[0])
    if DEVICE == "cuda":
        gF.dropout(torch.randn(20, 10, device=DEVICE), 0.5)
        gF.dropout(torch.randn(20, 10, device=DEVICE).half(), 0.5)     # half: torch's
        gF.dropout(torch.randn(9, 10, device=DEVICE), 0.5)             # small: torch's
        assert seen == [random_mask]
    else:
        gF.dropout(torch.randn(20, 10, device=DEVICE), 0.5)            # a host tensor: the CPU's
        assert random_mask not in seen


def test_an_eager_step_takes_the_counter_kernel_from_a_larger_size_than_a_captured_one(monkeypatch):
    """Eagerly the counter kernel's host time outweighs its device time saved below
    `DEVICE_COUNTER_MIN_ELEMENTS`; a step being captured pays no host time per replay,
    so there it runs from `CAPTURED_COUNTER_MIN_ELEMENTS`."""
    monkeypatch.setattr(gF, "DEVICE_COUNTER_MIN_ELEMENTS", 1000)
    monkeypatch.setattr(gF, "CAPTURED_COUNTER_MIN_ELEMENTS", 100)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    sizes = (99, 100, 999, 1000)
    assert [gF._device_counter_applies(torch.zeros(n)) for n in sizes] == [False, False, False, True]
    capturing[0] = True
    assert [gF._device_counter_applies(torch.zeros(n)) for n in sizes] == [False, True, True, True]
    assert not gF._device_counter_applies(torch.zeros(1000, dtype=torch.float16))     # torch's, captured or not


@needs_gpu
def test_a_captured_step_draws_a_new_mask_per_replay(monkeypatch):
    monkeypatch.setattr(gF, "DEVICE_COUNTER_MIN_ELEMENTS", 1 << 30)     # the captured bound decides
    monkeypatch.setattr(gF, "CAPTURED_COUNTER_MIN_ELEMENTS", 1)
    applied = []
    apply = gF._CounterDropout.apply
    monkeypatch.setattr(gF._CounterDropout, "apply", lambda *a: applied.append(a[-1]) or apply(*a))
    x = torch.randn(64, 33, device=DEVICE, requires_grad=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            gF.dropout(x, 0.5).sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        out = gF.dropout(x, 0.5)
        out.sum().backward()
    masks = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        kept = out != 0
        assert torch.equal(x.grad != 0, kept)               # the backward regenerated this replay's mask
        torch.testing.assert_close(out[kept], 2 * x.detach()[kept])
        masks.append(kept.clone())
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    assert random_mask in applied, "the captured step did not run the counter kernel"


@needs_gpu
def test_manual_seed_repeats_the_device_masks(monkeypatch):
    monkeypatch.setattr(gF, "DEVICE_COUNTER_MIN_ELEMENTS", 1)
    x = torch.randn(300, device=DEVICE)
    torch.manual_seed(4)
    first = gF.dropout(x, 0.5)
    torch.manual_seed(4)
    assert torch.equal(gF.dropout(x, 0.5), first)
