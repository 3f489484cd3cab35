"""Autograd glue: compiled programs behave like ordinary differentiable torch functions."""
from .compiled import CompiledProgram, ProgramCall, compile_program, record_calls
from .explain import ExplainReport, explain

__all__ = ["CompiledProgram", "ExplainReport", "ProgramCall", "compile_program", "explain", "record_calls"]
