"""Autograd glue: compiled programs behave like ordinary differentiable torch functions."""
from .compiled import CompiledProgram, ProgramCall, compile_program, compiled_for, record_calls
from .explain import ExplainReport, explain

__all__ = ["CompiledProgram", "ExplainReport", "ProgramCall", "compile_program", "compiled_for", "explain",
           "record_calls"]
