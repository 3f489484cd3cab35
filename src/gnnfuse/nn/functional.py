"""Functions with `torch.nn.functional`'s names and arguments that gnnfuse runs faster.

`dropout` is the one so far: on the CPU, torch's dropout (`bernoulli_`, one Mersenne
Twister draw per element on one thread, then two more passes) was most of a small
graph's training step -- 73 of 124 ms for a GCN step on pubmed's 19.7K x 500 input on two
cores -- so the GNN kernels could not show. On a GPU torch's is one fused kernel, but it
writes a keep mask the backward reads back; gnnfuse's writes none. Swap ``F.dropout``
for ``gnnfuse.nn.functional.dropout`` and the rest of the model stays as it is.

`cross_entropy` (its own module) is torch's, plus ``rows=``: the loss over selected rows of
the logits (``F.cross_entropy(out[idx], y[idx])`` as ``cross_entropy(out, y[idx],
rows=idx)``), on a GPU in one kernel each way instead of a gather, a log-softmax and
single-block NLL kernels.

`linear_cross_entropy` (its own module) has no torch counterpart: it is
``F.cross_entropy(F.linear(h, w, b), y)`` without the [rows, classes] logits, for
classifiers with many classes on many rows.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .cross_entropy import cross_entropy
from .linear_cross_entropy import linear_cross_entropy
from .transformed import transformed

__all__ = ["cross_entropy", "dropout", "linear_cross_entropy"]

# Below this many elements torch's dropout costs well under a millisecond, and the
# counter kernel's first use would cost a Numba import (about a second per process).
COUNTER_MIN_ELEMENTS = 1 << 16
# On a GPU the counter kernel takes about 0.7 of torch's kernel time (results/dropout.md),
# but each call costs the host more: a seed draw, a Triton launch and a Python autograd
# Function each way. On an H200's host its forward took 88-117 us against torch's 16-38,
# its backward 129 against 89, and in a mini-batch GraphSAGE step (products-like, fanouts
# 15,10,5: dropout inputs of 50M and 38M elements), which the host binds, it cost 0.73 ms
# of 5.58. So a step that runs eagerly takes the counter kernel from
# DEVICE_COUNTER_MIN_ELEMENTS, where it saves more device time than that (about 47 us
# forward and backward at 50M elements, 250 us at 245M) and torch's one-byte keep mask
# starts to weigh on memory (157 MB for a products-sized [2.45M, 64] hidden table); a
# step being captured into a CUDA graph, whose replays pay no host time, takes it from
# CAPTURED_COUNTER_MIN_ELEMENTS, below which it saves a few microseconds.
DEVICE_COUNTER_MIN_ELEMENTS = 1 << 26
CAPTURED_COUNTER_MIN_ELEMENTS = 1 << 22
_COUNTER_DTYPES = (torch.float32, torch.float64)
_HALF_DTYPES = (torch.float16, torch.bfloat16)
_SEED_BOUND = 1 << 62


def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """Inverted dropout with `torch.nn.functional.dropout`'s arguments and distribution:
    each element is zeroed with probability ``p`` and the rest scaled by ``1 / (1 - p)``.

    The masks differ from torch's draw for draw (another generator), but they are drawn
    from torch's default generator's state, so ``torch.manual_seed`` makes a run
    repeatable as it does with torch's dropout. Which path runs:

    - a dense float32/float64 CPU tensor of at least `COUNTER_MIN_ELEMENTS` elements,
      with Numba installed and outside `torch.compile` and `torch.jit.trace`: a counter-based mask
      (`backend.cpu.random_mask`), one parallel pass forward and one backward, and no
      mask kept between them (the backward regenerates it from the seed);
    - another CPU tensor: uniforms compared with ``p`` (`torch.rand_like`, 2-3x faster
      than torch's `bernoulli_`; float32 uniforms for a half-precision input);
    - a dense float32/float64 CUDA tensor of at least `DEVICE_COUNTER_MIN_ELEMENTS`
      elements (`CAPTURED_COUNTER_MIN_ELEMENTS` while a CUDA graph is being captured),
      outside `torch.compile` and `torch.jit.trace`: the same in Triton (`backend.triton.random_mask`;
      Philox numbers, its seed drawn on the device, so a step captured in a CUDA graph
      drops other elements in every replay). torch's fused kernel also writes a one-byte
      mask that its backward reads back;
    - a sparse COO tensor (bag-of-words features): only its stored values are dropped
      (after coalescing), since the zeros stay zero anyway, so the cost scales with the
      non-zeros (in place: a coalesced input's values, where they are);
    - anything else (a small, half-precision or other-device tensor): torch's.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if not isinstance(input, torch.Tensor):
        # a traced value inside a compiled function (not a Tensor): torch's dropout, which
        # the tracer compiles to its mask op (the checks below are no ops it has)
        return F.dropout(input, p, training, inplace)
    if not (input.is_floating_point() or input.is_complex()):   # torch's rand_like: "check_uniform_bounds" for Long
        raise TypeError(f"dropout scales the kept elements by 1 / (1 - p), so it needs a floating-point input; "
                        f"got {input.dtype}")
    if input.is_sparse:
        if inplace:
            return _sparse_in_place(input, p)
        # coalesced first: an element stored as several entries is one value to drop
        # (as a dense tensor's), and an uncoalesced tensor has no indices() to read
        input = input.coalesce()
        return torch.sparse_coo_tensor(input.indices(), dropout(input.values(), p, training), input.shape,
                                       is_coalesced=True, check_invariants=False)
    # torch.jit.trace records the counter path's seed, read with ``.item()``, as a constant:
    # every call of the traced module would drop the same elements. torch's op is traced
    # as one that draws anew, as it is compiled.
    if torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None:
        return F.dropout(input, p, training, inplace)
    # `_CounterDropout` has no jvp and no setup_context: a dual tensor (forward-mode AD,
    # `jacobian(strategy="forward-mode")`) or a torch.func transform's tensor takes torch's
    # dropout, which carries them (and vmap's `randomness` rule)
    if transformed(input):
        return F.dropout(input, p, training, inplace)
    p = float(p)      # a 0-dim tensor or NumPy number, as torch's dropout takes: the kernels take a number
    if input.is_cuda and p < 1.0 and _device_counter_applies(input):
        from ..backend.triton import random_mask
        return _CounterDropout.apply(input, random_mask.new_seed(input.device), p, inplace, random_mask)
    if input.device.type != "cpu":
        return F.dropout(input, p, training, inplace)
    if p == 1.0:
        return input.mul_(0.0) if inplace else input * 0.0
    if _counter_applies(input):
        from ..backend.cpu import random_mask
        seed = int(torch.randint(_SEED_BOUND, ()).item())     # torch's generator: manual_seed repeats it
        return _CounterDropout.apply(input, seed, p, inplace, random_mask)
    # half-precision uniforms are too coarse to compare with p (a bfloat16 one takes 256
    # values per binade, and p is rounded to bfloat16: p = 0.999 dropped every element)
    keep = torch.rand_like(input, dtype=torch.float32 if input.dtype in _HALF_DTYPES else None) >= p
    return input.mul_(keep).mul_(1.0 / (1.0 - p)) if inplace else input * keep * (1.0 / (1.0 - p))


def _sparse_in_place(input: torch.Tensor, p: float) -> torch.Tensor:
    """``dropout(input, p, inplace=True)`` of a sparse COO tensor: its stored values,
    dropped where they are. Why: a new tensor left ``input`` as it was, which a caller
    that kept using ``input`` read as a dropout that never happened. Refused where writing
    in place cannot be done: an uncoalesced tensor (coalescing makes a new one), or one
    whose gradient is being recorded (autograd does not follow writes into a sparse
    tensor's values)."""
    if not input.is_coalesced():
        raise ValueError("dropout(..., inplace=True) of an uncoalesced sparse tensor: an element stored as several "
                         "entries is one value to drop, which needs coalesce(), a new tensor; pass "
                         "inplace=False or coalesce it first")
    if input.requires_grad and torch.is_grad_enabled():
        raise ValueError("dropout(..., inplace=True) of a sparse tensor that requires grad: autograd does not follow "
                         "a write into its values; pass inplace=False")
    values = input.values()
    values.copy_(dropout(values, p, True))
    return input


def _device_counter_applies(input: torch.Tensor) -> bool:
    if input.dtype not in _COUNTER_DTYPES or input.layout != torch.strided:
        return False
    count = input.numel()
    if count >= DEVICE_COUNTER_MIN_ELEMENTS:
        return True
    return count >= CAPTURED_COUNTER_MIN_ELEMENTS and torch.cuda.is_current_stream_capturing()


def _counter_applies(input: torch.Tensor) -> bool:
    if input.dtype not in _COUNTER_DTYPES or input.numel() < COUNTER_MIN_ELEMENTS:
        return False
    from ..backend.cpu import random_mask
    return random_mask.available()


class _CounterDropout(torch.autograd.Function):
    """``input * mask * scale`` with the mask a function of ``seed``, drawn by ``masks``
    (the CPU's or the GPU's `random_mask` module: ``apply_mask(source, out, seed, p)``);
    its backward is the same map on the gradient (so it is itself differentiable, to
    any order)."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, seed, p: float, inplace: bool, masks) -> torch.Tensor:
        ctx.seed, ctx.p, ctx.masks = seed, p, masks
        if inplace and input.is_contiguous():
            ctx.mark_dirty(input)
            return masks.apply_mask(input, input, seed, p)
        source = input.contiguous()
        out = masks.apply_mask(source, torch.empty_like(source), seed, p)
        if inplace:
            ctx.mark_dirty(input)
            return input.copy_(out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _CounterDropout.apply(grad, ctx.seed, ctx.p, False, ctx.masks), None, None, None, None
