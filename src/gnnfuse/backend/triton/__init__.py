"""Generated Triton kernels for fused aggregation units (see codegen.py)."""
from .prepared_run import PreparedRun, execute

__all__ = ["PreparedRun", "execute"]
