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


def outside_autocast(state: tuple[str, torch.dtype] | None) -> ContextManager:
    """A block with autocast off for the device type of ``state`` (a tracer's
    ``(device type, dtype)``, or None where autocast was off: no block)."""
    return contextlib.nullcontext() if state is None else torch.autocast(state[0], enabled=False)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype torch.autocast casts products to on ``device_type`` where it is on there,
    else None. (The program calls on the hot path test the same inline, each check counted
    by tests/test_host_path.py.)"""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def autocast_off(device: torch.device) -> ContextManager:
    """A block with autocast off for ``device``'s type where it is on, else no block."""
    return contextlib.nullcontext() if autocast_dtype(device.type) is None else torch.autocast(device.type,
                                                                                                enabled=False)
