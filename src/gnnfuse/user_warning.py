"""Warnings shown at the user's line.

A warning's ``stacklevel`` counts frames from the call that warns, but gnnfuse warns from
different depths (a fallback deep in an aggregation, a layer's ``forward`` reached through
``torch.nn.Module.__call__``, PyG's ``forward`` around gnnfuse's ``propagate``), so a fixed
count pointed at gnnfuse's or torch's own files (``gnnfuse/nn/conv.py:807`` for a SAGEConv
aggregation the user chose on their line). `warn` walks out of the library instead.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import warnings

import torch

# gnnfuse's, torch's and PyG's packages: code in them is never the user's line
_PYG = importlib.util.find_spec("torch_geometric")
_LIBRARY_DIRS = tuple(os.path.dirname(path) + os.sep for path in (
    __file__, torch.__file__, *([_PYG.origin] if _PYG is not None and _PYG.origin else [])))


def is_library(filename: str) -> bool:
    """Whether code in ``filename`` is gnnfuse's, torch's or PyG's, never the user's."""
    return filename.startswith(_LIBRARY_DIRS)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the innermost frame outside
    gnnfuse, torch and PyG (the caller's own frame when every frame is library code), so
    the warning's file:line and ``__warningregistry__`` are the user's."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and is_library(frame.f_code.co_filename):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
