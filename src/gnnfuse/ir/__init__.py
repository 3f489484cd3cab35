"""One dataflow IR for every way of writing a layer (see program.py and registry.py)."""
from . import ops  # noqa: F401  (registers the built-in ops)
from .errors import CompileError
from .program import Program, Value
from .registry import OpDef, get_op, register, registered_ops
from .residency import Movement, Residency, ResidencyError, join
from .verify import verify

__all__ = ["CompileError", "Movement", "OpDef", "Program", "Residency", "ResidencyError", "Value",
           "get_op", "join", "register", "registered_ops", "verify"]
