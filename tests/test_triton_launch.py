"""`launch` replays an autotuned kernel's chosen config without the autotuner once it
has chosen for a call signature, and goes back to the autotuner for a new signature.
Runs a real ``@triton.autotune`` kernel (one config: no timing, so the interpreter can
run it); on a GPU the autotuner picks among several configs, the bookkeeping is the same."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gnnfuse.backend.triton import launch as launch_module
from gnnfuse.backend.triton.launch import launch
from oracle_check import device_for


@triton.autotune(configs=[triton.Config({"BLOCK": 4}, num_warps=1)], key=["n"])
@triton.jit
def _scale(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


def _grid(n: int):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def test_the_autotuner_runs_once_per_signature_and_results_agree(monkeypatch):
    # no choice kept from another test of this module run before it in the same worker
    # (xdist's order: the first launch then read 0 autotuner runs)
    monkeypatch.setitem(launch_module._CHOSEN, _scale, {})
    device = device_for("triton")
    tuner_calls = []
    real_run = type(_scale).run
    monkeypatch.setattr(type(_scale), "run", lambda self, *a, **k: tuner_calls.append(1) or real_run(self, *a, **k))
    for n, dtype, expected_tuner_calls in [(10, torch.float32, 1), (10, torch.float32, 1), (10, torch.float32, 1),
                                           (7, torch.float32, 2), (10, torch.float64, 3), (10, torch.float64, 3)]:
        x = torch.arange(n, dtype=dtype, device=device)
        out = torch.empty_like(x)
        launch(_scale, _grid(n), (n,), (x, out, n, 3.0), {})
        torch.testing.assert_close(out, x * 3)
        assert len(tuner_calls) == expected_tuner_calls


def test_a_plain_jit_kernel_is_launched_as_is():
    device = device_for("triton")
    x = torch.arange(6, dtype=torch.float32, device=device)
    out = torch.empty_like(x)
    launch(_scale.fn, _grid(6), (6,), (x, out, 6, 2.0), {"BLOCK": 8})
    torch.testing.assert_close(out, x * 2)


def test_replayed_launches_read_each_calls_arguments():
    """After the first launch of a signature, later ones skip the autotuner (and, on a GPU,
    Triton's binder: `direct_launch`): each must still read its own tensors and scalars,
    and a view off a 16-byte boundary (another specialization) must still be right."""
    device = device_for("triton")
    base = torch.arange(11, dtype=torch.float32, device=device)
    for x, factor in [(base[:10], 3.0), (base[:10] + 1, 5.0), (base[1:], -2.0), (base[:10] * 2, 0.5), (base[1:], 4.0)]:
        out = torch.empty_like(x)
        launch(_scale, _grid(10), (10,), (x, out, 10, factor), {})
        torch.testing.assert_close(out, x * factor)
