"""Importing this package registers every built-in op."""
from . import dense, elementwise, features, indexing, movement, row_matmul, typed  # noqa: F401
