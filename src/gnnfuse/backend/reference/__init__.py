"""Runs any program with plain torch ops (index_select, index_add, scatter_reduce)."""
from .context import GraphContext
from .executor import execute

__all__ = ["GraphContext", "execute"]
