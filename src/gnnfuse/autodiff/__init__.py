"""Reverse-mode differentiation of IR programs into IR programs."""
from .backward import BackwardProgram, build_backward

__all__ = ["BackwardProgram", "build_backward"]
