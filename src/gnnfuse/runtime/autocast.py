"""Programs run with torch.autocast off.

A traced program states every dtype itself: the casts autocast makes in eager code are
traced as ops (frontend/autocast.py). Its runs must not be cast again: the reference
backend's torch ops (and the GEMMs the other backends leave to torch) ran under the
caller's autocast, so a float32 program's ``x @ W`` came back bfloat16 behind the
program's back, and the backward, run outside the autocast block as training loops run
it, then failed on operands of two dtypes ("expected m1 and m2 to have the same dtype").
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch


# The device types torch.autocast serves, asked once at import: the hot-path checks test
# ``kind in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(kind)`` inline, because
# torch.compile (torch 2.11's dynamo) cannot trace ``torch.amp.is_autocast_available``
# and a layer called under torch.compile(fullgraph=True) then failed on that call, while
# ``torch.is_autocast_enabled`` is constant-folded. ("meta", torch.compile's stand-in
# device, is not one: its state is the tracer's, frontend/autocast.py.)
AUTOCAST_DEVICE_TYPES: tuple[str, ...] = tuple(
    kind for kind in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla", "ipu", torch._C._get_privateuse1_backend_name())
    if torch.amp.is_autocast_available(kind))


def outside_autocast(state: tuple[str, torch.dtype] | None) -> ContextManager:
    """A block with autocast off for the device type of ``state`` (a tracer's
    ``(device type, dtype)``, or None where autocast was off: no block)."""
    return contextlib.nullcontext() if state is None else torch.autocast(state[0], enabled=False)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype torch.autocast casts products to on ``device_type`` where it is on there,
    else None. (The program calls on the hot path test the same inline, each check counted
    by tests/test_host_path.py.)"""
    if device_type in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def autocast_off(device: torch.device) -> ContextManager:
    """A block with autocast off for ``device``'s type where it is on, else no block."""
    return contextlib.nullcontext() if autocast_dtype(device.type) is None else torch.autocast(device.type,
                                                                                                enabled=False)
