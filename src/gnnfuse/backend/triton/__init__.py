"""Generated Triton kernels for fused aggregation units (see codegen.py)."""
from .executor import execute
from .prepared_run import PreparedRun

__all__ = ["PreparedRun", "execute"]
