"""Generated Triton kernels for fused aggregation units (see codegen.py)."""
from .executor import execute

__all__ = ["execute"]
