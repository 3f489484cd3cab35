"""Autograd glue: compiled programs behave like ordinary differentiable torch functions."""
from .compiled import CompiledProgram, compile_program

__all__ = ["CompiledProgram", "compile_program"]
