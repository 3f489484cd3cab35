"""Generated Triton kernels for fused aggregation units (see codegen.py)."""
from .prepared_run import execute, held_run

__all__ = ["execute", "held_run"]
