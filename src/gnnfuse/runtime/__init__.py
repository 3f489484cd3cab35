"""Autograd glue: compiled programs behave like ordinary differentiable torch functions; whole
training steps can be captured in CUDA graphs (`StepCapture`)."""
from .compiled import CompiledProgram, ProgramCall, compile_program, compiled_for, record_calls
from .cuda_graph import CaptureFallbackWarning, StepCapture, audit_step, release_captures
from .explain import ExplainReport, explain

__all__ = ["CaptureFallbackWarning", "CompiledProgram", "ExplainReport", "ProgramCall", "StepCapture", "audit_step",
           "compile_program", "compiled_for", "explain", "record_calls", "release_captures"]
