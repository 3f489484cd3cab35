"""Importing this package registers every built-in op."""
from . import dense, elementwise, movement, pairwise, select, typed  # noqa: F401
