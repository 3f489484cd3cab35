"""Generated Numba kernels for fused units on the CPU (see codegen.py and executor.py)."""
from .executor import available, execute

__all__ = ["available", "execute"]
